"""Original vectors in one memory-mapped, append-only file: exact rerank without a database read.

A :class:`VectorFile` is a flat file of ``(rows, 128)`` float16 or float32 rows, or of coded rows
(:mod:`uibk_embedding.quantize`: ``dtype="int8"``, ``vectors-000001.i8``, one 132-byte
:data:`~uibk_embedding.quantize.QROW` record a row; ``"int4"``, ``"int3"``, ``"int2"``,
``.i4``/``.i3``/``.i2``, the rotated codes' 68/52/36-byte records), quantised on append, read
back decoded as float32. A coded file may keep *originals* beside it (``originals="float16"``):
a float16 file of the same generation (``vectors-000001.f16``) with the same rows at the same
positions, appended, cut, rewritten and removed with it; the scan reads the codes, only the
final rerank (and ``get``) reads originals.
Documents are
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
from uibk_embedding.quantize import CODES, code_dtype, dequantize, is_quantized, quantize

DIM = 128
_SUFFIX = {"float16": "f16", "float32": "f32", "int8": "i8", "int4": "i4", "int3": "i3", "int2": "i2"}
_NAME = re.compile(r"^vectors-(\d{6})\.(f16|f32|i8|i4|i3|i2)$")
ORIGINALS = (None, "float16")
"""What a coded file may keep beside it: nothing, or float16 originals."""


def file_name(generation: int, dtype: str) -> str:
    """``vectors-000001.f16``: the file of one generation."""
    return f"vectors-{generation:06d}.{_SUFFIX[dtype]}"


def row_dtype(kind: str) -> np.dtype:
    """The numpy dtype of one element of a ``kind`` file: float16, float32, or a coded row's
    record (:func:`~uibk_embedding.quantize.code_dtype`: one element a row)."""
    if kind not in _SUFFIX:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, _SUFFIX))}, got {kind!r}")
    return code_dtype(kind) if kind in CODES else np.dtype(kind)


def _check_originals(kind: str, originals: str | None) -> None:
    row_dtype(kind)
    if originals not in ORIGINALS or (originals is not None and kind not in CODES):
        raise ValueError(f"originals={originals!r}: only a coded file ({', '.join(CODES)}) keeps "
                         "originals, as 'float16'")


def remove_other_generations(folder: str | os.PathLike, keep: str | Sequence[str]) -> None:
    """Delete every vector file in ``folder`` except ``keep`` (a name, or the names of one
    generation: :meth:`VectorFile.file_names`), after the owner switched to it."""
    folder = Path(folder)
    kept = {keep} if isinstance(keep, str) else set(keep)
    removed = False
    for p in folder.iterdir():
        if _NAME.match(p.name) and p.name not in kept:
            p.unlink(missing_ok=True)
            removed = True
    if removed:
        fsync_dir(folder)


class VectorFile:
    """Append-only rows of original vectors, read through a memory map.

    Not thread-safe by itself: the owning store serialises writes (and reads that may run while
    a write grows the file) with its own lock.
    """

    originals: VectorFile | None = None
    """The float16 originals kept beside a coded file (same rows, same positions), or None."""

    def __init__(self, path: Path, dtype: str, n_rows: int, writable: bool = True) -> None:
        self.path = path
        self.kind = dtype
        self.dtype = row_dtype(dtype)
        self.n_rows = n_rows
        self.writable = writable
        self._map: np.ndarray | None = None
        # kept open for appends (and for the map: a file unlinked by a writer's compaction stays
        # readable through it); close() closes it
        self._f = open(path, "r+b" if writable else "rb")

    @classmethod
    def open_shared(cls, folder: str | os.PathLike, *, generation: int, dtype: str, rows: int,
                    originals: str | None = None) -> VectorFile:
        """Open generation ``generation`` in ``folder`` for reading its first ``rows`` rows (a
        reader's snapshot): nothing is created, cut or removed, whatever else the file holds (a
        writer may be appending). :class:`FileNotFoundError` when a writer's compaction removed
        it since the snapshot named it (read the snapshot again). ``originals``: the kind of the
        originals file kept beside a coded file (opened the same way)."""
        _check_originals(dtype, originals)
        path = Path(folder) / file_name(generation, dtype)
        if rows == 0 and not path.exists():  # a store no writer has opened since it lost the file
            vf = cls.__new__(cls)
            vf.path, vf.kind, vf.dtype, vf.n_rows, vf.writable = path, dtype, row_dtype(dtype), 0, False
            vf._map, vf._f = None, None
        else:
            vf = cls(path, dtype, rows, writable=False)
            size = os.fstat(vf._f.fileno()).st_size
            if size < rows * vf.row_bytes:
                vf.close()
                raise ValueError(f"{path} holds {size // vf.row_bytes} rows, {rows} are referenced: "
                                 "the file was truncated outside this library")
        if originals is not None:
            try:
                vf.originals = cls.open_shared(folder, generation=generation, dtype=originals, rows=rows)
            except BaseException:
                vf.close()
                raise
        return vf

    @classmethod
    def open(cls, folder: str | os.PathLike, *, generation: int, dtype: str,
             committed_rows: int, originals: str | None = None) -> VectorFile:
        """Open (or create) generation ``generation`` in ``folder``, keeping its first
        ``committed_rows`` rows (the rows the owner's references reach) and cutting off the rest;
        ``originals``: the kind of the originals file kept beside a coded file (the same)."""
        _check_originals(dtype, originals)
        vf = cls._open_one(Path(folder), generation, dtype, committed_rows)
        if originals is not None:
            try:
                vf.originals = cls._open_one(Path(folder), generation, originals, committed_rows)
            except BaseException:
                vf.close()
                raise
        return vf

    @classmethod
    def _open_one(cls, folder: Path, generation: int, dtype: str, committed_rows: int) -> VectorFile:
        path = folder / file_name(generation, dtype)
        row_bytes = cls._row_bytes_of(dtype)
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

    @staticmethod
    def _row_bytes_of(kind: str) -> int:
        dt = row_dtype(kind)
        return dt.itemsize if is_quantized(np.empty(0, dt)) else DIM * dt.itemsize

    def append(self, vectors: Sequence[np.ndarray],
               originals: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """Write ``vectors`` at the end of the file, durably; returns each one's start row. A
        coded file quantises float rows (records of its code are written as they are); its originals
        file gets the float rows (or ``originals``, when ``vectors`` are records), durably too."""
        if not self.writable:
            raise PermissionError(f"{self.path} was opened for reading (a reader's snapshot)")
        if len(vectors) == 0:
            return np.zeros(0, dtype=np.int64)
        lengths = np.fromiter((len(v) for v in vectors), dtype=np.int64, count=len(vectors))
        starts = self.n_rows + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        if self.kind in CODES:
            raw = [np.asarray(v) for v in vectors]
            if all(v.dtype == self.dtype for v in raw):
                block = np.concatenate(raw)
                floats = None if originals is None else np.concatenate(
                    [np.asarray(v, dtype=np.float32) for v in originals])
            else:
                floats = np.concatenate([np.asarray(v, dtype=np.float32) for v in raw])
                if floats.ndim != 2 or floats.shape[1] != DIM:
                    raise ValueError(f"vectors must have {DIM} columns, got shape {floats.shape}")
                block = quantize(floats, self.kind)
            if self.originals is not None and (floats is None or len(floats) != len(block)):
                raise ValueError("a coded file with originals needs the original rows of what it appends")
        else:
            block = np.concatenate([np.asarray(v, dtype=self.dtype) for v in vectors])
            if block.ndim != 2 or block.shape[1] != DIM:
                raise ValueError(f"vectors must have {DIM} columns, got shape {block.shape}")
        if self.originals is not None:  # the originals first: the codes' rows never outrun them
            self.originals.append([floats])
        self._f.seek(self.n_rows * self.row_bytes)
        self._f.write(np.ascontiguousarray(block).tobytes())
        self._f.flush()
        os.fsync(self._f.fileno())
        self.n_rows += len(block)
        return starts

    def grow_to(self, rows: int) -> None:
        """A reader's snapshot of the same file now reaches ``rows`` rows (mapped again on the
        next read); its originals too."""
        self.n_rows = rows
        if self.originals is not None:
            self.originals.n_rows = rows

    def file_names(self) -> list[str]:
        """The names of this generation's files: the vector file and its originals, if any."""
        return [self.path.name] + ([self.originals.path.name] if self.originals is not None else [])

    def _mapped(self) -> np.ndarray:
        """The first ``n_rows`` rows, memory-mapped read-only through the open file (so N
        processes reading one file share its pages in the page cache, and a file a writer
        unlinked meanwhile stays readable); mapped again when the rows grew."""
        if self._map is None or len(self._map) < self.n_rows:
            self._map = (np.memmap(self._f, dtype=self.dtype, mode="r", shape=self._shape(self.n_rows))
                         if self.n_rows else np.zeros(self._shape(0), self.dtype))
        return self._map[: self.n_rows]

    def _shape(self, n: int) -> tuple[int, ...]:
        return (n,) if self.kind in CODES else (n, DIM)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row in the file (132 for an int8 row, 68 for int4, its originals not
        counted)."""
        return self._row_bytes_of(self.kind)

    def private_map(self) -> np.ndarray:
        """The committed rows as a copy-on-write memory map: pages are read from the file when
        touched (and can be dropped again by the kernel); a write into the array changes
        private pages, never the file. For engines that take their input as arrays."""
        if not self.n_rows:
            return np.zeros(self._shape(0), self.dtype)
        return np.memmap(self._f, dtype=self.dtype, mode="c", shape=self._shape(self.n_rows))

    def read(self, start: int, n_rows: int) -> np.ndarray:
        """One document's rows as float32 (a copy): its originals where the file keeps them,
        else its rows (coded rows decoded)."""
        if self.originals is not None:
            return self.originals.read(start, n_rows)
        rows = self._mapped()[start:start + n_rows]
        return dequantize(rows) if self.kind in CODES else np.array(rows, dtype=np.float32)

    def gather(self, starts: np.ndarray, lengths: np.ndarray,
               dtype: type | np.dtype | None = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """The rows of several documents packed as ``(matrix, offsets)`` in the order given;
        the matrix as ``dtype`` (float32 by default; ``None`` or the file's own dtype
        :attr:`dtype`: the rows as stored, no conversion; coded rows as float are decoded)."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        want = self.dtype if dtype is None else np.dtype(dtype)
        if len(lengths) == 0:
            return np.zeros(self._shape(0) if want == self.dtype else (0, DIM), want), offsets
        # row index of every output row: its document's start plus its position in the document
        rows = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        got = self._mapped()[rows]
        if want == self.dtype:
            return got, offsets
        return (dequantize(got, want) if self.kind in CODES else got.astype(want, copy=False)), offsets

    def rewrite(self, folder: str | os.PathLike, generation: int, starts: np.ndarray,
                lengths: np.ndarray, chunk_rows: int = 1 << 20) -> tuple[VectorFile, np.ndarray]:
        """Copy the given documents into a fresh file of ``generation`` (durable before return);
        returns it and each document's new start. The owner then switches its references."""
        folder = Path(folder)
        orig = self.originals.kind if self.originals is not None else None
        targets = [folder / file_name(generation, k) for k in (self.kind, orig) if k is not None]
        for target in targets:
            target.unlink(missing_ok=True)
        new = VectorFile.open(folder, generation=generation, dtype=self.kind, committed_rows=0,
                              originals=orig)
        new_starts = np.zeros(len(lengths), dtype=np.int64)
        lo = 0
        try:
            while lo < len(lengths):  # bounded memory: copy about chunk_rows rows at a time
                hi, rows = lo, 0
                while hi < len(lengths) and (hi == lo or rows + lengths[hi] <= chunk_rows):
                    rows += int(lengths[hi])
                    hi += 1
                mat, off = self.gather(starts[lo:hi], lengths[lo:hi], None)  # as stored: no re-rounding
                kept = None if self.originals is None else [
                    self.originals.gather(starts[lo:hi], lengths[lo:hi], None)[0]]
                added = new.append([mat]) if kept is None else new.append([mat], kept)
                new_starts[lo:hi] = added + off[:-1]
                lo = hi
        except BaseException:  # a full disk, say: the new file is nobody's
            new.close()
            for target in targets:
                target.unlink(missing_ok=True)
            raise
        return new, new_starts

    def close(self) -> None:
        """Release the map and the file handle (and the originals')."""
        self._map = None
        if self._f is not None and not self._f.closed:
            self._f.close()
        if self.originals is not None:
            self.originals.close()


class MemoryVectors(VectorFile):
    """The rows of a store without a folder: the same interface as :class:`VectorFile`, kept in
    one growing float32 array (nothing is written anywhere).

    >>> mv = MemoryVectors()
    >>> mv.append([np.ones((2, 128)), np.zeros((1, 128))]).tolist(), mv.n_rows, mv.read(2, 1).sum()
    ([0, 2], 3, np.float32(0.0))
    """

    def __init__(self) -> None:  # no file: nothing of VectorFile.__init__ applies
        self.path = None  # type: ignore[assignment]
        self.kind = "float32"
        self.dtype = np.dtype(np.float32)
        self.n_rows = 0
        self.writable = True
        self._buf = np.zeros((0, DIM), np.float32)

    def append(self, vectors: Sequence[np.ndarray],
               originals: Sequence[np.ndarray] | None = None) -> np.ndarray:
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
