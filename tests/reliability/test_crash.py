"""Crash safety: a child process writing to a store is killed with SIGKILL at random points; the
store must reopen, answer searches, keep every acknowledged batch, and hold each interrupted
batch either whole or not at all (no half-written id maps, no dangling ids).

Runs for every backend spec that persists to local files (``reopen`` set; server-backed specs
are left out). ``UIBK_CRASH_KILLS`` sets the kills per backend (default 5; more for soak runs).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list
from uibk_embedding.testing.server_process import pid_alive

CHILD = Path(__file__).with_name("crash_child.py")
KILLS = int(os.environ.get("UIBK_CRASH_KILLS", "5"))
BATCH = 8
REMOTE = ("server", "standalone", "live")
RESULTS: dict[str, dict[str, int]] = {}


def _read_acks(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_for_server_sessions(acks: list[str], timeout: float = 60.0) -> None:
    """Wait until the server sessions the killed child opened (``OPEN <pid>``: a local database
    server's backend process) have ended. A backend that already received the child's COMMIT
    finishes it after the kill; checked before that, a batch commits between two reads of the
    check (seen once in CI: count() 328 against 320 documents found, one batch of 8)."""
    pids = [int(a.split()[1]) for a in acks if a.startswith("OPEN ") and len(a.split()) == 2]
    deadline = time.monotonic() + timeout
    for pid in pids:
        while pid_alive(pid):
            if time.monotonic() > deadline:
                pytest.fail(f"the killed child's server session (pid {pid}) still runs after {timeout} s")
            time.sleep(0.01)


def _expected(acks: list[str]) -> tuple[set[str], set[str]]:
    """Batches that must be whole (written, acknowledged, and no delete of them started) and
    batches whose delete was acknowledged (they must stay gone). A batch whose delete was in
    flight at the kill may be whole or gone; never partly there (checked separately)."""
    live: set[str] = set()
    deleted: set[str] = set()
    for line in acks:
        kind, _, batch = line.partition(" ")
        if kind == "ACK":
            live.add(batch)
        elif kind == "START-DEL":
            live.discard(batch)
        elif kind == "DEL":
            deleted.add(batch)
    return live, deleted


def test_kill_during_writes(spec, tmp_path):
    if spec.reopen is None or any(r in spec.name for r in REMOTE):  # REMOTE: see module docstring
        pytest.skip(f"{spec.name} does not persist to local files")
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    rnd = random.Random(spec.name)
    stats = defaultdict(int)
    all_acks: list[str] = []
    lost: list[str] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for seed in range(KILLS):
        ack = tmp_path / f"acks-{seed}.log"
        child = subprocess.Popen([sys.executable, str(CHILD), spec.name, str(store_dir), str(ack),
                                  str(seed)], env=env, stderr=subprocess.PIPE)
        want = rnd.randint(0, 4)  # operations to let finish before the kill window
        deadline = time.monotonic() + 240
        while child.poll() is None and time.monotonic() < deadline:
            acks = _read_acks(ack)
            if sum(a.startswith(("ACK", "DEL")) for a in acks) >= want:
                break
            time.sleep(0.02)
        if child.poll() is not None:
            pytest.fail(f"child exited early: {child.stderr.read().decode()[-2000:]}")
        time.sleep(rnd.uniform(0, 0.4))  # land somewhere inside the next write
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()
        _wait_for_server_sessions(_read_acks(ack))
        stats["kills"] += 1
        all_acks += _read_acks(ack)

        try:
            store = spec.reopen(store_dir)
        except Exception as e:
            stats["reopen_failures"] += 1
            pytest.fail(f"{spec.name}: store did not reopen after kill {seed}: {e!r}")
        try:
            live, deleted = _expected(all_acks)
            got = defaultdict(set)
            started = {line.partition(" ")[2] for line in all_acks if line.startswith("START-ACK")}
            ids = [f"{b}-{j}" for b in sorted(started) for j in range(BATCH)]
            for rec in store.get(ids):
                batch, _, j = rec.id.rpartition("-")
                got[batch].add(j)
                assert rec.vectors.shape[1] == 128 and np.isfinite(rec.vectors).all()
            for batch in sorted(live):
                if len(got.get(batch, ())) != BATCH:
                    stats["lost_acknowledged_batches"] += 1
                    lost.append(f"{batch} (kill {seed}: {len(got.get(batch, ()))} of {BATCH} found)")
            for members in got.values():
                if len(members) != BATCH:
                    stats["torn_batches"] += 1
            for batch in deleted:
                if batch in got and batch not in live:
                    # a delete that was acknowledged must stay applied
                    stats["resurrected_batches"] += 1
            assert store.count() == sum(len(m) for m in got.values())
            q = make_list(TaggedFormat(), np.random.default_rng(seed), 6)
            hits = store.search(q, k=5)
            assert len(hits) == min(5, store.count())
            stats["batches_checked"] += len(got)
        finally:
            store.close()
    RESULTS[spec.name] = dict(stats)
    print(f"\n{spec.name}: {dict(stats)}")
    assert stats["lost_acknowledged_batches"] == 0, (stats, lost[:10])
    assert stats["torn_batches"] == 0, stats
    assert stats["resurrected_batches"] == 0, stats
    assert stats["reopen_failures"] == 0, stats
