"""Bad input against every backend: a precise error (or a documented behaviour), and the store
exactly as before (same count, same search results, nothing half-written)."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.adapters.base import MAX_ID_LENGTH
from uibk_embedding.errors import InvalidInput
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

FMT = TaggedFormat()
_rng = np.random.default_rng(7)
GOOD = make_list(FMT, _rng, 6)
# lists of another tagged format (the store's is FMT): a beta changes the token and slot tags, a
# lambda the slot tags only; a query's slot tags are compared per unit norm (its dense weight)
OTHER_BETA = make_list(TaggedFormat(beta=0.5), _rng, 6)
OTHER_LAMBDA = make_list(TaggedFormat(lambda_=0.5), _rng, 6)
OTHER_LAMBDA_WEIGHTED = make_list(TaggedFormat(lambda_=0.5), _rng, 6, dense_weight=4.0)


def _nan():
    x = GOOD.copy()
    x[4, 9] = np.nan
    return x


def _inf():
    x = GOOD.copy()
    x[0, 3] = np.inf
    return x


def _past_float32():
    """float64 with slot values past float32's range (finite here, inf once stored as float32)."""
    x = GOOD.astype(np.float64)
    x[:3] *= 1e39
    return x


def _nested(depth: int, kind: str = "dict"):
    """Metadata (or, for kind "$not", a filter with a valid leaf) nested ``depth`` levels deep,
    built without recursion."""
    x: object = {"f": 1} if kind == "$not" else 1
    for _ in range(depth):
        x = {"a": x} if kind == "dict" else [x] if kind == "list" else {"$not": x}
    return x


DEEP_DICT = _nested(100_000)
DEEP_LIST = {"l": _nested(100_000, "list")}
DEEP_FILTER = _nested(5_000, "$not")

# case -> (upsert arguments, expected exception, message fragment)
UPSERT_CASES = {
    "empty id": (([""], [GOOD], None), ValueError, "empty"),
    "whitespace id": ((["  "], [GOOD], None), ValueError, "empty"),
    "duplicate ids in one batch": ((["x", "x"], [GOOD, GOOD], None), ValueError, "duplicate ids"),
    "very long id": ((["x" * (MAX_ID_LENGTH + 1)], [GOOD], None), ValueError, "limit is"),
    "non-string id": (([17], [GOOD], None), TypeError, "must be a str"),
    "ids as one string": (("abc", [GOOD], None), TypeError, "not a single string"),
    "metadata not JSON": ((["x"], [GOOD], [{"f": {1, 2}}]), TypeError, "not JSON-serialisable"),
    "metadata NaN": ((["x"], [GOOD], [{"f": float("nan")}]), TypeError, "not JSON-serialisable"),
    "metadata not a dict": ((["x"], [GOOD], ["text"]), TypeError, "must be a dict"),
    "reserved metadata key": ((["x"], [GOOD], [{"_uibk_id": 1}]), ValueError, "reserved"),
    "wrong dim": ((["x"], [np.ones((6, 64), np.float32)], None), ValueError, r"shape must be \(n, 128\)"),
    "1-d vector": ((["x"], [GOOD[0]], None), ValueError, "shape"),
    "int dtype": ((["x"], [GOOD.astype(np.int64)], None), TypeError, "dtype"),
    "object dtype": ((["x"], [GOOD.astype(object)], None), TypeError, "dtype"),
    "NaN": ((["x"], [_nan()], None), ValueError, "NaN or inf"),
    "inf": ((["x"], [_inf()], None), ValueError, "NaN or inf"),
    "float64 past float32's range": ((["x"], [_past_float32()], None), ValueError, "NaN or inf"),
    "nested non-string metadata key": ((["x"], [GOOD], [{"m": {1: "one", "1": "uno"}}]), TypeError,
                                       r"metadata\[1\]\['m'\]: keys must be strings, got 1"),
    "zero rows": ((["x"], [np.zeros((0, 128), np.float32)], None), ValueError, "at least 4 rows"),
    "slots only": ((["x"], [GOOD[:3]], None), ValueError, "at least 4 rows"),
    "tag signs wrong": ((["x"], [GOOD * np.r_[-1.0, np.ones(127)]], None), ValueError, "not a tagged list"),
    "not unit rows": ((["x"], [GOOD * 2], None), ValueError, "unit"),
    "token tags of another beta": ((["x"], [OTHER_BETA], None), ValueError,
                                   r"multivectors\[1\] \(id 'x'\): row 3 \(a token row\) has tag 0\.7071; "
                                   r"the store's format \(beta=0\.9, lambda=0\.75\) expects 0\.3162"),
    "slot tags of another lambda": ((["x"], [OTHER_LAMBDA], None), ValueError,
                                    r"row 0 \(a slot row\) has tag -0\.9220; .* expects -0\.8803 .* "
                                    r"read as beta=0\.9, lambda=0\.5"),
    "ids/vectors mismatch": ((["x", "y"], [GOOD], None), ValueError, "3 ids but 2 multivectors"),
    "ids/metadata mismatch": ((["x"], [GOOD], [{}, {}]), ValueError, "metadata entries"),
    "one matrix for many ids": ((["x"], GOOD, None), TypeError, "list of"),
    # the limits every backend shares (InvalidInput), refused before any engine sees them
    "lone surrogate in an id": ((["x\ud800"], [GOOD], None), InvalidInput, r"ids\[1\] is not valid Unicode"),
    "lone surrogate in a metadata key": ((["x"], [GOOD], [{"k\udfff": 1}]), InvalidInput,
                                         r"metadata\[1\]: the key .* not valid Unicode"),
    "lone surrogate in a metadata value": ((["x"], [GOOD], [{"f": ["ok", "v\ud800"]}]), InvalidInput,
                                           r"metadata\[1\]\['f'\]\[1\] is not valid Unicode"),
    "metadata nested 100,000 deep": ((["x"], [GOOD], [DEEP_DICT]), InvalidInput, "more than 32 levels"),
    "metadata list nested 100,000 deep": ((["x"], [GOOD], [DEEP_LIST]), InvalidInput, "more than 32 levels"),
    "metadata integer 2**70": ((["x"], [GOOD], [{"f": 2**70}]), InvalidInput, "signed 64-bit"),
    "metadata integer -2**63": ((["x"], [GOOD], [{"f": {"g": -(2**63)}}]), InvalidInput,
                                    "signed 64-bit"),
}

