"""A redo log that makes an engine's multi-point writes all-or-nothing across crashes.

Some engines commit point by point (qdrant-client's local mode writes one SQLite row per
point), so a process killed in the middle of a batch leaves part of it. Before such a write,
:class:`RedoLog` saves the whole operation to a file (temporary name, ``fsync``, atomic
rename); after the engine call returns, the file is removed. On open, every operation still
logged is replayed: upserts and deletes by id are idempotent, so an interrupted batch ends up
whole. Files are ``.npz`` plus JSON (no pickle).

Example
-------
>>> import numpy as np, tempfile
>>> log = RedoLog(tempfile.mkdtemp())
>>> with log.pending("upsert", ["a"], [np.ones((4, 128), np.float32)], [{"k": 1}]):
...     pass                                   # the engine call goes here
>>> log.replay(upsert=print, delete=print)     # nothing left to replay
0
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from uibk_embedding._durable import atomic_savez, durable_mkdir, fsync_dir

_counter = itertools.count()


class RedoLog:
    """Operations logged in ``folder`` until the engine has applied them.

    ``dirty`` is true while an entry of a failed engine call is still logged in this process:
    the caller must :meth:`replay` before its next write. Otherwise a later write of the same id
    would be applied first and the stale entry replayed over it on the next open.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = durable_mkdir(folder)
        self.dirty = any(self.folder.glob("*.npz"))

    def _write(self, op: str, ids: Sequence[str], vectors: Sequence[np.ndarray] | None,
               metadata: Sequence[dict] | None) -> Path:
        name = f"{time.time_ns():020d}-{os.getpid()}-{threading.get_ident()}-{next(_counter)}.npz"
        path = self.folder / name
        arrays = {"op": np.array(op), "ids": np.array(json.dumps(list(ids), ensure_ascii=False))}
        if vectors is not None:
            arrays["lengths"] = np.array([len(v) for v in vectors], dtype=np.int64)
            arrays["vectors"] = np.concatenate(vectors).astype(np.float32)
            arrays["metadata"] = np.array(json.dumps(list(metadata or []), ensure_ascii=False))
        atomic_savez(path, **arrays)
        return path

    @contextlib.contextmanager
    def pending(self, op: str, ids: Sequence[str], vectors: Sequence[np.ndarray] | None = None,
                metadata: Sequence[dict] | None = None) -> Iterator[None]:
        """Log the operation, run the body (the engine call), then drop the log entry.

        If the body raises, the entry stays (the engine may have applied part of it) and
        ``dirty`` is set: it is replayed before the next write, or on the next open."""
        if self.dirty:
            raise RuntimeError(f"{self.folder} holds operations not yet applied: replay() first")
        path = self._write(op, ids, vectors, metadata)
        try:
            yield
        except BaseException:
            self.dirty = True
            raise
        path.unlink()
        fsync_dir(self.folder)

    def replay(self, upsert: Callable[[list[str], list[np.ndarray], list[dict]], None],
               delete: Callable[[list[str]], None]) -> int:
        """Apply every logged operation in order, removing each once applied; returns how many."""
        for p in self.folder.glob(".tmp-*"):  # never renamed into place: never acknowledged
            p.unlink(missing_ok=True)
        done = 0
        for path in sorted(self.folder.glob("*.npz")):
            with np.load(path, allow_pickle=False) as z:
                ids = json.loads(str(z["ids"]))
                if str(z["op"]) == "delete":
                    delete(ids)
                else:
                    splits = np.cumsum(z["lengths"])[:-1]
                    upsert(ids, list(np.split(z["vectors"], splits)), json.loads(str(z["metadata"])))
            path.unlink()
            done += 1
        if done:
            fsync_dir(self.folder)
        self.dirty = False
        return done
