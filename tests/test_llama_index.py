"""LlamaIndex integration: insert, query with filters, delete by ref_doc_id, the retriever end
to end, and a VectorStoreIndex / query engine on the store with no single-vector embed model.

Every test runs once per backend (the ``backend_store`` fixture of tests/conftest.py: the first
spec of each backend in ``tests/backends``), as the LangChain standard suites do."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

from uibk_embedding.integrations.core import relevance
from uibk_embedding.integrations.llama_index import (
    NoEmbedding,
    UIBKRetriever,
    UIBKVectorStore,
    index_from_store,
)

# the per-backend stores are throwaway ones opened without format=, whose warning
# (tests/test_llama_index_patterns.py checks it) would repeat once per test
pytestmark = pytest.mark.filterwarnings("ignore:the .* store records no encoder projection:UserWarning")

# (node id, source document, text, metadata)
NODES = [
    ("wing-1", "doc-a", "Lift on a wing in the slipstream of a propeller.", {"topic": "aero", "year": 1958}),
    ("wing-2", "doc-a", "The propeller slipstream raises the wing's maximum lift.",
     {"topic": "aero", "year": 1958}),
    ("plate", "doc-b", "Boundary layer transition on a flat plate.", {"topic": "aero", "year": 1960}),
    ("body", "doc-c", "Heat transfer to a blunt body in hypersonic flow.", {"topic": "heat", "year": 1960}),
    ("bread", "doc-d", "A sourdough bread recipe with a long cold fermentation.",
     {"topic": "food", "year": 2020}),
    ("tennis", "doc-e", "The serve and volley style in modern tennis.", {"topic": "sport", "year": 2021}),
]


def make_nodes() -> list[TextNode]:
    return [
        TextNode(id_=i, text=t, metadata=dict(m),
                 relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=d)})
        for i, d, t, m in NODES
    ]


@pytest.fixture
def vs(encoder, backend_store) -> UIBKVectorStore:
    v = UIBKVectorStore(encoder=encoder, store=backend_store)
    assert v.add(make_nodes()) == [n[0] for n in NODES]
    return v


def ids(result) -> list[str]:
    return list(result.ids)


def flt(*filters: MetadataFilter | MetadataFilters, condition=FilterCondition.AND) -> MetadataFilters:
    return MetadataFilters(filters=list(filters), condition=condition)


def test_flags():
    assert UIBKVectorStore.model_fields["stores_text"].default is True
    assert UIBKVectorStore.model_fields["is_embedding_query"].default is False


def test_insert_and_query_round_trip(vs):
    res = vs.query(VectorStoreQuery(query_str="propeller slipstream and wing lift", similarity_top_k=3))
    assert ids(res)[:2] in (["wing-1", "wing-2"], ["wing-2", "wing-1"])
    assert res.similarities == sorted(res.similarities, reverse=True)
    node = res.nodes[0]
    assert node.get_content() == dict((n[0], n[2]) for n in NODES)[node.node_id]
    assert node.metadata["topic"] == "aero" and node.metadata["year"] == 1958
    assert node.ref_doc_id == "doc-a"
    assert {"score", "token_part", "dense_part"} <= set(node.metadata)
    # the decomposition keys stay out of what the LLM sees
    assert "token_part" not in node.get_content(metadata_mode="llm")
    assert "topic" in node.get_content(metadata_mode="llm")
    assert vs.get_nodes(["plate", "nope", "body"])[0].node_id == "plate"
    assert [n.node_id for n in vs.get_nodes(["plate", "nope", "body"])] == ["plate", "body"]


def test_query_filters(vs):
    q = "flow over a wing"

    def run(filters, k=10, **kw):
        return set(ids(vs.query(VectorStoreQuery(query_str=q, similarity_top_k=k, filters=filters, **kw))))

    assert run(flt(MetadataFilter(key="topic", value="aero"))) == {"wing-1", "wing-2", "plate"}
    assert run(flt(MetadataFilter(key="year", value=[1960, 2021], operator=FilterOperator.IN))) == {
        "plate", "body", "tennis"}
    nested = flt(MetadataFilter(key="topic", value="aero"),
                 flt(MetadataFilter(key="year", value=[1960, 1962], operator="in")))
    assert run(nested) == {"plate"}
    clash = flt(MetadataFilter(key="topic", value="aero"), MetadataFilter(key="topic", value="food"))
    assert run(clash) == set()
    assert run(flt(MetadataFilter(key="year", value="1960"))) == set()  # types must match
    assert run(None, doc_ids=["doc-a", "doc-c"]) == {"wing-1", "wing-2", "body"}
    aero = flt(MetadataFilter(key="topic", value="aero"))
    assert run(aero, doc_ids=["doc-a", "doc-c"]) == {"wing-1", "wing-2"}
    # node_ids: exact ranking among those nodes only, filters still apply
    res = vs.query(VectorStoreQuery(query_str="sourdough", similarity_top_k=2,
                                    node_ids=["tennis", "bread", "body"]))
    assert ids(res) == ["bread", res.ids[1]] and res.ids[1] in {"tennis", "body"}
    full = vs.query(VectorStoreQuery(query_str="sourdough", similarity_top_k=6))
    score = dict(zip(full.ids, full.similarities, strict=True))
    assert res.similarities[0] == pytest.approx(score["bread"], rel=1e-5)
    # every LlamaIndex operator but the list/text ones, AND / OR / NOT, nested (the filter language)
    everything = {n[0] for n in NODES}
    assert run(flt(MetadataFilter(key="year", value=1960, operator=FilterOperator.GT))) == {"bread", "tennis"}
    assert run(flt(MetadataFilter(key="year", value=1960, operator=FilterOperator.LTE),
                   MetadataFilter(key="year", value=1958, operator=FilterOperator.GTE))) == {
        "wing-1", "wing-2", "plate", "body"}
    assert run(flt(MetadataFilter(key="year", value=1960, operator=FilterOperator.LT))) == {
        "wing-1", "wing-2"}
    assert run(flt(MetadataFilter(key="topic", value="aero", operator=FilterOperator.NE))) == {
        "body", "bread", "tennis"}
    assert run(flt(MetadataFilter(key="topic", value=["aero", "heat"], operator=FilterOperator.NIN))) == {
        "bread", "tennis"}
    assert run(flt(MetadataFilter(key="topic", value="food"), MetadataFilter(key="year", value=1958),
                   condition=FilterCondition.OR)) == {"wing-1", "wing-2", "bread"}
    assert run(flt(MetadataFilter(key="topic", value="aero"), MetadataFilter(key="year", value=2021),
                   condition=FilterCondition.NOT)) == {"body", "bread"}  # none of them holds
    assert run(flt(condition=FilterCondition.NOT)) == everything  # none of no filters: LlamaIndex's own
    assert run(flt(MetadataFilter(key="topic", value="aero"),
                   flt(MetadataFilter(key="year", value=1958), MetadataFilter(key="year", value=2021),
                       condition=FilterCondition.OR))) == {"wing-1", "wing-2"}
    assert run(flt(MetadataFilter(key="missing", value=None, operator=FilterOperator.IS_EMPTY))) == everything
    assert run(flt(MetadataFilter(key="topic", value=None, operator=FilterOperator.IS_EMPTY))) == set()
    for bad, msg in [
        (flt(MetadataFilter(key="topic", value=["aero"], operator=FilterOperator.ANY)), "ANY"),
        (flt(MetadataFilter(key="topic", value="aer", operator=FilterOperator.TEXT_MATCH)), "TEXT_MATCH"),
        (flt(MetadataFilter(key="topic", value="aero", operator=FilterOperator.CONTAINS)), "CONTAINS"),
    ]:
        with pytest.raises(ValueError, match=msg):
            run(bad)
    with pytest.raises(ValueError, match="query_str"):
        vs.query(VectorStoreQuery(query_embedding=[0.1] * 8, similarity_top_k=2))
    with pytest.raises(ValueError, match="mode"):
        vs.query(VectorStoreQuery(query_str=q, mode=VectorStoreQueryMode.SPARSE))


def test_delete_by_ref_doc_id_and_nodes(vs):
    assert {n.node_id for n in vs.get_nodes()} == {n[0] for n in NODES}  # the store's listing
    aero = vs.get_nodes(filters=flt(MetadataFilter(key="topic", value="aero")))
    assert {n.node_id for n in aero} == {"wing-1", "wing-2", "plate"}
    assert {n.get_content() for n in aero} == {n[2] for n in NODES if n[3]["topic"] == "aero"}
    vs.delete("doc-a")
    assert vs.client.count() == len(NODES) - 2
    assert vs.get_nodes(["wing-1", "wing-2", "plate"])[0].node_id == "plate"
    vs.delete("doc-that-does-not-exist")
    assert vs.client.count() == len(NODES) - 2
    vs.delete_nodes(["body", "bread"], filters=flt(MetadataFilter(key="topic", value="food")))
    assert [n.node_id for n in vs.get_nodes(["body", "bread"])] == ["body"]
    vs.delete_nodes(filters=flt(MetadataFilter(key="year", value=[1960], operator="in")))
    assert [n.node_id for n in vs.get_nodes([n[0] for n in NODES])] == ["tennis"]
    vs.clear()
    assert vs.client.count() == 0


def test_bad_nodes_change_nothing(vs):
    n = vs.client.count()
    with pytest.raises(ValueError, match="key 'text'"):
        vs.add([TextNode(id_="x", text="fine", metadata={"text": "clash"})])
    with pytest.raises(ValueError, match="empty"):
        vs.add([TextNode(id_="y", text="fine"), TextNode(id_="z", text="  ")])
    assert vs.client.count() == n


def test_retriever_end_to_end(encoder, vs):
    r = UIBKRetriever(vector_store=vs, similarity_top_k=3)
    hits = r.retrieve("hypersonic heat transfer")
    assert len(hits) == 3 and hits[0].node.node_id == "body"
    q = vs.core.encode_query("hypersonic heat transfer")
    for h in hits:
        d = vs.client.explain(q, h.node.node_id)
        assert h.node.metadata["score"] == pytest.approx(d.total, rel=1e-5)
        assert h.score == pytest.approx(relevance(q, d.total), abs=1e-6)  # the relevance scale
        assert h.score == h.node.metadata["relevance"]
        assert h.node.metadata["token_part"] == pytest.approx(d.token_part, abs=1e-5)
        assert h.node.metadata["dense_part"] == pytest.approx(d.dense_part, abs=1e-5)
    # from encoder= + store=, with filters and a dense weight
    r2 = UIBKRetriever(encoder=encoder, store=vs.client, similarity_top_k=5,
                       filters=flt(MetadataFilter(key="topic", value="aero")), dense_weight=2.0)
    got = r2.retrieve("hypersonic heat transfer")
    assert {h.node.node_id for h in got} == {"wing-1", "wing-2", "plate"}
    one = {h.node.node_id: h.node.metadata for h in UIBKRetriever(
        vector_store=vs, similarity_top_k=6, dense_weight=1.0).retrieve("hypersonic heat transfer")}
    for h in got:
        assert h.node.metadata["dense_part"] == pytest.approx(2 * one[h.node.node_id]["dense_part"], rel=1e-4)
    with pytest.raises(ValueError, match="needs vector_store"):
        UIBKRetriever(encoder=encoder)
    with pytest.raises(ValueError, match="similarity_top_k"):
        UIBKRetriever(vector_store=vs, similarity_top_k=0)
    with pytest.raises(ValueError, match="ANY"):  # a filter the language cannot express: refused now
        UIBKRetriever(vector_store=vs, filters=flt(MetadataFilter(key="year", value=[1], operator="any")))
    hits = asyncio.run(r.aretrieve("sourdough bread"))
    assert hits[0].node.node_id == "bread"


@pytest.fixture
def no_llm():
    """LlamaIndex's documented way to run without an LLM (``Settings.llm = None``), restored after."""
    from llama_index.core import Settings

    saved = Settings._llm
    Settings.llm = None
    yield
    Settings._llm = saved


