"""The batched encoder pipeline against a plain per-document reference of the computation it
replaced (transformers-wrapper tokenisation, one numpy float64 tagged construction per text).

Both sides run the model on the same padded batches (the encoder's own length-sorted batches),
so the forward pass is the same and the float32 results must agree within 1e-6.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.shared import SharedEncoder
from uibk_embedding.encoder.uibk import N_PREFIX, UIBKConfig, UIBKEncoder, train_tokenizer

TOL = 1e-6


# -- the reference: today's computation, one document at a time ---------------------------------
def reference_tag(enc, g: np.ndarray, toks: np.ndarray, is_query: bool, w: float) -> np.ndarray:
    if is_query:
        toks = toks[: enc.query_token_cap]
    slices = enc.format.split(g, enc.R)
    u = np.asarray(toks, dtype=np.float32) @ enc.P.T
    return enc.format.build(slices, u, dense_weight=w)


def reference_transformer(enc, texts, is_query, w=1.0):
    """TransformerEncoder as it was: the transformers tokenizer wrapper, twice per batch."""
    max_len = enc.query_max_length if is_query else enc.doc_max_length
    out, cut = [None] * len(texts), 0
    for batch in enc._batches(texts, enc._length_order(texts), is_query):
        bt = [texts[i] for i in batch]
        full = enc.tokenizer(bt, add_special_tokens=True, truncation=False, verbose=False)
        cut += sum(len(ids) > max_len for ids in full["input_ids"])
        x = enc.tokenizer(bt, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        with torch.inference_mode():
            states = enc.model(**x).last_hidden_state.float()
        mask = x["attention_mask"].unsqueeze(-1).float()
        dense = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)
        lengths = x["attention_mask"].sum(1).tolist()
        states, dense = states.numpy(), dense.numpy()
        for k, (i, n) in enumerate(zip(batch, lengths, strict=True)):
            out[i] = reference_tag(enc, dense[k], states[k, 1: max(2, int(n) - 1)], is_query, w)
    return out, cut


def reference_uibk(enc, texts, is_query, w=1.0):
    """UIBKEncoder as it was: id lists built in Python, padded one row at a time."""
    ids_ = enc._ids
    limit = (enc.query_max_length if is_query else enc.doc_max_length) - N_PREFIX - 1
    marker = ids_["query_marker"] if is_query else ids_["document_marker"]
    out, cut = [None] * len(texts), 0
    for batch in enc._batches(texts, enc._length_order(texts), is_query):
        rows = []
        for e in enc.tokenizer.encode_batch([texts[i] for i in batch], add_special_tokens=False):
            cut += len(e.ids) > limit
            rows.append([ids_["cls_token_id"], marker, ids_["prompt_word"], *e.ids[:limit],
                         ids_["sep_token_id"]])
        longest = max(map(len, rows))
        input_ids = torch.full((len(rows), longest), ids_["pad_token_id"], dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for k, r in enumerate(rows):
            input_ids[k, : len(r)] = torch.tensor(r)
            mask[k, : len(r)] = 1
        with torch.inference_mode():
            g, tok = enc.model(input_ids, mask)
        g, tok = g.numpy(), tok.numpy()
        for k, (i, r) in enumerate(zip(batch, rows, strict=True)):
            # a text with no token keeps [SEP]'s vector (3 slots alone: a list no store takes)
            out[i] = reference_tag(enc, g[k], tok[k, N_PREFIX: max(N_PREFIX + 1, len(r) - 1)], is_query, w)
    return out, cut


def assert_same(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == np.float32 and a.shape == b.shape, (i, a.shape, b.shape)
        err = float(np.abs(a - b).max())
        assert err <= TOL, f"text {i}: max abs difference {err:.2e} > {TOL}"


def encode(enc, texts, is_query, w=1.0):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if is_query:
            out = enc.encode_queries(texts, dense_weight=w, show_progress=False)
        else:
            out = enc.encode_documents(texts, show_progress=False)
    msgs = [str(m.message) for m in caught if "truncated" in str(m.message)]
    assert len(msgs) <= 1, msgs  # one warning per call
    return out, msgs


# -- texts ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(cranfield) -> list[str]:
    return [d.full_text for d in cranfield.corpus[:40]]


def mixed_texts(corpus: list[str], long_words: int) -> list[str]:
    long_text = " ".join(" ".join(corpus).split()[:long_words])
    return [
        *corpus[:12],  # mixed lengths
        long_text,  # cut at the length limit
        "\x00",  # nothing left after tokenisation (control character)
        "\u200b",  # nothing left after tokenisation (zero-width space)
        "a",
        corpus[3],  # a duplicate
        long_text + " flutter",
    ]


# -- the embedded default (all-MiniLM-L6-v2), on the CPU in float32 ---------------------------------
@pytest.fixture(scope="module")
def minilm():
    return load_encoder(device="cpu")


@pytest.mark.parametrize("batch_tokens", [8192, 600])  # one pass / many passes through the prefetch
def test_minilm_documents_equal_the_reference(minilm, corpus, batch_tokens, monkeypatch):
    monkeypatch.setattr(minilm, "batch_tokens", batch_tokens)
    texts = mixed_texts(corpus, 700)
    got, msgs = encode(minilm, texts, False)
    want, cut = reference_transformer(minilm, texts, False)
    assert_same(got, want)
    assert cut >= 2 and msgs == [f"{cut} of {len(texts)} documents were longer than 512 tokens and were "
                                 "truncated"]
    assert len(got[13]) == len(got[14]) == 3 + 1  # [CLS] [SEP] only: one token vector, as before
    assert len(got[12]) == 3 + 510


@pytest.mark.parametrize("w", [1.0, 4.0, 0.3])
def test_minilm_queries_equal_the_reference(minilm, corpus, w, monkeypatch):
    monkeypatch.setattr(minilm, "batch_tokens", 900)
    texts = [t[:400] for t in mixed_texts(corpus, 300)]  # some over 64 tokens (token cap)
    texts += [" ".join(corpus[0].split()[:200]) * 2]  # over 256 tokens: the dense head is cut too
    got, msgs = encode(minilm, texts, True, w)
    want, cut = reference_transformer(minilm, texts, True, w)
    assert_same(got, want)
    assert cut == 1 and len(msgs) == 1
    assert max(map(len, got)) == 3 + 64
    np.testing.assert_allclose(np.linalg.norm(got[0][:3], axis=1), w, rtol=1e-6)


def test_minilm_single_text(minilm, corpus):
    for is_query in (False, True):
        w = 2.0 if is_query else 1.0
        got, _ = encode(minilm, [corpus[5]], is_query, w)
        want, _ = reference_transformer(minilm, [corpus[5]], is_query, w)
        assert_same(got, want)


def test_minilm_tokenisation_equals_the_wrapper(minilm, corpus):
    texts = mixed_texts(corpus, 700)
    tb = minilm._tokenize(texts, False)
    ref = minilm.tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt")
    for k in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(tb.inputs[k], ref[k]), k


class _PassSizes:
    """The model, recording the padded size (rows, tokens) of every forward pass."""

    def __init__(self, model) -> None:
        self.model, self.sizes = model, []

    def __call__(self, **inputs):
        self.sizes.append(tuple(inputs["input_ids"].shape))
        return self.model(**inputs)


@pytest.mark.parametrize("is_query", [False, True])
def test_no_forward_pass_exceeds_the_token_budget(minilm, is_query, monkeypatch):
    # batches are cut on an estimate (characters / 3 + 8): Chinese text has a token per
    # character, so 200 texts of 170 characters ran 22016 padded tokens per pass at batch_tokens
    # 8192 (2.7 times it)
    import random

    rng = random.Random(0)
    cjk = ["".join(chr(rng.randint(0x4E00, 0x4FFF)) for _ in range(n)) for n in [600] * 2 + [170] * 20]
    texts = [*cjk, "a wing in a slipstream"]  # 600 characters: 512 tokens (256 for a query), alone
    budget = 480  # estimated 7 texts of 170 characters a batch (1204 tokens), and the two of 600
    want, _ = encode(minilm, texts, is_query)  # batched otherwise (the default budget, 8192)
    spy = _PassSizes(minilm._net)  # the network the encoder runs (encoder/bert.py for MiniLM)
    monkeypatch.setattr(minilm, "batch_tokens", budget)
    monkeypatch.setattr(minilm, "_net", spy)
    got, _ = encode(minilm, texts, is_query)
    assert len(spy.sizes) > 1
    over = [(b, t) for b, t in spy.sizes if b * t > budget and b > 1]
    assert not over, (over, spy.sizes)
    # batched otherwise: float32 batching noise only (docs/model.md, "Batching": 7.6e-7 measured
    # on MiniLM); 1e-4 is over 100 times that, and a wrong row or text moves whole vectors
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


# -- a tiny random UIBK checkpoint ------------------------------------------------------------------
@pytest.fixture(scope="module")
def uibk(corpus, tmp_path_factory):
    cfg = UIBKConfig.tiny()
    enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, corpus), seed=7, device="cpu", doc_max_length=128)
    # through a saved checkpoint, as users load one
    return UIBKEncoder.from_pretrained(enc.save_pretrained(tmp_path_factory.mktemp("pipe") / "tiny"),
                                       device="cpu")


@pytest.mark.parametrize("batch_tokens", [8192, 300])
def test_uibk_documents_and_queries_equal_the_reference(uibk, corpus, batch_tokens, monkeypatch):
    monkeypatch.setattr(uibk, "batch_tokens", batch_tokens)
    texts = mixed_texts(corpus, 400)
    got, msgs = encode(uibk, texts, False)
    want, cut = reference_uibk(uibk, texts, False)
    assert_same(got, want)
    assert cut >= 2 and msgs == [f"{cut} of {len(texts)} documents were longer than 128 tokens and were "
                                 "truncated"]
    assert len(got[13]) == len(got[14]) == 3 + 1  # no text token: [SEP]'s vector, as the MiniLM one
    assert max(map(len, got)) == 3 + 128 - 4
    for w in (1.0, 2.5):
        got, msgs = encode(uibk, texts, True, w)
        want, cut = reference_uibk(uibk, texts, True, w)
        assert_same(got, want)
        assert cut >= 2 and msgs == [f"{cut} of {len(texts)} queries were longer than 256 tokens and were "
                                     "truncated"]
        assert max(map(len, got)) == 3 + 64


def test_uibk_single_text(uibk, corpus):
    for is_query in (False, True):
        w = 1.5 if is_query else 1.0
        got, _ = encode(uibk, [corpus[1]], is_query, w)
        want, _ = reference_uibk(uibk, [corpus[1]], is_query, w)
        assert_same(got, want)


def test_shared_encoder_merges_requests_with_their_own_weights(uibk, corpus):
    texts = corpus[:6]
    barrier = threading.Barrier(2)
    got: dict[float, list[np.ndarray]] = {}

    def call(w: float) -> None:
        barrier.wait()
        got[w] = enc.encode_queries(texts, dense_weight=w)

    with SharedEncoder(uibk, max_wait_ms=300) as enc:
        ts = [threading.Thread(target=call, args=(w,)) for w in (1.0, 3.0)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert enc.stats()["merged_passes"] >= 1
    for a, b in zip(got[1.0], got[3.0], strict=True):
        np.testing.assert_allclose(b[:3], 3 * a[:3], atol=TOL)
        np.testing.assert_allclose(b[3:], a[3:], atol=TOL)


# -- the pipeline's machinery ---------------------------------------------------------------------
def _tokenizer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "uibk-tokenize"]


def test_prefetch_thread_stops_when_the_consumer_stops(uibk, corpus, monkeypatch):
    monkeypatch.setattr(uibk, "batch_tokens", 200)
    gen = uibk._tagged_batches(corpus, False, 1.0)
    positions, arrays, _ = next(gen)
    assert len(positions) == len(arrays) >= 1
    assert _tokenizer_threads()
    gen.close()
    assert not _tokenizer_threads()


def test_a_tokeniser_error_in_the_prefetch_thread_reaches_the_caller(uibk, corpus, monkeypatch):
    monkeypatch.setattr(uibk, "batch_tokens", 200)
    real = uibk._tokenize
    calls = []

    def failing(texts, is_query):
        calls.append(len(texts))
        if len(calls) == 3:
            raise RuntimeError("tokeniser exploded")
        return real(texts, is_query)

    monkeypatch.setattr(uibk, "_tokenize", failing)
    with pytest.raises(RuntimeError, match="tokeniser exploded"):
        uibk.encode_documents(corpus)
    assert not _tokenizer_threads()
    monkeypatch.setattr(uibk, "_tokenize", real)
    assert len(uibk.encode_documents(corpus[:3])) == 3  # the encoder still works


def test_a_non_finite_model_output_is_refused(uibk, corpus, monkeypatch):
    real = uibk._forward

    def poisoned(inputs):
        g, tok = real(inputs)
        tok = tok.clone()
        tok[1, N_PREFIX + 1] = float("nan")
        return g, tok

    monkeypatch.setattr(uibk, "_forward", poisoned)
    texts = corpus[:4]
    second = uibk._length_order(texts)[1]  # row 1 of the length-sorted batch
    with pytest.raises(ValueError, match=f"text {second}: the model gave a zero or non-finite vector"):
        uibk.encode_documents(texts)
