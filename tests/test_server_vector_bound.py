"""``uibk-embed serve`` admits a request by an upper bound of the token vectors its answer will
hold (issue #61). The bound was ``3 + min(cap, characters)`` per text, but a composed or PyLate
encoder pads queries with ``[MASK]`` to its query length and adds markers: the query ``"a"`` gave
19 rows against a bound of 4, so requests far past ``--max-queued-vectors`` were admitted.
Tiny random models (no downloads); the ColBERT one in PyLate's format
(:func:`~uibk_embedding.testing.colbert_folders.pylate_colbert`)."""

from __future__ import annotations

import string
import threading
import time
import warnings

import pytest

from uibk_embedding.encoder import load_encoder
from uibk_embedding.testing.colbert_folders import pylate_colbert
from uibk_embedding.testing.tiny_models import tiny_bert

st = pytest.importorskip("sentence_transformers", minversion="6.0",
                         reason="the colbert extra (sentence-transformers >= 6) is not installed")
import sentence_transformers.models  # noqa: E402,F401  (st.models)

httpx = pytest.importorskip("httpx", reason="the serve extra (httpx) is not installed")
pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed")

from uibk_embedding.encoder.server import serve_subprocess, vector_bound  # noqa: E402

QUERY_LENGTH = 16
TEXTS = ["a", "wing", "the lift of a wing in a slipstream", "Flügel im Propellerstrahl", "lift " * 60,
         "heat transfer, in a boundary layer!"]


@pytest.fixture(scope="module")
def composed_folder(tmp_path_factory):
    """A saved composed encoder: a CLS-pooled dense model with prompts and a PyLate ColBERT model
    (query length 16 with [MASK] padding, document length 40)."""
    root = tmp_path_factory.mktemp("bound")
    letters = list(string.ascii_lowercase + string.digits)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"[unused{i}]" for i in range(4)),
             *string.punctuation, *letters, *(f"##{c}" for c in letters), "the", "wing", "lift"]
    for name, seed in (("hf_dense", 0), ("hf_colbert", 1)):
        tiny_bert(root / name, vocab, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st.SentenceTransformer(
            modules=[st.models.Transformer(str(root / "hf_dense"), max_seq_length=64),
                     st.models.Pooling(32, pooling_mode="cls"), st.models.Normalize()],
            prompts={"query": "query: ", "document": "passage: "}, device="cpu").save(str(root / "dense"))
        pylate_colbert(root / "colbert", root / "hf_colbert", seed=2, query_length=QUERY_LENGTH,
                       document_length=40)
        enc = load_encoder(dense=root / "dense", tokens=root / "colbert", device="cpu")
    enc.save(root / "encoder")
    return root / "encoder"


def test_the_bound_holds_for_padded_queries_and_marked_documents(composed_folder):
    enc = load_encoder(composed_folder, device="cpu")
    assert len(enc.encode_queries(["a"])[0]) == 3 + QUERY_LENGTH  # the padding the old bound missed
    bound = vector_bound(enc)
    for t in TEXTS:
        assert bound([t], True) >= len(enc.encode_queries([t])[0]), t
        assert bound([t], False) >= len(enc.encode_documents([t])[0]), t


def test_requests_past_the_vector_budget_answer_429(composed_folder):
    """Ten one-letter queries answer 10 x 19 = 190 rows: a second such request while the first
    waits (1.5 s) would hold 380 > 300 and is refused; before, each counted 40 and both passed."""
    with serve_subprocess("--encoder", str(composed_folder), "--device", "cpu", "--max-wait-ms", "1500",
                          "--max-queued-vectors", "300") as url:
        body = {"kind": "queries", "texts": ["a"] * 10}
        first: list[httpx.Response] = []
        t = threading.Thread(target=lambda: first.append(httpx.post(url + "/encode", json=body, timeout=60)))
        t.start()
        time.sleep(0.5)
        second = httpx.post(url + "/encode", json=body, timeout=60)
        t.join()
        assert first[0].status_code == 200
        assert second.status_code == 429 and "token vectors" in second.json()["detail"], second.status_code
        assert httpx.post(url + "/encode", json=body, timeout=60).status_code == 200  # released


def test_the_bounds_probe_says_no_truncation():
    """The probe of the longest query is cut on purpose: ``serve`` said "1 of 1 queries were longer
    than 256 tokens and were truncated" at every start before its first request."""
    enc = load_encoder()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        bound = vector_bound(enc)
        enc.encode_queries(["a " * 600])  # a user's long query is still said
    said = [str(w.message) for w in seen if "truncated" in str(w.message)]
    assert said == ["1 of 1 queries were longer than 256 tokens and were truncated"], said
    assert bound(["a"], True) >= len(enc.encode_queries(["a"])[0])
