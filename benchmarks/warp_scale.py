"""WARP (xtr-warp-rs) vs the exact store on NPL and on a 100k-document scale-up, in stages.

The 100k collection is the one ``uibk-embed compare --scale 100000`` uses: NPL's 11,426 encoded
documents, then :func:`~uibk_embedding.apps.compare.synthetic_corpus` copies (``seed=n``). The WARP
store is built through its own API with its default configuration, in stages that each fit in
a few minutes (``build --upto``: upsert in batches of 512, then ``flush()``), so a long build is
split into separate commands; the first stage trains the index (create), later stages add to it
(engine ``add``: compression against the existing centroids plus centroid expansion).
``query`` then builds the exact store in memory on the same documents and measures, side by
side in one process, exact p50 latency and every WARP configuration of a grid (candidates
``n_rerank``, ``nprobe``; plus the engine alone, no rerank): p50 latency and recall@10 against
exact MaxSim, and how the engine's raw scores relate to exact MaxSim.

    python benchmarks/warp_scale.py build --n 11426 --upto 11426
    python benchmarks/warp_scale.py query --n 11426 --json benchmarks/results/warp/npl.json
    python benchmarks/warp_scale.py build --n 100000 --upto 40000      # then --upto 100000
    python benchmarks/warp_scale.py query --n 100000 --json benchmarks/results/warp/scale-100k.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.warp import WarpStore
from uibk_embedding.apps.compare import synthetic_corpus
from uibk_embedding.apps.data import load_beir
from uibk_embedding.apps.evaluation import encode_collection
from uibk_embedding.encoder import load_encoder
from uibk_embedding.maxsim import maxsim_scores, pack
from uibk_embedding.testing import datasets_dir

BATCH = 512


def collection(n: int) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    enc = encode_collection(load_encoder(), load_beir(datasets_dir() / "npl"))
    ids, docs = list(enc.doc_ids), list(enc.docs)
    if n < len(docs):
        ids, docs = ids[:n], docs[:n]
    elif n > len(docs):
        docs += synthetic_corpus(enc.docs, n - len(docs), seed=n)
        ids += [f"syn-{i}" for i in range(len(ids), n)]
    return ids, docs, list(enc.queries)


def build(args: argparse.Namespace) -> None:
    ids, docs, _ = collection(args.n)
    path = Path(args.work) / f"warp-{args.n}"
    store = WarpStore(path)
    start = store.count()
    upto = min(args.upto, len(docs))
    t0 = time.perf_counter()
    for i in range(start, upto, BATCH):
        store.upsert(ids[i:min(i + BATCH, upto)], docs[i:min(i + BATCH, upto)])
    t1 = time.perf_counter()
    store.flush()
    t2 = time.perf_counter()
    usage = store.disk_usage()
    store.close()
    rec = {"from": start, "to": upto, "upsert_s": round(t1 - t0, 2), "flush_s": round(t2 - t1, 2),
           "disk": usage}
    log = Path(args.work) / f"build-{args.n}.json"
    stages = json.loads(log.read_text()) if log.exists() else []
    log.write_text(json.dumps([*stages, rec], indent=1))
    print(json.dumps(rec))


def _p50_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e3, 2)


def query(args: argparse.Namespace) -> None:
    ids, docs, queries = collection(args.n)
    queries = queries[:args.queries]
    out: dict = {"n_docs": len(docs), "n_vectors": int(sum(len(d) for d in docs)), "queries": len(queries)}
    t0 = time.perf_counter()
    exact = ExactStore()
    exact.upsert(ids, docs)
    out["exact_build_s"] = round(time.perf_counter() - t0, 2)
    log = Path(args.work) / f"build-{args.n}.json"
    if log.exists():
        stages = json.loads(log.read_text())
        out["warp_build_stages"] = stages
        out["warp_build_s"] = round(sum(s["upsert_s"] + s["flush_s"] for s in stages), 2)
    store = WarpStore(Path(args.work) / f"warp-{args.n}")
    if store.count() != len(docs) or store.n_pending:
        raise SystemExit(f"the WARP store holds {store.count()} documents ({store.n_pending} pending); "
                         f"build it first up to {len(docs)}")
    out["warp_disk"] = store.disk_usage()
    pos = {x: i for i, x in enumerate(ids)}
    # how the engine's raw scores relate to exact MaxSim (its own top 100 per query)
    ratios, corrs = [], []
    for q in queries:
        cands = store._engine_candidates([q], 100, None)[0]
        seqs = [s for s, _ in cands]
        mat, off = pack([docs[pos[store._id_of[s]]] for s in seqs])
        exact_scores = maxsim_scores([q], mat, off)[0]
        warp_scores = np.array([sc for _, sc in cands])
        ratios.append(float(np.median(warp_scores / exact_scores)))
        corrs.append(float(np.corrcoef(warp_scores, exact_scores)[0, 1]))
    out["raw_score_vs_maxsim"] = {"median_ratio": round(statistics.median(ratios), 4),
                                  "min_ratio": round(min(ratios), 4), "max_ratio": round(max(ratios), 4),
                                  "median_pearson_top100": round(statistics.median(corrs), 3)}
    grid = [("engine alone (rerank=False)", {"rerank": False}, {})]
    grid += [(f"rerank {n}", {"n_rerank": n}, {}) for n in args.rerank]
    grid += [(f"rerank {n}, nprobe {p}", {"n_rerank": n}, {"nprobe": p})
             for n in args.rerank for p in args.nprobe]
    default = (store.rerank, store.n_rerank, dict(store.search_params))

    def configure(attrs: dict, params: dict) -> None:
        store.rerank, store.n_rerank, store.search_params = default[0], default[1], dict(default[2])
        for key, v in attrs.items():
            setattr(store, key, v)
        store.search_params.update(params)

    for attrs_params in [(a, p) for _, a, p in grid]:  # warm-up of every configuration
        configure(*attrs_params)
        store.search(queries[0], k=10)
    # side by side, query by query: the exact store, then every configuration (load drifts
    # on a shared machine; interleaving keeps the ratios fair)
    exact_lat: list[float] = []
    lat: dict[str, list[float]] = {label: [] for label, _, _ in grid}
    got: dict[str, list[list[str]]] = {label: [] for label, _, _ in grid}
    ref = []
    for q in queries:
        t = time.perf_counter()
        ref.append([h.id for h in exact.search(q, k=10)])
        exact_lat.append(time.perf_counter() - t)
        for label, attrs, params in grid:
            configure(attrs, params)
            t = time.perf_counter()
            hits = store.search(q, k=10)
            lat[label].append(time.perf_counter() - t)
            got[label].append([h.id for h in hits])
    out["exact_p50_ms"] = _p50_ms(exact_lat)
    rows = []
    for label, _, _ in grid:
        recall = [len(set(g) & set(r)) / 10 for g, r in zip(got[label], ref, strict=True)]
        ratio = [w / e for w, e in zip(lat[label], exact_lat, strict=True)]
        row = {"config": label, "p50_ms": _p50_ms(lat[label]),
               "recall@10_vs_exact": round(float(np.mean(recall)), 4), "min_query_recall": min(recall),
               "identical_top10": sum(g == r for g, r in zip(got[label], ref, strict=True)),
               "median_latency_ratio_vs_exact": round(statistics.median(ratio), 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    store.close()
    out["warp"] = rows
    print(json.dumps({k: v for k, v in out.items() if k != "warp"}, indent=1))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("build", "query"):
        p = sub.add_parser(name)
        p.add_argument("--n", type=int, required=True, help="collection size (11426 = NPL itself)")
        p.add_argument("--work", default="/tmp/warp-bench", help="folder of the WARP stores and build logs")
        if name == "build":
            p.add_argument("--upto", type=int, required=True, help="index documents up to this count")
        else:
            p.add_argument("--queries", type=int, default=50)
            p.add_argument("--rerank", type=lambda s: [int(x) for x in s.split(",")], default=[100, 200, 400])
            p.add_argument("--nprobe", type=lambda s: [int(x) for x in s.split(",")], default=[])
            p.add_argument("--json", default=None)
    args = ap.parse_args()
    build(args) if args.cmd == "build" else query(args)


if __name__ == "__main__":
    main()
