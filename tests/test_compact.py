"""Coded rows and the exact store's profiles (issue 59): the quantizers (int8 and the rotated
4/3/2-bit codes), the fused and numpy paths against one scalar float64 reference, the score bound
and separation on encoded text, the profiles' records (old stores included) and contracts, the
vector files of a profile under the sharing rules, and ``stats()`` / ``uibk-embed stats``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from uibk_embedding import maxsim as M
from uibk_embedding import open_store
from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.quantize import (
    CODES,
    QROW,
    ROTATION,
    code_dtype,
    dequantize,
    quantize,
    row_error_bound,
    scan_dim,
    scan_queries,
    scan_rows_into,
)
from uibk_embedding.tagged import TaggedFormat, check_separation
from uibk_embedding.testing import make_list
from uibk_embedding.vectorfile import VectorFile

FMT = TaggedFormat()


def _docs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(FMT, rng, int(rng.integers(2, 60))) for _ in range(n)]


def _queries(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    qs = [make_list(FMT, rng, m) for m in (32, 5, 17)]
    qs[1] = qs[1].copy()
    qs[1][:3] *= 4.0  # a dense weight
    return qs


def _reference(queries: list[np.ndarray], codes: np.ndarray, off: np.ndarray) -> np.ndarray:
    """The one scalar reference: MaxSim in float64 over the decoded rows as scanned (int8: the
    dequantised rows; rotated codes: rotated, against the rotated queries), one pair at a time."""
    rows = _scan_rows(codes, np.float64)
    qs = [scan_queries(q.astype(np.float64), codes.dtype) for q in queries]
    return np.array([[M.maxsim(q, rows[off[d]:off[d + 1]]) for d in range(len(off) - 1)] for q in qs])


def _scan_rows(codes: np.ndarray, dtype: type) -> np.ndarray:
    return scan_rows_into(codes, np.empty((len(codes), scan_dim(codes.dtype)), dtype))


def _bound(query: np.ndarray, rows: np.ndarray) -> float:
    """Worst-case float32 rounding of MaxSim (as tests/test_maxsim_kernel.py: Higham's gamma_n)."""
    u = np.finfo(np.float32).eps / 2
    n = rows.shape[1] + len(query)
    dmax = float(np.linalg.norm(rows.astype(np.float64), axis=1).max())
    return n * u / (1 - n * u) * float(np.linalg.norm(query.astype(np.float64), axis=1).sum()) * dmax


# -- the quantizer ----------------------------------------------------------------------------
def test_quantize_keeps_the_tag_and_bounds_the_body_error():
    rows = np.concatenate(_docs(50, 1))
    q = quantize(rows)
    assert q.dtype == QROW and QROW.itemsize == 132
    back = dequantize(q)
    np.testing.assert_array_equal(back[:, 0], rows[:, 0].astype(np.float16).astype(np.float32))
    assert np.all(q["codes"][:, 0] == 0) and np.abs(q["codes"].astype(int)).max() <= 127
    # every body coordinate within half a step of its row's scale
    step = q["scale"].astype(np.float64)[:, None]
    assert np.all(np.abs(back[:, 1:] - rows[:, 1:]) <= step / 2 * (1 + 1e-6))
    # the float16 scale makes the dequantisation exact in float32: the same values as in float64
    np.testing.assert_array_equal(back.astype(np.float64), dequantize(q, np.float64))
    # quantising the dequantised rows again changes nothing (a compaction copies codes, but
    # nothing breaks if rows pass through float32)
    np.testing.assert_array_equal(dequantize(quantize(back)), back)


def test_quantize_refuses_other_shapes():
    with pytest.raises(ValueError, match="128"):
        quantize(np.ones((2, 64)))
    with pytest.raises(ValueError, match="code must be one of"):
        quantize(np.ones((2, 128)), "int5")


@pytest.mark.parametrize("code", ["int4", "int3", "int2"])
def test_rotated_codes_keep_the_tag_and_bound_the_body_error(code):
    rows = np.concatenate(_docs(50, 11))
    q = quantize(rows, code)
    bits = {"int4": 4, "int3": 3, "int2": 2}[code]
    assert q.dtype == code_dtype(code) and q.dtype.itemsize == 16 * bits + 4
    back = dequantize(q, np.float64)
    np.testing.assert_array_equal(back[:, 0], rows[:, 0].astype(np.float16).astype(np.float64))
    # the rotation is orthogonal, so the body's error has the norm of the rotated values' error:
    # at most half a step per value (no value is clipped), the bound row_error_bound states
    np.testing.assert_allclose(ROTATION @ ROTATION.T, np.eye(128), atol=1e-14)
    tag_bound, body_bound = row_error_bound(q)
    err = back - rows.astype(np.float64)
    assert np.all(np.abs(err[:, 0]) <= tag_bound)
    assert np.all(np.linalg.norm(err[:, 1:], axis=1) <= body_bound * (1 + 1e-9))
    # every rotated value within half a step of its level: the decoded scan rows against the
    # rotated rows, value by value
    y = np.zeros((len(rows), 128))
    y[:, :127] = rows[:, 1:]
    scan = _scan_rows(q, np.float64)
    step = q["scale"].astype(np.float64)[:, None]
    assert np.all(np.abs(scan[:, 1:] - y @ ROTATION.T) <= step / 2 * (1 + 1e-9))
    # no range is wasted: each row's largest value is coded at the top level (scale = max |y| / h)
    np.testing.assert_array_equal(np.abs(scan[:, 1:]).max(axis=1),
                                  (2 ** bits - 1) / 2 * q["scale"].astype(np.float64))
    # decoding is exact in float32: the same values as in float64
    np.testing.assert_array_equal(_scan_rows(q, np.float32).astype(np.float64), scan)
    # the products of scan rows are the original products (the rotation is undone by the query's)
    qs = scan_queries(rows[:7].astype(np.float64), q.dtype)
    np.testing.assert_allclose(qs @ scan.T, rows[:7].astype(np.float64) @ back.T, atol=1e-12)
    # an all-zero body keeps scale 0 and decodes to zeros
    z = quantize(np.eye(1, 128), code)
    assert z["scale"].tolist() == [0.0] and np.all(dequantize(z)[0, 1:] == 0)


def test_the_score_bound_and_separation_hold_on_encoded_text(real_data):
    """DESIGN.md 1.2 on coded rows: every MaxSim of an encoded query and a coded document is
    within the bound the quantize module derives of its float64 score (Cauchy-Schwarz per row,
    a max moves by at most what its values move), and no query token selects a slot nor a query
    slot a token, as on the float rows."""
    docs, queries = real_data.docs[:80], real_data.queries
    mat, off = M.pack(docs)
    exact = M.maxsim_scores(queries, mat, off, dtype=np.float64)
    assert check_separation(queries, docs).held
    for code in CODES:
        codes = quantize(mat, code)
        got = M.maxsim_scores(queries, codes, off, dtype=np.float64)
        tag_err, body_err = row_error_bound(codes)
        t = np.maximum.reduceat(tag_err, off[:-1])  # each document's largest
        b = np.maximum.reduceat(body_err, off[:-1])
        for qi, q in enumerate(queries):
            q = q.astype(np.float64)
            bound = np.abs(q[:, 0]).sum() * t + np.linalg.norm(q[:, 1:], axis=1).sum() * b
            assert np.all(np.abs(got[qi] - exact[qi]) <= bound + 1e-9), code
            assert np.abs(got[qi] - exact[qi]).max() > 0  # the codes do move scores
        decoded = [dequantize(codes[off[d]:off[d + 1]], np.float64) for d in range(len(docs))]
        assert check_separation(queries, decoded).held, code


# -- the kernels against one reference --------------------------------------------------------
@pytest.mark.usefixtures("maxsim_kernel")
@pytest.mark.parametrize("code", CODES)
def test_coded_rows_match_the_float64_reference_of_their_decoding(monkeypatch, code):
    docs = [*_docs(300, 2), make_list(FMT, np.random.default_rng(3), 700)]  # one long document
    mat, off = M.pack(docs)
    codes = quantize(mat, code)
    queries = _queries(4)
    ref = _reference(queries, codes, off)
    rows = _scan_rows(codes, np.float32)
    scan_q = [scan_queries(q.astype(np.float32), codes.dtype) for q in queries]
    got = M.maxsim_scores(queries, codes, off)
    assert got.dtype == np.float32
    for qi, q in enumerate(queries):
        assert np.abs(got[qi] - ref[qi]).max() <= _bound(q, rows)
    # the float64 path over int8 rows is the reference itself
    np.testing.assert_allclose(M.maxsim_scores(queries, codes, off, dtype=np.float64), ref, rtol=1e-12,
                               atol=1e-12)
    # the fused kernel: the same bytes as scoring the float32 decoding (it decodes exactly, into
    # the buffer its float32 rows are copied to); numpy's products depend on the block shapes,
    # which differ for converted rows: within the bound only
    if M._fused() is not None:
        np.testing.assert_array_equal(got, M.maxsim_scores(scan_q, rows, off))
    # and whatever the thread count (each document is scored whole by one thread)
    for threads in (1, 2, 3, 7):
        monkeypatch.setattr(M, "THREADS", threads)
        np.testing.assert_array_equal(M.maxsim_scores(queries, codes, off), got)
    # a slice of the documents scores as they do among all (fused: bit for bit)
    sub = M.maxsim_scores(queries, codes[off[10]:off[20]], off[10:21] - off[10])
    if M._fused() is not None:
        np.testing.assert_array_equal(sub, got[:, 10:20])
    assert np.abs(sub - ref[:, 10:20]).max() <= max(_bound(q, rows) for q in queries)


def test_the_fused_kernel_reads_coded_rows_where_it_is_built(monkeypatch):
    # a library built before the codes still loads (numpy scores the rows it lacks); this
    # checkout's build must have them all
    if M.kernel() == "fused":
        assert M.kernel_kinds() == 6
    else:
        assert M.kernel_kinds() == 0
    # without the fused kernel (or with one that lacks the codes) numpy scores them, within the
    # rounding bound of the same reference
    docs = _docs(40, 12)
    mat, off = M.pack(docs)
    queries = _queries(13)
    fused = {c: M.maxsim_scores(queries, quantize(mat, c), off) for c in CODES}
    monkeypatch.setattr(M, "kernel_kinds", lambda: 2)
    for c in CODES:
        codes = quantize(mat, c)
        got = M.maxsim_scores(queries, codes, off)
        ref = _reference(queries, codes, off)
        rows = _scan_rows(codes, np.float32)
        for qi, q in enumerate(queries):
            assert np.abs(got[qi] - ref[qi]).max() <= _bound(q, rows)
            assert np.abs(fused[c][qi] - ref[qi]).max() <= _bound(q, rows)


# -- the vector file ---------------------------------------------------------------------------
@pytest.mark.parametrize("code", CODES)
def test_coded_vector_file_with_originals(tmp_path, code):
    docs = _docs(20, 5)
    vf = VectorFile.open(tmp_path, generation=1, dtype=code, committed_rows=0, originals="float16")
    starts = vf.append(docs)
    suffix = {"int8": "i8", "int4": "i4", "int3": "i3", "int2": "i2"}[code]
    assert sorted(os.listdir(tmp_path)) == ["vectors-000001.f16", f"vectors-000001.{suffix}"]
    assert (tmp_path / f"vectors-000001.{suffix}").stat().st_size == code_dtype(code).itemsize * vf.n_rows
    assert (tmp_path / "vectors-000001.f16").stat().st_size == 256 * vf.n_rows
    np.testing.assert_array_equal(vf.read(int(starts[3]), len(docs[3])), docs[3].astype(np.float16))
    lengths = np.array([len(d) for d in docs])
    codes, _ = vf.gather(starts, lengths, None)
    assert codes.dtype == code_dtype(code)
    np.testing.assert_array_equal(codes, quantize(np.concatenate(docs), code))
    mat, _ = vf.gather(starts[:2], lengths[:2])  # as float: decoded
    np.testing.assert_array_equal(mat, dequantize(quantize(np.concatenate(docs[:2]), code)))
    keep = np.arange(0, 20, 2)
    new, new_starts = vf.rewrite(tmp_path, 2, starts[keep], lengths[keep])
    assert new.file_names() == [f"vectors-000002.{suffix}", "vectors-000002.f16"]
    np.testing.assert_array_equal(new.gather(new_starts, lengths[keep], None)[0],
                                  quantize(np.concatenate([docs[i] for i in keep]), code))  # codes copied
    np.testing.assert_array_equal(new.read(int(new_starts[1]), len(docs[2])), docs[2].astype(np.float16))
    vf.close()
    new.close()
    # an uncommitted tail is cut from both files
    again = VectorFile.open(tmp_path, generation=2, dtype=code, committed_rows=5, originals="float16")
    assert again.n_rows == 5 and again.originals.n_rows == 5
    assert (tmp_path / "vectors-000002.f16").stat().st_size == 5 * 256
    again.close()
    with pytest.raises(ValueError, match="originals"):
        VectorFile.open(tmp_path, generation=3, dtype="float32", committed_rows=0, originals="float16")


# -- the profiles ------------------------------------------------------------------------------
def _filled(path, profile, n=120, seed=6, **kw) -> tuple[ExactStore, list[str], list[np.ndarray]]:
    docs = _docs(n, seed)
    ids = [f"d{i}" for i in range(n)]
    s = ExactStore(path=path, profile=profile, **kw)
    s.upsert(ids, docs, [{"i": i} for i in range(n)])
    return s, ids, docs


def test_profiles_are_recorded_and_kept(tmp_path):
    for profile, files in [("compact", {"vectors-000001.i4"}),
                           ("exact-rerank", {"vectors-000001.i2", "vectors-000001.f16"}),
                           ("int8", {"vectors-000001.i8"}),
                           ("int8-rerank", {"vectors-000001.i8", "vectors-000001.f16"}),
                           ("float16", {"vectors-000001.f16"}), ("exact", {"vectors-000001.f32"})]:
        s, _, _ = _filled(tmp_path / profile, profile, n=5)
        s.close()
        assert {p for p in os.listdir(tmp_path / profile) if p.startswith("vectors")} == files
        again = open_store(path=tmp_path / profile)  # the record says which profile
        assert again.profile == profile and again.stats()["profile"] == profile
        again.close()
    with pytest.raises(CollectionMismatch, match=r"vector_dtype='int4', not 'int8'.*profile='int8-rerank'"):
        ExactStore(path=tmp_path / "compact", profile="int8-rerank")
    with pytest.raises(CollectionMismatch, match="profile='int8-rerank', not 'int8'"):
        ExactStore(path=tmp_path / "int8-rerank", profile="int8")  # the originals tell them apart
    with pytest.raises(CollectionMismatch, match="vector_dtype='float32', not 'int4'"):
        ExactStore(path=tmp_path / "exact", profile="compact")
    with pytest.raises(ValueError, match="contradicts"):
        ExactStore(path=tmp_path / "x", profile="compact", vector_dtype="float16")
    with pytest.raises(ValueError, match="profile must be one of"):
        ExactStore(path=tmp_path / "x", profile="tiny")
    with pytest.raises(ValueError, match="needs a path"):
        ExactStore(profile="compact")
    # a float store's record is what it was before profiles
    import sqlite3

    con = sqlite3.connect(tmp_path / "exact" / "store.sqlite")
    build = json.loads(con.execute("SELECT value FROM state WHERE key = 'config'").fetchone()[0])["build"]
    con.close()
    assert build == {"vector_dtype": "float32"}
    # a coded store's record names its code
    con = sqlite3.connect(tmp_path / "compact" / "store.sqlite")
    build = json.loads(con.execute("SELECT value FROM state WHERE key = 'config'").fetchone()[0])["build"]
    con.close()
    assert build == {"vector_dtype": "int4", "originals": None}


def test_an_int8_store_written_as_compact_before_the_4bit_code_still_opens(tmp_path):
    """0.5 recorded int8 stores as profile "compact": they open as "int8" (their rows are int8
    codes), with the same scores, and a writer adds int8 rows to them."""
    import sqlite3

    s, ids, docs = _filled(tmp_path / "old", "int8", n=30)
    q = _queries(14)[0]
    before = s.scores(q)
    s.close()
    con = sqlite3.connect(tmp_path / "old" / "store.sqlite")
    config = json.loads(con.execute("SELECT value FROM state WHERE key = 'config'").fetchone()[0])
    config["build"] = {"vector_dtype": "int8", "profile": "compact", "originals": None}  # as 0.5 wrote it
    with con:
        con.execute("UPDATE state SET value = ? WHERE key = 'config'", (json.dumps(config),))
    con.close()
    old = open_store(path=tmp_path / "old")
    assert old.profile == "int8" and old.vector_dtype == "int8"
    assert old.scores(q) == before
    old.upsert(["new"], [docs[0]])
    assert old.search(docs[0], k=2)[0].id in ("new", ids[0])
    assert sorted(p for p in os.listdir(tmp_path / "old") if p.startswith("vectors")) == ["vectors-000001.i8"]
    old.close()
    with pytest.raises(CollectionMismatch, match="vector_dtype='int8', not 'int4'"):
        ExactStore(path=tmp_path / "old", profile="compact")


@pytest.mark.parametrize("profile", ["exact-rerank", "int8-rerank"])
def test_rerank_profile_returns_the_exact_top_k_of_its_pool(tmp_path, profile):
    """The rerank contract: the hits are the ``k`` best of the coded scan's ``rerank_depth``
    best documents by exact MaxSim of their float16 originals, with those scores (bit for bit the
    float16 store's), wherever they stood in the pool."""
    depth, k = 12, 5
    s, ids, docs = _filled(tmp_path / "r", profile, rerank_depth=depth)
    f16, _, _ = _filled(tmp_path / "f", "float16")
    codes, off = M.pack(docs)
    codes = quantize(codes, {"exact-rerank": "int2", "int8-rerank": "int8"}[profile])
    for q in [*_queries(7), docs[3], docs[40]]:
        coarse = M.maxsim_scores([q], codes, off)[0]
        pool = set(M.top_k(coarse, depth).tolist())
        exact = f16.scores(q)  # float16 rows, fused kernel: the originals' exact scores
        want = sorted(pool, key=lambda i: (-exact[ids[i]], i))[:k]
        hits = s.search(q, k=k)
        assert [h.id for h in hits] == [ids[i] for i in want]
        assert [h.score for h in hits] == [exact[ids[i]] for i in want]
        # the pool may hold documents the int8 order ranked below k: they are found all the same
        full = [h.id for h in f16.search(q, k=k)]
        assert set(full) & {ids[i] for i in pool} <= {h.id for h in hits}
    # filtered: the pool is drawn from the allowed documents only
    hits = s.search(docs[7], k=3, filter={"i": {"$lt": 10}})
    assert hits[0].id == "d7" and all(h.metadata["i"] < 10 for h in hits)
    # get and explain read the originals
    np.testing.assert_array_equal(s.get(["d9"])[0].vectors, docs[9].astype(np.float16).astype(np.float32))
    assert s.explain(docs[9], "d9").total == pytest.approx(exact_self := f16.scores(docs[9])["d9"], abs=1e-4)
    assert exact_self > 0
    s.close()
    f16.close()


@pytest.mark.parametrize(("profile", "code"), [("compact", "int4"), ("int8", "int8")])
def test_compact_profile_scores_its_coded_rows(tmp_path, profile, code):
    s, ids, docs = _filled(tmp_path / "c", profile)
    mat, off = M.pack(docs)
    codes = quantize(mat, code)
    q = _queries(8)[0]
    want = M.maxsim_scores([q], codes, off)[0]
    hits = s.search(q, k=10)
    assert [h.id for h in hits] == [ids[i] for i in M.top_k(want, 10)]
    assert [h.score for h in hits] == [float(want[i]) for i in M.top_k(want, 10)]
    np.testing.assert_array_equal(s.get(["d4"])[0].vectors, dequantize(quantize(docs[4], code)))
    s.close()


def test_compaction_and_a_reader_beside_the_writer(tmp_path):
    """The profile's two files follow the vector file's generation rules: a compaction writes both
    into the next generation and removes the old pair; a reader that mapped the old pair keeps
    answering from it, then moves on."""
    s, ids, docs = _filled(tmp_path / "r", "exact-rerank", n=60)
    reader = ExactStore(path=tmp_path / "r", read_only=True)
    q = docs[50]
    before = [h.id for h in reader.search(q, k=3)]
    s.delete(ids[:40])
    s.compact()
    assert {p for p in os.listdir(tmp_path / "r") if p.startswith("vectors")} == {
        "vectors-000002.i2", "vectors-000002.f16"}
    assert before[0] == "d50" and reader.search(q, k=3)[0].id == "d50"  # refreshed to the new pair
    assert reader.count() == 20
    want = docs[45].astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(reader.get(["d45"])[0].vectors, want)
    reader.close()
    s.close()


# -- stats ------------------------------------------------------------------------------------
def test_stats_bytes_on_disk_and_resident(tmp_path):
    sizes = {}
    for profile in ("exact", "float16", "compact", "exact-rerank", "int8", "int8-rerank"):
        s, _, docs = _filled(tmp_path / profile, profile, n=50)
        st = s.stats()
        n = sum(len(d) for d in docs)
        assert st["vectors"] == n and st["documents"] == 50
        on_disk = sum(p.stat().st_size for p in (tmp_path / profile).rglob("*") if p.is_file())
        assert st["bytes_on_disk"] == on_disk
        db = sum(p.stat().st_size for p in (tmp_path / profile).glob("store.sqlite*"))
        row = {"exact": 512, "float16": 256, "compact": 68, "exact-rerank": 36, "int8": 132,
               "int8-rerank": 132}[profile]
        assert st["resident_bytes"] == n * row + db  # the scanned rows and the document table
        sizes[profile] = st
        s.close()
    # the originals are on disk, not resident
    assert sizes["int8-rerank"]["bytes_on_disk"] - sizes["int8"]["bytes_on_disk"] >= 256 * sizes[
        "int8"]["vectors"]
    assert sizes["exact-rerank"]["bytes_on_disk"] - sizes["exact-rerank"]["resident_bytes"] >= 256 * sizes[
        "compact"]["vectors"]
    mem = ExactStore()
    mem.upsert(["a"], _docs(1, 9))
    assert mem.stats()["bytes_on_disk"] == 0 and mem.stats()["resident_bytes"] == 512 * mem.stats()["vectors"]
    mem.close()


def test_stats_on_every_store(backend_store, tmp_path):
    """``stats()`` has the same keys on every backend; ``vectors`` counts the stored rows."""
    docs = _docs(3, 10)
    backend_store.upsert(["a", "b", "c"], docs)
    st = backend_store.stats()
    assert st["documents"] == 3 and st["vectors"] == sum(len(d) for d in docs)
    assert st["bytes_on_disk"] is None or st["bytes_on_disk"] > 0 or backend_store.backend == "exact"
    assert st["resident_bytes"] is None or st["resident_bytes"] > 0


def test_cli_stats_and_index_profile(tmp_path, capsys):
    from uibk_embedding.apps.cli import main

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"t{i}", "text": f"wing lift number {i}"}) + "\n"
                              for i in range(4)))
    assert main(["index", str(corpus), "--path", str(tmp_path / "idx"), "--profile", "int8-rerank",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["stats", "--path", str(tmp_path / "idx"), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["backend"] == "exact" and st["profile"] == "int8-rerank" and st["documents"] == 4
    assert st["vectors"] > 12 and st["bytes_on_disk"] > st["resident_bytes"] > 132 * st["vectors"]
    assert main(["stats", "--path", str(tmp_path / "idx")]) == 0
    assert "resident_bytes per vector" in capsys.readouterr().out
    store = ExactStore(path=tmp_path / "idx", read_only=True)
    assert store.profile == "int8-rerank" and store.count() == 4
    store.close()
    with pytest.raises(SystemExit, match="the weaviate backend takes none"):  # no profile= there
        main(["index", str(corpus), "--option", "url=http://127.0.0.1:9", "--backend", "weaviate",
              "--profile", "compact"])


def test_benchmark_runs_on_the_smallest_collection(tmp_path):
    from uibk_embedding.testing.specs import datasets_dir, load_benchmark

    if not (datasets_dir() / "limit-small" / "corpus.jsonl").exists():
        pytest.skip("the shared collections are not on this machine")
    bench = load_benchmark("compact")
    report = bench.run_collection("limit-small", bench.PROFILES, tmp_path)
    by = {r["profile"]: r for r in report["rows"]}
    assert by["exact"]["recall@10_vs_exact"] == 1.0 and by["exact-rerank"]["recall@10_vs_exact"] >= 0.99
    assert by["compact"]["disk_ratio"] <= 0.16 and by["float16"]["disk_ratio"] < 0.55  # the aim
    assert by["compact"]["ndcg@10_delta_points"] >= -0.5
    assert by["exact-rerank"]["resident_per_vector"] <= 64
    assert by["int8-rerank"]["resident_bytes"] == by["int8"]["resident_bytes"]
    md = bench.markdown({"date": "d", "machine": "m", "cpus": 2, "kernel": "fused", "kernel_kinds": 3,
                         "quiet_cores": False, "loadavg_start": [1], "loadavg_end": [1],
                         "collections": [report]})
    assert "| limit-small | compact |" in md and "not quiet" in md
    assert "| `exact-rerank` |" in md and "Which profile when" in md
