"""WARP over xtr-warp-rs: string ids, upserts, deletes, filters, a durable id map, exact rerank.

:class:`WarpStore` keeps three things in a directory:

* ``store.sqlite`` (SQLite in WAL mode, ``synchronous=FULL``): the source of truth. One row per
  document: its string id, an insertion sequence number, where its original vectors lie in the
  vector file (``start``, ``n_rows``), its WARP passage id (``pid``; NULL while the document
  is *pending*, not yet in the engine) and its JSON metadata; the engine pids of deleted or
  overwritten documents that the engine still holds (``dead``); and a state table (saved build
  parameters, the current index directory, the committed length of the vector file, a *dirty*
  flag). No pickle anywhere.
* ``vectors-NNNNNN.f16`` (:class:`~uibk_embedding.vectorfile.VectorFile`): the original vectors,
  append-only and memory-mapped: ``get``, exact rerank and rebuilds read them from there.
* ``warp-NNNNNN/``: the xtr-warp-rs index. The engine numbers passages itself (``create``
  numbers them 0..n-1, ``add`` continues from its ``next_passage_id``, ids are never reused);
  the store maps them back to string ids through the ``pid`` column.

Writes never call the engine. An upsert appends the vectors (durably) and then commits, in one
transaction, the new rows (pending) and the dead pids of what it replaced; a delete commits
the removal and the dead pids. A process killed at any point leaves the whole write or none of
it (an append that was never committed is cut off on open). Pending documents are searched
exactly, beside the engine's candidates; the engine catches up in :meth:`WarpStore.flush`,
which a search runs when more than ``buffer_size`` documents are pending or dead (so a bulk
load builds the index once, on the first search): with no index yet it builds one into a fresh
``warp-NNNNNN/`` and switches to it in one transaction (pids assigned with it); otherwise it
marks the index dirty, tombstones the dead pids, adds the pending documents, compacts when the
engine's tombstone ratio calls for it, flushes the engine's files to disk and commits the new
pids while clearing the flag. A crash inside that window leaves the flag set and the index is
rebuilt from the stored vectors on the next open (the documents themselves were committed
before; nothing acknowledged is lost).

Scores: WARP (XTR) scoring is not MaxSim. For each query vector it looks only at the document
vectors found in the probed centroids and *imputes* the similarity of the documents it did
not see there (a per-query-vector lower estimate), on compressed residuals. With
``rerank=True`` (the default) the engine only proposes ``n_rerank`` candidates, which are
rescored with exact MaxSim on the stored originals (``docs/warp.md`` has the measurements);
with ``rerank=False`` hits carry the engine's own scores and ranking (every pending write is
flushed first, so the engine sees everything). Filters are evaluated on this side with the
library's exact type semantics (``True`` is not ``1``) and handed to the engine as a subset of
passage ids; the engine's own DuckDB metadata is not used. Stores (or filtered subsets) no
larger than the rerank pool, and stores with fewer than ``min_index_vectors`` vectors, are
scored exactly.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.encoder.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> mk = lambda n: fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))
>>> store = WarpStore(buffer_size=0, min_index_vectors=32)   # a temporary directory
>>> docs = [mk(30) for _ in range(4)]
>>> store.upsert(["a", "b", "c", "d"], docs, [{"lang": "en"}, {}, {"lang": "de"}, {}])
>>> [h.id for h in store.search(docs[2], k=2, filter={"lang": "de"})]
['c']
>>> store.has_index, store.count()
(True, 4)
>>> store.delete(["a"]); store.count()
3
>>> store.close()
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import json
import logging
import os
import queue
import shutil
import sqlite3
import tempfile
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding._durable import fsync_tree
from uibk_embedding._optional import require
from uibk_embedding._sqlite_state import (
    committed_generation,
    connect,
    lock_folder,
    refuse_foreign_folder,
    remove_stale_index_dirs,
    state_get,
    state_set,
    transaction,
)
from uibk_embedding.adapters.base import Hit, MultiVectorStore, Record, finite_score, settle_format
from uibk_embedding.adapters.filters import Condition, matches
from uibk_embedding.encoder.tagged import TaggedFormat
from uibk_embedding.errors import CollectionMismatch, EngineError, StoreInUse, call_engine
from uibk_embedding.maxsim import maxsim_scores, top_k
from uibk_embedding.vectorfile import VectorFile, file_name, remove_other_generations

SCHEMA_VERSION = 1
DB_NAME = "store.sqlite"
LOCK_NAME = "store.lock"
_INDEX_PREFIX = "warp-"
_SQL_CHUNK = 900  # bound parameters per statement (SQLite's default limit is 999)

#: Build parameters saved with a store: xtr-warp-rs ``create`` defaults (``num_partitions=None``
#: is the engine's corpus-size heuristic); ``vector_dtype`` is ours.
BUILD_DEFAULTS: dict[str, Any] = {
    "nbits": 4,
    "kmeans_niters": 4,
    "max_points_per_centroid": 256,
    "n_samples_kmeans": None,
    "num_partitions": None,
    "seed": 42,
    "vector_dtype": "float16",
}


@contextlib.contextmanager
def _quiet_kmeans() -> Iterator[None]:
    """xtr-warp-rs logs its k-means plan at WARNING level on every build; hold that back for
    the duration of a build (its real warnings, e.g. about tombstones, still show)."""
    log = logging.getLogger("xtr_warp.kmeans")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


class _EngineThread:
    """One daemon thread that runs every engine call of a store.

    The engine's searcher is a pyo3 *unsendable* object: used or dropped on any thread but
    the one that created it, it panics. A daemon thread (rather than a ThreadPoolExecutor,
    which is joined before ``atexit`` handlers run) is still alive when the ``atexit`` hook
    below closes stores that were never closed, so their searchers are freed where they live.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="uibk-warp-engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args, kwargs, fut = item
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed to the caller, whatever it is
                fut.set_exception(e)

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        if not self._thread.is_alive():
            raise RuntimeError("the WARP engine thread has stopped")
        fut: Future = Future()
        self._queue.put((fn, args, kwargs, fut))
        return fut.result()

    def stop(self) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._queue.put(None)
            self._thread.join()


