"""LangChain integration: the ``langchain-tests`` standard suites on every backend, plus what
is specific to us (score decomposition in metadata, filters, dense weight, errors).

The standard suites run once per backend (the ``backend_store`` fixture of tests/conftest.py:
each spec in ``tests/backends/*.py`` not marked ``variant``, the conformance suite's specs), so a
backend that lands with its spec file is covered here with no change to this file. Registry
backends whose module does not exist yet (or whose optional dependency is missing) appear as
skipped parameters that say so.
"""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_tests")

from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_tests.integration_tests import (
    RetrieversIntegrationTests,
    VectorStoreIntegrationTests,
)

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.integrations.langchain import UIBKRetriever, UIBKVectorStore

# the suites' async tests carry no marker of their own: run them with anyio (asyncio backend);
# the per-backend stores are throwaway ones opened without format=, whose warning
# (tests/test_langchain_constructors.py checks it) would repeat once per test
pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore:the .* store records no encoder projection:UserWarning")]

# -- the standard suites -------------------------------------------------------------------------
class TestUIBKVectorStoreStandard(VectorStoreIntegrationTests):
    """``VectorStoreIntegrationTests`` with the embedded default encoder (deterministic)."""

    @pytest.fixture
    def vectorstore(self, backend_store, encoder):
        return UIBKVectorStore(encoder=encoder, store=backend_store)


RETRIEVER_CORPUS = [
    "Lift on a wing in the slipstream of a propeller.",
    "Boundary layer transition on a flat plate at low speed.",
    "Heat transfer to a blunt body in hypersonic flow.",
    "Flutter of thin panels in supersonic flow.",
    "Oblique shock waves meeting a laminar boundary layer.",
    "A sourdough bread recipe with long fermentation.",
]


class TestUIBKRetrieverStandard(RetrieversIntegrationTests):
    """``RetrieversIntegrationTests``: ``UIBKRetriever(encoder=..., store=..., k=...)``."""

    @pytest.fixture(autouse=True)
    def _filled_store(self, backend_store, encoder):
        UIBKVectorStore(encoder=encoder, store=backend_store).add_texts(RETRIEVER_CORPUS)
        self._params = {"encoder": encoder, "store": backend_store}

    @property
    def retriever_constructor(self) -> type[UIBKRetriever]:
        return UIBKRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return self._params

    @property
    def retriever_query_example(self) -> str:
        return "boundary layer of a wing in supersonic flow"


# -- what is ours --------------------------------------------------------------------------------
TEXTS = [
    ("wing", "Lift on a wing in the slipstream of a propeller.", {"topic": "aero", "year": 1958}),
    ("plate", "Boundary layer transition on a flat plate.", {"topic": "aero", "year": 1960}),
    ("body", "Heat transfer to a blunt body in hypersonic flow.", {"topic": "heat", "year": 1960}),
    ("panel", "Flutter of thin panels in supersonic flow.", {"topic": "aero", "year": 1962}),
    ("bread", "A sourdough bread recipe with a long cold fermentation.", {"topic": "food", "year": 2020}),
    ("tennis", "The serve and volley style in modern tennis.", {"topic": "sport", "year": 2021}),
]


@pytest.fixture
def vs(encoder) -> UIBKVectorStore:
    v = UIBKVectorStore(encoder=encoder, store=ExactStore())
    v.add_texts([t for _, t, _ in TEXTS], [m for _, _, m in TEXTS], ids=[i for i, _, _ in TEXTS])
    return v


def test_retriever_documents_carry_score_and_decomposition(vs):
    docs = vs.as_retriever(search_kwargs={"k": 3}).invoke("propeller slipstream lift")
    assert docs[0].id == "wing"
    scored = dict((d.id, s) for d, s in vs.similarity_search_with_score("propeller slipstream lift", k=3))
    for d in docs:
        m = d.metadata
        assert {"topic", "year", "score", "token_part", "dense_part"} <= set(m)
        assert m["score"] == pytest.approx(scored[d.id], rel=1e-6)
        # score = constant + token part + dense part, the constant the same for every document
        d0 = vs.store.explain(vs.core.encode_query("propeller slipstream lift"), d.id)
        assert m["token_part"] == pytest.approx(d0.token_part, abs=1e-5)
        assert m["dense_part"] == pytest.approx(d0.dense_part, abs=1e-5)
        assert m["score"] == pytest.approx(d0.constant + m["token_part"] + m["dense_part"], abs=1e-4)
    assert [d.metadata["score"] for d in docs] == sorted((d.metadata["score"] for d in docs), reverse=True)


