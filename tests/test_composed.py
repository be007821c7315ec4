"""Bring your own models: a sentence-transformers dense model + a ColBERT model.

Tiny random models are built here (no downloads): a 2-layer BERT saved by sentence-transformers
as a folder with CLS pooling, Normalize and query / document prompts; another as a ColBERT model
in PyLate's format (:func:`~uibk_embedding.testing.colbert_folders.pylate_colbert`: its Linear
projection to 128-d, [Q]/[D] markers, query length 16 with [MASK] expansion, document length
40) and one saved by sentence-transformers 6 itself (``st6_colbert``). The token head runs
sentence-transformers 6's ``MultiVectorEncoder`` (PyLate is not needed); the composed encoder's
heads must equal what ``SentenceTransformer`` and ``MultiVectorEncoder`` return themselves,
through the real pipeline (batching, prefetch thread, device construction), within 1e-5. That the
PyLate-format folder is what PyLate itself writes is checked in PyLate's own environment
(tests/test_pylate_interop.py).
"""

from __future__ import annotations

import json
import math
import shutil
import string
import warnings

import numpy as np
import pytest
import torch

from uibk_embedding.encoder import check_separation, decompose, load_encoder
from uibk_embedding.encoder.pooling import PoolingSpec
from uibk_embedding.encoder.transformer import TransformerEncoder, embedded_model_path
from uibk_embedding.errors import ModelChanged
from uibk_embedding.tagged import orthonormal_rows
from uibk_embedding.testing.colbert_folders import pylate_colbert, st6_colbert
from uibk_embedding.testing.tiny_models import tiny_bert

st = pytest.importorskip("sentence_transformers", minversion="6.0",
                         reason="the colbert extra (sentence-transformers >= 6) is not installed")
import sentence_transformers.models  # noqa: E402,F401  (st.models: Transformer, Pooling, ...)

TOL = 1e-5
WORDS = ("the a of in on wing lift slipstream boundary layer flow heat transfer what is how "
         "query passage document").split()
