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
