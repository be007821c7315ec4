"""A store object opened before ``os.fork()`` and used in the forked child (a prefork server:
gunicorn ``--preload``, ``multiprocessing``'s fork start method), issue 62.

The rule (docs/sharing.md, "Forked workers"): a SQLite connection is never used across a fork.
The child's first call on an inherited store object opens its own connection and reads the view
again; the parent's connection, appending vector file and engine handle are neither used nor
closed in the child; a temporary folder stays the parent's; a lock another thread of the parent
held at the fork does not hang the child. A writer beside them is seen by both.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding.adapters.indexed import ScanEngine
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

from .test_sharing import MAKERS, _make

FMT = TaggedFormat()
FORK = mp.get_context("fork")


def _docs(seed: int, n: int, rows: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(FMT, rng, rows) for _ in range(n)]


def _ids(hits) -> list[str]:
    return [h.id for h in hits]


def _in_child(work, timeout: float = 120.0) -> dict:
    """``work()`` in a forked child; its JSON answer (or the child's exception as text)."""
    parent, child = FORK.Pipe(duplex=False)

    def run() -> None:
        try:
            child.send(json.dumps({"ok": work()}))
        except BaseException as e:  # reported to the test
            child.send(json.dumps({"error": f"{type(e).__name__}: {e}"}))

    p = FORK.Process(target=run)
    p.start()
    try:
        if not parent.poll(timeout):
            raise AssertionError(f"the forked child answered nothing in {timeout} s (hung)")
        answer = json.loads(parent.recv())
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
    return answer


@pytest.mark.parametrize("backend", sorted(MAKERS))
def test_forked_child_searches_reopens_and_sees_the_writer(backend: str, tmp_path: Path) -> None:
    """The parent opens and searches (PLAID and WARP with their index loaded); the forked child
    gets the same hits from the same object, on a connection of its own, then sees what a writer
    beside it (another store object of the parent) committed after the fork, and writes itself
    (it becomes the writer): the parent sees the child's document."""
    docs = _docs(1, 40)
    store = _make(backend, tmp_path / "s")
    store.upsert([f"d{i}" for i in range(40)], docs, [{"i": i} for i in range(40)])
    store.flush()  # WARP builds its index at a flush
    if backend != "exact":
        assert store.has_index
    queries = _docs(2, 3, rows=6)
    before = [_ids(store.search(q, k=5)) for q in queries]
    parent_db = store._db
    new_doc = _docs(3, 1)[0]
    child_doc = _docs(4, 1)[0]
    writer = _make(backend, tmp_path / "s")
    gate = FORK.Event()

    def work() -> dict:
        same = [_ids(store.search(q, k=5)) for q in queries]
        own_connection = store._db is not parent_db
        gate.wait(60)  # the writer commits "w" meanwhile
        seen = _ids(store.search(new_doc, k=1))
        store.upsert(["c"], [child_doc], [{"by": "child"}])
        return {"same": same, "own": own_connection, "seen": seen, "count": store.count(),
                "meta": store.get(["w"])[0].metadata}

    parent, child = FORK.Pipe(duplex=False)

    def run() -> None:
        try:
            child.send(json.dumps({"ok": work()}))
        except BaseException as e:
            child.send(json.dumps({"error": f"{type(e).__name__}: {e}"}))

    p = FORK.Process(target=run)
    p.start()
    writer.upsert(["w"], [new_doc], [{"by": "writer"}])
    gate.set()
    assert parent.poll(180), "the forked child answered nothing (hung)"
    answer = json.loads(parent.recv())
    p.join(30)
    assert "error" not in answer, answer
    got = answer["ok"]
    assert got["same"] == before
    assert got["own"]
    assert got["seen"] == ["w"]
    assert got["meta"] == {"by": "writer"}
    assert got["count"] == 42
    # the parent's object goes on, on its own connection, and sees the child's write
    assert store._db is parent_db
    assert _ids(store.search(child_doc, k=1)) == ["c"]
    assert store.count() == 42
    assert store.get(["c"])[0].metadata == {"by": "child"}
    writer.close()
    store.close()


def test_forked_child_closing_leaves_the_parents_temporary_folder(tmp_path: Path) -> None:
    """A store without a path lives in a temporary folder its close() removes: closed in a forked
    child, it stays (the parent's), and the parent searches on (the old code removed it)."""
    store = ScanEngine(min_index_vectors=10_000)
    docs = _docs(5, 6)
    store.upsert([f"d{i}" for i in range(6)], docs)
    folder = store.path

    def work() -> list[str]:
        hits = _ids(store.search(docs[2], k=1))
        store.close()
        return hits

    answer = _in_child(work)
    assert answer == {"ok": ["d2"]}
    assert folder.is_dir()
    assert _ids(store.search(docs[4], k=1)) == ["d4"]
    store.close()
    assert not folder.exists()


def test_forked_child_does_not_hang_on_a_lock_another_thread_held(tmp_path: Path) -> None:
    """Another thread of the parent holds the store's lock (inside a search, say) when the main
    thread forks: the child's own calls get a lock of their own (the old code hung forever on
    the copy of the held lock)."""
    store = ScanEngine(tmp_path / "s", min_index_vectors=10_000)
    docs = _docs(6, 5)
    store.upsert([f"d{i}" for i in range(5)], docs)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store._lock:
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        answer = _in_child(lambda: [store.count(), _ids(store.search(docs[1], k=1))], timeout=30)
    finally:
        release.set()
        t.join()
    assert answer == {"ok": [5, ["d1"]]}
    store.close()


def test_forked_during_a_write_is_refused(tmp_path: Path) -> None:
    """A child forked while another thread of the parent was inside a write of the store (its view
    half changed) gets a clear StoreInUse on every call, never an answer from half a write."""
    store = ScanEngine(tmp_path / "s", min_index_vectors=10_000)
    store.upsert(["a"], _docs(7, 1))
    inside, release = threading.Event(), threading.Event()

    def write() -> None:
        with store._lock, store._writing():
            inside.set()
            release.wait(60)

    t = threading.Thread(target=write)
    t.start()
    try:
        assert inside.wait(10)
        answer = _in_child(store.count, timeout=30)
    finally:
        release.set()
        t.join()
    assert "error" in answer and answer["error"].startswith("StoreInUse")
    assert "os.fork()" in answer["error"]
    assert store.count() == 1  # the parent's object is untouched
    store.close()


def test_in_memory_store_goes_on_as_the_childs_copy() -> None:
    """An in-memory store (no folder) is the child's own copy after a fork: it answers the same,
    and the child's writes stay in the child."""
    from uibk_embedding.adapters.exact import ExactStore

    store = ExactStore()
    docs = _docs(8, 4)
    store.upsert(["a", "b", "c", "d"], docs)

    def work() -> list:
        store.upsert(["e"], _docs(9, 1))
        return [_ids(store.search(docs[3], k=1)), store.count()]

    assert _in_child(work) == {"ok": [["d"], 5]}
    assert store.count() == 4
    store.close()



_PREFORK_MASTER = """
import json, multiprocessing as mp, sys, warnings
from uibk_embedding.adapters.registry import import_engine, open_store
import_engine("lancedb")
loaded = sorted(m for m in ("lancedb", "pyarrow") if m in sys.modules)
path, queries = sys.argv[1], json.loads(sys.argv[2])

def worker(out):
    warnings.simplefilter("ignore")  # LanceDB's own note that its fork support is new
    import numpy as np
    store = open_store("lancedb", path=path, table="docs", read_only=True, create=False)
    out.put([[h.id for h in store.search(np.asarray(q, dtype=np.float32), k=3)] for q in queries])
    store.close()

ctx = mp.get_context("fork")
out = ctx.Queue()
workers = [ctx.Process(target=worker, args=(out,)) for _ in range(2)]
for w in workers:
    w.start()
print(json.dumps({"loaded": loaded, "answers": [out.get(timeout=120) for _ in workers]}))
for w in workers:
    w.join(30)
"""


def test_a_prefork_master_imports_lancedb_and_its_workers_search(tmp_path: Path) -> None:
    """``import_engine("lancedb")`` in a master that opens nothing (gunicorn ``--preload`` in
    examples/serve_store.py) imports LanceDB and pyarrow, so the forked workers share their
    pages; each worker then opens the table itself and answers as a store opened in one process."""
    import subprocess
    import sys

    pytest.importorskip("lancedb")
    from uibk_embedding.adapters.lancedb import LanceDBStore

    docs = _docs(11, 30)
    with LanceDBStore(tmp_path, table="docs") as store:
        store.upsert([f"d{i}" for i in range(30)], docs)
        queries = _docs(12, 2, rows=5)
        want = [_ids(store.search(q, k=3)) for q in queries]
    done = subprocess.run([sys.executable, "-c", _PREFORK_MASTER, str(tmp_path),
                           json.dumps([q.tolist() for q in queries])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"loaded": ["lancedb", "pyarrow"], "answers": [want, want]}
