"""MMR and relevance scores over our stores, as LangChain's and LlamaIndex's own documentation
uses them (``max_marginal_relevance_search``, ``as_retriever(search_type="mmr")``,
``search_type="similarity_score_threshold"``, ``similarity_search_with_relevance_scores``,
LlamaIndex ``vector_store_query_mode="mmr"``), checked against a plain reference MMR on the same
candidates, on real Cranfield documents with the embedded encoder.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.integrations.core import (
    RELEVANCE_KNOTS,
    RetrievalCore,
    mmr_select,
    query_span,
    relevance,
)
from uibk_embedding.tagged import dense_vector

QUERY = "boundary layer transition on a flat plate"


@pytest.fixture(scope="module")
def texts(cranfield) -> list[str]:
    docs = [d.full_text for d in cranfield.corpus[:60]]
    # two near-duplicates of one document: what MMR exists to avoid returning three times
    return [*docs, docs[0] + " (reprint)", docs[0] + " (second reprint)"]


@pytest.fixture(scope="module")
def core(encoder, texts) -> RetrievalCore:
    c = RetrievalCore(encoder, ExactStore())
    c.add_texts(texts, ids=[f"c{i}" for i in range(len(texts))])
    return c


def reference_mmr(rel: list[float], vecs: list[np.ndarray], k: int, lam: float) -> list[int]:
    """MMR written out in plain Python, pair by pair (the definition, no vectorisation)."""
    chosen: list[int] = []
    while len(chosen) < min(k, len(rel)):
        best, best_gain = None, -float("inf")
        for i in range(len(rel)):
            if i in chosen:
                continue
            redundancy = max((float(np.dot(vecs[i], vecs[j])) for j in chosen), default=0.0)
            gain = rel[i] if not chosen else lam * rel[i] - (1 - lam) * redundancy
            if gain > best_gain:
                best, best_gain = i, gain
        chosen.append(best)
    return chosen


@pytest.mark.parametrize("lam", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_mmr_equals_the_reference_on_the_same_candidates(core, encoder, lam):
    q = core.encode_query(QUERY)
    cands = core.store.search(q, k=20)
    rel = [relevance(q, h.score) for h in cands]
    vecs = [dense_vector(r.vectors).astype(np.float64) for r in core.store.get([h.id for h in cands])]
    want = [cands[i].id for i in reference_mmr(rel, vecs, 5, lam)]
    got = [h.id for h in core.mmr_search(QUERY, k=5, fetch_k=20, lambda_mult=lam)]
    assert got == want
    if lam == 1.0:  # no diversity: the plain ranking
        assert got == [h.id for h in core.search(QUERY, k=5)]


def test_mmr_skips_near_duplicates_that_similarity_returns(core, texts):
    dupes = {"c0", f"c{len(texts) - 2}", f"c{len(texts) - 1}"}
    query = texts[0][:80]
    plain = [h.id for h in core.search(query, k=3)]
    assert set(plain) == dupes, plain  # the three copies rank first
    diverse = [h.id for h in core.mmr_search(query, k=3, fetch_k=20, lambda_mult=0.5)]
    assert len(set(diverse) & dupes) == 1, diverse


def test_relevance_is_in_0_1_and_keeps_the_order(core):
    q = core.encode_query(QUERY)
    pairs = core.search_with_relevance(QUERY, k=10)
    rels = [r for _, r in pairs]
    assert all(0.0 <= r <= 1.0 for r in rels) and rels == sorted(rels, reverse=True)
    constant, reach = query_span(q)  # the hybrid part over what the query can reach, mapped
    xs, ys = zip(*RELEVANCE_KNOTS, strict=True)
    for h, r in pairs:
        assert r == pytest.approx(np.interp((h.score - constant) / (reach - constant), xs, ys), abs=1e-12)
    cut = rels[4]
    kept = core.search_with_relevance(QUERY, k=10, score_threshold=cut)
    assert [h.id for h, _ in kept] == [h.id for h, r in pairs if r >= cut]
    with pytest.raises(ValueError, match="lambda_mult"):
        mmr_select([1.0], np.ones((1, 1)), 1, 1.5)


def test_langchain_mmr_and_threshold_as_its_docs_use_them(encoder, core):
    pytest.importorskip("langchain_core")
    from uibk_embedding.integrations.langchain import UIBKVectorStore

    vs = UIBKVectorStore(encoder=encoder, store=core.store)
    docs = vs.max_marginal_relevance_search(QUERY, k=2, fetch_k=10)
    assert [d.id for d in docs] == [h.id for h in core.mmr_search(QUERY, k=2, fetch_k=10)]
    mmr = vs.as_retriever(search_type="mmr", search_kwargs={"k": 3, "fetch_k": 10, "lambda_mult": 0.25})
    assert [d.id for d in mmr.invoke(QUERY)] == [h.id for h in core.mmr_search(QUERY, 3, 10, 0.25)]
    scored = vs.similarity_search_with_relevance_scores(QUERY, k=5)
    assert all(0 <= s <= 1 for _, s in scored) and len(scored) == 5
    threshold = scored[2][1]
    high = vs.as_retriever(search_type="similarity_score_threshold",
                           search_kwargs={"score_threshold": threshold, "k": 5})
    got = high.invoke(QUERY)
    assert [d.id for d in got] == [d.id for d, s in scored if s >= threshold]
    assert all(d.metadata["relevance"] >= threshold for d in got)
    assert [d.id for d, _ in vs.similarity_search_with_relevance_scores(
        QUERY, k=5, score_threshold=threshold)] == [d.id for d in got]
    again = asyncio.run(vs.amax_marginal_relevance_search(QUERY, k=2, fetch_k=10))
    assert [d.id for d in again] == [d.id for d in docs]
    with pytest.raises(ValueError, match="score_threshold"):
        vs.as_retriever(search_type="similarity_score_threshold")


def test_llama_index_mmr_mode_as_its_docs_use_it(encoder, core):
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

    from uibk_embedding.integrations.llama_index import UIBKVectorStore, index_from_store

    vs = UIBKVectorStore(encoder=encoder, store=core.store)
    res = vs.query(VectorStoreQuery(query_str=QUERY, similarity_top_k=3, mode=VectorStoreQueryMode.MMR,
                                    mmr_threshold=0.25))
    assert res.ids == [h.id for h in core.mmr_search(QUERY, 3, 20, 0.25)]
    index = index_from_store(vs)
    retriever = index.as_retriever(similarity_top_k=3, vector_store_query_mode="mmr",
                                   vector_store_kwargs={"mmr_threshold": 0.25})
    assert [n.node.node_id for n in retriever.retrieve(QUERY)] == res.ids


def test_bad_fetch_k_and_threshold_are_named(encoder, core):
    pytest.importorskip("langchain_core")
    from uibk_embedding.integrations.langchain import UIBKVectorStore

    vs = UIBKVectorStore(encoder=encoder, store=core.store)
    # before: "k must be positive, got 0" named the wrong argument
    with pytest.raises(ValueError, match="fetch_k must be positive, got 0"):
        vs.max_marginal_relevance_search(QUERY, k=1, fetch_k=0)
    with pytest.raises(TypeError, match="fetch_k must be an int"):
        core.mmr_search(QUERY, k=1, fetch_k=2.5)
    # before: thresholds outside [0, 1] were accepted silently and "0.5" gave a bare TypeError
    for bad in (5, -1, "0.5", True):
        with pytest.raises(ValueError, match=r"score_threshold is a relevance in \[0, 1\]"):
            vs.similarity_search_with_relevance_scores(QUERY, k=3, score_threshold=bad)
        with pytest.raises(ValueError, match=r"score_threshold is a relevance in \[0, 1\]"):
            asyncio.run(vs.asimilarity_search_with_relevance_scores(QUERY, k=3, score_threshold=bad))
        with pytest.raises(ValueError, match=r"score_threshold is a relevance in \[0, 1\]"):
            vs.search(QUERY, "similarity_score_threshold", k=3, score_threshold=bad)


def test_llama_index_mmr_fetch_k_is_checked(encoder, core):
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import VectorStoreQuery, VectorStoreQueryMode

    from uibk_embedding.integrations.llama_index import UIBKVectorStore

    vs = UIBKVectorStore(encoder=encoder, store=core.store)
    q = VectorStoreQuery(query_str=QUERY, similarity_top_k=3, mode=VectorStoreQueryMode.MMR)
    # before: mmr_fetch_k=0 (or a negative) silently meant the default
    for bad in (0, -5):
        with pytest.raises(ValueError, match=f"mmr_fetch_k must be positive, got {bad}"):
            vs.query(q, mmr_fetch_k=bad)
    assert vs.query(q, mmr_fetch_k=10).ids == [h.id for h in core.mmr_search(QUERY, 3, 10, 0.5)]
