"""The one filter language every backend translates to its engine's native filter.

A filter is a mapping. Its keys are metadata fields or the combinators ``$and``, ``$or``,
``$not``; several keys must all hold (AND). A field maps to a value (equality) or to a mapping
of operators, which must all hold:

=====================  ==========================================================================
``{"f": v}``           ``f`` equals ``v`` (same as ``{"f": {"$eq": v}}``)
``$eq`` / ``$ne``      equals / does not equal one value
``$in`` / ``$nin``     equals one of / none of a non-empty list of values
``$gt`` ``$gte``       greater than (or equal to) a number
``$lt`` ``$lte``       less than (or equal to) a number
``$exists``            ``True``: ``f`` is present and neither null nor an empty list; ``False``:
                       the opposite (LlamaIndex's ``IS_EMPTY``)
``$and`` / ``$or``     all / any of a non-empty list of filters
``$not``               the complement of one filter
=====================  ==========================================================================

The type rules are those of equality so far, on every backend: values are strings, integers,
floats or booleans; ``True`` does not equal ``1``; an int and a float compare by value; a string
never equals a number. Ranges compare numbers only: a range bound must be an int or a float
(never a bool), and a document whose field is a string, a bool, a list or missing is not in any
range. (Ranges on strings are refused: Qdrant's payload ranges are numeric, so a string range
could not mean the same thing on every engine.) A list-valued field equals nothing.

Field names are top-level metadata keys, dots included, on every backend: ``{"a.b": 1}`` matches
the metadata ``{"a.b": 1}``, never the nested ``{"a": {"b": 1}}`` (a dict-valued field equals
nothing, as a list-valued one; a dict as a condition, ``{"a": {"b": 1}}``, is read as operators
and refused). To filter on a nested value, store it flat, under its own top-level key.

>>> f = parse_filter({"a.b": 1})
>>> matches({"a.b": 1}, f), matches({"a": {"b": 1}}, f)
(True, False)
>>> parse_filter({"a": {"b": 1}})
Traceback (most recent call last):
...
ValueError: filter on 'a': 'b' is not an operator (they start with '$'); a nested path ...

Limits, the same on every backend (past them: :class:`~uibk_embedding.errors.InvalidInput`, a
``ValueError``, before any engine sees the filter): at most :data:`MAX_FILTER_DEPTH` levels
(the filter itself is level 1, each ``$and`` / ``$or`` / ``$not`` one more: 31 nested
combinators); integers within signed 64 bits (:data:`MIN_INT` .. :data:`MAX_INT`, that is
``-(2**63 - 1) .. 2**63 - 1``); field names and strings valid Unicode (no lone surrogate: every
engine encodes them as UTF-8). A field name with the reserved prefix :data:`RESERVED_PREFIX`
(``_uibk``) is refused: no metadata can hold one, and engines keep their own data under such
names (Qdrant's payload, LanceDB's columns), which a filter must not reach.

Negations are complements: ``$ne``, ``$nin`` and ``$not`` match every document the positive
form does not match, *including documents without the field*. To require the field as well,
add ``{"$exists": True}``. A filter on a field no document has matches nothing (and its ``$ne``
everything): never an error.

Example
-------
>>> f = parse_filter({"lang": "en", "year": {"$gte": 1990, "$lt": 2000}})
>>> matches({"lang": "en", "year": 1994}, f), matches({"lang": "en", "year": 2001}, f)
(True, False)
>>> g = parse_filter({"$or": [{"lang": {"$ne": "en"}}, {"draft": {"$exists": False}}]})
>>> matches({"lang": "en", "draft": True}, g), matches({"lang": "en"}, g), matches({}, g)
(False, True, True)
>>> sorted(operators(g))
['$exists', '$ne', '$or']
>>> parse_filter({"title": {"$gt": "m"}})
Traceback (most recent call last):
...
TypeError: filter on 'title': $gt compares numbers only (an int or a float), got 'm'
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from uibk_embedding.errors import InvalidInput
from uibk_embedding.tagged import check_text

Scalar = str | int | float | bool
Filter = Mapping[str, Any]
RESERVED_PREFIX = "_uibk"
"""Metadata keys and filter fields may not start with it: the stores' own fields do."""

