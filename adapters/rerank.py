"""Candidates, then exact rerank: the one loop the engine stores that find candidates share.

An engine that cannot rank by exact MaxSim itself (Milvus rows or embedding lists, Weaviate
with ``rerank=True``, pgvector's dense HNSW index) names candidate documents; :func:`rerank_candidates`
fetches their stored lists (through a function the backend gives, in pieces), scores them with
exact MaxSim (:func:`uibk_embedding.rank.rerank`, float64) and keeps a running top ``k``. Given
score upper ``bounds`` (candidates in descending bound order), it stops as soon as the k-th
exact score reaches the next candidate's bound: no later candidate can enter the top ``k``.

Example
-------
>>> import numpy as np
>>> q = np.array([[1.0, 0.0]], np.float32)
>>> stored = {"a": (np.array([[0.5, 0.5]], np.float32), {"n": 1}),
...           "b": (np.array([[0.9, 0.1]], np.float32), {"n": 2})}
>>> fetch = lambda keys: {x: stored[x] for x in keys if x in stored}
>>> hits = rerank_candidates(q, ["a", "b", "gone"], fetch, k=1)
>>> [(h.id, round(h.score, 2), h.metadata) for h in hits]
[('b', 0.9, {'n': 2})]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from uibk_embedding.adapters.base import Hit, finite_score

from uibk_embedding.rank import rerank

#: what a backend's fetch returns: id -> (stored tagged list, metadata), for the ids found
Fetch = Callable[[Sequence[str]], Mapping[str, tuple[np.ndarray, dict[str, Any]]]]


def rerank_candidates(query: np.ndarray, candidates: Sequence[str], fetch: Fetch, k: int, *,
                      bounds: Mapping[str, float] | None = None, bound_slack: float = 0.0,
                      first: int = 512, piece: int = 512) -> list[Hit]:
    """The best ``k`` of ``candidates`` by exact MaxSim with ``query``, best first.

    ``fetch(ids)`` returns the stored list and metadata of each id that exists (and passes any
    filter the backend applies on the client side); ids it leaves out are skipped. It is called
    with pieces of ``candidates`` in order: ``first`` ids, then twice as many each time up to
    ``piece``. With ``bounds`` (an upper bound of each candidate's score, ``candidates`` in
    descending bound order) no further piece is fetched once ``k`` hits are held and the k-th
    score is at least the next candidate's bound plus ``bound_slack``. Ties keep the earlier
    candidate."""
    best_ids: list[str] = []
    best_lists: list[np.ndarray] = []
    best_scores: list[float] = []
    meta: dict[str, dict[str, Any]] = {}
    kth = -np.inf
    pos, step, ids = 0, first, list(candidates)
    while pos < len(ids):
        if bounds is not None and len(best_scores) >= k and kth >= bounds[ids[pos]] + bound_slack:
            break
        chunk, pos = ids[pos: pos + step], pos + step
        step = min(step * 2, piece)
        found = fetch(chunk)
        keep = [x for x in chunk if x in found]
        if not keep:
            continue
        lists = best_lists + [found[x][0] for x in keep]  # the running top k plus this piece
        ranked = rerank(query, lists, k, dtype=np.float64)
        pool = best_ids + keep
        best_ids = [pool[i] for i, _ in ranked]
        best_lists = [lists[i] for i, _ in ranked]
        best_scores = [s for _, s in ranked]
        meta.update((x, found[x][1]) for x in keep)
        if len(best_scores) >= k:
            kth = best_scores[-1]
    return [Hit(x, finite_score(s), meta[x]) for x, s in zip(best_ids, best_scores, strict=True)]
