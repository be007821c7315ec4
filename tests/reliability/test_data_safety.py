"""Ways to lose or corrupt data that a SIGKILL test cannot see: two writers, clocks, folders
that are not ours, torn multi-call writes, failing COMMITs and compactions, a rebuild that
fails on open. Each test reproduces one finding (it fails on the code before its fix) with the
public API, plus fault injection at our own layer where a real fault cannot be made on demand.
The power-loss model of the file code is ``test_power_loss.py``.
"""

from __future__ import annotations

import contextlib
import errno
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

FMT = TaggedFormat()


def docs(seed: int, n: int, rows: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(FMT, rng, rows) for _ in range(n)]


# -- the SQLite layer: a failed COMMIT --------------------------------------------------------------

def test_a_failed_commit_rolls_back_and_the_next_write_works(tmp_path):
    """A COMMIT that fails (here a deferred foreign key checked at COMMIT, a real SQLite failure
    that leaves the transaction open, as a full disk does) must not leave the connection inside
    the transaction: before the fix every later write failed with "cannot start a transaction
    within a transaction"."""
    from uibk_embedding._sqlite_state import connect, state_get, state_set, transaction

    db = connect(tmp_path / "s.sqlite", "CREATE TABLE parent (id INTEGER PRIMARY KEY)",
                 "CREATE TABLE child (pid INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)")
    db.execute("PRAGMA foreign_keys=ON")
    with pytest.raises(sqlite3.IntegrityError), transaction(db):
        state_set(db, generation=7)
        db.execute("INSERT INTO child VALUES (42)")  # no parent 42: COMMIT fails
    assert not db.in_transaction
    assert state_get(db, "generation") is None  # rolled back
    with transaction(db):
        state_set(db, generation=8)
    assert state_get(db, "generation") == "8"


# -- the exact store ---------------------------------------------------------------------------------

