"""Start-up of the embedded default: what a search imports, the plain-torch BERT against
transformers' model, the model digest cache, the seeded projections on one BLAS thread.

Timings are in benchmarks/startup.py; these tests check the causes, not the clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder import trust as trust_mod
from uibk_embedding.encoder.bert import native_bert_config
from uibk_embedding.encoder.fixed_projections import _seeded
from uibk_embedding.encoder.transformer import embedded_model_path
from uibk_embedding.encoder.trust import digest_files, model_digest
from uibk_embedding.tagged import orthonormal_rows

# libraries the embedded default's search never runs: transformers (7 s of the 8.5 s start-up
# measured before, generation utilities, scikit-learn and torch's compiler with it)
HEAVY = ("transformers", "transformers.generation", "sklearn", "torch._dynamo", "sentence_transformers")


def test_a_search_with_the_embedded_default_imports_no_heavy_library(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "the wing lift in a propeller slipstream"}) + "\n"
                      + json.dumps({"_id": "b", "text": "boundary layer transition"}) + "\n")
    store = tmp_path / "store"
    probe = """if True:
        import json, sys
        from uibk_embedding.apps.cli import main
        sys.argv = ["uibk-embed", *sys.argv[1:]]
        code = main()
        print("MODULES", json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
                                           ("transformers", "sklearn", "torch", "sentence_transformers"))))
        raise SystemExit(code)
    """
    env = {**os.environ, "UIBK_CACHE": str(tmp_path / "cache")}

    def run(*args: str) -> tuple[str, list[str]]:
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True,
                              env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES "))
        return done.stdout, json.loads(line[len("MODULES "):])

    run("index", str(corpus), "--path", str(store), "--quiet")
    out, modules = run("search", "slipstream lift", "--path", str(store))
    first = next(line for line in out.splitlines() if line.split()[:1] == ["1"])
    assert "  a  the wing lift" in first, out  # rank 1: the slipstream document
    assert "torch" in modules  # the model runs on torch
    imported = [m for m in HEAVY if m in modules]
    assert not imported, f"the embedded default's search imported {imported}"


def test_the_plain_torch_bert_gives_the_lists_transformers_gives(cranfield):
    """The embedded default (encoder/bert.py) and the same folder run by transformers'
    AutoModel + AutoTokenizer (any folder other than the embedded name takes that route):
    the same tagged lists within 1e-5, the same format identity."""
    native = load_encoder(device="cpu")
    assert native._native is not None and "transformers" not in type(native._net).__module__
    hf = load_encoder(str(embedded_model_path()), device="cpu")
    assert hf._native is None and type(hf._net).__name__ == "BertModel"
    texts = [d.full_text for d in cranfield.corpus[:12]]
    texts += ["a", "\u200b", "Ünïcödé wörds ÀND CAPITALS 3.14 — dashes", " ".join(texts) + " flutter"]
    assert native.format == hf.format and native.model_max_length == hf.model_max_length == 512
    for is_query in (False, True):
        enc = native.encode_queries if is_query else native.encode_documents
        ref = hf.encode_queries if is_query else hf.encode_documents
        with pytest.warns(UserWarning, match="truncated"):
            got = enc(texts)
        with pytest.warns(UserWarning, match="truncated"):
            want = ref(texts)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a.shape == b.shape, i
            err = float(np.abs(a - b).max())
            assert err <= 1e-5, (i, is_query, err)


def test_only_the_bert_that_the_plain_torch_encoder_reproduces_is_taken(tmp_path):
    src = embedded_model_path()
    assert native_bert_config(src) is not None
    cfg = json.loads((src / "config.json").read_text())
    for change in ({"position_embedding_type": "relative_key"}, {"hidden_act": "gelu_new"},
                   {"model_type": "roberta"}, {"auto_map": {"AutoModel": "m.M"}}, {"is_decoder": True},
                   {"architectures": ["BertForSequenceClassification"]}):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**cfg, **change}))
        for name in ("tokenizer.json", "model.safetensors"):
            (d / name).symlink_to(src / name)
        assert native_bert_config(d) is None, change


def test_the_model_digest_is_remembered_only_for_settled_files(tmp_path, monkeypatch):
    monkeypatch.setenv("UIBK_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "model.safetensors").write_bytes(b"weights-1")
    want = digest_files(folder, sorted(folder.iterdir()))
    assert model_digest(folder) == want
    entries = tmp_path / "cache" / "digests"
    # files changed less than 2 s ago could change again within the clock's tick: not remembered
    assert not entries.exists() or not list(entries.iterdir())

    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 10 * 10**9)  # ten seconds later
    assert model_digest(folder) == want
    (entry,) = entries.iterdir()
    entry.write_text("0" * 64)  # what is remembered is what is returned: the bytes are not read
    assert model_digest(folder) == "0" * 64
    # any change of a file (here its bytes and modification time) is another key: hashed again
    (folder / "model.safetensors").write_bytes(b"weights-2")
    os.utime(folder / "model.safetensors", ns=(real() - 10**9, real() - 10**9))
    assert model_digest(folder) == digest_files(folder, sorted(folder.iterdir())) != want
    # an unreadable cache is no error
    monkeypatch.setenv("UIBK_CACHE", str(folder / "config.json"))
    assert model_digest(folder) == digest_files(folder, sorted(folder.iterdir()))


def test_the_seeded_projections_on_one_blas_thread_are_the_threaded_ones():
    """The QR runs on one BLAS thread (it stalled for seconds on busy cores); the float32
    matrices, which a store's format identity hashes, are those of the threaded QR."""
    for dims, seed in (((384, 384), 0), ((768, 128), 3)):
        r, p = _seeded(*dims, seed)
        np.testing.assert_array_equal(r.astype(np.float32),
                                      orthonormal_rows(381, dims[0], seed).astype(np.float32))
        np.testing.assert_array_equal(p.astype(np.float32),
                                      orthonormal_rows(127, dims[1], seed + 1).astype(np.float32))


def test_the_embedded_default_loads_transformers_objects_only_when_asked():
    enc = load_encoder(device="cpu")
    assert enc._hf_model is None and enc._hf_tokenizer is None
    assert enc.tokenizer("wing")["input_ids"] == [101, 3358, 102]  # on demand, as before
    assert enc.model.config.hidden_size == 384
    assert trust_mod.model_digest(Path(embedded_model_path()))[:16] in enc.format.projection
