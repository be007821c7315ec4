"""Issue #42, the server: ``/encode`` answers JSON on ``Accept: application/json``; an
OpenAI-compatible ``POST /v1/embeddings`` (the dense sentence vector), both behind the key and the
strict body parser; and the hub-id message of ``load_encoder``."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed")
pytest.importorskip("httpx", reason="the serve extra (httpx) is not installed")

from fastapi.testclient import TestClient

from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.remote import MEDIA_TYPE, unpack_payload
from uibk_embedding.encoder.server import create_app, parse_embeddings_request
from uibk_embedding.encoder.shared import SharedEncoder
from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
from uibk_embedding.tagged import dense_vector

TEXTS = ["lift on a wing in a propeller slipstream", "laminar boundary layer transition"]
KEY = "k" * 20


@pytest.fixture(scope="module")
def local():
    cfg = UIBKConfig.tiny()
    return UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS), seed=3)


@pytest.fixture(scope="module")
def client(local):
    shared = SharedEncoder(local)
    try:
        yield TestClient(create_app(shared, api_key=KEY, max_texts=4, max_text_chars=500))
    finally:
        shared.close()


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_encode_answers_json_when_asked(client, local):
    body = {"kind": "documents", "texts": TEXTS}
    binary = client.post("/encode", json=body, headers=AUTH)
    assert binary.status_code == 200 and binary.headers["content-type"] == MEDIA_TYPE
    r = client.post("/encode", json=body, headers={**AUTH, "Accept": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json"), r.text
    got = r.json()
    assert got["kind"] == "documents" and got["dim"] == 128 and got["truncated"] == 0
    want = unpack_payload(binary.content)
    assert len(got["vectors"]) == 2
    for a, b in zip(got["vectors"], want, strict=True):
        np.testing.assert_allclose(np.asarray(a, dtype=np.float32), b, atol=1e-6)
    np.testing.assert_allclose(want[0], local.encode_documents(TEXTS[:1])[0], atol=1e-5)
    # the binary format stays the default, also when both are acceptable
    both = client.post("/encode", json=body, headers={**AUTH, "Accept": f"{MEDIA_TYPE}, application/json"})
    assert both.headers["content-type"] == MEDIA_TYPE


def test_v1_embeddings_is_the_openai_shape_with_the_dense_vector(client, local):
    r = client.post("/v1/embeddings", json={"input": TEXTS, "model": "uibk"}, headers=AUTH)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "list" and got["model"] == "uibk"
    assert [d["object"] for d in got["data"]] == ["embedding", "embedding"]
    assert [d["index"] for d in got["data"]] == [0, 1]
    tagged = local.encode_documents(TEXTS)
    for d, t in zip(got["data"], tagged, strict=True):
        v = np.asarray(d["embedding"], dtype=np.float32)
        assert v.shape == (381,) and abs(np.linalg.norm(v) - 1) < 1e-5
        np.testing.assert_allclose(v, dense_vector(t), atol=1e-5)
    assert got["usage"]["prompt_tokens"] == got["usage"]["total_tokens"] == sum(len(t) - 3 for t in tagged)
    # a single string, base64 (what the openai Python client asks for by default)
    one = client.post("/v1/embeddings", json={"input": TEXTS[0], "model": "m", "encoding_format": "base64",
                                              "user": "me", "dimensions": 381}, headers=AUTH).json()
    (d,) = one["data"]
    v = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
    np.testing.assert_allclose(v, dense_vector(tagged[0]), atol=1e-5)


def test_the_openai_python_client_reads_v1_embeddings(client, local):
    """The real ``openai`` client (its default base64 encoding, its auth header) against the
    app, through the in-process transport: what any OpenAI-client tool sees."""
    openai = pytest.importorskip("openai", reason="the openai client is a test dependency only")
    oai = openai.OpenAI(api_key=KEY, base_url="http://testserver/v1", http_client=client, max_retries=0)
    got = oai.embeddings.create(model="uibk", input=TEXTS)
    want = [dense_vector(t) for t in local.encode_documents(TEXTS)]
    assert [d.index for d in got.data] == [0, 1]
    for d, w in zip(got.data, want, strict=True):
        np.testing.assert_allclose(np.asarray(d.embedding, np.float32), w, atol=1e-5)
    bad = openai.OpenAI(api_key="wrong" * 4, base_url="http://testserver/v1", http_client=client,
                        max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(model="uibk", input=TEXTS)


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"input": [1, 2]}, 400, "input[0] must be a string"),
    ({"input": []}, 200, None),
    ({"input": "  "}, 400, "empty or whitespace"),
    ({"input": ["a"] * 5}, 413, "more than 4 texts"),
    ({"input": "a" * 501}, 200, None),  # cut to 500 characters, not refused
    ({"input": ["a" * 501]}, 200, None),
    ({"input": "a", "junk": [[[]]]}, 400, "unknown key 'junk'"),
    ({"input": "a", "encoding_format": "int8"}, 400, "'encoding_format' must be"),
    ({"input": "a", "dimensions": 64}, 400, "'dimensions' must be 381"),
    ({"input": {"a": 1}}, 400, "must be a string or a list of strings"),
    ({"model": "m"}, 400, "'input' must be"),
])
def test_v1_embeddings_refuses_bad_bodies(client, body, status, message):
    r = client.post("/v1/embeddings", content=json.dumps(body), headers=AUTH)
    assert r.status_code == status, r.text
    if message:
        assert message in r.json()["detail"]


def test_both_need_the_key(client):
    bodies = [("/v1/embeddings", {"input": "a"}), ("/encode", {"kind": "documents", "texts": ["a"]})]
    for path, body in bodies:
        r = client.post(path, json=body, headers={"Accept": "application/json"})
        assert r.status_code == 401, r.text
        r = client.post(path, json=body, headers={"Authorization": "Bearer wrong-key-wrong-key"})
        assert r.status_code == 401


def test_parse_embeddings_request_reads_strictly():
    assert parse_embeddings_request(b'{"input": ["a", "b"]}') == (["a", "b"], None, "float")
    with pytest.raises(ValueError, match="the key 'input' appears twice"):
        parse_embeddings_request(b'{"input": "a", "input": "b"}')
    with pytest.raises(ValueError, match="extra data"):
        parse_embeddings_request(b'{"input": "a"} []')


def test_a_hub_id_not_in_the_cache_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path that does not exist here
    with pytest.raises(FileNotFoundError) as e:  # Hub ids load through huggingface_hub (offline here)
        load_encoder("sentence-transformers/all-MiniLM-L6-v2", local_files_only=True,
                     cache_folder=tmp_path / "hub")
    msg = str(e.value)
    assert "is not in the Hugging Face cache" in msg
    assert "hf download sentence-transformers/all-MiniLM-L6-v2" in msg
    with pytest.raises(FileNotFoundError) as e:
        load_encoder(tmp_path / "models" / "mine")
    assert "hub id" not in str(e.value) and "no encoder at" in str(e.value)


def test_an_over_long_text_is_truncated_as_in_process_on_both_endpoints(local):
    """One behaviour for length: in-process truncates at the token limit (with a warning); the
    server cuts at max_text_chars characters, then truncates the same way; nothing is refused."""
    long_text = "wing lift " * 1500  # 15,000 characters, 3,000 tokens: past the 2,048 a document reads
    with pytest.warns(UserWarning, match="1 of 1 documents were longer than 2048 tokens"):
        want = local.encode_documents([long_text])[0]
    shared = SharedEncoder(local)
    try:
        client = TestClient(create_app(shared, max_text_chars=11_000))
        r = client.post("/encode", json={"kind": "documents", "texts": [long_text]},
                        headers={"Accept": "application/json"})
        assert r.status_code == 200, r.text
        assert r.headers["X-UIBK-Truncated"] == "1" and r.json()["truncated"] == 1
        np.testing.assert_allclose(np.asarray(r.json()["vectors"][0], dtype=np.float32), want, atol=1e-6)
        r = client.post("/v1/embeddings", json={"input": long_text})
        assert r.status_code == 200 and r.headers["X-UIBK-Truncated"] == "1", r.text
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], dense_vector(want), atol=1e-5)
    finally:
        shared.close()


def _call(app, path: str, body: bytes, accept: str,
          keep: bool) -> tuple[int, dict[str, str], bytes, int, int]:
    """One request straight through the ASGI interface (no client buffering the answer):
    ``(status, headers, body, body bytes, peak bytes traced while the server answered)``. With
    ``keep=False`` the body is counted and dropped, so the peak is the server's alone."""
    import asyncio
    import tracemalloc

    got = {"status": 0, "headers": {}, "body": [], "size": 0}
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected

    async def send(message):
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
            got["headers"] = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            got["size"] += len(message["body"])
            if keep:
                got["body"].append(message["body"])

    headers = [(b"content-type", b"application/json"), (b"accept", accept.encode()),
               (b"content-length", str(len(body)).encode())]
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    tracemalloc.start()
    try:
        asyncio.run(app(scope, receive, send))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return got["status"], got["headers"], b"".join(got["body"]), got["size"], peak


