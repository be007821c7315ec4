"""The exact in-memory store: brute-force MaxSim, the ground truth of the conformance suite.

Documents live in one packed float32 matrix (see :mod:`uibk_embedding.maxsim`). Readers work
on an immutable snapshot, so searches never block on, or see half of, a concurrent write.

Persistence (``path=``): every acknowledged ``upsert``/``delete`` is one operation file in
``path/ops/`` written to a temporary name, flushed with ``fsync`` and renamed into place, so a
process killed mid-write leaves either the whole batch or nothing. Opening replays the
newest snapshot and the operations after it; ``compact()`` folds them into a new snapshot.
Files are ``.npz`` (no pickle) plus JSON. The folder is locked (``store.lock``, an ``flock``)
while a store object has it open: a second object or process gets :class:`StoreInUse`. A folder
that holds other files and no store is refused, never written into.

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
>>> ExactStore(path=d).count()
1
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

from uibk_embedding._durable import atomic_savez, atomic_write_text, durable_mkdir
from uibk_embedding._sqlite_state import lock_folder
from uibk_embedding.adapters.base import Hit, MultiVectorStore, Record, settle_format
from uibk_embedding.adapters.filters import OPERATORS, Node, matches
from uibk_embedding.errors import CollectionMismatch, StoreInUse
from uibk_embedding.maxsim import DEFAULT_CHUNK_BYTES, maxsim_scores, top_k
from uibk_embedding.tagged import DIM, TaggedFormat

_OP = re.compile(r"^(\d{12})\.npz$")
LOCK_NAME = "store.lock"
CONFIG_NAME = "store.json"
_SNAP = re.compile(r"^snapshot-(\d{12})\.npz$")


@dataclass(frozen=True)
class _State:
    """Immutable view: rows ``buf[:n_rows]``; doc ``i`` owns rows ``offsets[i]:offsets[i+1]``."""

    buf: np.ndarray
    n_rows: int
    offsets: np.ndarray  # (n_slots + 1,)
    alive: np.ndarray  # (n_slots,) bool
    ids: tuple[str, ...]
    metadata: tuple[dict, ...]
    index: dict[str, int]  # id -> slot of its live copy

    @property
    def n_docs(self) -> int:
        return len(self.index)


def _empty_state() -> _State:
    return _State(np.zeros((0, DIM), np.float32), 0, np.zeros(1, np.int64),
                  np.zeros(0, bool), (), (), {})


def _encode_docs(ids: Sequence[str], vectors: Sequence[np.ndarray], metadata: Sequence[dict]):
    lengths = np.array([len(v) for v in vectors], dtype=np.int64)
    mat = np.concatenate(vectors).astype(np.float32) if len(vectors) else np.zeros((0, DIM), np.float32)
    return {
        "ids": np.array(json.dumps(list(ids), ensure_ascii=False)),
        "metadata": np.array(json.dumps(list(metadata), ensure_ascii=False)),
        "lengths": lengths,
        "vectors": mat,
    }


def _decode_docs(z) -> tuple[list[str], list[np.ndarray], list[dict]]:
    ids = json.loads(str(z["ids"]))
    md = json.loads(str(z["metadata"]))
    lengths = z["lengths"]
    mat = z["vectors"]
    splits = np.split(mat, np.cumsum(lengths)[:-1]) if len(lengths) else []
    return ids, list(splits), md


class ExactStore(MultiVectorStore):
    """Exact MaxSim over all stored documents, in memory, optionally persisted to ``path``.

    Parameters
    ----------
    path: directory to persist to (created when missing; reopened when it holds a store).
    format: the tagged format (saved with the store; used for decompositions).
    max_chunk_bytes: memory bound of one scoring chunk.
    compact_every: fold the operation log into a snapshot after this many operations.
    """

    backend = "exact"
    filter_operators = frozenset(OPERATORS)  # filters run in Python: filters.matches
    exact = True

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        format: TaggedFormat | None = None,
        *,
        max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        compact_every: int = 200,
    ) -> None:
        super().__init__(format)
        self._lock = threading.Lock()
        self._state = _empty_state()
        self.max_chunk_bytes = max_chunk_bytes
        self.compact_every = compact_every
        self.path = Path(path) if path is not None else None
        self._seq = 0
        self._snap_seq = 0
        self._lockfile = None
        self._closed = False
        self._compact_at = compact_every  # operations since the snapshot that trigger a compaction
        if self.path is not None:
            self._open(format)

    # -- persistence -------------------------------------------------------------------------
    def _open(self, format: TaggedFormat | None) -> None:
        assert self.path is not None
        durable_mkdir(self.path)
        cfg = self.path / CONFIG_NAME
        if not cfg.exists():
            # what a store leaves before its config is durable: the lock, an empty ops/, temp files
            other = sorted(p.name for p in self.path.iterdir()
                           if p.name not in (LOCK_NAME, "ops") and not p.name.startswith(".tmp-"))
            if other or any((self.path / "ops").glob("*.npz")):
                raise CollectionMismatch(
                    f"{self.path} is not an exact store (no {CONFIG_NAME}) and is not empty "
                    f"(it holds {other[:5] or ['ops/*.npz']}): give an empty or new folder")
        self._lockfile = lock_folder(self.path / LOCK_NAME, f"the exact store at {self.path}", "ExactStore")
        try:
            self._load(cfg, format)
        except BaseException:
            self.close()
            raise

    def _load(self, cfg: Path, format: TaggedFormat | None) -> None:
        assert self.path is not None
        if cfg.exists():
            try:
                saved = TaggedFormat.from_stored(json.loads(cfg.read_text())["format"])
            except (ValueError, KeyError, TypeError) as e:
                raise CollectionMismatch(f"{cfg} is not a readable exact-store configuration ({e})") from None
            self.format = settle_format(saved, format, f"store at {self.path}")
        else:
            atomic_write_text(cfg, json.dumps({"backend": "exact", "version": 1,
                                               "format": self.format.to_stored()}))
        durable_mkdir(self.path / "ops")
        snaps = sorted(int(m.group(1)) for p in self.path.iterdir() if (m := _SNAP.match(p.name)))
        if snaps:
            self._snap_seq = snaps[-1]
            with np.load(self.path / f"snapshot-{snaps[-1]:012d}.npz", allow_pickle=False) as z:
                ids, vecs, md = _decode_docs(z)
            self._apply_upsert(ids, vecs, md)
        ops = sorted(int(m.group(1)) for p in (self.path / "ops").iterdir()
                     if (m := _OP.match(p.name)))
        self._seq = max([self._snap_seq, *ops])
        for seq in ops:
            if seq <= self._snap_seq:
                continue
            with np.load(self.path / "ops" / f"{seq:012d}.npz", allow_pickle=False) as z:
                if str(z["op"]) == "delete":
                    self._apply_delete(json.loads(str(z["ids"])))
                else:
                    self._apply_upsert(*_decode_docs(z))
        self._cleanup_tmp()

    def _cleanup_tmp(self) -> None:
        assert self.path is not None
        for p in [*self.path.iterdir(), *(self.path / "ops").iterdir()]:
            if p.name.startswith(".tmp-"):
                p.unlink(missing_ok=True)

    def _log(self, op: str, **arrays: np.ndarray) -> None:
        """Write-ahead: make the operation durable before it is applied in memory."""
        if self.path is None:
            return
        if self._closed:
            raise StoreInUse(f"this ExactStore ({self.path}) is closed")
        self._seq += 1
        atomic_savez(self.path / "ops" / f"{self._seq:012d}.npz", op=np.array(op), **arrays)

    def _maybe_compact(self) -> None:
        """Fold the log into a snapshot once it is long; call only AFTER the logged operations
        are applied to ``self._state``, since the snapshot replaces their files."""
        if self.path is not None and self._seq - self._snap_seq >= self._compact_at:
            try:
                self._compact_locked()
            except OSError as e:  # the operation is durable in its log file: it stays acknowledged
                self._compact_at = self._seq - self._snap_seq + self.compact_every
                warnings.warn(f"exact store at {self.path}: compaction failed ({e}); the operation "
                              "log keeps every write, compaction is tried again later", stacklevel=4)

    def compact(self) -> None:
        """Write the whole store as one snapshot and drop the operations it contains."""
        with self._lock:
            self._compact_locked()
            self._state = self._packed(self._state)

    def _compact_locked(self) -> None:
        """Snapshot ``self._state`` as of ``self._seq``; every operation up to ``self._seq`` must
        already be applied to it, since their files are deleted once the snapshot is durable."""
        if self.path is None:
            return
        if self._closed:
            raise StoreInUse(f"this ExactStore ({self.path}) is closed")
        st = self._state
        live = sorted(st.index.values())
        vecs = [st.buf[st.offsets[i]:st.offsets[i + 1]] for i in live]
        arrays = _encode_docs([st.ids[i] for i in live], vecs, [st.metadata[i] for i in live])
        atomic_savez(self.path / f"snapshot-{self._seq:012d}.npz", **arrays)
        old_snap = self._snap_seq
        self._snap_seq = self._seq
        self._compact_at = self.compact_every
        for p in (self.path / "ops").iterdir():
            m = _OP.match(p.name)
            if m and int(m.group(1)) <= self._seq:
                p.unlink(missing_ok=True)
        if old_snap and old_snap != self._seq:
            (self.path / f"snapshot-{old_snap:012d}.npz").unlink(missing_ok=True)

    # -- state transitions (caller holds the lock, or is the constructor) ----------------
    def _apply_upsert(self, ids: list[str], vecs: list[np.ndarray], md: list[dict]) -> None:
        st = self._state
        new_rows = sum(len(v) for v in vecs)
        buf = st.buf
        if st.n_rows + new_rows > len(buf):
            cap = max(st.n_rows + new_rows, 2 * len(buf), 1024)
            buf = np.empty((cap, DIM), np.float32)
            buf[: st.n_rows] = st.buf[: st.n_rows]
        pos = st.n_rows
        lengths = []
        for v in vecs:  # rows past st.n_rows are invisible to readers of the old state
            buf[pos: pos + len(v)] = v
            pos += len(v)
            lengths.append(len(v))
        offsets = np.concatenate([st.offsets, st.offsets[-1] + np.cumsum(lengths)])
        alive = np.concatenate([st.alive, np.ones(len(ids), bool)])
        index = dict(st.index)
        for i in (index.pop(x) for x in ids if x in index):
            alive[i] = False
        base = len(st.ids)
        index.update((x, base + j) for j, x in enumerate(ids))
        new = _State(buf, pos, offsets, alive, st.ids + tuple(ids),
                     st.metadata + tuple(md), index)
        self._state = self._maybe_pack(new)

    def _apply_delete(self, ids: list[str]) -> None:
        st = self._state
        present = [x for x in ids if x in st.index]
        if not present:
            return
        alive = st.alive.copy()
        index = dict(st.index)
        for x in present:
            alive[index.pop(x)] = False
        self._state = self._maybe_pack(_State(st.buf, st.n_rows, st.offsets, alive, st.ids,
                                              st.metadata, index))

    def _maybe_pack(self, st: _State) -> _State:
        dead = len(st.alive) - st.n_docs
        return self._packed(st) if dead > 64 and dead > 0.3 * len(st.alive) else st

    @staticmethod
    def _packed(st: _State) -> _State:
        live = np.flatnonzero(st.alive)
        lengths = np.diff(st.offsets)[live]
        rows = np.concatenate([np.arange(st.offsets[i], st.offsets[i + 1]) for i in live]) \
            if len(live) else np.zeros(0, np.int64)
        buf = st.buf[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = tuple(st.ids[i] for i in live)
        md = tuple(st.metadata[i] for i in live)
        return _State(buf, len(buf), offsets, np.ones(len(live), bool), ids, md,
                      {x: j for j, x in enumerate(ids)})

    # -- the interface -------------------------------------------------------------------
    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        with self._lock:
            self._log("upsert", **_encode_docs(ids, vectors, metadata))
            self._apply_upsert(ids, [v.copy() for v in vectors], metadata)
            self._maybe_compact()

    def _delete(self, ids: list[str]) -> None:
        with self._lock:
            if not any(x in self._state.index for x in ids):
                return
            self._log("delete", ids=np.array(json.dumps(ids, ensure_ascii=False)))
            self._apply_delete(ids)
            self._maybe_compact()

    def _delete_where(self, conditions: tuple[Node, ...]) -> int:
        with self._lock:  # one logged operation: the whole filtered delete or none of it
            st = self._state
            ids = [st.ids[i] for i in sorted(st.index.values()) if matches(st.metadata[i], conditions)]
            if ids:
                self._log("delete", ids=np.array(json.dumps(ids, ensure_ascii=False)))
                self._apply_delete(ids)
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
                out.append(Record(x, st.buf[st.offsets[i]:st.offsets[i + 1]].copy(),
                                  json.loads(json.dumps(st.metadata[i]))))
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
        st = self._state  # one consistent snapshot for the whole call
        if st.n_docs == 0:
            return [[] for _ in queries]
        ok = self._candidates(st, conditions)
        scores = maxsim_scores(queries, st.buf[: st.n_rows], st.offsets,
                               max_chunk_bytes=self.max_chunk_bytes)
        scores[:, ~ok] = -np.inf
        out = []
        for row in scores:
            idx = top_k(row, k)
            out.append([Hit(st.ids[i], float(row[i]), json.loads(json.dumps(st.metadata[i])))
                        for i in idx])
        return out

    def scores(self, query: np.ndarray, *, dtype: type = np.float32) -> dict[str, float]:
        """MaxSim of ``query`` against every stored document (for tests and evaluation)."""
        st = self._state
        s = maxsim_scores([np.asarray(query)], st.buf[: st.n_rows], st.offsets, dtype=dtype)[0]
        return {st.ids[i]: float(s[i]) for i in sorted(st.index.values())}

    def ids(self) -> list[str]:
        """All stored ids, in insertion order of their live copies."""
        st = self._state
        return [st.ids[i] for i in sorted(st.index.values())]

    def close(self) -> None:
        """Release the folder lock (a persisted store); later writes raise :class:`StoreInUse`."""
        if self.path is not None:
            self._closed = True
        if self._lockfile is not None:
            self._lockfile.close()
            self._lockfile = None