def test_dense_weight_scales_the_dense_part_only(vs):
    r = UIBKRetriever(vectorstore=vs, k=6)
    one = {d.id: d.metadata for d in r.invoke("supersonic panel flutter", dense_weight=1.0)}
    two = {d.id: d.metadata for d in r.invoke("supersonic panel flutter", dense_weight=2.0)}
    for i in one:
        assert two[i]["dense_part"] == pytest.approx(2 * one[i]["dense_part"], rel=1e-4, abs=1e-6)
        assert two[i]["token_part"] == pytest.approx(one[i]["token_part"], rel=1e-5, abs=1e-6)
    with pytest.raises(ValueError, match="dense_weight"):
        r.invoke("flutter", dense_weight=-1.0)


def test_k_from_field_search_kwargs_and_call(encoder, vs):
    r = UIBKRetriever(encoder=encoder, store=vs.store, k=2)
    assert len(r.invoke("flow")) == 2
    assert len(r.invoke("flow", k=5)) == 5
    assert len(vs.as_retriever(search_kwargs={"k": 1}).invoke("flow")) == 1
    assert len(UIBKRetriever(vectorstore=vs, search_kwargs={"k": 4}).invoke("flow")) == 4
    with pytest.raises(TypeError, match="unexpected arguments"):
        r.invoke("flow", top_k=3)
    with pytest.raises(ValueError, match="unknown search_kwargs"):
        UIBKRetriever(vectorstore=vs, search_kwargs={"top_k": 4})
    with pytest.raises(ValueError, match="needs store="):
        UIBKRetriever(encoder=encoder)


def test_filters(vs):
    q = "flow over a wing"
    got = vs.similarity_search(q, k=10, filter={"topic": "aero"})
    assert {d.id for d in got} == {"wing", "plate", "panel"}
    got = vs.similarity_search(q, k=10, filter={"year": {"$in": [1960, 2021]}})
    assert {d.id for d in got} == {"plate", "body", "tennis"}
    got = vs.similarity_search(q, k=10, filter={"$and": [{"topic": "aero"}, {"year": {"$in": [1960, 1962]}}]})
    assert {d.id for d in got} == {"plate", "panel"}
    assert vs.similarity_search(q, k=10, filter={"$and": [{"topic": "aero"}, {"topic": "food"}]}) == []
    assert vs.similarity_search(q, k=10, filter={"nope": 1}) == []  # unknown field: no hits
    assert vs.similarity_search(q, k=10, filter={"year": "1960"}) == []  # types must match
    r = vs.as_retriever(search_kwargs={"k": 10, "filter": {"topic": "heat"}})
    assert [d.id for d in r.invoke(q)] == ["body"]
    # the operators of LangChain's Qdrant / Chroma / PGVector filter dicts (the filter language)
    for good, want in [
        ({"year": {"$gt": 1960}}, {"panel", "bread", "tennis"}),
        ({"year": {"$gte": 1960, "$lt": 2000}}, {"plate", "body", "panel"}),
        ({"topic": {"$ne": "aero"}}, {"body", "bread", "tennis"}),
        ({"topic": {"$nin": ["aero", "heat"]}}, {"bread", "tennis"}),
        ({"$or": [{"topic": "food"}, {"year": {"$lte": 1958}}]}, {"wing", "bread"}),
        ({"$not": {"topic": "aero"}}, {"body", "bread", "tennis"}),
        ({"$and": [{"topic": "aero"}, {"$or": [{"year": 1958}, {"year": 1962}]}]}, {"wing", "panel"}),
        ({"topic": {"$exists": True}}, {t[0] for t in TEXTS}),
        ({"nope": {"$exists": True}}, set()),
    ]:
        assert {d.id for d in vs.similarity_search(q, k=10, filter=good)} == want, good
    for bad, msg in [({"topic": {"$like": "aer%"}}, r"'\$like'"), ({"$nor": [{"topic": "aero"}]}, r"'\$nor'"),
                     ({"year": {"$gt": "1960"}}, "numbers only")]:
        with pytest.raises((ValueError, TypeError), match=msg):
            vs.similarity_search(q, filter=bad)
    with pytest.raises(ValueError, match=r"'\$like'"):
        UIBKRetriever(vectorstore=vs, filter={"topic": {"$like": "aer%"}})


