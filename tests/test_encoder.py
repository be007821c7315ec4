"""The embedded default encoder: output invariants, caps, dense weight, bad input, persistence."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.base import Encoder
from uibk_embedding.testing import batching_noise


def test_protocol_and_invariants(encoder):
    assert isinstance(encoder, Encoder)
    docs = encoder.encode_documents(["a wing in a slipstream", "heat transfer at high speed"])
    qs = encoder.encode_queries(["wing lift?"], dense_weight=1.0)
    for x in docs + qs:
        assert x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == 128
        np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)
        assert (x[:3, 0] < 0).all() and (x[3:, 0] > 0).all()
    # 3 slots + one vector per wordpiece of the text ([CLS] and [SEP] are not kept)
    n = len(encoder.tokenizer("a wing in a slipstream", add_special_tokens=False)["input_ids"])
    assert len(docs[0]) == 3 + n


def test_deterministic(encoder):
    """The same batch gives bit-identical lists; another batch (padding) moves a list only by
    float32 rounding, measured (docs/model.md, "Batching"): far below what a wrong token, a
    wrong position or another text would change (each moves whole vectors, differences of
    order 0.1), here bounded by 1e-4, over 100 times what any machine of ours has measured."""
    texts = ["the same text twice", "and another one, longer, so that the first text is padded"]
    first, again = encoder.encode_documents(texts), encoder.encode_documents(texts)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    noise = batching_noise(encoder, texts, batchings=((2, 1), (2, 2)))
    assert 0.0 <= noise < 1e-4, noise


def test_query_token_cap_and_dense_length(encoder):
    long_q = " ".join(["the wing flutter"] * 40)  # 120 wordpieces: over 64, under 256
    q = encoder.encode_queries([long_q])[0]
    assert len(q) == 3 + encoder.query_token_cap == 67
    # the dense head reads past the 64 tokens: a change after token 64 moves the slots only
    q2 = encoder.encode_queries([long_q + " zebra giraffe"])[0]
    assert not np.allclose(q[:3], q2[:3])


def test_dense_weight(encoder):
    q1 = encoder.encode_queries(["flutter of panels"], dense_weight=1.0)[0]
    q4 = encoder.encode_queries(["flutter of panels"], dense_weight=4.0)[0]
    np.testing.assert_allclose(q4[:3], 4 * q1[:3], atol=1e-5)
    np.testing.assert_allclose(q4[3:], q1[3:], atol=1e-6)
    for bad in (0, -1, float("nan"), float("inf"), True, 1e39):  # 1e39: slot rows of -inf before
        with pytest.raises(ValueError, match="dense_weight"):
            encoder.encode_queries(["x"], dense_weight=bad)


@pytest.mark.parametrize(
    ("texts", "error", "match"),
    [
        (["ok", ""], ValueError, r"texts\[1\] is empty"),
        (["   \n\t"], ValueError, r"texts\[0\] is empty"),
        (["ok", 3], TypeError, r"texts\[1\] must be a str"),
        (["ok", None], TypeError, r"texts\[1\] must be a str"),
        ("a single string", TypeError, "not a single string"),
    ],
)
def test_bad_input(encoder, texts, error, match):
    with pytest.raises(error, match=match):
        encoder.encode_documents(texts)
    with pytest.raises(error, match=match):
        encoder.encode_queries(texts)


def test_empty_list_gives_empty_result(encoder):
    assert encoder.encode_documents([]) == [] and encoder.encode_queries([]) == []


def test_truncation_reported_once(encoder):
    long_doc = "turbulence " * 700
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = encoder.encode_documents([long_doc, "short", long_doc, long_doc], show_progress=False)
    msgs = [str(w.message) for w in caught if "truncated" in str(w.message)]
    assert msgs == ["3 of 4 documents were longer than 512 tokens and were truncated"]
    assert len(out[0]) == 3 + 510  # the model's 512 positions less [CLS] and [SEP]


@pytest.mark.parametrize("family", ["roberta", "mpnet"])
def test_models_whose_positions_start_past_padding_cut_at_their_real_length(tmp_path, family):
    # RoBERTa, XLM-R and MPNet count max_position_embeddings with the padding offset (514 for 512
    # tokens): a document past 512 tokens indexed past the table and crashed
    import string

    import torch
    from transformers import MPNetConfig, MPNetModel, RobertaConfig, RobertaModel

    from uibk_embedding.testing.tiny_models import SPECIAL, tiny_bert

    vocab = [*SPECIAL, *string.ascii_lowercase, "wing", "lift"]
    tiny_bert(tmp_path, vocab, seed=0)
    config, model = {"roberta": (RobertaConfig, RobertaModel), "mpnet": (MPNetConfig, MPNetModel)}[family]
    cfg = config(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=66, pad_token_id=1)
    torch.manual_seed(0)
    model(cfg).save_pretrained(tmp_path)
    enc = load_encoder(tmp_path, device="cpu")
    assert enc.doc_max_length == 64  # 66 positions less the offset of padding index 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = enc.encode_documents(["wing lift " * 50])
    assert len(out[0]) == 3 + 62 and any("truncated" in str(w.message) for w in caught)


def test_save_and_load_round_trip(encoder, tmp_path):
    encoder.save_projections(tmp_path)
    again = load_encoder(tmp_path)
    text = ["boundary layer transition on a flat plate"]
    np.testing.assert_array_equal(again.encode_documents(text)[0], encoder.encode_documents(text)[0])
    assert again.dense_weight == encoder.dense_weight


def test_load_encoder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no encoder"):
        load_encoder(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="neither"):
        load_encoder(tmp_path)


def test_streaming(encoder):
    texts = (f"text number {i}" for i in range(7))
    out = list(encoder.encode_documents_iter(texts, chunk_size=3))
    assert len(out) == 7
    with pytest.raises(ValueError, match=r"^texts\[3\] is empty"):  # named texts[1] of its chunk before
        list(encoder.encode_documents_iter(["wing", "lift", "heat", "   "], chunk_size=2))


def _tokenizer_with_template(folder, template: str) -> None:
    """Rewrite a tiny BERT folder's tokenizer so that it wraps a text in ``template``'s special
    tokens only: ``"eos"`` ``wing lift [SEP]`` (Qwen, T5 style), ``"bos"`` ``[CLS] wing lift``
    (Llama, Mistral), ``"none"`` ``wing lift`` (GPT-2). The class becomes the generic fast
    tokenizer, which keeps the file's template (BertTokenizerFast rebuilds [CLS] ... [SEP])."""
    import json

    def tpl(*parts: str) -> list[dict]:
        return [{"SpecialToken": {"id": p, "type_id": 0}} if p.startswith("[")
                else {"Sequence": {"id": p, "type_id": 0}} for p in parts]

    tj = json.loads((folder / "tokenizer.json").read_text())
    specials = {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}
    tj["post_processor"] = {
        "eos": {"type": "TemplateProcessing", "single": tpl("A", "[SEP]"),
                "pair": tpl("A", "[SEP]", "B", "[SEP]"), "special_tokens": {"[SEP]": specials["[SEP]"]}},
        "bos": {"type": "TemplateProcessing", "single": tpl("[CLS]", "A"),
                "pair": tpl("[CLS]", "A", "B"), "special_tokens": {"[CLS]": specials["[CLS]"]}},
        "none": None,
    }[template]
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.pop("cls_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))


@pytest.mark.parametrize("slow_path", [False, True])
@pytest.mark.parametrize(("template", "wrapped"), [
    ("bert", ["[CLS]", "wing", "lift", "flow", "[SEP]"]),
    ("eos", ["wing", "lift", "flow", "[SEP]"]),
    ("bos", ["[CLS]", "wing", "lift", "flow"]),
    ("none", ["wing", "lift", "flow"]),
])
def test_token_rows_are_the_text_tokens_whatever_the_special_tokens(tmp_path, monkeypatch, template,
                                                                     wrapped, slow_path):
    # the rows were always positions 1 .. n - 2 (BERT's [CLS] ... [SEP]): with an end token only
    # 'wing' was lost, with a start token only 'flow', and without specials 'wing' alone raised
    # IndexError
    import string

    from uibk_embedding.testing.tiny_models import SPECIAL, tiny_bert

    tiny_bert(tmp_path, [*SPECIAL, *string.ascii_lowercase, "wing", "lift", "flow"], seed=0, layers=1)
    if template != "bert":
        _tokenizer_with_template(tmp_path, template)
    enc = load_encoder(tmp_path, device="cpu")
    if slow_path:  # the transformers wrapper, as for a model without a fast tokenizer
        monkeypatch.setattr(enc, "_fast_tokenizer", lambda max_len: None)
    tok = enc.tokenizer
    assert tok.convert_ids_to_tokens(tok("wing lift flow")["input_ids"]) == wrapped
    texts = ["wing lift flow", "wing", "flow wing"]
    tb = enc._tokenize(texts, False)
    ids = tb.inputs["input_ids"].numpy()
    for i, text in enumerate(texts):
        picked = tok.convert_ids_to_tokens(ids[i, tb.starts[i]:tb.ends[i]].tolist())
        assert picked == text.split(), (template, text, picked)
    # the lists carry exactly those rows: the model's states at those positions, through P
    import torch

    with torch.inference_mode():
        g, states = enc._forward(tb.inputs)
    docs = enc.encode_documents(texts)
    for i, text in enumerate(texts):
        a, b = int(tb.starts[i]), int(tb.ends[i])
        want = enc.format.build(enc.format.split(g[i].numpy(), enc.R), states[i, a:b].numpy() @ enc.P.T)
        assert len(docs[i]) == 3 + len(text.split())
        # the same forward pass on another padding: float32 batching noise, 7.6e-7 measured on
        # MiniLM (docs/model.md, "Batching"); 1e-5 is over ten times that and far below what a
        # wrong position moves (whole vectors, differences of order 0.1)
        np.testing.assert_allclose(docs[i], want, atol=1e-5, rtol=0)
    if template == "none":  # a text the tokenizer turns into nothing at all: no row to keep
        with pytest.raises(ValueError, match=r"gives no token at all for the text '\\u200b'"):
            enc.encode_documents(["wing", "\u200b"])


def test_bert_token_spans_are_unchanged(encoder):
    # the special-tokens mask must give the embedded model exactly the spans it always had:
    # positions 1 .. n - 2, and one row for a text whose words all vanish (n = 2: [CLS] [SEP])
    texts = ["a wing in a slipstream", "\u200b", "[SEP] wing [CLS]", "x " * 700]
    for is_query in (False, True):
        tb = encoder._tokenize(texts, is_query)
        n = tb.inputs["attention_mask"].sum(1).numpy()
        np.testing.assert_array_equal(tb.starts, np.ones_like(n))
        np.testing.assert_array_equal(tb.ends, np.maximum(2, n - 1))
