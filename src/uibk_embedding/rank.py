"""Exact MaxSim rerank of candidates: the one function every backend's rerank calls.

Engines that return *candidates* (PLAID, WARP, Milvus, LanceDB, Weaviate with ``rerank=True``,
pgvector with ``exact=False``) rescore them exactly on the stored vectors. :func:`rerank` does that for
one query and any sequence of candidate lists, independent of any index, with the packed
segment-max kernel of :mod:`uibk_embedding.maxsim` (no padding: a negative best similarity stays
negative). The store-level loop around it (fetch the candidates' lists in pieces, keep a running
top k, stop early on score bounds) is :func:`uibk_embedding.adapters.rerank.rerank_candidates`.

Example
-------
>>> import numpy as np
>>> q = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
>>> docs = [np.array([[-1.0, 0.0]], np.float32), np.array([[0.6, 0.8], [1.0, 0.0]], np.float32)]
>>> [(i, round(s, 3)) for i, s in rerank(q, docs, k=2)]
[(1, 1.8), (0, -1.0)]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from uibk_embedding.maxsim import maxsim_scores, pack, top_k


def rerank(query: np.ndarray, documents: Sequence[np.ndarray], k: int,
           *, dtype: type = np.float32) -> list[tuple[int, float]]:
    """The best ``k`` of ``documents`` by exact MaxSim with ``query``: ``(position, score)``,
    best first (ties keep the earlier position). ``dtype=np.float64`` for reference scores; float16
    documents score exactly as their float32 (or float64) widening."""
    if len(documents) == 0 or k <= 0:
        return []
    # float16 lists stay float16 in the packed matrix: the kernel widens them block by block (the
    # fused kernel with F16C, the blas one with torch's vectorised copy), exactly, the same values
    # numpy's conversion gives, at a fraction of its time
    half = all(np.asarray(d).dtype == np.float16 for d in documents)
    mat, off = pack(documents, dtype=np.float16 if half else dtype)
    scores = maxsim_scores([query], mat, off, dtype=dtype)[0]
    return [(int(i), float(scores[i])) for i in top_k(scores, k)]
