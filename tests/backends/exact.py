"""The exact store, in memory and persisted to a directory."""

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.testing import BackendSpec

SPECS = [
    BackendSpec("exact-memory", make=lambda d: ExactStore()),
    BackendSpec("exact-disk", make=lambda d: ExactStore(path=d / "exact"),
                reopen=lambda d, **kw: ExactStore(path=d / "exact", **kw)),
]
