"""Durable file writes shared by the stores: fsync'd temporary file, atomic rename, fsync'd folder.

A reader (or a process opening the folder after a crash) sees either the old file or the whole
new one; leftovers are named ``.tmp-uibk-*`` (:data:`TMP_PREFIX`) and can be deleted on open by
the store that owns the folder (a store deletes no file of another name).

>>> import numpy as np, tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "x.npz"
>>> atomic_savez(p, a=np.arange(3))
>>> np.load(p)["a"].tolist()
[0, 1, 2]
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import numpy as np

TMP_PREFIX = ".tmp-uibk-"
"""The start of every temporary file name written here (before 0.4: ``.tmp-``)."""


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or unlink inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_mkdir(path: str | os.PathLike) -> Path:
    """``mkdir -p`` whose new folders survive a power cut: each created folder's parent is
    fsync'd (a folder is an entry of its parent, and that entry is data like any other)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        fsync_dir(d.parent)
    return path


def fsync_tree(path: str | os.PathLike) -> None:
    """Flush every file below ``path`` and every folder's entries (e.g. an engine's index folder
    written without fsync), so that switching to it after this call survives a power loss.

    A file or folder that is gone by the time it is opened is skipped: the engine that owns the
    folder renamed or removed it meanwhile (Qdrant Edge's WAL renames ``tmp-open-N`` while it runs).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "a").mkdir(); _ = (d / "a" / "f").write_text("x")
    >>> fsync_tree(d)
    """
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            fsync_dir(root)


def atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    """Write ``arrays`` as ``.npz`` (no pickle) to ``path`` atomically and durably."""
    tmp = path.with_name(f"{TMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{path.name}")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably (file and folder fsync'd), so a power
    cut leaves the old file or the whole new one, never an empty one."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{path.name}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
