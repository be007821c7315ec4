"""A redo log that makes an engine's multi-point writes all-or-nothing across crashes.

Some engines commit point by point (qdrant-client's local mode writes one SQLite row per
point), so a process killed in the middle of a batch leaves part of it. Before such a write,
:class:`RedoLog` saves the whole operation to a file (temporary name, ``fsync``, atomic
rename); after the engine call returns, the file is removed. On open, every operation still
logged is replayed: upserts and deletes by id are idempotent, so an interrupted batch ends up
whole. Files are ``.npz`` plus JSON (no pickle).

An entry must never brick the store: an operation the engine refuses for a reason that does
not go away (a deterministic error: bad data, a bug, a Rust panic, as opposed to an I/O or
connection failure, see :func:`is_transient`) would otherwise be replayed, and fail, before every
later write and on every open. Such an entry is moved to the quarantine folder (``failed/``
beside the log unless given), with a :class:`ReplayFailed` warning naming the file and the
error, and the store goes on. Nothing acknowledged is lost: the call that logged it raised that
error to its caller (or its process ended before it returned). The inputs known to fail so
are refused earlier, by the shared validation of :mod:`uibk_embedding.adapters.base`.

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
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from uibk_embedding._durable import atomic_savez, durable_mkdir, fsync_dir

_counter = itertools.count()
FAILED_DIR = "failed"


class ReplayFailed(UserWarning):
    """A logged operation failed deterministically on replay and was moved to quarantine."""


def is_transient(exc: BaseException) -> bool:
    """Whether an engine call's error may go away on a later try, so its log entry must stay:
    I/O and connection errors (``OSError``, which includes ``ConnectionError``,
    ``TimeoutError`` and :class:`~uibk_embedding.errors.BackendUnavailable`), ``MemoryError``,
    SQLite's ``OperationalError`` (locked, disk I/O), a Rust I/O error (``"... (os error 28)"``)
    and an interruption (``KeyboardInterrupt``, ``SystemExit``). Everything else (``ValueError``,
    ``TypeError``, ``RecursionError``, a Rust panic, ...) is deterministic.

    >>> is_transient(OSError(28, "No space left on device")), is_transient(ValueError("bad"))
    (True, False)
    >>> is_transient(RuntimeError("Service internal error: No space left on device (os error 28)"))
    True
    """
    if not isinstance(exc, Exception):
        return type(exc).__name__ != "PanicException"  # pyo3's panics derive from BaseException
    if isinstance(exc, OSError | MemoryError | sqlite3.OperationalError):
        return True
    return "(os error " in str(exc)


class RedoLog:
    """Operations logged in ``folder`` until the engine has applied them.

    ``dirty`` is true while an entry of a failed engine call is still logged in this process:
    the caller must :meth:`replay` before its next write. Otherwise a later write of the same id
    would be applied first and the stale entry replayed over it on the next open.

    ``failed``: the quarantine folder of entries that failed deterministically (default
    ``folder/failed``); ``transient``: which errors keep an entry logged (:func:`is_transient`).
    """

    def __init__(self, folder: str | os.PathLike, *, failed: str | os.PathLike | None = None,
                 transient: Callable[[BaseException], bool] = is_transient) -> None:
        self.folder = durable_mkdir(folder)
        self.failed = Path(failed) if failed is not None else self.folder / FAILED_DIR
        self.transient = transient
        self.dirty = bool(self._entries())

    def _entries(self) -> list[Path]:
        """The logged operations, oldest first: the regular ``*.npz`` files of the folder (a folder
        of that name, e.g. the log of a collection called ``x.npz`` beside a 0.2.0 log, is none)."""
        return sorted(p for p in self.folder.glob("*.npz") if p.is_file())

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

        If the body raises a transient error (:func:`is_transient`), the entry stays (the engine
        may have applied part of it) and ``dirty`` is set: it is replayed before the next write,
        or on the next open. A deterministic error would fail the same way on every replay: the
        entry goes to quarantine at once (the error, raised to the caller, names the file)."""
        if self.dirty:
            raise RuntimeError(f"{self.folder} holds operations not yet applied: replay() first")
        path = self._write(op, ids, vectors, metadata)
        try:
            yield
        except BaseException as e:
            if self.transient(e):
                self.dirty = True
                raise
            dest = self._quarantine(path)
            if isinstance(e, Exception):
                e.add_note(f"uibk-embedding: the {op} of {len(ids)} document(s) may be partly applied; "
                           f"its redo log entry was moved to {dest}")
            raise
        path.unlink()
        fsync_dir(self.folder)

    def _quarantine(self, path: Path) -> Path:
        """Move one entry to the quarantine folder (durably), out of every later replay."""
        durable_mkdir(self.failed)
        dest = self.failed / path.name
        os.replace(path, dest)
        fsync_dir(self.failed)
        fsync_dir(self.folder)
        return dest

    def replay(self, upsert: Callable[[list[str], list[np.ndarray], list[dict]], None],
               delete: Callable[[list[str]], None]) -> int:
        """Apply every logged operation in order, removing each once applied; returns how many.

        An operation that fails with a transient error stops the replay (it stays logged, the
        error is raised); one that fails deterministically is moved to quarantine with a
        :class:`ReplayFailed` warning, and the replay goes on with the next."""
        for p in self.folder.glob(".tmp-*"):  # never renamed into place: never acknowledged
            if p.is_file():
                p.unlink(missing_ok=True)
        done = 0
        for path in self._entries():
            what = "operation"
            try:
                with np.load(path, allow_pickle=False) as z:
                    ids = json.loads(str(z["ids"]))
                    what = f"{z['op']} of {len(ids)} document(s)"
                    if str(z["op"]) == "delete":
                        delete(ids)
                    else:
                        splits = np.cumsum(z["lengths"])[:-1]
                        upsert(ids, list(np.split(z["vectors"], splits)), json.loads(str(z["metadata"])))
            except BaseException as e:
                if self.transient(e):
                    self.dirty = True
                    raise
                dest = self._quarantine(path)
                error = f"{type(e).__name__}: {e}"
                warnings.warn(
                    f"a logged {what} could not be replayed ({error[:500]}); the call that logged it "
                    f"did not return (it raised, or its process ended), so it was never acknowledged. "
                    f"It was moved to {dest}, and the store goes on without it", ReplayFailed, stacklevel=2)
                continue
            path.unlink()
            done += 1
        if done:
            fsync_dir(self.folder)
        self.dirty = False
        return done
