"""LanceDB (in-process, files in the test folder): the flat exact mode, and the IVF index mode
(candidates from an IVF_FLAT index, exact rerank; contract "approximate").

The index mode's spec builds no index itself (the suites fill stores after ``make``): LanceDB
then searches the unindexed rows flat, which the index path must also answer correctly; the
index proper is measured in tests/test_lancedb.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from uibk_embedding.testing import BackendSpec

HAVE_LANCEDB = importlib.util.find_spec("lancedb") is not None
SKIP = None if HAVE_LANCEDB else "lancedb (the lancedb extra) is not installed"


def _exact(d: Path, **kw):
    from uibk_embedding.adapters.lancedb import LanceDBStore

    return LanceDBStore(d / "lancedb", table="docs", **kw)


def _index(d: Path, **kw):
    return _exact(d, mode="index", **kw)


SPECS = [
    BackendSpec("lancedb-exact", make=_exact, reopen=_exact, skip=SKIP, shared_writers=True),
    BackendSpec("lancedb-index", make=_index, reopen=_index, contract="approximate", recall_floor=0.95,
                skip=SKIP, shared_writers=True),
]