TEXTS = [
    "the wing lift in a slipstream",
    "heat transfer, in a boundary layer!",  # punctuation: on PyLate's document skiplist
    "what is the flow of heat?",
    "a",
    "lift " * 60,  # over the ColBERT document length (40) and the query length (16)
    "boundary layer flow on a wing: heat transfer (of the slipstream) in 3 parts",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Folders: ``dense`` (CLS + Normalize + prompts), ``colbert`` (PyLate's format),
    ``colbert_st6`` (saved by sentence-transformers 6), ``maxmean`` (max + mean pooling, no
    Normalize), ``densehead`` (a Dense layer after pooling)."""
    root = tmp_path_factory.mktemp("byo")
    letters = list(string.ascii_lowercase + string.digits)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"[unused{i}]" for i in range(4)),
             *string.punctuation, *letters, *(f"##{c}" for c in letters),
             *(w for w in WORDS if w not in letters)]
    assert "wing" in vocab
    folders = {}
    for name, seed in (("hf_dense", 0), ("hf_colbert", 1)):
        tiny_bert(root / name, vocab, seed=seed)
    hf = str(root / "hf_dense")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = st.SentenceTransformer(
            modules=[st.models.Transformer(hf, max_seq_length=64),
                     st.models.Pooling(32, pooling_mode="cls"), st.models.Normalize()],
            prompts={"query": "query: ", "document": "passage: "}, device="cpu")
        m.save(str(root / "dense"))
        st.SentenceTransformer(
            modules=[st.models.Transformer(hf, max_seq_length=64),
                     st.models.Pooling(32, pooling_mode_max_tokens=True,
                                       pooling_mode_mean_tokens=True,
                                       pooling_mode_cls_token=False)],
            device="cpu").save(str(root / "maxmean"))
        torch.manual_seed(4)
        st.SentenceTransformer(
            modules=[st.models.Transformer(hf), st.models.Pooling(32),
                     st.models.Dense(32, 16)], device="cpu").save(str(root / "densehead"))
        pylate_colbert(root / "colbert", root / "hf_colbert", seed=2, query_length=16, document_length=40)
        st6_colbert(root / "colbert_st6", root / "hf_colbert", seed=3, query_length=16, document_length=40)
    for name in ("dense", "colbert", "colbert_st6", "maxmean", "densehead"):
        folders[name] = root / name
    return folders


@pytest.fixture(scope="module")
def composed(models):
    return load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu")


@pytest.fixture(scope="module")
def references(models):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dense = st.SentenceTransformer(str(models["dense"]), device="cpu")
        colbert = st.MultiVectorEncoder(str(models["colbert"]), device="cpu")
    return dense, colbert


def encode(enc, texts, is_query, w=1.0, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the long text is reported as truncated
        if is_query:
            return enc.encode_queries(texts, dense_weight=w, show_progress=False, **kw)
        return enc.encode_documents(texts, show_progress=False, **kw)


def reference_lists(enc, references, texts, is_query, w=1.0):
    """What the two libraries return, composed by hand in float64: ST's normalised sentence
    vector -> R -> 3 slots; MultiVectorEncoder's token vectors -> R' -> renormalised tokens."""
    dense, colbert = references
    name = "query" if is_query else "document"
    g = dense.encode(texts, prompt_name=name, normalize_embeddings=True, convert_to_numpy=True)
    toks = token_vectors(colbert, texts, is_query)
    out = []
    for gi, ti in zip(g, toks, strict=True):
        ti = np.asarray(ti, dtype=np.float64)[: enc.query_token_cap if is_query else None]
        out.append(enc.format.build(enc.format.split(gi, enc.R), ti @ enc.P.T.astype(np.float64),
                                    dense_weight=w))
    return out


def token_vectors(colbert, texts, is_query):
    """What ``MultiVectorEncoder.encode_query`` / ``encode_document`` return (unit vectors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = colbert.encode_query if is_query else colbert.encode_document
        return run(texts, convert_to_numpy=True, normalize_embeddings=True)


# -- the two heads equal the libraries' own outputs ---------------------------------------------
@pytest.mark.parametrize("is_query", [True, False])
def test_dense_head_equals_sentence_transformers(composed, references, is_query):
    dense, _ = references
    name = "query" if is_query else "document"
    want = dense.encode(TEXTS, prompt_name=name, normalize_embeddings=True, convert_to_numpy=True)
    got = np.stack([g for g, _ in composed._embed(TEXTS, is_query)])
    assert composed.query_prompt == "query: " and composed.document_prompt == "passage: "
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    # CLS pooling, not mean pooling: the two differ on these models
    mean = dense.encode(TEXTS, normalize_embeddings=True, prompt_name=name,
                        output_value="token_embeddings")
    assert not np.allclose(got[0], torch.nn.functional.normalize(mean[0].mean(0), dim=0).numpy(),
                           atol=1e-3)


@pytest.mark.parametrize("is_query", [True, False])
def test_token_head_equals_multi_vector_encoder_then_r_prime(composed, references, is_query):
    _, colbert = references
    want = token_vectors(colbert, TEXTS, is_query)
    p = composed.P.astype(np.float64)
    assert p.shape == (127, 128)
    np.testing.assert_allclose(p @ p.T, np.eye(127), atol=1e-6)  # R': orthonormal rows
    lists = encode(composed, TEXTS, is_query)
    beta = composed.format.beta
    for text, x, ref in zip(TEXTS, lists, want, strict=True):
        ref = np.asarray(ref, dtype=np.float64)
        assert len(x) == 3 + len(ref), text
        if is_query:
            assert len(ref) == 16  # query length, [MASK] expansion included
        u = ref @ p.T
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        np.testing.assert_allclose(x[3:, 1:] / math.sqrt(beta), u, atol=TOL, rtol=0)
        np.testing.assert_allclose(x[3:, 0], math.sqrt(1 - beta), atol=1e-6)
    # the skiplist took the punctuation out of the documents, not out of the queries
    if not is_query:
        n_words = len(composed.colbert.tokenizer("heat transfer, in a boundary layer!")["input_ids"])
        assert len(lists[1]) == 3 + n_words + 1 - 2  # + [D] marker - ',' - '!'


@pytest.mark.parametrize("batch_tokens", [8192, 60])  # one batch / many through the prefetch thread
@pytest.mark.parametrize("is_query", [True, False])
def test_whole_lists_equal_the_composed_reference(models, references, batch_tokens, is_query):
    enc = load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu",
                       batch_tokens=batch_tokens)
    w = 2.5 if is_query else 1.0
    got = encode(enc, TEXTS, is_query, w)
    want = reference_lists(enc, references, TEXTS, is_query, w)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == np.float32 and a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=TOL, rtol=0)


@pytest.mark.parametrize("is_query", [True, False])
def test_a_colbert_saved_by_sentence_transformers_6_is_a_token_head(models, is_query):
    """A native MultiVectorEncoder save (Transformer, Dense, MultiVectorMask, Normalize)."""
    enc = load_encoder(dense=models["dense"], tokens=models["colbert_st6"], device="cpu", batch_tokens=60)
    dense = st.SentenceTransformer(str(models["dense"]), device="cpu")
    refs = (dense, st.MultiVectorEncoder(str(models["colbert_st6"]), device="cpu"))
    w = 1.5 if is_query else 1.0
    got = encode(enc, TEXTS, is_query, w)
    want = reference_lists(enc, refs, TEXTS, is_query, w)
    assert [len(x) for x in got] == [len(x) for x in want]
    diff = max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True))
    print(f"sentence-transformers 6 ColBERT, {'queries' if is_query else 'documents'}: max |diff| {diff:.2e}")
    assert diff <= TOL


