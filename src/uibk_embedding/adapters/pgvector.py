"""PostgreSQL + pgvector adapter: tagged multi-vectors in the database most teams already run.

PostgreSQL has no multi-vector type and pgvector no MaxSim, so the layout is one row per
document in one table (``table``):

========== ====================== ==========================================================
column     type                   holds
========== ====================== ==========================================================
id         ``text COLLATE "C"``   the document id (primary key)
seq        ``bigint``             write order (a sequence; ties in a ranking keep it, as the
                                  exact store keeps insertion order)
metadata   ``json``               the metadata exactly as given (returned by get/scan/search)
fields     ``jsonb``              the same metadata, for filters (GIN ``jsonb_path_ops`` index)
n_rows     ``integer``            vectors in the list
vectors    ``bytea``              the whole tagged list, float32 little-endian (stored
                                  uncompressed out of line)
dense      ``vector(381)``        :func:`~uibk_embedding.tagged.dense_vector`, the three
                                  slot bodies: its inner product is the dense part of MaxSim
                                  (HNSW index, ``vector_ip_ops``)
========== ====================== ==========================================================

With ``profile="float16"`` (:data:`PROFILES`) the lists are float16 and ``dense`` is
``halfvec(381)`` (``halfvec_ip_ops``; pgvector >= 0.7.0): half the bytes, scores within float16
rounding.

Search, ``exact=True`` (default): every document passing the filter is read (a server-side
cursor, in pieces) and scored with exact MaxSim, so results equal the exact store's. With
``exact=False`` the ``candidates`` documents nearest to the query's dense vector come from the
HNSW index (with pgvector >= 0.8 an iterative index scan, so a filter still yields
``candidates`` matches: filtering happens inside the index scan, never after a top-k) and are
rescored exactly (:func:`uibk_embedding.adapters.rerank.rerank_candidates`). Scores are always
exact MaxSim; only which documents are scored is approximate. A query without slot rows has no
dense vector and is answered exactly. ``exact`` and ``candidates`` can also be given per query.

Writes are transactions: one ``upsert`` (``INSERT ... ON CONFLICT DO UPDATE``) or ``delete`` is
all-or-nothing and durable when it returns (PostgreSQL's WAL); any number of store objects,
processes and hosts may write to one table at once (rows are locked in id order; a deadlock
detected by the server is retried). A write whose connection is lost is applied again only when
the server says its transaction did not commit (``pg_xact_status`` of the transaction id each
write takes first): a write whose COMMIT reply was lost is not repeated over what another
writer wrote since; an outcome the server cannot tell is :class:`BackendUnavailable`.
Filters, ``scan`` and ``delete(filter=)`` are SQL over ``fields`` with the semantics of
:func:`~uibk_embedding.adapters.filters.matches`: jsonb equality keeps types apart (``true``
is not ``1``, ``"1"`` is not ``1``; ``1`` equals ``1.0``), a missing field never matches.

The table's configuration (schema version, the tagged format) is the table's comment. An
existing table is validated (columns, types, dimensions, index metric, format) and never
altered; a server without the ``vector`` extension, or one too old, raises :class:`ServerTooOld`.

Example (needs a server; ``uibk_embedding.testing.pg_server.LocalPostgresServer`` starts one)
-------
>>> import numpy as np
>>> from uibk_embedding.testing import make_list
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> docs = [make_list(fmt, rng, n) for n in (5, 40, 9)]
>>> store = PgVectorStore("postgresql://localhost/mydb", table="papers")  # doctest: +SKIP
>>> store.upsert(["a", "b", "c"], docs, [{"lang": "en"}, {"lang": "de"}, {}])  # doctest: +SKIP
>>> [h.id for h in store.search(docs[1], k=2, filter={"lang": "de"})]  # doctest: +SKIP
['b']
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding.adapters.base import (
    MAX_K,
    BatchSearch,
    Hit,
    MultiVectorStore,
    Record,
    check_flag,
    check_positive,
    finite_score,
    record_problems,
)
from uibk_embedding.adapters.common import exact_number, parse_version
from uibk_embedding.adapters.engine_profiles import check_profile, profile_conflict
from uibk_embedding.adapters.filters import OPERATORS, SQL_RANGES, And, Node, Not, Or
from uibk_embedding.adapters.rerank import check_rerank_options, rerank_candidates
from uibk_embedding.errors import BackendUnavailable, CollectionMismatch, ServerTooOld, StoreNotFound
from uibk_embedding.maxsim import maxsim_scores, top_k
from uibk_embedding.tagged import DIM, N_SLOTS, TaggedFormat, decompose, dense_vector

SCHEMA_VERSION = 1
DENSE_DIM = N_SLOTS * (DIM - 1)  # 381
MIN_SERVER = 130000  # PostgreSQL 13, the oldest pgvector 0.5 supports
MIN_VECTOR = (0, 5, 0)  # HNSW
ITERATIVE_VECTOR = (0, 8, 0)  # hnsw.iterative_scan: filtered index scans that keep going
HALFVEC_VECTOR = (0, 7, 0)  # the halfvec type and halfvec_ip_ops
PROFILES = {"exact": "float32 lists, vector(381) dense (the default)",
            "float16": "float16 lists, halfvec(381) dense: half the bytes (vector >= 0.7.0)"}
"""``profile=``: how a table keeps its lists (``vectors``, float32 or float16 little-endian) and
its dense column (``vector`` or ``halfvec``, HNSW ``vector_ip_ops`` or ``halfvec_ip_ops``). Recorded
in the table's comment; a table without one is ``exact``. The lists are scored in float32 either way."""
DEFAULT_CANDIDATES = 100
HNSW_M = (2, 100)  # pgvector's bounds of an HNSW index's m; its ef_construction is 2 * m .. 1000
HNSW_MAX_EF_CONSTRUCTION = 1000
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")
_RETRIES = 8
_MAX_PARAMS = 65535  # bind parameters of one PostgreSQL statement
_CONTAIN_MAX = 1000  # equality values per condition also matched by containment (the GIN index)


