"""``uibk-embed serve`` + RemoteEncoder: a real server process on a tiny checkpoint."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

httpx = pytest.importorskip("httpx", reason="the serve extra (httpx) is not installed")
pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from uibk_embedding.encoder import load_encoder  # noqa: E402
from uibk_embedding.encoder.remote import (  # noqa: E402
    MEDIA_TYPE,
    RemoteEncoder,
    RemoteEncoderError,
    ServerUnavailable,
    pack_payload,
    unpack_payload,
)
from uibk_embedding.encoder.server import serve_subprocess  # noqa: E402
from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer  # noqa: E402
from uibk_embedding.testing import batching_noise  # noqa: E402

TEXTS = [
    "lift on a wing in a propeller slipstream",
    "laminar to turbulent transition in the boundary layer of a flat plate",
    "heat transfer to a blunt body in hypersonic flow",
    "panel flutter in supersonic flow and damping",
    "oblique shock wave and laminar boundary layer interaction at high mach number",
]
MAX_TEXTS = 16
MAX_CHARS = 20_000


THREADS = "2"


@pytest.fixture(scope="module", autouse=True)
def _same_threads_as_the_servers():
    """The byte-identity tests compare an in-process encoder with server processes: both run on
    ``THREADS`` torch threads (one thread's sums differ from two threads' in the last bit, 6e-8
    on the tiny model; the full suite's worker had been left on one by another module)."""
    saved_env, saved = os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()
    os.environ["OMP_NUM_THREADS"] = THREADS  # the servers this module starts inherit it
    torch.set_num_threads(int(THREADS))
    yield
    torch.set_num_threads(saved)
    if saved_env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = saved_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    cfg = UIBKConfig.tiny()
    enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS), seed=2)
    return enc.save_pretrained(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def server(checkpoint):
    with serve_subprocess("--encoder", str(checkpoint), "--max-wait-ms", "150",
                          "--max-texts", str(MAX_TEXTS), "--max-text-chars", str(MAX_CHARS),
                          "--max-body-mb", "0.25", "--device", "cpu") as url:
        yield url


@pytest.fixture(scope="module")
def local(checkpoint):
    return load_encoder(checkpoint, device="cpu")  # the server under test runs on the CPU


def test_health_and_stats(server, checkpoint):
    with RemoteEncoder(server) as enc:
        h = enc.health()
        assert h["service"] == "uibk-embed" and h["kind"] == "uibk" and h["device"] == "cpu"
        assert h["limits"]["max_texts"] == MAX_TEXTS and h["dim"] == 128
        assert enc.model_name == checkpoint.name  # a name: /health shows no server path
        assert str(checkpoint.parent) not in json.dumps(h) and h["auth"] is False
        assert {"requests", "passes", "merged_passes", "multi_client_passes", "clients"} <= set(enc.stats())


def test_remote_is_byte_identical_to_in_process(server, local):
    with RemoteEncoder(server) as enc:
        assert enc.format == local.format and enc.dense_weight == local.dense_weight
        for a, b in zip(enc.encode_documents(TEXTS), local.encode_documents(TEXTS), strict=True):
            assert a.dtype == np.float32 and a.tobytes() == b.tobytes()
        for a, b in zip(enc.encode_queries(TEXTS, dense_weight=2.5),
                        local.encode_queries(TEXTS, dense_weight=2.5), strict=True):
            assert a.tobytes() == b.tobytes()
        # more texts than one request may hold: the client splits, the order is kept
        many = [f"{t} {i}" for i in range(3) for t in TEXTS * 2]
        assert len(many) > MAX_TEXTS
        got = enc.encode_documents(many)
    ref = local.encode_documents(many)
    assert [g.shape for g in got] == [d.shape for d in ref]
    # several requests open at once (in_flight): same lists, in the input order
    before = httpx.get(server + "/stats").json()["requests"]
    with RemoteEncoder(server, request_texts=2, in_flight=3) as enc:
        assert enc.request_texts == 2
        piped = enc.encode_documents(many)
    assert httpx.get(server + "/stats").json()["requests"] - before == -(-len(many) // 2)
    # other batches than in-process (requests of 2 texts): within the encoder's batching noise
    t = torch.get_num_threads()
    bound = 2 * batching_noise(local, many, batchings=((2, t), (MAX_TEXTS, t), (len(many), t)))
    for a, b in zip(piped, ref, strict=True):
        np.testing.assert_allclose(a, b, atol=bound, rtol=0)
    with pytest.raises(ValueError, match="in_flight"):
        RemoteEncoder(server, in_flight=0)
    with pytest.raises(ValueError, match="request_texts"):
        RemoteEncoder(server, request_texts=0)


CLIENT = textwrap.dedent("""
    import sys
    from uibk_embedding.encoder.remote import RemoteEncoder
    enc = RemoteEncoder(sys.argv[1])
    print("ready", flush=True)  # imported and set up: wait for the go (a barrier, no fixed sleep)
    assert sys.stdin.readline() == "go\\n"
    for i in range(12):
        out = enc.encode_documents([f"flow over a wing {i} {j}" for j in range(4)])
        assert len(out) == 4
    print("done")
""")


def test_two_client_processes_are_batched_by_one_server(server):
    before = httpx.get(server + "/stats").json()
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, server], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    # both clients import and set up first (each says "ready"), then both start at once
    for p in procs:
        line = p.stdout.readline()
        assert line == "ready\n", line + p.communicate(timeout=60)[0]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    after = httpx.get(server + "/stats").json()
    requests = after["requests"] - before["requests"]
    passes = after["passes"] - before["passes"]
    assert requests == 24
    assert after["clients"] >= before["clients"] + 2
    assert after["multi_client_passes"] > before["multi_client_passes"], (before, after)
    assert passes < requests, (before, after)


def test_bad_input_gives_clear_errors(server, local):
    with RemoteEncoder(server) as enc:
        assert enc.encode_documents([]) == []
        with pytest.raises(ValueError, match=r"texts\[1\] is empty"):
            enc.encode_documents(["fine", ""])
        # over-long in characters: cut and truncated as in-process, never refused (issue #42)
        very_long = "wing " * (MAX_CHARS // 4)  # 25,000 characters, 5,000 tokens
        with pytest.warns(UserWarning, match="1 of 1 documents were longer than 2048 tokens"):
            cut = enc.encode_documents([very_long])[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert cut.tobytes() == local.encode_documents([very_long])[0].tobytes()
        with pytest.raises(ValueError, match="dense_weight"):
            enc.encode_queries(["q"], dense_weight=0)
        # over-long in tokens (not in characters): truncated with a warning, as in-process
        long_doc = " ".join(TEXTS * 60)  # about 17,000 characters, 3,000 words
        with pytest.warns(UserWarning, match="longer than 2048 tokens"):
            remote = enc.encode_documents([long_doc])[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert remote.tobytes() == local.encode_documents([long_doc])[0].tobytes()
        assert remote.shape == (3 + 2044, 128)
    # the server checks on its own too (clients in other languages)
    post = lambda body: httpx.post(server + "/encode", content=body, timeout=30)  # noqa: E731
    r = post(json.dumps({"kind": "documents", "texts": ["ok", ""]}))
    assert r.status_code == 400 and "texts[1] is empty" in r.json()["detail"]
    r = post(json.dumps({"kind": "documents", "texts": ["x"] * (MAX_TEXTS + 1)}))
    assert r.status_code == 413 and f"at most {MAX_TEXTS}" in r.json()["detail"]
    r = post(json.dumps({"kind": "documents", "texts": ["x" * 19_000] * 15}))
    assert r.status_code == 413 and "exceeds the limit" in r.json()["detail"]
    r = post(b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["detail"]
    r = post(json.dumps({"kind": "passages", "texts": ["x"]}))
    assert r.status_code == 400 and "'kind'" in r.json()["detail"]
    r = post(json.dumps({"kind": "documents", "texts": "a single string"}))
    assert r.status_code == 400 and "list of strings" in r.json()["detail"]
    # a lone surrogate (JSON allows "\ud800"): 400, not the tokenizer's 500; and a request the
    # worker would have merged with it is not failed by it
    bad = post('{"kind": "documents", "texts": ["ok", "a\\ud800"]}')
    assert bad.status_code == 400 and "texts[1] is not valid Unicode" in bad.json()["detail"]
    r = httpx.post(server + "/v1/embeddings", content='{"input": "b\\udfff"}', timeout=30)
    assert r.status_code == 400 and "not valid Unicode" in r.json()["detail"]


def test_remote_takes_what_in_process_takes_and_counts_only_cut_texts(server, local):
    """A numpy or Fraction dense weight (in-process takes any real number: the client sent it
    to json.dumps and failed); a text of exactly ``max_text_chars`` characters is not counted as
    cut (it was, and the client warned), one longer is; leading whitespace past
    ``max_text_chars`` does not empty a text (the server refused it as whitespace only)."""
    from fractions import Fraction

    with RemoteEncoder(server) as enc:
        for w in (np.float32(2.0), np.int64(2), Fraction(4, 2)):
            np.testing.assert_array_equal(enc.encode_queries(["wing lift"], dense_weight=w)[0],
                                          local.encode_queries(["wing lift"], dense_weight=2.0)[0])
        at_limit = "wing" + " " * (MAX_CHARS - 4)  # MAX_CHARS characters, one word
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            enc.encode_documents([at_limit])
        assert not [w for w in caught if "truncated" in str(w.message)]
        spaced = " " * (MAX_CHARS + 10) + "wing lift"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            np.testing.assert_array_equal(enc.encode_documents([spaced])[0],
                                          local.encode_documents([spaced])[0])
    for text, counted in ((at_limit, "0"), (at_limit + "s", "1")):
        r = httpx.post(server + "/encode", content=json.dumps({"kind": "documents", "texts": [text]}),
                       timeout=30)
        assert r.status_code == 200 and r.headers["X-UIBK-Truncated"] == counted


def test_server_down_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerUnavailable, match=f"no uibk-embed server at {url}.*uibk-embed serve"):
        RemoteEncoder(url, connect_timeout=2)


class _Junk(http.server.BaseHTTPRequestHandler):
    """A real HTTP server that is not a (working) uibk-embed server."""

    health: ClassVar[dict] = {}
    payload: ClassVar[bytes] = b""

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health" and self.health:
            self._send(200, json.dumps(self.health).encode(), "application/json")
        else:
            self._send(404, b"not found", "text/plain")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(200, self.payload, MEDIA_TYPE)

    def log_message(self, *args):
        pass


@pytest.fixture
def junk_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Junk)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_garbage_answers_are_clear_errors(junk_server, server):
    srv, url = junk_server
    _Junk.health = {}
    with pytest.raises(RemoteEncoderError, match=r"HTTP 404.*is this a uibk-embed server"):
        RemoteEncoder(url)
    _Junk.health = httpx.get(server + "/health").json()  # a health report that looks right ...
    enc = RemoteEncoder(url)
    _Junk.payload = b"\x00garbage" * 10  # ... then vectors that are not
    with pytest.raises(RemoteEncoderError, match="malformed vector payload"):
        enc.encode_documents(["a wing"])
    good = pack_payload([np.ones((4, 128), np.float32)])
    _Junk.payload = good[:-4]  # one float short
    with pytest.raises(RemoteEncoderError, match="the header announces"):
        enc.encode_documents(["a wing"])
    _Junk.payload = pack_payload([np.ones((4, 128), np.float32)] * 2)
    with pytest.raises(RemoteEncoderError, match="2 lists for 1 texts"):
        enc.encode_documents(["a wing"])
    srv.shutdown()
    srv.server_close()
    with pytest.raises(ServerUnavailable):
        enc.encode_documents(["a wing"])


def test_payload_round_trip_and_corruption():
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(n, 128)).astype(np.float32) for n in (3, 0, 7)]
    back = unpack_payload(pack_payload(arrays), expected=3)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(arrays, back, strict=True))
    assert unpack_payload(pack_payload([])) == []
    bad = bytearray(pack_payload(arrays))
    bad[-4:] = np.float32(np.nan).tobytes()
    with pytest.raises(RemoteEncoderError, match="non-finite"):
        unpack_payload(bytes(bad))
    with pytest.raises(RemoteEncoderError, match="starts with"):
        unpack_payload(b"NOTUIBK!" + bytes(8))


