"""How deep in WARP's candidate list the exact top 10 sits, and which rerank pool rule finds it.

For a store that ``benchmarks/scale.py`` built (``{work}/warp-{docs}``), ``probe`` asks the engine
for its ``--depth`` best candidates of every NPL query (the store's own engine call, its default
search parameters) and scores all of them with exact MaxSim on the stored originals, as the
store's rerank does. The exact store's top 10 of the same documents (cached by
``scale.py sweep`` as ``exact-{docs}.top10.json``) is the reference. It writes one JSON per size:
per query, the engine's order, the engine's scores and the exact scores of the candidates, and
the engine rank of each document of the exact top 10.

``simulate`` replays pool rules on those files without the engine: a fixed pool of ``P``
candidates finds the exact top-10 documents that sit among the engine's first ``P`` (the rerank
puts every one of them in its top 10), and the adaptive rules grow the pool per query from what
the rerank of the first candidates shows. Recall of a fixed pool from the replay is checked
against the store's own search in ``probe`` (``--check``)::

    python benchmarks/rerank_depth.py probe --docs 30000 100000 300000 --depth 2000
    python benchmarks/rerank_depth.py simulate --docs 30000 100000 300000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import _open, exact_top10, queries_of, recall

HERE = Path(__file__).resolve().parent
K = 10


def probe(args: argparse.Namespace, docs: int) -> dict[str, Any]:
    work = Path(args.work)
    queries = queries_of(args.vectors, args.queries)
    reference = exact_top10(work, docs, queries)
    store = _open("warp", work / f"warp-{docs}")
    store.search(queries[0], k=K)  # loads the index
    defaults = dict(store.search_params)  # --params-at changes them per query; the check uses these
    rows, engine_s = [], []
    for q, ref in zip(queries, reference, strict=True):
        t = time.perf_counter()
        if args.params_at:  # the engine's search parameters for a pool of --params-at
            fixed = store._index.optimize_hyperparams(args.params_at, store._torch.from_numpy(q)[None])
            store.search_params = dict(zip(("bound", "nprobe", "centroid_score_threshold",
                                            "max_candidates", "t_prime"), fixed, strict=True))
        (cands,) = store._engine_candidates([q], args.depth, None)
        engine_s.append(time.perf_counter() - t)
        seqs = [s for s, _ in cands]
        hits = store._exact([q], seqs, len(seqs))[0]
        exact = {h.id: h.score for h in hits}
        ids = [store._id_of[s] for s in seqs]
        pos = {x: i for i, x in enumerate(ids)}
        rows.append({"ids": ids, "engine": [round(sc, 5) for _, sc in cands],
                     "exact": [round(exact[x], 5) for x in ids],
                     "reference": ref, "reference_rank": [pos.get(x, -1) for x in ref]})
    store.search_params = defaults
    check = {}
    for pool in args.check:
        got = [[h.id for h in store.search(q, k=K, candidates=pool, candidates_limit=pool)] for q in queries]
        check[str(pool)] = round(float(np.mean(recall(got, reference))), 4)
    store.close()
    # engine_ms_p50: indicative only (the probe is no timing harness; time with scale.py)
    return {"docs": docs, "depth": args.depth, "queries": rows, "store_recall": check,
            "engine_ms_p50": round(1000 * float(np.median(engine_s)), 1)}


def fixed(row: dict[str, Any], pool: int) -> tuple[float, int]:
    """Recall of a fixed pool: the exact top-10 documents among the engine's first ``pool``."""
    return sum(0 <= r < pool for r in row["reference_rank"]) / len(row["reference"]), pool


def adaptive(row: dict[str, Any], start: int, share: float, cap: int) -> tuple[float, int]:
    """Grow the pool (doubling, up to ``cap``) while the rerank's top 10 reaches past ``share`` of
    it: a document of the top 10 found deep in the engine's list says the engine's order is
    loose at that depth for this query, so more of the top 10 may lie beyond."""
    exact, pool = np.asarray(row["exact"]), start
    while True:
        head = exact[:pool]
        top = np.argsort(-head, kind="stable")[:K]
        if pool >= cap or pool >= len(exact) or top.max() < share * pool:
            break
        pool = min(2 * pool, cap)
    return fixed(row, pool)[0], pool


def simulate(args: argparse.Namespace) -> None:
    rules: list[tuple[str, Any]] = [(f"fixed {p}", lambda r, p=p: fixed(r, p))
                                    for p in (100, 200, 300, 500, 1000, 2000)]
    for start in (100, 200):
        for share in (0.25, 0.5, 0.75):
            rules.append((f"adaptive {start}, share {share}, cap 2000",
                          lambda r, s=start, f=share: adaptive(r, s, f, 2000)))
    out = []
    for docs in args.docs:
        tag = f"-at{args.params_at}" if args.params_at else ""
        data = json.loads((Path(args.out) / f"rerank-depth-{docs}{tag}.json").read_text())
        rows = data["queries"]
        ranks = [r for row in rows for r in row["reference_rank"]]
        missing = sum(r < 0 for r in ranks)
        found = np.array([r for r in ranks if r >= 0])
        print(f"{docs:,} documents: exact top-10 ranks in the engine's list: median {np.median(found):.0f}, "
              f"p90 {np.percentile(found, 90):.0f}, p99 {np.percentile(found, 99):.0f}, max {found.max()}, "
              f"beyond depth {data['depth']}: {missing} of {len(ranks)}; "
              f"store recall {data['store_recall']}")
        for name, rule in rules:
            res = [rule(row) for row in rows]
            rec = [r for r, _ in res]
            pools = [p for _, p in res]
            line = {"docs": docs, "rule": name, "recall@10": round(float(np.mean(rec)), 4),
                    "recall_min": round(float(np.min(rec)), 2), "pool_mean": round(float(np.mean(pools)), 1),
                    "pool_p90": float(np.percentile(pools, 90))}
            out.append(line)
            print(f"  {name:38s} recall {line['recall@10']:.4f} (min {line['recall_min']}), "
                  f"pool mean {line['pool_mean']}, p90 {line['pool_p90']:.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("probe", "simulate"):
        c = sub.add_parser(name)
        c.add_argument("--docs", type=int, nargs="+", required=True)
        c.add_argument("--out", default="/tmp/uibk-scale", help="where the probe files are")
        c.add_argument("--params-at", type=int, default=0, help="the engine's search parameters "
                       "chosen for this many candidates, not for --depth (0: for --depth)")
        if name == "probe":
            c.add_argument("--vectors", default="/tmp/npl-vectors.npz")
            c.add_argument("--work", default="/tmp/uibk-scale", help="the stores of scale.py")
            c.add_argument("--queries", type=int, default=93)
            c.add_argument("--depth", type=int, default=2000)
            c.add_argument("--check", type=int, nargs="*", default=[200], help="fixed pools whose "
                           "recall is also measured through the store's search")
        else:
            c.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.cmd == "simulate":
        simulate(args)
        return 0
    for docs in args.docs:
        res = probe(args, docs)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tag = f"-at{args.params_at}" if args.params_at else ""
        (Path(args.out) / f"rerank-depth-{docs}{tag}.json").write_text(json.dumps(res))
        print(f"{docs:,}: engine p50 {res['engine_ms_p50']} ms, store recall {res['store_recall']}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
