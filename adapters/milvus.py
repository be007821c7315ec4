"""Milvus adapter: tagged multi-vectors on every Milvus, from Milvus Lite to a cluster.

Two layouts behind one class, :class:`MilvusStore`:

``token_rows`` (default; every Milvus, Milvus Lite included)
    Two collections. ``<name>_rows`` holds one row per vector (document id, version, 128-d
    ``FLOAT_VECTOR`` with the ``IP`` metric, type-tagged filter values); ``<name>_docs`` holds
    each document's whole tagged list as float32 bytes (base64 in ``VARCHAR`` parts of 64 vectors;
    long documents span several parts) plus its metadata. A base64 part decodes ~100x faster than
    an ``ARRAY<FLOAT>`` (whose ``max_capacity`` Milvus caps at 4096 floats, 32 vectors) and holds
    twice as many vectors.
    A search sends every query vector (slots included) to the row index, takes the union of the
    documents owning the ``candidates`` nearest rows of each query vector, fetches their lists and
    rescores them with exact MaxSim, best score bound first (a candidate's bound takes, per query
    vector, its best returned row or else the last returned score), stopping once the k-th exact
    score reaches the next bound. Scores are therefore always exact MaxSim; the ranking is exact
    when the candidate union contains the true top-k and the row search is exhaustive. Only the
    row search waits for ``Strong`` consistency; lists are read without waiting and re-read if
    older than the rows that nominated them.

    ``exact=True`` (needs ``index_type="FLAT"``, an exhaustive row search) makes that a
    guarantee: a document outside the union can score at most the sum, over query vectors, of
    the score of the last row returned for it (the threshold-algorithm bound). When the k-th
    rescored score reaches that bound, the top-k is provably exact; otherwise the search
    deepens (x4, up to Milvus' 16,384 limit) and, if still unproven, rescores every stored
    document that passes the filter. With the default ``exact=False`` the budget is a plain
    recall/latency knob (see ``benchmarks/milvus_budget.py``).

``embedding_list`` (Milvus >= 2.6.4 only)
    One collection with an ``ARRAY<STRUCT{FLOAT_VECTOR}>`` field indexed with ``MAX_SIM_IP``
    and searched with ``EmbeddingList`` queries; the ``candidates`` best documents are rescored
    exactly. Older servers and Milvus Lite are refused with a clear message (Lite 3.x silently
    drops struct fields and rejects ``MAX_SIM``).

Writes (``upsert``): each call writes a new *version* of its documents (document parts first,
then rows), then deletes older versions. Readers only use the newest *complete* version of a
document (every part present), so a crash between the steps leaves each document either at its
old or its new content, never a mix; leftovers of the older version (count may overcount, old
rows may still nominate the document as a candidate) are removed by the next write of that id
or by :meth:`MilvusStore.repair`.

Filters become Milvus boolean expressions over a JSON field that stores each metadata value
with its type (strings as ``"s<text>"``, booleans as ``"b1"``/``"b0"``, numbers as numbers), so
``True`` never equals ``1`` (Milvus Lite conflates them) and string literals are escaped, never
interpolated raw: a value cannot inject an operator.

Example (Milvus Lite, in-process; a temporary directory is used and removed on ``close``)
-------
>>> import numpy as np
>>> from uibk_embedding.testing import make_list
>>> from uibk_embedding.encoder.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> docs = [make_list(fmt, rng, n) for n in (5, 40, 9)]
>>> with open_milvus_lite() as store:
...     store.upsert(["a", "b", "c"], docs, [{"lang": "en"}, {"lang": 'de" or 1==1'}, {}])
...     [h.id for h in store.search(docs[1], k=2)]
...     [h.id for h in store.search(docs[1], k=3, filter={"lang": 'de" or 1==1'})]
['b', 'c']
['b']

A server: ``MilvusStore(uri="http://localhost:19530", collection="papers")``.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding._sqlite_state import lock_folder
from uibk_embedding.adapters.base import Hit, MultiVectorStore, Record, finite_score
from uibk_embedding.adapters.filters import Condition, matches
from uibk_embedding.encoder.tagged import DIM, TaggedFormat, decompose
from uibk_embedding.errors import BackendUnavailable, CollectionMismatch, ServerTooOld
from uibk_embedding.rank import rerank

LAYOUTS = ("token_rows", "embedding_list")
MAX_LIMIT = 16384  # Milvus: largest search topk and query() rows per call
ARRAY_CAPACITY = 4096  # Milvus: largest ARRAY max_capacity (struct elements per document)
PART_ROWS = 64  # vectors per document part: 32 KiB of float32, 43,692 base64 characters
PART_CHARS = 43692
MAX_META_BYTES = 65535  # VARCHAR max_length
ID_BYTES = 2048  # ids are <= 512 characters, <= 4 bytes each in UTF-8
SCHEMA_VERSION = 1
EMBEDDING_LIST_MIN = (2, 6, 4)
DEFAULT_CANDIDATES = 64
# Milvus returns float32 scores: a bound is trusted only this far above an exact score
_BOUND_SLACK = 1e-4
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,200}$")
_Stored = tuple[np.ndarray, dict, int]  # a fetched document: its list, metadata, write version


def _pymilvus():
    return require("pymilvus", "milvus", "the Milvus adapter")


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


def filter_expression(conditions: Sequence[Condition], field: str = "f") -> str:
    """A Milvus boolean expression for parsed filter ``conditions`` ('' for none).

    A condition on a string with a control character (newline, tab, ...) is left out: it is a
    wider server-side search, and the client-side check of every rescored document applies it.

    >>> from uibk_embedding.adapters.filters import parse_filter
    >>> filter_expression(parse_filter({"lang": 'x" or 1==1 or "', "n": {"$in": [1, True]}}))
    '(f["lang"] == "sx\\\\" or 1==1 or \\\\"") and (f["n"] == 1 or f["n"] == "b1")'
    >>> filter_expression(parse_filter({"a": "two\\nlines", "n": 1}))
    '(f["n"] == 1)'
    """
    parts = []
    for c in conditions:
        if any(isinstance(v, str) and _CONTROL.search(v) for v in c.values):
            # Milvus Lite 2.5 matches no escaped control character (\n, \t) in a string literal
            # and refuses a raw newline: this condition is left to the client-side check every
            # search already applies to the documents it rescores (a wider server-side search,
            # the same result)
            continue
        path = f"{field}[{json.dumps(c.field, ensure_ascii=False)}]"
        ors = " or ".join(f"{path} == {_literal(v)}" for v in c.values)
        parts.append(f"({ors})")
    return " and ".join(parts)


def _ids_expr(ids: Sequence[str]) -> str:
    return "doc_id in [" + ", ".join(json.dumps(x, ensure_ascii=False) for x in ids) + "]"


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a Milvus server version string; ``None`` for Milvus Lite.

    >>> parse_version("v2.3.5-lite"), parse_version("2.6.4"), parse_version("milvus_lite-3.2.2")
    ((2, 3, 5), (2, 6, 4), None)
    """
    if "milvus_lite" in text.lower():
        return None
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def _b64(x: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode("ascii")


def _unb64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def _chunks(seq: Sequence, n: int) -> Iterable[Sequence]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


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
def _serialized(method):
    """One store call at a time within a process: a write spans two collections (rows, then
    documents, then old versions), and the concurrency test saw readers of Milvus Lite catch a
    write half-way. Other processes can still see a write in progress (see docs/milvus.md)."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._guard:
            return method(self, *args, **kwargs)

    return wrapper


class MilvusStore(MultiVectorStore):
    """Tagged multi-vectors in Milvus (see the module docstring for the layouts).

    Parameters
    ----------
    uri: ``http://host:19530`` for a server, or a local ``*.db`` path for Milvus Lite.
    collection: base name; ``token_rows`` uses ``<collection>_rows`` and ``<collection>_docs``.
    layout: ``"token_rows"`` (every Milvus) or ``"embedding_list"`` (Milvus >= 2.6.4).
    candidates: nearest rows taken per query vector (``token_rows``) or documents rescored
        (``embedding_list``). Larger = better recall, slower.
    exact: guarantee exact top-k (``token_rows`` with ``index_type="FLAT"`` only).
    index_type, index_params, search_params: the row index (``"HNSW"`` by default, M=16,
        efConstruction=200; ``ef`` = max(candidates, 64) at search time).
    token, timeout: connection options; ``timeout`` (seconds) bounds connecting and each call.
    format: the tagged format; stored with the collection and checked on reopen.
    batch_rows: vectors per insert call; ``show_progress`` draws a bar over insert batches.
    client: an existing ``pymilvus.MilvusClient`` to use instead of ``uri``.

    Example
    -------
    >>> s = MilvusStore(uri="http://localhost:19530")  # doctest: +SKIP
    """

    backend = "milvus"
    exact = False

    def __init__(
        self,
        uri: str = "http://localhost:19530",
        collection: str = "uibk",
        *,
        layout: str = "token_rows",
        candidates: int = DEFAULT_CANDIDATES,
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
        _on_close: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(format)
        self._guard = threading.RLock()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if not isinstance(collection, str) or not _NAME.match(collection):
            raise ValueError(
                f"collection name {collection!r}: use letters, digits and underscores, "
                "starting with a letter or underscore (at most 201 characters)"
            )
        if isinstance(candidates, bool) or not isinstance(candidates, int) or not (
                1 <= candidates <= MAX_LIMIT):
            raise ValueError(f"candidates must be an int in 1..{MAX_LIMIT}, got {candidates!r}")
        index_type = index_type.upper()
        if exact and (layout != "token_rows" or index_type != "FLAT"):
            raise ValueError(
                "exact=True needs layout='token_rows' and index_type='FLAT' (an exhaustive row "
                "search); the bound that proves exactness does not hold for approximate indexes"
            )
        self.uri = uri
        self.collection = collection
        self.layout = layout
        self.candidates = candidates
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
        if layout == "embedding_list":
            self._check_embedding_list_support(self.server_version)
        self.rows_name = f"{collection}_rows"
        self.docs_name = f"{collection}_docs" if layout == "token_rows" else collection
        self._open_or_create(format)

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

    @staticmethod
    def _check_embedding_list_support(version: str) -> None:
        v = parse_version(version)
        if v is None or v < EMBEDDING_LIST_MIN:
            need = ".".join(map(str, EMBEDDING_LIST_MIN))
            raise ServerTooOld(
                f"layout='embedding_list' needs a Milvus server >= {need} (ARRAY of STRUCT with "
                f"MAX_SIM_IP); this server reports {version!r}. Use layout='token_rows', which "
                "runs on every Milvus including Milvus Lite."
            )

    # -- schema ----------------------------------------------------------------------------
    def _description(self) -> str:
        return json.dumps({"uibk": self.layout, "schema": SCHEMA_VERSION,
                           "format": self.format.to_stored()}, sort_keys=True)

    def _expected_fields(self, name: str) -> dict[str, tuple[str, dict]]:
        if name == self.rows_name and self.layout == "token_rows":
            return {"pk": ("INT64", {}), "doc_id": ("VARCHAR", {"max_length": ID_BYTES}),
                    "ver": ("INT64", {}), "f": ("JSON", {}), "vec": ("FLOAT_VECTOR", {"dim": DIM})}
        if self.layout == "token_rows":
            return {"pk": ("INT64", {}), "doc_id": ("VARCHAR", {"max_length": ID_BYTES}),
                    "ver": ("INT64", {}), "part": ("INT64", {}), "n_parts": ("INT64", {}),
                    "n_rows": ("INT64", {}), "meta": ("VARCHAR", {"max_length": MAX_META_BYTES}),
                    "f": ("JSON", {}),
                    "vecs": ("VARCHAR", {"max_length": PART_CHARS}),
                    "dummy": ("FLOAT_VECTOR", {"dim": 2})}
        return {"doc_id": ("VARCHAR", {"max_length": ID_BYTES}),
                "meta": ("VARCHAR", {"max_length": MAX_META_BYTES}), "f": ("JSON", {}),
                "n_rows": ("INT64", {})}

    def _build_schema(self, name: str) -> tuple[Any, Any]:
        pm = _pymilvus()
        DataType = pm.DataType
        schema = self.client.create_schema(auto_id=self.layout == "token_rows",
                                           enable_dynamic_field=False,
                                           description=self._description())
        ip = self.client.prepare_index_params()
        if self.layout == "embedding_list":
            schema.add_field("doc_id", DataType.VARCHAR, is_primary=True, max_length=ID_BYTES)
            schema.add_field("meta", DataType.VARCHAR, max_length=MAX_META_BYTES)
            schema.add_field("f", DataType.JSON)
            schema.add_field("n_rows", DataType.INT64)
            struct = self.client.create_struct_field_schema()
            struct.add_field("v", DataType.FLOAT_VECTOR, dim=DIM)
            schema.add_field("vectors", DataType.ARRAY, element_type=DataType.STRUCT,
                             struct_schema=struct, max_capacity=ARRAY_CAPACITY)
            ip.add_index("vectors[v]", index_type=self.index_type, metric_type="MAX_SIM_IP",
                         params=self.index_params)
            return schema, ip
        schema.add_field("pk", DataType.INT64, is_primary=True)
        schema.add_field("doc_id", DataType.VARCHAR, max_length=ID_BYTES)
        schema.add_field("ver", DataType.INT64)
        if name == self.rows_name:
            schema.add_field("f", DataType.JSON)
            schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
            ip.add_index("vec", index_type=self.index_type, metric_type="IP", params=self.index_params)
        else:
            schema.add_field("part", DataType.INT64)
            schema.add_field("n_parts", DataType.INT64)
            schema.add_field("n_rows", DataType.INT64)
            schema.add_field("meta", DataType.VARCHAR, max_length=MAX_META_BYTES)
            schema.add_field("f", DataType.JSON)
            schema.add_field("vecs", DataType.VARCHAR, max_length=PART_CHARS)
            schema.add_field("dummy", DataType.FLOAT_VECTOR, dim=2)  # Milvus 2.3 needs a vector
            ip.add_index("dummy", index_type="FLAT", metric_type="L2")
        return schema, ip

    def _names(self) -> list[str]:
        return [self.rows_name, self.docs_name] if self.layout == "token_rows" else [self.docs_name]

    def _open_or_create(self, format: TaggedFormat | None) -> None:
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
        else:
            for n in names:
                schema, ip = self._build_schema(n)
                self.client.create_collection(n, schema=schema, index_params=ip,
                                              consistency_level="Strong", timeout=self.timeout)
                self.client.load_collection(n, timeout=max(self.timeout, 60))
            self._write_marker()

    def _marker(self, desc: dict) -> Any:
        """The store's marker: the collection description, else (Milvus Lite does not keep
        descriptions) the marker row of the docs collection (doc_id '', part -1)."""
        for text in (desc.get("description") or "",):
            try:
                info = json.loads(text)
                if isinstance(info, dict) and "uibk" in info:
                    return info
            except ValueError:
                pass
        if self.layout != "token_rows" or "part" not in {f["name"] for f in desc.get("fields", [])}:
            return None
        res = self.client.query(self.docs_name, filter='doc_id == "" and part == -1',
                                output_fields=["meta"], timeout=self.timeout)
        try:
            return json.loads(res[0]["meta"]) if res else None
        except ValueError:
            return None

    def _write_marker(self) -> None:
        if self.layout == "token_rows":
            self.client.insert(self.docs_name, [{"doc_id": "", "ver": 0, "part": -1, "n_parts": 0,
                                                 "n_rows": 0, "meta": self._description(), "f": {},
                                                 "vecs": "", "dummy": [0.0, 0.0]}],
                               timeout=self.timeout)

    def _validate_existing(self, name: str, format: TaggedFormat | None) -> None:
        desc = self.client.describe_collection(name, timeout=self.timeout)
        problems = self._field_problems(name, desc)
        if not problems:
            self.client.load_collection(name, timeout=max(self.timeout, 60))
        if name == self.docs_name and not problems:
            info = self._marker(desc)
            if not isinstance(info, dict) or info.get("uibk") != self.layout:
                problems.append(f"it was not created by this adapter with layout={self.layout!r}")
            elif info.get("schema") != SCHEMA_VERSION:
                problems.append(f"schema version {info.get('schema')} (this adapter writes "
                                f"{SCHEMA_VERSION})")
            else:
                saved = TaggedFormat.from_stored(info["format"])
                problem = saved.conflict(format)
                if problem:
                    problems.append(problem)
                else:
                    self.format = saved
        if name == self.rows_name and self.layout == "token_rows" and not problems:
            metric = self._index_metric(name, "vec")
            if metric is not None and metric != "IP":
                problems.append(f"the vector index uses metric {metric}, expected IP "
                                "(COSINE/L2 would change MaxSim scores)")
            idx = self._index_type(name, "vec")
            if self.exact and idx not in (None, "FLAT"):
                problems.append(f"exact=True needs a FLAT row index, the collection has {idx}")
        if problems:
            raise CollectionMismatch(
                f"existing Milvus collection {name!r} does not fit this store: " + "; ".join(problems)
                + ". It was left unchanged: use another collection name or drop it yourself."
            )

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

    @_serialized
    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        for x in ids:
            if _CONTROL.search(x):
                raise ValueError(
                    f"document id {x!r} has a control character: Milvus matches none in its filter "
                    "expressions (get and delete could never find it again); use printable ids")
        texts = [self._meta_text(x, m) for x, m in zip(ids, metadata, strict=True)]  # check all first
        if self.layout == "embedding_list":
            for x, v in zip(ids, vectors, strict=True):
                if len(v) > ARRAY_CAPACITY:
                    raise ValueError(f"document {x!r} has {len(v)} vectors; the embedding_list layout "
                                     f"holds at most {ARRAY_CAPACITY} per document")
            rows = [{"doc_id": x, "meta": t, "f": filter_fields(m), "n_rows": len(v),
                     "vectors": [{"v": r} for r in v.tolist()]}
                    for x, v, m, t in zip(ids, vectors, metadata, texts, strict=True)]
            for batch in self._batches(rows, [len(v) for v in vectors]):
                self.client.upsert(self.docs_name, batch, timeout=self.timeout)
            return
        ver = self._versions.next(after=self._newest_version(ids))
        doc_rows: list[dict] = []
        doc_sizes: list[int] = []
        vec_rows: list[dict] = []
        for x, v, m, t in zip(ids, vectors, metadata, texts, strict=True):
            f = filter_fields(m)
            n_parts = -(-len(v) // PART_ROWS)
            for p in range(n_parts):
                chunk = v[p * PART_ROWS:(p + 1) * PART_ROWS]
                doc_rows.append({"doc_id": x, "ver": ver, "part": p, "n_parts": n_parts,
                                 "n_rows": len(v), "meta": t if p == 0 else "",
                                 "f": f if p == 0 else {}, "vecs": _b64(chunk),
                                 "dummy": [0.0, 0.0]})
                doc_sizes.append(len(chunk))
            vec_rows.extend({"doc_id": x, "ver": ver, "f": f, "vec": r} for r in v.tolist())
        # 1. the new version's lists, 2. its rows, 3. drop older versions (see module docstring)
        for batch in self._batches(doc_rows, doc_sizes, vec_rows):
            self.client.insert(self.docs_name if "vecs" in batch[0] else self.rows_name, batch,
                               timeout=self.timeout)
        self._delete_versions(ids, f"ver < {ver}")

    def _batches(self, rows: list[dict], sizes: list[int], more: list[dict] | None = None):
        """Insert batches of at most ``batch_rows`` vectors, with an optional progress bar."""
        from tqdm.auto import tqdm

        batches: list[list[dict]] = []
        cur: list[dict] = []
        n = 0
        for r, s in zip(rows, sizes, strict=True):
            if cur and n + s > self.batch_rows:
                batches.append(cur)
                cur, n = [], 0
            cur.append(r)
            n += s
        if cur:
            batches.append(cur)
        if more:
            batches.extend(list(b) for b in _chunks(more, self.batch_rows))
        with tqdm(total=len(batches), desc=f"milvus insert {self.collection}", unit="batch",
                  disable=not self.show_progress) as bar:
            for b in batches:
                yield b
                bar.update(1)

    def _newest_version(self, ids: Sequence[str]) -> int:
        """The highest version stored for any of ``ids`` (complete or not; 0 for none), read at
        the collection's ``Strong`` consistency point, so it includes every acknowledged write."""
        newest = 0
        for chunk in _chunks(list(dict.fromkeys(ids)), 128):
            res = self.client.query(self.docs_name, filter=_ids_expr(chunk) + " and part >= 0",
                                    output_fields=["ver"], limit=MAX_LIMIT, timeout=self.timeout)
            newest = max([newest, *(int(r["ver"]) for r in res)])
        return newest

    def _delete_versions(self, ids: Sequence[str], extra: str = "") -> None:
        # the document rows first: a write killed between the two deletes leaves token rows
        # without a document, which search ignores (it rescores stored lists) and repair()
        # removes; the other order left a document that get/count/scan return and search misses
        names = [self.docs_name, self.rows_name] if self.layout == "token_rows" else [self.docs_name]
        for chunk in _chunks(list(ids), 500):
            expr = _ids_expr(chunk) + (f" and {extra}" if extra else "")
            for name in names:
                self.client.delete(name, filter=expr, timeout=self.timeout)

    @_serialized
    def _delete(self, ids: list[str]) -> None:
        self._delete_versions(ids)

    # -- reads -----------------------------------------------------------------------------
    @_serialized
    def count(self) -> int:
        expr = "part == 0" if self.layout == "token_rows" else ""
        res = self.client.query(self.docs_name, filter=expr, output_fields=["count(*)"],
                                timeout=self.timeout)
        return int(res[0]["count(*)"]) if res else 0

    def _scan(self, conditions: tuple[Condition, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        """Milvus's query iterator over the document collection (a lock per page, not per scan)."""
        expr = filter_expression(conditions)
        if self.layout == "token_rows":  # one row per document holds its metadata: part 0
            expr = "part == 0" + (f" and ({expr})" if expr else "")
        with self._guard:
            it = self.client.query_iterator(self.docs_name, batch_size=batch_size, filter=expr,
                                            output_fields=["doc_id", "meta"], timeout=self.timeout)
        seen: set[str] = set()  # an overwrite in progress briefly holds two versions of a document
        try:
            while True:
                with self._guard:
                    rows = it.next()
                if not rows:
                    return
                page = [(r["doc_id"], json.loads(r["meta"])) for r in rows if r["doc_id"] not in seen]
                seen.update(x for x, _ in page)
                if page:
                    yield page
        finally:
            with self._guard:
                it.close()

    def _query_all(self, name: str, expr: str, fields: list[str], *, batch: int = 1024) -> list[dict]:
        """Every row matching ``expr`` (paged: ``query`` returns at most 16,384 rows per call)."""
        it = self.client.query_iterator(name, batch_size=batch, filter=expr, output_fields=fields,
                                        timeout=self.timeout)
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

    def _fetch(self, ids: Sequence[str], *, wait: bool = True) -> dict[str, _Stored]:
        """Newest complete stored list, metadata and version of each id (missing ids absent).

        ``wait=False`` reads what the server holds now (``Eventually``) instead of waiting for
        the collection's ``Strong`` consistency point (one time tick, ~200 ms on Milvus 2.3):
        callers that know which version they need check it and re-read the stale ones."""
        out: dict[str, _Stored] = {}
        level = {} if wait else {"consistency_level": "Eventually"}
        if self.layout == "embedding_list":
            for chunk in _chunks(list(dict.fromkeys(ids)), 256):
                res = self.client.query(self.docs_name, filter=_ids_expr(chunk),
                                        output_fields=["doc_id", "meta", "vectors"], timeout=self.timeout)
                for r in res:
                    vec = np.array([e["v"] for e in r["vectors"]], dtype=np.float32).reshape(-1, DIM)
                    out[r["doc_id"]] = (vec, json.loads(r["meta"]), 0)
            return out
        fields = ["doc_id", "ver", "part", "n_parts", "n_rows", "meta", "vecs"]
        todo = [list(c) for c in _chunks(list(dict.fromkeys(ids)), 128)]
        rows: list[dict] = []
        while todo:
            chunk = todo.pop()
            res = self.client.query(self.docs_name, filter=_ids_expr(chunk), output_fields=fields,
                                    limit=MAX_LIMIT, timeout=self.timeout, **level)
            if len(res) >= MAX_LIMIT:  # maybe truncated: split and ask again
                if len(chunk) == 1:
                    res = self._query_all(self.docs_name, _ids_expr(chunk), fields, batch=256)
                else:
                    todo += [chunk[: len(chunk) // 2], chunk[len(chunk) // 2:]]
                    continue
            rows.extend(res)
        groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
        for r in rows:
            groups[(r["doc_id"], int(r["ver"]))].append(r)
        for (doc_id, ver), parts in sorted(groups.items(), key=lambda kv: kv[0][1]):
            parts.sort(key=lambda r: int(r["part"]))
            n_parts = int(parts[0]["n_parts"])
            if [int(p["part"]) for p in parts] != list(range(n_parts)):
                continue  # an incomplete version (a write that crashed): never used
            flat = np.concatenate([_unb64(p["vecs"]) for p in parts])
            n_rows = int(parts[0]["n_rows"])
            if flat.size != n_rows * DIM:
                continue
            out[doc_id] = (flat.reshape(n_rows, DIM), json.loads(parts[0]["meta"]), ver)  # newest wins
        return out

    @_serialized
    def _get(self, ids: list[str]) -> list[Record]:
        found = self._fetch(ids)
        return [Record(x, found[x][0].copy(), json.loads(json.dumps(found[x][1])))
                for x in ids if x in found]

    @_serialized
    def _search(self, query: np.ndarray, k: int, conditions: tuple[Condition, ...]) -> list[Hit]:
        return self._search_batch([query], k, conditions)[0]

    @_serialized
    def _search_batch(self, queries: list[np.ndarray], k: int,
                      conditions: tuple[Condition, ...]) -> list[list[Hit]]:
        return [self._search_one(q, k, conditions, {}) for q in queries]

    @_serialized
    def _search_explained(self, q: np.ndarray, k: int, conditions: tuple[Condition, ...]) -> list[Hit]:
        """The rescoring already fetched every hit's list: decompose from those, no second read."""
        cache: dict[str, _Stored | None] = {}
        hits = self._search_one(q, k, conditions, cache)
        missing = [h.id for h in hits if cache.get(h.id) is None]
        if missing:
            cache.update(self._fetch(missing))
        for h in hits:
            stored = cache.get(h.id)
            if stored is not None:
                h.decomposition = decompose(q, stored[0], self.format)
        return hits

    def _search_one(self, q: np.ndarray, k: int, conditions: tuple[Condition, ...],
                    cache: dict[str, _Stored | None]) -> list[Hit]:
        """One query; ``cache`` collects the lists fetched for the rescoring."""
        expr = filter_expression(conditions)
        if self.layout == "embedding_list":
            return self._search_embedding_list(q, k, expr, conditions, cache)
        depth = min(max(self.candidates, 1), MAX_LIMIT)
        while True:
            upper, seen, bound, complete = self._row_candidates(q, depth, expr)
            hits, kth = self._rescore(q, list(upper), k, conditions, cache, upper, seen)
            if not self.exact or complete or (len(hits) == k and kth >= bound):
                return hits
            if depth >= MAX_LIMIT:  # unproven at Milvus' deepest search: rescore everything
                return self._rescore(q, self._all_ids(expr), k, conditions, cache)[0]
            depth = min(depth * 4, MAX_LIMIT)

    def _row_candidates(self, q: np.ndarray, depth: int,
                        expr: str) -> tuple[dict[str, float], dict[str, int], float, bool]:
        """Documents owning each query vector's ``depth`` nearest rows, with score upper bounds.

        Returns ``{doc_id: upper bound of its MaxSim}`` ordered best bound first, the newest
        version of each document among its returned rows, the bound for
        documents outside the union (sum over query vectors of the last returned score) and
        whether some list came back short (then every row passing the filter was seen, so the
        union is every matching document). A document's bound takes, per query vector, its best
        returned row, or the last returned score where it has none; with an exhaustive row
        search (FLAT) it is a true upper bound, so rescoring in bound order can stop early."""
        params = {"metric_type": "IP", "params": dict(self.search_params)}
        if self.index_type == "HNSW":
            params["params"].setdefault("ef", max(depth, 64))
        elif self.index_type.startswith("IVF"):
            params["params"].setdefault("nprobe", 32)
        gain: dict[str, float] = {}  # sum over query vectors of (best row - last row)
        seen: dict[str, int] = {}
        bound = 0.0
        complete = False
        per_call = max(1, min(len(q), 2_000_000 // depth))
        for qs in _chunks(q, per_call):
            res = self.client.search(self.rows_name, data=qs.tolist(), limit=depth, filter=expr,
                                     output_fields=["doc_id", "ver"], search_params=params,
                                     anns_field="vec", timeout=self.timeout)
            for hits in res:
                if len(hits) < depth:
                    complete = True
                if not hits:
                    continue
                last = min(float(h["distance"]) for h in hits)
                bound += last
                best: dict[str, float] = {}
                for h in hits:
                    d, s = h["entity"]["doc_id"], float(h["distance"])
                    if s > best.get(d, -math.inf):
                        best[d] = s
                    seen[d] = max(seen.get(d, 0), int(h["entity"]["ver"]))
                for d, s in best.items():
                    gain[d] = gain.get(d, 0.0) + (s - last)
        upper = {d: bound + g for d, g in sorted(gain.items(), key=lambda kv: -kv[1])}
        return upper, seen, bound, complete

    def _all_ids(self, expr: str) -> list[str]:
        e = "part == 0" + (f" and ({expr})" if expr else "")
        return list(dict.fromkeys(r["doc_id"] for r in self._query_all(self.docs_name, e, ["doc_id"])))

    def _rescore(self, q: np.ndarray, ids: Sequence[str], k: int, conditions: tuple[Condition, ...],
                 cache: dict[str, _Stored | None] | None = None,
                 upper: dict[str, float] | None = None,
                 seen: dict[str, int] | None = None) -> tuple[list[Hit], float]:
        """Exact MaxSim over ``ids`` (fetched in pieces); the hits and the k-th score.

        With ``upper`` (score upper bounds, ``ids`` in descending bound order) rescoring stops
        once the k-th exact score reaches the next document's bound: no later document can
        enter the top k. With ``seen`` (the row versions the search returned) lists are read
        without waiting for the consistency point; any list older than its rows, or not found,
        is read again with the collection's consistency, so a list is never staler than the
        rows that nominated it."""
        best_ids: list[str] = []
        best_scores = np.zeros(0)
        meta: dict[str, dict] = {}
        cache = {} if cache is None else cache
        kth = -math.inf
        step = 64 if upper is not None else 512  # small first fetches when bounds can stop early
        pos, ids = 0, list(ids)
        while pos < len(ids):
            if upper is not None and len(best_scores) >= k and kth >= upper[ids[pos]] + _BOUND_SLACK:
                break
            chunk, pos = ids[pos: pos + step], pos + step
            step = min(step * 2, 512)
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
            keep = [x for x in chunk if x in found and matches(found[x][1], conditions)]
            if not keep:
                continue
            lists = [cache[x][0] for x in best_ids] + [found[x][0] for x in keep]  # type: ignore[index]
            ranked = rerank(q, lists, k, dtype=np.float64)  # the running top k plus this chunk
            pool = best_ids + keep
            best_ids = [pool[i] for i, _ in ranked]
            best_scores = np.array([s for _, s in ranked])
            meta.update((x, found[x][1]) for x in keep)
            if len(best_scores) >= k:
                kth = float(best_scores[-1])
        hits = [Hit(x, finite_score(s), meta[x]) for x, s in zip(best_ids, best_scores, strict=True)]
        return hits, kth

    def _search_embedding_list(self, q: np.ndarray, k: int, expr: str, conditions: tuple[Condition, ...],
                               cache: dict[str, _Stored | None] | None = None) -> list[Hit]:
        pm = _pymilvus()
        emb = pm.EmbeddingList(q, dim=DIM)
        res = self.client.search(self.docs_name, data=[emb], anns_field="vectors[v]",
                                 limit=max(k, self.candidates), filter=expr, output_fields=["doc_id"],
                                 search_params={"metric_type": "MAX_SIM_IP",
                                                "params": dict(self.search_params)},
                                 timeout=self.timeout)
        ids = [h["entity"]["doc_id"] for h in res[0]]
        return self._rescore(q, ids, k, conditions, cache)[0]

    # -- maintenance -----------------------------------------------------------------------
    @_serialized
    def repair(self) -> int:
        """Remove versions left behind by interrupted writes; returns how many documents were fixed.

        For every document stored in more than one version (or with an incomplete version), keep
        the newest complete version and delete the rest (rows and parts)."""
        if self.layout != "token_rows":
            return 0
        rows = self._query_all(self.docs_name, "part >= 0", ["doc_id", "ver", "part", "n_parts"])
        by_doc: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        n_parts: dict[tuple[str, int], int] = {}
        for r in rows:
            by_doc[r["doc_id"]][int(r["ver"])].append(int(r["part"]))
            n_parts[(r["doc_id"], int(r["ver"]))] = int(r["n_parts"])
        row_vers: dict[str, set[int]] = defaultdict(set)
        for r in self._query_all(self.rows_name, "", ["doc_id", "ver"], batch=4096):
            row_vers[r["doc_id"]].add(int(r["ver"]))
        fixed = 0
        for doc_id in set(by_doc) | set(row_vers):
            vers = by_doc.get(doc_id, {})
            complete = [v for v, parts in vers.items()
                        if sorted(parts) == list(range(n_parts[(doc_id, v)]))]
            keep = max(complete) if complete else None
            stale = (set(vers) | row_vers.get(doc_id, set())) - {keep}
            if stale:
                fixed += 1
                cond = f"ver != {keep}" if keep is not None else ""
                self._delete_versions([doc_id], cond)
        return fixed

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


# -- Milvus Lite -----------------------------------------------------------------------------------
_lite_refs: dict[str, int] = {}
LITE_START_TIMEOUT = 60.0  # seconds to wait for the server of a crashed process to let go
_lite_lock = threading.Lock()


def open_milvus_lite(path: str | os.PathLike | None = None, collection: str = "uibk",
                     **options: Any) -> MilvusStore:
    """A :class:`MilvusStore` on Milvus Lite, in-process (``token_rows`` layout).

    ``path``: the Milvus Lite data directory (named ``*.db`` by pymilvus' convention; created when
    missing, reopened when it holds a store). Without ``path`` a temporary directory is used and
    removed on ``close()``. Other ``options`` go to :class:`MilvusStore`; the row index defaults to
    ``FLAT`` here (Milvus Lite 2.5 builds no HNSW index: FLAT, IVF_FLAT and AUTOINDEX only).

    >>> s = open_milvus_lite()
    >>> s.backend, s.layout, s.count()
    ('milvus-lite', 'token_rows', 0)
    >>> s.close()
    """
    tmp = None
    if path is None:
        tmp = tempfile.mkdtemp(prefix="uibk-milvus-lite-")
        path = os.path.join(tmp, "milvus.db")
    uri = os.path.abspath(os.fspath(path))
    if not uri.endswith(".db"):
        uri = os.path.join(uri, "milvus.db")
    if options.get("layout", "token_rows") != "token_rows":
        raise ValueError("Milvus Lite supports only layout='token_rows' (no ARRAY of STRUCT, "
                         "no MAX_SIM): embedding_list needs a Milvus server >= 2.6.4")
    options.setdefault("index_type", "FLAT")
    os.makedirs(os.path.dirname(uri), exist_ok=True)
    # one store object per collection of a Milvus Lite folder, in this and other processes
    lock = lock_folder(f"{uri}.{collection}.lock", f"the Milvus Lite collection {collection!r} at {uri}",
                       "MilvusStore")
    with _lite_lock:
        _lite_refs[uri] = _lite_refs.get(uri, 0) + 1

    def release() -> None:
        lock.close()
        with _lite_lock:
            _lite_refs[uri] -= 1
            last = _lite_refs[uri] == 0
            if last:
                del _lite_refs[uri]
        if last:
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(uri)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    deadline = time.monotonic() + LITE_START_TIMEOUT
    try:
        while True:
            try:
                store = MilvusStore(uri=uri, collection=collection, _on_close=release, **options)
                break
            except BackendUnavailable:
                # the server of a process that died with this folder open stops only once it sees
                # that process's lock released (it polls); until then a new one cannot open the
                # files ("database is locked", or a socket that never answers): wait, bounded
                if time.monotonic() > deadline:  # (a local file: "unavailable" is a server
                    raise                                # that did not come up, or not yet)
                time.sleep(0.5)
    except BaseException:
        release()
        raise
    store.backend = "milvus-lite"  # type: ignore[misc]
    return store
