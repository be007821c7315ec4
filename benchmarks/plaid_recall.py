"""PLAID (fast-plaid) vs exact MaxSim on real tagged vectors: recall, score error, latency, size.

For each collection (documents and queries encoded by the embedded default encoder, cached on
disk) the same documents go into the exact store and into a :class:`PlaidStore`; then, per
query configuration of the PLAID store:

* recall@10 against the exact top 10 (the exact store, float32);
* score error of the returned hits against their exact MaxSim (mean and max relative);
* latency of one query at a time: median and p95 over queries of the median of ``--runs``;

next to the exact store's latency on the same queries, plus build time and size on disk of
both (PLAID: index directory + SQLite with the original vectors; exact: its persisted files).
Configurations: no rerank (PLAID's compressed scores) and exact rerank of 10 / 30 / 100 / 300
candidates, at dense weight 1 and with the query slots scaled to weight 4.

    python benchmarks/plaid_recall.py                             # npl and cranfield
    python benchmarks/plaid_recall.py cranfield --queries 20 --runs 1 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.apps.data import load_beir
from uibk_embedding.apps.evaluation import Encoded, encode_collection, with_dense_weight
from uibk_embedding.plaid_backend.store import PlaidStore
from uibk_embedding.testing import datasets_dir


def load(name: str, n_queries: int | None) -> Encoded:
    from uibk_embedding.encoder import load_encoder

    enc = encode_collection(load_encoder(), load_beir(datasets_dir() / name))
    q = slice(None) if n_queries is None else slice(0, n_queries)
    return Encoded(enc.doc_ids, enc.docs, enc.query_ids[q], enc.queries[q])


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed_search(store: Any, queries: list[np.ndarray], k: int, runs: int) -> tuple[list, list[float]]:
    """Results of one query at a time and each query's median latency (ms) over ``runs``."""
    results, lat = [], []
    for q in queries:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            hits = store.search(q, k=k)
            times.append((time.perf_counter() - t0) * 1000)
        results.append(hits)
        lat.append(statistics.median(times))
    return results, lat


def summary(lat: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(lat), 2),
            "p95_ms": round(float(np.percentile(lat, 95)), 2)}


def run_collection(name: str, args: argparse.Namespace) -> dict[str, Any]:
    enc = load(name, args.queries)
    n_vec = sum(len(d) for d in enc.docs)
    print(f"\n== {name}: {len(enc.docs)} documents, {n_vec} vectors, {len(enc.queries)} queries")
    out: dict[str, Any] = {"collection": name, "documents": len(enc.docs), "vectors": n_vec,
                           "queries": len(enc.queries), "k": args.k, "nbits": args.nbits}
    with tempfile.TemporaryDirectory(prefix="plaid-bench-") as tmp:
        t0 = time.perf_counter()
        exact = ExactStore(path=Path(tmp) / "exact", compact_every=10**9)
        exact.upsert(enc.doc_ids, enc.docs)
        exact.compact()
        out["exact_build_s"] = round(time.perf_counter() - t0, 2)
        out["exact_bytes"] = dir_bytes(Path(tmp) / "exact")

        t0 = time.perf_counter()
        plaid = PlaidStore(Path(tmp) / "plaid", nbits=args.nbits, num_threads=args.threads)
        plaid.upsert(enc.doc_ids, enc.docs)
        out["plaid_build_s"] = round(time.perf_counter() - t0, 2)
        out["plaid_bytes"] = plaid.disk_usage()
        print(f"build: exact {out['exact_build_s']} s, plaid {out['plaid_build_s']} s; "
              f"size: exact {out['exact_bytes'] / 2**20:.1f} MiB, plaid index "
              f"{out['plaid_bytes']['plaid_index'] / 2**20:.1f} MiB + stored vectors "
              f"{out['plaid_bytes']['stored'] / 2**20:.1f} MiB")

        rows = []
        for w in args.weights:
            qs = [with_dense_weight(q, w) for q in enc.queries]
            ref, ref_lat = timed_search(exact, qs, args.k, args.runs)
            truths = [exact.scores(q) for q in qs]
            rows.append({"config": "exact store", "dense_weight": w, "recall@10": 1.0,
                         "score_err_mean": 0.0, "score_err_max": 0.0, **summary(ref_lat)})
            configs = [("plaid, no rerank", False, args.k)] + \
                      [(f"plaid + rerank {n}", True, n) for n in args.rerank]
            for label, rerank, n in configs:
                plaid.rerank, plaid.n_rerank = rerank, n
                got, lat = timed_search(plaid, qs, args.k, args.runs)
                recalls, errs = [], []
                for truth, r, g in zip(truths, ref, got, strict=True):
                    recalls.append(len({h.id for h in r} & {h.id for h in g}) / max(1, len(r)))
                    errs += [abs(h.score - truth[h.id]) / abs(truth[h.id]) for h in g]
                rows.append({"config": label, "dense_weight": w,
                             "recall@10": round(float(np.mean(recalls)), 4),
                             "recall@10_min": round(float(np.min(recalls)), 2),
                             "score_err_mean": float(f"{np.mean(errs):.2e}"),
                             "score_err_max": float(f"{np.max(errs):.2e}"), **summary(lat)})
                r = rows[-1]
                print(f"  w={w} {label:22s} recall@10 {r['recall@10']:.4f} (min {r['recall@10_min']}) "
                      f"rel. score error mean {r['score_err_mean']:.1e} max {r['score_err_max']:.1e}  "
                      f"latency median {r['median_ms']} ms p95 {r['p95_ms']} ms "
                      f"(exact store: {summary(ref_lat)['median_ms']} ms)")
        out["rows"] = rows
        plaid.close()
        exact.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("collections", nargs="*", default=["npl", "cranfield"])
    ap.add_argument("--queries", type=int, default=None, help="first N queries (default all)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--nbits", type=int, default=4)
    ap.add_argument("--rerank", type=int, nargs="*", default=[10, 30, 100, 300])
    ap.add_argument("--weights", type=float, nargs="*", default=[1.0, 4.0])
    ap.add_argument("--runs", type=int, default=3, help="timed runs per query (median taken)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for fast-plaid")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    results = [run_collection(c, args) for c in args.collections]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