def test_vector_store_index_and_query_engine(encoder, no_llm, backend_store):
    vs = UIBKVectorStore(encoder=encoder, store=backend_store)
    index = index_from_store(vs)
    assert isinstance(index._embed_model, NoEmbedding)
    index.insert(Document(text="Flutter of thin panels in supersonic flow. Damping suppresses it.",
                          doc_id="panels", metadata={"topic": "aero"}))
    index.insert(Document(text="A sourdough bread recipe with a long cold fermentation.",
                          doc_id="bread", metadata={"topic": "food"}))
    assert vs.client.count() == 2
    nodes = index.as_retriever(similarity_top_k=1).retrieve("supersonic panel flutter")
    assert nodes[0].node.ref_doc_id == "panels" and "dense_part" in nodes[0].node.metadata
    filtered = index.as_retriever(
        similarity_top_k=2, filters=flt(MetadataFilter(key="topic", value="food"))).retrieve("flutter")
    assert [n.node.ref_doc_id for n in filtered] == ["bread"]
    # the query engine retrieves through the store ("no_text": the LLM is never called)
    engine = index.as_query_engine(similarity_top_k=1, response_mode="no_text")
    response = engine.query("how is panel flutter suppressed?")
    assert [n.node.ref_doc_id for n in response.source_nodes] == ["panels"]
    index.delete_ref_doc("panels")
    assert vs.client.count() == 1
    with pytest.raises(RuntimeError, match="encodes query_str itself"):
        NoEmbedding().get_query_embedding("x")


