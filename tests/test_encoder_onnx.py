"""``load_encoder(backend="onnx" | "openvino" | "openvino-bf16")``: the embedded default's BERT
exported with torch.onnx, fused by onnxruntime's transformer optimizer for ONNX Runtime, compiled by
OpenVINO as it is. ``onnx`` and ``openvino`` give the torch path's tagged lists (within 1e-5) and
the same format identity (measured 2026-12-07 on this AMD EPYC: max |difference| 7.9e-7 for onnx,
9.5e-7 for openvino, at 1 and at 2 threads, on the texts of the first test: 1e-5 leaves 10x for
another CPU's kernels); ``openvino-bf16`` runs bfloat16 only where the CPU has it and keeps
nDCG@10 within 0.3 points of torch (here: LIMIT-small, every head; the other collections in
docs/loading.md); the exports are made once, deterministically. The OpenVINO tests need the
``openvino`` package (skipped without it)."""

from __future__ import annotations

import collections
import hashlib
import warnings

import numpy as np
import pytest

from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.onnx_backend import OnnxBert

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("uibk-cache")


@pytest.fixture
def encoders(cache, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(cache))
    return load_encoder(backend="onnx", num_threads=2), load_encoder(device="cpu")


def ops(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


@pytest.mark.parametrize("batch_tokens", [8192, 700])
def test_onnx_lists_are_the_torch_lists(encoders, cranfield, batch_tokens, monkeypatch):
    onnx_enc, torch_enc = encoders
    assert isinstance(onnx_enc._net, OnnxBert) and onnx_enc.format == torch_enc.format
    monkeypatch.setattr(onnx_enc, "batch_tokens", batch_tokens)
    texts = [d.full_text for d in cranfield.corpus[:20]]
    texts += ["a", "\u200b", " ".join(texts)]  # one text alone, one with no token, one cut at 512
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the truncation warning
        for is_query in (False, True):
            got = onnx_enc.encode_queries(texts) if is_query else onnx_enc.encode_documents(texts)
            want = torch_enc.encode_queries(texts) if is_query else torch_enc.encode_documents(texts)
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert a.dtype == np.float32 and a.shape == b.shape, i
                assert float(np.abs(a - b).max()) <= 1e-5, (i, is_query)


def test_the_export_is_fused_made_once_and_reused(encoders, cache, monkeypatch):
    """Every layer's attention is one fused ``Attention`` node (no ``Softmax`` left), residual +
    LayerNorm ``SkipLayerNormalization``, bias + GELU ``BiasGelu``; a second load reads the file."""
    onnx_enc, _ = encoders
    (path,) = (cache / "onnx").glob("bert-*.onnx")
    assert onnx_enc._net.path == path and onnx_enc._model_id in path.name
    found = ops(path)
    layers = onnx_enc._native.num_hidden_layers
    assert found["Attention"] == layers and found["Softmax"] == 0, found
    assert found["SkipLayerNormalization"] == 2 * layers and found["BiasGelu"] == layers, found
    stamp = path.stat().st_mtime_ns
    import uibk_embedding.encoder.onnx_backend as ob

    monkeypatch.setattr(ob, "export_bert", lambda *a, **k: pytest.fail("exported again"))
    again = load_encoder(backend="onnx")
    assert again._net.path == path and path.stat().st_mtime_ns == stamp


def test_the_exports_are_deterministic(tmp_path, monkeypatch):
    """Two exports into two empty caches are the same bytes, the fused graph for ONNX Runtime and
    the plain one for OpenVINO (standard operators only)."""
    from uibk_embedding.encoder.bert import load_bert, native_bert_config
    from uibk_embedding.encoder.onnx_backend import exported_model
    from uibk_embedding.encoder.transformer import embedded_model_path

    path = embedded_model_path()
    net = load_bert(path, native_bert_config(path))
    for backend in ("onnx", "openvino"):
        digests = []
        for name in ("a", "b"):
            monkeypatch.setenv("UIBK_CACHE", str(tmp_path / backend / name))
            digests.append(hashlib.sha256(exported_model(net, "probe", backend).read_bytes()).hexdigest())
        assert digests[0] == digests[1], backend
    plain = ops(exported_model(net, "probe", "openvino"))
    assert plain["Softmax"] == net.config.num_hidden_layers and plain["Attention"] == 0, plain


@pytest.fixture(scope="module")
def openvino():
    return pytest.importorskip("openvino")


def test_openvino_lists_are_the_torch_lists(openvino, cache, cranfield, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(cache))
    ov_enc, torch_enc = load_encoder(backend="openvino", num_threads=2), load_encoder(device="cpu")
    assert ov_enc._net.precision == "f32" and ov_enc.format == torch_enc.format
    texts = [d.full_text for d in cranfield.corpus[:20]]
    texts += ["a", "\u200b", " ".join(texts)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for is_query in (False, True):
            got = ov_enc.encode_queries(texts) if is_query else ov_enc.encode_documents(texts)
            want = torch_enc.encode_queries(texts) if is_query else torch_enc.encode_documents(texts)
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert a.dtype == np.float32 and a.shape == b.shape, i
                assert float(np.abs(a - b).max()) <= 1e-5, (i, is_query)


def test_openvino_bf16_runs_bf16_only_where_the_cpu_has_it(openvino, cache, monkeypatch):
    """bfloat16 where OpenVINO's CPU plugin lists it (avx512_bf16, AMX), float32 elsewhere: the
    compiled model's precision is the one reported."""
    from uibk_embedding.encoder.onnx_backend import native_bf16

    monkeypatch.setenv("UIBK_CACHE", str(cache))
    enc = load_encoder(backend="openvino-bf16")
    want = "bf16" if native_bf16() else "f32"
    assert enc.backend == "openvino-bf16" and enc._net.precision == want
    hint = str(enc._net.compiled.get_property("INFERENCE_PRECISION_HINT"))  # "<Type: 'bfloat16'>"
    assert {"bf16": "bfloat16", "f32": "float32"}[want] in hint, hint


def test_openvino_bf16_keeps_ndcg_within_0_3_points_on_limit_small(openvino, datasets, cache, monkeypatch):
    """The fused score, the dense head and the token head of ``openvino-bf16`` on LIMIT-small:
    nDCG@10 within 0.3 points of torch (exact MaxSim over all documents); on a CPU without native
    bfloat16 this is the float32 graph."""
    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.apps.evaluation import Encoded, head_runs, with_dense_weight
    from uibk_embedding.maxsim import maxsim_scores, pack, top_k
    from uibk_embedding.metrics import evaluate

    monkeypatch.setenv("UIBK_CACHE", str(cache))
    coll = load_beir(datasets / "limit-small")
    texts, qids = [d.full_text for d in coll.corpus], list(coll.queries)
    ndcg = {}
    for name, enc in (("torch", load_encoder(device="cpu")), ("bf16", load_encoder(backend="openvino-bf16"))):
        docs = enc.encode_documents(texts, show_progress=False)
        qs = enc.encode_queries([coll.queries[q] for q in qids], dense_weight=1.0)
        e = Encoded([d.id for d in coll.corpus], docs, qids, qs)
        runs = head_runs(e)
        mat, off = pack(docs)
        scores = maxsim_scores([with_dense_weight(q, enc.dense_weight) for q in qs], mat, off)
        runs["fused"] = {q: [e.doc_ids[j] for j in top_k(scores[i], 100)] for i, q in enumerate(qids)}
        ndcg[name] = {k: 100 * evaluate(runs[k], coll.qrels)["ndcg@10"] for k in ("fused", "dense", "tokens")}
    for head in ("fused", "dense", "tokens"):
        assert abs(ndcg["bf16"][head] - ndcg["torch"][head]) <= 0.3, (head, ndcg)


def test_what_the_cpu_backends_do_not_run(tmp_path):
    for backend in ("onnx", "openvino", "openvino-bf16"):
        with pytest.raises(ValueError, match="runs on the CPU"):
            load_encoder(backend=backend, device="cuda")
        with pytest.raises(ValueError, match="runs the embedded default only"):
            load_encoder(tmp_path, backend=backend)
    with pytest.raises(ValueError, match="must be one of 'torch', 'onnx', 'openvino', 'openvino-bf16'"):
        load_encoder(backend="onnx-int8")
