"""Durability at the edges of every persistence path: compaction, redo log, PLAID rebuild.

Deterministic (no kill timing): each test drives a store to a boundary where a write and a
cleanup meet, then reopens it the way a crash leaves it (no ``close()``) and compares the
contents with a plain dict model of what was acknowledged. The random-kill test is
``tests/reliability/test_crash.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

FMT = TaggedFormat()
REMOTE = ("server", "standalone", "live")


def _doc(seed: int, n: int = 6) -> np.ndarray:
    return make_list(FMT, np.random.default_rng(seed), n)


def _script(n_ops: int) -> list[tuple[str, str, int]]:
    """A fixed mix of single-document upserts, overwrites and deletes (op, id, vector seed)."""
    ops: list[tuple[str, str, int]] = []
    for i in range(n_ops):
        if i % 5 == 4:
            ops.append(("delete", f"d{i - 3}", 0))        # delete an earlier document
        elif i % 7 == 6:
            ops.append(("upsert", f"d{i - 5}", 1000 + i))  # overwrite an earlier document
        else:
            ops.append(("upsert", f"d{i}", i))
    return ops


def _apply(model: dict[str, int], op: tuple[str, str, int]) -> None:
    kind, doc_id, seed = op
    if kind == "delete":
        model.pop(doc_id, None)
    else:
        model[doc_id] = seed


def _as_a_crash_leaves(path: Path, dest: Path) -> Path:
    """The files of an open store, copied as they are (what a killed process leaves: the page
    cache keeps every write), to be opened while the original still holds its folder lock."""
    import shutil

    shutil.copytree(path, dest, ignore=shutil.ignore_patterns("store.lock"))
    return dest


def _assert_holds(store, model: dict[str, int], atol: float = 1e-3) -> None:
    """``atol``: how close ``get`` returns stored vectors (the spec's ``get_atol`` where one is at
    hand: int8 rows are within 4e-3, float16 within 1e-3)."""
    every = sorted({op[1] for op in _script(40)} | set(model))
    got = {r.id: r for r in store.get(every)}
    assert sorted(got) == sorted(model), f"ids {sorted(got)} != acknowledged {sorted(model)}"
    for doc_id, seed in model.items():
        np.testing.assert_allclose(got[doc_id].vectors, _doc(seed), atol=max(atol, 1e-3))
        assert got[doc_id].metadata == {"seed": seed}
    assert store.count() == len(model)


# -- the exact store: every step ------------------------------------------------------------------

@pytest.mark.parametrize("spec_name", ["exact-disk", "exact-compact", "exact-rerank"])
def test_exact_store_reopened_without_close_at_every_step(tmp_path, spec_name):
    """Reopen after every single operation, without close() (a copy of the folder as a killed
    process leaves it): every acknowledged upsert, overwrite and delete is there, also across
    the vector file's compactions (many overwrites and deletes of few documents); for the coded
    profiles both files of a generation (the codes, the float16 originals) at every step."""
    from uibk_embedding.testing import load_backend_specs

    spec = next(s for s in load_backend_specs(Path(__file__).resolve().parent / "backends")
                if s.name == spec_name)
    path = tmp_path / "exact"
    store = spec.make(tmp_path)
    store.vector_compact_min_rows, store.vector_compact_fraction = 1, 0.1  # compact at 10 % dead rows
    model: dict[str, int] = {}
    for step, op in enumerate(_script(23)):
        kind, doc_id, seed = op
        if kind == "delete":
            store.delete([doc_id])
        else:
            store.upsert([doc_id], [_doc(seed)], [{"seed": seed}])
        _apply(model, op)
        reopened = ExactStore(path=_as_a_crash_leaves(path, tmp_path / f"crash-{step}"))
        try:
            assert reopened.profile == store.profile
            _assert_holds(reopened, model, spec.get_atol)
        except AssertionError as e:
            raise AssertionError(f"after step {step} ({op}): {e}") from e
        reopened.close()
    assert store._vgen > 1  # the vector file was compacted along the way


# -- every local persistent backend: a child process that never closes -----------------------

CHILD = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_durability import _doc, _script
    from uibk_embedding.testing import load_backend_specs
    name, folder, n_ops = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    spec = next(s for s in load_backend_specs({backends!r}) if s.name == name)
    store = spec.reopen(folder)
    for kind, doc_id, seed in _script(n_ops):
        if kind == "delete":
            store.delete([doc_id])
        else:
            store.upsert([doc_id], [_doc(seed)], [{{"seed": seed}}])
    sys.stdout.flush()
    os._exit(0)  # no close(), no atexit, no flush of anything the store buffered
""")


