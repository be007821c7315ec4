"""What is specific to the PLAID store (the shared contract is in tests/conformance):
the id map across deletes and reopen, crash safety of writes (kill -9), the query-time dense
weight without rerank, thread count, panics, reproducible builds, tiny stores."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding._sqlite_state import acquire_write_lock, stored_state
from uibk_embedding.errors import CollectionMismatch, StoreInUse

pytest.importorskip("fast_plaid")

from uibk_embedding.maxsim import maxsim
from uibk_embedding.plaid_backend.store import PlaidEngineError, PlaidStore, engine_call
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

CHEAP = {"nbits": 2, "kmeans_niters": 1, "num_threads": 1, "min_index_vectors": 64}


def docs_for(seed: int, n: int, rows: int = 20) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(TaggedFormat(), rng, rows) for _ in range(n)]


def self_hits(store: PlaidStore, ids: list[str], vecs: list[np.ndarray]) -> list[str]:
    return [store.search(v, k=1)[0].id for v in vecs]


def test_id_map_survives_deletes_upserts_and_reopen(tmp_path):
    ids, vecs = [f"d{i}" for i in range(30)], docs_for(0, 30)
    s = PlaidStore(tmp_path / "p", rerank=False, **CHEAP)
    s.upsert(ids, vecs, [{"i": i} for i in range(30)])
    assert s.has_index
    s.delete(["d3", "d10", "d11"])  # fast-plaid renumbers every later document
    s.upsert(["d20", "new"], [vecs[3], docs_for(1, 1)[0]], [{"i": 3}, {"i": -1}])
    vecs[20] = vecs[3]
    live = [i for i in range(30) if i not in (3, 10, 11)]
    expect = [ids[i] for i in live]
    # PLAID alone (no rerank) maps its positions back to the right ids
    assert self_hits(s, expect, [vecs[i] for i in live]) == expect
    assert s.get(["d20"])[0].metadata == {"i": 3}
    usage = s.disk_usage()
    assert usage["plaid_index"] > 0 and usage["stored"] >= 28 * 23 * 128 * 2  # float16 originals
    s.close()
    s2 = PlaidStore(tmp_path / "p", rerank=False, num_threads=1)
    assert s2.count() == 28 and s2.has_index
    assert self_hits(s2, expect, [vecs[i] for i in live]) == expect
    assert s2.search(docs_for(1, 1)[0], k=1)[0].id == "new"
    s2.close()


_CHILD = textwrap.dedent("""
    import os, signal, sys, numpy as np
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.plaid_backend.store import PlaidStore
    from uibk_embedding.testing import make_list
    path, mode = sys.argv[1], sys.argv[2]
    def batch(b):
        rng = np.random.default_rng(100 + b)
        return [f"b{b}-{j}" for j in range(8)], [make_list(TaggedFormat(), rng, 20) for _ in range(8)]
    s = PlaidStore(path, nbits=2, kmeans_niters=1, num_threads=1, start_from_scratch=5, min_index_vectors=64)
    ids, vecs = batch(0)
    s.upsert(ids, vecs)
    if mode == "inside-update":   # die after fast-plaid rewrote its files, before the store is clean
        import fast_plaid.search.update as u
        u.partial_reload = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    print("ready", flush=True)
    b = 1
    while True:
        s.upsert(*batch(b))
        print("done", b, flush=True)
        b += 1
