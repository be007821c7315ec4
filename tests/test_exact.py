"""What is specific to the persisted exact store: its rows scored from the memory-mapped vector
file, the generations that drop dead rows, and the conversion of folders written by 0.4 and older
(an operation log; 0.3.0: vectors inside the ``.npz``) into the file-backed store's format."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest

import uibk_embedding.adapters.exact as exact
from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.maxsim import maxsim
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list
from uibk_embedding.testing.old_formats import write_exact_store_030, write_exact_store_04

FMT = TaggedFormat()


def _docs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(FMT, rng, int(rng.integers(3, 12))) for _ in range(n)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_store_of_04_is_converted_once_keeping_its_vector_file(tmp_path, dtype):
    docs, ids = _docs(6), ["a", "b", "c", "b", "e", "f"]  # "b" overwritten by the operation
    md = [{"i": i} for i in range(6)]
    rows = write_exact_store_04(tmp_path / "s", ids, docs, md, dtype)
    vector_file = next((tmp_path / "s").glob("vectors-*"))
    inode = vector_file.stat().st_ino
    s = ExactStore(path=tmp_path / "s")
    assert s.vector_dtype == dtype and s.ids() == ["c", "b", "e", "f"]
    want = {"c": 2, "b": 3, "e": 4, "f": 5}
    for r in s.get(s.ids()):
        np.testing.assert_array_equal(r.vectors, rows[want[r.id]].astype(np.float32))
        assert r.metadata == md[want[r.id]]
    names = {p.name for p in (tmp_path / "s").iterdir()} - {"store.sqlite-wal", "store.sqlite-shm"}
    assert names == {"store.lock", "store.sqlite", vector_file.name}
    assert vector_file.stat().st_ino == inode  # the rows were not copied (the tail was cut off)
    q = make_list(FMT, np.random.default_rng(4), 5)
    # the float64 ranking: adjacent scores here are >= 0.0073 apart (2e-3 relative; measured for
    # both dtypes), far above float32 accumulation error (~1e-6), so any CPU gives this order
    ranked = [h.id for h in s.search(q, k=4)]
    assert ranked == sorted(want, key=lambda x: -maxsim(q, rows[want[x]].astype(np.float32)))
    s.upsert(["g"], [docs[1]])
    s.close()
    again = ExactStore(path=tmp_path / "s")
    assert again.ids() == ["c", "b", "e", "f", "g"]
    np.testing.assert_array_equal(again.get(["g"])[0].vectors, docs[1].astype(dtype).astype(np.float32))


@pytest.mark.parametrize("killed", ["before the database commits", "before the switch", "after the switch"])
def test_a_conversion_killed_at_any_step_is_redone_or_finished(tmp_path, monkeypatch, killed):
    """Killed before ``store.json`` is removed, the folder is the old store (the half-written
    database goes); after it, the old files are leftovers removed by the next write."""
    docs, ids = _docs(6, seed=1), ["a", "b", "c", "b", "e", "f"]
    write_exact_store_04(tmp_path / "s", ids, docs, [{} for _ in ids])
    real_unlink = Path.unlink

    def crash(*_a, **_k):
        raise KeyboardInterrupt("killed")

    if killed == "before the database commits":
        real_create = ExactStore._create_tables.__func__

        def create_then_crash(cls, *a, **k):  # inside the conversion's transaction, tables made
            real_create(cls, *a, **k)
            crash()

        monkeypatch.setattr(ExactStore, "_create_tables", classmethod(create_then_crash))
    elif killed == "before the switch":
        monkeypatch.setattr(Path, "unlink", lambda p, missing_ok=False: crash() if p.name == "store.json"
                            else real_unlink(p, missing_ok=missing_ok))
    else:
        monkeypatch.setattr(exact, "_remove_op_log", crash)
    with pytest.raises(KeyboardInterrupt):
        ExactStore(path=tmp_path / "s")
    assert (tmp_path / "s" / "store.json").exists() == (killed != "after the switch")
    monkeypatch.undo()
    with ExactStore(path=tmp_path / "s") as s:
        assert s.ids() == ["c", "b", "e", "f"]
        np.testing.assert_array_equal(s.get(["b"])[0].vectors, docs[3])
        s.delete(["no-such-id"])  # a reader cleans nothing up: the first write does
    assert not (tmp_path / "s" / "ops").exists() and not list((tmp_path / "s").glob("snapshot-*"))


def test_a_store_of_030_opens_converted_and_keeps_float32(tmp_path):
    docs, ids = _docs(5), [f"d{i}" for i in range(5)]
    md = [{"i": i} for i in range(5)]
    write_exact_store_030(tmp_path / "s", ids, docs, md)
    s = ExactStore(path=tmp_path / "s")
    assert s.vector_dtype == "float32" and s.ids() == ["d0", "d2", "d3", "d4"]
    for r in s.get(s.ids()):
        np.testing.assert_array_equal(r.vectors, docs[int(r.id[1:])])
        assert r.metadata == md[int(r.id[1:])]
    names = {p.name for p in (tmp_path / "s").iterdir()}
    assert {"store.sqlite", "vectors-000002.f32"} <= names and not names & {"ops", "store.json"}
    s.upsert(["d9"], [docs[1]])
    s.close()
    again = ExactStore(path=tmp_path / "s")
    assert again.ids() == ["d0", "d2", "d3", "d4", "d9"]
    np.testing.assert_array_equal(again.get(["d9"])[0].vectors, docs[1])


def test_rows_are_memory_mapped_and_scored_from_the_file(tmp_path):
    docs = _docs(40)
    s = ExactStore(path=tmp_path / "s", vector_dtype="float16")
    s.upsert([str(i) for i in range(40)], docs)
    s.close()
    s = ExactStore(path=tmp_path / "s")
    assert isinstance(s._vf._mapped(), np.memmap) and s._vf._mapped().dtype == np.float16
    q = make_list(FMT, np.random.default_rng(7), 6)
    hits = s.search(q, k=40)
    want = {str(i): maxsim(q, d.astype(np.float16).astype(np.float32)) for i, d in enumerate(docs)}
    for h in hits:  # exact MaxSim over the float16-rounded rows (float32 accumulation)
        assert h.score == pytest.approx(want[h.id], rel=1e-5, abs=1e-5)


def test_dead_rows_are_dropped_into_the_next_generation(tmp_path):
    docs = _docs(200, seed=1)
    ids = [str(i) for i in range(200)]
    s = ExactStore(path=tmp_path / "s")
    s.upsert(ids, docs)
    before = s.disk_usage()["vectors"]
    s.delete(ids[:150])  # > 1024 dead rows, > 30% of the rows: repacked at once
    assert s._vgen == 2 and s.disk_usage()["vectors"] < 0.4 * before
    assert sorted(p.name for p in (tmp_path / "s").glob("vectors-*")) == ["vectors-000002.f32"]
    kept = {r.id: r.vectors for r in s.get(ids)}
    s.close()
    again = ExactStore(path=tmp_path / "s")
    assert again.ids() == ids[150:]
    for r in again.get(ids):
        np.testing.assert_array_equal(r.vectors, kept[r.id])


def test_the_vector_dtype_is_the_stores_own(tmp_path):
    ExactStore(path=tmp_path / "s", vector_dtype="float16").close()
    with pytest.raises(CollectionMismatch, match="vector_dtype='float16', not 'float32'"):
        ExactStore(path=tmp_path / "s", vector_dtype="float32")
    assert ExactStore(path=tmp_path / "s").vector_dtype == "float16"
    assert ExactStore(path=tmp_path / "t").vector_dtype == "float32"  # the default
    with pytest.raises(ValueError, match="needs a path"):
        ExactStore(vector_dtype="float16")
    with pytest.raises(ValueError, match="vector_dtype must be"):
        ExactStore(path=tmp_path / "t", vector_dtype="int5")  # int8, int4, int3, int2 are codes


def test_a_repack_that_fails_leaves_the_old_generation_in_use(tmp_path, monkeypatch):
    from uibk_embedding.vectorfile import VectorFile

    docs = _docs(10, seed=3)
    s = ExactStore(path=tmp_path / "s", vector_dtype="float32")
    s.upsert([str(i) for i in range(10)], docs)
    s.delete(["9"])  # a dead row, so compact() copies the live rows into the next generation
    real = VectorFile.append

    def full_disk(self, vectors):
        if self.path.name.startswith("vectors-000002"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, vectors)

    monkeypatch.setattr(VectorFile, "append", full_disk)
    with pytest.raises(OSError, match="No space"):
        s.compact()
    assert not (tmp_path / "s" / "vectors-000002.f32").exists()
    s.upsert(["new"], [docs[0]])
    assert s.count() == 10
    s.close()
    again = ExactStore(path=tmp_path / "s")
    assert again.count() == 10 and "9" not in again.ids()
    np.testing.assert_array_equal(again.get(["new"])[0].vectors, docs[0])


def test_compact_copies_the_rows_only_when_some_are_dead(tmp_path):
    docs, ids = _docs(20, seed=3), [str(i) for i in range(20)]
    s = ExactStore(path=tmp_path / "s")
    s.upsert(ids, docs)
    s.compact()  # nothing dead: the same vector file
    assert s._vgen == 1
    s.delete(ids[:2])
    s.compact()  # dead rows: copied out into the next generation
    assert s._vgen == 2
    s.close()
    again = ExactStore(path=tmp_path / "s")
    assert again.ids() == ids[2:]
    for r, d in zip(again.get(ids[2:]), docs[2:], strict=True):
        np.testing.assert_array_equal(r.vectors, d)
    again.close()


# -- a folder is the exact store's only if it holds its store.sqlite (or is empty) --
def _listing(folder):
    """Every path below ``folder`` with its size and mtime (what a refused open must leave as it was)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.parametrize("files", [
    {".tmp-download.part": b"half of a user's download"},       # a user's file named like our temp files
    {"ops/notes.txt": b"not an operation"},                      # an unrelated ops/ folder
    {"ops/": None},                                              # an empty, unrelated ops/ folder
    {"store.lock": b"someone else's lock"},                      # not the empty file our lock is
])
def test_a_folder_without_a_store_but_with_files_is_refused_untouched(tmp_path, files):
    folder = tmp_path / "downloads"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            (folder / name).mkdir(exist_ok=True)
        else:
            (folder / name).write_bytes(data)
    before = _listing(folder)
    with pytest.raises(CollectionMismatch, match=str(folder)):
        ExactStore(path=folder)
    assert _listing(folder) == before
    for name, data in files.items():
        if data is not None:
            assert (folder / name).read_bytes() == data


