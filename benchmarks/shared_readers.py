"""Many readers, one writer on one store folder (issue 62): errors, consistency, throughput, memory.

For each backend (exact, PLAID, WARP, LanceDB) a folder of ``--docs`` random tagged lists is
built, then for each reader count in ``--readers`` (1, 2, 4) that many reader processes search it
for ``--seconds`` while one writer process upserts batches of 5 new documents and deletes older
batches of its own. Reported per backend and reader count:

* ``errors``: exceptions in any reader or the writer (must be 0);
* ``torn``: answers in which a writer batch appeared in part (must be 0: a reader sees whole
  writes only);
* ``mismatches``: hits whose score is not the exact MaxSim of that document's stored vectors
  (float16 stores: within 2e-2), and, for the exact store, answers whose ids are not the exact
  top k of the snapshot the search read (equal float32 scores in the order stored: the store's
  rule; two random documents did tie: 12.667008853 and 12.667009006 are one float32), and for
  LanceDB answers whose exact scores are not the exact top k's (``checked`` counts the answers
  whose snapshot every check read too: no write landed in between; the torn-batch check counts
  those as well);
* ``qps``: aggregate searches per second of search time over the readers (each reader's
  searches / the seconds its searches took, summed; checking is not timed), p50/p95 in ms;
* ``rss_mib`` / ``pss_mib``: resident and proportional memory of each reader at the end, read
  from ``/proc/self/smaps`` once the writer has exited and while every reader is still alive
  (PSS splits shared pages, the mapped vector file and the libraries among them, between the
  processes that map them); ``baseline_pss_mib``: the PSS of as many idle processes that
  imported exactly the modules a reader had (its ``sys.modules``), opened nothing and were
  measured together the same way; ``store_mib``: the readers' PSS less the baseline's, what
  the store itself costs them (its mapped files, its view of ids, the engine's state);
  ``pss_ratio`` / ``baseline_ratio`` / ``store_ratio``: against the row with one reader;
* ``loadavg``: the 1-minute load average before and after.

Run it alone on the machine (the lead's run, 60 s per point; ``--docs 11426 --tokens 48`` is
NPL's size, 582,726 vectors, where an exact reader's memory is mostly the shared vector file;
about 35 minutes, ten of them the PLAID and WARP builds; benchmarks/results/reader_memory.md
has where each reader's memory goes at that size):

    .venv/bin/python benchmarks/shared_readers.py --seconds 60 --docs 5000 \
        --out benchmarks/results/shared_readers.json
    .venv/bin/python benchmarks/shared_readers.py --seconds 60 --docs 11426 --tokens 48 \
        --out benchmarks/results/shared_readers_npl.json

``--modes plain,preload`` adds, after each backend's plain rows, the prefork rows (gunicorn
``--preload``, docs/serving.md): a parent process opens the folder read-only, runs one search,
calls ``gc.freeze()`` and forks the N readers, which search through the store object they
inherited (it opens its own SQLite connection in each child: docs/sharing.md; for LanceDB the
parent only imports it and its libraries, ``registry.import_engine``, and each child opens its
own); ``pss_total_mib`` is then the parent's PSS plus the readers', measured together;
``parent_pss_mib`` the parent's; ``pss_ratio`` against the preload row with one reader and
``vs_plain_one`` against the plain row with one reader.

The prefork rows beside the plain ones (the lead's run, alone on the machine; 4 backends x 2
modes x 3 reader counts x 60 s plus the builds and baselines: about 35 minutes at 5,000
documents, about 50 at NPL's size):

    .venv/bin/python benchmarks/shared_readers.py --seconds 60 --docs 5000 --modes plain,preload \
        --out benchmarks/results/shared_readers_preload.json

A short smoke run: ``--seconds 5 --docs 300 --readers 1,2 --backends exact`` (``--modes
plain,preload`` for both modes).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import multiprocessing as mp
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

K = 10
MAKERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "exact": ("uibk_embedding.adapters.exact", "ExactStore", {}),
    "plaid": ("uibk_embedding.plaid_backend.store", "PlaidStore",
              {"nbits": 2, "num_threads": 1, "min_index_vectors": 1000}),
    "warp": ("uibk_embedding.adapters.warp", "WarpStore", {"nbits": 2, "min_index_vectors": 1000}),
    "lancedb": ("uibk_embedding.adapters.lancedb", "LanceDBStore", {}),
}


def _open(backend: str, path: str, **kw: Any) -> Any:
    import importlib

    module, name, opts = MAKERS[backend]
    return getattr(importlib.import_module(module), name)(path, **{**opts, **kw})


def _lists(seed: int, n: int, rows: int = 24) -> list[np.ndarray]:
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list

    rng = np.random.default_rng(seed)
    return [make_list(TaggedFormat(), rng, rows) for _ in range(n)]


def _memory() -> tuple[float, float]:
    """RSS and PSS of this process in MiB (``/proc/self/smaps_rollup``; 0 where there is none)."""
    rss = pss = 0.0
    rollup = Path("/proc/self/smaps_rollup")
    if rollup.exists():
        for line in rollup.read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) / 1024
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) / 1024
    return rss, pss


def _measured_together(writer_gone: Any, barrier: Any, res: dict[str, Any]) -> None:
    """Wait until the writer has exited and every process of the group got here, read this
    process's memory into ``res``, and wait until every one has read its own (so each is read
    while all of them map what they share)."""
    if writer_gone is not None:
        writer_gone.wait(timeout=600)
    barrier.wait(timeout=600)
    time.sleep(0.2)
    res["rss_mib"], res["pss_mib"] = _memory()


def _baseline(modules: list[str], barrier: Any, out: Any) -> None:
    """An idle process that imported ``modules`` (a reader's ``sys.modules``) and opened nothing."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException:  # a module that imports only inside its package's own run
            continue
    res: dict[str, Any] = {}
    _measured_together(None, barrier, res)
    out.put(res)
    barrier.wait(timeout=600)


def _reader(backend: str, path: str, seconds: float, seed: int, out: Any, writer_gone: Any = None,
            barrier: Any = None, store: Any = None, opts: dict[str, Any] | None = None,
            checks: Any = None, encode: bool = False, encoder: Any = None) -> None:
    """One reader; ``store``: the store object a preloading parent opened before the fork;
    ``opts``: keywords of the reader's store (``--cache-bytes``); ``checks``: the queue of
    :func:`_check_lancedb` (LanceDB); ``encode``: each query a text encoded here first, by
    ``encoder`` (a preloading parent's) or by the embedded default loaded here (``--encode``)."""
    from uibk_embedding.maxsim import maxsim

    res: dict[str, Any] = {"errors": 0, "torn": 0, "mismatches": 0, "checked": 0, "times": [],
                           "first_error": None, "first_mismatch": None}
    try:
        if store is None:
            store = _open(backend, path, read_only=True, **(opts or {}))
        queries = _lists(seed, 32, rows=12)
        if encode and encoder is None:
            encoder = _encoder()
        dtype = store.build_params["vector_dtype"] if backend != "lancedb" else "float32"
        tol = 2e-2 if dtype == "float16" else 1e-3
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            i += 1
            try:
                q = encoder.encode_queries([_query_text(seed, i)])[0] if encode else queries[(i - 1) % 32]
                version = store._tbl.version if backend == "lancedb" else None  # the newest committed
                t0 = time.perf_counter()
                hits = store.search(q, k=K)
                res["times"].append(time.perf_counter() - t0)
                snapshot = getattr(store, "_data_version", None)  # the snapshot the search read
                recs = {r.id: r for r in store.get([h.id for h in hits])}
                for h in hits:  # documents are never overwritten here: a hit's vectors are its own
                    off = abs(maxsim(q, recs[h.id].vectors) - h.score) if h.id in recs else 0.0
                    if off > tol * max(1, abs(h.score)):
                        res["mismatches"] += 1
                        res["first_mismatch"] = res["first_mismatch"] or (
                            f"search {i}: {h.id} scored {h.score!r}, its stored vectors {h.score - off!r} or "
                            f"{h.score + off!r} (snapshot {snapshot})")
                if backend == "lancedb":  # a separate process checks the version it read
                    if checks is not None and version == store._tbl.version:  # no write landed between
                        with contextlib.suppress(queue.Full):
                            checks.put_nowait((store.table, version, q, [h.id for h in hits]))
                    continue
                batches: dict[Any, int] = {}
                for _, md in store.scan(filter={"batch": {"$exists": True}}):
                    batches[md["batch"]] = batches.get(md["batch"], 0) + 1
                # the store's own rule: equal scores in the order stored (scores() lists them so)
                want = sorted(store.scores(q).items(), key=lambda t: -t[1])[:K] \
                    if backend == "exact" else None
                if store._data_version != snapshot:  # a write landed meanwhile: another snapshot
                    continue
                res["checked"] += 1
                res["torn"] += sum(1 for n in batches.values() if n != 5)
                if want is not None and [h.id for h in hits] != [x for x, _ in want]:
                    res["mismatches"] += 1
                    res["first_mismatch"] = res["first_mismatch"] or (
                        f"search {i} (snapshot {snapshot}): {[(h.id, h.score) for h in hits]} against the "
                        f"exact top k {want}")
            except Exception:  # counted, and the first one kept
                res["errors"] += 1
                res["first_error"] = res["first_error"] or traceback.format_exc()[-1500:]
        res["modules"] = sorted(sys.modules)
        if barrier is None:
            res["rss_mib"], res["pss_mib"] = _memory()
        else:
            _measured_together(writer_gone, barrier, res)
    except Exception:
        res["errors"] += 1
        res["first_error"] = res["first_error"] or traceback.format_exc()[-1500:]
    out.put(res)
    if barrier is not None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=600)  # the others read theirs while this one still maps the store


