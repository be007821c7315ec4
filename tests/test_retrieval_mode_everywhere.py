"""``retrieval_mode`` (hybrid / dense / tokens, per query, no re-index) in the LangChain vector
store and retriever, the CLI (``search``/``eval --retrieval-mode``) and ``compare`` (issue #42);
and LlamaIndex's ``NodeWithScore.score`` on the LangChain relevance scale. The reference is
:class:`RetrievalCore`'s modes (tests/test_relevance_scale.py checks those against the heads).
Real stores (exact in memory and on disk, local-path Qdrant), the embedded default encoder."""

from __future__ import annotations

import json

import pytest

from uibk_embedding.adapters import open_store
from uibk_embedding.apps import compare
from uibk_embedding.apps.cli import main as cli_main
from uibk_embedding.integrations.core import RetrievalCore, relevance

pytest.importorskip("langchain_core")
from uibk_embedding.integrations import langchain as lc

MODES = ("hybrid", "dense", "tokens")
QUERY = "lift and drag of a wing in the slipstream of a propeller"


@pytest.fixture(scope="module")
def texts(datasets) -> list[str]:
    from uibk_embedding.apps.data import read_corpus

    return [d.full_text for d in read_corpus(datasets / "cranfield")[:60]]


@pytest.fixture(params=["exact", "qdrant"])
def store(request, tmp_path, encoder, texts):
    if request.param == "qdrant":
        pytest.importorskip("qdrant_client")
    s = open_store(request.param, path=str(tmp_path / "store"), format=encoder.format)
    RetrievalCore(encoder, s).add_texts(texts, ids=[f"c{i}" for i in range(len(texts))])
    yield s
    s.close()


def core_ids(encoder, store, mode: str, k: int = 6) -> list[str]:
    return [h.id for h in RetrievalCore(encoder, store).search(QUERY, k=k, retrieval_mode=mode)]


def test_langchain_vector_store_modes_per_query_and_default(encoder, store):
    vs = lc.UIBKVectorStore(encoder=encoder, store=store)
    want = {m: core_ids(encoder, store, m) for m in MODES}
    assert want["dense"] != want["tokens"]  # the two heads disagree on real data
    for mode in MODES:
        assert [d.id for d in vs.similarity_search(QUERY, k=6, retrieval_mode=mode)] == want[mode]
        scored = vs.similarity_search_with_relevance_scores(QUERY, k=6, retrieval_mode=mode)
        assert [d.id for d, _ in scored] == want[mode] and all(0 <= r <= 1 for _, r in scored)
        mmr = vs.max_marginal_relevance_search(QUERY, k=3, fetch_k=6, lambda_mult=1.0, retrieval_mode=mode)
        assert [d.id for d in mmr] == want[mode][:3]  # lambda 1: relevance order of that mode
    dense_vs = lc.UIBKVectorStore(encoder=encoder, store=store, retrieval_mode="dense")
    assert [d.id for d in dense_vs.similarity_search(QUERY, k=6)] == want["dense"]
    assert [d.id for d in dense_vs.similarity_search(QUERY, k=6, retrieval_mode="hybrid")] == want["hybrid"]
    with pytest.raises(ValueError, match="retrieval_mode must be one of"):
        vs.similarity_search(QUERY, retrieval_mode="sparse")
    with pytest.raises(ValueError, match="retrieval_mode must be one of"):
        lc.UIBKVectorStore(encoder=encoder, store=store, retrieval_mode="both")


def test_langchain_retriever_modes_as_field_search_kwargs_and_per_call(encoder, store):
    vs = lc.UIBKVectorStore(encoder=encoder, store=store)
    want = {m: core_ids(encoder, store, m) for m in MODES}
    for mode in MODES:
        by_field = lc.UIBKRetriever(vectorstore=vs, k=6, retrieval_mode=mode).invoke(QUERY)
        assert [d.id for d in by_field] == want[mode]
        by_kwargs = vs.as_retriever(search_kwargs={"k": 6, "retrieval_mode": mode}).invoke(QUERY)
        assert [d.id for d in by_kwargs] == want[mode]
        per_call = vs.as_retriever(search_kwargs={"k": 6}).invoke(QUERY, retrieval_mode=mode)
        assert [d.id for d in per_call] == want[mode]
    thr = vs.as_retriever(search_type="similarity_score_threshold",
                          search_kwargs={"k": 6, "score_threshold": 0.0, "retrieval_mode": "tokens"})
    assert [d.id for d in thr.invoke(QUERY)] == want["tokens"]
    with pytest.raises(ValueError, match="retrieval_mode must be one of"):
        vs.as_retriever(search_kwargs={"retrieval_mode": "sparse"})


