"""The exact store: brute-force MaxSim, the ground truth of the conformance suite.

It is the file-backed store (:class:`~uibk_embedding.adapters.indexed.IndexedStore`, PLAID's and
WARP's) with no index: one folder format for every local store, one SQLite source of truth,
one append-only vector file, one crash matrix. Every search scores every document (filtered:
every allowed one) with the fused MaxSim kernel straight from the memory map of the vector file
(:meth:`~uibk_embedding.adapters.indexed.IndexedStore._scores`): the store's RAM is its ids and
metadata, opening it reads no vectors. In memory (no ``path``) the same tables live in SQLite
``:memory:`` and the rows in one float32 array; nothing is written anywhere.

Rows are float32 by default (scores equal to the in-memory store's); ``vector_dtype="float16"``
halves the disk and page cache, scores within float16 rounding. Profiles name what a persisted
store keeps (:data:`PROFILES`, ``profile=``; its rows' code is recorded with the store, kept on
reopen): ``"exact"`` (float32 rows), ``"float16"``, ``"compact"`` (rotated 4-bit rows only, 68
bytes a row, :mod:`uibk_embedding.quantize`: scores within the code's bound) and
``"exact-rerank"`` (rotated 2-bit rows scanned, 36 bytes a row, then the best ``rerank_depth``
documents rescored exactly from float16 originals kept in a file of their own, read only for
those documents; docs/compact.md); ``"int8"`` and ``"int8-rerank"`` the same with int8 rows (132
bytes; ``"int8"`` was called ``"compact"`` before the 4-bit code: such stores open as ``"int8"``).
Deleted or overwritten
documents' rows are dropped (the live rows copied into the next generation of the vector file)
once they exceed :data:`REPACK_FRACTION` of the file (and 1,024 rows), or by :meth:`ExactStore.compact`.

Folders written by 0.4 and older (``store.json``, an operation log in ``ops/``, ``snapshot-*.npz``
files; before 0.3.1 with the vectors inside the ``.npz`` files) are converted when opened, once:
the vector file stays where it is, the documents are written into ``store.sqlite``, and removing
``store.json`` is the switch, so a conversion killed at any point is redone on the next open and
nothing is lost (:func:`convert_op_log`). A folder holding anything else is refused, untouched.

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
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from uibk_embedding._durable import TMP_PREFIX, fsync_dir
from uibk_embedding._sqlite_state import WRITE_TIMEOUT, acquire_write_lock, connect, transaction
from uibk_embedding.adapters.base import check_positive, check_record, read_record
from uibk_embedding.adapters.indexed import DB_NAME, LOCK_NAME, IndexedStore
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.maxsim import DEFAULT_CHUNK_BYTES, maxsim_scores, top_k
from uibk_embedding.quantize import CODES
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.vectorfile import VectorFile, file_name

OLD_CONFIG_NAME = "store.json"
"""The record of a folder written by 0.4 or older (converted on open)."""
_OP = re.compile(r"^(\d{12})\.npz$")
_SNAP = re.compile(r"^snapshot-(\d{12})\.npz$")
# the temporary files 0.4 and older wrote: .tmp-uibk-PID-THREAD-NAME (0.3: .tmp-PID-THREAD-NAME)
_OLD_TMP = re.compile(rf"^(?:{re.escape(TMP_PREFIX)}|\.tmp-\d+-\d+-)")
DEFAULT_VECTOR_DTYPE = "float32"
"""What a new persisted store keeps its rows as (``vector_dtype=``; in memory: float32). Not
float16 by default: float16 scores differ from the in-memory store's by float16 rounding."""
REPACK_FRACTION = 0.3
"""Rows of deleted or overwritten documents above this share of the vector file are dropped at
the next write."""
PROFILES: dict[str, dict[str, str | None]] = {
    "exact": {"vector_dtype": "float32"},
    "float16": {"vector_dtype": "float16"},
    "compact": {"vector_dtype": "int4", "originals": None},
    "exact-rerank": {"vector_dtype": "int2", "originals": "float16"},
    "int8": {"vector_dtype": "int8", "originals": None},
    "int8-rerank": {"vector_dtype": "int8", "originals": "float16"},
}
"""What each profile keeps: the scanned rows (``vector_dtype``: float, or a code of
:mod:`uibk_embedding.quantize`) and, for coded rows, the ``originals`` kept beside them for the
final rerank (docs/compact.md)."""
VECTOR_DTYPES = ("float32", "float16", *CODES)
MIN_RERANK_DEPTH = 100
"""A rerank profile rescores at least this many documents (and at least ``4 * k``) when no
``rerank_depth`` is given."""


