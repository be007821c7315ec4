"""``uibk-embed compare``: every backend on one collection, side by side, against exact MaxSim.

The collection is encoded once (cached on disk by :func:`~uibk_embedding.apps.evaluation.encode_collection`)
and written as plain arrays to a work folder. Each backend then runs in a FRESH Python process
(so its peak memory is its own and a crash or a missing dependency only skips that backend):
open the store, upsert every document, run one warm-up query (which also triggers lazy index
builds, e.g. WARP's), time every query one by one (``--repeat`` passes; a backend that reaches
80% of ``--timeout`` stops there and its figures cover the queries it ran, ``queries_run``) and
once as a batch,
measure the store's folder on disk, close. The parent scores the top-10 of each backend against
the qrels (nDCG@10, recall@10) and against exact MaxSim (recall@10 = overlap of the top-10s,
rank agreement), and writes ``compare.json``, ``compare.md`` and two PNG plots to ``--out``.

Backends are taken by registry name (``--backends exact,plaid,qdrant-edge``); a backend added to
the registry later works here unchanged. ``LABEL=NAME`` runs a backend under another label, and
``--option LABEL:KEY=VALUE`` passes it options (JSON values), e.g. two PLAID runs::

    uibk-embed compare npl --backends exact,plaid,plaid-raw=plaid --option plaid-raw:rerank=false

Benchmark defaults per backend (:data:`DEFAULT_OPTIONS`): a store folder inside the work folder,
so its size on disk can be measured; servers from ``QDRANT_URL`` / ``MILVUS_URI`` /
``WEAVIATE_URL`` when set. ``milvus`` without ``MILVUS_URI`` starts the local standalone server
(:class:`~uibk_embedding.testing.milvus_server.LocalMilvusServer`) in the worker; ``weaviate`` without
``WEAVIATE_URL`` is skipped. A backend that fails to import, open or index is reported as
skipped with the reason.

Peak memory: ``peak_rss_mb`` is the worker's peak resident set (``getrusage``), which includes
the document vectors the worker loads to index (``base_rss_mb``, measured before the store is
opened); the difference is what the backend itself used. A server child (local Milvus) is
counted separately (``server_peak_rss_mb``); a remote server's memory is not visible.

``--scale 10000,100000`` repeats the comparison on collections of those sizes: the real
documents first, then synthetic ones made from them (:func:`synthetic_corpus`: each copy of a
real document with noisy slot and token directions and a random tenth of its tokens dropped;
no re-encoding), and plots latency against collection size.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.testing import make_list
>>> from uibk_embedding.encoder.tagged import TaggedFormat
>>> docs = [make_list(TaggedFormat(), np.random.default_rng(i), 4) for i in range(3)]
>>> more = synthetic_corpus(docs, 5, seed=0)
>>> len(more), more[3].shape[1], bool(np.allclose(np.linalg.norm(more[4], axis=1), 1, atol=1e-5))
(5, 128, True)
>>> rank_agreement(["a", "b", "c"], ["a", "c", "b"])
0.6666666666666666
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from uibk_embedding.adapters.registry import BACKENDS, backend_factory, open_store
from uibk_embedding.apps.data import DataError, load_beir
from uibk_embedding.apps.evaluation import encode_collection
from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.tagged import N_SLOTS, infer_format
from uibk_embedding.maxsim import maxsim_scores, pack, top_k
from uibk_embedding.metrics import ndcg_at_k, overlap_at_k, recall_at_k
from uibk_embedding.testing.milvus_server import LocalMilvusServer
from uibk_embedding.testing.pg_server import LocalPostgresServer

K = 10


# -- benchmark defaults per backend -------------------------------------------------------------
def _url_or(env: str, key: str, local: dict[str, Any]) -> Callable[[Path], dict[str, Any]]:
    def make(d: Path) -> dict[str, Any]:
        return {key: os.environ[env]} if os.environ.get(env) else dict(local, path=str(d))

    return make


def _milvus(d: Path) -> dict[str, Any]:
    if os.environ.get("MILVUS_URI"):
        return {"uri": os.environ["MILVUS_URI"], "token": os.environ.get("MILVUS_TOKEN", ""),
                "collection": f"uibk_compare_{os.getpid()}"}
    return {"_local_server": True, "collection": f"uibk_compare_{os.getpid()}"}


def _pgvector(d: Path) -> dict[str, Any]:
    table = f"uibk_compare_{os.getpid()}"
    if os.environ.get("PG_DSN"):  # the table is dropped again at the end
        return {"dsn": os.environ["PG_DSN"], "table": table, "_drop_table": True}
    return {"_local_pg": True, "table": table}


def _weaviate(d: Path) -> dict[str, Any]:
    if not os.environ.get("WEAVIATE_URL"):
        raise _Skip("WEAVIATE_URL is not set (Weaviate needs a server)")
    return {"url": os.environ["WEAVIATE_URL"], "collection": f"UibkCompare{os.getpid()}"}


DEFAULT_OPTIONS: dict[str, Callable[[Path], dict[str, Any]]] = {
    # name -> options from the backend's own folder inside the work folder
    "exact": lambda d: {"path": str(d)},
    "plaid": lambda d: {"path": str(d)},
    "warp": lambda d: {"path": str(d)},  # its index is built by the warm-up query (a lazy flush)
    "qdrant": _url_or("QDRANT_URL", "url", {"collection": "uibk"}),  # else local mode on disk
    "qdrant-edge": lambda d: {"path": str(d)},
    "milvus-lite": lambda d: {"path": str(d / "milvus.db")},
    "milvus": _milvus,
    "pgvector": _pgvector,
    "weaviate": _weaviate,
}
"""Options a backend gets in a benchmark unless ``--option`` overrides them. A backend not listed
gets ``path=<its folder>`` when its constructor takes a ``path``, else nothing."""


class _Skip(Exception):
    """A backend that cannot run here (the message says why)."""


def default_options(name: str, folder: Path) -> dict[str, Any]:
    """The benchmark options of backend ``name`` with its store in ``folder``.

    >>> default_options("exact", Path("/tmp/x"))
    {'path': '/tmp/x'}
    """
    if name in DEFAULT_OPTIONS:
        return DEFAULT_OPTIONS[name](folder)

    try:
        params = inspect.signature(backend_factory(name)).parameters
    except (TypeError, ValueError):
        return {}
    return {"path": str(folder)} if "path" in params else {}


# -- synthetic collections ------------------------------------------------------------------------
def synthetic_corpus(docs: Sequence[np.ndarray], n: int, *, seed: int = 0, noise: float = 0.3,
                     drop: float = 0.1) -> list[np.ndarray]:
    """``n`` tagged documents made from ``docs`` with realistic token statistics, no encoder.

    Copy ``i`` is a random real document whose slot and token directions get Gaussian noise
    (``noise`` times a random unit direction, then renormalised, tags kept) and which loses a
    random ``drop`` fraction of its tokens (at least one kept): the lengths, tag layout and
    similarity structure stay those of real encoded text.
    """
    fmt = infer_format(docs[0])
    rng = np.random.default_rng(seed)
    out = []
    for base in rng.integers(0, len(docs), n):
        d = np.asarray(docs[base], dtype=np.float32)
        toks = d[N_SLOTS:, 1:]
        keep = rng.random(len(toks)) >= drop
        if len(toks) and not keep.any():
            keep[rng.integers(len(toks))] = True
        toks = toks[keep]

        def jitter(x: np.ndarray) -> np.ndarray:
            x = x / np.linalg.norm(x, axis=1, keepdims=True)
            e = rng.standard_normal(x.shape).astype(np.float32)
            return x + noise * e / np.linalg.norm(e, axis=1, keepdims=True)

        slots = fmt.slot_vectors(jitter(d[:N_SLOTS, 1:]))
        tv = fmt.token_vectors(jitter(toks)) if len(toks) else np.zeros((0, d.shape[1]))
        out.append(np.concatenate([slots, tv]).astype(np.float32))
    return out


# -- rank metrics -----------------------------------------------------------------------------------
def rank_agreement(run: Sequence[str], reference: Sequence[str]) -> float:
    """Fraction of the pairs of shared documents that ``run`` orders as ``reference`` does (1.0
    when fewer than two are shared and those agree, 0.0 when none is shared).

    >>> rank_agreement(["a", "b"], ["b", "a"])
    0.0
    """
    pos = {d: i for i, d in enumerate(reference)}
    shared = [pos[d] for d in run if d in pos]
    if not shared:
        return 0.0
    pairs = [(a, b) for i, a in enumerate(shared) for b in shared[i + 1:]]
    return 1.0 if not pairs else sum(a < b for a, b in pairs) / len(pairs)


def _percentile(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else math.nan


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


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
        t0 = time.perf_counter()
        store = open_store(spec["backend"], **options)
        res["open_s"] = time.perf_counter() - t0
        try:
            batch = int(spec.get("batch_size", 512))
            t0 = time.perf_counter()
            for i in range(0, len(docs), batch):
                store.upsert(doc_ids[i:i + batch], docs[i:i + batch])
            res["upsert_s"] = time.perf_counter() - t0
            store.search(queries[0], k=K)  # warm-up; triggers lazy builds
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
    cmd = [sys.executable, "-m", "uibk_embedding.apps.compare", "--worker", str(spec_path), str(out_path)]
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


# -- the comparison ------------------------------------------------------------------------------------
def _parse_backends(text: str) -> list[tuple[str, str]]:
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        label, _, name = item.partition("=") if "=" in item else (item, "", item)
        if name not in BACKENDS:
            raise SystemExit(f"uibk-embed compare: unknown backend {name!r}; known: "
                             f"{', '.join(sorted(BACKENDS))}")
        if label in (x[0] for x in out):
            raise SystemExit(f"uibk-embed compare: backend label {label!r} given twice")
        out.append((label, name))
    if not out:
        raise SystemExit("uibk-embed compare: --backends is empty")
    return out


def _parse_options(pairs: Sequence[str], labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in pairs:
        label, sep, kv = p.partition(":")
        if not sep or "=" not in kv or label not in labels:
            raise SystemExit(f"uibk-embed compare: --option expects LABEL:KEY=VALUE with LABEL one of "
                             f"{', '.join(labels)}; got {p!r}")
        k, v = kv.split("=", 1)
        try:
            out.setdefault(label, {})[k] = json.loads(v)
        except json.JSONDecodeError:
            out.setdefault(label, {})[k] = v
    return out


def exact_runs(docs: Sequence[np.ndarray], doc_ids: Sequence[str], queries: Sequence[np.ndarray],
               query_ids: Sequence[str], k: int = K) -> dict[str, list[str]]:
    """Top-``k`` ids of exact MaxSim for every query (the reference of every backend)."""
    mat, off = pack(list(docs))
    out = {}
    for i in range(0, len(queries), 16):
        scores = maxsim_scores(list(queries[i:i + 16]), mat, off)
        for qid, row in zip(query_ids[i:i + 16], scores, strict=True):
            out[qid] = [doc_ids[j] for j in top_k(row, k)]
    return out


def summarise(res: dict[str, Any], qrels: dict[str, dict[str, int]],
              reference: dict[str, list[str]] | None) -> dict[str, Any]:
    """The reported figures of one backend from its worker result."""
    if "skipped" in res:
        return {"skipped": res["skipped"]}
    runs, lat = res["runs"], res["latencies_s"]
    judged = {q: r for q, r in qrels.items() if q in runs}
    if reference is not None:
        reference = {q: r for q, r in reference.items() if q in runs}
    out: dict[str, Any] = {
        "ndcg@10": ndcg_at_k(runs, judged, K) if judged else None,
        "recall@10": recall_at_k(runs, judged, K) if judged else None,
        "recall@10_vs_exact": overlap_at_k(runs, reference, K) if reference else None,
        "rank_agreement@10": (statistics.mean(rank_agreement(runs.get(q, []), r)
                                              for q, r in reference.items()) if reference else None),
        "identical_top10": (statistics.mean(float(runs.get(q, [])[:K] == r[:K])
                                            for q, r in reference.items()) if reference else None),
        "latency_ms_p50": _percentile(lat, 50) * 1e3,
        "latency_ms_p95": _percentile(lat, 95) * 1e3,
        "qps": len(lat) / sum(lat) if sum(lat) > 0 else None,
        "batch_qps": len(runs) / res["batch_s"] if res.get("batch_s") else None,
        "index_bytes": res.get("index_bytes"),
        "build_s": res["build_s"],
        "upsert_s": res["upsert_s"],
        "peak_rss_mb": res["peak_rss_mb"],
        "base_rss_mb": res["base_rss_mb"],
        "count": res["count"],
        "queries_run": res.get("queries_run", len(runs)),
    }
    if "server_peak_rss_mb" in res:
        out["server_peak_rss_mb"] = res["server_peak_rss_mb"]
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def compare(doc_ids: list[str], docs: Sequence[np.ndarray], query_ids: list[str],
            queries: Sequence[np.ndarray], qrels: dict[str, dict[str, int]],
            backends: Sequence[tuple[str, str]], options: dict[str, dict[str, Any]], *,
            repeat: int = 1, timeout: float = 3600.0, threads: int | None = None,
            progress: Any = None, workdir: Path | None = None) -> dict[str, dict[str, Any]]:
    """Run every ``(label, backend)`` in its own process on these vectors; figures per label."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="uibk-compare-")) if own else Path(workdir)  # type: ignore[arg-type]
    try:
        arrays = work / "arrays"
        _save_arrays(arrays, doc_ids, docs, query_ids, queries)
        raw: dict[str, dict[str, Any]] = {}
        for label, name in backends:
            if progress is not None:
                progress.set_postfix_str(f"{label}, {len(doc_ids):,} docs")
            folder = work / "stores" / label
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                opts = {**default_options(name, folder), **options.get(label, {})}
            except _Skip as e:
                raw[label] = {"skipped": str(e)}
            else:
                raw[label] = _run_backend(label, name, opts, arrays, folder, repeat, timeout, threads)
                shutil.rmtree(folder, ignore_errors=True)
            if progress is not None:
                progress.update(1)
        ref_label = next((lab for lab, n in backends if n == "exact" and "runs" in raw[lab]), None)
        if ref_label is not None and not options.get(ref_label):
            reference = raw[ref_label]["runs"]  # the exact store runs the reference kernel
        else:
            reference = exact_runs(docs, doc_ids, queries, query_ids)
        return {label: summarise(raw[label], qrels, reference) for label, _ in backends}
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


