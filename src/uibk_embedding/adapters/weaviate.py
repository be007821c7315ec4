"""Weaviate (>= 1.29) as a store of tagged multi-vectors: one self-provided multi-vector, MaxSim.

Each document is one Weaviate object in one collection:

* a named multi-vector (default name ``"uibk"``, self-provided, HNSW, ``DOT`` distance,
  ``maxSim`` aggregation; optionally MUVERA-encoded, Weaviate >= 1.31) holding the tagged list;
* ``uibk_id`` (text): the original string id. The object's UUID is derived from it
  deterministically (:func:`object_uuid`), so upserting an id again overwrites the object;
* ``uibk_metadata`` (text, not indexed): the metadata dict as JSON, returned unchanged;
* ``uibk_terms`` (text[], ``field`` tokenization, filterable): one typed term per scalar
  metadata value (:func:`filter_term`), which is what filters match. Because every term carries
  the field name *and* the JSON type of the value, ``True`` never matches ``1``, ``"1"`` never
  matches ``1``, ``1`` matches ``1.0`` and a field a document lacks never matches: exactly the
  semantics of :mod:`~uibk_embedding.adapters.filters`, whatever the user's field names are.

Score convention. For ``DOT`` Weaviate's distance between two vectors is the negated dot product,
and for a multi-vector with ``maxSim`` aggregation the server adds up, over the query vectors,
the smallest distance to any document vector (``lateInteractionScore`` in
``adapters/repos/db/vector/hnsw`` of the server source): the reported distance is therefore
``-MaxSim`` and :func:`distance_to_score` negates it. This is read from the source, **not yet
verified against a live server**: ``tests/test_weaviate.py::test_live_distance_is_negated_maxsim``
checks it when ``WEAVIATE_URL`` is set. With ``rerank=True`` the store does not depend on the
convention at all: it fetches candidates with their vectors and scores them with exact MaxSim.

Search is approximate (HNSW, and MUVERA when enabled): the store declares ``exact = False``.

The collection configuration is built with the real client classes and can be inspected
without a server:

>>> spec = collection_spec("Docs", muvera={"ksim": 4})
>>> cfg = spec["vector_config"]._to_dict()["vectorIndexConfig"]
>>> cfg["distance"], cfg["multivector"]["aggregation"], cfg["multivector"]["muvera"]["ksim"]
('dot', 'maxSim', 4)
>>> [p.name for p in spec["properties"]]
['uibk_id', 'uibk_metadata', 'uibk_terms']

Filters become conditions on ``uibk_terms``:

>>> filter_term("lang", "en"), filter_term("year", 2024.0), filter_term("ok", True)
('["lang","en"]', '["year",2024]', '["ok",true]')

Against a server (``client=`` an existing v4 client, ``url=`` or ``host=``):

>>> store = WeaviateStore("Docs", url="http://localhost:8080")  # doctest: +SKIP
>>> store.upsert(["a"], [doc], [{"lang": "en"}])  # doctest: +SKIP
>>> store.search(query, k=10, filter={"lang": "en"})  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar
from urllib.parse import urlsplit

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding.adapters.base import (
    Hit,
    MultiVectorStore,
    Record,
    check_positive,
    finite_score,
    record_problems,
)
from uibk_embedding.adapters.common import batched, exact_number, parse_version
from uibk_embedding.adapters.filters import And, Node, Not, Or, matches
from uibk_embedding.adapters.rerank import check_rerank_options, rerank_candidates
from uibk_embedding.errors import BackendUnavailable, CollectionMismatch, ServerTooOld, StoreNotFound
from uibk_embedding.tagged import DIM, TaggedFormat, decompose

DEFAULT_COLLECTION = "UibkEmbedding"
VECTOR_NAME = "uibk"
PROP_ID = "uibk_id"
PROP_METADATA = "uibk_metadata"
PROP_TERMS = "uibk_terms"
#: the namespace of :func:`object_uuid` (fixed: changing it would orphan stored objects)
UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "uibk-embedding/weaviate/object-id")
MIN_VERSION = (1, 29, 0)  # self-provided multi-vectors
MUVERA_MIN_VERSION = (1, 31, 0)
MAX_TERM_CHARS = 256  # longer filter terms are stored and matched as a SHA-256 digest
MUVERA_KEYS = ("ksim", "dprojections", "repetitions")
FORMAT_MARKER = "uibk_embedding_format"  # key of the tagged format in the collection description

_PURPOSE = "the Weaviate adapter"


def _wv() -> Any:
    return require("weaviate", "weaviate", _PURPOSE)


# -- ids, filter terms, payload ---------------------------------------------------------------
def object_uuid(doc_id: str) -> str:
    """The deterministic Weaviate UUID of a string id (UUIDv5 in a fixed namespace).

    >>> object_uuid("doc-1") == object_uuid("doc-1"), object_uuid("doc-1") == object_uuid("doc-2")
    (True, False)
    >>> object_uuid("doc-1")
    'c76dda23-1bcc-5e4e-b9a8-f24da1c29c4f'
    """
    return str(uuid.uuid5(UUID_NAMESPACE, doc_id))


def filter_term(field: str, value: Any) -> str:
    """The indexed term for ``field == value``: compact JSON ``[field, value]`` (typed).

    Terms longer than 256 characters are replaced by ``"sha256:<hex digest>"`` of the JSON
    (the same on the write and the query side), so long values stay filterable.

    >>> filter_term("n", 1) == filter_term("n", 1.0), filter_term("n", 1) == filter_term("n", True)
    (True, False)
    >>> filter_term('say "hi"', "ü")
    '["say \\\\"hi\\\\"","ü"]'
    >>> filter_term("t", "x" * 300)[:7]
    'sha256:'
    """
    if isinstance(value, bool) or isinstance(value, str) or isinstance(value, int):
        v = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"filter on {field!r}: value {value} is not a finite number")
        v = exact_number(value)
    else:
        raise TypeError(f"{field!r}: only str, int, float and bool values are filterable")
    term = json.dumps([field, v], ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if len(term) > MAX_TERM_CHARS:
        term = "sha256:" + hashlib.sha256(term.encode("utf-8")).hexdigest()
    return term


def metadata_terms(metadata: Mapping[str, Any]) -> list[str]:
    """The filter terms of one metadata dict: one per top-level scalar value.

    Lists, dicts and ``None`` are stored (in ``uibk_metadata``) but not filterable, exactly as
    the reference filter semantics never match them.

    >>> metadata_terms({"lang": "en", "tags": ["a"], "year": 2024, "x": None})
    ['["lang","en"]', '["year",2024]']
    """
    out = []
    for key, value in metadata.items():
        if isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
            out.append(filter_term(key, value))
    return out


def object_properties(doc_id: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The Weaviate properties stored for one document.

    >>> object_properties("a", {"lang": "en"})
    {'uibk_id': 'a', 'uibk_metadata': '{"lang":"en"}', 'uibk_terms': ['["lang","en"]']}
    """
    return {
        PROP_ID: doc_id,
        PROP_METADATA: json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), allow_nan=False),
        PROP_TERMS: metadata_terms(metadata),
    }


