"""examples/serve_store.py under ``uvicorn --workers 2`` and ``gunicorn --preload`` (two forked
workers) beside examples/index_more.py (issue 62, docs/serving.md): one store folder, two reader
processes, one writer process.

The test builds a small exact store with the writer script, starts uvicorn with two workers on a
free 127.0.0.1 port (its own process group, always stopped), waits for ``/health``, queries until
both workers answered, runs the writer beside the service, and checks that every later search,
from either worker, finds the new document (a reader checks for newer writes before each search).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra (httpx) is not installed")
pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from uibk_embedding.adapters.exact import ExactStore  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CORPUS = {
    "wing": "lift on a wing in a propeller slipstream",
    "transition": "laminar to turbulent transition in the boundary layer of a flat plate",
    "heat": "heat transfer to a blunt body in hypersonic flow",
    "shock": "oblique shock wave and boundary layer interaction at high mach number",
    "bread": "a rye sourdough bread recipe with a long cold proof",
}
QUERIES = {"propeller slipstream lift": "wing", "hypersonic heat transfer": "heat",
           "sourdough rye bread": "bread"}
NEW_ID, NEW_TEXT, NEW_QUERY = "flutter", "flutter of thin panels in supersonic flow", "panel flutter"
STARTUP_S = 90  # two workers loading the embedded encoder on busy shared cores
RUN_S = 60

pytestmark = pytest.mark.skipif(
    "read_only" not in inspect.signature(ExactStore).parameters,
    reason="the shared opens of issue 62 (ExactStore(..., read_only=True), several processes on "
           "one folder) are not in this checkout",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def writer(*args: str, store: Path) -> str:
    """Run examples/index_more.py on ``store``; its stdout."""
    out = subprocess.run([sys.executable, str(EXAMPLES / "index_more.py"), "--store", str(store), *args],
                         capture_output=True, text=True, timeout=RUN_S)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (uvicorn and its workers), SIGKILL after 15 s."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:  # whatever is left of the group (a worker that did not stop)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=15)


def parent_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def uvicorn_command(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLES), "serve_store:app",
            "--workers", "2", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]


def gunicorn_command(port: int) -> list[str]:
    """The prefork mode of docs/serving.md: gunicorn imports the app (store, encoder) in its
    master, then forks two uvicorn workers."""
    return [sys.executable, "-m", "gunicorn", "--preload", "-k", "uvicorn.workers.UvicornWorker",
            "-w", "2", "-b", f"127.0.0.1:{port}", "--pythonpath", str(EXAMPLES), "--log-level", "warning",
            "serve_store:app"]


def start_server(store: Path, log: Path, command=uvicorn_command,
                 env_more: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """Two workers of examples/serve_store.py (uvicorn's by default) on a free port, /health
    answered; a port taken between choosing and binding it is tried again with another."""
    for _ in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "UIBK_STORE": str(store), "UIBK_TORCH_THREADS": "1", **(env_more or {})}
        env.pop("UIBK_BACKEND", None)
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                command(port), cwd=log.parent, env=env, stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        text = log.read_text(errors="replace")
        stop(proc)
        if "address already in use" not in text.lower():
            raise AssertionError(f"the server did not answer /health within {STARTUP_S} s:\n{text[-3000:]}")
    raise AssertionError("no free port after 3 tries")


def ask(url: str, q: str, k: int = 3) -> dict:
    """One search on a new connection (the kernel hands each connection to either worker)."""
    r = httpx.get(url + "/search", params={"q": q, "k": k}, timeout=30,
                  headers={"Connection": "close"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert r.headers["X-Worker-Pid"] == str(body["pid"])
    for h in body["hits"]:
        assert set(h) == {"id", "score", "relevance", "metadata"} and 0 <= h["relevance"] <= 1
    return body


def until_both_workers(url: str, queries: dict[str, str], seen: set[int] | None = None) -> set[int]:
    """Ask the queries concurrently (four at a time) until two worker processes answered, each
    answer's best hit the expected one; at most 400 requests or RUN_S seconds."""
    pids: set[int] = set() if seen is None else seen
    deadline = time.monotonic() + RUN_S
    items = list(queries.items())
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for start in range(0, 400, 8):
            batch = [items[(start + i) % len(items)] for i in range(8)]
            for (q, want), body in zip(batch, pool.map(lambda qw: ask(url, qw[0]), batch), strict=True):
                assert body["hits"] and body["hits"][0]["id"] == want, (q, body)
                pids.add(body["pid"])
            if len(pids) >= 2 or time.monotonic() > deadline:
                break
    return pids


def test_two_workers_serve_one_folder_while_a_writer_adds_a_document(tmp_path):
    store = tmp_path / "store"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t, "topic": "food" if i == "bread" else "aero"})
                              + "\n" for i, t in CORPUS.items()))
    assert "holds 5" in writer(str(corpus), store=store)  # the first store, by the same writer
    proc, url = start_server(store, tmp_path / "uvicorn.log")
    try:
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["status"] == "ok" and health["backend"] == "exact" and health["count"] == 5

        pids = until_both_workers(url, QUERIES)
        assert len(pids) == 2, f"one worker answered every request: {pids}"
        assert {parent_of(p) for p in pids} == {proc.pid}  # uvicorn's two workers, not strays
        body = ask(url, "sourdough rye bread")
        assert body["hits"][0]["metadata"] == {"topic": "food"}

        # the writer, a third process, adds a document while both workers hold the folder open and
        # answer searches (a client thread keeps asking): no search fails or sees a torn state
        answers: list[tuple[str, dict]] = []
        done = threading.Event()

        def keep_asking() -> None:
            while not done.is_set():
                q = list(QUERIES)[len(answers) % len(QUERIES)]
                answers.append((q, ask(url, q)))
                time.sleep(0.05)

        during = concurrent.futures.ThreadPoolExecutor(1)
        asking = during.submit(keep_asking)
        try:
            assert "holds 6" in writer("--id", NEW_ID, "--text", NEW_TEXT, "--metadata",
                                       '{"topic": "aero"}', store=store)
        finally:
            done.set()
            during.shutdown()
        asking.result()  # a failed search fails here
        assert answers and all(body["hits"][0]["id"] == QUERIES[q] for q, body in answers)
        assert all({h["id"] for h in body["hits"]} <= {*CORPUS, NEW_ID} for _, body in answers)
        # every search from now on, on either worker, sees it (checked before each search)
        after = until_both_workers(url, {NEW_QUERY: NEW_ID, **QUERIES})
        assert after == pids  # the same two workers, no restart
        assert httpx.get(url + "/health", timeout=10).json()["count"] == 6
        assert proc.poll() is None  # the server ran throughout
    finally:
        stop(proc)
    with ExactStore(store, read_only=True) as s:
        assert s.count() == 6 and sorted(h.id for h in s.get([NEW_ID, "wing"])) == [NEW_ID, "wing"]