""")


def _check_after_kill(path: Path) -> int:
    s = PlaidStore(path, num_threads=1)  # a reader: it repairs nothing, searches exactly while dirty
    try:
        if _dirty(path):
            assert not s.has_index
            with pytest.warns(RuntimeWarning, match="rebuilding"):
                s.flush()  # the first write repairs what the killed writer left
        assert s.has_index
        n = s.count()
        assert n % 8 == 0 and n >= 8, f"{n} documents: a batch was half stored"
        for b in range(n // 8):
            rng = np.random.default_rng(100 + b)
            vecs = [make_list(TaggedFormat(), rng, 20) for _ in range(8)]
            recs = s.get([f"b{b}-{j}" for j in range(8)])
            assert len(recs) == 8
            for r, v in zip(recs, vecs, strict=True):
                np.testing.assert_allclose(r.vectors, v, atol=1e-3)
            s.rerank = False  # PLAID's own positions -> ids
            assert [s.search(v, k=1)[0].id for v in vecs[:3]] == [f"b{b}-{j}" for j in range(3)]
            s.rerank = True
        return n
    finally:
        s.close()


def _dirty(path: Path) -> bool:
    return stored_state(path, "dirty") == "1"


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _spawn(path: Path, mode: str) -> subprocess.Popen:
    """The writer child; its stderr goes to ``<path>.stderr`` (read by :func:`_stderr`)."""
    with open(f"{path}.stderr", "w") as err:
        return subprocess.Popen([sys.executable, "-c", _CHILD, str(path), mode], stdout=subprocess.PIPE,
                                stderr=err, text=True)


def _stderr(path: Path) -> str:
    return Path(f"{path}.stderr").read_text()[-3000:]


def test_kill_inside_engine_update_keeps_the_committed_batch(tmp_path):
    proc = _spawn(tmp_path / "p", "inside-update")
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, _stderr(tmp_path / "p")
    assert _dirty(tmp_path / "p")  # the batch was committed, the index not yet in line
    assert _check_after_kill(tmp_path / "p") == 16  # reopened with the interrupted batch
    assert not _dirty(tmp_path / "p")


def test_kill_at_a_random_moment_of_a_write_loop(tmp_path):
    proc = _spawn(tmp_path / "p", "loop")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(float(np.random.default_rng().uniform(0.5, 2.5)))
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    assert _check_after_kill(tmp_path / "p") >= 8


def test_dense_weight_survives_without_rerank(tmp_path):
    """fast-plaid does not normalise query vectors: scaled slots scale their contribution."""
    vecs = docs_for(2, 30)
    s = PlaidStore(tmp_path / "p", rerank=False, **{**CHEAP, "nbits": 4})
    s.upsert([f"d{i}" for i in range(30)], vecs)
    q = make_list(TaggedFormat(), np.random.default_rng(3), 10)
    base = {h.id: h.score for h in s.search(q, k=30)}
    exact_base = {f"d{i}": maxsim(q, v) for i, v in enumerate(vecs)}
    for w in (0.25, 8.0):
        qw = q.copy()
        qw[:3] *= w
        hits = {h.id: h.score for h in s.search(qw, k=30)}
        assert hits.keys() == base.keys()
        # token errors of the compressed vectors cancel in the difference; the slot part remains
        got = [hits[x] - base[x] for x in sorted(hits)]
        want = [maxsim(qw, vecs[int(x[1:])]) - exact_base[x] for x in sorted(hits)]
        np.testing.assert_allclose(got, want, atol=0.02 * abs(w - 1) * 3)
    s.close()


def test_thread_count_is_set():
    import torch

    before = torch.get_num_threads()
    try:
        with PlaidStore(num_threads=1) as s:
            assert s.num_threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_engine_panic_becomes_a_clear_error(tmp_path):
    with PlaidStore(tmp_path / "p", **CHEAP) as s:
        s.upsert([f"d{i}" for i in range(10)], docs_for(4, 10))
        with pytest.raises(PlaidEngineError, match="panicked during get_embeddings"):
            engine_call("get_embeddings", s._fp.get_embeddings, [10**6])  # a real Rust panic
        assert s.count() == 10 and s.search(docs_for(4, 1)[0], k=1)[0].id == "d0"


def test_builds_are_reproducible(tmp_path):
    vecs = docs_for(5, 30)
    cents = []
    for name in ("a", "b"):
        with PlaidStore(tmp_path / name, **CHEAP) as s:
            s.upsert([f"d{i}" for i in range(30)], vecs)
            cents.append(np.load(next((tmp_path / name).glob("plaid-*")) / "centroids.npy"))
    np.testing.assert_array_equal(cents[0], cents[1])


def test_tiny_store_has_no_index_and_is_exact(tmp_path):
    with PlaidStore(tmp_path / "p", rerank=False, **CHEAP) as s:
        one = make_list(TaggedFormat(), np.random.default_rng(6), 1)  # 4 rows: too few for PLAID
        s.upsert(["one"], [one])
        assert not s.has_index
        q = make_list(TaggedFormat(), np.random.default_rng(7), 5)
        assert s.search(q, k=3)[0].score == pytest.approx(maxsim(q, one.astype(np.float16)), rel=1e-5)
        s.upsert([f"d{i}" for i in range(5)], docs_for(8, 5))
        assert s.has_index
        s.delete([f"d{i}" for i in range(5)])
        assert not s.has_index and [h.id for h in s.search(q, k=3)] == ["one"]
        assert [p.name for p in (tmp_path / "p").iterdir() if p.name.startswith("plaid-")] == []


def test_a_store_below_fast_plaids_build_floor_is_scanned_whatever_min_index_vectors_says(tmp_path):
    # fast-plaid cannot train its codec from fewer than 10 vectors: every write raised before
    small = {**CHEAP, "min_index_vectors": 1}
    with PlaidStore(tmp_path / "p", **small) as s:
        rng = np.random.default_rng(9)
        s.upsert(["a", "b"], [make_list(TaggedFormat(), rng, n) for n in (1, 2)])  # 9 rows
        assert (s.count(), s.has_index) == (2, False)
        assert "fast-plaid builds an index from 10 vectors up" in s.stats()["reason"]
        s.upsert(["c"], [make_list(TaggedFormat(), rng, 1)])  # 13 rows: built
        assert s.has_index
        s.delete(["b", "c"])  # 4 rows: half what it was built from would keep it, the floor drops it
        assert (s.count(), s.has_index) == (1, False)


def test_reopen_checks_parameters_lock_and_engine_version(tmp_path):
    p = tmp_path / "p"
    s = PlaidStore(p, **CHEAP)
    s.upsert([f"d{i}" for i in range(10)], docs_for(9, 10))
    with acquire_write_lock(p / "store.lock", "a writer"), PlaidStore(p) as reader:  # opens shared
        assert reader.count() == 10
        with PlaidStore(p, write_timeout=0) as second, \
                pytest.raises(StoreInUse, match="is being written by another store object"):
            second.delete(["d0"])  # the write waits for the lock, then fails
    s.close()
    with pytest.raises(CollectionMismatch, match="nbits=2, not 8"):
        PlaidStore(p, nbits=8)
    db = sqlite3.connect(p / "store.sqlite")
    cfg = json.loads(db.execute("SELECT value FROM state WHERE key = 'config'").fetchone()[0])
    cfg["engine"] = "fast-plaid 0.0.0"
    with db:
        db.execute("UPDATE state SET value = ? WHERE key = 'config'", (json.dumps(cfg),))
    db.close()
    old = {x.name for x in p.iterdir() if x.name.startswith("plaid-")}
    s2 = PlaidStore(p, num_threads=1)  # a reader: the index of another engine version is not used
    assert not s2.has_index and s2.search(docs_for(9, 1)[0], k=1)[0].id == "d0"
    with pytest.warns(RuntimeWarning, match="built by fast-plaid 0.0.0"):
        s2.flush()  # the first write rebuilds it
    assert s2.count() == 10 and s2.search(docs_for(9, 1)[0], k=1)[0].id == "d0"
    assert old.isdisjoint(x.name for x in p.iterdir() if x.name.startswith("plaid-"))
    s2.close()
    assert os.path.exists(p / "store.sqlite")


# -- the vector file (schema 2): migration from schema 1, compaction, uncommitted tails ----------

def _schema_1_store(path: Path, docs: list[np.ndarray], dtype: str = "float16") -> None:
    """A store exactly as schema 1 wrote it: vectors as SQLite blobs, no vector file."""
    from uibk_embedding.plaid_backend.store import BUILD_DEFAULTS

    path.mkdir(parents=True)
    db = sqlite3.connect(path / "store.sqlite")
    db.execute("CREATE TABLE docs (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
               "n_rows INTEGER NOT NULL, vectors BLOB NOT NULL, metadata TEXT NOT NULL)")
    db.execute("CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    import importlib.metadata

    config = {"backend": "plaid", "schema": 1, "format": TaggedFormat().to_dict(),
              "build": {**BUILD_DEFAULTS, "nbits": 2, "kmeans_niters": 1, "vector_dtype": dtype},
              "engine": f"fast-plaid {importlib.metadata.version('fast-plaid')}"}
    with db:
        db.executemany("INSERT INTO state VALUES (?, ?)", [("config", json.dumps(config)), ("plaid_dir", ""),
                                                          ("dirty", "0"), ("generation", "0")])
        db.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?)",
                       [(i + 1, f"d{i}", len(v), v.astype(dtype).tobytes(), json.dumps({"i": i}))
                        for i, v in enumerate(docs)])
    db.close()


def test_schema_1_store_is_converted_on_open(tmp_path):
    p, vecs = tmp_path / "p", docs_for(10, 12)
    _schema_1_store(p, vecs)
    (p / "vectors-000001.f16").write_bytes(b"\1" * 1000)  # a conversion killed half-way
    with pytest.warns(RuntimeWarning, match="from schema 1"):  # a one-time conversion: on open
        s = PlaidStore(p, num_threads=1, min_index_vectors=64)
    try:
        assert not s.has_index
        with pytest.warns(RuntimeWarning, match="is missing"):
            s.flush()  # (schema 1 had no index: built by the first write)
        assert s.count() == 12 and s.has_index
        for r, v in zip(s.get([f"d{i}" for i in range(12)]), vecs, strict=True):
            np.testing.assert_array_equal(r.vectors, v.astype(np.float16).astype(np.float32))
            assert r.metadata == {"i": int(r.id[1:])}
        assert [h.id for h in s.search(vecs[5], k=1)] == ["d5"]
        assert s.dead_vector_rows == 0
    finally:
        s.close()
    db = sqlite3.connect(p / "store.sqlite")
    cols = [r[1] for r in db.execute("PRAGMA table_info(docs)")]
    schema = json.loads(db.execute("SELECT value FROM state WHERE key = 'config'").fetchone()[0])["schema"]
    db.close()
    assert "vectors" not in cols and "start" in cols and schema == 2
    assert (p / "vectors-000001.f16").stat().st_size == 12 * 23 * 128 * 2
    with PlaidStore(p, num_threads=1) as again:  # converted once: no warning now
        assert again.get(["d3"])[0].vectors.shape == (23, 128)


def test_unknown_schema_or_foreign_database_is_refused(tmp_path):
    p = tmp_path / "p"
    PlaidStore(p, **CHEAP).close()
    db = sqlite3.connect(p / "store.sqlite")
    cfg = json.loads(db.execute("SELECT value FROM state WHERE key = 'config'").fetchone()[0])
    with db:
        db.execute("UPDATE state SET value = ? WHERE key = 'config'", (json.dumps({**cfg, "schema": 7}),))
    db.close()
    with pytest.raises(ValueError, match="schema 7"):
        PlaidStore(p)
    q = tmp_path / "q"
    q.mkdir()
    db = sqlite3.connect(q / "store.sqlite")
    db.execute("CREATE TABLE docs (x)")
    db.close()
    with pytest.raises(ValueError, match="no configuration"):
        PlaidStore(q)


def _vector_files(p: Path) -> list[str]:
    return sorted(x.name for x in p.iterdir() if x.name.startswith("vectors-"))


def test_dead_rows_are_compacted_and_the_store_reads_the_new_generation(tmp_path):
    p, vecs = tmp_path / "p", docs_for(11, 10)
    s = PlaidStore(p, vector_compact_fraction=0.5, **CHEAP)
    s.upsert([f"d{i}" for i in range(10)], vecs)
    s.upsert(["d0", "d1", "d2", "d3"], [vecs[9]] * 4)  # 4 of 14 documents' rows dead: kept
    assert s.dead_vector_rows == 4 * 23 and _vector_files(p) == ["vectors-000001.f16"]
    s.delete(["d4", "d5", "d6", "d7"])  # 8 of 14 dead: compacted into generation 2
    assert s.dead_vector_rows == 0 and _vector_files(p) == ["vectors-000002.f16"]
    assert s.disk_usage()["vectors"] == 6 * 23 * 128 * 2
    want = {f"d{i}": vecs[9] for i in range(4)} | {"d8": vecs[8], "d9": vecs[9]}
    s.upsert(["d8"], [vecs[8]])  # appends to the new generation
    for r in s.get(sorted(want)):
        np.testing.assert_array_equal(r.vectors, want[r.id].astype(np.float16).astype(np.float32))
    assert s.search(vecs[8], k=1)[0].id == "d8"
    s.upsert(["d8"], [vecs[8]])
    s.rebuild()  # compacts too
    assert s.dead_vector_rows == 0 and _vector_files(p) == ["vectors-000003.f16"]
    s.close()
    with PlaidStore(p, num_threads=1) as again:
        assert again.count() == 6 and again.dead_vector_rows == 0
        for r in again.get(sorted(want)):
            np.testing.assert_array_equal(r.vectors, want[r.id].astype(np.float16).astype(np.float32))


def test_uncommitted_rows_and_unswitched_generations_are_dropped_by_the_next_writer(tmp_path):
    """What a kill leaves: rows appended but never committed (between the append and the
    transaction) and a compacted generation written but never switched to."""
    p, vecs = tmp_path / "p", docs_for(12, 6)
    with PlaidStore(p, vector_dtype="float32", **CHEAP) as s:
        s.upsert([f"d{i}" for i in range(6)], vecs)
        size = (p / "vectors-000001.f32").stat().st_size
    with open(p / "vectors-000001.f32", "ab") as f:
        f.write(np.ones((7, 128), np.float32).tobytes())
    (p / "vectors-000002.f32").write_bytes(np.ones((3, 128), np.float32).tobytes())
    with PlaidStore(p, num_threads=1) as s:
        s.flush()  # a reader leaves them; the first write (of any store object) cuts and removes them
        assert _vector_files(p) == ["vectors-000001.f32"]
        assert (p / "vectors-000001.f32").stat().st_size == size
        assert s.dead_vector_rows == 0
        for r, v in zip(s.get([f"d{i}" for i in range(6)]), vecs, strict=True):
            np.testing.assert_array_equal(r.vectors, v)
        s.upsert(["d6"], [vecs[0]])  # lands right after the committed rows
        np.testing.assert_array_equal(s.get(["d6"])[0].vectors, vecs[0])


def test_the_engine_proposes_as_many_candidates_as_the_store_asks(tmp_path):
    """fast-plaid decompresses and returns only a quarter of ``n_full_scores`` documents: the
    store asks four times its pool, so a pool of 200 gets 200 candidates (it got 128 of 512,
    and at 1M documents recall@10 fell to 0.916: benchmarks/results/memory-log.md). A probe
    count above the index's centroids is cut to them (fast-plaid panicked)."""
    vecs = docs_for(14, 300)
    with PlaidStore(tmp_path / "p", n_ivf_probe=10**4, **CHEAP) as s:  # every centroid probed
        s.upsert([f"d{i}" for i in range(300)], vecs)
        s.flush()
        assert s.has_index
        for top in (10, 200, 300):
            (cands,) = s._engine_candidates([vecs[0]], top, None)
            assert len(cands) == top
            assert len({seq for seq, _ in cands}) == top


