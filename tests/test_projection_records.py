"""Stores record which projection made their lists and refuse an encoder with another one.

0.2.0 made the shipped PCA ``P`` the embedded default, 0.3.0 the seeded random one again (the
default chosen on no data, docs/model.md); a query projected with another ``P`` does not match
stored token vectors, so every store records ``TaggedFormat.projection`` (the conformance suite
checks each backend) and the CLI, the retrievers and the Ray path declare their encoder's. Here:
the rule itself, stores written by 0.1.0 (no record) and 0.2.0 (PCA), and the paths that declare.
"""

from __future__ import annotations

import json

import pytest

from uibk_embedding.adapters import open_store
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.tagged import UNRECORDED, TaggedFormat
from uibk_embedding.testing import make_list

RANDOM = TaggedFormat(projection="random-00aa11bb22cc33dd")
PCA = TaggedFormat(projection="pca-44ee55ff66aa77bb")


def test_conflict_rule():
    assert RANDOM.conflict(None) is None  # nothing declared: nothing to check
    assert RANDOM.conflict(TaggedFormat()) is None
    assert TaggedFormat().conflict(PCA) is None  # a store opened without a format: undeclared
    assert RANDOM.conflict(RANDOM) is None
    assert "not pca-44ee55ff66aa77bb" in RANDOM.conflict(PCA)
    other_beta = TaggedFormat(beta=0.8, projection=RANDOM.projection)
    assert "lambda=0.75, not beta=0.8" in RANDOM.conflict(other_beta)
    legacy = TaggedFormat.from_stored({"beta": 0.9, "lambda_": 0.75, "n_slots": 3})
    assert legacy.projection == UNRECORDED
    assert legacy.conflict(RANDOM) is None  # 0.1.0 encoded with seeded random matrices
    assert "written before stores recorded" in legacy.conflict(PCA)
    # what stores write: None spelled out, so "undeclared" is not read back as "0.1.0"
    assert TaggedFormat.from_stored(TaggedFormat().to_stored()).projection is None
    assert TaggedFormat.from_stored(PCA.to_stored()) == PCA
    assert "projection" not in PCA.to_dict()  # encoder configurations (and cache keys) unchanged
    with pytest.raises(ValueError, match="projection must be a non-empty string"):
        TaggedFormat(projection="")


def test_encoders_declare_their_projection(encoder):
    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.encoder.projection import projection_id
    from uibk_embedding.encoder.transformer import embedded_model_path
    from uibk_embedding.encoder.trust import model_digest

    model = model_digest(embedded_model_path())[:16]  # the model, beside the projection
    assert encoder.format.projection == f"random-{projection_id(encoder.R, encoder.P)}@{model}"
    fitted = load_encoder(projection="pca")
    assert fitted.format.projection == f"pca-{projection_id(fitted.R, fitted.P)}@{model}"
    assert fitted.format != encoder.format
    assert (fitted.format.beta, fitted.format.lambda_) == (encoder.format.beta, encoder.format.lambda_)


def _legacy_exact_store(path, rng):
    """An exact store as 0.1.0 wrote it: its store.json has no projection."""
    from uibk_embedding.testing.old_formats import write_exact_store_030

    docs = [make_list(RANDOM, rng, n) for n in (5, 7, 4, 6)]
    write_exact_store_030(path, ["a", "x", "b", "c"], docs, [{}] * 4, format=RANDOM)  # "x" deleted
    cfg = json.loads((path / "store.json").read_text())
    del cfg["format"]["projection"]
    (path / "store.json").write_text(json.dumps(cfg))
    return cfg


def _record(path) -> dict:
    """The configuration an exact store keeps in its store.sqlite."""
    from uibk_embedding._sqlite_state import stored_state

    return json.loads(stored_state(path, "config"))


def test_store_written_by_0_1_0_accepts_a_seeded_encoder_only(tmp_path, rng):
    path = tmp_path / "old"
    cfg = _legacy_exact_store(path, rng)
    with pytest.raises(CollectionMismatch, match=r"written before stores recorded .* projection='random'"):
        open_store("exact", path=path, format=PCA)
    assert json.loads((path / "store.json").read_text()) == cfg  # unchanged
    with open_store("exact", path=path, format=RANDOM) as s:
        assert s.count() == 3 and s.format.projection == UNRECORDED


