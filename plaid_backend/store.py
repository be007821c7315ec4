"""PLAID over fast-plaid: string ids, upserts, deletes, filters, a durable id map, exact rerank.

:class:`PlaidStore` keeps two things in a directory:

* ``store.sqlite`` (SQLite in WAL mode, ``synchronous=FULL``): the source of truth. One row
  per document: its string id, an insertion sequence number, where its original vectors are in
  the vector file (first row, number of rows) and its JSON metadata; plus a small state table
  (the saved build parameters, the name of the current PLAID index directory, a *dirty* flag,
  the vector file's generation and committed row count). No pickle anywhere.
* ``vectors-NNNNNN.f16`` (or ``.f32``): the original vectors (float16 by default), one
  append-only memory-mapped file (:class:`~uibk_embedding.vectorfile.VectorFile`). Rows are
  appended and ``fsync``'d *before* the SQLite transaction that references them commits, so a
  committed row never points at missing vectors; rows never committed are cut off on open.
  Deleted and overwritten documents leave dead rows, copied away (a new generation, switched to
  in one transaction) when they exceed ``vector_compact_fraction`` of the file and on
  :meth:`PlaidStore.rebuild`. The exact rerank reads its candidates from this map: no database
  read per query.
* ``plaid-NNNNNN/``: a fast-plaid index built from those vectors. fast-plaid numbers documents
  by insertion position and renumbers later documents on delete, so the position of a document
  is, by construction, its rank by sequence number among the live documents: the id map needs
  no separate bookkeeping that could drift.

A write appends the batch's vectors to the vector file, then one SQLite transaction stores the
batch (ids, metadata, vector locations) and marks the index dirty, then the fast-plaid update,
then a second transaction that clears the flag. A process killed at any point leaves either
the whole batch (committed; the index is rebuilt from the stored vectors on the next open
because it is dirty) or none of it (not committed; its appended rows are cut off). A rebuild writes a
fresh ``plaid-NNNNNN/`` directory and switches to it in one transaction.

Searching asks PLAID for candidates and, with ``rerank=True`` (the default), rescores them
with exact MaxSim on the stored vectors. fast-plaid does not normalise query vectors, so the
query-time dense weight (scaled query slots) also works without rerank. Collections with
fewer than ``min_index_vectors`` vectors have no PLAID index (fast-plaid cannot train its
codec on a handful of vectors) and are searched exactly; with rerank on, so are collections
(or filtered subsets) no larger than the rerank pool, since reranking all of them *is*
exact search.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.encoder.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> mk = lambda n: fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))
>>> store = PlaidStore(nbits=2, num_threads=1)          # a temporary directory
>>> docs = [mk(30) for _ in range(4)]
>>> store.upsert(["a", "b", "c", "d"], docs, [{"lang": "en"}, {}, {"lang": "de"}, {}])
>>> store.has_index, store.count()
(True, 4)
>>> [h.id for h in store.search(docs[2], k=2, filter={"lang": "de"})]
['c']
>>> store.delete(["a"]); store.count()
3
>>> store.close()
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import importlib.metadata
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
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
from uibk_embedding.encoder.tagged import DIM, TaggedFormat
from uibk_embedding.errors import CollectionMismatch, EngineError, StoreInUse, call_engine
from uibk_embedding.maxsim import maxsim_scores, pack, top_k
from uibk_embedding.vectorfile import VectorFile, remove_other_generations

SCHEMA_VERSION = 2
"""2: original vectors in a memory-mapped vector file, ``(start, n_rows)`` per SQLite row.
1: original vectors as SQLite blobs (converted on open)."""
DB_NAME = "store.sqlite"
LOCK_NAME = "store.lock"
_INDEX_PREFIX = "plaid-"
_SQL_CHUNK = 900  # bound parameters per statement (SQLite's default limit is 999)

#: Build parameters saved with a store (the engine's defaults; ``vector_dtype`` is ours).
BUILD_DEFAULTS: dict[str, Any] = {
    "nbits": 4,
    "kmeans_niters": 4,
    "max_points_per_centroid": 256,
    "n_samples_kmeans": None,
    "seed": 42,
    "vector_dtype": "float16",
    "n_centroids": None,
}
#: Build parameters a store saved before they existed get these values (the behaviour it had).
_BUILD_LEGACY: dict[str, Any] = {"n_centroids": None}
_PATCH_LOCK = threading.Lock()


def centroid_heuristic(n_vectors: int) -> int:
    """fast-plaid's number of centroids for ``n_vectors`` stored vectors: the power of two at
    or below ``16 * sqrt(n_vectors)``.

    >>> centroid_heuristic(582_526), centroid_heuristic(1_450_000)
    (8192, 16384)
    """
    return 2 ** int(np.floor(np.log2(16 * np.sqrt(max(1, n_vectors)))))


class PlaidEngineError(EngineError):
    """fast-plaid failed or panicked (its Rust panics are BaseException; they become this)."""


@contextlib.contextmanager
def _frozen_gc() -> Iterator[None]:
    """fast-plaid calls ``gc.collect()`` up to 14 times per update; with torch loaded each call
    walks ~180k objects (1.5 s apiece measured on a busy 2-core machine). Objects that exist
    before the call are frozen for its duration, so those collections only look at the new
    ones; nothing is lost (they are unfrozen afterwards). Left alone if the application froze
    objects itself."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def engine_call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call into fast-plaid (gc frozen), its errors and Rust panics raised as
    :class:`PlaidEngineError` (:func:`uibk_embedding.errors.call_engine`).

    >>> try:
    ...     engine_call("a division", lambda: 1 / 0)
    ... except PlaidEngineError as e:
    ...     print(e)
    fast-plaid failed during a division: ZeroDivisionError: division by zero
    """
    with _frozen_gc():
        return call_engine("fast-plaid", PlaidEngineError, what, fn, *args, **kwargs)


class PlaidStore(MultiVectorStore):
    """A PLAID index (fast-plaid) with string ids, metadata filters and optional exact rerank.

    Parameters
    ----------
    path:
        Directory of the store (created when missing, reopened when it holds one). ``None``:
        a temporary directory removed by :meth:`close`.
    format:
        The tagged format (saved with the store; used for decompositions).
    nbits, kmeans_niters, max_points_per_centroid, n_samples_kmeans, seed:
        fast-plaid build parameters (bits per residual dimension; k-means iterations, points
        per centroid and sample size; the seed of k-means and of torch's generator, which is
        seeded before every build so builds are reproducible). Saved with the store; ``None``
        means the saved value (or the engine default for a new store: 4, 4, 256, auto, 42).
    vector_dtype:
        ``"float16"`` (default) or ``"float32"``: how the original vectors are kept (for
        ``get``, rerank and rebuilds). float32 makes the reranked scores exact to float32.
    vector_compact_fraction:
        When deleted or overwritten documents' rows exceed this fraction of the vector file, the
        live rows are copied into a new file (amortised: each written row is copied O(1) times).
    n_centroids:
        Upper bound on the number of PLAID centroids (k-means clusters); ``None``: fast-plaid's
        heuristic (:func:`centroid_heuristic`). Both k-means and the compression of every
        vector cost time proportional to it. Saved with the store.
    n_ivf_probe, n_full_scores:
        fast-plaid search parameters (centroids probed per query vector; candidates scored in
        full). Defaults 2 and 512 (the engine's: 8 and 4096), measured on NPL with the exact
        rerank of 100: recall@10 vs exact 0.996, 10x faster than 8 / 4096 (docs/plaid.md).
    rerank:
        Rescore PLAID's candidates with exact MaxSim on the stored vectors (default on; see
        ``docs/plaid.md`` for the measurements behind that default).
    n_rerank:
        Candidates asked from PLAID when reranking (at least ``k``).
    index_batch_size, search_batch_size:
        fast-plaid ``batch_size`` for create/update (embeddings) and for search (queries).
    rebuild_growth:
        When the store holds more than this many times the vectors its index was last built
        from, the next write rebuilds the index from all stored vectors (new centroids) instead
        of adding to it (default 2.0; ``None``: never). fast-plaid's update assigns new
        documents to the existing centroids, so a collection indexed in batches would otherwise
        keep the centroids of its first batch (NPL indexed 512 documents at a time: recall@10
        vs exact 0.976 instead of 0.996). Doubling keeps the total build work within about
        twice one build of the final collection.
    buffer_size, start_from_scratch:
        fast-plaid update parameters: new documents buffered before centroids are extended,
        and the index size below which an update rebuilds the index (engine defaults 100, 999).
    min_index_vectors:
        Below this many stored vectors no PLAID index is built and search is exact.
    num_threads:
        ``torch.set_num_threads`` (process-wide) when given. Under CPU contention libtorch's
        threads can stall each other (one query took 2.2 s instead of 35 ms); 1 avoids that.
    device:
        fast-plaid device, ``"cpu"`` or ``"cuda:N"``.
    """

    backend = "plaid"
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
        seed: int | None = None,
        vector_dtype: str | None = None,
        n_centroids: int | None = None,
        n_ivf_probe: int = 2,
        n_full_scores: int = 512,
        rerank: bool = True,
        n_rerank: int = 100,
        index_batch_size: int = 50_000,
        search_batch_size: int = 2000,
        buffer_size: int = 100,
        start_from_scratch: int = 999,
        min_index_vectors: int = 64,
        num_threads: int | None = None,
        device: str = "cpu",
        vector_compact_fraction: float = 0.5,
        rebuild_growth: float | None = 2.0,
    ) -> None:
        super().__init__(format)
        for name, value in [("n_ivf_probe", n_ivf_probe), ("n_full_scores", n_full_scores),
                            ("n_rerank", n_rerank), ("index_batch_size", index_batch_size),
                            ("search_batch_size", search_batch_size), ("buffer_size", buffer_size),
                            ("min_index_vectors", min_index_vectors)]:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be a positive int or None, got {num_threads!r}")
        vcf = vector_compact_fraction
        if isinstance(vcf, bool) or not isinstance(vcf, (int, float)) or not 0 < vcf <= 1:
            raise ValueError(f"vector_compact_fraction must be in (0, 1], got {vector_compact_fraction!r}")
        if rebuild_growth is not None and (isinstance(rebuild_growth, bool)
                                           or not isinstance(rebuild_growth, (int, float))
                                           or not rebuild_growth > 1):
            raise ValueError(f"rebuild_growth must be a number > 1 or None, got {rebuild_growth!r}")
        self._torch = require("torch", "plaid", "the PLAID backend")
        self._fp_mod = require("fast_plaid.search", "plaid", "the PLAID backend")
        self._blas = require("threadpoolctl", "plaid", "the PLAID backend").ThreadpoolController()
        self.engine_version = importlib.metadata.version("fast-plaid")
        if num_threads is not None:
            self._torch.set_num_threads(num_threads)
        self.num_threads = num_threads
        self.n_ivf_probe = n_ivf_probe
        self.n_full_scores = n_full_scores
        self.rerank = bool(rerank)
        self.n_rerank = n_rerank
        self.index_batch_size = index_batch_size
        self.search_batch_size = search_batch_size
        self.buffer_size = buffer_size
        self.start_from_scratch = start_from_scratch
        self.min_index_vectors = min_index_vectors
        self.device = device
        self.vector_compact_fraction = float(vector_compact_fraction)
        self.rebuild_growth = None if rebuild_growth is None else float(rebuild_growth)
        given = {"nbits": nbits, "kmeans_niters": kmeans_niters,
                 "max_points_per_centroid": max_points_per_centroid,
                 "n_samples_kmeans": n_samples_kmeans, "seed": seed, "vector_dtype": vector_dtype,
                 "n_centroids": n_centroids}
        self._check_build_params(given)

        self._lock = threading.RLock()
        self._closed = False
        self._tmpdir: str | None = None
        if path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="uibk-plaid-")
            path = self._tmpdir
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lockfile = self._acquire_dir_lock()
        self._fp: Any = None
        # in-memory view of the id map: position i <-> sequence number self._order[i], whose
        # vectors are rows self._starts[i] .. + self._lens[i] of the vector file
        self._order = np.zeros(0, np.int64)
        self._starts = np.zeros(0, np.int64)
        self._lens = np.zeros(0, np.int64)
        self._id_of: dict[int, str] = {}
        self._seq_of: dict[str, int] = {}
        self._meta: dict[int, dict] = {}
        self._vf: VectorFile | None = None
        self._vgen = 0
        try:
            self._refuse_foreign_folder()
            self._db = self._connect()
            self._open(format, given)
        except BaseException:
            self._release()
            raise

    # -- configuration ---------------------------------------------------------------------
    @staticmethod
    def _check_build_params(given: dict[str, Any]) -> None:
        for name in ("nbits", "kmeans_niters", "max_points_per_centroid", "n_samples_kmeans", "seed",
                     "n_centroids"):
            v = given[name]
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"{name} must be a non-negative int, got {v!r}")
        if given["n_centroids"] == 0:
            raise ValueError("n_centroids must be a positive int or None, got 0")
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
        """Whether a PLAID index exists (False for empty or tiny stores, searched exactly)."""
        return self._fp is not None

    # -- files -----------------------------------------------------------------------------
    def _acquire_dir_lock(self) -> Any:
        return lock_folder(self.path / LOCK_NAME, f"the PLAID store at {self.path}", "PlaidStore")

    _DOCS_TABLE = ("(seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, n_rows INTEGER NOT NULL, "
                   "start INTEGER NOT NULL, metadata TEXT NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        return connect(self.path / DB_NAME)

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db)

    def _state_get(self, key: str, default: str | None = None) -> str | None:
        return state_get(self._db, key, default)

    _state_set = staticmethod(state_set)

    def _open(self, format: TaggedFormat | None, given: dict[str, Any]) -> None:
        raw = self._state_get("config")
        if raw is None:
            if self._db.execute("SELECT name FROM sqlite_master WHERE name = 'docs'").fetchone():
                raise CollectionMismatch(f"{self.path / DB_NAME} has documents but no configuration: not "
                                         "a PLAID store this library wrote; refusing to guess its layout")
            self._build = {k: (BUILD_DEFAULTS[k] if v is None else v) for k, v in given.items()}
            config = {"backend": "plaid", "schema": SCHEMA_VERSION, "format": self.format.to_stored(),
                      "build": self._build, "engine": f"fast-plaid {self.engine_version}"}
            with self._tx() as db:
                db.execute(f"CREATE TABLE docs {self._DOCS_TABLE}")
                self._state_set(db, config=json.dumps(config), plaid_dir="", dirty="0", generation="0",
                                vector_gen="1", vector_rows="0", built_vectors="0")
            self._generation = 0
            self._plaid_dir = ""
            self._built_vectors = 0
            self._open_vectors()
            return
        config = json.loads(raw)
        if config.get("backend") != "plaid":
            raise CollectionMismatch(
                f"{self.path} does not hold a PLAID store (backend {config.get('backend')!r})")
        if config.get("schema") == 1:
            config = self._migrate_from_schema_1(config)
        if config.get("schema") != SCHEMA_VERSION:
            raise CollectionMismatch(
                f"{self.path} holds a PLAID store of schema {config.get('schema')!r}; this version of "
                f"uibk-embedding reads schema {SCHEMA_VERSION} (and converts 1)")
        self.format = settle_format(TaggedFormat.from_stored(config["format"]), format,
                                    f"store at {self.path}")
        self._build = {**_BUILD_LEGACY, **config["build"]}
        for k, v in given.items():
            if v is not None and v != self._build[k]:
                raise CollectionMismatch(
                    f"store at {self.path} was built with {k}={self._build[k]!r}, not {v!r}: open it "
                    f"without {k}, or index into a new store"
                )
        self._generation = int(self._state_get("generation", "0") or 0)
        self._plaid_dir = self._state_get("plaid_dir", "") or ""
        built = self._state_get("built_vectors")  # absent in stores written before it existed
        rows = self._db.execute("SELECT seq, id, n_rows, start, metadata FROM docs ORDER BY seq").fetchall()
        self._order = np.array([r[0] for r in rows], dtype=np.int64)
        self._lens = np.array([r[2] for r in rows], dtype=np.int64)
        self._starts = np.array([r[3] for r in rows], dtype=np.int64)
        for seq, doc_id, _n, _s, md in rows:
            self._id_of[seq] = doc_id
            self._seq_of[doc_id] = seq
            self._meta[seq] = json.loads(md)
        self._open_vectors()
        self._built_vectors = int(built) if built is not None else self._n_vectors

        reason = None
        engine = config.get("engine")
        if self._state_get("dirty") == "1":
            reason = "an interrupted write left it out of date"
        elif engine != f"fast-plaid {self.engine_version}":
            reason = f"it was built by {engine}, this is fast-plaid {self.engine_version}"
        elif self._plaid_dir:
            n_index = self._index_doc_count(self.path / self._plaid_dir)
            if n_index != len(self._order):
                reason = f"it holds {n_index} documents, the store {len(self._order)}"
            else:
                try:
                    self._fp = engine_call("open", self._fp_mod.FastPlaid,
                                           index=str(self.path / self._plaid_dir), device=self.device)
                except PlaidEngineError as e:
                    reason = str(e)
        elif self._n_vectors >= self.min_index_vectors:
            reason = "it is missing"
        if reason is not None:
            if self._plaid_dir or self._n_vectors >= self.min_index_vectors:
                warnings.warn(f"rebuilding the PLAID index at {self.path} from the stored vectors: "
                              f"{reason}", RuntimeWarning, stacklevel=3)
            if engine != f"fast-plaid {self.engine_version}":
                config["engine"] = f"fast-plaid {self.engine_version}"
                with self._tx() as db:
                    self._state_set(db, config=json.dumps(config))
            try:
                self._rebuild()
            except (PlaidEngineError, OSError, sqlite3.Error) as e:
                self._open_without_index(e)
        self._remove_stale_indexes()

    def _open_without_index(self, error: BaseException) -> None:
        """The index could not be rebuilt on open (a full disk, say): the store opens on its
        committed documents with no index (searches are exact MaxSim over the stored vectors),
        still marked dirty, so the next write or :meth:`rebuild` tries again."""
        if self._fp is not None:
            self._fp.close()
            self._fp = None
        with contextlib.suppress(sqlite3.Error), self._tx() as db:
            self._state_set(db, dirty="1")
        warnings.warn(f"the PLAID index at {self.path} could not be rebuilt ({error}); the store is "
                      "open without an index: searches are exact over the stored vectors until a "
                      "write or rebuild() succeeds", RuntimeWarning, stacklevel=4)

    @property
    def _n_vectors(self) -> int:
        return int(self._lens.sum())

    def _open_vectors(self) -> None:
        """Open the committed generation of the vector file (cutting an uncommitted tail) and
        remove every other one (a compaction that crashed before its switch, or after it)."""
        self._vgen = int(self._state_get("vector_gen", "1") or 1)
        committed = int(self._state_get("vector_rows", "0") or 0)
        if len(self._lens) and int((self._starts + self._lens).max()) > committed:
            raise CollectionMismatch(f"{self.path / DB_NAME} references vector rows beyond the committed "
                                     f"{committed}: the store was modified outside this library")
        self._vf = VectorFile.open(self.path, generation=self._vgen, dtype=self._build["vector_dtype"],
                                   committed_rows=committed)
        remove_other_generations(self.path, keep=self._vf.path.name)

    def _migrate_from_schema_1(self, config: dict[str, Any]) -> dict[str, Any]:
        """Schema 1 kept the original vectors as SQLite blobs: copy them into a vector file
        (durable first), then switch the table, the schema number and the file's generation in
        one transaction. A crash before that commit leaves a schema-1 store (the half-written
        file is cut to nothing and the conversion starts over on the next open)."""
        dtype = np.dtype(config["build"]["vector_dtype"])
        warnings.warn(f"converting the PLAID store at {self.path} from schema 1 (vectors in SQLite) to "
                      f"schema {SCHEMA_VERSION} (vectors in a memory-mapped file)", RuntimeWarning,
                      stacklevel=4)
        vf = VectorFile.open(self.path, generation=1, dtype=dtype.name, committed_rows=0)
        try:
            locations: list[tuple[int, str, int, int, str]] = []
            last = -1
            while True:  # bounded memory: a few thousand documents at a time
                chunk = self._db.execute(
                    "SELECT seq, id, n_rows, vectors, metadata FROM docs WHERE seq > ? "
                    "ORDER BY seq LIMIT 2000", (last,)).fetchall()
                if not chunk:
                    break
                vecs = []
                for seq, _id, n_rows, blob, _md in chunk:
                    v = np.frombuffer(blob, dtype=dtype)
                    if v.size != n_rows * DIM:
                        raise CollectionMismatch(
                            f"{self.path / DB_NAME}: document seq {seq} has {v.size} values for "
                            f"{n_rows} rows of {DIM}; the store is damaged")
                    vecs.append(v.reshape(n_rows, DIM))
                starts = vf.append(vecs)
                locations += [(seq, doc_id, n_rows, int(st), md)
                              for (seq, doc_id, n_rows, _b, md), st in zip(chunk, starts, strict=True)]
                last = chunk[-1][0]
            config = {**config, "schema": SCHEMA_VERSION}
            with self._tx() as db:
                db.execute(f"CREATE TABLE docs_v2 {self._DOCS_TABLE}")
                db.executemany("INSERT INTO docs_v2 (seq, id, n_rows, start, metadata) "
                               "VALUES (?, ?, ?, ?, ?)", locations)
                db.execute("DROP TABLE docs")
                db.execute("ALTER TABLE docs_v2 RENAME TO docs")
                self._state_set(db, config=json.dumps(config), vector_gen="1", vector_rows=str(vf.n_rows))
        finally:
            vf.close()
        self._db.execute("VACUUM")  # give the blobs' pages back to the file system
        return config

    @staticmethod
    def _index_doc_count(index_dir: Path) -> int | None:
        try:
            return int(json.loads((index_dir / "metadata.json").read_text())["num_documents"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _refuse_foreign_folder(self) -> None:
        refuse_foreign_folder(self.path, DB_NAME, LOCK_NAME, "PLAID")

    def _remove_stale_indexes(self) -> None:
        remove_stale_index_dirs(self.path, _INDEX_PREFIX, self._plaid_dir, self._generation)

    # -- the engine ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _seeded(self) -> Iterator[None]:
        """torch's global generator seeded for a build (k-means sampling), then restored."""
        with self._torch.random.fork_rng(devices=[]):
            self._torch.manual_seed(int(self._build["seed"]))
            yield

    @contextlib.contextmanager
    def _centroid_count(self) -> Iterator[None]:
        """fast-plaid's ``create`` takes no number of centroids, but the k-means function it
        calls (``compute_kmeans``, looked up in its module at call time) does: during our
        ``create`` call that function gets ``num_partitions``. (Process-wide for the duration
        of the call: another FastPlaid created at that moment in this process, outside this
        store, would get the same bound.)"""
        bound = self._build["n_centroids"]
        if bound is None:
            yield
            return
        k = min(int(bound), centroid_heuristic(self._n_vectors))
        mod = importlib.import_module(self._fp_mod.FastPlaid.__module__)
        with _PATCH_LOCK:
            original = mod.compute_kmeans
            mod.compute_kmeans = functools.partial(original, num_partitions=k)
            try:
                yield
            finally:
                mod.compute_kmeans = original

    def _engine_kwargs(self) -> dict[str, Any]:
        b = self._build
        return {"kmeans_niters": b["kmeans_niters"], "max_points_per_centroid": b["max_points_per_centroid"],
                "n_samples_kmeans": b["n_samples_kmeans"], "batch_size": self.index_batch_size,
                "seed": b["seed"], "start_from_scratch": self.start_from_scratch}

    def _as_tensors(self, vectors: Sequence[np.ndarray]) -> list:
        return [self._torch.from_numpy(np.ascontiguousarray(v, dtype=np.float16)) for v in vectors]

    def _all_as_tensors(self) -> list:
        """Every live document's stored vectors as float16 tensors, in position order: views
        into one matrix read from the vector file (no per-document copies)."""
        mat, _ = self._vf.gather(self._starts, self._lens, dtype=np.float16)
        return list(self._torch.from_numpy(mat).split(self._lens.tolist()))

    def _rebuild(self) -> None:
        """Build a fresh index from the stored vectors into a new directory, then switch to it."""
        gen = self._generation + 1
        name = f"{_INDEX_PREFIX}{gen:06d}" if self._n_vectors >= self.min_index_vectors else ""
        new_fp = None
        if name:
            target = self.path / name
            shutil.rmtree(target, ignore_errors=True)
            vectors = self._all_as_tensors()
            new_fp = engine_call("open", self._fp_mod.FastPlaid, index=str(target), device=self.device)
            with self._seeded(), self._centroid_count():
                engine_call("create", new_fp.create, vectors, nbits=self._build["nbits"],
                            **self._engine_kwargs())
            del vectors
            fsync_tree(target)  # durable before the state row points at it
        old_fp, old_dir = self._fp, self._plaid_dir
        with self._tx() as db:
            self._state_set(db, plaid_dir=name, generation=str(gen), dirty="0",
                            built_vectors=str(self._n_vectors if name else 0))
        self._fp, self._plaid_dir, self._generation = new_fp, name, gen
        self._built_vectors = self._n_vectors if name else 0
        if old_fp is not None:
            old_fp.close()
        if old_dir and old_dir != name:
            shutil.rmtree(self.path / old_dir, ignore_errors=True)

    def rebuild(self) -> None:
        """Re-cluster: build the PLAID index anew from the stored vectors (e.g. after the
        collection drifted far from the one the centroids were trained on). The vector file is
        compacted first (rows of deleted or overwritten documents dropped)."""
        with self._lock:
            self._check_open()
            self._compact_vectors()
            self._rebuild()

    @property
    def dead_vector_rows(self) -> int:
        """Rows of the vector file that no live document references (removed by compaction)."""
        return self._vf.n_rows - self._n_vectors if self._vf is not None else 0

    def _compact_vectors(self) -> None:
        """Copy the live rows (in position order) into the next generation of the vector file,
        durably, then switch every document's start and the generation in one transaction."""
        gen = self._vgen + 1
        new, starts = self._vf.rewrite(self.path, gen, self._starts, self._lens, chunk_rows=1 << 18)
        try:
            seqs = self._order.tolist()
            with self._tx() as db:
                db.executemany("UPDATE docs SET start = ? WHERE seq = ?",
                               zip(starts.tolist(), seqs, strict=True))
                self._state_set(db, vector_gen=str(gen), vector_rows=str(new.n_rows))
        except BaseException:
            named = committed_generation(self._db, "vector_gen")
            if named != gen:  # not committed: the new file is nobody's (unless unreadable: kept)
                new.close()
                if named == self._vgen:
                    new.path.unlink(missing_ok=True)
                raise
        old, self._vf, self._vgen, self._starts = self._vf, new, gen, starts
        old.close()
        remove_other_generations(self.path, keep=new.path.name)

    def _maybe_compact_vectors(self) -> None:
        if self.dead_vector_rows > self.vector_compact_fraction * self._vf.n_rows:
            try:
                self._compact_vectors()
            except (OSError, sqlite3.Error) as e:  # the write is committed; dead rows only cost disk
                warnings.warn(f"could not compact the vector file of {self.path}: {e}", RuntimeWarning,
                              stacklevel=4)

    def _sync_engine(self, del_positions: list[int], n_index_before: int, added: list[np.ndarray]) -> None:
        """Bring the PLAID index in line with the committed store; rebuild on any failure.

        If even the rebuild fails, the index is dropped (searches fall back to exact MaxSim on
        the stored vectors, which stay committed) and the error is raised; the dirty flag stays
        set, so the next write or open rebuilds it."""
        try:
            self._sync_engine_or_rebuild(del_positions, n_index_before, added)
        except BaseException:
            if self._fp is not None:
                self._fp.close()
                self._fp = None
            raise

    def _sync_engine_or_rebuild(self, del_positions: list[int], n_index_before: int,
                                added: list[np.ndarray]) -> None:
        try:
            grown = self.rebuild_growth is not None \
                and self._n_vectors > self.rebuild_growth * self._built_vectors
            if self._fp is None or self._n_vectors < self.min_index_vectors \
                    or len(del_positions) >= n_index_before or grown:
                self._rebuild()
                return
            if del_positions:
                engine_call("delete", self._fp.delete, sorted(del_positions))
            if added:
                with self._seeded():
                    engine_call("update", self._fp.update, self._as_tensors(added),
                                buffer_size=self.buffer_size, **self._engine_kwargs())
            n_index = self._index_doc_count(self.path / self._plaid_dir)
            if n_index != len(self._order):
                raise PlaidEngineError(f"after the update the index holds {n_index} documents, "
                                       f"the store {len(self._order)}")
            # the engine updated its files in place without fsync: durable before the clean flag,
            # or a power cut leaves the old index trusted and positions mapped to other ids
            fsync_tree(self.path / self._plaid_dir)
            with self._tx() as db:
                self._state_set(db, dirty="0")
        except PlaidEngineError as e:
            warnings.warn(f"{e}; rebuilding the PLAID index from the stored vectors", RuntimeWarning,
                          stacklevel=4)
            self._rebuild()

    # -- positions -------------------------------------------------------------------------
    def _positions(self, seqs: Sequence[int]) -> list[int]:
        return np.searchsorted(self._order, np.asarray(seqs, dtype=np.int64)).tolist()

    # -- writes ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreInUse("this PlaidStore is closed")

    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        with self._lock:
            self._check_open()
            old = [self._seq_of[x] for x in ids if x in self._seq_of]
            del_positions = self._positions(old)
            n_before = len(self._order)
            top = int(self._order[-1]) if len(self._order) else 0
            new = list(range(top + 1, top + 1 + len(ids)))
            dtype = self._build["vector_dtype"]
            # durable in the vector file BEFORE the rows that reference them commit
            starts = self._vf.append(vectors)
            lens = np.fromiter((len(v) for v in vectors), dtype=np.int64, count=len(vectors))
            rows = [(s, x, int(n), int(st), json.dumps(m, ensure_ascii=False))
                    for s, x, n, st, m in zip(new, ids, lens, starts, metadata, strict=True)]
            with self._tx() as db:
                self._state_set(db, dirty="1", vector_rows=str(self._vf.n_rows))
                for i in range(0, len(old), _SQL_CHUNK):
                    chunk = old[i:i + _SQL_CHUNK]
                    db.execute(f"DELETE FROM docs WHERE seq IN ({','.join('?' * len(chunk))})", chunk)
                db.executemany("INSERT INTO docs (seq, id, n_rows, start, metadata) VALUES (?, ?, ?, ?, ?)",
                               rows)
            self._forget(old)
            for s, x, m in zip(new, ids, metadata, strict=True):
                self._id_of[s], self._seq_of[x], self._meta[s] = x, s, m
            keep = np.ones(len(self._order), bool)
            keep[del_positions] = False
            self._order = np.concatenate([self._order[keep], np.asarray(new, dtype=np.int64)])
            self._starts = np.concatenate([self._starts[keep], starts])
            self._lens = np.concatenate([self._lens[keep], lens])
            if dtype == "float16":  # the index is built from what is stored
                vectors = [v.astype(np.float16) for v in vectors]
            try:
                self._sync_engine(del_positions, n_before, vectors)
            finally:
                self._maybe_compact_vectors()

    def _forget(self, seqs: list[int]) -> None:
        for s in seqs:
            del self._seq_of[self._id_of.pop(s)]
            del self._meta[s]

    def _delete(self, ids: list[str]) -> None:
        with self._lock:
            self._check_open()
            old = [self._seq_of[x] for x in ids if x in self._seq_of]
            if not old:
                return
            del_positions = self._positions(old)
            n_before = len(self._order)
            with self._tx() as db:
                self._state_set(db, dirty="1")
                for i in range(0, len(old), _SQL_CHUNK):
                    chunk = old[i:i + _SQL_CHUNK]
                    db.execute(f"DELETE FROM docs WHERE seq IN ({','.join('?' * len(chunk))})", chunk)
            self._forget(old)
            keep = np.ones(len(self._order), bool)
            keep[del_positions] = False
            self._order, self._starts, self._lens = self._order[keep], self._starts[keep], self._lens[keep]
            try:
                self._sync_engine(del_positions, n_before, [])
            finally:
                self._maybe_compact_vectors()

    # -- reads -----------------------------------------------------------------------------
    def _scan(self, conditions: tuple[Condition, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        """From the id map in memory (the committed SQLite rows), in insertion order."""
        with self._lock:
            self._check_open()
            found = [(self._id_of[s], json.loads(json.dumps(self._meta[s])))
                     for s in self._order.tolist() if matches(self._meta[s], conditions)]
        for i in range(0, len(found), batch_size):
            yield found[i:i + batch_size]

    def count(self) -> int:
        return len(self._order)

    def _get(self, ids: list[str]) -> list[Record]:
        with self._lock:
            self._check_open()
            seqs = [self._seq_of[x] for x in ids if x in self._seq_of]
            return [Record(self._id_of[s], self._vf.read(int(self._starts[p]), int(self._lens[p])),
                           json.loads(json.dumps(self._meta[s])))
                    for s, p in zip(seqs, self._positions(seqs), strict=True)]

    def _hit(self, seq: int, score: float) -> Hit:
        return Hit(self._id_of[seq], finite_score(score), json.loads(json.dumps(self._meta[seq])))

    def _search(self, query: np.ndarray, k: int, conditions: tuple[Condition, ...]) -> list[Hit]:
        return self._search_batch([query], k, conditions)[0]

    def _search_batch(
        self, queries: list[np.ndarray], k: int, conditions: tuple[Condition, ...]
    ) -> list[list[Hit]]:
        with self._lock:
            self._check_open()
            n = len(self._order)
            if n == 0:
                return [[] for _ in queries]
            allowed: np.ndarray | None = None
            if conditions:
                mask = np.fromiter((matches(self._meta[s], conditions) for s in self._order.tolist()),
                                   dtype=bool, count=n)
                allowed = np.flatnonzero(mask)
                if len(allowed) == 0:
                    return [[] for _ in queries]
            n_allowed = n if allowed is None else len(allowed)
            pool = max(self.n_rerank, k) if self.rerank else k
            if self._fp is None or (self.rerank and n_allowed <= pool):
                positions = np.arange(n) if allowed is None else allowed
                return self._exact(queries, positions, k)
            found = self._engine_search(queries, pool, allowed)
            if self.rerank:
                return [self._exact([q], np.unique(np.fromiter((p for p, _ in cands), np.int64)), k)[0]
                        for q, cands in zip(queries, found, strict=True)]
            out = []
            for q, cands in zip(queries, found, strict=True):
                if len(cands) < min(k, n_allowed):
                    cands = self._fill_decompressed(q, cands, allowed, k)
                out.append([self._hit(int(self._order[p]), sc) for p, sc in cands[:k]])
            return out

    def _exact(self, queries: list[np.ndarray], positions: np.ndarray, k: int) -> list[list[Hit]]:
        """Exact MaxSim of ``queries`` over the stored vectors of the documents at ``positions``
        (ascending, so ties go to the lower sequence number), read from the memory-mapped file."""
        if len(positions) == 0:
            return [[] for _ in queries]
        mat, off = self._vf.gather(self._starts[positions], self._lens[positions])
        # one BLAS thread: these products are small, and a second OpenBLAS thread keeps
        # spinning after the call, taking a core from fast-plaid's next search (measured:
        # 10 ms engine search became 38 ms after a two-thread rerank on 2 cores)
        with self._blas.limit(limits=1, user_api="blas"):
            scores = maxsim_scores(queries, mat, off)
        seqs = self._order[positions]
        return [[self._hit(int(seqs[i]), row[i]) for i in top_k(row, k)] for row in scores]

    def _engine_search(self, queries: list[np.ndarray], top: int,
                       allowed: np.ndarray | None) -> list[list[tuple[int, float]]]:
        """PLAID candidates per query as (position, score), best first. Queries of one length go
        together, so no zero padding changes which centroids are probed."""
        torch = self._torch
        subset = None if allowed is None else allowed.tolist()
        out: list[list[tuple[int, float]]] = [[] for _ in queries]
        by_len: dict[int, list[int]] = {}
        for i, q in enumerate(queries):
            by_len.setdefault(len(q), []).append(i)
        n = len(self._order)
        for idx in by_len.values():
            batch = torch.from_numpy(np.stack([queries[i] for i in idx]).astype(np.float16))
            res = engine_call("search", self._fp.search, batch, top_k=top, batch_size=self.search_batch_size,
                              n_full_scores=max(self.n_full_scores, top), n_ivf_probe=self.n_ivf_probe,
                              show_progress=False, subset=subset, n_processes=1)
            for i, pairs in zip(idx, res, strict=True):
                if any(not 0 <= p < n for p, _ in pairs):
                    raise PlaidEngineError(f"fast-plaid returned a position outside 0..{n - 1}")
                out[i] = [(int(p), float(s)) for p, s in pairs]
        return out

    def _fill_decompressed(self, q: np.ndarray, cands: list[tuple[int, float]],
                           allowed: np.ndarray | None, k: int) -> list[tuple[int, float]]:
        """PLAID found fewer than ``k`` of the allowed documents: score the rest on their
        decompressed vectors (what PLAID scores), so ``k >= count`` returns every document."""
        have = {p for p, _ in cands}
        positions = np.arange(len(self._order)) if allowed is None else allowed
        missing = [int(p) for p in positions if int(p) not in have]
        embs = engine_call("get_embeddings", self._fp.get_embeddings, missing)
        mat, off = pack([e.float().numpy() for e in embs])
        scores = maxsim_scores([q], mat, off)[0]
        extra = [(p, float(s)) for p, s in zip(missing, scores, strict=True)]
        return sorted(cands + extra, key=lambda t: -t[1])

    # -- housekeeping ----------------------------------------------------------------------
    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk: ``plaid_index`` (the fast-plaid directory), ``vectors`` (the vector
        file of original vectors, dead rows included) and ``stored`` (that file plus SQLite:
        everything but the index)."""
        with self._lock:
            self._check_open()
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # count each stored byte once
            idx = sum(p.stat().st_size for p in (self.path / self._plaid_dir).rglob("*") if p.is_file()) \
                if self._plaid_dir else 0
            db = sum(p.stat().st_size for p in self.path.glob(DB_NAME + "*") if p.is_file())
            vec = self._vf.path.stat().st_size
            return {"plaid_index": idx, "vectors": vec, "stored": db + vec}

    def _release(self) -> None:
        if self._fp is not None:
            self._fp.close()
            self._fp = None
        if self._vf is not None:
            self._vf.close()
            self._vf = None
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
        if self._lockfile is not None:
            self._lockfile.close()  # releases the flock
            self._lockfile = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._release()