def profile_of(build: dict[str, Any]) -> str:
    """The profile name of a store's build parameters (its rows' code and originals; a
    ``profile`` recorded by 0.5's int8 stores is not read: their ``"compact"`` is ``"int8"`` now).

    >>> profile_of({"vector_dtype": "int8", "originals": "float16"}), profile_of({"vector_dtype": "float32"})
    ('int8-rerank', 'exact')
    >>> profile_of({"vector_dtype": "int8", "profile": "compact", "originals": None})
    'int8'
    """
    dtype, originals = build["vector_dtype"], build.get("originals")
    for name, params in PROFILES.items():
        if params["vector_dtype"] == dtype and params.get("originals") == originals:
            return name
    return f"{dtype}-rerank" if originals else dtype  # a code no profile names (vector_dtype="int3")


class ExactStore(IndexedStore):
    """Exact MaxSim over all stored documents, in memory, or persisted to ``path``.

    Parameters
    ----------
    path: directory to persist to (created when missing or empty; reopened when it holds a
        store; a folder of 0.4 or older is converted; any other folder is refused, untouched).
    format: the tagged format (saved with the store; used for decompositions).
    vector_dtype: how a persisted store keeps its rows: ``"float32"`` (the default for a new
        store: scores equal to the in-memory store's), ``"float16"`` (half the disk and page
        cache, scores within float16 rounding) or a code: ``"int4"`` (the ``compact``
        profile), ``"int3"``, ``"int2"``, ``"int8"`` (:mod:`uibk_embedding.quantize`).
        ``None``: the saved value. In memory the rows are always float32.
    profile: a name of :data:`PROFILES` (``"exact"``, ``"float16"``, ``"compact"``,
        ``"exact-rerank"``, ``"int8"``, ``"int8-rerank"``): what a new store keeps, or the
        profile an existing store must have (``CollectionMismatch`` otherwise). ``None``: the
        saved one (``vector_dtype``'s for a new store).
    rerank_depth: a rerank profile rescores this many of the coded scan's best documents from
        their float16 originals (at least ``k``; ``None``: ``max(100, 4 * k)``).
        Not saved. The result is the exact top ``k`` of that pool (exact MaxSim of the
        originals, as a ``float16`` store scores them), wherever they stood in it.
    max_chunk_bytes: memory bound of one scoring block (rows converted or gathered at a time).
    compact_every: accepted for stores written by 0.4 (their operation log was folded after this
        many writes); the SQLite store has no log to fold, so it has no effect.
    read_only, create, write_timeout: how the folder is shared: see
        :class:`~uibk_embedding.adapters.indexed.IndexedStore`.

    >>> s = ExactStore()
    >>> s.vector_dtype, s.count(), s.stats()["search"]
    ('float32', 0, 'exact')
    """

    backend = "exact"
    label = "exact"
    engine_name = "exact"
    exact = True
    schema_version: ClassVar[int] = 3  # 1 and 2 were store.json's versions (0.4 and older)
    search_options: ClassVar[tuple[str, ...]] = ()
    # profile and originals are given (and recorded) for int8 stores only: float stores' records
    # are those written before profiles
    build_defaults: ClassVar[dict[str, Any]] = {"vector_dtype": DEFAULT_VECTOR_DTYPE, "originals": None}
    sync_on_write = False  # no index to keep in line: a write is one transaction
    builds_index = False
    vector_compact_min_rows = 1024  # a small file is not copied for every few deleted rows
    in_memory_without_path = True

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        format: TaggedFormat | None = None,
        *,
        vector_dtype: str | None = None,
        profile: str | None = None,
        rerank_depth: int | None = None,
        max_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        compact_every: int = 200,
        read_only: bool = False,
        create: bool = True,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        given = self._profile_params(profile, vector_dtype)
        self._check_build_params(given)
        if path is None and given["vector_dtype"] not in (None, "float32"):
            raise ValueError(f"an in-memory ExactStore keeps float32 rows; vector_dtype="
                             f"{given['vector_dtype']!r} needs a path (the rows are then memory-mapped "
                             "from a file)")
        check_positive("rerank_depth", rerank_depth, allow_none=True)
        check_positive("max_chunk_bytes", max_chunk_bytes)
        check_positive("compact_every", compact_every)
        if path is not None and (Path(path) / OLD_CONFIG_NAME).is_file():
            if read_only:
                raise CollectionMismatch(f"{path} holds an exact store of 0.4 or older: it is converted "
                                         "once, by a store opened for writing (not read_only); nothing "
                                         "was changed")
            convert_op_log(Path(path), format, vector_dtype, write_timeout)
        try:
            super().__init__(path, format, given,
                             vector_compact_fraction=REPACK_FRACTION, read_only=read_only, create=create,
                             write_timeout=write_timeout)
        except CollectionMismatch as e:
            if profile is None:
                raise
            raise CollectionMismatch(f"{e} (profile={profile!r} keeps {given['vector_dtype']} rows"
                                     f"{' and float16 originals' if given.get('originals') else ''})") from e
        if profile is not None and self.profile != profile:  # originals=None is not checked above
            have = self.profile
            self.close()
            raise CollectionMismatch(f"store at {path} has profile={have!r}, not {profile!r}: open it "
                                     "without profile, or index into a new store")
        self.max_chunk_bytes = max_chunk_bytes
        self.compact_every = compact_every
        self.rerank_depth = rerank_depth

    @staticmethod
    def _profile_params(profile: str | None, vector_dtype: str | None) -> dict[str, Any]:
        """The build parameters given to the store: ``vector_dtype`` alone (float rows; the
        records of float stores are as before profiles), or, for coded rows, their originals
        too (the record names the code: ``vector_dtype``)."""
        if profile is None:
            if vector_dtype in CODES:  # a new store: no originals; an existing one: as it is
                return {"vector_dtype": vector_dtype, "originals": None}
            return {"vector_dtype": vector_dtype}
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(map(repr, PROFILES))}, got {profile!r}")
        params = PROFILES[profile]
        if vector_dtype is not None and vector_dtype != params["vector_dtype"]:
            raise ValueError(f"profile={profile!r} keeps {params['vector_dtype']} rows; vector_dtype="
                             f"{vector_dtype!r} contradicts it (give one of them)")
        if params["vector_dtype"] not in CODES:
            return {"vector_dtype": params["vector_dtype"]}
        return {"vector_dtype": params["vector_dtype"], "originals": params["originals"]}

    @staticmethod
    def _check_build_params(given: dict[str, Any]) -> None:
        dtype = given.get("vector_dtype")
        if not isinstance(dtype, str | None) or dtype not in (None, *VECTOR_DTYPES):
            raise ValueError(f"vector_dtype must be one of {', '.join(map(repr, VECTOR_DTYPES))}, "
                             f"got {dtype!r}")

    @property
    def vector_dtype(self) -> str:
        """``"float32"``, ``"float16"`` or a code (``"int4"``, ``"int2"``, ``"int8"``, ...): how
        the scanned rows are kept (saved with the store)."""
        return self._build["vector_dtype"]

    @property
    def profile(self) -> str:
        """The store's profile (:data:`PROFILES`), saved with it."""
        return profile_of(self._build)

    def stats(self) -> dict[str, Any]:
        """:meth:`IndexedStore.stats` with the store's ``profile`` and ``vector_dtype``."""
        return {**super().stats(), "profile": self.profile, "vector_dtype": self.vector_dtype}

    def _exact(self, queries: list[np.ndarray], seqs: Any, k: int) -> list[list[Any]]:
        """The exact scan; a rerank profile rescores the scan's best
        ``rerank_depth`` (``max(100, 4 k)`` by default, at least ``k``) from their float16
        originals and returns the exact top ``k`` of that pool (ties: lower seq)."""
        assert self._vf is not None
        originals = self._vf.originals
        if originals is None:
            return super()._exact(queries, seqs, k)
        depth = max(k, self.rerank_depth or max(MIN_RERANK_DEPTH, 4 * k))
        coarse = self._scores(queries, seqs)
        out = []
        for q, row in zip(queries, coarse, strict=True):
            pool = np.sort(top_k(row, depth))  # store order: ties resolve by seq below
            pool_seqs = [int(seqs[i]) for i in pool]
            starts, lengths = self._extents(pool_seqs)
            mat, off = originals.gather(starts, lengths, None)  # float16, as stored
            exact = maxsim_scores([q], mat, off, max_chunk_bytes=self.max_chunk_bytes)[0]
            out.append([self._hit(pool_seqs[i], float(exact[i])) for i in top_k(exact, k)])
        return out

    @property
    def n_pending(self) -> int:
        """0: the exact store builds no index, so no document waits for one."""
        return 0

    def _recover(self) -> None:
        super()._recover()
        if self.path is not None:
            _remove_op_log(self.path)  # what a conversion killed after its switch left

    def compact(self) -> None:
        """Drop the rows of deleted or overwritten documents now: the live rows are copied into
        the next generation of the vector file (in memory: a new array)."""
        with self._lock, self._writing():
            self._check_open()
            if self.dead_vector_rows:
                self._compact_vectors()

    def scores(self, query: np.ndarray, *, dtype: type = np.float32) -> dict[str, float]:
        """MaxSim of ``query`` against every stored document (for tests and evaluation;
        ``dtype=np.float64`` for the high-precision reference)."""
        with self._lock:
            self._check_open()
            self._fresh()
            seqs = self._everyone()
            row = self._scores([np.asarray(query)], seqs, dtype=dtype)[0]
            return {self._id_of[int(s)]: float(v) for s, v in zip(seqs, row, strict=True)}

    def ids(self) -> list[str]:
        """All stored ids, in insertion order of their live copies."""
        with self._lock:
            self._check_open()
            self._fresh()
            return list(self._id_of.values())

    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk: ``vectors`` (the vector file, dead rows included) and ``stored`` (every
        file of the store); 0 in memory."""
        usage = super().disk_usage()
        del usage["exact_index"]
        return usage


def convert_op_log(path: Path, format: TaggedFormat | None = None, vector_dtype: str | None = None,
                   write_timeout: float = WRITE_TIMEOUT) -> None:
    """Convert the exact store folder ``path`` written by 0.4 or older (``store.json``, the
    operation log ``ops/``, ``snapshot-*.npz``) into the SQLite store, under the folder's lock.

    The live documents are replayed from the newest snapshot and the operations after it; their
    rows stay in the vector file (0.3.0 kept them inside the ``.npz`` files: they are appended to
    a new vector file first). ``store.sqlite`` is written and made durable, then ``store.json``
    is removed: that is the switch. Killed before it, the folder is still the old store (the
    half-written database is removed and the conversion redone); after it, the old files are
    leftovers the store removes on open. Nothing of the old store is changed before the switch,
    and nothing at all when its record does not fit ``format`` or ``vector_dtype`` (the store
    would refuse to open it: it stays a store the version that wrote it can open).
    """
    lock = acquire_write_lock(path / LOCK_NAME, f"the store folder {path}", write_timeout)
    try:
        cfg = path / OLD_CONFIG_NAME
        if not cfg.is_file():
            return  # converted by another process meanwhile
        config = read_record(cfg.read_bytes())
        fmt = check_record(config, format, f"{path} (its {OLD_CONFIG_NAME})", key="backend", value="exact",
                           schema_key="version", schema=(1, 2))
        dtype = config.get("vector_dtype", "float32")  # before 0.3.1: float32 in the .npz files
        if vector_dtype not in (None, dtype):
            raise CollectionMismatch(f"store at {path} was built with vector_dtype={dtype!r}, not "
                                     f"{vector_dtype!r}: open it without vector_dtype, or index into a "
                                     "new store")
        live, gen, committed = _replay(path)
        for p in path.glob(DB_NAME + "*"):  # a conversion killed before its switch
            p.unlink()
        inline = [x for x, doc in live.items() if doc[0] is None]  # 0.3.0: rows in the .npz files
        if inline:
            gen, committed = gen + 1, 0
            (path / file_name(gen, dtype)).unlink(missing_ok=True)
            vf = VectorFile.open(path, generation=gen, dtype=dtype, committed_rows=0)
            try:
                starts = vf.append([live[x][2] for x in inline])
            finally:
                vf.close()
            for x, start in zip(inline, starts.tolist(), strict=True):
                _, n, _, md = live[x]
                live[x] = (start, n, None, md)
            committed = vf.n_rows
        store_config = {"backend": "exact", "schema": ExactStore.schema_version,
                        "format": (fmt or TaggedFormat()).to_stored(), "build": {"vector_dtype": dtype},
                        "engine": f"{ExactStore.engine_name} {ExactStore.engine_version}"}
        db = connect(path / DB_NAME)
        try:
            with transaction(db):
                ExactStore._create_tables(db, store_config, vector_gen=str(gen), vector_rows=str(committed),
                                          last_seq=str(len(live)))
                db.executemany("INSERT INTO docs (seq, id, start, n_rows, metadata) VALUES (?, ?, ?, ?, ?)",
                               [(i, x, start, n, json.dumps(md, ensure_ascii=False))
                                for i, (x, (start, n, _, md)) in enumerate(live.items(), start=1)])
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the database file alone holds the store
        finally:
            db.close()
        cfg.unlink()  # the switch
        fsync_dir(path)
        _remove_op_log(path)
    finally:
        lock.close()


def _replay(path: Path) -> tuple[dict[str, tuple], int, int]:
    """The live documents of an old folder in order, ``id -> (start, n_rows, rows, metadata)``
    (``start`` None and ``rows`` given for 0.3.0's inline rows), the vector file's generation and
    its committed rows: the newest snapshot, then every operation after it."""
    live: dict[str, tuple] = {}
    gen, committed = 1, 0
    snaps = sorted(int(m.group(1)) for p in path.iterdir() if (m := _SNAP.match(p.name)))
    ops_dir = path / "ops"
    ops = sorted(int(m.group(1)) for p in ops_dir.iterdir() if (m := _OP.match(p.name))) \
        if ops_dir.is_dir() else []
    files = [path / f"snapshot-{snaps[-1]:012d}.npz"] if snaps else []
    files += [ops_dir / f"{seq:012d}.npz" for seq in ops if not snaps or seq > snaps[-1]]
    for f in files:
        with np.load(f, allow_pickle=False) as z:
            ids = json.loads(str(z["ids"]))
            if "op" in z and str(z["op"]) == "delete":
                for x in ids:
                    live.pop(x, None)
                continue
            md = json.loads(str(z["metadata"]))
            lengths = z["lengths"].astype(np.int64).tolist()
            alive = z["alive"].astype(bool).tolist() if "alive" in z else [True] * len(ids)
            if "vectors" in z:  # 0.3.0
                ends = np.cumsum(lengths).tolist()
                rows = np.split(np.asarray(z["vectors"], np.float32), ends[:-1]) if ids else []
                for x, n, r, m, a in zip(ids, lengths, rows, md, alive, strict=True):
                    if a:
                        live.pop(x, None)
                        live[x] = (None, n, r, m)
                continue
            pos = int(z["start"]) if "start" in z else 0
            if "vector_gen" in z:
                gen, committed = int(z["vector_gen"]), int(z["vector_rows"])
            for x, n, m, a in zip(ids, lengths, md, alive, strict=True):
                if a:
                    live.pop(x, None)
                    live[x] = (pos, n, None, m)
                pos += n
            committed = max(committed, pos)
    return live, gen, committed


def _remove_op_log(path: Path) -> None:
    """Delete what an old folder's format left once the SQLite store holds it: the operation
    files (``ops/`` too once nothing else is in it), ``snapshot-*.npz`` and the temporary files
    0.4 and older wrote; a user's file (``.tmp-download.part``) stays."""
    ops = path / "ops"
    for folder in (path, ops) if ops.is_dir() else (path,):
        for p in folder.iterdir():
            if (_SNAP.match(p.name) or _OLD_TMP.match(p.name) or (folder == ops and _OP.match(p.name))) \
                    and p.is_file():
                p.unlink()
    if ops.is_dir() and not any(ops.iterdir()):
        ops.rmdir()


__all__ = ["DEFAULT_VECTOR_DTYPE", "OLD_CONFIG_NAME", "REPACK_FRACTION", "ExactStore", "convert_op_log"]