def test_delete_by_filter_and_get_by_ids(vs):
    assert vs.delete(filter={"topic": "aero"}) is True
    assert vs.store.count() == 3
    assert [d.id for d in vs.get_by_ids(["wing", "body", "bread"])] == ["body", "bread"]
    assert vs.get_by_ids(["body"])[0] == Document(
        id="body", page_content=TEXTS[2][1], metadata={"topic": "heat", "year": 1960})
    with pytest.raises(ValueError, match="needs ids"):
        vs.delete()
    vs.delete(filter={})
    assert vs.store.count() == 0


def test_bad_input_changes_nothing(vs):
    n = vs.store.count()
    with pytest.raises(ValueError, match="key 'text'"):
        vs.add_texts(["a new text"], [{"text": "clash"}])
    with pytest.raises(ValueError, match="empty"):
        vs.add_texts(["fine", "   "])
    with pytest.raises(TypeError, match="JSON"):
        vs.add_texts(["fine"], [{"when": object()}])
    with pytest.raises(ValueError, match="duplicate ids"):
        vs.add_texts(["x", "y"], ids=["same", "same"])
    assert vs.store.count() == n
    assert vs.get_by_ids(["wing"])[0].page_content == TEXTS[0][1]


def test_text_key_and_existing_store(encoder):
    store = ExactStore()
    store.upsert(["d1"], encoder.encode_documents(["wing lift"]), [{"body": "wing lift", "text": "x"}])
    vs = UIBKVectorStore.from_existing_store(store, encoder, text_key="body")
    assert vs.get_by_ids(["d1"]) == [Document(id="d1", page_content="wing lift", metadata={"text": "x"})]


def test_from_texts_and_embeddings(encoder):
    vs = UIBKVectorStore.from_texts(["wing lift", "bread recipe"], encoder, [{"n": 1}, {"n": 2}],
                                    ids=["w", "b"])
    assert vs.similarity_search("baking bread", k=1)[0].id == "b"
    with pytest.raises(TypeError, match="not a LangChain"):
        UIBKVectorStore.from_texts(["x"], DeterministicFakeEmbedding(size=6))
    emb = vs.embeddings
    assert emb is not None and len(emb.embed_query("wing")) == 381
    assert len(emb.embed_documents(["a", "b"])) == 2
    with pytest.raises(NotImplementedError, match="similarity_search"):
        vs.similarity_search_by_vector([0.0] * 381)
    with pytest.raises(ValueError, match="search_type"):
        vs.as_retriever(search_type="nearest-neighbour")


async def test_async_retriever_and_search(vs):
    docs = await vs.as_retriever(search_kwargs={"k": 2}).ainvoke("sourdough bread", k=1)
    assert [d.id for d in docs] == ["bread"] and "dense_part" in docs[0].metadata
    pairs = await vs.asimilarity_search_with_score("sourdough bread", k=2)
    assert pairs[0][0].id == "bread" and pairs[0][1] > pairs[1][1]


