"""LangChain constructors people bring from langchain-qdrant (issue #42): ``from_texts(path=,
collection_name=, url=/client=)``, ``from_existing_collection`` (creates nothing, and says why a
collection does not fit), ``client=`` / ``collection_name=``, ``similarity_search(score_threshold=)``."""

import pytest

pytest.importorskip("langchain_core")

import uibk_embedding as ue
from uibk_embedding.errors import StoreNotFound
from uibk_embedding.integrations.langchain import UIBKVectorStore

TEXTS = ["lift on a wing in a propeller slipstream", "a sourdough bread recipe with rye flour",
         "flutter of thin panels in supersonic flow"]
IDS = ["wing", "bread", "flutter"]


@pytest.fixture(scope="module")
def encoder():
    return ue.load_encoder()


def test_from_texts_path_then_from_existing_collection(tmp_path, encoder):
    where = tmp_path / "idx"
    UIBKVectorStore.from_texts(TEXTS, encoder, ids=IDS, path=where).store.close()
    vs = UIBKVectorStore.from_existing_collection(path=where, encoder=encoder)
    assert vs.store.backend == "exact" and vs.store.count() == 3
    assert vs.similarity_search("panel flutter", k=1)[0].id == "flutter"
    vs.store.close()


def test_from_existing_collection_creates_nothing(tmp_path, encoder):
    where = tmp_path / "never"
    with pytest.raises(StoreNotFound, match="no store at"):
        UIBKVectorStore.from_existing_collection(path=where, encoder=encoder)
    assert not where.exists()


def test_from_existing_collection_without_texts_says_which_key(tmp_path, encoder):
    where = tmp_path / "cli"
    with ue.open_store("exact", path=where) as s:
        s.upsert(["a"], encoder.encode_documents(["wing"]), [{"body": "wing"}])
    with pytest.raises(ValueError, match=r"no 'text' metadata key .*'body'.*text_key="):
        UIBKVectorStore.from_existing_collection(path=where, encoder=encoder)
    vs = UIBKVectorStore.from_existing_collection(path=where, encoder=encoder, text_key="body")
    assert vs.get_by_ids(["a"])[0].page_content == "wing"
    vs.store.close()


def test_qdrant_collection_name_path_and_client(tmp_path, encoder):
    qdrant_client = pytest.importorskip("qdrant_client")
    where = tmp_path / "q"
    vs = UIBKVectorStore.from_texts(TEXTS, encoder, ids=IDS, path=where, collection_name="docs")
    assert vs.store.backend == "qdrant"
    vs.store.close()
    again = UIBKVectorStore.from_existing_collection("docs", encoder, path=where)
    assert again.similarity_search("rye bread", k=1)[0].id == "bread"
    again.store.close()
    with pytest.raises(StoreNotFound, match="'other'"):
        UIBKVectorStore.from_existing_collection("other", encoder, path=where)
    client = qdrant_client.QdrantClient(":memory:")
    mem = UIBKVectorStore(encoder=encoder, client=client, collection_name="mem")
    mem.add_texts(TEXTS, ids=IDS)
    assert client.collection_exists("mem")
    assert mem.similarity_search("wing lift", k=1)[0].id == "wing"


def test_store_and_client_are_exclusive(encoder):
    with pytest.raises(TypeError, match="store=, or client="):
        UIBKVectorStore(encoder=encoder, store=ue.open_store("exact"), collection_name="x")
    with pytest.raises(TypeError, match="needs store="):
        UIBKVectorStore(encoder=encoder)
    with pytest.raises(TypeError, match="not both"):
        UIBKVectorStore.from_texts(TEXTS, encoder, store=ue.open_store("exact"), path="x")


