"""Where a process's memory goes, read from Linux's ``/proc/PID/smaps`` (what ``smem`` reads):
per mapping, resident (``Rss``), proportional (``Pss``: shared pages divided among the processes
that map them) and the clean/dirty, shared/private split, grouped into kinds (the files under
a folder, such as a store's, the shared libraries, the anonymous heap). For the memory
measurements of many reader processes on one store folder (benchmarks/shared_readers.py,
benchmarks/reader_memory.py, docs/sharing.md) and the test that a reader's vectors are mapped
pages shared between processes, not private copies.

>>> usage = mappings()                              # this process (Linux)
>>> totals(usage)["Pss"] > 0, by_kind(usage)["libraries"]["Rss"] > 0
(True, True)
>>> kind_of("/usr/lib/x86_64-linux-gnu/libc.so.6", None), kind_of("", None), kind_of("[heap]", None)
('libraries', 'anonymous', 'anonymous')
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

FIELDS = ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")
"""The smaps fields kept (KiB in the file; bytes here)."""


def mappings(pid: int | str = "self") -> list[tuple[str, dict[str, int]]]:
    """Every mapping of process ``pid`` as ``(name, {field: bytes})`` (:data:`FIELDS`); the name
    is the mapped file's path, a kernel name such as ``[heap]``, or ``""`` for anonymous memory.
    Empty where ``/proc/PID/smaps`` does not exist (not Linux)."""
    path = Path(f"/proc/{pid}/smaps")
    if not path.exists():
        return []
    out: list[tuple[str, dict[str, int]]] = []
    current: dict[str, int] | None = None
    for line in path.read_text(errors="replace").splitlines():
        head, _, rest = line.partition(" ")
        if head.endswith(":") and head[:-1] in FIELDS and current is not None:
            current[head[:-1]] = int(rest.split()[0]) * 1024
        elif "-" in head and not head.endswith(":"):  # "start-end perms offset dev inode [name]"
            parts = line.split(None, 5)
            current = dict.fromkeys(FIELDS, 0)
            out.append((parts[5].strip() if len(parts) > 5 else "", current))
    return out


def kind_of(name: str, folder: str | os.PathLike | None) -> str:
    """The kind of a mapping: ``"store"`` (a file under ``folder``, deleted ones too), ``"libraries"``
    (shared objects), ``"anonymous"`` (the heap, anonymous maps, stacks), ``"other files"``."""
    if folder is not None and name.startswith(str(Path(folder).resolve()).rstrip("/") + "/"):
        return "store"
    if not name or name.startswith("["):
        return "anonymous"
    base = name.removesuffix(" (deleted)")
    if ".so" in os.path.basename(base):
        return "libraries"
    return "other files"


def by_kind(usage: Iterable[tuple[str, dict[str, int]]],
            folder: str | os.PathLike | None = None) -> dict[str, dict[str, int]]:
    """``usage`` (:func:`mappings`) summed per :func:`kind_of` kind."""
    out: dict[str, dict[str, int]] = {}
    for name, fields in usage:
        acc = out.setdefault(kind_of(name, folder), dict.fromkeys(FIELDS, 0))
        for k, v in fields.items():
            acc[k] += v
    return out


def totals(usage: Iterable[tuple[str, dict[str, int]]]) -> dict[str, int]:
    """``usage`` (:func:`mappings`) summed over every mapping."""
    out = dict.fromkeys(FIELDS, 0)
    for _, fields in usage:
        for k, v in fields.items():
            out[k] += v
    return out


def matching(usage: Iterable[tuple[str, dict[str, int]]], suffix: str) -> dict[str, int]:
    """``usage`` summed over the mappings whose file name (less `` (deleted)``) ends with ``suffix``."""
    return totals((n, f) for n, f in usage if n.removesuffix(" (deleted)").endswith(suffix))


__all__ = ["FIELDS", "by_kind", "kind_of", "mappings", "matching", "totals"]
