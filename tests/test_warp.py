"""What is specific to the WARP store (the shared contract is in tests/conformance): the engine
pid map across flushes, deletes, compaction and reopen; pending writes searched exactly; a kill
inside every step of a flush; filter types through the engine's subset; the vector file's
rewrite; the missing-extra error."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding._sqlite_state import acquire_write_lock, stored_state

pytest.importorskip("xtr_warp")

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.warp import WarpStore
from uibk_embedding.errors import StoreInUse
from uibk_embedding.maxsim import maxsim
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

CHEAP = {"nbits": 2, "kmeans_niters": 1, "min_index_vectors": 64}


def docs_for(seed: int, n: int, rows: int = 20) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(TaggedFormat(), rng, rows) for _ in range(n)]


def engine_hits(store: WarpStore, vecs: list[np.ndarray]) -> list[str]:
    """The engine's own top hit for each vector list (no rerank: the pid map decides the id)."""
    rerank, store.rerank = store.rerank, False
    try:
        return [store.search(v, k=1)[0].id for v in vecs]
    finally:
        store.rerank = rerank


def test_pid_map_survives_flushes_deletes_compaction_and_reopen(tmp_path):
    ids, vecs = [f"d{i}" for i in range(300)], docs_for(0, 300)
    s = WarpStore(tmp_path / "w", buffer_size=0, **CHEAP)
    s.upsert(ids, vecs, [{"i": i} for i in range(300)])
    assert not s.has_index and s.n_pending == 300
    s.flush()
    assert s.has_index and s.n_pending == 0
    gone = [f"d{i}" for i in range(0, 300, 4)]  # 25%: over the compaction threshold
    s.delete(gone)
    moved, new = docs_for(1, 2)
    s.upsert(["d1", "new"], [moved, new], [{"i": 2}, {"i": -1}])
    vecs[1] = moved
    s.flush()  # tombstones, add, compact: the engine keeps its pids, the map follows
    live = [i for i in range(300) if i % 4]
    assert engine_hits(s, [vecs[i] for i in live]) == [ids[i] for i in live]
    assert s.get(["d1"])[0].metadata == {"i": 2}
    usage = s.disk_usage()
    assert usage["warp_index"] > 0 and usage["stored"] >= 226 * 23 * 128 * 2  # float16 originals
    s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a clean reopen: no rebuild
        s2 = WarpStore(tmp_path / "w", buffer_size=0, min_index_vectors=64)
    try:
        assert s2.count() == 226 and s2.has_index and s2.n_pending == 0
        assert engine_hits(s2, [vecs[i] for i in live]) == [ids[i] for i in live]
        assert engine_hits(s2, [new]) == ["new"]
    finally:
        s2.close()


def test_pending_writes_are_searched_exactly_beside_the_engine(tmp_path):
    vecs = docs_for(2, 300)
    s = WarpStore(tmp_path / "w", buffer_size=1000, n_rerank=20, **CHEAP)
    s.upsert([f"d{i}" for i in range(300)], vecs)
    s.flush()
    new, moved = docs_for(3, 2)
    s.upsert(["fresh", "d7"], [new, moved])  # pending: not in the engine yet
    assert s.n_pending == 2
    hit = s.search(new, k=1)[0]
    assert hit.id == "fresh" and hit.score == pytest.approx(maxsim(new, new), rel=1e-3)
    # d7's old vectors are still in the engine (a dead pid): never returned under its id
    for h in s.search(vecs[7], k=300):
        if h.id == "d7":
            assert h.score == pytest.approx(maxsim(vecs[7], moved), rel=1e-3)
    assert s.search(moved, k=1)[0].id == "d7"
    s.close()


_CHILD = textwrap.dedent("""
    import os, signal, sys, numpy as np
    from xtr_warp import XTRWarp
    from uibk_embedding.adapters.warp import WarpStore
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list
    path, step = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(5)
    docs = [make_list(TaggedFormat(), rng, 20) for _ in range(330)]
    s = WarpStore(path, buffer_size=10_000, nbits=2, kmeans_niters=1, min_index_vectors=64)
    s.upsert([f"d{i}" for i in range(300)], docs[:300], [{"i": i} for i in range(300)])
    s.flush()
    s.delete([f"d{i}" for i in range(0, 300, 4)])                       # compaction follows
    s.upsert([f"n{i}" for i in range(30)], docs[300:], [{"i": 300 + i} for i in range(30)])
    real = getattr(XTRWarp, step)
    def die(self, *a, **k):  # the engine's step runs, then the process dies before the commit
        real(self, *a, **k)
        os.kill(os.getpid(), signal.SIGKILL)
    setattr(XTRWarp, step, die)
    s.flush()
    print("flush returned", flush=True)
""")


