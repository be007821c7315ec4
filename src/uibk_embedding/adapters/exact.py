"""The exact store: brute-force MaxSim, the ground truth of the conformance suite.

In memory (no ``path``), documents live in one packed float32 matrix (see
:mod:`uibk_embedding.maxsim`). Persisted (``path=``), the rows live in one append-only vector
file (:mod:`uibk_embedding.vectorfile`; float32 by default, ``vector_dtype="float16"`` for
half the bytes at a slower search), read through a memory map and scored block by block: the
store's RAM is its ids and metadata plus one scoring block, whatever the number of documents,
and opening it reads no vectors. Readers work on an immutable view, so searches never block
on, or see half of, a concurrent write.

Persistence: every acknowledged ``upsert`` first appends its rows to the vector file (``fsync``),
then writes one operation file in ``path/ops/`` (ids, metadata, where the rows start; a temporary
name, ``fsync``, rename), so a process killed mid-write leaves either the whole batch or nothing
(rows no operation references are cut off on open). ``delete`` is one operation file. Opening
reads the newest snapshot (ids, metadata and row lengths of every document in the vector file,
dead ones marked) and the operations after it; ``compact()`` folds them into a new snapshot, and
once deleted or overwritten documents hold more than 30% of the rows it copies the live rows into
the next generation of the vector file first. Files are ``.npz`` (no pickle) plus JSON. Stores
written before 0.3.1 (vectors inside the ``.npz`` files) are converted on open, keeping float32.
The folder is locked (``store.lock``, an ``flock``) while a store object has it open: a second
object or process gets :class:`StoreInUse`. A folder is the store's only when it holds its
``store.json`` (or is empty, or holds only what a store killed while being created leaves): any
other folder is refused with :class:`CollectionMismatch` and nothing in it is created or deleted.
The store deletes only temporary files it wrote itself (``.tmp-uibk-*``; ``.tmp-PID-THREAD-*``
of 0.3 inside its own folder), never a user's ``.tmp-download.part``.

Example
-------
>>> import numpy as np, tempfile
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> mk = lambda n: fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))
>>> d = tempfile.mkdtemp()
>>> with ExactStore(path=d) as s:
...     s.upsert(["x", "y"], [mk(4), mk(6)], [{"n": 1}, {"n": 2}])
...     s.delete(["x"])
>>> again = ExactStore(path=d)
>>> again.count(), again.vector_dtype, again.get(["y"])[0].vectors.dtype
(1, 'float32', dtype('float32'))
>>> again.close()
"""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uibk_embedding._durable import TMP_PREFIX, atomic_savez, atomic_write_text, durable_mkdir
from uibk_embedding._sqlite_state import lock_folder
from uibk_embedding.adapters.base import (
    Hit,
    MultiVectorStore,
    Record,
    check_positive,
    check_record,
    read_record,
)
from uibk_embedding.adapters.filters import OPERATORS, Node, matches
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.maxsim import DEFAULT_CHUNK_BYTES, maxsim_scores, top_k
from uibk_embedding.tagged import DIM, Decomposition, TaggedFormat, decompose
from uibk_embedding.vectorfile import VectorFile, file_name, remove_other_generations

_OP = re.compile(r"^(\d{12})\.npz$")
# the temporary files this store writes: .tmp-uibk-PID-THREAD-NAME (before 0.4: .tmp-PID-THREAD-NAME)
_OWN_TMP = re.compile(rf"^(?:{re.escape(TMP_PREFIX)}|\.tmp-\d+-\d+-)")
LOCK_NAME = "store.lock"
CONFIG_NAME = "store.json"
_SNAP = re.compile(r"^snapshot-(\d{12})\.npz$")
DEFAULT_VECTOR_DTYPE = "float32"
"""What a new persisted store keeps its rows as (``vector_dtype=``; in memory: float32). Not
float16: converting float16 rows for the float32 product made a search 2-4x slower
(benchmarks/results/memory-log.md, measured at 30,000 documents)."""
REPACK_FRACTION = 0.3
"""Dead rows above this share of all rows (and more than 64 dead documents) are dropped: packed
in memory, or copied out of the vector file into its next generation at the next write."""