def _psycopg():
    return require("psycopg", "pgvector", "the pgvector adapter")


def filter_sql(conditions: Sequence[Node]) -> tuple[str, list[Any]]:
    """A SQL condition over the ``fields`` jsonb column for parsed filter ``conditions``, and
    its parameters (values are parameters, never interpolated; ``"TRUE"`` for none).

    Equality is ``fields -> field = ANY(values::jsonb[])`` (jsonb equality: types never mix,
    numbers compare by value) together with a containment ``fields @> {field: value}`` for each
    value, which the GIN index answers. A range also checks ``jsonb_typeof(...) = 'number'``
    (jsonb orders every number below every bool). Every part is two-valued (``COALESCE``), so a
    missing field makes a comparison false and its negation true, as in
    :func:`~uibk_embedding.adapters.filters.matches`.

    >>> from uibk_embedding.adapters.filters import parse_filter
    >>> sql, params = filter_sql(parse_filter({"n": {"$in": [1, True]}}))
    >>> sql
    'COALESCE((fields @> %s::jsonb OR fields @> %s::jsonb) AND (fields -> %s) = ANY(%s::jsonb[]), false)'
    >>> params
    ['{"n": 1}', '{"n": true}', 'n', ['1', 'true']]
    >>> filter_sql(parse_filter({"$not": {"y": {"$gt": 2}}}))[0]
    "NOT COALESCE(jsonb_typeof(fields -> %s) = 'number' AND (fields -> %s) > %s::jsonb, false)"
    >>> filter_sql(())
    ('TRUE', [])
    """
    parts: list[str] = []
    params: list[Any] = []
    for c in conditions:
        sql, p = _node_sql(c)
        parts.append(sql)
        params += p
    if len(params) > _MAX_PARAMS - 8:  # the statement's own parameters beside the filter's
        raise ValueError(f"the filter needs {len(params)} query parameters; PostgreSQL takes at most "
                         f"{_MAX_PARAMS} in one statement: put long lists of values in one $in")
    return (" AND ".join(parts) or "TRUE"), params


_HELPERS = ("_seq", "_seq_idx", "_fields", "_dense")  # the names a store makes beside its table
_RELKINDS = {  # pg_class.relkind of what a store's name may name instead of a plain table
    "S": "a sequence (perhaps another store's)", "i": "an index (perhaps another store's)",
    "I": "a partitioned index", "v": "a view", "m": "a materialized view", "f": "a foreign table",
    "p": "a partitioned table (the store needs a plain one)", "c": "a composite type", "t": "a TOAST table"}


def _node_sql(n: Node) -> tuple[str, list[Any]]:
    if isinstance(n, And | Or):
        if not n.children:
            return ("TRUE" if isinstance(n, And) else "FALSE"), []
        subs = [_node_sql(c) for c in n.children]
        glue = " AND " if isinstance(n, And) else " OR "
        return "(" + glue.join(s for s, _ in subs) + ")", [x for _, p in subs for x in p]
    if isinstance(n, Not):
        sql, p = _node_sql(n.child)
        return f"NOT {sql}", p
    negated = n.op in ("$ne", "$nin") or (n.op == "$exists" and not n.values[0])
    if _has_nul(n.field):  # no stored key holds NUL (validate_metadata refuses it): missing
        return ("TRUE" if negated else "FALSE"), []
    if n.op == "$exists":
        sql = "COALESCE((fields -> %s) NOT IN ('null'::jsonb, '[]'::jsonb), false)"
        return (sql if n.values[0] else f"NOT {sql}"), [n.field]
    if n.op in SQL_RANGES:
        sql = (f"COALESCE(jsonb_typeof(fields -> %s) = 'number' AND (fields -> %s) {SQL_RANGES[n.op]} "
               "%s::jsonb, false)")
        return sql, [n.field, n.field, json.dumps(exact_number(n.values[0]))]
    values = [exact_number(v) for v in n.values if not _has_nul(v)]  # no stored value holds NUL
    if not values:
        return ("TRUE" if negated else "FALSE"), []
    if len(values) > _CONTAIN_MAX:  # one parameter for them all (the index would take one each)
        sql, params = "COALESCE((fields -> %s) = ANY(%s::jsonb[]), false)", []
    else:
        contain = " OR ".join(["fields @> %s::jsonb"] * len(values))
        sql = f"COALESCE(({contain}) AND (fields -> %s) = ANY(%s::jsonb[]), false)"
        params = [json.dumps({n.field: v}, ensure_ascii=False) for v in values]
    params += [n.field, [json.dumps(v, ensure_ascii=False) for v in values]]
    return (f"NOT {sql}" if negated else sql), params


