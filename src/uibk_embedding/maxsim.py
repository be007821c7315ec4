"""Exact MaxSim: the reference every backend is checked against.

``MaxSim(q, d) = sum_i max_j q_i . d_j``. Documents of different lengths are packed into one
``(total_rows, dim)`` matrix with row offsets; the maximum over each document's rows is a
segment reduction (``np.maximum.reduceat``) over exactly its own rows, so no padding row can
ever win (the same as masking with ``-inf``; never zero padding, docs/engines.md#pitfalls). Work is chunked
over documents so memory stays bounded (``max_chunk_bytes``) whatever the collection size: each
block is one float32 BLAS product ``(query vectors x document rows)`` of about the size of a
core's L2 cache, a segment max along its contiguous rows (read back while still in cache) and a
sum over each query's vectors, so the kernel runs at 0.9x the speed of the bare matrix products
of the same shape (one thread); a batch of queries is stacked into one left operand
(``benchmarks/maxsim_kernel.py``). A document matrix of
another dtype (float16 rows, or float32 rows on the float64 path) is converted block by block into
one reused buffer, never as a whole, with torch's vectorised copy (F16C/AVX-512): ~20x faster than
numpy's ``astype`` for float16, which made float16 rows ~2x slower than float32 rows before.

Example
-------
>>> import numpy as np
>>> q = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
>>> docs = [np.array([[-1.0, 0.0]], np.float32), np.array([[0.6, 0.8], [1.0, 0.0]], np.float32)]
>>> mat, off = pack(docs)
>>> maxsim_scores([q], mat, off, dtype=np.float64).round(3).tolist()
[[-1.0, 1.8]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_CHUNK_BYTES = 256 * 2**20
"""Hard upper bound on the memory of one similarity block (``query rows x document rows``)."""
BLOCK_BYTES = 2 * 2**20
"""Target size of one similarity block (``query rows x document rows`` float32): of the order of the
L2 cache, so the segment max reads the block the matrix product has just written while it is still
close. Measured on 2 cores (AMD EPYC, ``lscpu``: 1 MiB L2 per core, 2 MiB in all;
``benchmarks/maxsim_kernel.py``, benchmarks/results/benchmarks-log.md section 4): 2 MiB blocks run
1.2-1.3x faster than the 16 MiB blocks used before on one thread (1.03-1.18x with two BLAS
threads), for one query and for batches; smaller blocks lose to the per-call overhead of the
product, larger ones to cache misses in the reductions (256 KiB-2 MiB were level within the noise
of a loaded machine, #43)."""
MIN_BLOCK_ROWS = 512
"""Fewest document rows per block (amortises the per-block call overhead for wide queries)."""


def pack(lists: Sequence[np.ndarray], dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate multi-vectors into one matrix plus ``offsets`` (length ``n + 1``)."""
    if len(lists) == 0:
        return np.zeros((0, 0), dtype=dtype), np.zeros(1, dtype=np.int64)
    lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    if np.any(lengths == 0):
        raise ValueError("every multi-vector needs at least one row")
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.concatenate([np.asarray(x, dtype=dtype) for x in lists]), offsets


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """MaxSim of one query and one document, in float64.

    >>> import numpy as np
    >>> maxsim(np.eye(2), np.array([[0.5, 0.5]]))
    1.0
    """
    q = np.asarray(query, dtype=np.float64)
    d = np.asarray(document, dtype=np.float64)
    return float((q @ d.T).max(axis=1).sum())


def maxsim_scores(
    queries: Sequence[np.ndarray],
    doc_matrix: np.ndarray,
    doc_offsets: np.ndarray,
    *,
    dtype: type = np.float32,
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> np.ndarray:
    """Scores of every query against every packed document: shape ``(n_queries, n_docs)``.

    ``dtype=np.float64`` gives the high-precision path used by tests.
    """
    n_docs = len(doc_offsets) - 1
    if len(queries) == 0:
        return np.zeros((0, n_docs), dtype=dtype)
    qmat, qoff = pack(queries, dtype=dtype)
    out = np.empty((len(queries), n_docs), dtype=dtype)
    if n_docs == 0:
        return out
    offsets = np.asarray(doc_offsets, dtype=np.int64)
    itemsize = np.dtype(dtype).itemsize
    row_bytes = itemsize * max(1, qmat.shape[0])
    # cache-sized blocks, never above the memory bound, never below one document
    rows_budget = max(1, min(max(BLOCK_BYTES // row_bytes, MIN_BLOCK_ROWS), max_chunk_bytes // row_bytes))
    convert = doc_matrix.dtype != dtype  # converted block by block: memory stays bounded
    buffer = np.empty((0, doc_matrix.shape[1]), dtype=dtype)
    single = len(queries) == 1
    start_doc = 0
    while start_doc < n_docs:
        r0 = offsets[start_doc]
        # the largest end_doc whose rows fit the budget (at least one document)
        end_doc = int(np.searchsorted(offsets, r0 + rows_budget, side="right")) - 1
        end_doc = min(max(end_doc, start_doc + 1), n_docs)
        r1 = offsets[end_doc]
        block = doc_matrix[r0:r1]
        if convert:
            if len(buffer) < r1 - r0:
                buffer = np.empty((max(r1 - r0, rows_budget), doc_matrix.shape[1]), dtype=dtype)
            block = _convert_into(block, buffer[: r1 - r0])
        # (query vectors, document rows): the per-document max then runs along contiguous
        # memory, which is ~10x faster than reducing over the other axis
        sims = qmat @ block.T
        best = np.maximum.reduceat(sims, offsets[start_doc:end_doc] - r0, axis=1)
        if single:
            best.sum(axis=0, out=out[0, start_doc:end_doc])
        else:
            out[:, start_doc:end_doc] = np.add.reduceat(best, qoff[:-1], axis=0)
        start_doc = end_doc
    return out

def _convert_into(block: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``block`` converted to ``out``'s dtype, written into ``out`` (same shape), which is returned.

    torch's copy converts float16 with F16C/AVX-512 instructions; numpy's ``astype`` converts one
    value at a time (``benchmarks/maxsim_kernel.py``, ``convert`` rows). Dtypes torch cannot view
    (or a non-contiguous block) take numpy's conversion; the values are the same either way (an exact
    widening, or float64 to float32 rounding to nearest).

    >>> import numpy as np
    >>> _convert_into(np.array([[0.5, -2.0]], np.float16), np.empty((1, 2), np.float32)).tolist()
    [[0.5, -2.0]]
    """
    try:
        import torch

        torch.from_numpy(out).copy_(torch.from_numpy(block))
    except (TypeError, RuntimeError, ValueError):
        np.copyto(out, block, casting="unsafe")
    return out


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best scores, best first; ties keep the lower index first.

    ``-inf`` entries (filtered out) are never returned.

    >>> import numpy as np
    >>> top_k(np.array([0.1, 0.9, -np.inf, 0.9]), 5).tolist()
    [1, 3, 0]
    """
    scores = np.asarray(scores)
    valid = np.flatnonzero(np.isfinite(scores))
    if k <= 0 or len(valid) == 0:
        return np.zeros(0, dtype=np.int64)
    s = scores[valid]
    if k < len(valid):
        part = np.argpartition(-s, k - 1)[:k]
        # keep every index tied with the k-th score so that ties resolve by index
        kth = s[part].min()
        part = np.flatnonzero(s >= kth)
    else:
        part = np.arange(len(valid))
    order = np.lexsort((valid[part], -s[part]))
    return valid[part][order][:k]