def test_exact_store_write_stays_acknowledged_when_compaction_fails(tmp_path, monkeypatch):
    """ENOSPC while copying the live rows into the next vector file: the write itself committed,
    so it returns normally (with a warning), later writes too, and a reopen has them all."""
    import uibk_embedding.adapters.exact as exact
    from uibk_embedding.vectorfile import VectorFile

    real = VectorFile.rewrite

    def full_disk(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(VectorFile, "rewrite", full_disk)
    vecs = docs(1, 6)
    store = exact.ExactStore(path=tmp_path / "s", vector_dtype="float32")
    store.vector_compact_min_rows = 1
    with pytest.warns(RuntimeWarning, match="could not compact"):
        for i, v in enumerate(vecs):
            store.upsert([f"d{i}"], [v])
            store.upsert([f"d{i}"], [v])  # the first copy's rows are dead: compaction is due
    assert store.count() == 6 and store._vgen == 1
    store.close()
    monkeypatch.setattr(VectorFile, "rewrite", real)
    again = exact.ExactStore(path=tmp_path / "s")
    assert again.ids() == [f"d{i}" for i in range(6)]
    np.testing.assert_array_equal(again.get(["d5"])[0].vectors, vecs[5])


def test_exact_store_refuses_a_folder_that_is_not_a_store(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    from uibk_embedding.adapters.exact import ExactStore

    with pytest.raises(CollectionMismatch, match="not an exact store"):
        ExactStore(path=tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


# -- PLAID and WARP: folders that are not theirs, a rebuild that fails on open --------------------

def _plaid(path, **kw):
    pytest.importorskip("fast_plaid")
    from uibk_embedding.plaid_backend.store import PlaidStore

    return PlaidStore(path, nbits=2, kmeans_niters=1, num_threads=1, **{"min_index_vectors": 64, **kw})


def _warp(path, **kw):
    pytest.importorskip("xtr_warp")
    from uibk_embedding.adapters.warp import WarpStore

    return WarpStore(path, nbits=2, kmeans_niters=1, min_index_vectors=64, **kw)


ENGINES = [pytest.param(_plaid, "plaid", id="plaid"), pytest.param(_warp, "warp", id="warp")]


@pytest.mark.parametrize(("make", "name"), ENGINES)
def test_engine_store_keeps_folders_it_did_not_create(tmp_path, make, name):
    """Before the fix, opening a store removed every ``plaid-*`` / ``warp-*`` subfolder that was
    not its current index: a user's ``plaid-notes/results.csv`` was gone."""
    user = tmp_path / "user"
    (user / f"{name}-notes").mkdir(parents=True)
    (user / f"{name}-notes" / "results.csv").write_text("a,b\n")
    with pytest.raises(CollectionMismatch, match="is not empty"):
        make(user)
    assert (user / f"{name}-notes" / "results.csv").read_text() == "a,b\n"
    # a store's own folder that a user put a folder into: the store never deletes it
    store = make(tmp_path / "store")
    store.upsert([f"d{i}" for i in range(20)], docs(2, 20))
    store.close()
    (tmp_path / "store" / f"{name}-notes").mkdir()
    (tmp_path / "store" / f"{name}-notes" / "results.csv").write_text("x")
    again = make(tmp_path / "store")
    assert again.count() == 20
    again.close()
    assert (tmp_path / "store" / f"{name}-notes" / "results.csv").read_text() == "x"


@pytest.mark.parametrize(("make", "name"), ENGINES)
def test_dirty_store_whose_rebuild_fails_opens_without_an_index(tmp_path, make, name, monkeypatch):
    """A store left dirty (an interrupted write) opens and searches its committed documents
    exactly (a reader repairs nothing); the first write rebuilds, and when that fails (ENOSPC) the
    store goes on without an index. Before the fix it could not be opened at all, not even to read."""
    from uibk_embedding._sqlite_state import connect, state_set, transaction

    vecs = docs(3, 40)
    ids = [f"d{i}" for i in range(40)]
    store = make(tmp_path / "s")
    store.upsert(ids, vecs)
    assert store.has_index if name == "plaid" else True
    store.close()
    db = connect(tmp_path / "s" / "store.sqlite")
    with transaction(db):
        state_set(db, dirty="1")
    db.close()
    cls = type(store)

    def no_space(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cls, "_rebuild", no_space)
    opened = make(tmp_path / "s")  # a reader repairs nothing: it searches the stored vectors exactly
    try:
        assert opened.count() == 40 and not opened.has_index
        assert [opened.search(v, k=1)[0].id for v in vecs[:5]] == ids[:5]
        with pytest.warns(RuntimeWarning, match="open without an index"), pytest.raises(OSError):
            opened.flush()  # a write repairs first: the rebuild fails, the store goes on without
        assert [opened.search(v, k=1)[0].id for v in vecs[:5]] == ids[:5]
        np.testing.assert_allclose(opened.get(["d7"])[0].vectors, vecs[7], atol=1e-3)
    finally:
        opened.close()
    monkeypatch.undo()
    healed = make(tmp_path / "s")
    try:
        plaid = name == "plaid"
        with pytest.warns(RuntimeWarning, match="rebuilding") if plaid else contextlib.nullcontext():
            healed.flush()  # the next write rebuilds (PLAID's index; WARP's store wants none here)
        assert healed.has_index or name != "plaid"
        assert healed.count() == 40 and [healed.search(v, k=1)[0].id for v in vecs[:3]] == ids[:3]
    finally:
        healed.close()


def _warp(path, **kw):
    pytest.importorskip("xtr_warp")
    from uibk_embedding.adapters.warp import WarpStore

    return WarpStore(path, nbits=2, kmeans_niters=1, min_index_vectors=64, buffer_size=10**6, **kw)


@pytest.mark.parametrize("engine", ["plaid", "warp"])
def test_in_place_update_is_durable_before_it_is_marked_clean(engine, tmp_path, monkeypatch):
    """The order of the in-place update's durability steps: the engine rewrote its index files
    in place, so they must be fsync'd before ``dirty=0`` commits (PLAID's path did not: after a
    power cut the stale index was trusted and 29 of 29 documents searched with their own vectors
    returned another id; WARP's path lacked it too before the shared store)."""
    import uibk_embedding.adapters.indexed as indexed

    store = _plaid(tmp_path / "s", rebuild_growth=None) if engine == "plaid" else _warp(tmp_path / "s")
    store.upsert([f"a{i}" for i in range(30)], docs(4, 30))
    store.flush()
    assert store.has_index
    events: list[str] = []
    real_sync, real_set = indexed.fsync_tree, type(store)._state_set

    def sync(path):
        events.append(f"fsync {Path(path).name}")
        real_sync(path)

    def record(db, **values):
        events.append("state " + ",".join(f"{k}={v}" for k, v in sorted(values.items())))
        real_set(db, **values)

    monkeypatch.setattr(indexed, "fsync_tree", sync)  # the engine store's fsync
    monkeypatch.setattr(type(store), "_state_set", staticmethod(record))
    store.upsert([f"b{i}" for i in range(5)], docs(5, 5))
    store.flush()  # an engine update, no rebuild
    store.close()
    clean = events.index("state dirty=0")
    dirty = next(i for i, e in enumerate(events) if e.startswith("state dirty=1"))  # in place, marked
    assert any(e.startswith(f"fsync {engine}-") for e in events[dirty:clean]), events


# -- Qdrant local mode: one redo log per collection -------------------------------------------------

def test_qdrant_redo_log_is_replayed_only_into_its_own_collection(tmp_path):
    """A write to ``papers`` that died half-way (its redo entry still logged) must not be
    replayed into ``patents`` when the folder is opened with that collection; ``papers`` gets it
    on its next open. Before the fix the log belonged to the folder: ``patents`` received the
    batch and the entry was deleted, leaving ``papers`` torn."""
    pytest.importorskip("qdrant_client")
    from uibk_embedding.adapters.qdrant import QdrantStore

    vecs = docs(6, 3)
    papers = QdrantStore(path=tmp_path / "q", collection="papers")
    with pytest.raises(KeyboardInterrupt), papers._redo.pending("upsert", ["p1", "p2", "p3"], vecs,
                                                                [{}, {}, {}]):
        raise KeyboardInterrupt  # the process dies after logging, before the engine wrote
    papers.client.close()  # no replay: what a killed process leaves
    patents = QdrantStore(path=tmp_path / "q", collection="patents")
    assert patents.count() == 0, "another collection's torn write was replayed into this one"
    patents.close()
    papers = QdrantStore(path=tmp_path / "q", collection="papers")
    try:
        assert sorted(r.id for r in papers.get(["p1", "p2", "p3"])) == ["p1", "p2", "p3"]
    finally:
        papers.close()


# -- Qdrant Edge: one upsert, several engine calls ----------------------------------------------------

def _dies_at(call, n: int):
    """``call``, except that its ``n``-th call raises (a crash between engine calls)."""
    calls = []

    def wrapper(*a, **kw):
        calls.append(1)
        if len(calls) == n:
            raise OSError(errno.EIO, "injected: the process dies here")
        return call(*a, **kw)

    return wrapper


class _FailingShard:
    """The real Edge shard, whose ``fail_at``-th update call raises (a crash between engine calls)."""

    def __init__(self, shard, fail_at: int) -> None:
        self._shard, self._fail_at, self.calls = shard, fail_at, 0

    def update(self, op):
        self.calls += 1
        if self.calls == self._fail_at:
            raise OSError(errno.EIO, "injected: the process dies here")
        return self._shard.update(op)

    def __getattr__(self, name):
        return getattr(self._shard, name)


def test_qdrant_edge_batch_larger_than_one_engine_call_is_all_or_nothing(tmp_path):
    """600 points are three engine calls of 256; a failure after the first leaves the batch
    whole after reopen (redo log), never 256 of 600 (before the fix)."""
    pytest.importorskip("qdrant_edge")
    from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore

    ids = [f"e{i}" for i in range(600)]
    vecs = docs(7, 600, rows=4)
    store = QdrantEdgeStore(path=tmp_path / "edge", batch_size=256)
    real = store.shard
    store.shard = _FailingShard(real, fail_at=2)
    with pytest.raises(OSError, match="injected"):
        store.upsert(ids, vecs)
    store.shard = real
    store.close()
    again = QdrantEdgeStore(path=tmp_path / "edge")
    try:
        assert again.count() == 600
        np.testing.assert_allclose(again.get(["e599"])[0].vectors, vecs[599], atol=1e-6)
    finally:
        again.close()


@pytest.mark.parametrize("engine", ["edge", "path"])
def test_qdrant_delete_by_filter_after_a_half_way_write_stays_done(tmp_path, engine):
    """An upsert fails half-way (its redo entry stays); a delete by filter then counted and
    removed the matches, and the replay at the next write or open re-created them (Edge), or the
    listing before the replay missed the rest of the write (local mode): acknowledged deletes
    undone. The delete now finishes the logged write first."""
    pytest.importorskip("qdrant_edge")
    pytest.importorskip("qdrant_client")
    from uibk_embedding.adapters.qdrant import QdrantStore
    from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore

    def make():
        if engine == "edge":
            return QdrantEdgeStore(path=tmp_path / "edge", batch_size=3)
        return QdrantStore("c", path=tmp_path / "local", batch_size=3)

    ids = [f"d{i}" for i in range(7)]
    store = make()
    store.upsert(ids, docs(12, 7, rows=3), [{"v": "old"}] * 7)
    if engine == "edge":
        real, store.shard = store.shard, _FailingShard(store.shard, fail_at=2)
    else:
        real_upsert = store.client.upsert
        store.client.upsert = _dies_at(real_upsert, 2)
    with pytest.raises(OSError, match="injected"):
        store.upsert(ids, docs(13, 7, rows=3), [{"v": "new"}] * 7)
    if engine == "edge":
        store.shard = real
    else:
        store.client.upsert = real_upsert
    assert store.delete(filter={"v": "new"}) == 7  # the whole write, finished, then deleted
    store.upsert(["z"], docs(14, 1, rows=3), [{"v": "z"}])
    assert sorted(x for x, _ in store.scan()) == ["z"]
    store.close()
    with make() as again:
        assert sorted(x for x, _ in again.scan()) == ["z"]


# -- Milvus: clocks, the order of deletes, ids with control characters ----------------------------

@pytest.fixture
def lite(tmp_path):
    pytest.importorskip("milvus_lite")
    from uibk_embedding.adapters.milvus import open_milvus_lite

    def make():
        return open_milvus_lite(path=tmp_path / "lite.db", exact=True)

    return make


def test_milvus_writer_with_a_clock_one_hour_behind_still_supersedes(lite, monkeypatch):
    """Write versions came from the wall clock: a writer whose clock is behind wrote a lower
    version, readers kept the old copy and repair() deleted the new one."""
    import uibk_embedding.adapters.milvus as milvus

    old, new = docs(8, 1)[0], docs(9, 1)[0]
    with lite() as store:
        store.upsert(["d"], [old], [{"v": "old"}])
    real = milvus.time.time_ns
    monkeypatch.setattr(milvus.time, "time_ns", lambda: real() - 3600 * 10**9)
    with lite() as store:
        store.upsert(["d"], [new], [{"v": "new"}])
        assert store.get(["d"])[0].metadata == {"v": "new"}
        assert store.repair() == 0
        got = store.get(["d"])[0]
        assert got.metadata == {"v": "new"}
        np.testing.assert_array_equal(got.vectors, new)
        assert store.search(new, k=1)[0].id == "d" and store.count() == 1


def test_milvus_delete_killed_half_way_leaves_no_document_search_cannot_find(lite):
    """A delete that dies between its two collections: every document that get/count/scan
    still return is found by search, and repair() removes what is left. Before the fix the
    token rows went first: the document stayed listed and was never found."""
    vecs = docs(10, 6)
    ids = [f"d{i}" for i in range(6)]
    with lite() as store:
        store.upsert(ids, vecs)
        real = store.client.delete
        store.client.delete = _dies_at(real, 2)
        with pytest.raises(OSError, match="injected"):
            store.delete(["d2"])
        store.client.delete = real
        listed = sorted(x for x, _ in store.scan())
        assert store.count() == len(listed)
        for x in listed:  # each listed document is found by search with its own list
            assert store.search(vecs[ids.index(x)], k=1)[0].id == x, x
        assert "d2" not in listed
        # the orphaned token rows of d2: rows without parts may be a write in progress (rows go
        # first), so they are removed once older than abandoned_after, here at once
        assert store.repair() == 0
        assert store.repair(abandoned_after=0) >= 1
        assert store.repair(abandoned_after=0) == 0


def test_milvus_ids_with_control_characters_are_refused_before_writing(lite):
    with lite() as store:
        store.upsert(["ok"], docs(11, 1))
        for bad in ("tab\there", "bell\x07", "line\nbreak"):
            with pytest.raises(ValueError, match="control character"):
                store.upsert(["fine", bad], docs(12, 2))
        assert store.count() == 1 and store.get(["fine"]) == []