def test_async_add_and_delete(encoder, backend_store):
    vs = UIBKVectorStore(encoder=encoder, store=backend_store)

    async def go():
        await vs.async_add(make_nodes()[:3])
        await vs.adelete("doc-a")
        return await vs.aquery(VectorStoreQuery(query_str="boundary layer", similarity_top_k=5))

    assert ids(asyncio.run(go())) == ["plate"]


def test_store_options_are_honoured_or_refused(encoder):
    """``retrieval_mode=`` is the queries' default (as on the LangChain store); an argument the
    store does not take is refused, not dropped by pydantic."""
    from uibk_embedding.adapters.exact import ExactStore

    def first(vs, **kw):
        vs.add(make_nodes()) if not vs.client.count() else None
        res = vs.query(VectorStoreQuery(query_str="supersonic panel flutter", similarity_top_k=3), **kw)
        return list(zip(res.ids, res.similarities, strict=True))

    store = ExactStore()
    tokens = UIBKVectorStore(encoder=encoder, store=store, retrieval_mode="tokens")
    hybrid = UIBKVectorStore(encoder=encoder, store=store)
    assert first(tokens) == first(hybrid, retrieval_mode="tokens") != first(hybrid)
    with pytest.raises(TypeError, match=r"unexpected arguments \['dense_wieght'\]"):
        UIBKVectorStore(encoder=encoder, store=store, dense_wieght=50.0)
    with pytest.raises(ValueError, match="sparse"):
        UIBKVectorStore(encoder=encoder, store=store, retrieval_mode="sparse")