def test_cli_delegates_serve_help():
    out = subprocess.run([sys.executable, "-m", "uibk_embedding.apps.cli", "serve", "--help"],
                         capture_output=True, text=True, timeout=120, env={**os.environ})
    assert out.returncode == 0 and "--max-text-chars" in out.stdout


# -- a server that can be exposed: API key, concurrency limit, body timeout, metrics -------------

API_KEY = "k3y-for-tests-0123456789"


@pytest.fixture(scope="module")
def guarded(checkpoint, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(API_KEY + "\n")
    with serve_subprocess("--encoder", str(checkpoint), "--device", "cpu", "--api-key-file", str(key_file),
                          "--max-concurrent-requests", "1", "--body-timeout-s", "2") as url:
        yield url


def test_api_key_is_required_everywhere_but_health(guarded, local):
    h = httpx.get(guarded + "/health").json()
    assert h["auth"] is True and h["service"] == "uibk-embed"
    body = {"kind": "documents", "texts": TEXTS[:2]}
    for method, path in (("POST", "/encode"), ("GET", "/stats"), ("GET", "/metrics")):
        for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}, {"Authorization": API_KEY}):
            r = httpx.request(method, guarded + path, json=body if method == "POST" else None,
                              headers=headers)
            assert r.status_code == 401, (path, headers, r.status_code)
            assert r.headers["www-authenticate"] == "Bearer" and "API key" in r.json()["detail"]
    # a wrong key is said to be refused (it said "needs an API key: pass ..."), and at once
    with pytest.raises(RemoteEncoderError, match=r"refused the API key \(HTTP 401; the key of api_key=\)"):
        RemoteEncoder(guarded, api_key="wrong-key-0123456789")
    with pytest.raises(RemoteEncoderError, match="needs an API key: pass"):
        RemoteEncoder(guarded, api_key="")
    with RemoteEncoder(guarded, api_key=API_KEY) as enc:
        for a, b in zip(enc.encode_documents(TEXTS), local.encode_documents(TEXTS), strict=True):
            assert a.tobytes() == b.tobytes()
    # a key read from a file ends in a newline, which no header can carry: the client strips it
    # (it raised ServerUnavailable "no uibk-embed server ... start one", the server being up)
    with RemoteEncoder(guarded, api_key=API_KEY + "\n") as enc:
        assert len(enc.encode_documents(TEXTS[:1])) == 1