def test_retriever_refuses_a_store_of_another_projection(encoder, rng):
    from uibk_embedding.integrations.core import RetrievalCore

    store = open_store("exact", format=RANDOM)
    with pytest.raises(CollectionMismatch, match=f"not {encoder.format.projection}"):
        RetrievalCore(encoder=encoder, store=store)
    RetrievalCore(encoder=encoder, store=open_store("exact"))  # undeclared: nothing to check
    RetrievalCore(encoder=encoder, store=open_store("exact", format=encoder.format))


def test_cli_records_and_refuses(tmp_path, capsys):
    """Index with the 0.2.0 default (--projection pca); searching with the default of 0.3.0 (the
    seeded random projection) is refused with the reason and the fix, searching with the same
    projection works."""
    from uibk_embedding.apps import cli

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(
        ["lift of a swept wing at low speed", "heat transfer in hypersonic flow",
         "buckling of thin cylindrical shells"])))
    store = str(tmp_path / "store")
    assert cli.main(["index", str(corpus), "--path", store, "--projection", "pca", "--quiet"]) == 0
    recorded = _record(tmp_path / "store")["format"]["projection"]
    assert recorded.startswith("pca-")
    with pytest.raises(SystemExit, match=f"its lists were encoded with projection {recorded}, not random-"
                                         ".*0.2.0.*--projection pca"):
        cli.main(["search", "hypersonic heating", "--path", store])
    capsys.readouterr()
    assert cli.main(["search", "hypersonic heating", "--path", store, "--projection", "pca",
                     "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits[0]["id"] == "d1"
    # and indexing more with another projection is refused before anything is written
    with pytest.raises(SystemExit, match="not random-"):
        cli.main(["index", str(corpus), "--path", store, "--quiet"])
    assert _record(tmp_path / "store")["format"]["projection"] == recorded


def test_stores_of_0_1_0_and_0_2_0_open_with_the_projection_that_filled_them(tmp_path, rng, encoder):
    """The 0.3.0 default (seeded) opens a 0.1.0 store; a 0.2.0 store (the shipped PCA) refuses it
    with the fix in the message, and opens with projection='pca'."""
    from uibk_embedding.encoder import load_encoder

    _legacy_exact_store(tmp_path / "v010", rng)
    with open_store("exact", path=tmp_path / "v010", format=encoder.format) as s:
        assert s.count() == 3
    pca = load_encoder(projection="pca").format
    with open_store("exact", path=tmp_path / "v020", format=pca) as s:
        s.upsert(["a"], [make_list(pca, rng, 5)])
    with pytest.raises(CollectionMismatch, match=r"0\.2\.0.*projection='pca'.*--projection pca"):
        open_store("exact", path=tmp_path / "v020", format=encoder.format)
    with open_store("exact", path=tmp_path / "v020", format=pca) as s:
        assert s.count() == 1


def test_index_fit_projection_fits_on_the_corpus_saves_and_records(tmp_path, capsys):
    """`uibk-embed index --fit-projection`: P fitted on the indexed documents, the encoder saved in
    the store folder and recorded by the store; `search --path` finds and uses it; the default
    encoder is refused on that store; a server backend without --save-encoder is refused."""
    from uibk_embedding.apps import cli
    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.testing import datasets_dir

    corpus = datasets_dir() / "cranfield" / "corpus.jsonl"
    # 60 documents, P fitted on 40 of them: thousands of token rows, far more than the 127
    # independent rows P needs; the size of the corpus is not what is tested here
    lines = corpus.read_text().splitlines()[:60]
    data = tmp_path / "corpus.jsonl"
    data.write_text("\n".join(lines) + "\n")
    store = tmp_path / "store"
    assert cli.main(["index", str(data), "--path", str(store), "--fit-projection", "--fit-sample", "40",
                     "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "it is found there" in out
    assert "fitted P on 40 of 60 documents" in err  # a sample of the corpus, not all of it
    fitted = load_encoder(store / "uibk-encoder")
    assert fitted.config()["projection"] == "pca"
    recorded = _record(store)["format"]["projection"]
    assert recorded == fitted.format.projection and recorded.startswith("pca-")
    first = json.loads(lines[7])
    assert cli.main(["search", first["text"][:120], "--path", str(store), "--json", "-k", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == str(first["_id"])
    with pytest.raises(SystemExit, match="not random-"):  # the default projection does not fit it
        cli.main(["search", "wing", "--path", str(store), "--projection", "random"])
    with pytest.raises(SystemExit, match="needs --save-encoder"):
        cli.main(["index", str(data), "--backend", "milvus", "--option", "uri=http://127.0.0.1:9",
                  "--fit-projection", "--quiet"])
    with pytest.raises(SystemExit, match="is not empty"):
        cli.main(["index", str(data), "--path", str(store), "--fit-projection", "--quiet"])
    # eval and a later index of that store use the encoder inside it too (they used the default)
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": first["text"][:120]}) + "\n")
    (beir / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\nq\t{first['_id']}\t1\n")
    assert cli.main(["eval", str(beir), "--path", str(store), "--json", "--no-cache"]) == 0
    capsys.readouterr()
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"_id": "extra", "text": "an extra report on the lift of a wing"}) + "\n")
    assert cli.main(["index", str(more), "--path", str(store), "--quiet"]) == 0
    # fit-projection never overwrites an encoder folder (this one is the store's)
    saved = (store / "uibk-encoder" / "projections.npz").read_bytes()
    with pytest.raises(SystemExit, match="is not an empty folder"):
        cli.main(["fit-projection", str(data), "--out", str(store / "uibk-encoder")])
    assert (store / "uibk-encoder" / "projections.npz").read_bytes() == saved


def test_two_models_of_one_width_are_told_apart(tmp_path):
    """Seeded projections depend only on the widths and the seed, so two models of one width
    declared the same projection and a store took either's lists (a store indexed by one model
    searched with another gave scores, not an error). The format now names the model too
    (``<projection>@<model hash>``): a copy of the model is the same, another model is refused,
    and a record written before models were named still takes either."""
    import shutil

    import numpy as np

    from uibk_embedding.encoder.transformer import TransformerEncoder
    from uibk_embedding.testing.tiny_models import tiny_bert

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "wing", "lift", "heat", "flow"]
    for name, seed in (("a", 0), ("b", 1)):
        tiny_bert(tmp_path / name, vocab, seed=seed)
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")
    a, b, a2 = (TransformerEncoder(tmp_path / n) for n in ("a", "b", "a-copy"))
    assert np.array_equal(a.R, b.R) and np.array_equal(a.P, b.P)  # the same seeded projections
    assert a.format.projection != b.format.projection and a.format == a2.format
    with open_store("exact", path=tmp_path / "s", format=a.format) as s:
        s.upsert(["d"], a.encode_documents(["wing lift"]))
    with pytest.raises(CollectionMismatch, match="encoded by another model"):
        open_store("exact", path=tmp_path / "s", format=b.format, create=False)
    with open_store("exact", path=tmp_path / "s", format=a2.format, create=False) as s:
        assert s.count() == 1
    older = TaggedFormat(projection=a.format.projection.partition("@")[0])  # recorded before models
    with open_store("exact", path=tmp_path / "old", format=older) as s:
        s.upsert(["d"], a.encode_documents(["wing lift"]))
    with open_store("exact", path=tmp_path / "old", format=b.format, create=False) as s:
        assert s.count() == 1


def test_a_uibk_checkpoint_is_named_by_its_weights_on_any_dtype(tmp_path):
    """A UIBK checkpoint's identity is its weights (rounded to bfloat16) and vocabulary: the same
    after a save and load, loaded in bfloat16 (as on a GPU), and saved again from bfloat16 (as
    ``index --fit-projection`` on a GPU saves it), so a store indexed on a GPU is searched on a
    CPU; other weights of the same configuration and seed are another model."""
    import torch

    from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer

    cfg = UIBKConfig.tiny()
    tok = train_tokenizer(cfg, ["the lift of a wing in a slipstream", "heat transfer"])
    enc = UIBKEncoder.random(cfg, tok, seed=0, device="cpu")
    enc.save_pretrained(tmp_path / "ckpt")
    same = UIBKEncoder.from_pretrained(tmp_path / "ckpt", device="cpu")
    half = UIBKEncoder.from_pretrained(tmp_path / "ckpt", device="cpu", dtype="bfloat16")
    assert enc.format == same.format == half.format and "@" in enc.format.projection
    half.save_pretrained(tmp_path / "from-bf16")
    assert UIBKEncoder.from_pretrained(tmp_path / "from-bf16", device="cpu").format == enc.format
    with torch.no_grad():
        next(same.model.parameters()).add_(1.0)
    same.save_pretrained(tmp_path / "changed")
    other = UIBKEncoder.from_pretrained(tmp_path / "changed", device="cpu")
    assert other.format.projection.partition("@")[0] == enc.format.projection.partition("@")[0]
    assert "encoded by another model" in enc.format.conflict(other.format)
