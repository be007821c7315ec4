"""The relevance scale (issue #42): the hybrid part of MaxSim over what the query can reach,
``(score - C(q)) / (max - C(q))`` from the query alone, through a fixed map calibrated on
standard-library docstrings (benchmarks/relevance.py); and ``retrieval_mode`` per query.
Real Cranfield documents, the embedded encoder, the exact store (the reference)."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.integrations.core import RetrievalCore, hybrid_fraction, query_span, relevance
from uibk_embedding.tagged import query_for_mode

SHORT = "slipstream lift"
LONG = ("an experimental study of the lift and drag of a wing immersed in the slipstream of a "
        "propeller at several angles of attack, with boundary layer measurements along the span "
        "and a comparison with the theory of thin aerofoils in a non-uniform stream")


@pytest.fixture(scope="module")
def texts(cranfield) -> list[str]:
    return [d.full_text for d in cranfield.corpus[:80]]


@pytest.fixture(scope="module")
def core(encoder, texts) -> RetrievalCore:
    c = RetrievalCore(encoder, ExactStore())
    c.add_texts(texts, ids=[f"c{i}" for i in range(len(texts))])
    return c


def perfect_document(q: np.ndarray) -> np.ndarray:
    """A stored list every query row matches exactly: the query rows at unit norm."""
    q = np.asarray(q, dtype=np.float64)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("text", [SHORT, LONG])
@pytest.mark.parametrize("w", [None, 0.5, 3.0])
def test_a_perfect_match_is_1_whatever_the_query_length(encoder, text, w):
    q = encoder.encode_queries([text], dense_weight=w)[0]
    store = ExactStore()
    other = encoder.encode_documents(["sourdough bread"])[0]
    store.upsert(["perfect", "other"], [perfect_document(q), other])
    hits = store.search(q, k=2, explain=True)
    assert hits[0].id == "perfect"
    assert relevance(q, hits[0].score) == pytest.approx(1.0, abs=1e-5)
    assert relevance(q, hits[1].score) < 0.5
    c, top = query_span(q)
    assert c == pytest.approx(hits[0].decomposition.constant, abs=1e-4)  # C(q) as decompose finds it
    assert top == pytest.approx(hits[0].score, abs=1e-4)


def test_the_constant_is_the_format_constant(encoder):
    fmt = encoder.format
    for text, w in [(SHORT, 1.0), (LONG, 2.0)]:
        q = encoder.encode_queries([text], dense_weight=w)[0]
        m = int((q[:, 0] > 0).sum())
        assert query_span(q)[0] == pytest.approx(fmt.constant(m, w), rel=1e-5)


def test_a_document_against_its_own_text_is_near_1(core, texts):
    for text in (texts[3], texts[3][:120]):
        (hit, rel), = core.search_with_relevance(text, k=1)
        assert hit.id == "c3" and rel > 0.8, rel


@pytest.mark.parametrize("gibberish", ["zzz qqq xxy", "asdf qwer zxcv", "blorp fnarg wibble"])
def test_gibberish_best_document_is_below_one_half(core, gibberish):
    (hit, rel), = core.search_with_relevance(gibberish, k=1)
    assert rel < 0.5, (gibberish, hit.id, rel)
    assert core.search_with_relevance(gibberish, k=5, score_threshold=0.5) == []


def test_relevance_is_the_mapped_hybrid_fraction_and_keeps_the_order(core):
    q = core.encode_query(LONG)
    pairs = core.search_with_relevance(LONG, k=10)
    rels = [r for _, r in pairs]
    assert rels == sorted(rels, reverse=True) and all(0 <= r <= 1 for r in rels)
    c, top = query_span(q)
    for h, r in pairs:
        assert hybrid_fraction(q, h.score) == pytest.approx((h.score - c) / (top - c), abs=1e-9)
        assert r == relevance(q, h.score)


# -- retrieval_mode ------------------------------------------------------------------------------
def slot_score(q: np.ndarray, d: np.ndarray) -> float:
    """Dense reference: each query slot's best document slot (cosine of the 127-d bodies)."""
    qs = q[q[:, 0] < 0, 1:].astype(np.float64)
    ds = d[d[:, 0] < 0, 1:].astype(np.float64)
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    ds /= np.linalg.norm(ds, axis=1, keepdims=True)
    return float((qs @ ds.T).max(axis=1).sum())


def token_maxsim(q: np.ndarray, d: np.ndarray) -> float:
    """Token MaxSim reference: query token bodies against document token bodies only."""
    qt = q[q[:, 0] > 0, 1:].astype(np.float64)
    dt = d[d[:, 0] > 0, 1:].astype(np.float64)
    return float((qt @ dt.T).max(axis=1).sum())