def test_a_conversion_deletes_only_the_old_formats_files(tmp_path):
    path = tmp_path / "s"
    docs = _docs(6, seed=2)
    write_exact_store_04(path, ["a", "b", "c", "d", "e", "f"], docs, [{} for _ in docs])
    user = path / ".tmp-download.part"
    user.write_bytes(b"a user's file")
    (path / "ops" / ".tmp-download.part").write_bytes(b"another")
    ours = [path / ".tmp-uibk-123-456-snapshot-000000000009.npz",   # what 0.4 wrote
            path / "ops" / ".tmp-123-456-000000000002.npz",          # what 0.3.x wrote
            path / ".tmp-99-7-store.json"]
    for p in ours:
        p.write_bytes(b"torn")
    with ExactStore(path=path) as again:
        assert again.ids() == ["b", "c", "d", "e", "f"]
    assert user.read_bytes() == b"a user's file"
    assert sorted(p.name for p in (path / "ops").iterdir()) == [".tmp-download.part"]
    assert not any(p.exists() for p in ours)


def test_a_store_killed_while_being_created_opens(tmp_path):
    """What a process killed before its first transaction leaves: the (empty) lock and an empty
    database file; the folder is still ours."""
    path = tmp_path / "s"
    path.mkdir()
    (path / "store.lock").touch()
    (path / "store.sqlite").touch()
    with ExactStore(path=path) as s:
        s.upsert(["a"], _docs(1))
    assert ExactStore(path=path).ids() == ["a"]


