"""Where the memory of N reader processes on one store folder goes (issue 62), smem-style.

One folder per backend of ``--docs`` random tagged lists of ``--tokens`` token vectors (plus 3
slots; NPL's size by default: 11,426 documents, 582,726 vectors), each with metadata holding a
text of ``--text-bytes`` characters (NPL's average, 270, by default), is built once
(``--workdir`` keeps it for the next run). Then, for each reader count N in ``--readers``:

* N reader processes open the folder ``read_only=True``, run ``--searches`` searches each, wait
  for one another and read their own ``/proc/self/smaps`` (all N alive, so shared pages are
  divided among all of them);
* N *baseline* processes import exactly the modules a reader had imported (its ``sys.modules``),
  open nothing, and read theirs the same way.

Reported per backend and N: the readers' total PSS, the baselines' total PSS, and the store's
own memory (readers minus baselines), each with its ratio to N = 1; and for one reader, per
kind of mapping (the store folder's files, libraries, anonymous memory: heap and maps, other
files), RSS, PSS, Shared_Clean and Private_Dirty in MiB. ``--tracemalloc`` adds, from one more
reader process, the Python allocations the open store holds (after the searches, less what the
imports held), by source line.

``--modes`` adds the prefork modes (gunicorn ``--preload``; docs/serving.md): a parent process
imports exactly the modules a plain reader had imported (``preload``), and also opens the folder
``read_only=True`` and runs 2 searches (``preload-open``: the forked readers use that store object,
which opens its own SQLite connection in each child: docs/sharing.md), calls ``gc.freeze()``, then
forks the N readers (``os.fork``); each runs its searches on the pages it shares with the parent.
Reported: the total PSS of parent + readers (all alive, measured together), its ratio to one
*plain* reader's PSS (``vs_plain_one``) and to the parent + 1 reader of the same mode
(``vs_one``). ``--trim`` calls glibc's ``malloc_trim(0)`` in every reader after its searches.

Measurements of memory, not of time, but the page cache is shared: run it with nothing else
reading large files. Example (NPL-sized, every backend, about 15 minutes the first time: most
of it the PLAID, WARP and LanceDB builds; ~3 minutes with the folders kept in ``--workdir``):

    .venv/bin/python benchmarks/reader_memory.py --workdir /tmp/uibk-reader-memory \
        --out benchmarks/results/reader_memory.json --tracemalloc

A smoke run: ``--docs 300 --tokens 20 --readers 1,2 --backends exact --searches 3``
(``--modes plain,preload,preload-open`` for the prefork modes).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MIB = 2**20
MAKERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "exact": ("uibk_embedding.adapters.exact", "ExactStore", {}),
    "plaid": ("uibk_embedding.plaid_backend.store", "PlaidStore",
              {"nbits": 4, "num_threads": 1, "min_index_vectors": 1000}),
    "warp": ("uibk_embedding.adapters.warp", "WarpStore", {"nbits": 4, "min_index_vectors": 1000}),
    "lancedb": ("uibk_embedding.adapters.lancedb", "LanceDBStore", {}),
}


def open_store(backend: str, path: str, **kw: Any) -> Any:
    module, name, opts = MAKERS[backend]
    return getattr(importlib.import_module(module), name)(path, **{**opts, **kw})


def random_lists(seed: int, n: int, tokens: int) -> list[np.ndarray]:
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list

    rng = np.random.default_rng(seed)
    return [make_list(TaggedFormat(), rng, tokens) for _ in range(n)]


WORDS = ("wing", "lift", "flutter", "boundary", "layer", "shock", "heat", "transfer", "plate", "flow")


def text_of(j: int, n_bytes: int) -> str:
    """A document's text of about ``n_bytes`` characters (words chosen by ``j``)."""
    words, size, i = [], 0, j
    while size < n_bytes:
        words.append(WORDS[i % len(WORDS)])
        size += len(words[-1]) + 1
        i = i * 7 + 3
    return " ".join(words)[:n_bytes]