def _dirty(path: Path) -> bool:
    return stored_state(path, "dirty") == "1"


@pytest.mark.parametrize("step", ["delete", "add", "compact", "load"])
def test_kill_inside_each_step_of_a_flush(tmp_path, step):
    path = tmp_path / "w"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), step], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert _dirty(path)  # every write was committed; the engine was caught half-way
    s = WarpStore(path, buffer_size=0, min_index_vectors=64)  # a reader: exact until a write repairs
    try:
        assert _dirty(path) and not s.has_index
        with pytest.warns(RuntimeWarning, match="interrupted flush"):
            s.flush()
        assert not _dirty(path) and s.has_index and s.n_pending == 0
        rng = np.random.default_rng(5)
        docs = [make_list(TaggedFormat(), rng, 20) for _ in range(330)]
        expect = {f"d{i}": i for i in range(300) if i % 4} | {f"n{i}": 300 + i for i in range(30)}
        assert s.count() == len(expect)
        got = {r.id: r for r in s.get([*list(expect), "d0", "d4"])}
        assert sorted(got) == sorted(expect)
        for doc_id, i in expect.items():
            np.testing.assert_allclose(got[doc_id].vectors, docs[i], atol=1e-3)
            assert got[doc_id].metadata == {"i": i}
        sample = list(expect)[::7]
        assert engine_hits(s, [docs[expect[x]] for x in sample]) == sample
    finally:
        s.close()


def test_filters_keep_exact_types_through_the_engine_subset(tmp_path):
    values = [True, 1, 1.0, "1", False, 0]
    vecs = docs_for(4, 480)
    s = WarpStore(tmp_path / "w", buffer_size=0, n_rerank=20, **CHEAP)
    s.upsert([f"d{i}" for i in range(480)], vecs, [{"v": values[i % 6]} for i in range(480)])
    q = make_list(TaggedFormat(), np.random.default_rng(9), 12)
    for flt, ok in [({"v": True}, lambda v: v is True),
                    ({"v": 1}, lambda v: not isinstance(v, bool | str) and v == 1),
                    ({"v": {"$in": ["1", False]}}, lambda v: v == "1" or v is False)]:
        hits = s.search(q, k=10, filter=flt)  # 80-160 allowed documents > the pool of 20
        assert len(hits) == 10
        assert all(ok(h.metadata["v"]) for h in hits), (flt, [h.metadata for h in hits])
    assert s.has_index
    s.close()


def test_vector_file_is_rewritten_once_mostly_garbage(tmp_path):
    vecs = docs_for(6, 50, rows=200)
    s = WarpStore(tmp_path / "w", vector_dtype="float32", min_index_vectors=10**9)
    ids = [f"d{i}" for i in range(50)]
    for r in range(8):  # every round overwrites all 50 documents (10,150 rows)
        s.upsert(ids, [v + 0 for v in vecs], [{"round": r}] * 50)
    files = sorted(p.name for p in (tmp_path / "w").glob("vectors-*"))
    assert files != ["vectors-000001.f32"] and len(files) == 1  # a later generation, alone
    s.close()
    s2 = WarpStore(tmp_path / "w")
    try:
        for rec, v in zip(s2.get(ids), vecs, strict=True):
            np.testing.assert_array_equal(rec.vectors, v)
            assert rec.metadata == {"round": 7}
    finally:
        s2.close()


def test_reopen_checks_parameters_and_the_lock(tmp_path):
    s = WarpStore(tmp_path / "w", nbits=2)
    with WarpStore(tmp_path / "w") as reader:  # opening shares the folder
        assert reader.count() == 0
        with acquire_write_lock(tmp_path / "w" / "store.lock", "a writer"), \
                WarpStore(tmp_path / "w", write_timeout=0) as second, \
                pytest.raises(StoreInUse, match="is being written by another store object"):
            second.upsert(["x"], docs_for(0, 1))
    s.close()
    with pytest.raises(ValueError, match="nbits=2, not 4"):
        WarpStore(tmp_path / "w", nbits=4)
    with pytest.raises(ValueError, match="n_rerank must be a positive int"):
        WarpStore(tmp_path / "x", n_rerank=0)
    with ExactStore(tmp_path / "e"):  # the message named the WarpStore the folder never held
        with pytest.raises(ValueError, match=r"holds a store of backend 'exact'"):
            WarpStore(tmp_path / "e")


