"""The exact store's profiles through the framework wrappers and the Ray path of the CLI (issue 59):
LangChain's constructors take ``profile=`` as a store option (a new store records it, an existing
one is checked against it), LlamaIndex's vector store searches a profile's store it is given, and
``uibk-embed index --ray --profile`` is refused before Ray starts (no backend a Ray pool can write
to keeps profiles; before, the option was dropped without a word)."""

from __future__ import annotations

import json

import pytest

from uibk_embedding import open_store
from uibk_embedding.errors import CollectionMismatch

TEXTS = ["Lift on a wing in the slipstream of a propeller.", "Boundary layer transition on a flat plate.",
         "A sourdough bread recipe with a long cold fermentation.", "The serve and volley style in tennis."]
IDS = ["wing", "plate", "bread", "tennis"]


def test_langchain_constructors_pass_the_profile_to_the_store(encoder, tmp_path):
    pytest.importorskip("langchain_core")
    from uibk_embedding.integrations.langchain import UIBKVectorStore

    where = tmp_path / "lc"
    vs = UIBKVectorStore.from_texts(TEXTS, encoder, ids=IDS, path=where, profile="compact")
    assert vs.store.profile == "compact" and vs.store.vector_dtype == "int4"
    assert vs.similarity_search("propeller slipstream lift", k=1)[0].id == "wing"
    vs.store.close()
    again = UIBKVectorStore.from_existing_collection(encoder=encoder, path=where, profile="compact")
    assert again.store.profile == "compact"
    assert again.similarity_search("sourdough", k=1)[0].page_content == TEXTS[2]
    again.store.close()
    with pytest.raises(CollectionMismatch, match="profile='exact-rerank'"):
        UIBKVectorStore.from_existing_collection(encoder=encoder, path=where, profile="exact-rerank")


def test_llama_index_searches_a_profiles_store(encoder, tmp_path):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from uibk_embedding.integrations.llama_index import UIBKVectorStore

    store = open_store("exact", path=tmp_path / "li", profile="exact-rerank", format=encoder.format)
    vs = UIBKVectorStore(encoder=encoder, store=store)
    assert vs.add([TextNode(id_=i, text=t) for i, t in zip(IDS, TEXTS, strict=True)]) == IDS
    res = vs.query(VectorStoreQuery(query_str="the serve in tennis", similarity_top_k=2))
    assert res.ids[0] == "tennis" and res.nodes[0].get_content() == TEXTS[3]
    # the rerank profile's hits carry the float16 store's exact scores
    f16 = open_store("exact", path=tmp_path / "f16", profile="float16", format=encoder.format)
    f16.upsert(IDS, encoder.encode_documents(TEXTS))
    q = encoder.encode_queries(["the serve in tennis"])[0]
    assert [h.score for h in store.search(q, k=2)] == [h.score for h in f16.search(q, k=2)]
    f16.close()
    store.close()
    assert open_store(path=tmp_path / "li").profile == "exact-rerank"


def test_cli_ray_index_refuses_a_profile_no_ray_backend_keeps(tmp_path):
    from uibk_embedding.apps import cli

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": "wing lift"}) + "\n")
    with pytest.raises(SystemExit, match="--profile chooses what a store keeps; --ray takes none"):
        cli.main(["index", str(corpus), "--backend", "lancedb", "--option", f"uri={tmp_path / 'l'}",
                  "--ray", "--profile", "compact"])
    assert not (tmp_path / "l").exists()  # refused before anything started or was written
    with pytest.raises(SystemExit, match="lives inside one process"):  # the exact store: not with Ray
        cli.main(["index", str(corpus), "--path", str(tmp_path / "e"), "--ray", "--profile", "compact"])
