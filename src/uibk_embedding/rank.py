"""Exact MaxSim rerank of candidates: the one function every backend's rerank calls.

Engines that return *candidates* (PLAID, WARP, Milvus, LanceDB, Weaviate with ``rerank=True``,
pgvector with ``exact=False``) rescore them exactly on the stored vectors. :func:`rerank` does that for
one query and any sequence of candidate lists, independent of any index, with the packed
segment-max kernel of :mod:`uibk_embedding.maxsim` (no padding: a negative best similarity stays
negative). The store-level loop around it (fetch the candidates' lists in pieces, keep a running
top k, stop early on score bounds) is :func:`uibk_embedding.adapters.rerank.rerank_candidates`.

:func:`relevance` puts a MaxSim score on a scale in [0, 1] computed from the query alone, the same
on every backend: every store's hits carry it (``Hit.relevance``), and so do the framework wrappers.

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


# -- relevance: a MaxSim score on a scale that does not depend on the query's length ----------
def query_span(query: np.ndarray) -> tuple[float, float]:
    """``(C(q), max)``: the part of MaxSim every document gets, and the largest score, computed
    from the query rows alone (DESIGN 1.1-1.2). A row's tag ``x0`` meets a stored row of the
    same kind, whose tag has the same magnitude per unit norm, so its share of ``C(q)`` is
    ``x0**2 / |row|`` (``(1 - beta)`` per unit token row, ``w (1 - delta)`` per slot of norm
    ``w``); its largest contribution is ``|row|`` (stored rows have unit norm). Holds for any
    dense weight and for slots-only or tokens-only queries (:func:`~uibk_embedding.tagged.query_for_mode`).

    >>> from uibk_embedding.tagged import TaggedFormat
    >>> fmt = TaggedFormat(); rng = np.random.default_rng(0)
    >>> q = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(10, 127)))
    >>> c, top = query_span(q)
    >>> round(c, 3), round(fmt.constant(10), 3), round(top, 3)
    (3.325, 3.325, 13.0)
    """
    x = np.asarray(query, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1)
    live = norms > 0
    constant = float((x[live, 0] ** 2 / norms[live]).sum())
    return constant, float(norms.sum())


def hybrid_fraction(query: np.ndarray, score: float) -> float:
    """The hybrid part of a MaxSim score as a fraction of what the query can reach,
    ``(score - C(q)) / (max - C(q))`` (:func:`query_span`), clipped to [0, 1]: 1 for a perfect
    match whatever the query's length, near 0 for a document unlike the query.

    >>> from uibk_embedding.tagged import TaggedFormat
    >>> q = TaggedFormat().build(np.eye(3, 127), np.eye(5, 127, 3))
    >>> c, top = query_span(q)
    >>> hybrid_fraction(q, top), hybrid_fraction(q, c), round(hybrid_fraction(q, (c + top) / 2), 6)
    (1.0, 0.0, 0.5)
    """
    constant, top = query_span(query)
    if top - constant <= 0:
        return 0.0
    return float(min(1.0, max(0.0, (float(score) - constant) / (top - constant))))


# The monotone map from hybrid_fraction to relevance, piecewise linear through these knots
# (x: hybrid fraction, y: relevance). Printed by `python benchmarks/relevance.py calibrate`,
# which fits them on paragraphs of Python standard-library docstrings (not an evaluation
# collection, never qrels): a paragraph's first sentence against the rest of its paragraph
# (related) and against the best of 50 random other paragraphs (off-topic). The 0.5 knot is the
# off-topic best matches' 90th percentile, so nine off-topic queries in ten have their best
# document below 0.5 (the equal-error point, 0.505, left a third above); the two overlap, so about
# 40% of the related pairs reach 0.5 there. Gibberish queries reach 0.24-0.37 (relevance below
# 0.32). Results: benchmarks/results/relevance.md.
RELEVANCE_KNOTS: tuple[tuple[float, float], ...] = ((0.0, 0.0), (0.296, 0.25), (0.592, 0.5), (1.0, 1.0))


def relevance(query: np.ndarray, score: float) -> float:
    """A MaxSim score as a relevance in [0, 1]: :func:`hybrid_fraction` through the fixed
    monotone map :data:`RELEVANCE_KNOTS`. 1 is a perfect match whatever the query's length;
    gibberish falls below 0.5, and so does the best document of nine off-topic queries in ten
    (calibrated on non-evaluation text, ``benchmarks/relevance.py``; related and off-topic
    pairs overlap, benchmarks/results/relevance.md says what each threshold keeps on Cranfield
    and NPL). Computed from the query alone, so the same on every backend, and the same query's
    documents keep their order. Start with a threshold of 0.5.

    >>> from uibk_embedding.tagged import TaggedFormat
    >>> q = TaggedFormat().build(np.eye(3, 127), np.eye(5, 127, 3))
    >>> c, top = query_span(q)
    >>> relevance(q, top), relevance(q, c), relevance(q, c - 1.0)
    (1.0, 0.0, 0.0)
    """
    xs, ys = zip(*RELEVANCE_KNOTS, strict=True)
    return float(np.interp(hybrid_fraction(query, score), xs, ys))