def test_missing_engine_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xtr_warp", None)
    with pytest.raises(ImportError, match=r"uibk-embedding\[warp\]"):
        WarpStore()


def test_build_progress_on_request_and_quiet_off_a_terminal(tmp_path, capfd):
    """``show_progress=True``: the engine reports its build and its adds on standard error;
    the default (None) stays quiet when standard error is not a terminal, as under pytest."""
    vecs = docs_for(3, 100)
    quiet = WarpStore(tmp_path / "q", **CHEAP)
    quiet.upsert([f"d{i}" for i in range(100)], vecs)
    quiet.flush()
    assert quiet.has_index
    quiet.close()
    assert "Encoded chunk" not in capfd.readouterr().err
    loud = WarpStore(tmp_path / "l", show_progress=True, **CHEAP)
    loud.upsert([f"d{i}" for i in range(100)], vecs)
    loud.flush()
    assert "Index build complete" in capfd.readouterr().err
    loud.upsert(["new"], docs_for(4, 1))
    loud.flush()
    assert loud.n_pending == 0 and "Encoded chunk 1/1" in capfd.readouterr().err  # the add too
    loud.close()
    with pytest.raises(TypeError, match="show_progress must be True, False or None"):
        WarpStore(tmp_path / "x", show_progress="yes")


def test_cpu_builds_cap_the_engine_partition_heuristic(tmp_path, monkeypatch):
    """``num_partitions=None`` builds the engine's heuristic, at most ``CPU_MAX_PARTITIONS``
    centroids on the CPU (lowered here so a small store reaches it); a saved number is kept."""
    import json

    import uibk_embedding.adapters.indexed as indexed_module
    import uibk_embedding.adapters.warp as warp_module

    def built_partitions(store: WarpStore) -> int:
        meta = json.loads((store.path / store._index_dir / "metadata.json").read_text())
        return int(meta["num_partitions"])

    vecs = docs_for(5, 60)  # 60 x 23 = 1,380 vectors: the heuristic is 512
    monkeypatch.setattr(indexed_module, "CPU_MAX_PARTITIONS", 32)
    s = WarpStore(tmp_path / "w", **CHEAP)
    s.upsert([str(i) for i in range(60)], vecs)
    s.flush()
    assert built_partitions(s) == 32 and warp_module.default_partitions(1380, "cuda") == 512
    s.close()
    s = WarpStore(tmp_path / "n", num_partitions=64, **CHEAP)
    s.upsert([str(i) for i in range(60)], vecs)
    s.flush()
    assert built_partitions(s) == 64
    s.close()


def _exact_top(q: np.ndarray, stored: dict[str, np.ndarray], k: int) -> list[tuple[str, float]]:
    """The exact MaxSim top ``k`` of ``stored`` (id -> the vectors as the store keeps them)."""
    scored = sorted(((maxsim(q, v), x) for x, v in stored.items()), key=lambda t: -t[0])
    return [(x, s) for s, x in scored[:k]]


def _assert_exact(store: WarpStore, stored: dict[str, np.ndarray], queries: list[np.ndarray], k: int) -> None:
    for q in queries:
        for rerank in (True, False):
            got = [(h.id, h.score) for h in store.search(q, k=k, rerank=rerank)]
            want = _exact_top(q, stored, k)
            assert [x for x, _ in got] == [x for x, _ in want], rerank
            np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5)


def test_deletes_below_min_index_vectors_drop_the_index_and_search_exactly(tmp_path):
    """A store whose deletes take it under ``min_index_vectors`` (256 here) and under half the
    vectors its index was built from answers from
    its exact scan: the flush drops the engine index and every pid with it (it used to raise
    ``zip() argument 2 is longer`` on every flush, also after a reopen), the reopened store
    searches exactly, and it builds an index again once it grows past the threshold."""
    vecs = docs_for(11, 20)  # 20 x 23 = 460 vectors
    ids = [f"d{i}" for i in range(20)]
    s = WarpStore(tmp_path / "w", nbits=2, kmeans_niters=1, buffer_size=0, min_index_vectors=256)
    s.upsert(ids, vecs)
    s.flush()
    assert s.has_index and stored_state(tmp_path / "w", "index_dir") == "warp-000001"
    s.delete(ids[:12])  # 8 x 23 = 184 vectors < 256
    s.flush()
    assert not s.has_index and s.n_pending == 8 and stored_state(tmp_path / "w", "index_dir") == ""
    assert not list((tmp_path / "w").glob("warp-*"))
    live = {x: s.get([x])[0].vectors for x in ids[12:]}
    queries = [*vecs[12:15], *docs_for(12, 2)]
    _assert_exact(s, live, queries, k=5)
    s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing to repair
        s = WarpStore(tmp_path / "w", buffer_size=0, min_index_vectors=256)
    try:
        assert s.count() == 8 and not s.has_index
        s.flush()
        _assert_exact(s, live, queries, k=5)
        more = docs_for(13, 10)
        s.upsert([f"m{i}" for i in range(10)], more)  # 18 x 23 = 414 vectors: indexed again
        s.flush()
        assert s.has_index and s.n_pending == 0
        assert engine_hits(s, [live["d15"], more[3]]) == ["d15", "m3"]
    finally:
        s.close()