EQUALITY = ("$eq", "$ne", "$in", "$nin")
RANGES = ("$gt", "$gte", "$lt", "$lte")
SQL_RANGES = dict(zip(RANGES, (">", ">=", "<", "<="), strict=True))
"""A range operator's comparison in SQL (PostgreSQL, LanceDB) and Milvus expressions."""
FIELD_OPERATORS = (*EQUALITY, *RANGES, "$exists")
COMBINATORS = ("$and", "$or", "$not")
OPERATORS = FIELD_OPERATORS + COMBINATORS
"""Every operator of the language. Backends declare which they translate (all of them for every
backend in this package but Weaviate, which refuses ranges and ``$exists``); a filter using
another is refused before it reaches the engine."""

BASIC = frozenset({"$eq", "$in"})
"""The operators of the first filter language (equality, AND only)."""

MIN_INT = -(2**63 - 1)
MAX_INT = 2**63 - 1
"""Integers in metadata and filters must lie in ``MIN_INT .. MAX_INT``: signed 64 bits, the
range every engine stores as an integer (Qdrant Edge turned ``2**70`` into a float), less its
lowest value ``-2**63``, which Milvus 2.3's filter expressions cannot state (they read
``-9223372036854775808`` as the negation of an out-of-range ``9223372036854775808``)."""

MAX_FILTER_DEPTH = 32
"""How many levels of ``$and`` / ``$or`` / ``$not`` a filter may nest (the top level is 1)."""


def check_int(value: int, where: str) -> int:
    """``value``, if it fits in signed 64 bits (:data:`MIN_INT` .. :data:`MAX_INT`); else
    :class:`InvalidInput`.

    >>> check_int(2**63 - 1, "n")
    9223372036854775807
    >>> check_int(2**70, "metadata[0]['n']")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.InvalidInput: metadata[0]['n']: the integer 1180591620717411303424 is outside ...
    """
    if not MIN_INT <= value <= MAX_INT:
        raise InvalidInput(
            f"{where}: the integer {_short(value)} is outside the signed 64-bit range every backend "
            "stores and filters on (-(2**63-1) .. 2**63-1); store it as a string or a float")
    return value


@dataclass(frozen=True)
class Condition:
    """One operator on one field: ``field`` ``op`` ``values``.

    ``values`` holds one value, except for ``$in``/``$nin`` (the list) and ``$exists`` (one
    bool). ``$eq`` and ``$in`` are positive equality, ``$ne`` and ``$nin`` their complements.
    """

    field: str
    op: str
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class And:
    """All of ``children`` hold."""

    children: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    """At least one of ``children`` holds."""

    children: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    """``child`` does not hold."""

    child: Node


Node = Union[Condition, And, Or, Not]  # noqa: UP007 - a runtime alias, used before 3.12 syntax


def _short(value: int) -> str:
    """An integer for a message (Python refuses ``str()`` past 4,300 digits)."""
    return str(value) if value.bit_length() <= 256 else f"of {value.bit_length()} bits"


def _check_value(field: str, v: Any) -> Scalar:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return check_int(v, f"filter on {field!r}")
    if isinstance(v, str):
        return check_text(v, f"filter on {field!r}: the value")
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"filter on {field!r}: value {v} is not a finite number")
        return v
    raise TypeError(
        f"filter on {field!r}: values must be str, int, float or bool, got {type(v).__name__}"
    )


def _check_number(field: str, op: str, v: Any) -> int | float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"filter on {field!r}: {op} compares numbers only (an int or a float), got {v!r}")
    return _check_value(field, v)  # type: ignore[return-value]  # finite check


def _values_list(field: str, op: str, arg: Any) -> tuple[Scalar, ...]:
    if isinstance(arg, str | bytes | Mapping) or not hasattr(arg, "__iter__"):
        raise TypeError(f"filter on {field!r}: {op} takes a list of values, got {arg!r}")
    values = tuple(_check_value(field, v) for v in arg)
    if not values:
        raise ValueError(f"filter on {field!r}: {op} needs at least one value")
    return values