def _preloaded(backend: str, path: str, seconds: float, n: int, out: Any, writer_gone: Any,
               opts: dict[str, Any] | None = None, checks: Any = None, encode: bool = False) -> None:
    """The prefork parent: opens the folder read-only and searches once (every module a reader
    needs imported, the vector file mapped), freezes its objects out of the cyclic GC's reach,
    forks ``n`` readers that search through its store object and reports its own memory, read
    together with theirs. LanceDB: the parent only imports it and its libraries (a child forked
    after the parent had searched, with LanceDB's runtime running, hung) and each child opens its
    own store."""
    res: dict[str, Any] = {"parent": True, "errors": 0, "first_error": None}
    procs: list[Any] = []
    try:
        inherited = None
        if backend == "lancedb":  # its runtime must not run before the fork (a child hung): imports only
            from uibk_embedding.adapters.registry import import_engine

            import_engine(backend)  # the adapter, LanceDB and pyarrow: their pages shared
        else:
            inherited = _open(backend, path, read_only=True, **(opts or {}))
            inherited.search(_lists(7, 1, rows=12)[0], k=K)
        encoder = _encoder() if encode else None  # loaded once, shared by the readers (the example's)
        gc.collect()
        gc.freeze()
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(n + 1)
        procs = [ctx.Process(target=_reader, args=(backend, path, seconds, 100 + r, out, writer_gone, barrier,
                                                   inherited, opts, checks, encode, encoder))
                 for r in range(n)]
        for p in procs:
            p.start()
        _measured_together(writer_gone, barrier, res)
        out.put(res)
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=600)
    except Exception:
        res["errors"] += 1
        res["first_error"] = traceback.format_exc()[-1500:]
        out.put(res)
    for p in procs:
        p.join(timeout=60)


