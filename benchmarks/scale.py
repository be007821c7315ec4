"""Scale on one machine: build, disk, peak memory, latency and recall of the local engines
(exact store, PLAID, WARP), and the search settings, rerank and profile of an index it built.

One script for what ``scale.py``, ``plaid_scale.py``, ``warp_scale.py``, ``scale_sweep.py`` and
``plaid_recall.py`` measured before. NPL is encoded once (``encode``, resumable:
``/tmp/npl-vectors.npz``; ``--collection`` another of the shared collections) and grown with noisy
copies (:func:`uibk_embedding.apps.compare.synthetic_corpus`, generated in chunks of
``--chunk`` documents, chunk ``c`` from seed ``c``, so every engine gets the same documents and no
process holds the whole collection). The stores live in ``--work`` as ``{engine}-{docs}``.

Subcommands:

* ``encode``: NPL through the default encoder, in chunks, stopping after ``--budget-s`` (rerun it
  to continue).
* ``run``: for each size and engine (``--engines exact,exact16,plaid,warp``) ``load``, ``build``,
  optionally ``update`` (``--add``), then ``search`` in ``--rounds`` rounds; every step in a FRESH
  process, so its peak RSS (``VmHWM``, which counts the pages of memory-mapped files it touched as
  well as its heap) is that step's alone. Writes one JSON and one Markdown table (``--out``).

  - ``load``: stream the documents into a store (PLAID and WARP build no index while loading);
  - ``build``: open the loaded store and build its index: time, peak RSS, bytes on disk, and for
    PLAID the time inside fast-plaid's k-means, its Rust ``create`` and the garbage collector
    (``engine_s``) and the number of centroids;
  - ``update``: ``--add`` new documents, ``--chunk`` per upsert, to a copy of the built store
    (WARP: the engine's ``add`` against the trained centroids, or a rebuild where the store
    decides one);
  - ``search``: the NPL queries at k = 10, one at a time; each round runs every engine in its own
    process, the engine order rotated from round to round; a query's latency is its median over
    the rounds, p50/p95 are over queries, and recall@10 is against the exact store's top 10.

  Build options go per engine: ``--option plaid:nbits=2 --option plaid:num_threads=1``.
* ``sweep``: search settings (JSON store options) of a built PLAID or WARP store: recall@10
  against the exact store's top 10 (cached as ``exact-{docs}.top10.json``), p50/p95 latency
  (median of ``--runs`` per query), identical top 10s; with ``--time-exact`` the exact store is
  timed query by query beside each setting (interleaved, so both see the same machine: the
  latency ratio); ``--score-error`` the hits' scores against exact MaxSim; ``--dense-weight``
  queries with their slots scaled (no re-index); with ``--raw-scores N`` how the engine's raw
  scores of its top ``N`` relate to exact MaxSim. Appends JSON lines to ``--out``.
* ``rerank`` (PLAID): the exact rerank of ``--candidates`` documents from the memory-mapped vector
  file against reading the same documents' float16 blobs from SQLite (schema 1's path).
* ``profile`` (PLAID, WARP): where one query's time goes: the engine's candidate call, the exact
  MaxSim rerank, the rest; then the 12 heaviest functions of cProfile.
* ``crossover``: the exact scan, PLAID and WARP on random vectors at ``--docs`` sizes (where an
  index starts to pay); appends JSON lines to ``--out``.

::

    python benchmarks/scale.py encode                       # once, resumable
    python benchmarks/scale.py run --docs 30000 100000 --engines exact,plaid,warp \\
        --out benchmarks/results/scale

What the removed scripts measured, and how to get it now (every ``sweep``, ``rerank`` and
``profile`` also takes ``--docs N``, the size of the built store it reads):

* ``plaid_scale.py build`` (build time split, centroids, bytes): ``run --engines exact,plaid``
  (``build_s``, ``engine_s``, ``centroids``, ``disk_bytes``), build parameters as
  ``--option plaid:nbits=2`` etc.;
* ``plaid_scale.py search`` (PLAID defaults vs exact, interleaved, ``--gap``):
  ``sweep --engine plaid --settings '{}' --time-exact --runs 3 --gap 0.2``;
* ``plaid_scale.py sweep --probe 4 --full 256 --rerank 0 50``: ``sweep --engine plaid --settings
  '{"n_ivf_probe": 4, "n_full_scores": 256, "rerank": false}' '{"n_ivf_probe": 4,
  "n_full_scores": 256, "candidates": 50}' --time-exact``;
* ``plaid_scale.py rerank`` and ``profile``: ``rerank`` and ``profile --engine plaid``;
* ``warp_scale.py build`` (staged: create, then engine ``add``): ``run --engines exact,warp
  --add N`` (``build_s``, ``update_s``, ``update_chunk_s``, ``update_rebuilt``);
* ``warp_scale.py query`` (grid of rerank pools and ``nprobe``, raw score vs MaxSim):
  ``sweep --engine warp --settings '{"rerank": false}' '{"candidates": 100}' '{"candidates": 100,
  "nprobe": 8}' --time-exact --raw-scores 100``;
* ``scale_sweep.py``: ``sweep`` (one round: ``--runs 1``, the default).
* ``plaid_recall.py cranfield npl --rerank 10 100 --weights 1 4`` (recall, score error, latency
  per rerank pool and dense weight, on real collections): per collection ``encode --collection
  cranfield --vectors /tmp/cranfield-vectors.npz``, ``run --docs 1398 --engines exact,plaid
  --vectors ...``, then ``sweep --engine plaid --docs 1398 --vectors /tmp/cranfield-vectors.npz
  --time-exact --score-error --dense-weight 1 4 --settings '{"rerank": false}' '{"candidates": 10}'
  '{"candidates": 100}'``.

The synthetic documents beyond NPL's 11,426 come from other seeds than in the old scripts
(``plaid_scale.py`` used one seed for all, ``warp_scale.py`` seed = size), so figures above NPL's
size are comparable in kind, not document for document. ``run`` rows record the load average
before each step, ``sweep``/``rerank``/``profile`` rows the one at their end. Run it alone on the
machine: a test run or another benchmark on the same cores changes build times and latencies (not
peak RSS). Logs of the figures: ``benchmarks/results/memory-log.md``,
``benchmarks/results/plaid-log.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ENGINES = ("exact", "exact16", "compact", "exact-rerank", "plaid", "warp")
EXACT_PROFILES = {"exact16": "float16", "compact": "compact", "exact-rerank": "exact-rerank"}
"""The exact store's engines of this benchmark besides ``exact``: the profile each loads with
(docs/compact.md): ``compact`` is rotated 4-bit rows only, ``exact-rerank`` rotated 2-bit rows
scanned and the best reranked from float16 originals on disk."""


def _is_exact(engine: str) -> bool:
    return engine == "exact" or engine in EXACT_PROFILES


def _status(pid: int | str = "self") -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon and RssFile of a process (default: this one), in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _base(vectors: str) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
    with np.load(vectors) as z:
        ids = json.loads(str(z["doc_ids"]))
        dm, do = z["doc_mat"], z["doc_off"]
        qm, qo = z["query_mat"], z["query_off"]
    docs = [dm[do[i]:do[i + 1]] for i in range(len(do) - 1)]
    queries = [qm[qo[i]:qo[i + 1]] for i in range(len(qo) - 1)]
    return ids, docs, queries


def corpus(vectors: str, n_docs: int, chunk: int) -> Iterator[tuple[list[str], list[np.ndarray]]]:
    """The first ``n_docs`` documents, ``chunk`` at a time: NPL's own, then noisy copies."""
    from uibk_embedding.apps.compare import synthetic_corpus

    ids, docs, _ = _base(vectors)
    real = min(n_docs, len(docs))
    for lo in range(0, real, chunk):
        hi = min(lo + chunk, real)
        yield ids[lo:hi], docs[lo:hi]
    made, c = real, 0
    while made < n_docs:
        n = min(chunk, n_docs - made)
        yield [f"syn-{made + i}" for i in range(n)], synthetic_corpus(docs, n, seed=c)
        made, c = made + n, c + 1


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """``--option [ENGINE:]KEY=VALUE``: store options of this engine (no prefix: every engine)."""
    out: dict[str, Any] = {}
    for item in args.option or []:
        key, _, value = item.partition("=")
        engine, _, key = key.rpartition(":")
        if engine and engine != args.engine:
            continue
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _open(engine: str, path: Path, loading: bool = False, **options: Any) -> Any:
    if _is_exact(engine):  # exact16: float16 rows (half the bytes, slower scoring)
        from uibk_embedding.adapters.exact import ExactStore

        if engine in EXACT_PROFILES and not path.exists():
            options = {"profile": EXACT_PROFILES[engine], **options}
        return ExactStore(path=path, **options)
    # loading: no index yet (built once at the end); otherwise the engine's index at every size,
    # which is what this benchmark measures (the library's default, an exact scan below
    # min_index_vectors, is the `crossover` subcommand's subject)
    huge = {"min_index_vectors": 2**62} if loading else {"min_index_vectors": 1}
    if engine == "plaid":
        from uibk_embedding.plaid_backend.store import PlaidStore

        return PlaidStore(path, **{"num_threads": 2, **huge, **options})
    from uibk_embedding.adapters.warp import WarpStore

    return WarpStore(path, **{**huge, **options})


