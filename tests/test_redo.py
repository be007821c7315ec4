"""The redo log: an operation whose engine call did not finish is replayed whole on open."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.adapters.redo import RedoLog


def test_interrupted_operation_is_replayed_and_blocks_later_writes(tmp_path):
    log = RedoLog(tmp_path)
    v = [np.full((4, 128), 0.5, np.float32), np.ones((5, 128), np.float32)]
    with pytest.raises(RuntimeError, match="half-way"), log.pending("upsert", ["a", "b"], v, [{"x": 1}, {}]):
        raise RuntimeError("killed half-way")  # the engine applied part of it, or nothing
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
