"""The exact MaxSim kernel against per-document float64 MaxSim, across block boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding import maxsim as M

pytestmark = pytest.mark.usefixtures("maxsim_kernel")  # every test on both kernels (conftest.py)


def _docs(rng: np.random.Generator, n: int, lo: int, hi: int) -> list[np.ndarray]:
    out = []
    for length in rng.integers(lo, hi + 1, n):
        x = rng.standard_normal((int(length), 128)).astype(np.float32)
        out.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    return out


@pytest.mark.parametrize("block_bytes,min_rows",
                         [(M.BLOCK_BYTES, M.MIN_BLOCK_ROWS), (4096, 1), (64 * 1024, 16)])
@pytest.mark.parametrize("n_queries", [1, 5])
def test_kernel_matches_float64_reference_across_blocks(monkeypatch, block_bytes, min_rows, n_queries):
    # small blocks split the collection into many blocks; a 700-row document is larger than a
    # 4 KiB block, so one block then holds a single document
    rng = np.random.default_rng(7)
    big = rng.standard_normal((700, 128)).astype(np.float32)
    docs = [*_docs(rng, 300, 1, 60), big, *_docs(rng, 50, 1, 9)]
    queries = [rng.standard_normal((int(m), 128)).astype(np.float32) for m in rng.integers(1, 40, n_queries)]
    monkeypatch.setattr(M, "BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(M, "MIN_BLOCK_ROWS", min_rows)
    mat, off = M.pack(docs)
    ref = np.array([[M.maxsim(q, d) for d in docs] for q in queries])
    got32 = M.maxsim_scores(queries, mat, off)
    got64 = M.maxsim_scores(queries, mat, off, dtype=np.float64)
    assert got32.dtype == np.float32 and got32.shape == (n_queries, len(docs))
    np.testing.assert_allclose(got64, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got32, ref, rtol=1e-5, atol=1e-5)
    # a block never mixes documents: the scores do not depend on the block size
    monkeypatch.setattr(M, "BLOCK_BYTES", 1 << 30)
    one_block = M.maxsim_scores(queries, mat, off, dtype=np.float64)
    np.testing.assert_allclose(one_block, got64, rtol=1e-12, atol=1e-12)


def test_padding_never_wins_with_negative_scores():
    # every product is negative: a zero-padded row would win the max; the segment max must not see one
    q = np.array([[1.0, 0.0]], np.float32)
    docs = [np.array([[-1.0, 0.0]] * k, np.float32) for k in (1, 3, 2)]
    mat, off = M.pack(docs)
    assert M.maxsim_scores([q], mat, off, dtype=np.float64).tolist() == [[-1.0, -1.0, -1.0]]


def test_offsets_past_the_matrix_are_refused():
    # the fused kernel read past the matrix (garbage scores, or a segfault for 10**9)
    mat, q = np.ones((4, 8), np.float32), [np.ones((1, 8), np.float32)]
    for offsets in ([0, 4, 40], [0, 4, 10**9], [0, 3, 3, 4], [-1, 4], [[0, 4]]):
        with pytest.raises(ValueError, match="doc_offsets"):
            M.maxsim_scores(q, mat, np.array(offsets))


def test_a_bad_thread_count_in_the_environment_is_named(monkeypatch):
    monkeypatch.setattr(M, "THREADS", None)
    monkeypatch.setenv("UIBK_MAXSIM_THREADS", "auto")
    with pytest.raises(ValueError, match="UIBK_MAXSIM_THREADS"):
        M._thread_count()


def test_top_k_keeps_infinite_scores_first():
    # +inf was dropped with -inf: an overflowing best document vanished from the ranking
    assert M.top_k(np.array([1.0, np.inf, -np.inf, np.nan, 2.0]), 5).tolist() == [1, 4, 0]


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_non_finite_value_reaches_the_scores_as_in_float64(value, dtype):
    # the fused kernel's max drops a NaN operand: a document holding a NaN scored the max of its
    # other rows, or of the rows after the NaN one (78.4, 70.5 or -18.1 by the NaN's row), where
    # float64 gives NaN
    rng = np.random.default_rng(3)
    good = _docs(rng, 2, 3, 9)
    q = rng.standard_normal((20, 128)).astype(np.float32)  # more than one 16-row query block
    for row in (0, 5, 6, 49, 99):  # in and across the kernel's groups of 6 rows and chunks of 48
        bad = rng.standard_normal((100, 128)).astype(np.float32)
        bad[row, 7] = value
        mat, off = M.pack([good[0], bad, good[1]], dtype=dtype)
        queries = [q, q[:3], -q[:1]]
        got = M.maxsim_scores(queries, mat, off)
        ref = M.maxsim_scores(queries, mat.astype(np.float64), off, dtype=np.float64)
        assert np.isfinite(got[:, [0, 2]]).all()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=f"row {row}")  # NaN = NaN


def test_a_query_holding_a_nan_scores_nan_everywhere():
    rng = np.random.default_rng(4)
    mat, off = M.pack(_docs(rng, 5, 1, 60))
    q = rng.standard_normal((20, 128)).astype(np.float32)
    q[3, 2] = np.nan
    assert np.isnan(M.maxsim_scores([q], mat, off)).all()


def test_bad_shapes_and_offsets_are_named():
    mat, q = np.ones((4, 8), np.float32), np.ones((2, 8), np.float32)
    with pytest.raises(TypeError, match="doc_offsets must be integers"):
        M.maxsim_scores([q], mat, np.array([0, 1.5, 4]))  # silently cut to 0, 1, 4 before
    for queries, matrix in (([q[0]], mat), ([q], mat.ravel())):  # an IndexError before
        with pytest.raises(ValueError, match=r"must be \(rows, dim\) arrays"):
            M.maxsim_scores(queries, matrix, np.array([0, 4]))


def test_a_worker_thread_failure_is_raised(monkeypatch):
    # a worker thread's exception was printed by threading and the call returned its columns
    # of the output unwritten (np.empty)
    lib = M._fused()
    if lib is None:  # the fixture skips the fused run where the kernel is not built
        pytest.skip("the blas kernel runs no worker threads of its own")
    main = __import__("threading").main_thread()

    class Failing:
        def __getattr__(self, name):
            return getattr(lib, name)

        def uibk_maxsim(self, *args):
            if __import__("threading").current_thread() is not main:
                raise MemoryError("a worker failed")
            return lib.uibk_maxsim(*args)

        def uibk_maxsim_isa(self, *args):  # the entry that names the kernel's path (#59)
            if __import__("threading").current_thread() is not main:
                raise MemoryError("a worker failed")
            return lib.uibk_maxsim_isa(*args)

    monkeypatch.setattr(M, "THREADS", 2)
    rng = np.random.default_rng(5)
    mat, off = M.pack(_docs(rng, 4000, 5, 10))
    with pytest.raises(MemoryError, match="a worker failed"):
        M._fused_scores(Failing(), *M.pack([rng.standard_normal((32, 128)).astype(np.float32)]), mat, off)