QUERY_CASES = {
    "query with no vectors": ((np.zeros((0, 128), np.float32), 5, None), ValueError, "no vectors"),
    "query wrong dim": ((np.ones((4, 10), np.float32), 5, None), ValueError, "shape"),
    "query NaN": ((_nan(), 5, None), ValueError, "NaN"),
    "query float64 past float32's range": ((_past_float32(), 5, None), ValueError, "NaN or inf"),
    "query slots not first": ((GOOD[::-1].copy(), 5, None), ValueError, "not a tagged list"),
    "query tag zero": ((GOOD * np.r_[0.0, np.ones(127)], 5, None), ValueError, "tag"),
    "query of another beta": ((OTHER_BETA, 5, None), ValueError, r"row 3 \(a token row\) has tag 0\.7071"),
    "query slots of another lambda": ((OTHER_LAMBDA_WEIGHTED, 5, None), ValueError,
                                      r"row 0 \(a slot row\) has tag -0\.9220 per unit norm; "
                                      r".* expects -0\.8803"),
    "k = 0": ((GOOD, 0, None), ValueError, "k must be positive"),
    "k < 0": ((GOOD, -3, None), ValueError, "k must be positive"),
    "k not int": ((GOOD, 2.5, None), TypeError, "k must be an int"),
    "k 2**63": ((GOOD, 2**63, None), ValueError, "k must be at most"),
    "filter bad operator": ((GOOD, 5, {"f": {"$regex": "1"}}), ValueError, "unknown operator"),
    "filter empty $in": ((GOOD, 5, {"f": {"$in": []}}), ValueError, "at least one value"),
    "filter not a mapping": ((GOOD, 5, ["f"]), TypeError, "mapping"),
    "filter list value": ((GOOD, 5, {"f": [1, 2]}), TypeError, "values must be"),
    "filter 5,000 nested $not": ((GOOD, 5, DEEP_FILTER), InvalidInput, "more than 32 levels"),
    "filter integer 2**70": ((GOOD, 5, {"f": 2**70}), InvalidInput, "signed 64-bit"),
    "filter range bound 2**70": ((GOOD, 5, {"f": {"$gt": -(2**70)}}), InvalidInput, "signed 64-bit"),
    "filter $in with 2**64": ((GOOD, 5, {"f": {"$in": [1, 2**64]}}), InvalidInput, "signed 64-bit"),
    "filter lone surrogate value": ((GOOD, 5, {"g": "e\ud800"}), InvalidInput, "not valid Unicode"),
    "filter lone surrogate field": ((GOOD, 5, {"g\ud800": "even"}), InvalidInput, "not valid Unicode"),
}


@pytest.fixture
def filled(spec, tmp_path):
    store = spec.make(tmp_path)
    rng = np.random.default_rng(3)
    ids = [f"d{i}" for i in range(8)]
    store.upsert(ids, [make_list(FMT, rng, 5 + i) for i in range(8)],
                 [{"f": i, "g": "even" if i % 2 == 0 else "odd"} for i in range(8)])
    q = make_list(FMT, rng, 5)
    yield store, q, [(h.id, h.score) for h in store.search(q, k=8)]
    store.close()


def _unchanged(store, q, before):
    assert store.count() == 8
    assert [(h.id, h.score) for h in store.search(q, k=8)] == before
    assert store.get(["fresh", "x", "y"]) == []


