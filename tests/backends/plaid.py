"""PLAID (fast-plaid) in three configurations.

* ``plaid-exact``: float32 originals + exact rerank of PLAID's candidates. Contract "exact":
  same ids, order and scores as exact MaxSim (small stores and filtered subsets no larger than
  the rerank pool are scored exactly; the 200 real documents go through PLAID + rerank). On real
  text the exact top k are among PLAID's candidates; nothing guarantees it (random unclustered
  lists: recall@10 0.29), so this holds for the suite's data, not for every store.
* ``plaid``: the defaults, profile ``exact-rerank`` (float16 originals + rerank: the exact
  top k of PLAID's pool, scored on the originals). The top 10 on real data is the exact
  top 10 (recall floor 1.0), but float16 scores can swap near-ties (measured: 1 of 25 real
  queries at dense weight 8 had two hits swapped), so it claims no more.
* ``plaid-norerank``: PLAID's own compressed scores; recall@10 vs exact on the suite's 200 real
  documents measured 0.948 (lowest query 0.8) with nbits=4, and 0.952 (lowest 0.8) over the
  25 queries the suite uses now; the floor 0.9 leaves room for k-means varying by platform.
* ``plaid-compact``: ``profile="compact"``: no originals (the exact store's rotated 4-bit rows
  beside fast-plaid's index, which keeps no ``embeddings.npy`` either); the answers are
  fast-plaid's own scores. Contract "approximate", recall@10 floor RECALL_COMPACT (measured
  below); ``get`` the decoded 4-bit rows (tests/backends/exact.py's GET_ATOL_INT4).
* The suite asserts that all three searched through the PLAID index (``index_used``).
"""

from uibk_embedding.plaid_backend.store import PlaidStore
from uibk_embedding.testing import BackendSpec
from uibk_embedding.testing.specs import engine_indexed

GET_ATOL_INT4 = 0.08  # tests/backends/exact.py's: the decoded rotated 4-bit rows
RECALL_COMPACT = 0.9
"""The compact profile's recall@10 floor against exact MaxSim on the suite's real data: measured
0.936 over its 25 real queries (lowest 0.8; nbits=4, fast-plaid's own scores), rounded down as
plaid-norerank's (k-means varies by platform); 0.913 on LIMIT-small (benchmarks/compact.py)."""


def _opts(**kw):
    # below the default crossover (DEFAULT_MIN_INDEX_VECTORS) a store searches exactly: a low
    # threshold so the suite's 200 documents go through the PLAID index (index_used)
    return {"num_threads": 1, "min_index_vectors": 64, **kw}


SPECS = [
    BackendSpec("plaid-exact", make=lambda d: PlaidStore(d / "p", vector_dtype="float32", **_opts()),
                reopen=lambda d, **kw: PlaidStore(d / "p", **_opts(**kw)), contract="exact",
                index_used=engine_indexed),
    BackendSpec("plaid", make=lambda d: PlaidStore(d / "p", **_opts()),
                reopen=lambda d, **kw: PlaidStore(d / "p", **_opts(**kw)), contract="approximate",
                recall_floor=1.0, get_atol=1e-3, index_used=engine_indexed,
                variant=True),
    BackendSpec("plaid-norerank", make=lambda d: PlaidStore(d / "p", **_opts(rerank=False)),
                reopen=lambda d, **kw: PlaidStore(d / "p", **_opts(rerank=False, **kw)),
                contract="approximate",
                recall_floor=0.9, get_atol=1e-3, index_used=engine_indexed,
                variant=True),
    BackendSpec("plaid-compact", make=lambda d: PlaidStore(d / "p", **_opts(profile="compact")),
                reopen=lambda d, **kw: PlaidStore(d / "p", **_opts(**{"profile": "compact", **kw})),
                contract="approximate", recall_floor=RECALL_COMPACT, get_atol=GET_ATOL_INT4,
                index_used=engine_indexed, variant=True),
]
