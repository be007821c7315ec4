"""The exact MaxSim kernels' paths (#43): float16 rows, query batches, odd and 1-row documents,
negative similarities, against float64 MaxSim and an a-priori float32 rounding bound. Every test
runs on both kernels (the fused C kernel and the numpy/BLAS one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from uibk_embedding import maxsim as M

DIM = 128


pytestmark = pytest.mark.usefixtures("maxsim_kernel")  # every test on both kernels (conftest.py)


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return set()
    return {f for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for f in line.split()}


def test_fused_kernel_is_built_where_the_cpu_runs_it(maxsim_kernel):
    # the package builds the C kernel at install; on an x86-64 CPU with AVX2, FMA and F16C it must
    # be what scores float32 (so CI exercises it), never a silent fallback to numpy
    if maxsim_kernel == "blas":
        assert M.kernel() == "blas"
    elif {"avx2", "fma", "f16c"} <= _cpu_flags():
        assert M.kernel() == "fused"


def test_scores_do_not_depend_on_the_thread_count(monkeypatch):
    # each document is scored whole by one thread in one order: bitwise the same for any split
    rng = np.random.default_rng(17)
    docs = [_unit(rng, int(n)) for n in rng.integers(1, 80, 3000)]
    mat, off = M.pack(docs)
    queries = [_unit(rng, 32), _unit(rng, 3), _unit(rng, 17)]
    monkeypatch.setattr(M, "THREADS", 1)
    one = M.maxsim_scores(queries, mat, off)
    for threads in (2, 3, 7):
        monkeypatch.setattr(M, "THREADS", threads)
        np.testing.assert_array_equal(M.maxsim_scores(queries, mat, off), one)


@pytest.mark.parametrize("dim", [1, 5, 130])
def test_any_width_and_many_query_rows(dim):
    # widths that are no multiple of the vector width; 3 x 40 query rows pad to 128 (8 blocks)
    rng = np.random.default_rng(18)
    docs = [rng.standard_normal((int(n), dim)).astype(np.float32) for n in rng.integers(1, 60, 120)]
    queries = [rng.standard_normal((40, dim)).astype(np.float32) for _ in range(3)]
    mat, off = M.pack(docs)
    got = M.maxsim_scores(queries, mat, off)
    ref = np.array([[M.maxsim(q, d) for d in docs] for q in queries])
    u = np.finfo(np.float32).eps / 2
    n = dim + 40
    for qi, q in enumerate(queries):  # the a-priori bound of _bound, for these widths
        bound = n * u / (1 - n * u) * np.linalg.norm(q, axis=1).sum() * max(
            np.linalg.norm(d, axis=1).max() for d in docs)
        assert np.abs(got[qi] - ref[qi]).max() <= bound


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _collection(rng: np.random.Generator) -> list[np.ndarray]:
    # odd lengths, 1-row documents, one document longer than a whole block
    lengths = [1, 3, 1, 7, 31, 1, 129, 2, *rng.integers(1, 90, 200).tolist(), 700, 1]
    return [_unit(rng, int(n)) for n in lengths]


def _bound(query: np.ndarray, docs: list[np.ndarray], dtype: type) -> float:
    """Worst-case rounding of float ``dtype`` MaxSim (Higham's gamma_n = n u / (1 - n u)): each
    dot product of ``DIM`` terms is off by at most gamma_DIM |q_i| |d_j| (Cauchy-Schwarz), the max
    keeps that error, and the sum of the query's maxima adds gamma_m of their magnitudes."""
    u = np.finfo(dtype).eps / 2
    n = DIM + len(query)
    gamma = n * u / (1 - n * u)
    dmax = max(float(np.linalg.norm(d.astype(np.float64), axis=1).max()) for d in docs)
    return gamma * float(np.linalg.norm(query.astype(np.float64), axis=1).sum()) * dmax


@pytest.fixture(params=[(M.BLOCK_BYTES, M.MIN_BLOCK_ROWS), (4096, 1)], ids=["cache-blocks", "tiny-blocks"])
def blocks(request, monkeypatch):
    monkeypatch.setattr(M, "BLOCK_BYTES", request.param[0])
    monkeypatch.setattr(M, "MIN_BLOCK_ROWS", request.param[1])


def test_float16_rows_match_float64_reference_within_bound(blocks):
    rng = np.random.default_rng(11)
    docs16 = [d.astype(np.float16) for d in _collection(rng)]
    queries = [_unit(rng, 32), _unit(rng, 5)]
    mat16, off = M.pack(docs16, dtype=np.float16)
    assert mat16.dtype == np.float16
    got = M.maxsim_scores(queries, mat16, off)
    got64 = M.maxsim_scores(queries, mat16, off, dtype=np.float64)
    assert got.dtype == np.float32 and got64.dtype == np.float64
    for qi, q in enumerate(queries):
        # the reference sees the same float16 values, widened exactly to float64
        ref = np.array([M.maxsim(q, d.astype(np.float64)) for d in docs16])
        np.testing.assert_allclose(got64[qi], ref, rtol=1e-12, atol=1e-12)
        assert np.abs(got[qi] - ref).max() <= _bound(q, docs16, np.float32)
        np.testing.assert_array_equal(M.top_k(got[qi], 10), M.top_k(ref, 10))
    # float16 rows score exactly as their float32 widening does
    np.testing.assert_array_equal(got, M.maxsim_scores(queries, mat16.astype(np.float32), off))


def test_batch_equals_one_query_at_a_time(blocks, maxsim_kernel):
    rng = np.random.default_rng(12)
    docs = _collection(rng)
    mat, off = M.pack(docs)
    queries = [_unit(rng, int(m)) for m in (1, 32, 7, 64, 3)]
    batch = M.maxsim_scores(queries, mat, off)
    assert batch.shape == (len(queries), len(docs))
    for qi, q in enumerate(queries):
        one = M.maxsim_scores([q], mat, off)[0]
        ref = np.array([M.maxsim(q, d) for d in docs])
        bound = _bound(q, docs, np.float32)
        # both are within the rounding bound of the reference, so within twice it of each other
        assert np.abs(batch[qi] - ref).max() <= bound and np.abs(one - ref).max() <= bound
        np.testing.assert_array_equal(M.top_k(batch[qi], 10), M.top_k(ref, 10))
        if maxsim_kernel == "fused":  # each query row is its own lane: a batch changes no bit of a score
            np.testing.assert_array_equal(batch[qi], one)


def test_negative_similarities_and_one_row_documents(blocks):
    # every document points away from the query: all maxima are negative, so a zero (padding) row
    # or a zero initial maximum would win; a 1-row document's score is its single product summed
    rng = np.random.default_rng(13)
    q = np.abs(_unit(rng, 4))
    docs = [-np.abs(_unit(rng, int(n))) for n in (1, 2, 1, 5, 1, 33)]
    mat, off = M.pack(docs)
    got = M.maxsim_scores([q], mat, off, dtype=np.float64)[0]
    ref = np.array([M.maxsim(q, d) for d in docs])
    assert (ref < 0).all()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert got[0] == pytest.approx(float((q.astype(np.float64) @ docs[0][0].astype(np.float64)).sum()),
                                   rel=1e-12)
    got16 = M.maxsim_scores([q], mat.astype(np.float16), off)[0]
    assert (got16 < 0).all()


def test_convert_into_fallback_matches_torch_copy():
    rng = np.random.default_rng(14)
    x16 = _unit(rng, 50).astype(np.float16)
    fast = M._convert_into(x16, np.empty((50, DIM), np.float32))
    # a reversed view has negative strides, which torch cannot view: numpy converts it
    with pytest.raises(ValueError):
        torch.from_numpy(x16[::-1])
    slow = M._convert_into(x16[::-1], np.empty((50, DIM), np.float32))[::-1]
    np.testing.assert_array_equal(fast, x16.astype(np.float32))
    np.testing.assert_array_equal(slow, fast)


def test_non_contiguous_float16_matrix_is_scored_like_a_copy():
    rng = np.random.default_rng(15)
    docs = _collection(rng)[:40]
    mat, off = M.pack(docs, dtype=np.float16)
    wide = np.zeros((len(mat), DIM * 2), np.float16)
    wide[:, ::2] = mat
    q = _unit(rng, 9)
    np.testing.assert_array_equal(M.maxsim_scores([q], wide[:, ::2], off), M.maxsim_scores([q], mat, off))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rerank_of_float16_documents_scores_their_widening(dtype):
    from uibk_embedding.rank import rerank

    rng = np.random.default_rng(16)
    docs16 = [d.astype(np.float16) for d in _collection(rng)[:60]]
    q = _unit(rng, 8)
    got = rerank(q, docs16, k=10, dtype=dtype)
    wide = rerank(q, [d.astype(dtype) for d in docs16], k=10, dtype=dtype)
    assert got == wide


def test_benchmark_engines_table_runs_and_checks_accuracy(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "maxsim_kernel.py"
    spec = importlib.util.spec_from_file_location("maxsim_kernel_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "title": "", "text": "w " * (i % 7 + 1)}) + "\n"
                              for i in range(40)))
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    engines = "kernel_f32,kernel_f16rows,numpy_one_gemm,torch_blocked_f32"
    assert bench.main(["--engines", engines, "--corpus", str(corpus), "--rows", "300", "--runs", "2",
                       "--shape", "0", "--json", str(out), "--md", str(md)]) == 0
    res = json.loads(out.read_text())["engines"]
    assert res["n_docs"] == 40 and abs(res["doc_rows"] - 300) <= 40  # lengths rounded per document
    rows = {r["engine"]: r for r in res["rows"]}
    assert set(rows) == set(engines.split(","))
    for r in rows.values():
        assert r["top10_equal"] == "2/2" and r["max_abs_error"] <= res["float32_rounding_bound"]
    assert rows["numpy_one_gemm"]["ratio_to_fastest_outside"] == 1.0
    assert "| kernel_f16rows |" in md.read_text()


# -- the AVX-512 path (#59): the same FMA chains lane for lane as the AVX2 path, so the same bits --
def _isa_scores(monkeypatch, isa: str, queries: list[np.ndarray], mat: np.ndarray, off: np.ndarray):
    monkeypatch.setattr(M, "ISA", isa)
    assert M.kernel_isa() == isa
    return M.maxsim_scores(queries, mat, off)


def _needs_both_paths(maxsim_kernel) -> None:
    if maxsim_kernel != "fused":
        pytest.skip("the blas kernel has no paths")
    if "avx512" not in M.kernel_isas():
        pytest.skip("this CPU (or library) runs one path of the fused kernel")


# document lengths around the tiles (12 rows; 8 with 48 query rows) and the 48-row chunks: every
# tail tile size, a chunk boundary inside a document, one-row documents, a long document
_TAIL_LENGTHS = [1, 2, 11, 12, 13, 23, 24, 25, 47, 48, 49, 95, 96, 97, *range(3, 11), 700, 1]


@pytest.mark.parametrize("dim", [1, 5, 16, 128, 130])
@pytest.mark.parametrize("query_rows", [[1], [16], [32], [35], [48], [64], [7, 9, 40], [80, 3]])
def test_avx512_path_scores_bit_for_bit_as_avx2(monkeypatch, maxsim_kernel, dim, query_rows):
    # query rows 16 / 32 / 48 / 64 / 80 pad to 1-5 blocks of 16: passes of one, two and three
    # 16-float registers; a NaN in one document row makes its lanes NaN on both paths
    _needs_both_paths(maxsim_kernel)
    rng = np.random.default_rng(21 + dim)
    docs = [rng.standard_normal((n, dim)).astype(np.float32) for n in _TAIL_LENGTHS]
    docs[5][3, 0] = np.nan
    mat, off = M.pack(docs)
    queries = [rng.standard_normal((m, dim)).astype(np.float32) for m in query_rows]
    for rows in (mat, mat.astype(np.float16)):
        fast = _isa_scores(monkeypatch, "avx512", queries, rows, off)
        slow = _isa_scores(monkeypatch, "avx2", queries, rows, off)
        np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
        assert np.isnan(fast[:, 5]).all() and not np.isnan(np.delete(fast, 5, axis=1)).any()
        ref = np.array([[M.maxsim(q, d.astype(np.float64)) for d in rows_of(rows, off)] for q in queries])
        finite = ~np.isnan(ref)
        np.testing.assert_allclose(fast[finite], ref[finite], rtol=1e-5, atol=1e-5)


def rows_of(mat: np.ndarray, off: np.ndarray) -> list[np.ndarray]:
    return [mat[off[i]:off[i + 1]] for i in range(len(off) - 1)]


@pytest.mark.parametrize("code", ["int8", "int4", "int3", "int2"])
def test_avx512_path_scores_coded_rows_as_avx2(monkeypatch, maxsim_kernel, code):
    # int8 rows and the rotated codes (kinds 2-5) are decoded by the same code on both paths
    from uibk_embedding.quantize import quantize

    _needs_both_paths(maxsim_kernel)
    if M.kernel_kinds() < 6:
        pytest.skip("a library built before the rotated codes")
    rng = np.random.default_rng(22)
    docs = [_unit(rng, n) for n in _TAIL_LENGTHS]
    mat, off = M.pack(docs)
    coded = quantize(mat, code)
    queries = [_unit(rng, 32), _unit(rng, 5)]
    fast = _isa_scores(monkeypatch, "avx512", queries, coded, off)
    slow = _isa_scores(monkeypatch, "avx2", queries, coded, off)
    np.testing.assert_array_equal(fast.view(np.uint32), slow.view(np.uint32))
    monkeypatch.setattr(M, "_LIB", None)  # numpy's decoding and products: within float32 rounding
    np.testing.assert_allclose(fast, M.maxsim_scores(queries, coded, off), rtol=1e-5, atol=1e-5)


def test_avx512_path_runs_where_the_cpu_has_it(monkeypatch, maxsim_kernel):
    # like the fused kernel itself: where the CPU has AVX-512F the fast path is what scores
    if maxsim_kernel != "fused":
        pytest.skip("the blas kernel has no paths")
    monkeypatch.delenv("UIBK_MAXSIM_ISA", raising=False)
    assert M.kernel_isa() == M.kernel_isas()[-1]
    if {"avx512f", "avx2", "fma", "f16c"} <= _cpu_flags():
        assert M.kernel_isas() == ("avx2", "avx512") and M.kernel_isa() == "avx512"
    monkeypatch.setenv("UIBK_MAXSIM_ISA", "avx2")
    assert M.kernel_isa() == "avx2"
    monkeypatch.setattr(M, "ISA", "sse")
    with pytest.raises(ValueError, match="must be one of 'avx2', 'avx512', got 'sse'"):
        M.maxsim_scores([_unit(np.random.default_rng(0), 2)], *M.pack([_unit(np.random.default_rng(1), 3)]))
    if "avx512" not in M.kernel_isas():
        monkeypatch.setattr(M, "ISA", "avx512")
        with pytest.raises(ValueError, match="cannot run its 'avx512' path here"):
            M.kernel_isa()


def test_avx512_path_threads_and_batches_change_no_bit(monkeypatch, maxsim_kernel):
    # documents split across threads and query batches: each score is the same on both paths
    _needs_both_paths(maxsim_kernel)
    rng = np.random.default_rng(23)
    docs = [_unit(rng, int(n)) for n in rng.integers(1, 120, 2000)]
    mat, off = M.pack(docs)
    queries = [_unit(rng, 32), _unit(rng, 35), _unit(rng, 1)]
    monkeypatch.setattr(M, "THREADS", 1)
    one = _isa_scores(monkeypatch, "avx2", queries, mat, off)
    for threads in (2, 3):
        monkeypatch.setattr(M, "THREADS", threads)
        np.testing.assert_array_equal(_isa_scores(monkeypatch, "avx512", queries, mat, off), one)
    for qi, q in enumerate(queries):
        np.testing.assert_array_equal(_isa_scores(monkeypatch, "avx512", [q], mat, off)[0], one[qi])


def test_benchmark_compares_the_exact_stores_and_the_avx2_path(tmp_path):
    # the #59 run: the two exact stores answer the same hits, the AVX2 path's engine row is there
    import importlib.util
    import json

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "maxsim_kernel.py"
    spec = importlib.util.spec_from_file_location("maxsim_kernel_bench_stores", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "title": "", "text": "w " * (i % 9 + 1)}) + "\n"
                              for i in range(60)))
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    engines = "kernel_f32,kernel_f16rows_avx2" if "avx2" in M.kernel_isas() else "kernel_f32"
    assert bench.main(["--engines", engines, "--stores", "--corpus", str(corpus), "--rows", "400",
                       "--runs", "3", "--shape", "0", "--json", str(out), "--md", str(md)]) == 0
    res = json.loads(out.read_text())
    stores = res["stores"]
    assert stores["n_docs"] == 60 and stores["same_hits"] == "3/3"
    assert {r["store"] for r in stores["rows_table"]} == {"exact_in_memory", "exact_persisted"}
    assert stores["in_memory_over_persisted"] > 0
    assert {r["engine"] for r in res["engines"]["rows"]} == set(engines.split(","))
    for r in res["engines"]["rows"]:  # float16 rows against the float64 MaxSim of their widening
        assert r["top10_equal"] == "3/3" and r["max_abs_error"] <= res["engines"]["float32_rounding_bound"]
    assert "in memory vs persisted" in md.read_text()
