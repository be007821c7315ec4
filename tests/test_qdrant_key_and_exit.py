"""Issue #61: the Qdrant adapter takes its API key from ``$QDRANT_API_KEY`` when none is given; a
key over plain ``http://`` is one ``uibk-embed:`` line, not qdrant-client's two-line UserWarning;
a local-mode store left open at exit closes without ``Exception ignored in:
QdrantClient.__del__ ... ImportError: sys.meta_path is None``."""

from __future__ import annotations

import http.server
import subprocess
import sys
import textwrap
import threading

import pytest

pytest.importorskip("qdrant_client", reason="the qdrant extra is not installed")

from uibk_embedding.adapters.qdrant import QdrantRefused, QdrantStore
from uibk_embedding.apps.cli import main


@pytest.fixture
def recording_server():
    """An HTTP server that records each request's ``api-key`` header and refuses it (401), as a
    Qdrant server refuses a wrong key."""
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(self.headers.get("api-key"))
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_the_api_key_comes_from_the_environment_when_none_is_given(recording_server, monkeypatch):
    url, seen = recording_server
    monkeypatch.setenv("QDRANT_API_KEY", "key-from-the-environment")
    with pytest.warns(UserWarning, match="API key is sent unencrypted"):
        with pytest.raises(QdrantRefused):
            QdrantStore(url=url, max_retries=0)
    assert seen and set(seen) == {"key-from-the-environment"}
    seen.clear()
    with pytest.warns(UserWarning, match="API key is sent unencrypted"):
        with pytest.raises(QdrantRefused):  # a key given wins over the environment
            QdrantStore(url=url, api_key="key-given", max_retries=0)
    assert seen and set(seen) == {"key-given"}


def test_no_key_without_the_environment_variable(recording_server, monkeypatch):
    url, seen = recording_server
    monkeypatch.delenv("QDRANT_API_KEY", raising=False)
    with pytest.raises(QdrantRefused):
        QdrantStore(url=url, max_retries=0)
    assert seen and set(seen) == {None}


def test_a_key_over_http_is_one_line_in_the_cli(recording_server, capsys, monkeypatch):
    url, _ = recording_server
    monkeypatch.delenv("QDRANT_API_KEY", raising=False)
    with pytest.raises(SystemExit):
        main(["search", "wing", "--backend", "qdrant", "--option", f"url={url}", "--option",
              "api_key=secret-0123456789", "--option", "max_retries=0"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0] == (f"uibk-embed: the Qdrant API key is sent unencrypted to {url} (http://, not "
                        "https://): anyone on the network can read it; use an https:// url (or https=True)")
    assert lines[1:] == [f"uibk-embed: Qdrant at {url} refused collection_exists (HTTP 401): the API key "
                         "is missing or wrong; pass api_key= (uibk-embed: --option api_key=KEY) or set "
                         "QDRANT_API_KEY"]
    assert "UserWarning" not in err and "insecure connection" not in err and "secret" not in err


EXIT_SCRIPT = textwrap.dedent("""
    import sys
    import uibk_embedding as ue
    enc = ue.load_encoder()
    store = ue.open_store("qdrant", path=sys.argv[1], format=enc.format)
    store.upsert(["a", "b"], enc.encode_documents(["wing lift", "bread"]),
                 [{"text": "wing lift"}, {"text": "bread"}])
    print(store.search(enc.encode_queries(["lift"])[0], k=1)[0].id)
    # no store.close(): the interpreter exits with the local-mode store open
""")


def test_exiting_with_a_local_store_open_prints_nothing_on_stderr(tmp_path):
    script = tmp_path / "exit_open.py"
    script.write_text(EXIT_SCRIPT)
    for run in range(3):  # it printed the ImportError 2 of 2 times
        out = subprocess.run([sys.executable, str(script), str(tmp_path / f"q{run}")],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == "a", out.stderr
        assert out.stderr == "", out.stderr
        # closed, so the folder opens again (its lock released)
        with QdrantStore(path=tmp_path / f"q{run}", create=False) as store:
            assert store.count() == 2
