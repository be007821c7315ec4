"""Exact MaxSim: the reference every backend is checked against.

``MaxSim(q, d) = sum_i max_j q_i . d_j``. Documents of different lengths are packed into one
``(total_rows, dim)`` matrix with row offsets; the maximum runs over exactly each document's own
rows, so no padding row can ever win (the same as masking with ``-inf``; never zero padding,
docs/engines.md#pitfalls).

Two kernels compute the same scores (up to float32 rounding; NaN and infinities, which no store
takes, reach the scores as numpy's arithmetic takes them on both):

- **fused** (``_maxsim_kernel.c``, built with the package; AVX2 + FMA + F16C, checked at run time):
  register-blocked products whose max over a document's rows is taken while they are still in
  registers, so the ``(query vectors x document rows)`` product matrix is never written to memory;
  float16 rows are widened in a 24 KiB buffer on the fly (no slower than float32 rows: half the
  bytes to read), int8 rows and the rotated 4/3/2-bit codes (:mod:`uibk_embedding.quantize`)
  decoded there 8 codes at a time in registers, bit for bit their float32 decoding; documents
  are split across the cores (:data:`THREADS`). Used for float32 scores whenever it is built and
  the CPU has those instructions (:func:`kernel`; coded rows need a library built with them:
  :func:`kernel_kinds`). Where the CPU has AVX-512F a second path runs (:func:`kernel_isa`,
  :data:`ISA`): 12 document rows x 32 query rows per tile, float32 rows broadcast straight from
  the matrix; the same FMA chains lane for lane, so its scores are bit for bit the AVX2 path's.
- **blas** (numpy): per cache-sized block one BLAS product in the requested dtype,
  ``np.maximum.reduceat`` over each document's rows and a sum per query. Used for
  ``dtype=np.float64`` (the reference the tests compare with), and for float32 where the fused
  kernel is not available, and for document rows that are neither float32, float16 nor int8 rows
  (float64, another byte order). Coded rows are decoded block by block (exact in float32 and
  float64).

``doc_matrix`` is a ``(rows, dim)`` float array, or a 1-d array of coded rows (128 dimensions:
:data:`~uibk_embedding.quantize.QROW` int8 records or :func:`~uibk_embedding.quantize.code_dtype`
records of a rotated code, whose queries are rotated once here,
:func:`~uibk_embedding.quantize.scan_queries`).

``benchmarks/maxsim_kernel.py`` measures both against the outside MaxSim kernels
(benchmarks/results/maxsim_kernel.md).

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

import ctypes
import functools
import importlib.util
import os
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from uibk_embedding.quantize import CODE_BITS, code_of, is_quantized, scan_queries, scan_rows_into
from uibk_embedding.quantize import DIM as QDIM

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
THREADS: int | None = None
"""Threads of the fused kernel: ``None`` uses every core this process may run on (or the
``UIBK_MAXSIM_THREADS`` environment variable); small scans always run on the calling thread."""
ISA: str | None = None
"""Which path of the fused kernel scores: ``"avx512"``, ``"avx2"``, or ``None``: the
``UIBK_MAXSIM_ISA`` environment variable when set, else the best this CPU runs
(:func:`kernel_isa`). Both give the same scores bit for bit; naming one this CPU lacks is an
error."""
_ISAS = {"avx2": 1, "avx512": 2}  # uibk_maxsim_isa's numbers (bit isa - 1 of uibk_maxsim_isas)
_PARALLEL_WORK = 1 << 18
"""Document rows x query rows below which one thread scans (a thread start costs ~0.1 ms)."""
_CHUNK_ROWS = 48  # CHUNK in _maxsim_kernel.c: its per-thread buffer holds this many rows
_QUERY_BLOCK = 16  # QB in _maxsim_kernel.c


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

    ``dtype=np.float64`` gives the high-precision path used by tests; float32 runs the fused
    kernel when :func:`kernel` says it is available (float32 or float16 rows).

    >>> import numpy as np
    >>> mat, off = pack([np.eye(2, dtype=np.float32), np.ones((1, 2), np.float32)])
    >>> maxsim_scores([np.eye(2, dtype=np.float32)], mat, off).tolist()
    [[2.0, 2.0]]
    """
    n_docs = len(doc_offsets) - 1
    if len(queries) == 0:
        return np.zeros((0, n_docs), dtype=dtype)
    quantized = is_quantized(np.asarray(doc_matrix))
    if any(np.ndim(q) != 2 for q in queries) or np.ndim(doc_matrix) != (1 if quantized else 2):
        raise ValueError("queries and doc_matrix must be (rows, dim) arrays (or int8 rows), got shapes "
                         f"{[np.shape(q) for q in queries][:3]} and {np.shape(doc_matrix)}")
    if np.size(doc_offsets) and not np.issubdtype(np.asarray(doc_offsets).dtype, np.integer):
        raise TypeError(f"doc_offsets must be integers, got {np.asarray(doc_offsets).dtype}")
    qmat, qoff = pack(queries, dtype=dtype)
    dim = QDIM if quantized else doc_matrix.shape[1]
    if n_docs and qmat.shape[1] != dim:
        raise ValueError(f"query vectors have {qmat.shape[1]} dimensions, documents {dim}")
    if n_docs and quantized:  # the rotated codes are scanned against rotated queries
        qmat = scan_queries(qmat, doc_matrix.dtype)
    offsets = np.ascontiguousarray(doc_offsets, dtype=np.int64)
    if (offsets.ndim != 1 or len(offsets) == 0 or offsets[0] < 0 or offsets[-1] > len(doc_matrix)
            or np.any(np.diff(offsets) <= 0)):  # the kernel would read past the matrix
        raise ValueError(f"doc_offsets must rise strictly from 0 or more to at most the {len(doc_matrix)} "
                         "rows of doc_matrix (every document at least one row)")
    lib = _fused() if dtype == np.float32 and (doc_matrix.dtype in (np.float32, np.float16)
                                               or (quantized and kernel_kinds() >= _kinds_for(doc_matrix))) \
        else None
    if lib is None or n_docs == 0:
        return _blas_scores(qmat, qoff, doc_matrix, offsets, n_docs, dtype, max_chunk_bytes)
    if doc_matrix.flags.c_contiguous:
        return _fused_scores(lib, qmat, qoff, doc_matrix, offsets)
    # a strided view: contiguous copies of bounded blocks of whole documents. A document's score
    # does not depend on which block or thread computes it, so this equals scoring a copy.
    out = np.empty((len(queries), n_docs), dtype=np.float32)
    rows_budget = max(1, max_chunk_bytes // _row_bytes(doc_matrix))
    for start, stop in doc_blocks(offsets, rows_budget):
        r0 = offsets[start]
        block = np.ascontiguousarray(doc_matrix[r0:offsets[stop]])
        out[:, start:stop] = _fused_scores(lib, qmat, qoff, block, offsets[start:stop + 1] - r0)
    return out


def _kinds_for(doc_matrix: np.ndarray) -> int:
    """The :func:`kernel_kinds` a library needs to read coded rows of ``doc_matrix``'s dtype."""
    return 3 if code_of(doc_matrix.dtype) == "int8" else 6


def _kind(doc_matrix: np.ndarray) -> int:
    """The kernel's number for the rows of ``doc_matrix`` (``uibk_maxsim``'s ``kind``)."""
    code = code_of(doc_matrix.dtype)
    if code is None:
        return int(doc_matrix.dtype == np.float16)
    return 2 if code == "int8" else 7 - CODE_BITS[code]


def _row_bytes(doc_matrix: np.ndarray) -> int:
    """Bytes of one row of ``doc_matrix`` (an int8 row record is one element)."""
    if is_quantized(doc_matrix):
        return doc_matrix.itemsize
    return doc_matrix.itemsize * max(1, doc_matrix.shape[1])


def doc_blocks(offsets: np.ndarray, rows_budget: int) -> Iterator[tuple[int, int]]:
    """Consecutive ``(start_doc, end_doc)`` ranges of whole documents, each the most whose rows fit
    ``rows_budget`` (at least one document).

    >>> list(doc_blocks(np.array([0, 2, 5, 6, 20]), 4))
    [(0, 1), (1, 3), (3, 4)]
    """
    n_docs, start = len(offsets) - 1, 0
    while start < n_docs:
        end = int(np.searchsorted(offsets, offsets[start] + rows_budget, side="right")) - 1
        end = min(max(end, start + 1), n_docs)
        yield start, end
        start = end


def _blas_scores(qmat: np.ndarray, qoff: np.ndarray, doc_matrix: np.ndarray, offsets: np.ndarray,
                 n_docs: int, dtype: type, max_chunk_bytes: int) -> np.ndarray:
    """:func:`maxsim_scores` with BLAS products and ``np.maximum.reduceat`` (the blas kernel)."""
    out = np.empty((len(qoff) - 1, n_docs), dtype=dtype)
    if n_docs == 0:
        return out
    itemsize = np.dtype(dtype).itemsize
    dim = qmat.shape[1]
    convert = doc_matrix.dtype != dtype  # converted block by block: memory stays bounded
    # what one document row of a block costs: its similarities with every query row and its
    # converted copy (dim values: a wide row with a one-row query would otherwise size a buffer
    # of gigabytes), counted whether or not the rows need converting, so float16 rows are scored
    # in the same blocks, and so to the same bits, as their float32 widening
    row_bytes = itemsize * (max(1, qmat.shape[0]) + dim)
    # cache-sized blocks, never above the memory bound, never below one document
    rows_budget = max(1, min(max(BLOCK_BYTES // row_bytes, MIN_BLOCK_ROWS), max_chunk_bytes // row_bytes))
    buffer = np.empty((0, dim), dtype=dtype)
    single = len(qoff) == 2
    for start_doc, end_doc in doc_blocks(offsets, rows_budget):
        r0, r1 = offsets[start_doc], offsets[end_doc]
        block = doc_matrix[r0:r1]
        if convert:
            if len(buffer) < r1 - r0:  # a block's rows, never more than are left to convert
                rows = max(r1 - r0, min(rows_budget, int(offsets[-1] - r0)))
                buffer = np.empty((rows, dim), dtype=dtype)
            block = _convert_into(block, buffer[: r1 - r0])
        # (query vectors, document rows): the per-document max then runs along contiguous
        # memory, which is ~10x faster than reducing over the other axis
        sims = qmat @ block.T
        best = np.maximum.reduceat(sims, offsets[start_doc:end_doc] - r0, axis=1)
        if single:
            best.sum(axis=0, out=out[0, start_doc:end_doc])
        else:
            out[:, start_doc:end_doc] = np.add.reduceat(best, qoff[:-1], axis=0)
    return out


_LIB: ctypes.CDLL | bool | None = False  # False: not looked up yet


def _fused() -> ctypes.CDLL | None:
    """The fused kernel's library, or ``None`` when it is not built or this CPU lacks AVX2/FMA/F16C."""
    global _LIB
    if _LIB is False:
        _LIB = None
        # built with the package (optional: without a C compiler the blas kernel serves)
        spec = importlib.util.find_spec("uibk_embedding._maxsim_kernel")
        if spec is None or spec.origin is None:
            return None
        try:
            lib = ctypes.CDLL(spec.origin)
        except OSError:
            return None
        if lib.uibk_maxsim_supported():
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            lib.uibk_maxsim.argtypes = [ptr, i64, i64, ptr, ctypes.c_int, ptr, i64, i64, ptr, i64, ptr,
                                        i64, ptr]
            lib.uibk_maxsim.restype = ctypes.c_int
            if hasattr(lib, "uibk_maxsim_isa"):  # a library built before the AVX-512 path lacks it
                lib.uibk_maxsim_isa.argtypes = [ctypes.c_int, *lib.uibk_maxsim.argtypes]
                lib.uibk_maxsim_isa.restype = ctypes.c_int
            _LIB = lib
    return _LIB  # type: ignore[return-value]


def kernel_kinds() -> int:
    """How many row kinds the fused kernel reads here: 6 (float32, float16, int8 rows and the
    rotated 4/3/2-bit codes), 3 for a library built before the rotated codes, 2 before int8 rows
    (rebuilt by ``make setup`` or ``pip install -e .``; the rows it lacks are scored by numpy
    meanwhile), 0 without the fused kernel.

    >>> kernel_kinds() in (0, 2, 3, 6)
    True
    """
    lib = _fused()
    if lib is None:
        return 0
    try:
        kinds = lib.uibk_maxsim_kinds
    except AttributeError:
        return 2
    kinds.restype = ctypes.c_int
    return int(kinds())


def kernel_isas() -> tuple[str, ...]:
    """The paths of the fused kernel this CPU runs, best last: ``("avx2", "avx512")`` with
    AVX-512F, ``("avx2",)`` without (or with a library built before the AVX-512 path), ``()``
    without the fused kernel.

    >>> set(kernel_isas()) <= {"avx2", "avx512"}
    True
    """
    lib = _fused()
    if lib is None:
        return ()
    if not hasattr(lib, "uibk_maxsim_isas"):
        return ("avx2",)
    mask = int(lib.uibk_maxsim_isas())
    return tuple(name for name, bit in _ISAS.items() if mask >> (bit - 1) & 1)


def kernel_isa() -> str | None:
    """The path of the fused kernel that scores here: :data:`ISA` (or ``UIBK_MAXSIM_ISA``) when
    set, else the best of :func:`kernel_isas`; ``None`` without the fused kernel.

    >>> kernel_isa() in (None, "avx2", "avx512")
    True
    """
    have = kernel_isas()
    if not have:
        return None
    want = ISA if ISA is not None else os.environ.get("UIBK_MAXSIM_ISA") or None
    if want is None:
        return have[-1]
    if want not in _ISAS:
        raise ValueError(f"the fused MaxSim kernel's path (ISA or UIBK_MAXSIM_ISA) must be one of "
                         f"{', '.join(map(repr, _ISAS))}, got {want!r}")
    if want not in have:
        raise ValueError(f"the fused MaxSim kernel cannot run its {want!r} path here (this CPU and "
                         f"library run {', '.join(map(repr, have))})")
    return want


def kernel() -> str:
    """Which kernel computes float32 scores here: ``"fused"`` or ``"blas"`` (see the module doc).

    >>> kernel() in ("fused", "blas")
    True
    """
    return "fused" if _fused() is not None else "blas"


def _thread_count() -> int:
    if THREADS is not None:
        return max(1, THREADS)
    env = os.environ.get("UIBK_MAXSIM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"UIBK_MAXSIM_THREADS must be a whole number of threads, got {env!r}") from None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _fused_scores(lib: ctypes.CDLL, qmat: np.ndarray, qoff: np.ndarray, doc_matrix: np.ndarray,
                  offsets: np.ndarray) -> np.ndarray:
    """:func:`maxsim_scores` with the fused kernel, documents split across threads by rows.

    ctypes releases the GIL for the call, so the threads run at once; each gets its own work
    buffer and a disjoint range of documents (and so of output columns).
    """
    n_docs, dim = len(offsets) - 1, qmat.shape[1]
    rows = qmat.shape[0]
    rpad = -(-rows // _QUERY_BLOCK) * _QUERY_BLOCK
    qt = np.zeros((dim, rpad), dtype=np.float32)
    qt[:, :rows] = qmat.T
    out = np.empty((len(qoff) - 1, n_docs), dtype=np.float32)
    first, last = int(offsets[0]), int(offsets[-1])
    threads = min(_thread_count(), n_docs, max(1, (last - first) * rpad // _PARALLEL_WORK))
    # balanced by rows, not documents: thread t takes the documents starting in its share of rows
    bounds = np.searchsorted(offsets, np.linspace(first, last, threads + 1), side="left")
    bounds[0], bounds[-1] = 0, n_docs
    kind = _kind(doc_matrix)
    isa = kernel_isa()
    if hasattr(lib, "uibk_maxsim_isa"):
        call = functools.partial(lib.uibk_maxsim_isa, _ISAS[isa])
    else:  # a library built before the AVX-512 path: its one path, AVX2
        call = lib.uibk_maxsim

    codes: list[int] = []
    failed: list[BaseException] = []  # a worker's error (its thread would only print it)

    def scan(d0: int, d1: int) -> None:
        try:
            work = np.empty(rpad + _CHUNK_ROWS * dim, dtype=np.float32)
            codes.append(call(qt.ctypes.data, rpad, dim, doc_matrix.ctypes.data, kind, offsets.ctypes.data,
                              d0, d1, qoff.ctypes.data, len(qoff) - 1, out.ctypes.data, n_docs,
                              work.ctypes.data))
        except BaseException as e:  # its columns of ``out`` were never written
            failed.append(e)

    # one thread per share; the calling thread scans the first (ranges are disjoint, never empty)
    workers = [threading.Thread(target=scan, args=(int(bounds[t]), int(bounds[t + 1])), daemon=True)
               for t in range(1, threads) if bounds[t] < bounds[t + 1]]
    for w in workers:
        w.start()
    try:
        if bounds[0] < bounds[1]:
            scan(0, int(bounds[1]))
    finally:
        for w in workers:
            w.join()
    if failed:
        raise failed[0]
    if any(codes):
        raise RuntimeError(f"the fused MaxSim kernel refused its arguments (codes {codes})")
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
    if is_quantized(block):  # coded rows: decoded as scanned (exact in float32 and float64)
        return scan_rows_into(block, out)
    try:
        import torch

        torch.from_numpy(out).copy_(torch.from_numpy(block))
    except (TypeError, RuntimeError, ValueError):
        np.copyto(out, block, casting="unsafe")
    return out


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` best scores, best first; ties keep the lower index first.

    ``-inf`` entries (filtered out) and NaN are never returned; ``+inf`` ranks first.

    >>> import numpy as np
    >>> top_k(np.array([0.1, 0.9, -np.inf, 0.9]), 5).tolist()
    [1, 3, 0]
    """
    scores = np.asarray(scores)
    valid = np.flatnonzero(~np.isnan(scores) & (scores != -np.inf))
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