def _slow_client(url: str) -> socket.socket:
    """A client that sends its headers and 10 of 1,000 promised body bytes, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n"
                 b'{"kind": "')
    return sock


def test_over_the_limit_is_429_and_a_slow_client_is_cut_at_the_body_timeout(guarded):
    slow = _slow_client(guarded)
    try:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        deadline = time.monotonic() + 10
        while True:  # the slow request holds the one place; the next one is turned away
            r = httpx.post(guarded + "/encode", json={"kind": "documents", "texts": TEXTS[:1]},
                           headers=headers)
            if r.status_code == 429 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.status_code
        t0 = time.monotonic()
        slow.settimeout(10)
        answer = slow.recv(4096).decode()
        waited = time.monotonic() - t0
        assert answer.startswith("HTTP/1.1 408"), answer[:200]
        assert waited < 5, f"the slow client was held {waited:.1f} s (body timeout 2 s)"
    finally:
        slow.close()
    # the place is free again: a normal client (which retries 429s itself) is served
    with RemoteEncoder(guarded, api_key=API_KEY) as enc:
        assert len(enc.encode_documents(TEXTS[:2])) == 2


def test_malformed_bodies_are_400_without_internals(guarded):
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    for body in (b"[" * 100_000, b"{not json", b'"a string"', b'{"kind": "documents", "texts": [1]}'):
        r = httpx.post(guarded + "/encode", content=body, headers=headers)
        assert r.status_code == 400, (body[:20], r.status_code)
        assert "Traceback" not in r.text and "File " not in r.text


def test_metrics_are_exposed_in_prometheus_format(guarded):
    with RemoteEncoder(guarded, api_key=API_KEY) as enc:
        enc.encode_documents(TEXTS)
        enc.encode_queries(TEXTS[:2])
    text = httpx.get(guarded + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line and not line.startswith("#")}
    assert values['uibk_requests_total{status="200"}'] >= 2
    assert values["uibk_texts_total"] >= len(TEXTS) + 2 and values["uibk_token_vectors_total"] > 0
    assert values["uibk_request_seconds_count"] >= 2 and values['uibk_request_seconds_bucket{le="+Inf"}'] >= 2
    assert values["uibk_pass_texts_count"] >= 1 and "uibk_encoder_queue_depth" in values
    assert values["uibk_requests_in_flight"] == 0


# -- the security review: docs pages, junk bodies held in memory, queued budgets ---------------


def test_docs_pages_are_off_and_the_schema_needs_the_key(guarded, server):
    for url in (guarded, server):  # /docs and /redoc load their scripts from a CDN: not served
        for path in ("/docs", "/redoc"):
            assert httpx.get(url + path).status_code == 404, (url, path)
    r = httpx.get(guarded + "/openapi.json")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = httpx.get(guarded + "/openapi.json", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200 and "/encode" in r.json()["paths"]
    assert httpx.get(server + "/openapi.json").status_code == 200  # no key: the schema is open


def _junk(kind: str, size: int) -> bytes:
    texts = json.dumps(TEXTS)
    if kind == "extra_key":  # valid texts, plus a key the endpoint does not take
        head = f'{{"kind": "documents", "texts": {texts}, "junk": ['.encode()
        return head + b"{}," * ((size - len(head)) // 3) + b"{}]}"
    if kind == "dict_texts":  # objects where strings are expected
        return b'{"kind": "documents", "texts": [' + b"{}," * (size // 3) + b"{}]}"
    if kind == "nested_kind":
        return b'{"texts": ' + texts.encode() + b', "kind": ' + b"[" * (size // 2) + b"]" * (size // 2) + b"}"
    raise AssertionError(kind)


@pytest.mark.parametrize(("argv", "said"), [
    (["--port", "99999"], "--port: must be at least 0 and at most 65535"),  # OverflowError traceback
    (["--threads", "-1"], "--threads: must be at least 1"),  # RuntimeError traceback
    (["--batch-tokens", "-5"], "--batch-tokens: must be at least 1"),  # accepted
    (["--idle-timeout-s", "-1"], "--idle-timeout-s: must be at least 0"),  # accepted
    (["--log-level", "foo"], "--log-level: invalid choice"),  # "not found: foo", after "listening"
])
def test_serve_options_are_checked_before_anything_loads(capsys, argv, said):
    from uibk_embedding.encoder.server import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and said in capsys.readouterr().err


def test_serve_names_a_port_in_use_before_saying_it_listens(capsys):
    import socket

    from uibk_embedding.encoder.server import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(SystemExit, match=r"cannot listen on 127\.0\.0\.1:"):
            main(["--port", str(taken.getsockname()[1])])
    assert "listening" not in capsys.readouterr().err


def test_junk_bodies_are_refused_without_building_the_junk(checkpoint):
    """Valid JSON that is not a request (an extra key, a list of {} as texts, deep nesting) is a
    400 naming the problem; the server's memory while refusing it stays near the body's size
    (json.loads built ~24 bytes of Python objects per body byte of {} and kept them alive)."""
    import tracemalloc

    from fastapi.testclient import TestClient

    from uibk_embedding.encoder.server import create_app
    from uibk_embedding.encoder.shared import SharedEncoder

    size = 4 * 2**20
    shared = SharedEncoder(load_encoder(checkpoint, device="cpu"))
    try:
        client = TestClient(create_app(shared, max_body_bytes=2 * size))
        expected = {"extra_key": "unknown key 'junk'", "dict_texts": "texts[0] must be a string",
                    "nested_kind": "'kind' must be 'documents' or 'queries'"}
        for kind, detail in expected.items():
            body = _junk(kind, size)
            tracemalloc.start()
            try:
                r = client.post("/encode", content=body, headers={"Content-Type": "application/json"})
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert r.status_code == 400, (kind, r.status_code, r.text[:200])
            assert detail in r.json()["detail"], (kind, r.json())
            assert peak < 5 * len(body), f"{kind}: {peak / 2**20:.0f} MiB traced, body {len(body) >> 20} MiB"
        r = client.post("/encode", json={"kind": "documents", "texts": TEXTS[:2], "dense_weight": None})
        assert r.status_code == 200 and len(unpack_payload(r.content, expected=2)) == 2
        r = client.post("/encode", content=b'{"kind": "documents", "texts": ["a"], "kind": "queries"}')
        assert r.status_code == 400 and "appears twice" in r.json()["detail"]
        # answered 200 with slot rows of -inf (and, as JSON, "-Infinity") before
        r = client.post("/encode", json={"kind": "queries", "texts": ["a"], "dense_weight": 1e39})
        assert r.status_code == 400 and "dense_weight must be at most" in r.json()["detail"]
    finally:
        shared.close()


@pytest.fixture(scope="module")
def budgeted(checkpoint):
    """A server whose queued budgets are small: 12 texts, 15,000 bytes (bodies of 10,240 at most),
    10,000 token vectors;
    the worker waits 1.5 s for more requests, so a request stays queued that long."""
    with serve_subprocess("--encoder", str(checkpoint), "--device", "cpu", "--max-texts", "8",
                          "--max-queued-texts", "12", "--max-body-mb", str(10_240 / 2**20),
                          "--max-queued-mb", str(15_000 / 2**20), "--max-queued-vectors", "10000",
                          "--max-wait-ms", "1500",
                          "--body-timeout-s", "3") as url:
        yield url


def test_queued_texts_and_bytes_past_the_budget_answer_429(budgeted):
    first: list[httpx.Response] = []
    t = threading.Thread(target=lambda: first.append(
        httpx.post(budgeted + "/encode", json={"kind": "documents", "texts": TEXTS[:4] * 2}, timeout=60)))
    t.start()  # 8 texts queued for 1.5 s; 8 more would pass the budget of 12
    time.sleep(0.5)
    r = httpx.post(budgeted + "/encode", json={"kind": "documents", "texts": TEXTS[:4] * 2}, timeout=60)
    t.join()
    assert first[0].status_code == 200
    assert r.status_code == 429 and r.headers["retry-after"] == "1", r.status_code
    assert "texts of queued requests" in r.json()["detail"]
    # a body on its way counts at its declared length: 10,000 of 15,000 bytes held by a slow client
    host, port = budgeted.removeprefix("http://").split(":")
    slow = socket.create_connection((host, int(port)))
    try:
        slow.sendall(b"POST /encode HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 10000\r\n\r\n" + b'{"kind": "')
        time.sleep(0.5)
        big = {"kind": "documents", "texts": ["wing " * 1200]}  # 6,000+ bytes
        r = httpx.post(budgeted + "/encode", json=big, timeout=60)
        assert r.status_code == 429 and "bytes of queued requests" in r.json()["detail"], r.status_code
        small = httpx.post(budgeted + "/encode", json={"kind": "documents", "texts": TEXTS[:1]}, timeout=60)
        assert small.status_code == 200
        slow.settimeout(10)
        assert slow.recv(4096).startswith(b"HTTP/1.1 408")  # cut at the body timeout: released
    finally:
        slow.close()
    assert httpx.post(budgeted + "/encode", json=big, timeout=60).status_code == 200
    metrics = httpx.get(budgeted + "/metrics").text
    assert "uibk_queued_bytes 0" in metrics and "uibk_queued_texts 0" in metrics


def test_token_vectors_past_the_budget_answer_429(budgeted):
    """A 512-byte token vector per character or so: the answers are bounded, not only the bodies."""
    cap = httpx.get(budgeted + "/health").json()["doc_max_length"]
    long = "wing " * 420  # 2,100 ASCII characters: counted as 3 + min(2,100, cap) vectors
    bound = 4 * (3 + min(len(long), cap))
    assert bound <= 10_000 < bound + 2 * (3 + min(len(long), cap))
    first: list[httpx.Response] = []
    t = threading.Thread(target=lambda: first.append(
        httpx.post(budgeted + "/encode", json={"kind": "documents", "texts": [long] * 4}, timeout=60)))
    t.start()  # 4 long texts queued for 1.5 s: two more would pass the budget of 10,000 vectors
    time.sleep(0.5)
    r = httpx.post(budgeted + "/encode", json={"kind": "documents", "texts": [long] * 2}, timeout=60)
    short = httpx.post(budgeted + "/encode", json={"kind": "documents", "texts": TEXTS[:1]}, timeout=60)
    t.join()
    assert r.status_code == 429 and "token vectors of queued requests" in r.json()["detail"], r.status_code
    assert short.status_code == 200 and first[0].status_code == 200
    got = unpack_payload(first[0].content, expected=4)
    assert sum(len(a) for a in got) <= bound  # the count is an upper bound of the real vectors
    metrics = httpx.get(budgeted + "/metrics").text  # released once the answers were sent
    assert "uibk_queued_vectors 0" in metrics and "uibk_queued_bytes 0" in metrics
    assert httpx.post(budgeted + "/encode", json={"kind": "documents", "texts": [long] * 2},
                      timeout=60).status_code == 200


# -- the second review: a restarted server, body sizes, counting cuts, options, keys, heads ---------


def test_a_server_restarted_with_another_model_is_an_error_not_mixed_vectors(checkpoint, tmp_path):
    """The client read the format from /health once: a server restarted on the same port with
    another model answered with its vectors, which the client returned as if of the first model
    (a store would then hold lists of two models). Every answer now says its format."""
    cfg = UIBKConfig.tiny()
    other = UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS), seed=7).save_pretrained(tmp_path / "other")
    port = free_port()
    with serve_subprocess("--encoder", str(checkpoint), "--device", "cpu", port=port) as url:
        enc = RemoteEncoder(url)
        first = enc.format
        assert len(enc.encode_documents(TEXTS[:2])) == 2
    with serve_subprocess("--encoder", str(other), "--device", "cpu", port=port):
        with pytest.raises(RemoteEncoderError) as e:
            enc.encode_documents(TEXTS[:2])
        msg = str(e.value)
        now = RemoteEncoder(url)
        assert first.projection in msg and now.format.projection in msg and "restarted" in msg, msg
        with pytest.raises(RemoteEncoderError, match="restarted"):
            enc.encode_queries(TEXTS[:1])
        # the binary and the JSON answer say it alike (and a new client reads the new model)
        body = {"kind": "documents", "texts": TEXTS[:1]}
        binary = httpx.post(url + "/encode", json=body)
        as_json = httpx.post(url + "/encode", json=body, headers={"Accept": "application/json"})
        for r in (binary, as_json):
            assert r.headers["X-UIBK-Format"] == binary.headers["X-UIBK-Format"]
            assert float(r.headers["X-UIBK-Dense-Weight"]) == now.dense_weight
        assert now.format.projection in binary.headers["X-UIBK-Format"]
        assert len(now.encode_documents(TEXTS[:2])) == 2
        now.close()
    enc.close()


def test_long_non_ascii_texts_are_sent_under_the_body_limit_not_refused(server, budgeted, checkpoint, local):
    """The client split requests by text count only and sent JSON with non-ASCII escaped (6 bytes a
    CJK character): 16 texts of 8,000 characters made a 790 KB body, and the server (0.25 MB)
    refused it with 413, although over-long texts are cut, never refused. The client now sends
    UTF-8 and splits requests by the server's body limit too."""
    texts = ["機翼の揚力 " * 1600] * MAX_TEXTS  # 8,000 characters, 25,600 bytes of UTF-8 each
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 8,000 tokens each: truncated at the document length
        want = local.encode_documents(texts[:1])[0]
        with RemoteEncoder(server) as enc:
            before = httpx.get(server + "/stats").json()["requests"]
            got = enc.encode_documents(texts)
            sent = httpx.get(server + "/stats").json()["requests"] - before
            assert enc.max_body_bytes == 2**18
    assert len(got) == MAX_TEXTS and sent == 2  # 10 texts fit in 0.25 MB, not 16
    for a in got:
        np.testing.assert_allclose(a, want, atol=1e-5, rtol=0)
    # one text larger than the whole body limit (10,240 bytes) after the server's character cut:
    # cut to fit, counted and warned about as any over-long text, as in-process
    one = "機翼の揚力" * 1000  # 5,000 characters, 15,000 bytes; the first 2,044 tokens are read
    with RemoteEncoder(budgeted) as enc:
        with pytest.warns(UserWarning, match="1 of 1 documents were longer than 2048 tokens"):
            (got,) = enc.encode_documents([one])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert got.tobytes() == local.encode_documents([one])[0].tobytes()