def test_n_centroids_bounds_the_number_of_centroids(tmp_path):
    vecs = docs_for(13, 30)  # 690 vectors: fast-plaid's heuristic gives 256 centroids
    counts = {}
    for name, bound in (("auto", None), ("bounded", 16)):
        with PlaidStore(tmp_path / name, n_centroids=bound, **CHEAP) as s:
            s.upsert([f"d{i}" for i in range(30)], vecs)
            counts[name] = len(np.load(next((tmp_path / name).glob("plaid-*")) / "centroids.npy"))
            assert [h.id for h in s.search(vecs[7], k=1)] == ["d7"]
    assert counts == {"auto": 256, "bounded": 16}
    with pytest.raises(ValueError, match="n_centroids=16, not 32"):
        PlaidStore(tmp_path / "bounded", n_centroids=32)
    with pytest.raises(ValueError, match="n_centroids"):
        PlaidStore(tmp_path / "x", n_centroids=0)


def test_cpu_builds_cap_the_centroid_heuristic_unless_a_bound_is_given(tmp_path, monkeypatch):
    """``n_centroids=None`` builds the heuristic, at most ``CPU_MAX_PARTITIONS`` centroids on the
    CPU (lowered here so a small store reaches it); a given bound may exceed the cap."""
    import uibk_embedding.adapters.indexed as indexed_module

    monkeypatch.setattr(indexed_module, "CPU_MAX_PARTITIONS", 32)
    vecs = docs_for(13, 30)  # 690 vectors: the heuristic gives 256 centroids
    counts = {}
    for name, bound in (("auto", None), ("bounded", 64)):
        with PlaidStore(tmp_path / name, n_centroids=bound, **CHEAP) as s:
            s.upsert([f"d{i}" for i in range(30)], vecs)
            counts[name] = len(np.load(next((tmp_path / name).glob("plaid-*")) / "centroids.npy"))
    assert counts == {"auto": 32, "bounded": 64}