def _where(dsn: str | None) -> str:
    """``host:port`` of a DSN for messages (never its password).

    >>> _where("host=127.0.0.1 port=5433 dbname=x password=secret")
    '127.0.0.1:5433'
    >>> _where("postgresql://u:pw@db.internal/app")
    'db.internal:5432'
    """
    try:
        info = _psycopg().conninfo.conninfo_to_dict(dsn or "")
    except Exception:
        return "(an unparsable DSN)"
    return f"{info.get('host') or 'localhost'}:{info.get('port') or 5432}"


def _has_nul(x: Any) -> bool:
    if isinstance(x, str):
        return "\x00" in x
    if isinstance(x, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in x.items())
    if isinstance(x, list):
        return any(_has_nul(v) for v in x)
    return False


def _to_bytes(x: np.ndarray, dtype: str = "<f4") -> bytes:
    return np.ascontiguousarray(x, dtype=dtype).tobytes()


def _from_bytes(b: bytes, n_rows: int, dtype: str = "<f4") -> np.ndarray:
    arr = np.frombuffer(b, dtype=dtype)
    if arr.size != n_rows * DIM:
        raise CollectionMismatch(f"a stored list has {arr.size} floats, expected {n_rows} x {DIM}")
    return arr.reshape(n_rows, DIM).astype(np.float32)


