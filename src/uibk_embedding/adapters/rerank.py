"""Candidates, then exact rerank: the one loop every store whose engine proposes candidates shares.

The engine contract (the shape of colbert-live's database contract) is two reads, beside CRUD and
filter translation:

* ``candidates``: per query, ``[(key, bound or None)]``, best first: the documents the engine
  proposes, each with an upper bound of its exact MaxSim when the engine can prove one (Milvus
  token rows with an exhaustive row search), else None;
* ``fetch(keys) -> {key: (stored tagged list, metadata)}``: the keys it leaves out (gone, or
  refused by a filter applied on the client) are skipped.

:func:`rerank_candidates` is the one function that turns them into hits: it fetches the candidates
in pieces, scores each piece with exact MaxSim (:func:`uibk_embedding.rank.rerank`), keeps a
running top ``k``, stops early on the bounds, grows the pool while the best lie deep in the
engine's order (``pool``, :data:`DEEPEN_SHARE`) and explains the hits from the lists it already
fetched (no second read). Every candidate engine calls it: PLAID and WARP (:mod:`.indexed`),
Milvus (both layouts), pgvector with ``exact=False``, Weaviate with ``rerank=True``, LanceDB (in
index mode; in flat mode it scores the lists it returned). Engines with a native exact path (the
exact store, pgvector ``exact=True``, a file-backed store with no index) answer directly.
:func:`check_rerank_options` validates the options (``rerank``, ``candidates``,
``candidates_limit``) once for every backend;
:class:`Reranking` is the mixin of the file-backed engines that declares them.

Example
-------
>>> import numpy as np
>>> q = np.array([[1.0, 0.0]], np.float32)
>>> stored = {"a": (np.array([[0.5, 0.5]], np.float32), {"n": 1}),
...           "b": (np.array([[0.9, 0.1]], np.float32), {"n": 2})}
>>> fetch = lambda keys: {x: stored[x] for x in keys if x in stored}
>>> hits = rerank_candidates(q, [("a", None), ("b", None), ("gone", None)], fetch, k=1)
>>> [(h.id, round(h.score, 2), h.metadata) for h in hits]
[('b', 0.9, {'n': 2})]
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from uibk_embedding.adapters.base import Hit, check_flag, check_positive, finite_score, renamed_option
from uibk_embedding.maxsim import top_k
from uibk_embedding.rank import rerank
from uibk_embedding.tagged import TaggedFormat, decompose

#: what an engine's fetch returns: key -> (stored tagged list, metadata), for the keys found
Fetch = Callable[[Sequence[Any]], Mapping[Any, tuple[np.ndarray, dict[str, Any]]]]
#: one engine candidate: (key, upper bound of its exact MaxSim or None), best first
Candidate = tuple[Hashable, float | None]

DEEPEN_SHARE = 0.5
"""With a ``pool``, the pool doubles while the best ``k`` reach past this share of the candidates
scored (:func:`rerank_candidates`; chosen on ``benchmarks/rerank_depth.py``, docs/warp.md)."""


def rerank_candidates(query: np.ndarray, candidates: Sequence[Candidate], fetch: Fetch, k: int, *,
                      pool: int | None = None, head: Sequence[Hashable] = (), bound_slack: float = 0.0,
                      first: int = 512, piece: int = 512, dtype: type = np.float32,
                      explain: TaggedFormat | None = None) -> list[Hit]:
    """The best ``k`` of ``candidates`` (and ``head``) by exact MaxSim with ``query``, best first.

    ``candidates`` are the engine's ``(key, bound or None)``, best first; ``head`` keys are
    scored whatever the engine said (writes it has not indexed yet). ``fetch(keys)`` returns the
    stored list and metadata of each key that exists (and passes any filter the backend applies
    on the client side); keys it leaves out are skipped. It is called with pieces in order:
    ``first`` keys, then twice as many each time up to ``piece``; each key once.

    * Pool growth: without ``pool`` every candidate may be scored. With it the first ``pool``
      are, then twice as many while the deepest of the best ``k`` (its place in the engine's
      order) reaches :data:`DEEPEN_SHARE` of the candidates scored: a document of the top ``k``
      found that deep says the engine's order is loose there, so more may lie beyond. The
      caller cuts ``candidates`` to the most the pool may grow to.
    * Early stop: once ``k`` hits are held and the k-th score is at least the next candidate's
      bound plus ``bound_slack``, nothing later is fetched (bounds must then descend).
    * Scores are computed in ``dtype``: float32 scores as the exact store does (with the fused
      kernel a document's score does not depend on the others scored beside it, so identical
      lists tie); ties keep the earlier key (``head`` first, then the engine's order). float64
      gives reference scores, whose BLAS products may part identical lists by an ulp.
    * With ``explain`` (the store's :class:`~uibk_embedding.tagged.TaggedFormat`) each hit
      carries its :class:`~uibk_embedding.tagged.Decomposition`, computed from the list already
      fetched (no second read).

    >>> from uibk_embedding.tagged import TaggedFormat
    >>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
    >>> q, doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(4, 127))), {}
    >>> doc["a"] = (fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(9, 127))), {})
    >>> (hit,) = rerank_candidates(q, [("a", None)], lambda keys: doc, k=1, explain=fmt)
    >>> round(hit.decomposition.total, 6) == round(hit.score, 6)
    True
    """
    engine = {key: rank for rank, (key, _) in enumerate(candidates)}
    head = [x for x in dict.fromkeys(head) if x not in engine]
    keys = head + [key for key, _ in candidates]
    bounds = [None] * len(head) + [bound for _, bound in candidates]
    end = len(keys) if pool is None else len(head) + min(pool, len(candidates))
    best: list[tuple[Hashable, float, np.ndarray, dict[str, Any]]] = []  # (key, score, list, metadata)
    pos, step = 0, first
    while True:
        if pos >= end:
            scored = end - len(head)
            deepest = max((engine.get(x, -1) for x, *_ in best), default=-1)
            if end >= len(keys) or pool is None or deepest < DEEPEN_SHARE * scored:
                break
            end = len(head) + min(max(2 * scored, 1), len(candidates))  # the best lie deep: grow
        bound = bounds[pos]
        if bound is not None and len(best) >= k and best[-1][1] >= bound + bound_slack:
            break
        chunk = keys[pos:min(pos + step, end)]
        pos, step = pos + len(chunk), min(step * 2, piece)
        found = fetch(chunk)
        fetched = [(x, *found[x]) for x in chunk if x in found]
        if not fetched:
            continue
        ranked = rerank(query, [vectors for _, vectors, _ in fetched], k, dtype=dtype)
        merged = best + [(fetched[i][0], s, fetched[i][1], fetched[i][2]) for i, s in ranked]
        best = [merged[i] for i in top_k(np.array([s for _, s, *_ in merged]), k)]  # ties: earlier
    hits = [Hit(x, finite_score(s), md) for x, s, _, md in best]
    if explain is not None:
        for h, (_, _, vectors, _) in zip(hits, best, strict=True):
            h.decomposition = decompose(query, vectors, explain)
    return hits


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
    rerank = None if rerank is None else check_flag("rerank", rerank)
    for name, value in (("candidates", candidates), ("candidates_limit", candidates_limit)):
        if value is not None:
            check_positive(name, value)
    return rerank, candidates, candidates_limit


class Reranking:
    """The options of backends whose engine proposes candidates that :func:`rerank_candidates`
    rescores with exact MaxSim on stored vectors.

    A backend mixes this in before :class:`MultiVectorStore` and calls :meth:`_init_reranking`
    in its constructor; in its ``_search`` it asks :meth:`_pool` for the rerank switch and pool
    size (store defaults, overridden per query). The options are declared (``search_options``),
    so ``search(q, k, rerank=False)`` and ``search(q, k, candidates=500)`` work on every such
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
        check_positive(name, pool)
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