def _check_lancedb(path: str, checks: Any, out: Any) -> None:
    """LanceDB's answers checked on the snapshot they read, in a process of its own (its reads
    are no reader's memory). A reader sends ``(table, version, query, ids)`` for a search
    that read one table version (the newest before the search and still the newest after it);
    this compares the exact scores of ``ids`` with those of the exact top k of that version's
    rows, read again from the folder and scored here (equal scores in any order: LanceDB's own
    among ties), and counts the version's writer batches held in part (``torn``).
    A version pruned before it was read is counted in ``pruned``; ``None`` ends it."""
    import lancedb

    from uibk_embedding.maxsim import maxsim_scores

    res: dict[str, Any] = {"checker": True, "checked": 0, "torn": 0, "mismatches": 0, "pruned": 0,
                           "errors": 0, "first_error": None}
    tables: dict[str, Any] = {}
    while (item := checks.get()) is not None:
        name, version, q, ids = item
        try:
            if name not in tables:
                tables[name] = lancedb.connect(path).open_table(name)
            try:
                tables[name].checkout(version)
                rows = tables[name].to_arrow().select(["id", "vectors", "metadata"]).combine_chunks()
            except Exception:  # pruned by the writer's upkeep meanwhile
                res["pruned"] += 1
                continue
            vectors = rows["vectors"].chunk(0)  # list<fixed_size_list<float, 128>>
            mat = vectors.values.values.to_numpy(zero_copy_only=False).reshape(-1, 128)
            scores = maxsim_scores([q], mat, vectors.offsets.to_numpy())[0]
            exact = dict(zip(rows["id"].to_pylist(), scores.tolist(), strict=True))
            best = sorted(exact.values(), reverse=True)[:K]
            batches: dict[Any, int] = {}
            for md in map(json.loads, rows["metadata"].to_pylist()):
                if "batch" in md:
                    batches[md["batch"]] = batches.get(md["batch"], 0) + 1
            res["checked"] += 1
            res["torn"] += sum(1 for n in batches.values() if n != 5)
            # the exact top k's scores, in order (LanceDB's order among equal scores is its own)
            res["mismatches"] += [exact.get(x) for x in ids] != best
        except Exception:
            res["errors"] += 1
            res["first_error"] = res["first_error"] or traceback.format_exc()[-1500:]
    out.put(res)