def test_a_text_cut_twice_is_counted_once_and_each_cut_text_is_counted(server):
    """X-UIBK-Truncated was max(texts cut at max_text_chars, texts cut at the token limit): a
    request with one text of each said 1 (and the client warned of 1 of 2)."""
    cut_by_chars = "x" * (MAX_CHARS + 100)  # one [UNK] token: under the token limit once cut
    cut_by_tokens = "wing " * 600  # 3,000 characters, 600 tokens: past the query length
    r = httpx.post(server + "/encode", json={"kind": "queries", "texts": [cut_by_chars, cut_by_tokens]},
                   timeout=60)
    assert r.status_code == 200 and r.headers["X-UIBK-Truncated"] == "2"
    r = httpx.post(server + "/encode", json={"kind": "queries", "texts": [cut_by_chars + " wing" * 600]},
                   timeout=60)
    assert r.headers["X-UIBK-Truncated"] == "1"  # cut by both: one text
    with RemoteEncoder(server) as enc, pytest.warns(UserWarning, match="2 of 2 queries"):
        enc.encode_queries([cut_by_chars, cut_by_tokens])


@pytest.mark.parametrize(("argv", "said"), [
    (["--max-wait-ms", "inf"], "--max-wait-ms: must be at least 0 and at most 60000"),  # hung every request
    (["--max-body-mb", "inf"], "--max-body-mb: must be above 0 and at most"),  # OverflowError traceback
    (["--max-queued-mb", "inf"], "--max-queued-mb: must be above 0 and at most"),  # the same
    (["--max-text-chars", "0"], "--max-text-chars: must be at least 1"),  # refused after loading
    (["--max-concurrent-requests", "0"], "--max-concurrent-requests: must be at least 1"),
    (["--max-queued-texts", "0"], "--max-queued-texts: must be at least 1"),
    (["--max-queued-vectors", "0"], "--max-queued-vectors: must be at least 1"),
])
def test_serve_sizes_are_refused_by_name_before_the_encoder_loads(capsys, argv, said):
    """Each of these passed the parser: the encoder loaded, and then the server hung, failed with
    a traceback or said a message not naming the option. With a port in use, a run that gets past
    the parser ends at "cannot listen" (the test then fails) instead of serving."""
    from uibk_embedding.encoder.server import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(SystemExit) as e:
            main([*argv, "--port", str(taken.getsockname()[1])])
    assert e.value.code == 2, e.value.code
    assert said in capsys.readouterr().err


