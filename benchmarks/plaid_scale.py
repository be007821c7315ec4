"""PLAID (fast-plaid, CPU) against the exact store at NPL size and scaled up to 100k documents.

Steps, each a separate command so that none runs longer than a few minutes on a small machine
(the encoded vectors, stores and results persist in ``--work``):

    python benchmarks/plaid_scale.py encode                   # NPL -> /tmp/npl-vectors.npz (resumable)
    python benchmarks/plaid_scale.py build --docs 11426       # exact store + PLAID store, timed
    python benchmarks/plaid_scale.py search --docs 11426 --queries 50
    python benchmarks/plaid_scale.py sweep --docs 11426 --queries 50 \\
        --probe 4 8 --full 256 1024 --rerank 0 50 100          # search parameters, one table
    python benchmarks/plaid_scale.py rerank --docs 11426       # the exact rerank step alone

``encode`` runs the embedded default encoder over NPL in chunks and stops after ``--budget-s``
seconds (rerun it to continue); the finished cache is one ``.npz`` (documents and queries,
float32, packed). ``--docs N`` above the 11,426 real documents adds synthetic ones
(:func:`uibk_embedding.apps.compare.synthetic_corpus`: noisy copies of NPL documents, no
re-encoding), the same documents for every backend and every run (seed 0).

``search`` times one query at a time (median of ``--runs`` per query; p50/p95 over queries) on
the exact store and on PLAID with the store's defaults, interleaved query by query so that both
see the same machine, and reports recall@10 of PLAID against the exact top 10. A pause of
``--gap`` seconds separates the two stores' calls: numpy's OpenBLAS threads keep spinning for
up to ~0.1 s after a multi-threaded product and torch's OpenMP threads after theirs, so
back-to-back calls of the two libraries on 2 cores slow each other (one store per process
does not see that). ``build``
records build time and bytes on disk (the exact store's files; PLAID's index + vector file +
SQLite). Results: ``--work/results-<docs>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.maxsim import pack

NPL_DOCS = 11_426


def _uptime() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()
    except OSError:
        return "?"


# -- encoding (resumable) --------------------------------------------------------------------
def encode(args: argparse.Namespace) -> None:
    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.testing import datasets_dir

    out = Path(args.vectors)
    if out.exists():
        print(f"{out} exists")
        return
    parts = out.with_suffix(".parts")
    parts.mkdir(parents=True, exist_ok=True)
    coll = load_beir(datasets_dir() / "npl")
    texts = [d.full_text for d in coll.corpus]
    enc = load_encoder()
    t0 = time.perf_counter()
    chunk = args.chunk
    for lo in range(0, len(texts), chunk):
        f = parts / f"docs-{lo:06d}.npz"
        if f.exists():
            continue
        if time.perf_counter() - t0 > args.budget_s:
            print(f"budget spent; rerun to continue (at document {lo} of {len(texts)})")
            return
        mat, off = pack(enc.encode_documents(texts[lo:lo + chunk]))
        np.savez(f, mat=mat.astype(np.float32), off=off)
        print(f"documents {lo}..{min(lo + chunk, len(texts))} of {len(texts)} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    qids = list(coll.queries)
    qmat, qoff = pack(enc.encode_queries([coll.queries[q] for q in qids], dense_weight=1.0))
    docs = []
    for lo in range(0, len(texts), chunk):
        with np.load(parts / f"docs-{lo:06d}.npz") as z:
            m, o = z["mat"], z["off"]
            docs += [m[o[i]:o[i + 1]] for i in range(len(o) - 1)]
    dmat, doff = pack(docs)
    tmp = out.with_name(f".tmp-{os.getpid()}-{out.name}")
    with open(tmp, "wb") as fh:
        np.savez(fh, doc_mat=dmat, doc_off=doff, doc_ids=np.array(json.dumps([d.id for d in coll.corpus])),
                 query_mat=qmat, query_off=qoff, query_ids=np.array(json.dumps(qids)))
    os.replace(tmp, out)
    shutil.rmtree(parts)
    print(f"wrote {out}: {len(docs)} documents, {len(dmat)} vectors, {len(qids)} queries")


def _unpack(mat: np.ndarray, off: np.ndarray) -> list[np.ndarray]:
    return [mat[off[i]:off[i + 1]] for i in range(len(off) - 1)]


def load_vectors(path: str | os.PathLike, n_docs: int | None = None
                 ) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    """NPL documents (scaled to ``n_docs`` with synthetic copies) and queries from the cache."""
    from uibk_embedding.apps.compare import synthetic_corpus

    with np.load(path) as z:
        ids = json.loads(str(z["doc_ids"]))
        docs = _unpack(z["doc_mat"], z["doc_off"])
        queries = _unpack(z["query_mat"], z["query_off"])
    if n_docs is not None:
        if n_docs <= len(docs):
            ids, docs = ids[:n_docs], docs[:n_docs]
        else:
            extra = synthetic_corpus(docs, n_docs - len(docs), seed=0)
            ids = ids + [f"syn-{i}" for i in range(len(extra))]
            docs = docs + extra
    return ids, docs, queries


# -- stores --------------------------------------------------------------------------------------
def _dir(args: argparse.Namespace) -> Path:
    return Path(args.work) / str(args.docs)


def _results(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    path = Path(args.work) / f"results-{args.docs}.json"
    return path, (json.loads(path.read_text()) if path.exists() else {"documents": args.docs})


def _save(path: Path, res: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    print(f"wrote {path}")


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _plaid_build_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for name in ("nbits", "kmeans_niters", "max_points_per_centroid", "n_samples_kmeans", "n_centroids"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    return kw


class _EngineTimer:
    """Wall time inside fast-plaid's k-means, its Rust ``create`` (compression + IVF), and the
    garbage collector, during a build; the rest of the build is ours (reading the vector file,
    SQLite, fsync) or fast-plaid's Python glue."""

    def __init__(self) -> None:
        self.t = {"kmeans_s": 0.0, "rust_create_s": 0.0, "gc_s": 0.0}
        self._gc0 = 0.0

    def _wrap(self, key: str, fn: Any) -> Any:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.t[key] += time.perf_counter() - t0
        return timed

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc0 = time.perf_counter()
        else:
            self.t["gc_s"] += time.perf_counter() - self._gc0

    def __enter__(self) -> _EngineTimer:
        import gc

        import fast_plaid.search.fast_plaid as fpm

        self._fpm, self._km, self._rust = fpm, fpm.compute_kmeans, fpm.fast_plaid_rust
        fpm.compute_kmeans = self._wrap("kmeans_s", self._km)

        class Rust:  # the module's create timed, everything else passed through
            def __getattr__(_, name: str) -> Any:
                return getattr(self._rust, name)
        rust = Rust()
        rust.create = self._wrap("rust_create_s", self._rust.create)  # type: ignore[attr-defined]
        fpm.fast_plaid_rust = rust
        gc.callbacks.append(self._gc)
        return self

    def __exit__(self, *exc: Any) -> None:
        import gc

        self._fpm.compute_kmeans, self._fpm.fast_plaid_rust = self._km, self._rust
        gc.callbacks.remove(self._gc)


