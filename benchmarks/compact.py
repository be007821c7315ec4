"""The exact store's profiles (issue 59): bytes per vector, quality and latency side by side.

For every BEIR collection under the shared datasets folder (``$UIBK_DATASETS`` or
``../shared/datasets``; read from there, never copied), with the embedded default encoder (the
corpus encoded once and cached by :func:`~uibk_embedding.apps.evaluation.encode_collection`), the
same lists are indexed into one persisted exact store per profile (a temporary folder each):
``exact`` (float32 rows, the reference), ``float16``, ``compact`` (rotated 4-bit rows only),
``exact-rerank`` (rotated 2-bit rows scanned, the best ``max(100, 4 k)`` rescored from float16
originals), ``int8`` (int8 rows only: ``compact`` before the 4-bit code) and ``int8-rerank``.

Reported per collection and profile: bytes per stored vector on disk (``stats()["bytes_on_disk"]``:
the whole folder, ids and metadata included) and resident (``stats()["resident_bytes"]``: the rows
a search scans plus the document table), their ratio to ``exact``, nDCG@10, recall@10 against
the float32 exact store's top 10, p50/p95 of one search (k=10, one query at a time, every query),
and the build time (upserting the encoded lists, 512 a batch, durably). nDCG, recall and bytes
do not depend on the machine's load; the timings do (the load average at the start and the end
is recorded, and the cores are named as shared unless ``--quiet-cores`` says they were not).

Usage::

    .venv/bin/python benchmarks/compact.py                       # every shared collection
    .venv/bin/python benchmarks/compact.py --collections cranfield limit-small
    .venv/bin/python benchmarks/compact.py --quiet-cores    # alone on the machine: timings count

Writes ``benchmarks/results/compact.json`` and ``compact.md`` (``--out`` for another stem); the
markdown ends with the "which profile when" table of the README, filled from the run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from uibk_embedding import open_store
from uibk_embedding.apps.evaluation import encode_beir, index_into
from uibk_embedding.encoder import load_encoder
from uibk_embedding.maxsim import kernel, kernel_kinds
from uibk_embedding.metrics import evaluate, overlap_at_k
from uibk_embedding.testing.specs import datasets_dir

HERE = Path(__file__).resolve().parent
PROFILES = ("exact", "float16", "compact", "exact-rerank", "int8", "int8-rerank")
WHEN = {  # the README's "which profile when": what each profile is for (the figures come from a run)
    "exact": "the reference: scores equal to the in-memory store's",
    "float16": "half the bytes, scores within float16 rounding",
    "compact": "the smallest folder (no originals), scores within the 4-bit code's bound",
    "exact-rerank": "the smallest scan; exact scores of its pool, originals on disk",
    "int8": "int8 rows only (compact before the 4-bit code)",
    "int8-rerank": "int8 scan, exact rerank from originals on disk",
}
K = 10


def _exact(folder: Path, profile: str, fmt, read_only: bool = False):
    if read_only:
        return open_store("exact", path=folder, read_only=True)  # as a served reader sees it
    return open_store("exact", path=folder, profile=profile, format=fmt)


def _plaid(folder: Path, profile: str, fmt, read_only: bool = False):
    # min_index_vectors=1: the PLAID index is built from the first write (the default 6M vectors
    # would leave these collections to the exact scan of the same rows); one torch thread: on
    # shared cores libtorch's threads stall each other (a 46-document search took 1.6-5 s at load
    # 16); quality does not depend on it
    opts = {"min_index_vectors": 1, "num_threads": 1}
    if read_only:
        return open_store("plaid", path=folder, read_only=True, **opts)
    return open_store("plaid", path=folder, profile=profile, format=fmt, **opts)


def _lancedb(folder: Path, profile: str, fmt, read_only: bool = False):
    return open_store("lancedb", path=folder, table="docs", profile=profile, format=fmt)


def _pgvector(folder: Path, profile: str, fmt, read_only: bool = False):
    # a table on a local server this process starts (testing/pg_server.py, removed when it exits);
    # its bytes "on disk" are the table's on the server: rows, TOAST (the lists) and every index
    from uibk_embedding.testing.pg_server import LocalPostgresServer

    table = re.sub(r"[^a-z0-9_]", "_", folder.name.lower())[:40]
    store = open_store("pgvector", dsn=LocalPostgresServer.shared_dsn(), table=table, format=fmt,
                       profile=None if read_only else profile)
    store._bytes_on_disk = store.size_bytes  # stats() reads it
    return store


def _qdrant_edge(folder: Path, profile: str, fmt, read_only: bool = False):
    # Edge builds a coded profile's codes when the writing store closes (or at optimize())
    return open_store("qdrant-edge", path=folder, profile=profile, format=fmt)


def _qdrant(folder: Path, profile: str, fmt, read_only: bool = False):
    # local mode: pure Python, keeps and checks the profile's settings but stores float32 and
    # searches exactly (its rows are the exact store's); a server applies them
    return open_store("qdrant", collection="docs", path=folder, profile=profile, format=fmt)


def _milvus_lite(folder: Path, profile: str, fmt, read_only: bool = False):
    # token_rows, FLAT rows: exact=True (the exactness bound) for float32 rows, candidates for float16
    return open_store("milvus-lite", path=folder / "milvus.db", profile=profile, format=fmt,
                      exact=profile == "exact", rows_per_vector=256)


OPENERS = {"exact": _exact, "plaid": _plaid, "lancedb": _lancedb, "pgvector": _pgvector,
           "qdrant-edge": _qdrant_edge, "qdrant": _qdrant, "milvus-lite": _milvus_lite}
"""backend -> ``open(folder, profile, format, read_only=False)``: a store of that backend keeping
``profile``, in ``folder`` (created), or reopened read-only as a served reader sees it (a backend
without ``read_only`` reopens as a writer would). Each engine's profiles are its own
compression (docs/compact.md); the reference is always the float32 exact store."""


def run_collection(name: str, profiles: tuple[str, ...], work: Path, backend: str = "exact") -> dict:
    enc = load_encoder()
    coll, base, queries = encode_beir(datasets_dir() / name, enc)
    n_vectors = int(sum(len(d) for d in base.docs))
    print(f"{name}: {len(base.docs)} documents, {n_vectors:,} vectors, {len(queries)} queries", flush=True)
    rows, reference = [], None
    runs = [("exact", "exact")] + [(backend, p) for p in profiles if (backend, p) != ("exact", "exact")]
    for engine, profile in runs:
        folder = work / f"{name}-{engine}-{profile}"
        store = OPENERS[engine](folder, profile, enc.format)
        t0 = time.perf_counter()
        index_into(store, base, coll, show_progress=False)
        build_s = time.perf_counter() - t0
        stats = store.stats()
        store.close()
        store = OPENERS[engine](folder, profile, enc.format, read_only=True)
        store.search(queries[0], k=K)  # the first search maps the file
        run, times = {}, []
        for qid, q in zip(base.query_ids, queries, strict=True):
            t1 = time.perf_counter()
            hits = store.search(q, k=K)
            times.append(time.perf_counter() - t1)
            run[qid] = [h.id for h in hits]
        store.close()
        shutil.rmtree(folder, ignore_errors=True)
        if reference is None:
            reference = run
        m = evaluate(run, coll.qrels)
        row = {
            "backend": engine,
            "profile": profile,
            "label": profile if engine == "exact" else f"{engine} {profile}",
            "vectors": stats["vectors"],
            "bytes_on_disk": stats["bytes_on_disk"],
            "resident_bytes": stats["resident_bytes"],
            "disk_per_vector": stats["bytes_on_disk"] / stats["vectors"],
            # None: the engine does not say (LanceDB): nan in the table
            "resident_per_vector": (stats["resident_bytes"] or float("nan")) / stats["vectors"],
            "ndcg@10": m["ndcg@10"],
            "recall@10_vs_exact": overlap_at_k(run, reference, K),
            "p50_ms": 1000 * float(np.percentile(times, 50)),
            "p95_ms": 1000 * float(np.percentile(times, 95)),
            "build_s": build_s,
        }
        rows.append(row)
        print(f"  {profile:>11}: {row['disk_per_vector']:.1f} B/vector on disk, "
              f"{row['resident_per_vector']:.1f} resident, nDCG@10 {row['ndcg@10']:.4f}, recall@10 vs exact "
              f"{row['recall@10_vs_exact']:.3f}, p50 {row['p50_ms']:.1f} ms, built in {build_s:.1f} s",
              flush=True)
    first = rows[0]
    for r in rows:
        r["disk_ratio"] = r["bytes_on_disk"] / first["bytes_on_disk"]
        r["resident_ratio"] = (r["resident_bytes"] or float("nan")) / first["resident_bytes"]
        r["ndcg@10_delta_points"] = 100 * (r["ndcg@10"] - first["ndcg@10"])
    return {"collection": name, "documents": len(base.docs), "queries": len(queries), "rows": rows}


def markdown(report: dict) -> str:
    timing = ("the cores were not shared" if report["quiet_cores"] else
              "the cores were shared with other work, so the timing columns (p50, p95, build) are not "
              "quiet figures; bytes, nDCG and recall do not depend on load")
    lines = [
        f"# The {report.get('backend', 'exact')} store's profiles: bytes per vector, quality, latency",
        "",
        f"Run {report['date']} on {report['machine']} ({report['cpus']} CPUs), `benchmarks/compact.py`, "
        f"MaxSim kernel `{report['kernel']}` (row kinds {report['kernel_kinds']}); load average "
        f"{report['loadavg_start']} at the start, {report['loadavg_end']} at the end: {timing}.",
        "",
        "Embedded default encoder, one persisted store per profile (and the float32 exact store, "
        "the reference), the same lists in each. "
        "Bytes per vector: the store folder (everything in it: ids, metadata, SQLite) and the "
        "resident bytes of `stats()` (the rows a search scans plus the document table), over the "
        "stored vectors. Recall@10 is against the float32 `exact` profile's top 10. One search at a "
        f"time, k={K}, every query; the build upserts the encoded lists (encoding not included).",
        "",
        "| collection | profile | disk B/vector | x exact | resident B/vector | x exact | nDCG@10 "
        "| delta (points) | recall@10 vs exact | p50 ms | p95 ms | build s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["collections"]:
        for r in c["rows"]:
            lines.append(
                f"| {c['collection']} | {r['label']} | {r['disk_per_vector']:.1f} | {r['disk_ratio']:.3f} "
                f"| {r['resident_per_vector']:.1f} | {r['resident_ratio']:.3f} | {r['ndcg@10']:.4f} "
                f"| {r['ndcg@10_delta_points']:+.2f} | {r['recall@10_vs_exact']:.3f} | {r['p50_ms']:.1f} "
                f"| {r['p95_ms']:.1f} | {r['build_s']:.1f} |")
    lines += ["", "## Against the aims of issue 59", ""]
    for c in report["collections"]:
        by = {r["label"]: r for r in c["rows"]}
        if "compact" in by:
            r = by["compact"]
            lines.append(f"- {c['collection']}, compact: folder {r['disk_ratio']:.3f}x the float32 exact "
                         f"store's (aim <= 0.16x: {'met' if r['disk_ratio'] <= 0.16 else 'not met'}), "
                         f"nDCG@10 {r['ndcg@10_delta_points']:+.2f} points (aim within 0.5: "
                         f"{'met' if r['ndcg@10_delta_points'] >= -0.5 else 'not met'}).")
        if "exact-rerank" in by:
            r = by["exact-rerank"]
            met = "met" if r["resident_per_vector"] <= 64 else "not met"
            p50 = by["exact"]["p50_ms"]
            shared = "" if report["quiet_cores"] else ", cores shared"
            speed = "" if c["collection"] != "npl" else (
                f", p50 {r['p50_ms']:.1f} ms against exact's {p50:.1f} (aim: no slower, "
                f"{'met' if r['p50_ms'] <= p50 else 'not met'}{shared})")
            lines.append(f"- {c['collection']}, exact-rerank: resident {r['resident_per_vector']:.1f} "
                         f"bytes/vector (aim <= 64: {met}), "
                         f"recall@10 vs exact {r['recall@10_vs_exact']:.3f} (aim >= 0.99: "
                         f"{'met' if r['recall@10_vs_exact'] >= 0.99 else 'not met'}){speed}.")
    lines += ["", "## Which profile when (the README's table, from this run)", "",
              *which_profile_when(report), ""]
    return "\n".join(lines)


def which_profile_when(report: dict) -> list[str]:
    """The README's "which profile when" table: per profile, what it is for and its figures in
    this run (bytes per vector on disk and resident, as a ratio of exact's folder, the nDCG@10
    delta and recall@10 range over the collections, NPL's p50)."""
    names = [r["label"] for r in report["collections"][0]["rows"]] if report["collections"] else []
    out = ["| profile | when | disk B/vector (x exact) | resident B/vector | nDCG@10 vs exact (points) "
           "| recall@10 vs exact | p50 ms on NPL |", "|---|---|---:|---:|---:|---:|---:|"]
    for name in names:
        rows = [(c["collection"], r) for c in report["collections"] for r in c["rows"]
                if r["label"] == name]
        disk = [r["disk_per_vector"] for _, r in rows]
        ratio = [r["disk_ratio"] for _, r in rows]
        res = [r["resident_per_vector"] for _, r in rows]
        nd = [r["ndcg@10_delta_points"] for _, r in rows]
        rec = [r["recall@10_vs_exact"] for _, r in rows]
        npl = [r["p50_ms"] for c, r in rows if c == "npl"]
        out.append(f"| `{name}` | {WHEN.get(name, '')} | {min(disk):.0f}-{max(disk):.0f} ({min(ratio):.2f}-"
                   f"{max(ratio):.2f}x) | {min(res):.0f}-{max(res):.0f} | {min(nd):+.2f} to {max(nd):+.2f} "
                   f"| {min(rec):.3f}-{max(rec):.3f} | {f'{npl[0]:.1f}' if npl else '-'} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", nargs="*", default=None, help="folders under the datasets folder "
                    "(default: every one with a corpus.jsonl)")
    ap.add_argument("--profiles", nargs="*", default=list(PROFILES), choices=PROFILES)
    ap.add_argument("--backend", default="exact", choices=sorted(OPENERS),
                    help="the backend whose profiles are measured (default exact); the float32 exact "
                         "store is always the first row, the reference")
    ap.add_argument("--out", default=str(HERE / "results" / "compact"))
    ap.add_argument("--quiet-cores", action="store_true", help="the machine ran nothing else (say so)")
    ap.add_argument("--work", default=None, help="where the stores are built (default: a temporary folder)")
    args = ap.parse_args()
    root = datasets_dir()
    names = args.collections or sorted(p.name for p in root.iterdir() if (p / "corpus.jsonl").exists())
    profiles = tuple(args.profiles)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="uibk-compact-"))
    report = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "kernel": kernel(),
        "kernel_kinds": kernel_kinds(),
        "quiet_cores": args.quiet_cores,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "datasets": str(root),
        "backend": args.backend,
        "collections": [run_collection(n, profiles, work, args.backend) for n in names],
    }
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
