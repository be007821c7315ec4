"""Original vectors in one memory-mapped, append-only file: exact rerank without a database read.

A :class:`VectorFile` is a flat file of ``(rows, 128)`` float16 or float32 rows. Documents are
*appended*; the store that owns the file keeps each document's ``(start, n_rows)`` in its own
source of truth (a SQLite row) and commits those references only after
:meth:`VectorFile.append` returned, which has made the rows durable (``fsync``). So after a crash
every committed reference points at complete rows; rows appended but never referenced are a
harmless tail that :meth:`VectorFile.open` cuts off (``committed_rows``).

Deleted or overwritten documents leave unreferenced rows behind. :meth:`VectorFile.rewrite`
copies the live documents into a new file of the next *generation*
(``vectors-000002.f16``) and returns their new starts; the owner switches its references and
the file name in one transaction, then calls :func:`remove_other_generations`. A crash before
the switch leaves the old generation in use and the new file is removed on the next open.

Reads go through ``numpy.memmap``: :meth:`gather` copies just the rows of the requested
documents (as float32) into one packed matrix plus offsets, ready for
:func:`uibk_embedding.maxsim.maxsim_scores`.

Example
-------
>>> import numpy as np, tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> vf = VectorFile.open(folder, generation=1, dtype="float32", committed_rows=0)
>>> starts = vf.append([np.ones((2, 128), np.float32), np.full((3, 128), 0.5, np.float32)])
>>> starts.tolist(), vf.n_rows
([0, 2], 5)
>>> mat, off = vf.gather(starts[::-1], np.array([3, 2]))
>>> mat.shape, off.tolist(), float(mat[0, 0]), float(mat[3, 0])
((5, 128), [0, 3, 5], 0.5, 1.0)
>>> vf.close()
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from uibk_embedding._durable import fsync_dir

DIM = 128
_SUFFIX = {"float16": "f16", "float32": "f32"}
_NAME = re.compile(r"^vectors-(\d{6})\.(f16|f32)$")


def file_name(generation: int, dtype: str) -> str:
    """``vectors-000001.f16``: the file of one generation."""
    return f"vectors-{generation:06d}.{_SUFFIX[dtype]}"


def remove_other_generations(folder: str | os.PathLike, keep: str) -> None:
    """Delete every vector file in ``folder`` except ``keep`` (after the owner switched to it)."""
    folder = Path(folder)
    removed = False
    for p in folder.iterdir():
        if _NAME.match(p.name) and p.name != keep:
            p.unlink(missing_ok=True)
            removed = True
    if removed:
        fsync_dir(folder)


class VectorFile:
    """Append-only rows of original vectors, read through a memory map.

    Not thread-safe by itself: the owning store serialises writes (and reads that may run while
    a write grows the file) with its own lock.
    """

    def __init__(self, path: Path, dtype: str, n_rows: int, writable: bool = True) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.n_rows = n_rows
        self.writable = writable
        self._map: np.ndarray | None = None
        # kept open for appends (and for the map: a file unlinked by a writer's compaction stays
        # readable through it); close() closes it
        self._f = open(path, "r+b" if writable else "rb")

    @classmethod
    def open_shared(cls, folder: str | os.PathLike, *, generation: int, dtype: str, rows: int) -> VectorFile:
        """Open generation ``generation`` in ``folder`` for reading its first ``rows`` rows (a
        reader's snapshot): nothing is created, cut or removed, whatever else the file holds (a
        writer may be appending). :class:`FileNotFoundError` when a writer's compaction removed
        it since the snapshot named it (read the snapshot again)."""
        if dtype not in _SUFFIX:
            raise ValueError(f"dtype must be 'float16' or 'float32', got {dtype!r}")
        path = Path(folder) / file_name(generation, dtype)
        if rows == 0 and not path.exists():  # a store no writer has opened since it lost the file
            vf = cls.__new__(cls)
            vf.path, vf.dtype, vf.n_rows, vf.writable = path, np.dtype(dtype), 0, False
            vf._map, vf._f = None, None
            return vf
        vf = cls(path, dtype, rows, writable=False)
        size = os.fstat(vf._f.fileno()).st_size
        if size < rows * vf.row_bytes:
            vf.close()
            raise ValueError(f"{path} holds {size // vf.row_bytes} rows, {rows} are referenced: "
                             "the file was truncated outside this library")
        return vf

    @classmethod
    def open(cls, folder: str | os.PathLike, *, generation: int, dtype: str,
             committed_rows: int) -> VectorFile:
        """Open (or create) generation ``generation`` in ``folder``, keeping its first
        ``committed_rows`` rows (the rows the owner's references reach) and cutting off the rest."""
        if dtype not in _SUFFIX:
            raise ValueError(f"dtype must be 'float16' or 'float32', got {dtype!r}")
        folder = Path(folder)
        path = folder / file_name(generation, dtype)
        row_bytes = DIM * np.dtype(dtype).itemsize
        if not path.exists():
            if committed_rows:
                raise FileNotFoundError(f"{path} is missing but {committed_rows} rows are referenced")
            path.touch()
            fsync_dir(folder)
        size = path.stat().st_size
        if size < committed_rows * row_bytes:
            raise ValueError(f"{path} holds {size // row_bytes} rows, {committed_rows} are referenced: "
                             "the file was truncated outside this library")
        if size != committed_rows * row_bytes:  # an append that was never committed
            os.truncate(path, committed_rows * row_bytes)
        return cls(path, dtype, committed_rows)

    def append(self, vectors: Sequence[np.ndarray]) -> np.ndarray:
        """Write ``vectors`` at the end of the file, durably; returns each one's start row."""
        if not self.writable:
            raise PermissionError(f"{self.path} was opened for reading (a reader's snapshot)")
        if len(vectors) == 0:
            return np.zeros(0, dtype=np.int64)
        lengths = np.fromiter((len(v) for v in vectors), dtype=np.int64, count=len(vectors))
        starts = self.n_rows + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        block = np.concatenate([np.asarray(v, dtype=self.dtype) for v in vectors])
        if block.ndim != 2 or block.shape[1] != DIM:
            raise ValueError(f"vectors must have {DIM} columns, got shape {block.shape}")
        self._f.seek(self.n_rows * DIM * self.dtype.itemsize)
        self._f.write(np.ascontiguousarray(block).tobytes())
        self._f.flush()
        os.fsync(self._f.fileno())
        self.n_rows += len(block)
        return starts

    def _mapped(self) -> np.ndarray:
        """The first ``n_rows`` rows, memory-mapped read-only through the open file (so N
        processes reading one file share its pages in the page cache, and a file a writer
        unlinked meanwhile stays readable); mapped again when the rows grew."""
        if self._map is None or len(self._map) < self.n_rows:
            self._map = (np.memmap(self._f, dtype=self.dtype, mode="r", shape=(self.n_rows, DIM))
                         if self.n_rows else np.zeros((0, DIM), self.dtype))
        return self._map[: self.n_rows]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row in the file."""
        return DIM * self.dtype.itemsize

    def private_map(self) -> np.ndarray:
        """The committed rows as a copy-on-write memory map: pages are read from the file when
        touched (and can be dropped again by the kernel); a write into the array changes
        private pages, never the file. For engines that take their input as arrays."""
        if not self.n_rows:
            return np.zeros((0, DIM), self.dtype)
        return np.memmap(self._f, dtype=self.dtype, mode="c", shape=(self.n_rows, DIM))

    def read(self, start: int, n_rows: int) -> np.ndarray:
        """One document's rows as float32 (a copy)."""
        return np.array(self._mapped()[start:start + n_rows], dtype=np.float32)

    def gather(self, starts: np.ndarray, lengths: np.ndarray,
               dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """The rows of several documents packed as ``(matrix, offsets)`` in the order given;
        the matrix as ``dtype`` (float32 by default; the file's own dtype avoids a conversion)."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if len(lengths) == 0:
            return np.zeros((0, DIM), dtype), offsets
        # row index of every output row: its document's start plus its position in the document
        rows = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return self._mapped()[rows].astype(dtype, copy=False), offsets

    def rewrite(self, folder: str | os.PathLike, generation: int, starts: np.ndarray,
                lengths: np.ndarray, chunk_rows: int = 1 << 20) -> tuple[VectorFile, np.ndarray]:
        """Copy the given documents into a fresh file of ``generation`` (durable before return);
        returns it and each document's new start. The owner then switches its references."""
        folder = Path(folder)
        target = folder / file_name(generation, self.dtype.name)
        target.unlink(missing_ok=True)
        new = VectorFile.open(folder, generation=generation, dtype=self.dtype.name, committed_rows=0)
        new_starts = np.zeros(len(lengths), dtype=np.int64)
        lo = 0
        try:
            while lo < len(lengths):  # bounded memory: copy about chunk_rows rows at a time
                hi, rows = lo, 0
                while hi < len(lengths) and (hi == lo or rows + lengths[hi] <= chunk_rows):
                    rows += int(lengths[hi])
                    hi += 1
                mat, off = self.gather(starts[lo:hi], lengths[lo:hi])
                new_starts[lo:hi] = new.append([mat]) + off[:-1]
                lo = hi
        except BaseException:  # a full disk, say: the new file is nobody's
            new.close()
            target.unlink(missing_ok=True)
            raise
        return new, new_starts

    def close(self) -> None:
        """Release the map and the file handle."""
        self._map = None
        if self._f is not None and not self._f.closed:
            self._f.close()


class MemoryVectors(VectorFile):
    """The rows of a store without a folder: the same interface as :class:`VectorFile`, kept in
    one growing float32 array (nothing is written anywhere).

    >>> mv = MemoryVectors()
    >>> mv.append([np.ones((2, 128)), np.zeros((1, 128))]).tolist(), mv.n_rows, mv.read(2, 1).sum()
    ([0, 2], 3, np.float32(0.0))
    """

    def __init__(self) -> None:  # no file: nothing of VectorFile.__init__ applies
        self.path = None  # type: ignore[assignment]
        self.dtype = np.dtype(np.float32)
        self.n_rows = 0
        self.writable = True
        self._buf = np.zeros((0, DIM), np.float32)

    def append(self, vectors: Sequence[np.ndarray]) -> np.ndarray:
        """Copy ``vectors`` after the rows held (the array doubles when full); each one's start."""
        lengths = np.fromiter((len(v) for v in vectors), dtype=np.int64, count=len(vectors))
        starts = self.n_rows + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        end = self.n_rows + int(lengths.sum())
        if end > len(self._buf):  # readers of the old array keep it: rows are never moved in place
            grown = np.empty((max(end, 2 * len(self._buf), 1024), DIM), np.float32)
            grown[: self.n_rows] = self._buf[: self.n_rows]
            self._buf = grown
        for start, v in zip(starts.tolist(), vectors, strict=True):
            self._buf[start:start + len(v)] = v
        self.n_rows = end
        return starts

    def _mapped(self) -> np.ndarray:
        return self._buf[: self.n_rows]

    def private_map(self) -> np.ndarray:
        """A copy of the rows (an engine may write into what it is given)."""
        return self._buf[: self.n_rows].copy()

    def rewrite(self, folder: str | os.PathLike | None, generation: int, starts: np.ndarray,
                lengths: np.ndarray, chunk_rows: int = 1 << 20) -> tuple[VectorFile, np.ndarray]:
        """The given documents copied into a new :class:`MemoryVectors` (``folder`` unused)."""
        new = MemoryVectors()
        if len(lengths):
            mat, off = self.gather(starts, lengths)
            new.append([mat])
            return new, off[:-1].copy()
        return new, np.zeros(0, np.int64)

    def close(self) -> None:
        """Nothing to release (the rows go with the object)."""
