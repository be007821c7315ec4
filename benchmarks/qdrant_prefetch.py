"""Qdrant prefetch vs exact MaxSim on a real collection, and the adapter's overhead.

1. Recall@10 against exact MaxSim (the exact store) of prefetch mode (dense prefetch of N
   candidates, MaxSim rerank in the same request) for N in {50, 200, 1000}, and the latency
   per query of exact and prefetch mode, next to the exact store, for qdrant-client local
   mode and Qdrant Edge.
   Local mode runs on the first ``--local-docs`` (1000) documents and ``--local-queries`` (10)
   queries.
2. Adapter overhead: upsert + query through ``QdrantStore`` vs the same calls made directly
   with qdrant-client, and ``QdrantEdgeStore`` vs qdrant-edge-py (same collection layout, same
   vectors), as ratios; medians of runs.

Documents and queries are encoded by the embedded default encoder (cached on disk).

    python benchmarks/qdrant_prefetch.py                      # npl, everything
    python benchmarks/qdrant_prefetch.py --docs 2000 --queries 20 --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.qdrant import DENSE_DIM, QdrantStore, point_id
from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore
from uibk_embedding.apps.data import load_beir
from uibk_embedding.apps.evaluation import Encoded, encode_collection
from uibk_embedding.tagged import DIM, dense_vector
from uibk_embedding.testing import datasets_dir


def load(name: str, n_docs: int | None, n_queries: int | None) -> Encoded:
    from uibk_embedding.encoder import load_encoder

    enc = encode_collection(load_encoder(), load_beir(datasets_dir() / name))
    d = slice(None) if n_docs is None else slice(0, n_docs)
    q = slice(None) if n_queries is None else slice(0, n_queries)
    return Encoded(enc.doc_ids[d], enc.docs[d], enc.query_ids[q], enc.queries[q])


def per_query_ms(fn: Callable[[np.ndarray], Any], queries: list[np.ndarray]) -> tuple[float, list]:
    """Median latency (ms) of one query at a time, and the results."""
    times, out = [], []
    for q in queries:
        t0 = time.perf_counter()
        out.append(fn(q))
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out


def recall(results: list[list], reference: list[list[str]], k: int = 10) -> float:
    return float(np.mean([len({h.id for h in r[:k]} & set(ref[:k])) / min(k, len(ref))
                          for r, ref in zip(results, reference, strict=True)]))


def prefetch_table(enc: Encoded, ns: list[int], backends: list[str]) -> list[dict]:
    exact = ExactStore()
    exact.upsert(enc.doc_ids, enc.docs)
    ms, ref_hits = per_query_ms(lambda q: exact.search(q, k=10), enc.queries)
    reference = [[h.id for h in hs] for hs in ref_hits]
    rows = [{"backend": "exact", "mode": "exact", "N": None, "recall@10": 1.0, "ms/query": ms,
             "docs": len(enc.docs)}]
    tmp = tempfile.mkdtemp(prefix="uibk-bench-")
    makers = {"qdrant-local": lambda: QdrantStore(location=":memory:", batch_size=256),
              "qdrant-edge": lambda: QdrantEdgeStore(path=f"{tmp}/edge")}
    for name in backends:
        store = makers[name]()
        t0 = time.perf_counter()
        store.upsert(enc.doc_ids, enc.docs)
        print(f"{name}: indexed {len(enc.docs)} docs in {time.perf_counter() - t0:.1f} s", flush=True)
        ms, hits = per_query_ms(lambda q, s=store: s.search(q, k=10, mode="exact"), enc.queries)
        rows.append({"backend": name, "mode": "exact", "N": None,
                     "recall@10": recall(hits, reference), "ms/query": ms, "docs": len(enc.docs)})
        for n in ns:
            ms, hits = per_query_ms(
                lambda q, s=store, n=n: s.search(q, k=10, mode="prefetch", prefetch=n), enc.queries)
            rows.append({"backend": name, "mode": "prefetch", "N": n,
                         "recall@10": recall(hits, reference), "ms/query": ms, "docs": len(enc.docs)})
        store.close()
    return rows


def _direct(enc: Encoded, queries: list[np.ndarray], batch: int) -> None:
    """The same collection, upserts and queries with plain qdrant-client calls."""
    from qdrant_client import QdrantClient
    from qdrant_client import models as m

    c = QdrantClient(location=":memory:")
    c.create_collection("direct", vectors_config={
        "tagged": m.VectorParams(size=DIM, distance=m.Distance.DOT, hnsw_config=m.HnswConfigDiff(m=0),
                                 multivector_config=m.MultiVectorConfig(
                                     comparator=m.MultiVectorComparator.MAX_SIM)),
        "dense": m.VectorParams(size=DENSE_DIM, distance=m.Distance.DOT)})
    for lo in range(0, len(enc.docs), batch):
        c.upsert("direct", [
            m.PointStruct(id=point_id(x), vector={"tagged": d.tolist(), "dense": dense_vector(d).tolist()},
                          payload={"_uibk_id": x})
            for x, d in zip(enc.doc_ids[lo:lo + batch], enc.docs[lo:lo + batch], strict=True)])
    for q in queries:
        c.query_points("direct", query=q.tolist(), using="tagged", limit=10, with_payload=True)
    c.close()


def _adapter(enc: Encoded, queries: list[np.ndarray], batch: int) -> None:
    s = QdrantStore(location=":memory:", batch_size=batch, show_progress=False)
    s.upsert(enc.doc_ids, enc.docs)
    for q in queries:
        s.search(q, k=10)
    s.close()


def _direct_edge(enc: Encoded, queries: list[np.ndarray], batch: int) -> None:
    """The same shard, upserts and exact queries with plain qdrant-edge-py calls."""
    import qdrant_edge as e

    with tempfile.TemporaryDirectory() as d:
        shard = e.EdgeShard.create(f"{d}/s", e.EdgeConfig(vectors={
            "tagged": e.EdgeVectorParams(DIM, e.Distance.Dot, hnsw_config=e.HnswIndexConfig(
                m=0, ef_construct=100, full_scan_threshold=10000), multivector_config=e.MultiVectorConfig(
                    e.MultiVectorComparator.MaxSim)),
            "dense": e.EdgeVectorParams(DENSE_DIM, e.Distance.Dot)}))
        for lo in range(0, len(enc.docs), batch):
            shard.update(e.UpdateOperation.upsert_points([
                e.Point(point_id(x), {"tagged": v.tolist(), "dense": dense_vector(v).tolist()},
                        {"_uibk_id": x})
                for x, v in zip(enc.doc_ids[lo:lo + batch], enc.docs[lo:lo + batch], strict=True)]))
        for q in queries:
            shard.query(e.QueryRequest(limit=10, query=e.Query.Nearest(q.tolist(), using="tagged"),
                                       params=e.SearchParams(exact=True), with_payload=True))
        shard.close()


def _adapter_edge(enc: Encoded, queries: list[np.ndarray], batch: int) -> None:
    s = QdrantEdgeStore(batch_size=batch, show_progress=False)
    s.upsert(enc.doc_ids, enc.docs)
    for q in queries:
        s.search(q, k=10)
    s.close()


def overhead(enc: Encoded, runs: int, batch: int = 256, edge: bool = False) -> dict:
    """Median seconds of upsert + query, adapter vs direct, interleaved run by run."""
    direct, adapter = [], []
    pair = ((_direct_edge, direct), (_adapter_edge, adapter)) if edge else \
        ((_direct, direct), (_adapter, adapter))
    for _ in range(runs):
        for fn, out in pair:
            t0 = time.perf_counter()
            fn(enc, enc.queries, batch)
            out.append(time.perf_counter() - t0)
    d, a = statistics.median(direct), statistics.median(adapter)
    return {"engine": "qdrant-edge" if edge else "qdrant-client local", "docs": len(enc.docs),
            "queries": len(enc.queries), "runs": runs,
            "direct_s": d, "adapter_s": a, "ratio": a / d}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="npl")
    ap.add_argument("--docs", type=int, default=None, help="first N documents (default: all)")
    ap.add_argument("--queries", type=int, default=None, help="first N queries (default: all)")
    ap.add_argument("--prefetch", type=int, nargs="+", default=[50, 200, 1000])
    ap.add_argument("--runs", type=int, default=3, help="runs of the overhead measurement")
    ap.add_argument("--local-docs", type=int, default=1000,
                    help="qdrant-client local mode is pure Python: it runs on the first N docs")
    ap.add_argument("--local-queries", type=int, default=10)
    ap.add_argument("--overhead-docs", type=int, default=300)
    ap.add_argument("--overhead-queries", type=int, default=5)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    load_before = list(os.getloadavg())  # another load on the cores changes every timing
    enc = load(args.dataset, args.docs, args.queries)
    print(f"{args.dataset}: {len(enc.docs)} docs, {len(enc.queries)} queries, "
          f"{np.mean([len(d) for d in enc.docs]):.1f} vectors/doc", flush=True)
    def subset(nd: int, nq: int) -> Encoded:
        return Encoded(enc.doc_ids[:nd], enc.docs[:nd], enc.query_ids[:nq], enc.queries[:nq])

    rows = prefetch_table(enc, args.prefetch, ["qdrant-edge"])
    if args.local_docs:
        rows += prefetch_table(subset(args.local_docs, args.local_queries), args.prefetch,
                               ["qdrant-local"])
    print(f"\n{'backend':<14}{'docs':>7}{'mode':>10}{'N':>6}{'recall@10':>11}{'ms/query':>10}")
    for r in rows:
        print(f"{r['backend']:<14}{r['docs']:>7}{r['mode']:>10}{r['N'] or '':>6}"
              f"{r['recall@10']:>11.3f}{r['ms/query']:>10.1f}")
    ovs = [overhead(subset(args.overhead_docs, args.overhead_queries), args.runs, edge=edge)
           for edge in (False, True)]
    for ov in ovs:
        print(f"adapter overhead ({ov['engine']}, {ov['docs']} docs upserted + {ov['queries']} exact "
              f"queries, median of {ov['runs']} runs): direct {ov['direct_s']:.3f} s, adapter "
              f"{ov['adapter_s']:.3f} s, ratio {ov['ratio']:.3f}")
    result = {"load_average": {"before": load_before, "after": list(os.getloadavg())},
              "dataset": args.dataset, "docs": len(enc.docs), "queries": len(enc.queries),
              "prefetch": rows, "overhead": ovs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
