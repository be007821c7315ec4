"""A native ``qdrant_client.models.Filter`` as ``filter=`` (issue #42): a Qdrant store (local
path) passes it to the engine untranslated, in search, search_batch, scan and delete, and through
the LangChain wrapper; every other backend, and Qdrant Edge given the client's type, refuses it
with an error naming what to give. Real stores, real documents and the embedded encoder."""

from __future__ import annotations

import re

import pytest

from uibk_embedding.adapters import open_store
from uibk_embedding.integrations.core import RetrievalCore

qdrant_client = pytest.importorskip("qdrant_client")
models = qdrant_client.models

TEXTS = {
    "wing": ("lift on a wing in the slipstream of a propeller", {"topic": "aero", "year": 1958}),
    "plate": ("transition in the boundary layer of a flat plate", {"topic": "aero", "year": 1960}),
    "body": ("heat transfer to a blunt body in hypersonic flow", {"topic": "aero", "year": 1962}),
    "bread": ("a sourdough bread recipe with a long fermentation", {"topic": "food", "year": 1961}),
    "tennis": ("the serve and volley style in modern tennis", {"topic": "sport", "year": 1963}),
}


def field_is(key: str, value) -> models.Filter:
    return models.Filter(must=[models.FieldCondition(key=key, match=models.MatchValue(value=value))])


@pytest.fixture
def core(tmp_path, encoder):
    store = open_store("qdrant", path=str(tmp_path / "q"), format=encoder.format)
    c = RetrievalCore(encoder, store)
    c.add_texts([t for t, _ in TEXTS.values()], [m for _, m in TEXTS.values()], ids=list(TEXTS))
    yield c
    store.close()


def test_native_filter_runs_on_the_local_qdrant_store_as_the_dict_filter(core):
    native = models.Filter(
        must=[models.FieldCondition(key="topic", match=models.MatchValue(value="aero"))],
        must_not=[models.FieldCondition(key="year", range=models.Range(gte=1962))])
    as_dict = {"$and": [{"topic": "aero"}, {"$not": {"year": {"$gte": 1962}}}]}
    want = [h.id for h in core.search("propeller wing lift", k=5, filter=as_dict)]
    assert set(want) == {"wing", "plate"}
    assert [h.id for h in core.search("propeller wing lift", k=5, filter=native)] == want
    q = core.encode_query("propeller wing lift")
    store = core.store
    assert [h.id for h in store.search(q, k=5, filter=native, explain=True)] == want
    assert [[h.id for h in hs] for hs in store.search_batch([q, q], k=5, filter=native)] == [want, want]
    assert sorted(i for i, _ in store.scan(field_is("topic", "food"))) == ["bread"]
    assert store.delete(filter=field_is("topic", "sport")) == 1
    assert sorted(i for i, _ in store.scan()) == ["body", "bread", "plate", "wing"]


def test_langchain_passes_a_native_filter_to_qdrant(core):
    pytest.importorskip("langchain_core")
    from uibk_embedding.integrations.langchain import UIBKVectorStore

    vs = UIBKVectorStore(encoder=core.encoder, store=core.store)
    docs = vs.similarity_search("bread", k=5, filter=field_is("topic", "food"))
    assert [d.id for d in docs] == ["bread"]
    got = vs.as_retriever(search_kwargs={"k": 5, "filter": field_is("topic", "sport")}).invoke("bread")
    assert [d.id for d in got] == ["tennis"]
    assert vs.delete(filter=field_is("topic", "food")) is True
    assert vs.get_by_ids(["bread"]) == []


@pytest.mark.parametrize("backend", ["exact", "lancedb"])
def test_every_other_backend_refuses_a_native_filter(tmp_path, encoder, backend):
    if backend != "exact":
        pytest.importorskip(backend)
    store = open_store(backend, path=str(tmp_path / backend), format=encoder.format)
    c = RetrievalCore(encoder, store)
    c.add_texts([t for t, _ in TEXTS.values()], [m for _, m in TEXTS.values()], ids=list(TEXTS))
    said = f"works only on the qdrant and qdrant-edge backends, not on {backend}"
    with pytest.raises(TypeError, match=said):
        c.search("bread", filter=field_is("topic", "food"))
    for call in (lambda f: store.search(c.encode_query("bread"), filter=f),  # the store itself too
                 lambda f: store.delete(filter=f), lambda f: list(store.scan(f))):
        with pytest.raises(TypeError, match=said):
            call(field_is("topic", "food"))
    assert store.count() == len(TEXTS)
    store.close()


def test_qdrant_edge_refuses_the_client_filter_type_by_name(tmp_path, encoder):
    pytest.importorskip("qdrant_edge")
    store = open_store("qdrant-edge", path=str(tmp_path / "edge"), format=encoder.format)
    c = RetrievalCore(encoder, store)
    c.add_texts(["a wing", "a bread"], [{"topic": "aero"}, {"topic": "food"}], ids=["w", "b"])
    said = re.escape("takes a native qdrant_edge.Filter, got a qdrant_client.models.Filter")
    with pytest.raises(TypeError, match=said):
        c.search("wing", filter=field_is("topic", "food"))
    store.close()
