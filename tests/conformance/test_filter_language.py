"""The filter language on every backend, against the reference evaluation (property-based).

Random metadata (strings, ints, floats, bools, nulls, lists, missing fields, the same field
with different types in different documents) and random filters (every operator, nested
``$and``/``$or``/``$not`` up to depth 3) are drawn from a seeded generator; for each filter,
``scan``, ``search`` (k = every document) and ``search_batch`` must return exactly the documents
:func:`~uibk_embedding.adapters.filters.matches` accepts, and ``delete(filter=)`` must delete
exactly those. A backend's native translation (SQL, Milvus expressions, Qdrant conditions) is
what is tested: no backend filters a top-k after the search.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from uibk_embedding.adapters.filters import OPERATORS, matches, operators, parse_filter
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import BackendSpec, make_list

N_DOCS = 40
N_FILTERS = 60
FIELDS = ("s", "n", "b", "m", "zz")  # zz: a field no document has
STRINGS = ("a", "b", "ab", "A", "é", "1", "true", "")
NUMBERS = (-3, -1, 0, 1, 2, 7, 0.5, -1.5, 1.0, 2.0, 1e12, 2**40 + 1)
MIXED = (*STRINGS[:4], -1, 0, 1, 2.5, True, False, None, [], ["a"], [1, 2])


def random_metadata(r: random.Random) -> dict[str, Any]:
    md: dict[str, Any] = {}
    if r.random() < 0.85:
        md["s"] = r.choice(STRINGS)
    if r.random() < 0.85:
        md["n"] = r.choice(NUMBERS)
    if r.random() < 0.7:
        md["b"] = r.random() < 0.5
    if r.random() < 0.8:
        md["m"] = r.choice(MIXED)
    return md


def _value(r: random.Random, field: str) -> Any:
    pool = {"s": STRINGS, "n": NUMBERS, "b": (True, False)}.get(field)
    if pool is None or r.random() < 0.2:  # sometimes a value of another type
        pool = (*STRINGS[:3], -1, 0, 1, 2.5, True, False)
    return r.choice(pool)


def _number(r: random.Random) -> int | float:
    return r.choice((-2, -1, 0, 0.5, 1, 1.0, 1.5, 2, 3, 7, 1e12))


def random_leaf(r: random.Random) -> dict[str, Any]:
    field = r.choice(FIELDS)
    op = r.choice(("value", "$eq", "$ne", "$in", "$nin", "$gt", "$gte", "$lt", "$lte", "$exists"))
    if op == "value":
        return {field: _value(r, field)}
    if op in ("$in", "$nin"):
        return {field: {op: [_value(r, field) for _ in range(r.randint(1, 3))]}}
    if op == "$exists":
        return {field: {op: r.random() < 0.5}}
    if op in ("$gt", "$gte", "$lt", "$lte"):
        cond = {op: _number(r)}
        if r.random() < 0.3:  # a closed or half-open interval on one field
            other = {"$gt": "$lt", "$gte": "$lte", "$lt": "$gt", "$lte": "$gte"}[op]
            cond[other] = _number(r)
        return {field: cond}
    return {field: {op: _value(r, field)}}


def random_filter(r: random.Random, depth: int = 0) -> dict[str, Any]:
    roll = r.random()
    if depth >= 3 or roll < 0.45:
        return random_leaf(r)
    if roll < 0.65:
        return {"$or": [random_filter(r, depth + 1) for _ in range(r.randint(1, 3))]}
    if roll < 0.8:
        return {"$and": [random_filter(r, depth + 1) for _ in range(r.randint(1, 3))]}
    if roll < 0.9:
        return {"$not": random_filter(r, depth + 1)}
    out: dict[str, Any] = {}  # several keys at the top: an implicit AND
    for _ in range(2):
        out.update(random_leaf(r))
    return out


FIXED = [
    {},  # everything
    {"zz": 1},  # nothing
    {"zz": {"$ne": 1}},  # everything: a missing field is not equal
    {"n": {"$gt": 1e15}},  # nothing
    {"$or": [{"n": {"$gte": -1e15}}, {"n": {"$exists": False}}]},  # everything
    {"$not": {}},  # nothing
    {"m": {"$exists": True}},
    {"m": {"$exists": False}},
    {"n": {"$gte": 1, "$lte": 1}},  # 1 and 1.0, never True
    {"b": {"$ne": True}},
    {"s": {"$nin": ["a", "b"]}},
    {"m": {"$in": [1, True, "a"]}},
]


def _fill(spec: BackendSpec, where):
    store = spec.make(where)
    r, rng = random.Random(7), np.random.default_rng(7)
    ids = [f"doc-{i}" for i in range(N_DOCS)]
    docs = [make_list(TaggedFormat(), rng, int(rng.integers(4, 12))) for _ in ids]
    md = [random_metadata(r) for _ in ids]
    store.upsert(ids, docs, md)
    return store, dict(zip(ids, md, strict=True)), docs


@pytest.fixture(scope="module")
def filled_shared(spec: BackendSpec, tmp_path_factory):
    """The filled store, made once per spec and shared by the tests that only read it (scan,
    search, search_batch): they must not write to it."""
    filled = _fill(spec, tmp_path_factory.mktemp(f"shared-filter-{spec.name}"))
    try:
        yield filled
    finally:
        filled[0].close()


@pytest.fixture
def filled(spec: BackendSpec, tmp_path):
    """A filled store of its own, for a test that writes to it."""
    filled = _fill(spec, tmp_path)
    try:
        yield filled
    finally:
        filled[0].close()


def cases() -> list[dict[str, Any]]:
    r = random.Random(2026)
    return FIXED + [random_filter(r) for _ in range(N_FILTERS)]


def test_every_operator_is_generated():
    used = set().union(*(operators(parse_filter(f)) for f in cases()))
    assert used == set(OPERATORS)


def test_scan_and_search_return_exactly_the_matches(spec, filled_shared, fmt):
    store, stored, _docs = filled_shared
    supported = store.filter_operators
    q = make_list(fmt, np.random.default_rng(3), 6)
    checked = refused = 0
    for flt in cases():
        conds = parse_filter(flt)
        if not operators(conds) <= supported:
            with pytest.raises(ValueError, match="not supported by the"):
                list(store.scan(flt))
            refused += 1
            continue
        want = {x for x, m in stored.items() if matches(m, conds)}
        got = [x for x, _ in store.scan(flt, batch_size=16)]
        assert len(got) == len(set(got)), f"{spec.name}: duplicate ids in scan({flt})"
        assert set(got) == want, (f"{spec.name}: scan({flt}): extra {set(got) - want}, "
                                  f"missing {want - set(got)}")
        hits = store.search(q, k=N_DOCS, filter=flt)
        if spec.contract == "exact":
            assert {h.id for h in hits} == want, f"{spec.name}: search(filter={flt})"
        else:
            assert {h.id for h in hits} <= want, f"{spec.name}: search(filter={flt}) outside the filter"
        checked += 1
    assert checked + refused == len(cases())
    if supported >= set(OPERATORS):
        assert refused == 0


def test_search_batch_filters_like_search(spec, filled_shared, fmt):
    store, stored, _docs = filled_shared
    rng = np.random.default_rng(5)
    qs = [make_list(fmt, rng, 5) for _ in range(3)]
    for flt in [f for f in cases()[:40] if operators(parse_filter(f)) <= store.filter_operators]:
        want = {x for x, m in stored.items() if matches(m, parse_filter(flt))}
        for hits in store.search_batch(qs, k=N_DOCS, filter=flt):
            got = {h.id for h in hits}
            assert got == want if spec.contract == "exact" else got <= want, f"{spec.name}: {flt}"


def test_delete_by_filter_deletes_exactly_the_matches(spec, filled):
    store, stored, _docs = filled
    r = random.Random(11)
    left = dict(stored)
    for flt in [random_filter(r) for _ in range(6)] + [{}]:
        conds = parse_filter(flt)
        if not operators(conds) <= store.filter_operators:
            continue
        doomed = {x for x, m in left.items() if matches(m, conds)}
        assert store.delete(filter=flt) == len(doomed), f"{spec.name}: delete(filter={flt})"
        left = {x: m for x, m in left.items() if x not in doomed}
        assert {x for x, _ in store.scan()} == set(left), f"{spec.name}: after delete(filter={flt})"
    assert store.count() == 0


RESERVED_FILTERS = [{"_uibk_id": {"$exists": True}}, {"_uibk_id": "d0"},
                    {"$or": [{"s": "a"}, {"_uibk_lists": "y"}]},
                    {"$not": {"_uibk_bools": {"$exists": False}}}]


def test_filters_on_reserved_keys_are_refused_and_delete_nothing(spec, filled, fmt):
    """No metadata can hold a ``_uibk`` key, so on the exact store such a filter matched nothing,
    while on Qdrant it reached the store's own payload (``{"_uibk_id": {"$exists": True}}``
    matched every document, and ``delete(filter=)`` emptied the store). Refused everywhere."""
    store, stored, _docs = filled
    q = make_list(fmt, np.random.default_rng(4), 5)
    for flt in RESERVED_FILTERS:
        for call in (lambda f: list(store.scan(f)), lambda f: store.search(q, k=5, filter=f),
                     lambda f: store.search_batch([q], k=5, filter=f), lambda f: store.delete(filter=f)):
            with pytest.raises(ValueError, match="reserved prefix '_uibk'"):
                call(flt)
    assert {x for x, _ in store.scan()} == set(stored), f"{spec.name}: a refused filter deleted"


def _nots(depth: int) -> dict:
    f: dict = {"n": 1}
    for _ in range(depth):
        f = {"$not": f}
    return f


def test_filter_limits_are_refused_with_invalid_input_never_a_recursion_error():
    """The parser's limits (the same on every backend, since every backend parses with it):
    32 levels of $and/$or/$not, 64-bit integers, valid Unicode; exactly at a limit is fine."""
    from uibk_embedding.adapters.filters import MAX_FILTER_DEPTH, MAX_INT, MIN_INT
    from uibk_embedding.errors import InvalidInput

    assert MAX_FILTER_DEPTH == 32
    assert matches({"n": 2}, parse_filter(_nots(MAX_FILTER_DEPTH - 1)))  # 31 $not + the top level
    deep_or: dict = {"n": 1}
    for _ in range(MAX_FILTER_DEPTH - 1):
        deep_or = {"$or": [{"s": "a"}, deep_or]}
    assert matches({"n": 1}, parse_filter(deep_or))
    too_deep = [_nots(MAX_FILTER_DEPTH), _nots(5_000), {"$and": [{"$or": [_nots(40)]}]}]
    for flt in too_deep:
        with pytest.raises(InvalidInput, match="more than 32 levels"):
            parse_filter(flt)
    assert parse_filter({"n": {"$gte": MIN_INT, "$lte": MAX_INT}})
    assert (MIN_INT, MAX_INT) == (-(2**63 - 1), 2**63 - 1)
    for flt in [{"n": MAX_INT + 1}, {"n": {"$lt": MIN_INT - 1}}, {"n": {"$nin": [1, 2**70]}},
                {"n": {"$ne": -(2**100)}}]:
        with pytest.raises(InvalidInput, match="signed 64-bit"):
            parse_filter(flt)
    for flt in [{"s": "a\ud800"}, {"s\udfff": 1}, {"s": {"$in": ["ok", "\udc00"]}}]:
        with pytest.raises(InvalidInput, match="not valid Unicode"):
            parse_filter(flt)
    assert parse_filter({"s": True}) and parse_filter({"s": "😀"})  # bools are not ints; astral is fine
