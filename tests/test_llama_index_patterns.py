"""LlamaIndex's documented patterns over a UIBKVectorStore (issue #42): ``from_vector_store`` and
``from_documents(storage_context=...)`` with this library's embed model (they raised
``ImportError: llama-index-embeddings-openai package not found`` with LlamaIndex's default)."""

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, Settings, StorageContext, VectorStoreIndex

import uibk_embedding as ue
from uibk_embedding.integrations.llama_index import UIBKEmbedding, UIBKVectorStore

TEXTS = {"wing": "Lift on a wing in a propeller slipstream.",
         "bread": "A sourdough bread recipe with rye flour.",
         "flutter": "Flutter of thin panels in supersonic flow."}


@pytest.fixture(scope="module")
def encoder():
    return ue.load_encoder()


@pytest.fixture
def vs(encoder):
    return UIBKVectorStore(encoder=encoder, store=ue.open_store("exact"))


def _docs():
    return [Document(text=t, doc_id=i) for i, t in TEXTS.items()]


def test_from_vector_store_with_the_library_embed_model(vs, encoder):
    index = VectorStoreIndex.from_vector_store(vs, embed_model=UIBKEmbedding(encoder))
    for d in _docs():
        index.insert(d)
    assert vs.client.count() == 3
    hits = index.as_retriever(similarity_top_k=1).retrieve("panel flutter at supersonic speed")
    assert hits[0].node.ref_doc_id == "flutter"


def test_from_documents_with_storage_context(vs, encoder):
    ctx = StorageContext.from_defaults(vector_store=vs)
    index = VectorStoreIndex.from_documents(_docs(), storage_context=ctx, embed_model=UIBKEmbedding(encoder))
    assert vs.client.count() == 3
    assert index.as_retriever(similarity_top_k=1).retrieve("rye bread")[0].node.ref_doc_id == "bread"


def test_settings_embed_model_makes_both_patterns_work_without_arguments(vs, encoder, monkeypatch):
    monkeypatch.setattr(Settings, "_embed_model", UIBKEmbedding(encoder))
    ctx = StorageContext.from_defaults(vector_store=vs)
    index = VectorStoreIndex.from_documents(_docs(), storage_context=ctx)
    again = VectorStoreIndex.from_vector_store(vs)  # reopened over the same store
    top = again.as_retriever(similarity_top_k=1).retrieve("propeller slipstream")
    assert top[0].node.ref_doc_id == "wing"
    assert index.as_retriever(similarity_top_k=3).retrieve("wing")[0].node.ref_doc_id == "wing"


def test_embed_model_vectors_are_the_dense_head(encoder):
    from uibk_embedding.tagged import dense_vector

    e = UIBKEmbedding(encoder)
    got = e.get_text_embedding_batch(list(TEXTS.values()))
    want = [dense_vector(x) for x in encoder.encode_documents(list(TEXTS.values()))]
    assert len(got) == 3 and all(abs(sum(a * b for a, b in zip(g, w, strict=True)) - 1) < 1e-5
                                 for g, w in zip(got, want, strict=True))


def test_embed_model_refuses_a_foreign_encoder():
    with pytest.raises(TypeError, match="uibk encoder"):
        UIBKEmbedding(encoder="text-embedding-3-small")


def test_a_store_with_the_encoders_format_refuses_another_projection(tmp_path, encoder):
    """LlamaIndex's constructors take a store (they create none): a store opened with the
    encoder's format records its projection, and a vector store or retriever built on it with an
    encoder of another projection raises CollectionMismatch (its queries would not match the
    stored token vectors); the store is left as it was."""
    from uibk_embedding.errors import CollectionMismatch
    from uibk_embedding.integrations.llama_index import UIBKRetriever

    pca = ue.load_encoder(projection="pca")
    with ue.open_store("exact", path=tmp_path / "s", format=encoder.format) as store:
        vs = UIBKVectorStore(encoder=encoder, store=store)
        VectorStoreIndex.from_vector_store(vs, embed_model=UIBKEmbedding(encoder)).insert(_docs()[0])
    with ue.open_store("exact", path=tmp_path / "s") as store:
        assert store.format == encoder.format
        with pytest.raises(CollectionMismatch, match=r"projection random-[0-9a-f@]+, not pca-"):
            UIBKVectorStore(encoder=pca, store=store)
        with pytest.raises(CollectionMismatch, match=r"projection random-[0-9a-f@]+, not pca-"):
            UIBKRetriever(encoder=pca, store=store)
        assert store.count() == 1


def test_a_store_opened_without_the_encoders_format_warns_before_it_is_filled(tmp_path, encoder):
    """LlamaIndex's constructors take a store: one opened without format= records no projection
    (a later reopen with another projection would be accepted), so the vector store warns while
    the store is empty; with format=encoder.format, or in memory, it does not."""
    import warnings

    with ue.open_store("exact", path=tmp_path / "bare") as store:
        with pytest.warns(UserWarning, match=r"records no encoder projection.*format=encoder\.format"):
            UIBKVectorStore(encoder=encoder, store=store)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ue.open_store("exact", path=tmp_path / "fmt", format=encoder.format) as store:
            UIBKVectorStore(encoder=encoder, store=store)
        UIBKVectorStore(encoder=encoder, store=ue.open_store("exact"))