class PgVectorStore(BatchSearch, MultiVectorStore):
    """Tagged multi-vectors in a PostgreSQL table with pgvector (see the module docstring).

    Parameters
    ----------
    dsn: a libpq connection string or URI (``"postgresql://user@host/db"``,
        ``"host=/tmp port=5432 dbname=db"``).
    connection: an open ``psycopg.Connection`` in autocommit mode to use instead (not closed
        by :meth:`close`).
    table: the table name (lowercase letters, digits, underscores; at most 40 characters); it
        is created when missing (``create=False``: :class:`~uibk_embedding.errors.StoreNotFound`,
        nothing created, not even the ``vector`` extension), validated when present.
    exact: score every document passing the filter (default) or only HNSW candidates.
    candidates: documents taken from the dense HNSW index per query (``exact=False``), rescored
        exactly (:func:`~uibk_embedding.adapters.rerank.rerank_candidates`).
    ef_search: HNSW search breadth (default ``max(candidates, 40)``, at most 1000).

    ``exact`` and ``candidates`` are also per-query options: ``search(q, k, exact=False,
    candidates=300)`` (the HNSW breadth follows ``candidates`` unless ``ef_search`` was given).
    m, ef_construction: HNSW build parameters of a new table (pgvector's bounds: ``2 <= m <= 100``,
        ``2 * m <= ef_construction <= 1000``; past them ``ValueError`` before connecting).
    connect_timeout: seconds to wait for the server when connecting (a positive number; libpq
        takes whole seconds, at least 1).
    batch_size: documents per statement and per fetch of a scan.
    format: the tagged format; recorded with a new table and checked against an existing one.
    profile: ``"exact"`` or ``"float16"`` (:data:`PROFILES`; the exact store's other names are
        refused): what a new table keeps, or what an existing one must keep (``CollectionMismatch``
        naming both otherwise); ``None``: the table's own (new: exact). ``float16`` needs the
        ``vector`` extension >= 0.7.0 (``halfvec``): :class:`ServerTooOld` naming it otherwise.

    Example
    -------
    >>> s = PgVectorStore("host=/tmp dbname=postgres", table="uibk")  # doctest: +SKIP
    >>> s.exact, s.count()  # doctest: +SKIP
    (True, 0)
    """

    backend = "pgvector"
    exact = True
    search_options = ("exact", "candidates")  # per query, as the parameters of the same names
    filter_operators = frozenset(OPERATORS)

    def __init__(
        self,
        dsn: str | None = None,
        *,
        connection: Any = None,
        table: str = "uibk",
        exact: bool = True,
        candidates: int = DEFAULT_CANDIDATES,
        ef_search: int | None = None,
        m: int = 16,
        ef_construction: int = 64,
        connect_timeout: float = 10.0,
        batch_size: int = 256,
        format: TaggedFormat | None = None,
        create: bool = True,
        profile: str | None = None,
    ) -> None:
        super().__init__(format)
        self._asked = check_profile(profile, PROFILES, "pgvector")
        self.profile = self._asked or "exact"
        if (dsn is None) == (connection is None):
            raise TypeError("PgVectorStore takes dsn=... or connection=..., exactly one of them")
        if not isinstance(table, str) or not _NAME.match(table):
            raise ValueError(f"table name {table!r}: use lowercase letters, digits and underscores, "
                             "starting with a letter or underscore (at most 40 characters)")
        for name, v in (("candidates", candidates), ("m", m), ("ef_construction", ef_construction),
                        ("batch_size", batch_size)):
            check_positive(name, v)
        check_positive("ef_search", ef_search, allow_none=True)
        if not HNSW_M[0] <= m <= HNSW_M[1]:  # what the server refuses, refused before connecting
            raise ValueError(f"m must be between {HNSW_M[0]} and {HNSW_M[1]} (pgvector's HNSW bounds), "
                             f"got {m}")
        if not 2 * m <= ef_construction <= HNSW_MAX_EF_CONSTRUCTION:
            raise ValueError(f"ef_construction must be at least 2 * m = {2 * m} and at most "
                             f"{HNSW_MAX_EF_CONSTRUCTION} (pgvector's HNSW bounds), got {ef_construction}")
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int | float):
            raise TypeError(f"connect_timeout must be a number of seconds, got {connect_timeout!r}")
        if not 0 < connect_timeout < float("inf"):
            raise ValueError(f"connect_timeout must be a positive, finite number of seconds, "
                             f"got {connect_timeout!r}")
        self.table = table
        self.exact = check_flag("exact", exact)  # instance value: this store's guarantee
        self.candidates = candidates
        self._ef_search_given = ef_search
        self.ef_search = min(ef_search if ef_search is not None else max(candidates, 40), 1000)
        self.m, self.ef_construction = m, ef_construction
        self.batch_size = batch_size
        self._lock = threading.RLock()
        self._closed = False
        psycopg = _psycopg()
        self._sql = psycopg.sql
        if connection is not None:
            if not getattr(connection, "autocommit", False):
                raise ValueError("connection= must be in autocommit mode (psycopg.connect(..., "
                                 "autocommit=True)): the store runs its own transactions")
            if connection.row_factory is not psycopg.rows.tuple_row:
                raise ValueError(f"connection= must return tuple rows (its row_factory is "
                                 f"{getattr(connection.row_factory, '__name__', connection.row_factory)}): "
                                 "give a connection made without row_factory, or dsn=")
            self.conn, self._owns = connection, False
        else:
            self._dsn, self._timeout = dsn, connect_timeout
            self.conn, self._owns = self._connect(), True
        try:
            self.vector_version = self._check_server(create)
            self._iterative = self.vector_version >= ITERATIVE_VECTOR
            self._register_vector()
            self._open_or_create(format, create)
            self._f = "<f2" if self.profile == "float16" else "<f4"
        except BaseException:
            self.close()
            raise

    def _connect(self) -> Any:
        psycopg = _psycopg()
        try:
            return psycopg.connect(self._dsn, autocommit=True,
                                   connect_timeout=max(1, round(self._timeout)))
        except psycopg.OperationalError as e:
            raise BackendUnavailable(f"cannot connect to PostgreSQL at {_where(self._dsn)} "
                                     f"({str(e).strip()}); is the server running and the DSN right?") from e

    def _reconnect(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
        self.conn = self._connect()
        self._register_vector()

    def _register_vector(self) -> None:
        """pgvector's types on this connection. They are found by name, so the ``vector`` type
        must be on the connection's ``search_path`` (and so must its operators, which every
        search uses): :class:`ServerTooOld` naming its schema when it is not."""
        if self.conn.execute("SELECT to_regtype('vector')").fetchone()[0] is None:
            schema, path = self.conn.execute(
                "SELECT (SELECT n.nspname FROM pg_extension x JOIN pg_namespace n ON n.oid = x.extnamespace "
                "WHERE x.extname = 'vector'), current_setting('search_path')").fetchone()
            if schema is None:
                raise ServerTooOld("the vector extension is not enabled in this database (any more): run "
                                   "'CREATE EXTENSION vector' as a privileged user")
            raise ServerTooOld(
                f"the vector extension's type is in schema {schema!r}, which this connection's search_path "
                f"({path}) does not include: add {schema!r} to it (in the DSN: options='-c "
                f"search_path=...,{schema}', or ALTER ROLE ... SET search_path)")
        require("pgvector.psycopg", "pgvector", "the pgvector adapter").register_vector(self.conn)

    # -- schema ----------------------------------------------------------------------------
    def _ident(self, suffix: str = "") -> Any:
        return self._sql.Identifier(self.table + suffix)

    def _q(self, text: str, **names: str) -> Any:
        """SQL text with ``{t}`` (the table) and ``{<name>}`` (``table + suffix``) identifiers."""
        ids = {"t": self._ident(), **{k: self._ident(v) for k, v in names.items()}}
        return self._sql.SQL(text).format(**ids)

    def _check_server(self, create: bool) -> tuple[int, ...]:
        """The ``vector`` extension's version, created in this database when missing (without
        ``create`` no table of ours can exist then: :class:`StoreNotFound`)."""
        server = int(self.conn.info.server_version)
        if server < MIN_SERVER:
            raise ServerTooOld(f"PostgreSQL {server // 10000}.{server % 10000} is too old: the pgvector "
                               "adapter needs PostgreSQL >= 13 with the vector extension >= 0.5.0")
        row = self.conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        if row is None:
            avail = self.conn.execute(
                "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()
            if not create:
                raise StoreNotFound(f"no PostgreSQL table {self.table!r} at {_where(self.conn.info.dsn)}: "
                                    "the vector extension is not enabled in this database; nothing "
                                    "was created")
            if avail is None:
                raise ServerTooOld("this PostgreSQL server has no pgvector extension ('vector' is not in "
                                   "pg_available_extensions): install pgvector on the server")
            try:
                self.conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            except _psycopg().Error as e:
                if self.conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
                    pass  # another process created it at the same moment
                else:
                        raise ServerTooOld(f"the vector extension is installed on the server but not enabled "
                                       f"in this database, and enabling it failed ({str(e).strip()}): "
                                       "run 'CREATE EXTENSION vector' as a privileged user") from e
            row = self.conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        version = parse_version(row[0])
        if version < MIN_VECTOR:
            raise ServerTooOld(f"the vector extension is {row[0]}; the pgvector adapter needs >= 0.5.0 "
                               "(HNSW): ALTER EXTENSION vector UPDATE")
        return version

    def _check_halfvec(self) -> None:
        """:class:`ServerTooOld` when the float16 profile meets a ``vector`` without ``halfvec``."""
        if self.profile == "float16" and self.vector_version < HALFVEC_VECTOR:
            have = ".".join(map(str, self.vector_version))
            raise ServerTooOld(f"profile='float16' keeps halfvec columns: the vector extension is {have} "
                               "here, halfvec needs >= 0.7.0 (ALTER EXTENSION vector UPDATE), or use "
                               "profile='exact'")

    @property
    def _vec(self) -> str:
        """The dense column's pgvector type: ``vector`` or ``halfvec``."""
        return "halfvec" if self.profile == "float16" else "vector"

    def _marker(self) -> str:
        extra = {"profile": self.profile} if self.profile != "exact" else {}
        return json.dumps({"uibk": "pgvector", "schema": SCHEMA_VERSION,
                           "format": self.format.to_stored(), **extra}, sort_keys=True)

    EXPECTED: ClassVar[dict[str, str]] = {
        "id": "text", "seq": "bigint", "metadata": "json", "fields": "jsonb", "n_rows": "integer",
        "vectors": "bytea", "dense": f"vector({DENSE_DIM})"}

    def _open_or_create(self, format: TaggedFormat | None, create: bool) -> None:
        with self._lock, self.conn.transaction():
            # one creator at a time per table name (other processes and hosts)
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"uibk-pgvector:{self.table}",))
            kind = self._relkind("")
            if kind is None and not create:
                raise StoreNotFound(f"no PostgreSQL table {self.table!r} at {_where(self.conn.info.dsn)} "
                                    "(create=False); nothing was created")
            if kind is None:
                taken = [self.table + s for s in _HELPERS if self._relkind(s) is not None]
                if taken:  # another store's (table "papers" names "papers_dense") or the user's
                    raise CollectionMismatch(
                        f"PostgreSQL table {self.table!r} cannot be created: the names it needs beside it "
                        f"are taken ({', '.join(taken)}, perhaps by another store's table or index); "
                        "nothing was created: choose another table name")
                self._check_halfvec()
                self._create()
                self.created = True
            else:
                if kind != "r":
                    raise CollectionMismatch(
                        f"{self.table!r} in this PostgreSQL database is not a table: it is "
                        f"{_RELKINDS.get(kind, f'a relation of kind {kind!r}')}; it was left unchanged: "
                        "choose another table name")
                self._validate(format)
                self.created = False

    def _relkind(self, suffix: str) -> str | None:
        """The kind of relation ``table + suffix`` names (``"r"`` a table, ``"S"`` a sequence,
        ``"i"`` an index, ...), or None when nothing has that name."""
        row = self.conn.execute("SELECT relkind::text FROM pg_class WHERE oid = to_regclass(%s)",
                                (self._ident(suffix).as_string(self.conn),)).fetchone()
        return None if row is None else row[0]

    def _quoted(self) -> str:
        return self._ident().as_string(self.conn)

    def _create(self) -> None:
        ex = self.conn.execute
        ex(self._q("CREATE SEQUENCE {s}", s="_seq"))
        ex(self._q('CREATE TABLE {t} (id text COLLATE "C" PRIMARY KEY, '
                   "seq bigint NOT NULL DEFAULT nextval('{s}'), metadata json NOT NULL, "
                   "fields jsonb NOT NULL, n_rows integer NOT NULL CHECK (n_rows > 3), "
                   f"vectors bytea NOT NULL, dense {self._vec}({DENSE_DIM}) NOT NULL)", s="_seq"))
        ex(self._q("ALTER SEQUENCE {s} OWNED BY {t}.seq", s="_seq"))
        ex(self._q("ALTER TABLE {t} ALTER COLUMN vectors SET STORAGE EXTERNAL"))  # floats do not compress
        ex(self._q("CREATE INDEX {i} ON {t} (seq)", i="_seq_idx"))
        ex(self._q("CREATE INDEX {i} ON {t} USING gin (fields jsonb_path_ops)", i="_fields"))
        ex(self._sql.SQL(f"CREATE INDEX {{i}} ON {{t}} USING hnsw (dense {self._vec}_ip_ops) "
                         "WITH (m = {m}, ef_construction = {ef})").format(
            i=self._ident("_dense"), t=self._ident(), m=self._sql.Literal(self.m),
            ef=self._sql.Literal(self.ef_construction)))
        ex(self._sql.SQL("COMMENT ON TABLE {t} IS {c}").format(t=self._ident(),
                                                              c=self._sql.Literal(self._marker())))

    def _validate(self, format: TaggedFormat | None) -> None:
        problems: list[str] = []
        comment = self.conn.execute("SELECT obj_description(%s::regclass, 'pg_class')",
                                    (self._quoted(),)).fetchone()[0]
        try:
            info = json.loads(comment) if comment else None
        except ValueError:
            info = None
        self.profile = info.get("profile", "exact") if isinstance(info, dict) else "exact"
        if why := profile_conflict(self.profile, self._asked, f"PostgreSQL table {self.table!r}"):
            raise CollectionMismatch(why)
        self._check_halfvec()
        cols = dict(self.conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            (self._quoted(),)).fetchall())
        for name, typ in {**self.EXPECTED, "dense": f"{self._vec}({DENSE_DIM})"}.items():
            if name not in cols:
                problems.append(f"column {name!r} is missing")
            elif cols[name] != typ:
                problems.append(f"column {name!r} has type {cols[name]}, expected {typ}")
        saved = None
        if not problems:  # the table comment is the store's record
            saved, problems = record_problems(info, format, key="uibk", value="pgvector",
                                              schema=SCHEMA_VERSION)
        if not problems:
            opclasses = [r[0] for r in self.conn.execute(
                "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass",
                (self._quoted(),)).fetchall()]
            dense = [d for d in opclasses if "hnsw" in d and "(dense" in d]
            if dense and f"{self._vec}_ip_ops" not in dense[0]:
                problems.append(f"the dense index is not an inner-product index ({dense[0]})")
        if problems:
            raise CollectionMismatch(
                f"existing PostgreSQL table {self.table!r} does not fit this store: " + "; ".join(problems)
                + ". It was left unchanged: use another table name or drop it yourself.")
        assert saved is not None
        self.format = saved

    # -- transactions ----------------------------------------------------------------------
    def _call(self, fn: Any, *, transaction: bool = False, returns: bool = False) -> Any:
        """``fn()`` (in one transaction with ``transaction``) under the store's lock.

        Retried when the server reports a deadlock or a serialisation failure (another writer;
        nothing of the failed attempt was committed). A lost connection (server restarted,
        connection killed) is opened again (at most twice per call): a read is retried; a write
        (``transaction``) is retried only when it is known not to have committed. Each write
        transaction takes its transaction id first; after a lost connection the new connection
        asks the server for that transaction's fate (``pg_xact_status``): never started or
        aborted, the write is retried; committed (only the reply was lost), it is done and is
        not applied again (a second application could overwrite, or delete, what another writer
        wrote in between); unknown, :class:`BackendUnavailable` says the outcome is unknown. A
        committed write whose result is needed (``returns``: the count of a delete by
        filter) raises :class:`BackendUnavailable` saying it was applied."""
        psycopg = _psycopg()
        errors = psycopg.errors
        with self._lock:
            self._check_open()
            reconnects = 0
            if self._owns and (self.conn.closed or self.conn.broken):  # lost during an earlier call
                self._reconnect()
            for attempt in range(_RETRIES):
                xact: tuple[str, int] | None = None  # (transaction id, server process) of a write
                try:
                    if not transaction:
                        return fn()
                    with self.conn.transaction():
                        xid = self.conn.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
                        xact = (xid, int(self.conn.info.backend_pid))
                        return fn()
                except (errors.DeadlockDetected, errors.SerializationFailure):
                    if attempt == _RETRIES - 1:
                        raise
                    time.sleep(0.01 * 2 ** attempt)
                except psycopg.OperationalError as e:
                    if not (self.conn.closed or self.conn.broken):
                        raise  # an error of this statement on a working connection
                    lost = f"the connection to PostgreSQL was lost ({str(e).strip()})"
                    if not self._owns or reconnects >= 2:
                        if transaction and xact is not None:
                            lost += "; the write may or may not have been applied"
                        elif transaction:
                            lost += "; the write was not applied"
                        raise BackendUnavailable(lost) from e
                    try:
                        self._reconnect()
                    except BackendUnavailable as again:
                        if transaction:
                            raise BackendUnavailable(
                                f"{lost}; reconnecting failed ({again}): the write "
                                + ("may or may not have been applied" if xact is not None
                                   else "was not applied")) from e
                        raise
                    reconnects += 1
                    if xact is None:
                        continue  # a read, or a write that never began: nothing was committed
                    try:
                        status = self._xact_status(*xact)
                    except psycopg.Error:
                        status = None  # lost again while asking: unknown
                    if status == "aborted":
                        continue  # nothing of it was committed: apply it again
                    if status == "committed":
                        if not returns:
                            return None  # applied; only the reply was lost
                        raise BackendUnavailable(
                            f"{lost}; the write was applied (its transaction committed) but its "
                            "result was lost") from e
                    raise BackendUnavailable(
                        f"{lost}; the write may or may not have been applied (the server reports "
                        f"its transaction as {status or 'unknown'})") from e
            raise AssertionError("unreachable")

    def _xact_status(self, xid: str, pid: int) -> str | None:
        """The fate of transaction ``xid`` of the lost connection's server process ``pid``:
        ``'committed'``, ``'aborted'``, ``'in progress'`` (still so after waiting) or ``None``
        (unknown to the server). A server process still holding the transaction open (it has
        not noticed that its client is gone) is ended, so the transaction is decided now: it
        commits or aborts as a whole (matched by pid *and* transaction id, never another
        session's process)."""
        deadline = time.monotonic() + max(5.0, getattr(self, "_timeout", 0.0))
        xid32 = str(int(xid) % 2**32)  # pg_stat_activity.backend_xid is the 32-bit xid
        while True:
            row = self.conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
            status = row[0] if row else None
            if status != "in progress" or time.monotonic() > deadline:
                return status
            try:
                self.conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE pid = %s AND backend_xid::text = %s", (pid, xid32))
            except _psycopg().Error:
                pass  # not allowed to end it: wait for the server to notice
            time.sleep(0.02)

    def _write(self, fn: Any, *, returns: bool = False) -> Any:
        return self._call(fn, transaction=True, returns=returns)

    # -- writes ----------------------------------------------------------------------------
    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        rows = []
        for x, v, md in zip(ids, vectors, metadata, strict=True):  # no NUL: validate_metadata refused it
            text = json.dumps(md, ensure_ascii=False, allow_nan=False)  # returned as written
            fields = json.dumps({k: exact_number(w) for k, w in md.items()}, ensure_ascii=False)  # filtered
            rows.append([x, text, fields, len(v), _to_bytes(v, self._f), dense_vector(v).astype(np.float32)])
        sql = self._q("INSERT INTO {t} (seq, id, metadata, fields, n_rows, vectors, dense) "
                      f"VALUES (%s, %s, %s::json, %s::jsonb, %s, %s, %s::{self._vec}) "
                      "ON CONFLICT (id) DO UPDATE SET "
                      "seq = EXCLUDED.seq, metadata = EXCLUDED.metadata, fields = EXCLUDED.fields, "
                      "n_rows = EXCLUDED.n_rows, vectors = EXCLUDED.vectors, dense = EXCLUDED.dense")

        def run() -> None:
            # write order follows the caller's order (ties in a ranking keep it); rows are locked
            # in id order, the same in every writer, so concurrent batches do not deadlock
            seqs = self.conn.execute(self._q("SELECT nextval('{s}') FROM generate_series(1, %s)", s="_seq"),
                                     (len(rows),)).fetchall()
            ordered = sorted(([s[0], *r] for s, r in zip(seqs, rows, strict=True)),
                             key=lambda r: r[1].encode())
            with self.conn.cursor() as cur:
                for i in range(0, len(ordered), self.batch_size):
                    cur.executemany(sql, ordered[i:i + self.batch_size])

        self._write(run)

    def _delete(self, ids: list[str]) -> None:
        ordered = sorted(ids, key=str.encode)
        self._write(lambda: self.conn.execute(self._q("DELETE FROM {t} WHERE id = ANY(%s)"), (ordered,)))

    def _delete_where(self, conditions: tuple[Node, ...]) -> int:
        where, params = filter_sql(conditions)
        sql = self._q(f"DELETE FROM {{t}} WHERE {where}")
        return self._write(lambda: self.conn.execute(sql, params).rowcount, returns=True)

    # -- reads -----------------------------------------------------------------------------
    def count(self) -> int:
        return self._call(lambda: int(self.conn.execute(self._q("SELECT count(*) FROM {t}")).fetchone()[0]))

    def _scan(self, conditions: tuple[Node, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        """Keyset pages in id order, each page its own statement (no transaction held open)."""
        where, params = filter_sql(conditions)
        sql = self._q(f"SELECT id, metadata::text FROM {{t}} WHERE id > %s AND {where} ORDER BY id LIMIT %s")
        last = ""
        while True:
            page_params = [last, *params, batch_size]
            rows = self._call(lambda p=page_params: self.conn.execute(sql, p).fetchall())
            if rows:
                yield [(x, json.loads(m)) for x, m in rows]
            if len(rows) < batch_size:
                return
            last = rows[-1][0]

    def _get(self, ids: list[str]) -> list[Record]:
        sql = self._q("SELECT id, metadata::text, n_rows, vectors FROM {t} WHERE id = ANY(%s)")

        def read() -> list:
            with self.conn.cursor(binary=True) as cur:
                return cur.execute(sql, (ids,)).fetchall()

        return [Record(x, _from_bytes(v, n, self._f), json.loads(m)) for x, m, n, v in self._call(read)]

    def _search_batch(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
                      exact: bool | None = None, candidates: int | None = None,
                      explain: bool = False) -> list[list[Hit]]:
        """``explain``: both paths decompose the hits from the lists the search read."""
        exact, pool, ef = self._search_params(exact, candidates)
        return self._call(lambda: self._search_all(queries, k, conditions, exact, pool, ef, explain))

    def _search_params(self, exact: bool | None, candidates: int | None) -> tuple[bool, int, int]:
        """``(exact, pool, ef_search)`` of one search: the per-query options over the store's."""
        exact = self.exact if exact is None else check_flag("exact", exact)
        if candidates is None:
            return exact, self.candidates, self.ef_search
        pool = check_rerank_options(candidates=candidates)[1]
        return exact, pool, min(self._ef_search_given if self._ef_search_given is not None else max(pool, 40),
                                1000)

    def _search_all(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
                    exact: bool, candidates: int, ef_search: int, explain: bool = False) -> list[list[Hit]]:
        out: dict[int, list[Hit]] = {}
        for i, q in enumerate(queries):
            if not exact and q[0, 0] < 0:  # a dense vector to find candidates with
                out[i] = self._search_candidates(q, k, conditions, candidates, ef_search, explain)
        rest = [i for i in range(len(queries)) if i not in out]
        if rest:  # exact mode, or token-only queries: one scan for all of them
            for i, hits in zip(rest, self._search_exact([queries[i] for i in rest], k, conditions, explain),
                               strict=True):
                out[i] = hits
        return [out[i] for i in range(len(queries))]

    def _search_exact(self, queries: list[np.ndarray], k: int, conditions: tuple[Node, ...],
                      explain: bool = False) -> list[list[Hit]]:
        """Every document passing the filter, in write order, scored in pieces (float32, as the
        exact store scores); a running top-k per query (earlier documents first, so ties keep
        write order as the exact store does). One snapshot (REPEATABLE READ) for the scan and
        the winners' metadata; lists arrive as raw bytes (a binary cursor). ``explain``: the
        winners' lists are kept from the scan and decomposed (no second read)."""
        where, params = filter_sql(conditions)
        best: list[tuple[np.ndarray, list[str]]] = [(np.zeros(0, np.float32), []) for _ in queries]
        kept: dict[str, bytes] = {}  # with explain: the lists of the winners so far
        with self.conn.transaction():
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            with self.conn.cursor(name=f"uibk_scan_{id(self)}", binary=True) as cur:
                cur.execute(self._q(f"SELECT id, vectors FROM {{t}} WHERE {where} ORDER BY seq"), params)
                while rows := cur.fetchmany(self.batch_size):
                    width = int(self._f[-1]) * DIM
                    lengths = np.fromiter((len(v) // width for _, v in rows), np.int64, len(rows))
                    mat = np.frombuffer(b"".join(v for _, v in rows), dtype=self._f).reshape(-1, DIM)
                    mat = mat.astype(np.float32, copy=False)
                    off = np.concatenate([[0], np.cumsum(lengths)])
                    scores = maxsim_scores(queries, mat, off)
                    chunk = [x for x, _ in rows]
                    for qi, row in enumerate(scores):
                        s0, ids0 = best[qi]
                        pool = np.concatenate([s0, row])
                        keep = top_k(pool, k)
                        ids = ids0 + chunk
                        best[qi] = (pool[keep], [ids[j] for j in keep])
                    if explain:
                        kept.update(rows)
                        kept = {x: kept[x] for _, winners in best for x in winners}
            winners = list(dict.fromkeys(x for _, ids in best for x in ids))
            meta = dict(self.conn.execute(self._q("SELECT id, metadata::text FROM {t} WHERE id = ANY(%s)"),
                                          (winners,)).fetchall()) if winners else {}
        hits = [[Hit(x, finite_score(sc), json.loads(meta[x])) for sc, x in zip(*b, strict=True)]
                for b in best]
        for q, row in zip(queries, hits if explain else [], strict=False):
            for h in row:
                v = kept[h.id]
                n = len(v) // (int(self._f[-1]) * DIM)
                h.decomposition = decompose(q, _from_bytes(v, n, self._f), self.format)
        return hits

    def _search_candidates(self, q: np.ndarray, k: int, conditions: tuple[Node, ...],
                           candidates: int, ef_search: int, explain: bool = False) -> list[Hit]:
        """The dense HNSW index's ``max(candidates, k)`` nearest documents, rescored exactly
        (``explain``: each hit decomposed from the list fetched with it)."""
        where, params = filter_sql(conditions)
        limit = max(candidates, k)
        # without iterative scans the index returns at most ef_search rows: widen it to the limit
        ef = ef_search if self._iterative else min(1000, max(ef_search, limit))
        with self.conn.transaction():
            self.conn.execute(self._sql.SQL("SET LOCAL hnsw.ef_search = {}").format(self._sql.Literal(ef)))
            if self._iterative:
                self.conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
                self.conn.execute(self._sql.SQL("SET LOCAL hnsw.max_scan_tuples = {}").format(
                    self._sql.Literal(min(MAX_K, max(20000, 20 * limit)))))
            with self.conn.cursor(binary=True) as cur:
                rows = cur.execute(
                    self._q(f"SELECT id, metadata::text, n_rows, vectors FROM {{t}} WHERE {where} "
                            f"ORDER BY dense <#> %s::{self._vec} LIMIT %s"),
                    [*params, dense_vector(q).astype(np.float32), limit + 1]).fetchall()
        if len(rows) <= limit:
            # no more than asked (one more was asked for): a table or filtered subset no larger
            # than the budget, an iterative scan that reached hnsw.max_scan_tuples, or pgvector < 0.8
            # filtering after its index scan; the subset is scored exactly (never a short,
            # post-filtered top-k, and a budget covering every document gives the exact answer)
            return self._search_exact([q], k, conditions, explain)[0]
        rows = rows[:limit]
        # the candidates came with their lists: the rerank's fetch is a lookup, in one piece
        stored = {x: (_from_bytes(v, n, self._f), json.loads(m)) for x, m, n, v in rows}
        return rerank_candidates(q, [(r[0], None) for r in rows], lambda ids: {x: stored[x] for x in ids}, k,
                                 first=len(rows), explain=self.format if explain else None)

    # -- maintenance -----------------------------------------------------------------------
    def size_bytes(self) -> int:
        """Bytes the table takes on the server: rows, TOAST (the lists) and every index."""
        return self._call(lambda: int(self.conn.execute("SELECT pg_total_relation_size(%s::regclass)",
                                                        (self._quoted(),)).fetchone()[0]))

    def drop(self) -> None:
        """Drop this store's table (and its sequence and indexes) from the database (irreversible),
        then close the store: later calls raise :class:`~uibk_embedding.errors.StoreInUse` (a new
        store of the same name creates an empty table)."""
        self._write(lambda: self.conn.execute(self._q("DROP TABLE IF EXISTS {t}")))

    def close(self) -> None:
        """Close the connection (one given as ``connection=`` stays open); later calls raise
        :class:`StoreInUse`. A call in flight in another thread finishes first (it would open a
        new connection on finding this one closed, which nothing would close)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if getattr(self, "_owns", False):
                self.conn.close()