@dataclass(frozen=True)
class _State:
    """Immutable view: rows ``buf[:n_rows]``; slot ``i`` owns rows ``offsets[i]:offsets[i+1]``.

    ``buf`` is a float32 array in memory, or the memory map of the vector file (persisted
    stores): rows beyond ``n_rows`` are invisible to the readers of this view."""

    buf: np.ndarray
    n_rows: int
    offsets: np.ndarray  # (n_slots + 1,)
    alive: np.ndarray  # (n_slots,) bool
    ids: tuple[str | None, ...]
    metadata: tuple[dict | None, ...]
    index: dict[str, int]  # id -> slot of its live copy

    @property
    def n_docs(self) -> int:
        return len(self.index)

    def rows(self, i: int) -> np.ndarray:
        """The rows of slot ``i`` as a float32 copy."""
        return np.array(self.buf[self.offsets[i]:self.offsets[i + 1]], dtype=np.float32)

    @property
    def dead_rows(self) -> int:
        return self.n_rows - int(np.diff(self.offsets)[self.alive].sum()) if len(self.alive) else 0


def _empty_state(buf: np.ndarray | None = None) -> _State:
    return _State(np.zeros((0, DIM), np.float32) if buf is None else buf, 0, np.zeros(1, np.int64),
                  np.zeros(0, bool), (), (), {})


def _extend(st: _State, buf: np.ndarray, start: int, ids: Sequence[str], lengths: Sequence[int],
            metadata: Sequence[dict]) -> _State:
    """``st`` plus the documents whose rows start at row ``start`` of ``buf`` (a gap before it,
    rows of a write that was never acknowledged, becomes one dead slot)."""
    if start < st.n_rows:
        raise CollectionMismatch(f"an operation's rows start at row {start}, inside the {st.n_rows} "
                                 "rows already referenced: the store's files are inconsistent")
    gap = start > st.n_rows
    ends = start + np.cumsum(np.asarray(lengths, dtype=np.int64))
    offsets = np.concatenate([st.offsets, [start] if gap else [], ends]).astype(np.int64)
    alive = np.concatenate([st.alive, [False] if gap else [], np.ones(len(ids), bool)]).astype(bool)
    index = dict(st.index)
    for i in (index.pop(x) for x in ids if x in index):
        alive[i] = False
    base = len(st.ids) + gap
    index.update((x, base + j) for j, x in enumerate(ids))
    pad: tuple[None, ...] = (None,) * gap
    return _State(buf, int(offsets[-1]), offsets, alive, st.ids + pad + tuple(ids),
                  st.metadata + pad + tuple(metadata), index)


def _without(st: _State, ids: Sequence[str]) -> _State:
    present = [x for x in ids if x in st.index]
    if not present:
        return st
    alive = st.alive.copy()
    index = dict(st.index)
    for x in present:
        alive[index.pop(x)] = False
    return _State(st.buf, st.n_rows, st.offsets, alive, st.ids, st.metadata, index)


