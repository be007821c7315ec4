"""``load_encoder(backend="onnx")``: the embedded default's BERT exported with torch.onnx and run
by ONNX Runtime gives the torch path's tagged lists (within 1e-5) and the same format identity."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.onnx_backend import OnnxBert

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("uibk-cache")


@pytest.fixture
def encoders(cache, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(cache))
    return load_encoder(backend="onnx", num_threads=2), load_encoder(device="cpu")


@pytest.mark.parametrize("batch_tokens", [8192, 700])
def test_onnx_lists_are_the_torch_lists(encoders, cranfield, batch_tokens, monkeypatch):
    onnx, torch_enc = encoders
    assert isinstance(onnx._net, OnnxBert) and onnx.format == torch_enc.format
    monkeypatch.setattr(onnx, "batch_tokens", batch_tokens)
    texts = [d.full_text for d in cranfield.corpus[:20]]
    texts += ["a", "\u200b", " ".join(texts)]  # one text alone, one with no token, one cut at 512
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the truncation warning
        for is_query in (False, True):
            got = onnx.encode_queries(texts) if is_query else onnx.encode_documents(texts)
            want = torch_enc.encode_queries(texts) if is_query else torch_enc.encode_documents(texts)
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert a.dtype == np.float32 and a.shape == b.shape, i
                assert float(np.abs(a - b).max()) <= 1e-5, (i, is_query)


def test_the_export_is_made_once_and_reused(encoders, cache, monkeypatch):
    onnx, _ = encoders
    (path,) = (cache / "onnx").glob("bert-*.onnx")
    assert onnx._net.path == path and onnx._model_id in path.name
    stamp = path.stat().st_mtime_ns
    import uibk_embedding.encoder.onnx_backend as ob

    monkeypatch.setattr(ob, "export_bert", lambda *a: pytest.fail("exported again"))
    again = load_encoder(backend="onnx")
    assert again._net.path == path and path.stat().st_mtime_ns == stamp


def test_what_the_onnx_backend_does_not_run(tmp_path):
    with pytest.raises(ValueError, match="runs on the CPU"):
        load_encoder(backend="onnx", device="cuda")
    with pytest.raises(ValueError, match="backend must be 'torch' or 'onnx'"):
        load_encoder(backend="openvino")
    with pytest.raises(ValueError, match="runs the embedded default only"):
        load_encoder(tmp_path, backend="onnx")
