"""Power loss, not only SIGKILL: every point of a workload, every disk state a power cut there
could leave (``power_loss.py``: unsynced folder operations lost or kept, unsynced bytes dropped
or torn), reopened, must hold every acknowledged write and delete, and the write in flight
whole or not at all.

Modelled: our own file code, the exact store (the file-backed store of PLAID and WARP with no
index: its vector file and generations around SQLite's commits, SQLite's files trusted), the
conversion of an exact store folder of 0.4 (operation log, snapshots, ``store.json``) and the
redo log that makes Qdrant local-mode and Edge batches all-or-nothing, with the engine side of
the redo log a plain dict (the engines' files are theirs to guarantee).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

sys.path.insert(0, str(Path(__file__).resolve().parent))
from power_loss import crash_states, record

FMT = TaggedFormat()


def _doc(seed: int) -> np.ndarray:
    return make_list(FMT, np.random.default_rng(seed), 5)


# (op, id, seed): upserts, an overwrite, deletes, enough operations for two compactions
WORKLOAD = [("upsert", "a", 1), ("upsert", "b", 2), ("delete", "a", 0), ("upsert", "c", 3),
            ("upsert", "b", 4), ("upsert", "d", 5), ("delete", "c", 0), ("upsert", "e", 6)]


def _model(steps: int) -> dict[str, int]:
    m: dict[str, int] = {}
    for op, x, seed in WORKLOAD[:steps]:
        if op == "delete":
            m.pop(x, None)
        else:
            m[x] = seed
    return m


def _sqlite(name: str) -> bool:
    return name.startswith("store.sqlite")


def _run_exact(path: Path, repack: bool) -> None:
    from uibk_embedding.adapters.exact import ExactStore

    store = ExactStore(path=path)
    for op, x, seed in WORKLOAD:
        if op == "delete":
            store.delete([x])
        else:
            store.upsert([x], [_doc(seed)], [{"seed": seed}])
        if repack:  # after each write that left dead rows (3 of the 8) the live rows are
            store.compact()  # copied into the next vector file generation
        yield
    assert store._vgen == (4 if repack else 1)  # the repacks happened (and only those)


@pytest.mark.parametrize("repack", [False, True])
def test_exact_store_survives_a_power_cut_at_every_point(tmp_path, repack):
    from uibk_embedding.adapters.exact import ExactStore

    root = tmp_path / "store"
    root.mkdir()
    with record(root, trusted=_sqlite) as rec:
        steps = _run_exact(root, repack)
        rec.acked = 0  # the constructor is step "-1": a store that opened must reopen
        for _ in steps:
            rec.acked += 1
            rec.point("after a write")  # deletes are SQLite commits alone: no call of ours to cut at
    assert len(rec.points) > 2 * len(WORKLOAD), "the recorder saw no file operations"
    explored = 0
    for i, variant, snap, folder in crash_states(rec, tmp_path / "crash"):
        store = ExactStore(path=folder)  # must open: no torn vector file read
        got = {r.id: r.metadata["seed"] for r in store.get(sorted({x for _, x, _ in WORKLOAD}))}
        for r in store.get(list(got)):  # the rows are the document's, not another write's
            np.testing.assert_array_equal(r.vectors, _doc(r.metadata["seed"]))
        store.close()
        done = _model(snap.acked)
        in_flight = _model(snap.acked + 1) if snap.acked < len(WORKLOAD) else done
        assert got in (done, in_flight), (
            f"point {i} ({snap.label}, {variant}): holds {got}, acknowledged {done}")
        explored += 1
    print(f"exact store, repack={repack}: {len(rec.points)} points, {explored} crash states")


def test_converting_a_store_of_04_survives_a_power_cut_at_every_point(tmp_path):
    """A folder of 0.4 converted on open: whatever a cut leaves opens to the same documents with
    the same rows (the old files until the switch, the SQLite store after it)."""
    from uibk_embedding.adapters.exact import ExactStore
    from uibk_embedding.testing.old_formats import write_exact_store_04

    ids = ["a", "b", "c", "b", "e", "f"]
    docs = [_doc(i) for i in range(len(ids))]
    root = tmp_path / "store"
    write_exact_store_04(root, ids, docs, [{"seed": i} for i in range(len(ids))])
    want = {"c": 2, "b": 3, "e": 4, "f": 5}
    # what 0.4 left durable: every file and folder of the store as written
    with record(root, trusted=_sqlite) as rec:
        rec.durable_dirs.update({".": {}, "ops": {}})
        for rel in [p.relative_to(root) for p in root.rglob("*")]:
            ino = None if (root / rel).is_dir() else (root / rel).stat().st_ino
            rec.durable_dirs.setdefault(str(rel.parent), {})[str(rel)] = ino
            if ino is not None:
                rec.durable_files[ino] = (root / rel).read_bytes()
        ExactStore(path=root).close()
        rec.acked = 1
    assert len(rec.points) > 5, "the recorder saw no file operations"
    for i, variant, snap, folder in crash_states(rec, tmp_path / "crash"):
        with ExactStore(path=folder) as store:
            got = {r.id: r.metadata["seed"] for r in store.get(ids)}
            assert got == want, f"point {i} ({snap.label}, {variant}): holds {got}"
            for r in store.get(list(want)):
                np.testing.assert_array_equal(r.vectors, docs[want[r.id]])
        assert not (folder / "store.json").exists()


def test_redo_log_makes_a_batch_whole_after_a_power_cut_at_every_point(tmp_path):
    """The redo log's own protocol: the entry durable before the engine call, removed after it;
    replayed on open. The engine is a dict that applies a batch point by point and is durable at
    once (as Qdrant local mode's per-point SQLite commits are): a cut at any point leaves a batch
    that replay completes, never half of it."""
    from uibk_embedding.adapters.redo import RedoLog

    root = tmp_path / "redo"
    root.mkdir()
    engine: dict[str, int] = {}
    trace: list[tuple[int, dict[str, int]]] = [(0, {})]  # (from point, engine contents)
    batch = [("x1", 1), ("x2", 2), ("x3", 3)]
    with record(root) as rec:
        log = RedoLog(root / "log")
        rec.acked = 0
        with log.pending("upsert", [x for x, _ in batch], [_doc(s) for _, s in batch],
                         [{"seed": s} for _, s in batch]):
            for x, s in batch:
                engine[x] = s
                trace.append((len(rec.points), dict(engine)))
                rec.point(f"engine applied {x}")  # a cut between two engine writes
        rec.acked = 1
    explored = 0
    for i, variant, snap, folder in crash_states(rec, tmp_path / "crash"):
        state = dict(next(e for p, e in reversed(trace) if p <= i))

        def upsert(ids, vecs, md, state=state):
            state.update({x: m["seed"] for x, m in zip(ids, md, strict=True)})

        def delete(ids, state=state):
            for x in ids:
                state.pop(x, None)

        if (folder / "log").exists():
            RedoLog(folder / "log").replay(upsert, delete)
        whole = {x: s for x, s in batch}
        if snap.acked:
            assert state == whole, f"point {i} ({snap.label}, {variant}): acknowledged batch lost: {state}"
        else:
            assert state in ({}, whole), f"point {i} ({snap.label}, {variant}): torn batch {state}"
        explored += 1
    print(f"redo log: {len(rec.points)} points, {explored} crash states")
