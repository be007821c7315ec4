"""The exact store, in memory and persisted to a directory.

* ``exact-memory``: float32 rows in RAM.
* ``exact-disk``: float32 rows (the default) memory-mapped from the store's vector file.
  Contract "exact".
* ``exact-disk-f16``: ``vector_dtype="float16"``: exact MaxSim over the rounded rows,
  so scores are within float16 rounding and near-ties may swap (as PLAID's float16 default,
  see plaid.py): contract "approximate" with recall floor 1.0.
* ``exact-compact``: ``profile="compact"``, rotated 4-bit rows only (docs/compact.md):
  contract "approximate", recall@10 floor RECALL_COMPACT (measured below), ``get`` within
  GET_ATOL_INT4 (the decoded rows rotated back: measured at most 0.061 a coordinate over 189,000
  random tagged rows; the worst case ``sqrt(128) * scale / 2`` is about 0.2).
* ``exact-rerank``: ``profile="exact-rerank"``: the rotated 2-bit scan's best ``rerank_depth``
  rescored from float16 originals, so the hits are the exact top k of that pool with the
  float16 store's scores (tests/test_compact.py checks that contract itself): contract
  "approximate" with recall floor 1.0, ``get`` the float16 originals.
* ``exact-int8`` (``profile="int8"``, what ``compact`` was before the 4-bit code: int8 rows
  only; recall@10 floor 0.98, measured 0.996 over the conformance set's 25 real queries, lowest
  0.9; 0.998 on Cranfield; ``get`` within int8 rounding) and ``exact-int8-rerank`` (the same
  contract as ``exact-rerank`` over int8 rows).
"""

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.testing import BackendSpec

RECALL_COMPACT = 0.93
"""The compact profile's recall@10 floor against exact MaxSim: the lowest measured, rounded down:
0.972 over the conformance set's 25 real queries (lowest 0.9), and on the shared collections
0.963 (NPL), 0.970 (Cranfield), 0.938 (LIMIT-small), with nDCG@10 within 0.2 points of float32
exact on each (benchmarks/compact.py)."""
GET_ATOL_INT4 = 0.08


def _profile(name: str, profile: str, **kw) -> BackendSpec:
    """A persisted exact store of ``profile``; reopen names the profile too (the crash test and
    others create the store with it)."""
    return BackendSpec(name, make=lambda d: ExactStore(path=d / "exact", profile=profile),
                       reopen=lambda d, **o: ExactStore(path=d / "exact", **{"profile": profile, **o}),
                       contract="approximate", variant=True, **kw)


SPECS = [
    BackendSpec("exact-memory", make=lambda d: ExactStore()),
    BackendSpec("exact-disk", make=lambda d: ExactStore(path=d / "exact", vector_dtype="float32"),
                reopen=lambda d, **kw: ExactStore(path=d / "exact", **kw), variant=True),
    BackendSpec("exact-disk-f16", make=lambda d: ExactStore(path=d / "exact", vector_dtype="float16"),
                # reopen names the dtype too: the crash test and others create the store with it
                reopen=lambda d, **kw: ExactStore(path=d / "exact", **{"vector_dtype": "float16", **kw}),
                contract="approximate",
                recall_floor=1.0, get_atol=1e-3, variant=True),
    _profile("exact-compact", "compact", recall_floor=RECALL_COMPACT, get_atol=GET_ATOL_INT4),
    _profile("exact-rerank", "exact-rerank", recall_floor=1.0, get_atol=1e-3),
    _profile("exact-int8", "int8", recall_floor=0.98, get_atol=4e-3),
    _profile("exact-int8-rerank", "int8-rerank", recall_floor=1.0, get_atol=1e-3),
]