def test_an_api_key_an_http_header_cannot_carry_is_refused_on_both_sides(server, tmp_path, capsys):
    """A non-ASCII key: the client raised a bare UnicodeEncodeError; the server took it from its
    key file, and no client could ever send it."""
    with pytest.raises(ValueError, match=r"API key .*printable ASCII"):
        RemoteEncoder(server, api_key="clé-secrète-0123456789")
    from uibk_embedding.encoder.server import create_app, main

    key_file = tmp_path / "key"
    key_file.write_text("clé-secrète-0123456789\n", encoding="utf-8")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(SystemExit) as e:
            main(["--api-key-file", str(key_file), "--port", str(taken.getsockname()[1])])
    assert "API key" in str(e.value) and "printable ASCII" in str(e.value), e.value
    with pytest.raises(ValueError, match="printable ASCII"):
        create_app(None, api_key="clé-secrète-0123456789")  # type: ignore[arg-type]


def test_a_connection_that_never_sends_a_whole_request_head_is_closed(guarded):
    """uvicorn has no timeout for a request head: a connection that sent nothing, or half a head,
    stayed open for good (each held a socket and a place in the server). They are closed after
    the body timeout (2 s here)."""
    host, port = guarded.removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)))
    half = socket.create_connection((host, int(port)))
    try:
        half.sendall(b"POST /encode HTTP/1.1\r\nHost: x\r\n")
        for sock in (silent, half):
            sock.settimeout(60)  # a bound against a hang, not a timing
            assert sock.recv(4096) == b""  # closed by the server
    finally:
        silent.close()
        half.close()
    r = httpx.get(guarded + "/health")  # the server still serves
    assert r.status_code == 200


def test_a_failed_encoder_worker_answers_500_and_health_503(checkpoint):
    """The shared encoder's worker thread died silently (with --max-wait-ms inf, say): every
    /encode waited forever while /health said 200. Its failure now reaches both."""
    from fastapi.testclient import TestClient

    from uibk_embedding.encoder.server import create_app
    from uibk_embedding.encoder.shared import SharedEncoder

    shared = SharedEncoder(load_encoder(checkpoint, device="cpu"))
    try:
        client = TestClient(create_app(shared))
        assert client.get("/health").json()["status"] == "ok"
        shared.max_wait = float("inf")  # past the constructor's check: the worker's queue.get fails
        r = client.post("/encode", json={"kind": "documents", "texts": TEXTS[:1]})
        assert r.status_code == 500 and "Traceback" not in r.text
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "failed", r.text
        assert "worker thread failed (OverflowError)" in r.json()["error"]
        r = client.post("/encode", json={"kind": "documents", "texts": TEXTS[:1]})
        assert r.status_code == 500
    finally:
        shared.close()