def test_truncation_is_reported(composed):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        composed.encode_documents(TEXTS, show_progress=False)
    msgs = [str(m.message) for m in caught if "truncated" in str(m.message)]
    assert msgs == ["1 of 6 documents were longer than 40 tokens and were truncated"]


def test_truncation_without_a_document_marker_counts_every_position(models, tmp_path):
    # the limit assumed PyLate's marker: a document of exactly document_length tokens was
    # reported as truncated, though all 40 of them were kept
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pylate_colbert(tmp_path / "plain", models["colbert"].parent / "hf_colbert", seed=2,
                       query_length=16, document_length=40, query_prefix="", document_prefix="")
        enc = load_encoder(dense=models["dense"], tokens=tmp_path / "plain", device="cpu")
    for words, rows, cut in ((38, 3 + 40, False), (39, 3 + 40, True)):  # [CLS] words [SEP]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = enc.encode_documents([" ".join(["wing"] * words)])[0]
        assert len(out) == rows and any("truncated" in str(w.message) for w in caught) == cut, words


# -- the format: docs/format.md#identity on the composed lists -----------------------------------------------
def test_identity_of_design_1_2(composed):
    fmt = composed.format
    w = 1.7
    queries = encode(composed, TEXTS[:4], True, w)
    docs = encode(composed, TEXTS, False)
    rep = check_separation(queries, docs)
    assert rep.held, rep.as_dict()
    checked = 0
    for qi, q in enumerate(queries):
        gq = composed._embed([TEXTS[qi]], True)[0][0]
        for di, d in enumerate(docs):
            p = decompose(q, d, fmt)
            assert p.separated and p.dense_weight == pytest.approx(w, rel=1e-5)
            assert p.total == pytest.approx(
                p.constant + fmt.beta * (p.token + fmt.lambda_ * w * p.dense), abs=1e-4)
            if not p.slots_aligned:
                continue
            checked += 1
            # C(q) = m (1 - beta) + 3 w (1 - delta), and the dense part is the slots' cosine
            assert p.constant == pytest.approx(fmt.constant(len(q) - 3, w), abs=1e-4)
            gd = composed._embed([TEXTS[di]], False)[0][0]
            sq, sd = fmt.split(gq, composed.R), fmt.split(gd, composed.R)
            sq /= np.linalg.norm(sq, axis=1, keepdims=True)
            sd /= np.linalg.norm(sd, axis=1, keepdims=True)
            assert p.dense == pytest.approx(float(np.mean(np.sum(sq * sd, axis=1))), abs=1e-4)
            # and the token part is PyLate's MaxSim after R'
            uq = q[3:, 1:] / math.sqrt(fmt.beta)
            ud = d[3:, 1:] / math.sqrt(fmt.beta)
            assert p.token == pytest.approx(float((uq @ ud.T).max(axis=1).sum()), abs=1e-4)
    assert checked >= len(queries) * len(docs) // 2


