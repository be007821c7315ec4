"""The pool factor passed through every path that writes an encoder's documents: the CLI's
``index --pool-factor``, LangChain, LlamaIndex and the Ray path's actor; each refuses a store
that recorded another pool factor, and a pooled store is searched by an unpooled encoder."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from uibk_embedding import open_store
from uibk_embedding.apps.cli import main
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.tagged import N_SLOTS
from uibk_embedding.token_pooling import pool_tokens

TEXTS = ["the lift of a wing in a propeller slipstream measured in a wind tunnel at low speed",
         "laminar to turbulent transition of the boundary layer on a flat plate with suction",
         "buckling of thin cylindrical shells under axial compression and external pressure"]


@pytest.fixture(scope="module")
def pooled_encoder():
    from uibk_embedding.encoder import load_encoder

    return load_encoder(pool_factor=2)


def _assert_pooled(store, ids, encoder, texts=TEXTS):
    """The stored lists are the unpooled lists pooled by 2: slots exact, max(n // 2, 1) tokens."""
    plain = encoder.encode_documents(list(texts))
    rows = encoder.token_rows(list(texts))
    by_id = {r.id: r.vectors for r in store.get(list(ids))}
    assert store.format.pool_method == "content"
    for doc_id, ref, r in zip(ids, plain, rows, strict=True):
        got = by_id[doc_id]
        assert len(got) - N_SLOTS == max((len(ref) - N_SLOTS) // 2, 1)
        assert got[:N_SLOTS].tobytes() == ref[:N_SLOTS].tobytes()
        assert np.abs(got - pool_tokens(ref, 2, store.format, r)).max() < 1e-4


def test_cli_index_pool_factor(tmp_path, capsys, encoder):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    path = tmp_path / "idx"
    assert main(["index", str(corpus), "--path", str(path), "--pool-factor", "2", "--quiet"]) == 0
    with open_store("exact", path=str(path)) as store:
        assert store.format.pool_factor == 2
        _assert_pooled(store, ["d0", "d1", "d2"], encoder)
    capsys.readouterr()
    # searching needs no pool factor (queries are never pooled)
    assert main(["search", "wing lift", "--path", str(path), "--json", "-k", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "d0"
    # adding without it (or with another) is refused, the store unchanged
    for extra in ([], ["--pool-factor", "3"]):
        with pytest.raises(SystemExit):
            main(["index", str(corpus), "--path", str(path), "--quiet", *extra])
        err = capsys.readouterr().err
        assert "pooled with pool_factor=2" in err and "--pool-factor 2" in err
    with pytest.raises(SystemExit):
        main(["index", str(corpus), "--path", str(tmp_path / "x"), "--pool-factor", "0"])
    assert "must be positive" in capsys.readouterr().err


def test_langchain_passes_the_pool_factor(tmp_path, pooled_encoder, encoder):
    pytest.importorskip("langchain_core")
    from uibk_embedding.integrations.langchain import UIBKVectorStore

    path = tmp_path / "lc"
    UIBKVectorStore.from_texts(TEXTS, ids=["a", "b", "c"], encoder=pooled_encoder, path=str(path))
    with open_store("exact", path=str(path)) as store:
        assert store.format.pool_factor == 2
        _assert_pooled(store, ["a", "b", "c"], encoder)
    store = open_store("exact", path=str(path), format=encoder.format)
    with pytest.warns(UserWarning, match="pool_factor=2, pool_method='content' and this encoder's "
                                         "documents get no pooling"):
        vs = UIBKVectorStore(encoder=encoder, store=store)
    assert vs.similarity_search("buckling of shells", k=1)[0].id == "c"
    with pytest.raises(CollectionMismatch, match="refuses these documents"):
        vs.add_texts(["another text"], ids=["d"])
    assert store.count() == 3
    store.close()


def test_llama_index_passes_the_pool_factor(tmp_path, pooled_encoder, encoder):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode

    from uibk_embedding.integrations.llama_index import UIBKVectorStore

    path = tmp_path / "li"
    store = open_store("exact", path=str(path), format=pooled_encoder.format)
    vs = UIBKVectorStore(encoder=pooled_encoder, store=store)
    vs.add([TextNode(text=t, id_=f"n{i}") for i, t in enumerate(TEXTS)])
    store.close()
    with open_store("exact", path=str(path)) as reopened:
        assert reopened.format.pool_factor == 2
        _assert_pooled(reopened, ["n0", "n1", "n2"], encoder)
    store = open_store("exact", path=str(path), format=encoder.format)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        vs = UIBKVectorStore(encoder=encoder, store=store)
    with pytest.raises(CollectionMismatch, match="pool_factor=2"):
        vs.add([TextNode(text="more", id_="n9")])
    store.close()


def test_ray_path_actor_pools_and_refuses_another_pool_factor(tmp_path, encoder):
    pytest.importorskip("lancedb")
    from uibk_embedding.apps.distributed import IndexWorker, with_pool_factor

    uri = str(tmp_path / "db")
    options = with_pool_factor(None, None, None, 2)  # what index_distributed(pool_factor=2) gives each actor
    worker = IndexWorker("lancedb", {"uri": uri}, encoder_options=options)  # the actor, without Ray
    n = len(TEXTS)
    worker({"_id": np.array(["r0", "r1", "r2"]), "_text": np.array(TEXTS), "_title": np.array([""] * n),
            "_body": np.array(TEXTS), "_meta": np.array(["{}"] * n), "_pos": np.arange(n),
            "_error": np.array([""] * n)})
    worker.store.close()
    with open_store("lancedb", uri=uri) as store:
        assert store.format.pool_factor == 2
        _assert_pooled(store, ["r0", "r1", "r2"], encoder)
    with pytest.raises(CollectionMismatch, match="pooled with pool_factor=2, pool_method='content' and "
                                                 "this encoder's documents get pool_factor=3"):
        IndexWorker("lancedb", {"uri": uri}, encoder_options=with_pool_factor(None, None, None, 3))
    with pytest.raises(ValueError, match="disagree"):
        with_pool_factor(None, {"pool_factor": 3}, None, 2)


def test_a_pylate_folder_keeps_the_pool_factor(tmp_path):
    pytest.importorskip("sentence_transformers", minversion="6.0",
                        reason="the colbert extra (sentence-transformers >= 6) is not installed")
    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.encoder.pylate_model import save_pylate
    from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer

    cfg = UIBKConfig.tiny()
    native = UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS * 3), seed=0, device="cpu")
    folder = save_pylate(native, tmp_path / "uibk-pylate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = load_encoder(folder, trust_remote_code=True, device="cpu")
        pooled = load_encoder(folder, trust_remote_code=True, device="cpu", pool_factor=2)
    assert plain.format.pool_factor == 1 and pooled.format.pool_factor == 2  # the probe kept it
    rows = pooled.token_rows(TEXTS)  # the folder's text positions: the native encoder's token rows
    assert [r.function.tolist() for r in rows] == [r.function.tolist() for r in native.token_rows(TEXTS)]
    for a, b, r in zip(plain.encode_documents(TEXTS), pooled.encode_documents(TEXTS), rows, strict=True):
        assert len(b) - N_SLOTS == max((len(a) - N_SLOTS) // 2, 1)
        assert np.abs(b - pool_tokens(a, 2, pooled.format, r)).max() < 1e-4
    for a, b in zip(plain.encode_queries(TEXTS), pooled.encode_queries(TEXTS), strict=True):
        assert a.tobytes() == b.tobytes()


def test_cli_index_fits_the_frequent_ids_and_later_runs_adopt_them(tmp_path, capsys, real_data):
    """``index --pool-factor 2`` reads the corpus's token frequencies before encoding (the content
    method's frequent ids, recorded with the store); a later run on other documents adopts the
    store's ids; ``--pool-method`` chooses the method and is checked like the factor."""
    from uibk_embedding.encoder import load_encoder

    def corpus(name, texts, start):
        f = tmp_path / name
        lines = (json.dumps({"id": f"d{start + i}", "text": t}) + "\n" for i, t in enumerate(texts))
        f.write_text("".join(lines))
        return str(f)

    first, second = real_data.texts[:60], real_data.texts[60:90]
    path = str(tmp_path / "idx")
    assert main(["index", corpus("a.jsonl", first, 0), "--path", path, "--pool-factor", "2", "--quiet"]) == 0
    expected = load_encoder(pool_factor=2).fit_pooling(first)
    with open_store("exact", path=path) as store:
        assert store.format.pool_method == "content" and store.format.pool_frequent_ids == expected
        assert len(expected) > 0
    later = corpus("b.jsonl", second, 60)
    assert main(["index", later, "--path", path, "--pool-factor", "2", "--quiet"]) == 0
    with open_store("exact", path=path) as store:
        assert store.format.pool_frequent_ids == expected and store.count() == 90
        fitted = load_encoder(pool_factor=2)
        fitted.adopt_pooling(store.format)
        ref = fitted.encode_documents([second[0]])[0]
        assert store.get(["d60"])[0].vectors.shape == ref.shape
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["index", corpus("c.jsonl", second[:2], 90), "--path", path, "--pool-factor", "2",
              "--pool-method", "ward", "--quiet"])
    err = capsys.readouterr().err
    assert "pool_method='content'" in err and "pool_method='ward'" in err
    ward = str(tmp_path / "ward")
    assert main(["index", corpus("d.jsonl", first, 0), "--path", ward, "--pool-factor", "2",
                 "--pool-method", "ward", "--quiet"]) == 0
    with open_store("exact", path=ward) as store:
        assert store.format.pool_method == "ward" and store.format.pool_frequent_ids == ()
        plain = load_encoder().encode_documents([first[0]])[0]
        assert np.abs(store.get(["d0"])[0].vectors - pool_tokens(plain, 2, store.format)).max() < 1e-4


def test_ray_actor_adopts_the_frequent_ids_a_store_recorded(tmp_path, real_data):
    pytest.importorskip("lancedb")
    from uibk_embedding.apps.distributed import IndexWorker, with_pool_factor
    from uibk_embedding.encoder import load_encoder

    fitted = load_encoder(pool_factor=2)
    frequent = fitted.fit_pooling(real_data.texts)
    uri = str(tmp_path / "db")
    open_store("lancedb", uri=uri, format=fitted.format).close()  # a store made from the corpus
    worker = IndexWorker("lancedb", {"uri": uri}, encoder_options=with_pool_factor(None, None, None, 2))
    assert worker.encoders[0].format.pool_frequent_ids == frequent
    texts = real_data.texts[:2]
    worker({"_id": np.array(["r0", "r1"]), "_text": np.array(texts), "_title": np.array(["", ""]),
            "_body": np.array(texts), "_meta": np.array(["{}", "{}"]), "_pos": np.arange(2),
            "_error": np.array(["", ""])})
    worker.store.close()
    with open_store("lancedb", uri=uri) as store:
        got = {r.id: r.vectors for r in store.get(["r0", "r1"])}
    for i, ref in enumerate(fitted.encode_documents(texts)):
        assert got[f"r{i}"].shape == ref.shape and np.abs(got[f"r{i}"] - ref).max() < 1e-4