def build(args: argparse.Namespace) -> None:
    from uibk_embedding.adapters.exact import ExactStore
    from uibk_embedding.plaid_backend.store import PlaidStore

    t0 = time.perf_counter()
    ids, docs, _ = load_vectors(args.vectors, args.docs)
    print(f"{len(docs)} documents, {sum(len(d) for d in docs)} vectors (loaded in "
          f"{time.perf_counter() - t0:.1f} s)", flush=True)
    rpath, res = _results(args)
    res["vectors"] = int(sum(len(d) for d in docs))
    d = _dir(args)
    if args.store in ("exact", "both"):
        shutil.rmtree(d / "exact", ignore_errors=True)
        t0 = time.perf_counter()
        exact = ExactStore(path=d / "exact", compact_every=10**9)
        exact.upsert(ids, docs)
        exact.compact()
        exact.close()
        res["exact_build_s"] = round(time.perf_counter() - t0, 2)
        res["exact_bytes"] = _dir_bytes(d / "exact")
        print(f"exact store: {res['exact_build_s']} s, {res['exact_bytes'] / 2**20:.1f} MiB", flush=True)
    if args.store in ("plaid", "both"):
        name = args.label or "plaid"
        shutil.rmtree(d / name, ignore_errors=True)
        import fast_plaid

        version = getattr(fast_plaid, "__version__", None)
        if version is None:
            import importlib.metadata
            version = importlib.metadata.version("fast-plaid")
        kw = _plaid_build_kwargs(args)
        t0 = time.perf_counter()
        with _EngineTimer() as timer:
            plaid = PlaidStore(d / name, num_threads=args.threads, **kw)
            plaid.upsert(ids, docs)
        total = time.perf_counter() - t0
        usage = plaid.disk_usage()
        n_centroids = int(np.load(plaid.path / plaid._index_dir / "centroids.npy", mmap_mode="r").shape[0])
        plaid.close()
        t = {k: round(v, 2) for k, v in timer.t.items()}
        ours = round(total - t["kmeans_s"] - t["rust_create_s"], 2)
        res.setdefault("plaid_builds", {})[name] = {
            "fast_plaid": version, "threads": args.threads, "params": kw, "build_s": round(total, 2),
            **t, "other_s": ours, "centroids": n_centroids, "bytes": usage, "load": _uptime()}
        print(f"plaid ({name}, fast-plaid {version}, {args.threads} threads, {kw}): {total:.1f} s "
              f"(k-means {t['kmeans_s']} s, Rust create {t['rust_create_s']} s, gc {t['gc_s']} s, "
              f"rest {ours} s), {n_centroids} centroids; index {usage['plaid_index'] / 2**20:.1f} MiB, "
              f"vectors {usage['vectors'] / 2**20:.1f} MiB", flush=True)
    _save(rpath, res)


