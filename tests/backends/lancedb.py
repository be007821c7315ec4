"""LanceDB (in-process, files in the test folder): the flat exact mode, and the IVF index mode
(candidates from an IVF_FLAT index, exact rerank; contract "approximate").

The index mode's spec lets the store keep its index (built once the table holds 64 rows, and
every write that leaves a row unindexed optimizes: ``reindex_share=0``), so the suite's 200
real documents are searched through the index, and the suite asserts that they were
(``index_used``: the index exists, no row is pending). Smaller stores of the other tests stay
below 64 rows and are searched flat, which the index mode must answer correctly too.

``lancedb-float16``: ``profile="float16"``, the vectors column float16 and LanceDB's flat MaxSim
over it, the hits rescored in float32 from the float16 values: scores within float16 rounding, so
near-ties may swap (as the exact store's float16 spec): contract "approximate", recall floor 1.0,
``get`` within float16 rounding.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from uibk_embedding.testing import BackendSpec
from uibk_embedding.testing.specs import engine_indexed

HAVE_LANCEDB = importlib.util.find_spec("lancedb") is not None
SKIP = None if HAVE_LANCEDB else "lancedb (the lancedb extra) is not installed"


def _exact(d: Path, **kw):
    from uibk_embedding.adapters.lancedb import LanceDBStore

    return LanceDBStore(d / "lancedb", table="docs", **kw)


def _index(d: Path, **kw):
    return _exact(d, mode="index", index_min_rows=64, reindex_share=0.0, **kw)


SPECS = [
    BackendSpec("lancedb-exact", make=_exact, reopen=_exact, skip=SKIP, shared_writers=True,
                takes_create=True),
    BackendSpec("lancedb-index", make=_index, reopen=_index, contract="approximate", recall_floor=0.95,
                skip=SKIP, shared_writers=True, index_used=engine_indexed, takes_create=True,
                variant=True),
    BackendSpec("lancedb-float16", make=lambda d: _exact(d, profile="float16"),
                reopen=lambda d, **kw: _exact(d, **{"profile": "float16", **kw}), contract="approximate",
                recall_floor=1.0, get_atol=1e-3, skip=SKIP, shared_writers=True, takes_create=True,
                variant=True),
]