def _packed(st: _State) -> _State:
    """Only the live slots, their rows copied into one float32 matrix (in-memory stores)."""
    live = np.flatnonzero(st.alive)
    lengths = np.diff(st.offsets)[live]
    rows = np.concatenate([np.arange(st.offsets[i], st.offsets[i + 1]) for i in live]) \
        if len(live) else np.zeros(0, np.int64)
    buf = np.asarray(st.buf[rows], dtype=np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = tuple(st.ids[i] for i in live)
    md = tuple(st.metadata[i] for i in live)
    return _State(buf, len(buf), offsets, np.ones(len(live), bool), ids, md,
                  {x: j for j, x in enumerate(ids) if x is not None})


def _json(value: object) -> np.ndarray:
    return np.array(json.dumps(value, ensure_ascii=False))


class ExactStore(MultiVectorStore):
    """Exact MaxSim over all stored documents, in memory, or persisted to ``path``.

    Parameters
    ----------
    path: directory to persist to (created when missing or empty; reopened when it holds a
        ``store.json``; any other folder is refused, untouched).
    format: the tagged format (saved with the store; used for decompositions).
    vector_dtype: how a persisted store keeps its rows: ``"float32"`` (the default for a new
        store: scores equal to the in-memory store's) or ``"float16"`` (half the disk and page
        cache, scores within float16 rounding, each search slower by the conversion of every
        row). ``None``: the saved value. In memory the rows are always float32.
    max_chunk_bytes: memory bound of one scoring chunk.
    compact_every: fold the operation log into a snapshot after this many operations.

    >>> s = ExactStore()
    >>> s.vector_dtype, s.count()
    ('float32', 0)
    """

    backend = "exact"
    filter_operators = frozenset(OPERATORS)  # filters run in Python: filters.matches
    exact = True

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        format: TaggedFormat | None = None,
        *,
        vector_dtype: str | None = None,
        max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        compact_every: int = 200,
    ) -> None:
        super().__init__(format)
        if vector_dtype not in (None, "float16", "float32"):
            raise ValueError(f"vector_dtype must be 'float16' or 'float32', got {vector_dtype!r}")
        if path is None and vector_dtype == "float16":
            raise ValueError("an in-memory ExactStore keeps float32 rows; vector_dtype='float16' "
                             "needs a path (the rows are then memory-mapped from a file)")
        check_positive("max_chunk_bytes", max_chunk_bytes)
        check_positive("compact_every", compact_every)
        self._lock = threading.Lock()
        self._state = _empty_state()
        self.max_chunk_bytes = max_chunk_bytes
        self.compact_every = compact_every
        self.path = Path(path) if path is not None else None
        self.vector_dtype = vector_dtype or ("float32" if path is None else DEFAULT_VECTOR_DTYPE)
        self._vf: VectorFile | None = None
        self._vgen = 1
        self._seq = 0
        self._snap_seq = 0
        self._lockfile = None
        self._closed = False
        self._compact_at = compact_every  # operations since the snapshot that trigger a compaction
        if self.path is not None:
            self._open(format, vector_dtype)

    # -- persistence -------------------------------------------------------------------------
    def _open(self, format: TaggedFormat | None, vector_dtype: str | None) -> None:
        assert self.path is not None
        cfg = self.path / CONFIG_NAME
        if self.path.exists() and not self.path.is_dir():
            raise CollectionMismatch(f"{self.path} is a file, not a folder: an exact store needs a folder")
        if not cfg.exists() and self.path.exists():
            foreign = _foreign_files(self.path)
            if foreign:
                raise CollectionMismatch(
                    f"{self.path} is not an exact store (no {CONFIG_NAME}) and is not empty (it holds "
                    f"{foreign[:5]}): give an empty or new folder; nothing in it was changed")
        durable_mkdir(self.path)
        self._lockfile = lock_folder(self.path / LOCK_NAME, f"the exact store at {self.path}", "ExactStore")
        try:
            self._load(cfg, format, vector_dtype)
        except BaseException:
            self.close()
            raise

    def _load(self, cfg: Path, format: TaggedFormat | None, vector_dtype: str | None) -> None:
        assert self.path is not None
        if cfg.exists():
            config = read_record(cfg.read_bytes())
            self.format = check_record(config, format, f"{self.path} (its {CONFIG_NAME})", key="backend",
                                       value="exact", schema_key="version", schema=(1, 2)) or self.format
            stored_dtype = config.get("vector_dtype", "float32")  # before 0.3.1: float32 in the .npz
            if vector_dtype not in (None, stored_dtype):
                raise CollectionMismatch(f"the exact store at {self.path} keeps {stored_dtype} rows; "
                                         f"vector_dtype={vector_dtype!r} cannot change that (leave it out)")
            self.vector_dtype = stored_dtype
        else:
            atomic_write_text(cfg, json.dumps({"backend": "exact", "version": 2,
                                               "format": self.format.to_stored(),
                                               "vector_dtype": self.vector_dtype}))
        durable_mkdir(self.path / "ops")
        snaps = sorted(int(m.group(1)) for p in self.path.iterdir() if (m := _SNAP.match(p.name)))
        ops = sorted(int(m.group(1)) for p in (self.path / "ops").iterdir()
                     if (m := _OP.match(p.name)))
        self._snap_seq = snaps[-1] if snaps else 0
        self._seq = max([self._snap_seq, *ops])
        records: list = []  # what the files say, in order, before any vector is touched
        committed, legacy = 0, False
        if snaps:
            with np.load(self.path / f"snapshot-{self._snap_seq:012d}.npz", allow_pickle=False) as z:
                if "vectors" in z:
                    legacy = True
                    records.append(("rows", *_legacy_docs(z)))
                else:
                    self._vgen = int(z["vector_gen"])
                    committed = int(z["vector_rows"])
                    records.append(("snapshot", json.loads(str(z["ids"])), json.loads(str(z["metadata"])),
                                    z["lengths"].astype(np.int64), z["alive"].astype(bool)))
        for seq in ops:
            if seq <= self._snap_seq:
                continue
            with np.load(self.path / "ops" / f"{seq:012d}.npz", allow_pickle=False) as z:
                if str(z["op"]) == "delete":
                    records.append(("delete", json.loads(str(z["ids"]))))
                elif "vectors" in z:
                    legacy = True
                    records.append(("rows", *_legacy_docs(z)))
                else:
                    start, lengths = int(z["start"]), z["lengths"].astype(np.int64)
                    committed = max(committed, start + int(lengths.sum()))
                    records.append(("append", json.loads(str(z["ids"])), json.loads(str(z["metadata"])),
                                    start, lengths))
        remove_other_generations(self.path, keep="" if legacy else self._file_name())
        if legacy:  # a store of 0.3.0 or older: everything in memory, then converted below
            self._replay_legacy(records)
        else:
            self._vf = VectorFile.open(self.path, generation=self._vgen, dtype=self.vector_dtype,
                                       committed_rows=committed)
            self._replay(records)
        self._cleanup_tmp()
        if legacy:
            self._compact_locked(repack=True)

    def _file_name(self) -> str:
        return file_name(self._vgen, self.vector_dtype)

    def _mapped(self) -> np.ndarray:
        assert self._vf is not None
        return self._vf._mapped()

    def _replay(self, records: list) -> None:
        st = _empty_state(self._mapped())
        for rec in records:
            if rec[0] == "snapshot":
                _, ids, md, lengths, alive = rec
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                index = {x: i for i, x in enumerate(ids) if alive[i]}
                st = _State(st.buf, int(offsets[-1]), offsets, alive, tuple(ids), tuple(md), index)
            elif rec[0] == "delete":
                st = _without(st, rec[1])
            else:
                _, ids, md, start, lengths = rec
                st = _extend(st, st.buf, start, ids, lengths, md)
        self._state = st

    def _replay_legacy(self, records: list) -> None:
        st = _empty_state()
        for rec in records:
            if rec[0] == "delete":
                st = _without(st, rec[1])
            else:
                _, ids, vecs, md = rec
                st = _append_in_memory(st, ids, vecs, md)
        self._state = st

    def _cleanup_tmp(self) -> None:
        """Delete the temporary files a killed write left (never acknowledged): only names this
        store writes (``.tmp-uibk-*``, and ``.tmp-PID-THREAD-*`` of 0.3), in a folder holding its
        ``store.json``; a user's ``.tmp-download.part`` stays."""
        assert self.path is not None
        for p in [*self.path.iterdir(), *(self.path / "ops").iterdir()]:
            if _OWN_TMP.match(p.name) and p.is_file():
                p.unlink(missing_ok=True)

    def _log(self, op: str, **arrays: np.ndarray) -> None:
        """Write-ahead: make the operation durable before it is applied in memory."""
        if self.path is None:
            return
        self._check_open()
        self._seq += 1
        atomic_savez(self.path / "ops" / f"{self._seq:012d}.npz", op=np.array(op), **arrays)

    def _maybe_compact(self) -> None:
        """Fold the log into a snapshot once it is long (or drop the dead rows once they are
        many); call only AFTER the logged operations are applied to ``self._state``, since the
        snapshot replaces their files."""
        if self.path is None:
            self._state = self._maybe_pack(self._state)
            return
        repack = self._wants_repack(self._state)
        if repack or self._seq - self._snap_seq >= self._compact_at:
            try:
                self._compact_locked(repack=repack)
            except OSError as e:  # the operation is durable in its log file: it stays acknowledged
                self._compact_at = self._seq - self._snap_seq + self.compact_every
                warnings.warn(f"exact store at {self.path}: compaction failed ({e}); the operation "
                              "log keeps every write, compaction is tried again later", stacklevel=4)

    @staticmethod
    def _wants_repack(st: _State) -> bool:
        dead = len(st.alive) - st.n_docs
        return dead > 64 and st.dead_rows > REPACK_FRACTION * st.n_rows

    def compact(self) -> None:
        """Write the whole store as one snapshot and drop the operations it contains, and the
        rows of deleted or overwritten documents (a persisted store copies its live rows into
        the next generation of its vector file; an in-memory one packs them)."""
        with self._lock:
            if self.path is None:
                self._state = _packed(self._state)
            else:  # no dead rows: the rows stay where they are (no copy of the whole file)
                assert self._vf is not None
                self._compact_locked(repack=self._state.dead_rows > 0 or self._vf.n_rows > self._state.n_rows)

    def _compact_locked(self, repack: bool = False) -> None:
        """Snapshot ``self._state`` as of ``self._seq``; every operation up to ``self._seq`` must
        already be applied to it, since their files are deleted once the snapshot is durable.
        ``repack``: first copy the live rows into the next generation of the vector file."""
        assert self.path is not None
        self._check_open()
        st, new_vf, gen = self._state, None, self._vgen
        try:
            if repack or self._vf is None:
                gen = self._vgen + 1 if self._vf is not None else 1  # None: converting a 0.3.0 store
                st, new_vf = self._rewritten(st, gen)
            atomic_savez(self.path / f"snapshot-{self._seq:012d}.npz",
                         ids=_json([x if st.alive[i] else None for i, x in enumerate(st.ids)]),
                         metadata=_json([m if st.alive[i] else None for i, m in enumerate(st.metadata)]),
                         lengths=np.diff(st.offsets), alive=st.alive, vector_gen=np.array(gen),
                         vector_rows=np.array(st.n_rows))
        except BaseException:
            if new_vf is not None:  # the old generation stays in use; the new file goes
                new_vf.close()
                new_vf.path.unlink(missing_ok=True)
            raise
        old_snap = self._snap_seq
        self._snap_seq = self._seq
        self._compact_at = self.compact_every
        if new_vf is not None:
            if self._vf is not None:
                self._vf.close()
            self._vf, self._vgen, self._state = new_vf, gen, st
        for p in (self.path / "ops").iterdir():
            m = _OP.match(p.name)
            if m and int(m.group(1)) <= self._seq:
                p.unlink(missing_ok=True)
        if old_snap and old_snap != self._seq:
            (self.path / f"snapshot-{old_snap:012d}.npz").unlink(missing_ok=True)
        if new_vf is not None:
            remove_other_generations(self.path, keep=self._file_name())

    def _rewritten(self, st: _State, gen: int, chunk_rows: int = 1 << 18) -> tuple[_State, VectorFile]:
        """The live slots of ``st`` copied into a fresh vector file of generation ``gen``
        (durable on return; bounded memory: about ``chunk_rows`` rows at a time)."""
        assert self.path is not None
        (self.path / file_name(gen, self.vector_dtype)).unlink(missing_ok=True)
        new = VectorFile.open(self.path, generation=gen, dtype=self.vector_dtype, committed_rows=0)
        live = np.flatnonzero(st.alive)
        lengths = np.diff(st.offsets)[live]
        lo = 0
        try:
            while lo < len(live):
                hi, rows = lo, 0
                while hi < len(live) and (hi == lo or rows + lengths[hi] <= chunk_rows):
                    rows += int(lengths[hi])
                    hi += 1
                new.append([st.buf[st.offsets[i]:st.offsets[i + 1]] for i in live[lo:hi]])
                lo = hi
        except BaseException:
            new.close()
            new.path.unlink(missing_ok=True)
            raise
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = tuple(st.ids[i] for i in live)
        md = tuple(st.metadata[i] for i in live)
        view = _State(new._mapped(), int(offsets[-1]), offsets, np.ones(len(live), bool), ids, md,
                      {x: j for j, x in enumerate(ids) if x is not None})
        return view, new

    # -- state transitions (caller holds the lock, or is the constructor) ----------------
    def _maybe_pack(self, st: _State) -> _State:
        return _packed(st) if self._wants_repack(st) else st

    # -- the interface -------------------------------------------------------------------
    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        with self._lock:
            if self.path is None:
                self._state = _append_in_memory(self._state, ids, vectors, metadata)
            else:
                self._check_open()
                assert self._vf is not None
                start = int(self._vf.n_rows)
                self._vf.append(vectors)  # durable BEFORE the operation that references the rows
                lengths = np.array([len(v) for v in vectors], dtype=np.int64)
                self._log("upsert", ids=_json(ids), metadata=_json(metadata), start=np.array(start),
                          lengths=lengths)
                self._state = _extend(self._state, self._mapped(), start, ids, lengths, metadata)
            self._maybe_compact()

    def _delete(self, ids: list[str]) -> None:
        with self._lock:
            if not any(x in self._state.index for x in ids):
                return
            self._log("delete", ids=_json(ids))
            self._state = _without(self._state, ids)
            self._maybe_compact()

    def _delete_where(self, conditions: tuple[Node, ...]) -> int:
        with self._lock:  # one logged operation: the whole filtered delete or none of it
            st = self._state
            ids = [st.ids[i] for i in sorted(st.index.values()) if matches(st.metadata[i], conditions)]
            if ids:
                self._log("delete", ids=_json(ids))
                self._state = _without(st, ids)
                self._maybe_compact()
            return len(ids)

    def _scan(self, conditions: tuple[Node, ...], batch_size: int):
        st = self._state  # one consistent snapshot for the whole scan
        page: list[tuple[str, dict]] = []
        for i in sorted(st.index.values()):
            if matches(st.metadata[i], conditions):
                page.append((st.ids[i], json.loads(json.dumps(st.metadata[i]))))
                if len(page) == batch_size:
                    yield page
                    page = []
        if page:
            yield page

    def count(self) -> int:
        return self._state.n_docs

    def _get(self, ids: list[str]) -> list[Record]:
        st = self._state
        out = []
        for x in ids:
            i = st.index.get(x)
            if i is not None:
                out.append(Record(x, st.rows(i), json.loads(json.dumps(st.metadata[i]))))
        return out

    def _candidates(self, st: _State, conditions: tuple[Node, ...]) -> np.ndarray:
        ok = st.alive.copy()
        if conditions:
            for i in np.flatnonzero(ok):
                ok[i] = matches(st.metadata[i], conditions)
        return ok

    def _search(self, query: np.ndarray, k: int, conditions: tuple[Node, ...]) -> list[Hit]:
        return self._search_batch([query], k, conditions)[0]

    def _search_batch(
        self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...]
    ) -> list[list[Hit]]:
        st, ranked = self._ranked(queries, k, conditions)
        return [[self._hit(st, i, row) for i in idx] for idx, row in ranked]

    def _search_explained(self, q: np.ndarray, k: int, conditions: tuple[Node, ...]) -> list[Hit]:
        """``_search`` with each hit's decomposition taken from the rows the search scored (the
        same view of the buffer or memory map: no second read through ``get``)."""
        st, ranked = self._ranked([q], k, conditions)
        idx, row = ranked[0]
        return [self._hit(st, i, row, decompose(q, st.buf[st.offsets[i]:st.offsets[i + 1]], self.format))
                for i in idx]

    def _ranked(self, queries: list[np.ndarray], k: int,
                conditions: tuple[Node, ...]) -> tuple[_State, list[tuple[np.ndarray, np.ndarray]]]:
        """One consistent view and, per query, the slots of its top ``k`` and its scores row."""
        st = self._state  # one consistent snapshot for the whole call
        if st.n_docs == 0:
            return st, [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in queries]
        ok = self._candidates(st, conditions)
        scores = maxsim_scores(queries, st.buf[: st.n_rows], st.offsets,
                               max_chunk_bytes=self.max_chunk_bytes)
        scores[:, ~ok] = -np.inf
        return st, [(top_k(row, k), row) for row in scores]

    @staticmethod
    def _hit(st: _State, i: int, row: np.ndarray, decomposition: Decomposition | None = None) -> Hit:
        return Hit(st.ids[i], float(row[i]), json.loads(json.dumps(st.metadata[i])), decomposition)

    def scores(self, query: np.ndarray, *, dtype: type = np.float32) -> dict[str, float]:
        """MaxSim of ``query`` against every stored document (for tests and evaluation)."""
        st = self._state
        s = maxsim_scores([np.asarray(query)], st.buf[: st.n_rows], st.offsets, dtype=dtype)[0]
        return {st.ids[i]: float(s[i]) for i in sorted(st.index.values())}

    def ids(self) -> list[str]:
        """All stored ids, in insertion order of their live copies."""
        st = self._state
        return [st.ids[i] for i in sorted(st.index.values())]

    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk (persisted stores): ``vectors`` (the vector file, dead rows included)
        and ``stored`` (every file of the store)."""
        if self.path is None:
            return {"vectors": 0, "stored": 0}
        with self._lock:
            vec = self._vf.path.stat().st_size if self._vf is not None else 0
            total = sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())
            return {"vectors": vec, "stored": total}

    def close(self) -> None:
        """Release the folder lock (a persisted store); later writes raise :class:`StoreInUse`."""
        if self.path is not None:
            self._closed = True
        if self._vf is not None:
            self._vf.close()
        if self._lockfile is not None:
            self._lockfile.close()
            self._lockfile = None


def _foreign_files(folder: Path) -> list[str]:
    """What a folder without ``store.json`` holds that this store did not leave there. Before its
    config is durable a store leaves only its (empty) lock and temporary config files
    (``.tmp-uibk-*``); anything else (a ``.tmp-download.part``, an ``ops/`` folder, a lock file
    with content) makes the folder someone else's."""
    out = []
    for p in sorted(folder.iterdir()):
        if p.name == LOCK_NAME and p.is_file() and p.stat().st_size == 0:
            continue
        if p.name.startswith(TMP_PREFIX) and p.name.endswith(f"-{CONFIG_NAME}") and p.is_file():
            continue
        out.append(p.name + ("/" if p.is_dir() else ""))
    return out


