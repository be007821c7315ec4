"""Unreachable servers: a refused connection, or a server that accepts and never answers, gives a
clear error (naming where it tried) within the configured timeout, for every remote backend and
for the remote encoder. The black hole is a real listening socket on 127.0.0.1 that never
replies, not a mock of any backend."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from uibk_embedding.errors import BackendUnavailable

TIMEOUT = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A TCP server on loopback that accepts connections and never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def _open_qdrant(port: int):
    from uibk_embedding import open_store

    return open_store("qdrant", url=f"http://127.0.0.1:{port}", timeout=TIMEOUT, max_retries=1,
                      backoff=0.1)


def _open_milvus(port: int):
    from uibk_embedding import open_store

    return open_store("milvus", uri=f"http://127.0.0.1:{port}", timeout=TIMEOUT)


def _open_weaviate(port: int):
    from uibk_embedding import open_store

    return open_store("weaviate", url=f"http://127.0.0.1:{port}", grpc_port=_free_port(),
                      timeout=TIMEOUT)


def _open_pgvector(port: int):
    pytest.importorskip("psycopg")
    from uibk_embedding import open_store

    return open_store("pgvector", dsn=f"host=127.0.0.1 port={port} dbname=x user=x",
                      connect_timeout=TIMEOUT)


def _remote_encoder(port: int):
    from uibk_embedding.encoder.remote import RemoteEncoder

    return RemoteEncoder(f"http://127.0.0.1:{port}", timeout=TIMEOUT,
                         connect_timeout=TIMEOUT).encode_documents(["a text"])


CLIENTS = {"qdrant": _open_qdrant, "milvus": _open_milvus, "weaviate": _open_weaviate,
           "pgvector": _open_pgvector, "remote-encoder": _remote_encoder}


@pytest.mark.parametrize("mode", ["refused", "no answer"])
@pytest.mark.parametrize("name", list(CLIENTS))
def test_unreachable_server_gives_clear_error_in_time(name, mode, black_hole):
    port = _free_port() if mode == "refused" else black_hole
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable) as e:  # one type for one condition, every backend
        CLIENTS[name](port)
    elapsed = time.monotonic() - t0
    msg = str(e.value)
    assert f"127.0.0.1:{port}" in msg, f"{name}: the error does not say where it tried: {msg}"
    assert not isinstance(e.value, AssertionError | TypeError | AttributeError), msg
    # retries are allowed where safe; the whole attempt stays within a few timeouts
    assert elapsed < 6 * TIMEOUT + 5, f"{name}: {elapsed:.1f} s"