_OPEN_STORES: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    for store in list(_OPEN_STORES):
        with contextlib.suppress(Exception):
            store.close()


class WarpEngineError(EngineError):
    """xtr-warp-rs failed or panicked (its Rust panics are BaseException; they become this)."""


def engine_call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call into xtr-warp-rs, its errors and Rust panics raised as :class:`WarpEngineError`
    (:func:`uibk_embedding.errors.call_engine`).

    >>> try:
    ...     engine_call("a division", lambda: 1 / 0)
    ... except WarpEngineError as e:
    ...     print(e)
    xtr-warp-rs failed during a division: ZeroDivisionError: division by zero
    """
    return call_engine("xtr-warp-rs", WarpEngineError, what, fn, *args, **kwargs)


def _positive_int(name: str, value: Any, *, allow_zero: bool = False, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {kind} int{' or None' if allow_none else ''}, got {value!r}")


class WarpStore(MultiVectorStore):
    """A WARP index (xtr-warp-rs) with string ids, metadata filters and exact rerank.

    Parameters
    ----------
    path:
        Directory of the store (created when missing, reopened when it holds one). ``None``:
        a temporary directory removed by :meth:`close`.
    format:
        The tagged format (saved with the store; used for decompositions).
    nbits, kmeans_niters, max_points_per_centroid, n_samples_kmeans, num_partitions, seed:
        xtr-warp-rs ``create`` parameters (bits per residual dimension; k-means iterations,
        points per centroid and sample size; the number of centroids, ``None`` for the
        engine's heuristic ``2**floor(log2(16 * sqrt(vectors)))``; the k-means seed). Saved
        with the store; ``None`` means the saved value (or the engine default for a new store:
        4, 4, 256, auto, auto, 42).
    vector_dtype:
        ``"float16"`` (default) or ``"float32"``: how the original vectors are kept (for
        ``get``, rerank and rebuilds). float32 makes the reranked scores exact to float32.
    bound, nprobe, t_prime, max_candidates, centroid_score_threshold:
        xtr-warp-rs search parameters; ``None`` (default) lets the engine choose them from the
        index density, ``k`` and the query length (its ``hyperparams.optimize``).
    search_batch_size:
        The engine's ``batch_size`` for the query-centroid product (engine default 8192).
    rerank:
        Rescore the engine's candidates with exact MaxSim on the stored vectors (default on).
    n_rerank:
        Candidates asked from the engine when reranking (at least ``k``).
    buffer_size:
        A search flushes pending writes into the engine when more than this many documents
        are pending or dead (pending ones are scored exactly meanwhile). 0 flushes on every
        search after a write.
    min_index_vectors:
        Below this many stored vectors no index is built and search is exact.
    min_outliers, max_growth_rate:
        xtr-warp-rs ``add`` centroid expansion (engine defaults 50 and 0.1).
    compact_threshold:
        Tombstone ratio at which a flush compacts the engine index (engine default 0.2).
    retrain_factor:
        Rebuild (re-cluster) at a flush once the live vectors exceed this factor times the
        vectors the index was trained on; ``None`` (default) relies on the engine's centroid
        expansion, as xtr-warp-rs does. :meth:`rebuild` re-clusters on demand.
    num_threads:
        The engine's search threads (engine default 1). Index builds use torch's threads.
    device:
        Engine device, ``"cpu"`` or ``"cuda[:N]"`` (CUDA paths are not measured here).
    """

    backend = "warp"
    exact = False

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        format: TaggedFormat | None = None,
        *,
        nbits: int | None = None,
        kmeans_niters: int | None = None,
        max_points_per_centroid: int | None = None,
        n_samples_kmeans: int | None = None,
        num_partitions: int | None = None,
        seed: int | None = None,
        vector_dtype: str | None = None,
        bound: int | None = None,
        nprobe: int | None = None,
        t_prime: int | None = None,
        max_candidates: int | None = None,
        centroid_score_threshold: float | None = None,
        search_batch_size: int = 8192,
        rerank: bool = True,
        n_rerank: int = 200,
        buffer_size: int = 256,
        min_index_vectors: int = 256,
        min_outliers: int = 50,
        max_growth_rate: float = 0.1,
        compact_threshold: float = 0.2,
        retrain_factor: float | None = None,
        num_threads: int = 1,
        device: str = "cpu",
    ) -> None:
        super().__init__(format)
        for name, value in [("search_batch_size", search_batch_size), ("n_rerank", n_rerank),
                            ("min_index_vectors", min_index_vectors), ("num_threads", num_threads)]:
            _positive_int(name, value)
        _positive_int("buffer_size", buffer_size, allow_zero=True)
        _positive_int("min_outliers", min_outliers, allow_zero=True)
        for name, value in [("bound", bound), ("nprobe", nprobe), ("t_prime", t_prime),
                            ("max_candidates", max_candidates)]:
            _positive_int(name, value, allow_none=True)
        if centroid_score_threshold is not None and not 0 <= centroid_score_threshold <= 1:
            raise ValueError("centroid_score_threshold must be in [0, 1] or None, got "
                             f"{centroid_score_threshold!r}")
        if not 0 < compact_threshold <= 1:
            raise ValueError(f"compact_threshold must be in (0, 1], got {compact_threshold!r}")
        if not max_growth_rate > 0:
            raise ValueError(f"max_growth_rate must be positive, got {max_growth_rate!r}")
        if retrain_factor is not None and not retrain_factor > 1:
            raise ValueError(f"retrain_factor must be > 1 or None, got {retrain_factor!r}")
        self._torch = require("torch", "warp", "the WARP backend")
        self._warp_mod = require("xtr_warp", "warp", "the WARP backend")
        self.engine_version = importlib.metadata.version("xtr-warp-rs")
        self.search_params = {"bound": bound, "nprobe": nprobe, "t_prime": t_prime,
                              "max_candidates": max_candidates,
                              "centroid_score_threshold": centroid_score_threshold}
        self.search_batch_size = search_batch_size
        self.rerank = bool(rerank)
        self.n_rerank = n_rerank
        self.buffer_size = buffer_size
        self.min_index_vectors = min_index_vectors
        self.min_outliers = min_outliers
        self.max_growth_rate = float(max_growth_rate)
        self.compact_threshold = float(compact_threshold)
        self.retrain_factor = retrain_factor
        self.num_threads = num_threads
        self.device = device
        given = {"nbits": nbits, "kmeans_niters": kmeans_niters,
                 "max_points_per_centroid": max_points_per_centroid, "n_samples_kmeans": n_samples_kmeans,
                 "num_partitions": num_partitions, "seed": seed, "vector_dtype": vector_dtype}
        self._check_build_params(given)

        self._lock = threading.RLock()
        self._worker = _EngineThread()
        self._closed = False
        self._tmpdir: str | None = None
        if path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="uibk-warp-")
            path = self._tmpdir
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lockfile: Any = None
        self._lockfile = self._acquire_dir_lock()
        self._engine: Any = None
        self._vf: VectorFile | None = None
        # in-memory view of the store (seq = insertion sequence number)
        self._id_of: dict[int, str] = {}
        self._seq_of: dict[str, int] = {}
        self._start: dict[int, int] = {}
        self._rows: dict[int, int] = {}
        self._meta: dict[int, dict] = {}
        self._pid: dict[int, int] = {}        # seq -> engine pid (indexed documents)
        self._seq_of_pid: dict[int, int] = {}
        self._pending: dict[int, None] = {}   # seqs not yet in the engine, in order
        self._dead: set[int] = set()          # engine pids of documents that are gone
        self._n_vectors = 0
        try:
            self._refuse_foreign_folder()
            self._db = self._connect()
            self._open(format, given)
        except BaseException:
            self._closed = True
            self._release()
            raise
        _OPEN_STORES.add(self)

    # -- configuration ---------------------------------------------------------------------
    @staticmethod
    def _check_build_params(given: dict[str, Any]) -> None:
        for name in ("nbits", "kmeans_niters", "max_points_per_centroid", "n_samples_kmeans",
                     "num_partitions"):
            _positive_int(name, given[name], allow_none=True)
        _positive_int("seed", given["seed"], allow_zero=True, allow_none=True)
        if given["nbits"] is not None and given["nbits"] not in (1, 2, 4, 8):
            raise ValueError(f"nbits must be 1, 2, 4 or 8, got {given['nbits']!r}")
        if given["vector_dtype"] not in (None, "float16", "float32"):
            raise ValueError(f"vector_dtype must be 'float16' or 'float32', got {given['vector_dtype']!r}")

    @property
    def build_params(self) -> dict[str, Any]:
        """The saved build parameters (nbits, k-means settings, seed, vector dtype)."""
        return dict(self._build)

    @property
    def has_index(self) -> bool:
        """Whether an engine index exists (False for empty or tiny stores, searched exactly)."""
        return self._engine is not None

    @property
    def n_pending(self) -> int:
        """Documents written but not yet in the engine index (searched exactly meanwhile)."""
        return len(self._pending)

    # -- files -----------------------------------------------------------------------------
    def _acquire_dir_lock(self) -> Any:
        return lock_folder(self.path / LOCK_NAME, f"the WARP store at {self.path}", "WarpStore")

    def _connect(self) -> sqlite3.Connection:
        return connect(
            self.path / DB_NAME,
            "CREATE TABLE IF NOT EXISTS docs (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
            "start INTEGER NOT NULL, n_rows INTEGER NOT NULL, pid INTEGER UNIQUE, metadata TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS dead (pid INTEGER PRIMARY KEY)")

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db)

    def _state_get(self, key: str, default: str | None = None) -> str | None:
        return state_get(self._db, key, default)

    _state_set = staticmethod(state_set)

    def _open(self, format: TaggedFormat | None, given: dict[str, Any]) -> None:
        raw = self._state_get("config")
        if raw is None:
            self._build = {k: (BUILD_DEFAULTS[k] if v is None else v) for k, v in given.items()}
            config = {"backend": "warp", "schema": SCHEMA_VERSION, "format": self.format.to_stored(),
                      "build": self._build, "engine": f"xtr-warp-rs {self.engine_version}"}
            with self._tx() as db:
                self._state_set(db, config=json.dumps(config), index_dir="", dirty="0",
                                generation="0", vf_generation="1", vf_rows="0", trained_vectors="0")
            config_engine = config["engine"]
        else:
            config = json.loads(raw)
            if config.get("backend") != "warp" or config.get("schema") != SCHEMA_VERSION:
                raise CollectionMismatch(f"{self.path} does not hold a WARP store of schema {SCHEMA_VERSION}")
            self.format = settle_format(TaggedFormat.from_stored(config["format"]), format,
                                        f"store at {self.path}")
            self._build = dict(config["build"])
            for k, v in given.items():
                if v is not None and v != self._build[k]:
                    raise CollectionMismatch(
                        f"store at {self.path} was built with {k}={self._build[k]!r}, not {v!r}: open it "
                        f"without {k}, or index into a new store"
                    )
            config_engine = config.get("engine")
        self._generation = int(self._state_get("generation", "0") or 0)
        self._index_dir = self._state_get("index_dir", "") or ""
        self._trained = int(self._state_get("trained_vectors", "0") or 0)
        vf_gen = int(self._state_get("vf_generation", "1") or 1)
        vf_rows = int(self._state_get("vf_rows", "0") or 0)
        self._vf = VectorFile.open(self.path, generation=vf_gen, dtype=self._build["vector_dtype"],
                                   committed_rows=vf_rows)
        remove_other_generations(self.path, keep=self._vf.path.name)
        for seq, doc_id, start, n_rows, pid, md in self._db.execute(
                "SELECT seq, id, start, n_rows, pid, metadata FROM docs ORDER BY seq"):
            self._remember(seq, doc_id, start, n_rows, json.loads(md))
            if pid is None:
                self._pending[seq] = None
            else:
                self._pid[seq] = pid
                self._seq_of_pid[pid] = seq
        self._dead = {r[0] for r in self._db.execute("SELECT pid FROM dead")}
        self._last_seq = max([int(self._state_get("last_seq", "0") or 0), *self._id_of])

        reason = None
        if self._state_get("dirty") == "1":
            reason = "an interrupted flush left it out of date"
        elif config_engine != f"xtr-warp-rs {self.engine_version}":
            reason = f"it was built by {config_engine}, this is xtr-warp-rs {self.engine_version}"
        elif self._index_dir:
            reason = self._load_engine()
        if reason is not None:
            if config_engine != f"xtr-warp-rs {self.engine_version}":
                config["engine"] = f"xtr-warp-rs {self.engine_version}"
                with self._tx() as db:
                    self._state_set(db, config=json.dumps(config))
            if self._index_dir or self._pid:
                warnings.warn(f"rebuilding the WARP index at {self.path} from the stored vectors: "
                              f"{reason}", RuntimeWarning, stacklevel=3)
            try:
                self._rebuild()
            except (WarpEngineError, OSError, sqlite3.Error) as e:
                self._open_without_index(e)
        self._remove_stale_indexes()

    def _open_without_index(self, error: BaseException) -> None:
        """The index could not be rebuilt on open (a full disk, say): the store opens on its
        committed documents with no index (searches are exact MaxSim over the stored vectors),
        still marked dirty, so the next write, flush or :meth:`rebuild` tries again."""
        self._close_engine()
        with contextlib.suppress(sqlite3.Error), self._tx() as db:
            self._state_set(db, dirty="1")
        warnings.warn(f"the WARP index at {self.path} could not be rebuilt ({error}); the store is "
                      "open without an index: searches are exact over the stored vectors until a "
                      "write, flush or rebuild() succeeds", RuntimeWarning, stacklevel=4)

    def _load_engine(self) -> str | None:
        """Open the current index; the reason it cannot be used, or None."""
        folder = self.path / self._index_dir
        try:
            n_engine = self._engine_passages(folder) - self._tombstones(folder)
        except WarpEngineError as e:
            return str(e)
        if n_engine != len(self._pid) + len(self._dead):
            return f"it holds {n_engine} live passages, the store expects {len(self._pid) + len(self._dead)}"
        try:
            engine = self._warp_mod.XTRWarp(str(folder), device=self.device)
            self._call("load", engine.load, device=self.device)
        except WarpEngineError as e:
            return str(e)
        self._engine = engine
        return None

    def _refuse_foreign_folder(self) -> None:
        refuse_foreign_folder(self.path, DB_NAME, LOCK_NAME, "WARP")

    def _remove_stale_indexes(self) -> None:
        remove_stale_index_dirs(self.path, _INDEX_PREFIX, self._index_dir, self._generation)

    def _remember(self, seq: int, doc_id: str, start: int, n_rows: int, md: dict) -> None:
        self._id_of[seq], self._seq_of[doc_id] = doc_id, seq
        self._start[seq], self._rows[seq], self._meta[seq] = start, n_rows, md
        self._n_vectors += n_rows

    # -- the engine ------------------------------------------------------------------------
    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """:func:`engine_call` on the store's engine thread. The engine's searcher is a pyo3
        *unsendable* object: it panics when used or dropped on any thread but the one that
        created it, so every engine call of a store runs on one worker thread."""
        return self._worker.call(engine_call, what, fn, *args, **kwargs)

    def _tensors(self, seqs: Sequence[int]) -> list:
        """float32 torch views of the stored vectors of ``seqs`` (one gathered matrix)."""
        mat, off = self._gather(seqs)
        t = self._torch.from_numpy(mat)
        return [t[off[i]:off[i + 1]] for i in range(len(seqs))]

    def _gather(self, seqs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        assert self._vf is not None
        starts = np.fromiter((self._start[s] for s in seqs), dtype=np.int64, count=len(seqs))
        lengths = np.fromiter((self._rows[s] for s in seqs), dtype=np.int64, count=len(seqs))
        return self._vf.gather(starts, lengths)

    def _close_engine(self) -> None:
        if self._engine is not None:
            with contextlib.suppress(Exception):
                self._call("free", self._engine.free)  # drops the searcher on its own thread
            self._engine = None

    def _rebuild(self) -> None:
        """Build a fresh index from the stored vectors into a new directory, then switch to it
        (the pids of every live document are reassigned in the same transaction)."""
        gen = self._generation + 1
        live = sorted(self._id_of)
        name = f"{_INDEX_PREFIX}{gen:06d}" if self._n_vectors >= self.min_index_vectors else ""
        engine = None
        if name:
            target = self.path / name
            shutil.rmtree(target, ignore_errors=True)
            b = self._build
            engine = self._warp_mod.XTRWarp(str(target), device=self.device)
            tensors = self._tensors(live)
            with _quiet_kmeans():
                self._call("create", engine.create, tensors, device=self.device, nbits=b["nbits"],
                            kmeans_niters=b["kmeans_niters"],
                            max_points_per_centroid=b["max_points_per_centroid"],
                            n_samples_kmeans=b["n_samples_kmeans"], num_partitions=b["num_partitions"],
                            seed=b["seed"], show_progress=False)
            del tensors
            fsync_tree(target)  # durable before the state row points at it
        old_dir = self._index_dir
        with self._tx() as db:
            db.execute("UPDATE docs SET pid = NULL")
            if name:
                db.executemany("UPDATE docs SET pid = ? WHERE seq = ?", [(p, s) for p, s in enumerate(live)])
            db.execute("DELETE FROM dead")
            self._state_set(db, index_dir=name, generation=gen, dirty="0",
                            trained_vectors=self._n_vectors if name else 0)
        self._close_engine()
        self._index_dir, self._generation = name, gen
        self._trained = self._n_vectors if name else 0
        self._dead = set()
        self._pid, self._seq_of_pid, self._pending = {}, {}, {}
        if name:
            self._pid = {s: p for p, s in enumerate(live)}
            self._seq_of_pid = dict(enumerate(live))
            assert engine is not None
            self._call("load", engine.load, device=self.device)
            self._engine = engine
        else:
            self._pending = dict.fromkeys(live)
        if old_dir and old_dir != name:
            shutil.rmtree(self.path / old_dir, ignore_errors=True)

    def rebuild(self) -> None:
        """Re-cluster: build the index anew from the stored vectors (e.g. after the collection
        drifted far from the one the centroids were trained on)."""
        with self._lock:
            self._check_open()
            self._rebuild()

    def flush(self) -> None:
        """Bring the engine index up to date with every committed write (builds it when the
        store has reached ``min_index_vectors``). Searches call this on their own when more
        than ``buffer_size`` documents are pending or dead."""
        with self._lock:
            self._check_open()
            self._flush()

    def _flush(self) -> None:
        if not self._pending and not self._dead:
            return
        if self._engine is None:
            if self._n_vectors >= self.min_index_vectors:
                self._rebuild()
            return
        drifted = self.retrain_factor is not None and self._n_vectors > self.retrain_factor * self._trained
        if self._n_vectors < self.min_index_vectors or (not self._pid and not self._pending) or drifted:
            self._rebuild()
            return
        try:
            self._flush_incremental()
        except WarpEngineError as e:
            warnings.warn(f"{e}; rebuilding the WARP index from the stored vectors", RuntimeWarning,
                          stacklevel=3)
            self._close_engine()
            self._rebuild()

    def _flush_incremental(self) -> None:
        assert self._engine is not None
        engine = self._engine
        pending = list(self._pending)
        dead = sorted(self._dead)
        folder = self.path / self._index_dir
        with self._tx() as db:
            self._state_set(db, dirty="1")
        if dead:
            self._call("delete", engine.delete, dead, compact_threshold=None)
        self._close_engine()  # the engine rewrites files the searcher maps
        new: list[int] = []
        if pending:
            with _quiet_kmeans():
                new = [int(p) for p in self._call(
                    "add", engine.add, self._tensors(pending), reload=False, min_outliers=self.min_outliers,
                    max_growth_rate=self.max_growth_rate,
                    max_points_per_centroid=self._build["max_points_per_centroid"], show_progress=False)]
            if len(new) != len(pending) or len(set(new)) != len(new) or set(new) & set(self._seq_of_pid):
                raise WarpEngineError(f"add returned {len(new)} passage ids for {len(pending)} documents "
                                      "(or ids already in use)")
        # the engine's num_passages keeps counting tombstoned passages until it compacts
        n_engine, n_tomb = self._engine_passages(folder), self._tombstones(folder)
        if n_tomb and n_tomb / max(1, n_engine) >= self.compact_threshold:
            self._call("compact", engine.compact, reload=False, show_progress=False)
            n_engine, n_tomb = self._engine_passages(folder), self._tombstones(folder)
        if n_engine - n_tomb != len(self._pid) + len(new):
            raise WarpEngineError(f"after the flush the engine holds {n_engine - n_tomb} live passages, "
                                  f"the store {len(self._pid) + len(new)}")
        fresh = self._warp_mod.XTRWarp(str(folder), device=self.device)
        self._call("load", fresh.load, device=self.device)
        fsync_tree(folder)  # the engine's files are durable before the flag is cleared
        with self._tx() as db:
            db.executemany("UPDATE docs SET pid = ? WHERE seq = ?", list(zip(new, pending, strict=True)))
            for i in range(0, len(dead), _SQL_CHUNK):
                chunk = dead[i:i + _SQL_CHUNK]
                db.execute(f"DELETE FROM dead WHERE pid IN ({','.join('?' * len(chunk))})", chunk)
            self._state_set(db, dirty="0")
        self._engine = fresh
        for p, s in zip(new, pending, strict=True):
            self._pid[s], self._seq_of_pid[p] = p, s
        self._pending = {}
        self._dead = set()

    @staticmethod
    def _tombstones(folder: Path) -> int:
        path = folder / "deleted_pids.npy"
        try:
            return len(np.load(path, allow_pickle=False)) if path.exists() else 0
        except (OSError, ValueError) as e:
            raise WarpEngineError(f"the index tombstones are unreadable: {e}") from e

    @staticmethod
    def _engine_passages(folder: Path) -> int:
        try:
            return int(json.loads((folder / "metadata.json").read_text())["num_passages"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise WarpEngineError(f"the index metadata is unreadable: {e}") from e

    # -- writes ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreInUse("this WarpStore is closed")

    def _retire(self, db: sqlite3.Connection, seqs: list[int]) -> None:
        """Delete the rows of ``seqs`` and record the engine pids they leave behind."""
        for i in range(0, len(seqs), _SQL_CHUNK):
            chunk = seqs[i:i + _SQL_CHUNK]
            db.execute(f"DELETE FROM docs WHERE seq IN ({','.join('?' * len(chunk))})", chunk)
        dead = [(self._pid[s],) for s in seqs if s in self._pid]
        db.executemany("INSERT OR IGNORE INTO dead (pid) VALUES (?)", dead)

    def _forget(self, seqs: list[int]) -> None:
        for s in seqs:
            self._n_vectors -= self._rows.pop(s)
            del self._seq_of[self._id_of.pop(s)]
            del self._start[s], self._meta[s]
            self._pending.pop(s, None)
            pid = self._pid.pop(s, None)
            if pid is not None:
                del self._seq_of_pid[pid]
                self._dead.add(pid)

    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        with self._lock:
            self._check_open()
            assert self._vf is not None
            old = [self._seq_of[x] for x in ids if x in self._seq_of]
            new = list(range(self._last_seq + 1, self._last_seq + 1 + len(ids)))
            starts = self._vf.append(vectors)  # durable before any row points at it
            rows = [(s, x, int(st), len(v), json.dumps(m, ensure_ascii=False))
                    for s, x, st, v, m in zip(new, ids, starts, vectors, metadata, strict=True)]
            with self._tx() as db:
                self._retire(db, old)
                db.executemany("INSERT INTO docs (seq, id, start, n_rows, pid, metadata) "
                               "VALUES (?, ?, ?, ?, NULL, ?)", rows)
                self._state_set(db, vf_rows=self._vf.n_rows, last_seq=new[-1])
            self._last_seq = new[-1]
            self._forget(old)
            for s, x, st, v, m in zip(new, ids, starts, vectors, metadata, strict=True):
                self._remember(s, x, int(st), len(v), m)
                self._pending[s] = None
            self._maybe_rewrite_vectors()

    def _delete(self, ids: list[str]) -> None:
        with self._lock:
            self._check_open()
            old = [self._seq_of[x] for x in ids if x in self._seq_of]
            if not old:
                return
            with self._tx() as db:
                self._retire(db, old)
            self._forget(old)
            self._maybe_rewrite_vectors()

    def _maybe_rewrite_vectors(self) -> None:
        """Copy the live vectors into a fresh file once more than half the file is garbage."""
        assert self._vf is not None
        garbage = self._vf.n_rows - self._n_vectors
        if garbage < 65536 or garbage <= self._n_vectors:
            return
        live = sorted(self._id_of)
        gen = int(self._state_get("vf_generation", "1") or 1) + 1
        starts = np.fromiter((self._start[s] for s in live), dtype=np.int64, count=len(live))
        lengths = np.fromiter((self._rows[s] for s in live), dtype=np.int64, count=len(live))
        try:
            new_vf, new_starts = self._vf.rewrite(self.path, gen, starts, lengths)
        except OSError as e:  # the write itself is committed; the garbage rows only cost disk
            warnings.warn(f"could not compact the vector file of {self.path}: {e}", RuntimeWarning,
                          stacklevel=4)
            return
        try:
            with self._tx() as db:
                db.executemany("UPDATE docs SET start = ? WHERE seq = ?",
                               [(int(st), s) for st, s in zip(new_starts, live, strict=True)])
                self._state_set(db, vf_generation=gen, vf_rows=new_vf.n_rows)
        except (OSError, sqlite3.Error) as e:
            named = committed_generation(self._db, "vf_generation")
            if named != gen:  # not committed: the new file is nobody's (unless unreadable: kept)
                new_vf.close()
                if named == gen - 1:
                    new_vf.path.unlink(missing_ok=True)
                warnings.warn(f"could not compact the vector file of {self.path}: {e}", RuntimeWarning,
                              stacklevel=4)
                return
        old, self._vf = self._vf, new_vf
        old.close()
        for st, s in zip(new_starts, live, strict=True):
            self._start[s] = int(st)
        remove_other_generations(self.path, keep=new_vf.path.name)

    # -- reads -----------------------------------------------------------------------------
    def count(self) -> int:
        return len(self._id_of)

    def _scan(self, conditions: tuple[Condition, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        """From the id map in memory (the committed SQLite rows), in insertion order."""
        with self._lock:
            self._check_open()
            found = [(self._id_of[s], json.loads(json.dumps(self._meta[s])))
                     for s in sorted(self._id_of) if matches(self._meta[s], conditions)]
        for i in range(0, len(found), batch_size):
            yield found[i:i + batch_size]

    def _get(self, ids: list[str]) -> list[Record]:
        with self._lock:
            self._check_open()
            assert self._vf is not None
            seqs = [self._seq_of[x] for x in ids if x in self._seq_of]
            return [Record(self._id_of[s], self._vf.read(self._start[s], self._rows[s]),
                           json.loads(json.dumps(self._meta[s]))) for s in seqs]

    def _hit(self, seq: int, score: float) -> Hit:
        return Hit(self._id_of[seq], finite_score(score), json.loads(json.dumps(self._meta[seq])))

    def _search(self, query: np.ndarray, k: int, conditions: tuple[Condition, ...]) -> list[Hit]:
        return self._search_batch([query], k, conditions)[0]

    def _search_batch(
        self, queries: list[np.ndarray], k: int, conditions: tuple[Condition, ...]
    ) -> list[list[Hit]]:
        with self._lock:
            self._check_open()
            if len(self._pending) + len(self._dead) > self.buffer_size \
                    or (not self.rerank and (self._pending or self._dead)):
                self._flush()
            if not self._id_of:
                return [[] for _ in queries]
            # dicts keep insertion order, which is sequence order: no sorting
            if conditions:
                live = [s for s in self._id_of if matches(self._meta[s], conditions)]
                if not live:
                    return [[] for _ in queries]
                indexed = [s for s in live if s in self._pid] if self._engine is not None else []
                pending = [s for s in live if s not in self._pid] if indexed else live
                n_indexed = len(indexed)
                subset: list[int] | None = None if n_indexed == len(self._pid) \
                    else [self._pid[s] for s in indexed]
            else:
                live = None  # all documents; listed only when needed
                n_indexed = len(self._pid) if self._engine is not None else 0
                pending = list(self._pending) if n_indexed else list(self._id_of)
                subset = None
            pool = max(self.n_rerank, k) if self.rerank else k
            if not n_indexed or (self.rerank and n_indexed <= pool):
                return self._exact(queries, list(self._id_of) if live is None else live, k)
            found = self._engine_search(queries, pool + (len(self._dead) if subset is None else 0), subset)
            out = []
            for q, cands in zip(queries, found, strict=True):
                cands = [(s, sc) for s, sc in cands if s in self._id_of][:pool]
                if len(cands) < min(k, n_indexed):  # the engine came up short: score them all
                    out.append(self._exact([q], list(self._id_of) if live is None else live, k)[0])
                elif self.rerank:
                    out.append(self._exact([q], sorted({s for s, _ in cands} | set(pending)), k)[0])
                else:
                    out.append([self._hit(s, sc) for s, sc in cands[:k]])
            return out

    def _exact(self, queries: list[np.ndarray], seqs: list[int], k: int) -> list[list[Hit]]:
        """Exact MaxSim of ``queries`` over the stored vectors of ``seqs`` (ties: lower seq)."""
        if not seqs:
            return [[] for _ in queries]
        mat, off = self._gather(seqs)
        scores = maxsim_scores(queries, mat, off)
        return [[self._hit(seqs[i], row[i]) for i in top_k(row, k)] for row in scores]

    def _engine_search(self, queries: list[np.ndarray], top: int,
                       subset: list[int] | None) -> list[list[tuple[int, float]]]:
        """Engine candidates per query as (seq, score), best first (unknown pids dropped).
        Queries go one at a time: the engine pads a batch with zero rows."""
        assert self._engine is not None
        torch = self._torch
        out = []
        for q in queries:
            res = self._call("search", self._engine.search, torch.from_numpy(np.ascontiguousarray(q)),
                              top_k=top, num_threads=self.num_threads, batch_size=self.search_batch_size,
                              subset=subset, show_progress=False, **self.search_params)
            out.append([(self._seq_of_pid.get(int(p), -1), float(s)) for p, s in res[0]])
        return out

    # -- housekeeping ----------------------------------------------------------------------
    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk: ``warp_index`` (the engine directory) and ``stored`` (the vector file
        and SQLite: original vectors, ids, metadata)."""
        with self._lock:
            self._check_open()
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # count each stored byte once
            idx = sum(p.stat().st_size for p in (self.path / self._index_dir).rglob("*") if p.is_file()) \
                if self._index_dir else 0
            stored = sum(p.stat().st_size for p in self.path.glob(DB_NAME + "*") if p.is_file())
            assert self._vf is not None
            stored += self._vf.path.stat().st_size
            return {"warp_index": idx, "stored": stored}

    def _release(self) -> None:
        self._close_engine()
        if self._vf is not None:
            self._vf.close()
            self._vf = None
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
        if self._lockfile is not None:
            self._lockfile.close()  # releases the flock
            self._lockfile = None
        self._worker.stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._release()

    def __del__(self) -> None:  # a store dropped without close(): free the engine on its thread
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self.close()


__all__ = ["BUILD_DEFAULTS", "WarpEngineError", "WarpStore", "engine_call", "file_name"]