def data_objects(ids: list[str], vectors: list[np.ndarray], metadata: list[dict],
                 vector_name: str = VECTOR_NAME) -> list[Any]:
    """The ``weaviate`` ``DataObject`` list an upsert sends (input already validated).

    >>> import numpy as np
    >>> obj = data_objects(["a"], [np.eye(4, 128, dtype=np.float32)], [{}])[0]
    >>> obj.uuid == object_uuid("a"), len(obj.vector["uibk"]), obj.properties["uibk_terms"]
    (True, 4, [])
    """
    DataObject = _wv().classes.data.DataObject
    return [
        DataObject(properties=object_properties(i, m), uuid=object_uuid(i),
                   vector={vector_name: np.asarray(v, dtype=np.float32).tolist()})
        for i, v, m in zip(ids, vectors, metadata, strict=True)
    ]


WEAVIATE_OPERATORS = frozenset({"$eq", "$ne", "$in", "$nin", "$and", "$or", "$not"})
"""What the typed terms answer exactly. Ranges (``$gt`` ...) and ``$exists`` are refused: the
terms hold ``[field, value]`` pairs, which have no order and do not record a field's presence
(a range would need a numeric property per metadata field in the collection's schema)."""

NEGATION_MIN_VERSION = (1, 33, 0)  # the ContainsNone and Not filter operators
QUERY_MAXIMUM_RESULTS = 10_000  # Weaviate's default cap on offset + limit of one query


def server_operators(version: str) -> frozenset[str]:
    """The filter operators a Weaviate server of ``version`` answers: ``$ne``, ``$nin`` and
    ``$not`` need its ContainsNone and Not operators (1.33); before, they are refused on this
    side (an older server fails the query, or ignores a ``Not``).

    >>> sorted(WEAVIATE_OPERATORS - server_operators("1.29.2"))
    ['$ne', '$nin', '$not']
    >>> server_operators("1.33.0") == WEAVIATE_OPERATORS
    True
    """
    if parse_version(version) >= NEGATION_MIN_VERSION:
        return WEAVIATE_OPERATORS
    return WEAVIATE_OPERATORS - {"$ne", "$nin", "$not"}