# -- save / load ---------------------------------------------------------------------------------
def test_save_and_load_round_trip(composed, models, tmp_path):
    composed.save(tmp_path / "enc")
    cfg = json.loads((tmp_path / "enc" / "uibk_encoder.json").read_text())
    assert cfg["kind"] == "composed" and cfg["dense"] == str(models["dense"].resolve())
    assert len(cfg["dense_sha256"]) == len(cfg["tokens_sha256"]) == 64
    again = load_encoder(tmp_path / "enc", device="cpu")
    for is_query in (True, False):
        for a, b in zip(encode(again, TEXTS, is_query), encode(composed, TEXTS, is_query), strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(again.R, composed.R)
    np.testing.assert_array_equal(again.P, composed.P)


def test_a_fitted_projection_round_trips(models, tmp_path):
    """A composed encoder fitted by PCA reloads as that encoder: the same matrices, declared as
    a PCA projection (so a store it filled accepts it), and a missing projections.npz is refused
    rather than replaced by the seeded matrices."""
    fitted = load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu")
    seeded_format = fitted.format
    # what fit_projection installs (a PCA needs 127 token directions; the tiny model has 32)
    fitted.set_projections({"R": orthonormal_rows(fitted.R.shape[0], fitted.R.shape[1], 7),
                            "P": orthonormal_rows(fitted.P.shape[0], fitted.P.shape[1], 8)}, "pca")
    assert fitted.projection == "pca" and fitted.format.projection.startswith("pca-")
    assert fitted.format.conflict(seeded_format) is not None
    fitted.save(tmp_path / "enc")
    again = load_encoder(tmp_path / "enc", device="cpu")
    assert again.projection == "pca"
    assert again.format.projection == fitted.format.projection
    assert again.format.conflict(fitted.format) is None
    np.testing.assert_array_equal(again.R, fitted.R)
    np.testing.assert_array_equal(again.P, fitted.P)
    (tmp_path / "enc" / "projections.npz").unlink()
    with pytest.raises(FileNotFoundError, match=r"projections\.npz is missing"):
        load_encoder(tmp_path / "enc", device="cpu")


def test_a_saved_projection_keeps_its_kind(models, tmp_path):
    """``projection=`` cannot rename the matrices a saved folder holds (as for the other saved
    encoders): before, a PCA-fitted folder loaded with projection='random' ran its PCA matrices
    declared as random (and a seeded one with 'pca' its seeded matrices declared as PCA), so a
    store filled by the other kind accepted its lists."""
    enc = load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu")
    enc.save(tmp_path / "seeded")
    enc.set_projections({"R": orthonormal_rows(enc.R.shape[0], enc.R.shape[1], 7),
                         "P": orthonormal_rows(enc.P.shape[0], enc.P.shape[1], 8)}, "pca")
    enc.save(tmp_path / "fitted")
    with pytest.raises(ValueError, match=r"holds a fitted pca projection; projection='random' cannot"):
        load_encoder(tmp_path / "fitted", projection="random", device="cpu")
    with pytest.raises(ValueError, match=r"holds the seeded random projection; projection='pca' needs"):
        load_encoder(tmp_path / "seeded", projection="pca", device="cpu")
    with pytest.raises(ValueError, match=r"no PCA projection is shipped for composed:dense\+colbert"):
        load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu", projection="pca")
    # naming the kind the folder holds is fine
    assert load_encoder(tmp_path / "fitted", projection="pca", device="cpu").format == enc.format
    assert load_encoder(tmp_path / "seeded", projection="random", device="cpu").projection == "random"


def test_a_changed_model_is_refused(composed, models, tmp_path):
    moved = {k: tmp_path / k for k in ("dense", "colbert")}
    for k, v in moved.items():
        shutil.copytree(models[k], v)
    enc = load_encoder(dense=moved["dense"], tokens=moved["colbert"], device="cpu")
    enc.save(tmp_path / "enc")
    (moved["colbert"] / "README.md").write_text("an edited model card changes nothing")
    load_encoder(tmp_path / "enc", device="cpu")
    # the weights of the token model change: refused, with the reason
    weights = moved["colbert"] / "1_Dense" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelChanged, match=r"the tokens model at .* is not the one this encoder"):
        load_encoder(tmp_path / "enc", device="cpu")
    with pytest.raises(ValueError):  # ModelChanged is a ValueError too
        load_encoder(tmp_path / "enc", device="cpu")
    # pointing it at the original folders (same content, another place) loads it
    enc2 = load_encoder(tmp_path / "enc", tokens=models["colbert"], dense=models["dense"], device="cpu")
    np.testing.assert_array_equal(encode(enc2, TEXTS[:2], False)[0], encode(enc, TEXTS[:2], False)[0])
    shutil.rmtree(moved["dense"])
    with pytest.raises(FileNotFoundError, match=r"dense model folder .* does not exist"):
        load_encoder(tmp_path / "enc", tokens=models["colbert"], device="cpu")