@pytest.fixture
def exact_vs(encoder) -> UIBKVectorStore:
    from uibk_embedding.adapters.exact import ExactStore

    v = UIBKVectorStore(encoder=encoder, store=ExactStore())
    v.add(make_nodes())
    return v


def test_one_string_of_doc_ids_or_node_ids_is_refused_not_split(exact_vs):
    # before: doc_ids="doc-a" filtered ref_doc_id in ["d", "o", "c", "-", "a"] and returned []
    index = index_from_store(exact_vs)
    with pytest.raises(TypeError, match="doc_ids must be a list of strings, not a single string"):
        index.as_retriever(doc_ids="doc-a").retrieve("propeller")
    with pytest.raises(TypeError, match="node_ids must be a list of strings, not a single string"):
        exact_vs.query(VectorStoreQuery(query_str="bread", node_ids="bread"))
    with pytest.raises(TypeError, match="not a single string"):
        exact_vs.core.rank_ids("bread", "bread", k=1)
    assert {n.node.node_id for n in index.as_retriever(doc_ids=["doc-a"]).retrieve("propeller")} == {
        "wing-1", "wing-2"}


def test_explanation_keys_never_replace_the_nodes_metadata(exact_vs, encoder):
    # before: a node's own "score" / "relevance" came back replaced by the explanation
    n = exact_vs.client.count()
    for key in ("score", "relevance", "token_part", "dense_part"):
        with pytest.raises(ValueError, match=rf"metadata\[0\] has the key '{key}'.*explanation"):
            exact_vs.add([TextNode(id_="r", text="great wing review", metadata={key: 5})])
    assert exact_vs.client.count() == n
    # a store written elsewhere (e.g. uibk-embed index) may hold such a key: it comes back as stored
    from uibk_embedding.adapters.exact import ExactStore

    store = ExactStore()
    store.upsert(["a"], encoder.encode_documents(["great wing review"]),
                 [{"text": "great wing review", "score": 5, "relevance": "high"}])
    other = UIBKVectorStore(encoder=encoder, store=store)
    for node in (UIBKRetriever(vector_store=other).retrieve("wing")[0].node,
                 other.query(VectorStoreQuery(query_str="wing", node_ids=["a"])).nodes[0]):
        assert (node.metadata["score"], node.metadata["relevance"]) == (5, "high")
        assert "token_part" in node.metadata and "score" in node.get_content(metadata_mode="llm")


