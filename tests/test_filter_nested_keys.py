"""Dotted filter keys (issue #42): ``{"a.b": 1}`` is the top-level key ``a.b`` on every backend,
and a nested-path condition is refused with a message that says so (it matched nothing)."""

import pytest

import uibk_embedding as ue
from uibk_embedding.adapters.filters import matches, parse_filter


def test_dotted_key_is_a_top_level_key():
    f = parse_filter({"a.b": 1})
    assert matches({"a.b": 1}, f)
    assert not matches({"a": {"b": 1}}, f)


@pytest.mark.parametrize("flt", [{"a": {"b": 1}}, {"$and": [{"meta": {"lang": "en"}}]}])
def test_nested_path_condition_is_refused(flt):
    with pytest.raises(ValueError, match=r"is not an operator .*top-level metadata keys"):
        parse_filter(flt)


def test_store_search_refuses_nested_path_before_the_engine():
    enc = ue.load_encoder()
    store = ue.open_store("exact", format=enc.format)
    store.upsert(["x"], enc.encode_documents(["wing"]), [{"a": {"b": 1}}])
    q = enc.encode_queries(["wing"])[0]
    assert [h.id for h in store.search(q, k=1, filter={"a.b": 1})] == []
    with pytest.raises(ValueError, match="nested path"):
        store.search(q, k=1, filter={"a": {"b": 1}})