def _built_vectors(path: Path) -> int:
    return int(stored_state(path, "built_vectors"))


def test_index_is_rebuilt_when_the_store_has_doubled(tmp_path):
    """Batches add to the index until the store holds more than ``rebuild_growth`` times the
    vectors of the last build; then the index is built anew (new centroids), durably recorded."""
    path = tmp_path / "p"
    s = PlaidStore(path, **CHEAP)
    vecs = docs_for(7, 64)  # 23 rows each
    s.upsert([f"d{i}" for i in range(16)], vecs[:16])
    assert (s._generation, _built_vectors(path)) == (1, 16 * 23)
    s.upsert([f"d{i}" for i in range(16, 32)], vecs[16:32])  # 2.0x: added to the index
    assert (s._generation, _built_vectors(path)) == (1, 16 * 23)
    s.upsert(["d32"], vecs[32:33])  # past 2x: rebuilt from all 33 documents
    assert (s._generation, _built_vectors(path)) == (2, 33 * 23)
    s.close()
    s = PlaidStore(path, rebuild_growth=None, **CHEAP)  # the build size survives a reopen
    assert s._built_vectors == 33 * 23
    s.upsert([f"d{i}" for i in range(33, 64)], vecs[33:64])  # never rebuilt on growth
    assert s._generation == 2
    s.rerank = False
    assert self_hits(s, ["d40", "d63"], [vecs[40], vecs[63]]) == ["d40", "d63"]
    s.close()
    for bad in (1.0, 0, True, "2"):
        with pytest.raises(ValueError, match="rebuild_growth"):
            PlaidStore(tmp_path / "q", rebuild_growth=bad)