def test_reopen_without_close(spec, tmp_path):
    """Single-document writes across index creation, updates, overwrites and deletes, by a
    process that exits without close(); the reopened store holds exactly what was written."""
    if spec.reopen is None or any(r in spec.name for r in REMOTE):
        pytest.skip(f"{spec.name} does not persist to local files")
    here = Path(__file__).resolve().parent
    child = tmp_path / "child.py"
    child.write_text(CHILD.format(tests=str(here), backends=str(here / "backends")))
    folder = tmp_path / "store"
    folder.mkdir()
    n_ops = 17  # PLAID: crosses min_index_vectors (64 rows), then updates and deletes
    proc = subprocess.run([sys.executable, str(child), spec.name, str(folder), str(n_ops)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    model: dict[str, int] = {}
    for op in _script(n_ops):
        _apply(model, op)
    store = spec.reopen(folder)
    try:
        _assert_holds(store, model, spec.get_atol)
        for doc_id, seed in model.items():  # and search finds each document by its own vectors
            hits = store.search(_doc(seed), k=1)
            assert hits and hits[0].id == doc_id, (doc_id, hits)
    finally:
        store.close()


# -- the Qdrant redo log: a failed engine call is finished before the next write ---------------

def _qdrant_with_a_failed_upsert(path: Path, monkeypatch):
    """A local-files Qdrant store whose upsert of a (seed 1) and b (seed 2) failed half-way: the
    real engine wrote the first point, then the call raised."""
    pytest.importorskip("qdrant_client")
    from uibk_embedding.adapters.qdrant import QdrantStore

    store = QdrantStore(path=path)
    real = store._write_points

    def half_then_fail(ids, vectors, metadata):
        real(ids[:1], vectors[:1], metadata[:1])
        raise ConnectionError("engine went away half-way")

    monkeypatch.setattr(store, "_write_points", half_then_fail)
    with pytest.raises(ConnectionError):
        store.upsert(["a", "b"], [_doc(1), _doc(2)], [{"seed": 1}, {"seed": 2}])
    monkeypatch.setattr(store, "_write_points", real)
    return store, QdrantStore


def test_qdrant_failed_write_is_not_replayed_over_a_later_one(tmp_path, monkeypatch):
    """The failed upsert leaves a redo entry. A later successful upsert of the same id must win:
    before the fix, the stale entry was replayed over it on reopen."""
    store, cls = _qdrant_with_a_failed_upsert(tmp_path / "q", monkeypatch)
    store.upsert(["a"], [_doc(3)], [{"seed": 3}])  # acknowledged: a is now seed 3
    _assert_holds(store, {"a": 3, "b": 2})  # the failed call was finished first, in order
    store.close()
    again = cls(path=tmp_path / "q")
    try:
        _assert_holds(again, {"a": 3, "b": 2})
    finally:
        again.close()


def test_qdrant_failed_write_is_whole_after_reopen(tmp_path, monkeypatch):
    store, cls = _qdrant_with_a_failed_upsert(tmp_path / "q", monkeypatch)
    store.close()
    again = cls(path=tmp_path / "q")
    try:
        _assert_holds(again, {"a": 1, "b": 2})
    finally:
        again.close()


# -- PLAID: a failed engine update and a failed rebuild ----------------------------------------

def _plaid_store(path: Path, **kw):
    pytest.importorskip("fast_plaid")
    from uibk_embedding.plaid_backend.store import PlaidStore

    return PlaidStore(path, num_threads=1, rerank=False, nbits=2, **{"min_index_vectors": 64, **kw})


def test_plaid_search_never_reads_an_index_that_lost_sync(tmp_path, monkeypatch):
    """The engine's delete fails and so does the rebuild that should repair it: the delete is
    committed (acknowledged), the stale index must not be searched (positions would map to the
    wrong ids), and the next open rebuilds it."""
    import uibk_embedding.plaid_backend.store as mod

    store = _plaid_store(tmp_path / "p")
    docs = {f"d{i}": i for i in range(30)}
    store.upsert(list(docs), [_doc(s) for s in docs.values()], [{"seed": s} for s in docs.values()])
    assert store.has_index
    real = mod.engine_call

    def failing(what, fn, *a, **kw):
        if what in ("delete", "create"):
            raise mod.PlaidEngineError(f"injected failure during {what}")
        return real(what, fn, *a, **kw)

    monkeypatch.setattr(mod, "engine_call", failing)
    with pytest.warns(RuntimeWarning, match="rebuilding"), pytest.raises(mod.PlaidEngineError):
        store.delete(["d0"])
    monkeypatch.setattr(mod, "engine_call", real)
    del docs["d0"]
    _assert_holds(store, docs)
    for doc_id, seed in docs.items():  # every later position moved down by one
        assert store.search(_doc(seed), k=1)[0].id == doc_id
    store.upsert(["new"], [_doc(99)], [{"seed": 99}])  # the next write rebuilds the index
    docs["new"] = 99
    assert store.has_index
    assert store.search(_doc(99), k=1)[0].id == "new"
    store.close()
    again = _plaid_store(tmp_path / "p")
    try:
        _assert_holds(again, docs)
    finally:
        again.close()


def test_fsync_tree_skips_what_the_engine_renames_while_it_walks(tmp_path, monkeypatch):
    """CI saw Qdrant Edge's WAL rename ``wal/tmp-open-2`` between ``os.walk`` listing it and
    ``fsync_tree`` opening it (FileNotFoundError on opening the store). A file or folder gone by
    then is skipped; every other file and folder is still flushed."""
    from uibk_embedding import _durable

    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / "open-1").write_bytes(b"x")
    real_walk, opened = os.walk, []

    def walk_with_ghosts(path):
        for root, dirs, files in real_walk(path):
            yield root, dirs, [*files, "tmp-open-2"]  # listed, then renamed by the engine
        yield str(tmp_path / "gone"), [], ["f"]  # a folder removed after it was listed

    real_open = os.open

    def tracking_open(p, *a, **kw):
        opened.append(os.path.basename(p))
        return real_open(p, *a, **kw)

    monkeypatch.setattr(_durable.os, "walk", walk_with_ghosts)
    monkeypatch.setattr(_durable.os, "open", tracking_open)
    _durable.fsync_tree(tmp_path)
    assert "open-1" in opened and "wal" in opened and "tmp-open-2" in opened
