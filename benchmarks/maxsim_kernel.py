"""Exact MaxSim kernel throughput against a plain matrix product on the same machine.

For each shape (documents x vectors per document, query vectors) it times, interleaved in one
process and repeated ``--runs`` times (medians reported):

* ``kernel``: :func:`uibk_embedding.maxsim.maxsim_scores` as the library runs it (the fused C
  kernel where it is built, :func:`uibk_embedding.maxsim.kernel`);
* ``previous``: the blas kernel (numpy: a matrix product per cache-sized block, a segment max per
  document and a sum over query vectors), which served every float32 score before the fused one;
* ``gemm_same_shape``: the bare matrix products the blas kernel runs (``q @ block.T`` over the
  same blocks), nothing else: what the segment reductions cost on top;
* ``gemm_square``: a square float32 ``n x n @ n x n`` product of about the same FLOPs: the
  machine's BLAS rate.

Throughput is ``2 * query_rows * doc_rows * 128`` FLOP divided by the time. The ratios ``kernel /
gemm_square`` (targets: >= 0.5 for one query, >= 0.7 for a batch) and ``kernel / gemm_same_shape``
are taken per run (the four timings of one run sit side by side) and the median is reported. A
last table gives the latency of one query as the collection grows (prefixes of the largest
collection).

``--engines`` adds the side-by-side table of issue #43: single-query exact MaxSim latency (p50/p95
over ``--runs`` different queries, engines interleaved query by query) on one collection of random
unit vectors whose document lengths follow NPL's (``--corpus``: the whitespace word count of each
document scaled so the rows sum to ``--rows``, NPL's 582,526 encoded vectors), each engine's
top-10 compared with a float64 reference and its largest score error measured next to the a-priori
float32 rounding bound (``gamma_(dim+m) * sum_i |q_i| * max_j |d_j|``). Engines: the library's
kernel and the blas kernel on float32 and float16 rows, numpy's one GEMM + ``maximum.reduceat``,
blocked ``torch.mm`` (float32 and bfloat16), a numba loop, maxsim-cpu and Qdrant Edge's exact scan
(the last three when importable; ``--extra-path`` adds a folder with them to ``sys.path``). ``cat
/proc/loadavg`` is recorded before and after; the figures are labelled preliminary unless
``--quiet-cores`` says the machine ran nothing else.

Usage::

    python benchmarks/maxsim_kernel.py [--runs 5] [--threads N] [--scale 10000,20000,50000,100000]
        [--small] [--json out.json]
    python benchmarks/maxsim_kernel.py --quick      # engines table + one batch shape, ~2 minutes;
        # writes benchmarks/results/maxsim_kernel.{md,json} unless --md / --json are given
    python benchmarks/maxsim_kernel.py --engines all --shape 0 --threads 1 --md results/x.md
    python benchmarks/maxsim_kernel.py --engines kernel_f32,kernel_f16rows,kernel_f32_avx2,numpy_one_gemm \\
        --shape 0 --stores --runs 20 --md x.md   # issue #59: the scan and the two exact stores

``--stores`` adds the exact store in memory against the same documents persisted (NPL's lengths,
random tagged lists, one search each per query alternating which goes first). The
``kernel_*_avx2`` engines run the fused kernel's AVX2 path where the AVX-512 one is the default
(:data:`uibk_embedding.maxsim.ISA`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from uibk_embedding import maxsim as M

DIM = 128


def make_collection(n_docs: int, lo: int, hi: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random unit rows, ``n_docs`` documents of ``lo..hi`` vectors (uniform)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(lo, hi + 1, n_docs)
    offsets = np.zeros(n_docs + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    mat = np.empty((int(offsets[-1]), DIM), np.float32)
    step = 1 << 20
    for r in range(0, len(mat), step):  # in pieces: no float64 temporary of the whole matrix
        x = rng.standard_normal((min(step, len(mat) - r), DIM), dtype=np.float32)
        mat[r:r + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return mat, offsets


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _gemm_same_shape(q: np.ndarray, mat: np.ndarray, offsets: np.ndarray) -> None:
    row_bytes = 4 * q.shape[0]
    rows = max(1, min(max(M.BLOCK_BYTES // row_bytes, M.MIN_BLOCK_ROWS), M.DEFAULT_CHUNK_BYTES // row_bytes))
    for r0 in range(0, int(offsets[-1]), rows):
        q @ mat[r0:r0 + rows].T


def _blas(qs: list[np.ndarray], mat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """:func:`maxsim_scores` on the blas kernel (the fused one set aside for the call)."""
    saved, M._LIB = M._LIB, None
    try:
        return M.maxsim_scores(qs, mat, offsets)
    finally:
        M._LIB = saved


def bench_shape(mat: np.ndarray, offsets: np.ndarray, q_rows: int, runs: int, n_queries: int = 1) -> dict:
    rng = np.random.default_rng(1)
    qs = [rng.standard_normal((q_rows, DIM)).astype(np.float32) for _ in range(n_queries)]
    qs = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in qs]
    q = np.concatenate(qs)  # the kernel stacks a batch's query rows into one product
    flops = 2.0 * len(q) * len(mat) * DIM
    n = round((flops / 2) ** (1 / 3))
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    fns = {
        "kernel": lambda: M.maxsim_scores(qs, mat, offsets),
        "previous": lambda: _blas(qs, mat, offsets),
        "gemm_same_shape": lambda: _gemm_same_shape(q, mat, offsets),
        "gemm_square": lambda: a @ b,
    }
    flop_of = {k: flops for k in fns} | {"gemm_square": 2.0 * n**3}
    for fn in fns.values():
        fn()  # warm-up
    gf: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            gf[k].append(flop_of[k] / _timed(fn) / 1e9)
    med = {k: statistics.median(v) for k, v in gf.items()}
    return {
        "n_docs": len(offsets) - 1, "doc_rows": len(mat), "query_rows": q_rows, "n_queries": n_queries,
        "gflops": {k: round(v, 2) for k, v in med.items()},
        "kernel_ms": round(flops / med["kernel"] / 1e6, 2),
        "ratio_vs_gemm_square": round(statistics.median(
            k / s for k, s in zip(gf["kernel"], gf["gemm_square"], strict=True)), 3),
        "ratio_vs_gemm_same_shape": round(statistics.median(
            k / s for k, s in zip(gf["kernel"], gf["gemm_same_shape"], strict=True)), 3),
        "speedup_vs_previous": round(statistics.median(
            k / s for k, s in zip(gf["kernel"], gf["previous"], strict=True)), 3),
    }


def bench_scaling(mat: np.ndarray, offsets: np.ndarray, sizes: list[int], q_rows: int,
                  runs: int) -> list[dict]:
    rng = np.random.default_rng(2)
    q = rng.standard_normal((q_rows, DIM)).astype(np.float32)
    out = []
    subsets = [(n, mat[: offsets[n]], offsets[: n + 1]) for n in sizes if n < len(offsets)]
    times: dict[int, list[float]] = {n: [] for n, _, _ in subsets}
    for _n, m, o in subsets:
        M.maxsim_scores([q], m, o)
    for _ in range(runs):
        for n, m, o in subsets:
            times[n].append(_timed(lambda m=m, o=o: M.maxsim_scores([q], m, o)))
    for n, _, _ in subsets:
        ms = statistics.median(times[n]) * 1e3
        out.append({"n_docs": n, "doc_rows": int(offsets[n]), "query_rows": q_rows,
                    "latency_ms_p50": round(ms, 2), "us_per_doc": round(ms * 1e3 / n, 3)})
    return out


def _limit_threads(n: int | None):
    if n is None:
        return contextlib.nullcontext()
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)  # torch's own pool (the conversion copy, the torch engines)
    M.THREADS = n  # the fused kernel's threads
    return threadpool_limits(n)


# -- engines side by side (#43) ---------------------------------------------------------------------
NPL_CORPUS = "/work/shared/datasets/npl/corpus.jsonl"
NPL_ROWS = 582_526  # vectors of NPL encoded with the default encoder (issue #43)


def npl_lengths(corpus: str, total_rows: int) -> np.ndarray:
    """Vectors per document: each document's word count scaled so that the rows sum to ``total_rows``."""
    words = []
    with open(corpus) as f:
        for line in f:
            d = json.loads(line)
            words.append(len(f"{d.get('title', '')} {d.get('text', '')}".split()))
    w = np.asarray(words, np.float64)
    return np.maximum(1, np.round(w * total_rows / w.sum())).astype(np.int64)