@pytest.mark.parametrize(("option", "value", "kind"), [
    ("nbits", -1, "a positive int or None"), ("kmeans_niters", 2.5, "a non-negative int or None"),
    ("seed", True, "a non-negative int or None"),
    # 0 was saved, then every build failed (no training points) and a reopen with a fix was refused
    ("max_points_per_centroid", 0, "a positive int or None"),
    ("n_samples_kmeans", 0, "a positive int or None"),
    ("vector_dtype", np.dtype("float32"), "'float16' or 'float32'"),  # equal to the string; unsaveable
])
def test_a_bad_build_option_is_refused_by_name_before_anything_is_written(tmp_path, option, value, kind):
    import re

    with pytest.raises(ValueError, match=re.escape(f"{option} must be {kind}, got {value!r}") + "$"):
        PlaidStore(tmp_path / "p", **{option: value})


@pytest.mark.parametrize("device", ["banana", "cuda:99", 0])
def test_a_device_the_engine_cannot_use_is_refused_before_anything_is_written(tmp_path, device):
    # accepted before: the first build raised after committing its batch
    with pytest.raises(ValueError, match="device"):
        PlaidStore(tmp_path / "p", device=device)
    assert not (tmp_path / "p").exists()
    assert not (tmp_path / "p").exists()