QUERY_WORDS = ("heart", "kidney", "vitamin", "protein", "cancer", "diet", "exercise", "sleep", "blood",
               "pressure", "brain", "bone", "infection", "vaccine", "liver", "sugar", "fat", "gene")


def _query_text(seed: int, i: int) -> str:
    """The ``i``-th query text of reader ``seed`` (``--encode``): a few health words, different
    from one query to the next."""
    rng = np.random.default_rng([seed, i])
    return "what is known about " + " and ".join(rng.choice(QUERY_WORDS, size=3, replace=False))


def _encoder() -> Any:
    """The embedded default encoder on one thread (a served worker's, examples/serve_store.py)."""
    from uibk_embedding import load_encoder

    return load_encoder(None, num_threads=1)


def _writer(backend: str, path: str, seconds: float, out: Any, tokens: int = 24) -> None:
    res: dict[str, Any] = {"errors": 0, "writes": 0, "first_error": None}
    try:
        store = _open(backend, path)
        end, b = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            try:
                store.upsert([f"w{b}-{j}" for j in range(5)], _lists(10_000 + b, 5, tokens),
                             [{"batch": b}] * 5)
                if b >= 10:
                    store.delete([f"w{b - 10}-{j}" for j in range(5)])
                res["writes"] += 1
                b += 1
            except Exception:
                res["errors"] += 1
                res["first_error"] = res["first_error"] or traceback.format_exc()[-1500:]
                time.sleep(0.05)
        store.close()
    except Exception:
        res["errors"] += 1
        res["first_error"] = res["first_error"] or traceback.format_exc()[-1500:]
    out.put(res)


def build(backend: str, path: str, n_docs: int, tokens: int = 24) -> None:
    """The folder, written in one upsert (one index build), in a process of its own."""
    store = _open(backend, path)
    store.upsert([f"d{j}" for j in range(n_docs)], _lists(1, n_docs, tokens))
    if hasattr(store, "flush"):
        store.flush()
    store.close()


