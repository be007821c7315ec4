"""One tagged index vs a dense index + a token index with fusion, same model, same collection.

(a) one index: every document's tagged list (3 slot rows + token rows) scored by exact MaxSim;
(b) two indexes: the dense sentence vector (``dense_vector``, 381-d float32) in a flat exact index,
    and the token rows in an exact MaxSim index, each returning its top ``--depth``, fused by
    * reciprocal rank fusion (``1 / (60 + rank)``, summed), and
    * a weighted score sum, ``token MaxSim + 3 * delta * cos(dense)``: the weighting that makes
      the sum equal to (a)'s score up to a constant, so (b) can match (a) only through the
      candidates both heads return (a document missing from one list gets that list's lowest
      score).

Both sides use the same float32 kernel (:mod:`uibk_embedding.maxsim`) and the same encoded
vectors, so the differences are those of the architecture: index bytes (raw float32 arrays +
ids, saved with ``np.save``), search latency (one MaxSim pass vs two searches + fusion, timed
query by query, interleaved, medians over ``--runs``), nDCG@10, and the encoding time of one
forward pass for both heads vs two passes (dense pass + token pass; measured with
``benchmarks/encode_throughput.py``'s code on ``--encode-docs`` documents). The paper's
Table 11 figures are printed next to the measured ratios: 580 vs 743 MiB of index, 1.7x encode
throughput.

Usage::

    python benchmarks/hybrid_baseline.py [DATA=npl] [--depth 100] [--runs 3]
        [--encode-docs 200] [--max-docs N] [--json out.json]
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

REPO = Path(__file__).resolve().parent.parent
PAPER = {"index_mib_one": 580, "index_mib_two": 743, "encode_throughput_ratio": 1.7}


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    from uibk_embedding.maxsim import top_k

    return top_k(scores, k)


def rrf(lists: list[list[int]], c: int = 60) -> list[int]:
    """Reciprocal rank fusion of ranked index lists."""
    score: dict[int, float] = {}
    for ranked in lists:
        for r, i in enumerate(ranked):
            score[i] = score.get(i, 0.0) + 1.0 / (c + r + 1)
    return sorted(score, key=lambda i: (-score[i], i))


def weighted_sum(dense: tuple[np.ndarray, np.ndarray], tokens: tuple[np.ndarray, np.ndarray],
                 alpha: float) -> list[int]:
    """``token + alpha * dense`` over the union of both candidate lists (missing = list minimum)."""
    (di, ds), (ti, ts) = dense, tokens
    dmap, tmap = dict(zip(di.tolist(), ds.tolist(), strict=True)), dict(zip(ti.tolist(), ts.tolist(),
                                                                           strict=True))
    dmin, tmin = float(ds.min()), float(ts.min())
    cand = set(dmap) | set(tmap)
    s = {i: tmap.get(i, tmin) + alpha * dmap.get(i, dmin) for i in cand}
    return sorted(s, key=lambda i: (-s[i], i))


def _nbytes(*arrays: np.ndarray, ids: list[str], copies: int) -> int:
    with tempfile.TemporaryDirectory() as d:
        total = 0
        for j, a in enumerate(arrays):
            p = Path(d) / f"{j}.npy"
            np.save(p, a)
            total += p.stat().st_size
        p = Path(d) / "ids.json"
        p.write_text(json.dumps(ids))
        return total + copies * p.stat().st_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", default="npl", help="BEIR folder or a name under the datasets dir")
    p.add_argument("--depth", type=int, default=100, help="candidates per head in (b)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--encode-docs", type=int, default=200, help="documents for the encode timing (0: skip)")
    p.add_argument("--max-docs", type=int, default=None)
    p.add_argument("--max-queries", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    load_before = list(os.getloadavg())  # another load on the cores changes every timing

    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.apps.evaluation import encode_collection
    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.maxsim import maxsim_scores, pack
    from uibk_embedding.metrics import ndcg_at_k
    from uibk_embedding.tagged import N_SLOTS, dense_vector, infer_format
    from uibk_embedding.testing import datasets_dir

    path = Path(args.data) if Path(args.data).exists() else datasets_dir() / args.data
    coll = load_beir(path)
    if args.max_docs:
        coll.corpus = coll.corpus[: args.max_docs]
    if args.max_queries:
        coll.queries = {q: coll.queries[q] for q in list(coll.queries)[: args.max_queries]}
    encoder = load_encoder()
    enc = encode_collection(encoder, coll)
    ids = enc.doc_ids
    fmt = infer_format(enc.docs[0])
    alpha = N_SLOTS * fmt.delta  # slot part = w * (3 tag^2 + 3 delta cos(dense)); w = 1 here

    # (a) one index
    tag_mat, tag_off = pack(enc.docs)
    # (b) two indexes
    dense_mat = np.stack([dense_vector(d) for d in enc.docs]).astype(np.float32)
    tok_mat, tok_off = pack([d[N_SLOTS:] for d in enc.docs])
    q_dense = [dense_vector(q) for q in enc.queries]
    q_tok = [q[N_SLOTS:] for q in enc.queries]

    def one(i: int) -> list[int]:
        return _top(maxsim_scores([enc.queries[i]], tag_mat, tag_off)[0], 10).tolist()

    def heads(i: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        ds = dense_mat @ q_dense[i]
        di = _top(ds, args.depth)
        ts = maxsim_scores([q_tok[i]], tok_mat, tok_off)[0]
        ti = _top(ts, args.depth)
        return (di, ds[di]), (ti, ts[ti])

    def two_rrf(i: int) -> list[int]:
        d, t = heads(i)
        return rrf([d[0].tolist(), t[0].tolist()])[:10]

    def two_sum(i: int) -> list[int]:
        d, t = heads(i)
        return weighted_sum(d, t, alpha)[:10]

    systems = {"a_one_index": one, "b_two_indexes_rrf": two_rrf, "b_two_indexes_weighted_sum": two_sum}
    nq = len(enc.queries)
    runs = {name: {enc.query_ids[i]: [ids[j] for j in f(i)] for i in range(nq)}
            for name, f in systems.items()}
    times: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(args.runs):
        for i in range(nq):
            for name, f in systems.items():  # interleaved: the same load for all three
                t0 = time.perf_counter()
                f(i)
                times[name].append(time.perf_counter() - t0)
    qrels = {q: r for q, r in coll.qrels.items() if q in coll.queries}
    from uibk_embedding.apps.evaluation import head_runs

    hr = head_runs(enc, k=10)
    result: dict = {
        "load_average": {"before": load_before, "after": list(os.getloadavg())},
        "dataset": coll.name, "n_docs": len(ids), "n_queries": nq, "depth": args.depth,
        "ndcg@10": {name: round(ndcg_at_k(r, qrels, 10), 4) for name, r in runs.items()}
        | {"dense_only": round(ndcg_at_k(hr["dense"], qrels, 10), 4),
           "tokens_only": round(ndcg_at_k(hr["tokens"], qrels, 10), 4)},
        "latency_ms_p50": {n: round(statistics.median(t) * 1e3, 2) for n, t in times.items()},
        "index_bytes": {
            "a_one_index": _nbytes(tag_mat, tag_off, ids=ids, copies=1),
            "b_two_indexes": _nbytes(dense_mat, tok_mat, tok_off, ids=ids, copies=2),
            "b_dense_part": _nbytes(dense_mat, ids=ids, copies=1),
        },
        "paper_table11": PAPER,
    }
    ib = result["index_bytes"]
    result["ratios"] = {
        "index_bytes_two_over_one": round(ib["b_two_indexes"] / ib["a_one_index"], 3),
        "latency_two_rrf_over_one": round(result["latency_ms_p50"]["b_two_indexes_rrf"]
                                          / result["latency_ms_p50"]["a_one_index"], 3),
        "paper_index_two_over_one": round(PAPER["index_mib_two"] / PAPER["index_mib_one"], 3),
    }
    if args.encode_docs:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from encode_throughput import bench_hybrid

        texts = [d.full_text for d in coll.corpus[: args.encode_docs]]
        enc_res = bench_hybrid(encoder, texts, args.runs, "cpu")
        result["encode"] = enc_res
        result["ratios"]["encode_two_pass_over_one_pass"] = round(enc_res["ratios"]["time_c_over_a"], 3)
        result["ratios"]["paper_encode_throughput"] = PAPER["encode_throughput_ratio"]

    mib = {k: v / 2**20 for k, v in ib.items()}
    print(f"## {coll.name}: {len(ids):,} documents, {nq} queries, {args.depth} candidates per head\n")
    print("| system | nDCG@10 | latency p50 (ms) | index (MiB) |\n|---|---:|---:|---:|")
    for name in systems:
        size = mib["a_one_index"] if name.startswith("a_") else mib["b_two_indexes"]
        print(f"| {name} | {result['ndcg@10'][name]:.4f} | {result['latency_ms_p50'][name]:.2f} "
              f"| {size:.1f} |")
    print(f"| dense only (exact) | {result['ndcg@10']['dense_only']:.4f} | | {mib['b_dense_part']:.1f} |")
    print(f"| tokens only (exact) | {result['ndcg@10']['tokens_only']:.4f} | | |")
    r = result["ratios"]
    print(f"\nindex bytes, two indexes / one: {r['index_bytes_two_over_one']:.3f} "
          f"(paper Table 11: {PAPER['index_mib_two']} / {PAPER['index_mib_one']} MiB = "
          f"{r['paper_index_two_over_one']:.3f})")
    print(f"search latency, two indexes + RRF / one index: {r['latency_two_rrf_over_one']:.3f}")
    if "encode" in result:
        print(f"encode time, two passes / one pass: {r['encode_two_pass_over_one_pass']:.3f} "
              f"(paper Table 11: {PAPER['encode_throughput_ratio']}x throughput) on "
              f"{result['encode']['texts']} documents")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
