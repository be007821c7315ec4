"""PLAID over fast-plaid: string ids, upserts, deletes, filters, a durable id map, exact rerank.

:class:`PlaidStore` is the fast-plaid engine of the file-backed store
:class:`~uibk_embedding.adapters.indexed.IndexedStore`, which owns the folder, its SQLite
source of truth, the memory-mapped vector file of original vectors, the dirty flag and its
repair on open, compaction, growth-triggered rebuilds and the exact rerank. Beside those, the
folder holds ``plaid-NNNNNN/``, a fast-plaid index built from the stored vectors. fast-plaid
numbers documents by insertion position and renumbers later documents on delete, so the
position of a document is, by construction, its rank by sequence number among the documents
in the index: the id map needs no separate bookkeeping that could drift.

Every write updates the index at once (``sync_on_write``): the store commits the batch and
the dirty flag, then fast-plaid deletes and adds, the index files are fsync'd and the flag is
cleared; a process killed in between leaves the flag set and the index is rebuilt from the
stored vectors on the next open.

Searching asks PLAID for candidates and, with ``rerank=True`` (the default), rescores them
with exact MaxSim on the stored vectors. fast-plaid does not normalise query vectors, so the
query-time dense weight (scaled query slots) also works without rerank. Collections with
fewer than ``min_index_vectors`` vectors (the measured crossover: below it the exact scan is
no slower than PLAID, benchmarks/results/crossover.md) have no PLAID index and are searched
exactly; with rerank on, so are collections
(or filtered subsets) no larger than the rerank pool, since reranking all of them *is*
exact search.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.testing import make_list
>>> store = PlaidStore(nbits=2, num_threads=1, min_index_vectors=64)   # a temporary directory
>>> rng = np.random.default_rng(0)
>>> docs = [make_list(store.format, rng, 30) for _ in range(4)]
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
import math
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding._sqlite_state import WRITE_TIMEOUT, connect_reader
from uibk_embedding.adapters.base import Hit, check_positive, read_record
from uibk_embedding.adapters.engine_profiles import check_profile, profile_conflict
from uibk_embedding.adapters.indexed import (  # noqa: F401 (fix_mmap_threshold: its old home)
    DB_NAME,
    MMAP_THRESHOLD,
    IndexedStore,
    centroid_heuristic,
    default_partitions,
    fix_mmap_threshold,
)
from uibk_embedding.adapters.rerank import rerank_candidates
from uibk_embedding.errors import CollectionMismatch, EngineError, call_engine
from uibk_embedding.tagged import DIM, TaggedFormat
from uibk_embedding.vectorfile import VectorFile

SCHEMA_VERSION = 2
"""2: original vectors in a memory-mapped vector file, ``(start, n_rows)`` per SQLite row.
1: original vectors as SQLite blobs (converted on open)."""

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
PROFILES: dict[str, str] = {"exact": "float32", "exact-rerank": "float16", "compact": "int4"}
"""``profile=``: the ``vector_dtype`` of the rows the store keeps beside fast-plaid's index
(docs/plaid.md): ``exact`` float32 originals and ``exact-rerank`` float16 originals (the default),
both reranking PLAID's candidates exactly (the exact top k of that pool); ``compact`` no originals,
only the exact store's rotated 4-bit rows (68 bytes), and the answers are fast-plaid's own scores
(its decompressed codes, as PyLate answers) unless ``rerank=True`` rescores from the 4-bit rows."""
_PROFILE_OF = {v: k for k, v in PROFILES.items()}
_SUPPORTED = {"exact": "float32 originals, exact rerank", "exact-rerank": "float16 originals, exact "
              "rerank (the default)", "compact": "fast-plaid's codes + 4-bit rows, no originals"}


SAMPLE_BYTES_PER_VECTOR = 2 * 2 * DIM + 8 + 2
"""RAM per vector of fast-plaid's k-means sample: the float16 copy, its float16 square (for the
norms), an int64 label and the norm."""
MIN_POINTS_PER_CENTROID = 64
"""The memory budget never shrinks the k-means sample below this many vectors per centroid."""
FULL_SCORE_SHARE = 4
"""fast-plaid ranks ``n_full_scores`` documents by their centroids only and decompresses and
returns the best quarter of them: to get ``top`` candidates the store asks ``4 * top``."""


def kmeans_sample_docs(n_docs: int, n_vectors: int, n_centroids: int, memory_budget: int) -> int:
    """Documents in fast-plaid's k-means sample: the engine's own ``min(n, 1 + 16 sqrt(120 n))``,
    cut so that the sample takes at most half of ``memory_budget``, but never below
    :data:`MIN_POINTS_PER_CENTROID` vectors per centroid (the quality floor wins over the budget).

    For documents of 48 vectors (NPL's length) the engine's rule gives 76-152 vectors per
    centroid at its own centroid count (the ratio grows with the square root of the document
    length), so with that count the floor decides (on NPL it keeps 90% of the sample, at 30k
    documents 73%); with fewer centroids (``n_centroids``) the budget does:

    >>> kmeans_sample_docs(11_426, 582_526, 8_192, 2**28)        # NPL: the rule takes all 11,426
    10284
    >>> kmeans_sample_docs(30_000, 1_440_000, 16_384, 2**28)     # the floor: 64 x 16,384 vectors
    21846
    >>> kmeans_sample_docs(100_000, 4_800_000, 4_096, 614 * 2**20)  # the budget: 55,000 by the rule
    12847
    """
    engine = min(n_docs, 1 + int(16 * math.sqrt(120 * n_docs)))
    per_doc = max(1.0, n_vectors / max(1, n_docs))
    fit = int(memory_budget // 2 / (SAMPLE_BYTES_PER_VECTOR * per_doc))
    floor = math.ceil(MIN_POINTS_PER_CENTROID * n_centroids / per_doc)
    return max(1, min(engine, max(fit, floor)))


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


class PlaidStore(IndexedStore):
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
        ``"float16"`` (default), ``"float32"`` or ``"int4"``: how the stored vectors are kept (for
        ``get``, rerank, the scan below ``min_index_vectors`` and rebuilds). float32 makes the
        reranked scores exact to float32; int4 is the ``compact`` profile's code.
    profile:
        A name of :data:`PROFILES` (``"exact"``, ``"exact-rerank"``, ``"compact"``; the others of
        the exact store's names are refused): what a new store keeps, or the profile an existing
        store must have (``CollectionMismatch`` naming both otherwise). ``None``: the saved one
        (``vector_dtype``'s for a new store).
    vector_compact_fraction:
        When deleted or overwritten documents' rows exceed this fraction of the vector file, the
        live rows are copied into a new file (amortised: each written row is copied O(1) times).
    n_centroids:
        Upper bound on the number of PLAID centroids (k-means clusters); ``None``: fast-plaid's
        heuristic (:func:`centroid_heuristic`). Both k-means and the compression of every
        vector cost time proportional to it. Saved with the store.
    n_ivf_probe, n_full_scores:
        fast-plaid search parameters (centroids probed per query vector, at most the index's
        centroid count; documents ranked by their centroids, of which the best quarter are
        decompressed and scored in full). Defaults 2 and 512 (the engine's: 8 and 4096),
        measured on NPL with the exact rerank of 100: recall@10 vs exact 0.996, 10x faster
        than 8 / 4096 (docs/plaid.md).
    rerank, candidates, candidates_limit:
        ``rerank=None`` (default): on, except in the ``compact`` profile (fast-plaid's own
        scores). Rescore PLAID's ``candidates`` best (default 100, at least ``k``) with exact MaxSim on
        the stored vectors (default on), and twice as many while the best ``k`` reach past half
        of those scored, up to ``candidates_limit`` (default 2000). PLAID is asked for that many
        at once (``n_full_scores`` of at least 4 x ``candidates_limit``), so it scores that many
        documents in full: what holds recall@10 at scale (1M documents: 0.9925; docs/plaid.md).
        All three also per query: ``search(q, k, rerank=False)``.
    n_rerank:
        Deprecated name of ``candidates``.
    index_batch_size, search_batch_size:
        fast-plaid ``batch_size`` for create/update (embeddings) and for search (queries).
    rebuild_growth:
        When the store holds more than this many times the vectors its index was last built
        from, the next write rebuilds the index from all stored vectors (new centroids) instead
        of adding to it (default 2.0; ``None``: never). fast-plaid's update assigns new
        documents to the existing centroids, so a collection indexed in batches would otherwise
        keep the centroids of its first batch (NPL indexed 512 documents at a time: recall@10
        vs exact 0.976 instead of 0.993). Doubling keeps the total build work within about
        twice one build of the final collection.
    buffer_size, start_from_scratch:
        fast-plaid update parameters: new documents buffered before centroids are extended,
        and the index size below which an update rebuilds the index (engine defaults 100, 999;
        ``None``: 999, and 0 in the ``compact`` profile: fast-plaid keeps the originals of an
        index that small, ``embeddings.npy``, to rebuild it from).
    min_index_vectors:
        The crossover: below this many stored vectors no PLAID index is built and search is
        the exact scan; the write that reaches it builds the index (:meth:`stats` says which
        path answers and why). Default (``None``) :attr:`default_min_index_vectors`, the
        crossover measured with the search defaults (6,000,000). A store that has an index keeps
        it until it falls below this *and* below half the vectors it was built from (older
        stores keep theirs). fast-plaid cannot build from fewer than 10 vectors
        (:attr:`min_build_vectors`): a smaller store is scanned exactly whatever this says.
    num_threads:
        ``torch.set_num_threads`` (process-wide) when given. Under CPU contention libtorch's
        threads can stall each other (one query took 2.2 s instead of 35 ms); 1 avoids that.
    device:
        fast-plaid device, ``"cpu"`` or ``"cuda:N"``.
    memory_budget:
        Bytes for fast-plaid's k-means during a build: its distance tiles (its default tile is
        51,200 points x up to 10,240 centroids of float32, 2 GiB; a quarter of the budget here)
        and its sample (:func:`kmeans_sample_docs`: at most half the budget, unless that leaves
        fewer than 64 vectors per centroid; ``n_samples_kmeans`` overrides it);
        ``None``: :func:`~uibk_embedding.adapters.indexed.default_memory_budget` (half the
        vector file, 256 MiB to 4 GiB; docs/memory.md).
    read_only, create, write_timeout:
        How the folder is shared: see :class:`~uibk_embedding.adapters.indexed.IndexedStore`.
    """

    backend = "plaid"
    label = "PLAID"
    engine_name = "fast-plaid"
    engine_error = PlaidEngineError
    index_prefix = "plaid-"
    schema_version = SCHEMA_VERSION
    build_defaults = BUILD_DEFAULTS
    build_legacy = _BUILD_LEGACY
    default_candidates_limit = 2000
    default_min_index_vectors = 6_000_000
    min_build_vectors = 10
    """fast-plaid trains its residual codec on a held-out slice of the build's vectors, which is
    empty below 10 ("no heldout samples were generated"; 9 fail and 10 build here)."""
    """PLAID's crossover with its search defaults (a pool of 2000 documents scored in full),
    measured against the exact scan on NPL grown with noisy copies (Intel, 2 cores, alone): PLAID
    took 1.27x the scan's p50 at 4.67M vectors (after a 243 s build), 0.95x at 5.83M, 0.83x at
    6.99M, 0.72x at 9.29M and 0.61x at 13.9M; its own p50 stays near 260 ms up to 7M, the cost of
    scoring the pool (benchmarks/results/crossover.md)."""

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
        profile: str | None = None,
        n_centroids: int | None = None,
        n_ivf_probe: int = 2,
        n_full_scores: int = 512,
        rerank: bool | None = None,
        candidates: int | None = None,
        candidates_limit: int | None = None,
        n_rerank: int | None = None,
        index_batch_size: int = 50_000,
        search_batch_size: int = 2000,
        buffer_size: int = 100,
        start_from_scratch: int | None = None,
        min_index_vectors: int | None = None,
        num_threads: int | None = None,
        device: str = "cpu",
        vector_compact_fraction: float = 0.5,
        rebuild_growth: float | None = 2.0,
        memory_budget: int | None = None,
        read_only: bool = False,
        create: bool = True,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        for name, value in [("n_ivf_probe", n_ivf_probe), ("n_full_scores", n_full_scores),
                            ("index_batch_size", index_batch_size),
                            ("search_batch_size", search_batch_size), ("buffer_size", buffer_size)]:
            check_positive(name, value)
        check_positive("start_from_scratch", start_from_scratch, allow_zero=True, allow_none=True)
        check_positive("num_threads", num_threads, allow_none=True)
        if check_profile(profile, _SUPPORTED, "plaid") is not None:
            if vector_dtype not in (None, PROFILES[profile]):
                raise ValueError(f"profile={profile!r} keeps {PROFILES[profile]} rows, not vector_dtype="
                                 f"{vector_dtype!r}: give one of them")
            vector_dtype = PROFILES[profile]
        self._torch = require("torch", "plaid", "the PLAID backend")
        self._fp_mod = require("fast_plaid.search", "plaid", "the PLAID backend")
        self._blas = require("threadpoolctl", "plaid", "the PLAID backend").ThreadpoolController()
        self.engine_version = importlib.metadata.version("fast-plaid")
        if num_threads is not None:
            self._torch.set_num_threads(num_threads)
        self.num_threads = num_threads
        self.n_ivf_probe = n_ivf_probe
        self.n_full_scores = n_full_scores
        self.index_batch_size = index_batch_size
        self.search_batch_size = search_batch_size
        self.buffer_size = buffer_size
        self.start_from_scratch = start_from_scratch
        self._order = np.zeros(0, np.int64)
        self._order_version = -1
        given = {"nbits": nbits, "kmeans_niters": kmeans_niters,
                 "max_points_per_centroid": max_points_per_centroid,
                 "n_samples_kmeans": n_samples_kmeans, "seed": seed, "vector_dtype": vector_dtype,
                 "n_centroids": n_centroids}
        try:
            super().__init__(path, format, given, rerank=rerank is None or bool(rerank),
                             candidates=candidates, n_rerank=n_rerank, default_candidates=100,
                             candidates_limit=candidates_limit,
                             min_index_vectors=min_index_vectors,
                             vector_compact_fraction=vector_compact_fraction, rebuild_growth=rebuild_growth,
                             device=device, memory_budget=memory_budget, read_only=read_only, create=create,
                             write_timeout=write_timeout)
        except CollectionMismatch as e:
            saved = self._saved_profile(path) if profile is not None else None
            if saved is None or saved == profile:
                raise
            raise CollectionMismatch(profile_conflict(saved, profile, f"the PLAID store at {path}")) from e
        if rerank is None:
            self.rerank = self.profile != "compact"
        if start_from_scratch is None:
            self.start_from_scratch = 0 if self.profile == "compact" else 999

    @property
    def profile(self) -> str:
        """The store's profile (:data:`PROFILES`), from its saved ``vector_dtype``."""
        return _PROFILE_OF[self._build["vector_dtype"]]

    @staticmethod
    def _saved_profile(path: str | os.PathLike | None) -> str | None:
        """The profile recorded in the store at ``path`` (read-only; None when unreadable)."""
        try:
            con = connect_reader(Path(path) / DB_NAME, False)  # type: ignore[arg-type]
            try:
                raw = con.execute("SELECT value FROM state WHERE key = 'config'").fetchone()[0]
            finally:
                con.close()
            return _PROFILE_OF.get(read_record(raw)["build"]["vector_dtype"])
        except Exception:  # the original error is raised instead
            return None

    @staticmethod
    def _check_build_params(given: dict[str, Any]) -> None:
        for name in ("nbits", "kmeans_niters", "max_points_per_centroid", "n_samples_kmeans", "seed",
                     "n_centroids"):  # 0 trains no codec (saved, it failed every later build)
            check_positive(name, given[name], allow_zero=name in ("seed", "kmeans_niters"), allow_none=True)
        if given["nbits"] is not None and given["nbits"] not in (1, 2, 4, 8):
            raise ValueError(f"nbits must be 1, 2, 4 or 8, got {given['nbits']!r}")
        coded = given.get("vector_dtype") == "int4"  # the compact profile's code
        IndexedStore._check_build_params({**given, "vector_dtype": None} if coded else given)

    @property
    def _fp(self) -> Any:
        """The open fast-plaid index (None without one)."""
        return self._index

    def _upgrade(self, config: dict[str, Any]) -> dict[str, Any]:
        """Schema 1 kept the original vectors as SQLite blobs: copy them into a vector file
        (durable first), then switch the table, the schema number and the file's generation in
        one transaction. A crash before that commit leaves a schema-1 store (the half-written
        file is cut to nothing and the conversion starts over on the next open)."""
        if config.get("schema") != 1:
            return config
        dtype = np.dtype(config["build"]["vector_dtype"])
        warnings.warn(f"converting the PLAID store at {self.path} from schema 1 (vectors in SQLite) to "
                      f"schema {SCHEMA_VERSION} (vectors in a memory-mapped file)", RuntimeWarning,
                      stacklevel=5)
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
                db.execute(f"CREATE TABLE docs_v2 {self._docs_table()}")
                db.executemany("INSERT INTO docs_v2 (seq, id, n_rows, start, metadata) "
                               "VALUES (?, ?, ?, ?, ?)", locations)
                db.execute("DROP TABLE docs")
                db.execute("ALTER TABLE docs_v2 RENAME TO docs")
                self._state_set(db, config=json.dumps(config), vector_gen="1", vector_rows=str(vf.n_rows))
        finally:
            vf.close()
        self._db.execute("VACUUM")  # give the blobs' pages back to the file system
        return config

    # -- fast-plaid ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _seeded(self) -> Iterator[None]:
        """torch's global generator seeded for a build (k-means sampling), then restored."""
        with self._torch.random.fork_rng(devices=[]):
            self._torch.manual_seed(int(self._build["seed"]))
            yield

    def _centroids(self) -> int:
        """The number of centroids of a build now: the heuristic, at most ``n_centroids`` (none
        given: at most :data:`~uibk_embedding.adapters.indexed.CPU_MAX_PARTITIONS` on the CPU)."""
        bound = self._build["n_centroids"]
        if bound is None:
            return default_partitions(self._n_vectors, self.device)
        return min(int(bound), centroid_heuristic(self._n_vectors))

    @contextlib.contextmanager
    def _centroid_count(self) -> Iterator[None]:
        """fast-plaid's ``create`` takes neither a number of centroids nor the size of k-means'
        distance tiles, but the k-means function it calls (``compute_kmeans``, and the
        ``FastKMeans`` class, looked up in its module at call time) do: during our ``create``
        call they get ``num_partitions`` (``n_centroids``) and ``chunk_size_data`` (from the
        memory budget). (Process-wide for the duration of the call: another FastPlaid created
        at that moment in this process, outside this store, would get the same bounds.)"""
        k = self._centroids()
        tile_rows = int(max(1024, min(51_200, self.memory_budget // 4 // (4 * min(k, 10_240)))))
        mod = importlib.import_module(self._fp_mod.FastPlaid.__module__)
        with _PATCH_LOCK:
            kmeans, tiles = mod.compute_kmeans, mod.FastKMeans
            mod.compute_kmeans = functools.partial(kmeans, num_partitions=k)
            mod.FastKMeans = functools.partial(tiles, chunk_size_data=tile_rows)
            try:
                yield
            finally:
                mod.compute_kmeans, mod.FastKMeans = kmeans, tiles

    def _engine_kwargs(self, n_docs: int | None = None) -> dict[str, Any]:
        """fast-plaid's build arguments; for a ``create`` of ``n_docs`` documents the k-means
        sample is bounded by the memory budget (an ``update`` keeps the engine's rule)."""
        b = self._build
        samples = b["n_samples_kmeans"]
        if samples is None and n_docs is not None:  # the engine's rule, within the memory budget
            samples = kmeans_sample_docs(n_docs, self._n_vectors, self._centroids(), self.memory_budget)
        return {"kmeans_niters": b["kmeans_niters"], "max_points_per_centroid": b["max_points_per_centroid"],
                "n_samples_kmeans": samples, "batch_size": self.index_batch_size,
                "seed": b["seed"], "start_from_scratch": self.start_from_scratch}

    def _tensors(self, seqs: Sequence[int]) -> list:
        """The stored vectors of ``seqs`` as float16 tensors (:meth:`IndexedStore._views`)."""
        return self._views(seqs, np.float16)

    def _positions(self) -> np.ndarray:
        """The seqs of the documents in the index, by position (their seq order)."""
        if self._order_version != self._version:
            if self._pending or self._dead:
                indexed = (s for s in self._id_of if s not in self._pending)
                order = np.sort(np.fromiter([*indexed, *self._dead], dtype=np.int64))
            else:
                order = np.fromiter(self._id_of, dtype=np.int64, count=len(self._id_of))
            self._order, self._order_version = order, self._version
        return self._order

    # -- the engine interface --------------------------------------------------------------
    def _engine_build(self, folder: Path, seqs: list[int]) -> tuple[Any, list[int]]:
        vectors = self._tensors(seqs)
        fp = engine_call("open", self._fp_mod.FastPlaid, index=str(folder), device=self.device)
        with self._seeded(), self._centroid_count():
            engine_call("create", fp.create, vectors, nbits=self._build["nbits"],
                        **self._engine_kwargs(len(seqs)))
        return fp, seqs

    def _engine_open(self, folder: Path) -> Any:
        return engine_call("open", self._fp_mod.FastPlaid, index=str(folder), device=self.device)

    def _engine_count(self, folder: Path) -> int:
        try:
            return int(json.loads((folder / "metadata.json").read_text())["num_documents"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PlaidEngineError(f"the index metadata is unreadable: {e}") from e

    def _engine_update(self, dead: list[int], seqs: list[int]) -> list[int]:
        if dead:
            engine_call("delete", self._fp.delete, np.searchsorted(self._positions(), dead).tolist())
        if seqs:
            with self._seeded():
                engine_call("update", self._fp.update, self._tensors(seqs), buffer_size=self.buffer_size,
                            **self._engine_kwargs())
        return seqs

    def _engine_candidates(self, queries: list[np.ndarray], top: int,
                           subset: list[int] | None) -> list[list[tuple[int, float]]]:
        """Queries of one length go together, so no zero padding changes which centroids are
        probed."""
        order = self._positions()
        allowed = None if subset is None else np.searchsorted(order, subset).tolist()
        out: list[list[tuple[int, float]]] = [[] for _ in queries]
        by_len: dict[int, list[int]] = {}
        for i, q in enumerate(queries):
            by_len.setdefault(len(q), []).append(i)
        for idx in by_len.values():
            batch = self._torch.from_numpy(np.stack([queries[i] for i in idx]).astype(np.float16))
            res = engine_call("search", self._fp.search, batch, top_k=top, batch_size=self.search_batch_size,
                              n_full_scores=max(self.n_full_scores, FULL_SCORE_SHARE * top),
                              n_ivf_probe=min(self.n_ivf_probe, self._centroid_count_of_index()),
                              show_progress=False, subset=allowed, n_processes=1)
            for i, pairs in zip(idx, res, strict=True):
                if any(not 0 <= p < len(order) for p, _ in pairs):
                    raise PlaidEngineError(f"fast-plaid returned a position outside 0..{len(order) - 1}")
                out[i] = [(int(order[p]), float(s)) for p, s in pairs]
        return out

    def _centroid_count_of_index(self) -> int:
        """The current index's number of centroids (fast-plaid panics when asked to probe more),
        read from the file's header at each search: an update may add centroids."""
        return int(np.load(self._engine_folder / "centroids.npy", mmap_mode="r").shape[0])

    def _engine_close(self) -> None:
        self._fp.close()

    # -- scoring ---------------------------------------------------------------------------
    def _scoring(self) -> contextlib.AbstractContextManager:
        # one BLAS thread: these products are small, and a second OpenBLAS thread keeps
        # spinning after the call, taking a core from fast-plaid's next search (measured:
        # 10 ms engine search became 38 ms after a two-thread rerank on 2 cores)
        return self._blas.limit(limits=1, user_api="blas")

    def _fill_short(self, q: np.ndarray, cands: list[tuple[int, float]], seqs: list[int],
                    k: int) -> list[Hit]:
        """PLAID found fewer than ``k`` of the allowed documents: score the rest on their
        decompressed vectors (what PLAID scores), so ``k >= count`` returns every document."""
        have = {s for s, _ in cands}
        missing = [int(s) for s in seqs if s not in have]

        def fetch(keys: Sequence[int]) -> dict[int, tuple[np.ndarray, dict]]:
            positions = np.searchsorted(self._positions(), keys).tolist()
            embs = engine_call("get_embeddings", self._fp.get_embeddings, positions)
            return {s: (e.float().numpy(), {}) for s, e in zip(keys, embs, strict=True)}

        extra = rerank_candidates(q, [(s, None) for s in missing], fetch, k, first=max(1, len(missing)),
                                  dtype=np.float32)
        pairs = cands + [(h.id, h.score) for h in extra]
        return [self._hit(s, sc) for s, sc in sorted(pairs, key=lambda t: -t[1])[:k]]

__all__ = ["BUILD_DEFAULTS", "PROFILES", "PlaidEngineError", "PlaidStore", "centroid_heuristic",
           "engine_call"]