def build(backend: str, path: str, n_docs: int, tokens: int, text_bytes: int = 270) -> None:
    """The folder, written in one upsert (one index build; in a process of its own: the parent
    maps nothing of it); each document's metadata hold a text of ``text_bytes`` characters
    (NPL's average is 270) and two fields."""
    store = open_store(backend, path)
    store.upsert([f"d{j}" for j in range(n_docs)], random_lists(0, n_docs, tokens),
                 [{"n": j, "lang": "en" if j % 2 else "de", "text": text_of(j, text_bytes)}
                  for j in range(n_docs)])
    if hasattr(store, "flush"):
        store.flush()
    store.close()


def ensure_folder(backend: str, workdir: Path, n_docs: int, tokens: int, text_bytes: int = 270) -> Path:
    path = workdir / f"{backend}-{n_docs}x{tokens}-t{text_bytes}"
    done = path.with_suffix(".built")
    if not done.exists():
        shutil.rmtree(path, ignore_errors=True)
        t0 = time.monotonic()
        p = mp.get_context("spawn").Process(target=build, args=(backend, str(path), n_docs, tokens,
                                                                 text_bytes))
        p.start()
        p.join()
        if p.exitcode:
            raise RuntimeError(f"building the {backend} folder failed (exit {p.exitcode})")
        done.write_text(f"{time.monotonic() - t0:.0f} s\n")
    return path


def _usage(folder: str | None) -> dict[str, Any]:
    from uibk_embedding._procmem import by_kind, mappings, totals

    maps = mappings()
    return {"total": totals(maps), "kinds": by_kind(maps, folder)}