def wants_muvera(muvera: bool | Mapping[str, int] | None) -> bool | None:
    """``muvera=`` as on/off (``None``: either): a dict, even ``{}``, turns it on.

    >>> wants_muvera({}), wants_muvera(False), wants_muvera(None)
    (True, False, None)
    """
    return None if muvera is None else muvera is not False


_NO_TERM = "[]"  # a term no document carries (every stored term is a [field, value] pair)


def to_weaviate_filter(conditions: tuple[Node, ...]) -> Any:
    """Parsed filter conditions as one Weaviate filter (``None`` for no conditions).

    A field condition becomes ``uibk_terms`` *contains any* of its typed terms (*contains none*
    for ``$ne``/``$nin``, which a document without the field passes, as in
    :func:`~uibk_embedding.adapters.filters.matches`); ``$and``/``$or``/``$not`` become
    *all of*/*any of*/*not*.

    >>> from uibk_embedding.adapters.filters import parse_filter
    >>> f = to_weaviate_filter(parse_filter({"lang": {"$in": ["en", "de"]}}))
    >>> f.target, f.operator.value, f.value
    ('uibk_terms', 'ContainsAny', ['["lang","en"]', '["lang","de"]'])
    >>> f = to_weaviate_filter(parse_filter({"lang": {"$ne": "en"}}))
    >>> f.operator.value, f.value
    ('ContainsNone', ['["lang","en"]'])
    >>> to_weaviate_filter(parse_filter({"$or": [{}, {"lang": "en"}]})) is None  # everything
    True
    """
    return _weaviate_node(And(tuple(conditions)))


def _weaviate_node(n: Node) -> Any:
    """One node as a Weaviate filter; ``None`` for a node every document passes (``{}``),
    which an ``$and`` leaves out and which makes an ``$or`` pass everything."""
    Filter = _wv().classes.query.Filter
    terms = Filter.by_property(PROP_TERMS)
    if isinstance(n, And | Or):
        parts = [_weaviate_node(c) for c in n.children]
        if isinstance(n, Or) and None in parts:
            return None
        parts = [p for p in parts if p is not None]
        if len(parts) <= 1:
            return parts[0] if parts else None
        return Filter.all_of(parts) if isinstance(n, And) else Filter.any_of(parts)
    if isinstance(n, Not):
        inner = _weaviate_node(n.child)  # not everything: a term no document carries
        return terms.contains_any([_NO_TERM]) if inner is None else Filter.not_(inner)
    values = list(dict.fromkeys(filter_term(n.field, v) for v in n.values))
    return terms.contains_any(values) if n.op in ("$eq", "$in") else terms.contains_none(values)


def distance_to_score(distance: float) -> float:
    """MaxSim from the distance Weaviate reports for a ``DOT`` + ``maxSim`` multi-vector.

    Weaviate's DOT distance is ``-dot`` and the multi-vector distance sums, per query vector,
    the smallest distance: it is ``-MaxSim`` (read from the server source; not yet verified
    against a live server).

    >>> distance_to_score(-12.5)
    12.5
    """
    return -finite_score(distance)


# -- collection configuration -----------------------------------------------------------------
def _muvera_encoding(muvera: bool | Mapping[str, int] | None) -> Any:
    if muvera is None or muvera is False:
        return None
    cfg = _wv().classes.config.Configure
    if muvera is True:
        return cfg.VectorIndex.MultiVector.Encoding.muvera()
    if not isinstance(muvera, Mapping):
        raise TypeError(f"muvera must be a bool or a dict of {MUVERA_KEYS}, got {type(muvera).__name__}")
    unknown = set(muvera) - set(MUVERA_KEYS)
    if unknown:
        raise ValueError(f"unknown MUVERA options {sorted(unknown)}; known: {list(MUVERA_KEYS)}")
    return cfg.VectorIndex.MultiVector.Encoding.muvera(**dict(muvera))