def _files(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}


def test_compact_profile_keeps_no_originals_through_updates_deletes_and_growth_rebuilds(tmp_path):
    """profile="compact": the folder holds fast-plaid's index (no ``embeddings.npy``: fast-plaid
    keeps one for indexes below ``start_from_scratch``, 0 here), the 4-bit rows and SQLite, no
    float file; answers are fast-plaid's own scores; upserts, deletes and the rebuild past
    2x growth (from the decoded 4-bit rows) keep it so, and a reopen keeps the profile."""
    path, vecs = tmp_path / "p", docs_for(11, 70, rows=23)
    s = PlaidStore(path, profile="compact", **CHEAP)
    assert (s.profile, s.rerank, s.start_from_scratch) == ("compact", False, 0)
    s.upsert([f"d{i}" for i in range(16)], vecs[:16])
    assert s.has_index and s._generation == 1
    s.upsert([f"d{i}" for i in range(16, 33)], vecs[16:33])  # past 2x: rebuilt from the 4-bit rows
    assert s._generation == 2
    s.delete(["d3"])
    s.upsert(["d5"], [vecs[40]])  # an overwrite
    files = _files(path)
    assert not [f for f in files if f.endswith((".f16", ".f32", "embeddings.npy"))], files
    assert [f for f in files if f.startswith("vectors-")] == ["vectors-000001.i4"]
    assert self_hits(s, ["d7", "d5", "d32"], [vecs[7], vecs[40], vecs[32]]) == ["d7", "d5", "d32"]
    hits = s.search(vecs[7], k=3)
    assert "d3" not in {h.id for h in s.search(vecs[3], k=5)}
    # fast-plaid's own score: MaxSim of its decompressed codes (float16 query), not of any stored row
    pos = int(np.searchsorted(s._positions(), s._seq_of["d7"]))
    decoded = s._fp.get_embeddings([pos])[0].float().numpy()
    assert hits[0].score == pytest.approx(maxsim(vecs[7].astype(np.float16).astype(np.float32), decoded),
                                          rel=1e-3)
    assert hits[0].score != pytest.approx(maxsim(vecs[7], vecs[7]), rel=1e-3)
    reranked = s.search(vecs[7], k=1, rerank=True)[0]  # from the 4-bit rows: as an exact compact store
    from uibk_embedding.adapters.exact import ExactStore

    ex = ExactStore(tmp_path / "e", profile="compact")
    ex.upsert(["d7"], [vecs[7]])
    assert reranked.id == "d7" and reranked.score == pytest.approx(ex.search(vecs[7], k=1)[0].score, rel=1e-5)
    ex.close()
    assert np.abs(s.get(["d7"])[0].vectors - vecs[7]).max() < 0.08  # the decoded 4-bit rows
    s.close()
    again = PlaidStore(path, num_threads=1)
    assert again.profile == "compact" and not again.rerank and again.count() == 32
    again.close()


