"""What fast-plaid's index alone costs and answers: could PLAID's ``compact`` drop its rows? (issue 59)

PLAID's ``compact`` profile keeps fast-plaid's index and, beside it, the exact store's rotated
4-bit rows (the store's source of truth: rebuilds, crash repair, the scan below
``min_index_vectors``): 0.31x of the float32 exact store's folder, not the issue's 0.16x. This
measures the best that dropping those rows could give: the index folder alone (``plaid-*``),
over the float32 exact store's whole folder, and the answers of fast-plaid's own scores
(``rerank=False``, as ``compact`` searches), at ``nbits`` 4 (the default) and 2, with the
store's probe (``n_ivf_probe=2``) and a wider one, so a loss can be told apart: candidates the
probe misses (the wider probe recovers them) or the codes' precision (it does not).

For every collection (the shared datasets, embedded default encoder, corpus cached by
:func:`~uibk_embedding.apps.evaluation.encode_collection`): one float32 exact store (the
reference: its folder's bytes, its top 10, its nDCG@10), then per ``nbits`` one PLAID
``compact`` store built in one write (``min_index_vectors=1``: an index from the first write, no
batched rebuilds), searched at each probe. Bytes and quality do not depend on the load.

Usage::

    .venv/bin/python benchmarks/plaid_codes.py                       # limit-small cranfield npl
    .venv/bin/python benchmarks/plaid_codes.py --collections cranfield --nbits 4 --probes 2

Writes ``benchmarks/results/plaid_codes.{json,md}`` (``--out`` for another stem).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from uibk_embedding import open_store
from uibk_embedding.apps.evaluation import encode_beir
from uibk_embedding.encoder import load_encoder
from uibk_embedding.metrics import evaluate, overlap_at_k
from uibk_embedding.testing.specs import datasets_dir

K = 10


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder``."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def run_collection(name: str, nbits: list[int], probes: list[int], work: Path) -> list[dict]:
    """The reference and one PLAID ``compact`` store per ``nbits``, searched at each probe."""
    enc = load_encoder()
    coll, base, queries = encode_beir(datasets_dir() / name, enc)
    n_vectors = int(sum(len(d) for d in base.docs))
    exact = open_store("exact", path=work / "exact", format=enc.format)
    exact.upsert(base.doc_ids, base.docs)
    exact_bytes = exact.stats()["bytes_on_disk"]
    reference = {qid: [h.id for h in exact.search(q, k=K)]
                 for qid, q in zip(base.query_ids, queries, strict=True)}
    exact.close()
    ndcg0 = evaluate(reference, coll.qrels)["ndcg@10"]
    print(f"{name}: {len(base.docs)} documents, {n_vectors:,} vectors; exact folder "
          f"{exact_bytes / n_vectors:.1f} B/vector, nDCG@10 {ndcg0:.4f}", flush=True)
    rows = []
    for bits in nbits:
        folder = work / f"plaid-{bits}"
        t0 = time.perf_counter()
        store = open_store("plaid", path=folder, format=enc.format, profile="compact", nbits=bits,
                           min_index_vectors=1, num_threads=2)
        store.upsert(base.doc_ids, base.docs)
        build_s = time.perf_counter() - t0
        store_bytes = store.stats()["bytes_on_disk"]
        index_bytes = sum(folder_bytes(p) for p in folder.glob("plaid-*"))
        for probe in probes:
            store.n_ivf_probe = probe
            run = {qid: [h.id for h in store.search(q, k=K)]
                   for qid, q in zip(base.query_ids, queries, strict=True)}
            ndcg = evaluate(run, coll.qrels)["ndcg@10"]
            row = {"collection": name, "nbits": bits, "n_ivf_probe": probe, "vectors": n_vectors,
                   "exact_folder_per_vector": exact_bytes / n_vectors,
                   "index_per_vector": index_bytes / n_vectors, "index_x_exact": index_bytes / exact_bytes,
                   "store_x_exact": store_bytes / exact_bytes, "ndcg@10": ndcg,
                   "ndcg@10_delta_points": 100 * (ndcg - ndcg0),
                   "recall@10_vs_exact": overlap_at_k(run, reference, K), "build_s": build_s}
            rows.append(row)
            print(f"  nbits {bits}, probe {probe}: index {row['index_per_vector']:.1f} B/vector "
                  f"({row['index_x_exact']:.3f}x exact; the store with its rows "
                  f"{row['store_x_exact']:.3f}x), nDCG@10 {row['ndcg@10_delta_points']:+.2f} points, "
                  f"recall@10 {row['recall@10_vs_exact']:.3f}",
                  flush=True)
        store.close()
        shutil.rmtree(folder)
    shutil.rmtree(work / "exact")
    return rows


def markdown(report: dict) -> str:
    """The table, one row per collection, ``nbits`` and probe."""
    lines = [
        "# fast-plaid's index alone: bytes and answers (could PLAID `compact` drop its rows?)", "",
        f"Run {report['started']} on {report['cpus']} CPUs, `benchmarks/plaid_codes.py`; load average "
        f"{report['loadavg_start']} at the start, {report['loadavg_end']} at the end. Bytes and quality "
        "do not depend on the load.", "",
        "Index: the `plaid-*` folder alone, over the float32 exact store's whole folder. Store: PLAID "
        "`compact` as it is (the index + the rotated 4-bit rows + SQLite). Answers: fast-plaid's own scores "
        "(`rerank=False`), one build in one write, k=10; deltas against the float32 exact store.", "",
        "| collection | nbits | n_ivf_probe | index B/vector | index x exact | store x exact | nDCG@10 delta "
        "(points) | recall@10 vs exact |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        lines.append(f"| {r['collection']} | {r['nbits']} | {r['n_ivf_probe']} | "
                     f"{r['index_per_vector']:.1f} | {r['index_x_exact']:.3f} | {r['store_x_exact']:.3f} | "
                     f"{r['ndcg@10_delta_points']:+.2f} | {r['recall@10_vs_exact']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", nargs="+", default=["limit-small", "cranfield", "npl"])
    ap.add_argument("--nbits", type=int, nargs="+", default=[4, 2])
    ap.add_argument("--probes", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--out", default="benchmarks/results/plaid_codes", help="stem of the .json and .md")
    args = ap.parse_args(argv)
    report: dict = {"started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "cpus": len(os.sched_getaffinity(0)),
                    "loadavg_start": open("/proc/loadavg").read().split()[:3], "rows": []}
    work = Path(tempfile.mkdtemp(prefix="plaid-codes-"))
    try:
        for name in args.collections:
            report["rows"] += run_collection(name, args.nbits, args.probes, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(report, indent=1))
    Path(args.out + ".md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