def collection_from_lengths(lengths: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random unit rows, one document per entry of ``lengths``."""
    rng = np.random.default_rng(seed)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    mat = np.empty((int(offsets[-1]), DIM), np.float32)
    for r in range(0, len(mat), 1 << 20):
        x = rng.standard_normal((min(1 << 20, len(mat) - r), DIM), dtype=np.float32)
        mat[r:r + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return mat, offsets


def _blocks(offsets: np.ndarray, rows_budget: int) -> list[tuple[int, int]]:
    out, s, n = [], 0, len(offsets) - 1
    while s < n:
        e = int(np.searchsorted(offsets, offsets[s] + rows_budget, side="right")) - 1
        e = min(max(e, s + 1), n)
        out.append((s, e))
        s = e
    return out


def _torch_blocked(q: np.ndarray, mat, offsets: np.ndarray, rows_budget: int = 4096) -> np.ndarray:
    """``torch.mm(rows, q.T)`` per block (rows x query vectors), max down each document's rows."""
    import torch

    qt = torch.from_numpy(q).to(mat.dtype).T
    out = np.empty(len(offsets) - 1, np.float32)
    for s, e in _blocks(offsets, rows_budget):
        sims = torch.mm(mat[offsets[s]:offsets[e]], qt).float().numpy()
        np.maximum.reduceat(sims, offsets[s:e] - offsets[s], axis=0).sum(axis=1, out=out[s:e])
    return out


def _numpy_one_gemm(q: np.ndarray, mat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The plain outside baseline: one GEMM over every row, then ``maximum.reduceat``."""
    return np.maximum.reduceat(q @ mat.T, offsets[:-1], axis=1).sum(axis=0)


_NUMBA_KERNEL = None


def _numba_kernel():
    """A fused numba loop: four document rows at a time against the transposed query (no BLAS)."""
    global _NUMBA_KERNEL
    if _NUMBA_KERNEL is None:
        from numba import njit

        @njit(fastmath=True, boundscheck=False)
        def kernel(qt, mat, off, out):  # pragma: no cover - compiled
            dim, nq = qt.shape
            best = np.empty(nq, np.float32)
            s0, s1 = np.empty(nq, np.float32), np.empty(nq, np.float32)
            s2, s3 = np.empty(nq, np.float32), np.empty(nq, np.float32)
            for d in range(len(off) - 1):
                best[:] = -np.inf
                j = off[d]
                while j < off[d + 1]:
                    m = min(4, off[d + 1] - j)
                    s0[:] = 0.0
                    s1[:] = 0.0
                    s2[:] = 0.0
                    s3[:] = 0.0
                    for k in range(dim):
                        a0 = mat[j, k]
                        a1 = mat[j + 1, k] if m > 1 else 0.0
                        a2 = mat[j + 2, k] if m > 2 else 0.0
                        a3 = mat[j + 3, k] if m > 3 else 0.0
                        for i in range(nq):
                            w = qt[k, i]
                            s0[i] += a0 * w
                            s1[i] += a1 * w
                            s2[i] += a2 * w
                            s3[i] += a3 * w
                    for i in range(nq):
                        b = s0[i]
                        if m > 1:
                            b = max(b, s1[i])
                        if m > 2:
                            b = max(b, s2[i])
                        if m > 3:
                            b = max(b, s3[i])
                        best[i] = max(best[i], b)
                    j += m
                out[d] = best.sum()

        _NUMBA_KERNEL = kernel
    return _NUMBA_KERNEL


def _qdrant_edge(mat: np.ndarray, offsets: np.ndarray, folder: str):
    """A Qdrant Edge shard holding the collection as MaxSim multivectors; returns ``search(q) -> ids``."""
    import qdrant_edge as e

    hnsw = e.HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10000)  # no HNSW: a scan
    params = e.EdgeVectorParams(DIM, e.Distance.Dot, hnsw_config=hnsw,
                                multivector_config=e.MultiVectorConfig(e.MultiVectorComparator.MaxSim))
    shard = e.EdgeShard.create(folder, e.EdgeConfig(vectors={"v": params}))
    n = len(offsets) - 1
    for b in range(0, n, 256):
        points = [e.Point(d, {"v": mat[offsets[d]:offsets[d + 1]].tolist()}, {})
                  for d in range(b, min(n, b + 256))]
        shard.update(e.UpdateOperation.upsert_points(points))
    shard.flush()

    def search(q: np.ndarray, k: int = 10) -> list[tuple[int, float]]:
        req = e.QueryRequest(limit=k, query=e.Query.Nearest(q.tolist(), using="v"),
                             params=e.SearchParams(exact=True), with_payload=False)
        return [(int(p.id), float(p.score)) for p in shard.query(req)]

    return search, shard


def _rounding_bound(q: np.ndarray, mat: np.ndarray) -> float:
    u = np.finfo(np.float32).eps / 2
    g = (DIM + len(q)) * u / (1 - (DIM + len(q)) * u)
    dmax = max(float(np.sqrt((mat[r:r + (1 << 20)].astype(np.float64) ** 2).sum(1).max()))
               for r in range(0, len(mat), 1 << 20))
    return g * float(np.linalg.norm(q.astype(np.float64), axis=1).sum()) * dmax


def bench_engines(mat: np.ndarray, offsets: np.ndarray, q_rows: int, runs: int,
                  engines: list[str], edge_folder: str | None = None) -> dict:
    """Single-query latency of each engine, queries interleaved across engines, plus accuracy."""
    import torch

    rng = np.random.default_rng(3)
    queries = [x / np.linalg.norm(x, axis=1, keepdims=True)
               for x in (rng.standard_normal((q_rows, DIM)).astype(np.float32) for _ in range(runs + 1))]
    mat16 = np.empty(mat.shape, np.float16)
    for r in range(0, len(mat), 1 << 20):
        mat16[r:r + (1 << 20)] = mat[r:r + (1 << 20)]
    mat_t = torch.from_numpy(mat)
    mat_bf = mat_t.to(torch.bfloat16)
    calls: dict[str, Callable[[np.ndarray], object]] = {}
    skipped: dict[str, str] = {}
    shard = None
    for name in engines:
        try:
            if name == "kernel_f32":
                calls[name] = lambda q: M.maxsim_scores([q], mat, offsets)[0]
            elif name in ("kernel_f32_avx2", "kernel_f16rows_avx2"):  # the fused kernel's AVX2 path
                rows = mat if name == "kernel_f32_avx2" else mat16
                if "avx2" not in M.kernel_isas():
                    raise ImportError("the fused kernel's AVX2 path does not run here")

                def run_avx2(q, rows=rows):
                    saved, M.ISA = M.ISA, "avx2"
                    try:
                        return M.maxsim_scores([q], rows, offsets)[0]
                    finally:
                        M.ISA = saved

                calls[name] = run_avx2
            elif name == "kernel_f16rows":
                calls[name] = lambda q: M.maxsim_scores([q], mat16, offsets)[0]
            elif name == "blas_f32":
                calls[name] = lambda q: _blas([q], mat, offsets)[0]
            elif name == "blas_f16rows":
                calls[name] = lambda q: _blas([q], mat16, offsets)[0]
            elif name == "numpy_one_gemm":
                calls[name] = lambda q: _numpy_one_gemm(q, mat, offsets)
            elif name == "torch_blocked_f32":
                calls[name] = lambda q: _torch_blocked(q, mat_t, offsets)
            elif name == "torch_blocked_bf16":
                calls[name] = lambda q: _torch_blocked(q, mat_bf, offsets)
            elif name == "numba_fused":
                kernel = _numba_kernel()

                def run_numba(q, kernel=kernel):
                    out = np.empty(len(offsets) - 1, np.float32)
                    kernel(np.ascontiguousarray(q.T), mat, offsets, out)
                    return out

                calls[name] = run_numba
            elif name == "maxsim_cpu":
                import maxsim_cpu

                docs = [mat[offsets[d]:offsets[d + 1]] for d in range(len(offsets) - 1)]
                calls[name] = lambda q, docs=docs: np.asarray(maxsim_cpu.maxsim_scores_variable(q, docs))
            elif name == "qdrant_edge":
                t0 = time.perf_counter()
                search, shard = _qdrant_edge(mat, offsets, edge_folder or "edge")
                print(f"Qdrant Edge shard built in {time.perf_counter() - t0:.1f} s", flush=True)
                calls[name] = search
            else:
                raise ValueError(f"unknown engine {name!r}")
        except ImportError as exc:
            skipped[name] = f"not importable: {exc}"
    load_before = open("/proc/loadavg").read().split()[:3]
    times: dict[str, list[float]] = {k: [] for k in calls}
    worst: dict[str, float] = {k: 0.0 for k in calls}
    top_equal: dict[str, int] = {k: 0 for k in calls}
    bounds = []
    for qi, q in enumerate(queries):
        ref = M.maxsim_scores([q], mat, offsets, dtype=np.float64)[0]
        ref16 = M.maxsim_scores([q], mat16, offsets, dtype=np.float64)[0]
        bounds.append(_rounding_bound(q, mat))
        for name, fn in calls.items():
            t0 = time.perf_counter()
            got = fn(q)
            dt = time.perf_counter() - t0
            if qi == 0:
                continue  # warm-up (numba compiles, caches fill)
            times[name].append(dt)
            r = ref16 if "f16rows" in name else ref
            if name == "qdrant_edge":
                ids = [i for i, _ in got]
                err = max(abs(sc - r[i]) for i, sc in got)
            else:
                got = np.asarray(got, np.float64)
                ids = M.top_k(got, 10).tolist()
                err = float(np.abs(got - r).max())
            worst[name] = max(worst[name], err)
            top_equal[name] += ids == M.top_k(r, 10).tolist()
    load_after = open("/proc/loadavg").read().split()[:3]
    if shard is not None:
        shard.close()
    rows = []
    for name, ts in times.items():
        ms = np.asarray(ts) * 1e3
        rows.append({"engine": name, "p50_ms": round(float(np.median(ms)), 2),
                     "p95_ms": round(float(np.percentile(ms, 95)), 2),
                     "top10_equal": f"{top_equal[name]}/{len(ts)}",
                     "max_abs_error": float(f"{worst[name]:.3g}")})
    fastest_outside = min((r["p50_ms"] for r in rows if r["engine"] in OUTSIDE), default=None)
    for r in rows:
        r["ratio_to_fastest_outside"] = (round(r["p50_ms"] / fastest_outside, 3)
                                         if fastest_outside else None)
    from importlib import metadata

    versions = {}
    for dist in ("numpy", "torch", "numba", "maxsim-cpu", "qdrant-edge-py"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {"n_docs": len(offsets) - 1, "doc_rows": len(mat), "query_rows": q_rows, "queries": runs,
            "versions": versions,
            "float32_rounding_bound": float(f"{max(bounds):.3g}"), "rows": rows, "skipped": skipped,
            "loadavg_before": load_before, "loadavg_after": load_after}


OUTSIDE = ("numpy_one_gemm", "maxsim_cpu", "qdrant_edge")
"""Outside exact MaxSim engines the aim compares with (torch and numba variants are candidates)."""
ENGINES = ("kernel_f32", "kernel_f16rows", "kernel_f32_avx2", "kernel_f16rows_avx2", "blas_f32",
           "blas_f16rows", "numpy_one_gemm", "torch_blocked_f32",
           "torch_blocked_bf16", "numba_fused", "maxsim_cpu", "qdrant_edge")


def bench_stores(lengths: np.ndarray, runs: int, folder: str) -> dict:
    """The exact store in memory against the same documents persisted (float32 rows, memory
    mapped): one search each per query, alternating which goes first, p50/p95 over ``runs``
    queries (one more for warm-up). Documents are random tagged lists of ``lengths`` rows (3 slots
    and at least one token), queries 3 slots + 29 tokens (32 rows)."""
    from uibk_embedding.adapters.exact import ExactStore
    from uibk_embedding.tagged import TaggedFormat

    fmt, rng = TaggedFormat(), np.random.default_rng(4)
    stores = {"exact_in_memory": ExactStore(), "exact_persisted": ExactStore(path=folder)}
    t0 = time.perf_counter()
    for b in range(0, len(lengths), 500):
        docs = [fmt.build(rng.normal(size=(3, DIM - 1)), rng.normal(size=(max(int(n) - 3, 1), DIM - 1)))
                for n in lengths[b:b + 500]]
        ids = [str(i) for i in range(b, b + len(docs))]
        for s in stores.values():
            s.upsert(ids, docs)
    built = time.perf_counter() - t0
    queries = [fmt.build(rng.normal(size=(3, DIM - 1)), rng.normal(size=(29, DIM - 1)), 4.0)
               for _ in range(runs + 1)]
    load_before = open("/proc/loadavg").read().split()[:3]
    times: dict[str, list[float]] = {k: [] for k in stores}
    same = 0
    for qi, q in enumerate(queries):
        order = list(stores.items()) if qi % 2 else list(stores.items())[::-1]
        hits = {}
        for name, s in order:
            t = time.perf_counter()
            hits[name] = [(h.id, h.score) for h in s.search(q, k=10)]
            if qi:
                times[name].append(time.perf_counter() - t)
        same += qi > 0 and hits["exact_in_memory"] == hits["exact_persisted"]
    load_after = open("/proc/loadavg").read().split()[:3]
    rows = int(stores["exact_in_memory"].stats().get("vectors", 0) or 0)
    for s in stores.values():
        s.close()
    out = {"n_docs": len(lengths), "rows": rows, "queries": runs, "build_s": round(built, 1),
           "same_hits": f"{same}/{runs}", "loadavg_before": load_before, "loadavg_after": load_after,
           "rows_table": []}
    for name, ts in times.items():
        ms = np.asarray(ts) * 1e3
        out["rows_table"].append({"store": name, "p50_ms": round(float(np.median(ms)), 2),
                                  "p95_ms": round(float(np.percentile(ms, 95)), 2)})
    p50 = {r["store"]: r["p50_ms"] for r in out["rows_table"]}
    out["in_memory_over_persisted"] = round(p50["exact_in_memory"] / p50["exact_persisted"], 3)
    return out


def stores_markdown(r: dict) -> str:
    lines = [f"### Exact store search, in memory vs persisted: {r['n_docs']:,} documents, {r['queries']} "
             "queries of 32 rows, k = 10 (random tagged lists, NPL's lengths)", "",
             f"Load average before / after: {' '.join(r['loadavg_before'])} / "
             f"{' '.join(r['loadavg_after'])}; "
             f"same hits and scores: {r['same_hits']}; in memory / persisted p50: "
             f"{r['in_memory_over_persisted']}", "",
             "| store | p50 ms | p95 ms |", "|---|---:|---:|"]
    lines += [f"| {x['store']} | {x['p50_ms']} | {x['p95_ms']} |" for x in r["rows_table"]]
    return "\n".join(lines) + "\n"


def engines_markdown(e: dict, threads: int | None, quiet: bool = False) -> str:
    cores = "the cores were not shared" if quiet else "shared machine: preliminary"
    lines = [f"### Exact MaxSim, one {e['query_rows']}-vector query, {e['n_docs']:,} documents, "
             f"{e['doc_rows']:,} rows (random unit vectors, NPL's lengths), {e['queries']} queries, "
             f"threads: {threads or 'default'}",
             "",
             f"Load average before / after: {' '.join(e['loadavg_before'])} / {' '.join(e['loadavg_after'])}"
             f" ({cores}). float32 rounding bound (a priori): "
             f"{e['float32_rounding_bound']}. Versions: "
             + ", ".join(f"{k} {v}" for k, v in e.get("versions", {}).items()) + ".",
             "",
             "| engine | p50 ms | p95 ms | / fastest outside | top-10 = float64 | max abs error |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in e["rows"]:
        lines.append(f"| {r['engine']} | {r['p50_ms']} | {r['p95_ms']} | {r['ratio_to_fastest_outside']} | "
                     f"{r['top10_equal']} | {r['max_abs_error']} |")
    for k, why in e["skipped"].items():
        lines.append(f"| {k} | skipped: {why} | | | | |")
    return "\n".join(lines) + "\n"


def _blas_info() -> list[dict]:
    """Which BLAS and which of its CPU kernels run (OpenBLAS: ``OPENBLAS_CORETYPE`` picks it)."""
    from threadpoolctl import threadpool_info

    keys = ("internal_api", "version", "architecture", "num_threads")
    return [{k: i.get(k) for k in keys} | {"env_OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}
            for i in threadpool_info() if i.get("user_api") == "blas"]


def shapes_markdown(result: dict) -> str:
    """The throughput and scaling tables as markdown."""
    lines = []
    if result["shapes"]:
        lines += ["| documents x vectors | rows | queries x vectors | kernel GFLOP/s | square GEMM GFLOP/s "
                  "| kernel / square GEMM | kernel / same-shape GEMM |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in result["shapes"]:
            lines.append(f"| {r['n_docs']:,} x {r['doc_vectors']} | {r['doc_rows']:,} | {r['n_queries']} x "
                         f"{r['query_rows']} | {r['gflops']['kernel']} | {r['gflops']['gemm_square']} | "
                         f"{r['ratio_vs_gemm_square']} | {r['ratio_vs_gemm_same_shape']} |")
        lines.append("")
    if result["scaling"]:
        lines += ["| documents | rows | latency p50 (ms) | us / document |", "|---:|---:|---:|---:|"]
        lines += [f"| {r['n_docs']:,} | {r['doc_rows']:,} | {r['latency_ms_p50']} | {r['us_per_doc']} |"
                  for r in result["scaling"]]
    lines.append(f"\nLoad average at the end: {' '.join(result['loadavg_end'])}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=None, help="runs per shape / queries per engine (5; 10 quick)")
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS, torch and fused-kernel threads (default: each its own, all cores)")
    p.add_argument("--scale", default=None, help="collection sizes (10000,20000,50000,100000)")
    p.add_argument("--small", action="store_true", help="tiny shapes (CI smoke run)")
    p.add_argument("--shape", action="append", default=[], metavar="DOCS,MIN,MAX,QROWS,NQ",
                   help="run only these shapes (documents, vectors per document, query vectors, queries "
                        "per batch); the scaling table then uses the last one")
    p.add_argument("--json", default=None)
    p.add_argument("--md", default=None, help="write the tables as markdown here")
    p.add_argument("--engines", default="", help=f"comma list or 'all' of {','.join(ENGINES)}")
    p.add_argument("--corpus", default=NPL_CORPUS, help="BEIR corpus.jsonl whose document lengths to follow")
    p.add_argument("--rows", type=int, default=NPL_ROWS, help="total vectors of the engines' collection")
    p.add_argument("--docs", type=int, default=None, help="first N documents of the corpus only")
    p.add_argument("--extra-path", default=None, help="folder prepended to sys.path (numba, maxsim_cpu)")
    p.add_argument("--stores", action="store_true",
                   help="also the exact store in memory against the same documents persisted (NPL's lengths)")
    p.add_argument("--quiet-cores", action="store_true",
                   help="the machine ran nothing else (say so): the timings are not labelled preliminary")
    p.add_argument("--quick", action="store_true",
                   help="every engine on NPL's lengths (11 queries) and one batch shape: a few minutes")
    args = p.parse_args(argv)
    if args.extra_path:
        sys.path.insert(0, args.extra_path)
    if args.quick:
        args.engines = args.engines or "all"
        args.shape = args.shape or ["20000,30,60,32,16"]
        args.scale = args.scale or "5000,20000"
        args.md = args.md or "benchmarks/results/maxsim_kernel.md"
        args.json = args.json or "benchmarks/results/maxsim_kernel.json"
    args.runs = args.runs or (10 if args.quick else 5)
    args.scale = args.scale or "10000,20000,50000,100000"
    engines = list(ENGINES) if args.engines == "all" else [x for x in args.engines.split(",") if x]
    sizes = [int(x) for x in args.scale.split(",") if x]
    if args.small:
        shapes, sizes = [(200, 30, 300, 32, 1), (200, 30, 300, 32, 4)], [50, 100, 200]
    else:
        # (documents, min vectors, max vectors, query vectors, queries in one batch)
        shapes = [(10_000, 30, 300, 32, 1), (10_000, 30, 300, 64, 1), (10_000, 30, 300, 32, 16),
                  (max(sizes), 30, 60, 32, 1)]
    if args.shape:
        shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape if s != "0"]
    result: dict = {"threads": args.threads, "quiet_cores": args.quiet_cores, "kernel": M.kernel(),
                    "block_bytes": M.BLOCK_BYTES, "blas": _blas_info(),
                    "shapes": [], "scaling": []}
    print(f"kernel: {M.kernel()}; BLAS: {result['blas']}; similarity block {M.BLOCK_BYTES >> 10} KiB",
          flush=True)
    result["engines"] = None
    result["stores"] = None
    with _limit_threads(args.threads):
        if args.stores:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                lengths = npl_lengths(args.corpus, args.rows)[: args.docs]
                result["stores"] = bench_stores(lengths, args.runs, tmp + "/exact")
            print(stores_markdown(result["stores"]), flush=True)
        if engines:
            lengths = npl_lengths(args.corpus, args.rows)[: args.docs]
            mat, off = collection_from_lengths(lengths)
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                result["engines"] = bench_engines(mat, off, 32, args.runs, engines, edge_folder=tmp + "/edge")
            print(engines_markdown(result["engines"], args.threads, args.quiet_cores), flush=True)
            del mat, off
        cache: dict[tuple, tuple] = {}
        for n_docs, lo, hi, q_rows, nq in shapes:
            key = (n_docs, lo, hi)
            if key not in cache:
                cache.clear()
                cache[key] = make_collection(n_docs, lo, hi)
            mat, off = cache[key]
            r = bench_shape(mat, off, q_rows, args.runs, nq) | {"doc_vectors": f"{lo}-{hi}"}
            result["shapes"].append(r)
            print(f"{n_docs:>7} docs x {lo}-{hi} vectors ({len(mat):,} rows), {nq} x query {q_rows}: "
                  f"kernel {r['gflops']['kernel']} GFLOP/s, gemm same shape "
                  f"{r['gflops']['gemm_same_shape']}, square gemm {r['gflops']['gemm_square']} -> "
                  f"ratio {r['ratio_vs_gemm_square']} (vs same shape {r['ratio_vs_gemm_same_shape']}; "
                  f"{r['speedup_vs_previous']}x the blas kernel)", flush=True)
        if cache:
            mat, off = next(iter(cache.values()))
            result["scaling"] = bench_scaling(mat, off, sizes, 32, args.runs)
    result["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    md = shapes_markdown(result)
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            command = " ".join(argv if argv is not None else sys.argv[1:])
            f.write(f"# Exact MaxSim kernel (`python benchmarks/maxsim_kernel.py {command}`)\n\n"
                    f"Kernel: {result['kernel']}; BLAS: {result['blas']}; similarity block "
                    f"{M.BLOCK_BYTES >> 10} KiB\n\n")
            if result["engines"]:
                f.write(engines_markdown(result["engines"], args.threads, args.quiet_cores) + "\n")
            if result["stores"]:
                f.write(stores_markdown(result["stores"]) + "\n")
            f.write(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