def _field_conditions(field: str, cond: Any) -> list[Node]:
    if not isinstance(cond, Mapping):
        return [Condition(field, "$eq", (_check_value(field, cond),))]
    if not cond:
        raise ValueError(f"filter on {field!r}: an empty condition {{}}; give a value or an operator")
    out: list[Node] = []
    for op, arg in cond.items():
        if op in ("$eq", "$ne"):
            out.append(Condition(field, op, (_check_value(field, arg),)))
        elif op in ("$in", "$nin"):
            out.append(Condition(field, op, _values_list(field, op, arg)))
        elif op in RANGES:
            out.append(Condition(field, op, (_check_number(field, op, arg),)))
        elif op == "$exists":
            if not isinstance(arg, bool):
                raise TypeError(f"filter on {field!r}: $exists takes True or False, got {arg!r}")
            out.append(Condition(field, op, (arg,)))
        elif isinstance(op, str) and not op.startswith("$"):
            raise ValueError(
                f"filter on {field!r}: {op!r} is not an operator (they start with '$'); a nested "
                f"path such as {{{field!r}: {{{op!r}: ...}}}} cannot be filtered on: field names are "
                "top-level metadata keys, so store the value under a top-level key"
            )
        else:
            raise ValueError(
                f"filter on {field!r}: unknown operator {op!r}; the operators are "
                f"{', '.join(FIELD_OPERATORS)} (and {', '.join(COMBINATORS)} around filters)"
            )
    return out


def _parse(filter: Any, where: str, depth: int = 1) -> list[Node]:
    if depth > MAX_FILTER_DEPTH:  # checked before going deeper: never a RecursionError
        raise InvalidInput(f"the filter nests more than {MAX_FILTER_DEPTH} levels (the filter itself "
                           f"is level 1, each {', '.join(COMBINATORS)} one more; at {where})")
    if not isinstance(filter, Mapping):
        raise TypeError(f"{where} must be a mapping of field -> condition, got {type(filter).__name__}")
    out: list[Node] = []
    for key, cond in filter.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"filter field names must be non-empty strings, got {key!r}")
        check_text(key, "a filter field name")
        if key.startswith(RESERVED_PREFIX):
            raise ValueError(f"filter field {key!r} uses the reserved prefix {RESERVED_PREFIX!r}: "
                             "no metadata holds such a key")
        if key in ("$and", "$or"):
            if isinstance(cond, str | bytes | Mapping) or not hasattr(cond, "__iter__"):
                raise TypeError(f"{key} takes a list of filters, got {cond!r}")
            subs = list(cond)
            if not subs:
                raise ValueError(f"{key} needs at least one filter")
            children = tuple(_group(_parse(s, f"{key}[{i}]", depth + 1)) for i, s in enumerate(subs))
            out.append(And(children) if key == "$and" else Or(children))
        elif key == "$not":
            out.append(Not(_group(_parse(cond, "$not", depth + 1))))
        elif key.startswith("$"):
            raise ValueError(
                f"unknown filter operator {key!r} at the top of a filter: use {', '.join(COMBINATORS)} "
                f"there, and {', '.join(FIELD_OPERATORS)} inside a field's condition"
            )
        else:
            out.extend(_field_conditions(key, cond))
    return out


def _group(nodes: list[Node]) -> Node:
    """One node for a sub-filter: its only condition, or the AND of several (``{}``: all)."""
    return nodes[0] if len(nodes) == 1 else And(tuple(nodes))  # {}: And(()), which always holds


def flattened(node: Node) -> Node:
    """``node`` with the nesting that changes nothing taken out: a double negation, an AND inside
    an AND, an OR inside an OR (for engines whose parser limits how deep a filter nests).

    >>> c = Condition("n", "$eq", (1,))
    >>> flattened(Not(Not(Or((c, Or((c, Not(Not(c)))))))))
    Or(children=(Condition(field='n', op='$eq', values=(1,)), Condition(field='n', op='$eq', values=(1,)), \
Condition(field='n', op='$eq', values=(1,))))
    """
    if isinstance(node, Not):
        child = flattened(node.child)
        return child.child if isinstance(child, Not) else Not(child)
    if isinstance(node, And | Or):
        kind, children = type(node), []
        for c in map(flattened, node.children):
            children += c.children if isinstance(c, kind) else (c,)
        return kind(tuple(children))
    return node


def parse_filter(filter: Filter | None) -> tuple[Node, ...]:
    """Validate a filter and return its conditions, all of which must hold (empty for ``None``
    or ``{}``, which match every document).

    >>> parse_filter({"lang": "en"})
    (Condition(field='lang', op='$eq', values=('en',)),)
    >>> parse_filter({"n": {"$nin": [1, 2]}, "$not": {"x": True}})  # doctest: +NORMALIZE_WHITESPACE
    (Condition(field='n', op='$nin', values=(1, 2)),
     Not(child=Condition(field='x', op='$eq', values=(True,))))
    """
    if filter is None:
        return ()
    return tuple(_parse(filter, "filter"))