def test_reopen_with_another_profile_is_refused_naming_both(tmp_path):
    for made, asked in (("compact", "exact-rerank"), ("exact-rerank", "compact"), ("exact", "compact")):
        path = tmp_path / made
        s = PlaidStore(path, profile=made, **CHEAP)
        s.upsert(["a"], docs_for(1, 1))
        s.close()
        with pytest.raises(CollectionMismatch, match=f"has profile='{made}', not '{asked}'"):
            PlaidStore(path, profile=asked, **CHEAP)
        assert PlaidStore(path, profile=made, **CHEAP).profile == made  # nothing was changed
    assert PlaidStore(tmp_path / "d", **CHEAP).profile == "exact-rerank"  # the default, as before
    with pytest.raises(ValueError, match="profile='int8' has no meaning on plaid; it takes 'exact'"):
        PlaidStore(tmp_path / "x", profile="int8")
    with pytest.raises(ValueError, match="profile='compact' keeps int4 rows, not vector_dtype='float16'"):
        PlaidStore(tmp_path / "y", profile="compact", vector_dtype="float16")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_cli_index_takes_plaids_profile(tmp_path, capsys):
    from uibk_embedding.apps.cli import main

    corpus = tmp_path / "c.jsonl"
    lines = [json.dumps({"id": f"t{i}", "text": f"wing lift in a slipstream, part {i}"}) for i in range(12)]
    corpus.write_text("\n".join(lines) + "\n")
    where = tmp_path / "idx"
    assert main(["index", str(corpus), "--path", str(where), "--backend", "plaid", "--profile", "compact",
                 "--option", "min_index_vectors=64", "--option", "num_threads=1", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["stats", "--path", str(where), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["backend"] == "plaid" and st["documents"] == 12 and st["has_index"]
    s = PlaidStore(where, read_only=True)
    assert s.profile == "compact" and not list(where.glob("vectors-*.f16"))
    s.close()
    with pytest.raises(SystemExit):  # a name PLAID has no meaning for
        main(["index", str(corpus), "--path", str(tmp_path / "q"), "--backend", "plaid", "--profile", "int8"])
