"""UIBK-Embedding-v1 architecture on tiny random checkpoints built and saved here."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.uibk import (
    REQUIRED_FILES,
    UIBKConfig,
    UIBKEncoder,
    _build_model,
    param_counts,
    train_tokenizer,
)
from uibk_embedding.tagged import TaggedFormat, decompose

CORPUS = [
    "experimental investigation of the lift on a wing in a propeller slipstream",
    "transition from laminar to turbulent flow in the boundary layer of a flat plate",
    "heat transfer to a blunt body in hypersonic flow at high mach number",
    "flutter of thin panels in supersonic flow and its suppression by damping",
    "interaction of an oblique shock wave with a laminar boundary layer",
    "measuring the dielectric constant of liquids with microwave cavities",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = UIBKConfig.tiny()
    enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, CORPUS), seed=3)
    path = enc.save_pretrained(tmp_path_factory.mktemp("uibk") / "tiny")
    return enc, path


def test_saved_layout_and_round_trip_is_identical(tiny):
    enc, path = tiny
    assert sorted(p.name for p in path.iterdir()) == sorted(REQUIRED_FILES)
    again = load_encoder(path)  # dispatch through uibk_encoder.json kind "uibk"
    assert isinstance(again, UIBKEncoder)
    assert again.config() == enc.config()
    np.testing.assert_array_equal(again.R, enc.R)
    np.testing.assert_array_equal(again.P, enc.P)
    for a, b in zip(again.encode_documents(CORPUS), enc.encode_documents(CORPUS), strict=True):
        assert a.tobytes() == b.tobytes()
    for a, b in zip(again.encode_queries(CORPUS[:3], dense_weight=2.5),
                    enc.encode_queries(CORPUS[:3], dense_weight=2.5), strict=True):
        assert a.tobytes() == b.tobytes()
    # a second save of the loaded model writes the same weights
    assert again.save_pretrained(path.parent / "again")
    weights = "model.safetensors"
    assert (path.parent / "again" / weights).read_bytes() == (path / weights).read_bytes()


def test_a_fitted_projection_saved_alone_loads_with_its_weights(tmp_path, cranfield):
    # save_projections wrote uibk_encoder.json + projections.npz only: a store indexed with
    # --fit-projection --encoder UIBK could not load its encoder ("not a complete UIBK checkpoint")
    cfg = UIBKConfig.tiny(hidden_size=128, num_attention_heads=2, intermediate_size=192)
    texts = [d.text for d in cranfield.corpus[:300]]
    enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, texts), seed=3)
    enc.fit_projection(texts)
    enc.save_projections(tmp_path / "fitted")
    again = load_encoder(tmp_path / "fitted")
    assert again.config()["projection"] == enc.config()["projection"]
    for a, b in zip(again.encode_documents(CORPUS), enc.encode_documents(CORPUS), strict=True):
        assert a.tobytes() == b.tobytes()


def test_output_invariants(tiny):
    enc, _ = tiny
    fmt = enc.format
    assert enc.R.shape == (381, 32) and enc.P.shape == (127, 128)
    np.testing.assert_allclose(enc.P @ enc.P.T, np.eye(127), atol=1e-5)
    ids, _ = enc.token_ids(CORPUS, is_query=False)
    docs = enc.encode_documents(CORPUS)
    for d, x in zip(docs, ids, strict=True):
        assert d.dtype == np.float32 and d.shape == (3 + len(x) - 4, 128)
        np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1, atol=1e-5)
        assert (d[:3, 0] < 0).all() and (d[3:, 0] > 0).all()
        np.testing.assert_allclose(d[:3, 0], fmt.slot_tag, atol=1e-6)
        np.testing.assert_allclose(d[3:, 0], fmt.token_tag, atol=1e-6)
    qids, _ = enc.token_ids(CORPUS[:1], is_query=True)
    assert qids[0][:3] == [2, enc._ids["query_marker"], enc._ids["prompt_word"]] and qids[0][-1] == 3
    assert ids[0][1] == enc._ids["document_marker"]
    q = enc.encode_queries(CORPUS[:1], dense_weight=2.0)[0]
    np.testing.assert_allclose(np.linalg.norm(q[:3], axis=1), 2.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(q[3:], axis=1), 1.0, atol=1e-5)
    # the same text as query and as document differs (marker), so does the weight only scale slots
    q1 = enc.encode_queries(CORPUS[:1], dense_weight=1.0)[0]
    np.testing.assert_allclose(q[:3], 2 * q1[:3], atol=1e-6)
    np.testing.assert_array_equal(q[3:], q1[3:])
    assert not np.allclose(q1, docs[0])


def test_length_caps(tiny):
    enc, _ = tiny
    words = " ".join(CORPUS).split()
    long_text = " ".join(words[i % len(words)] for i in range(2600))
    n_body = len(enc.tokenizer.encode(long_text, add_special_tokens=False).ids)
    assert n_body > 2100
    with pytest.warns(UserWarning, match="1 of 1 documents were longer than 2048 tokens"):
        d = enc.encode_documents([long_text])[0]
    assert d.shape == (3 + 2048 - 4, 128)
    with pytest.warns(UserWarning, match="longer than 256 tokens"):
        q = enc.encode_queries([long_text])[0]
    assert q.shape == (3 + 64, 128)  # only the first 64 query tokens take part in matching
    # the dense head reads up to 256 tokens: a change at token 150 moves the slots ...
    base = long_text.split()[:300]
    changed = [*base[:150], "microwave" if base[150] != "microwave" else "wing", *base[151:]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = enc.encode_queries([" ".join(base), " ".join(changed)])
        # ... a change after token 256 does not
        c = enc.encode_queries([" ".join([*base[:280], "damping", "plate", *base[282:]])])[0]
    assert not np.allclose(a[:3], b[:3])
    np.testing.assert_array_equal(a, c)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # short texts: no truncation warning
        enc.encode_documents(CORPUS)


def test_identity_of_design_1_2(tiny):
    enc, _ = tiny
    fmt: TaggedFormat = enc.format
    w = 1.7
    queries = enc.encode_queries(CORPUS[:3], dense_weight=w)
    docs = enc.encode_documents(CORPUS)
    (gq, uq), = enc._embed(CORPUS[:1], True)
    checked = 0
    for qi, q in enumerate(queries):
        raw_q = enc._embed([CORPUS[qi]], True)[0]
        for di, d in enumerate(docs):
            parts = decompose(q, d, fmt)
            assert parts.total == pytest.approx(
                parts.constant + fmt.beta * (parts.token + fmt.lambda_ * parts.dense_weight * parts.dense),
                abs=1e-4)
            assert parts.dense_weight == pytest.approx(w, rel=1e-5)
            if not (parts.separated and parts.slots_aligned):
                continue
            checked += 1
            m = len(q) - 3
            assert parts.constant == pytest.approx(fmt.constant(m, w), abs=1e-4)
            # the parts equal what the two heads compute on their own
            raw_d = enc._embed([CORPUS[di]], False)[0]
            sq = fmt.split(raw_q[0], enc.R)
            sd = fmt.split(raw_d[0], enc.R)
            sq /= np.linalg.norm(sq, axis=1, keepdims=True)
            sd /= np.linalg.norm(sd, axis=1, keepdims=True)
            assert parts.dense == pytest.approx(float(np.mean(np.sum(sq * sd, axis=1))), abs=1e-4)
            uq_ = raw_q[1][:64] @ enc.P.T
            ud_ = raw_d[1] @ enc.P.T
            uq_ /= np.linalg.norm(uq_, axis=1, keepdims=True)
            ud_ /= np.linalg.norm(ud_, axis=1, keepdims=True)
            assert parts.token == pytest.approx(float((uq_ @ ud_.T).max(axis=1).sum()), abs=1e-4)
            exact = float((q.astype(np.float64) @ d.T.astype(np.float64)).max(axis=1).sum())
            assert exact == pytest.approx(fmt.constant(m, w) + fmt.beta * (
                parts.token + fmt.lambda_ * w * parts.dense), abs=1e-4)
    assert checked >= 6, "separation should hold on most pairs of the tiny model"
    assert gq.shape == (32,) and uq.shape[1] == 128


def test_heads_share_the_first_layers_and_nothing_else():
    cfg = UIBKConfig.tiny()
    # bitwise equality of an untouched head is a claim about deterministic CPU kernels
    enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, CORPUS), seed=5, device="cpu")
    model = enc.model
    assert model.n_shared == 2 and len(model.trunk.layers) == 6 and len(model.dense_layers) == 4
    texts = CORPUS[:2]

    def heads():
        out = enc._embed(texts, False)
        return np.stack([g for g, _ in out]), np.concatenate([t for _, t in out])

    gen = torch.Generator().manual_seed(0)

    def shake(w):  # a random change (a constant shift would vanish in the next LayerNorm)
        w.add_(torch.randn(w.shape, generator=gen).to(w))  # generator on CPU, w anywhere

    g0, t0 = heads()
    with torch.no_grad():
        shake(model.dense_layers[0].mlp.Wo.weight)
    g1, t1 = heads()
    assert not np.allclose(g0, g1) and np.array_equal(t0, t1)
    with torch.no_grad():
        shake(model.trunk.layers[-1].mlp.Wo.weight)
    g2, t2 = heads()
    assert np.array_equal(g1, g2) and not np.allclose(t1, t2)
    with torch.no_grad():
        shake(model.trunk.layers[0].mlp.Wo.weight)
    g3, t3 = heads()
    assert not np.allclose(g2, g3) and not np.allclose(t2, t3)


def test_param_counts_of_the_released_configuration():
    c = param_counts(UIBKConfig.released())
    assert [round(c[k] / 1e6, 1) for k in ("total", "backbone", "dense_top", "pooling_projection")] == [
        179.0, 149.0, 20.1, 9.9]
    # the formula is the real module: count the parameters of the full-size model on "meta"
    with torch.device("meta"):
        model = _build_model(UIBKConfig.released())
    assert sum(p.numel() for p in model.parameters()) == c["total"]
    assert sum(p.numel() for p in model.trunk.parameters()) == c["backbone"]
    dense = sum(p.numel() for p in [*model.dense_layers.parameters(), *model.dense_norm.parameters()])
    assert dense == c["dense_top"]
    assert sum(p.numel() for p in model.pooler.parameters()) == c["pooling"]


def test_param_counts_of_the_tiny_configuration(tiny):
    enc, _ = tiny
    assert sum(p.numel() for p in enc.model.parameters()) == param_counts(enc.uibk_config)["total"]


@pytest.mark.parametrize("name", REQUIRED_FILES)
def test_missing_file_is_named(tiny, tmp_path, name):
    _, path = tiny
    broken = shutil.copytree(path, tmp_path / "broken")
    (broken / name).unlink()
    with pytest.raises(FileNotFoundError, match=f"missing {name}"):
        UIBKEncoder.from_pretrained(broken)


def test_mismatched_shapes_are_named(tiny, tmp_path):
    _, path = tiny
    broken = shutil.copytree(path, tmp_path / "broken")
    meta = json.loads((broken / "uibk_encoder.json").read_text())
    meta["model"]["num_latents"] = 8
    (broken / "uibk_encoder.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"pooler.latents has shape \(16, 32\), the configuration "
                                         r"expects \(8, 32\)"):
        load_encoder(broken)
    broken2 = shutil.copytree(path, tmp_path / "broken2")
    cfg = json.loads((broken2 / "config.json").read_text())
    cfg["num_hidden_layers"] = 7
    cfg.pop("layer_types")
    (broken2 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing weight trunk\.layers\.6"):
        load_encoder(broken2)
    broken3 = shutil.copytree(path, tmp_path / "broken3")
    np.savez(broken3 / "projections.npz", R=np.eye(381, 16), P=np.eye(127, 128))
    with pytest.raises(ValueError, match="projection shapes"):
        load_encoder(broken3)


def test_bad_configuration_errors(tiny, tmp_path):
    _, path = tiny
    broken = shutil.copytree(path, tmp_path / "marker")
    meta = json.loads((broken / "uibk_encoder.json").read_text())
    meta["model"]["prompt_word"] = "[NOT-THERE]"
    (broken / "uibk_encoder.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"prompt_word '\[NOT-THERE\]' is not one entry"):
        load_encoder(broken)
    with pytest.raises(FileNotFoundError, match="no UIBK checkpoint folder"):
        UIBKEncoder.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="top_layers"):
        UIBKConfig.tiny(num_hidden_layers=4).__class__(backbone={"num_hidden_layers": 4}, top_layers=4)


def test_empty_and_bad_input(tiny):
    enc, _ = tiny
    assert enc.encode_documents([]) == []
    with pytest.raises(ValueError, match="empty"):
        enc.encode_documents(["fine", ""])
    with pytest.raises(TypeError, match="single string"):
        enc.encode_queries("a query")
    # a text the tokenizer reads as nothing: 3 slot rows and no token row, which stores refuse
    for lists in (enc.encode_documents(["\u200b", "\x00"]), enc.encode_queries(["\u200b"])):
        assert [x.shape for x in lists] == [(4, 128)] * len(lists)
    ExactStore().upsert(["z"], enc.encode_documents(["\u200b"]))


# -- a folder whose weights the model would not read ---------------------------------------------
def test_a_uibk_folder_without_its_config_is_refused_not_loaded_random(tiny, tmp_path):
    # with uibk_encoder.json gone, load_encoder took the folder for a plain Hugging Face model:
    # no trunk.* weight name matched, every weight was freshly initialised, silently
    _, path = tiny
    broken = shutil.copytree(path, tmp_path / "no-config")
    (broken / "uibk_encoder.json").unlink()
    with pytest.raises(ValueError, match=r"uibk_encoder\.json"):
        load_encoder(broken)


def test_a_bert_folder_loads_without_its_pooler_but_not_without_its_embeddings(tmp_path):
    from safetensors.torch import load_file, save_file

    from uibk_embedding.testing.tiny_models import SPECIAL, tiny_bert

    tiny_bert(tmp_path / "bert", [*SPECIAL, "wing", "lift", "heat"], seed=0)
    want = load_encoder(tmp_path / "bert").encode_documents(["wing lift"])
    weights = tmp_path / "bert" / "model.safetensors"
    state = load_file(str(weights))
    # the pooler is unused (mean / CLS pooling read the token states): a folder without it loads
    save_file({k: v for k, v in state.items() if "pooler" not in k}, str(weights))
    got = load_encoder(tmp_path / "bert").encode_documents(["wing lift"])
    assert got[0].tobytes() == want[0].tobytes()
    name = next(k for k in state if "word_embeddings" in k)
    save_file({k: v for k, v in state.items() if k != name}, str(weights))
    with pytest.raises(ValueError, match="word_embeddings"):
        load_encoder(tmp_path / "bert")


def test_no_forward_pass_exceeds_the_token_budget(tiny, monkeypatch):
    # batches are cut on an estimate from the characters (a third of a token each): Chinese text
    # has a token a character, so a UIBK batch ran about 3 times batch_tokens in one pass
    enc, _ = tiny
    texts = ["机翼的升力边界层传热" * (4 + i % 5) for i in range(40)]
    want = enc.encode_documents(texts)
    sizes = []
    forward = enc.model.forward

    def spy(input_ids, attention_mask):
        sizes.append(tuple(input_ids.shape))
        return forward(input_ids, attention_mask)

    monkeypatch.setattr(enc, "batch_tokens", 256)
    monkeypatch.setattr(enc.model, "forward", spy)
    got = enc.encode_documents(texts)
    assert len(sizes) > 1
    over = [(b, t) for b, t in sizes if b * t > 256 and b > 1]
    assert not over, (over, sizes)
    # batched otherwise: float32 batching noise only (docs/model.md, "Batching": under 1e-6
    # measured); 1e-4 is over 100 times that, and a wrong row or text moves whole vectors
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["uibk_encoder.json", "config.json", "model.safetensors",
                                  "tokenizer.json"])
def test_a_damaged_file_is_named(tiny, tmp_path, name):
    _, path = tiny
    broken = shutil.copytree(path, tmp_path / "damaged")
    data = (broken / name).read_bytes()
    (broken / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load_encoder(broken)
