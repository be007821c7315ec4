"""The one store interface every backend implements, with shared input validation.

A store holds *documents*: a string id, one tagged multi-vector (float32, ``(n, 128)``, see
:mod:`uibk_embedding.tagged`) and a JSON metadata dict. Backends implement six small
methods (``_upsert``, ``_delete``, ``_search``, ``_get``, ``count`` and ``_scan``, a paged
listing of ids and metadata by filter with the engine's own listing call) and, where the engine
deletes by filter natively, ``_delete_where``. The public methods here validate every input
first, so bad input is refused with the same precise error on every backend and never reaches
(or half-changes) the engine.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.adapters.exact import ExactStore
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> mk = lambda n: fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127)))
>>> store = ExactStore()
>>> store.upsert(["a", "b"], [mk(5), mk(7)], [{"lang": "en"}, {"lang": "de"}])
>>> [h.id for h in store.search(mk(4), k=5, filter={"lang": "de"})]
['b']
>>> list(store.scan({"lang": "en"}))
[('a', {'lang': 'en'})]
>>> store.delete(filter={"lang": "de"}), store.count()
(1, 1)
>>> store.upsert(["a"], [mk(1)[:2]])   # two rows: not a tagged list
Traceback (most recent call last):
...
ValueError: multivectors[0] (id 'a'): needs at least 4 rows (3 slots + tokens), got 2
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import math
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from uibk_embedding.adapters.filters import (
    BASIC,
    RESERVED_PREFIX,
    Filter,
    Node,
    check_int,
    native_filter_refused,
    operators,
    parse_filter,
)
from uibk_embedding.errors import CollectionMismatch, InvalidInput, StoreInUse
from uibk_embedding.rank import relevance
from uibk_embedding.tagged import (
    DIM,
    MAX_DENSE_WEIGHT,
    N_SLOTS,
    TAG_RTOL,
    Decomposition,
    TaggedFormat,
    check_text,
    decompose,
)

MAX_ID_LENGTH = 512
MAX_ROWS = 8192
UNIT_TOL = 1e-3
MAX_METADATA_DEPTH = 32
"""How deep one document's metadata may nest: the dict itself is level 1, each dict or list
inside it one more (``{"a": {"b": [1]}}`` is 3 levels deep). Deeper metadata is refused with
:class:`~uibk_embedding.errors.InvalidInput` on every backend (engines recurse into it: Qdrant's
local mode raised ``RecursionError`` at 600 levels, JSON encoders at about 1,000)."""


def settle_format(saved: TaggedFormat, requested: TaggedFormat | None, where: str) -> TaggedFormat:
    """The format an existing store goes on with: ``saved``, after checking that lists made
    with ``requested`` (``None``: not declared) can be stored and searched beside its lists
    (:meth:`TaggedFormat.conflict`); else :class:`CollectionMismatch` naming ``where``.

    >>> settle_format(TaggedFormat(projection="random-1a"), None, "store x").projection
    'random-1a'
    """
    problem = saved.conflict(requested)
    if problem:
        raise CollectionMismatch(f"{where} cannot be used with this encoder: {problem}. It was not changed.")
    return saved


def record_problems(
    record: Any, requested: TaggedFormat | None, *, key: str | None, value: Any = None,
    schema: int | Collection[int] | None = None, format_key: str = "format", schema_key: str = "schema",
    optional: bool = False,
) -> tuple[TaggedFormat | None, list[str]]:
    """The one reopen check of every backend: ``record`` is the marker a store wrote where its
    engine keeps it (a table comment, a collection description or metadata, a marker row, a
    ``store.json``, a configuration row in SQLite), parsed to a dict (``None``: there is none, or it
    could not be parsed). The engine says only what the record holds: ``key`` is ``value`` (who
    wrote it; ``key=None``: the engine records no writer), ``schema_key`` is ``schema`` (the
    version this library writes, or every version it reads; ``None``: not checked) and
    ``format_key`` holds the tagged format (:meth:`TaggedFormat.to_stored`). ``optional``: a store
    may hold no record at all (made before records were written, or by hand), which is accepted
    and has no format to conflict with.

    Returns the saved format and what makes the store unusable with ``requested`` (empty: it
    fits); the engine raises :class:`CollectionMismatch` with them, naming where it looked
    (:func:`check_record` does both when the record is all an engine checks).

    >>> saved = {"uibk": "pgvector", "schema": 1, "format": TaggedFormat().to_stored()}
    >>> record_problems(saved, None, key="uibk", value="pgvector", schema=1)[1]
    []
    >>> record_problems({"uibk": "other"}, None, key="uibk", value="pgvector", schema=1)[1]
    ["its record names uibk 'other', not 'pgvector'"]
    >>> record_problems({**saved, "schema": 3}, None, key="uibk", value="pgvector", schema=(1, 2))[1]
    ['its record has schema 3; this version of uibk-embedding reads schema 1 or 2']
    >>> print(*record_problems({"fmt": {"beta": "x"}}, None, key=None, format_key="fmt")[1])
    unreadable format record (could not convert string to float: 'x')
    >>> record_problems(None, None, key="backend", value="exact", optional=True)
    (None, [])
    """
    if record is None and optional:
        return None, []
    if not isinstance(record, Mapping):
        kind = f"a {value!r} store" if key is not None else "a store of this library"
        return None, [f"it holds no readable record of {kind}"]
    if key is not None and record.get(key) != value:
        return None, [f"its record names {key} {record.get(key)!r}, not {value!r}"]
    if schema is not None:
        readable = [schema] if isinstance(schema, int) else sorted(schema)
        if record.get(schema_key) not in readable:
            return None, [f"its record has {schema_key} {record.get(schema_key)!r}; this version of "
                          f"uibk-embedding reads {schema_key} {' or '.join(map(str, readable))}"]
    try:
        saved = TaggedFormat.from_stored(record[format_key])
    except (KeyError, TypeError, ValueError) as e:
        return None, [f"unreadable format record ({e})"]
    problem = saved.conflict(requested)
    return saved, [problem] if problem else []


def check_record(
    record: Any, requested: TaggedFormat | None, where: str, **holds: Any,
) -> TaggedFormat | None:
    """:func:`record_problems` for an engine whose record is all it checks on reopening (``holds``:
    what the record holds, as there): the saved format (``None``: an ``optional`` record that is
    absent), else :class:`CollectionMismatch` naming ``where`` the record is kept and every problem.

    >>> check_record({"backend": "exact", "version": 2, "format": TaggedFormat(beta=0.8).to_stored()},
    ...              None, "store.json", key="backend", value="exact", schema_key="version", schema=2).beta
    0.8
    >>> check_record({"backend": "warp"}, None, "store.json", key="backend", value="exact")
    ...                                                      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.CollectionMismatch: store.json does not fit this store: its record names ...
    """
    saved, problems = record_problems(record, requested, **holds)
    if problems:
        raise CollectionMismatch(f"{where} does not fit this store: {'; '.join(problems)}. "
                                 "It was left unchanged.")
    return saved


def read_record(text: str | bytes | None) -> Any:
    """A store record's JSON text parsed: ``None`` stays ``None`` (no record, which an
    ``optional`` record may be), text that is not JSON comes back as it is, which
    :func:`record_problems` names as unreadable (never taken for a missing record).

    >>> read_record('{"schema": 1}'), read_record(None)
    ({'schema': 1}, None)
    >>> record_problems(read_record("{oops"), None, key=None, optional=True)[1]
    ['it holds no readable record of a store of this library']
    """
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass
class Hit:
    """One search result: ``id``, MaxSim ``score`` (as the backend computed it), ``metadata``,
    when asked for (``explain=True``) its :class:`Decomposition`, and its ``relevance``.

    ``relevance`` is the score on a scale in [0, 1] that does not depend on the query's length
    (:func:`~uibk_embedding.rank.relevance`: 1 a perfect match, off-topic and gibberish queries'
    best documents mostly below 0.5); :meth:`MultiVectorStore.search` and ``search_batch`` set it
    on every hit they return, the same on every backend.

    >>> import uibk_embedding as ue
    >>> enc = ue.load_encoder(); store = ue.open_store("exact", format=enc.format)
    >>> store.upsert(["wing", "bread"], enc.encode_documents(["lift of a wing in a slipstream",
    ...                                                       "a rye sourdough recipe"]))
    >>> hits = store.search(enc.encode_queries(["wing lift"])[0], k=2)
    >>> [h.id for h in hits], all(0 <= h.relevance <= 1 for h in hits), hits[0].relevance > hits[1].relevance
    (['wing', 'bread'], True, True)
    """

    id: str
    score: float
    metadata: dict[str, Any] = field(default_factory=dict)
    decomposition: Decomposition | None = None
    relevance: float | None = None  # set by the store's search (None only on a Hit made by hand)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "score": self.score, "relevance": self.relevance,
                             "metadata": self.metadata}
        if self.decomposition is not None:
            d["decomposition"] = self.decomposition.as_dict()
        return d


def with_relevance(query: np.ndarray, hits: list[Hit]) -> list[Hit]:
    """``hits`` of ``query`` with their ``relevance`` set (:func:`~uibk_embedding.rank.relevance`,
    which depends on the query); the same list, returned.

    >>> from uibk_embedding.rank import query_span
    >>> from uibk_embedding.tagged import TaggedFormat
    >>> q = TaggedFormat().build(np.eye(3, 127), np.eye(5, 127, 3))
    >>> c, top = query_span(q)
    >>> [h.relevance for h in with_relevance(q, [Hit("a", top), Hit("b", c), Hit("c", c - 1.0)])]
    [1.0, 0.0, 0.0]
    """
    for h in hits:
        h.relevance = relevance(query, h.score)
    return hits


@dataclass
class Record:
    """A stored document: id, its tagged multi-vector and metadata."""

    id: str
    vectors: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)


# -- validation --------------------------------------------------------------------------------
def validate_ids(ids: Sequence[str], *, unique: bool = True) -> list[str]:
    """Check ids: non-empty strings of at most 512 characters, valid Unicode (no lone
    surrogate, so every engine can encode them as UTF-8) and no NUL, unique within the call.

    >>> validate_ids(["a", "b"])
    ['a', 'b']
    >>> validate_ids(["a", "x\\ud800"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.InvalidInput: ids[1] is not valid Unicode: a lone surrogate '\\ud800' at ...
    """
    if isinstance(ids, str | bytes):
        raise TypeError("ids must be a sequence of strings, not a single string")
    out = list(ids)
    for i, x in enumerate(out):
        if not isinstance(x, str):
            raise TypeError(f"ids[{i}] must be a str, got {type(x).__name__} {x!r}")
        if not x or not x.strip():
            raise ValueError(f"ids[{i}] is empty or whitespace")
        if len(x) > MAX_ID_LENGTH:
            raise ValueError(f"ids[{i}] is {len(x)} characters long; the limit is {MAX_ID_LENGTH}")
        if "\x00" in x:
            raise ValueError(f"ids[{i}] contains a NUL character")
        check_text(x, f"ids[{i}]")
    if unique and len(set(out)) != len(out):
        seen: set[str] = set()
        dups = sorted({x for x in out if x in seen or seen.add(x)})
        raise ValueError(f"duplicate ids in one call: {dups[:5]}")
    return out


def _as_matrix(x: Any, what: str) -> np.ndarray:
    if isinstance(x, str | bytes):
        raise TypeError(f"{what}: got a string ({x[:40]!r}); stores take encoded vectors: encode it "
                        "first (encoder.encode_queries([text])[0], or encode_documents for documents)")
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as e:  # ragged lists and the like
            raise TypeError(f"{what}: not an array ({e})") from None
    if x.dtype.kind != "f":
        raise TypeError(f"{what}: dtype must be floating point, got {x.dtype}")
    if x.ndim != 2 or x.shape[1] != DIM:
        raise ValueError(f"{what}: shape must be (n, {DIM}), got {x.shape}")
    x = x.astype(np.float32, copy=False)  # checked after: float64 past float32's range is inf
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: contains NaN or inf (in float32, which stores and scores use)")
    return x


def validate_document(x: Any, what: str = "document", format: TaggedFormat | None = None) -> np.ndarray:
    """A stored list: >= 4 unit rows, the first 3 slots (tag < 0) then tokens (tag > 0); with
    ``format`` (what every store passes: its own), every row's tag that format's
    (:func:`check_format_tags`). Returns it as float32.

    >>> fmt = TaggedFormat()
    >>> doc = fmt.build(np.ones((3, 127)), np.ones((2, 127)))
    >>> validate_document(doc, "doc", fmt).shape
    (5, 128)
    >>> validate_document(TaggedFormat(beta=0.5).build(np.ones((3, 127)), np.ones((2, 127))), "doc", fmt)
    ...                                                    # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: doc: row 3 (a token row) has tag 0.7071; the store's format (beta=0.9, lambda=0.75) ...
    """
    x = _as_matrix(x, what)
    if len(x) <= N_SLOTS:
        raise ValueError(f"{what}: needs at least {N_SLOTS + 1} rows (3 slots + tokens), got {len(x)}")
    if len(x) > MAX_ROWS:
        raise ValueError(f"{what}: {len(x)} rows is over the limit of {MAX_ROWS}")
    _check_tags(x, what)
    norms = np.linalg.norm(x, axis=1)
    bad = np.flatnonzero(np.abs(norms - 1) > UNIT_TOL)
    if len(bad):
        raise ValueError(f"{what}: row {bad[0]} has norm {norms[bad[0]]:.4f}; stored rows must be unit")
    if format is not None:
        check_format_tags(x, format, what)
    return x


def validate_query(x: Any, what: str = "query", format: TaggedFormat | None = None) -> np.ndarray:
    """A query list: slot rows first (tag < 0, all of one norm w > 0), then unit token rows; with
    ``format`` (what every store passes: its own), every row's tag that format's, a slot row's
    per unit norm (:func:`check_format_tags`). Returns it as float32.

    A query may also be tokens only or slots only (the dense-only / token-only heads).

    >>> fmt = TaggedFormat()
    >>> q = fmt.build(np.ones((3, 127)), np.ones((2, 127)), dense_weight=4.0)
    >>> validate_query(q, "query", fmt).shape
    (5, 128)
    """
    x = _as_matrix(x, what)
    if len(x) == 0:
        raise ValueError(f"{what}: has no vectors")
    slot = x[:, 0] < 0
    n_slots = int(slot.sum())
    if n_slots not in (0, N_SLOTS) or not np.all(slot[:n_slots]):
        raise ValueError(
            f"{what}: expected {N_SLOTS} slot rows (tag < 0) first, then token rows (tag > 0): "
            "not a tagged list"
        )
    if np.any(x[:, 0] == 0):
        raise ValueError(f"{what}: a row has tag 0: not a tagged list")
    norms = np.linalg.norm(x.astype(np.float64), axis=1)  # float32 norms overflow past 1.8e19
    tok = norms[~slot]
    if len(tok) and np.any(np.abs(tok - 1) > UNIT_TOL):
        raise ValueError(f"{what}: token rows must be unit vectors")
    if n_slots and np.ptp(norms[slot]) > UNIT_TOL * max(1.0, norms[slot].max()):
        raise ValueError(f"{what}: slot rows must share one norm (the dense weight)")
    if n_slots and norms[slot].max() > MAX_DENSE_WEIGHT * (1 + UNIT_TOL):
        raise ValueError(f"{what}: slot rows of norm {norms[slot].max():.3g}: the dense weight is at most "
                         f"{MAX_DENSE_WEIGHT:g} (scores would overflow float32)")
    if format is not None:
        check_format_tags(x, format, what, norms=norms)
    return x


def check_format_tags(x: np.ndarray, fmt: TaggedFormat, what: str, *,
                      norms: np.ndarray | None = None) -> None:
    """A ``ValueError`` naming ``what``, the first row whose tag is not ``fmt``'s, the tag found and
    the tag expected, unless every slot row's tag (``x[:, 0] < 0``) is ``fmt.slot_tag`` and every
    token row's ``fmt.token_tag``, within a relative :data:`TAG_RTOL`. ``norms``: the rows'
    norms, for a query, whose slot rows are scaled by its dense weight (tag included), so their
    tag is compared per unit norm; a stored list's rows are unit (checked before).

    The tags are the format: a list of another beta or lambda scores as that format, so beside
    the store's lists its constant ``C(q)`` would depend on the document (MaxSim would not rank
    as the hybrid score) and ``explain`` would split its score with the store's beta and lambda.
    The one check every backend runs (:meth:`MultiVectorStore.upsert`, ``search``,
    ``search_batch``, ``explain``), against the store's format: the one it was opened with, the
    one it recorded, or, for a store that has neither, the released one (:class:`TaggedFormat`),
    which a new store records.

    >>> fmt = TaggedFormat()
    >>> check_format_tags(fmt.build(np.ones((3, 127)), np.ones((2, 127))), fmt, "doc")
    >>> q = TaggedFormat(lambda_=0.5).build(np.ones((3, 127)), np.ones((2, 127)), dense_weight=2.0)
    >>> check_format_tags(q, fmt, "query", norms=np.linalg.norm(q, axis=1))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: query: row 0 (a slot row) has tag -0.9220 per unit norm; the store's format (beta=0.9, ...
    """
    tags = x[:, 0].astype(np.float64)
    if norms is not None:
        tags = tags / norms
    slot = tags < 0
    expected = np.where(slot, fmt.slot_tag, fmt.token_tag)
    wrong = np.abs(tags - expected) > TAG_RTOL * np.abs(expected)
    # token rows first: their tag is beta's alone (a slot tag is beta's and lambda's)
    off = np.r_[np.flatnonzero(wrong & ~slot), np.flatnonzero(wrong & slot)]
    if not len(off):
        return
    i = int(off[0])
    kind, rule = ("slot", "-sqrt(1 - lambda beta / 3)") if slot[i] else ("token", "sqrt(1 - beta)")
    unit = " per unit norm" if norms is not None and slot[i] else ""
    # what the list's own tags read as (a part it lacks: the store's)
    beta = 1 - float(np.median(tags[~slot])) ** 2 if (~slot).any() else fmt.beta
    lam = N_SLOTS * (1 - float(np.median(tags[slot])) ** 2) / beta if slot.any() and beta > 0 else fmt.lambda_
    raise ValueError(
        f"{what}: row {i} (a {kind} row) has tag {tags[i]:.4f}{unit}; the store's format "
        f"(beta={fmt.beta:g}, lambda={fmt.lambda_:g}) expects {expected[i]:.4f} = {rule}, within "
        f"{TAG_RTOL:.1%}. The list's tags read as beta={beta:.3g}, lambda={lam:.3g}: it was made with "
        "another tagged format, and lists of two formats do not score alike (C(q) would depend on the "
        "document). Encode it with the encoder this store was made with, or keep such lists in a "
        f"store of their own (open_store(..., format=TaggedFormat(beta={beta:.3g}, lambda_={lam:.3g})))")


def _check_tags(x: np.ndarray, what: str) -> None:
    if not np.all(x[:N_SLOTS, 0] < 0) or not np.all(x[N_SLOTS:, 0] > 0):
        raise ValueError(
            f"{what}: expected {N_SLOTS} slot rows (tag < 0) then token rows (tag > 0): "
            "not a tagged list"
        )


def _check_metadata_tree(m: Mapping[str, Any], i: int) -> None:
    """One document's metadata within the shared limits, walked without recursion (so input
    nested 100,000 deep is refused, not a ``RecursionError``): at most
    :data:`MAX_METADATA_DEPTH` levels, keys and strings valid Unicode, integers in 64 bits."""
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(m, (), 1)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            check_text(v, _where(i, path))
        elif isinstance(v, bool):
            continue
        elif isinstance(v, int):
            check_int(v, _where(i, path))
        elif isinstance(v, Mapping | list | tuple):
            if depth > MAX_METADATA_DEPTH:
                raise InvalidInput(
                    f"metadata[{i}] nests dicts and lists more than {MAX_METADATA_DEPTH} levels deep (the "
                    f"metadata dict itself is level 1; the limit is MAX_METADATA_DEPTH); it is deeper "
                    f"at {_where(i, path)}")
            if isinstance(v, Mapping):
                for key, x in v.items():
                    if not isinstance(key, str):  # JSON would turn it into a string, or drop it
                        raise TypeError(f"{_where(i, path)}: keys must be strings, got {key!r}")
                    check_text(key, f"{_where(i, path)}: the key {key!r}")
                    stack.append((x, (*path, key), depth + 1))
            else:
                stack.extend((x, (*path, j), depth + 1) for j, x in enumerate(v))


def _where(i: int, path: tuple[Any, ...]) -> str:
    shown = "".join(f"[{k!r}]" for k in path[:8]) + ("[...]" if len(path) > 8 else "")
    return f"metadata[{i}]{shown}"


def validate_metadata(metadata: Sequence[Mapping[str, Any] | None] | None, n: int) -> list[dict]:
    """Metadata: one JSON-serialisable dict per document (``None`` means ``{}``), within the
    limits every backend shares (:class:`~uibk_embedding.errors.InvalidInput` past them): at most
    :data:`MAX_METADATA_DEPTH` levels of dicts and lists, keys and strings valid Unicode (no
    lone surrogate) without a NUL character (PostgreSQL's jsonb cannot hold one), integers
    within signed 64 bits
    (:data:`~uibk_embedding.adapters.filters.MIN_INT` .. :data:`~uibk_embedding.adapters.filters.MAX_INT`).

    >>> validate_metadata([{"lang": "en", "n": 2**63 - 1}, None], 2)
    [{'lang': 'en', 'n': 9223372036854775807}, {}]
    >>> validate_metadata([{"n": 2**64}], 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.InvalidInput: metadata[0]['n']: the integer 18446744073709551616 is outside ...
    >>> validate_metadata([{"tags": ["ok", "a\\x00b"]}], 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.InvalidInput: metadata[0]['tags'][1] holds a NUL character, which ...
    """
    if metadata is None:
        return [{} for _ in range(n)]
    if isinstance(metadata, Mapping):
        raise TypeError("metadata must be a list with one dict per document, not one dict")
    md = list(metadata)
    if len(md) != n:
        raise ValueError(f"got {n} ids but {len(md)} metadata entries")
    out = []
    for i, m in enumerate(md):
        if m is None:
            out.append({})
            continue
        if not isinstance(m, Mapping):
            raise TypeError(f"metadata[{i}] must be a dict, got {type(m).__name__}")
        for key in m:
            if not isinstance(key, str) or not key:
                raise TypeError(f"metadata[{i}]: keys must be non-empty strings, got {key!r}")
            if key.startswith(RESERVED_PREFIX):
                raise ValueError(f"metadata[{i}]: key {key!r} uses the reserved prefix {RESERVED_PREFIX!r}")
        _check_metadata_tree(m, i)  # before json.dumps, which recurses
        try:
            text = json.dumps(m, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"metadata[{i}] is not JSON-serialisable: {e}") from None
        copy = json.loads(text)  # a deep, JSON-clean copy: the caller may mutate theirs
        if "\\u0000" in text:  # JSON's spelling of NUL (or of a backslash and "u0000": look)
            nul = " holds a NUL character, which not every backend can store (PostgreSQL's jsonb cannot)"
            stack: list[tuple[Any, tuple[Any, ...]]] = [(copy, ())]  # at most MAX_METADATA_DEPTH deep
            while stack:
                v, path = stack.pop()
                if isinstance(v, str) and "\x00" in v:
                    raise InvalidInput(f"{_where(i, path)}{nul}")
                if isinstance(v, dict):
                    for key, x in v.items():
                        if "\x00" in key:
                            raise InvalidInput(f"{_where(i, path)}: the key {key!r}{nul}")
                        stack.append((x, (*path, key)))
                elif isinstance(v, list):
                    stack.extend((x, (*path, j)) for j, x in enumerate(v))
        out.append(copy)
    return out


def check_positive(name: str, value: Any, *, allow_zero: bool = False, allow_none: bool = False) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is a positive int (or 0 / None if allowed):
    the one check of every count option (``candidates``, ``batch_size``, ``m``, ...).

    >>> check_positive("batch_size", 0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be a positive int, got 0
    """
    if value is None and allow_none:
        return
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {kind} int{' or None' if allow_none else ''}, got {value!r}")


def check_flag(name: str, value: Any) -> bool:
    """``value`` as a bool, else a ``TypeError`` naming ``name`` (``"false"`` or ``0`` is no flag:
    ``bool()`` would read the string as True).

    >>> check_flag("exact", "false")
    Traceback (most recent call last):
    ...
    TypeError: exact must be True or False, got 'false'
    """
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Collection[Any]) -> None:
    """``ValueError`` naming ``name`` and every valid choice unless ``value`` is one of ``choices``.

    >>> check_choice("mode", "fast", ("exact", "index"))
    Traceback (most recent call last):
    ...
    ValueError: mode must be one of ('exact', 'index'), got 'fast'
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


MAX_K = 2**31 - 1
"""The largest ``k`` a search takes (engines keep it in a C int or long; past it they overflowed)."""


def validate_k(k: Any, name: str = "k") -> int:
    """``k`` as an int in 1 .. :data:`MAX_K` (a larger ``k`` than the store's count returns every
    document), else a ``TypeError`` / ``ValueError`` naming it (``name``: the caller's word for
    it, e.g. MMR's ``fetch_k``).

    >>> validate_k(10), validate_k(np.int64(3))
    (10, 3)
    >>> validate_k(0, "fetch_k")
    Traceback (most recent call last):
    ...
    ValueError: fetch_k must be positive, got 0
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(k).__name__}")
    if k <= 0:
        raise ValueError(f"{name} must be positive, got {k}")
    if k > MAX_K:
        raise ValueError(f"{name} must be at most {MAX_K:,} (MAX_K), got {k}")
    return int(k)


# -- a closed store refuses every call ---------------------------------------------------------
_CHECKED = "__uibk_refuses_when_closed__"


def _closed_error(store: MultiVectorStore, what: str) -> StoreInUse:
    """The one error of a call on a closed store, naming the store, where it is and the call."""
    return StoreInUse(f"this {type(store).__name__} ({store._location()}) is closed; {what} needs an "
                      "open store: open it again")


def _refuse_when_closed(method: Any, what: str | None = None) -> Any:
    """``method``, raising :class:`StoreInUse` once the store was closed (before any engine call);
    ``what`` names it in the message (default ``name()``)."""

    @functools.wraps(method)
    def wrapper(self: MultiVectorStore, *args: Any, **kwargs: Any) -> Any:
        if self._store_closed:
            raise _closed_error(self, what or f"{method.__name__}()")
        return method(self, *args, **kwargs)

    setattr(wrapper, _CHECKED, True)
    return wrapper


def unknown_options(where: str, given: Iterable[str], valid: Sequence[str]) -> None:
    """``TypeError`` naming the ``given`` option names that are not ``valid`` and listing the
    valid ones: the one message of every unknown constructor or search option.

    >>> unknown_options("ExactStore()", ["pth"], ["path", "format"])
    Traceback (most recent call last):
    ...
    TypeError: ExactStore() got unknown option(s) pth; it takes path, format
    """
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise TypeError(f"{where} got unknown option(s) {', '.join(unknown)}; "
                        f"it takes {', '.join(valid) or 'no options'}")


def _checking_options(init: Any) -> Any:
    """A constructor that refuses an unknown keyword with the list of its options (one that
    forwards ``**kwargs`` is left to the constructor it forwards them to)."""
    params = list(inspect.signature(init).parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return init
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    public = [x for x in named if not x.startswith("_")]

    @functools.wraps(init)
    def wrapper(self: MultiVectorStore, *args: Any, **kwargs: Any) -> None:
        if not set(kwargs) <= set(named):
            unknown_options(f"{type(self).__name__}()", kwargs, public)
        init(self, *args, **kwargs)

    setattr(wrapper, _CHECKED, True)
    return wrapper


def _closing(close: Any) -> Any:
    """``close``, run once: a second call does nothing; when the outermost call ends (also by an
    error: the store's resources are then in an unknown state), the store counts as closed."""

    @functools.wraps(close)
    def wrapper(self: MultiVectorStore) -> None:
        if self._store_closed:
            return
        depth = self.__dict__.get("_close_depth", 0)  # a subclass's close calls super().close()
        self._close_depth = depth + 1
        try:
            close(self)
        finally:
            self._close_depth = depth
            if depth == 0:
                self._store_closed = True

    setattr(wrapper, _CHECKED, True)
    return wrapper


def _dropping(drop: Any) -> Any:
    """``drop``, refused when closed like every method, that closes the store once the store's
    data is gone: a dropped store refuses later calls as a closed one (:class:`StoreInUse`), on
    every backend, where each engine failed its own way (a missing table or collection)."""
    checked = _refuse_when_closed(drop)

    @functools.wraps(drop)
    def wrapper(self: MultiVectorStore, *args: Any, **kwargs: Any) -> Any:
        out = checked(self, *args, **kwargs)
        self.close()
        return out

    setattr(wrapper, _CHECKED, True)
    return wrapper


# -- the interface -----------------------------------------------------------------------------
class MultiVectorStore(ABC):
    """Abstract store of tagged multi-vectors; see the module docstring for an example.

    Subclasses set ``backend`` (the name ``open_store`` knows them by) and ``exact`` (whether
    ``search`` returns exactly the MaxSim top-k) and implement ``_upsert``, ``_delete``,
    ``_search``, ``_get``, ``_scan`` and ``count``. ``_search`` gets a validated float32 query, ``k`` and
    parsed filter conditions.

    A closed store (:meth:`close`) refuses every public method with
    :class:`~uibk_embedding.errors.StoreInUse`, on every backend: the methods here, ``count``
    and every public method and property a subclass (or a mixin) defines are wrapped when the subclass
    is created (:meth:`__init_subclass__`); ``close()`` again does nothing. A backend's ``drop()``
    (the server stores') closes the store once it has removed the data.

    >>> from uibk_embedding.adapters.exact import ExactStore
    >>> store = ExactStore()
    >>> store.close(); store.close()
    >>> store.count()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.StoreInUse: this ExactStore (in memory) is closed; count() needs an open ...
    """

    _store_closed: bool = False
    _guard: Any = contextlib.nullcontext()
    """The lock of this store object's threads where the engine needs one (:func:`serialized`);
    it also makes the default :meth:`_delete_where`'s listing and delete one step."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap the subclass's public methods (and its mixins') so that a closed store refuses
        them, and its ``close`` so that it marks the store closed (once)."""
        super().__init_subclass__(**kwargs)
        init = vars(cls).get("__init__")
        if init is not None and not getattr(init, _CHECKED, False):
            cls.__init__ = _checking_options(init)  # type: ignore[method-assign]
        for klass in cls.__mro__:
            if klass in (MultiVectorStore, ABC, object):
                continue
            for name, value in list(vars(klass).items()):
                if name.startswith("_") or inspect.getattr_static(cls, name) is not value:
                    continue  # private, or overridden nearer to cls
                if isinstance(value, property) and value.fget and not getattr(value.fget, _CHECKED, False):
                    setattr(cls, name, property(_refuse_when_closed(value.fget, f"reading {name}"),
                                                value.fset, value.fdel, value.__doc__))
                elif inspect.isfunction(value) and not getattr(value, _CHECKED, False):
                    wrap = {"close": _closing, "drop": _dropping}.get(name, _refuse_when_closed)
                    setattr(cls, name, wrap(value))

    def _check_open(self, what: str = "this call") -> None:
        """:class:`StoreInUse`, with the message every closed store gives, once the store is
        closed: for an engine to call under its own lock, where a ``close()`` from another thread
        may have run since the public method's check (an engine that sets ``_closed`` under that
        lock when it closes is seen as closed at once).

        >>> from uibk_embedding.adapters.exact import ExactStore
        >>> store = ExactStore()
        >>> store._check_open()
        >>> store.close(); store._check_open("the write")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        uibk_embedding.errors.StoreInUse: this ExactStore (in memory) is closed; the write needs an open ...
        """
        if self._store_closed or self.__dict__.get("_closed", False):
            raise _closed_error(self, what)

    def _location(self) -> str:
        """Where the store lives, for messages: its path, server or collection."""
        for attr in ("path", "where", "url", "collection", "table"):
            v = self.__dict__.get(attr)
            if isinstance(v, str | os.PathLike) and str(v):
                return str(v)
        return "in memory"

    backend: ClassVar[str] = "abstract"
    exact: ClassVar[bool] = True
    filter_operators: ClassVar[frozenset[str]] = BASIC
    """The operators of :mod:`~uibk_embedding.adapters.filters` this backend translates to its
    engine's native filter; a filter using another is refused before anything is sent."""
    search_options: ClassVar[tuple[str, ...]] = ()
    """Per-query options ``search`` and ``search_batch`` accept beyond ``k`` and ``filter`` (each
    documented in the backend's class docstring). Given ones are passed on to ``_search``,
    ``_search_explained`` and ``_search_batch`` as keyword arguments, which check their values;
    a name not declared here is refused with the list of declared ones."""

    def __init__(self, format: TaggedFormat | None = None) -> None:
        self.format = format or TaggedFormat()

    # public API -----------------------------------------------------------------------------
    @_refuse_when_closed
    def upsert(
        self,
        ids: Sequence[str],
        multivectors: Sequence[np.ndarray],
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> None:
        """Insert or overwrite documents. Every input is checked before anything is written."""
        ids = validate_ids(ids)
        if isinstance(multivectors, np.ndarray) and multivectors.ndim == 2:
            raise TypeError("multivectors must be a list of (n, 128) arrays, one per id")
        mvs = list(multivectors)
        if len(mvs) != len(ids):
            raise ValueError(f"got {len(ids)} ids but {len(mvs)} multivectors")
        arrays = [
            validate_document(x, f"multivectors[{i}] (id {ids[i]!r})", self.format) for i, x in enumerate(mvs)
        ]
        md = validate_metadata(metadata, len(ids))
        if not ids:
            return
        with self._guard:
            self._upsert(ids, arrays, md)

    @_refuse_when_closed
    def delete(self, ids: Sequence[str] | None = None, *, filter: Filter | None = None) -> int | None:
        """Delete documents by id, or every document whose metadata matches ``filter``.

        By id (``delete(ids)``): ids that are not stored are ignored (not an error); returns
        None. By filter (``delete(filter={...})``): every match is deleted with the engine's own
        filtered delete or listing (never an approximate search), and the number deleted is
        returned; ``filter={}`` deletes every document.
        """
        if (ids is None) == (filter is None):
            raise TypeError("delete() takes ids or filter=..., exactly one of them")
        if filter is not None:
            return self._delete_where(self._parse_filter(filter))
        ids = validate_ids(ids, unique=False)
        if ids:
            with self._guard:
                self._delete(list(dict.fromkeys(ids)))
        return None

    @_refuse_when_closed
    def scan(self, filter: Filter | None = None, *, batch_size: int = 1000) -> Iterator[tuple[str, dict]]:
        """Every stored ``(id, metadata)`` whose metadata matches ``filter`` (all without one),
        read from the engine ``batch_size`` at a time. The order is the engine's; a document
        written or deleted while the scan runs may or may not be listed."""
        conds = self._parse_filter(filter)
        check_positive("batch_size", batch_size)
        for page in self._scan(conds, batch_size):
            if self._store_closed:  # closed while the caller iterates
                raise StoreInUse(f"this {type(self).__name__} ({self._location()}) was closed during scan()")
            yield from page

    @_refuse_when_closed
    def search(
        self, query: np.ndarray, k: int = 10, filter: Filter | None = None, *, explain: bool = False,
        **options: Any,
    ) -> list[Hit]:
        """The ``k`` documents with the highest MaxSim against ``query``, best first.

        ``filter`` restricts the candidates (see :mod:`~uibk_embedding.adapters.filters`);
        ``explain=True`` attaches each hit's :class:`Decomposition` (from the stored vectors);
        ``options`` are the backend's declared :attr:`search_options` (None: the store's default).
        """
        opts = self._given_options(options)
        q = validate_query(query, format=self.format)
        k = validate_k(k)
        conds = self._parse_filter(filter)
        if explain:
            return with_relevance(q, self._search_explained(q, k, conds, **opts))
        return with_relevance(q, self._search(q, k, conds, **opts))

    @_refuse_when_closed
    def search_batch(
        self, queries: Sequence[np.ndarray], k: int = 10, filter: Filter | None = None, **options: Any
    ) -> list[list[Hit]]:
        """``search`` for many queries (backends may answer them in one call)."""
        opts = self._given_options(options)
        qs = [validate_query(q, f"queries[{i}]", self.format) for i, q in enumerate(queries)]
        k = validate_k(k)
        conds = self._parse_filter(filter)
        if not qs:
            return []
        return [with_relevance(q, hits) for q, hits in zip(qs, self._search_batch(qs, k, conds, **opts),
                                                          strict=True)]

    def _parse_filter(self, filter: Filter | None) -> tuple[Node, ...]:
        """``parse_filter``, refusing operators this backend does not translate (and a native
        Qdrant filter, which only the Qdrant backends take)."""
        native_filter_refused(filter, self.backend)
        conds = parse_filter(filter)
        missing = operators(conds) - self.filter_operators
        if missing:
            raise ValueError(
                f"filter operator(s) {', '.join(sorted(missing))} are not supported by the "
                f"{self.backend} backend (it translates {', '.join(sorted(self.filter_operators))})")
        return conds

    def _given_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The per-query options that were given (not None), refusing undeclared names."""
        unknown_options(f"{type(self).__name__}.search()", options, self.search_options)
        return {name: v for name, v in options.items() if v is not None}

    @_refuse_when_closed
    def get(self, ids: Sequence[str]) -> list[Record]:
        """Stored records for the ids that exist, in the order asked (missing ids skipped)."""
        ids = validate_ids(ids, unique=False)
        found = {r.id: r for r in self._get(list(dict.fromkeys(ids)))} if ids else {}
        return [Record(x, found[x].vectors.copy(), json.loads(json.dumps(found[x].metadata)))
                for x in ids if x in found]  # copies: a caller's edit never reaches a cache

    @_refuse_when_closed
    def explain(self, query: np.ndarray, doc_id: str) -> Decomposition:
        """The decomposition of ``MaxSim(query, doc)`` for one stored document."""
        q = validate_query(query, format=self.format)
        rec = self.get([doc_id])
        if not rec:
            raise KeyError(f"no document with id {doc_id!r}")
        return decompose(q, rec[0].vectors, self.format)

    @abstractmethod
    def count(self) -> int:
        """Number of stored documents."""

    @_refuse_when_closed
    def stats(self) -> dict[str, Any]:
        """What the store holds and what it costs, the same keys on every backend:

        * ``documents``: stored documents; ``vectors``: their stored rows (vectors);
        * ``bytes_on_disk``: every file of the store's local folder or file (ids, metadata,
          indexes and logs included); ``None`` where the store lives on a server or in memory
          without a folder (unknown here);
        * ``resident_bytes``: what the store keeps in memory or must map whole for a search
          (the rule is the backend's: the file-backed stores count the rows a search scans plus
          their document table, :meth:`~uibk_embedding.adapters.indexed.IndexedStore.stats`);
          ``None`` where the engine does not say (servers, Qdrant's and LanceDB's own files).

        Backends add their own keys (which path answers a search, and why).

        >>> from uibk_embedding.adapters.exact import ExactStore
        >>> s = ExactStore()
        >>> {k: s.stats()[k] for k in ("documents", "vectors", "bytes_on_disk", "resident_bytes")}
        {'documents': 0, 'vectors': 0, 'bytes_on_disk': 0, 'resident_bytes': 0}
        """
        return {"documents": self.count(), "vectors": self._stored_vectors(),
                "bytes_on_disk": self._bytes_on_disk(), "resident_bytes": self._resident_bytes()}

    def _stored_vectors(self) -> int:
        """Rows stored: by default every document read back (engines that count rows natively
        override this)."""
        ids = [x for page in self._scan((), 1000) for x, _ in page]
        return sum(len(r.vectors) for i in range(0, len(ids), 256) for r in self._get(ids[i:i + 256]))

    def _bytes_on_disk(self) -> int | None:
        """Bytes of the store's local folder or file (its ``path``, ``uri`` or ``where`` when that
        names one on this machine), else None."""
        for attr in ("path", "uri", "where"):
            v = self.__dict__.get(attr)
            if isinstance(v, str | os.PathLike) and "://" not in str(v) and os.path.exists(v):
                return folder_bytes(v)
        return None

    def _resident_bytes(self) -> int | None:
        """What a search needs in memory (see :meth:`stats`); None: the engine does not say."""
        return None

    @_closing  # noqa: B027 - optional hook, a no-op for stores without resources
    def close(self) -> None:
        """Release resources (files, connections). Every later call raises
        :class:`~uibk_embedding.errors.StoreInUse`; ``close()`` again does nothing."""

    def __enter__(self) -> MultiVectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @_refuse_when_closed
    def __len__(self) -> int:
        return self.count()

    # for subclasses ---------------------------------------------------------------------
    @abstractmethod
    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None: ...

    @abstractmethod
    def _delete(self, ids: list[str]) -> None: ...

    @abstractmethod
    def _search(self, query: np.ndarray, k: int, conditions: tuple[Node, ...],
                **options: Any) -> list[Hit]: ...

    def _search_batch(
        self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...], **options: Any
    ) -> list[list[Hit]]:
        return [self._search(q, k, conditions, **options) for q in queries]

    @abstractmethod
    def _get(self, ids: list[str]) -> list[Record]:
        """The stored records of ``ids`` (unique) that exist, in any order; :meth:`get` orders
        and copies them."""

    @abstractmethod
    def _scan(self, conditions: tuple[Node, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        """Pages (of at most about ``batch_size``) of ``(id, metadata)`` matching ``conditions``."""

    def _delete_where(self, conditions: tuple[Node, ...]) -> int:
        """Delete every match; returns how many. Default: list the matches with ``_scan``, then
        one ``_delete``, under ``_guard`` (a write between them could make a listed document stop
        matching, and it was deleted all the same). Engines with a native filtered delete override
        this."""
        with self._guard:
            ids = list(dict.fromkeys(x for page in self._scan(conditions, 1000) for x, _ in page))
            if ids:
                self._delete(ids)
            return len(ids)

    def _search_explained(self, q: np.ndarray, k: int, conditions: tuple[Node, ...],
                          **options: Any) -> list[Hit]:
        """``_search`` with each hit's decomposition. Default: a second ``get`` for the hits'
        vectors; backends whose engine returns them with the search override this."""
        return self._explain(q, self._search(q, k, conditions, **options))

    def _explain(self, q: np.ndarray, hits: list[Hit]) -> list[Hit]:
        records = {r.id: r for r in self.get([h.id for h in hits])}
        for h in hits:
            if h.id in records:
                h.decomposition = decompose(q, records[h.id].vectors, self.format)
        return hits


class BatchSearch:
    """For engines that search a batch of queries at once: a search, explained or not, is a
    batch of one of ``_search_batch(queries, k, conditions, explain=False, **options)``.
    Listed before :class:`MultiVectorStore` among the bases.

    >>> from uibk_embedding.adapters.exact import ExactStore
    >>> issubclass(ExactStore, BatchSearch)
    True
    """

    def _search(self, query: np.ndarray, k: int, conditions: tuple[Node, ...], **options: Any) -> list[Hit]:
        return self._search_batch([query], k, conditions, **options)[0]  # type: ignore[attr-defined]

    def _search_explained(self, q: np.ndarray, k: int, conditions: tuple[Node, ...],
                          **options: Any) -> list[Hit]:
        return self._search_batch([q], k, conditions, explain=True, **options)[0]  # type: ignore[attr-defined]


def folder_bytes(path: str | os.PathLike) -> int:
    """Bytes of the files under ``path`` (or of the file ``path``); files that vanish meanwhile
    (a writer's compaction) are not counted.

    >>> import tempfile
    >>> folder_bytes(tempfile.mkdtemp())
    0
    """
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def finite_score(x: float) -> float:
    """Scores handed back by engines, as Python floats (refusing NaN)."""
    x = float(x)
    if math.isnan(x):
        raise RuntimeError("the backend returned a NaN score")
    return x


def renamed_option(new_name: str, new: Any, old_name: str, old: Any, *, stacklevel: int = 3) -> Any:
    """The value of option ``new_name``, also accepted under its deprecated ``old_name`` (with a
    :class:`DeprecationWarning`); None when neither is given, ``TypeError`` when both are.

    >>> renamed_option("candidates", 50, "n_rerank", None)
    50
    """
    if old is None:
        return new
    warnings.warn(f"{old_name} is deprecated; use {new_name}", DeprecationWarning, stacklevel=stacklevel)
    if new is not None:
        raise TypeError(f"give {new_name} or {old_name} (its deprecated name), not both")
    return old