def test_similarity_search_score_threshold(encoder):
    vs = UIBKVectorStore.from_texts(TEXTS, encoder, ids=IDS)
    q = "supersonic panel flutter"
    rel = dict((d.id, r) for d, r in vs.similarity_search_with_relevance_scores(q, k=3))
    for t in (0.0, 0.3, 0.5, 0.8, 1.0):
        want = [i for i, r in sorted(rel.items(), key=lambda x: -x[1]) if r >= t]
        assert [d.id for d in vs.similarity_search(q, k=3, score_threshold=t)] == want
        assert [d.id for d, _ in vs.similarity_search_with_score(q, k=3, score_threshold=t)] == want
    assert len(vs.similarity_search(q, k=3, score_threshold=0.0)) == 3
    assert vs.similarity_search(q, k=3, score_threshold=1.0) == []
    with pytest.raises(ValueError, match=r"relevance in \[0, 1\]"):
        vs.similarity_search(q, k=3, score_threshold=12.0)


def test_constructors_record_the_encoders_format(tmp_path, encoder):
    """A store made by from_texts(path=/collection_name=) or UIBKVectorStore(client=) records the
    encoder's format (its projection included), so reopening it with an encoder of another
    projection raises CollectionMismatch instead of returning scores against the wrong vectors."""
    from uibk_embedding.errors import CollectionMismatch

    pca = ue.load_encoder(projection="pca")
    assert pca.format.projection != encoder.format.projection
    where = tmp_path / "idx"
    vs = UIBKVectorStore.from_texts(TEXTS, ids=IDS, path=where, encoder=encoder)
    assert vs.store.format == encoder.format
    vs.store.close()
    with pytest.raises(CollectionMismatch, match=r"projection random-[0-9a-f@]+, not pca-"):
        UIBKVectorStore.from_existing_collection(path=where, encoder=pca)
    again = UIBKVectorStore.from_existing_collection(path=where, encoder=encoder)
    assert again.store.count() == 3 and again.store.format == encoder.format
    again.store.close()
    # an explicit format= that the encoder cannot use is refused before any store is made
    with pytest.raises(CollectionMismatch, match="format="):
        UIBKVectorStore.from_texts(TEXTS, ids=IDS, path=tmp_path / "other", encoder=pca,
                                   format=encoder.format)
    assert not (tmp_path / "other").exists()
    qdrant_client = pytest.importorskip("qdrant_client")
    q = UIBKVectorStore.from_texts(TEXTS, encoder, ids=IDS, path=tmp_path / "q", collection_name="docs")
    assert q.store.format == encoder.format
    q.store.close()
    with pytest.raises(CollectionMismatch, match=r"projection random-[0-9a-f@]+, not pca-"):
        UIBKVectorStore.from_existing_collection("docs", pca, path=tmp_path / "q")
    client = qdrant_client.QdrantClient(":memory:")
    mem = UIBKVectorStore(encoder=encoder, client=client, collection_name="mem")
    assert mem.store.format == encoder.format
    with pytest.raises(CollectionMismatch, match=r"projection random-[0-9a-f@]+, not pca-"):
        UIBKVectorStore(encoder=pca, client=client, collection_name="mem")


def test_a_store_opened_without_the_encoders_format_warns_before_it_is_filled(tmp_path, encoder):
    """A store opened with store= but without format= records no projection, so a later reopen
    with an encoder of another projection would be accepted and score queries against vectors
    they do not match. The stores offer no way to record a format after they are made, so the
    wrapper warns while the store is empty (the fix is one argument, format=encoder.format)."""
    import warnings

    with ue.open_store("exact", path=tmp_path / "bare") as store:
        assert store.format.projection is None
        with pytest.warns(UserWarning, match=r"records no encoder projection.*format=encoder\.format"):
            vs = UIBKVectorStore(encoder=encoder, store=store)
        vs.add_texts(TEXTS, ids=IDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where there is nothing to fix:
        with ue.open_store("exact", path=tmp_path / "bare") as store:  # filled before: works as before
            vs = UIBKVectorStore(encoder=encoder, store=store)
            assert vs.similarity_search("sourdough bread", k=1)[0].id == "bread"
        with ue.open_store("exact", path=tmp_path / "fmt", format=encoder.format) as store:
            UIBKVectorStore(encoder=encoder, store=store)  # records the projection
        UIBKVectorStore(encoder=encoder, store=ue.open_store("exact"))  # in memory: never reopened