def test_llama_index_node_score_is_the_langchain_relevance(encoder, store):
    pytest.importorskip("llama_index.core")
    from uibk_embedding.integrations import llama_index as li

    core = RetrievalCore(encoder, store)
    for mode in MODES:
        q = core.encode_query(QUERY, retrieval_mode=mode)
        lc_scores = lc.UIBKVectorStore(encoder=encoder, store=store).similarity_search_with_relevance_scores(
            QUERY, k=5, retrieval_mode=mode)
        vs = li.UIBKVectorStore(encoder=encoder, store=store)
        got = li.UIBKRetriever(vector_store=vs, similarity_top_k=5, retrieval_mode=mode).retrieve(QUERY)
        assert [n.node.node_id for n in got] == [d.id for d, _ in lc_scores]
        assert [n.score for n in got] == pytest.approx([r for _, r in lc_scores], abs=1e-9)
        for n in got:  # the raw MaxSim stays in the metadata, and maps to the score
            assert n.score == pytest.approx(relevance(q, n.node.metadata["score"]), abs=1e-9)
        index = li.index_from_store(vs)
        via_index = index.as_retriever(similarity_top_k=5, vector_store_kwargs={"retrieval_mode": mode})
        assert [n.score for n in via_index.retrieve(QUERY)] == pytest.approx([n.score for n in got], abs=1e-9)


def test_cli_search_retrieval_mode(encoder, texts, tmp_path, capsys):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"c{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    path = str(tmp_path / "idx")
    assert cli_main(["index", str(corpus), "--backend", "exact", "--path", path, "--quiet"]) == 0
    with open_store("exact", path=path) as store:
        want = {m: core_ids(encoder, store, m, k=5) for m in MODES}
    for mode in MODES:
        capsys.readouterr()
        assert cli_main(["search", QUERY, "--path", path, "-k", "5", "--json",
                         "--retrieval-mode", mode]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["retrieval_mode"] == mode and [h["id"] for h in out["hits"]] == want[mode]
    with pytest.raises(SystemExit) as e:
        cli_main(["search", QUERY, "--path", path, "--retrieval-mode", "sparse"])
    assert e.value.code == 2


@pytest.fixture
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(tmp_path / "uibk-cache"))


N_LIMIT_QUERIES = 100


@pytest.fixture
def limit_subset(datasets, tmp_path) -> str:
    """LIMIT-small (all 46 documents) with its first 100 queries and their qrels: what is tested
    is that the mode reaches eval and compare, not the size of the query set (1,000)."""
    src = datasets / "limit-small"
    queries = (src / "queries.jsonl").read_text().splitlines()[:N_LIMIT_QUERIES]
    keep = {json.loads(q)["_id"] for q in queries}
    head, *rows = (src / "qrels" / "test.tsv").read_text().splitlines()
    d = tmp_path / "limit-small"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text((src / "corpus.jsonl").read_text())
    (d / "queries.jsonl").write_text("\n".join(queries) + "\n")
    (d / "qrels" / "test.tsv").write_text("\n".join([head, *(r for r in rows if r.split("\t")[0] in keep)])
                                          + "\n")
    return str(d)


def test_eval_and_compare_retrieval_mode(limit_subset, tmp_path, capsys, _cache):
    data = limit_subset
    runs = {}
    for mode in MODES:
        capsys.readouterr()
        assert cli_main(["eval", data, "--json", "--retrieval-mode", mode]) == 0
        runs[mode] = json.loads(capsys.readouterr().out)
    assert "retrieval_mode" not in runs["hybrid"] and "fused" in runs["hybrid"]["metrics"]
    for mode in ("dense", "tokens"):
        m = runs[mode]["metrics"]
        assert runs[mode]["retrieval_mode"] == mode and "fused" not in m
        assert m[mode] == runs["hybrid"]["metrics"][mode]  # the exact heads beside it, unchanged
        # the store's run in that mode is its own ranking (slot MaxSim lets a query slot meet
        # any document slot, so "dense (store)" is not the concatenated-cosine "dense" head)
        assert m[f"{mode} (store)"] != runs["hybrid"]["metrics"]["fused"]
    out = tmp_path / "out"
    for mode in MODES:
        assert compare.main([data, "--backends", "exact", "--out", str(out), "--quiet", "--threads", "1",
                             "--retrieval-mode", mode]) == 0
        res = json.loads((out / "compare.json").read_text())
        assert res["retrieval_mode"] == mode and res["n_queries"] == N_LIMIT_QUERIES
        assert f"retrieval mode {mode}" in (out / "compare.md").read_text().splitlines()[0]
        key = "fused" if mode == "hybrid" else f"{mode} (store)"
        assert res["backends"]["exact"]["ndcg@10"] == pytest.approx(
            runs[mode]["metrics"][key]["ndcg@10"], abs=1e-4)