def test_wrong_folders_are_refused(models, tmp_path):
    with pytest.raises(ValueError, match=r"needs both dense= .* and tokens="):
        load_encoder(dense=models["dense"])
    with pytest.raises(ValueError, match="a ColBERT model is a Transformer followed by"):
        load_encoder(dense=models["dense"], tokens=models["maxmean"])  # not a ColBERT model
    with pytest.raises(ValueError, match="looks like a ColBERT model"):
        load_encoder(dense=models["colbert"], tokens=models["colbert"])
    with pytest.raises(ValueError, match=r"is not a ColBERT model \(no modules\.json"):
        load_encoder(dense=models["dense"], tokens=models["dense"].parent / "hf_colbert")
    with pytest.raises(FileNotFoundError, match="dense model folder"):
        load_encoder(dense=tmp_path / "nope", tokens=models["colbert"])


# -- one folder, one pass: the folder's own pooling ----------------------------------------------
def test_one_pass_honours_cls_pooling_and_normalize(models):
    enc = load_encoder(models["dense"], device="cpu")
    assert isinstance(enc, TransformerEncoder) and enc.pooling.describe() == "cls + normalize"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = st.SentenceTransformer(str(models["dense"]), device="cpu")
    texts = TEXTS[:4]
    want = ref.encode(texts, normalize_embeddings=True)  # no prompt: one pass reads the text as is
    got = np.stack([g for g, _ in enc._embed(texts, False)])
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_one_pass_honours_the_folders_lower_casing(tmp_path):
    # do_lower_case in sentence_bert_config.json was ignored: on a cased tokenizer the sentence
    # vector of "Wing LIFT Heat" had cosine 0.81 to the model's own
    from transformers import BertConfig, BertModel, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *string.ascii_lowercase,
             *(f"##{c}" for c in string.ascii_lowercase), "wing", "lift", "heat"]
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(tmp_path / "hf")
    cased = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=False)
    cased.save_pretrained(tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st.SentenceTransformer(modules=[st.models.Transformer(str(tmp_path / "hf"), do_lower_case=True),
                                        st.models.Pooling(32), st.models.Normalize()],
                               device="cpu").save(str(tmp_path / "st"))
        ref = st.SentenceTransformer(str(tmp_path / "st"), device="cpu")
    enc = load_encoder(tmp_path / "st", device="cpu")
    texts = ["Wing LIFT Heat", "wing lift heat"]
    got = np.stack([g for g, _ in enc._embed(texts, False)])
    np.testing.assert_allclose(got, ref.encode(texts, normalize_embeddings=True), atol=TOL, rtol=0)


def test_one_pass_honours_concatenated_pooling_without_normalize(models):
    enc = load_encoder(models["maxmean"], device="cpu")
    assert enc.pooling == PoolingSpec(modes=("max", "mean"), normalize=False,
                                      source=enc.pooling.source)
    assert enc.R.shape == (381, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = st.SentenceTransformer(str(models["maxmean"]), device="cpu")
    want = ref.encode(TEXTS[:4])
    got = np.stack([g for g, _ in enc._embed(TEXTS[:4], False)])
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_one_pass_refuses_what_it_cannot_honour(models):
    with pytest.raises(ValueError, match=r"lists the modules \['Transformer', 'Pooling', 'Dense'\]"):
        load_encoder(models["densehead"], device="cpu")
    with pytest.raises(ValueError, match=r"\['Transformer', 'Dense'\].*load_encoder\(dense="):
        load_encoder(models["colbert"], device="cpu")  # its trained projection would be ignored


def test_embedded_default_is_mean_pooled_and_normalised():
    assert PoolingSpec.from_folder(embedded_model_path()).describe() == "mean + normalize"


def test_shared_encoder_and_one_index(composed, models):
    """The composed encoder runs behind SharedEncoder (so `uibk-embed serve`) unchanged, and its
    lists go into one store and come back with one search, explained."""
    import uibk_embedding as ue
    from uibk_embedding.encoder.shared import SharedEncoder

    with SharedEncoder(dense=models["dense"], tokens=models["colbert"], device="cpu") as shared:
        for w in (1.0, 3.0):
            for a, b in zip(shared.encode_queries(TEXTS, dense_weight=w), encode(composed, TEXTS, True, w),
                            strict=True):
                np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    store = ue.open_store("exact")
    store.upsert([str(i) for i in range(len(TEXTS))], encode(composed, TEXTS, False))
    hits = store.search(encode(composed, [TEXTS[0]], True)[0], k=3, explain=True)
    assert len(hits) == 3 and all(h.decomposition.separated for h in hits)
    assert hits[0].score >= hits[1].score >= hits[2].score


def test_readme_example_composes_two_local_folders(models, tmp_path, monkeypatch):
    """The "Bring your own models" block of README.md, run as written with its two folder
    names pointing at the tiny models."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Bring your own models", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    names = {"models/bge-small-en-v1.5": models["dense"], "models/my-colbert": models["colbert"]}
    for name, folder in names.items():
        assert f'"{name}"' in code, f"README example no longer names {name}"
        code = code.replace(f'"{name}"', repr(str(folder)))
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "README.md", "exec"), ns)
    assert (tmp_path / "my-encoder").is_dir()
    again = load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu")
    assert ns["enc"].format == again.format  # reloaded from the saved folder: same matrices
    np.testing.assert_allclose(ns["docs"][0], again.encode_documents(
        ["the wing lift in a propeller slipstream"], show_progress=False)[0], atol=1e-6)
    assert ns["q"].shape[1] == 128


def test_cli_composes_two_folders(models, tmp_path, capsys):
    """``--dense/--tokens`` on the CLI: index and search with the composed encoder; the store
    records its projection, so searching it with the embedded default is refused."""
    from uibk_embedding.apps import cli

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                              for i, t in enumerate(TEXTS[:4])))
    both = ["--dense", str(models["dense"]), "--tokens", str(models["colbert"])]
    store = ["--path", str(tmp_path / "store")]
    assert cli.main(["index", str(corpus), *store, *both, "--quiet"]) == 0
    capsys.readouterr()
    query = "heat in the boundary layer"
    assert cli.main(["search", query, *store, *both, "--json", "-k", "3"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    enc = load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu")
    want = ue_search(enc, TEXTS[:4], query, 3)
    assert [h["id"] for h in hits] == want
    with pytest.raises(SystemExit, match=f"projection {enc.format.projection}, not random-"):
        cli.main(["search", query, *store])
    with pytest.raises(SystemExit, match="composing two models needs both"):
        cli.main(["search", query, *store, "--dense", str(models["dense"])])
    with pytest.raises(SystemExit, match="does not apply to --dense/--tokens"):
        cli.main(["search", query, *store, *both, "--projection", "pca"])


def ue_search(enc, texts, query, k):
    """The same search in Python: exact MaxSim over the composed lists."""
    from uibk_embedding.adapters import open_store

    with open_store("exact", format=enc.format) as s:
        s.upsert([f"d{i}" for i in range(len(texts))], encode(enc, texts, False))
        return [h.id for h in s.search(encode(enc, [query], True, w=enc.dense_weight)[0], k=k)]


def test_model_hashing_is_bounded(tmp_path, monkeypatch):
    """A saved composed encoder names its model folders; hashing one must not read a whole file
    system (a folder naming "/"): past MAX_MODEL_FILES files it stops with a clear error."""
    import uibk_embedding.encoder.composed as composed
    import uibk_embedding.encoder.trust as trust

    monkeypatch.setattr(trust, "MAX_MODEL_FILES", 50)
    for i in range(51):
        (tmp_path / f"f{i}.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a model folder"):
        composed.model_digest(tmp_path)
    (tmp_path / "f0.bin").unlink()
    assert len(composed.model_digest(tmp_path)) == 64


# -- the sentence-transformers 6 export ------------------------------------------------------------
def _st6_lists(model, texts, is_query):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = model.encode_query if is_query else model.encode_document
        return run(texts, convert_to_numpy=True, batch_size=2)


def _assert_same_lists(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=TOL, rtol=0)


@pytest.mark.parametrize("tokens, options", [
    ("colbert", None),  # PyLate's format: [Q]/[D] markers, [MASK] expansion, punctuation skiplist
    ("colbert_st6", None),  # saved by sentence-transformers 6 itself
    ("colbert", {"query_length": 12, "query_expansion": None}),  # overridden token-model settings
])
def test_st6_export_gives_the_composed_lists(models, tmp_path, tokens, options):
    """A composed encoder saved by save_sentence_transformers is one MultiVectorEncoder folder
    whose first module runs both models: encode_query / encode_document (batches of 2, so the
    two models' inputs are padded to one width) give the composed encoder's tagged lists, and
    load_encoder reads the folder back (batched by a small token budget: split rows, cropped
    widths) to the same lists; the folder's own code needs trust_remote_code."""
    from uibk_embedding.encoder.pylate_model import PyLateEncoder, save_sentence_transformers
    from uibk_embedding.errors import UntrustedCode

    enc = load_encoder(dense=models["dense"], tokens=models[tokens], device="cpu",
                       colbert_options=options)
    folder = save_sentence_transformers(enc, tmp_path / "st6")
    mods = json.loads((folder / "modules.json").read_text())
    assert [m["type"] for m in mods] == ["tagged_modules.ComposedInput", "tagged_modules.TaggedLists"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = st.MultiVectorEncoder(str(folder), trust_remote_code=True, device="cpu")
    back = load_encoder(folder, trust_remote_code=True, device="cpu", batch_tokens=48)
    assert isinstance(back, PyLateEncoder)
    assert (back.format.beta, back.format.lambda_) == (enc.format.beta, enc.format.lambda_)
    for is_query in (True, False):
        want = encode(enc, TEXTS, is_query)
        _assert_same_lists(_st6_lists(model, TEXTS, is_query), want)
        _assert_same_lists(encode(back, TEXTS, is_query), want)
    # the export is in the lists' reference too: what the two libraries return, composed by hand
    refs = (st.SentenceTransformer(str(models["dense"]), device="cpu"),
            st.MultiVectorEncoder(str(models[tokens]), device="cpu"))
    if options is None:
        _assert_same_lists(_st6_lists(model, TEXTS, False), reference_lists(enc, refs, TEXTS, False))
    with pytest.raises(UntrustedCode, match=r"tagged_modules\.ComposedInput"):
        load_encoder(folder, device="cpu")
    if options is None and tokens == "colbert":
        # the format's projection hashes both model folders: another token model is another format
        weights = folder / "tokens" / "1_Dense" / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1
        weights.write_bytes(bytes(data))
        other = load_encoder(folder, trust_remote_code=True, device="cpu")
        assert other.format.projection != back.format.projection
        assert other.format.conflict(back.format) is not None


def test_st6_export_saves_again_and_refuses_a_changed_model(models, tmp_path):
    """MultiVectorEncoder.save_pretrained of a loaded export writes a folder that gives the same
    lists (ComposedInput.save writes both models); the export copies the model folders only if
    they still hash to what the encoder loaded; loader options that are no setting of the model
    are refused rather than dropped."""
    from uibk_embedding.encoder.pylate_model import save_sentence_transformers

    folder = save_sentence_transformers(
        load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu"), tmp_path / "st6")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = st.MultiVectorEncoder(str(folder), trust_remote_code=True, device="cpu")
        model.save_pretrained(str(tmp_path / "again"))
        again = st.MultiVectorEncoder(str(tmp_path / "again"), trust_remote_code=True, device="cpu")
    for is_query in (True, False):
        _assert_same_lists(_st6_lists(again, TEXTS, is_query), _st6_lists(model, TEXTS, is_query))

    moved = tmp_path / "colbert"
    shutil.copytree(models["colbert"], moved)
    enc = load_encoder(dense=models["dense"], tokens=moved, device="cpu")
    weights = moved / "1_Dense" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelChanged, match=r"the tokens model at .* changed since"):
        save_sentence_transformers(enc, tmp_path / "changed")
    opts = load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu",
                        colbert_options={"model_kwargs": {}})
    with pytest.raises(NotImplementedError, match=r"colbert_options \['model_kwargs'\]"):
        save_sentence_transformers(opts, tmp_path / "opts")


def test_cli_export_st_writes_the_composed_encoder(models, tmp_path, capsys):
    """``uibk-embed export-st OUT --dense D --tokens T`` writes the composed encoder as a
    sentence-transformers 6 folder that MultiVectorEncoder loads to the composed lists; it never
    writes over another folder's files, and export-pylate, which cannot take a composed encoder,
    says so in one line and names export-st."""
    from uibk_embedding.apps import cli

    both = ["--dense", str(models["dense"]), "--tokens", str(models["colbert"])]
    out = tmp_path / "st6"
    assert cli.main(["export-st", str(out), *both]) == 0
    assert "MultiVectorEncoder(" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = st.MultiVectorEncoder(str(out), trust_remote_code=True, device="cpu")
    enc = load_encoder(dense=models["dense"], tokens=models["colbert"], device="cpu")
    for is_query in (True, False):
        _assert_same_lists(_st6_lists(model, TEXTS, is_query), encode(enc, TEXTS, is_query))
    listing = sorted(p.name for p in out.iterdir())
    with pytest.raises(SystemExit, match="is not an empty folder"):
        cli.main(["export-st", str(out), *both])
    assert sorted(p.name for p in out.iterdir()) == listing
    with pytest.raises(SystemExit, match=r"uibk-embed export-st OUT"):
        cli.main(["export-pylate", str(tmp_path / "pylate"), *both])


@pytest.mark.parametrize("colbert", ["colbert", "colbert_st6"])
def test_content_pooling_reads_the_token_ids_of_the_kept_rows(models, colbert):
    """The content method needs each emitted token row's id: for a dense + token pair they are the
    ids at the positions the token model keeps (its document skiplist drops punctuation)."""
    from uibk_embedding.tagged import N_SLOTS
    from uibk_embedding.token_pooling import pool_tokens

    texts = ["the lift of a wing , and the drag of the wing", "wing"]
    plain = load_encoder(dense=models["dense"], tokens=models[colbert], device="cpu")
    pooled = load_encoder(dense=models["dense"], tokens=models[colbert], device="cpu", pool_factor=2)
    tb = pooled._tokenize(texts, False)
    ids = pooled._row_token_ids(tb)
    tok = pooled.colbert.tokenizer
    words = tok.convert_ids_to_tokens([int(i) for i in ids[0]])
    assert "lift" in words and "wing" in words and "," not in words  # kept rows, skiplist applied
    rows = pooled.token_rows(texts)
    for a, b, r in zip(plain.encode_documents(texts), pooled.encode_documents(texts), rows, strict=True):
        assert len(r.function) == len(a) - N_SLOTS
        assert len(b) - N_SLOTS == max((len(a) - N_SLOTS) // 2, 1)
        assert np.abs(b - pool_tokens(a, 2, pooled.format, r)).max() < 1e-5