def vector_config(
    name: str = VECTOR_NAME,
    *,
    muvera: bool | Mapping[str, int] | None = None,
    ef: int | None = None,
    ef_construction: int | None = None,
    max_connections: int | None = None,
) -> Any:
    """The named multi-vector: self-provided, HNSW, DOT distance, MaxSim aggregation.

    ``muvera``: ``True`` or a dict of ``ksim``/``dprojections``/``repetitions`` enables
    MUVERA encoding (Weaviate >= 1.31). ``ef``, ``ef_construction``, ``max_connections``:
    HNSW parameters (``None``: the server's defaults).

    >>> sorted(vector_config(ef=256)._to_dict()["vectorIndexConfig"].items())
    [('distance', 'dot'), ('ef', 256), ('multivector', {'enabled': True, 'aggregation': 'maxSim'})]
    """
    cfg = _wv().classes.config
    aggregation = require(
        "weaviate.collections.classes.config_vector_index", "weaviate", _PURPOSE
    ).MultiVectorAggregation.MAX_SIM
    return cfg.Configure.MultiVectors.self_provided(
        name=name,
        encoding=_muvera_encoding(muvera),
        vector_index_config=cfg.Configure.VectorIndex.hnsw(
            distance_metric=cfg.VectorDistances.DOT,
            ef=ef,
            ef_construction=ef_construction,
            max_connections=max_connections,
        ),
        multi_vector_config=cfg.Configure.VectorIndex.MultiVector.multi_vector(aggregation=aggregation),
    )


def collection_properties() -> list[Any]:
    """The three properties the store needs (see the module docstring)."""
    cfg = _wv().classes.config
    return [
        cfg.Property(name=PROP_ID, data_type=cfg.DataType.TEXT, tokenization=cfg.Tokenization.FIELD,
                     index_filterable=True, index_searchable=False),
        cfg.Property(name=PROP_METADATA, data_type=cfg.DataType.TEXT, index_filterable=False,
                     index_searchable=False),
        cfg.Property(name=PROP_TERMS, data_type=cfg.DataType.TEXT_ARRAY,
                     tokenization=cfg.Tokenization.FIELD, index_filterable=True, index_searchable=False),
    ]


def collection_spec(name: str = DEFAULT_COLLECTION, *, vector_name: str = VECTOR_NAME,
                    format: TaggedFormat | None = None, **vector_options: Any) -> dict[str, Any]:
    """Keyword arguments for ``client.collections.create`` (``vector_options``: see
    :func:`vector_config`). The tagged ``format`` is recorded in the collection's description
    and checked on reopen. See the module docstring for an example."""
    return {
        "name": name,
        "description": json.dumps({FORMAT_MARKER: (format or TaggedFormat()).to_stored()}, sort_keys=True),
        "properties": collection_properties(),
        "vector_config": vector_config(vector_name, **vector_options),
    }


def saved_format(config: Any) -> TaggedFormat | None:
    """The tagged format recorded in a collection's description (None: none recorded, or not
    readable: :func:`collection_problems` names that)."""
    return _format_record(config, None)[0]


def _format_record(config: Any, format: TaggedFormat | None) -> tuple[TaggedFormat | None, list[str]]:
    """:func:`~uibk_embedding.adapters.base.record_problems` on the record in the collection's
    description. A collection whose description holds no record (one created without
    :func:`collection_spec`) is accepted: it has no format to conflict with."""
    try:
        record = json.loads(config.description or "")
    except ValueError:
        record = None
    if not isinstance(record, Mapping) or FORMAT_MARKER not in record:
        return None, []
    return record_problems(record, format, key=None, format_key=FORMAT_MARKER)


def _enum_value(x: Any) -> Any:
    return getattr(x, "value", x)


