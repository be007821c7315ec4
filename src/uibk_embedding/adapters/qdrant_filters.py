"""The filter language as Qdrant conditions, for the client (``qdrant_client.models``) and for
Qdrant Edge (``qdrant_edge``): one translation, two small dialects.

Qdrant's own matching differs from :func:`~uibk_embedding.adapters.filters.matches` in three
places, and the translation closes each gap:

* numbers: ``MatchValue(1)`` does not match ``1.0``, so a number is the range ``[v, v]``
  (integers of magnitude 2**53 or more, which a float64 range cannot tell apart: ``2**53 + 1``
  rounds to ``2**53``, match exactly). Qdrant's
  ranges are float64, so a *range* (``$gt`` ...) near an integer beyond 2**53 compares as float64
  does (``2**62 + 1`` is not ``$gt 2**62`` on Edge; local mode compares the stored int exactly
  against the float64 bound);
* lists: a condition on a list-valued payload field matches any element; the stored payload
  names its list-valued fields under ``_uibk_lists`` and every comparison excludes them
  (``$exists`` does not: a non-empty list is present);
* Edge matches no booleans, so Edge points carry ``'["field", true]'`` tokens under ``_uibk_bools``.

``$exists`` is Qdrant's ``IsEmpty`` (missing, null or ``[]``) negated; ``$not`` is
``must_not``; ``$or`` is ``should``.

Example
-------
>>> from uibk_embedding.adapters.filters import parse_filter
>>> f = to_qdrant_filter("client", parse_filter({"year": {"$gt": 1990}}))
>>> f.must[0].must[0].range.gt, f.must[0].must_not[0].key, f.must[0].must_not[0].match.value
(1990.0, '_uibk_lists', 'year')
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from uibk_embedding.adapters.base import RESERVED_PREFIX
from uibk_embedding.adapters.filters import (
    NATIVE_FILTER_TYPES,
    And,
    Node,
    Not,
    Or,
    native_filter_kind,
    native_filter_refused,
)

LISTS_KEY = f"{RESERVED_PREFIX}_lists"
BOOLS_KEY = f"{RESERVED_PREFIX}_bools"
MAX_SAFE_INT = 2**53
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def json_key(field: str) -> str:
    """A metadata field name as a Qdrant JSON path: plain names as they are, others quoted
    (so ``"a.b"`` is the top-level key ``a.b``, not the nested path ``a`` -> ``b``).

    >>> json_key("lang"), json_key("a.b")
    ('lang', '"a.b"')
    """
    if _PLAIN_KEY.fullmatch(field):
        return field
    if '"' in field or "\\" in field:  # Edge's JSON path parser takes neither
        raise ValueError(f"filter field {field!r} contains a double quote or a backslash, which a "
                         "Qdrant JSON path cannot express; rename the metadata field to filter on it")
    return f'"{field}"'


def bool_token(field: str, value: bool) -> str:
    """The entry of ``_uibk_bools`` that stands for ``field == value`` (Edge).

    >>> bool_token("a=b", True)
    '["a=b", true]'
    """
    return json.dumps([field, value], ensure_ascii=False)


def list_fields(metadata: dict) -> list[str]:
    """The fields whose values are lists (stored under ``_uibk_lists``).

    >>> list_fields({"tags": ["a"], "n": 1, "e": []})
    ['tags', 'e']
    """
    return [k for k, v in metadata.items() if isinstance(v, list)]


def split_values(values: Iterable[Any]) -> tuple[list[str], list[bool], list[int | float], list[int]]:
    """Filter values by how Qdrant must match them: strings, booleans, numbers compared as
    numbers (range ``[v, v]``: ``1`` matches ``1`` and ``1.0`` but never ``True``), and integers
    of magnitude 2**53 or more (exact integer match: a float64 range could not tell them apart;
    2**53 itself included, as ``2**53 + 1`` rounds to it).

    >>> split_values(["x", True, 1, 2**53 - 1, 2**53, -(2**53)])
    (['x'], [True], [1, 9007199254740991], [9007199254740992, -9007199254740992])
    """
    strs: list[str] = []
    bools: list[bool] = []
    nums: list[int | float] = []
    big: list[int] = []
    for v in values:
        if isinstance(v, bool):
            bools.append(v)
        elif isinstance(v, str):
            strs.append(v)
        elif isinstance(v, int) and abs(v) >= MAX_SAFE_INT:
            big.append(v)
        else:
            nums.append(v)
    return strs, bools, nums, big


@dataclass(frozen=True)
class Dialect:
    """How one Qdrant API spells the few conditions the translation uses."""

    filter: Callable[..., Any]  # Filter(must=, should=, must_not=)
    match_value: Callable[[str, Any], Any]  # key, value
    match_any: Callable[[str, list], Any]  # key, values
    range: Callable[[str, dict[str, float]], Any]  # key, {"gt": ...}
    is_empty: Callable[[str], Any]  # key
    bools: Callable[[str, str, list[bool]], Any]  # field, key, values


def _client_dialect() -> Dialect:
    from qdrant_client import models as m  # optional dependency: the qdrant extra

    return Dialect(
        filter=m.Filter,
        match_value=lambda k, v: m.FieldCondition(key=k, match=m.MatchValue(value=v)),
        match_any=lambda k, vs: m.FieldCondition(key=k, match=m.MatchAny(any=vs)),
        range=lambda k, r: m.FieldCondition(key=k, range=m.Range(**r)),
        is_empty=lambda k: m.IsEmptyCondition(is_empty=m.PayloadField(key=k)),
        bools=lambda _f, k, bs: m.Filter(should=[m.FieldCondition(key=k, match=m.MatchValue(value=b))
                                                 for b in bs]),
    )


def _edge_dialect() -> Dialect:
    import qdrant_edge as e  # optional dependency: the qdrant extra

    def bools(field: str, _key: str, bs: list[bool]) -> Any:
        toks = [bool_token(field, b) for b in bs]
        match = e.MatchValue(toks[0]) if len(toks) == 1 else e.MatchAny(toks)
        return e.FieldCondition(BOOLS_KEY, match=match)

    return Dialect(
        filter=e.Filter,
        match_value=lambda k, v: e.FieldCondition(k, match=e.MatchValue(v)),
        match_any=lambda k, vs: e.FieldCondition(k, match=e.MatchAny(vs)),
        range=lambda k, r: e.FieldCondition(k, range=e.RangeFloat(**{x: float(v) for x, v in r.items()})),
        is_empty=lambda k: e.IsEmptyCondition(k),
        bools=bools,
    )


#: the dialects by name, each built on first use (importing this module needs neither client)
DIALECTS: dict[str, Callable[[], Dialect]] = {"client": functools.cache(_client_dialect),
                                              "edge": functools.cache(_edge_dialect)}

_RANGE = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}


def _equal_any(d: Dialect, field: str, values: Sequence[Any]) -> Any:
    """``field`` is a scalar equal to one of ``values`` (never a list holding one)."""
    key = json_key(field)
    strs, bools, nums, big = split_values(values)
    alts: list[Any] = []
    if strs:
        alts.append(d.match_value(key, strs[0]) if len(strs) == 1 else d.match_any(key, strs))
    if bools:
        alts.append(d.bools(field, key, list(dict.fromkeys(bools))))
    alts += [d.range(key, {"gte": v, "lte": v}) for v in dict.fromkeys(nums)]
    if big:
        alts.append(d.match_any(key, big))
    return d.filter(must=[d.filter(should=alts)], must_not=[d.match_value(LISTS_KEY, field)])


def _node(d: Dialect, n: Node) -> Any:
    if isinstance(n, And):
        return d.filter(must=[_node(d, c) for c in n.children])
    if isinstance(n, Or):
        if not n.children:
            return d.filter(must_not=[d.filter(must=[])])  # nothing
        return d.filter(should=[_node(d, c) for c in n.children])
    if isinstance(n, Not):
        return d.filter(must_not=[_node(d, n.child)])
    key = json_key(n.field)
    if n.op == "$exists":
        empty = d.is_empty(key)
        return d.filter(must_not=[empty]) if n.values[0] else d.filter(must=[empty])
    if n.op in _RANGE:
        return d.filter(must=[d.range(key, {_RANGE[n.op]: n.values[0]})],
                        must_not=[d.match_value(LISTS_KEY, n.field)])
    eq = _equal_any(d, n.field, n.values)
    return eq if n.op in ("$eq", "$in") else d.filter(must_not=[eq])


# -- native filters: a Qdrant Filter object given as filter=, passed through untranslated --------
@dataclass(frozen=True)
class NativeFilter:
    """A Qdrant ``Filter`` of the store's own engine, given as ``filter=`` and passed to the
    engine as it is (as llama-index's ``qdrant_filters`` does): the conditions tuple the Qdrant
    stores carry instead of parsed conditions. It is Qdrant's own matching, not the filter
    language's (a condition on a list-valued field matches any element; Edge matches no booleans)."""

    filter: Any


def native_conditions(filter: Any, dialect: str, backend: str) -> tuple[NativeFilter] | None:
    """``(NativeFilter(filter),)`` when ``filter`` is a Qdrant ``Filter`` of ``dialect``; None when
    it is no Qdrant filter (parse it as the filter language); a ``TypeError`` naming the type to
    give when it is the other Qdrant engine's."""
    kind = native_filter_kind(filter)
    if kind is None:
        return None
    if kind != dialect:
        raise TypeError(
            f"the {backend} backend takes a native {NATIVE_FILTER_TYPES[dialect]}, got a "
            f"{NATIVE_FILTER_TYPES[kind]}; give that type, or a dict of the filter language")
    return (NativeFilter(filter),)


def to_qdrant_filter(dialect: str, conditions: tuple[Node, ...]) -> Any:
    """Parsed filter ``conditions`` as one Qdrant ``Filter`` in ``dialect`` ("client" or
    "edge"; None for no conditions); a :class:`NativeFilter` is its filter, untranslated."""
    if not conditions:
        return None
    if len(conditions) == 1 and isinstance(conditions[0], NativeFilter):
        return conditions[0].filter
    d = DIALECTS[dialect]()
    return d.filter(must=[_node(d, c) for c in conditions])


__all__ = ["BOOLS_KEY", "DIALECTS", "LISTS_KEY", "NativeFilter", "bool_token", "json_key", "list_fields",
           "native_conditions", "native_filter_kind", "native_filter_refused", "split_values",
           "to_qdrant_filter"]
