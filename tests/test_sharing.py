"""Many readers, one writer (issue 62): the rules of a shared store folder, on exact, PLAID and WARP.

* Opening never takes the folder: any number of store objects and processes open one folder and
  search it. Each write takes the folder's write lock for its duration; a second writer waits up
  to ``write_timeout`` and then gets StoreInUse.
* A reader answers from one snapshot (a SQLite read transaction, the vector-file generation and
  index folder it names), never half a write, also when the writer is killed mid-write; it moves
  on to newer writes on ``refresh()`` and before every search (``PRAGMA data_version``).
* A reader repairs nothing; the next writer does.
* ``read_only=True`` refuses writes; a folder this process cannot write is searched read-only.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding._sqlite_state import acquire_write_lock, stored_state
from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.registry import open_store
from uibk_embedding.errors import ReadOnlyStore, StoreInUse, StoreNotFound
from uibk_embedding.maxsim import maxsim
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

FMT = TaggedFormat()

# the three folder stores, small enough that PLAID and WARP build an index (64 vectors)
MAKERS = {
    "exact": ("uibk_embedding.adapters.exact", "ExactStore", {}),
    "plaid": ("uibk_embedding.plaid_backend.store", "PlaidStore",
              {"nbits": 2, "kmeans_niters": 1, "num_threads": 1, "min_index_vectors": 64}),
    "warp": ("uibk_embedding.adapters.warp", "WarpStore",
             {"nbits": 2, "kmeans_niters": 1, "min_index_vectors": 64, "buffer_size": 0}),
}
ENGINES = {"plaid": "fast_plaid", "warp": "xtr_warp"}


def _make(backend: str, path: Path, **kw):
    import importlib

    if backend in ENGINES:
        pytest.importorskip(ENGINES[backend])
    module, name, opts = MAKERS[backend]
    return getattr(importlib.import_module(module), name)(path, **{**opts, **kw})


def _docs(seed: int, n: int, rows: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(FMT, rng, rows) for _ in range(n)]


@pytest.fixture(params=["exact", "plaid", "warp"])
def backend(request):
    return request.param


def test_two_store_objects_open_one_folder_and_both_search(backend, tmp_path):
    docs = _docs(1, 40)
    ids = [f"d{i}" for i in range(40)]
    with _make(backend, tmp_path / "s") as writer:
        writer.upsert(ids, docs, [{"i": i} for i in range(40)])
        writer.flush()
        with _make(backend, tmp_path / "s") as reader, _make(backend, tmp_path / "s", read_only=True) as ro:
            assert reader.count() == ro.count() == 40
            assert reader.has_index == writer.has_index == (backend != "exact")
            for i in (0, 17, 39):
                assert [h.id for h in reader.search(docs[i], k=1)] == [f"d{i}"]
                assert [h.id for h in ro.search(docs[i], k=3)] == [h.id for h in writer.search(docs[i], k=3)]
            writer.upsert(["new"], _docs(2, 1))  # the writer goes on while both readers are open
            assert reader.search(_docs(2, 1)[0], k=1)[0].id == "new"  # seen before the search
            assert ro.count() == 41


def test_a_second_process_opens_the_folder_and_searches(backend, tmp_path):
    docs = _docs(3, 30)
    with _make(backend, tmp_path / "s") as writer:
        writer.upsert([f"d{i}" for i in range(30)], docs)
        child = textwrap.dedent(f"""
            import importlib, sys, numpy as np
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_sharing import MAKERS, _docs
            module, name, opts = MAKERS[{backend!r}]
            s = getattr(importlib.import_module(module), name)({str(tmp_path / "s")!r}, **opts)
            print(s.count(), s.search(_docs(3, 30)[7], k=1)[0].id)
            s.upsert(["from-the-child"], _docs(4, 1))
            s.close()
        """)
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["30", "d7"]
        assert writer.count() == 31 and writer.get(["from-the-child"])[0].id == "from-the-child"


def test_a_second_writer_waits_for_the_lock_then_gets_store_in_use(backend, tmp_path):
    with _make(backend, tmp_path / "s") as first:
        first.upsert(["a"], _docs(5, 1))
        second = _make(backend, tmp_path / "s", write_timeout=0.2)
        try:
            # another writer holds the lock (what a write in flight in another process holds)
            with acquire_write_lock(tmp_path / "s" / "store.lock", "another writer"):
                with pytest.raises(StoreInUse, match="is being written by another store object"):
                    second.upsert(["b"], _docs(6, 1))
                assert second.count() == 1 and second.search(_docs(5, 1)[0], k=1)[0].id == "a"  # reads go on
            second.upsert(["b"], _docs(6, 1))  # the lock is free again
            assert first.count() == 2
            # a writer waits: the lock is let go while it waits
            held = acquire_write_lock(tmp_path / "s" / "store.lock", "another writer")
            releaser = threading.Timer(0.1, held.close)
            releaser.start()
            first.write_timeout = 30.0
            first.upsert(["c"], _docs(7, 1))
            releaser.join()
            assert second.count() == 3
        finally:
            second.close()


def test_read_only_refuses_writes_and_creates_nothing(backend, tmp_path):
    with pytest.raises(StoreNotFound, match="nothing was created"):
        _make(backend, tmp_path / "none", read_only=True)
    assert not (tmp_path / "none").exists()
    _make(backend, tmp_path / "s").close()

    def listing() -> list[str]:
        return sorted(p.name for p in (tmp_path / "s").iterdir())

    before = listing()
    with _make(backend, tmp_path / "s", read_only=True) as ro:
        for write in (lambda: ro.upsert(["x"], _docs(8, 1)), lambda: ro.delete(["x"])):
            with pytest.raises(ReadOnlyStore, match="read_only=True"):
                write()
        assert ro.count() == 0 and ro.search(_docs(8, 1)[0], k=3) == []
    assert listing() == before


def test_refresh_sees_new_writes(backend, tmp_path):
    with _make(backend, tmp_path / "s") as writer, _make(backend, tmp_path / "s", read_only=True) as reader:
        assert reader.refresh() is False
        writer.upsert([f"d{i}" for i in range(20)], _docs(9, 20))
        assert reader.refresh() is True and reader.refresh() is False
        assert sorted(r.id for r in reader.get(["d0", "d19"])) == ["d0", "d19"]
        writer.delete(["d0"])
        assert reader.get(["d0"]) == [] and reader.count() == 19  # checked before every read


def test_a_reader_keeps_its_index_while_the_writer_updates_a_copy(tmp_path):
    """PLAID updates its index on every write: with a reader on the folder the update goes to a
    copy in the next generation (the reader's folder is left as it is), and the old folder goes
    once no reader shares it."""
    docs = _docs(10, 40)
    with _make("plaid", tmp_path / "p") as w:
        w.upsert([f"d{i}" for i in range(30)], docs[:30])
        first = stored_state(tmp_path / "p", "index_dir")
        r = _make("plaid", tmp_path / "p", rerank=False)
        assert r.has_index and r._index_dir == first
        w.upsert([f"d{i}" for i in range(30, 40)], docs[30:])  # the reader shares `first`: a copy
        second = stored_state(tmp_path / "p", "index_dir")
        assert second != first and (tmp_path / "p" / first).is_dir()
        assert [h.id for h in r.search(docs[35], k=1)] == ["d35"]  # moved on before the search
        assert r._index_dir == second
        w.delete(["d1"])  # nobody shares `first` now: the writer removes it
        assert not (tmp_path / "p" / first).exists()
        r.close()
        w.delete(["d2"])  # no reader: in place
        assert stored_state(tmp_path / "p", "index_dir") == w._index_dir
        assert [h.id for h in w.search(docs[3], k=1)] == ["d3"]


def test_a_reader_maps_a_vector_file_the_writer_replaced(tmp_path):
    """A compaction writes the next generation and removes the old file; a reader that mapped it
    still reads its rows (an unlinked file lives while mapped) until it moves on."""
    docs = _docs(11, 10, rows=300)
    with ExactStore(tmp_path / "e") as w:
        w.upsert([f"d{i}" for i in range(10)], docs)
        r = ExactStore(tmp_path / "e", read_only=True)
        old = r._vf
        mapped = old.read(r._start[r._seq_of["d3"]], 303)
        w.delete([f"d{i}" for i in range(6)])  # 60% dead: compacted into generation 2
        assert not old.path.exists() and stored_state(tmp_path / "e", "vector_gen") == "2"
        np.testing.assert_array_equal(old.read(r._start[r._seq_of["d3"]], 303), mapped)  # still readable
        assert r.count() == 4 and r._vgen == 2  # and it moves on
        np.testing.assert_array_equal(r.get(["d7"])[0].vectors, docs[7])
        r.close()


# -- a writer killed mid-write: readers never see half of it -------------------------------------

_WRITER = textwrap.dedent("""
    import importlib, sys, numpy as np
    sys.path.insert(0, {here!r})
    from test_sharing import MAKERS, _docs
    module, name, opts = MAKERS[sys.argv[1]]
    s = getattr(importlib.import_module(module), name)(sys.argv[2], **opts)
    b = 0
    while True:  # batches of 5 documents, each an overwrite of the previous batch of that slot
        s.upsert([f"slot{{b % 7}}-{{j}}" for j in range(5)], _docs(1000 + b, 5),
                 [{{"batch": b}}] * 5)
        if b % 3 == 2:
            s.delete([f"slot{{(b + 3) % 7}}-{{j}}" for j in range(5)])
        print(b, flush=True)
        b += 1
""")


@pytest.mark.filterwarnings("ignore:rebuilding:RuntimeWarning")  # the new writer repairs PLAID
def test_a_reader_never_sees_half_a_write_and_outlives_a_killed_writer(backend, tmp_path):
    path = tmp_path / "s"
    _make(backend, path).close()
    proc = subprocess.Popen([sys.executable, "-c", _WRITER.format(here=str(Path(__file__).parent)),
                             backend, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader = _make(backend, path, read_only=True)
    try:
        assert proc.stdout is not None
        q = _docs(77, 1)[0]
        for n_read in range(40):
            line = proc.stdout.readline()  # one more write committed (or the writer died)
            assert line, proc.stderr.read()[-2000:] if proc.stderr else "the writer died"
            listed = [x for x, _ in reader.scan()]
            by_batch: dict[int, list[str]] = {}
            for rec in reader.get(listed):
                by_batch.setdefault(rec.metadata["batch"], []).append(rec.id)
            assert all(len(v) == 5 for v in by_batch.values()), by_batch  # whole batches only
            hits = [h.id for h in reader.search(q, k=3)]
            snapshot = reader._data_version  # the snapshot the search answered from
            want = _exact_scores(reader, q, 3)  # its reads move on to a newer snapshot, if any
            if reader._data_version == snapshot:  # nothing committed in between: one snapshot
                assert hits == want, (n_read, hits, want)
            if int(line) >= 12:
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        reader.refresh()
        assert reader.count() % 5 == 0
        again = _make(backend, path)  # a writer killed at any point: a new writer recovers its files
        try:
            n = reader.count()
            again.upsert(["after"], _docs(5, 1))
            assert again.count() == n + 1 and reader.refresh() and reader.count() == n + 1
            assert reader.search(_docs(5, 1)[0], k=1)[0].id == "after"
        finally:
            again.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        reader.close()


def _exact_scores(store, q: np.ndarray, k: int) -> list[str]:
    listed = [x for x, _ in store.scan()]
    scored = sorted((-maxsim(q, r.vectors), r.id) for r in store.get(listed))
    return [x for _, x in scored[:k]]


# -- issue 61: a half-made store and create=False ----------------------------------------------

def test_create_false_on_a_half_made_store_creates_nothing(tmp_path):
    """What a creation killed before its first commit leaves: ``store.sqlite`` holding only the
    empty ``state`` table. ``create=False`` must not finish the store (one run did) nor raise a
    raw sqlite3 error leaving ``store.lock`` behind (another did): StoreNotFound, no file added."""
    d = tmp_path / "half"
    d.mkdir()
    db = sqlite3.connect(d / "store.sqlite")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.close()
    before = {p.name: p.stat().st_size for p in d.iterdir()}
    for opener in (lambda: open_store("exact", path=d, create=False), lambda: ExactStore(d, create=False),
                   lambda: ExactStore(d, read_only=True)):
        with pytest.raises(StoreNotFound, match="create=True"):
            opener()
        assert {p.name: p.stat().st_size for p in d.iterdir()} == before
    with open_store("exact", path=d) as s:  # create=True finishes it
        assert s.count() == 0


# -- a folder this process cannot write ----------------------------------------------------------

_READ_ONLY_CHILD = textwrap.dedent("""
    import importlib, sys, numpy as np
    sys.path.insert(0, {here!r})
    from test_sharing import MAKERS, _docs
    backend, path = sys.argv[1], sys.argv[2]
    if backend == "lancedb":
        from uibk_embedding.adapters.lancedb import LanceDBStore
        s = LanceDBStore(path)
    else:
        module, name, opts = MAKERS[backend]
        s = getattr(importlib.import_module(module), name)(path, **opts)
    print(s.count(), s.search(_docs(12, 30)[4], k=1)[0].id)
    try:
        s.upsert(["x"], _docs(1, 1))
    except (PermissionError, OSError, Exception) as e:
        print("refused", type(e).__name__)
    s.close()
""")


def _read_only_mount(path: Path) -> list[str] | None:
    """As root, permission bits stop no write: the child then runs in a mount namespace of its own
    where ``path`` is bound read-only (writes fail with EROFS, for root too; the mount goes with
    the child). The command prefix, or None where that cannot be made here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    prefix = [unshare, "-m", "--propagation", "private", "sh", "-c",
              'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && shift 0 && exec "$@"', str(path)]
    probe = subprocess.run([*prefix, "sh", "-c", f'touch "{path}/probe" 2>/dev/null && exit 3 || exit 0'],
                           capture_output=True, timeout=60)
    return prefix if probe.returncode == 0 else None


@pytest.mark.parametrize("kind", ["exact", "plaid", "warp", "lancedb"])
def test_a_folder_made_read_only_answers_searches(kind, tmp_path):
    """``chmod -R a-w`` on a closed store: a process that cannot write there opens it and
    searches (SQLite read ``immutable``, nothing created), and a write is refused. As root,
    permission bits stop nothing: the folder is then also mounted read-only for the child."""
    if kind == "lancedb":
        pytest.importorskip("lancedb")
    elif kind in ENGINES:
        pytest.importorskip(ENGINES[kind])
    path = tmp_path / "s"
    docs = _docs(12, 30)
    if kind == "lancedb":
        from uibk_embedding.adapters.lancedb import LanceDBStore

        store = LanceDBStore(path)
    else:
        store = _make(kind, path)
    with store:
        store.upsert([f"d{i}" for i in range(30)], docs)
    prefix: list[str] = []
    if os.geteuid() == 0:
        prefix = _read_only_mount(path) or []
        if not prefix:
            pytest.skip("running as root, where chmod stops no write, and no read-only mount can be made")
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        before = sorted(str(p.relative_to(path)) for p in path.rglob("*"))
        child = _READ_ONLY_CHILD.format(here=str(Path(__file__).parent))
        out = subprocess.run([*prefix, sys.executable, "-c", child, kind, str(path)], capture_output=True,
                             text=True, timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        lines = out.stdout.split("\n")
        assert lines[0].split() == ["30", "d4"], out.stdout
        assert lines[1].startswith("refused"), out.stdout
        assert sorted(str(p.relative_to(path)) for p in path.rglob("*")) == before
    finally:
        for p in [path, *path.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def test_a_scan_answers_while_a_writer_removes_documents_faster_than_the_reader_reloads(backend, tmp_path):
    """Every reload of the reader's view is followed at once by a writer's delete (the interleaving
    shared_readers.py met at 650 commits/s on WARP): a view's own metadata are always gone by the
    time they would be read. The scan still answers, from one committed state (it failed with
    StoreInUse after 100 snapshots when it read the view's documents' metadata)."""
    ids = [f"d{i}" for i in range(150)]
    with _make(backend, tmp_path / "s") as writer, _make(backend, tmp_path / "s", read_only=True) as reader:
        writer.upsert(ids, _docs(21, 150, rows=4), [{"i": i} for i in range(150)])
        assert reader.count() == 150
        reload = reader._reload
        gone: list[str] = []

        def reload_then_a_writer_commits() -> None:
            reload()
            if len(gone) < 120:
                gone.append(ids[len(gone)])
                writer.delete([gone[-1]])

        reader._reload = reload_then_a_writer_commits
        writer.delete(["d149"])  # the reader's next read reloads
        found = [(doc_id, md["i"]) for doc_id, md in reader.scan(batch_size=50)]
        assert found == [(f"d{i}", i) for i in range(150) if f"d{i}" not in {*gone, "d149"}]
        assert 1 <= len(gone) < 120