def _queries(args: argparse.Namespace) -> list[np.ndarray]:
    _, _, queries = load_vectors(args.vectors, 0)
    return queries[:args.queries]


def _exact_truth(args: argparse.Namespace, queries: list[np.ndarray]) -> tuple[list[list[str]], list[float]]:
    """The exact store's top 10 per query and its latency (median of ``--runs`` per query),
    cached in the work folder."""
    from uibk_embedding.adapters.exact import ExactStore

    cache = _dir(args) / f"exact-top10-{len(queries)}.json"
    if cache.exists():
        c = json.loads(cache.read_text())
        return c["top"], c["latency_ms"]
    exact = ExactStore(path=_dir(args) / "exact")
    exact.search(queries[0], k=10)
    top, lat = [], []
    for q in queries:
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            hits = exact.search(q, k=10)
            times.append((time.perf_counter() - t0) * 1000)
        top.append([h.id for h in hits])
        lat.append(statistics.median(times))
    exact.close()
    cache.write_text(json.dumps({"top": top, "latency_ms": lat}))
    return top, lat


def _stats(lat: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p95_ms": round(float(np.percentile(lat, 95)), 2)}


def _time_plaid(store: Any, queries: list[np.ndarray], truth: list[list[str]], runs: int) -> dict[str, Any]:
    store.search(queries[0], k=10)
    lat, rec = [], []
    for q, t in zip(queries, truth, strict=True):
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            hits = store.search(q, k=10)
            times.append((time.perf_counter() - t0) * 1000)
        lat.append(statistics.median(times))
        rec.append(len({h.id for h in hits} & set(t)) / max(1, len(t)))
    return {**_stats(lat), "recall@10": round(float(np.mean(rec)), 4), "recall@10_min": float(np.min(rec))}


def search(args: argparse.Namespace) -> None:
    """Exact store and PLAID (store defaults unless given), interleaved query by query."""
    from uibk_embedding.adapters.exact import ExactStore
    from uibk_embedding.plaid_backend.store import PlaidStore

    queries = _queries(args)
    rpath, res = _results(args)
    exact = ExactStore(path=_dir(args) / "exact")
    plaid = PlaidStore(_dir(args) / (args.label or "plaid"), num_threads=args.threads, **_search_kwargs(args))
    for s in (exact, plaid):
        s.search(queries[0], k=10)
    lat_e, lat_p, rec = [], [], []
    for q in queries:
        te, tp = [], []
        for _ in range(args.runs):
            time.sleep(args.gap)
            t0 = time.perf_counter()
            he = exact.search(q, k=10)
            te.append((time.perf_counter() - t0) * 1000)
            time.sleep(args.gap)
            t0 = time.perf_counter()
            hp = plaid.search(q, k=10)
            tp.append((time.perf_counter() - t0) * 1000)
        lat_e.append(statistics.median(te))
        lat_p.append(statistics.median(tp))
        rec.append(len({h.id for h in he} & {h.id for h in hp}) / max(1, len(he)))
    row = {"plaid": {**_stats(lat_p), "recall@10": round(float(np.mean(rec)), 4),
                     "recall@10_min": float(np.min(rec))},
           "exact": _stats(lat_e), "queries": len(queries), "runs": args.runs, "threads": args.threads,
           "params": {"n_ivf_probe": plaid.n_ivf_probe, "n_full_scores": plaid.n_full_scores,
                      "rerank": plaid.rerank, "n_rerank": plaid.n_rerank}, "load": _uptime()}
    row["p50_ratio"] = round(row["plaid"]["p50_ms"] / row["exact"]["p50_ms"], 3)
    plaid.close()
    exact.close()
    res.setdefault("search", {})[f"{args.label or 'plaid'} threads={args.threads}"] = row
    print(json.dumps(row, indent=1))
    _save(rpath, res)


def _search_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for name in ("n_ivf_probe", "n_full_scores", "n_rerank"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    return kw


def sweep(args: argparse.Namespace) -> None:
    """PLAID's search parameters against the cached exact top 10 (one table)."""
    from uibk_embedding.plaid_backend.store import PlaidStore

    queries = _queries(args)
    truth, lat_exact = _exact_truth(args, queries)
    rpath, res = _results(args)
    plaid = PlaidStore(_dir(args) / (args.label or "plaid"), num_threads=args.threads)
    rows = res.setdefault("sweep", [])
    exact_row = {"config": "exact store", **_stats(lat_exact), "load": _uptime()}
    print(exact_row, flush=True)
    for probe in args.probe:
        for full in args.full:
            for rr in args.rerank:
                plaid.n_ivf_probe, plaid.n_full_scores = probe, full
                plaid.rerank, plaid.n_rerank = rr > 0, max(rr, 10)
                r = {"label": args.label or "plaid", "threads": args.threads, "n_ivf_probe": probe,
                     "n_full_scores": full, "n_rerank": rr,
                     **_time_plaid(plaid, queries, truth, args.runs), "exact_p50_ms": exact_row["p50_ms"]}
                rows.append(r)
                print(r, flush=True)
    plaid.close()
    _save(rpath, res)


def rerank(args: argparse.Namespace) -> None:
    """The exact rerank of ``--candidates`` documents: from the memory-mapped vector file (this
    store) against reading the same documents' float16 blobs from SQLite (schema 1's path)."""
    import sqlite3
    import tempfile

    from uibk_embedding.maxsim import maxsim_scores
    from uibk_embedding.plaid_backend.store import PlaidStore

    queries = _queries(args)
    plaid = PlaidStore(_dir(args) / (args.label or "plaid"), num_threads=args.threads)
    rng = np.random.default_rng(0)
    n = plaid.count()
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        db = sqlite3.connect(Path(tmp) / "blobs.sqlite")  # schema 1's table, same documents
        db.execute("CREATE TABLE docs (seq INTEGER PRIMARY KEY, n_rows INTEGER, vectors BLOB)")
        with db:
            for lo in range(0, n, 2000):
                chunk = list(plaid._id_of)[lo:lo + 2000]
                mat, off = plaid._gather(chunk, dtype=np.float16)
                db.executemany("INSERT INTO docs VALUES (?, ?, ?)",
                               [(s, int(off[i + 1] - off[i]), mat[off[i]:off[i + 1]].tobytes())
                                for i, s in enumerate(chunk)])
        new, old = [], []
        for q in queries:
            cand = np.sort(rng.choice(n, size=min(args.candidates, n), replace=False))
            seqs = np.fromiter(plaid._id_of, np.int64)[cand].tolist()
            for _ in range(args.runs):
                t0 = time.perf_counter()
                plaid._exact([q], seqs, 10)
                new.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                marks = ",".join("?" * len(seqs))
                rows = db.execute(f"SELECT n_rows, vectors FROM docs WHERE seq IN ({marks})", seqs).fetchall()
                docs = [np.frombuffer(b, np.float16).reshape(r, 128).astype(np.float32) for r, b in rows]
                mat, off = pack(docs)
                maxsim_scores([q], mat, off)
                old.append((time.perf_counter() - t0) * 1000)
        db.close()
    plaid.close()
    rpath, res = _results(args)
    row = {"candidates": args.candidates, "memory_map": _stats(new), "sqlite_blobs": _stats(old),
           "queries": len(queries), "runs": args.runs, "load": _uptime()}
    res["rerank"] = row
    print(json.dumps(row, indent=1))
    _save(rpath, res)


def profile(args: argparse.Namespace) -> None:
    """Where one PLAID query's time goes: fast-plaid's search call, our exact rerank, the rest."""
    import cProfile
    import pstats

    from uibk_embedding.plaid_backend.store import PlaidStore

    queries = _queries(args)
    plaid = PlaidStore(_dir(args) / (args.label or "plaid"), num_threads=args.threads, **_search_kwargs(args))
    spent = {"engine": 0.0, "rerank": 0.0}

    def timed(key: str, fn: Any) -> Any:
        def inner(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[key] += time.perf_counter() - t0
        return inner

    plaid._engine_candidates = timed("engine", plaid._engine_candidates)
    plaid._scores = timed("rerank", plaid._scores)  # every exact MaxSim of a search (the rerank)
    plaid.search(queries[0], k=10)
    rows = []
    for q in queries:
        for _ in range(args.runs):
            spent["engine"] = spent["rerank"] = 0.0
            t0 = time.perf_counter()
            plaid.search(q, k=10)
            total = time.perf_counter() - t0
            rows.append((total, spent["engine"], spent["rerank"]))
    t = np.array(rows) * 1000
    out = {"total_ms": round(float(np.median(t[:, 0])), 2), "engine_ms": round(float(np.median(t[:, 1])), 2),
           "rerank_ms": round(float(np.median(t[:, 2])), 2),
           "ours_other_ms": round(float(np.median(t[:, 0] - t[:, 1] - t[:, 2])), 2),
           "params": {"n_ivf_probe": plaid.n_ivf_probe, "n_full_scores": plaid.n_full_scores,
                      "n_rerank": plaid.n_rerank}, "threads": args.threads, "load": _uptime()}
    print(json.dumps(out))
    prof = cProfile.Profile()
    prof.enable()
    for q in queries:
        plaid.search(q, k=10)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    plaid.close()
    rpath, res = _results(args)
    res.setdefault("profile", []).append(out)
    _save(rpath, res)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode", help="encode NPL once (resumable)")
    e.add_argument("--vectors", default="/tmp/npl-vectors.npz")
    e.add_argument("--chunk", type=int, default=500)
    e.add_argument("--budget-s", type=float, default=480)
    for name, fn in (("build", build), ("search", search), ("sweep", sweep), ("rerank", rerank),
                     ("profile", profile)):
        c = sub.add_parser(name, help=fn.__doc__.splitlines()[0] if fn.__doc__ else name)
        c.add_argument("--vectors", default="/tmp/npl-vectors.npz")
        c.add_argument("--work", default="/tmp/plaid-scale", help="stores and results")
        c.add_argument("--docs", type=int, default=NPL_DOCS, help="collection size (NPL + synthetic)")
        c.add_argument("--queries", type=int, default=50)
        c.add_argument("--runs", type=int, default=3, help="timed runs per query (median)")
        c.add_argument("--threads", type=int, default=2, help="torch threads (PlaidStore num_threads)")
        c.add_argument("--label", default=None, help="PLAID store folder name (default 'plaid')")
    b_ = sub.choices["build"]
    b_.add_argument("--store", choices=["exact", "plaid", "both"], default="both")
    for name in ("nbits", "kmeans-niters", "max-points-per-centroid", "n-samples-kmeans", "n-centroids"):
        b_.add_argument(f"--{name}", type=int, default=None)
    for name in ("n-ivf-probe", "n-full-scores", "n-rerank"):
        for cmd in ("search", "profile"):
            sub.choices[cmd].add_argument(f"--{name}", type=int, default=None)
    sw = sub.choices["sweep"]
    sw.add_argument("--probe", type=int, nargs="+", default=[8])
    sw.add_argument("--full", type=int, nargs="+", default=[4096])
    sw.add_argument("--rerank", type=int, nargs="+", default=[100], help="0: no rerank")
    sub.choices["rerank"].add_argument("--candidates", type=int, default=100)
    sub.choices["search"].add_argument("--gap", type=float, default=0.2, help="pause between stores (s)")
    args = ap.parse_args(argv)
    print(f"load average {_uptime()}", flush=True)
    {"encode": encode, "build": build, "search": search, "sweep": sweep, "rerank": rerank,
     "profile": profile}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