def _baselines(modules: list[str], n: int) -> list[dict]:
    """The memory of ``n`` idle processes that imported ``modules``, measured together."""
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(n)
    procs = [ctx.Process(target=_baseline, args=(modules, barrier, q)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return results


def run(backend: str, n_docs: int, seconds: float, reader_counts: list[int], workdir: Path,
        tokens: int = 24, modes: tuple[str, ...] = ("plain",), opts: dict[str, Any] | None = None,
        encode: bool = False) -> list[dict]:
    """The rows of one backend; ``opts``: keywords of every reader's store; ``encode``: every
    reader encodes its query texts (``--encode``)."""
    path = str(workdir / backend)
    ctx = mp.get_context("spawn")
    builder = ctx.Process(target=build, args=(backend, path, n_docs, tokens))
    builder.start()
    builder.join()
    if builder.exitcode:
        raise RuntimeError(f"building the {backend} folder failed (exit {builder.exitcode})")
    rows: list[dict] = []
    plain_one: float | None = None
    for mode, n in [(m, n) for m in modes for n in reader_counts]:
        preload = mode == "preload"
        q, writer_gone, barrier = ctx.Queue(), ctx.Event(), ctx.Barrier(n)
        load0 = os.getloadavg()[0]
        checks, checked_q = (ctx.Queue(maxsize=16), ctx.Queue()) if backend == "lancedb" else (None, None)
        checker = ctx.Process(target=_check_lancedb, args=(path, checks, checked_q)) if checks else None
        if checker is not None:
            checker.start()
        if preload:
            procs = [ctx.Process(target=_preloaded,
                                 args=(backend, path, seconds, n, q, writer_gone, opts, checks, encode))]
        else:
            procs = [ctx.Process(target=_reader, args=(backend, path, seconds, 100 + r, q, writer_gone,
                                                       barrier, None, opts, checks, encode))
                     for r in range(n)]
        wproc = ctx.Process(target=_writer, args=(backend, path, seconds, q, tokens))
        for p in [*procs, wproc]:
            p.start()
        expected = n + 1 + preload  # the readers, the writer (and the preloading parent)
        results = [q.get(timeout=seconds + 600)]
        while "writes" not in results[-1] and len(results) < expected:
            results.append(q.get(timeout=seconds + 600))
        wproc.join(timeout=600)  # gone before the readers read their memory: it maps the store too
        writer_gone.set()
        results += [q.get(timeout=600) for _ in range(expected - len(results))]
        for p in procs:
            p.join(timeout=60 + seconds)
        if checker is not None:
            checks.put(None)
            results.append(checked_q.get(timeout=600))
            checker.join(timeout=60)
        readers = [r for r in results if "times" in r]
        counted = [*readers, *(r for r in results if r.get("checker"))]  # LanceDB's checks: its checker's
        writer = next(r for r in results if "writes" in r)
        parent = next((r for r in results if r.get("parent")), None)
        modules = next((r["modules"] for r in readers if "modules" in r), [])
        bases = _baselines(modules, n) if modules and not preload else []
        pss = sum(r.get("pss_mib", 0) for r in readers) + (parent or {}).get("pss_mib", 0)
        base = sum(b["pss_mib"] for b in bases)
        times = np.concatenate([np.asarray(r["times"]) for r in readers]) if readers else np.zeros(0)
        qps = sum(len(r["times"]) / max(sum(r["times"]), 1e-9) for r in readers)
        row = {"backend": backend, "mode": mode, "reader_opts": opts or {}, "encode": encode, "readers": n,
               "docs": n_docs, "seconds": seconds,
               "errors": sum(r["errors"] for r in results), "torn": sum(r["torn"] for r in counted),
               "mismatches": sum(r["mismatches"] for r in counted),
               "checked": sum(r["checked"] for r in counted), "searches": len(times),
               "pruned": sum(r.get("pruned", 0) for r in counted),
               "writes": writer["writes"], "qps": round(qps, 1),
               "p50_ms": round(float(np.percentile(times, 50)) * 1e3, 2) if len(times) else None,
               "p95_ms": round(float(np.percentile(times, 95)) * 1e3, 2) if len(times) else None,
               "rss_mib": [round(r.get("rss_mib", 0), 1) for r in readers],
               "pss_mib": [round(r.get("pss_mib", 0), 1) for r in readers],
               "pss_total_mib": round(pss, 1), "baseline_pss_mib": round(base, 1) if bases else None,
               "store_mib": round(pss - base, 1) if bases else None,
               "parent_pss_mib": round(parent["pss_mib"], 1) if parent and "pss_mib" in parent else None,
               "loadavg": [round(load0, 2), round(os.getloadavg()[0], 2)],
               "first_error": next((r["first_error"] for r in results if r["first_error"]), None),
               "first_mismatch": next((r["first_mismatch"] for r in readers if r.get("first_mismatch")),
                                      None)}
        first = next((r for r in rows if r["mode"] == mode), row)
        for key, name in (("pss_total_mib", "pss_ratio"), ("baseline_pss_mib", "baseline_ratio"),
                          ("store_mib", "store_ratio")):
            row[name] = round(row[key] / first[key], 2) if first[key] else None
        if mode == "plain" and n == 1:
            plain_one = row["pss_total_mib"]
        row["vs_plain_one"] = round(row["pss_total_mib"] / plain_one, 2) if plain_one else None
        print(json.dumps({k: v for k, v in row.items() if k != "first_error"}), flush=True)
        if row["first_error"]:
            print(row["first_error"], flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="exact,plaid,warp,lancedb")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--tokens", type=int, default=24, help="token vectors per document (3 slots added)")
    ap.add_argument("--readers", default="1,2,4")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--modes", default="plain",
                    help="comma-separated: plain (each reader opens the folder), preload (a parent opens "
                         "it, then forks the readers: gunicorn --preload)")
    ap.add_argument("--cache-bytes", type=int, default=None,
                    help="LanceDB readers' cache_bytes (the bound of LanceDB's caches in each reader)")
    ap.add_argument("--encode", action="store_true",
                    help="each reader encodes its queries with the embedded default encoder first, loaded by "
                         "the preloading parent in preload mode (a served worker: examples/serve_store.py)")
    args = ap.parse_args(argv)
    modes = tuple(args.modes.split(","))
    if set(modes) - {"plain", "preload"}:
        ap.error(f"--modes: unknown mode(s) {', '.join(sorted(set(modes) - {'plain', 'preload'}))}")
    workdir = Path(tempfile.mkdtemp(prefix="uibk-shared-"))
    rows: list[dict] = []
    try:
        for backend in args.backends.split(","):
            try:
                counts = [int(x) for x in args.readers.split(",")]
                opts = {"cache_bytes": args.cache_bytes} if backend == "lancedb" and args.cache_bytes else {}
                rows += run(backend, args.docs, args.seconds, counts, workdir, args.tokens, modes, opts,
                            args.encode)
            except ImportError as e:
                print(f"{backend}: skipped ({e})", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if any(r["errors"] or r["torn"] or r["mismatches"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