def test_a_text_query_says_to_encode_it_first() -> None:
    """``store.search("a string")`` names the fix, not numpy's dtype (``<U9``)."""
    from uibk_embedding.adapters.exact import ExactStore

    store = ExactStore()
    with pytest.raises(TypeError, match=r"got a string \('some text'\).*encode it first"):
        store.search("some text")


@pytest.mark.parametrize("where", ["memory", "float32", "float16"])
def test_explain_decomposes_from_the_scored_rows_without_a_second_read(tmp_path, where):
    """``search(explain=True)`` takes each hit's decomposition from the rows it scored: ``_get``
    is never called, and every decomposition equals the one of the stored vectors (read with
    ``get`` afterwards), also with a filter and after a delete."""
    from uibk_embedding.tagged import decompose

    path = None if where == "memory" else tmp_path / "s"
    s = ExactStore(path=path, vector_dtype=None if where == "memory" else where)
    docs = _docs(30, seed=5)
    s.upsert([f"d{i}" for i in range(30)], docs, [{"n": i % 3} for i in range(30)])
    s.delete(["d0", "d1"])
    q = make_list(FMT, np.random.default_rng(9), 6)
    reads = []
    real_get = s._get
    s._get = lambda ids: reads.append(ids) or real_get(ids)
    for flt in (None, {"n": 1}):
        hits = s.search(q, k=5, filter=flt, explain=True)
        assert not reads, f"search(explain=True) read the hits again through _get: {reads}"
        plain = s.search(q, k=5, filter=flt)
        assert [(h.id, h.score, h.metadata) for h in hits] == [(h.id, h.score, h.metadata) for h in plain]
        assert len(hits) == 5 and all(h.decomposition is not None for h in hits)
        del s._get
        stored = {r.id: r.vectors for r in s.get([h.id for h in hits])}
        assert [h.decomposition for h in hits] == [decompose(q, stored[h.id], FMT) for h in hits]
        s._get = lambda ids: reads.append(ids) or real_get(ids)
    s.close()


