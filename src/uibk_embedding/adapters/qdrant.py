"""Qdrant: tagged lists as native multivectors, on a cluster, a server or in local mode.

One Qdrant point per document. Its named multivector (default ``"tagged"``) holds the whole
tagged list with **DOT** distance and the **MAX_SIM** comparator, so Qdrant's multivector
score is exactly the MaxSim of :mod:`uibk_embedding.maxsim` (COSINE is refused: it renormalises
every vector and so would undo the query-time dense weight). HNSW is disabled on it by default
(``m=0``): it serves exact MaxSim and reranking, not graph search. A second named vector
(default ``"dense"``) holds :func:`~uibk_embedding.tagged.dense_vector` of the list
(381-d, unit, HNSW) for candidate prefetch.

Two search modes, chosen per store or per query:

* ``"exact"``: MaxSim over the whole collection (or the filtered subset): identical to
  the exact store; cost grows with the collection.
* ``"prefetch"``: the dense vector fetches ``prefetch`` candidates (HNSW), and MaxSim reranks
  them in the same request: approximate (recall depends on ``prefetch``), much cheaper on big
  collections. ``benchmarks/qdrant_prefetch.py`` measures the trade-off.

String ids become deterministic UUIDv5 point ids (:func:`point_id`); the original id is kept
in the payload under ``_uibk_id`` next to the metadata. Existing collections are validated and
never modified or dropped (see :class:`CollectionMismatch`).

Example
-------
>>> import numpy as np
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> mk = lambda n: fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))
>>> store = QdrantStore(location=":memory:")     # or url=..., api_key=... for a cluster
>>> store.upsert(["a", "b"], [mk(5), mk(7)], [{"lang": "en"}, {"lang": "de"}])
>>> [h.id for h in store.search(mk(4), k=5, filter={"lang": "de"})]
['b']
>>> len(store.search(mk(4), k=5, mode="prefetch", prefetch=50))
2
>>> store.close()
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import shutil
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from uibk_embedding._durable import fsync_dir
from uibk_embedding._optional import require
from uibk_embedding._sqlite_state import refuse_foreign_entries
from uibk_embedding.adapters.base import (
    RESERVED_PREFIX,
    BatchSearch,
    Hit,
    MultiVectorStore,
    Record,
    check_choice,
    check_positive,
    finite_score,
    record_problems,
)
from uibk_embedding.adapters.common import batched, serialized
from uibk_embedding.adapters.engine_profiles import check_profile, profile_conflict
from uibk_embedding.adapters.filters import OPERATORS, Node
from uibk_embedding.adapters.qdrant_filters import (
    LISTS_KEY,
    json_key,
    list_fields,
    native_conditions,
    to_qdrant_filter,
)
from uibk_embedding.adapters.qdrant_profiles import (
    SETTINGS,
    SUPPORTED,
    client_vector_params,
    config_problems,
    quantization_kind,
    search_params,
)
from uibk_embedding.adapters.redo import RedoLog
from uibk_embedding.errors import BackendUnavailable, CollectionMismatch, StoreInUse, StoreNotFound, UIBKError
from uibk_embedding.tagged import DIM, N_SLOTS, TaggedFormat, decompose, dense_vector

T = TypeVar("T")

#: Namespace of the UUIDv5 point ids (fixed forever: changing it would orphan stored points).
POINT_ID_NAMESPACE = uuid.UUID("5f0c8d4e-2b1a-5c7e-9a43-7d1e0b6f3a21")
ID_KEY = f"{RESERVED_PREFIX}_id"
META_KEY = "uibk_embedding"  # key of our entry in the collection metadata
DENSE_DIM = N_SLOTS * (DIM - 1)
MODES = ("exact", "prefetch", "hnsw")
#: Default cap on the tagged-list rows of one upsert request. Qdrant refuses a JSON body over
#: 32 MiB (``service.max_request_size_mb``); one row of 128 floats measured 2.68 kB of JSON
#: (300-token documents, dense vector included), and is at most 128 x 24 B = 3.1 kB (a float32
#: printed as a Python float takes at most 23 characters, plus the comma). 8192 rows: about
#: 22 MB measured, at most 25 MB, plus 9 kB of dense vector per document, under 32 MiB.
MAX_ROWS_PER_REQUEST = 8192


class QdrantUnavailable(BackendUnavailable):
    """The Qdrant server could not be reached (after the configured retries)."""


class QdrantRefused(UIBKError, PermissionError):
    """The Qdrant server refused the request (HTTP 401 or 403): a missing or wrong API key."""


def point_id(doc_id: str) -> str:
    """The Qdrant point id of a document id: a UUIDv5, the same on every machine and run.

    >>> point_id("doc-1") == point_id("doc-1"), point_id("doc-1") == point_id("doc-2")
    (True, False)
    """
    return str(uuid.uuid5(POINT_ID_NAMESPACE, doc_id))


def split_payload(payload: Mapping[str, Any] | None, fallback_id: Any) -> tuple[str, dict]:
    """(original id, user metadata) of a stored payload (reserved ``_uibk`` keys removed)."""
    payload = payload or {}
    doc_id = payload.get(ID_KEY)
    md = {k: v for k, v in payload.items() if not k.startswith(RESERVED_PREFIX)}
    return (str(doc_id) if doc_id is not None else str(fallback_id)), md


def progress(total: int, desc: str, show: bool | None, batches: int) -> Any:
    """A tqdm bar (``show=None``: only for calls of several batches, on a terminal)."""
    from tqdm.auto import tqdm

    disable: bool | None = (not show) if show is not None else (True if batches <= 1 else None)
    return tqdm(total=total, desc=desc, unit="doc", disable=disable)


class _QdrantBase(BatchSearch, MultiVectorStore):
    """What the client store and the Edge store share: search modes and id/payload mapping."""

    backend = "qdrant-base"
    exact = True
    filter_operators = frozenset(OPERATORS)
    search_options = ("mode", "prefetch")  # per query: "exact"/"prefetch"/"hnsw", dense candidates

    def _init_modes(self, mode: str, prefetch: int, dense_name: str | None) -> None:
        self._check_mode(mode, dense_name)
        self.mode = mode
        self.prefetch = self._check_prefetch(prefetch)
        self.exact = mode == "exact"  # type: ignore[misc]  # per instance: follows the default mode

    def _init_profile(self, profile: str | None, multivector_hnsw: bool) -> None:
        """``profile=`` (qdrant_profiles): checked by name; the one a new collection is made with
        (``"exact"`` when None) until an existing collection's record says otherwise."""
        self._asked_profile = check_profile(profile, SUPPORTED, self.backend)
        self.profile = self._asked_profile or "exact"
        self._set_exact()
        if multivector_hnsw and SETTINGS[self.profile].quantization is not None:
            raise ValueError(f"profile={self.profile!r} scans the multivector's quantized codes with "
                             "Qdrant's non-exact search, which would walk its HNSW graph instead: "
                             "pass multivector_hnsw=False")

    def _check_profile(self, record: Any, name: str, datatype: str | None, quant: Any,
                       where: str) -> list[str]:
        """The recorded profile (``"exact"`` in a record from before profiles; with no record,
        the one asked for) against the one asked for (CollectionMismatch naming both), then the multivector's
        settings against it; sets :attr:`profile` (what ``profile=None`` opens)."""
        # no record (made by hand): the profile asked for, if its settings are there (below)
        saved = (record.get("profile", "exact") if isinstance(record, Mapping)
                 else self._asked_profile or "exact")
        if saved not in SETTINGS:
            return [f"its record names profile {saved!r}, which this version does not know"]
        conflict = profile_conflict(saved, self._asked_profile, where)
        if conflict is not None:
            raise CollectionMismatch(conflict + "; nothing was changed")
        self.profile = saved
        self._set_exact()
        return config_problems(saved, name, datatype, quantization_kind(quant))

    def _set_exact(self) -> None:
        """:attr:`exact` of the default mode and the profile (rounded or coded vectors are not
        exact, except in qdrant-client's local mode, which stores and scans float32)."""
        self.exact = self.mode == "exact" and (  # type: ignore[misc]
            self.profile == "exact" or getattr(self, "local", False))

    def stats(self) -> dict[str, Any]:
        """:meth:`MultiVectorStore.stats` with the store's ``profile``."""
        return {**super().stats(), "profile": self.profile}

    @staticmethod
    def _check_mode(mode: str, dense_name: str | None) -> None:
        check_choice("mode", mode, MODES)
        if mode == "prefetch" and dense_name is None:
            raise ValueError("mode 'prefetch' needs the dense vector (dense_name is None)")

    @staticmethod
    def _check_prefetch(n: Any) -> int:
        n = int(n) if isinstance(n, np.integer) else n
        check_positive("prefetch", n)
        return n

    def _resolve(self, mode: str | None, prefetch: int | None) -> tuple[str, int]:
        m = self.mode if mode is None else mode
        self._check_mode(m, self.dense_name)
        n = self.prefetch if prefetch is None else self._check_prefetch(prefetch)
        return m, n

    def _search_batch(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
                      mode: str | None = None, prefetch: int | None = None,
                      explain: bool = False) -> list[list[Hit]]:
        return self._run(queries, k, conditions, *self._resolve(mode, prefetch), explain=explain)

    @staticmethod
    def _query_dense(q: np.ndarray) -> list[float]:
        if not np.any(q[:, 0] < 0):
            raise ValueError("mode 'prefetch' needs a query with slot rows (the dense part); this "
                             "query has token rows only: use mode='exact'")
        return dense_vector(q).tolist()

    def _hit(self, point: Any, query: np.ndarray | None = None) -> Hit:
        """A scored point as a Hit; with ``query``, the point's vectors (asked for in the same
        search) give its decomposition, so ``explain`` costs no second request."""
        doc_id, md = split_payload(point.payload, point.id)
        hit = Hit(doc_id, finite_score(point.score), md)
        if query is not None:
            hit.decomposition = decompose(query, self._vector(point), self.format)
        return hit

    def _vector(self, point: Any) -> np.ndarray:
        """The tagged list a point was read with."""
        vec = point.vector[self.vector_name] if isinstance(point.vector, Mapping) else point.vector
        return np.asarray(vec, dtype=np.float32)

    def _run(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
             mode: str, n: int, explain: bool = False) -> list[list[Hit]]:
        raise NotImplementedError

    # -- filters: one translation for both engines (adapters/qdrant_filters), in each one's dialect
    dialect: ClassVar[str] = "client"  # or "edge": see qdrant_filters.DIALECTS

    def _filter(self, conditions: tuple[Node, ...]) -> Any:
        return to_qdrant_filter(self.dialect, conditions)

    def _parse_filter(self, filter: Any) -> tuple[Node, ...]:
        """The filter language (the base class's parsing), or a native Qdrant ``Filter`` of this
        engine (``qdrant_client.models.Filter``; on Edge ``qdrant_edge.Filter``) passed through
        to the engine untranslated (:class:`~uibk_embedding.adapters.qdrant_filters.NativeFilter`).
        Searches, ``scan`` and ``delete(filter=...)`` all take it."""
        native = native_conditions(filter, self.dialect, self.backend)
        if native is not None:
            return native  # type: ignore[return-value]
        return super()._parse_filter(filter)

    # -- writes: one point layout and one batch loop for both engines ----------------------------
    def _point(self, doc_id: str, vectors: dict[str, list], payload: dict) -> Any:
        """The engine's point object."""
        raise NotImplementedError

    def _payload(self, doc_id: str, metadata: dict) -> dict:
        """The stored payload: the user's metadata plus the original id under a reserved key."""
        payload = {**metadata, ID_KEY: doc_id}
        lists = list_fields(metadata)
        if lists:  # Qdrant matches list elements: filters exclude these fields (qdrant_filters)
            payload[LISTS_KEY] = lists
        return payload

    #: cap on the tagged-list rows of one request (None: documents only, as on Edge, in process)
    max_rows_per_request: int | None = None

    def _chunks(self, vectors: list[np.ndarray]) -> list[range]:
        """Index ranges of at most ``batch_size`` documents and ``max_rows_per_request`` rows
        (a document over the row cap goes alone)."""
        cap = self.max_rows_per_request or math.inf
        chunks: list[range] = []
        lo = rows = 0
        for i, v in enumerate(vectors):
            if i > lo and (i - lo >= self.batch_size or rows + len(v) > cap):
                chunks.append(range(lo, i))
                lo, rows = i, 0
            rows += len(v)
        if len(vectors) > lo:
            chunks.append(range(lo, len(vectors)))
        return chunks

    def _in_batches(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict], label: str,
                    send: Callable[[list[Any]], Any]) -> None:
        """Build the points (tagged list + optional dense vector + payload) one batch at a time
        (:meth:`_chunks`) and ``send`` each, with a progress bar for calls of several batches."""
        chunks = self._chunks(vectors)
        with progress(len(ids), f"upserting into {label}", self.show_progress, len(chunks)) as bar:
            for chunk in chunks:
                points = []
                for x, v, md in zip(ids[chunk.start:chunk.stop], vectors[chunk.start:chunk.stop],
                                    metadata[chunk.start:chunk.stop], strict=True):
                    vec = {self.vector_name: v.tolist()}
                    if self.dense_name is not None:
                        vec[self.dense_name] = dense_vector(v).tolist()
                    points.append(self._point(x, vec, self._payload(x, md)))
                send(points)
                bar.update(len(points))

    # -- the interface: each engine supplies its calls (points, scroll, retrieve); the base's
    # upsert and delete run _upsert and _delete under _guard
    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        self._logged(ids, vectors, metadata)

    def _delete(self, ids: list[str]) -> None:
        self._logged(ids)

    def _scan(self, conditions: tuple[Node, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        flt, offset = self._filter(conditions), None
        while True:  # Qdrant's scroll: pages in point-id order, each with the next page's offset
            recs, offset = self._scroll(flt, offset, batch_size)
            if recs:
                yield [split_payload(r.payload, r.id) for r in recs]
            if offset is None:
                return

    @serialized
    def _get(self, ids: list[str]) -> list[Record]:
        found = []
        for chunk in batched(ids, 256):
            for r in self._retrieve([point_id(x) for x in chunk]):
                doc_id, md = split_payload(r.payload, r.id)
                found.append(Record(doc_id, self._vector(r), md))
        return found

    def _scroll(self, flt: Any, offset: Any, limit: int) -> tuple[list[Any], Any]:
        """One page of points (payloads, no vectors) and the next page's offset (None: the end)."""
        raise NotImplementedError

    def _retrieve(self, point_ids: list[str]) -> list[Any]:
        """The points (payload and the tagged list) of these point ids that exist."""
        raise NotImplementedError

    def _write_points(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        raise NotImplementedError

    def _delete_points(self, ids: list[str]) -> None:
        raise NotImplementedError

    def _flush_engine(self) -> None:
        """Make the engine's files durable (Edge); the redo entry is dropped only after it."""

    # -- the redo log of local files (local mode, Edge): one engine call at a time ----------------
    _redo: RedoLog | None = None

    def _logged(self, ids: list[str], vectors: list[np.ndarray] | None = None,
                metadata: list[dict] | None = None) -> None:
        """An upsert (with ``vectors``) or a delete. The engine applies each call of a batch on
        its own; with a redo log the whole write is all-or-nothing across a crash."""
        if self._redo is None:
            self._apply(ids, vectors, metadata)
            return
        self._replay_failed()
        with self._redo.pending("delete" if vectors is None else "upsert", ids, vectors, metadata):
            self._apply(ids, vectors, metadata)

    def _apply(self, ids: list[str], vectors: list[np.ndarray] | None = None,
               metadata: list[dict] | None = None) -> None:
        """The engine calls of one upsert (with ``vectors``) or delete, then the engine's flush:
        a redo entry is removed only after this returns."""
        if vectors is None:
            self._delete_points(ids)
        else:
            self._write_points(ids, vectors, metadata or [])
        self._flush_engine()

    def _replay(self, log: RedoLog) -> int:
        """Replay ``log`` into this collection, each entry flushed by the engine before it is removed."""
        return log.replay(self._apply, self._apply)

    def _replay_failed(self) -> None:
        """Finish an earlier call that failed half-way, before the next write or delete by
        filter (keeps log order; replayed after a delete, it would re-create what was deleted)."""
        if self._redo is not None and self._redo.dirty:
            self._replay(self._redo)


def _is_transient(exc: BaseException) -> bool:
    """Whether an error is worth retrying: connection failures, timeouts, 408/429/502/503/504
    and gRPC UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED. Bad requests are not."""
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    if isinstance(exc, UnexpectedResponse):
        return exc.status_code in (408, 429, 502, 503, 504)
    if isinstance(exc, ResponseHandlingException):
        return _is_transient(exc.source) or _is_transport(exc.source)
    if _is_transport(exc) or isinstance(exc, ConnectionError | TimeoutError):
        return True
    try:
        import grpc
    except ImportError:  # pragma: no cover - grpc comes with qdrant-client
        return False
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.RESOURCE_EXHAUSTED)
    return False


def _already_exists(exc: BaseException) -> bool:
    """Whether ``create_collection`` failed because the collection exists: 409 on a server (REST),
    ALREADY_EXISTS (gRPC), ``ValueError("Collection ... already exists")`` in local mode."""
    from qdrant_client.http.exceptions import UnexpectedResponse

    if isinstance(exc, UnexpectedResponse):
        return exc.status_code == 409
    if isinstance(exc, ValueError):
        return "already exists" in str(exc)
    try:
        import grpc
    except ImportError:  # pragma: no cover - grpc comes with qdrant-client
        return False
    return (isinstance(exc, grpc.RpcError) and hasattr(exc, "code")
            and exc.code() == grpc.StatusCode.ALREADY_EXISTS)


def _is_transport(exc: BaseException) -> bool:
    import httpx

    return isinstance(exc, httpx.TransportError)


def unwritten_dense(vectors: Mapping[str, tuple[int, bool]]) -> list[str]:
    """With ``dense_name=None``: the problem of a collection that has a dense head (a single vector
    of :data:`DENSE_DIM`; ``vectors``: name -> (size, is a multivector)). Documents written without
    it could never be found by prefetch mode, so such a collection is opened with its name."""
    dense = sorted(n for n, (size, multi) in vectors.items() if size == DENSE_DIM and not multi)
    return [f"it has a dense vector {n!r} (size {DENSE_DIM}) that documents written with "
            f"dense_name=None would lack (prefetch mode could never find them): pass dense_name={n!r}"
            for n in dense[:1]]


def refuse_integer_index(field: str, schema: Any) -> None:
    """An integer payload index changes what number filters match, so it is refused: they run
    as float ranges (``1`` matches ``1.0``), and Qdrant answers them from the index, which holds
    only the integral values (measured on Edge: ``1990.5`` no longer matched ``$gt 1990``).

    >>> refuse_integer_index("year", "float")
    >>> refuse_integer_index("year", "integer")
    Traceback (most recent call last):
    ...
    ValueError: payload index 'integer' on 'year': number filters run as float ranges and ...
    """
    kind = str(getattr(schema, "type", getattr(schema, "value", schema))).lower()
    if kind.rsplit(".", 1)[-1] == "integer":
        raise ValueError(f"payload index 'integer' on {field!r}: number filters run as float ranges "
                         "and an integer index leaves non-integral values out of them (1990.5 would "
                         'not match {"$gt": 1990}); index numeric fields as "float"')


def local_collection_exists(path: str | os.PathLike, collection: str) -> bool:
    """Whether the local-mode folder ``path`` holds ``collection``, read from qdrant-client's
    ``meta.json`` alone (nothing is opened, locked or created).

    >>> import tempfile
    >>> local_collection_exists(tempfile.mkdtemp(), "uibk")
    False
    """
    try:
        meta = json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, Mapping) and collection in (meta.get("collections") or {})


def local_meta_problem(path: str | os.PathLike) -> str | None:
    """Why the ``meta.json`` in ``path`` is not the metadata of a qdrant-client local-mode folder
    (None: there is none, or it is one): a JSON object with ``collections`` (a mapping of
    collection configurations) and ``aliases`` (a mapping), as qdrant-client writes it.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> local_meta_problem(d) is None
    True
    >>> _ = (d / "meta.json").write_text('{"name": "my dataset"}')
    >>> local_meta_problem(d)
    'it has no "collections" mapping'
    >>> _ = (d / "meta.json").write_text('{"collections": {}, "aliases": {}}')
    >>> local_meta_problem(d) is None
    True
    """
    meta_path = Path(path) / "meta.json"
    if not meta_path.exists() and not meta_path.is_symlink():
        return None
    if not meta_path.is_file():
        return "it is not a regular file"
    try:
        meta = json.loads(meta_path.read_bytes())
    except ValueError as e:
        return f"it is not JSON ({e})"
    if not isinstance(meta, Mapping):
        return f"it holds a JSON {type(meta).__name__}, not an object"
    collections = meta.get("collections")
    if not isinstance(collections, Mapping):
        return 'it has no "collections" mapping'
    bad = sorted(str(name) for name, cfg in collections.items() if not isinstance(cfg, Mapping))
    if bad:
        return f"the configuration of collection(s) {bad[:5]} is not a JSON object"
    if not isinstance(meta.get("aliases"), Mapping):
        return 'it has no "aliases" mapping'
    return None


def _remove_log(folder: Path) -> None:
    """Remove a redo log folder (with its quarantine) durably: gone, and its parent fsync'd."""
    if folder.exists():
        shutil.rmtree(folder)
        fsync_dir(folder.parent)


def redo_folder(path: str | os.PathLike, collection: str) -> Path:
    """The redo log of one collection of a local-mode folder (name percent-encoded).

    >>> redo_folder("/data/q", "papers").as_posix()
    '/data/q/uibk-redo/papers'
    """
    from urllib.parse import quote

    return Path(path) / "uibk-redo" / quote(collection, safe="")


API_KEY_ENV = "QDRANT_API_KEY"  # the server's API key when api_key= is not given

# local-mode stores this process opened and has not closed: closed by _close_at_exit
_OPEN_LOCAL: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close the local-mode stores still open when the interpreter exits. Left to
    ``QdrantClient.__del__`` at shutdown, the close imports ``portalocker`` when imports no longer
    work and prints ``Exception ignored in: ... ImportError: sys.meta_path is None``."""
    for store in list(_OPEN_LOCAL):
        with contextlib.suppress(Exception):
            store.close()


def _say_client_warnings(said: list[warnings.WarningMessage], where: Any) -> None:
    """qdrant-client's warnings from making a client, shown again; its warning that the API key
    goes over plain ``http://`` said as one warning of ours, with what to do."""
    for w in said:
        if "insecure connection" in str(w.message):
            warnings.warn(f"the Qdrant API key is sent unencrypted to {where} (http://, not https://): "
                          "anyone on the network can read it; use an https:// url (or https=True)",
                          UserWarning, stacklevel=3)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


class QdrantStore(_QdrantBase):
    """Tagged multivectors in a Qdrant collection, through ``qdrant_client.QdrantClient``.

    Parameters
    ----------
    collection: collection name; created when missing (unless ``create=False``), validated
        (and never changed) when it exists.
    url, host, port, grpc_port, prefer_grpc, https, api_key, timeout: a remote server or
        cluster (passed to ``QdrantClient``). ``timeout`` (seconds) bounds every request.
        ``api_key`` defaults to ``$QDRANT_API_KEY`` (as qdrant-client's users set it); a key
        sent over plain ``http://`` is warned about, once, in one line.
    location, path: local mode (``":memory:"`` or a directory): qdrant-client's pure-Python
        engine, always exact; for tests and small collections. With no connection argument
        at all the store runs in memory.
    client: an existing ``QdrantClient`` (not closed by :meth:`close`).
    vector_name, dense_name: names of the multivector and of the dense prefetch vector
        (``dense_name=None``: no dense vector, exact mode only).
    dense_distance: "dot" or "cosine" for a new dense vector (same ranking: it is unit).
    multivector_hnsw: build HNSW on the multivector too (default False: ``m=0``).
    dense_hnsw: ``HnswConfigDiff`` fields for the dense vector (e.g. ``{"m": 32}``).
    shard_number, replication_factor, on_disk, on_disk_payload: passed to
        ``create_collection`` (``on_disk`` applies to both vectors).
    mode, prefetch: default search mode and number of dense candidates.
    profile: Qdrant's own compression by the exact store's names (``"exact"``, ``"float16"``,
        ``"compact"``, ``"int8"``, ``"int8-rerank"``, ``"exact-rerank"``; what each sets:
        :mod:`~uibk_embedding.adapters.qdrant_profiles`), recorded with a new collection and
        checked on open (another profile: ``CollectionMismatch`` naming both; None: the
        recorded one, :attr:`profile`). Local mode keeps and checks it but searches exactly.
    max_rows_per_request: cap on the tagged-list rows (all documents' rows together) of one
        upsert request, next to ``batch_size``: Qdrant refuses a request body over 32 MiB
        (its ``max_request_size_mb``), and the default 8192 rows make at most about 25 MB of
        JSON (:data:`MAX_ROWS_PER_REQUEST`). A document over the cap is sent alone.
    batch_size, max_retries, backoff: upsert batch size; retries of transient failures
        (connection errors, timeouts, 408/429/502/503/504) with exponential backoff from
        ``backoff`` seconds. Every retried call is idempotent (upserts and deletes by id).
    payload_indexes: ``{field: schema}`` payload indexes to create (e.g. ``{"lang":
        "keyword", "year": "float"}``); see :meth:`create_payload_index`.
    show_progress: progress bar for upserts (None: for multi-batch calls on a terminal).

    Example
    -------
    >>> import numpy as np
    >>> from uibk_embedding.testing import make_list
    >>> rng = np.random.default_rng(1)
    >>> s = QdrantStore("docs", location=":memory:", payload_indexes={"lang": "keyword"})
    >>> s.upsert(["x"], [make_list(s.format, rng, 6)], [{"lang": "en"}])
    >>> s.get(["x"])[0].metadata, s.count()
    ({'lang': 'en'}, 1)
    >>> QdrantStore("docs", client=s.client, vector_name="other")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.CollectionMismatch: Qdrant collection 'docs' does not fit ...
    """

    backend = "qdrant"
    exact = True

    def __init__(
        self,
        collection: str = "uibk",
        *,
        url: str | None = None,
        host: str | None = None,
        port: int | None = 6333,
        grpc_port: int = 6334,
        prefer_grpc: bool = False,
        https: bool | None = None,
        api_key: str | None = None,
        timeout: float = 10.0,
        location: str | None = None,
        path: str | os.PathLike | None = None,
        client: Any = None,
        format: TaggedFormat | None = None,
        vector_name: str = "tagged",
        dense_name: str | None = "dense",
        dense_distance: str = "dot",
        multivector_hnsw: bool = False,
        dense_hnsw: Mapping[str, Any] | None = None,
        create: bool = True,
        shard_number: int | None = None,
        replication_factor: int | None = None,
        on_disk: bool | None = None,
        on_disk_payload: bool | None = None,
        mode: str = "exact",
        prefetch: int = 200,
        batch_size: int = 64,
        max_rows_per_request: int = MAX_ROWS_PER_REQUEST,
        max_retries: int = 3,
        backoff: float = 0.5,
        payload_indexes: Mapping[str, Any] | None = None,
        show_progress: bool | None = None,
        profile: str | None = None,
    ) -> None:
        qc = require("qdrant_client", "qdrant", "the Qdrant adapter")
        self._models = require("qdrant_client.models", "qdrant", "the Qdrant adapter")
        super().__init__(format)
        self._given_format = format
        if not isinstance(collection, str) or not collection:
            raise ValueError(f"collection must be a non-empty string, got {collection!r}")
        if vector_name == dense_name:
            raise ValueError("vector_name and dense_name must differ")
        if dense_distance.lower() not in ("dot", "cosine"):
            raise ValueError(f"dense_distance must be 'dot' or 'cosine', got {dense_distance!r}")
        check_positive("batch_size", batch_size)
        check_positive("max_rows_per_request", max_rows_per_request)
        for field, schema in (payload_indexes or {}).items():
            refuse_integer_index(field, schema)  # before the collection is made
        if max_retries < 0 or backoff < 0 or timeout <= 0:
            raise ValueError("max_retries and backoff must be >= 0 and timeout > 0")
        self.collection = collection
        self.vector_name = vector_name
        self.dense_name = dense_name
        self.batch_size = batch_size
        self.max_rows_per_request = int(max_rows_per_request)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.show_progress = show_progress
        self._init_modes(mode, prefetch, dense_name)
        self._init_profile(profile, multivector_hnsw)
        self._own_client = client is None
        remote = url is not None or host is not None
        # qdrant-client's local mode is pure Python and not thread-safe (concurrent calls raced:
        # readers saw writes go backwards, SQLite refused nested transactions): one call at a time
        self._guard: Any = contextlib.nullcontext()
        if client is not None:
            if remote or location is not None or path is not None:
                raise ValueError("pass either client= or connection arguments, not both")
            self.client = client
        elif remote:
            if location is not None or path is not None:
                raise ValueError("pass either url/host (a server) or location/path (local mode)")
            if api_key is None:  # as qdrant-client's users set it (the client itself does not read it)
                api_key = os.environ.get(API_KEY_ENV) or None
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                self.client = qc.QdrantClient(
                    url=url, host=host, port=port, grpc_port=grpc_port, prefer_grpc=prefer_grpc,
                    https=https, api_key=api_key, timeout=timeout, check_compatibility=False)
            _say_client_warnings(said, url or host)
        else:
            if location is not None and path is not None:
                raise ValueError("pass location= or path=, not both")
            problem = None if path is None else local_meta_problem(path)
            if problem is not None:  # someone else's meta.json: qdrant-client would fail on it
                raise CollectionMismatch(
                    f"{Path(path) / 'meta.json'} is not the metadata of a Qdrant local-mode folder "
                    f"({problem}): give the store its own folder, or an empty or new one; nothing "
                    "was written")
            if not create and path is not None and not local_collection_exists(path, collection):
                # before the client, which makes the folder, its lock and meta.json
                raise StoreNotFound(f"Qdrant collection {collection!r} does not exist at {path} "
                                    "(create=False); nothing was created")
            if path is not None:
                refuse_foreign_entries(path, "a Qdrant local-mode folder", lambda names: "meta.json" in names)
            try:
                self.client = qc.QdrantClient(
                    location=location if path is not None or location is not None else ":memory:",
                    path=None if path is None else str(path))
            except RuntimeError as e:
                if "already accessed by another instance" not in str(e):
                    raise
                raise StoreInUse(f"the Qdrant local-mode folder {path} is open in another QdrantStore "
                                 "(this or another process); close it first, or use a Qdrant server "
                                 "for several writers") from None
        self.where = url or host or (str(path) if path is not None else location or ":memory:")
        from qdrant_client.local.qdrant_local import QdrantLocal

        self.local = isinstance(getattr(self.client, "_client", None), QdrantLocal)
        self._set_exact()
        if self.local:
            self._guard = threading.RLock()
            if self._own_client:  # closed at exit while imports still work (_close_at_exit)
                _OPEN_LOCAL.add(self)
        self.created = False
        # local mode on disk commits point by point: a redo log makes each call all-or-nothing;
        # one log per collection (a folder may hold several), so a torn write is replayed into
        # the collection it was meant for and no other
        self._redo: RedoLog | None = None
        self._redo_dir = None if path is None else redo_folder(path, collection)
        try:
            self._open(create, shard_number, replication_factor, on_disk, on_disk_payload,
                       dense_distance, multivector_hnsw, dense_hnsw)
            if self._redo_dir is not None:  # made once the collection fits: none in a refused folder
                self._redo = RedoLog(self._redo_dir)
                self._replay_legacy_log(self._redo_dir.parent.parent)
                self._replay(self._redo)
            for field, schema in (payload_indexes or {}).items():
                self.create_payload_index(field, schema)
        except BaseException:
            self.close()
            raise

    def _replay_legacy_log(self, path: Path) -> None:
        """A redo log written by uibk-embedding 0.2.0 or older (``uibk-redo/*.npz``, no collection
        recorded): replayed only when this collection is the folder's only one, else kept, with a
        warning, for the user to decide (replaying it into another collection would corrupt it)."""
        # its quarantine must not be uibk-redo/failed: that is the log of a collection "failed"
        legacy = RedoLog(path / "uibk-redo", failed=path / "uibk-redo-failed-0.2.0")
        if not legacy.dirty:  # its entries are files; uibk-redo/x.npz/ is the log of collection x.npz
            return
        names = [c.name for c in self.client.get_collections().collections]
        if names == [self.collection]:
            self._replay(legacy)
            return
        warnings.warn(f"{legacy.folder} holds writes of uibk-embedding <= 0.2.0 that did not finish and do "
                      f"not name their collection; the folder holds collections {sorted(names)}, so they "
                      "were not replayed. Open the collection they belong to alone (or delete the files)",
                      stacklevel=3)

    # -- connection and collection ------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one idempotent client call, retrying transient failures with backoff."""
        attempt = 0
        while True:
            try:
                with warnings.catch_warnings():
                    # local mode warns that search params have no effect: it is always exact
                    warnings.filterwarnings("ignore", message="Local mode performs exact")
                    # ... and that payload indexes do nothing there (they matter on a server)
                    warnings.filterwarnings("ignore", message="Payload indexes have no effect")
                    return fn(*args, **kwargs)
            except Exception as e:
                if getattr(e, "status_code", None) in (401, 403):  # UnexpectedResponse: not retried
                    raise QdrantRefused(
                        f"Qdrant at {self.where} refused {what} (HTTP {e.status_code}): the API key is "
                        "missing or wrong; pass api_key= (uibk-embed: --option api_key=KEY) or set "
                        f"{API_KEY_ENV}") from e
                if not _is_transient(e):
                    raise
                if attempt >= self.max_retries:
                    raise QdrantUnavailable(
                        f"Qdrant at {self.where}: {what} failed after {attempt + 1} attempt(s) "
                        f"({type(e).__name__}: {e}); check the URL, the network and the timeout"
                    ) from e
                time.sleep(min(self.backoff * 2**attempt, 30.0))
                attempt += 1

    def _vectors_config(self, dense_distance: str, multivector_hnsw: bool,
                        dense_hnsw: Mapping[str, Any] | None, on_disk: bool | None) -> dict:
        m = self._models
        cfg = {self.vector_name: m.VectorParams(
            size=DIM, distance=m.Distance.DOT,
            multivector_config=m.MultiVectorConfig(comparator=m.MultiVectorComparator.MAX_SIM),
            hnsw_config=None if multivector_hnsw else m.HnswConfigDiff(m=0),
            **{"on_disk": on_disk, **client_vector_params(self.profile, m)})}
        if self.dense_name is not None:
            dist = m.Distance.DOT if dense_distance.lower() == "dot" else m.Distance.COSINE
            cfg[self.dense_name] = m.VectorParams(
                size=DENSE_DIM, distance=dist, on_disk=on_disk,
                hnsw_config=m.HnswConfigDiff(**dense_hnsw) if dense_hnsw else None)
        return cfg

    def _open(self, create: bool, shard_number: int | None, replication_factor: int | None,
              on_disk: bool | None, on_disk_payload: bool | None, dense_distance: str,
              multivector_hnsw: bool, dense_hnsw: Mapping[str, Any] | None) -> None:
        for _ in range(self.max_retries + 1):
            if self._call("collection_exists", self.client.collection_exists, self.collection):
                self._validate(self._call("get_collection", self.client.get_collection,
                                          self.collection))
                return
            if not create:
                raise StoreNotFound(f"Qdrant collection {self.collection!r} does not exist at "
                                    f"{self.where} (create=False); nothing was created")
            self._forget_logs_of_gone_collections()
            try:
                # not retried blindly: after a lost reply, the existence check decides
                self.client.create_collection(
                    self.collection,
                    vectors_config=self._vectors_config(dense_distance, multivector_hnsw,
                                                        dense_hnsw, on_disk),
                    shard_number=shard_number, replication_factor=replication_factor,
                    on_disk_payload=on_disk_payload,
                    metadata={META_KEY: {"version": 1, "format": self.format.to_stored(),
                                         "profile": self.profile}})
                self.created = True
                return
            except Exception as e:
                if _already_exists(e) and self._call("collection_exists", self.client.collection_exists,
                                                     self.collection):
                    # another writer created it since our check: validated like any existing one
                    self._validate(self._call("get_collection", self.client.get_collection,
                                              self.collection))
                    return
                if not _is_transient(e):
                    raise
                time.sleep(self.backoff)
        raise QdrantUnavailable(f"Qdrant at {self.where}: could not create {self.collection!r}")

    def _forget_logs_of_gone_collections(self) -> None:
        """Before the collection is created (local mode on disk): a redo log under its name is an
        earlier collection's (dropped, the process killed before drop() removed the log), never
        the new one's; removed first, so that no crash leaves it to be replayed into the new
        collection. So are the entries of a 0.2.0 log when the folder holds no collection at all."""
        if self._redo_dir is None:
            return
        _remove_log(self._redo_dir)
        legacy = self._redo_dir.parent
        if legacy.is_dir() and not self.client.get_collections().collections:
            gone = [p for p in legacy.glob("*.npz") if p.is_file()]
            for p in gone:
                p.unlink()
            if gone:
                fsync_dir(legacy)

    def _validate(self, info: Any) -> None:
        """Refuse a collection whose layout differs, saying exactly what differs."""
        m = self._models
        vectors = info.config.params.vectors
        problems: list[str] = []
        named = isinstance(vectors, Mapping)
        if not named:
            desc = "none" if vectors is None else f"size {vectors.size}, {vectors.distance.value}"
            problems.append(f"it has a single unnamed vector ({desc}), not a named multivector "
                            f"{self.vector_name!r}")
            vectors = {}
        names = sorted(vectors)
        sparse = sorted(info.config.params.sparse_vectors or {})
        has = str(names) if names else f"no dense vectors; sparse vectors: {sparse}"
        mv = vectors.get(self.vector_name)
        if named and mv is None:
            problems.append(f"it has no vector named {self.vector_name!r} (it has {has})")
        if mv is not None:
            if mv.size != DIM:
                problems.append(f"{self.vector_name!r} has size {mv.size}, needs {DIM}")
            if mv.distance != m.Distance.DOT:
                problems.append(
                    f"{self.vector_name!r} uses distance {mv.distance.value}, needs Dot "
                    "(Cosine renormalises each vector and breaks the query-time dense weight)")
            cmp = mv.multivector_config.comparator if mv.multivector_config else None
            if cmp != m.MultiVectorComparator.MAX_SIM:
                problems.append(f"{self.vector_name!r} is not a multivector with comparator max_sim "
                                f"(multivector_config: {mv.multivector_config})")
            dt = getattr(mv, "datatype", None)
            record = (getattr(info.config, "metadata", None) or {}).get(META_KEY)
            problems += self._check_profile(record, self.vector_name, dt and dt.value,
                                            getattr(mv, "quantization_config", None),
                                            f"Qdrant collection {self.collection!r} at {self.where}")
        if self.dense_name is not None and named:
            dv = vectors.get(self.dense_name)
            if dv is None:
                problems.append(f"it has no dense vector named {self.dense_name!r} (it has {has}; "
                                "pass dense_name=None to use exact search only)")
            else:
                if dv.size != DENSE_DIM:
                    problems.append(f"{self.dense_name!r} has size {dv.size}, needs {DENSE_DIM}")
                if dv.distance not in (m.Distance.DOT, m.Distance.COSINE):
                    problems.append(f"{self.dense_name!r} uses distance {dv.distance.value}, "
                                    "needs Dot or Cosine")
                if dv.multivector_config is not None:
                    problems.append(f"{self.dense_name!r} is a multivector, needs a single vector")
                problems += self._datatype_problems(self.dense_name, dv)
        elif vectors:
            problems += unwritten_dense({n: (v.size, v.multivector_config is not None)
                                          for n, v in vectors.items()})
        # the store's record: our entry in the collection metadata (none in collections made by
        # hand or before records were written: accepted, with no format to conflict with)
        saved, mismatch = record_problems((getattr(info.config, "metadata", None) or {}).get(META_KEY),
                                          self._given_format, key=None, schema_key="version", schema=1,
                                          optional=True)
        problems += mismatch
        if saved is not None and not problems:
            self.format = saved
        if problems:
            raise CollectionMismatch(
                f"Qdrant collection {self.collection!r} does not fit uibk-embedding: "
                + "; ".join(problems) + ". The collection was not changed.")

    def _datatype_problems(self, name: str, params: Any) -> list[str]:
        """A vector stored as float16 or uint8 rounds (or truncates) what is written, so scores
        are no longer the exact store's: only float32 (the default) is accepted."""
        dt = getattr(params, "datatype", None)
        if dt is None or dt == self._models.Datatype.FLOAT32:
            return []
        return [f"{name!r} stores datatype {dt.value}, needs float32 (the default): {dt.value} "
                "changes the stored vectors and so the scores"]

    def create_payload_index(self, field: str, schema: Any = "keyword") -> None:
        """Index a metadata field for fast filtering (``schema``: "keyword", "float", "bool" or a
        qdrant-client schema object). Number filters run as float ranges, so index numeric
        fields as "float"; an integer index is refused (:func:`refuse_integer_index`)."""
        refuse_integer_index(field, schema)
        if isinstance(schema, str):
            try:
                schema = self._models.PayloadSchemaType(schema.lower())
            except ValueError:
                raise ValueError(f"unknown payload schema {schema!r} for field {field!r}") from None
        self._call(f"create_payload_index({field!r})", self.client.create_payload_index,
                   self.collection, field_name=json_key(field), field_schema=schema, wait=True)

    # -- the interface ------------------------------------------------------------------------
    def _write_points(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        self._in_batches(ids, vectors, metadata, self.collection, lambda points: self._call(
            "upsert", self.client.upsert, self.collection, points=points, wait=True))

    def _point(self, doc_id: str, vectors: dict[str, list], payload: dict) -> Any:
        return self._models.PointStruct(id=point_id(doc_id), vector=vectors, payload=payload)

    def _delete_points(self, ids: list[str]) -> None:
        m = self._models
        for chunk in batched(ids, 1024):
            self._call("delete", self.client.delete, self.collection,
                       points_selector=m.PointIdsList(points=[point_id(x) for x in chunk]), wait=True)

    @serialized
    def count(self) -> int:
        return int(self._call("count", self.client.count, self.collection, exact=True).count)

    @serialized
    def _scroll(self, flt: Any, offset: Any, limit: int) -> tuple[list[Any], Any]:
        return self._call("scroll", self.client.scroll, self.collection, scroll_filter=flt,
                          limit=limit, offset=offset, with_payload=True, with_vectors=False)

    def _delete_where(self, conditions: tuple[Node, ...]) -> int:
        if self._redo is not None:  # local files: list the ids so the redo log can hold them
            with self._guard:  # the replay before the listing
                self._replay_failed()
                return super()._delete_where(conditions)
        return self._delete_by_filter(conditions)

    @serialized
    def _delete_by_filter(self, conditions: tuple[Node, ...]) -> int:
        m = self._models
        flt = self._filter(conditions) or m.Filter(must=[])
        n = int(self._call("count", self.client.count, self.collection, count_filter=flt, exact=True).count)
        if n:
            self._call("delete", self.client.delete, self.collection,
                       points_selector=m.FilterSelector(filter=flt), wait=True)
        return n

    def _retrieve(self, point_ids: list[str]) -> list[Any]:
        return self._call("retrieve", self.client.retrieve, self.collection, ids=point_ids,
                          with_payload=True, with_vectors=[self.vector_name])

    def _requests(self, queries: list[np.ndarray], k: int, flt: Any, mode: str, n: int,
                  explain: bool = False) -> list:
        m = self._models
        params = None if self.local or mode == "hnsw" else m.SearchParams(exact=True)
        coded = None if self.local else search_params(self.profile, k, m.SearchParams,
                                                      m.QuantizationSearchParams)
        params = coded or params  # a profile's codes: scanned (exact=False ignores no code)
        out = []
        for q in queries:
            pre = None
            if mode == "prefetch":
                pre = m.Prefetch(query=self._query_dense(q), using=self.dense_name,
                                 limit=max(n, k), filter=flt)
                params = None  # reranking scores the prefetched candidates exactly
            out.append(m.QueryRequest(query=q.tolist(), using=self.vector_name, prefetch=pre,
                                      filter=flt, params=params, limit=k, with_payload=True,
                                      with_vector=[self.vector_name] if explain else False))
        return out

    @serialized
    def _run(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
             mode: str, n: int, explain: bool = False) -> list[list[Hit]]:
        flt = self._filter(conditions)
        results: list[list[Hit]] = []
        for chunk in batched(queries, 32):
            reqs = self._requests(list(chunk), k, flt, mode, n, explain)
            if len(reqs) == 1:
                r = reqs[0]
                resps = [self._call("query_points", self.client.query_points, self.collection,
                                    query=r.query, using=r.using, prefetch=r.prefetch,
                                    query_filter=r.filter, search_params=r.params, limit=k,
                                    with_payload=True, with_vectors=r.with_vector)]
            else:
                resps = self._call("query_batch_points", self.client.query_batch_points,
                                   self.collection, requests=reqs)
            results += [[self._hit(p, q if explain else None) for p in resp.points]
                        for q, resp in zip(chunk, resps, strict=True)]
        return results

    def drop(self) -> None:
        """Delete the collection, only if this store created it (a user's collection never is).
        In local mode on disk its redo log goes too, after the collection (a crash in between
        leaves a log that the next creation of the name removes before it creates)."""
        if not self.created:
            raise PermissionError(f"collection {self.collection!r} was not created by this store; "
                                  "refusing to drop it")
        with self._guard:
            self._call("delete_collection", self.client.delete_collection, self.collection)
            self.created = False
            if self._redo_dir is not None:
                self._redo = None  # the unfinished writes of a collection that is gone
                _remove_log(self._redo_dir)

    def drop_collection(self) -> None:
        """Deprecated name of :meth:`drop` (the name every backend uses)."""
        warnings.warn("QdrantStore.drop_collection() is deprecated: use drop()", DeprecationWarning,
                      stacklevel=2)
        self.drop()

    def close(self) -> None:
        """Close the client if the store opened it (local mode: releases the path lock)."""
        client = getattr(self, "client", None)
        if client is not None and self._own_client:
            client.close()