def cmd_load(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.work) / f"{args.engine}-{args.docs}"
    shutil.rmtree(path, ignore_errors=True)
    forget_top10(Path(args.work), args.engine, args.docs)  # of the store this load replaces
    harness = _status()
    t0 = time.perf_counter()
    store = _open(args.engine, path, loading=True, **_options(args))
    n_vectors = 0
    for ids, docs in corpus(args.vectors, args.docs, args.chunk):
        store.upsert(ids, docs)
        n_vectors += sum(len(d) for d in docs)
    if _is_exact(args.engine):
        store.compact()
    store.close()
    return {"load_s": round(time.perf_counter() - t0, 1), "vectors": n_vectors,
            "load_peak_rss": _status()["VmHWM"], "harness_rss": harness["VmRSS"]}


class _Phases:
    """RSS sampled every 50 ms in a thread, with the peak of each phase: ``kmeans`` while
    fast-plaid's ``compute_kmeans`` runs (PLAID), ``other`` the rest of the build. For PLAID also
    the wall time inside k-means, fast-plaid's Rust ``create`` (compression + IVF) and the garbage
    collector (``seconds``); the rest of a build is ours (vector file, SQLite, fsync) or
    fast-plaid's Python glue."""

    def __init__(self, plaid: bool) -> None:
        self.plaid = plaid
        self.phase, self.peaks, self._stop = "other", {"other": 0}, threading.Event()
        self.seconds = {"kmeans_s": 0.0, "rust_create_s": 0.0, "gc_s": 0.0}
        self._gc0 = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            rss = _status()["VmRSS"]
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)

    def _timed(self, key: str, fn: Any, phase: str | None = None) -> Any:
        def inner(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            if phase:
                self.phase = phase
            try:
                return fn(*a, **kw)
            finally:
                self.phase = "other"
                self.seconds[key] += time.perf_counter() - t0
        return inner

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc0 = time.perf_counter()
        else:
            self.seconds["gc_s"] += time.perf_counter() - self._gc0

    def __enter__(self) -> _Phases:
        self._thread.start()
        if not self.plaid:  # importing fast-plaid loads torch: not part of the other builds
            return self
        import gc

        import fast_plaid.search.fast_plaid as fpm

        self._fpm, self._kmeans, self._rust = fpm, fpm.compute_kmeans, fpm.fast_plaid_rust
        fpm.compute_kmeans = self._timed("kmeans_s", self._kmeans, "kmeans")
        outer = self

        class Rust:  # the module's create timed, everything else passed through
            def __getattr__(self, name: str) -> Any:
                return getattr(outer._rust, name)
        rust = Rust()
        rust.create = self._timed("rust_create_s", self._rust.create)  # type: ignore[attr-defined]
        fpm.fast_plaid_rust = rust
        gc.callbacks.append(self._gc)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        if hasattr(self, "_fpm"):
            import gc

            self._fpm.compute_kmeans, self._fpm.fast_plaid_rust = self._kmeans, self._rust
            gc.callbacks.remove(self._gc)


def cmd_build(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.work) / f"{args.engine}-{args.docs}"
    before = _status()
    t0 = time.perf_counter()
    with _Phases(args.engine == "plaid") as phases:
        store = _open(args.engine, path, **_options(args))
        if not _is_exact(args.engine):
            if store.has_index and args.rebuild:  # built on open already by an earlier run
                store.rebuild()
            store.flush()
            assert store.has_index, "no index was built"
    build_s = time.perf_counter() - t0
    st = _status()
    extra: dict[str, Any] = {}
    if args.engine == "plaid":
        import importlib.metadata

        extra = {"engine_s": {k: round(v, 2) for k, v in phases.seconds.items()},
                 "engine_version": importlib.metadata.version("fast-plaid"),
                 "centroids": int(np.load(store.path / store._index_dir / "centroids.npy",
                                          mmap_mode="r").shape[0])}
    store.close()
    return {"build_s": round(build_s, 1), "build_peak_rss": st["VmHWM"], "start_rss": before["VmRSS"],
            "phase_peak_rss": phases.peaks, "disk_bytes": _dir_bytes(path), **extra}


def cmd_update(args: argparse.Namespace) -> dict[str, Any]:
    """Add ``--add`` new documents, ``--chunk`` per upsert, to the built store copied to
    ``{engine}-{docs}-update``, each upsert followed by a flush that brings the index up to
    date (the engine's update path, or a rebuild where the store decides one). The new
    documents (noisy copies from other seeds) are made first, one ``.npy`` per chunk beside the
    store, and the base collection freed; the peak is reset after that and each chunk read only
    for its own upsert, so ``update_peak_rss`` is the store's plus one chunk of documents
    (``update_docs_bytes``: the largest chunk), as in an application that indexes a stream."""
    from uibk_embedding.apps.compare import synthetic_corpus
    from uibk_embedding.maxsim import pack

    built = Path(args.work) / f"{args.engine}-{args.docs}"
    path = built.with_name(built.name + "-update")
    if not built.exists():
        raise SystemExit(f"update: no built store at {built} (run load and build first)")
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(built, path)  # copy_file_range / sendfile: no pages of this process
    adds = Path(tempfile.mkdtemp(prefix="adds-", dir=args.work))
    try:
        _, base, _ = _base(args.vectors)
        chunks, docs_bytes = [], 0
        for c, lo in enumerate(range(0, args.add, args.chunk)):
            n = min(args.chunk, args.add - lo)
            mat, off = pack(synthetic_corpus(base, n, seed=10**6 + c))
            np.save(adds / f"{c}-mat.npy", mat)
            np.save(adds / f"{c}-off.npy", off)
            chunks.append([f"add-{lo + i}" for i in range(n)])
            docs_bytes = max(docs_bytes, mat.nbytes)
        del base, mat
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)
        before = _status()
        t0 = time.perf_counter()
        store = _open(args.engine, path, **_options(args))
        generation = getattr(store, "_generation", None)
        open_s, chunk_s, chunk_peak = time.perf_counter() - t0, [], []
        for c, ids in enumerate(chunks):
            t = time.perf_counter()
            mat, off = np.load(adds / f"{c}-mat.npy"), np.load(adds / f"{c}-off.npy")
            store.upsert(ids, np.split(mat, off[1:-1]))
            del mat
            if hasattr(store, "flush"):  # WARP indexes at a flush (or a search), not at each upsert
                store.flush()
            chunk_s.append(round(time.perf_counter() - t, 2))
            chunk_peak.append(_status()["VmHWM"])  # which upsert raised the peak
        update_s = time.perf_counter() - t0
    finally:
        shutil.rmtree(adds, ignore_errors=True)
    rebuilt = generation is not None and store._generation != generation
    st = _status()
    store.close()
    return {"update_docs": args.add, "update_chunk": args.chunk, "update_s": round(update_s, 1),
            "update_open_s": round(open_s, 1), "update_chunk_s": chunk_s, "update_rebuilt": rebuilt,
            "update_chunk_peak_rss": chunk_peak, "update_start_rss": before["VmRSS"],
            "update_docs_bytes": docs_bytes,
            "update_peak_rss": st["VmHWM"], "update_disk_bytes": _dir_bytes(path)}


