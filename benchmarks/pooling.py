"""Token pooling at index time (issue #59): stored vectors and nDCG@10 at pool factor 1, 2 and 3.

For every BEIR collection under the shared datasets folder (``$UIBK_DATASETS`` or
``../shared/datasets``; read from there, never copied), with the embedded default encoder and the
exact store (in memory, exact MaxSim): the corpus is encoded once (``pool_factor=1``, cached by
:func:`~uibk_embedding.apps.evaluation.encode_collection`), then each pool factor's lists are
those lists pooled by :func:`~uibk_embedding.token_pooling.pool_documents`, the function the
encoder's ``pool_factor=`` runs on each batch it encodes (checked here on a sample: an encoder
made with ``pool_factor=p`` gives the same lists, within the model's float noise across batches).
Each pool factor's lists go into their own exact store opened with that format; the queries
(never pooled) are searched at the encoder's dense weight, top 100, and scored with the
metrics of ``uibk-embed eval``. Recall@10 against pool factor 1 (the same store's top 10
without pooling) says how much of the ranking moved.

Reported per collection and pool factor: stored vectors (slots included: three a document,
never pooled) and token vectors, their ratio to pool factor 1, nDCG@10, recall@10 and
recall@100, overlap@10 with pool factor 1, the time pooling took and the search p50. nDCG and
the vector counts do not depend on the machine's load; the timings do (the load average at the
start and the end is recorded).

Usage::

    .venv/bin/python benchmarks/pooling.py                # every shared collection, factors 1 2 3
    .venv/bin/python benchmarks/pooling.py --collections cranfield --factors 1 2

Writes ``benchmarks/results/pooling.json`` and ``pooling.md`` (``--out`` for another stem).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from uibk_embedding import open_store
from uibk_embedding.apps.data import load_beir
from uibk_embedding.apps.evaluation import Encoded, encode_collection, fused_run, index_into
from uibk_embedding.encoder import load_encoder
from uibk_embedding.metrics import evaluate, overlap_at_k
from uibk_embedding.tagged import N_SLOTS
from uibk_embedding.testing.specs import datasets_dir
from uibk_embedding.token_pooling import pool_documents

HERE = Path(__file__).resolve().parent
SAMPLE = 32  # documents encoded again through the encoder's own pool_factor= as a check


def check_option_path(texts: list[str], pooled: list[np.ndarray], pool_factor: int) -> float:
    """Encode ``texts`` with ``load_encoder(pool_factor=...)`` and return the largest difference
    from ``pooled`` (the lists pooled here); a shape that differs is an error."""
    enc = load_encoder(pool_factor=pool_factor)
    got = enc.encode_documents(texts, show_progress=False)
    worst = 0.0
    for a, b in zip(got, pooled, strict=True):
        if a.shape != b.shape:
            raise AssertionError(f"pool_factor={pool_factor}: the encoder gave {a.shape}, pooling {b.shape}")
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


def run_collection(name: str, factors: list[int]) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coll = load_beir(datasets_dir() / name)
        enc = load_encoder()
        t0 = time.perf_counter()
        base = encode_collection(enc, coll)
    encode_s = time.perf_counter() - t0
    print(f"{name}: {len(base.docs)} documents, {len(base.queries)} queries, encoded (or read from the "
          f"cache) in {encode_s:.1f} s", flush=True)
    rows = []
    reference: dict[str, list[str]] | None = None
    for p in factors:
        fmt = replace(enc.format, pool_factor=p)
        t0 = time.perf_counter()
        docs = pool_documents(base.docs, fmt)
        pool_s = time.perf_counter() - t0
        drift = check_option_path([d.full_text for d in coll.corpus[:SAMPLE]], docs[:SAMPLE], p)
        store = open_store("exact", format=fmt)
        index_into(store, Encoded(base.doc_ids, docs, base.query_ids, base.queries), coll,
                   show_progress=False)
        t0 = time.perf_counter()
        run = fused_run(store, Encoded(base.doc_ids, docs, base.query_ids, base.queries), enc.dense_weight)
        search_s = time.perf_counter() - t0
        per_query = []
        for q in base.queries[: min(50, len(base.queries))]:  # p50 over single searches
            t1 = time.perf_counter()
            store.search(q, k=10)
            per_query.append(time.perf_counter() - t1)
        store.close()
        if reference is None:
            reference = run
        m = evaluate(run, coll.qrels)
        row = {
            "pool_factor": p,
            "documents": len(docs),
            "stored_vectors": int(sum(len(d) for d in docs)),
            "token_vectors": int(sum(len(d) - N_SLOTS for d in docs)),
            "ndcg@10": m["ndcg@10"],
            "recall@10": m["recall@10"],
            "recall@100": m["recall@100"],
            "overlap@10_vs_pool1": overlap_at_k(run, reference, 10),
            "pool_seconds": pool_s,
            "search_all_seconds": search_s,
            "search_p50_ms": 1000 * float(np.median(per_query)),
            "option_path_max_abs_diff": drift,
        }
        rows.append(row)
        print(f"  pool {p}: {row['stored_vectors']:,} vectors ({row['token_vectors']:,} tokens), "
              f"nDCG@10 {row['ndcg@10']:.4f}, pooled in {pool_s:.1f} s, p50 {row['search_p50_ms']:.1f} ms",
              flush=True)
    one = rows[0]
    for r in rows:
        r["stored_ratio"] = r["stored_vectors"] / one["stored_vectors"]
        r["token_ratio"] = r["token_vectors"] / one["token_vectors"]
        r["ndcg@10_delta_points"] = 100 * (r["ndcg@10"] - one["ndcg@10"])
    return {"collection": name, "queries": len(base.queries), "encode_seconds": encode_s,
            "dense_weight": enc.dense_weight, "rows": rows}


def markdown(report: dict) -> str:
    w = report["collections"][0]["dense_weight"]
    lines = [
        "# Token pooling at index time: stored vectors and nDCG@10",
        "",
        f"Run {report['date']} on {report['machine']} ({report['cpus']} CPUs), `benchmarks/pooling.py`; "
        f"load average {report['loadavg_start']} at the start, {report['loadavg_end']} at the end: the "
        "cores were shared with other work, so the timing columns are not quiet figures (nDCG, recall "
        "and the vector counts do not depend on load).",
        "",
        f"Embedded default encoder (dense weight {w:g}), exact store (exact MaxSim, in memory), queries "
        "never pooled. Stored vectors count the three slot vectors of every document, which are never "
        "pooled; token vectors are pooled to `max(n // pool_factor, 1)` per document. Aim (issue #59): "
        "pool factor 2 halves stored vectors with nDCG@10 within 0.5 points on every shared collection.",
        "",
        "| collection | pool factor | stored vectors | ratio | token vectors | ratio | nDCG@10 "
        "| delta (points) | recall@10 | recall@100 | overlap@10 vs pool 1 | pooling s | search p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["collections"]:
        for r in c["rows"]:
            lines.append(
                f"| {c['collection']} | {r['pool_factor']} | {r['stored_vectors']:,} "
                f"| {r['stored_ratio']:.3f} | {r['token_vectors']:,} | {r['token_ratio']:.3f} "
                f"| {r['ndcg@10']:.4f} | {r['ndcg@10_delta_points']:+.2f} | {r['recall@10']:.4f} "
                f"| {r['recall@100']:.4f} | {r['overlap@10_vs_pool1']:.3f} | {r['pool_seconds']:.1f} "
                f"| {r['search_p50_ms']:.1f} |")
    lines += ["", "## Against the aim", ""]
    for c in report["collections"]:
        two = next((r for r in c["rows"] if r["pool_factor"] == 2), None)
        if two is None:
            continue
        halved = "halved" if two["stored_ratio"] <= 0.5 else "not halved"
        d = two["ndcg@10_delta_points"]
        within = "within 0.5 points (or better)" if d >= -0.5 else "more than 0.5 points worse"
        lines.append(
            f"- {c['collection']}: pool factor 2 keeps {two['stored_ratio']:.1%} of stored vectors "
            f"({two['token_ratio']:.1%} of token vectors): {halved}; nDCG@10 {d:+.2f} points: {within}.")
    lines += ["", "The lists of each pool factor are the pool factor 1 lists pooled with the function "
              "the encoder's `pool_factor=` runs; on the first "
              f"{SAMPLE} documents of every collection an encoder made with that pool factor gave the "
              "same shapes, the largest difference per coordinate in `option_path_max_abs_diff` of the "
              "JSON (float noise of the model between batch compositions).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", nargs="*", default=None, help="folders under the datasets folder "
                    "(default: every one with a corpus.jsonl)")
    ap.add_argument("--factors", nargs="*", type=int, default=[1, 2, 3])
    ap.add_argument("--out", default=str(HERE / "results" / "pooling"))
    args = ap.parse_args()
    root = datasets_dir()
    names = args.collections or sorted(p.name for p in root.iterdir() if (p / "corpus.jsonl").exists())
    factors = sorted(set(args.factors) | {1})
    report = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "datasets": str(root),
        "factors": factors,
        "collections": [run_collection(n, factors) for n in names],
    }
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
