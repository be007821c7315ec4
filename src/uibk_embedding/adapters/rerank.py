"""Candidates, then exact rerank: the one loop every store whose engine finds candidates shares.

An engine that cannot rank by exact MaxSim itself (PLAID and WARP centroids, Milvus rows or
embedding lists, Weaviate with ``rerank=True``, pgvector's dense HNSW index) names candidate
documents; :func:`rerank_candidates`
fetches their stored lists (through a function the backend gives, in pieces), scores them with
exact MaxSim (:func:`uibk_embedding.rank.rerank`, float64) and keeps a running top ``k``. Given
score upper ``bounds`` (candidates in descending bound order), it stops as soon as the k-th
exact score reaches the next candidate's bound: no later candidate can enter the top ``k``.
:class:`Reranking` is a mixin with the two options every such store declares (``rerank``,
``candidates``); the file-backed engines (:mod:`.indexed`) use it.

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
from typing import Any, ClassVar

import numpy as np

from uibk_embedding.adapters.base import Hit, finite_score, renamed_option
from uibk_embedding.maxsim import top_k
from uibk_embedding.rank import rerank
from uibk_embedding.tagged import TaggedFormat, decompose

#: what a backend's fetch returns: id -> (stored tagged list, metadata), for the ids found
Fetch = Callable[[Sequence[str]], Mapping[str, tuple[np.ndarray, dict[str, Any]]]]


def rerank_candidates(query: np.ndarray, candidates: Sequence[str], fetch: Fetch, k: int, *,
                      bounds: Mapping[str, float] | None = None, bound_slack: float = 0.0,
                      first: int = 512, piece: int = 512, dtype: type = np.float64,
                      explain: TaggedFormat | None = None) -> list[Hit]:
    """The best ``k`` of ``candidates`` by exact MaxSim with ``query``, best first.

    ``fetch(ids)`` returns the stored list and metadata of each id that exists (and passes any
    filter the backend applies on the client side); ids it leaves out are skipped. It is called
    with pieces of ``candidates`` in order: ``first`` ids, then twice as many each time up to
    ``piece``. With ``bounds`` (an upper bound of each candidate's score, ``candidates`` in
    descending bound order) no further piece is fetched once ``k`` hits are held and the k-th
    score is at least the next candidate's bound plus ``bound_slack``. Ties keep the earlier
    candidate. Scores are computed in ``dtype`` (float64: reference scores). With ``explain`` (the
    store's :class:`~uibk_embedding.tagged.TaggedFormat`) each hit carries its
    :class:`~uibk_embedding.tagged.Decomposition`, computed from the list already fetched (no
    second read).

    >>> from uibk_embedding.tagged import TaggedFormat
    >>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
    >>> q, doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(4, 127))), {}
    >>> doc["a"] = (fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(9, 127))), {})
    >>> (hit,) = rerank_candidates(q, ["a"], lambda keys: doc, k=1, explain=fmt)
    >>> round(hit.decomposition.total, 6) == round(hit.score, 6)
    True
    """
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
        ranked = rerank(query, lists, k, dtype=dtype)
        pool = best_ids + keep
        best_ids = [pool[i] for i, _ in ranked]
        best_lists = [lists[i] for i, _ in ranked]
        best_scores = [s for _, s in ranked]
        meta.update((x, found[x][1]) for x in keep)
        if len(best_scores) >= k:
            kth = best_scores[-1]
    hits = [Hit(x, finite_score(s), meta[x]) for x, s in zip(best_ids, best_scores, strict=True)]
    if explain is not None:
        for h, vectors in zip(hits, best_lists, strict=True):
            h.decomposition = decompose(query, vectors, explain)
    return hits


DEEPEN_SHARE = 0.5
"""The rerank pool doubles while the best ``k`` reach past this share of the candidates scored
(:func:`deepened_rerank`; chosen on ``benchmarks/rerank_depth.py``, docs/warp.md)."""


def deepened_rerank(score: Callable[[Sequence[Any]], np.ndarray], candidates: Sequence[Any],
                    head: Sequence[Any], k: int, pool: int,
                    limit: int | None = None) -> tuple[list[Any], np.ndarray]:
    """Exact rerank with a growing pool: ``(keys scored, their scores)``.

    ``score(keys)`` returns the exact MaxSim of each key (a 1-d array); ``candidates`` is the
    engine's ranking (best first), ``head`` keys are scored whatever the engine said (writes it
    has not indexed yet). The first ``pool`` candidates are scored, then twice as many while the
    best ``k`` so far reach past :data:`DEEPEN_SHARE` of the candidates scored (a document of the
    top ``k`` found that deep says the engine's order is loose there for this query, so more of
    it may lie beyond), up to ``limit`` candidates (default: all of ``candidates``).

    >>> exact = {"a": 0.1, "b": 0.2, "c": 0.9, "d": 0.3}
    >>> score = lambda keys: np.array([exact[x] for x in keys])
    >>> deepened_rerank(score, ["a", "b", "c", "d"], [], k=1, pool=2)[0]  # "b" was the deepest
    ['a', 'b', 'c', 'd']
    >>> deepened_rerank(score, ["c", "a", "b", "d"], [], k=1, pool=2)[0]  # "c" led: no growth
    ['c', 'a']
    """
    cands = list(candidates)[:limit] if limit is not None else list(candidates)
    engine = set(cands)
    head = [x for x in head if x not in engine]
    n = min(pool, len(cands))
    keys = head + cands[:n]
    scores = score(keys)
    while n < len(cands):
        deepest = max(int(i) for i in top_k(scores, k)) - len(head)  # an engine rank
        if deepest < DEEPEN_SHARE * n:
            break
        more = cands[n:min(2 * n, len(cands))]
        keys, n = keys + more, n + len(more)
        scores = np.concatenate([scores, score(more)])
    return keys, scores


def check_rerank_options(rerank: Any = None, candidates: Any = None,
                         candidates_limit: Any = None) -> tuple[bool | None, int | None, int | None]:
    """The per-query (or store) rerank options, validated once for every backend: ``rerank``
    True or False, ``candidates`` (documents to rerank) and ``candidates_limit`` (the most the
    pool may grow to) positive ints; None means "not given". Raises ``TypeError`` or
    ``ValueError`` naming the option.

    >>> check_rerank_options(True, 50)
    (True, 50, None)
    >>> check_rerank_options(candidates=0)
    Traceback (most recent call last):
    ...
    ValueError: candidates must be a positive int, got 0
    """
    if rerank is not None and not isinstance(rerank, bool | np.bool_):
        raise TypeError(f"rerank must be True or False, got {rerank!r}")
    for name, value in (("candidates", candidates), ("candidates_limit", candidates_limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return None if rerank is None else bool(rerank), candidates, candidates_limit


class Reranking:
    """Candidates, then exact rerank: the search template of backends whose engine proposes
    candidates that are rescored with exact MaxSim on stored vectors.

    A backend mixes this in before :class:`MultiVectorStore` and calls :meth:`_init_reranking`
    in its constructor; in its ``_search`` it asks :meth:`_pool` for the rerank switch and pool
    size (store defaults, overridden per query), gets that many candidate keys from its engine
    and scores them exactly. The options are declared (``search_options``), so
    ``search(q, k, rerank=False)`` and ``search(q, k, candidates=500)`` work on every such
    backend.
    """

    search_options: ClassVar[tuple[str, ...]] = ("rerank", "candidates")
    rerank: bool = True
    candidates: int = 100

    def _init_reranking(self, rerank: bool, candidates: int | None, n_rerank: int | None = None,
                        default: int = 100) -> None:
        """Set the store defaults; ``n_rerank`` is the deprecated name of ``candidates``."""
        name = "candidates" if n_rerank is None else "n_rerank"
        pool = renamed_option("candidates", candidates, "n_rerank", n_rerank, stacklevel=5)
        pool = default if pool is None else pool
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 1:
            raise ValueError(f"{name} must be a positive int, got {pool!r}")
        self.rerank, self.candidates = bool(rerank), pool

    @property
    def n_rerank(self) -> int:
        """Deprecated name of :attr:`candidates`."""
        return self.candidates

    @n_rerank.setter
    def n_rerank(self, value: int) -> None:
        self.candidates = value

    def _pool(self, k: int, rerank: bool | None = None, candidates: int | None = None) -> tuple[bool, int]:
        """``(rerank, pool)`` for one query: the pool is ``max(candidates, k)`` with rerank, else
        ``k``. Per-query values override the store's (None: the store's)."""
        rerank, candidates, _ = check_rerank_options(rerank, candidates)
        on = self.rerank if rerank is None else bool(rerank)
        return on, (max(self.candidates if candidates is None else candidates, k) if on else k)