def reference_ranking(core, query: str, score) -> list[str]:
    q = core.encode_query(query, retrieval_mode="hybrid")
    recs = list(core.store.get([f"c{i}" for i in range(core.count())]))
    scores = {r.id: score(q, r.vectors) for r in recs}
    return sorted(scores, key=lambda i: -scores[i])


@pytest.mark.parametrize("query", [SHORT, LONG, "heat transfer in hypersonic flow"])
def test_dense_mode_ranks_by_the_dense_head_and_tokens_mode_by_token_maxsim(core, query):
    k = 10
    dense = [h.id for h in core.search(query, k=k, retrieval_mode="dense")]
    tokens = [h.id for h in core.search(query, k=k, retrieval_mode="tokens")]
    assert dense == reference_ranking(core, query, slot_score)[:k]
    assert tokens == reference_ranking(core, query, token_maxsim)[:k]
    assert dense != tokens  # the two heads disagree somewhere on real data
    hybrid = [h.id for h in core.search(query, k=k)]
    assert hybrid == [h.id for h in core.search(query, k=k, retrieval_mode="hybrid")]
    for mode in ("dense", "tokens"):
        (h, r), = core.search_with_relevance(query, k=1, retrieval_mode=mode)
        assert 0 <= r <= 1 and h.id == core.search(query, k=1, retrieval_mode=mode)[0].id


def test_mode_default_and_errors(encoder, core):
    dense_core = RetrievalCore(encoder, core.store, retrieval_mode="dense")
    assert [h.id for h in dense_core.search(LONG, k=5)] == [
        h.id for h in core.search(LONG, k=5, retrieval_mode="dense")]
    assert [h.id for h in dense_core.search(LONG, k=5, retrieval_mode="hybrid")] == [
        h.id for h in core.search(LONG, k=5)]
    with pytest.raises(ValueError, match="retrieval_mode must be one of"):
        RetrievalCore(encoder, core.store, retrieval_mode="sparse")
    with pytest.raises(ValueError, match="retrieval_mode must be one of"):
        core.search(LONG, retrieval_mode="both")
    q = core.encode_query(LONG)
    with pytest.raises(ValueError, match="no token rows"):
        query_for_mode(query_for_mode(q, "dense"), "tokens")


def test_langchain_and_llama_index_give_the_core_relevance(encoder, core):
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from uibk_embedding.integrations import langchain as lc
    from uibk_embedding.integrations import llama_index as li

    want = [(h.id, r) for h, r in core.search_with_relevance(LONG, k=5)]
    q = core.encode_query(LONG)
    assert [r for _, r in want] == [relevance(q, h.score) for h in core.search(LONG, k=5)]
    vs = lc.UIBKVectorStore(encoder=encoder, store=core.store)
    got = vs.similarity_search_with_relevance_scores(LONG, k=5)
    assert [d.id for d, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([r for _, r in want], abs=1e-9)
    assert vs.similarity_search_with_relevance_scores("zzz qqq xxy", k=3, score_threshold=0.5) == []
    res = li.UIBKVectorStore(encoder=encoder, store=core.store).query(
        VectorStoreQuery(query_str=LONG, similarity_top_k=5))
    assert [n.metadata["relevance"] for n in res.nodes] == pytest.approx([r for _, r in want], abs=1e-9)


def test_llama_index_retrieval_mode_per_query_and_per_retriever(encoder, core):
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from uibk_embedding.integrations import llama_index as li

    vs = li.UIBKVectorStore(encoder=encoder, store=core.store)
    for mode in ("dense", "tokens", "hybrid"):
        want = [h.id for h in core.search(LONG, k=5, retrieval_mode=mode)]
        assert vs.query(VectorStoreQuery(query_str=LONG, similarity_top_k=5), retrieval_mode=mode).ids == want
        r = li.UIBKRetriever(vector_store=vs, similarity_top_k=5, retrieval_mode=mode)
        assert [n.node.node_id for n in r.retrieve(LONG)] == want
        index = li.index_from_store(vs)
        retriever = index.as_retriever(similarity_top_k=5, vector_store_kwargs={"retrieval_mode": mode})
        got = retriever.retrieve(LONG)
        assert [n.node.node_id for n in got] == want
    with pytest.raises(ValueError, match="retrieval_mode must be one of"):
        li.UIBKRetriever(vector_store=vs, retrieval_mode="sparse")
