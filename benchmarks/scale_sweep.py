"""Search settings of a store that ``benchmarks/scale.py`` built: recall@10 against the exact
store of the same documents, and the p50 latency of one round, per setting.

The exact store's top 10 of each query is computed once and cached next to the stores
(``exact-{docs}.top10.json``). One round per setting, so the latencies are indicative only;
recall does not depend on the machine's load. Example (the WARP rerank pool at 300k)::

    python benchmarks/scale_sweep.py --docs 300000 --engine warp \\
        --settings '{}' '{"candidates": 500}' '{"nprobe": 8}'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import _open, queries_of, recall, timed_search


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vectors", default="/tmp/npl-vectors.npz")
    p.add_argument("--work", default="/tmp/uibk-scale", help="the stores of scale.py")
    p.add_argument("--docs", type=int, required=True)
    p.add_argument("--engine", choices=("plaid", "warp"), required=True)
    p.add_argument("--queries", type=int, default=93)
    p.add_argument("--settings", nargs="+", default=["{}"], help="JSON objects of store options")
    p.add_argument("--out", default="", help="JSON lines file the results are appended to")
    args = p.parse_args(argv)
    work = Path(args.work)
    queries = queries_of(args.vectors, args.queries)
    cache = work / f"exact-{args.docs}.top10.json"
    top = json.loads(cache.read_text()) if cache.exists() else None
    if top is None or len(top) != len(queries):
        exact = _open("exact", work / f"exact-{args.docs}")
        top = [[h.id for h in exact.search(q, k=10)] for q in queries]
        exact.close()
        cache.write_text(json.dumps(top))
    for text in args.settings:
        setting: dict[str, Any] = json.loads(text)
        store = _open(args.engine, work / f"{args.engine}-{args.docs}", **setting)
        store.search(queries[0], k=10)
        lat, got = timed_search(store, queries)
        store.close()
        rec = recall(got, top)
        row = {"docs": args.docs, "engine": args.engine, "setting": setting,
               "recall@10_vs_exact": round(float(np.mean(rec)), 4), "recall@10_min": round(min(rec), 2),
               "p50_ms_one_round": round(float(np.median(lat)), 1),
               "load_average": float(Path("/proc/loadavg").read_text().split()[0])}
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
