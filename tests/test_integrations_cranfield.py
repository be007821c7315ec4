"""On Cranfield, each framework's retriever returns the same top-10 as ``uibk-embed search``.

* Exact store, end to end through the real command line: ``uibk-embed index`` writes a store
  of the first 100 Cranfield documents to disk, ``uibk-embed search --json`` answers queries
  (default dense weight, a custom one, and a filter), and the LangChain and LlamaIndex
  retrievers, opened on the same store with the same settings, must return the same ids in
  the same order with the same scores.
* Every other backend spec of ``tests/backends`` (the conformance suite's): the store is filled
  with the 200 encoded Cranfield documents of the ``real_data`` fixture, then the CLI's own
  ``search`` command runs against that very store (``open_store`` returns it, the session
  encoder stands in for reloading the same embedded model) and is compared the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

from uibk_embedding.adapters import open_store
from uibk_embedding.apps import cli
from uibk_embedding.apps.data import load_beir
from uibk_embedding.integrations import langchain as lc
from uibk_embedding.integrations import llama_index as li
from uibk_embedding.testing import BackendSpec, datasets_dir, open_spec

HERE = Path(__file__).resolve().parent
N_DOCS = 100  # documents the end-to-end test indexes through the CLI
K = 10


def _groups(i: int) -> str:
    return "even" if i % 2 == 0 else "odd"


@pytest.fixture(scope="module")
def cranfield_coll():
    root = datasets_dir() / "cranfield"
    if not root.exists():
        pytest.fail(f"test collection missing: {root} (set UIBK_DATASETS)")
    return load_beir(root)


def cli_search(capsys, query: str, args: list[str]) -> list[tuple[str, float]]:
    capsys.readouterr()
    assert cli.main(["search", query, "-k", str(K), "--json", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    return [(h["id"], h["score"]) for h in out["hits"]]


def framework_results(encoder, store, query: str, dense_weight=None, group=None):
    lc_r = lc.UIBKRetriever(encoder=encoder, store=store, k=K, dense_weight=dense_weight,
                            filter={"group": group} if group else None)
    lc_hits = [(d.id, d.metadata["score"]) for d in lc_r.invoke(query)]
    li_filters = MetadataFilters(filters=[MetadataFilter(key="group", value=group)]) if group else None
    li_r = li.UIBKRetriever(encoder=encoder, store=store, similarity_top_k=K, dense_weight=dense_weight,
                            filters=li_filters)
    li_hits = [(n.node.node_id, n.node.metadata["score"]) for n in li_r.retrieve(query)]
    return lc_hits, li_hits


def assert_same(cli_hits, other, what):
    assert [i for i, _ in other] == [i for i, _ in cli_hits], f"{what}: top-{K} differs from the CLI"
    assert [s for _, s in other] == pytest.approx([s for _, s in cli_hits], rel=1e-6), what


def test_exact_store_end_to_end_through_the_cli(cranfield_coll, encoder, tmp_path, capsys):
    corpus = tmp_path / "cranfield-200.jsonl"
    with corpus.open("w") as f:
        for i, d in enumerate(cranfield_coll.corpus[:N_DOCS]):
            f.write(json.dumps({"_id": d.id, "title": d.title, "text": d.text,
                                "metadata": {"group": _groups(i)}}) + "\n")
    path = tmp_path / "store"
    assert cli.main(["index", str(corpus), "--backend", "exact", "--path", str(path), "--quiet"]) == 0
    queries = list(cranfield_coll.queries.values())[:2]
    settings = [(queries[0], None, None), (queries[1], 2.5, None), (queries[1], None, "odd")]
    for q, w, group in settings:
        args = ["--backend", "exact", "--path", str(path)]
        args += ["--dense-weight", str(w)] if w else []
        args += ["--filter", json.dumps({"group": group})] if group else []
        ref = cli_search(capsys, q, args)  # the CLI opens the store itself: one store object at a time
        assert len(ref) == K
        store = open_store("exact", path=path)
        try:
            assert store.count() == N_DOCS
            lc_hits, li_hits = framework_results(encoder, store, q, w, group)
        finally:
            store.close()
        assert_same(ref, lc_hits, f"LangChain, query {q[:40]!r}, w={w}, group={group}")
        assert_same(ref, li_hits, f"LlamaIndex, query {q[:40]!r}, w={w}, group={group}")
    # the LangChain vector store reads the CLI's store as it is (text + metadata)
    with open_store("exact", path=path) as store:
        first = cranfield_coll.corpus[0].id
        doc = lc.UIBKVectorStore.from_existing_store(store, encoder).get_by_ids([first])[0]
        assert doc.page_content == cranfield_coll.corpus[0].text and doc.metadata["group"] == "even"


# -- every backend spec (the ``spec`` parameter of tests/conftest.py) ---------------------------
class _KeepOpen:
    """The store as the CLI sees it: the CLI closes what it opens; this one stays open."""

    def __init__(self, store) -> None:
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def close(self) -> None:
        pass


def test_every_backend_matches_the_cli_search(spec: BackendSpec, real_data, encoder, tmp_path, capsys,
                                              monkeypatch):
    store = open_spec(spec, tmp_path)
    try:
        md = [{"text": t, "group": _groups(i)} for i, t in enumerate(real_data.texts)]
        store.upsert(real_data.doc_ids, real_data.docs, md)
        monkeypatch.setattr("uibk_embedding.adapters.open_store", lambda backend, **kw: _KeepOpen(store))
        monkeypatch.setattr(cli, "require_store", lambda backend, opts: None)  # the store is this one
        monkeypatch.setattr(cli, "_load_encoder", lambda args, **kw: encoder)
        qs = real_data.query_texts
        settings = [(qs[0], None, None), (qs[1], 2.5, None), (qs[2], None, "odd")]
        for q, w, group in settings:
            args = ["--backend", store.backend]
            args += ["--dense-weight", str(w)] if w else []
            args += ["--filter", json.dumps({"group": group})] if group else []
            ref = cli_search(capsys, q, args)
            assert len(ref) == K
            lc_hits, li_hits = framework_results(encoder, store, q, w, group)
            assert_same(ref, lc_hits, f"{spec.name} LangChain, w={w}, group={group}")
            assert_same(ref, li_hits, f"{spec.name} LlamaIndex, w={w}, group={group}")
    finally:
        store.close()


def test_llama_index_in_filter_matches_cli(real_data, encoder, capsys, monkeypatch):
    """An IN filter (LlamaIndex) and ``$in`` (LangChain, CLI) select the same documents."""
    from uibk_embedding.adapters.exact import ExactStore

    store = ExactStore()
    store.upsert(real_data.doc_ids, real_data.docs,
                 [{"text": t, "n": i % 5} for i, t in enumerate(real_data.texts)])
    monkeypatch.setattr("uibk_embedding.adapters.open_store", lambda backend, **kw: _KeepOpen(store))
    monkeypatch.setattr(cli, "require_store", lambda backend, opts: None)  # the store is this one
    monkeypatch.setattr(cli, "_load_encoder", lambda args, **kw: encoder)
    q = real_data.query_texts[2]
    ref = cli_search(capsys, q, ["--filter", json.dumps({"n": {"$in": [1, 3]}})])
    lc_hits = [(d.id, d.metadata["score"]) for d in lc.UIBKRetriever(
        encoder=encoder, store=store, k=K, filter={"n": {"$in": [1, 3]}}).invoke(q)]
    li_hits = [(n.node.node_id, n.node.metadata["score"]) for n in li.UIBKRetriever(
        encoder=encoder, store=store, similarity_top_k=K,
        filters=MetadataFilters(filters=[MetadataFilter(key="n", value=[1, 3], operator=FilterOperator.IN)]),
    ).retrieve(q)]
    assert_same(ref, lc_hits, "LangChain $in")
    assert_same(ref, li_hits, "LlamaIndex IN")
