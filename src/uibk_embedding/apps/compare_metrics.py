"""The figures of ``uibk-embed compare``: exact MaxSim reference runs, rank agreement, and the
summary of one backend's worker result (quality against the qrels and against exact MaxSim,
latency percentiles).

>>> rank_agreement(["a", "b", "c"], ["a", "c", "b"])
0.6666666666666666
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from uibk_embedding.maxsim import maxsim_scores, pack, top_k
from uibk_embedding.metrics import ndcg_at_k, overlap_at_k, recall_at_k

K = 10


# -- rank metrics -----------------------------------------------------------------------------------
def rank_agreement(run: Sequence[str], reference: Sequence[str]) -> float:
    """Fraction of the pairs of shared documents that ``run`` orders as ``reference`` does (1.0
    when fewer than two are shared and those agree, 0.0 when none is shared).

    Only the documents in BOTH lists count: a run that misses half of the reference's top-10 but
    keeps the rest in order scores 1.0. The report therefore calls it ``shared_pair_order@10`` and
    shows it beside ``identical_top10`` (the share of queries whose top-10 is the reference's, ids
    and order) and ``recall@10_vs_exact`` (the overlap of the sets).

    >>> rank_agreement(["a", "b"], ["b", "a"])
    0.0
    """
    pos = {d: i for i, d in enumerate(reference)}
    shared = [pos[d] for d in run if d in pos]
    if not shared:
        return 0.0
    pairs = [(a, b) for i, a in enumerate(shared) for b in shared[i + 1:]]
    return 1.0 if not pairs else sum(a < b for a, b in pairs) / len(pairs)


def _percentile_ms(xs: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile of latencies in seconds, in milliseconds; None without latencies
    (no query ran): JSON has no NaN."""
    return float(np.percentile(np.asarray(xs), q)) * 1e3 if xs else None


def exact_runs(docs: Sequence[np.ndarray], doc_ids: Sequence[str], queries: Sequence[np.ndarray],
               query_ids: Sequence[str], k: int = K) -> dict[str, list[str]]:
    """Top-``k`` ids of exact MaxSim for every query (the reference of every backend)."""
    mat, off = pack(list(docs))
    out = {}
    for i in range(0, len(queries), 16):
        scores = maxsim_scores(list(queries[i:i + 16]), mat, off)
        for qid, row in zip(query_ids[i:i + 16], scores, strict=True):
            out[qid] = [doc_ids[j] for j in top_k(row, k)]
    return out


def summarise(res: dict[str, Any], qrels: dict[str, dict[str, int]],
              reference: dict[str, list[str]] | None) -> dict[str, Any]:
    """The reported figures of one backend from its worker result."""
    if "skipped" in res:
        return {"skipped": res["skipped"]}
    runs, lat = res["runs"], res["latencies_s"]
    judged = {q: r for q, r in qrels.items() if q in runs}
    if reference is not None:
        reference = {q: r for q, r in reference.items() if q in runs}
    out: dict[str, Any] = {
        "ndcg@10": ndcg_at_k(runs, judged, K) if judged else None,
        "recall@10": recall_at_k(runs, judged, K) if judged else None,
        "recall@10_vs_exact": overlap_at_k(runs, reference, K) if reference else None,
        "shared_pair_order@10": (statistics.mean(rank_agreement(runs.get(q, []), r)
                                                 for q, r in reference.items()) if reference else None),
        "identical_top10": (statistics.mean(float(runs.get(q, [])[:K] == r[:K])
                                            for q, r in reference.items()) if reference else None),
        "latency_ms_p50": _percentile_ms(lat, 50),
        "latency_ms_p95": _percentile_ms(lat, 95),
        "qps": len(lat) / sum(lat) if sum(lat) > 0 else None,
        "batch_qps": len(runs) / res["batch_s"] if res.get("batch_s") else None,
        "index_bytes": res.get("index_bytes"),
        "build_s": res["build_s"],
        "upsert_s": res["upsert_s"],
        "peak_rss_mb": res["peak_rss_mb"],
        "base_rss_mb": res["base_rss_mb"],
        "count": res["count"],
        "queries_run": res.get("queries_run", len(runs)),
        "search": res.get("search"),
    }
    if "server_peak_rss_mb" in res:
        out["server_peak_rss_mb"] = res["server_peak_rss_mb"]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}
