"""LanceDB: the embedded, file-based engine (local folders or object storage), MaxSim natively.

One table per store (:class:`LanceDBStore`): ``id`` (the declared primary key: two writers of one
id conflict and retry), ``vectors``, ``metadata`` (JSON) and filter columns of BLAKE2 digests, so no
user string reaches SQL (docs/lancedb.md); the format record in the schema metadata. An existing
table is validated, never altered. Each upsert (``merge_insert`` on ``id``) and delete is one commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from functools import partialmethod
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding._optional import require
from uibk_embedding._sqlite_state import refuse_foreign_entries
from uibk_embedding.adapters import base
from uibk_embedding.adapters.base import Hit, MultiVectorStore, Record
from uibk_embedding.adapters.common import batched
from uibk_embedding.adapters.engine_profiles import check_profile, profile_conflict
from uibk_embedding.adapters.filters import (
    OPERATORS,
    SQL_RANGES,
    And,
    Condition,
    Node,
    Not,
    Or,
    flattened,
    is_number,
)
from uibk_embedding.adapters.indexed import fix_mmap_threshold
from uibk_embedding.adapters.rerank import rerank_candidates
from uibk_embedding.errors import CollectionMismatch, ReadOnlyStore, StoreNotFound
from uibk_embedding.maxsim import pack
from uibk_embedding.tagged import DIM, TaggedFormat

RECORD_KEY = b"uibk_embedding"
ENGINE_MODULES = ("lancedb", "pyarrow")
"""The engine's libraries, imported on the first open (or by
:func:`~uibk_embedding.adapters.registry.import_engine` in a prefork master: ~80 MiB of private
memory per worker when each imports them itself)."""
MAX_NESTING = 22
"""The deepest nesting of ``$and``/``$or``/``$not`` (after :func:`~uibk_embedding.adapters.filters.flattened`,
a negated condition counting one more) that LanceDB's SQL parser takes (measured: every filter tried
of 22 levels parsed, some of 24 hit its recursion limit)."""
PRUNE_EVERY = 64
"""Writes of one store object between two :meth:`LanceDBStore.optimize` runs of the upkeep (each
write is a table version; exact mode kept every one: 113 versions, 29 MB for 2 MB of rows)."""
OPEN_WAIT_S = 1.0
"""How long an open waits for a table that another process is creating (listed, no version yet;
a creation takes about 3 ms) before it takes it for a creation killed half-way."""
PRIMARY_KEY = {b"lance-schema:unenforced-primary-key": b"true"}  # concurrent inserts of one id conflict
_LISTED = ("id", "vectors", "metadata")
PROFILES = {"exact": "float32 vectors (the default)", "float16": "float16 vectors: half the bytes"}
"""``profile=``: the type of the ``vectors`` column (the column's type is the record: a table
opened with another profile is refused, naming both). LanceDB's MaxSim scores a float16 column
against float32 queries; the hits are rescored here in float32 from the float16 values."""


def digest(*parts: Any) -> str:
    """The hex token a field (and a typed value) is filtered by.

    >>> digest("lang", "s", "en") == digest("lang", "s", "en") != digest("lang", "s", "de")
    True
    """
    return hashlib.blake2b(json.dumps(parts, ensure_ascii=False).encode(), digest_size=16).hexdigest()


def value_token(field: str, v: Any) -> str | None:
    """The equality token of a scalar value (None for lists, dicts and null, which equal nothing).

    >>> value_token("n", 1) == value_token("n", 1.0) != value_token("n", True)
    True
    """
    if isinstance(v, bool | str):
        return digest(field, "b" if isinstance(v, bool) else "s", v)
    if is_number(v):  # 1 and 1.0 are one number
        return digest(field, "n", str(int(v)) if float(v).is_integer() else repr(v))
    return None


def quote(text: str) -> str:
    """An SQL string literal: every ``'`` doubled (LanceDB's SQL reads backslashes literally).

    >>> print(quote("x' OR '1'='1"))
    'x'' OR ''1''=''1'
    """
    return "'" + text.replace("'", "''") + "'"


def _nesting(node: Node) -> int:
    if isinstance(node, Not):
        return 1 + _nesting(node.child)
    if isinstance(node, And | Or):
        return 1 + max(map(_nesting, node.children), default=0)
    return 1  # a negated condition is wrapped once more


def filter_sql(nodes: tuple[Node, ...] | Node) -> str:
    """The LanceDB ``where`` of parsed filter conditions (two-valued: a missing field makes a
    comparison false and its negation true).

    >>> from uibk_embedding.adapters.filters import parse_filter
    >>> filter_sql(parse_filter({"n": {"$gte": 2}}))  # doctest: +ELLIPSIS
    "(COALESCE(json_get_float(_uibk_num, '...') >= 2.0, false))"
    """
    if isinstance(nodes, tuple):  # the top: nesting that changes nothing is dropped first
        nodes = flattened(And(nodes))
        if (depth := _nesting(nodes)) > MAX_NESTING:
            raise ValueError(f"the filter nests {depth} levels of $and/$or/$not; LanceDB's SQL "
                             f"parser takes {MAX_NESTING} at most")
    if isinstance(nodes, And):
        nodes = nodes.children
        return "(" + " AND ".join(filter_sql(n) for n in nodes) + ")" if nodes else "TRUE"
    if isinstance(nodes, Or):
        return "(" + " OR ".join(filter_sql(c) for c in nodes.children) + ")"
    if isinstance(nodes, Not):
        return f"(NOT {filter_sql(nodes.child)})"
    n: Condition = nodes
    if n.op in SQL_RANGES:
        return (f"COALESCE(json_get_float(_uibk_num, '{digest(n.field)}') {SQL_RANGES[n.op]} "
                f"{float(n.values[0])!r}, false)")
    sql = (f"array_has(_uibk_has, '{digest(n.field)}')" if n.op == "$exists" else
           "array_has_any(_uibk_eq, [" + ", ".join(f"'{value_token(n.field, v)}'" for v in n.values) + "])")
    return sql if n.op in ("$eq", "$in") or (n.op, *n.values) == ("$exists", True) else f"(NOT {sql})"


class LanceDBStore(MultiVectorStore):
    """Tagged multivectors in the LanceDB table ``table`` of the database at ``uri`` (a folder,
    or ``s3://...`` and the like; None: a temporary folder, removed on :meth:`close`).

    Parameters
    ----------
    uri (or path): the database; table: the table name (created when missing, unless
        ``create=False``: then :class:`~uibk_embedding.errors.StoreNotFound`).
    format: the tagged format (recorded in the table's schema metadata).
    mode: "exact" (default: flat MaxSim, metric ``dot``) or "index": ``candidates`` documents from
        an IVF_FLAT cosine index (``nprobes`` partitions probed, LanceDB's ``refine_factor``),
        unindexed rows searched flat; all four also per-query options. Hits are scored here by
        exact MaxSim (:func:`~uibk_embedding.adapters.rerank.rerank_candidates`); when the probed
        partitions hold fewer than ``k`` matches, the search is flat.
    index_min_rows, reindex_share: the index upkeep of mode "index": built at ``index_min_rows``
        rows, ``optimize()`` past ``reindex_share`` unindexed (a failure warns; the write stands).
    keep_versions: the age in seconds (since it was written) past which ``optimize()`` prunes a
        superseded version (run every :data:`PRUNE_EVERY` writes in either mode; LanceDB's 7 days
        took 4.5 GiB on NPL); a version older than that goes at the first upkeep after it is
        superseded. 0: one process only (older readers would fail).
    read_only: refuse every write (StoreInUse) and open only a table that exists: for readers
        beside a writer (LanceDB versions its table: every reader sees the newest committed
        version), and for a folder made read-only.
    profile: ``"exact"`` (float32 vectors) or ``"float16"`` (:data:`PROFILES`; the exact store's
        other names are refused): what a new table keeps, or what an existing one must keep
        (``CollectionMismatch`` naming both otherwise). ``None``: the table's own (new: exact).
    cache_bytes: the most bytes this store's LanceDB caches hold (a ``lancedb.Session``: half for
        its index cache, half for its metadata cache; the session's own ~150 bytes of bookkeeping
        aside); ``None``: LanceDB's own (6 GiB and 1 GiB, filled as they are used). A reader beside
        a writer caches every new version's metadata: one of an unindexed table held 27 MiB private
        after 45 s with ``cache_bytes=8 << 20``, 22 MiB with ``1 << 20``, at the same searches per
        second (docs/serving.md).

    >>> import numpy as np, tempfile; from uibk_embedding.testing import make_list
    >>> d, rng = tempfile.mkdtemp(), np.random.default_rng(0)
    >>> with LanceDBStore(d, table="docs") as s:
    ...     s.upsert(["a", "b"], [make_list(s.format, rng, 5), make_list(s.format, rng, 7)],
    ...              [{"ok": True}, {"ok": 1}])
    ...     [h.id for h in s.search(make_list(s.format, rng, 4), k=5, filter={"ok": True})]
    ['a']
    >>> s = LanceDBStore(d, table="docs")   # persisted
    >>> s.backend, s.exact, s.count()
    ('lancedb', True, 2)
    """

    backend = "lancedb"
    filter_operators = frozenset(OPERATORS)
    search_options = ("mode", "candidates", "nprobes", "refine_factor")

    def __init__(self, uri: str | os.PathLike | None = None, *, table: str = "uibk",
                 path: str | os.PathLike | None = None, format: TaggedFormat | None = None,
                 mode: str = "exact", candidates: int = 100, nprobes: int = 32, refine_factor: int = 10,
                 index_min_rows: int = 2048, reindex_share: float = 0.1, keep_versions: float = 60.0,
                 create: bool = True, read_only: bool = False, profile: str | None = None,
                 cache_bytes: int | None = None) -> None:
        if cache_bytes is not None and (isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int)
                                        or cache_bytes < 0):
            raise ValueError(f"cache_bytes must be a number of bytes >= 0 or None, got {cache_bytes!r}")
        self._float = {"float16": "float16"}.get(check_profile(profile, PROFILES, "lancedb") or "", "float32")
        if not isinstance(read_only, bool):
            raise TypeError(f"read_only must be True or False, got {read_only!r}")
        self.read_only = read_only
        create = create and not read_only  # a read-only store opens a table that exists
        self._ldb, self._pa = (require(m, "lancedb", "the LanceDB adapter") for m in ENGINE_MODULES)
        super().__init__(format)
        if uri is not None and path is not None:
            raise TypeError("give uri or path (the same: where the database is), not both")
        self._defaults = self._options(mode=mode, candidates=candidates, nprobes=nprobes,
                                       refine_factor=refine_factor, index_min_rows=index_min_rows)
        self.exact, self.index_min_rows, self.reindex_share = mode == "exact", index_min_rows, reindex_share
        if not 0 <= reindex_share < 1 or not 0 <= keep_versions <= 10**9:  # (timedelta's own limit: 1e14 s)
            raise ValueError(f"reindex_share must be in [0, 1) and keep_versions in [0, 1e9] seconds, got "
                             f"{reindex_share!r} and {keep_versions!r}")
        self.keep_versions = timedelta(seconds=keep_versions)
        self._tmp = uri is None and path is None
        if self._tmp and not create:
            raise StoreNotFound("LanceDBStore(create=False) needs uri= or path=: without one it would make "
                                "a new temporary database; nothing was created")
        self.uri = str(tempfile.mkdtemp(prefix="uibk-lancedb-") if self._tmp else os.fspath(uri or path))
        if "://" not in self.uri:  # a local folder as LanceDB reads it ("~" expanded)
            self.uri = os.path.expanduser(self.uri)
        self.table = table  # a local folder is looked at before connecting, which would create it
        local_missing = "://" not in self.uri and not (Path(self.uri) / f"{table}.lance").is_dir()
        if "://" not in self.uri:  # LanceDB would add its table to any folder
            refuse_foreign_entries(self.uri, "a LanceDB database",
                                   lambda names: all(n.endswith(".lance") for n in names))
        # LanceDB's flat scan reads the vectors column into buffers of a few MiB on its ~20 threads;
        # with glibc's adaptive mmap threshold those come from per-thread arenas and stay held once
        # freed: 500+ MiB private per reader of NPL's table after 5 searches (benchmarks/results/
        # reader_memory.md), ~10 MiB with the threshold fixed (process-wide; UIBK_MALLOC_TUNING=0 off)
        fix_mmap_threshold()
        self._session = None if cache_bytes is None else self._ldb.Session(  # half the bound each
            index_cache_size_bytes=cache_bytes // 2, metadata_cache_size_bytes=cache_bytes - cache_bytes // 2)
        self._db = None if local_missing and not create else self._ldb.connect(
            self.uri, read_consistency_interval=timedelta(0),  # every read: the latest version, any writer's
            session=self._session)
        if self._db is None:
            raise StoreNotFound(f"no LanceDB table {table!r} at {self.uri}; nothing was created")
        self._tbl = self._open_or_create(create)
        if self._tbl is None:  # opened, not created
            self._tbl = self._db.open_table(table)
            schema = self._tbl.schema  # a foreign table may lack the column: _validate names that
            kind = schema.field("vectors").type if "vectors" in schema.names else None
            inner = getattr(getattr(kind, "value_type", None), "value_type", None)
            self._float = "float16" if inner == self._pa.float16() else "float32"
            self.format = self._validate(format)
            if why := profile_conflict(self.profile, profile, f"LanceDB table {table!r} at {self.uri}"):
                raise CollectionMismatch(why)

    @property
    def profile(self) -> str:
        """The table's profile (:data:`PROFILES`): its ``vectors`` column's type."""
        return "float16" if self._float == "float16" else "exact"

    def _open_or_create(self, create: bool) -> Any:
        """Create the table (returned) or find it there (None: open it). Two processes may open a
        new table at once: the one whose creation loses opens the winner's, and one that sees the
        table before its first version is written waits for it (``OPEN_WAIT_S`` at most). A table
        folder still without a version after that is a creation killed half-way, which committed
        nothing: created again (``create=False``: :class:`~uibk_embedding.errors.StoreNotFound`)."""
        deadline = time.monotonic() + OPEN_WAIT_S
        while True:
            if self.table not in self._db.list_tables().tables:
                if not create:
                    raise StoreNotFound(f"no LanceDB table {self.table!r} at {self.uri}; nothing was created")
                record = json.dumps({"backend": self.backend, "version": 1,
                                     "format": self.format.to_stored()})
                try:
                    return self._db.create_table(self.table, schema=self._schema({RECORD_KEY: record}))
                except ValueError as e:  # another process created it meanwhile: open that one
                    if "already exists" not in str(e):
                        raise
            elif self._has_version():
                return None
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        folder = Path(self.uri) / f"{self.table}.lance"
        if "://" in self.uri:
            raise CollectionMismatch(f"LanceDB table {self.table!r} at {self.uri} is listed but has no "
                                     f"version after {OPEN_WAIT_S:g} s (a creation that did not finish?)")
        if not create:
            raise StoreNotFound(f"LanceDB table {self.table!r} at {self.uri} was never created in full (its "
                                f"folder {folder} holds no version: a creation killed half-way, which "
                                "committed nothing); create=True creates it; nothing was changed")
        try:  # never remove a table LanceDB itself can open
            self._db.open_table(self.table)
            return None
        except ValueError:
            pass
        shutil.rmtree(folder)  # no version: no row was ever committed to it
        return self._open_or_create(create)

    def _has_version(self) -> bool:
        """Whether the listed table has a committed version (a local folder: a manifest in its
        ``_versions``; elsewhere, LanceDB's open answers)."""
        if "://" not in self.uri:
            return any((Path(self.uri) / f"{self.table}.lance" / "_versions").glob("*.manifest"))
        try:
            self._db.open_table(self.table)
        except ValueError as e:
            if "not found" not in str(e):
                raise
            return False
        return True

    def _schema(self, metadata: dict | None = None) -> Any:
        pa = self._pa
        return pa.schema([pa.field("id", pa.string(), nullable=False, metadata=PRIMARY_KEY),
                          pa.field("vectors", pa.list_(pa.list_(getattr(pa, self._float)(), DIM))),
                          pa.field("metadata", pa.string()), pa.field("_uibk_eq", pa.list_(pa.string())),
                          pa.field("_uibk_has", pa.list_(pa.string())), pa.field("_uibk_num", pa.json_())],
                         metadata=metadata)

    def _validate(self, requested: TaggedFormat | None) -> TaggedFormat:
        schema, problems = self._tbl.schema, []
        for want in self._schema():
            got = schema.field(want.name) if want.name in schema.names else None
            if got is None:
                problems.append(f"it has no column {want.name!r}")
            elif want.name == "_uibk_num":
                if (got.metadata or {}).get(b"ARROW:extension:name") != b"lance.json":
                    problems.append(f"column '_uibk_num' is {got.type}, needs a Lance JSON column")
            elif not got.type.equals(want.type):
                problems.append(f"column {want.name!r} is {got.type}, needs {want.type}")
            elif not (want.metadata or {}).items() <= (got.metadata or {}).items():
                problems.append("column 'id' is not declared the primary key (writers may duplicate an id)")
        if extra := [n for n in schema.names if n not in self._schema().names]:
            problems.append(f"it has columns uibk-embedding does not write: {extra}")
        record = base.read_record((schema.metadata or {}).get(RECORD_KEY))
        saved, found = base.record_problems(record, requested, key="backend", value=self.backend,
                                            schema_key="version", schema=1)
        if problems or found:
            raise CollectionMismatch(f"LanceDB table {self.table!r} at {self.uri} does not fit this store: "
                                     f"{'; '.join(problems + found)}. The table was not changed.")
        return saved  # type: ignore[return-value]  # no problems: record_problems read the format

    def _options(self, **given: Any) -> dict[str, Any]:
        opts = {**getattr(self, "_defaults", {}), **given}
        base.check_choice("mode", opts["mode"], ("exact", "index"))
        for name in ("candidates", "nprobes", "refine_factor", "index_min_rows"):
            base.check_positive(name, opts[name])
        return opts

    def _arrow(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> Any:
        pa, (mat, off) = self._pa, pack(vectors)
        rows = pa.array(mat.astype(self._float, copy=False).ravel())
        vec = pa.ListArray.from_arrays(off.astype("i4"), pa.FixedSizeListArray.from_arrays(rows, DIM))
        return pa.Table.from_pydict({
            "id": ids, "vectors": vec, "metadata": [json.dumps(m, ensure_ascii=False) for m in metadata],
            "_uibk_eq": [[t for f, v in m.items() if (t := value_token(f, v))] for m in metadata],
            "_uibk_has": [[digest(f) for f, v in m.items() if v is not None and v != []] for m in metadata],
            "_uibk_num": [json.dumps({digest(f): v for f, v in m.items() if is_number(v)}) for m in metadata],
        }, schema=self._schema())

    def _refuse_writes(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"this LanceDBStore ({self.uri}, table {self.table!r}) was opened with "
                             "read_only=True: it answers reads and refuses writes; open it without "
                             "read_only to write")

    def _upsert(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict]) -> None:
        self._refuse_writes()
        (self._tbl.merge_insert("id").when_matched_update_all().when_not_matched_insert_all()
         .execute(self._arrow(ids, vectors, metadata)))
        self._mean_rows = float(np.mean([len(v) for v in vectors]))  # for the index's partitions
        self._upkeep()

    def _delete(self, ids: list[str]) -> None:
        self._refuse_writes()
        self._upkeep(self._tbl.delete(f"id IN ({', '.join(map(quote, ids))})"))

    def _delete_where(self, conditions: tuple[Node, ...]) -> int:
        self._refuse_writes()
        return self._upkeep(int(self._tbl.delete(filter_sql(conditions)).num_deleted_rows))

    def _upkeep(self, result: Any = None) -> Any:
        """After a write's commit (``result`` passed through): index mode's index upkeep, and in
        either mode an :meth:`optimize` (compaction, versions older than ``keep_versions`` pruned)
        every :data:`PRUNE_EVERY` writes of this store object (each write is a new version)."""
        self._writes = getattr(self, "_writes", 0) + 1
        try:
            n = 0 if self.exact else self.count()
            if n >= self.index_min_rows and not self.has_index:  # partitions: ~sqrt(token rows), docs
                self.create_index(num_partitions=int(np.sqrt(n * getattr(self, "_mean_rows", 0))) or None)
            elif (n and self.has_index and self.n_pending > self.reindex_share * n) \
                    or self._writes % PRUNE_EVERY == 0:
                self.optimize()
        except Exception as e:  # the rows are stored; the next write tries again
            warnings.warn(f"LanceDB table {self.table!r} at {self.uri}: index upkeep failed ({e}); the "
                          "rows are stored and searched flat until a later write updates the index",
                          RuntimeWarning, stacklevel=3)
        return result

    @property
    def has_index(self) -> bool:
        """Whether the table has its vector index (``mode="index"`` builds it itself)."""
        return bool(self._tbl.list_indices())

    @property
    def n_pending(self) -> int:
        """Rows the index does not hold yet (searched flat; all rows when there is no index)."""
        idx = self._tbl.list_indices()
        return self._tbl.index_stats(idx[0].name).num_unindexed_rows if idx else self.count()

    def count(self) -> int:
        return int(self._tbl.count_rows())

    def _rows(self, where: str, columns: tuple[str, ...] = _LISTED, batch_size: int | None = None) -> Any:
        query = self._tbl.search().where(where).select(list(columns)).limit(None)
        return query.to_batches(batch_size) if batch_size else query.to_arrow()

    def _scan(self, conditions: tuple[Node, ...], batch_size: int) -> Iterator[list[tuple[str, dict]]]:
        for b in self._rows(filter_sql(conditions), ("id", "metadata"), batch_size):
            if b.num_rows:
                yield list(zip(b["id"].to_pylist(), map(json.loads, b["metadata"].to_pylist()), strict=True))

    def _get(self, ids: list[str]) -> list[Record]:
        found = [_found(self._rows(f"id IN ({', '.join(map(quote, c))})")) for c in batched(ids, 512)]
        return [Record(x, v, md) for part in found for x, (v, md) in part.items()]

    def _search(self, q: np.ndarray, k: int, conditions: tuple[Node, ...], explain: bool = False,
                **given: Any) -> list[Hit]:
        opts = self._options(**given)  # index_min_rows is no search option: the base refuses it
        search = self._tbl.search(q, "vectors").where(filter_sql(conditions), prefilter=True)
        if opts["mode"] == "exact":
            search = search.distance_type("dot").bypass_vector_index().limit(k)
        else:
            limit = opts["candidates"]
            if k > limit:  # k past the rows: LanceDB allocated for all k (10**8 killed the process)
                limit = min(k, max(self.count(), 1))
            search = (search.distance_type("cosine").nprobes(opts["nprobes"])
                      .refine_factor(opts["refine_factor"]).limit(limit))
        found = _found(search.select([*_LISTED, "_distance"]).to_arrow())  # _distance: Lance wants it
        if opts["mode"] == "index" and len(found) < k:  # the probed partitions missed matches: flat
            return self._search(q, k, conditions, explain, **{**given, "mode": "exact"})
        return rerank_candidates(q, [(x, None) for x in found], lambda _: found, k, first=max(len(found), 1),
                                 explain=self.format if explain else None)  # exact MaxSim

    _search_explained = partialmethod(_search, explain=True)  # the hits' lists came with the search

    def create_index(self, *, index_type: str = "IVF_FLAT", num_partitions: int | None = None,
                     **options: Any) -> None:
        """Build (or rebuild) the IVF index (cosine; ``options``: LanceDB's ``create_index``'s)."""
        self._refuse_writes()
        self._tbl.create_index(metric="cosine", vector_column_name="vectors", index_type=index_type,
                               num_partitions=num_partitions, **options)

    def optimize(self) -> None:
        """LanceDB's ``optimize``: compact, index new rows, prune versions older than ``keep_versions``."""
        self._refuse_writes()
        self._tbl.optimize(cleanup_older_than=self.keep_versions)

    def close(self) -> None:
        """Drop the table handle (a temporary database is deleted)."""
        self._tbl = self._db = None
        if getattr(self, "_tmp", False):
            shutil.rmtree(self.uri, ignore_errors=True)


def _found(rows: Any) -> dict[str, tuple[np.ndarray, dict]]:
    """``{id: (tagged list as one (n, 128) float32 array, metadata)}`` of a table of :data:`_LISTED`."""
    col = rows["vectors"].combine_chunks()
    off, flat = col.offsets.to_numpy(), col.values.flatten().to_numpy(zero_copy_only=False).reshape(-1, DIM)
    lists = np.split(flat[off[0]:off[-1]].astype(np.float32), off[1:-1] - off[0]) if len(col) else []
    return {x: (v, json.loads(m)) for x, v, m in zip(rows["id"].to_pylist(), lists,
                                                     rows["metadata"].to_pylist(), strict=True)}
