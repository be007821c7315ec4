"""The CPU encoding backends from the command line and the server: ``--encoder-backend`` reaches
the encoder that ``index`` and ``search`` run (and ``uibk-embed serve``'s), ``--revision`` reaches
the Hub resolution."""

from __future__ import annotations

import json

import numpy as np
import pytest

from uibk_embedding.apps.cli import main
from uibk_embedding.encoder import load_encoder

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

DOCS = [("d1", "the lift of a wing in a propeller slipstream"),
        ("d2", "heat transfer in a hypersonic boundary layer at Mach 3"),
        ("d3", "a sourdough bread recipe")]


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(tmp_path / "uibk-cache"))
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in DOCS))
    return path


def search(capsys, store, *flags: str) -> dict:
    argv = ["search", "wing lift in a slipstream", "--path", str(store), "--json", "-k", "3", *flags]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    out["totals"] = {h["id"]: h["decomposition"]["total"] for h in out["hits"]}
    return out


def test_index_and_search_run_the_backend_given(corpus, tmp_path, capsys):
    """A backend that changes the numbers (bfloat16 where the CPU has it, else float32 OpenVINO:
    ``onnx``, identical within float32 noise, is the control) shows which encoder each command
    ran: the index built with it scores differently from the torch index, and so does a search
    with it; ``onnx`` gives torch's scores; the export appears in the cache on first use."""
    stores = {}
    for backend in ("torch", "onnx"):
        stores[backend] = tmp_path / f"store-{backend}"
        assert main(["index", str(corpus), "--path", str(stores[backend]), "--quiet",
                     "--encoder-backend", backend]) == 0
        capsys.readouterr()
    assert [p.name.endswith("-fused.onnx") for p in (tmp_path / "uibk-cache" / "onnx").iterdir()] == [True]
    tt = search(capsys, stores["torch"])
    assert tt["encoder_backend"] == "torch"
    to = search(capsys, stores["torch"], "--encoder-backend", "onnx")
    oo = search(capsys, stores["onnx"], "--encoder-backend", "onnx")
    assert to["encoder_backend"] == oo["encoder_backend"] == "onnx"
    for run in (to, oo):
        assert run["totals"].keys() == tt["totals"].keys()
        assert max(abs(run["totals"][k] - tt["totals"][k]) for k in tt["totals"]) <= 1e-5
    from uibk_embedding.encoder.onnx_backend import native_bf16

    pytest.importorskip("openvino")
    if not native_bf16():
        pytest.skip("this CPU has no native bfloat16: openvino-bf16 runs float32, the numbers of torch")
    stores["bf16"] = tmp_path / "store-bf16"
    assert main(["index", str(corpus), "--path", str(stores["bf16"]), "--quiet",
                 "--encoder-backend", "openvino-bf16"]) == 0
    capsys.readouterr()
    bt = search(capsys, stores["bf16"])  # documents in bfloat16, the query on torch
    tb = search(capsys, stores["torch"], "--encoder-backend", "openvino-bf16")  # the reverse
    assert tb["encoder_backend"] == "openvino-bf16" and bt["encoder_backend"] == "torch"
    for run in (bt, tb):
        assert max(abs(run["totals"][k] - tt["totals"][k]) for k in tt["totals"]) > 1e-5


def test_the_flags_are_refused_where_they_do_not_apply(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit, match="applies to a Hugging Face Hub id"):
        main(["index", str(corpus), "--path", str(tmp_path / "s"), "--revision", "main"])
    with pytest.raises(SystemExit, match="--encoder-backend does not apply"):
        main(["index", str(corpus), "--path", str(tmp_path / "s"), "--encoder-url", "http://127.0.0.1:9",
              "--encoder-backend", "onnx"])
    with pytest.raises(SystemExit):
        main(["search", "wing", "--encoder-backend", "onnx-int8"])
    assert "invalid choice: 'onnx-int8'" in capsys.readouterr().err


def test_a_server_on_the_onnx_backend_serves_the_torch_lists(corpus):
    """``uibk-embed serve --encoder-backend onnx``: /health says so, and the lists it serves are the
    in-process torch lists within float32 noise (1e-5, as in-process)."""
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from uibk_embedding.encoder.remote import RemoteEncoder
    from uibk_embedding.encoder.server import serve_subprocess

    texts = [t for _, t in DOCS] + ["a", "heat " * 600]
    want_docs = load_encoder(device="cpu").encode_documents(texts)
    want_queries = load_encoder(device="cpu").encode_queries(texts)
    with serve_subprocess("--encoder-backend", "onnx", "--threads", "2") as url:
        remote = RemoteEncoder(url)
        assert remote.health()["backend"] == "onnx" and remote.health()["device"] == "cpu"
        served = (remote.encode_documents(texts), remote.encode_queries(texts))
        for got, want in zip(served, (want_docs, want_queries), strict=True):
            for a, b in zip(got, want, strict=True):
                assert a.shape == b.shape and float(np.abs(a - b).max()) <= 1e-5
