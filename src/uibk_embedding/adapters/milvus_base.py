"""What both Milvus layouts share: connection, collections, id and metadata rows, rescoring.

:class:`MilvusStore` is the store users make (``MilvusStore(uri, collection, layout=...)``); it
hands construction to the class of the layout asked for, each in its own module:
:class:`~uibk_embedding.adapters.milvus_token_rows.MilvusTokenRowsStore` (``"token_rows"``) and
:class:`~uibk_embedding.adapters.milvus_embedding_list.MilvusEmbeddingListStore`
(``"embedding_list"``). Import them through :mod:`uibk_embedding.adapters.milvus`, which
registers both. Here: the filter expressions, the connection and server version, creating or
validating the collections and the store's marker, the metadata rows, ``count``/``scan``/``get``,
the one search entry point (its pool option per query) and the exact rescoring of candidates with
its consistency rule (a list is never older than the rows that nominated it).

A layout implements: ``_names`` (its collections), ``_expected_fields`` and ``_build_schema``,
``_write`` (an upsert after the shared checks), ``_fetch`` (stored lists by id) and
``_search_one`` (candidates for one query, then :meth:`MilvusStore._rescore`, which hands them
to :func:`~uibk_embedding.adapters.rerank.rerank_candidates`); optionally
``_check_server``, ``_doc_filter``, ``_visible`` (with ``_scan_fields``: which metadata rows a
scan lists), ``_marker``/``_write_marker``, ``_index_problems`` and ``repair``. Every request and
answer is sized to about :data:`REQUEST_BYTES` (Milvus refuses a gRPC message over 64 MiB).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding.adapters.base import (
    BatchSearch,
    Hit,
    MultiVectorStore,
    Record,
    check_choice,
    check_positive,
    record_problems,
    renamed_option,
)
from uibk_embedding.adapters.common import batched, parse_version, serialized
from uibk_embedding.adapters.engine_profiles import check_profile, profile_conflict
from uibk_embedding.adapters.filters import OPERATORS, SQL_RANGES, And, Node, Not, Or, matches
from uibk_embedding.adapters.rerank import rerank_candidates
from uibk_embedding.errors import BackendUnavailable, CollectionMismatch, ServerTooOld, StoreNotFound
from uibk_embedding.tagged import TaggedFormat

LAYOUTS = ("token_rows", "embedding_list")
MAX_LIMIT = 16384  # Milvus: largest search topk and query() rows per call
MAX_META_BYTES = 65535  # VARCHAR max_length
ID_BYTES = 2048  # ids are <= 512 characters, <= 4 bytes each in UTF-8
SCHEMA_VERSION = 1
# Milvus refuses a gRPC message over 64 MiB (RESOURCE_EXHAUSTED; measured on 2.3.5): inserts,
# fetches, scans and row searches are sized to stay within this estimated budget, a quarter of it
REQUEST_BYTES = 16 * 2**20
GRPC_LIMIT_BYTES = 64 * 2**20
_FIELD_BYTES = 8  # an estimate's allowance per field of a row (number, length prefix, tags)
DEFAULT_CANDIDATES = 64
# Milvus returns float32 scores: a bound is trusted only this far above an exact score
_BOUND_SLACK = 1e-4
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,200}$")
_Stored = tuple[np.ndarray, dict, int]  # a fetched document: its list, metadata, write version


def _pymilvus():
    return require("pymilvus", "milvus", "the Milvus adapter")


def _start_lite_server(uri: str) -> None:
    """Start the Milvus Lite server of the file ``uri`` (pymilvus then connects to it), one
    start at a time on this machine: a starting server empties and re-creates ``~/.cache/milvus``,
    and two starting at once failed one of them ("create dir ... failed", then "Mmap manager has
    not been init" on its first call; 5 of 24 parallel starts here)."""
    import fcntl
    import tempfile

    manager = require("milvus_lite.server_manager", "milvus", "Milvus Lite (a local .db file)")
    lock = os.path.join(tempfile.gettempdir(), f"uibk-milvus-lite-start-{os.getuid()}.lock")
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        manager.server_manager_instance.start_and_get_uri(uri)  # waits 0.5 s: the server is up then


# -- filters -----------------------------------------------------------------------------------
def encode_filter_value(v: Any) -> Any:
    """How one metadata value is stored for filtering (``None``: not filterable).

    >>> encode_filter_value("x"), encode_filter_value(True), encode_filter_value(2)
    ('sx', 'b1', 2)
    """
    if isinstance(v, bool):
        return "b1" if v else "b0"
    if isinstance(v, str):
        return "s" + v
    if isinstance(v, int | float):
        return v
    return None


def filter_fields(metadata: dict) -> dict:
    """The type-tagged JSON object stored beside a document for filtering."""
    out = {}
    for key, v in metadata.items():
        enc = encode_filter_value(v)
        if enc is not None:
            out[key] = enc
    return out


def _literal(v: Any) -> str:
    enc = encode_filter_value(v)
    if isinstance(enc, str):
        return json.dumps(enc, ensure_ascii=False)  # a quoted literal, quotes/backslashes escaped
    if isinstance(enc, float):
        if not math.isfinite(enc):
            raise ValueError(f"filter value {v!r} is not finite")
        return repr(enc)
    return str(int(enc))


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def filter_expression(conditions: Sequence[Node], field: str = "f") -> str:
    """A Milvus boolean expression that every document matching ``conditions`` passes ('' for
    no constraint); the exact check (:func:`~uibk_embedding.adapters.filters.matches`) runs on
    the documents it returns, in search and in scan.

    Equality and ranges on numbers, strings and booleans, under ``$and`` and ``$or``, are sent
    to Milvus. What the stored filter fields cannot answer exactly is left to the exact check
    and sent as no constraint (a wider server-side search; a search that then finds fewer than
    ``k`` matching documents searches deeper, as it does for any filter): negations
    (``$ne``, ``$nin``, ``$not``: Milvus's handling of a missing JSON key under ``not`` is not
    the library's), ``$exists`` (lists and nulls are not stored for filtering), and strings
    with a control character (Milvus Lite 2.5 matches no escaped ``\\n`` or ``\\t`` in a string
    literal and refuses a raw newline).

    >>> from uibk_embedding.adapters.filters import parse_filter
    >>> filter_expression(parse_filter({"lang": 'x" or 1==1 or "', "n": {"$in": [1, True]}}))
    '(f["lang"] == "sx\\\\" or 1==1 or \\\\"") and (f["n"] == 1 or f["n"] == "b1")'
    >>> filter_expression(parse_filter({"a": "two\\nlines", "n": 1}))
    '(f["n"] == 1)'
    >>> filter_expression(parse_filter({"$or": [{"y": {"$gte": 2}}, {"y": {"$lt": 0.5}}]}))
    '((f["y"] >= 2) or (f["y"] < 0.5))'
    >>> filter_expression(parse_filter({"$or": [{"y": 1}, {"z": {"$ne": 1}}]}))
    ''
    >>> filter_expression(parse_filter({"ts": {"$gt": 1.7e18}}))
    '(f["ts"] >= 1.7e+18)'
    """
    parts = [p for p in (_expression(c, field) for c in conditions) if p]
    return _chain(parts, "and")


def _chain(parts: list[str], op: str) -> str:
    """``parts`` joined by ``op`` in parenthesised groups of at most 16: Milvus Lite refuses a
    flat chain of more than about 50 terms ("unsupported expr proto node"), an ``$in`` of 50
    values or an ``$or`` of 50 branches among them.

    >>> _chain(["a", "b"], "or"), _chain([str(i) for i in range(20)], "or").count("(")
    ('a or b', 2)
    """
    while len(parts) > 16:
        parts = ["(" + f" {op} ".join(parts[i:i + 16]) + ")" for i in range(0, len(parts), 16)]
    return f" {op} ".join(parts)


def _expression(n: Node, field: str) -> str:
    """A superset expression for one node ('' for no constraint)."""
    if isinstance(n, And):
        parts = [p for p in (_expression(c, field) for c in n.children) if p]
        return "(" + _chain(parts, "and") + ")" if parts else ""
    if isinstance(n, Or):
        parts = [_expression(c, field) for c in n.children]
        if not parts or not all(parts):
            return ""  # one unconstrained alternative: the whole OR is unconstrained
        return "(" + _chain(parts, "or") + ")"
    if isinstance(n, Not) or n.op in ("$ne", "$nin", "$exists"):
        return ""
    path = f"{field}[{json.dumps(n.field, ensure_ascii=False)}]"
    if n.op in SQL_RANGES:
        op, v = SQL_RANGES[n.op], n.values[0]
        if abs(v) >= 2**53:  # Milvus compares an int and a float as doubles, which round
            op = op[0] + "="  # neighbours together past 2**53: widened, the exact check decides
        return f"({path} {op} {_literal(v)})"
    if any(isinstance(v, str) and _CONTROL.search(v) for v in n.values):
        return ""
    return "(" + _chain([f"{path} == {_literal(v)}" for v in n.values], "or") + ")"


def row_bytes(row: dict, sizes: dict[int, int] | None = None) -> int:
    """About how many bytes ``row`` takes in a Milvus insert request: UTF-8 text, JSON text of a
    JSON field, 4 bytes per float of a vector, and a few bytes per field. ``sizes`` caches the
    size of dict values by identity (the token rows of one document share one filter dict).

    >>> row_bytes({"doc_id": "ab", "ver": 1, "f": {"k": "sv"}, "vec": [0.0] * 128})
    557
    """
    n = 0
    for v in row.values():
        n += _FIELD_BYTES
        if isinstance(v, str):
            n += len(v.encode())
        elif isinstance(v, dict):
            if sizes is None or id(v) not in sizes:
                size = len(json.dumps(v, ensure_ascii=False).encode())
                if sizes is None:
                    n += size
                    continue
                sizes[id(v)] = size
            n += sizes[id(v)]
        elif isinstance(v, list):
            n += 4 * len(v) if not v or not isinstance(v[0], dict) else \
                sum(row_bytes(e, sizes) for e in v)
    return n


def too_large(error: BaseException) -> bool:
    """Whether ``error`` is Milvus refusing a gRPC message over its size limit.

    >>> too_large(ValueError("grpc: received message larger than max (100 vs. 64)"))
    True
    """
    code = getattr(error, "code", None)
    try:
        name = getattr(code() if callable(code) else code, "name", "")
    except Exception:
        name = ""
    return name == "RESOURCE_EXHAUSTED" or "larger than max" in str(error)


def _ids_expr(ids: Sequence[str]) -> str:
    return "doc_id in [" + ", ".join(json.dumps(x, ensure_ascii=False) for x in ids) + "]"


class _Version:
    """Write versions: above the local clock (nanoseconds since the epoch) when it is ahead, and
    always above every version already stored for the documents written (``after``), so a writer
    whose clock is behind (another host, an NTP step, a restored VM) still supersedes what it
    read: the order of versions is the order of acknowledged writes, not of clocks."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self, after: int = 0) -> int:
        with self._lock:
            self._last = max(self._last + 1, int(after) + 1, time.time_ns())
            return self._last


# -- the store -----------------------------------------------------------------------------------
class MilvusStore(BatchSearch, MultiVectorStore):
    """Tagged multi-vectors in Milvus; ``MilvusStore(...)`` makes the store of the ``layout``
    asked for (see :mod:`uibk_embedding.adapters.milvus` for the layouts).

    Parameters
    ----------
    uri: ``http://host:19530`` for a server, or a local ``*.db`` path for Milvus Lite.
    collection: base name; ``token_rows`` uses ``<collection>_rows`` and ``<collection>_docs``.
    layout: ``"token_rows"`` (every Milvus) or ``"embedding_list"`` (Milvus >= 2.6.4).
    rows_per_vector: (``token_rows``) nearest rows taken per query vector; the documents owning
        them are rescored. Larger = better recall, slower. Also a per-query option:
        ``search(q, k, rows_per_vector=256)``. ``candidates`` is its deprecated name there.
    candidates: (``embedding_list``) documents rescored, as on every other backend; also per
        query: ``search(q, k, candidates=256)``.
    exact: guarantee exact top-k (``token_rows`` with ``index_type="FLAT"`` only).
    index_type, index_params, search_params: the row index (``"HNSW"`` by default, M=16,
        efConstruction=200; ``ef`` = max(rows_per_vector, 64) at search time).
    token, timeout: connection options; ``timeout`` (seconds) bounds connecting and each call.
    format: the tagged format; stored with the collection and checked on reopen.
    batch_rows: vectors per insert call; ``show_progress`` draws a bar over insert batches.
    client: an existing ``pymilvus.MilvusClient`` to use instead of ``uri``.
    create: create the collections when missing (``False``:
        :class:`~uibk_embedding.errors.StoreNotFound`, nothing created).
    profile: the row vectors' type by the exact store's profile names (:attr:`PROFILES` of the
        layout: ``token_rows`` takes ``"exact"``, FLOAT_VECTOR rows, and ``"float16"``,
        FLOAT16_VECTOR rows on Milvus >= 2.4 and Milvus Lite 2.5; the lists a search rescores
        stay float32), recorded with the store and checked on open (another profile:
        ``CollectionMismatch`` naming both; None: the recorded one, :attr:`profile`).

    Example
    -------
    >>> s = MilvusStore(uri="http://localhost:19530")  # doctest: +SKIP
    """

    backend = "milvus"
    filter_operators = frozenset(OPERATORS)
    exact = False
    search_options: ClassVar[tuple[str, ...]] = ("candidates",)  # per query (see Parameters)
    pool_option: ClassVar[str] = "candidates"
    """The name of this layout's pool option: ``candidates`` (documents) or ``rows_per_vector``."""
    layout: ClassVar[str] = ""  # set by each layout class
    supports_exact: ClassVar[bool] = False  # whether exact=True can be proven by this layout
    _docs_suffix: ClassVar[str] = "_docs"  # the documents collection: <collection><suffix>
    _layouts: ClassVar[dict[str, type[MilvusStore]]] = {}
    _request_bytes: int = REQUEST_BYTES  # the estimated size every request and answer stays under
    _id_bytes: int = 256  # the longest document id (UTF-8) this object wrote or read, at least 256
    PROFILES: ClassVar[dict[str, tuple[str, tuple[int, int, int], str]]] = {
        "exact": ("FLOAT_VECTOR", (0, 0, 0), "FLOAT_VECTOR rows")}
    """profile -> (the row field's Milvus type, the oldest server with it, what it keeps)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.layout:
            MilvusStore._layouts[cls.layout] = cls

    def __new__(cls, *args: Any, layout: str | None = None, **kwargs: Any) -> MilvusStore:
        if cls is MilvusStore:  # the class of the layout asked for
            layout = "token_rows" if layout is None else layout
            check_choice("layout", layout, LAYOUTS)
            if layout not in MilvusStore._layouts:
                raise ValueError(f"layout {layout!r} is not loaded: import uibk_embedding.adapters.milvus")
            cls = MilvusStore._layouts[layout]
        return super().__new__(cls)

    def __init__(
        self,
        uri: str = "http://localhost:19530",
        collection: str = "uibk",
        *,
        layout: str | None = None,
        candidates: int | None = None,
        rows_per_vector: int | None = None,
        exact: bool = False,
        index_type: str = "HNSW",
        index_params: dict | None = None,
        search_params: dict | None = None,
        token: str = "",
        timeout: float = 30.0,
        format: TaggedFormat | None = None,
        batch_rows: int = 8192,
        show_progress: bool = False,
        client: Any = None,
        create: bool = True,
        profile: str | None = None,
        _on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(format)
        self._guard = threading.RLock()
        if layout is not None and layout != self.layout:
            raise ValueError(f"{type(self).__name__} stores layout {self.layout!r}, got layout={layout!r}")
        if not isinstance(collection, str) or not _NAME.match(collection):
            raise ValueError(
                f"collection name {collection!r}: use letters, digits and underscores, "
                "starting with a letter or underscore (at most 201 characters)"
            )
        self._asked_profile = check_profile(profile, {k: v[2] for k, v in self.PROFILES.items()},
                                            f"milvus layout {self.layout!r}")
        self.profile = self._asked_profile or "exact"
        if exact and self.profile != "exact":
            raise ValueError(f"exact=True proves the top k from the rows' float32 scores; profile="
                             f"{self.profile!r} rounds them: use profile='exact' or exact=False")
        pool = self._given_pool(candidates, rows_per_vector, stacklevel=4)
        check_positive("batch_rows", batch_rows)
        index_type = index_type.upper()
        if exact and (not self.supports_exact or index_type != "FLAT"):
            raise ValueError(
                "exact=True needs layout='token_rows' and index_type='FLAT' (an exhaustive row "
                "search); the bound that proves exactness does not hold for approximate indexes"
            )
        self.uri = uri
        self.collection = collection
        setattr(self, self.pool_option, DEFAULT_CANDIDATES if pool is None else pool)
        self.exact = exact  # instance value: this store's guarantee
        self.index_type = index_type
        self.index_params = dict(index_params if index_params is not None else
                                 ({"M": 16, "efConstruction": 200} if index_type == "HNSW" else
                                  {"nlist": 1024} if index_type.startswith("IVF") else {}))
        self.search_params = dict(search_params or {})
        self.timeout = timeout
        self.batch_rows = batch_rows
        self.show_progress = show_progress
        self._on_close = _on_close
        self._versions = _Version()
        self._closed = False
        self._owns_client = client is None
        self.client = client if client is not None else self._connect(uri, token, timeout)
        self.server_version = self._server_version(uri, timeout)
        self._check_server(self.server_version)
        self._check_profile_server(self.profile)
        self.rows_name = f"{collection}_rows"
        self.docs_name = f"{collection}{self._docs_suffix}"
        try:
            self._open_or_create(format, create)
        except BaseException:
            if self._owns_client:
                self.client.close()
            raise

    def _given_pool(self, candidates: Any, rows_per_vector: Any, stacklevel: int = 3) -> int | None:
        """The pool option given (None: not given), under this layout's name
        (:attr:`pool_option`): ``candidates`` is the deprecated spelling of ``rows_per_vector``
        on ``token_rows``; ``rows_per_vector`` is refused on ``embedding_list``."""
        name = self.pool_option
        if name == "rows_per_vector":
            n = renamed_option(name, rows_per_vector, "candidates", candidates, stacklevel=stacklevel + 1)
        elif rows_per_vector is not None:
            raise TypeError(f"rows_per_vector is an option of layout='token_rows'; the {self.layout!r} "
                            "layout takes candidates (documents rescored)")
        else:
            n = candidates
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LIMIT):
            raise ValueError(f"{name} must be an int in 1..{MAX_LIMIT}, got {n!r}")
        return n

    # -- connection ------------------------------------------------------------------------
    @staticmethod
    def _connect(uri: str, token: str, timeout: float) -> Any:
        pymilvus = _pymilvus()
        if uri.endswith(".db"):
            Path = __import__("pathlib").Path
            Path(uri).parent.mkdir(parents=True, exist_ok=True)
        result: dict[str, Any] = {}

        def connect() -> None:  # pymilvus may retry for long: bound it ourselves
            try:
                if uri.endswith(".db"):
                    _start_lite_server(uri)
                result["client"] = pymilvus.MilvusClient(uri=uri, token=token, timeout=timeout)
            except BaseException as e:
                result["error"] = e

        t = threading.Thread(target=connect, daemon=True)
        t.start()
        t.join(timeout + 1.0)
        if "client" in result:
            return result["client"]
        why = f"{type(result['error']).__name__}: {result['error']}" if "error" in result else \
            f"no answer within {timeout:g} s"
        raise BackendUnavailable(f"cannot connect to Milvus at {uri!r} ({why}); is the server running "
                              "and the URI right (e.g. http://localhost:19530)?") from result.get("error")

    def _server_version(self, uri: str, timeout: float) -> str:
        if uri.endswith(".db"):
            import milvus_lite

            version = str(getattr(milvus_lite, "__version__", ""))
            if version.startswith("2."):  # the C++ Milvus Lite lacks the GetVersion call of pymilvus 3
                return f"milvus_lite-{version}"
        return str(self.client.get_server_version(timeout=timeout))

    def _check_server(self, version: str) -> None:
        """Refuse a server this layout cannot run on (default: every server will do)."""

    def _check_profile_server(self, profile: str) -> None:
        """Refuse a profile whose row type this server lacks, naming its version."""
        ftype, oldest, _ = self.PROFILES[profile]
        if parse_version(self.server_version) < oldest:
            need = ".".join(map(str, oldest))
            raise ServerTooOld(f"profile={profile!r} keeps {ftype} rows, which Milvus "
                               f"{self.server_version!r} lacks (they need Milvus >= {need}); use "
                               "profile='exact'")

    def _profile_problems(self, marker: Any) -> list[str]:
        """The recorded profile (``"exact"`` in a record from before profiles) against the one
        asked for (CollectionMismatch naming both); sets :attr:`profile`."""
        saved = marker.get("profile", "exact") if isinstance(marker, dict) else "exact"
        if saved not in self.PROFILES:
            return [f"its record names profile {saved!r}, which layout {self.layout!r} does not take"]
        conflict = profile_conflict(saved, self._asked_profile, f"Milvus store {self.collection!r}")
        if conflict is not None:
            raise CollectionMismatch(conflict + "; nothing was changed")
        self.profile = saved
        return []

    def stats(self) -> dict[str, Any]:
        """:meth:`MultiVectorStore.stats` with the store's ``profile``."""
        return {**super().stats(), "profile": self.profile}

    # -- schema ----------------------------------------------------------------------------
    def _description(self) -> str:
        return json.dumps({"uibk": self.layout, "schema": SCHEMA_VERSION,
                           "format": self.format.to_stored(), "profile": self.profile}, sort_keys=True)

    def _names(self) -> list[str]:
        """The layout's collections in creation order; the documents collection (the one with
        the store's marker) last."""
        raise NotImplementedError

    def _expected_fields(self, name: str) -> dict[str, tuple[str, dict]]:
        """Field name -> (Milvus type name, type parameters) of collection ``name``."""
        raise NotImplementedError

    def _build_schema(self, name: str) -> tuple[Any, Any]:
        """The schema and index parameters collection ``name`` is created with."""
        raise NotImplementedError

    def _open_or_create(self, format: TaggedFormat | None, create: bool) -> None:
        names = self._names()
        present = [n for n in names if self.client.has_collection(n, timeout=self.timeout)]
        if present and len(present) != len(names):
            missing = sorted(set(names) - set(present))
            raise CollectionMismatch(
                f"Milvus store {self.collection!r} is incomplete: {present} exist but {missing} do "
                "not (a crash during creation, or a name clash). Drop the existing collection(s) or "
                "choose another collection name; nothing was changed."
            )
        if present:
            for n in reversed(names):  # the docs collection (with the marker) first
                self._validate_existing(n, format)
        elif not create:
            raise StoreNotFound(f"no Milvus store {self.collection!r} at {self.uri} (create=False): "
                                f"{' and '.join(names)} do not exist; nothing was created")
        else:
            for n in names:
                schema, ip = self._build_schema(n)
                self.client.create_collection(n, schema=schema, consistency_level="Strong",
                                              timeout=self.timeout)
                # the index of an empty collection is complete once the server has recorded it:
                # sync=False skips pymilvus's wait for it (0.5 s of sleep per index)
                self.client.create_index(n, ip, timeout=self.timeout, sync=False)
            # a load takes the server seconds even for an empty collection (2.4 s each on 2.3.5):
            # ask for all of them, then wait for each, so they load side by side
            for n in names:
                self.client.load_collection(n, timeout=max(self.timeout, 60), _async=True)
            for n in names:
                self.client.load_collection(n, timeout=max(self.timeout, 60))
            self._write_marker()

    def _marker(self, desc: dict) -> Any:
        """The store's marker: the docs collection's description (a layout whose engine may not
        keep descriptions adds a fallback)."""
        try:
            info = json.loads(desc.get("description") or "")
            if isinstance(info, dict) and "uibk" in info:
                return info
        except ValueError:
            pass
        return None

    def _write_marker(self) -> None:
        """Store the marker beyond the collection description (default: nothing more)."""

    def _validate_existing(self, name: str, format: TaggedFormat | None) -> None:
        desc = self.client.describe_collection(name, timeout=self.timeout)
        problems = self._field_problems(name, desc)
        if not problems:
            self.client.load_collection(name, timeout=max(self.timeout, 60))
        if name == self.docs_name and not problems:  # the marker is the store's record
            marker = self._marker(desc)
            saved, problems = record_problems(marker, format, key="uibk", value=self.layout,
                                              schema=SCHEMA_VERSION)
            problems = problems or self._profile_problems(marker)
            if saved is not None and not problems:
                self.format = saved
        if not problems:
            problems = self._index_problems(name)
        if problems:
            raise CollectionMismatch(
                f"existing Milvus collection {name!r} does not fit this store: " + "; ".join(problems)
                + ". It was left unchanged: use another collection name or drop it yourself."
            )

    def _index_problems(self, name: str) -> list[str]:
        """What makes the vector index of an existing collection unusable (default: nothing)."""
        return []

    def _field_problems(self, name: str, desc: dict) -> list[str]:
        problems: list[str] = []
        fields = {f["name"]: f for f in desc.get("fields", [])}
        for fname, (ftype, params) in self._expected_fields(name).items():
            f = fields.get(fname)
            if f is None:
                problems.append(f"field {fname!r} is missing")
                continue
            got = getattr(f["type"], "name", str(f["type"]))
            if got != ftype:
                problems.append(f"field {fname!r} has type {got}, expected {ftype}")
            fp = f.get("params", {})
            for key, want in params.items():
                val = fp.get(key, f.get(key))
                val = getattr(val, "name", val)
                if val is not None and str(val) != str(want):
                    problems.append(f"field {fname!r} has {key}={val}, expected {want}")
        return problems

    def _index_info(self, name: str, field: str) -> dict:
        try:
            for idx in self.client.list_indexes(name, field_name=field, timeout=self.timeout):
                return dict(self.client.describe_index(name, idx, timeout=self.timeout) or {})
        except Exception:
            return {}
        return {}

    def _index_metric(self, name: str, field: str) -> str | None:
        return self._index_info(name, field).get("metric_type")

    def _index_type(self, name: str, field: str) -> str | None:
        return self._index_info(name, field).get("index_type")

    # -- writes ----------------------------------------------------------------------------
    def _meta_text(self, doc_id: str, md: dict) -> str:
        text = json.dumps(md, ensure_ascii=False, allow_nan=False)
        if len(text.encode()) > MAX_META_BYTES:
            raise ValueError(f"metadata of {doc_id!r} is {len(text.encode())} bytes as JSON; "
                             f"Milvus VARCHAR holds at most {MAX_META_BYTES}")
        return text

    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        for x in ids:
            if _CONTROL.search(x):
                raise ValueError(
                    f"document id {x!r} has a control character: Milvus matches none in its filter "
                    "expressions (get and delete could never find it again); use printable ids")
        texts = [self._meta_text(x, m) for x, m in zip(ids, metadata, strict=True)]  # check all first
        self._write(ids, vectors, metadata, texts)

    def _write(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict],
               texts: list[str]) -> None:
        """Store checked documents (``texts``: each one's metadata as JSON)."""
        raise NotImplementedError

    def _batches(self, *groups: tuple[list[dict], list[int]]) -> Iterator[list[dict]]:
        """Insert batches of each group of ``(rows, vectors per row)`` in turn (a batch never
        mixes groups), each of at most ``batch_rows`` vectors and about ``_request_bytes`` bytes
        (:func:`row_bytes`: Milvus refuses a message over 64 MiB, and each token row carries its
        document's filter JSON), with an optional progress bar."""
        from tqdm.auto import tqdm

        batches: list[list[dict]] = []
        sizes: dict[int, int] = {}
        for rows, counts in groups:
            cur: list[dict] = []
            n = nbytes = 0
            for r, c in zip(rows, counts, strict=True):
                b = row_bytes(r, sizes)
                if cur and (n + c > self.batch_rows or nbytes + b > self._request_bytes):
                    batches.append(cur)
                    cur, n, nbytes = [], 0, 0
                cur.append(r)
                n += c
                nbytes += b
            if cur:
                batches.append(cur)
        with tqdm(total=len(batches), desc=f"milvus insert {self.collection}", unit="batch",
                  disable=not self.show_progress) as bar:
            for b in batches:
                yield b
                bar.update(1)

    def _delete_versions(self, ids: Sequence[str], extra: str = "") -> None:
        # the documents collection first: a write killed between two deletes leaves token rows
        # without a document, which search ignores (it rescores stored lists) and repair()
        # removes; the other order left a document that get/count/scan return and search misses
        names = list(reversed(self._names()))
        for chunk in batched(list(ids), 500):
            expr = _ids_expr(chunk) + (f" and {extra}" if extra else "")
            for name in names:
                self.client.delete(name, filter=expr, timeout=self.timeout)

    def _delete(self, ids: list[str]) -> None:
        self._delete_versions(ids)

    # -- reads -----------------------------------------------------------------------------
    def _doc_filter(self, expr: str) -> str:
        """``expr`` restricted to the rows of the documents collection that hold a document's
        metadata, one per document (default: every row)."""
        return expr

    @serialized
    def count(self) -> int:
        res = self.client.query(self.docs_name, filter=self._doc_filter(""), output_fields=["count(*)"],
                                timeout=self.timeout)
        return int(res[0]["count(*)"]) if res else 0

    _scan_fields: ClassVar[tuple[str, ...]] = ("doc_id", "meta")
    """What :meth:`_scan` reads of each metadata row (a layout adds what :meth:`_visible` needs)."""

    def _scan(self, conditions: tuple[Node, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        """Milvus's query iterator over the metadata rows (a lock per page, not per scan); each
        page keeps the rows :meth:`_visible` says ``get`` would return, each document once."""
        expr = self._doc_filter(filter_expression(conditions))
        # a page of rows with metadata up to MAX_META_BYTES stays within the request budget
        page_rows = max(1, min(batch_size, MAX_LIMIT, self._request_bytes // (MAX_META_BYTES + ID_BYTES)))
        with self._guard:
            it = self.client.query_iterator(self.docs_name, batch_size=page_rows, filter=expr,
                                            output_fields=list(self._scan_fields), timeout=self.timeout)
        seen: set[str] = set()  # a document overwritten while the scan runs: listed once
        try:
            while True:
                with self._guard:
                    self._check_open("scan()")  # closed while the caller iterates: not the client's error
                    raw = it.next()
                    if not raw:
                        return
                    rows = self._visible(raw)
                page = []
                for r in rows:
                    if r["doc_id"] not in seen and matches(md := json.loads(r["meta"]), conditions):
                        seen.add(r["doc_id"])
                        page.append((r["doc_id"], md))
                if page:
                    yield page
        finally:
            with self._guard:
                if not self._closed:  # a closed client's iterator is gone with it
                    it.close()

    def _visible(self, rows: list[dict]) -> list[dict]:
        """The metadata rows of one scan page that ``get`` would return (default: all)."""
        return rows

    def _query_all(self, name: str, expr: str, fields: list[str], *, batch: int = 1024,
                   **level: Any) -> list[dict]:
        """Every row matching ``expr`` (paged: ``query`` returns at most 16,384 rows per call);
        ``level``: a ``consistency_level`` other than the collection's."""
        it = self.client.query_iterator(name, batch_size=batch, filter=expr, output_fields=fields,
                                        timeout=self.timeout, **level)
        out: list[dict] = []
        try:
            while True:
                page = it.next()
                if not page:
                    break
                out.extend(page)
        finally:
            it.close()
        return out

    def _all_ids(self, expr: str) -> list[str]:
        """Every document id whose metadata row passes ``expr`` (the last resort of a search)."""
        e = self._doc_filter(expr)
        return list(dict.fromkeys(r["doc_id"] for r in self._query_all(self.docs_name, e, ["doc_id"])))

    def _fetch(self, ids: Sequence[str], *, wait: bool = True) -> dict[str, _Stored]:
        """Newest complete stored list, metadata and version of each id (missing ids absent).

        ``wait=False`` reads what the server holds now (``Eventually``) instead of waiting for
        the collection's ``Strong`` consistency point: callers that know which version they
        need check it and re-read the stale ones."""
        raise NotImplementedError

    @serialized
    def _get(self, ids: list[str]) -> list[Record]:
        return [Record(x, found[0], found[1]) for x, found in self._fetch(ids).items()]

    @serialized
    def _search_batch(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
                      candidates: int | None = None, rows_per_vector: int | None = None,
                      explain: bool = False) -> list[list[Hit]]:
        n = self._given_pool(candidates, rows_per_vector, stacklevel=5)
        n = getattr(self, self.pool_option) if n is None else n
        return [self._search_one(q, k, conditions, n, explain) for q in queries]


    def _search_one(self, q: np.ndarray, k: int, conditions: tuple[Node, ...], pool: int,
                    explain: bool) -> list[Hit]:
        """One query with this layout's pool option ``pool`` (:attr:`pool_option`); ``explain``
        is passed on to :meth:`_rescore`."""
        raise NotImplementedError

    def _rescore(self, q: np.ndarray, ids: Sequence[str], k: int, conditions: tuple[Node, ...],
                 cache: dict[str, _Stored | None] | None = None,
                 upper: dict[str, float] | None = None,
                 seen: dict[str, int] | None = None, explain: bool = False) -> tuple[list[Hit], float]:
        """Exact MaxSim over ``ids`` (fetched in pieces); the hits and the k-th score.

        With ``upper`` (score upper bounds, ``ids`` in descending bound order) rescoring stops
        once the k-th exact score reaches the next document's bound: no later document can
        enter the top k. With ``seen`` (the row versions the search returned) lists are read
        without waiting for the consistency point; any list older than its rows, or not found,
        is read again with the collection's consistency, so a list is never staler than the
        rows that nominated it. ``explain``: each hit decomposed from the list fetched for it."""
        cache = {} if cache is None else cache

        def fetch(chunk: Sequence[str]) -> dict[str, tuple[np.ndarray, dict]]:
            missing = [x for x in chunk if x not in cache]
            if missing:
                if seen is None:
                    got = self._fetch(missing)
                else:
                    got = self._fetch(missing, wait=False)
                    stale = [x for x in missing if x not in got or got[x][2] < seen.get(x, 0)]
                    if stale:
                        got.update(self._fetch(stale))
                cache.update(got)
                cache.update((x, None) for x in missing if x not in got)
            found = {x: cache[x] for x in chunk if cache.get(x) is not None}
            return {x: (s[0], s[1]) for x, s in found.items() if matches(s[1], conditions)}  # type: ignore[index]

        # small first fetches when bounds can stop early
        cands = [(x, None if upper is None else upper[x]) for x in ids]
        hits = rerank_candidates(q, cands, fetch, k, bound_slack=_BOUND_SLACK,
                                 first=64 if upper is not None else 512,
                                 explain=self.format if explain else None)
        return hits, (hits[-1].score if len(hits) >= k else -math.inf)

    # -- maintenance -----------------------------------------------------------------------
    @serialized
    def repair(self, abandoned_after: float = 3600.0) -> int:
        """Remove what interrupted writes left behind; returns how many documents were fixed
        (0 for a layout whose writes leave nothing behind). ``abandoned_after``: seconds after
        which an unfinished write counts as interrupted, not running (see the layout's repair)."""
        return 0

    def drop(self) -> None:
        """Delete this store's collections from the server (irreversible)."""
        for n in self._names():
            if self.client.has_collection(n, timeout=self.timeout):
                self.client.drop_collection(n, timeout=self.timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._owns_client:
                self.client.close()
        finally:
            if self._on_close is not None:
                self._on_close()


