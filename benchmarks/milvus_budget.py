"""Milvus (token_rows) vs the exact store on NPL: build time, latency, candidate budget vs recall.

Encodes ``../shared/datasets/npl`` with the embedded default encoder (cached on disk), indexes
it into the exact store and into Milvus (Milvus Lite in-process by default, or the real
standalone server with ``--server``), then for each candidate budget (nearest rows per query
vector) reports recall@10 against exact MaxSim and the median latency per query. Everything is
measured side by side in one run; latencies are medians over the queries of ``--repeats`` runs.

    python benchmarks/milvus_budget.py                      # Milvus Lite, HNSW rows
    python benchmarks/milvus_budget.py --server --docs 3000 # real standalone 2.3.5 server
    python benchmarks/milvus_budget.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.milvus import (
    DEFAULT_CANDIDATES,
    MilvusStore,
    open_milvus_lite,
)
from uibk_embedding.apps.data import load_beir
from uibk_embedding.apps.evaluation import encode_collection
from uibk_embedding.encoder import load_encoder
from uibk_embedding.testing import datasets_dir
from uibk_embedding.testing.milvus_server import LocalMilvusServer


def timed_search(store, queries, k, repeats):
    """Per-query latencies (seconds, median of ``repeats`` runs each) and the last results."""
    lat = []
    results = []
    for q in queries:
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            hits = store.search(q, k=k)
            runs.append(time.perf_counter() - t)
        lat.append(statistics.median(runs))
        results.append([h.id for h in hits])
    return lat, results


def wait_for_index(store, timeout: float = 3600.0) -> None:
    """Flush, then wait until the row index covers every row (servers build it in the background)."""
    c = store.client
    try:
        c.flush(store.rows_name)
    except Exception:  # Milvus Lite has no separate flush: its index is built on insert
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = c.describe_index(store.rows_name, c.list_indexes(store.rows_name)[0])
        if "total_rows" not in info or info.get("indexed_rows", 0) >= info["total_rows"]:
            return
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="npl")
    ap.add_argument("--docs", type=int, default=0, help="first N documents only (0: all)")
    ap.add_argument("--queries", type=int, default=0, help="first N queries only (0: all)")
    ap.add_argument("--budgets", default="4,8,16,32,64,128,256")
    ap.add_argument("--index", default="HNSW", help="row index type (HNSW, IVF_FLAT, FLAT)")
    ap.add_argument("--server", action="store_true", help="the real standalone server (milvus package)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    load_before = list(os.getloadavg())  # another load on the cores changes every timing

    coll = load_beir(datasets_dir() / args.dataset)
    t = time.perf_counter()
    enc = encode_collection(load_encoder(), coll)  # the whole collection (cached), then subsets
    if args.docs:
        enc.doc_ids, enc.docs = enc.doc_ids[: args.docs], enc.docs[: args.docs]
    if args.queries:
        enc.query_ids, enc.queries = enc.query_ids[: args.queries], enc.queries[: args.queries]
    print(f"encoded {len(enc.docs)} docs ({sum(len(d) for d in enc.docs)} vectors), "
          f"{len(enc.queries)} queries in {time.perf_counter() - t:.1f} s (cached after the first run)",
          file=sys.stderr)

    exact = ExactStore()
    t = time.perf_counter()
    exact.upsert(enc.doc_ids, enc.docs)
    exact_build = time.perf_counter() - t
    exact_lat, exact_res = timed_search(exact, enc.queries, args.k, args.repeats)

    server = LocalMilvusServer() if args.server else None
    tmp = tempfile.mkdtemp(prefix="uibk-milvus-bench-")
    try:
        if server is not None:
            server.start()
            store = MilvusStore(uri=server.uri, collection="bench", index_type=args.index)
        else:
            store = open_milvus_lite(path=Path(tmp) / "bench.db", index_type=args.index)
        t = time.perf_counter()
        for i in range(0, len(enc.docs), 256):
            store.upsert(enc.doc_ids[i:i + 256], enc.docs[i:i + 256])
        wait_for_index(store)
        store.search(enc.queries[0], k=1)
        milvus_build = time.perf_counter() - t
        print(f"milvus build {milvus_build:.1f} s; exact store build {exact_build:.2f} s, median "
              f"{1000 * statistics.median(exact_lat):.1f} ms/query", file=sys.stderr, flush=True)
        rows = []
        for budget in [int(b) for b in args.budgets.split(",")]:
            store.rows_per_vector = budget
            lat, res = timed_search(store, enc.queries, args.k, args.repeats)
            recall = float(np.mean([len(set(a) & set(b)) / len(b)
                                    for a, b in zip(res, exact_res, strict=True)]))
            rows.append({"rows_per_vector": budget, "recall@10_vs_exact": round(recall, 4),
                         "median_latency_ms": round(1000 * statistics.median(lat), 2)})
            print(f"rows_per_vector={budget}: {rows[-1]}", file=sys.stderr, flush=True)
        engine = f"milvus {store.server_version} ({'standalone' if server else 'Lite'}, {args.index} rows)"
        store.close()
    finally:
        if server is not None:
            server.stop()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)

    out = {
        "load_average": {"before": load_before, "after": list(os.getloadavg())},
        "dataset": coll.name + (f" (first {args.docs} docs)" if args.docs else ""),
        "docs": len(enc.docs), "vectors": int(sum(len(d) for d in enc.docs)),
        "queries": len(enc.queries), "engine": engine, "default_rows_per_vector": DEFAULT_CANDIDATES,
        "exact_store": {"build_s": round(exact_build, 2),
                        "median_latency_ms": round(1000 * statistics.median(exact_lat), 2)},
        "milvus": {"build_s": round(milvus_build, 2), "budgets": rows},
    }
    print(f"\n{out['dataset']}: {out['docs']} docs, {out['vectors']} vectors, {out['queries']} queries; "
          f"{engine}")
    print(f"build: exact store {out['exact_store']['build_s']} s, milvus {out['milvus']['build_s']} s; "
          f"exact store median latency {out['exact_store']['median_latency_ms']} ms/query\n")
    print("| rows_per_vector (rows per query vector) | recall@10 vs exact | median latency (ms/query) |")
    print("|---:|---:|---:|")
    for r in rows:
        mark = " (default)" if r["rows_per_vector"] == DEFAULT_CANDIDATES else ""
        print(f"| {r['rows_per_vector']}{mark} | {r['recall@10_vs_exact']:.4f} | {r['median_latency_ms']} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