def _legacy_docs(z) -> tuple[list[str], list[np.ndarray], list[dict]]:
    """Ids, vectors and metadata of a snapshot or operation file of 0.3.0 (vectors inside)."""
    ids = json.loads(str(z["ids"]))
    md = json.loads(str(z["metadata"]))
    lengths = z["lengths"]
    mat = z["vectors"]
    splits = np.split(mat, np.cumsum(lengths)[:-1]) if len(lengths) else []
    return ids, list(splits), md


def _append_in_memory(st: _State, ids: Sequence[str], vecs: Sequence[np.ndarray],
                      md: Sequence[dict]) -> _State:
    """``st`` plus the documents, their rows copied into the (grown) float32 buffer."""
    new_rows = sum(len(v) for v in vecs)
    buf = st.buf
    if st.n_rows + new_rows > len(buf):
        cap = max(st.n_rows + new_rows, 2 * len(buf), 1024)
        buf = np.empty((cap, DIM), np.float32)
        buf[: st.n_rows] = st.buf[: st.n_rows]
    pos = st.n_rows
    for v in vecs:  # rows past st.n_rows are invisible to readers of the old state
        buf[pos: pos + len(v)] = v
        pos += len(v)
    return _extend(st, buf, st.n_rows, ids, [len(v) for v in vecs], md)