# -- reports ------------------------------------------------------------------------------------------
def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def markdown_table(backends: dict[str, dict[str, Any]]) -> str:
    """The comparison as a markdown table (skipped backends listed under it with the reason).

    >>> print(markdown_table({"x": {"skipped": "no server"}}).splitlines()[-1])
    - x: skipped (no server)
    """
    head = ("| backend | nDCG@10 | recall@10 | recall@10 vs exact | rank agreement | build (s) "
            "| index (MiB) | peak RSS (MiB) | p50 (ms) | p95 (ms) | QPS | queries |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    skipped = []
    for name, r in backends.items():
        if "skipped" in r:
            skipped.append(f"- {name}: skipped ({r['skipped']})")
            continue
        size = r["index_bytes"] / 2**20 if r.get("index_bytes") is not None else None
        lines.append(
            f"| {name} | {_fmt(r['ndcg@10'])} | {_fmt(r['recall@10'])} | {_fmt(r['recall@10_vs_exact'])} "
            f"| {_fmt(r['rank_agreement@10'])} | {_fmt(r['build_s'], 1)} | {_fmt(size, 1)} "
            f"| {_fmt(r['peak_rss_mb'], 0)} | {_fmt(r['latency_ms_p50'], 2)} "
            f"| {_fmt(r['latency_ms_p95'], 2)} | {_fmt(r['qps'], 1)} | {r.get('queries_run', '-')} |")
    return "\n".join(lines + (["", *skipped] if skipped else []))


def plot(backends: dict[str, dict[str, Any]], out: Path, title: str) -> list[Path]:
    """``recall_vs_latency.png`` and ``index_size.png`` in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {k: v for k, v in backends.items() if "skipped" not in v}
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in ok.items():
        y = r["recall@10_vs_exact"]
        ax.scatter([r["latency_ms_p50"]], [y if y is not None else math.nan])
        ax.annotate(name, (r["latency_ms_p50"], y if y is not None else 0), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("query latency p50 (ms, log)")
    ax.set_ylabel("recall@10 vs exact MaxSim")
    ax.set_title(f"{title}: recall vs latency")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    paths.append(out / "recall_vs_latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    sized = {k: v["index_bytes"] / 2**20 for k, v in ok.items() if v.get("index_bytes") is not None}
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(list(sized), list(sized.values()))
    ax.set_ylabel("index size on disk (MiB)")
    ax.set_title(f"{title}: index size")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    paths.append(out / "index_size.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def plot_scale(scale: dict[str, dict[str, dict[str, Any]]], out: Path, title: str) -> Path:
    """``latency_vs_size.png``: p50 latency of each backend against the number of documents."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    names = sorted({b for per in scale.values() for b in per})
    for name in names:
        pts = [(int(n), per[name]["latency_ms_p50"]) for n, per in scale.items()
               if name in per and "skipped" not in per[name]]
        if pts:
            xs, ys = zip(*sorted(pts), strict=True)
            ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("documents")
    ax.set_ylabel("query latency p50 (ms)")
    ax.set_title(f"{title}: latency vs collection size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "latency_vs_size.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="uibk-embed compare", description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated registry names or LABEL=NAME (default: all registered)")
    p.add_argument("--option", action="append", default=[], metavar="LABEL:KEY=VALUE",
                   help="backend option (JSON value), repeatable")
    p.add_argument("--out", default="compare-out", help="folder for compare.json, compare.md, PNGs")
    p.add_argument("--encoder", default=None, help="encoder folder (default: the embedded model)")
    p.add_argument("--split", default="test")
    p.add_argument("--repeat", type=int, default=1, help="timed passes over the queries")
    p.add_argument("--max-docs", type=int, default=None, help="use the first N documents only")
    p.add_argument("--max-queries", type=int, default=None, help="use the first N queries only")
    p.add_argument("--scale", default=None,
                   help="comma-separated collection sizes (synthetic documents beyond the real ones)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per backend")
    p.add_argument("--threads", type=int, default=None,
                   help="cap the worker's BLAS/OpenMP/Rayon threads (default: the libraries' own)")
    p.add_argument("--no-cache", action="store_true", help="do not cache the encoded vectors")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """``uibk-embed compare``; returns the exit status.

    >>> main(["/nonexistent", "--backends", "exact"])
    Traceback (most recent call last):
    ...
    SystemExit: uibk-embed compare: /nonexistent is not a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1], argv[2])
    args = build_parser().parse_args(argv)
    backends = _parse_backends(args.backends)
    options = _parse_options(args.option, [lab for lab, _ in backends])
    sizes = sorted({int(x) for x in args.scale.split(",") if x.strip()}) if args.scale else []
    if any(n <= 0 for n in sizes):
        raise SystemExit("uibk-embed compare: --scale sizes must be positive")

    try:
        coll = load_beir(args.data, split=args.split)
    except (DataError, FileNotFoundError) as e:
        raise SystemExit(f"uibk-embed compare: {e}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rounds = sizes or [None]
    bar = tqdm(total=1 + len(rounds) * len(backends) + 1, desc="compare", unit="stage",
               disable=args.quiet)
    try:
        bar.set_postfix_str("encoding (cached)")

        # the whole collection is encoded (and cached) once; subsets are taken from the vectors
        enc = encode_collection(load_encoder(args.encoder), coll, use_cache=not args.no_cache)
        if args.max_docs:
            enc.doc_ids, enc.docs = enc.doc_ids[: args.max_docs], enc.docs[: args.max_docs]
        if args.max_queries:
            enc.query_ids, enc.queries = enc.query_ids[: args.max_queries], enc.queries[: args.max_queries]
        coll.qrels = {q: r for q, r in coll.qrels.items() if q in set(enc.query_ids)}
        bar.update(1)
        per_size: dict[str, dict[str, dict[str, Any]]] = {}
        for n in rounds:
            docs, ids = list(enc.docs), list(enc.doc_ids)
            if n is not None:
                if n <= len(docs):
                    docs, ids = docs[:n], ids[:n]
                else:
                    docs += synthetic_corpus(enc.docs, n - len(docs), seed=n)
                    ids += [f"synthetic-{i}" for i in range(n - len(ids))]
            per_size[str(len(ids))] = compare(ids, docs, enc.query_ids, enc.queries, coll.qrels,
                                              backends, options, repeat=args.repeat,
                                              timeout=args.timeout, threads=args.threads,
                                              progress=bar)
        bar.set_postfix_str("report")
        key = str(len(enc.doc_ids)) if not sizes else str(max(int(k) for k in per_size))
        report = {"dataset": coll.name, "n_docs": int(key), "n_queries": len(enc.query_ids),
                  "k": K, "backends": per_size[key]}
        if sizes:
            report["scale"] = per_size
        (out / "compare.json").write_text(json.dumps(report, indent=2))
        md = [f"## {coll.name}: {int(key):,} documents, {len(enc.query_ids)} queries\n",
              markdown_table(per_size[key])]
        if sizes:
            md.append("\n### Latency p50 (ms) by collection size\n")
            names = [lab for lab, _ in backends]
            md.append("| documents | " + " | ".join(names) + " |")
            md.append("|---:|" + "---:|" * len(names))
            for n, per in per_size.items():
                md.append(f"| {int(n):,} | " + " | ".join(
                    _fmt(per[b].get("latency_ms_p50"), 2) if "skipped" not in per[b] else "skipped"
                    for b in names) + " |")
            plot_scale(per_size, out, coll.name)
        (out / "compare.md").write_text("\n".join(md) + "\n")
        plot(per_size[key], out, coll.name)
        bar.update(1)
    finally:
        bar.close()
    print("\n".join(md))
    print(f"\nwrote {out / 'compare.json'}, {out / 'compare.md'} and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
