"""Exact MaxSim kernel throughput against a plain matrix product on the same machine.

For each shape (documents x vectors per document, query vectors) it times, interleaved in one
process and repeated ``--runs`` times (medians reported):

* ``kernel``: :func:`uibk_embedding.maxsim.maxsim_scores` for one query (matrix product in
  cache-sized blocks + segment max per document + sum over query vectors);
* ``previous``: the same kernel with the block size it had before the blocks were sized for the
  L2 cache (16 MiB similarity blocks of at least 4,096 document rows);
* ``gemm_same_shape``: the bare matrix products the kernel runs (``q @ block.T`` over the same
  blocks), nothing else: what the segment reductions cost on top;
* ``gemm_square``: a square float32 ``n x n @ n x n`` product of about the same FLOPs: the
  machine's BLAS rate.

Throughput is ``2 * query_rows * doc_rows * 128`` FLOP divided by the time. The ratios
``kernel / gemm_square`` (the target: >= 0.5) and ``kernel / gemm_same_shape`` are taken per
run (the four timings of one run sit side by side) and the median is reported. A last table
gives the latency of one query as the collection grows (prefixes of the largest collection).

Usage::

    python benchmarks/maxsim_kernel.py [--runs 5] [--threads N] [--scale 10000,30000,100000]
        [--small] [--json out.json]
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


PREVIOUS_BLOCK_BYTES, PREVIOUS_MIN_BLOCK_ROWS = 16 * 2**20, 4096


def _previous(qs: list[np.ndarray], mat: np.ndarray, offsets: np.ndarray) -> None:
    saved = M.BLOCK_BYTES, M.MIN_BLOCK_ROWS
    M.BLOCK_BYTES, M.MIN_BLOCK_ROWS = PREVIOUS_BLOCK_BYTES, PREVIOUS_MIN_BLOCK_ROWS
    try:
        M.maxsim_scores(qs, mat, offsets)
    finally:
        M.BLOCK_BYTES, M.MIN_BLOCK_ROWS = saved


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
        "previous": lambda: _previous(qs, mat, offsets),
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
    from threadpoolctl import threadpool_limits

    return threadpool_limits(n)


def _blas_info() -> list[dict]:
    """Which BLAS and which of its CPU kernels run (OpenBLAS: ``OPENBLAS_CORETYPE`` picks it)."""
    from threadpoolctl import threadpool_info

    keys = ("internal_api", "version", "architecture", "num_threads")
    return [{k: i.get(k) for k in keys} | {"env_OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}
            for i in threadpool_info() if i.get("user_api") == "blas"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="BLAS threads (default: BLAS's own)")
    p.add_argument("--scale", default="10000,20000,50000,100000", help="collection sizes")
    p.add_argument("--small", action="store_true", help="tiny shapes (CI smoke run)")
    p.add_argument("--shape", action="append", default=[], metavar="DOCS,MIN,MAX,QROWS,NQ",
                   help="run only these shapes (documents, vectors per document, query vectors, queries "
                        "per batch); the scaling table then uses the last one")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.scale.split(",") if x]
    if args.small:
        shapes, sizes = [(200, 30, 300, 32, 1), (200, 30, 300, 32, 4)], [50, 100, 200]
    else:
        # (documents, min vectors, max vectors, query vectors, queries in one batch)
        shapes = [(10_000, 30, 300, 32, 1), (10_000, 30, 300, 64, 1), (10_000, 30, 300, 32, 16),
                  (max(sizes), 30, 60, 32, 1)]
    if args.shape:
        shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape]
    result: dict = {"threads": args.threads, "block_bytes": M.BLOCK_BYTES, "blas": _blas_info(),
                    "shapes": [], "scaling": []}
    print(f"BLAS: {result['blas']}; similarity block {M.BLOCK_BYTES >> 10} KiB", flush=True)
    with _limit_threads(args.threads):
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
                  f"{r['speedup_vs_previous']}x the previous kernel)", flush=True)
        mat, off = next(iter(cache.values()))
        result["scaling"] = bench_scaling(mat, off, sizes, 32, args.runs)
    print("\n| documents | rows | latency p50 (ms) | us / document |\n|---:|---:|---:|---:|")
    for r in result["scaling"]:
        print(f"| {r['n_docs']:,} | {r['doc_rows']:,} | {r['latency_ms_p50']} | {r['us_per_doc']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