def test_gunicorn_preload_workers_share_the_masters_store_and_encoder(tmp_path):
    """``gunicorn --preload`` (UIBK_PRELOAD=1): the master opens the store and loads the encoder
    before it forks two workers; each worker answers from the inherited store object (on its own
    SQLite connection: tests/test_sharing_fork.py), and a writer beside them is seen by both."""
    pytest.importorskip("gunicorn", reason="the serve extra (gunicorn) is not installed")
    store = tmp_path / "store"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t, "topic": "food" if i == "bread" else "aero"})
                              + "\n" for i, t in CORPUS.items()))
    assert "holds 5" in writer(str(corpus), store=store)
    proc, url = start_server(store, tmp_path / "gunicorn.log", gunicorn_command, {"UIBK_PRELOAD": "1"})
    try:
        pids = until_both_workers(url, QUERIES)
        assert len(pids) == 2, f"one worker answered every request: {pids}"
        assert {parent_of(p) for p in pids} == {proc.pid}  # gunicorn's master forked both
        healths = [httpx.get(url + "/health", timeout=10, headers={"Connection": "close"}).json()
                   for _ in range(6)]
        # the encoder (and the store object) were loaded by the master, not by a worker
        assert {h["loaded_by"] for h in healths} == {proc.pid}
        assert all(h["pid"] in pids and h["count"] == 5 for h in healths)
        assert "holds 6" in writer("--id", NEW_ID, "--text", NEW_TEXT, "--metadata", '{"topic": "aero"}',
                                   store=store)
        after = until_both_workers(url, {NEW_QUERY: NEW_ID, **QUERIES})
        assert after == pids  # the same two workers, no restart
        assert proc.poll() is None
    finally:
        stop(proc)
    log = (tmp_path / "gunicorn.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def test_the_app_refuses_a_missing_store_and_creates_nothing(tmp_path, monkeypatch):
    """A wrong UIBK_STORE fails the worker's start-up (no new empty store served)."""
    from fastapi.testclient import TestClient

    from uibk_embedding.errors import StoreNotFound

    monkeypatch.syspath_prepend(str(EXAMPLES))
    import serve_store

    monkeypatch.setenv("UIBK_STORE", str(tmp_path / "nowhere"))
    with pytest.raises(StoreNotFound, match="nothing was created"), TestClient(serve_store.app):
        pass
    assert not (tmp_path / "nowhere").exists()
    monkeypatch.delenv("UIBK_STORE")
    with pytest.raises(RuntimeError, match="set UIBK_STORE"), TestClient(serve_store.app):
        pass
