"""Smoke runs of the encoder's start-up and backend benchmarks on tiny inputs, so that they cannot
rot (their figures are checked for being produced, not for speed)."""

from __future__ import annotations

import json

import pytest

from uibk_embedding.testing import load_benchmark


def test_startup_benchmark(tmp_path, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "startup.json"
    assert load_benchmark("startup").main(["--runs", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["search_wall_median_s"] > 0 and res["search_cpu_median_s"] > 0
    assert res["imports_s"] > 0 and res["heavy_modules_imported"] == []


def test_encode_backends_benchmark(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    monkeypatch.setenv("UIBK_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "backends.json"
    bench = load_benchmark("encode_backends")
    assert bench.main(["--docs", "6", "--long", "2", "--runs", "1", "--threads", "1",
                       "--backends", "onnx", "--int8", "per-channel", "--quality", "limit-small",
                       "--json", str(out), "--md", str(tmp_path / "backends.md")]) == 0
    res = json.loads(out.read_text())
    for name, texts in (("npl", 6), ("512 tokens", 2)):
        s = res["sets"][name]
        assert s["texts"] == texts and s["max_abs_difference"]["onnx"] <= 1e-5
        assert s["max_abs_difference"]["onnx-int8-per-channel"] > 1e-5  # quantized: not the same lists
        assert s["docs_per_s"]["torch"] > 0 and s["docs_per_s"]["onnx"] > 0
    q = res["quality"]["limit-small"]
    assert q["docs"] == 46 and q["queries"] == 1000
    # the same lists up to float32 noise: the same rankings but for near ties
    assert abs(q["torch"]["fused"] - q["onnx"]["fused"]) <= 0.5
    assert all(0 <= q[k][h] <= 100 for k in ("torch", "onnx", "onnx-int8-per-channel")
               for h in ("fused", "dense", "tokens"))
    assert "| onnx-int8-per-channel |" in (tmp_path / "backends.md").read_text()
