"""WARP over xtr-warp-rs: string ids, upserts, deletes, filters, a durable id map, exact rerank.

:class:`WarpStore` is the xtr-warp-rs engine of the file-backed store
:class:`~uibk_embedding.adapters.indexed.IndexedStore`, which owns the folder, its SQLite
source of truth, the memory-mapped vector file, the dirty flag and its repair, compaction,
rebuilds and the exact rerank. Beside those, the folder holds ``warp-NNNNNN/``, the
xtr-warp-rs index. The engine numbers passages itself (``create`` numbers them 0..n-1, ``add``
continues from its ``next_passage_id``, ids are never reused); the store keeps each document's
passage id in the ``pid`` column (NULL while the document is *pending*, not yet in the
engine) and the pids of deleted or overwritten documents that the engine still holds in a
``dead`` table.

Writes never call the engine (``sync_on_write`` is off): a write commits the rows (pending)
and the dead pids of what they replaced in one transaction. Pending documents are searched
exactly, beside the engine's candidates; the engine catches up in :meth:`WarpStore.flush`,
which a search runs when more than ``buffer_size`` documents are pending or dead (so a bulk
load builds the index once, on the first search): the store marks the index dirty, the engine
tombstones the dead pids, adds the pending documents and compacts when its tombstone ratio
calls for it, its files are fsync'd and the new pids are committed while the flag is cleared.
A crash inside that window leaves the flag set and the index is rebuilt from the stored
vectors on the next open (the documents themselves were committed before).

Scores: WARP (XTR) scoring is not MaxSim. For each query vector it looks only at the document
vectors found in the probed centroids and *imputes* the similarity of the documents it did
not see there (a per-query-vector lower estimate), on compressed residuals. With
``rerank=True`` (the default) the engine only proposes documents: the first ``candidates`` (200)
are rescored with exact MaxSim on the stored originals, and more of its list (up to
``candidates_limit``, 2000) where the rescored top ``k`` reaches deep into it (``docs/warp.md``
has the measurements);
with ``rerank=False`` hits carry the engine's own scores and ranking (every pending write is
flushed first, so the engine sees everything). Filters are evaluated on this side with the
library's exact type semantics (``True`` is not ``1``) and handed to the engine as a subset of
passage ids; the engine's own DuckDB metadata is not used. Stores (or filtered subsets) no
larger than the rerank pool, and stores with fewer than ``min_index_vectors`` vectors, are
scored exactly.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.testing import make_list
>>> store = WarpStore(buffer_size=0, min_index_vectors=32)   # a temporary directory
>>> rng = np.random.default_rng(0)
>>> docs = [make_list(store.format, rng, 30) for _ in range(4)]
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
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding._sqlite_state import WRITE_TIMEOUT
from uibk_embedding.adapters.base import check_positive, renamed_option
from uibk_embedding.adapters.indexed import CPU_MAX_PARTITIONS, IndexedStore, default_partitions
from uibk_embedding.errors import EngineError, StoreInUse, call_engine
from uibk_embedding.tagged import DIM, TaggedFormat
from uibk_embedding.vectorfile import file_name

SCHEMA_VERSION = 1

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


CPU_COMPRESSION_BATCH = 256
"""Token rows per compression product on the CPU. One chunk of 256 NPL documents (11,800 tokens)
against 8,192 float16 centroids on an AVX2-only AMD EPYC, 2 threads, medians of 7: 3.3 s in
batches of 256, 6.2 s of 1,024, 11.0 s of 16,384 (float32: 0.5 s); a 3,000-document build took
84 s with 256, 101 s with 1,024 and 135 s with 16,384, writing identical codes
(``benchmarks/results/fp16-gemm-amd-avx2.json``, benchmarks/results/memory-log.md)."""


def warp_memory_options(budget: int, device: str = "cpu") -> dict[str, int]:
    """xtr-warp-rs ``create`` options that keep its build buffers within ``budget`` bytes: a
    quarter for the float32 k-means sample (engine default 2 GiB), a quarter for one k-means
    distance tile (``data x 8192`` centroids float32; default 32,768 points: 1 GiB), an eighth
    each for one compression batch (token vectors and their centroid scores) and the codec
    sample (default 1M vectors: 512 MiB). Engine defaults are the upper limits.

    On the CPU the compression batch is :data:`CPU_COMPRESSION_BATCH` token rows whatever the
    budget: the engine's float16 product of each batch with the centroids is up to 3x faster in
    small batches where the CPU has no float16 matrix unit (``benchmarks/fp16_gemm.py``), and the
    index it writes is the same.

    >>> [warp_memory_options(b)["kmeans_data_chunk_size"] for b in (2**30, 2**34)]
    [8192, 32768]
    >>> [warp_memory_options(2**34, d)["compression_batch_size"] for d in ("cpu", "cuda")]
    [256, 32768]
    """
    def clamp(value: int, low: int, high: int) -> int:
        return int(max(low, min(high, value)))

    batch = clamp(budget // 8 // (4 * (DIM + 8192)), 1024, 32768)
    return {"kmeans_sample_max_bytes": clamp(budget // 4, 2**26, 2**31),
            "kmeans_data_chunk_size": clamp(budget // 4 // (4 * 8192), 1024, 32768),
            "compression_batch_size": batch if device.startswith("cuda") else CPU_COMPRESSION_BATCH,
            "codec_sample_max_tokens": clamp(budget // 8 // (4 * DIM), 65536, 1_000_000)}


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


class WarpStore(IndexedStore):
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
        points per centroid and sample size; the number of centroids, ``None`` for
        :func:`default_partitions`: the engine's heuristic ``2**floor(log2(16 * sqrt(vectors)))``,
        at most 8,192 on the CPU; the k-means seed). Saved with the store; ``None`` means the
        saved value (or the default for a new store: 4, 4, 256, auto, auto, 42).
    vector_dtype:
        ``"float16"`` (default) or ``"float32"``: how the original vectors are kept (for
        ``get``, rerank and rebuilds). float32 makes the reranked scores exact to float32.
    bound, nprobe, t_prime, max_candidates, centroid_score_threshold:
        xtr-warp-rs search parameters; ``None`` (default) lets the engine choose them from the
        index density, ``k`` and the query length (its ``hyperparams.optimize``).
    search_batch_size:
        The engine's ``batch_size`` for the query-centroid product (engine default 8192).
    rerank, candidates, candidates_limit:
        Rescore the engine's ``candidates`` best (default 200, at least ``k``) with exact
        MaxSim on the stored vectors (default on), and twice as many while the best ``k`` reach
        past half of those scored, up to ``candidates_limit`` (default 2000; the engine is asked
        for that many at once, which costs it no more time than 200; docs/warp.md). All three
        also per query: ``search(q, k, rerank=False)``.
    n_rerank:
        Deprecated name of ``candidates``.
    buffer_size:
        A search flushes pending writes into the engine when more than this many documents
        are pending or dead (pending ones are scored exactly meanwhile). 0 flushes on every
        search after a write.
    min_index_vectors:
        The crossover: below this many stored vectors no index is built and search is the exact
        scan; once the store reaches it, :meth:`flush` builds the index, or a search once more
        than ``buffer_size`` documents wait (:meth:`stats` says which path answers and why).
        Default (``None``) :attr:`default_min_index_vectors`, 1,000,000, measured: on random
        vectors WARP answered 2.6-3.5x slower than the exact scan (54k, 161k vectors); on real
        text it was 0.31x exact at 582k (NPL, after a 211 s build) and 0.11x at 1.44M: the default
        keeps the shared collections (up to NPL) on the scan, with no build of minutes
        (benchmarks/results/crossover.md; lower it for NPL-sized collections when query time
        matters more than the build). A store that has an index keeps it until it falls below this
        *and* below half the vectors it was built from (older stores keep theirs). xtr-warp-rs
        cannot build from fewer than 10 vectors (:attr:`min_build_vectors`): a smaller store is
        scanned exactly whatever this says.
    min_outliers, max_growth_rate:
        xtr-warp-rs ``add`` centroid expansion (engine defaults 50 and 0.1).
    compact_threshold:
        Tombstone ratio at which a flush compacts the engine index (engine default 0.2).
    rebuild_growth:
        Rebuild (re-cluster) at a flush once the live vectors exceed this factor times the
        vectors the index was built from; ``None`` (default) relies on the engine's centroid
        expansion, as xtr-warp-rs does. :meth:`rebuild` re-clusters on demand.
    retrain_factor:
        Deprecated name of ``rebuild_growth``.
    vector_compact_fraction:
        The vector file is compacted once dead rows exceed this fraction of it (and 65,536).
    num_threads:
        The engine's search threads (engine default 1). Index builds use torch's threads.
    device:
        Engine device, ``"cpu"`` or ``"cuda[:N]"`` (CUDA paths are not measured here).
    memory_budget:
        Bytes for the engine's build buffers (:func:`warp_memory_options`: its k-means sample
        and distance tiles, compression batches, codec sample); ``None``:
        :func:`~uibk_embedding.adapters.indexed.default_memory_budget` (half the vector file,
        256 MiB to 4 GiB; docs/memory.md).
    show_progress:
        The engine's progress report while it builds, adds or compacts (its plan, then one line
        per encoded chunk; bars on a terminal), on standard error. ``None`` (default): when
        standard error is a terminal.
    read_only, create, write_timeout:
        How the folder is shared: see :class:`~uibk_embedding.adapters.indexed.IndexedStore`.
    """

    backend = "warp"
    label = "WARP"
    engine_name = "xtr-warp-rs"
    engine_error = WarpEngineError
    default_candidates_limit = 2000
    index_prefix = "warp-"
    schema_version = SCHEMA_VERSION
    build_defaults = BUILD_DEFAULTS
    sync_on_write = False
    _builds_index_at = "at flush(), or at a search once more than buffer_size documents wait"
    _failed_flush = -1  # the write version at which a search's flush failed (see _before_search)
    ref_column = "pid"
    vector_compact_min_rows = 65536
    min_build_vectors = 10
    """xtr-warp-rs panics building from fewer than 10 vectors (``kthvalue`` over an empty
    slice; 9 fail and 10 build here), as fast-plaid does: a smaller store is scanned exactly."""

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
        candidates: int | None = None,
        candidates_limit: int | None = None,
        n_rerank: int | None = None,
        buffer_size: int = 256,
        min_index_vectors: int | None = None,
        min_outliers: int = 50,
        max_growth_rate: float = 0.1,
        compact_threshold: float = 0.2,
        rebuild_growth: float | None = None,
        retrain_factor: float | None = None,
        vector_compact_fraction: float = 0.5,
        num_threads: int = 1,
        device: str = "cpu",
        memory_budget: int | None = None,
        show_progress: bool | None = None,
        read_only: bool = False,
        create: bool = True,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        if show_progress is not None and not isinstance(show_progress, bool):
            raise TypeError(f"show_progress must be True, False or None, got {show_progress!r}")
        for name, value in [("search_batch_size", search_batch_size), ("num_threads", num_threads)]:
            check_positive(name, value)
        check_positive("buffer_size", buffer_size, allow_zero=True)
        check_positive("min_outliers", min_outliers, allow_zero=True)
        for name, value in [("bound", bound), ("nprobe", nprobe), ("t_prime", t_prime),
                            ("max_candidates", max_candidates)]:
            check_positive(name, value, allow_none=True)
        if centroid_score_threshold is not None and not 0 <= centroid_score_threshold <= 1:
            raise ValueError("centroid_score_threshold must be in [0, 1] or None, got "
                             f"{centroid_score_threshold!r}")
        if not 0 < compact_threshold <= 1:
            raise ValueError(f"compact_threshold must be in (0, 1], got {compact_threshold!r}")
        if not max_growth_rate > 0:
            raise ValueError(f"max_growth_rate must be positive, got {max_growth_rate!r}")
        growth_name = "rebuild_growth" if retrain_factor is None else "retrain_factor"
        rebuild_growth = renamed_option("rebuild_growth", rebuild_growth, "retrain_factor", retrain_factor)
        self._torch = require("torch", "warp", "the WARP backend")
        self._warp_mod = require("xtr_warp", "warp", "the WARP backend")
        self.engine_version = importlib.metadata.version("xtr-warp-rs")
        self.search_params = {"bound": bound, "nprobe": nprobe, "t_prime": t_prime,
                              "max_candidates": max_candidates,
                              "centroid_score_threshold": centroid_score_threshold}
        self.search_batch_size = search_batch_size
        self.buffer_size = buffer_size
        self.min_outliers = min_outliers
        self.max_growth_rate = float(max_growth_rate)
        self.compact_threshold = float(compact_threshold)
        self.num_threads = num_threads
        self.show_progress = show_progress
        given = {"nbits": nbits, "kmeans_niters": kmeans_niters,
                 "max_points_per_centroid": max_points_per_centroid, "n_samples_kmeans": n_samples_kmeans,
                 "num_partitions": num_partitions, "seed": seed, "vector_dtype": vector_dtype}
        self._worker = _EngineThread()
        try:
            super().__init__(path, format, given, rerank=rerank, candidates=candidates, n_rerank=n_rerank,
                             default_candidates=200, candidates_limit=candidates_limit,
                             min_index_vectors=min_index_vectors,
                             vector_compact_fraction=vector_compact_fraction,
                             rebuild_growth=rebuild_growth, growth_name=growth_name, device=device,
                             memory_budget=memory_budget, read_only=read_only, create=create,
                             write_timeout=write_timeout)
        except BaseException:
            self._worker.stop()
            raise
        _OPEN_STORES.add(self)

    @staticmethod
    def _check_build_params(given: dict[str, Any]) -> None:
        for name in ("nbits", "kmeans_niters", "max_points_per_centroid", "n_samples_kmeans",
                     "num_partitions"):
            check_positive(name, given[name], allow_none=True)
        check_positive("seed", given["seed"], allow_zero=True, allow_none=True)
        if given["nbits"] is not None and given["nbits"] not in (1, 2, 4, 8):
            raise ValueError(f"nbits must be 1, 2, 4 or 8, got {given['nbits']!r}")
        IndexedStore._check_build_params(given)

    @property
    def retrain_factor(self) -> float | None:
        """Deprecated name of :attr:`rebuild_growth`."""
        return self.rebuild_growth

    # -- xtr-warp-rs -----------------------------------------------------------------------
    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """:func:`engine_call` on the store's engine thread. The engine's searcher is a pyo3
        *unsendable* object: it panics when used or dropped on any thread but the one that
        created it, so every engine call of a store runs on one worker thread."""
        return self._worker.call(engine_call, what, fn, *args, **kwargs)

    @property
    def _progress(self) -> bool:
        """Whether the engine reports its build progress (:attr:`show_progress`)."""
        if self.show_progress is not None:
            return self.show_progress
        try:
            return sys.stderr.isatty()
        except (AttributeError, ValueError):  # replaced or closed stderr
            return False

    def _tensors(self, seqs: Sequence[int]) -> list:
        """The stored vectors of ``seqs`` as torch tensors, in the vector file's own dtype
        (:meth:`IndexedStore._views`; the engine converts each chunk it compresses)."""
        return self._views(seqs, self._vf.dtype.type)

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

    def _before_search(self, rerank: bool) -> None:
        """Flush when more than ``buffer_size`` documents wait. A flush that fails leaves the
        store without an index (its documents stay committed): the search answers exactly,
        with a warning, and no search tries again before the next write or :meth:`flush`."""
        waiting = len(self._pending) + len(self._dead)
        if not self._has_written or self.read_only:
            return  # a reader never writes: pending documents are scored exactly beside the index
        if (waiting > self.buffer_size or (not rerank and waiting)) and self._failed_flush != self._version:
            try:
                with self._writing(timeout=0):
                    self._sync()
            except StoreInUse:
                return  # another store object writes now: this search answers as a reader
            except (self.engine_error, OSError) as e:
                self._failed_flush = self._version
                warnings.warn(f"{e}; this search and the next ones until a write or flush() are exact "
                              "over the stored vectors (the index is built again then)", RuntimeWarning,
                              stacklevel=6)

    # -- the engine interface --------------------------------------------------------------
    def _engine_build(self, folder: Path, seqs: list[int]) -> tuple[Any, list[int]]:
        b = self._build
        engine = self._warp_mod.XTRWarp(str(folder), device=self.device)
        tensors = self._tensors(seqs)
        with _quiet_kmeans():
            self._call("create", engine.create, tensors, device=self.device, nbits=b["nbits"],
                       kmeans_niters=b["kmeans_niters"], max_points_per_centroid=b["max_points_per_centroid"],
                       n_samples_kmeans=b["n_samples_kmeans"],
                       num_partitions=b["num_partitions"] or default_partitions(self._n_vectors, self.device),
                       seed=b["seed"], show_progress=self._progress,
                       **warp_memory_options(self.memory_budget, self.device))
        del tensors
        self._call("load", engine.load, device=self.device)
        return engine, list(range(len(seqs)))

    def _engine_open(self, folder: Path) -> Any:
        engine = self._warp_mod.XTRWarp(str(folder), device=self.device)
        self._call("load", engine.load, device=self.device)
        return engine

    def _engine_count(self, folder: Path) -> int:
        # the engine's num_passages keeps counting tombstoned passages until it compacts
        return self._engine_passages(folder) - self._tombstones(folder)

    def _engine_update(self, dead: list[int], seqs: list[int]) -> list[int]:
        engine, folder = self._index, self._engine_folder
        if dead:
            self._call("delete", engine.delete, dead, compact_threshold=None)
        self._close_index()  # the engine rewrites files the searcher maps
        new: list[int] = []
        if seqs:
            with _quiet_kmeans():
                new = [int(p) for p in self._call(
                    "add", engine.add, self._tensors(seqs), reload=False, min_outliers=self.min_outliers,
                    max_growth_rate=self.max_growth_rate,
                    max_points_per_centroid=self._build["max_points_per_centroid"],
                    show_progress=self._progress)]
        n_engine, n_tomb = self._engine_passages(folder), self._tombstones(folder)
        if n_tomb and n_tomb / max(1, n_engine) >= self.compact_threshold:
            self._call("compact", engine.compact, reload=False, show_progress=self._progress)
        self._index = self._engine_open(folder)
        return new

    def _engine_candidates(self, queries: list[np.ndarray], top: int,
                           subset: list[int] | None) -> list[list[tuple[int, float]]]:
        """Engine candidates per query as (seq, score), best first (unknown pids dropped).
        Queries go one at a time: the engine pads a batch with zero rows."""
        pids = None if subset is None else [self._ref[s] for s in subset]
        out = []
        for q in queries:
            res = self._call("search", self._index.search, self._torch.from_numpy(np.ascontiguousarray(q)),
                             top_k=top, num_threads=self.num_threads, batch_size=self.search_batch_size,
                             subset=pids, show_progress=False, **self.search_params)
            out.append([(self._seq_of_ref.get(int(p), -1), float(s)) for p, s in res[0]])
        return out

    def _engine_close(self) -> None:
        self._call("free", self._index.free)  # drops the searcher on its own thread

    def _release(self) -> None:
        super()._release()
        self._worker.stop()

    def _after_fork(self, what: str = "this call") -> None:
        """In a forked child the parent's engine thread does not exist: a new one first."""
        self._worker = _EngineThread()
        super()._after_fork(what)

    def __del__(self) -> None:  # a store dropped without close(): free the engine on its thread
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self.close()


__all__ = ["BUILD_DEFAULTS", "CPU_MAX_PARTITIONS", "WarpEngineError", "WarpStore", "default_partitions",
           "engine_call", "file_name", "warp_memory_options"]