def malloc_trim() -> bool:
    """glibc's ``malloc_trim(0)``: free heap memory at the top of every arena and whole free
    pages inside them given back to the system. False where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def reader(backend: str, path: str, searches: int, seed: int, barrier: Any, out: Any,
           store: Any = None, trim: bool = False) -> None:
    """One reader: opens the folder (or uses ``store``, opened by a preloading parent before the
    fork), runs ``searches`` searches, waits for the others and reports its memory."""
    try:
        if store is None:
            store = open_store(backend, path, read_only=True)
        for q in random_lists(seed, searches, 20):
            store.search(q, k=10)
        if trim:
            malloc_trim()
        res: dict[str, Any] = {"modules": sorted(sys.modules), "pid": os.getpid()}
    except BaseException as e:  # reported, and the others are not left waiting
        res = {"error": repr(e)}
    barrier.wait()
    time.sleep(0.3)
    res.update(_usage(path))
    out.put(res)
    barrier.wait()


def import_all(modules: list[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException:  # a module that only imports inside its package's run
            continue


def preloaded(backend: str, path: str, searches: int, modules: list[str], n: int, open_first: bool,
              trim: bool, out: Any) -> None:
    """The prefork parent (gunicorn ``--preload``): imports ``modules`` (and, ``open_first``, opens
    the folder read-only and runs 2 searches), freezes the objects it made out of the cyclic
    GC's reach (``gc.freeze()``: a collection in a child then writes none of their pages), forks
    ``n`` readers and measures itself while they are measured."""
    try:
        import_all(modules)
        store = None
        if open_first:
            store = open_store(backend, path, read_only=True)
            for q in random_lists(99, 2, 20):
                store.search(q, k=10)
        gc.collect()
        gc.freeze()
        ctx = mp.get_context("fork")
        barrier, q = ctx.Barrier(n + 1), ctx.Queue()
        procs = [ctx.Process(target=reader, args=(backend, path, searches, 100 + i, barrier, q, store, trim))
                 for i in range(n)]
        for p in procs:
            p.start()
        barrier.wait()
        time.sleep(0.3)
        mine = _usage(path)
        barrier.wait()
        readers = [q.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        out.put({"parent": mine, "readers": readers})
    except BaseException as e:  # reported to the benchmark
        out.put({"error": repr(e)})


def baseline(modules: list[str], barrier: Any, out: Any) -> None:
    import_all(modules)
    barrier.wait()
    time.sleep(0.3)
    out.put(_usage(None))
    barrier.wait()


def traced(backend: str, path: str, searches: int, modules: list[str], out: Any) -> None:
    """The Python allocations an open store holds after ``searches`` searches, by line (the
    modules the reader used imported first, so their import is not counted)."""
    import tracemalloc

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException:
            continue
    queries = random_lists(1, searches, 20)
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    store = open_store(backend, path, read_only=True)
    for q in queries:
        store.search(q, k=10)
    after = tracemalloc.take_snapshot()
    stats = after.compare_to(before, "lineno")
    top = [{"where": str(s.traceback[0]), "kib": round(s.size_diff / 1024, 1), "blocks": s.count_diff}
           for s in stats[:12]]
    out.put({"python_heap_mib": round(sum(s.size_diff for s in stats) / MIB, 2), "top": top})
    store.close()


def _run_group(target: Any, args_of: Any, n: int, *extra: Any) -> list[dict]:
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(i), barrier, q, *extra)) for i in range(n)]
    for p in procs:
        p.start()
    results = [q.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return results


def measure_preloaded(backend: str, path: Path, counts: list[int], searches: int, modules: list[str],
                      open_first: bool, plain_one: float | None, trim: bool) -> list[dict[str, Any]]:
    """The rows of one prefork mode (see the module docstring)."""
    mode = "preload-open" if open_first else "preload"
    rows: list[dict[str, Any]] = []
    for n in counts:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=preloaded,
                        args=(backend, str(path), searches, modules, n, open_first, trim, q))
        p.start()
        res = q.get(timeout=3600)
        p.join(timeout=60)
        errors = [res["error"]] if "error" in res else [r["error"] for r in res["readers"] if "error" in r]
        if errors:
            raise RuntimeError(f"{backend} {mode}: {errors[0]}")
        parent = res["parent"]["total"]["Pss"] / MIB
        readers = sum(r["total"]["Pss"] for r in res["readers"]) / MIB
        total = parent + readers
        row = {"mode": mode + ("+trim" if trim else ""), "readers": n, "pss_mib": round(total, 1),
               "parent_pss_mib": round(parent, 1), "readers_pss_mib": round(readers, 1),
               "rss_mib_each": [round(r["total"]["Rss"] / MIB, 1) for r in res["readers"]],
               "private_dirty_mib_each": [round(r["total"]["Private_Dirty"] / MIB, 1)
                                          for r in res["readers"]],
               "parent_rss_mib": round(res["parent"]["total"]["Rss"] / MIB, 1),
               "kinds_reader0": {k: {f: round(v / MIB, 1) for f, v in fields.items()}
                                 for k, fields in sorted(res["readers"][0]["kinds"].items())}}
        row["vs_one"] = round(total / rows[0]["pss_mib"], 2) if rows else 1.0
        row["vs_plain_one"] = round(total / plain_one, 2) if plain_one else None
        print(json.dumps({k: v for k, v in row.items() if not k.startswith("kinds")}), flush=True)
        rows.append(row)
    return rows


def measure(backend: str, path: Path, counts: list[int], searches: int, trace: bool,
            modes: tuple[str, ...] = ("plain",), trim: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"backend": backend, "rows": [], "preloaded": []}
    modules: list[str] | None = None
    plain_one: float | None = None
    if "plain" in modes:
        out.update(measure_plain(backend, path, counts, searches, trace, trim))
        modules = out.pop("modules")
        plain_one = out["rows"][0]["pss_mib"] if out["rows"] and out["rows"][0]["readers"] == 1 else None
    if modules is None and any(m != "plain" for m in modes):  # what one plain reader imports
        modules = _run_group(reader, lambda i: (backend, str(path), 1, 100), 1)[0].get("modules", [])
    for mode in modes:
        if mode != "plain":
            assert modules is not None
            out["preloaded"] += measure_preloaded(backend, path, counts, searches, modules,
                                                  mode == "preload-open", plain_one, trim)
    out["folder_mib"] = round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / MIB, 1)
    return out


def measure_plain(backend: str, path: Path, counts: list[int], searches: int, trace: bool,
                  trim: bool = False) -> dict[str, Any]:
    rows, ref = [], None
    for n in counts:
        readers = _run_group(reader, lambda i: (backend, str(path), searches, 100 + i), n, None, trim)
        errors = [r["error"] for r in readers if "error" in r]
        if errors:
            raise RuntimeError(f"{backend}: a reader failed: {errors[0]}")
        modules = readers[0]["modules"]
        bases = _run_group(baseline, lambda i, m=modules: (m,), n)
        pss = sum(r["total"]["Pss"] for r in readers) / MIB
        base = sum(b["total"]["Pss"] for b in bases) / MIB
        row = {"readers": n, "pss_mib": round(pss, 1), "baseline_pss_mib": round(base, 1),
               "store_mib": round(pss - base, 1),
               "rss_mib_each": [round(r["total"]["Rss"] / MIB, 1) for r in readers],
               "private_dirty_mib_each": [round(r["total"]["Private_Dirty"] / MIB, 1) for r in readers],
               "baseline_private_dirty_mib": round(bases[0]["total"]["Private_Dirty"] / MIB, 1),
               "kinds_reader0": {k: {f: round(v / MIB, 1) for f, v in fields.items()}
                                 for k, fields in sorted(readers[0]["kinds"].items())},
               "kinds_baseline0": {k: {f: round(v / MIB, 1) for f, v in fields.items()}
                                   for k, fields in sorted(bases[0]["kinds"].items())}}
        if ref is None:
            ref = row
        for key in ("pss_mib", "baseline_pss_mib", "store_mib"):
            row[key.replace("_mib", "") + "_ratio"] = round(row[key] / ref[key], 2) if ref[key] else None
        print(json.dumps({k: v for k, v in row.items() if not k.startswith("kinds")}), flush=True)
        rows.append(row)
    out: dict[str, Any] = {"rows": rows, "modules": modules}
    if trace:
        q = mp.get_context("spawn").Queue()
        p = mp.get_context("spawn").Process(target=traced, args=(backend, str(path), searches, modules, q))
        p.start()
        out["tracemalloc"] = q.get(timeout=3600)
        p.join(timeout=60)
        print(json.dumps(out["tracemalloc"]), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="exact,plaid,warp,lancedb")
    ap.add_argument("--docs", type=int, default=11_426)
    ap.add_argument("--tokens", type=int, default=48, help="token vectors per document (3 slots added)")
    ap.add_argument("--readers", default="1,2,4")
    ap.add_argument("--text-bytes", type=int, default=270,
                    help="characters of text in each document's metadata (NPL's average: 270)")
    ap.add_argument("--searches", type=int, default=20)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the built folders here")
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--modes", default="plain",
                    help="comma-separated: plain (each reader imports and opens), preload (a parent "
                         "imports, then forks the readers), preload-open (the parent also opens the folder)")
    ap.add_argument("--trim", action="store_true", help="malloc_trim(0) in every reader after its searches")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="uibk-reader-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for backend in args.backends.split(","):
            try:
                path = ensure_folder(backend, workdir, args.docs, args.tokens, args.text_bytes)
            except ImportError as e:
                print(f"{backend}: skipped ({e})", flush=True)
                continue
            print(f"{backend}: {path}", flush=True)
            modes = tuple(args.modes.split(","))
            unknown = set(modes) - {"plain", "preload", "preload-open"}
            if unknown:
                ap.error(f"--modes: unknown mode(s) {', '.join(sorted(unknown))}")
            results.append(measure(backend, path, [int(x) for x in args.readers.split(",")],
                                   args.searches, args.tracemalloc, modes, args.trim))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
