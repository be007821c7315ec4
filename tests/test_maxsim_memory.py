"""The numpy/BLAS MaxSim path bounds its memory by what a block really holds (issue #61): its
conversion buffer was sized from the query's rows alone, so one wide row asked for
``rows_budget x dim`` values: 32 GiB for a (1, 16384) query and one (1, 16384) float16 document."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from uibk_embedding import maxsim as M

pytestmark = pytest.mark.usefixtures("maxsim_kernel")  # both kernels (conftest.py)


def _peak(fn) -> int:
    """Bytes of the largest traced allocation peak while ``fn`` runs (numpy reports its buffers to
    tracemalloc), so a 32 GiB request is seen without 32 GiB being touched."""
    small = np.ones((1, 4), np.float16)  # warm up: the conversion imports torch on first use
    M.maxsim_scores([np.ones((1, 4), np.float32)], small, np.array([0, 1]), dtype=np.float64)
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_wide_row_is_converted_in_a_bounded_buffer(dtype):
    q, doc = np.ones((1, 16384), np.float32), np.ones((1, 16384), np.float16)
    out = {}
    peak = _peak(lambda: out.setdefault("s", M.maxsim_scores([q], doc, np.array([0, 1]), dtype=dtype)))
    assert out["s"].tolist() == [[16384.0]]
    assert peak < 16 * 2**20, f"asked for {peak / 2**30:.2f} GiB to score one 16384-d row"


def test_the_memory_bound_holds_for_converted_blocks():
    """Many wide float16 documents under a 1 MiB ``max_chunk_bytes``: blocks and their converted
    copies stay near the bound, and the scores equal float64 MaxSim."""
    rng = np.random.default_rng(0)
    docs = [rng.standard_normal((int(n), 4096)).astype(np.float16) for n in rng.integers(1, 6, 200)]
    mat, off = M.pack(docs, dtype=np.float16)
    q = rng.standard_normal((3, 4096)).astype(np.float32)
    out = {}
    peak = _peak(lambda: out.setdefault("s", M.maxsim_scores([q], mat, off, dtype=np.float64,
                                                             max_chunk_bytes=2**20)))
    ref = [M.maxsim(q, d.astype(np.float64)) for d in docs]
    np.testing.assert_allclose(out["s"][0], ref, rtol=1e-12)
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB under a 1 MiB bound"
