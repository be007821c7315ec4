"""The local Milvus standalone harness (uibk_embedding.testing.milvus_server): confined to loopback,
answers through the relay, and stop() leaves no process and no data behind."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import time
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


@pytest.mark.skipif(not user_namespaces_available(), reason="unprivileged user namespaces unavailable")
def test_requests_over_the_grpc_message_limit_are_split(tmp_path):
    """Milvus 2.3.5 refuses a gRPC message over 64 MiB with a raw RESOURCE_EXHAUSTED. Measured
    before the fix: an upsert of 80 documents of 97 tokens with 12 KB of metadata (every token
    row carries the filter JSON: 100 MB in one insert call); get() of 16 documents of 7,000
    vectors (asked for together: 76 MB), so no search of that store could ever succeed; a
    35-vector search with rows_per_vector=16384 over ids of 300 characters (185 MB)."""
    import numpy as np

    from uibk_embedding.adapters.milvus import MilvusStore
    from uibk_embedding.tagged import TaggedFormat
    from uibk_embedding.testing import make_list

    fmt, rng = TaggedFormat(), np.random.default_rng(7)
    server = LocalMilvusServer()
    uri = server.start()
    try:
        s = MilvusStore(uri=uri, collection="meta", index_type="FLAT")
        ids = [f"m{i}" for i in range(80)]
        md = [{"text": "w" * 12000, "i": i} for i in range(80)]
        s.upsert(ids, [make_list(fmt, rng, 97) for _ in ids], md)
        assert {r.id: r.metadata for r in s.get(ids)} == dict(zip(ids, md, strict=True))
        s.drop()
        s.close()

        s = MilvusStore(uri=uri, collection="long", index_type="FLAT")
        ids = [f"L{i}" for i in range(16)]
        docs = [make_list(fmt, rng, 7000) for _ in ids]
        for i in range(0, 16, 4):
            s.upsert(ids[i:i + 4], docs[i:i + 4])
        got = {r.id: r.vectors for r in s.get(ids)}
        assert sorted(got) == sorted(ids)
        for x, v in zip(ids, docs, strict=True):
            np.testing.assert_array_equal(got[x], v)
        assert s.search(docs[3][:8], k=16)[0].id == "L3"
        s.drop()
        s.close()

        # ids of 2 KB (500 four-byte characters): one query vector's 12,000 rows are 24 MB. The
        # writer knows its ids' length; another store object guesses shorter ones, asks for three
        # query vectors at once (73 MB), is refused and asks again in halves.
        s = MilvusStore(uri=uri, collection="wide", index_type="FLAT")
        ids = [f"{i:08d}" + "\U0001F600" * 500 for i in range(800)]
        s.upsert(ids, [make_list(fmt, rng, 15) for _ in ids])  # 12,000 rows
        q = make_list(fmt, rng, 8)
        want = [(h.id, h.score) for h in s.search(q, k=10, rows_per_vector=16384)]
        assert len(want) == 10 and {x for x, _ in want} <= set(ids)
        with MilvusStore(uri=uri, collection="wide", index_type="FLAT") as other:
            real, refused = other.client.search, []

            def search(*a, **kw):
                try:
                    return real(*a, **kw)
                except Exception:
                    refused.append(len(kw["data"]))
                    raise

            other.client.search = search
            assert [(h.id, h.score) for h in other.search(q, k=10, rows_per_vector=16384)] == want
            assert refused and 1 not in refused  # over the limit, then asked again in halves
        s.drop()
        s.close()
    finally:
        server.stop()


@pytest.mark.skipif(not user_namespaces_available(), reason="unprivileged user namespaces unavailable")
def test_a_dead_test_server_is_reported_with_its_logs_and_its_leases_outlast_a_stall():
    """The shared test server holds 10-minute etcd leases (a 40 s SIGSTOP, as a VM lockup of 34 s
    did to CI, killed a server on 30 s leases); one that dies anyway is not handed out again: the
    error names a folder with its logs."""
    class Own(LocalMilvusServer):  # a class of its own: the session's shared server is untouched
        _shared = None
        _died_logs = ""

    server = Own.shared()
    try:
        config = open(os.path.join(server._base, "data", "configs", "milvus.yaml")).read()
        assert re.search(r"\n  session:\n    ttl: 600 ", config)
        assert Own.shared() is server
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(2):  # the second call names the same folder
            with pytest.raises(RuntimeError, match="Milvus standalone server of this process died") as e:
                Own.shared()
            assert Own._died_logs in str(e.value)
        kept = os.listdir(Own._died_logs)
        assert "launcher.log" in kept and any(n.startswith("milvus") and ".INFO." in n for n in kept), kept
    finally:
        server.stop()
        if Own._died_logs:
            shutil.rmtree(Own._died_logs)
