"""The worker of ``uibk-embed compare``: one backend in one fresh Python process.

The parent (:func:`_run_backend`) writes a spec (backend, options, the arrays folder) and runs
``python -m uibk_embedding.apps.compare_worker SPEC OUT``; the worker indexes and queries the
backend (:func:`run_worker`) and writes its result to ``OUT``, or why it was skipped.

>>> import tempfile
>>> d = Path(tempfile.mkdtemp())
>>> _ = (d / "a.bin").write_bytes(b"1234")
>>> _dir_bytes(d)
4
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.adapters.registry import open_store
from uibk_embedding.apps.compare_metrics import K
from uibk_embedding.apps.compare_options import _Skip
from uibk_embedding.maxsim import pack
from uibk_embedding.tagged import infer_format
from uibk_embedding.testing.milvus_server import LocalMilvusServer
from uibk_embedding.testing.pg_server import LocalPostgresServer


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def finish_build(store: Any, query: np.ndarray) -> None:
    """After the upserts: the store's ``flush()`` where it has one (WARP builds its index there,
    or at a search only once more than ``buffer_size`` documents wait), then one warm-up query.
    Both count in ``build_s``."""
    flush = getattr(store, "flush", None)
    if callable(flush):
        flush()
    store.search(query, k=K)


def search_path(store: Any) -> str | None:
    """Which path answered the store's searches: ``"index"`` or ``"exact"`` for a store whose
    ``stats()`` says (PLAID, WARP and the exact store search exactly below their
    ``min_index_vectors``), else None.

    >>> from uibk_embedding.adapters.exact import ExactStore
    >>> with ExactStore() as store:
    ...     search_path(store)
    'exact'
    """
    stats = getattr(store, "stats", None)
    return stats().get("search") if callable(stats) else None


# -- the worker (one backend, one fresh process) ----------------------------------------------------
def _save_arrays(folder: Path, doc_ids: list[str], docs: Sequence[np.ndarray], query_ids: list[str],
                 queries: Sequence[np.ndarray]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, lists in (("doc", docs), ("query", queries)):
        mat, off = pack(list(lists))
        np.save(folder / f"{prefix}_mat.npy", mat.astype(np.float32))
        np.save(folder / f"{prefix}_off.npy", off)
    (folder / "ids.json").write_text(json.dumps({"doc": doc_ids, "query": query_ids}))


def _load_arrays(folder: Path) -> tuple[list[str], list[np.ndarray], list[str], list[np.ndarray]]:
    ids = json.loads((folder / "ids.json").read_text())
    out = []
    for prefix in ("doc", "query"):
        mat, off = np.load(folder / f"{prefix}_mat.npy"), np.load(folder / f"{prefix}_off.npy")
        out.append([mat[off[i]:off[i + 1]] for i in range(len(off) - 1)])
    return ids["doc"], out[0], ids["query"], out[1]


def _status_mb(field: str, pid: int | str = "self") -> float | None:
    """``VmRSS`` / ``VmHWM`` (peak) of a process in MiB, from ``/proc`` (per process image:
    unlike ``getrusage``, not inherited from the parent across fork + exec)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _rss_mb() -> float:
    return _status_mb("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Index and query one backend as described by ``spec`` (run in a fresh process)."""
    started = time.perf_counter()
    doc_ids, docs, query_ids, queries = _load_arrays(Path(spec["arrays"]))
    base_rss = _rss_mb()
    folder = Path(spec["folder"])
    options = dict(spec["options"])
    server = None
    res: dict[str, Any] = {"base_rss_mb": round(base_rss, 1)}
    try:
        if options.pop("_local_server", False):
            server = LocalMilvusServer()
            options["uri"] = server.start()
        local_pg = options.pop("_local_pg", False)
        if local_pg:  # its memory is many processes': no single peak to report

            server = LocalPostgresServer()
            options["dsn"] = server.start()
        drop_table = options.pop("_drop_table", False)
        options.setdefault("format", infer_format(docs[0]))  # a store checks lists against its format
        t0 = time.perf_counter()
        store = open_store(spec["backend"], **options)
        res["open_s"] = time.perf_counter() - t0
        try:
            batch = int(spec.get("batch_size", 512))
            t0 = time.perf_counter()
            for i in range(0, len(docs), batch):
                store.upsert(doc_ids[i:i + batch], docs[i:i + batch])
            res["upsert_s"] = time.perf_counter() - t0
            finish_build(store, queries[0])
            res["build_s"] = time.perf_counter() - t0
            res["count"] = store.count()
            lat: list[float] = []
            runs: dict[str, list[str]] = {}
            deadline = started + float(spec.get("query_budget_s", math.inf))
            for _ in range(max(1, int(spec.get("repeat", 1)))):
                for qid, q in zip(query_ids, queries, strict=True):
                    if time.perf_counter() > deadline:
                        break
                    t1 = time.perf_counter()
                    hits = store.search(q, k=K)
                    lat.append(time.perf_counter() - t1)
                    runs.setdefault(qid, [h.id for h in hits])
            if len(runs) < len(query_ids):  # out of time: the figures cover the queries run
                res["queries_run"] = len(runs)
            else:
                t1 = time.perf_counter()
                store.search_batch(queries, k=K)
                res["batch_s"] = time.perf_counter() - t1
            res["latencies_s"] = lat
            res["runs"] = runs
            res["search"] = search_path(store)
            if server is not None and server.pid is not None and not local_pg:
                res["server_peak_rss_mb"] = _status_mb("VmHWM", server.pid)
            if hasattr(store, "size_bytes"):  # a database's own size of the store's relations
                res["index_bytes"] = store.size_bytes()
            elif server is not None and getattr(server, "_base", ""):
                res["index_bytes"] = _dir_bytes(Path(server._base))
            elif folder.exists() and any(folder.iterdir()):
                res["index_bytes"] = _dir_bytes(folder)
            else:
                res["index_bytes"] = None  # in memory or on a remote server
        finally:
            if drop_table:
                store.drop()
            store.close()
    finally:
        if server is not None:
            server.stop()
    res["peak_rss_mb"] = _status_mb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")


def _run_backend(label: str, backend: str, options: dict[str, Any], arrays: Path, folder: Path,
                 repeat: int, timeout: float, threads: int | None = None) -> dict[str, Any]:
    spec = {"backend": backend, "options": options, "arrays": str(arrays), "folder": str(folder),
            "repeat": repeat, "query_budget_s": 0.8 * timeout}
    spec_path = folder.parent / f"{label}.spec.json"
    out_path = folder.parent / f"{label}.result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "uibk_embedding.apps.compare_worker", str(spec_path), str(out_path)]
    try:
        env = dict(os.environ)
        if threads:
            env.update({v: str(threads) for v in THREAD_VARS})
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {timeout:.0f} s"}
    if out_path.exists():
        return json.loads(out_path.read_text())
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()
    return {"skipped": f"worker exited with status {proc.returncode}: {tail[-1] if tail else ''}"}


def _worker_main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    if os.environ.get("OMP_NUM_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    try:
        res = run_worker(spec)
    except (ImportError, NotImplementedError, _Skip) as e:
        res = {"skipped": f"{type(e).__name__}: {e}"}
    except Exception as e:  # a backend failure is reported, not raised
        res = {"skipped": f"failed: {type(e).__name__}: {e}"}
    tmp = Path(out_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(res))
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1], sys.argv[2]))