def test_rebuild_of_a_store_below_min_index_vectors(tmp_path):
    """``rebuild()`` of a store too small for an index (2 documents) leaves it without one and
    searching exactly, in memory and after a reopen (it raised ``zip() argument 2 is longer``)."""
    vecs = docs_for(14, 2)
    s = WarpStore(tmp_path / "w")
    s.upsert(["a", "b"], vecs)
    s.rebuild()
    assert not s.has_index and s.count() == 2
    assert [h.id for h in s.search(vecs[1], k=2)] == ["b", "a"]
    s.close()
    s = WarpStore(tmp_path / "w")
    try:
        s.rebuild()
        assert [h.id for h in s.search(vecs[0], k=2, rerank=False)] == ["a", "b"]
    finally:
        s.close()


def test_a_flush_that_fails_inside_a_search_leaves_the_search_exact(tmp_path, monkeypatch):
    """The index build a search runs failed (a full disk here): every search raised, each one
    building again. Now the search answers exactly over the committed documents, warns once,
    and no search builds again before the next write; stats() names the store's state."""
    import xtr_warp

    ids, vecs = [f"d{i}" for i in range(40)], docs_for(7, 40)
    s = WarpStore(tmp_path / "w", buffer_size=10, **CHEAP)
    s.upsert(ids, vecs)
    stored = {r.id: r.vectors for r in s.get(ids)}
    assert "at flush(), or at a search once more than buffer_size" in s.stats()["reason"]
    real, attempts = xtr_warp.XTRWarp.create, []

    def full_disk(*a, **k):
        attempts.append(1)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(xtr_warp.XTRWarp, "create", full_disk)
    with pytest.warns(RuntimeWarning, match="No space left on device.*exact over the stored vectors"):
        _assert_exact(s, stored, [vecs[3]], 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _assert_exact(s, stored, [vecs[5], vecs[9]], 5)
    assert len(attempts) == 1 and not s.has_index and s.count() == 40
    s.upsert(["more"], docs_for(8, 1))  # a write: the next search tries again
    with pytest.warns(RuntimeWarning, match="No space left"):
        s.search(vecs[1], k=3)
    assert len(attempts) == 2
    monkeypatch.setattr(xtr_warp.XTRWarp, "create", real)
    s.flush()
    assert s.has_index and s.search(vecs[1], k=1)[0].id == "d1"
    s.close()


def test_a_store_below_warps_build_floor_is_scanned_whatever_min_index_vectors_says(tmp_path):
    # xtr-warp-rs panics building from fewer than 10 vectors (kthvalue over an empty slice): a
    # flush raised WarpEngineError and every later search warned with the panic before
    small = {**CHEAP, "min_index_vectors": 1, "buffer_size": 0}
    rng = np.random.default_rng(9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no engine-failure warning on any search
        with WarpStore(tmp_path / "w", **small) as s:
            a, b = make_list(TaggedFormat(), rng, 1), make_list(TaggedFormat(), rng, 2)
            s.upsert(["a", "b"], [a, b])  # 9 rows
            s.flush()
            assert (s.count(), s.has_index) == (2, False)
            assert "xtr-warp-rs builds an index from 10 vectors up" in s.stats()["reason"]
            assert s.search(b, k=2)[0].id == "b"
            s.upsert(["c"], [make_list(TaggedFormat(), rng, 1)])  # 13 rows: built
            s.flush()
            assert s.has_index
            s.delete(["c"])  # back to 9 rows: the index cannot be rebuilt, the store scans
            s.flush()
            assert not s.has_index and s.search(a, k=2)[0].id == "a"