def test_a_json_answer_holds_no_more_memory_than_the_binary_one(local):
    """``Accept: application/json`` answers were built whole, on the event loop: about 10 KB of
    Python floats and strings per token vector at the peak (the documented bound is 1 KiB per
    queued vector, which max_queued_vectors counts), and the loop answered nothing (not /health)
    meanwhile. They are now written in slices, in a worker thread: the same peak as the binary
    answer (the vectors themselves), plus one slice."""
    texts = [" ".join(TEXTS * 40)] * 8  # 8 texts of about 300 tokens: some 2,500 token vectors
    body = json.dumps({"kind": "documents", "texts": texts}).encode()
    shared = SharedEncoder(local)
    try:
        app = create_app(shared)
        status, headers, content, _, _ = _call(app, "/encode", body, "application/json", keep=True)
        assert status == 200 and headers["content-type"].startswith("application/json")
        got = json.loads(content)
        want = local.encode_documents(texts)
        assert got["kind"] == "documents" and got["dim"] == 128 and got["truncated"] == 0
        for a, b in zip(got["vectors"], want, strict=True):
            np.testing.assert_allclose(np.asarray(a, dtype=np.float32), b, atol=1e-6)
        vectors = sum(len(a) for a in want)
        _, _, _, binary_size, binary_peak = _call(app, "/encode", body, MEDIA_TYPE, keep=False)
        _, _, _, json_size, json_peak = _call(app, "/encode", body, "application/json", keep=False)
    finally:
        shared.close()
    assert binary_size < vectors * 520 < 4 * vectors * 520 < json_size  # the JSON answer is larger
    # the JSON answer's peak: the vectors (as the binary answer holds them) and one slice at most
    assert json_peak < binary_peak + 2**21, (f"{json_peak / vectors:.0f} B per vector at the peak for JSON, "
                                             f"{binary_peak / vectors:.0f} for binary")
