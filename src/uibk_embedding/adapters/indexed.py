"""The file-backed engine store: one folder, one SQLite truth, one vector file, any index engine.

:class:`IndexedStore` is everything PLAID and WARP share; an *engine* (a subclass) adds only
the calls into its index. The store keeps, in its folder:

* ``store.sqlite`` (WAL, ``synchronous=FULL``; :mod:`uibk_embedding._sqlite_state`): the source
  of truth. ``docs`` holds one row per document (string id, insertion sequence number ``seq``,
  ``start`` and ``n_rows`` in the vector file, JSON metadata; an engine whose document numbers
  must survive a reopen adds a column for them, see ``ref_column``). ``state`` holds one set of
  keys for every engine: ``config`` (backend, schema, tagged format, build parameters, engine
  version), ``index_dir`` and ``generation`` (the current index folder), ``dirty``,
  ``vector_gen`` and ``vector_rows`` (the vector file's generation and committed rows),
  ``built_vectors`` (vectors the index was last built from) and ``last_seq``. Stores written
  with older key names (PLAID ``plaid_dir``; WARP ``index_dir``/``vf_generation``/``vf_rows``/
  ``trained_vectors``) are renamed on open, in one transaction (:data:`RENAMED_KEYS`).
* ``vectors-NNNNNN.f16`` (:mod:`uibk_embedding.vectorfile`): the original vectors, appended and
  ``fsync``'d before the transaction that references them; compacted into the next generation
  when dead rows exceed ``vector_compact_fraction`` of the file.
* ``<prefix>NNNNNN/``: the engine's index, written fresh by a rebuild and switched to in one
  transaction; stale ones (older, or a rebuild that died before its switch) are removed on
  open, and a folder holding anything but a store is refused.

A write appends the vectors, then commits the rows (and, for ``sync_on_write`` engines, the
*dirty* flag) in one transaction; the documents are then *pending* (not in the index) and the
ones they replaced *dead* (still in the index). :meth:`IndexedStore.flush` brings the index in
line: a rebuild when there is no index yet, the store wants none (below ``min_index_vectors``;
:meth:`IndexedStore.stats`), no indexed
document is left or it grew past ``rebuild_growth`` times the vectors of the last build; else an
in-place update (dirty set first, the engine's files fsync'd before ``dirty=0`` commits; an
engine error rebuilds). A dirty store is rebuilt on open; when that fails it opens without an
index (searches exact) and the next write tries again.

Search is one template: the engine proposes candidates, best first, and
:func:`~uibk_embedding.adapters.rerank.rerank_candidates` scores the first ``candidates`` of them
with exact MaxSim (float32) on their stored vectors (:meth:`IndexedStore._fetch`), then twice as
many while the best ``k`` reach past half of those scored, up to ``candidates_limit``
(``rerank``/``candidates``/``candidates_limit``, per store and per query). Stores (or filtered
subsets) no larger than the pool, and stores without an index, are scored exactly
(:meth:`IndexedStore._exact`); pending documents are scored beside the engine's candidates.

The engine interface
--------------------
An engine sets ``backend``, ``label``, ``engine_name``, ``engine_error``, ``index_prefix``,
``schema_version``, ``build_defaults`` (and optionally ``sync_on_write``, ``ref_column``,
``vector_compact_min_rows``), validates its own parameters in ``__init__`` before calling
``IndexedStore.__init__``, and implements six methods on ``self._index`` (its handle):

* ``_engine_build(folder, seqs) -> (handle, refs)``: a new index of the documents ``seqs``
  (store order; vectors from :meth:`IndexedStore._gather`) and each one's engine number;
* ``_engine_open(folder) -> handle``: open the index of a folder the store trusts;
* ``_engine_count(folder) -> int``: live documents the index in ``folder`` holds;
* ``_engine_update(dead, seqs) -> refs``: remove the engine numbers ``dead``, add ``seqs``;
* ``_engine_candidates(queries, top, subset) -> [[(seq, score)]]``: best first, ``subset``
  the allowed seqs (None: all);
* ``_engine_close()``: release the handle.

Engine numbers (*refs*) are the seqs themselves unless ``ref_column`` names a ``docs`` column
that stores them (WARP's passage ids); then a ``dead`` table keeps the refs of removed
documents the engine still holds. :class:`ScanEngine` below is a complete engine: 46 lines,
28 of them its six engine methods (PLAID's six are 45 lines, WARP's 53).

Example
-------
>>> import numpy as np
>>> from uibk_embedding.tagged import TaggedFormat, decompose
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> mk = lambda n: fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))
>>> store = ScanEngine(candidates=2, min_index_vectors=8)   # a temporary directory
>>> docs = [mk(5) for _ in range(4)]
>>> store.upsert(["a", "b", "c", "d"], docs, [{"lang": "en"}, {}, {"lang": "de"}, {}])
>>> store.has_index, store.count(), sorted(store.disk_usage())
(True, 4, ['scan_index', 'stored', 'vectors'])
>>> [h.id for h in store.search(docs[2], k=1)], [h.id for h in store.search(docs[0], k=1, rerank=False)]
(['c'], ['a'])
>>> store.delete(["a"]); store.count(), [h.id for h in store.search(docs[3], k=2, filter={})][0]
(3, 'd')
>>> store.close()
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
import shutil
import sqlite3
import tempfile
import threading
import warnings
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from uibk_embedding._durable import fsync_tree
from uibk_embedding._sqlite_state import (
    WRITE_TIMEOUT,
    acquire_write_lock,
    committed_generation,
    connect,
    connect_reader,
    read_transaction,
    refuse_foreign_folder,
    remove_stale_index_dirs,
    remove_unshared_directory,
    rename_state_keys,
    share_directory,
    state_get,
    state_set,
    transaction,
    try_exclusive,
    writable_folder,
)
from uibk_embedding.adapters.base import (
    BatchSearch,
    Hit,
    MultiVectorStore,
    Record,
    check_positive,
    check_record,
    finite_score,
    folder_bytes,
    read_record,
)
from uibk_embedding.adapters.filters import OPERATORS, And, Node, Not, Or, matches
from uibk_embedding.adapters.rerank import Reranking, check_rerank_options, rerank_candidates
from uibk_embedding.errors import CollectionMismatch, EngineError, ReadOnlyStore, StoreInUse, StoreNotFound
from uibk_embedding.maxsim import DEFAULT_CHUNK_BYTES, doc_blocks, maxsim_scores, top_k
from uibk_embedding.tagged import TaggedFormat, decompose
from uibk_embedding.vectorfile import MemoryVectors, VectorFile, file_name, remove_other_generations

DB_NAME = "store.sqlite"
LOCK_NAME = "store.lock"
SQL_CHUNK = 900  # bound parameters per statement (SQLite's default limit is 999)
SCORE_CHUNK_ROWS = 1 << 18
"""Stored rows read at a time when documents are scored exactly (64 MiB of float16 rows)."""
DEFAULT_MIN_INDEX_VECTORS = 1_000_000
"""The default ``min_index_vectors`` of an engine that measured none
(:attr:`IndexedStore.default_min_index_vectors`; WARP's, PLAID has its own): the crossover, in
stored vectors, below which the exact scan answered no slower than the index
(benchmarks/results/crossover.md)."""
#: State keys older stores wrote, and the one name they have now.
RENAMED_KEYS = {"plaid_dir": "index_dir", "vf_generation": "vector_gen", "vf_rows": "vector_rows",
                "trained_vectors": "built_vectors"}


def _fields(nodes: Sequence[Node]) -> frozenset[str]:
    """The metadata fields (top-level keys) that filter conditions name."""
    out: set[str] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, Not):
            stack.append(node.child)
        elif isinstance(node, (And, Or)):
            stack.extend(node.children)
        else:
            out.add(node.field)
    return frozenset(out)


class _StaleView(Exception):
    """A document of a store object's view is gone from SQLite (another writer removed it after
    the view's snapshot): read the view again (:meth:`IndexedStore._reading`)."""


def _in(column: str, values: list[int]) -> Iterator[tuple[str, list[int]]]:
    """``column IN (?, ...)`` clauses over ``values``, a bounded number of parameters each."""
    for i in range(0, len(values), SQL_CHUNK):
        chunk = values[i:i + SQL_CHUNK]
        yield f"{column} IN ({','.join('?' * len(chunk))})", chunk


def default_memory_budget(vector_bytes: int = 0) -> int:
    """The default ``memory_budget`` of a store whose vector file holds ``vector_bytes``: half of
    that, at least 256 MiB, and at most a quarter of the memory available now
    (``MemAvailable``) or 4 GiB. So a build's buffers grow with the collection, as its files do
    (docs/memory.md: peak RSS within 1.5 x the bytes on disk + 1 GiB).

    >>> default_memory_budget(0) == 2**28, 2**28 <= default_memory_budget(2**40) <= 2**32
    (True, True)
    """
    available = 2**34
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    return int(max(2**28, min(vector_bytes // 2, available // 4, 2**32)))


MMAP_THRESHOLD = 1 << 20
"""Allocations of this many bytes or more are served by ``mmap`` during and after an index build
or update (glibc only, :func:`fix_mmap_threshold`)."""
_mmap_threshold_fixed = False


def fix_mmap_threshold() -> bool:
    """Make glibc serve every allocation of :data:`MMAP_THRESHOLD` bytes or more by ``mmap``, so
    freeing it gives the memory back to the system. Called before every engine build or update
    of an :class:`IndexedStore` (PLAID and WARP), when one opens its index to search it, and when
    a LanceDB store opens (its flat scan's buffers: docs/sharing.md, "Memory of N workers").

    glibc's default threshold adapts: each freed ``mmap`` block raises it (up to 32 MiB), after
    which such blocks come from the heap and stay held once freed. The engines' compression
    allocates and frees many of them: fast-plaid at NPL size left about 600 MiB freed but held
    (peak RSS of the build 1,706 MiB, 1,103 MiB with the fixed threshold), and xtr-warp-rs's
    heap grew by ~260 bytes per vector it encoded (a 300,000-document build peaked at 16,151 MiB;
    docs/memory.md).

    Process-wide and lasting (glibc has no way back to the adaptive threshold); the cost is a
    system call and fresh pages for each such allocation. Not done when the environment sets
    ``MALLOC_MMAP_THRESHOLD_`` (glibc's own setting wins) or ``UIBK_MALLOC_TUNING=0``, nor where
    the C library has no ``mallopt`` (macOS). Returns whether the threshold is now fixed by us.

    >>> isinstance(fix_mmap_threshold(), bool)
    True
    """
    global _mmap_threshold_fixed
    if _mmap_threshold_fixed:
        return True
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or os.environ.get("UIBK_MALLOC_TUNING") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _mmap_threshold_fixed = mallopt(-3, MMAP_THRESHOLD) == 1  # -3: M_MMAP_THRESHOLD (malloc.h)
    return _mmap_threshold_fixed


def centroid_heuristic(n_vectors: int) -> int:
    """fast-plaid's and xtr-warp-rs's number of centroids for ``n_vectors`` stored vectors: the
    power of two at or below ``16 * sqrt(n_vectors)``.

    >>> centroid_heuristic(582_526), centroid_heuristic(1_450_000)
    (8192, 16384)
    """
    return 2 ** int(np.floor(np.log2(16 * np.sqrt(max(1, n_vectors)))))


CPU_MAX_PARTITIONS = 8192
"""The most centroids a CPU build of PLAID or WARP chooses by itself (``n_centroids`` /
``num_partitions`` None): the build's time grows with the centroid count (k-means and the
assignment of every vector), and 8,192 held recall with the deepening rerank at every size
measured (docs/plaid.md, docs/warp.md)."""


def _cuda_devices() -> int:
    import torch  # every engine that takes a device runs on torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_partitions(n_vectors: int, device: str = "cpu") -> int:
    """The number of centroids of a build that was given none: the engine's heuristic,
    the power of two at or below ``16 * sqrt(n_vectors)``, at most :data:`CPU_MAX_PARTITIONS` on
    the CPU.

    >>> default_partitions(582_526), default_partitions(1_438_453), default_partitions(1_438_453, "cuda")
    (8192, 8192, 16384)
    """
    heuristic = centroid_heuristic(n_vectors)
    return heuristic if device.startswith("cuda") else min(heuristic, CPU_MAX_PARTITIONS)


_OPEN_STORES: weakref.WeakSet[IndexedStore] = weakref.WeakSet()
"""Every open store object of this process (for :func:`_after_fork_in_child`)."""
_INHERITED: list[Any] = []
"""What a forked child took over from its parent and must neither use nor close: SQLite
connections and files opened for appending (see :meth:`IndexedStore._after_fork`). Kept
referenced so the child never finalises them while it runs."""


def _after_fork_in_child() -> None:
    """In the child of ``os.fork()`` (``os.register_at_fork``): every store object gets a new
    lock (another thread of the parent may have held the old one at the fork: it would never be
    released here), and one that was in the middle of a write is marked (it refuses every call:
    its view is half a write). The connections are replaced lazily, on the object's first call
    (:meth:`IndexedStore._after_fork`)."""
    for store in list(_OPEN_STORES):
        store._forked_in_write = store._forked_in_write or store._write_depth > 0
        store._lock = store._guard = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class IndexedStore(Reranking, BatchSearch, MultiVectorStore):
    """A file-backed store whose engine index proposes candidates (see the module docstring).

    Parameters shared by every engine
    ---------------------------------
    path:
        Directory of the store (created when missing, reopened when it holds one). ``None``:
        a temporary directory removed by :meth:`close`.
    format:
        The tagged format (saved with the store; used for decompositions).
    rerank, candidates:
        Rescore the engine's ``candidates`` best (at least ``k``) with exact MaxSim on the
        stored vectors (default on; also per query: ``search(..., rerank=, candidates=)``).
    n_rerank:
        Deprecated name of ``candidates``.
    candidates_limit:
        The pool may grow per query up to this many candidates: it doubles while the best ``k``
        of the rerank reach past half of the candidates scored (:func:`.rerank_candidates`). ``None``: the
        engine's default (:attr:`default_candidates_limit`; no growth when that is None too).
        Also per query: ``search(..., candidates_limit=)``.
    min_index_vectors:
        The crossover: below this many stored vectors no index is built and search is the exact
        scan (:meth:`stats` says which path answers and why). ``None``: the engine's measured
        :attr:`default_min_index_vectors` (below it the scan answered no slower than the index,
        benchmarks/results/crossover.md, and a build costs minutes). A store that reaches it
        builds its index at that write (``sync_on_write`` engines, PLAID) or at the next flush
        (WARP; or a search once more than ``buffer_size`` documents wait). A store that has an
        index keeps it (updated, rebuilt) until it holds fewer than ``min_index_vectors`` *and*
        fewer than half the vectors the index was built from, so stores indexed under a lower
        threshold (older versions, or the option) keep their index, and a store at the line does
        not build and drop by turns.
    vector_compact_fraction:
        When deleted or overwritten documents' rows exceed this fraction of the vector file
        (and ``vector_compact_min_rows``), the live rows are copied into a new generation.
    rebuild_growth:
        Rebuild (re-cluster) at the next flush once the store holds more than this many times
        the vectors its index was built from (``None``: never).
    device:
        The engine's device, ``"cpu"`` or ``"cuda:N"``.
    memory_budget:
        Bytes the engine's working buffers may take during a build (k-means tiles and samples,
        compression batches), beside the memory-mapped vector file; ``None``:
        :func:`default_memory_budget` (half the vector file, 256 MiB to 4 GiB). Not saved:
        each process chooses its own (docs/memory.md).
    read_only, create, write_timeout:
        How the folder is shared (docs/sharing.md): any number of store objects and processes
        open one folder and read it; each write takes the folder's write lock for its duration,
        waiting up to ``write_timeout`` seconds (:data:`WRITE_TIMEOUT`) for another writer, then
        StoreInUse. ``read_only=True`` refuses writes (:class:`ReadOnlyStore`); ``create=False``
        opens only a store that exists (StoreNotFound otherwise, nothing created).
    """

    exact = False
    filter_operators = frozenset(OPERATORS)  # filters run in Python: filters.matches
    label: ClassVar[str] = "indexed"
    engine_name: ClassVar[str] = "engine"
    engine_error: ClassVar[type[EngineError]] = EngineError
    index_prefix: ClassVar[str] = "index-"
    schema_version: ClassVar[int] = 1
    search_options: ClassVar[tuple[str, ...]] = (*Reranking.search_options, "candidates_limit")
    default_min_index_vectors: ClassVar[int] = DEFAULT_MIN_INDEX_VECTORS
    """The engine's crossover in stored vectors, the default ``min_index_vectors``."""
    builds_index: ClassVar[bool] = True
    """False: the store scores every document exactly, whatever its size (the exact store)."""
    min_build_vectors: ClassVar[int] = 1
    """The fewest stored vectors the engine can build an index from; below it the store is
    scanned exactly whatever ``min_index_vectors`` says."""
    default_candidates_limit: ClassVar[int | None] = None
    """The engine's default ``candidates_limit`` (None: the pool never grows past ``candidates``)."""
    build_defaults: ClassVar[dict[str, Any]] = {"vector_dtype": "float16"}
    build_legacy: ClassVar[dict[str, Any]] = {}
    sync_on_write: ClassVar[bool] = True
    """True: every write updates the index (dirty during it); False: writes stay pending until
    :meth:`flush` (which searches call via :meth:`_before_search`)."""
    _builds_index_at: ClassVar[str] = "at the next write or flush()"
    """When a store that reached ``min_index_vectors`` without an index builds it (:meth:`stats`)."""
    ref_column: ClassVar[str | None] = None
    vector_compact_min_rows: ClassVar[int] = 0
    engine_version: str = "0"
    in_memory_without_path: ClassVar[bool] = False
    """True: ``path=None`` keeps the store in memory (SQLite ``:memory:``, :class:`MemoryVectors`);
    False: in a temporary directory removed by :meth:`close` (engines that write index files)."""
    _torch: Any = None  # the torch module, for engines that hand it tensors (PLAID, WARP)

    def __init__(
        self, path: str | os.PathLike | None, format: TaggedFormat | None, given: dict[str, Any], *,
        rerank: bool = True, candidates: int | None = None, n_rerank: int | None = None,
        default_candidates: int = 100, candidates_limit: int | None = None,
        min_index_vectors: int | None = None,
        vector_compact_fraction: float = 0.5,
        rebuild_growth: float | None = None, growth_name: str = "rebuild_growth", device: str = "cpu",
        memory_budget: int | None = None, read_only: bool = False, create: bool = True,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        MultiVectorStore.__init__(self, format)
        for name, flag in (("read_only", read_only), ("create", create)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        if isinstance(write_timeout, bool) or not isinstance(write_timeout, (int, float)) \
                or not 0 <= write_timeout < float("inf"):
            raise ValueError(f"write_timeout must be a number of seconds >= 0, got {write_timeout!r}")
        if path is None and (read_only or not create):
            raise StoreNotFound(f"no {self.label} store to read: without path= it would be a new, empty "
                                "store; give the path of the store (read_only=True and create=False "
                                "open one that exists)")
        self.read_only = read_only
        self.write_timeout = float(write_timeout)
        self._init_reranking(rerank, candidates, n_rerank, default_candidates)
        check_positive("candidates_limit", candidates_limit, allow_none=True)
        self.candidates_limit = candidates_limit or self.default_candidates_limit
        check_positive("min_index_vectors", min_index_vectors, allow_none=True)
        vcf = vector_compact_fraction
        if isinstance(vcf, bool) or not isinstance(vcf, (int, float)) or not 0 < vcf <= 1:
            raise ValueError(f"vector_compact_fraction must be in (0, 1], got {vcf!r}")
        if rebuild_growth is not None and (isinstance(rebuild_growth, bool)
                                           or not isinstance(rebuild_growth, (int, float))
                                           or not rebuild_growth > 1):
            raise ValueError(f"{growth_name} must be a number > 1 or None, got {rebuild_growth!r}")
        self._check_build_params(given)
        self.min_index_vectors = min_index_vectors or self.default_min_index_vectors
        self.vector_compact_fraction = float(vcf)
        self.rebuild_growth = None if rebuild_growth is None else float(rebuild_growth)
        if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", device):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        if device != "cpu" and (seen := _cuda_devices()) <= int(device.partition(":")[2] or 0):
            raise ValueError(f"device {device!r}: torch sees {seen} CUDA device(s) here")
        self.device = device
        check_positive("memory_budget", memory_budget, allow_none=True)
        self._memory_budget = None if memory_budget is None else int(memory_budget)

        self._lock = self._guard = threading.RLock()
        self._closed = False
        self._pid = os.getpid()               # the process that opened the connections (fork safety)
        self._forked_in_write = False         # copied by os.fork() while a write ran: unusable
        self._tmpdir: str | None = None
        if path is None and not self.in_memory_without_path:
            self._tmpdir = tempfile.mkdtemp(prefix=f"uibk-{self.backend}-")
            path = self._tmpdir
        self.path = None if path is None else Path(path)
        self.max_chunk_bytes = DEFAULT_CHUNK_BYTES
        self._writable = True                 # may this process create files in the folder
        self._write_depth = 0                 # > 0 while a write holds the folder (see _writing)
        self._has_written = False             # whether this object ever wrote (it flushes its own)
        self._synced = False                  # the view was read under the write lock, unchanged since
        self._data_version: Any = None        # PRAGMA data_version of the snapshot the view holds
        self._config: dict[str, Any] = {}
        self._index_problem: str | None = None
        self._index_fd: int | None = None     # shared lock on the loaded index folder
        self._index_dir, self._generation, self._vgen, self._built_vectors = "", 0, 1, 0
        self._engine_folder: Path | None = None
        self._db: Any = None
        self._index: Any = None
        self._vf: VectorFile | None = None
        # in-memory view of the committed rows (dicts keep insertion order = seq order)
        self._id_of: dict[int, str] = {}
        self._seq_of: dict[str, int] = {}
        self._start: dict[int, int] = {}
        self._rows: dict[int, int] = {}
        # metadata are not held: read from SQLite for the documents an answer names (_metadata)
        self._filter_fields: tuple[frozenset[str], dict[int, dict]] | None = None  # see _matching
        self._pending: dict[int, None] = {}   # live seqs not in the index, in order
        self._dead: set[int] = set()          # refs of removed documents the index still holds
        self._ref: dict[int, int] = {}        # seq -> engine ref (ref_column engines only)
        self._seq_of_ref: dict[int, int] = {}
        self._n_vectors = 0
        self._last_seq = 0
        self._dirty = False
        self._version = 0                     # bumped on every change of the view
        self._live: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None  # see _everyone
        try:
            if self.path is None:  # in memory: the same tables, nothing written anywhere
                self._db = connect(":memory:")
            else:
                if not self.path.exists():
                    if read_only or not create:
                        raise StoreNotFound(f"no {self.label} store at {self.path}: the path does not exist; "
                                            "nothing was created")
                    self.path.mkdir(parents=True, exist_ok=True)
                # is the folder ours? Decided before anything is created in it
                refuse_foreign_folder(self.path, DB_NAME, LOCK_NAME, self.label, self.backend)
                self._writable = writable_folder(self.path)
            self._open(format, given, create)
            _OPEN_STORES.add(self)
        except sqlite3.DatabaseError as e:
            self._closed = True
            self._release()
            if isinstance(e, sqlite3.OperationalError):  # locked, an I/O error: may pass
                raise
            raise CollectionMismatch(f"{self.path / DB_NAME} is damaged (SQLite: {e}); nothing in it was "
                                     "changed: restore the folder from a copy, or index anew") from e
        except BaseException:
            self._closed = True
            self._release()
            raise

    # -- configuration ---------------------------------------------------------------------
    @staticmethod
    def _check_build_params(given: dict[str, Any]) -> None:
        """Refuse bad build parameters (``None``: the saved value). Engines extend this."""
        if not isinstance(given.get("vector_dtype"), str | None) or given.get("vector_dtype") not in (
                None, "float16", "float32"):  # a numpy dtype compares equal, then fails to save
            raise ValueError(f"vector_dtype must be 'float16' or 'float32', got {given['vector_dtype']!r}")

    @property
    def memory_budget(self) -> int:
        """Bytes the engine's build buffers may take: the ``memory_budget`` given, else
        :func:`default_memory_budget` of the stored vectors."""
        if self._memory_budget is not None:
            return self._memory_budget
        return default_memory_budget(self._vf.n_rows * self._vf.row_bytes if self._vf else 0)

    @property
    def build_params(self) -> dict[str, Any]:
        """The saved build parameters (the engine's, and the vector dtype)."""
        return dict(self._build)

    @property
    def has_index(self) -> bool:
        """Whether an engine index exists (False below ``min_index_vectors``: searched exactly;
        :meth:`stats` says why)."""
        return self._index is not None

    def _wants_index(self) -> bool:
        """Whether the store should have an engine index: it holds at least ``min_build_vectors``
        and either at least ``min_index_vectors`` vectors or an index (``index_dir``) built from
        at most twice what it holds (see ``min_index_vectors``)."""
        n = self._n_vectors
        kept = bool(self._index_dir) and n > 0 and 2 * n >= self._built_vectors
        return self.builds_index and n >= self.min_build_vectors and (n >= self.min_index_vectors or kept)

    def stats(self) -> dict[str, Any]:
        """Which path answers searches, and why: ``documents``, ``vectors`` (stored, live),
        ``min_index_vectors``, ``has_index``, ``pending`` (documents not in the index, scored
        exactly beside it), ``search`` (``"index"``: the engine proposes candidates;
        ``"exact"``: every document is scored, the exact scan) and ``reason`` (one sentence).
        With rerank on, a store or filtered subset no larger than the rerank pool is scored
        exactly even with an index.

        And what it costs (:meth:`MultiVectorStore.stats`): ``bytes_on_disk``, every file in the
        store folder (SQLite with its WAL, the vector files with dead rows and originals, the
        index folders, the lock file; 0 in memory), and ``resident_bytes``, by this rule: the
        rows a search scans whole, which the store maps from its vector file (every live row
        times the bytes of a row of the scanned file; with an engine index, the index folder
        and the pending documents' rows instead), plus the document table (the SQLite
        database's bytes: every store object loads the ids from it, and reads the metadata of
        the documents an answer names; Python's own objects cost more and are not counted).
        Rows read only for a few documents a query (the rerank of candidates, the float16
        originals of the ``int8-rerank`` profile) are not resident.

        >>> s = ScanEngine(min_index_vectors=10)
        >>> s.stats()["search"], s.stats()["reason"]
        ('exact', 'the store holds 0 vectors, below min_index_vectors=10: no index is built')
        >>> s.close()
        """
        with self._lock:
            self._check_open()
            n, limit = self._n_vectors, self.min_index_vectors
            if self._index is not None and not self._wants_index():  # reopened with a higher limit
                reason = (f"its index was built from {self._built_vectors} vectors; it holds {n}, below "
                          f"min_index_vectors={limit} and below half of them: the {self.engine_name} "
                          "index proposes candidates until the next rebuild drops it "
                          f"({self._builds_index_at})")
            elif self._index is not None:
                why = (f"the store holds {n} vectors, at least min_index_vectors={limit}" if n >= limit else
                       f"its index was built from {self._built_vectors} vectors and it still holds {n}, "
                       f"at least half of them (below min_index_vectors={limit})")
                reason = f"{why}: the {self.engine_name} index proposes candidates"
            elif self._index_dir or self._dirty:
                reason = f"the {self.engine_name} index could not be opened or rebuilt: the exact scan"
            elif not self.builds_index:
                reason = f"the {self.label} store scores every document exactly: it builds no index"
            elif limit <= n < self.min_build_vectors:
                reason = (f"the store holds {n} vectors; {self.engine_name} builds an index from "
                          f"{self.min_build_vectors} vectors up: the exact scan")
            elif n >= limit:
                reason = (f"the store holds {n} vectors, at least min_index_vectors={limit}: the index "
                          f"is built {self._builds_index_at}")
            else:
                reason = f"the store holds {n} vectors, below min_index_vectors={limit}: no index is built"
            return {"documents": len(self._id_of), "vectors": n, "min_index_vectors": limit,
                    "has_index": self._index is not None, "pending": self.n_pending,
                    "search": "index" if self._index is not None else "exact", "reason": reason,
                    "bytes_on_disk": self._bytes_on_disk(), "resident_bytes": self._resident_bytes()}

    def _bytes_on_disk(self) -> int:
        if self.path is None:
            return 0
        if not self.read_only and self._writable:  # count each stored byte once
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return folder_bytes(self.path)

    def _resident_bytes(self) -> int:
        assert self._vf is not None
        if self._index is not None:
            index = folder_bytes(self._engine_folder) if self._engine_folder is not None else 0
            rows = index + sum(self._rows[s] for s in self._pending) * self._vf.row_bytes
        else:
            rows = self._n_vectors * self._vf.row_bytes
        if self.path is None:
            return rows
        return rows + sum(p.stat().st_size for p in self.path.glob(DB_NAME + "*") if p.is_file())

    @property
    def n_pending(self) -> int:
        """Documents written but not yet in the engine index (searched exactly meanwhile)."""
        return len(self._pending)

    @property
    def dead_vector_rows(self) -> int:
        """Rows of the vector file that no live document references (removed by compaction)."""
        return self._vf.n_rows - self._n_vectors if self._vf is not None else 0

    # -- fork safety -----------------------------------------------------------------------
    def _check_open(self, what: str = "this call") -> None:
        """:meth:`MultiVectorStore._check_open`, and in a process forked from the one that
        opened this object (a prefork server's worker: gunicorn ``--preload``,
        ``multiprocessing``'s fork), its connections opened again first (:meth:`_after_fork`)."""
        super()._check_open(what)
        if self._pid != os.getpid():
            self._after_fork(what)

    def _after_fork(self, what: str = "this call") -> None:
        """This object was opened in a parent process and is used in a forked child: a SQLite
        connection must not be used across ``fork()`` (its locks are the parent's), so the
        child opens its own and reads the view again (one :meth:`_load`, as a reader: the
        child becomes a writer when it writes, like any store object). What the parent opened
        is taken over, never used nor closed here (:data:`_INHERITED`): its connection and a
        vector file open for appending; the engine's in-memory index is dropped and opened
        again from its folder (engines keep threads and native state that do not survive a
        fork); the read-only map of the vector file is kept (the same shared pages). A store
        in memory (``path=None``, SQLite ``:memory:``) goes on as the child's own copy. A
        temporary folder (``path=None`` of an engine that writes files) stays the parent's to
        remove. A store copied while another thread of the parent was writing to it refuses
        every call (:class:`StoreInUse`): its view is half a write."""
        if self._forked_in_write:
            self._closed = True
            raise StoreInUse(f"this {type(self).__name__} ({self.path}) was copied by os.fork() while "
                             f"another thread of the parent process wrote to it: {what} is refused in "
                             "the child; open the folder again in this process")
        self._pid = os.getpid()
        if self.path is None:
            self._tmpdir = None  # the parent's to remove
            return
        self._leave_the_parents_handles()
        self._engine_folder = None
        if self._index_fd is not None:  # a copy of the parent's descriptor: its shared lock stays
            os.close(self._index_fd)
            self._index_fd = None
        self._write_depth, self._synced, self._has_written = 0, False, False
        self._db = self._connect()
        self._load()

    def _leave_the_parents_handles(self) -> None:
        """In a forked child: the parent's temporary folder, connection, vector file open for
        appending and engine handle are the parent's, neither used nor closed here
        (:data:`_INHERITED` keeps them referenced)."""
        self._tmpdir = None
        _INHERITED.append(self._db)
        self._db = None
        if self._vf is not None and self._vf.writable:
            _INHERITED.append(self._vf)
            self._vf = None
        _INHERITED.append(self._index)
        self._index = None

    # -- SQLite ----------------------------------------------------------------------------
    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return transaction(self._db)

    def _state_get(self, key: str, default: str | None = None) -> str | None:
        return state_get(self._db, key, default)

    _state_set = staticmethod(state_set)

    @classmethod
    def _docs_table(cls) -> str:
        ref = f", {cls.ref_column} INTEGER UNIQUE" if cls.ref_column else ""
        return ("(seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, start INTEGER NOT NULL, "
                f"n_rows INTEGER NOT NULL{ref}, metadata TEXT NOT NULL)")

    @classmethod
    def _create_tables(cls, db: sqlite3.Connection, config: dict[str, Any], **state: str) -> None:
        """The tables and state keys of a new store (inside the caller's transaction); ``state``
        overrides the keys of an empty one (a converted store starts with rows)."""
        db.execute(f"CREATE TABLE docs {cls._docs_table()}")
        if cls.ref_column:
            db.execute("CREATE TABLE dead (pid INTEGER PRIMARY KEY)")
        state_set(db, **{"config": json.dumps(config), "index_dir": "", "dirty": "0", "generation": "0",
                         "vector_gen": "1", "vector_rows": "0", "built_vectors": "0", "last_seq": "0",
                         **state})

    # -- open ------------------------------------------------------------------------------
    def _open(self, format: TaggedFormat | None, given: dict[str, Any], create: bool = True) -> None:
        """Open the folder for reading (creating the store first when there is none and ``create``):
        nothing is repaired, rebuilt or cleaned up here. The one-time conversions of an older
        layout (renamed state keys, an older schema) are writes: they take the write lock."""
        mine = f"{self.engine_name} {self.engine_version}"
        if self.path is not None:
            have, why = self._stored_config()
            if not have:
                if self.read_only or not create:
                    half = (self.path / DB_NAME).is_file()
                    raise StoreNotFound(
                        f"no {self.label} store at {self.path} ({why}); nothing was created"
                        + ("; its store.sqlite is what a creation killed before its first commit leaves: "
                           "open it with create=True to make the store there, or delete the folder"
                           if half else ""))
                with self._folder_lock():  # creation is a write; a creator that lost the race opens
                    self._db = connect(self.path / DB_NAME)
                    if self._state_get("config") is None:
                        self._create(given, mine)
                    self._db.close()
                    self._db = None
            self._db = self._connect()
        elif self._state_get("config") is None:
            self._create(given, mine)
        raw = self._state_get("config")
        assert raw is not None
        # the record first: nothing is renamed or converted in a store that does not fit
        config = read_record(raw)
        self.format = check_record(
            config, format, f"{self.path} (the configuration in its {DB_NAME})", key="backend",
            value=self.backend, schema=self._readable_schemas()) or self.format
        self._build = {**self.build_legacy, **config["build"]}
        for k, v in given.items():
            if v is not None and v != self._build[k]:
                raise CollectionMismatch(
                    f"store at {self.path} was built with {k}={self._build[k]!r}, not {v!r}: open it "
                    f"without {k}, or index into a new store")
        marks = ",".join("?" * len(RENAMED_KEYS))
        old_keys = self._db.execute(f"SELECT key FROM state WHERE key IN ({marks})",
                                    list(RENAMED_KEYS)).fetchall()
        old_schema = config.get("schema") != self.schema_version
        if old_schema and (self.read_only or not self._writable):
            raise CollectionMismatch(
                f"the {self.label} store at {self.path} has schema {config.get('schema')}: it is converted "
                f"to schema {self.schema_version} once, by a store opened for writing (not read_only, "
                "in a writable folder); nothing was changed")
        if (old_keys or old_schema) and not self.read_only and self._writable:
            with self._folder_lock():
                rename_state_keys(self._db, RENAMED_KEYS)
                config = self._upgrade(read_record(self._state_get("config") or raw))
        self._config = config
        self._load()

    def _create(self, given: dict[str, Any], engine: str) -> None:
        """The tables of a new store (in ``self._db``, under the write lock of its folder)."""
        if self._db.execute("SELECT name FROM sqlite_master WHERE name = 'docs'").fetchone():
            raise CollectionMismatch(
                f"{self.path / DB_NAME} has documents but no configuration: not a {self.label} store "
                "this library wrote; refusing to guess its layout")
        build = {k: (self.build_defaults[k] if v is None else v) for k, v in given.items()}
        config = {"backend": self.backend, "schema": self.schema_version,
                  "format": self.format.to_stored(), "build": build, "engine": engine}
        with self._tx() as db:
            self._create_tables(db, config)
        if self.path is not None:  # readers map it from the start
            VectorFile.open(self.path, generation=1, dtype=build["vector_dtype"], committed_rows=0,
                            originals=build.get("originals")).close()

    def _stored_config(self) -> tuple[bool, str]:
        """Whether the folder holds a store (its ``store.sqlite`` has a configuration), read
        through a read-only connection (the WAL included; nothing is created), and why not."""
        db_path = self.path / DB_NAME
        if not db_path.is_file():
            return False, f"the folder holds no {DB_NAME}"
        # immutable first (no -wal/-shm file made); through the WAL where one lies beside it (a
        # creator that has not checkpointed yet, a killed writer)
        for writable in (False, *((self._writable,) if Path(f"{db_path}-wal").is_file() else ())):
            con = connect_reader(db_path, writable)
            try:
                try:
                    row = con.execute("SELECT value FROM state WHERE key = 'config'").fetchone()
                except sqlite3.OperationalError as e:
                    if "no such table" not in str(e):
                        raise
                    row = None
            finally:
                con.close()
            if row is not None:
                return True, ""
        return False, f"its {DB_NAME} holds no store configuration"

    def _connect(self) -> sqlite3.Connection:
        """The store object's connection: read-write (it never writes before a write takes the
        folder's write lock); ``PRAGMA query_only`` for ``read_only`` (a read-write connection all
        the same: SQLite removes its ``-wal``/``-shm`` files when the last one closes, where a
        ``mode=ro`` one leaves them); immutable in a folder this process cannot write
        (:func:`~uibk_embedding._sqlite_state.connect_reader`)."""
        if not self._writable:
            return connect_reader(self.path / DB_NAME, writable=False)
        if self.read_only:
            db = sqlite3.connect(self.path / DB_NAME, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA query_only=1")
            return db
        return connect(self.path / DB_NAME)

    # -- sharing: many readers, one writer at a time ----------------------------------------
    @contextlib.contextmanager
    def _folder_lock(self, timeout: float | None = None) -> Iterator[None]:
        """The folder's write lock (:func:`~uibk_embedding._sqlite_state.acquire_write_lock`),
        for the duration of the block; nothing for a store without a folder."""
        if self.path is None:
            yield
            return
        self._refuse_writes()
        lock = acquire_write_lock(self.path / LOCK_NAME, f"the store folder {self.path}",
                                  self.write_timeout if timeout is None else timeout)
        try:
            yield
        finally:
            lock.close()

    def _refuse_writes(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"this {type(self).__name__} ({self.path}) was opened with read_only=True: "
                             "it answers reads and refuses writes; open the folder without read_only "
                             "to write")
        if not self._writable:
            raise PermissionError(f"the store folder {self.path} is not writable by this process: the "
                                  "store answers reads, but cannot take writes")

    @contextlib.contextmanager
    def _writing(self, timeout: float | None = None) -> Iterator[None]:
        """Around every write (under ``self._lock``): the folder's write lock (waited for up to
        ``write_timeout``, then :class:`~uibk_embedding.errors.StoreInUse`), the view brought up
        to date with what other store objects committed, and what a killed writer left recovered
        (:meth:`_recover`), then the write; the lock goes when the write returns. Nested writes
        (a flush inside an upsert) hold it once."""
        if self._write_depth:
            self._write_depth += 1
            try:
                yield
            finally:
                self._write_depth -= 1
            return
        with self._folder_lock(timeout):
            self._write_depth = 1
            try:
                if self.path is not None and (not self._synced or self._changed()):
                    self._load(writer=True)
                    self._recover()
                    self._synced = True
                self._has_written = True
                yield
            finally:
                self._write_depth = 0

    def _changed(self) -> bool:
        """Whether another connection (store object, process) committed since the view's snapshot:
        one ``PRAGMA data_version`` (a read of SQLite's shared-memory WAL header; no file read)."""
        return self._db.execute("PRAGMA data_version").fetchone()[0] != self._data_version

    def _fresh(self) -> None:
        """Before a read: the view moves on to the newest committed state when another store
        object committed since its snapshot (:meth:`_changed`; then the rows are read again)."""
        if self.path is not None and not self._write_depth and self._changed():
            self._reload()
            self._synced = False

    def refresh(self) -> bool:
        """Move on to the newest committed state of the folder (other store objects' and
        processes' writes); returns whether there was one. Every search, ``get``, ``count`` and
        listing does this check first (one ``PRAGMA data_version``, about a microsecond); until
        then a store object answers from the snapshot it read: a consistent state, never half a
        write.

        >>> import tempfile
        >>> from uibk_embedding.testing import make_list
        >>> import numpy as np
        >>> d = tempfile.mkdtemp()
        >>> a, b = ScanEngine(d), ScanEngine(d)      # two store objects on one folder
        >>> a.upsert(["x"], [make_list(a.format, np.random.default_rng(0), 4)])
        >>> b.refresh(), b.count()
        (True, 1)
        >>> a.close(); b.close()
        """
        with self._lock:
            self._check_open()
            if self.path is None or not self._changed():
                return False
            self._reload()
            self._synced = False
            return True

    def _recover(self) -> None:
        """Under the write lock, once the view was read: finish what a killed or failed writer
        left (the view's index is out of date, of another engine version, or missing where the
        store wants one: rebuilt; index folders no reader uses any more: removed). The vector
        file's uncommitted tail and other generations went when :meth:`_load` opened it."""
        reason = self._index_problem
        mine = f"{self.engine_name} {self.engine_version}"
        if reason is not None:
            if self._index_dir or (self.sync_on_write and self._wants_index()):
                warnings.warn(f"rebuilding the {self.label} index at {self.path} from the stored vectors: "
                              f"{reason}", RuntimeWarning, stacklevel=6)
            if self._config.get("engine") != mine:
                self._config = {**self._config, "engine": mine}
                with self._tx() as db:
                    self._state_set(db, config=json.dumps(self._config))
            try:
                self._rebuild()
            except (self.engine_error, OSError, sqlite3.Error) as e:
                self._open_without_index(e)
        if self.path is not None:
            remove_stale_index_dirs(self.path, self.index_prefix, self._index_dir, self._generation)

    def _upgrade(self, config: dict[str, Any]) -> dict[str, Any]:
        """Convert a store of an older schema (engines with older schemas override this and then
        read every older schema: :meth:`_readable_schemas`)."""
        return config

    def _readable_schemas(self) -> tuple[int, ...]:
        """The schemas this engine opens: its own, and every older one when it converts them."""
        converts = type(self)._upgrade is not IndexedStore._upgrade
        return tuple(range(1 if converts else self.schema_version, self.schema_version + 1))

    def _load(self, writer: bool = False) -> None:
        """Read the view (the committed rows, the vector file, the index's document map) from one
        snapshot: a SQLite read transaction and the vector-file generation and index folder it
        names. The index folder is shared-locked before the snapshot is taken (:meth:`_snapshot`),
        so no writer changes it in place while this object answers from it. A ``writer`` (under
        the write lock) opens the vector file for appending, cutting an uncommitted tail and
        removing every other generation (a reader's map of one stays readable: an unlinked file
        lives while it is mapped); a reader changes nothing."""
        keep = self._index
        seen = None
        for _ in range(100):
            state, rows, refs, dead, version, fd = self._snapshot()
            gen = int(state.get("vector_gen", "1") or 1)
            committed = int(state.get("vector_rows", "0") or 0)
            try:
                vf = self._open_vectors(gen, committed, writer)
                break
            except FileNotFoundError:  # a writer's compaction removed it after the snapshot: again
                if fd is not None and fd != self._index_fd:
                    os.close(fd)
                if writer or self.path is None or version == seen:  # not a compaction meanwhile: lost
                    raise
                seen = version
        else:
            raise StoreInUse(f"the store folder {self.path} kept changing while it was read "
                             "(100 snapshots); try again")
        same_index = (keep is not None and fd == self._index_fd
                      and state.get("index_dir", "") == self._index_dir
                      and state.get("generation", "0") == str(self._generation)
                      and state.get("dirty", "0") == "0")
        if not same_index:
            if fd is not None and fd == self._index_fd:
                self._close_index()  # the same folder, still shared-locked: opened again below
            else:
                self._release_index()
                self._index_fd = fd
        old_vf, self._vf = self._vf, vf
        if old_vf is not None and old_vf is not vf:
            old_vf.close()
        self._reset_view()
        self._vgen = gen
        self._data_version = version
        self._generation = int(state.get("generation", "0") or 0)
        self._index_dir = state.get("index_dir", "") or ""
        self._dirty = state.get("dirty", "0") == "1"
        for seq, doc_id, start, n_rows in rows:
            if start + n_rows > committed:
                raise CollectionMismatch(f"{self.path / DB_NAME} references vector rows beyond the committed "
                                         f"{committed}: the store was modified outside this library")
            self._remember(seq, doc_id, start, n_rows)
        built = state.get("built_vectors")  # absent in stores written before it existed
        self._built_vectors = int(built) if built is not None else self._n_vectors
        self._last_seq = max([int(state.get("last_seq", "0") or 0), *self._id_of])
        if self.ref_column:
            for seq, ref in refs:
                self._ref[seq], self._seq_of_ref[ref] = ref, seq
            self._dead = set(dead)
            self._pending = {s: None for s in self._id_of if s not in self._ref}
        elif not self._index_dir and self.builds_index:  # a store that builds none has nothing pending
            self._pending = dict.fromkeys(self._id_of)
        mine = f"{self.engine_name} {self.engine_version}"
        engine = self._config.get("engine")
        problem = None
        if self._dirty:
            problem = f"an interrupted {'write' if self.sync_on_write else 'flush'} left it out of date"
        elif engine != mine:
            problem = f"it was built by {engine}, this is {mine}"
        elif self._index_dir and self._index_fd is None:
            problem = "its folder is missing or was held by a writer"
        elif self._index_dir and not same_index:
            problem = self._open_index()
        elif not self._index_dir and self.sync_on_write and self._wants_index():
            problem = "it is missing"
        if problem is not None:
            self._release_index()
        self._index_problem = problem

    def _reload(self) -> None:
        """A reader's move to the newest committed state: what changed since its snapshot
        (:meth:`_catch_up`) where that is enough, else the whole view (:meth:`_load`)."""
        if not self._catch_up():
            self._load()

    def _catch_up(self) -> bool:
        """Bring the view of a store *without an index* (the exact store; PLAID and WARP below
        ``min_index_vectors``) to the newest committed state by reading only what changed, in
        one read transaction: the documents written since the view's snapshot (seqs above its
        ``last_seq``: seqs only grow) and, when fewer of the view's documents are left than it
        holds, the seqs still there (so the removed ones are known). False, nothing changed,
        when the whole view must be read (:meth:`_load`): an index exists or was built, the
        vector file moved to another generation (a compaction), or the store is dirty."""
        vf = self._vf
        if (self.path is None or self._index is not None or self._index_dir or self._dirty or vf is None
                or vf.writable or self._index_fd is not None):
            return False
        last = self._last_seq
        with read_transaction(self._db) as db:
            state = dict(db.execute("SELECT key, value FROM state").fetchall())
            for old, new in RENAMED_KEYS.items():
                if old in state:
                    state.setdefault(new, state.pop(old))
            if (state.get("index_dir", "") or state.get("dirty", "0") != "0"
                    or int(state.get("vector_gen", "1") or 1) != self._vgen
                    or read_record(state.get("config")) != self._config):
                return False
            committed = int(state.get("vector_rows", "0") or 0)
            added = db.execute("SELECT seq, id, start, n_rows FROM docs WHERE seq > ? ORDER BY seq",
                               (last,)).fetchall()
            kept = db.execute("SELECT COUNT(*) FROM docs WHERE seq <= ?", (last,)).fetchone()[0]
            gone: list[int] = []
            if kept != len(self._id_of):
                there = {r[0] for r in db.execute("SELECT seq FROM docs WHERE seq <= ?", (last,))}
                gone = [s for s in self._id_of if s not in there]
            built = state.get("built_vectors")
            version = db.execute("PRAGMA data_version").fetchone()[0]
        if committed < vf.n_rows or any(st + n > committed for _, _, st, n in added):
            return False  # not a state this view can grow into: read it whole
        vf.grow_to(committed)
        self._forget(gone)
        for seq, doc_id, start, n_rows in added:
            self._remember(seq, doc_id, start, n_rows)
            if self.builds_index:  # no index yet: every document is pending (scored exactly)
                self._pending[seq] = None
        self._last_seq = max([int(state.get("last_seq", "0") or 0), last, *(r[0] for r in added)])
        self._built_vectors = int(built) if built is not None else self._n_vectors
        self._generation = int(state.get("generation", "0") or 0)
        self._data_version = version
        self._live = None
        self._version += 1
        return True

    def _snapshot(self) -> tuple[dict[str, str], list, list, list, Any, int | None]:
        """One consistent read of the database: the state keys (older names read as today's),
        the documents, the engine refs and dead refs, ``PRAGMA data_version``, and the descriptor
        of a shared lock on the index folder the state names (taken *before* the read: a writer
        updates a folder in place only while no store object shares it; None: no index, or its
        folder could not be shared). Read again when the index folder changed in between."""
        for _ in range(100):
            peek = state_get(self._db, "index_dir") or state_get(self._db, "plaid_dir") or ""
            if not peek or self.path is None:
                fd = None
            elif peek == self._index_dir and self._index_fd is not None:
                fd = self._index_fd  # held since this object loaded it
            else:
                fd = share_directory(self.path / peek, self.write_timeout)
            with read_transaction(self._db) as db:
                state = dict(db.execute("SELECT key, value FROM state").fetchall())
                for old, new in RENAMED_KEYS.items():
                    if old in state:
                        state.setdefault(new, state.pop(old))
                if state.get("index_dir", "") != peek:
                    if fd is not None and fd != self._index_fd:
                        os.close(fd)
                    continue
                rows = db.execute("SELECT seq, id, start, n_rows FROM docs ORDER BY seq").fetchall()
                refs, dead = [], []
                if self.ref_column:
                    refs = db.execute(f"SELECT seq, {self.ref_column} FROM docs "
                                      f"WHERE {self.ref_column} IS NOT NULL").fetchall()
                    dead = [r[0] for r in db.execute("SELECT pid FROM dead")]
                version = db.execute("PRAGMA data_version").fetchone()[0]
            return state, rows, refs, dead, version, fd
        raise StoreInUse(f"the index of {self.path} kept changing while it was read (100 snapshots); "
                         "try again")

    def _reset_view(self) -> None:
        self._id_of, self._seq_of, self._start, self._rows = {}, {}, {}, {}
        self._pending, self._dead, self._ref, self._seq_of_ref = {}, set(), {}, {}
        self._n_vectors = 0
        self._live = None
        self._version += 1

    def _open_vectors(self, gen: int, committed: int, writer: bool) -> VectorFile:
        """The vector file of generation ``gen``: a writer's opens (or creates) it for appending,
        cutting an uncommitted tail, and removes every other generation (a compaction that
        crashed before its switch, or after it); a reader's maps its first ``committed`` rows."""
        if self.path is None:
            return self._vf if self._vf is not None else MemoryVectors()
        dtype, originals = self._build["vector_dtype"], self._build.get("originals")
        if not writer:
            vf = self._vf
            if vf is not None and not vf.writable and vf.path.name == file_name(gen, dtype) \
                    and committed >= vf.n_rows and vf._f is not None:
                vf.grow_to(committed)  # the same file, grown: mapped again on the next read
                return vf
            return VectorFile.open_shared(self.path, generation=gen, dtype=dtype, rows=committed,
                                          originals=originals)
        vf = VectorFile.open(self.path, generation=gen, dtype=dtype, committed_rows=committed,
                             originals=originals)
        remove_other_generations(self.path, keep=vf.file_names())
        return vf

    def _open_index(self) -> str | None:
        """Open the current index (its folder shared-locked by :meth:`_snapshot`); the reason it
        cannot be used, or None."""
        folder = self.path / self._index_dir
        expected = len(self._id_of) - len(self._pending) + len(self._dead)
        try:
            n = self._engine_count(folder)
            if n != expected:
                return f"it holds {n} documents, the store {expected}"
            self._engine_folder = folder
            # a reader's searches too: PLAID's decompression buffers (up to 4 x candidates_limit
            # documents) otherwise stay held by the allocator after a search, 150-200 MiB a reader
            # at NPL's size (benchmarks/results/reader_memory.md)
            fix_mmap_threshold()
            self._index = self._engine_open(folder)
        except self.engine_error as e:
            return str(e)
        return None

    def _open_without_index(self, error: BaseException) -> None:
        """The index could not be rebuilt on open (a full disk, say): the store opens on its
        committed documents with no index (searches are exact MaxSim over the stored vectors),
        still marked dirty, so the next write, flush or :meth:`rebuild` tries again."""
        self._close_index()
        with contextlib.suppress(sqlite3.Error), self._tx() as db:
            self._state_set(db, dirty="1")
        self._dirty = True
        warnings.warn(f"the {self.label} index at {self.path} could not be rebuilt ({error}); the store "
                      "is open without an index: searches are exact over the stored vectors until a "
                      "write, flush or rebuild() succeeds", RuntimeWarning, stacklevel=5)

    def _remember(self, seq: int, doc_id: str, start: int, n_rows: int) -> None:
        self._id_of[seq], self._seq_of[doc_id] = doc_id, seq
        self._start[seq], self._rows[seq] = start, n_rows
        self._n_vectors += n_rows

    def _metadata(self, seqs: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The metadata of the documents ``seqs`` of the view, read from SQLite now (a store object
        holds no metadata: N readers do not keep N copies of every document's metadata, which
        may hold its text). A document's row never changes while its seq lives (an upsert gives
        a new seq), so the rows read now are those of the view's snapshot, unless another
        writer removed one since: then :class:`_StaleView` (the caller reads the view again
        and answers from the newer snapshot)."""
        want = list(dict.fromkeys(int(s) for s in seqs))
        out: dict[int, dict[str, Any]] = {}
        for clause, chunk in _in("seq", want):
            for seq, md in self._db.execute(f"SELECT seq, metadata FROM docs WHERE {clause}", chunk):
                out[seq] = json.loads(md)
        if len(out) != len(want):
            raise _StaleView
        return out

    def _matching(self, conditions: tuple[Node, ...]) -> list[int]:
        """The seqs of the view's documents whose metadata pass ``conditions``. The fields the
        conditions name (top-level keys: a filter reads nothing else) are read from SQLite once
        and kept per seq (a seq's metadata never change), for the next filter on the same fields;
        documents written since are read then, a filter on other fields reads them all again.
        So a process that filters holds those fields of every document, one that does not holds
        nothing."""
        fields = _fields(conditions)
        cached = self._filter_fields
        if cached is None or cached[0] != fields:  # every stored document's, from one committed state
            with read_transaction(self._db) as db:
                rows = db.execute("SELECT seq, metadata FROM docs")
                values = {seq: {f: md[f] for f in fields if f in md}
                          for seq, m in rows for md in (json.loads(m),)}
            self._filter_fields = cached = (fields, values)
        values = cached[1]
        missing = [s for s in self._id_of if s not in values]
        if missing:
            for s, md in self._metadata(missing).items():
                values[s] = {f: md[f] for f in fields if f in md}
        if len(values) > 2 * len(self._id_of) + 1024:  # removed documents' entries
            cached[1].clear()
            cached[1].update({s: values[s] for s in self._id_of})
        return [s for s in self._id_of if matches(values[s], conditions)]

    def _reading(self, read: Any) -> Any:
        """``read()`` (a read of metadata, which come from SQLite), done again on the newest
        snapshot when the view's one lost a document meanwhile (:class:`_StaleView`)."""
        for _ in range(100):
            try:
                return read()
            except _StaleView:
                if self.path is None or self._write_depth:
                    raise RuntimeError(f"the {self.label} store's documents changed under a write") from None
                self._reload()
                self._synced = False
        raise StoreInUse(f"the store folder {self.path} kept changing while it was read (100 snapshots); "
                         "try again")

    def _gather(self, seqs: Sequence[int], dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """The stored vectors of ``seqs`` packed as ``(matrix, offsets)`` (:meth:`VectorFile.gather`)."""
        assert self._vf is not None
        return self._vf.gather(*self._extents(seqs), dtype=dtype)

    def _views(self, seqs: Sequence[int], dtype: type) -> list:
        """The stored vectors of ``seqs`` as one torch tensor each, in ``dtype``. When the vector
        file holds ``dtype`` these are views into its copy-on-write memory map
        (:meth:`VectorFile.private_map`): an index build reads the rows from the page cache
        instead of holding a second copy of every vector on the heap. Otherwise one converted
        copy (:meth:`_gather`). For engines that load torch (``self._torch``)."""
        torch = self._torch
        assert self._vf is not None
        if self._vf.dtype == np.dtype(dtype):
            rows = torch.from_numpy(self._vf.private_map())
            return [rows[self._start[s]:self._start[s] + self._rows[s]] for s in seqs]
        mat, off = self._gather(seqs, dtype)
        return list(torch.from_numpy(mat).split(np.diff(off).tolist()))

    # -- the index -------------------------------------------------------------------------
    def _close_index(self) -> None:
        """Close the engine's handle (the folder stays shared-locked: :meth:`_release_index`)."""
        if self._index is not None:
            with contextlib.suppress(Exception):
                self._engine_close()
            self._index = None

    def _release_index(self) -> None:
        """Close the engine's handle and let go of its folder (a writer may then remove it)."""
        self._close_index()
        self._engine_folder = None
        if self._index_fd is not None:
            os.close(self._index_fd)
            self._index_fd = None

    def _switch_index(self, handle: Any, name: str) -> None:
        """This object answers from the index folder ``name`` now (its handle ``handle``; none
        for ``""``): the previous folder is let go, and removed when no reader shares it."""
        old = self._engine_folder
        self._release_index()
        self._index = handle
        if name:
            self._engine_folder = self.path / name
            self._index_fd = share_directory(self._engine_folder, 0)
        if old is not None and old.name != name:
            remove_unshared_directory(old)
        if self.path is not None:
            remove_stale_index_dirs(self.path, self.index_prefix, name, self._generation)

    def _rebuild(self) -> None:
        """Build a fresh index from the stored vectors into a new folder, then switch to it (the
        refs of every live document are set in the same transaction). When the store wants no
        index (:meth:`_wants_index`) the switch is to no index: no document keeps a ref, every one is
        pending (searched exactly), and the old index folder goes."""
        gen = self._generation + 1
        live = list(self._id_of)
        name = f"{self.index_prefix}{gen:06d}" if self._wants_index() else ""
        handle, refs = None, []
        indexed = live if name else []  # the documents ``refs`` numbers, in the same order
        if name:
            target = self.path / name
            shutil.rmtree(target, ignore_errors=True)
            fix_mmap_threshold()
            handle, refs = self._engine_build(target, live)
            fsync_tree(target)  # durable before the state row points at it
        built = self._n_vectors if name else 0
        try:
            with self._tx() as db:
                if self.ref_column:
                    db.execute(f"UPDATE docs SET {self.ref_column} = NULL")
                    db.executemany(f"UPDATE docs SET {self.ref_column} = ? WHERE seq = ?",
                                   zip(refs, indexed, strict=True))
                    db.execute("DELETE FROM dead")
                self._state_set(db, index_dir=name, generation=str(gen), dirty="0", built_vectors=str(built))
        except BaseException:
            if handle is not None:
                old, self._index = self._index, handle
                self._close_index()
                self._index = old
            raise
        self._index_dir, self._generation = name, gen
        self._switch_index(handle, name)
        self._built_vectors, self._dirty, self._index_problem = built, False, None
        self._dead, self._pending = set(), ({} if name or not self.builds_index else dict.fromkeys(live))
        if self.ref_column:
            self._ref = dict(zip(indexed, refs, strict=True))
            self._seq_of_ref = {r: s for s, r in self._ref.items()}
        self._version += 1

    def rebuild(self) -> None:
        """Re-cluster: build the index anew from the stored vectors (e.g. after the collection
        drifted far from the one the centroids were trained on). The vector file is compacted
        first (rows of deleted or overwritten documents dropped)."""
        with self._lock, self._writing():
            self._check_open()
            self._compact_vectors()
            self._rebuild()

    def flush(self) -> None:
        """Bring the index up to date with every committed write (builds it when the store has
        reached ``min_index_vectors``): a write (it takes the folder's write lock). A
        ``read_only`` store only moves on to the newest committed state (:meth:`refresh`)."""
        with self._lock:
            self._check_open()
            if self.read_only:
                self._fresh()
                return
            with self._writing():
                self._sync()

    def _sync(self) -> None:
        """:meth:`_flush`; on any failure the index is dropped (searches fall back to exact
        MaxSim on the stored vectors, which stay committed) and the error raised. The dirty
        flag stays set, so the next write, flush or open rebuilds it."""
        try:
            self._flush()
        except BaseException:
            self._close_index()
            raise

    def _flush(self) -> None:
        if not self._pending and not self._dead and not self._dirty:
            return
        if self._index is None:
            if self._wants_index() or self._dirty:
                self._rebuild()
            return
        growth = self.rebuild_growth
        grown = growth is not None and self._n_vectors > growth * self._built_vectors
        if not self._wants_index() or len(self._pending) == len(self._id_of) or grown:
            self._rebuild()
            return
        try:
            self._update_index()
        except self.engine_error as e:
            warnings.warn(f"{e}; rebuilding the {self.label} index from the stored vectors", RuntimeWarning,
                          stacklevel=5)
            self._close_index()
            self._rebuild()

    def _update_index(self) -> None:
        """The engine update: in place when no other store object answers from the index folder
        (:func:`~uibk_embedding._sqlite_state.try_exclusive`), else on a copy of it
        (:meth:`_update_copy`), so a reader keeps the index its snapshot names."""
        fd = self._index_fd
        if fd is not None and not try_exclusive(fd):
            self._update_copy()
            return
        try:
            self._update_in_place()
        finally:
            if fd is not None and fd == self._index_fd:
                fcntl.flock(fd, fcntl.LOCK_SH)

    def _update_copy(self) -> None:
        """Copy the index folder into the next generation, update the copy, then switch to it in
        one transaction (readers of the old folder keep it until they move on; the old folder
        goes when none shares it)."""
        gen = self._generation + 1
        name = f"{self.index_prefix}{gen:06d}"
        target = self.path / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(self._engine_folder, target)
        self._close_index()
        old_folder, self._engine_folder = self._engine_folder, target
        try:
            self._index = self._engine_open(target)
            refs, added, dead = self._apply_update(target)
            with self._tx() as db:
                self._commit_refs(db, refs, added, dead)
                self._state_set(db, index_dir=name, generation=str(gen), dirty="0")
        except BaseException:
            self._close_index()
            self._engine_folder = old_folder
            shutil.rmtree(target, ignore_errors=True)
            raise
        handle, self._index = self._index, None
        self._index_dir, self._generation = name, gen
        self._engine_folder = old_folder
        self._switch_index(handle, name)
        self._updated(refs, added)

    def _apply_update(self, folder: Path) -> tuple[list[int], list[int], list[int]]:
        """The engine's update of the index in ``folder`` (the pending documents added, the dead
        ones removed), checked and made durable; returns ``(refs, added, dead)`` to commit. The
        engine writes its files without fsync: durable before the clean flag or the switch, or a
        power cut leaves the old index trusted and its numbers mapped to other ids."""
        dead, added = sorted(self._dead), list(self._pending)
        if added:
            fix_mmap_threshold()
        refs = self._engine_update(dead, added)
        self._check_update(refs, added, folder)
        fsync_tree(folder)
        return refs, added, dead

    def _check_update(self, refs: list[int], added: list[int], folder: Path) -> None:
        if len(refs) != len(added) or len(set(refs)) != len(refs) \
                or (self.ref_column and set(refs) & set(self._seq_of_ref)):
            raise self.engine_error(f"the update returned {len(refs)} document numbers for {len(added)} "
                                    "documents (or numbers already in use)")
        n = self._engine_count(folder)
        if n != len(self._id_of):
            raise self.engine_error(f"after the update the index holds {n} documents, the store "
                                    f"{len(self._id_of)}")

    def _commit_refs(self, db: sqlite3.Connection, refs: list[int], added: list[int],
                     dead: list[int]) -> None:
        if self.ref_column:
            db.executemany(f"UPDATE docs SET {self.ref_column} = ? WHERE seq = ?",
                           zip(refs, added, strict=True))
            for clause, chunk in _in("pid", dead):
                db.execute(f"DELETE FROM dead WHERE {clause}", chunk)

    def _updated(self, refs: list[int], added: list[int]) -> None:
        self._dirty = False
        if self.ref_column:
            for r, s in zip(refs, added, strict=True):
                self._ref[s], self._seq_of_ref[r] = r, s
        self._pending, self._dead = {}, set()
        self._version += 1

    def _update_in_place(self) -> None:
        """The in-place update: dirty, engine update, count check, fsync, then clean."""
        folder = self._engine_folder
        if not self._dirty:
            with self._tx() as db:
                self._state_set(db, dirty="1")
            self._dirty = True
        refs, added, dead = self._apply_update(folder)
        with self._tx() as db:
            self._commit_refs(db, refs, added, dead)
            self._state_set(db, dirty="0")
        self._updated(refs, added)

    # -- the vector file -------------------------------------------------------------------
    def _compact_vectors(self) -> None:
        """Copy the live rows (in seq order) into the next generation of the vector file,
        durably, then switch every document's start and the generation in one transaction."""
        assert self._vf is not None
        live = list(self._id_of)
        starts = np.fromiter((self._start[s] for s in live), dtype=np.int64, count=len(live))
        lengths = np.fromiter((self._rows[s] for s in live), dtype=np.int64, count=len(live))
        gen = self._vgen + 1
        new, new_starts = self._vf.rewrite(self.path, gen, starts, lengths, chunk_rows=1 << 18)
        try:
            with self._tx() as db:
                db.executemany("UPDATE docs SET start = ? WHERE seq = ?",
                               zip(new_starts.tolist(), live, strict=True))
                self._state_set(db, vector_gen=str(gen), vector_rows=str(new.n_rows))
        except BaseException:
            named = committed_generation(self._db, "vector_gen")
            if named != gen:  # not committed: the new file is nobody's (unless unreadable: kept)
                new.close()
                if named == self._vgen:
                    new.path.unlink(missing_ok=True)
                raise
        old, self._vf, self._vgen = self._vf, new, gen
        old.close()
        for s, st in zip(live, new_starts.tolist(), strict=True):
            self._start[s] = st
        self._version += 1
        if self.path is not None:
            remove_other_generations(self.path, keep=new.file_names())

    def _maybe_compact_vectors(self) -> None:
        dead = self.dead_vector_rows
        assert self._vf is not None
        if dead >= max(1, self.vector_compact_min_rows) \
                and dead > self.vector_compact_fraction * self._vf.n_rows:
            try:
                self._compact_vectors()
            except (OSError, sqlite3.Error) as e:  # the write is committed; dead rows only cost disk
                warnings.warn(f"could not compact the vector file of {self.path}: {e}", RuntimeWarning,
                              stacklevel=5)

    # -- writes ----------------------------------------------------------------------------
    def _retire(self, db: sqlite3.Connection, seqs: list[int]) -> None:
        """Delete the rows of ``seqs`` (and record the refs they leave in the index)."""
        for clause, chunk in _in("seq", seqs):
            db.execute(f"DELETE FROM docs WHERE {clause}", chunk)
        if self.ref_column:
            db.executemany("INSERT OR IGNORE INTO dead (pid) VALUES (?)",
                           [(self._ref[s],) for s in seqs if s in self._ref])

    def _forget(self, seqs: list[int]) -> None:
        for s in seqs:
            self._n_vectors -= self._rows.pop(s)
            del self._seq_of[self._id_of.pop(s)]
            del self._start[s]
            indexed = s not in self._pending
            self._pending.pop(s, None)
            if self.ref_column:
                ref = self._ref.pop(s, None)
                if ref is not None:
                    del self._seq_of_ref[ref]
                    self._dead.add(ref)
            elif indexed and self._index is not None:
                self._dead.add(s)

    def _written(self) -> None:
        self._version += 1
        try:
            if self.sync_on_write:
                self._sync()
        finally:
            self._maybe_compact_vectors()

    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        with self._lock, self._writing():
            self._check_open()
            assert self._vf is not None
            old = [self._seq_of[x] for x in ids if x in self._seq_of]
            new = list(range(self._last_seq + 1, self._last_seq + 1 + len(ids)))
            starts = self._vf.append(vectors)  # durable BEFORE the rows that reference them commit
            rows = [(s, x, int(st), len(v), json.dumps(m, ensure_ascii=False))
                    for s, x, st, v, m in zip(new, ids, starts, vectors, metadata, strict=True)]
            dirty = {"dirty": "1"} if self.sync_on_write else {}
            with self._tx() as db:
                self._retire(db, old)
                db.executemany("INSERT INTO docs (seq, id, start, n_rows, metadata) VALUES (?, ?, ?, ?, ?)",
                               rows)
                self._state_set(db, **dirty, vector_rows=str(self._vf.n_rows), last_seq=str(new[-1]))
            self._dirty = self._dirty or self.sync_on_write
            self._last_seq = new[-1]
            self._forget(old)
            for s, x, st, v in zip(new, ids, starts, vectors, strict=True):
                self._remember(s, x, int(st), len(v))
                if self.builds_index:  # the exact store builds no index: nothing waits for one
                    self._pending[s] = None
            self._written()

    def _delete(self, ids: list[str]) -> None:
        with self._lock, self._writing():
            self._check_open()
            old = [self._seq_of[x] for x in ids if x in self._seq_of]
            if not old:
                return
            with self._tx() as db:
                self._retire(db, old)
                if self.sync_on_write:
                    self._state_set(db, dirty="1")
            self._dirty = self._dirty or self.sync_on_write
            self._forget(old)
            self._written()

    # -- reads -----------------------------------------------------------------------------
    def count(self) -> int:
        with self._lock:
            self._check_open()
            self._fresh()
            return len(self._id_of)

    def _scan(self, conditions: tuple[Node, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        """The documents (ids and metadata), in insertion order, of one committed state: read from
        SQLite in one read transaction. A scan needs no vectors, so it reads the newest state
        rather than the view's: the view's own state may be gone before its metadata are read
        (a writer that removes documents faster than a reader reloads its view)."""
        with self._lock:
            self._check_open()
            self._fresh()
            with read_transaction(self._db) as db:
                rows = db.execute("SELECT id, metadata FROM docs ORDER BY seq")
                found = [(doc_id, md) for doc_id, md in ((d, json.loads(m)) for d, m in rows)
                         if matches(md, conditions)]
        for i in range(0, len(found), batch_size):
            yield found[i:i + batch_size]

    def _get(self, ids: list[str]) -> list[Record]:
        with self._lock:
            self._check_open()
            self._fresh()
            assert self._vf is not None

            def read() -> list[Record]:
                seqs = [self._seq_of[x] for x in ids if x in self._seq_of]
                md = self._metadata(seqs)
                return [Record(self._id_of[s], self._vf.read(self._start[s], self._rows[s]), md[s])
                        for s in seqs]

            return self._reading(read)

    def _hit(self, key: int, score: float) -> Hit:
        """A hit of the view's document ``key`` (seq); its metadata are filled in by
        :meth:`_with_metadata` once the answer is complete."""
        return Hit(self._id_of[key], finite_score(score), {})

    def _with_metadata(self, answers: list[list[Hit]]) -> list[list[Hit]]:
        """``answers`` with every hit's metadata, read from SQLite in one statement per 900 hits."""
        md = self._metadata([self._seq_of[h.id] for row in answers for h in row])
        for row in answers:
            for h in row:
                h.metadata = md[self._seq_of[h.id]]
        return answers

    def _scores(self, queries: list[np.ndarray], seqs: Sequence[int], dtype: type = np.float32) -> np.ndarray:
        """Exact MaxSim of every query against the stored vectors of ``seqs``:
        ``(len(queries), len(seqs))``, in the vector file's own dtype, converted block by block
        inside :func:`~uibk_embedding.maxsim.maxsim_scores`. When the rows of ``seqs`` make up
        most of one stretch of the file (every live document, say) that stretch of the memory
        map is scored in place, the rows between documents as documents of their own whose
        scores are dropped: no copy at all. Otherwise the rows are gathered,
        :data:`SCORE_CHUNK_ROWS` at a time: bounded memory however many documents are scored."""
        assert self._vf is not None
        if len(seqs) == 0:
            return np.zeros((len(queries), 0), dtype=dtype)
        starts, lengths = self._extents(seqs)
        ends = starts + lengths
        lo, hi = int(starts[0]), int(ends[-1])
        with self._scoring():
            if np.all(starts[1:] >= ends[:-1]) and hi - lo <= 2 * int(lengths.sum()):
                prev = np.concatenate([starts[:1], ends[:-1]])
                gap = starts > prev
                pos = np.cumsum(1 + gap) - 1  # each document's place among the stretch's pieces
                bounds = np.empty(len(seqs) + int(gap.sum()) + 1, dtype=np.int64)
                bounds[pos], bounds[pos[gap] - 1], bounds[-1] = starts, prev[gap], hi
                return maxsim_scores(queries, self._vf._mapped()[lo:hi], bounds - lo, dtype=dtype,
                                     max_chunk_bytes=self.max_chunk_bytes)[:, pos]
            out = np.empty((len(queries), len(seqs)), dtype=dtype)
            for first, last in doc_blocks(np.concatenate([[0], np.cumsum(lengths)]), SCORE_CHUNK_ROWS):
                mat, off = self._vf.gather(starts[first:last], lengths[first:last], self._vf.dtype)
                out[:, first:last] = maxsim_scores(queries, mat, off, dtype=dtype,
                                                   max_chunk_bytes=self.max_chunk_bytes)
        return out

    def _extents(self, seqs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of the rows of ``seqs`` (the cached arrays for :meth:`_everyone`'s)."""
        if self._live is not None and seqs is self._live[1]:
            return self._live[2], self._live[3]
        starts = np.fromiter((self._start[s] for s in seqs), dtype=np.int64, count=len(seqs))
        lengths = np.fromiter((self._rows[s] for s in seqs), dtype=np.int64, count=len(seqs))
        return starts, lengths

    def _everyone(self) -> np.ndarray:
        """Every live seq in order, as an array kept until the next change (an exact scan of a
        large store then reads no dictionary per document)."""
        if self._live is None or self._live[0] != self._version:
            seqs = np.fromiter(self._id_of, dtype=np.int64, count=len(self._id_of))
            self._live = (self._version, seqs, *self._extents(seqs))
        return self._live[1]

    def _scoring(self) -> contextlib.AbstractContextManager:
        """Held while stored vectors are scored (the rerank, an exact scan): engines that share
        the cores with BLAS-heavy work limit its threads here."""
        return contextlib.nullcontext()

    def _fetch(self, keys: Sequence[int]) -> dict[int, tuple[np.ndarray, dict[str, Any]]]:
        """The engine contract's ``fetch``: the stored lists of ``keys`` (seqs) in the vector
        file's own dtype (views of one gathered block); no metadata (filled in for the final
        hits only, :meth:`_with_metadata`)."""
        mat, off = self._gather(keys, self._vf.dtype)
        return {s: (mat[off[i]:off[i + 1]], {}) for i, s in enumerate(keys)}

    def _exact(self, queries: list[np.ndarray], seqs: list[int], k: int) -> list[list[Hit]]:
        """Exact MaxSim of ``queries`` over the stored vectors of ``seqs`` (ties: lower seq)."""
        scores = self._scores(queries, seqs)
        return [[self._hit(int(seqs[i]), float(row[i])) for i in top_k(row, k)] for row in scores]

    def _before_search(self, rerank: bool) -> None:
        """Called before every search: engines that defer writes flush here."""

    def _fill_short(self, q: np.ndarray, cands: list[tuple[int, float]], seqs: list[int],
                    k: int) -> list[Hit]:
        """The engine (rerank off) found fewer than ``k`` of the allowed ``seqs``: by default
        every allowed document is scored exactly."""
        return self._exact([q], seqs, k)[0]

    def _search_batch(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
                      candidates_limit: int | None = None, explain: bool = False,
                      **options: Any) -> list[list[Hit]]:
        rerank, pool = self._pool(k, **options)
        check_rerank_options(candidates_limit=candidates_limit)
        limit = self.candidates_limit if candidates_limit is None else candidates_limit
        limit = max(pool, limit or 0) if rerank else pool
        with self._lock:
            self._check_open()
            self._fresh()
            self._before_search(rerank)
            return self._reading(lambda: self._with_metadata(
                self._search_view(queries, k, conditions, limit, rerank, pool, explain)))

    def _search_view(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...], limit: int,
                     rerank: bool, pool: int, explain: bool) -> list[list[Hit]]:
        """:meth:`_search_batch` on the view as it is (under ``self._lock``); hits without metadata."""
        if not self._id_of:
            return [[] for _ in queries]
        # live: the allowed documents (None: all of them, not listed unless needed)
        live = self._matching(conditions) if conditions else None
        if live is not None and not live:
            return [[] for _ in queries]
        n_indexed, subset, pending = 0, None, []
        if self._index is not None:
            if self._pending:
                pending = list(self._pending) if live is None else [s for s in live if s in self._pending]
            n_indexed = (len(self._id_of) if live is None else len(live)) - len(pending)
            if live is not None and n_indexed < len(self._id_of) - len(self._pending):
                subset = [s for s in live if s not in self._pending] if pending else live
        everyone = self._everyone if live is None else (lambda: live)
        if not n_indexed or (rerank and n_indexed <= pool):  # native exact path: a scan
            return self._explained(queries, self._exact(queries, everyone(), k), explain)
        # the engine may still return removed documents: ask for that many more
        top = limit + (len(self._dead) if subset is None else 0)
        found = self._engine_candidates(queries, top, subset)
        out = []
        for q, cands in zip(queries, found, strict=True):
            cands = [(s, sc) for s, sc in cands if s in self._id_of][:limit]
            if len(cands) < min(k, n_indexed):  # the engine came up short
                hits = self._exact([q], everyone(), k)[0] if rerank else self._fill_short(
                    q, cands, everyone(), k)
                out.append(self._explained([q], [hits], explain)[0])
            elif rerank:
                with self._scoring():
                    hits = rerank_candidates(q, [(s, None) for s, _ in cands], self._fetch, k, pool=pool,
                                             head=pending,
                                             explain=self.format if explain else None)
                out.append([Hit(self._id_of[h.id], h.score, {}, h.decomposition) for h in hits])
            else:
                out.append(self._explained([q], [[self._hit(s, sc) for s, sc in cands[:k]]], explain)[0])
        return out

    def _explained(self, queries: list[np.ndarray], hits: list[list[Hit]], explain: bool) -> list[list[Hit]]:
        """Hits of a path that did not fetch their lists (an exact scan, the engine's own
        scores), explained from the vector file when ``explain``."""
        if explain:
            for q, row in zip(queries, hits, strict=True):
                for h in row:
                    h.decomposition = decompose(q, self._vf.read(self._start[self._seq_of[h.id]],
                                                                 self._rows[self._seq_of[h.id]]), self.format)
        return hits

    # -- housekeeping ----------------------------------------------------------------------
    def disk_usage(self) -> dict[str, int]:
        """Bytes on disk: ``<backend>_index`` (the engine folder), ``vectors`` (the vector file
        of original vectors, dead rows included) and ``stored`` (that file plus SQLite:
        everything but the index)."""
        with self._lock:
            self._check_open()
            assert self._vf is not None
            if self.path is None:
                return {f"{self.backend}_index": 0, "vectors": 0, "stored": 0}
            if not self.read_only and self._writable:  # count each stored byte once
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            idx = sum(p.stat().st_size for p in (self.path / self._index_dir).rglob("*") if p.is_file()) \
                if self._index_dir else 0
            db = sum(p.stat().st_size for p in self.path.glob(DB_NAME + "*") if p.is_file())
            vec = sum((self.path / name).stat().st_size for name in self._vf.file_names())
            return {f"{self.backend}_index": idx, "vectors": vec, "stored": db + vec}

    def _release(self) -> None:
        self._release_index()
        if self._vf is not None:
            self._vf.close()
            self._vf = None
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            _OPEN_STORES.discard(self)
            if self._pid != os.getpid():  # never used in this forked child: the parent's, left alone
                self._leave_the_parents_handles()
            self._release()

    # -- the engine interface (see the module docstring) -----------------------------------
    def _engine_build(self, folder: Path, seqs: list[int]) -> tuple[Any, list[int]]:
        raise NotImplementedError

    def _engine_open(self, folder: Path) -> Any:
        raise NotImplementedError

    def _engine_count(self, folder: Path) -> int:
        raise NotImplementedError

    def _engine_update(self, dead: list[int], seqs: list[int]) -> list[int]:
        raise NotImplementedError

    def _engine_candidates(self, queries: list[np.ndarray], top: int,
                           subset: list[int] | None) -> list[list[tuple[int, float]]]:
        raise NotImplementedError

    def _engine_close(self) -> None:
        raise NotImplementedError


class ScanEngine(IndexedStore):
    """The smallest engine: its index is one ``.npy`` of each document's mean vector (and seq);
    candidates are the documents whose mean is nearest the query's. A demonstration of the
    engine interface (and a test of the store), not a search method."""

    backend = "scan"
    label = "scan"
    engine_name = "scan"
    index_prefix = "scan-"

    def __init__(self, path: str | os.PathLike | None = None, **options: Any) -> None:
        super().__init__(path, None, {"vector_dtype": None}, **options)

    def _engine_build(self, folder: Path, seqs: list[int]) -> tuple[Any, list[int]]:
        folder.mkdir()
        mat, off = self._gather(seqs)
        means = np.add.reduceat(mat, off[:-1], axis=0) / np.diff(off)[:, None] if seqs else mat
        np.save(folder / "index.npy", np.hstack([np.asarray(seqs, np.float32)[:, None], means]))
        return self._engine_open(folder), seqs

    def _engine_open(self, folder: Path) -> Any:
        return {"folder": folder, "table": np.load(folder / "index.npy")}

    def _engine_count(self, folder: Path) -> int:
        return len(np.load(folder / "index.npy", mmap_mode="r"))

    def _engine_update(self, dead: list[int], seqs: list[int]) -> list[int]:
        table = self._index["table"]
        keep = table[~np.isin(table[:, 0], dead)]
        mat, off = self._gather(seqs)
        means = np.add.reduceat(mat, off[:-1], axis=0) / np.diff(off)[:, None] if seqs else mat[:0]
        self._index["table"] = np.vstack([keep, np.hstack([np.asarray(seqs, np.float32)[:, None], means])])
        np.save(self._index["folder"] / "index.npy", self._index["table"])
        return seqs

    def _engine_candidates(self, queries: list[np.ndarray], top: int,
                           subset: list[int] | None) -> list[list[tuple[int, float]]]:
        table = self._index["table"]
        if subset is not None:
            table = table[np.isin(table[:, 0], subset)]
        scores = np.stack([q.mean(axis=0) for q in queries]) @ table[:, 1:].T
        return [[(int(table[i, 0]), float(row[i])) for i in np.argsort(-row, kind="stable")[:top]]
                for row in scores]

    def _engine_close(self) -> None:
        self._index = None


__all__ = ["CPU_MAX_PARTITIONS", "DB_NAME", "DEFAULT_MIN_INDEX_VECTORS", "LOCK_NAME", "MMAP_THRESHOLD",
           "RENAMED_KEYS", "IndexedStore", "ScanEngine", "centroid_heuristic", "default_memory_budget",
           "default_partitions", "fix_mmap_threshold"]