def test_a_filter_on_the_text_answers_the_same_on_every_path(exact_vs):
    # before: with node_ids (query and get_nodes) the text was not matched, so nothing came back
    text = dict((n[0], n[2]) for n in NODES)["bread"]
    f = flt(MetadataFilter(key="text", value=text))
    every = [n[0] for n in NODES]
    for node_ids in (None, every):
        res = exact_vs.query(VectorStoreQuery(query_str="bread", similarity_top_k=3, filters=f,
                                              node_ids=node_ids))
        assert ids(res) == ["bread"], node_ids
        assert [n.node_id for n in exact_vs.get_nodes(node_ids, filters=f)] == ["bread"], node_ids
    assert ids(exact_vs.query(VectorStoreQuery(query_str="bread", node_ids=every, similarity_top_k=6,
                                               filters=flt(MetadataFilter(key="text", value="x"))))) == []


def test_mmr_mode_applies_to_node_ids(exact_vs):
    # before: with node_ids the MMR mode was ignored and the plain ranking came back
    def run(**kw):
        q = VectorStoreQuery(query_str="propeller slipstream and wing lift", similarity_top_k=2,
                             mmr_threshold=0.1, **kw)
        return ids(exact_vs.query(q))

    plain = run(node_ids=["wing-1", "wing-2", "plate"])
    assert set(plain) == {"wing-1", "wing-2"}  # the near-duplicates rank first
    mmr = run(node_ids=["wing-1", "wing-2", "plate"], mode=VectorStoreQueryMode.MMR)
    assert mmr == run(doc_ids=["doc-a", "doc-b"], mode=VectorStoreQueryMode.MMR)  # the same candidates
    assert mmr[1] == "plate"


def test_a_node_text_the_store_refuses_fails_the_whole_call_and_is_named(exact_vs):
    # before: the store refused the NUL inside its batch of 256 (256 of 300 nodes written) and the
    # error named metadata[34]['text'], not the node
    from uibk_embedding.errors import InvalidInput

    n = exact_vs.client.count()
    nodes = [TextNode(id_=f"n{i}", text=f"node number {i} about wings") for i in range(300)]
    nodes[290] = TextNode(id_="pdf", text="text extracted from a pdf\x00with a NUL")
    with pytest.raises(InvalidInput, match=r"^nodes\[290\]: the text holds a NUL character"):
        exact_vs.add(nodes)
    assert exact_vs.client.count() == n


