"""Qdrant Edge: the real Qdrant engine (Rust segments and shard) in-process, no server.

Same layout and search modes as :class:`~uibk_embedding.adapters.qdrant.QdrantStore`: one
point per document with the tagged list as a DOT / MaxSim multivector (``"tagged"``) and the
381-d :func:`~uibk_embedding.tagged.dense_vector` (``"dense"``) for prefetch. Searches
are exact by default (``SearchParams(exact=True)``, and no HNSW on the multivector): HNSW on
multivectors builds slowly and reached low recall on hard data (see docs/engines.md#pitfalls), so it
is opt-in (``multivector_hnsw=True`` plus ``mode="hnsw"`` after :meth:`QdrantEdgeStore.optimize`).

Engine difference handled here: qdrant-edge-py 0.9 turns a boolean ``MatchValue(True)`` into
the integer 1, so a bool filter would match ``1`` and never ``true``. Boolean metadata fields
are therefore also written to a reserved payload list (``_uibk_bools``, entries
``'["field", true]'``) and boolean filters match there: ``True`` never matches ``1``.

Example
-------
>>> import numpy as np, tempfile
>>> from uibk_embedding.testing import make_list
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> d = tempfile.mkdtemp()
>>> with QdrantEdgeStore(path=d + "/shard") as s:
...     s.upsert(["a", "b"], [make_list(fmt, rng, 5), make_list(fmt, rng, 7)],
...              [{"ok": True}, {"ok": 1}])
...     [h.id for h in s.search(make_list(fmt, rng, 4), k=5, filter={"ok": True})]
['a']
>>> QdrantEdgeStore(path=d + "/shard").count()      # persisted
2
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding._durable import TMP_PREFIX, atomic_write_text, fsync_dir, fsync_tree
from uibk_embedding._optional import require
from uibk_embedding._sqlite_state import lock_directory
from uibk_embedding.adapters.base import Hit, check_positive, read_record, record_problems
from uibk_embedding.adapters.common import batched
from uibk_embedding.adapters.filters import Node
from uibk_embedding.adapters.qdrant import (
    DENSE_DIM,
    CollectionMismatch,
    _QdrantBase,
    json_key,
    point_id,
    refuse_integer_index,
    unwritten_dense,
)
from uibk_embedding.adapters.qdrant_filters import BOOLS_KEY, bool_token
from uibk_embedding.adapters.qdrant_profiles import SETTINGS, edge_vector_params, search_params
from uibk_embedding.adapters.redo import RedoLog
from uibk_embedding.errors import EngineError, StoreInUse
from uibk_embedding.tagged import DIM, TaggedFormat

CONFIG_FILE = "uibk_embedding.json"
REDO_DIR = "uibk-redo"
EDGE_CONFIG = "edge_config.json"
_CREATION_DIRS = ("wal", "segments")
"""What ``EdgeShard.create`` makes before it writes :data:`EDGE_CONFIG`."""
_CREATION_TMP = (".atomicwrite", TMP_PREFIX)


class QdrantEdgeStore(_QdrantBase):
    """Tagged multivectors in a Qdrant Edge shard at ``path`` (a temporary directory, removed
    on :meth:`close`, when ``path`` is None).

    Parameters
    ----------
    path: the shard directory (created when missing, reopened and validated when it holds one).
    format: the tagged format (saved next to the shard in ``uibk_embedding.json``).
    vector_name, dense_name: names of the multivector and of the dense vector (None: none).
    multivector_hnsw: give the multivector an HNSW index (built by :meth:`optimize`) for
        ``mode="hnsw"``; default False (``m=0``, exact search only).
    mode, prefetch: default search mode ("exact", "prefetch", "hnsw") and candidate count.
    batch_size, show_progress: upsert batching and progress bar.
    payload_indexes: ``{field: "keyword" | "float" | "bool"}`` to index.
    max_search_threads: the shard's search thread pool size (None: from the CPU count), set
        when the shard is created (an existing shard refuses it: Qdrant Edge takes it on load
        only together with the whole vector configuration).
    profile: Qdrant's own compression by the exact store's names (what each sets:
        :mod:`~uibk_embedding.adapters.qdrant_profiles`), recorded in ``uibk_embedding.json`` and
        checked on open (another profile: ``CollectionMismatch`` naming both; None: the recorded
        one, :attr:`profile`). The quantized codes are built by :meth:`optimize` and when a
        store that wrote closes; until then a search scans the new points' originals exactly.

    Example
    -------
    >>> import numpy as np
    >>> from uibk_embedding.testing import make_list
    >>> s = QdrantEdgeStore()          # temporary shard
    >>> q = make_list(s.format, np.random.default_rng(3), 6)
    >>> s.upsert(["q"], [q], [{"n": 2}])
    >>> [(h.id, h.metadata) for h in s.search(q, k=1, filter={"n": 2.0})]
    [('q', {'n': 2})]
    >>> s.close()
    """

    backend = "qdrant-edge"
    dialect = "edge"
    exact = True

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        format: TaggedFormat | None = None,
        vector_name: str = "tagged",
        dense_name: str | None = "dense",
        multivector_hnsw: bool = False,
        mode: str = "exact",
        prefetch: int = 200,
        batch_size: int = 256,
        show_progress: bool | None = None,
        payload_indexes: Mapping[str, str] | None = None,
        max_search_threads: int | None = None,
        profile: str | None = None,
    ) -> None:
        self._e = require("qdrant_edge", "qdrant", "the Qdrant Edge adapter")
        super().__init__(format)
        if vector_name == dense_name:
            raise ValueError("vector_name and dense_name must differ")
        check_positive("batch_size", batch_size)
        for field, schema in (payload_indexes or {}).items():
            refuse_integer_index(field, schema)  # before the shard is made
        self.vector_name = vector_name
        self.dense_name = dense_name
        self.multivector_hnsw = multivector_hnsw
        self.batch_size = batch_size
        self.show_progress = show_progress
        self._init_modes(mode, prefetch, dense_name)
        self._init_profile(profile, multivector_hnsw)
        self._tmp = path is None
        self.path = Path(tempfile.mkdtemp(prefix="uibk-edge-")) / "shard" if path is None else Path(path)
        self.shard: Any = None
        self._lock_fd: int | None = None
        try:
            self._open(format, max_search_threads)
        except BaseException:
            self.close()
            raise
        try:
            for field, schema in (payload_indexes or {}).items():
                self.create_payload_index(field, schema)
        except BaseException:
            self.close()
            raise

    # -- shard ----------------------------------------------------------------------------
    def _config(self, max_search_threads: int | None) -> Any:
        e = self._e
        hnsw = None if self.multivector_hnsw else e.HnswIndexConfig(m=0, ef_construct=100,
                                                                     full_scan_threshold=10000)
        vectors = {self.vector_name: e.EdgeVectorParams(
            DIM, e.Distance.Dot, multivector_config=e.MultiVectorConfig(e.MultiVectorComparator.MaxSim),
            hnsw_config=hnsw, **edge_vector_params(self.profile, e))}
        if self.dense_name is not None:
            vectors[self.dense_name] = e.EdgeVectorParams(DENSE_DIM, e.Distance.Dot)
        # a segment gets its quantized codes when optimize() indexes it, which Edge does only past
        # the indexing threshold (default about 10 MB): a coded profile indexes every segment
        coded = SETTINGS[self.profile].quantization is not None
        opt = e.EdgeOptimizersConfig(indexing_threshold=1) if coded else None
        return e.EdgeConfig(vectors=vectors, max_search_threads=max_search_threads, optimizers=opt)

    def _open(self, format: TaggedFormat | None, max_search_threads: int | None) -> None:
        e = self._e
        cfg_path = self.path / EDGE_CONFIG
        ours = self.path / CONFIG_FILE
        # our lock before the engine's: a second EdgeShard.load on an open shard damages the
        # first one's payload files before it fails on the WAL lock
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_directory(self.path, f"the Qdrant Edge shard at {self.path}")
        if cfg_path.exists():
            # our record is absent only in a shard whose creation died before it was written
            recorded = ours.exists()
            self.format = self._validate(read_record(cfg_path.read_bytes()),
                                         read_record(ours.read_bytes()) if recorded else None,
                                         format) or self.format
            if max_search_threads is not None:  # qdrant-edge takes it on load only with the vectors
                raise ValueError(f"max_search_threads is set when a shard is created; {self.path} "
                                 "exists: open it without max_search_threads")
            self.shard = self._engine_open(lambda: e.EdgeShard.load(str(self.path), None))
            for leftover in self.path.glob(TMP_PREFIX + "*"):  # a record write that was killed
                leftover.unlink()
            if not recorded:  # finish that creation: later opens check their format against it
                self._write_record()
            self._redo = RedoLog(self.path / REDO_DIR)
            self._replay(self._redo)
            return
        self._clear_unfinished_creation()
        if any(self.path.iterdir()):
            raise CollectionMismatch(f"{self.path} exists and is not an empty directory or an Edge "
                                     "shard; refusing to write into it")
        config = self._config(max_search_threads)
        self.shard = self._engine_open(lambda: e.EdgeShard.create(str(self.path), config))
        self._write_record()
        self._redo = RedoLog(self.path / REDO_DIR)

    def _clear_unfinished_creation(self) -> None:
        """Remove what a creation killed before the engine wrote its configuration left behind.

        ``EdgeShard.create`` makes ``wal/`` (with its first segment files) and ``segments/``
        before it writes ``edge_config.json``; a process killed in between leaves a folder that no
        engine can load and that holds no data (a write needs the store open, which needs our
        record, which comes after the configuration). Only those names and the temporary files of
        the engine (``.atomicwrite*``) and ours (``.tmp-uibk-*``) are removed, and only when every
        entry of the folder is one of them: a folder with anything else is left as it is.
        """
        entries = list(self.path.iterdir())
        if not entries or not all(p.name in _CREATION_DIRS or p.name.startswith(_CREATION_TMP)
                                  for p in entries):
            return
        for p in entries:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        fsync_dir(self.path)

    def _write_record(self) -> None:
        """Our record (``uibk_embedding.json``: backend, version, format), written durably once
        the engine's own files are on disk, so that the record names a shard that exists."""
        self.shard.flush()
        fsync_tree(self.path)
        atomic_write_text(self.path / CONFIG_FILE, json.dumps({"backend": "qdrant-edge", "version": 1,
                                                               "format": self.format.to_stored(),
                                                               "profile": self.profile}))

    def _engine_open(self, fn: Any) -> Any:
        """The engine's open or create: its folder lock refusal as :class:`StoreInUse`, any other
        failure (a read-only folder: Edge rewrites its bookkeeping files on every load) as
        :class:`EngineError` naming the shard."""
        try:
            return fn()
        except Exception as err:
            if "WouldBlock" in str(err):
                raise StoreInUse(f"the Qdrant Edge shard at {self.path} is open in another QdrantEdgeStore "
                                 "(this or another process); close it first") from None
            raise EngineError(f"Qdrant Edge could not open the shard at {self.path}: {err}") from err

    def _validate(self, cfg: Any, record: Any, format: TaggedFormat | None) -> TaggedFormat | None:
        """Refuse a shard whose layout (the engine's ``cfg``) or record (ours) does not fit, saying
        exactly what differs; the format the record holds (None: no record)."""
        saved, problems = record_problems(record, format, key="backend", value="qdrant-edge",
                                          schema_key="version", schema=1, optional=True)
        if not isinstance(cfg, Mapping):
            problems.append(f"its {EDGE_CONFIG} is not a readable engine configuration")
            cfg = {}
        vectors = cfg.get("vectors") or {}
        mv = vectors.get(self.vector_name)
        if mv is None:
            problems.append(f"it has no vector named {self.vector_name!r} (it has {sorted(vectors)})")
        else:
            if mv.get("size") != DIM:
                problems.append(f"{self.vector_name!r} has size {mv.get('size')}, needs {DIM}")
            if mv.get("distance") != "Dot":
                problems.append(f"{self.vector_name!r} uses distance {mv.get('distance')}, needs Dot "
                                "(Cosine renormalises each vector and breaks the query-time dense weight)")
            if (mv.get("multivector_config") or {}).get("comparator") != "max_sim":
                problems.append(f"{self.vector_name!r} is not a multivector with comparator max_sim")
            problems += self._check_profile(record, self.vector_name, mv.get("datatype"),
                                            mv.get("quantization_config"), f"Edge shard at {self.path}")
        if self.dense_name is not None:
            dv = vectors.get(self.dense_name)
            if dv is None:
                problems.append(f"it has no dense vector named {self.dense_name!r} "
                                "(pass dense_name=None to use exact search only)")
            else:
                if dv.get("size") != DENSE_DIM:
                    problems.append(f"{self.dense_name!r} has size {dv.get('size')}, needs {DENSE_DIM}")
                if dv.get("distance") not in ("Dot", "Cosine"):
                    problems.append(f"{self.dense_name!r} uses distance {dv.get('distance')}, needs Dot "
                                    "or Cosine")
                if dv.get("multivector_config"):
                    problems.append(f"{self.dense_name!r} is a multivector, needs a single vector")
        else:
            problems += unwritten_dense({n: (v.get("size"), bool(v.get("multivector_config")))
                                          for n, v in vectors.items() if isinstance(v, Mapping)})
        if problems:
            raise CollectionMismatch(f"Edge shard at {self.path} does not fit uibk-embedding: "
                                     + "; ".join(problems) + ". The shard was not changed.")
        return saved

    def create_payload_index(self, field: str, schema: str = "keyword") -> None:
        """Index a metadata field ("keyword", "float" or "bool"; boolean filters use the reserved
        ``_uibk_bools`` list, indexed as a keyword field when "bool" is asked). An integer index is
        refused (:func:`~uibk_embedding.adapters.qdrant.refuse_integer_index`)."""
        refuse_integer_index(field, schema)
        e = self._e
        kinds = {"keyword": e.PayloadSchemaType.Keyword, "float": e.PayloadSchemaType.Float,
                 "bool": e.PayloadSchemaType.Keyword}
        if schema not in kinds:
            raise ValueError(f"unknown payload schema {schema!r} for field {field!r}; "
                             f"one of {sorted(kinds)}")
        key = BOOLS_KEY if schema == "bool" else json_key(field)
        self.shard.update(e.UpdateOperation.create_field_index(key, kinds[schema]))

    def _bytes_on_disk(self) -> int:
        """Bytes the shard's files hold on disk (allocated blocks: Edge preallocates its WAL and
        vector chunks as sparse files, whose apparent size the disk does not hold)."""
        return sum(p.stat().st_blocks * 512 for p in self.path.rglob("*") if p.is_file())

    def _resident_bytes(self) -> int:
        """The multivector's files its profile keeps in RAM (allocated): the quantized codes of
        a quantized profile (``always_ram``; the originals are on disk), else its vectors; the
        payload, ids and WAL are not counted."""
        coded = SETTINGS[self.profile].quantization is not None
        files = self.path.glob(f"segments/*/vector_storage-{self.vector_name}/**/*")
        return sum(p.stat().st_blocks * 512 for p in files
                   if p.is_file() and p.name.startswith("quantized") == coded)

    def optimize(self) -> bool:
        """Merge segments and build the HNSW indexes (slow on multivectors) and a coded profile's
        codes: True if it did work."""
        self._wrote = False
        return bool(self.shard.optimize())

    def stats(self) -> dict[str, Any]:
        """:meth:`MultiVectorStore.stats` (``bytes_on_disk``: allocated; ``resident_bytes``: the
        multivector's files its profile keeps in RAM) of the settled shard: a coded profile's
        pending codes are built first (:meth:`optimize`)."""
        if getattr(self, "_wrote", False) and SETTINGS[self.profile].quantization is not None:
            self.optimize()
        return super().stats()

    # -- the interface --------------------------------------------------------------------
    # Edge applies each engine call on its own and one upsert is several calls of ``batch_size``
    # points: a redo log (as for local-mode Qdrant) makes the whole call all-or-nothing across a
    # crash; the entry is dropped only after the shard is flushed, so a power cut cannot lose it
    def _flush_engine(self) -> None:
        self.shard.flush()

    def _write_points(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        self._wrote = True
        self._in_batches(ids, vectors, metadata, self.path.name,
                         lambda points: self.shard.update(self._e.UpdateOperation.upsert_points(points)))

    def _payload(self, doc_id: str, metadata: dict) -> dict:
        payload = super()._payload(doc_id, metadata)
        bools = [bool_token(f, val) for f, val in metadata.items() if isinstance(val, bool)]
        if bools:  # Edge matches booleans through these tokens (see bool_token)
            payload[BOOLS_KEY] = bools
        return payload

    def _point(self, doc_id: str, vectors: dict[str, list], payload: dict) -> Any:
        return self._e.Point(point_id(doc_id), vectors, payload)

    def _delete_points(self, ids: list[str]) -> None:
        for chunk in batched(ids, 1024):
            self.shard.update(self._e.UpdateOperation.delete_points([point_id(x) for x in chunk]))

    def count(self) -> int:
        return int(self.shard.count(self._e.CountRequest(exact=True)))

    def _scroll(self, flt: Any, offset: Any, limit: int) -> tuple[list[Any], Any]:
        return self.shard.scroll(self._e.ScrollRequest(offset=offset, limit=limit, filter=flt,
                                                       with_payload=True, with_vector=False))

    def _delete_where(self, conditions: tuple[Node, ...]) -> int:
        self._replay_failed()
        e = self._e
        flt = self._filter(conditions) or e.Filter(must=[])
        n = int(self.shard.count(e.CountRequest(exact=True, filter=flt)))
        if n:
            self.shard.update(e.UpdateOperation.delete_points_by_filter(flt))
            self._flush_engine()  # durable when it returns, as every logged write
        return n

    def _retrieve(self, point_ids: list[str]) -> list[Any]:
        # with_payload must be given although the stub marks it optional (docs/engines.md#pitfalls)
        return self.shard.retrieve(point_ids, with_payload=True, with_vector=[self.vector_name])

    def _request(self, q: np.ndarray, k: int, flt: Any, mode: str, n: int, explain: bool = False) -> Any:
        e = self._e
        query = e.Query.Nearest(q.tolist(), using=self.vector_name)
        vec = [self.vector_name] if explain else None
        if mode == "prefetch":
            pre = e.Prefetch(limit=max(n, k), query=e.Query.Nearest(self._query_dense(q),
                                                                   using=self.dense_name), filter=flt)
            return e.QueryRequest(limit=k, query=query, prefetches=[pre], filter=flt, with_payload=True,
                                  with_vector=vec)
        params = search_params(self.profile, k, e.SearchParams, e.QuantizationSearchParams)
        params = params or e.SearchParams(exact=mode == "exact")  # a profile's codes: scanned, not exact
        return e.QueryRequest(limit=k, query=query, filter=flt, params=params, with_payload=True,
                              with_vector=vec)

    def _run(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
             mode: str, n: int, explain: bool = False) -> list[list[Hit]]:
        flt = self._filter(conditions)
        reqs = [self._request(q, k, flt, mode, n, explain) for q in queries]
        if len(reqs) == 1:
            results = [self.shard.query(reqs[0])]
        else:
            results = self.shard.query_batch(self._e.QueryBatchRequest(reqs))
        return [[self._hit(p, q if explain else None) for p in res]
                for q, res in zip(queries, results, strict=True)]

    def close(self) -> None:
        """Flush and close the shard (a temporary shard is deleted)."""
        shard, self.shard = getattr(self, "shard", None), None
        if shard is not None:
            if getattr(self, "_wrote", False) and SETTINGS[self.profile].quantization is not None:
                shard.optimize()  # the codes of what was written (else scanned exactly until optimized)
            shard.flush()
            shard.close()
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)
        if getattr(self, "_tmp", False):
            shutil.rmtree(self.path.parent, ignore_errors=True)
