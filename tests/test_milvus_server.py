"""The local Milvus standalone harness (uibk_embedding.testing.milvus_server): confined to loopback,
answers through the relay, and stop() leaves no process and no data behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

pytest.importorskip("milvus")
pytest.importorskip("pymilvus")

from uibk_embedding.testing.milvus_server import LocalMilvusServer, user_namespaces_available


@pytest.mark.skipif(not user_namespaces_available(), reason="unprivileged user namespaces unavailable")
def test_server_is_reachable_only_through_the_relay_and_stops_clean():
    from pymilvus import MilvusClient

    server = LocalMilvusServer()
    uri = server.start()
    try:
        base, pid = server._base, server.pid
        assert uri.startswith("http://127.0.0.1:") and pid is not None
        client = MilvusClient(uri=uri)
        assert client.list_collections() == []  # a fresh server, through the relay
        client.close()
        inner_port = int(open(os.path.join(base, "ready")).read().split()[1])
        relay_port = int(uri.rsplit(":", 1)[1])
        if inner_port != relay_port:  # the server's own port exists only in its namespace
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex(("127.0.0.1", inner_port)) != 0
    finally:
        server.stop()
    assert not _running(pid), f"the Milvus server (pid {pid}) still runs after stop()"
    assert not os.path.exists(base)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed process whose parent is gone may wait to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not user_namespaces_available(), reason="unprivileged user namespaces unavailable")
def test_a_process_that_exits_while_its_server_starts_leaves_no_server(tmp_path):
    """pytest starts the shared server in a background thread; a run that ended before the
    server was up (``pytest -k`` of a quick test) left it running for good: the watcher inside
    the namespace took the parent it watches only once the server was up, by then init."""
    import subprocess
    import sys
    import time

    code = ("import threading, time\n"
            "from uibk_embedding.testing.milvus_server import LocalMilvusServer\n"
            "s = LocalMilvusServer()\n"
            "threading.Thread(target=s.start, daemon=True).start()\n"
            "while s._proc is None: time.sleep(0.01)\n"  # the launcher runs; this process ends
            "print(s._base, flush=True)\n")
    base = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip()
    assert base

    def server_pids() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and base.encode() in (entry / "cmdline").read_bytes() \
                        and _running(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                pass
        return found

    deadline = time.monotonic() + 180  # the server finishes starting, then sees its parent gone
    while server_pids() and time.monotonic() < deadline:
        time.sleep(1)
    assert not server_pids(), f"processes of {base} still run three minutes after their parent exited"
    assert not os.path.exists(base)