def queries_of(vectors: str, n: int) -> list[np.ndarray]:
    """The first ``n`` queries of the vectors file (the harness loads no documents)."""
    with np.load(vectors) as z:
        qm, qo = z["query_mat"], z["query_off"]
    return [qm[qo[i]:qo[i + 1]] for i in range(min(n, len(qo) - 1))]


def timed_search(store: Any, queries: list[np.ndarray]) -> tuple[list[float], list[list[str]]]:
    """Each query's latency (ms) at k = 10, one at a time, and its top-10 ids."""
    lat, top = [], []
    for q in queries:
        time.sleep(0.02)  # let the previous call's BLAS / OpenMP threads settle
        t = time.perf_counter()
        hits = store.search(q, k=10)
        lat.append((time.perf_counter() - t) * 1000)
        top.append([h.id for h in hits])
    return lat, top


def recall(top: list[list[str]], exact: list[list[str]]) -> list[float]:
    """Per query: the share of the exact top 10 found."""
    return [len(set(a) & set(b)) / max(1, len(b)) for a, b in zip(top, exact, strict=True)]


def cmd_search(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.work) / f"{args.engine}-{args.docs}"
    queries = queries_of(args.vectors, args.queries)
    store = _open(args.engine, path, **_options(args))
    t0 = time.perf_counter()
    store.search(queries[0], k=10)
    first_s = time.perf_counter() - t0
    lat, top = timed_search(store, queries)
    st = _status()
    store.close()
    return {"latency_ms": lat, "top": top, "first_search_s": round(first_s, 2),
            "search_peak_rss": st["VmHWM"], "search_rss_anon": st["RssAnon"]}


def _sample_rss(child: subprocess.Popen, every: float = 0.05) -> tuple[int, int]:
    """Wait for ``child``; the peaks of its RssAnon (heap, anonymous maps) and RssFile (pages of
    files it maps: the vector file, the engine's index) sampled from outside every ``every`` s,
    so also while its Rust code holds the interpreter. Samples can miss a short peak; VmHWM, the
    kernel's exact peak of their sum, is the figure of record."""
    anon = file = 0
    while child.poll() is None:
        with contextlib.suppress(OSError, KeyError, ValueError):
            st = _status(child.pid)
            anon, file = max(anon, st["RssAnon"]), max(file, st["RssFile"])
        time.sleep(every)
    return anon, file