def walk(nodes: tuple[Node, ...] | Node) -> Iterator[Node]:
    """Every node of a parsed filter, parents before children."""
    stack: list[Node] = list(nodes) if isinstance(nodes, tuple) else [nodes]
    while stack:
        n = stack.pop(0)
        yield n
        if isinstance(n, And | Or):
            stack[:0] = list(n.children)
        elif isinstance(n, Not):
            stack.insert(0, n.child)


def operators(nodes: tuple[Node, ...]) -> set[str]:
    """The operators a parsed filter uses (``$and`` only for an explicit nested one)."""
    out: set[str] = set()
    for n in walk(nodes):
        if isinstance(n, Condition):
            out.add(n.op)
        else:
            out.add({And: "$and", Or: "$or", Not: "$not"}[type(n)])
    return out


def is_number(v: Any) -> bool:
    """An int or a float, never a bool (the numbers ranges and numeric equality see)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def equal(a: Any, b: Scalar) -> bool:
    """Stored value ``a`` equals filter value ``b`` under the type rules."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return is_number(a) and a == b


def present(md: Mapping[str, Any], field: str) -> bool:
    """What ``$exists: True`` tests: the field is there, not null and not an empty list."""
    v = md.get(field)
    return v is not None and v != []


def _holds(md: Mapping[str, Any], n: Node) -> bool:
    if isinstance(n, And):
        return all(_holds(md, c) for c in n.children)
    if isinstance(n, Or):
        return any(_holds(md, c) for c in n.children)
    if isinstance(n, Not):
        return not _holds(md, n.child)
    op = n.op
    if op == "$exists":
        return present(md, n.field) == n.values[0]
    if n.field not in md:
        return op in ("$ne", "$nin")
    v = md[n.field]
    if op in EQUALITY:
        hit = any(equal(v, x) for x in n.values)
        return hit if op in ("$eq", "$in") else not hit
    if not is_number(v):
        return False
    bound = n.values[0]
    return {"$gt": v > bound, "$gte": v >= bound, "$lt": v < bound, "$lte": v <= bound}[op]


def matches(metadata: Mapping[str, Any] | None, conditions: tuple[Node, ...]) -> bool:
    """Whether one document's metadata satisfies all ``conditions`` (the reference evaluation
    every backend's native translation is tested against)."""
    md = metadata or {}
    return all(_holds(md, c) for c in conditions)


NATIVE_FILTER_TYPES = {"client": "qdrant_client.models.Filter", "edge": "qdrant_edge.Filter"}


def native_filter_kind(obj: Any) -> str | None:
    """``"client"`` for a ``qdrant_client.models.Filter``, ``"edge"`` for a ``qdrant_edge.Filter``,
    else None; imports neither package (a filter of one exists only when it is installed).

    >>> native_filter_kind({"lang": "en"}) is None
    True
    >>> from qdrant_client import models
    >>> native_filter_kind(models.Filter(must=[models.FieldCondition(
    ...     key="lang", match=models.MatchValue(value="en"))]))
    'client'
    """
    cls = type(obj)
    if cls.__name__ != "Filter":
        return None
    top = cls.__module__.split(".")[0]
    return {"qdrant_client": "client", "qdrant_edge": "edge"}.get(top)


def native_filter_refused(filter: Any, backend: str) -> None:
    """A ``TypeError`` when ``filter`` is a native Qdrant ``Filter`` and ``backend`` is not a
    Qdrant backend (for callers before the store, e.g. the framework integrations).

    >>> from qdrant_client import models
    >>> native_filter_refused(models.Filter(must=[]), "exact")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: a native Qdrant filter (qdrant_client.models.Filter) works only on the qdrant and ...
    """
    kind = native_filter_kind(filter)
    if kind is not None and backend not in ("qdrant", "qdrant-edge"):
        raise TypeError(
            f"a native Qdrant filter ({NATIVE_FILTER_TYPES[kind]}) works only on the qdrant and "
            f"qdrant-edge backends, not on {backend}: give a dict of the filter language, "
            'e.g. {"lang": "en"}')
