"""The redo log: an operation whose engine call did not finish is replayed whole on open."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.adapters.redo import RedoLog


def test_interrupted_operation_is_replayed_and_blocks_later_writes(tmp_path):
    log = RedoLog(tmp_path)
    v = [np.full((4, 128), 0.5, np.float32), np.ones((5, 128), np.float32)]
    with pytest.raises(OSError, match="half-way"), log.pending("upsert", ["a", "b"], v, [{"x": 1}, {}]):
        raise OSError("I/O error half-way")  # the engine applied part of it, or nothing
    assert log.dirty
    # a later write must not go first: its entry would be older than the replay of this one
    with pytest.raises(RuntimeError, match="replay"), log.pending("delete", ["a"]):
        pass
    assert RedoLog(tmp_path).dirty  # what the next open sees
    (tmp_path / ".tmp-half-written.npz").write_bytes(b"torn")  # never renamed: never logged
    calls = []
    n = log.replay(lambda ids, vecs, md: calls.append(("upsert", ids, [x.shape for x in vecs], md)),
                   lambda ids: calls.append(("delete", ids)))
    assert n == 1 and not log.dirty
    assert calls == [("upsert", ["a", "b"], [(4, 128), (5, 128)], [{"x": 1}, {}])]
    assert list(tmp_path.iterdir()) == []
    assert log.replay(lambda *a: None, lambda *a: None) == 0


def test_completed_operations_leave_nothing(tmp_path):
    log = RedoLog(tmp_path)
    with log.pending("delete", ["x"]):
        pass
    assert list(tmp_path.iterdir()) == []


def _entry(log, op="upsert", ids=("a",)):
    """Leave one logged entry behind, as an engine call that failed transiently does."""
    exc = OSError("disk gone")
    v = [np.full((4, 128), 0.5, np.float32) for _ in ids] if op == "upsert" else None
    with pytest.raises(type(exc)), log.pending(op, list(ids), v, [{} for _ in ids] if v else None):
        raise exc


def test_a_deterministic_failure_on_replay_is_quarantined_and_the_rest_goes_on(tmp_path):
    """One entry the engine always refuses must not block the log (it would fail before every
    later write and on every open): it moves to failed/ with a warning; the entries around it
    are applied in order, and later writes are accepted."""
    from uibk_embedding.adapters.redo import ReplayFailed

    log = RedoLog(tmp_path)
    _entry(log, ids=["good-1"])
    log.dirty = False  # as a new process sees it after the crash: entries pile up in order
    _entry(log, ids=["bad"])
    log.dirty = False
    _entry(log, "delete", ids=["good-1"])
    applied = []

    def upsert(ids, vecs, md):
        if ids == ["bad"]:
            raise RecursionError("maximum recursion depth exceeded")  # what the engine raised
        applied.append(("upsert", ids))

    with pytest.warns(ReplayFailed, match=r"upsert of 1 document.*RecursionError.*moved to .*failed"):
        n = RedoLog(tmp_path).replay(upsert, lambda ids: applied.append(("delete", ids)))
    assert n == 2 and applied == [("upsert", ["good-1"]), ("delete", ["good-1"])]
    assert [p.name for p in tmp_path.iterdir()] == ["failed"]
    assert len(list((tmp_path / "failed").glob("*.npz"))) == 1
    log = RedoLog(tmp_path)
    assert not log.dirty
    with log.pending("delete", ["x"]):
        pass
    assert log.replay(upsert, lambda ids: None) == 0  # the quarantined entry is never replayed again


def test_a_transient_failure_on_replay_keeps_the_entry(tmp_path):
    log = RedoLog(tmp_path)
    _entry(log)

    def fail(*a):
        raise ConnectionError("the server went away")

    with pytest.raises(ConnectionError):
        log.replay(fail, fail)
    assert log.dirty and len(list(tmp_path.glob("*.npz"))) == 1 and not (tmp_path / "failed").exists()
    assert log.replay(lambda *a: None, lambda *a: None) == 1 and not log.dirty


def test_a_write_the_engine_refuses_is_quarantined_at_once(tmp_path):
    """A deterministic error of the engine call itself: raised to the caller (with a note naming
    the quarantined entry), nothing left to replay, the next write goes through."""
    log = RedoLog(tmp_path, failed=tmp_path.parent / "quarantine")
    with pytest.raises(ValueError, match="refused") as e, log.pending("delete", ["a"]):
        raise ValueError("refused by the engine")
    assert any("may be partly applied" in note for note in e.value.__notes__)
    assert not log.dirty and list(tmp_path.glob("*.npz")) == []
    assert len(list((tmp_path.parent / "quarantine").glob("*.npz"))) == 1
    with log.pending("delete", ["b"]):
        pass
    assert log.replay(lambda *a: None, lambda *a: None) == 0


def test_only_regular_files_are_entries(tmp_path):
    """A folder named like an entry (``papers.npz``: the log of collection "papers.npz" inside
    a 0.2.0 log folder) or like a leftover (``.tmp-x``: collection ".tmp-x") is not one: it made
    the log dirty, replay ran np.load on it (IsADirectoryError, kept as transient) or unlinked it."""
    (tmp_path / "papers.npz").mkdir()
    (tmp_path / ".tmp-x").mkdir()
    log = RedoLog(tmp_path)
    assert not log.dirty
    _entry(log)
    log = RedoLog(tmp_path)
    assert log.dirty
    calls = []
    assert log.replay(lambda ids, v, md: calls.append(ids), lambda ids: None) == 1
    assert calls == [["a"]] and not log.dirty
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-x", "papers.npz"]