def _step(cmd: str, engine: str, docs: int, args: argparse.Namespace) -> dict[str, Any]:
    """One step in a fresh process; its JSON result."""
    argv = [sys.executable, str(Path(__file__).resolve()), cmd, "--engine", engine, "--docs", str(docs),
            "--work", args.work, "--vectors", args.vectors, "--chunk", str(args.chunk),
            "--queries", str(args.queries), "--add", str(args.add)]
    for item in args.option or []:
        argv += ["--option", item]
    load = _load_average()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen(argv, stdout=stdout, stderr=stderr, text=True)
        peaks = _sample_rss(child)
        stdout.seek(0), stderr.seek(0)
        if child.returncode:
            raise subprocess.CalledProcessError(child.returncode, argv, stdout.read(), stderr.read())
        res = json.loads(stdout.read().strip().splitlines()[-1])
    res[f"{cmd}_load_average"] = load
    res[f"{cmd}_peak_anon"], res[f"{cmd}_peak_file"] = peaks
    print(f"  {cmd:6s} {engine:5s} {docs:>8,}: "
          + ", ".join(f"{k}={v}" for k, v in res.items() if k not in ("latency_ms", "top")), flush=True)
    return res


def _summary(rows: dict[str, Any], reference: str = "exact") -> dict[str, Any]:
    """p50/p95 per engine; recall@10 and latency against the ``reference`` engine's row (the
    exact store: float32 rows, exact MaxSim; ``exact16`` where float32 rows would not fit the
    page cache)."""
    exact = rows.get(reference)
    for engine, r in rows.items():
        runs = r.pop("latency_runs")
        if not runs:  # --rounds 0: load, build and update only
            continue
        lat = np.median(np.array(runs), axis=0)
        r["p50_ms"] = round(float(np.percentile(lat, 50)), 2)
        r["p95_ms"] = round(float(np.percentile(lat, 95)), 2)
        r["reference"] = reference
        if exact is not None and "top" in exact and engine != reference:
            rec = recall(r["top"], exact["top"])
            r["recall@10_vs_exact"] = round(float(np.mean(rec)), 4)
            r["recall@10_min"] = round(float(np.min(rec)), 2)
    for r in rows.values():
        if exact is not None and "p50_ms" in exact and "p50_ms" in r:
            r["p50_vs_exact"] = round(r["p50_ms"] / exact["p50_ms"], 3)
        r["peak_rss"] = max(r.get(k, 0) for k in ("load_peak_rss", "build_peak_rss", "search_peak_rss"))
        r["aim_rss"] = int(1.5 * r["disk_bytes"] + 2**30)
        if "update_disk_bytes" in r:
            r["update_aim_rss"] = int(1.5 * r["update_disk_bytes"] + 2**30)
        r.pop("top", None)
    return rows


def cmd_run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    saved = out.with_suffix(".json")
    result: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() \
        else {"machine": {"cpus": os.cpu_count()}, "sizes": {}}
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for docs in args.docs:
        print(f"{docs:,} documents", flush=True)
        rows: dict[str, Any] = {}
        earlier = json.loads(Path(args.rows_from).read_text()) if args.rows_from else result
        old, reuse = earlier["sizes"].get(str(docs), {}), args.reuse.split(",")
        kept = ("load", "build", "update", "harness", "vectors", "disk", "start", "phase", "engine",
                "centroids")
        for engine in engines:
            options = _options(argparse.Namespace(option=args.option, engine=engine))
            if engine in reuse and engine in old:  # loaded and built by an earlier run
                if old[engine].get("options", {}) != options:
                    raise SystemExit(f"--reuse {engine}: its {docs:,}-document store was built with "
                                     f"{old[engine].get('options', {})}, not {options}")
                rows[engine] = {k: v for k, v in old[engine].items() if k.startswith(kept)}
            else:
                rows[engine] = {**_step("load", engine, docs, args), **_step("build", engine, docs, args)}
            rows[engine]["latency_runs"] = []
            rows[engine]["options"] = options
            if args.add:  # the update path, on a copy of the built store (removed after)
                try:
                    rows[engine].update(_step("update", engine, docs, args))
                finally:
                    shutil.rmtree(Path(args.work) / f"{engine}-{docs}-update", ignore_errors=True)
        for r in range(args.rounds):
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            for engine in order:
                res = _step("search", engine, docs, args)
                rows[engine]["latency_runs"].append(res.pop("latency_ms"))
                rows[engine]["top"] = res.pop("top")
                rows[engine].update(res)
        result["sizes"][str(docs)] = _summary(rows, args.reference)
        result.pop("options", None)  # before: one list for every size; now per row
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1))
        out.with_suffix(".md").write_text(markdown(result))
        print(markdown(result), flush=True)


