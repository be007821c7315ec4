"""The exact store, in memory and persisted to a directory.

* ``exact-memory``: float32 rows in RAM.
* ``exact-disk``: float32 rows (the default) memory-mapped from the store's vector file.
  Contract "exact".
* ``exact-disk-f16``: ``vector_dtype="float16"``: exact MaxSim over the rounded rows,
  so scores are within float16 rounding and near-ties may swap (as PLAID's float16 default,
  see plaid.py): contract "approximate" with recall floor 1.0.
"""

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.testing import BackendSpec

SPECS = [
    BackendSpec("exact-memory", make=lambda d: ExactStore()),
    BackendSpec("exact-disk", make=lambda d: ExactStore(path=d / "exact", vector_dtype="float32"),
                reopen=lambda d, **kw: ExactStore(path=d / "exact", **kw), variant=True),
    BackendSpec("exact-disk-f16", make=lambda d: ExactStore(path=d / "exact", vector_dtype="float16"),
                # reopen names the dtype too: the crash test and others create the store with it
                reopen=lambda d, **kw: ExactStore(path=d / "exact", **{"vector_dtype": "float16", **kw}),
                contract="approximate",
                recall_floor=1.0, get_atol=1e-3, variant=True),
]