def test_query_mode_given_as_a_string(exact_vs):
    # before: mode="sparse" raised AttributeError "'str' object has no attribute 'value'"
    with pytest.raises(ValueError, match=r"query mode 'sparse' is not supported"):
        exact_vs.query(VectorStoreQuery(query_str="wing", mode="sparse"))
    with pytest.raises(ValueError, match=r"query mode 'nonsense' is not supported"):
        exact_vs.query(VectorStoreQuery(query_str="wing", mode="nonsense"))
    for name, mode in (("default", VectorStoreQueryMode.DEFAULT), ("mmr", VectorStoreQueryMode.MMR)):
        q = {"query_str": "propeller slipstream", "similarity_top_k": 3}
        assert ids(exact_vs.query(VectorStoreQuery(**q, mode=name))) == ids(
            exact_vs.query(VectorStoreQuery(**q, mode=mode)))


def test_an_empty_list_of_ids_is_no_restriction_as_vector_store_index_sends_it(exact_vs):
    # VectorStoreIndex.as_retriever() passes node_ids=list(index_struct.nodes_dict.values()), which
    # is [] over a store that keeps the text (stores_text=True): reading [] as "no node allowed"
    # (SimpleVectorStore, which keeps no text, never sees it) would make every index retriever
    # return nothing. So [] is no restriction, as in LlamaIndex's text-storing stores.
    every = ids(exact_vs.query(VectorStoreQuery(query_str="wing", similarity_top_k=5)))
    assert len(every) == 5
    for mode in (VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.MMR):
        plain = ids(exact_vs.query(VectorStoreQuery(query_str="wing", similarity_top_k=5, mode=mode)))
        for kw in ({"node_ids": []}, {"doc_ids": []}):
            assert ids(exact_vs.query(VectorStoreQuery(query_str="wing", similarity_top_k=5, mode=mode,
                                                       **kw))) == plain, (mode, kw)
    retriever = index_from_store(exact_vs).as_retriever(similarity_top_k=5)
    assert retriever._node_ids == []  # what LlamaIndex sends (the reason for this rule)
    assert [n.node.node_id for n in retriever.retrieve("wing")] == every


def test_filters_with_the_value_none_answer_as_llama_index_does(exact_vs):
    # before: MetadataFilter(key=..., value=None) raised TypeError "values must be str, int, float
    # or bool, got NoneType". The expected sets come from LlamaIndex's own filter function (that of
    # its SimpleVectorStore): EQ None matches no node, NE None every node
    from llama_index.core.vector_stores.utils import build_metadata_filter_fn

    metadata = {i: m for i, _, _, m in NODES}
    every = [n[0] for n in NODES]
    for filters in [
        flt(MetadataFilter(key="topic", value=None)),
        flt(MetadataFilter(key="topic", value=None, operator="!=")),
        flt(MetadataFilter(key="nope", value=None, operator="!=")),
        flt(MetadataFilter(key="topic", value=None), MetadataFilter(key="year", value=1960),
            condition=FilterCondition.OR),
        flt(MetadataFilter(key="topic", value=None, operator="!="), MetadataFilter(key="year", value=1960)),
        flt(MetadataFilter(key="topic", value=None), condition=FilterCondition.NOT),
        flt(MetadataFilter(key="topic", value=None, operator="!="), condition=FilterCondition.NOT),
    ]:
        want = {i for i in every if build_metadata_filter_fn(metadata.get, filters)(i)}
        res = exact_vs.query(VectorStoreQuery(query_str="wing", similarity_top_k=10, filters=filters))
        assert set(ids(res)) == want, filters
        assert {n.node_id for n in exact_vs.get_nodes(every, filters=filters)} == want, filters
        assert {n.node_id for n in exact_vs.get_nodes(filters=filters)} == want, filters
    nested = flt(flt(MetadataFilter(key="topic", value=None)), MetadataFilter(key="topic", value="food"),
                 condition=FilterCondition.OR)  # LlamaIndex's function takes no nesting: worked out
    assert ids(exact_vs.query(VectorStoreQuery(query_str="wing", filters=nested))) == ["bread"]
    # a range has no bound in None (LlamaIndex's own filter raises TypeError comparing with it)
    for op in (">", ">=", "<", "<="):
        with pytest.raises(ValueError, match=rf"filter on 'year': {op!r} .*None"):
            exact_vs.query(VectorStoreQuery(query_str="wing", filters=flt(
                MetadataFilter(key="year", value=None, operator=op))))