def test_one_string_of_ids_is_refused_not_split(vs):
    """``delete("wing")`` must not mean ids "w", "i", "n", "g" (list("wing")): a TypeError, and
    nothing is deleted, as add_texts and the store refuse one string."""
    vs.add_texts(["w text", "i text"], ids=["w", "i"])
    n = vs.store.count()
    with pytest.raises(TypeError, match="not a single string"):
        vs.delete("wing")
    with pytest.raises(TypeError, match="not a single string"):
        vs.get_by_ids("wing")
    assert vs.store.count() == n and [d.id for d in vs.get_by_ids(["w", "i"])] == ["w", "i"]


def test_retriever_honours_score_threshold_in_every_search_type(vs):
    """LangChain's retriever passes ``search_kwargs`` to ``similarity_search``, which keeps only
    hits at or above ``score_threshold``: ours does the same for ``search_type="similarity"``,
    refuses it for MMR, and checks a per-call threshold as it checks the field."""
    q = "propeller slipstream lift"
    kept = [d.id for d in vs.similarity_search(q, k=5, score_threshold=0.6)]
    assert 0 < len(kept) < 5  # the threshold cuts something here
    r = vs.as_retriever(search_kwargs={"k": 5, "score_threshold": 0.6})
    docs = r.invoke(q)
    assert [d.id for d in docs] == kept and all(d.metadata["relevance"] >= 0.6 for d in docs)
    assert [d.id for d in vs.as_retriever(search_kwargs={"k": 5}).invoke(q, score_threshold=0.6)] == kept
    with pytest.raises(ValueError, match=r"relevance in \[0, 1\]"):
        vs.as_retriever(search_kwargs={"k": 5}).invoke(q, score_threshold=5)
    with pytest.raises(ValueError, match="does not apply to search_type 'mmr'"):
        vs.as_retriever(search_type="mmr", search_kwargs={"score_threshold": 0.6}).invoke(q)


async def test_async_relevance_scores_equal_the_sync_ones(vs):
    q = "sourdough bread"
    sync = [(d.id, s) for d, s in vs.similarity_search_with_relevance_scores(q, k=3)]
    got = [(d.id, s) for d, s in await vs.asimilarity_search_with_relevance_scores(q, k=3)]
    assert got == sync and all(0 <= s <= 1 for _, s in got)
    cut = [d.id for d in await vs.asearch(q, "similarity_score_threshold", k=3, score_threshold=sync[1][1])]
    assert cut == [i for i, s in sync if s >= sync[1][1]]


def test_as_retriever_leaves_the_callers_tags_alone_and_one_encoder(vs, encoder):
    mine = ["rag"]
    vs.as_retriever(tags=mine)
    vs.as_retriever(tags=mine)
    assert mine == ["rag"]
    assert vs.as_retriever(tags=mine).tags[0] == "rag"
    with pytest.raises(ValueError, match="not two different encoders"):
        UIBKRetriever(vectorstore=vs, encoder="not an encoder")
    assert UIBKRetriever(vectorstore=vs, encoder=vs.encoder).encoder is vs.encoder


def test_explanation_keys_never_replace_the_users_metadata(vs, encoder):
    # before: {"score": 5} was stored, then silently replaced by the MaxSim score in explained results
    n = vs.store.count()
    for key in ("score", "relevance", "token_part", "dense_part"):
        with pytest.raises(ValueError, match=rf"metadata\[1\] has the key '{key}'.*explanation"):
            vs.add_texts(["fine", "great wing review"], [{}, {key: 5}], ids=["ok", "a"])
    assert vs.store.count() == n
    # a store written elsewhere (e.g. uibk-embed index) may hold such a key: it comes back as stored
    store = ExactStore()
    store.upsert(["a"], encoder.encode_documents(["great wing review"]),
                 [{"text": "great wing review", "score": 5, "relevance": "high"}])
    other = UIBKVectorStore.from_existing_store(store, encoder)
    got = [*other.as_retriever().invoke("wing"), *other.similarity_search_with_explanation("wing"),
           *other.as_retriever(search_type="mmr").invoke("wing"),
           *other.as_retriever(search_kwargs={"score_threshold": 0.0}).invoke("wing")]
    for d in got:
        assert (d.metadata["score"], d.metadata["relevance"]) == (5, "high") and "token_part" in d.metadata


