"""The exact store, in memory and persisted to a directory.

* ``exact-memory``: float32 rows in RAM.
* ``exact-disk``: float32 rows (the default) memory-mapped from the store's vector file.
  Contract "exact".
* ``exact-disk-f16``: ``vector_dtype="float16"``: exact MaxSim over the rounded rows,
  so scores are within float16 rounding and near-ties may swap (as PLAID's float16 default,
  see plaid.py): contract "approximate" with recall floor 1.0.
* ``exact-compact``: ``profile="compact"``, int8 rows only (docs/compact.md): contract
  "approximate", recall@10 floor 0.98 (measured: 0.996 over the conformance set's 25 real
  queries, lowest 0.9; 0.998 on Cranfield), ``get`` within int8 rounding.
* ``exact-int8-rerank``: ``profile="int8-rerank"``: the int8 scan's best ``rerank_depth``
  rescored from float16 originals, so the hits are the exact top k of that pool with the
  float16 store's scores (tests/test_compact.py checks that contract itself): contract
  "approximate" with recall floor 1.0, ``get`` the float16 originals.
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
    BackendSpec("exact-compact", make=lambda d: ExactStore(path=d / "exact", profile="compact"),
                reopen=lambda d, **kw: ExactStore(path=d / "exact", **{"profile": "compact", **kw}),
                contract="approximate", recall_floor=0.98, get_atol=4e-3, variant=True),
    BackendSpec("exact-int8-rerank", make=lambda d: ExactStore(path=d / "exact", profile="int8-rerank"),
                reopen=lambda d, **kw: ExactStore(path=d / "exact", **{"profile": "int8-rerank", **kw}),
                contract="approximate", recall_floor=1.0, get_atol=1e-3, variant=True),
]