def test_stats_say_the_exact_store_builds_no_index():
    """Past ``min_index_vectors`` (1,000,000 by default; lowered here) ``stats()`` said the index
    "is built at the next flush or search" and counted every document pending: the exact store
    builds none."""
    from uibk_embedding.testing import make_list

    s = ExactStore()
    s.min_index_vectors = 8
    rng = np.random.default_rng(0)
    s.upsert(["a", "b", "c"], [make_list(s.format, rng, 5) for _ in range(3)])
    s.flush()
    st = s.stats()
    assert st["vectors"] > s.min_index_vectors and not st["has_index"] and st["search"] == "exact"
    assert "builds no index" in st["reason"] and st["pending"] == s.n_pending == 0
    s.min_index_vectors = 10**6  # below it too: "no index is built" read as if one would be above
    assert "builds no index" in s.stats()["reason"]
    s.close()


def test_in_memory_and_persisted_stores_scan_the_same_way(tmp_path, monkeypatch):
    # issue 59: the two exact stores are one scan: every search hands the kernel a contiguous
    # float32 view of the rows as stored (the in-memory array, the file's memory map), never a
    # copy, and both give the same hits and scores, with an overwritten document's dead rows
    # between the live ones
    import uibk_embedding.adapters.indexed as indexed

    seen: list[np.ndarray] = []
    scan = indexed.maxsim_scores

    def spy(queries, doc_matrix, doc_offsets, **kw):
        seen.append(doc_matrix)
        return scan(queries, doc_matrix, doc_offsets, **kw)

    monkeypatch.setattr(indexed, "maxsim_scores", spy)
    docs, ids = _docs(40, seed=3), [f"d{i}" for i in range(40)]
    stores = {"memory": ExactStore(), "persisted": ExactStore(path=tmp_path / "s")}
    q = make_list(FMT, np.random.default_rng(4), 6, dense_weight=4.0)
    hits = {}
    for name, s in stores.items():
        s.upsert(ids, docs)
        s.upsert(["d7"], _docs(1, seed=5))  # d7's first rows are dead now
        seen.clear()
        hits[name] = [(h.id, h.score) for h in s.search(q, k=10)]
        (mat,) = seen
        rows = s._vf._mapped()
        assert mat.dtype == np.float32 and mat.flags.c_contiguous, name
        assert np.shares_memory(mat, rows), f"the {name} store scanned a copy of its rows"
        s.close()
    assert hits["memory"] == hits["persisted"] and len(hits["memory"]) == 10