def test_one_string_of_texts_is_refused_not_split(vs, encoder, tmp_path):
    # before: add_texts("gh") and from_texts("wing lift") stored one document per character
    n = vs.store.count()
    with pytest.raises(TypeError, match="texts must be a list of strings, not a single string"):
        vs.add_texts("gh")
    assert vs.store.count() == n
    with pytest.raises(TypeError, match="texts must be a list of strings, not a single string"):
        UIBKVectorStore.from_texts("wing lift", encoder)
    with pytest.raises(TypeError, match="texts must be a list of strings, not a single string"):
        UIBKVectorStore.from_texts("wing lift", encoder, path=tmp_path / "idx")
    assert not (tmp_path / "idx").exists()  # refused before a store is created
    assert vs.add_texts(t for t in ["a generator of texts"]) and vs.store.count() == n + 1


def test_retriever_checks_search_kwargs_and_fields_when_built(vs):
    # before: these built a retriever that failed (or ignored the value) only at invoke
    for kwargs, msg in [
        ({"search_kwargs": {"filter": {"t": {"$like": "x"}}}}, r"'\$like'"),
        ({"search_kwargs": {"k": -3}}, "k must be positive, got -3"),
        ({"search_kwargs": {"k": "3"}}, "k must be an int"),
        ({"search_kwargs": {"fetch_k": 0}, "search_type": "mmr"}, "fetch_k must be positive, got 0"),
        ({"search_kwargs": {"lambda_mult": 1.5}, "search_type": "mmr"}, r"lambda_mult must be in \[0, 1\]"),
        ({"search_kwargs": {"lambda_mult": "0.5"}, "search_type": "mmr"}, r"lambda_mult must be in \[0, 1\]"),
        ({"search_kwargs": {"score_threshold": 5}}, r"relevance in \[0, 1\]"),
        ({"search_kwargs": {"dense_weight": -1.0}}, "dense_weight"),
        ({"search_kwargs": {"score_threshold": 0.5}, "search_type": "mmr"},
         "does not apply to search_type 'mmr'"),
        ({"k": 0}, "k must be positive, got 0"),
        ({"dense_weight": 0.0}, "dense_weight"),
    ]:
        with pytest.raises((TypeError, ValueError), match=msg):
            vs.as_retriever(**kwargs)
    with pytest.raises(ValueError, match="fetch_k must be positive, got -1"):
        vs.as_retriever(search_type="mmr").invoke("wing", fetch_k=-1)


def test_a_text_the_store_refuses_fails_the_whole_call_and_is_named(encoder):
    # before: the text went into the metadata after the whole-call check, and the store refused a
    # NUL only inside its batch of 256: 256 of 300 documents were written, and the error named
    # metadata[34]['text'] (the user passed no metadata; the bad input was texts[290])
    from uibk_embedding.errors import InvalidInput

    vs = UIBKVectorStore(encoder=encoder, store=ExactStore())
    texts = [f"document number {i} about wings" for i in range(300)]
    texts[290] = "text extracted from a pdf\x00with a NUL"
    with pytest.raises(InvalidInput, match=r"^texts\[290\]: the text holds a NUL character"):
        vs.add_texts(texts, ids=[f"d{i}" for i in range(300)])
    assert vs.store.count() == 0
    with pytest.raises(InvalidInput, match=r"^texts\[1\]: the text holds a NUL character"):
        vs.add_documents([Document(page_content="fine"), Document(page_content="a\x00b")])
    assert vs.store.count() == 0


def test_an_empty_query_is_named_as_the_query(vs):
    # before: "texts[0] is empty or whitespace only" (the encoder's wording for a list of texts)
    for q in ("", "   "):
        with pytest.raises(ValueError, match=r"^the query is empty or whitespace only"):
            vs.similarity_search(q)
        with pytest.raises(ValueError, match=r"^the query is empty or whitespace only"):
            vs.similarity_search_with_relevance_scores(q)
        with pytest.raises(ValueError, match=r"^the query is empty or whitespace only"):
            vs.max_marginal_relevance_search(q)