# One filled store per backend for all cases of a kind (a server collection takes seconds to
# make): each case is its own subtest and leaves the store exactly as it was (`_unchanged`), so a
# case that writes anything fails there, or, at the latest, in the next case.
def test_bad_upserts(spec, filled, record, subtests):
    store, q, before = filled
    for case, ((ids, vecs, md), exc, match) in UPSERT_CASES.items():
        with subtests.test(case=case):
            # a good document first in the same call: it must not be written either (all or nothing)
            ids = ["fresh", *ids] if not isinstance(ids, str) else ids
            vecs = [GOOD, *vecs] if isinstance(vecs, list) else vecs
            md = [{}, *md] if md is not None else None
            with pytest.raises(exc, match=match) as e:
                store.upsert(ids, vecs, md)
            _unchanged(store, q, before)
            record(case, spec.name, f"{exc.__name__}")
            assert str(e.value)


def test_bad_queries(spec, filled, record, subtests):
    store, q, before = filled
    for case, ((query, k, flt), exc, match) in QUERY_CASES.items():
        with subtests.test(case=case):
            with pytest.raises(exc, match=match):
                store.search(query, k=k, filter=flt)
            _unchanged(store, q, before)
            record(case, spec.name, exc.__name__)


def test_limits_on_reads_and_deletes(spec, filled, record):
    """The shared limits hold on every call that takes ids or a filter, not only on upsert and
    search: InvalidInput, and nothing changed."""
    store, q, before = filled
    for what, call in {
        "get": lambda: store.get(["d1", "x\ud800"]),
        "delete by id": lambda: store.delete(["d1", "x\ud800"]),
        "explain": lambda: store.explain(q, "d\udc00"),
        "delete by filter": lambda: store.delete(filter=DEEP_FILTER),
        "delete by filter 2**70": lambda: store.delete(filter={"f": {"$lt": 2**70}}),
        "scan": lambda: list(store.scan(DEEP_FILTER)),
        "search_batch": lambda: store.search_batch([q], k=3, filter={"f": {"$nin": [2**63]}}),
    }.items():
        with pytest.raises(InvalidInput):
            try:
                call()
            except InvalidInput:
                raise
            except BaseException as e:
                raise AssertionError(f"{what}: {type(e).__name__} instead of InvalidInput") from e
        _unchanged(store, q, before)
    record("surrogate / deep filter / 2**70 in get, delete, scan", spec.name, "InvalidInput")
    # the edges of the limits are accepted, stored and filtered exactly
    edge = {"max": 2**63 - 1, "min": -(2**63 - 1), "deep": _nested(31), "text": "ok \U0001f600"}
    store.upsert(["edge"], [GOOD], [edge])
    assert store.get(["edge"])[0].metadata == edge
    assert [x for x, _ in store.scan({"max": 2**63 - 1, "min": -(2**63 - 1)})] == ["edge"]
    assert [x for x, _ in store.scan({"max": {"$in": [2**63 - 1, -1]}, "min": {"$ne": 0}})] == ["edge"]
    store.delete(["edge"])
    _unchanged(store, q, before)


def test_documented_behaviours(spec, filled, record):
    store, q, before = filled
    # a filter on a field no document has: no hits (documented, same on every backend)
    assert store.search(q, k=5, filter={"no_such_field": 1}) == []
    record("filter on unknown field", spec.name, "no hits")
    # deleting unknown ids: not an error, nothing changes
    store.delete(["unknown-1", "unknown-2"])
    _unchanged(store, q, before)
    record("delete unknown ids", spec.name, "ignored")
    # duplicate ids in delete are fine
    store.delete(["unknown-1", "unknown-1"])
    _unchanged(store, q, before)
    # float64 and float16 input is accepted and stored as float32
    store.upsert(["fresh"], [GOOD.astype(np.float64)])
    assert store.count() == 9
    store.delete(["fresh"])
    record("float64 vectors", spec.name, "accepted (stored float32)")
    # a query made of slots only or tokens only (the dense / token heads) is valid
    assert len(store.search(q[:3], k=3)) == 3
    assert len(store.search(q[3:], k=3)) == 3
    record("query of slots only / tokens only", spec.name, "accepted")


SPECIAL_VALUES = ['say "hi"', "it's", "a\\b", "x' OR 1=1 --", '") || (', "ünïcödé 日本", "$in", "",
                  "line\nbreak", "%_*"]


def test_metadata_values_are_literal(spec, tmp_path, record):
    """Quotes, operators and unicode in metadata are stored and filtered literally."""
    store = spec.make(tmp_path)
    try:
        rng = np.random.default_rng(5)
        ids = [f"s{i}" for i in range(len(SPECIAL_VALUES))]
        store.upsert(ids, [make_list(FMT, rng, 4) for _ in ids],
                     [{"v": v, "n": i} for i, v in enumerate(SPECIAL_VALUES)])
        q = make_list(FMT, rng, 4)
        for i, v in enumerate(SPECIAL_VALUES):
            assert store.get([ids[i]])[0].metadata == {"v": v, "n": i}
            hits = store.search(q, k=20, filter={"v": v})
            assert [h.id for h in hits] == [ids[i]], f"filter on {v!r}"
        hits = store.search(q, k=20, filter={"v": {"$in": SPECIAL_VALUES[:3]}})
        assert {h.id for h in hits} == set(ids[:3])
        record("metadata with quotes/operators/unicode", spec.name, "stored and filtered literally")
    finally:
        store.close()