def collection_problems(config: Any, vector_name: str = VECTOR_NAME,
                        muvera: bool | Mapping[str, int] | None = None,
                        format: TaggedFormat | None = None) -> list[str]:
    """What makes an existing collection (its ``collection.config.get()``) unusable, if anything.

    ``muvera=None`` accepts either; ``True``/``False``/a dict demand MUVERA on/off.
    The collection is never changed: the caller reports these problems.
    """
    problems = _format_record(config, format)[1]
    if getattr(config.multi_tenancy_config, "enabled", False):
        problems.append("multi-tenancy is enabled (the store does not pass tenants)")
    named = config.vector_config or {}
    if vector_name not in named:
        have = sorted(named) or "none"
        problems.append(f"no named vector {vector_name!r} (named vectors: {have})")
    else:
        nv = named[vector_name]
        vz = _enum_value(nv.vectorizer.vectorizer)
        if vz != "none":
            problems.append(f"vector {vector_name!r} uses vectorizer {vz!r}; "
                            "it must be self-provided ('none')")
        idx = nv.vector_index_config
        kind = idx.vector_index_type() if hasattr(idx, "vector_index_type") else type(idx).__name__
        if kind != "hnsw":
            problems.append(f"vector {vector_name!r} has index type {kind!r}; it must be 'hnsw'")
        dist = _enum_value(getattr(idx, "distance_metric", None))
        if dist != "dot":
            problems.append(f"vector {vector_name!r} uses distance {dist!r}; it must be 'dot' "
                            "(cosine renormalises and breaks the dense weight)")
        mv = getattr(idx, "multi_vector", None)
        if mv is None:
            problems.append(f"vector {vector_name!r} is not a multi-vector")
        else:
            if _enum_value(mv.aggregation) != "maxSim":
                problems.append(f"vector {vector_name!r} aggregates with {mv.aggregation!r}; "
                                "it must be 'maxSim'")
            has_muvera = mv.encoding is not None and mv.encoding.enabled is not False
            wanted = wants_muvera(muvera)
            if wanted is not None and wanted != has_muvera:
                problems.append(f"MUVERA is {'on' if has_muvera else 'off'} in the collection but "
                                f"{'on' if wanted else 'off'} was asked for")
    props = {p.name: p for p in (config.properties or [])}
    want = {PROP_ID: "text", PROP_METADATA: "text", PROP_TERMS: "text[]"}
    for pname, dtype in want.items():
        p = props.get(pname)
        if p is None:
            problems.append(f"property {pname!r} ({dtype}) is missing")
            continue
        got = _enum_value(p.data_type)
        if got != dtype:
            problems.append(f"property {pname!r} has data type {got!r}; it must be {dtype!r}")
        if pname in (PROP_ID, PROP_TERMS):
            if not p.index_filterable:
                problems.append(f"property {pname!r} must be filterable (index_filterable=True)")
            tok = _enum_value(p.tokenization)
            if tok != "field":
                problems.append(f"property {pname!r} has tokenization {tok!r}; it must be 'field'")
    return problems