def markdown(result: dict[str, Any]) -> str:
    mib = 2**20
    lines = ["| documents | engine | vectors | load (s) | build (s) | disk (MiB) | peak RSS load / build "
             "/ search (MiB) | build: heap / file pages, sampled (MiB) | aim 1.5 x disk + 1 GiB (MiB) "
             "| p50 / p95 (ms) | p50 vs exact | recall@10 vs exact (min) | load avg | options |",
             "|---:|---|---:|---:|---:|---:|---|---|---:|---|---:|---|---|---|"]
    for docs, rows in result["sizes"].items():
        for engine, r in rows.items():
            rec = f"{r['recall@10_vs_exact']} ({r['recall@10_min']})" if "recall@10_vs_exact" in r else "-"
            if r.get("reference", "exact") != "exact" and "recall@10_vs_exact" in r:
                rec += f" vs {r['reference']}"
            loads = "/".join(str(r.get(k, "?")) for k in ("load_load_average", "build_load_average",
                                                          "search_load_average"))
            peaks = " / ".join(f"{r[k] / mib:,.0f}" if k in r else "-"
                               for k in ("load_peak_rss", "build_peak_rss", "search_peak_rss"))
            split = " / ".join(f"{r[k] / mib:,.0f}" if k in r else "-"
                               for k in ("build_peak_anon", "build_peak_file"))
            lines.append(
                f"| {int(docs):,} | {engine} | {r['vectors']:,} | {r['load_s']} | {r['build_s']} | "
                f"{r['disk_bytes'] / mib:,.0f} | {peaks} | {split} | {r['aim_rss'] / mib:,.0f} | "
                f"{r.get('p50_ms', '-')} / {r.get('p95_ms', '-')} | {r.get('p50_vs_exact', '-')} | {rec} | "
                f"{loads} | "
                f"{', '.join(f'{k}={v}' for k, v in r.get('options', {}).items()) or 'defaults'} |")
    updates = [(docs, engine, r) for docs, rows in result["sizes"].items() for engine, r in rows.items()
               if "update_peak_rss" in r]
    if updates:
        lines += ["", "| documents | engine | added | per upsert | update (s) | median upsert (s) | rebuilt "
                  "| disk after (MiB) | peak RSS (MiB) | of which one upsert's documents (MiB) "
                  "| aim 1.5 x disk + 1 GiB (MiB) | load avg |",
                  "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
        for docs, engine, r in updates:
            per = r.get("update_chunk", "?")
            lines.append(
                f"| {int(docs):,} | {engine} | {r['update_docs']:,} | {per} | {r['update_s']} | "
                f"{np.median(r['update_chunk_s']):.2f} | {'yes' if r['update_rebuilt'] else 'no'} | "
                f"{r['update_disk_bytes'] / mib:,.0f} | {r['update_peak_rss'] / mib:,.0f} | "
                f"{r['update_docs_bytes'] / mib:,.0f} | {r['update_aim_rss'] / mib:,.0f} | "
                f"{r.get('update_load_average', '?')} |")
    return "\n".join(lines) + "\n"


# -- encoding (resumable) --------------------------------------------------------------------
def cmd_encode(args: argparse.Namespace) -> None:
    """NPL through the default encoder into one ``.npz`` (documents and queries, float32, packed),
    in chunks of ``--chunk`` documents, stopping after ``--budget-s`` seconds (rerun to continue)."""
    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.maxsim import pack
    from uibk_embedding.testing import datasets_dir

    out = Path(args.vectors)
    if out.exists():
        print(f"{out} exists")
        return
    parts = out.with_suffix(".parts")
    parts.mkdir(parents=True, exist_ok=True)
    coll = load_beir(datasets_dir() / args.collection)
    texts = [d.full_text for d in coll.corpus]
    enc = load_encoder()
    t0 = time.perf_counter()
    for lo in range(0, len(texts), args.chunk):
        f = parts / f"docs-{lo:06d}.npz"
        if f.exists():
            continue
        if time.perf_counter() - t0 > args.budget_s:
            print(f"budget spent; rerun to continue (at document {lo} of {len(texts)})")
            return
        mat, off = pack(enc.encode_documents(texts[lo:lo + args.chunk]))
        np.savez(f, mat=mat.astype(np.float32), off=off)
        print(f"documents {lo}..{min(lo + args.chunk, len(texts))} of {len(texts)} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    qids = list(coll.queries)
    qmat, qoff = pack(enc.encode_queries([coll.queries[q] for q in qids], dense_weight=1.0))
    docs = []
    for lo in range(0, len(texts), args.chunk):
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


# -- a built store: search settings, rerank, profile -----------------------------------------
def _built(args: argparse.Namespace, engine: str) -> Path:
    path = Path(args.work) / f"{engine}-{args.docs}"
    if not path.exists():
        raise SystemExit(f"no {engine} store at {path}: run `scale.py run --engines exact,{engine} "
                         f"--docs {args.docs}` first")
    return path


def forget_top10(work: Path, store: str, docs: int) -> list[Path]:
    """Delete the cached top 10s of the store ``{store}-{docs}`` (every dense weight's), which
    :func:`exact_top10` would otherwise reuse as the reference after the store is loaded anew
    (e.g. from vectors of another projection); returns the files deleted.

    >>> import tempfile
    >>> w = Path(tempfile.mkdtemp())
    >>> for name in ("exact-60.top10.json", "exact-60-w4.top10.json", "exact-600.top10.json"):
    ...     _ = (w / name).write_text("[]")
    >>> sorted(p.name for p in forget_top10(w, "exact", 60))
    ['exact-60-w4.top10.json', 'exact-60.top10.json']
    >>> sorted(p.name for p in w.iterdir())
    ['exact-600.top10.json']
    """
    gone = [p for p in work.glob(f"{store}-{docs}*.top10.json")
            if p.name == f"{store}-{docs}.top10.json" or p.name.startswith(f"{store}-{docs}-")]
    for p in gone:
        p.unlink()
    return gone


def exact_top10(work: Path, docs: int, queries: list[np.ndarray], tag: str = "",
                exact: Any = None, reference: str = "exact") -> list[list[str]]:
    """The exact store's top 10 of each query, cached next to the stores (``tag``: of queries
    changed, e.g. ``-w4`` for another dense weight; ``exact``: the store, already open;
    ``reference``: ``exact`` or ``exact16``, the store that gives them). ``load`` of that store
    deletes the cache (:func:`forget_top10`)."""
    cache = work / f"{reference}-{docs}{tag}.top10.json"
    top = json.loads(cache.read_text()) if cache.exists() else None
    if top is None or len(top) != len(queries):
        store = exact or _open(reference, work / f"{reference}-{docs}")
        top = [[h.id for h in store.search(q, k=10)] for q in queries]
        if exact is None:
            store.close()
        cache.write_text(json.dumps(top))
    return top


def _p50_p95(ms: list[float]) -> dict[str, float]:
    return {f"p{q}_ms": round(float(np.percentile(ms, q)), 2) for q in (50, 95)}


def _append(out: str, row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def _median_ms(store: Any, q: np.ndarray, runs: int, gap: float) -> tuple[float, list[str], list]:
    """The median latency (ms) of ``runs`` searches at k = 10, the ids and the hits."""
    times, hits = [], []
    for _ in range(runs):
        time.sleep(gap)  # let the previous call's BLAS / OpenMP threads settle
        t = time.perf_counter()
        hits = store.search(q, k=10)
        times.append((time.perf_counter() - t) * 1000)
    return float(np.median(times)), [h.id for h in hits], hits


def _raw_scores(store: Any, queries: list[np.ndarray], depth: int) -> dict[str, float]:
    """The engine's raw scores of its own top ``depth`` against exact MaxSim of the same
    documents (the stored originals)."""
    ratios, corrs = [], []
    for q in queries:
        cands = [(s, sc) for s, sc in store._engine_candidates([q], depth, None)[0] if s in store._id_of]
        exact = store._scores([q], [s for s, _ in cands])[0]
        raw = np.array([sc for _, sc in cands])
        ratios.append(float(np.median(raw / exact)))
        if len(cands) > 1:
            corrs.append(float(np.corrcoef(raw, exact)[0, 1]))
    return {"median_ratio": round(float(np.median(ratios)), 4), "min_ratio": round(min(ratios), 4),
            "max_ratio": round(max(ratios), 4),
            f"median_pearson_top{depth}": round(float(np.median(corrs)), 3) if corrs else None}


def cmd_sweep(args: argparse.Namespace) -> None:
    """Search settings of a built store against the exact store's top 10."""
    from uibk_embedding.apps.evaluation import with_dense_weight

    work = Path(args.work)
    path = _built(args, args.engine)
    ref = args.reference
    exact = _open(ref, _built(args, ref)) if args.time_exact or args.score_error else None
    for w in args.dense_weight:
        queries = [q if w == 1 else with_dense_weight(q, w) for q in queries_of(args.vectors, args.queries)]
        top = exact_top10(work, args.docs, queries, "" if w == 1 else f"-w{w:g}", exact, ref)
        truth = [exact.scores(q) for q in queries] if args.score_error and exact is not None else []
        for text in args.settings:
            _sweep_setting(args, path, exact, queries, top, truth, w, json.loads(text))
    if exact is not None:
        exact.close()


def _sweep_setting(args: argparse.Namespace, path: Path, exact: Any, queries: list[np.ndarray],
                   top: list[list[str]], truth: list[dict[str, float]], w: float,
                   setting: dict[str, Any]) -> None:
    store = _open(args.engine, path, **setting)
    store.search(queries[0], k=10)
    if exact is not None:
        exact.search(queries[0], k=10)
    lat, lat_exact, got, errs = [], [], [], []
    for i, q in enumerate(queries):
        if args.time_exact:
            lat_exact.append(_median_ms(exact, q, args.runs, args.gap)[0])
        ms, ids, hits = _median_ms(store, q, args.runs, args.gap)
        lat.append(ms)
        got.append(ids)
        if truth:  # the hits' scores against exact MaxSim (float32 originals)
            errs += [abs(h.score - truth[i][h.id]) / abs(truth[i][h.id]) for h in hits]
    rec = recall(got, top)
    row: dict[str, Any] = {
        "docs": args.docs, "engine": args.engine, "setting": setting, "dense_weight": w,
        "queries": len(queries), "runs": args.runs, "recall@10_vs_exact": round(float(np.mean(rec)), 4),
        "recall@10_min": round(min(rec), 2),
        "identical_top10": sum(g == t for g, t in zip(got, top, strict=True)), **_p50_p95(lat),
        "reference": args.reference}
    if lat_exact:
        row["exact_p50_ms"] = round(float(np.percentile(lat_exact, 50)), 2)
        row["p50_ratio"] = round(row["p50_ms"] / row["exact_p50_ms"], 3)
        row["median_latency_ratio_vs_exact"] = round(float(np.median(np.array(lat) / np.array(lat_exact))), 4)
    if errs:
        row["score_err_mean"] = float(f"{np.mean(errs):.2e}")
        row["score_err_max"] = float(f"{np.max(errs):.2e}")
    if args.raw_scores:
        row["raw_score_vs_maxsim"] = _raw_scores(store, queries, args.raw_scores)
    store.close()
    row["load_average"] = _load_average()
    _append(args.out, row)


def cmd_rerank(args: argparse.Namespace) -> None:
    """The exact rerank of ``--candidates`` documents of a PLAID store: from the memory-mapped
    vector file against the same documents' float16 blobs read from SQLite (schema 1's path)."""
    import sqlite3

    from uibk_embedding.maxsim import maxsim_scores, pack

    queries = queries_of(args.vectors, args.queries)
    plaid = _open("plaid", _built(args, "plaid"))
    rng = np.random.default_rng(0)
    all_seqs = np.fromiter(plaid._id_of, np.int64)
    n = len(all_seqs)
    new, old = [], []
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        db = sqlite3.connect(Path(tmp) / "blobs.sqlite")  # schema 1's table, same documents
        db.execute("CREATE TABLE docs (seq INTEGER PRIMARY KEY, n_rows INTEGER, vectors BLOB)")
        with db:
            for lo in range(0, n, 2000):
                chunk = all_seqs[lo:lo + 2000].tolist()
                mat, off = plaid._gather(chunk, dtype=np.float16)
                db.executemany("INSERT INTO docs VALUES (?, ?, ?)",
                               [(s, int(off[i + 1] - off[i]), mat[off[i]:off[i + 1]].tobytes())
                                for i, s in enumerate(chunk)])
        for q in queries:
            seqs = all_seqs[np.sort(rng.choice(n, size=min(args.candidates, n), replace=False))].tolist()
            for _ in range(args.runs):
                t0 = time.perf_counter()
                plaid._exact([q], seqs, 10)
                new.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                marks = ",".join("?" * len(seqs))
                rows = db.execute(f"SELECT n_rows, vectors FROM docs WHERE seq IN ({marks})", seqs).fetchall()
                dim = q.shape[1]
                docs = [np.frombuffer(b, np.float16).reshape(r, dim).astype(np.float32) for r, b in rows]
                maxsim_scores([q], *pack(docs))
                old.append((time.perf_counter() - t0) * 1000)
        db.close()
    plaid.close()
    _append(args.out, {"docs": args.docs, "candidates": args.candidates, "memory_map": _p50_p95(new),
                       "sqlite_blobs": _p50_p95(old), "queries": len(queries), "runs": args.runs,
                       "load_average": _load_average()})


def cmd_profile(args: argparse.Namespace) -> None:
    """Where one query's time goes: the engine's candidate call, the exact MaxSim rerank (the
    shared ``rerank_candidates`` loop or the store's ``_scores``: fetch and scoring), the rest;
    then cProfile's heaviest functions."""
    import cProfile
    import pstats

    queries = queries_of(args.vectors, args.queries)
    setting = json.loads(args.setting)
    store = _open(args.engine, _built(args, args.engine), **setting)
    spent = {"engine": 0.0, "rerank": 0.0}
    depth = [0]  # only the outermost timed call counts (a rerank that calls _scores: once)

    def timed(key: str, fn: Any) -> Any:
        def inner(*a: Any, **kw: Any) -> Any:
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    spent[key] += time.perf_counter() - t0
        return inner

    store._engine_candidates = timed("engine", store._engine_candidates)
    store._scores = timed("rerank", store._scores)  # the exact scan, and the rerank where it scores
    patched = []  # the shared candidates -> rerank loop, where the store's module calls one
    for cls in type(store).__mro__:
        mod = sys.modules.get(cls.__module__)
        if mod is not None and callable(getattr(mod, "rerank_candidates", None)) \
                and all(m is not mod for m, _ in patched):
            patched.append((mod, mod.rerank_candidates))
            mod.rerank_candidates = timed("rerank", mod.rerank_candidates)
    store.search(queries[0], k=10)
    rows = []
    for q in queries:
        for _ in range(args.runs):
            spent["engine"] = spent["rerank"] = 0.0
            t0 = time.perf_counter()
            store.search(q, k=10)
            rows.append((time.perf_counter() - t0, spent["engine"], spent["rerank"]))
    t = np.array(rows) * 1000
    out = {"docs": args.docs, "engine": args.engine, "setting": setting,
           "total_ms": round(float(np.median(t[:, 0])), 2), "engine_ms": round(float(np.median(t[:, 1])), 2),
           "rerank_ms": round(float(np.median(t[:, 2])), 2),
           "ours_other_ms": round(float(np.median(t[:, 0] - t[:, 1] - t[:, 2])), 2),
           "runs": args.runs, "load_average": _load_average()}
    prof = cProfile.Profile()
    prof.enable()
    for q in queries:
        store.search(q, k=10)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    for mod, fn in patched:
        mod.rerank_candidates = fn
    store.close()
    _append(args.out, out)


def crossover_corpus(n_docs: int, seed: int = 0) -> tuple[list[str], list[np.ndarray]]:
    """``n_docs`` random documents in the tagged format, NPL-like lengths: token counts drawn
    around NPL's mean of 51 vectors per document (uniform 20..82), unit token rows, 3 random
    dense slices. Random vectors: no cluster structure, so an index finds no shortcut that real
    text gives it; the latency of the exact scan does not depend on the values."""
    from uibk_embedding.tagged import TaggedFormat

    fmt, rng = TaggedFormat(), np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        u = rng.normal(size=(int(rng.integers(20, 83)), 127)).astype(np.float32)
        docs.append(fmt.build(rng.normal(size=(3, 127)), u / np.linalg.norm(u, axis=1, keepdims=True)))
    return [f"d{i}" for i in range(n_docs)], docs


def cmd_ties(args: argparse.Namespace) -> None:
    """How far an engine's top 10 is from the reference's in exact MaxSim (of the reference's
    rows): per query, the reference's 10th score ``s10``, and for the engine's hits the share whose
    exact score is within ``eps`` of ``s10`` (``s - s10 >= -eps * |s10|``: a near-tie the engine may
    order either way) for several ``eps``, and how crowded the reference's top is (its 1st and
    50th scores). Quality only: untimed. Appends one JSON line to ``--out``."""
    ref = _open(args.reference, _built(args, args.reference))
    store = _open(args.engine, _built(args, args.engine))
    eps = (0.0, 0.001, 0.005, 0.01, 0.02)
    per: list[dict[str, Any]] = []
    for q in queries_of(args.vectors, args.queries):
        truth = ref.scores(q)
        ranked = np.sort(np.fromiter(truth.values(), dtype=np.float64))[::-1]
        s10 = float(ranked[9])
        got = [truth[h.id] for h in store.search(q, k=10)]
        within = {f"within_{e:g}": float(np.mean([g - s10 >= -e * abs(s10) for g in got])) for e in eps}
        per.append({"s1": float(ranked[0]), "s10": s10, "s50": float(ranked[49]), **within})
    ref.close(), store.close()
    row = {"docs": args.docs, "engine": args.engine, "reference": args.reference, "queries": len(per),
           **{k: round(float(np.mean([p[k] for p in per])), 4) for k in per[0]},
           "min_within_0.01": round(min(p["within_0.01"] for p in per), 2),
           "s1_minus_s50_rel_median": round(float(np.median([(p["s1"] - p["s50"]) / abs(p["s1"])
                                                             for p in per])), 4)}
    _append(args.out, row)


def cmd_crossover(args: argparse.Namespace) -> None:
    """Exact scan vs PLAID vs WARP query latency at a few sizes: where an index starts to pay.

    Per size: one PLAID store answering from its exact scan (``min_index_vectors`` above the
    store: the path a file-backed store takes below its crossover), one PLAID and one WARP store
    with their index (``min_index_vectors=1``), default search settings; the build time of each
    index; then every query at k = 10 on every store, engines interleaved query by query (order
    rotated), ``--runs`` runs each; per store the p50/p95 over queries of the per-query medians.
    The load average is read before and after each size."""
    from uibk_embedding.adapters.warp import WarpStore
    from uibk_embedding.plaid_backend.store import PlaidStore
    from uibk_embedding.tagged import TaggedFormat

    fmt, rng = TaggedFormat(), np.random.default_rng(12345)
    queries = []
    for _ in range(args.queries):
        u = rng.normal(size=(32, 127)).astype(np.float32)
        queries.append(fmt.build(rng.normal(size=(3, 127)), u / np.linalg.norm(u, axis=1, keepdims=True)))
    for n_docs in args.docs:
        ids, docs = crossover_corpus(n_docs)
        n_vectors = int(sum(len(d) for d in docs))
        with tempfile.TemporaryDirectory(prefix="uibk-crossover-", dir=args.work or None) as tmp:
            stores: dict[str, Any] = {}
            build_s: dict[str, float] = {}
            load_before = Path("/proc/loadavg").read_text().split()[:3]
            for name, cls, opts in [("scan", PlaidStore, {"min_index_vectors": 2**62, "num_threads": 2}),
                                    ("plaid", PlaidStore, {"min_index_vectors": 1, "num_threads": 2}),
                                    ("warp", WarpStore, {"min_index_vectors": 1, "buffer_size": 0})]:
                store = cls(Path(tmp) / name, **opts)
                t = time.perf_counter()
                for lo in range(0, n_docs, args.chunk):
                    store.upsert(ids[lo:lo + args.chunk], docs[lo:lo + args.chunk])
                store.flush()
                build_s[name] = round(time.perf_counter() - t, 2)
                assert store.has_index == (name != "scan"), name
                stores[name] = store
            names = list(stores)
            per: dict[str, list[float]] = {n: [] for n in names}
            agree: dict[str, list[float]] = {n: [] for n in names}
            for i, q in enumerate(queries):
                order = names[i % len(names):] + names[:i % len(names)]
                tops = {}
                for name in order:
                    ms, top, _ = _median_ms(stores[name], q, args.runs, args.gap)
                    per[name].append(ms)
                    tops[name] = top
                for name in names:
                    agree[name].append(len(set(tops[name]) & set(tops["scan"])) / 10)
            for store in stores.values():
                store.close()
        row = {"docs": n_docs, "vectors": n_vectors, "queries": len(queries), "runs": args.runs,
               "loadavg_before": load_before, "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
               "load_s": build_s,
               **{f"{n}_{k}": v for n in names for k, v in _p50_p95(per[n]).items()},
               **{f"{n}_recall10_vs_scan": round(float(np.mean(agree[n])), 3) for n in names}}
        _append(args.out, row)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode", help="encode NPL once (resumable)")
    e.add_argument("--vectors", default="/tmp/npl-vectors.npz")
    e.add_argument("--chunk", type=int, default=500)
    e.add_argument("--budget-s", type=float, default=480)
    e.add_argument("--collection", default="npl", help="a shared BEIR collection (npl, cranfield, ...)")
    for name in ("sweep", "rerank", "profile"):
        c = sub.add_parser(name)
        c.add_argument("--vectors", default="/tmp/npl-vectors.npz")
        c.add_argument("--work", default="/tmp/uibk-scale", help="the stores of `run`")
        c.add_argument("--docs", type=int, required=True)
        c.add_argument("--queries", type=int, default=93)
        c.add_argument("--runs", type=int, default=3 if name != "sweep" else 1, help="timed runs per query")
        c.add_argument("--out", default="", help="JSON lines file the results are appended to")
        if name in ("sweep", "profile"):
            c.add_argument("--engine", choices=("plaid", "warp"), required=True)
    sw = sub.choices["sweep"]
    sw.add_argument("--settings", nargs="+", default=["{}"], help="JSON objects of store options")
    sw.add_argument("--reference", default="exact", choices=("exact", "exact16"),
                    help="the exact store (float32 or float16 rows) whose top 10 is the truth")
    sw.add_argument("--time-exact", action="store_true",
                    help="time the exact store beside each setting, query by query")
    sw.add_argument("--gap", type=float, default=0.02, help="pause before each timed call (s)")
    sw.add_argument("--raw-scores", type=int, default=0, metavar="N",
                    help="also compare the engine's raw scores of its top N with exact MaxSim")
    sw.add_argument("--score-error", action="store_true",
                    help="relative error of the hits' scores against exact MaxSim (the exact store's)")
    sw.add_argument("--dense-weight", type=float, nargs="+", default=[1.0],
                    help="query dense weights (the query's slots scaled, no re-index)")
    sub.choices["rerank"].add_argument("--candidates", type=int, default=100)
    sub.choices["profile"].add_argument("--setting", default="{}", help="JSON object of store options")
    for name in ("load", "build", "update", "search", "run"):
        c = sub.add_parser(name)
        c.add_argument("--vectors", default="/tmp/npl-vectors.npz")
        c.add_argument("--work", default="/tmp/uibk-scale", help="stores")
        c.add_argument("--chunk", type=int, default=2000, help="documents per upsert")
        c.add_argument("--queries", type=int, default=93)
        c.add_argument("--option", action="append", help="[ENGINE:]KEY=VALUE store option (JSON value)")
        c.add_argument("--add", type=int, default=0, help="update: documents added to a copy of the "
                       "built store, --chunk per upsert (run: 0 = no update step)")
        if name == "run":
            c.add_argument("--docs", type=int, nargs="+", required=True)
            c.add_argument("--engines", default=",".join(ENGINES))
            c.add_argument("--rounds", type=int, default=3)
            c.add_argument("--reuse", default="", help="engines whose load and build rows (and stores) "
                           "an earlier run left: only searched again")
            c.add_argument("--rows-from", default="", help="the JSON of the earlier run whose rows "
                           "--reuse takes (default: the --out JSON)")
            c.add_argument("--out", default=str(HERE / "results" / "scale"))
            c.add_argument("--reference", default="exact", choices=("exact", "exact16"),
                           help="the engine recall and 'vs exact' are measured against")
        else:
            c.add_argument("--engine", choices=ENGINES, required=True)
            c.add_argument("--docs", type=int, required=True)
            c.add_argument("--rebuild", action="store_true", help="build: rebuild an existing index")
    ti = sub.add_parser("ties", help="an engine's top 10 in exact MaxSim: near-ties of the reference's 10th")
    ti.add_argument("--vectors", default="/tmp/npl-vectors.npz")
    ti.add_argument("--work", default="/tmp/uibk-scale", help="the stores of `run`")
    ti.add_argument("--docs", type=int, required=True)
    ti.add_argument("--queries", type=int, default=30)
    ti.add_argument("--engine", choices=ENGINES, required=True)
    ti.add_argument("--reference", default="exact", choices=("exact", "exact16"))
    ti.add_argument("--out", default="", help="JSON lines file the row is appended to")
    co = sub.add_parser("crossover", help="exact scan vs PLAID vs WARP latency at a few sizes")
    co.add_argument("--docs", type=int, nargs="+", default=[1000, 3000, 10000])
    co.add_argument("--queries", type=int, default=30)
    co.add_argument("--runs", type=int, default=3, help="timed runs per query and store")
    co.add_argument("--gap", type=float, default=0.02, help="pause before each timed call (s)")
    co.add_argument("--chunk", type=int, default=1000, help="documents per upsert")
    co.add_argument("--work", default="", help="parent of the temporary stores (default: the system's)")
    co.add_argument("--out", default="", help="JSON lines file the rows are appended to")
    args = p.parse_args(argv)
    later = {"run": cmd_run, "crossover": cmd_crossover, "encode": cmd_encode, "sweep": cmd_sweep,
             "rerank": cmd_rerank, "profile": cmd_profile, "ties": cmd_ties}
    if args.cmd in later:
        later[args.cmd](args)
        return 0
    res = {"load": cmd_load, "build": cmd_build, "update": cmd_update, "search": cmd_search}[args.cmd](args)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
