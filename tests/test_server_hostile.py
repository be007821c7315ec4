"""benchmarks/server_hostile.py on a tiny checkpoint, small bodies and a few seconds: it runs,
samples the server's memory, and the server refuses every hostile body (none is encoded)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
from uibk_embedding.testing import load_benchmark


def test_server_hostile_smoke(tmp_path):
    bench = load_benchmark("server_hostile")
    cfg = UIBKConfig.tiny()
    enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, [bench.TEXT]), seed=1)
    folder = enc.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "hostile.json"
    result = bench.main(["--clients", "3", "--seconds", "3", "--max-requests", "4", "--body-mb", "1",
                         "--server-args", f"--encoder {folder}", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    (run,) = result["runs"]
    assert run["clients"] == 3 and run["peak_rss_mb"] >= run["idle_rss_mb"] > 0
    assert not run["stopped_at_cap"]
    answers = run["answers"]
    assert sum(answers.values()) >= 3 and set(answers) <= {"400", "429"}, answers
