"""The tiny filter language every backend translates.

A filter is a mapping from metadata field to a condition; all conditions must hold (AND):

* ``{"lang": "en"}`` or ``{"lang": {"$eq": "en"}}``: the field equals the value;
* ``{"year": {"$in": [2023, 2024]}}``: the field equals one of the values.

Values are strings, integers, floats or booleans. A document without the field never matches
(so a filter on a field no document has returns no hits: that is the documented behaviour on
every backend, not an error). ``True`` does not equal ``1``: types must match.

Example
-------
>>> f = parse_filter({"lang": "en", "year": {"$in": [2023, 2024]}})
>>> [c.field for c in f]
['lang', 'year']
>>> matches({"lang": "en", "year": 2024}, f), matches({"lang": "en"}, f)
(True, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Scalar = str | int | float | bool
Filter = Mapping[str, Any]

OPERATORS = ("$eq", "$in")


@dataclass(frozen=True)
class Condition:
    """``field`` equals one of ``values`` (one value for ``$eq``)."""

    field: str
    op: str  # "$eq" or "$in"
    values: tuple[Scalar, ...]


def _check_value(field: str, v: Any) -> Scalar:
    if isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"filter on {field!r}: value {v} is not a finite number")
        return v
    raise TypeError(
        f"filter on {field!r}: values must be str, int, float or bool, got {type(v).__name__}"
    )


def parse_filter(filter: Filter | None) -> tuple[Condition, ...]:
    """Validate a filter and return its conditions (empty for ``None`` or ``{}``)."""
    if filter is None:
        return ()
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a mapping of field -> condition, got {type(filter).__name__}")
    out = []
    for field, cond in filter.items():
        if not isinstance(field, str) or not field:
            raise ValueError(f"filter field names must be non-empty strings, got {field!r}")
        if isinstance(cond, Mapping):
            if len(cond) != 1 or next(iter(cond)) not in OPERATORS:
                raise ValueError(
                    f"filter on {field!r}: a condition is a value, {{'$eq': value}} or "
                    f"{{'$in': [values]}}, got {dict(cond)!r}"
                )
            op, arg = next(iter(cond.items()))
            if op == "$in":
                if isinstance(arg, str | bytes) or not hasattr(arg, "__iter__"):
                    raise TypeError(f"filter on {field!r}: $in takes a list of values, got {arg!r}")
                values = tuple(_check_value(field, v) for v in arg)
                if not values:
                    raise ValueError(f"filter on {field!r}: $in needs at least one value")
            else:
                values = (_check_value(field, arg),)
            out.append(Condition(field, op, values))
        else:
            out.append(Condition(field, "$eq", (_check_value(field, cond),)))
    return tuple(out)


def _equal(a: Any, b: Scalar) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return isinstance(a, int | float) and a == b


def matches(metadata: Mapping[str, Any] | None, conditions: tuple[Condition, ...]) -> bool:
    """Whether one document's metadata satisfies all ``conditions``."""
    md = metadata or {}
    for c in conditions:
        if c.field not in md:
            return False
        v = md[c.field]
        if not any(_equal(v, x) for x in c.values):
            return False
    return True
