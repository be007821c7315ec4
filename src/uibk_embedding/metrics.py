"""Ranking metrics, with the definitions of trec_eval (as BEIR reports them).

* ``ndcg@k``: linear gains (the judgment score), discount ``log2(rank + 1)``, ideal ranking
  built from all judged documents of the query;
* ``recall@k``: relevant documents (score > 0) in the top ``k`` / all relevant documents.

Both are averaged over the queries that have at least one relevant document. A run lists each
document of a query once (a repeated id is a ``ValueError``: scoring it twice would inflate nDCG).

>>> qrels = {"q": {"a": 2, "b": 1}}
>>> run = {"q": ["b", "x", "a"]}
>>> round(ndcg_at_k(run, qrels, 3), 4), recall_at_k(run, qrels, 2)
(0.7602, 0.5)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

Run = Mapping[str, Sequence[str]]
Qrels = Mapping[str, Mapping[str, int]]


def _judged(qrels: Qrels) -> list[str]:
    return [q for q, rel in qrels.items() if any(v > 0 for v in rel.values())]


def _mean_over_judged(run: Run, qrels: Qrels, k: int,
                      per_query: Callable[[list[str], Mapping[str, int]], float]) -> float:
    """``per_query(top k of the run, judgments)`` averaged over the judged queries (a query
    missing from ``run`` has an empty top k)."""
    qs = _judged(qrels)
    if not qs:
        raise ValueError("no query has a relevant document")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    total = 0.0
    for q in qs:
        ranked = list(run.get(q, ()))
        if len(set(ranked)) < len(ranked):
            twice = next(d for i, d in enumerate(ranked) if d in ranked[:i])
            raise ValueError(f"the run lists document {twice!r} twice for query {q!r}")
        total += per_query(ranked[:k], qrels[q])
    return total / len(qs)


def ndcg_at_k(run: Run, qrels: Qrels, k: int) -> float:
    """Mean nDCG@k over judged queries (a query missing from ``run`` scores 0)."""

    def ndcg(ranked: list[str], rel: Mapping[str, int]) -> float:
        dcg = sum(max(rel.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked))
        ideal = sorted((v for v in rel.values() if v > 0), reverse=True)[:k]
        return dcg / sum(g / math.log2(i + 2) for i, g in enumerate(ideal))

    return _mean_over_judged(run, qrels, k, ndcg)


def recall_at_k(run: Run, qrels: Qrels, k: int) -> float:
    """Mean recall@k over judged queries."""

    def recall(ranked: list[str], rel: Mapping[str, int]) -> float:
        relevant = {d for d, v in rel.items() if v > 0}
        return len(relevant.intersection(ranked)) / len(relevant)

    return _mean_over_judged(run, qrels, k, recall)


def evaluate(run: Run, qrels: Qrels) -> dict[str, float]:
    """The figures `uibk-embed eval` reports."""
    return {
        "ndcg@10": ndcg_at_k(run, qrels, 10),
        "recall@2": recall_at_k(run, qrels, 2),
        "recall@10": recall_at_k(run, qrels, 10),
        "recall@100": recall_at_k(run, qrels, 100),
    }


def overlap_at_k(run: Run, reference: Run, k: int) -> float:
    """Mean |top-k(run) ∩ top-k(reference)| / k: recall@k of a backend against exact MaxSim.

    >>> overlap_at_k({"q": ["a", "b"]}, {"q": ["b", "c"]}, 2)
    0.5
    """
    if not reference:
        raise ValueError("empty reference run")
    total = 0.0
    for q, ref in reference.items():
        ref_k = list(ref)[:k]
        if ref_k:
            total += len(set(ref_k).intersection(list(run.get(q, ()))[:k])) / len(ref_k)
    return total / len(reference)
