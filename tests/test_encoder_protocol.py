"""Every encoder class satisfies the encoder protocol (uibk_embedding.encoder.protocol).

``Encoder``: the in-process encoders (transformer, uibk, composed, pylate), the shared encoder
and the remote encoder. ``LocalEncoder``: the in-process ones only (a shared or a remote encoder
has no projections of its own to fit or save). Checked on tiny encoders, member by member and
keyword by keyword (:func:`protocol_gaps`), and with ``isinstance`` (runtime_checkable).
"""

from __future__ import annotations

import string
import warnings

import numpy as np
import pytest

from uibk_embedding.encoder import Encoder, LocalEncoder, TaggedEncoder, load_encoder
from uibk_embedding.encoder.base import Encoder as EncoderFromBase
from uibk_embedding.encoder.protocol import protocol_gaps
from uibk_embedding.encoder.shared import SharedEncoder
from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
from uibk_embedding.testing.tiny_models import tiny_bert

TEXTS = ["lift of a wing in a slipstream", "heat transfer to a blunt body"]


def check(enc: object, local: bool) -> None:
    assert protocol_gaps(enc, Encoder) == []
    assert isinstance(enc, Encoder)
    if local:
        assert protocol_gaps(enc, LocalEncoder) == []
        assert isinstance(enc, LocalEncoder)
    else:
        assert not isinstance(enc, LocalEncoder)
    # what the protocol promises, used once
    d = enc.encode_documents(TEXTS, show_progress=False)  # type: ignore[attr-defined]
    q = enc.encode_queries(TEXTS[:1], dense_weight=2.0, show_progress=False)  # type: ignore[attr-defined]
    assert [x.shape[1] for x in d + q] == [128] * 3
    assert len(list(enc.encode_documents_iter(iter(TEXTS), chunk_size=1))) == 2  # type: ignore[attr-defined]
    assert enc.format.projection and isinstance(enc.model_name, str)  # type: ignore[attr-defined]
    assert enc.dense_weight > 0 and enc.query_max_length > 1 and enc.doc_max_length > 1  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def tiny() -> UIBKEncoder:
    cfg = UIBKConfig.tiny()
    return UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS), seed=0, device="cpu")


def test_the_protocol_is_importable_from_where_it_was():
    assert EncoderFromBase is Encoder


def test_gaps_name_missing_members_and_keywords():
    class Partial:
        format = dense_weight = model_name = query_max_length = doc_max_length = None

        def encode_queries(self, texts, *, show_progress=None): ...
        def encode_documents(self, texts, **kw): ...
        def encode_documents_iter(self, texts, *, chunk_size=1): ...

    assert protocol_gaps(Partial(), Encoder) == ["encode_queries(dense_weight=)"]
    assert not isinstance(object(), Encoder)


def test_uibk(tiny):
    check(tiny, local=True)


def test_transformer_embedded_default():
    check(load_encoder(device="cpu"), local=True)


@pytest.mark.parametrize("export", ["sentence_transformers", "pylate"])
def test_pylate(tiny, tmp_path, export):
    """A multi-vector model folder (PyLateEncoder): our sentence-transformers 6 export and our
    PyLate export, both run through sentence-transformers 6."""
    pytest.importorskip("sentence_transformers", minversion="6.0",
                        reason="the colbert extra (sentence-transformers >= 6) is not installed")
    from uibk_embedding.encoder.pylate_model import save_pylate, save_sentence_transformers

    save = save_sentence_transformers if export == "sentence_transformers" else save_pylate
    check(load_encoder(save(tiny, tmp_path / export), trust_remote_code=True, device="cpu"), local=True)


def test_shared(tiny):
    with SharedEncoder(tiny) as enc:
        check(enc, local=False)


def test_remote(tiny, tmp_path):
    pytest.importorskip("httpx", reason="the serve extra is not installed")
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    from uibk_embedding.encoder.remote import RemoteEncoder
    from uibk_embedding.encoder.server import serve_subprocess

    folder = tiny.save_pretrained(tmp_path / "tiny")
    with serve_subprocess("--encoder", str(folder), "--device", "cpu") as url, RemoteEncoder(url) as enc:
        check(enc, local=False)


def test_composed(tmp_path):
    st = pytest.importorskip("sentence_transformers", minversion="6.0",
                             reason="the colbert extra (sentence-transformers >= 6) is not installed")
    import sentence_transformers.models  # noqa: F401  (st.models)

    from uibk_embedding.testing.colbert_folders import pylate_colbert
    letters = list(string.ascii_lowercase)
    words = sorted({w for t in TEXTS for w in t.split()} - set(letters))  # no duplicate entries
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]", *letters,
             *(f"##{c}" for c in letters), *words]
    for name, seed in (("hf_dense", 0), ("hf_colbert", 1)):
        tiny_bert(tmp_path / name, vocab, seed=seed, layers=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st.SentenceTransformer(modules=[st.models.Transformer(str(tmp_path / "hf_dense"), max_seq_length=64),
                                        st.models.Pooling(32), st.models.Normalize()],
                               device="cpu").save(str(tmp_path / "dense"))
        pylate_colbert(tmp_path / "colbert", tmp_path / "hf_colbert", seed=1, query_length=16,
                       document_length=40)
        enc = load_encoder(dense=tmp_path / "dense", tokens=tmp_path / "colbert", device="cpu")
    assert isinstance(enc, TaggedEncoder)
    check(enc, local=True)


def test_the_eval_cache_is_keyed_by_the_model_content_not_its_path(tmp_path, monkeypatch):
    """Weights retrained into the same folder reused the cached vectors of the old ones: the
    cache key held the folder's path (``eval`` printed the old model's figures)."""
    from uibk_embedding.apps.data import Collection, Document
    from uibk_embedding.apps.evaluation import encode_collection

    monkeypatch.setenv("UIBK_CACHE", str(tmp_path / "cache"))
    letters = list(string.ascii_lowercase)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters), "wing"]
    coll = Collection("tiny", [Document("d1", "a wing"), Document("d2", "b c")], {"q1": "wing"},
                      {"q1": {"d1": 1}})
    docs = []
    for seed in (0, 1, 1):
        tiny_bert(tmp_path / "model", vocab, seed=seed, layers=1)
        docs.append(encode_collection(load_encoder(tmp_path / "model", device="cpu"), coll).docs)
    fresh = encode_collection(load_encoder(tmp_path / "model", device="cpu"), coll, use_cache=False).docs
    assert not np.array_equal(docs[0][0], docs[1][0])  # retrained: encoded again
    for cached, new in zip(docs[2], fresh, strict=True):  # the same weights: from the cache
        np.testing.assert_array_equal(cached, new)


def test_an_encoder_saved_from_a_relative_model_path_loads_from_anywhere(tmp_path, monkeypatch):
    """``uibk_encoder.json`` recorded the model path as given (``hf``), relative to the directory
    of the run that saved it: a store's encoder could be loaded only from that directory."""
    letters = list(string.ascii_lowercase)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters)]
    tiny_bert(tmp_path / "hf", vocab, seed=0, layers=1)
    monkeypatch.chdir(tmp_path)
    enc = load_encoder("hf", device="cpu")
    assert enc.model_name == "hf" and enc.config()["model"] == str((tmp_path / "hf").resolve())
    enc.save_projections(tmp_path / "saved")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = load_encoder(tmp_path / "saved", device="cpu")
    np.testing.assert_array_equal(again.encode_queries(["a b"])[0], enc.encode_queries(["a b"])[0])