# -- connection ---------------------------------------------------------------------------
def connection_kwargs(url: str, *, grpc_port: int | None = None, grpc_host: str | None = None) -> dict:
    """Arguments for ``weaviate.connect_to_custom`` from an HTTP(S) URL.

    The gRPC host defaults to the HTTP host; the gRPC port to 50051 (443 for an ``https`` URL
    whose gRPC host is another one, such as ``grpc-<host>``); gRPC is secure when the URL is
    ``https``. One host cannot serve HTTP and gRPC on one port (the client refuses it): that is
    a ``ValueError`` naming both.

    >>> connection_kwargs("http://10.0.0.5:8081")
    {'http_host': '10.0.0.5', 'http_port': 8081, 'http_secure': False, 'grpc_host': '10.0.0.5', \
'grpc_port': 50051, 'grpc_secure': False}
    >>> connection_kwargs("https://wv.example.org", grpc_host="grpc-wv.example.org")["grpc_port"]
    443
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url must look like http://host:8080 or https://host, got {url!r}")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError(f"url must have no path or query (got {url!r}); the client adds /v1 itself")
    secure = parts.scheme == "https"
    http_port, grpc_host = parts.port or (443 if secure else 80), grpc_host or parts.hostname
    if grpc_port is None:
        grpc_port = 443 if secure and grpc_host != parts.hostname else 50051
    if (grpc_host, int(grpc_port)) == (parts.hostname, http_port):
        raise ValueError(f"HTTP and gRPC cannot share {grpc_host}:{http_port}: give grpc_port= or "
                         "grpc_host= (on Weaviate Cloud use cloud=True)")
    return {"http_host": parts.hostname, "http_port": http_port, "http_secure": secure,
            "grpc_host": grpc_host, "grpc_port": int(grpc_port), "grpc_secure": secure}


class WeaviateBatchError(RuntimeError):
    """Some objects of an upsert were not written. ``failed`` maps id -> Weaviate's message,
    ``written`` lists the ids that were written (and are now stored), ``not_attempted`` the ids
    not sent because the connection failed."""

    def __init__(self, failed: dict[str, str], written: list[str], not_attempted: list[str]):
        self.failed, self.written, self.not_attempted = failed, written, not_attempted
        shown = "; ".join(f"{k!r}: {v}" for k, v in list(failed.items())[:5])
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        tail = f"; {len(not_attempted)} not attempted" if not_attempted else ""
        super().__init__(
            f"Weaviate rejected {len(failed)} of {len(failed) + len(written) + len(not_attempted)} "
            f"objects: {shown}{more}; {len(written)} were written{tail}"
        )


# -- the store ---------------------------------------------------------------------------------
class WeaviateStore(MultiVectorStore):
    """Tagged multi-vectors in a Weaviate (>= 1.29) collection; MaxSim by the server.

    Parameters
    ----------
    collection:
        Collection name (Weaviate capitalises its first letter). Created with
        :func:`collection_spec` if it does not exist (and ``create=True``); an existing one is
        checked with :func:`collection_problems` and refused with a precise message, never changed.
    client:
        An open ``weaviate.WeaviateClient`` (not closed by :meth:`close`). Otherwise the store
        connects itself, with ``url=`` (``connect_to_custom``, or ``connect_to_weaviate_cloud``
        with ``cloud=True``) or ``host=`` (``connect_to_local``), and ``api_key``/``headers``.
    vector_name, muvera, ef, ef_construction, max_connections:
        The named multi-vector's configuration (see :func:`vector_config`).
    rerank, candidates:
        With ``rerank=True``, score the ``candidates`` (default ``4 * k``, at least ``k``) hits
        Weaviate returns with exact MaxSim on their stored vectors and keep the best ``k``
        (:func:`~uibk_embedding.adapters.rerank.rerank_candidates`; scores then never depend on
        Weaviate's distance convention). **Off by default**, unlike the other candidate-finding
        stores (Milvus, pgvector with ``exact=False``, PLAID, WARP), which always rerank: without
        it the hits and scores are Weaviate's own MaxSim (HNSW, or MUVERA). Both are also
        per-query options: ``search(q, k, rerank=True, candidates=200)``.
    batch_size, max_rows_per_request:
        Upserts go in requests of at most this many objects / vector rows.
    timeout:
        Seconds for connecting (an unreachable server fails with ``ConnectionError`` after this)
        and for each query; inserts get at least 90 s.

    Example (needs a server)::

        store = WeaviateStore("Docs", url="http://localhost:8080")
        store.upsert(ids, lists, metadata)
        hits = store.search(query, k=10, filter={"lang": "en"})
    """

    backend: ClassVar[str] = "weaviate"
    filter_operators = WEAVIATE_OPERATORS
    exact: ClassVar[bool] = False
    search_options: ClassVar[tuple[str, ...]] = ("rerank", "candidates")

    def __init__(
        self,
        collection: str = DEFAULT_COLLECTION,
        *,
        client: Any = None,
        url: str | None = None,
        host: str | None = None,
        port: int = 8080,
        grpc_port: int | None = None,
        grpc_host: str | None = None,
        api_key: str | None = None,
        cloud: bool = False,
        headers: Mapping[str, str] | None = None,
        vector_name: str = VECTOR_NAME,
        muvera: bool | Mapping[str, int] | None = None,
        ef: int | None = None,
        ef_construction: int | None = None,
        max_connections: int | None = None,
        create: bool = True,
        rerank: bool = False,
        candidates: int | None = None,
        batch_size: int = 64,
        max_rows_per_request: int = 32768,
        timeout: float = 30.0,
        format: TaggedFormat | None = None,
    ) -> None:
        super().__init__(format)
        self._given_format = format
        if not isinstance(collection, str) or not collection:
            raise ValueError("collection must be a non-empty string")
        check_positive("batch_size", batch_size)
        check_positive("max_rows_per_request", max_rows_per_request)
        check_rerank_options(rerank=rerank, candidates=candidates)
        self.vector_name, self.where = vector_name, collection  # where: the name messages give
        self.rerank, self.candidates = bool(rerank), candidates
        self.batch_size, self.max_rows_per_request = int(batch_size), int(max_rows_per_request)
        self._guard = threading.RLock()  # a delete by filter lists, then deletes
        wv = _wv()
        self._owns_client = client is None
        if client is None:
            where = url or f"{host}:{port}"
            try:
                client = self._connect(wv, url=url, host=host, port=port, grpc_port=grpc_port,
                                       grpc_host=grpc_host, api_key=api_key, cloud=cloud,
                                       headers=headers, timeout=timeout)
            except wv.exceptions.WeaviateBaseError as e:
                raise BackendUnavailable(
                    f"cannot connect to Weaviate at {where!r} within {timeout:g} s: {e}; check the "
                    "URL, the ports (HTTP and gRPC), the network and the timeout") from None
        elif url is not None or host is not None:
            raise ValueError("give either client= or url=/host=, not both")
        self._client = client
        try:
            self._check_version(muvera)
            self._collection = self._open_collection(
                collection, create=create, muvera=muvera, ef=ef, ef_construction=ef_construction,
                max_connections=max_connections)
        except BaseException:
            self.close()
            raise

    # setup -----------------------------------------------------------------------------------
    @staticmethod
    def _connect(wv: Any, *, url: str | None, host: str | None, port: int, grpc_port: int | None,
                 grpc_host: str | None, api_key: str | None, cloud: bool,
                 headers: Mapping[str, str] | None, timeout: float = 30.0) -> Any:
        auth = wv.classes.init.Auth.api_key(api_key) if api_key else None
        extra = wv.classes.init.AdditionalConfig(
            timeout=wv.classes.init.Timeout(init=timeout, query=timeout, insert=max(timeout, 90)))
        hdrs = dict(headers) if headers else None
        if url is not None and host is not None:
            raise ValueError("give url= or host=, not both")
        if cloud:
            if url is None or auth is None:
                raise ValueError("cloud=True needs url= (the cluster URL) and api_key=")
            return wv.connect_to_weaviate_cloud(cluster_url=url, auth_credentials=auth, headers=hdrs,
                                                additional_config=extra)
        if url is not None:
            return wv.connect_to_custom(**connection_kwargs(url, grpc_port=grpc_port, grpc_host=grpc_host),
                                        headers=hdrs, auth_credentials=auth, additional_config=extra)
        if host is not None:
            return wv.connect_to_local(host=host, port=port, grpc_port=grpc_port or 50051, headers=hdrs,
                                       auth_credentials=auth, additional_config=extra)
        raise ValueError("WeaviateStore needs client=, url= or host=")

    def _check_version(self, muvera: Any) -> None:
        version = str(self._client.get_meta().get("version", "0"))
        v = parse_version(version)
        if v < MIN_VERSION:
            raise ServerTooOld(f"Weaviate {version} has no self-provided multi-vectors; "
                               f"version >= {'.'.join(map(str, MIN_VERSION))} is needed")
        self.filter_operators = server_operators(version)
        if wants_muvera(muvera) and v < MUVERA_MIN_VERSION:
            raise ServerTooOld(f"MUVERA encoding needs Weaviate >= "
                               f"{'.'.join(map(str, MUVERA_MIN_VERSION))}; the server runs {version}")

    def _open_collection(self, name: str, *, create: bool, muvera: Any, **hnsw: Any) -> Any:
        cols = self._client.collections
        if cols.exists(name):
            col = cols.get(name)
            config = col.config.get()
            problems = collection_problems(config, self.vector_name, muvera, self._given_format)
            if problems:
                raise CollectionMismatch(
                    f"Weaviate collection {name!r} cannot hold tagged multi-vectors (it was not "
                    "changed): " + "; ".join(problems)
                    + ". Use another collection name, or create it with "
                    "uibk_embedding.adapters.weaviate.collection_spec()."
                )
            self.format = saved_format(config) or self.format
            return col
        if not create:
            raise StoreNotFound(f"Weaviate collection {name!r} does not exist (create=False); "
                                     "nothing was created")
        return cols.create(**collection_spec(name, vector_name=self.vector_name, format=self.format,
                                             muvera=muvera, **hnsw))

    @property
    def collection(self) -> Any:
        """The underlying ``weaviate`` collection object."""
        return self._collection

    def drop(self) -> None:
        """Delete the whole collection on the server (irreversible)."""
        self._client.collections.delete(self._collection.name)

    # writes ----------------------------------------------------------------------------------
    def _chunks(self, ids: list[str], vectors: list[np.ndarray]) -> list[list[int]]:
        chunks: list[list[int]] = []
        cur: list[int] = []
        rows = 0
        for i, v in enumerate(vectors):
            if cur and (len(cur) >= self.batch_size or rows + len(v) > self.max_rows_per_request):
                chunks.append(cur)
                cur, rows = [], 0
            cur.append(i)
            rows += len(v)
        if cur:
            chunks.append(cur)
        return chunks

    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        all_failed = _wv().exceptions.WeaviateInsertManyAllFailedError
        failed: dict[str, str] = {}
        written: list[str] = []
        chunks = self._chunks(ids, vectors)
        for n, chunk in enumerate(chunks):
            objs = data_objects([ids[i] for i in chunk], [vectors[i] for i in chunk],
                                [metadata[i] for i in chunk], self.vector_name)
            try:
                res = self._collection.data.insert_many(objs)
            except all_failed as e:
                failed.update({ids[i]: str(e) for i in chunk})
                continue
            except Exception as e:
                rest = [ids[i] for c in chunks[n:] for i in c]
                raise WeaviateBatchError(failed, written, rest) from e
            for j, i in enumerate(chunk):
                if j in res.errors:
                    failed[ids[i]] = res.errors[j].message
                else:
                    written.append(ids[i])
        if failed:
            raise WeaviateBatchError(failed, written, [])

    def _delete(self, ids: list[str]) -> None:
        Filter = _wv().classes.query.Filter
        for s in range(0, len(ids), 1000):
            uuids = [object_uuid(x) for x in ids[s:s + 1000]]
            res = self._collection.data.delete_many(where=Filter.by_id().contains_any(uuids))
            if res.failed:
                raise RuntimeError(f"Weaviate failed to delete {res.failed} of {len(uuids)} objects")

    # reads ---------------------------------------------------------------------------------
    def _vectors_of(self, obj: Any) -> np.ndarray:
        vec = obj.vector
        if isinstance(vec, Mapping):
            vec = vec.get(self.vector_name)
        arr = np.asarray(vec, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != DIM:
            raise RuntimeError(f"object {obj.uuid}: expected an (n, {DIM}) multi-vector "
                               f"{self.vector_name!r}, got shape {arr.shape}")
        return arr

    @staticmethod
    def _id_and_metadata(obj: Any) -> tuple[str, dict]:
        """An object written by another tool has no ``uibk_id``: it shows up under its UUID."""
        props = obj.properties or {}
        return props.get(PROP_ID) or str(obj.uuid), json.loads(props.get(PROP_METADATA) or "{}")

    def _record(self, obj: Any) -> Record:
        doc_id, md = self._id_and_metadata(obj)
        return Record(doc_id, self._vectors_of(obj), md)

    def _get(self, ids: list[str]) -> list[Record]:
        found = []
        for part in batched(ids, 256):
            res = self._collection.query.fetch_objects_by_ids(
                [object_uuid(x) for x in part], limit=len(part), include_vector=[self.vector_name],
                return_properties=[PROP_ID, PROP_METADATA])
            found += map(self._record, res.objects)
        return found

    def _scan(self, conditions: tuple[Node, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        """Weaviate's cursor iterator over every object (it takes no filter: the conditions are
        checked on the stored metadata, with the library's exact type semantics)."""
        page: list[tuple[str, dict]] = []
        for obj in self._collection.iterator(include_vector=False, return_properties=[PROP_ID, PROP_METADATA],
                                             cache_size=batch_size):
            doc_id, md = self._id_and_metadata(obj)
            if matches(md, conditions):
                page.append((doc_id, md))
                if len(page) >= batch_size:
                    yield page
                    page = []
        if page:
            yield page

    def count(self) -> int:
        """Number of objects in the collection."""
        return int(self._collection.aggregate.over_all(total_count=True).total_count or 0)

    def _search(self, query: np.ndarray, k: int, conditions: tuple[Node, ...],
                rerank: bool | None = None, candidates: int | None = None,
                explain: bool = False) -> list[Hit]:
        MetadataQuery = _wv().classes.query.MetadataQuery
        rerank, pool, _ = check_rerank_options(rerank, candidates)
        pool = self.candidates if pool is None else pool
        rerank = self.rerank if rerank is None else rerank
        # the rerank pool stays within the server's default QUERY_MAXIMUM_RESULTS (a larger
        # limit fails the whole query); k itself is the caller's, past it the server refuses
        limit = max(k, min(pool or 4 * k, QUERY_MAXIMUM_RESULTS)) if rerank else k
        res = self._collection.query.near_vector(
            near_vector=query.astype(np.float32).tolist(),
            target_vector=self.vector_name,
            limit=limit,
            filters=to_weaviate_filter(conditions),
            return_metadata=MetadataQuery(distance=True),
            return_properties=[PROP_ID, PROP_METADATA],
            include_vector=[self.vector_name] if rerank or explain else False,
        )
        found = [(*self._id_and_metadata(obj), obj) for obj in res.objects]
        if not rerank:
            hits = [Hit(doc_id, distance_to_score(obj.metadata.distance), md)
                    for doc_id, md, obj in found][:k]
            if explain:
                for h, (_, _, obj) in zip(hits, found, strict=False):
                    h.decomposition = decompose(query, self._vectors_of(obj), self.format)
            return hits
        # the candidates came with their vectors: the rerank's fetch is a lookup, in one piece
        stored = {doc_id: (self._vectors_of(obj), md) for doc_id, md, obj in found}
        return rerank_candidates(query, [(doc_id, None) for doc_id, _, _ in found],
                                 lambda ids: {x: stored[x] for x in ids}, k, first=max(1, len(found)),
                                 explain=self.format if explain else None)

    def _search_explained(self, q: np.ndarray, k: int, conditions: tuple[Node, ...],
                          **options: Any) -> list[Hit]:
        """The search returns the hits' vectors: each hit is decomposed from them (no second read)."""
        return self._search(q, k, conditions, explain=True, **options)

    def close(self) -> None:
        """Close the connection if the store opened it (a given ``client`` stays open)."""
        client, self._client = getattr(self, "_client", None), None
        if client is not None and self._owns_client:
            client.close()
