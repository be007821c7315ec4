"""What ``explain=True`` costs: search latency without it, with it (the hits' vectors asked for in
the same engine call), and with the old path (search, then a second ``get`` of the hits).

Usage::

    python benchmarks/explain_latency.py [--docs 2000] [--queries 30] [--k 10]
        [--backends qdrant-memory,qdrant-edge,milvus-lite,milvus-standalone] [--json OUT]

Documents and queries are random tagged lists (what is measured is the fetching of the hits'
vectors, not their content). Each query runs in the three ways, interleaved, after a warm-up
pass; the table gives the median and p95 per query in milliseconds. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from uibk_embedding.adapters.base import MultiVectorStore
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list


def _open(name: str, folder: Path):
    if name == "qdrant-memory":
        from uibk_embedding.adapters.qdrant import QdrantStore

        return QdrantStore(location=":memory:")
    if name == "qdrant-edge":
        from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore

        return QdrantEdgeStore(path=folder / "edge")
    if name == "milvus-lite":
        from uibk_embedding.adapters.milvus import open_milvus_lite

        return open_milvus_lite(path=folder / "lite.db", exact=True, index_type="FLAT")
    if name == "milvus-standalone":
        from uibk_embedding.adapters.milvus import MilvusStore
        from uibk_embedding.testing.milvus_server import LocalMilvusServer

        return MilvusStore(uri=LocalMilvusServer.shared().uri, collection="explain_bench", exact=True,
                           index_type="FLAT")
    raise SystemExit(f"unknown backend {name!r}")


def _ms(xs: list[float]) -> dict[str, float]:
    return {"p50": float(np.median(xs)) * 1e3, "p95": float(np.percentile(xs, 95)) * 1e3}


def measure(name: str, n_docs: int, n_queries: int, k: int, folder: Path) -> dict:
    fmt, rng = TaggedFormat(), np.random.default_rng(0)
    store = _open(name, folder)
    try:
        ids = [f"d{i}" for i in range(n_docs)]
        for lo in range(0, n_docs, 500):
            store.upsert(ids[lo:lo + 500], [make_list(fmt, rng, int(rng.integers(20, 60)))
                                            for _ in ids[lo:lo + 500]])
        queries = [make_list(fmt, rng, 32) for _ in range(n_queries)]
        ways = {
            "plain": lambda q: store.search(q, k=k),
            "explain": lambda q: store.search(q, k=k, explain=True),
            "explain_second_get": lambda q: MultiVectorStore._search_explained(store, q, k, ()),
        }
        for q in queries[:3]:  # warm-up
            for f in ways.values():
                f(q)
        times: dict[str, list[float]] = {w: [] for w in ways}
        for q in queries:
            for w, f in ways.items():
                t0 = time.perf_counter()
                hits = f(q)
                times[w].append(time.perf_counter() - t0)
                if w != "plain":
                    assert all(h.decomposition is not None for h in hits)
        row = {w: _ms(t) for w, t in times.items()}
        row["explain_over_plain"] = row["explain"]["p50"] / row["plain"]["p50"]
        row["second_get_over_plain"] = row["explain_second_get"]["p50"] / row["plain"]["p50"]
        return row
    finally:
        if name == "milvus-standalone":
            store.drop()
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--backends", default="qdrant-memory,qdrant-edge,milvus-lite,milvus-standalone")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import tempfile

    print(f"load average before the run: {os.getloadavg()[0]:.2f}")
    out = {"docs": args.docs, "queries": args.queries, "k": args.k, "load_average": os.getloadavg()[0],
           "results": {}}
    print("| backend | plain p50 / p95 ms | explain (same call) p50 / p95 | explain (second get) p50 / p95 "
          "| same call / plain | second get / plain |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.backends.split(","):
        with tempfile.TemporaryDirectory() as d:
            r = measure(name, args.docs, args.queries, args.k, Path(d))
        out["results"][name] = r
        print(f"| {name} | {r['plain']['p50']:.1f} / {r['plain']['p95']:.1f} | "
              f"{r['explain']['p50']:.1f} / {r['explain']['p95']:.1f} | "
              f"{r['explain_second_get']['p50']:.1f} / {r['explain_second_get']['p95']:.1f} | "
              f"{r['explain_over_plain']:.2f} | {r['second_get_over_plain']:.2f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
