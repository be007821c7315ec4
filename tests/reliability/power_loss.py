"""A small power-loss model of our own file code (the ALICE / SQLite crash-test idea, scaled down).

The layer modelled: the POSIX calls our stores make through Python (``os.fsync`` of files and
folders, ``os.replace``, ``os.unlink``, ``os.mkdir``, ``os.rmdir``) over a real folder. Not
modelled: the engines' own files (fast-plaid, xtr-warp-rs, SQLite, Qdrant, Milvus), which are
theirs to guarantee. A store whose source of truth is SQLite (the file-backed stores) names its
database files as ``trusted``: at every point they count as durable as they are, since SQLite
commits (``synchronous=FULL``, fsync'd in C, unseen here) never span one of our calls; what is
modelled is our own protocol around them (the vector file durable before the commit that
references it, generation switches).

:func:`record` runs a workload on a real folder and takes, before every such call, a copy of
the whole tree (names -> inode, inode -> bytes), and at every ``fsync`` what became durable:
a file's bytes, or a folder's entries. :func:`crash_states` then builds, for each point, the
disk a power cut there could leave, in three variants:

* ``lost``: every folder operation since that folder's last fsync is undone (entries as of the
  last fsync of each folder; a folder never fsync'd is empty), unsynced file bytes dropped;
* ``kept``: every folder operation persisted, unsynced file bytes dropped (a renamed file whose
  data was never fsync'd is empty: the classic rename-before-fsync bug);
* ``torn``: folder operations persisted, half of each file's unsynced bytes written.

A file never fsync'd has no durable bytes (empty). Real file systems leave one of many states
between these; these three are the extremes that the usual bugs fall into.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

VARIANTS = ("lost", "kept", "torn")


@dataclass
class Snapshot:
    """The tree before one call: relative path -> inode (folders: None), inode -> bytes."""

    entries: dict[str, int | None]
    data: dict[int, bytes]
    durable_files: dict[int, bytes]  # inode -> bytes as of its last fsync
    durable_dirs: dict[str, dict[str, int | None]]  # folder -> its entries as of its last fsync
    label: str
    acked: int  # workload steps acknowledged (returned) before this point


@dataclass
class Recording:
    root: Path
    points: list[Snapshot] = field(default_factory=list)
    durable_files: dict[int, bytes] = field(default_factory=dict)
    durable_dirs: dict[str, dict[str, int | None]] = field(default_factory=dict)
    acked: int = 0
    trusted: Callable[[str], bool] = lambda name: False  # file names whose bytes SQLite makes durable

    def _tree(self) -> tuple[dict[str, int | None], dict[int, bytes]]:
        entries: dict[str, int | None] = {}
        data: dict[int, bytes] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel = os.path.relpath(dirpath, self.root)
            for d in dirnames:
                entries[os.path.normpath(os.path.join(rel, d))] = None
            for f in filenames:
                p = os.path.join(dirpath, f)
                ino = os.stat(p).st_ino
                entries[os.path.normpath(os.path.join(rel, f))] = ino
                with open(p, "rb") as fh:
                    data[ino] = fh.read()
        return entries, data

    def point(self, label: str) -> None:
        entries, data = self._tree()
        for rel, ino in entries.items():
            if ino is not None and self.trusted(os.path.basename(rel)):
                self.durable_files[ino] = data[ino]
                self.durable_dirs.setdefault(os.path.dirname(rel) or ".", {})[rel] = ino
        self.points.append(Snapshot(entries, data, dict(self.durable_files),
                                    {k: dict(v) for k, v in self.durable_dirs.items()}, label, self.acked))

    def fsynced(self, fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if not target.startswith(str(self.root)):
            return
        rel = os.path.normpath(os.path.relpath(target, self.root))
        if os.path.isdir(target):
            entries, _ = self._tree()
            prefix = "" if rel == "." else rel + os.sep
            self.durable_dirs[rel] = {k: v for k, v in entries.items()
                                      if k.startswith(prefix) and os.sep not in k[len(prefix):]}
        else:
            with open(target, "rb") as fh:
                self.durable_files[os.stat(target).st_ino] = fh.read()


@contextlib.contextmanager
def record(root: Path, trusted: Callable[[str], bool] | None = None) -> Iterator[Recording]:
    """Record every modelled call made under ``root`` while the block runs. The caller marks each
    acknowledged workload step with ``rec.acked += 1`` after the call returns; ``trusted`` names
    the files durable as they are at every point (see the module docstring)."""
    rec = Recording(Path(root).resolve(), trusted=trusted or (lambda name: False))
    rec.durable_dirs["."] = {}  # the root exists (made by the test, durable) and is empty
    real = {name: getattr(os, name) for name in ("fsync", "replace", "rename", "unlink", "mkdir", "rmdir")}

    def wrap(name: str) -> Callable:
        fn = real[name]

        def call(*args, **kwargs):
            first = args[0] if args else None
            ours = name == "fsync" or str(first).startswith(str(rec.root)) or (
                isinstance(first, str | os.PathLike) and not os.path.isabs(first))
            if ours:
                rec.point(f"{name} {first if name != 'fsync' else '(fd)'}")
            out = fn(*args, **kwargs)
            if name == "fsync":
                rec.fsynced(args[0])
                if trusted is not None and ours:  # a SQLite commit may follow: a cut just before it
                    rec.point("after fsync")
            return out

        return call

    for name in real:
        setattr(os, name, wrap(name))
    try:
        yield rec
        rec.point("end")
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


def _materialise(entries: dict[str, int | None], content: Callable[[int], bytes], dest: Path) -> None:
    dest.mkdir(parents=True)
    for rel in sorted(entries, key=lambda r: r.count(os.sep)):
        p = dest / rel
        if entries[rel] is None:
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(content(entries[rel]))


def _durable_tree(s: Snapshot) -> dict[str, int | None]:
    """Entries reachable from the root through each folder's fsync'd entries."""
    out: dict[str, int | None] = {}
    todo = ["."]
    while todo:
        d = todo.pop()
        for rel, ino in s.durable_dirs.get(d, {}).items():
            out[rel] = ino
            if ino is None:
                todo.append(rel)
    return out


def crash_states(rec: Recording, dest: Path) -> Iterator[tuple[int, str, Snapshot, Path]]:
    """(point index, variant, snapshot, folder holding that disk state) for every point."""
    for i, s in enumerate(rec.points):
        for variant in VARIANTS:
            folder = dest / f"{i:04d}-{variant}"

            def unsynced_dropped(ino: int, s: Snapshot = s) -> bytes:
                return s.durable_files.get(ino, b"")

            def torn(ino: int, s: Snapshot = s) -> bytes:
                old, now = s.durable_files.get(ino, b""), s.data.get(ino, b"")
                if now.startswith(old):
                    return now[: len(old) + (len(now) - len(old)) // 2]
                return old

            if variant == "lost":
                _materialise(_durable_tree(s), unsynced_dropped, folder)
            elif variant == "kept":
                _materialise(s.entries, unsynced_dropped, folder)
            else:
                _materialise(s.entries, torn, folder)
            yield i, variant, s, folder
            shutil.rmtree(folder, ignore_errors=True)
