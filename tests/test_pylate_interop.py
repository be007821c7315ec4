"""PyLate itself on our PyLate export and on the PyLate-format folders of the tests (issue 60).

PyLate (1.6.0) pins ``sentence-transformers==5.3.0`` and ``transformers<=5.3.0``, so it cannot share
an environment with the package's ``colbert`` extra (sentence-transformers >= 6): these tests run
in PyLate's own environment and skip, saying why, everywhere else::

    make pylate-env                                   # .venv-pylate (Makefile)
    .venv-pylate/bin/python -m pytest -q tests/test_pylate_interop.py

What they check: ``pylate.models.ColBERT(folder, trust_remote_code=True).encode`` on a
``save_pylate`` export returns the native encoder's tagged lists (within ``SAME_BATCH`` = 1e-5,
float32 rounding); PyLate's bfloat16 cast keeps the fixed projections; PyLate's own re-save of the
export still encodes the same; the PyLate-format ColBERT folder the other tests build without
PyLate (:func:`~uibk_embedding.testing.colbert_folders.pylate_colbert`) is what PyLate writes and
loads in PyLate; and the interop benchmark runs. The sentence-transformers 6 side of each (loading
these folders without PyLate) is in tests/test_pylate_model.py and tests/test_composed.py.
"""

from __future__ import annotations

import json
import string
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pylate_models = pytest.importorskip(
    "pylate.models", reason="PyLate is not installed: it pins sentence-transformers==5.3.0, so it has "
    "its own environment (make pylate-env; benchmarks/pylate_interop.py)")

from uibk_embedding.encoder import load_encoder  # noqa: E402
from uibk_embedding.encoder.pylate_model import save_pylate  # noqa: E402
from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer  # noqa: E402
from uibk_embedding.testing.colbert_folders import pylate_colbert  # noqa: E402
from uibk_embedding.testing.tiny_models import SPECIAL, tiny_bert  # noqa: E402

SAME_BATCH = 1e-5
TEXTS = [
    "the wing lift in a slipstream",
    "heat transfer, in a boundary layer!",
    "what is the flow of heat?",
    "a",
    "lift " * 60,
    "boundary layer flow on a wing: heat transfer (of the slipstream) in 3 parts",
    "\u200b",
]


def _max_diff(a, b) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max())
               for x, y in zip(a, b, strict=True))


def _colbert(folder, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pylate_models.ColBERT(model_name_or_path=str(folder), device="cpu", **kwargs)


@pytest.fixture(scope="module")
def natives():
    cfg = UIBKConfig.tiny()
    return {"uibk": UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS * 3), seed=0, device="cpu"),
            "minilm": load_encoder(device="cpu")}


@pytest.fixture(scope="module")
def exports(natives, tmp_path_factory):
    root = tmp_path_factory.mktemp("pylate-export")
    return {name: save_pylate(enc, root / name) for name, enc in natives.items()}


@pytest.mark.parametrize("name", ["uibk", "minilm"])
@pytest.mark.parametrize("is_query", [False, True])
def test_pylate_encode_returns_the_native_tagged_lists(natives, exports, name, is_query):
    got = _colbert(exports[name], trust_remote_code=True).encode(TEXTS, is_query=is_query)
    nat = natives[name]
    want = nat.encode_queries(TEXTS, dense_weight=1.0) if is_query else nat.encode_documents(TEXTS)
    diff = _max_diff(got, want)
    print(f"{name} {'queries' if is_query else 'documents'}: PyLate encode vs native, max |diff| {diff:.2e}")
    assert diff <= SAME_BATCH


def test_a_bfloat16_cast_keeps_the_fixed_projections(exports):
    """MTEB loads the model with torch_dtype=bfloat16: the weights are cast, R and R' are not."""
    cb = _colbert(exports["uibk"], trust_remote_code=True)
    hybrid = cb[1]
    want = torch.cat([torch.zeros(1, hybrid.P.shape[1]), hybrid.P])
    cb.to(torch.bfloat16)
    assert hybrid.linear.weight.dtype == torch.bfloat16 and hybrid.R.dtype == torch.float32
    assert torch.equal(hybrid._token_weight(torch.device("cpu")), want)
    out = cb.encode(TEXTS[:2], is_query=False)
    assert all(np.isfinite(x).all() and x.shape[1] == 128 for x in out)


def test_a_model_saved_again_by_pylate_encodes_the_same(natives, exports, tmp_path):
    """ColBERT(folder).save(other): PyLate's own save of the custom modules (MTEB, fine-tuning)."""
    _colbert(exports["uibk"], trust_remote_code=True).save(str(tmp_path / "resaved"))
    again = _colbert(tmp_path / "resaved", trust_remote_code=True).encode(TEXTS, is_query=False)
    assert _max_diff(again, natives["uibk"].encode_documents(TEXTS)) <= SAME_BATCH


def test_the_pylate_format_fixture_is_what_pylate_writes(tmp_path):
    """pylate_colbert (the PyLate-format ColBERT folder the other tests build without PyLate)
    writes PyLate's own files and configuration, and PyLate loads and encodes it as its own."""
    letters = list(string.ascii_lowercase + string.digits)
    tiny_bert(tmp_path / "bert", [*SPECIAL, *string.punctuation, *letters, *(f"##{c}" for c in letters),
                                  "wing", "lift"], seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(2)
        real = tmp_path / "real"
        pylate_models.ColBERT(model_name_or_path=str(tmp_path / "bert"), device="cpu", query_length=16,
                              document_length=40).save(str(real))
    ours = pylate_colbert(tmp_path / "ours", tmp_path / "bert", seed=2, query_length=16, document_length=40)
    files = {p.relative_to(real).as_posix() for p in real.rglob("*") if p.is_file()} - {"README.md"}
    assert files == {p.relative_to(ours).as_posix() for p in ours.rglob("*") if p.is_file()}
    for name in ("modules.json", "1_Dense/config.json", "sentence_bert_config.json"):
        assert json.loads((real / name).read_text()) == json.loads((ours / name).read_text()), name
    a, b = (json.loads((f / "config_sentence_transformers.json").read_text()) for f in (real, ours))
    a.pop("__version__")
    b.pop("__version__")
    assert a == b
    mine, theirs = _colbert(ours), _colbert(real)
    for is_query in (True, False):
        ids = [mine.tokenize(TEXTS[:3], is_query=is_query)["input_ids"],
               theirs.tokenize(TEXTS[:3], is_query=is_query)["input_ids"]]
        assert torch.equal(*ids), is_query
        assert [len(x) for x in mine.encode(TEXTS[:3], is_query=is_query)] == \
            [len(x) for x in theirs.encode(TEXTS[:3], is_query=is_query)]


@pytest.mark.slow
def test_interop_benchmark_smoke(tmp_path):
    """benchmarks/pylate_interop.py on 60 NPL documents, so that it cannot rot (figures unchecked)."""
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    data = root.parent / "shared" / "datasets" / "npl"
    if not (data / "corpus.jsonl").exists():
        pytest.skip(f"no collection at {data}")
    spec = importlib.util.spec_from_file_location("pylate_interop", root / "benchmarks" / "pylate_interop.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "figures.json"
    assert bench.main(["--data", str(data), "--docs", "60", "--speed-docs", "8", "--runs", "1",
                       "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert "recall@10_vs_exact" in figures["interop_minilm"]["pylate_plaid"]
    # our PLAID is timed with its index (by default it searches exactly below 6,000,000 vectors)
    assert figures["interop_minilm"]["our_plaid"]["search"] == "index"
