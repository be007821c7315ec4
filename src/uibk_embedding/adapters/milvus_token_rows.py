"""The ``token_rows`` Milvus layout: one row per vector, the lists in base64 document parts.

Runs on every Milvus, Milvus Lite included: ``<name>_rows`` (one row per vector, searched by
``IP``) and ``<name>_docs`` (each whole tagged list and its metadata, and the store's marker
row: doc_id ``''``, part -1, as Milvus Lite keeps no collection description). How a search
bounds and rescores its candidates, and how versioned writes and :meth:`repair` work: see
:mod:`uibk_embedding.adapters.milvus`.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from uibk_embedding.adapters.base import Hit
from uibk_embedding.adapters.common import batched, serialized
from uibk_embedding.adapters.filters import Node
from uibk_embedding.adapters.milvus_base import (
    _FIELD_BYTES,
    GRPC_LIMIT_BYTES,
    ID_BYTES,
    MAX_LIMIT,
    MAX_META_BYTES,
    MilvusStore,
    _ids_expr,
    _pymilvus,
    _Stored,
    filter_expression,
    filter_fields,
    too_large,
)
from uibk_embedding.errors import BackendUnavailable
from uibk_embedding.tagged import DIM

PART_ROWS = 64  # vectors per document part: 32 KiB of float32, 43,692 base64 characters
PART_CHARS = 43692
ABANDONED_AFTER = 3600.0  # seconds: repair() leaves a younger incomplete version alone


def _b64(x: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode("ascii")


def _unb64(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


_PART_FIELDS = ["pk", "doc_id", "ver", "part", "n_parts", "n_rows"]  # a part row without its data
_READS = 20  # reads of one document whose chosen version keeps being replaced while it is read


def complete_versions(rows: Sequence[dict]) -> dict[str, list[tuple[int, list[dict]]]]:
    """Each document's complete versions (every part ``0..n_parts-1`` present), newest first, as
    ``(version, its part rows in part order)``. A part stored twice (pymilvus retries an insert
    whose reply was lost, and the server may have applied the first try) counts once.

    >>> rows = [{"doc_id": "a", "ver": 2, "part": p, "n_parts": 2} for p in (0, 0, 1)]
    >>> rows.append({"doc_id": "a", "ver": 3, "part": 0, "n_parts": 2})  # a write that died
    >>> [(v, [r["part"] for r in parts]) for v, parts in complete_versions(rows)["a"]]
    [(2, [0, 1])]
    """
    groups: dict[tuple[str, int], dict[int, dict]] = defaultdict(dict)
    for r in rows:
        groups[(r["doc_id"], int(r["ver"]))].setdefault(int(r["part"]), r)
    out: dict[str, list[tuple[int, list[dict]]]] = defaultdict(list)
    for (doc_id, ver), parts in sorted(groups.items(), key=lambda kv: -kv[0][1]):
        n_parts = int(next(iter(parts.values()))["n_parts"])
        if n_parts >= 1 and sorted(parts) == list(range(n_parts)):
            out[doc_id].append((ver, [parts[p] for p in range(n_parts)]))
    return dict(out)


class MilvusTokenRowsStore(MilvusStore):
    """The ``token_rows`` layout (see the module docstring; parameters: :class:`MilvusStore`)."""

    layout: ClassVar[str] = "token_rows"
    supports_exact: ClassVar[bool] = True
    pool_option: ClassVar[str] = "rows_per_vector"
    search_options: ClassVar[tuple[str, ...]] = ("rows_per_vector", "candidates")  # candidates: deprecated
    PROFILES: ClassVar[dict[str, tuple[str, tuple[int, int, int], str]]] = {
        **MilvusStore.PROFILES,
        "float16": ("FLOAT16_VECTOR", (2, 4, 0),
                    "FLOAT16_VECTOR rows, Milvus >= 2.4; lists rescored in float32"),
    }

    @property
    def candidates(self) -> int:
        """Deprecated name of :attr:`rows_per_vector` on this layout (setting it warns)."""
        return self.rows_per_vector

    @candidates.setter
    def candidates(self, value: int) -> None:
        n = self._given_pool(value, None, stacklevel=3)  # DeprecationWarning; 1..16,384 checked
        if n is None:
            raise ValueError("rows_per_vector must be an int, got None")
        self.rows_per_vector = n

    # -- schema ----------------------------------------------------------------------------
    def _names(self) -> list[str]:
        return [self.rows_name, self.docs_name]

    def _expected_fields(self, name: str) -> dict[str, tuple[str, dict]]:
        if name == self.rows_name:
            return {"pk": ("INT64", {}), "doc_id": ("VARCHAR", {"max_length": ID_BYTES}),
                    "ver": ("INT64", {}), "f": ("JSON", {}),
                    "vec": (self.PROFILES[self.profile][0], {"dim": DIM})}
        return {"pk": ("INT64", {}), "doc_id": ("VARCHAR", {"max_length": ID_BYTES}),
                "ver": ("INT64", {}), "part": ("INT64", {}), "n_parts": ("INT64", {}),
                "n_rows": ("INT64", {}), "meta": ("VARCHAR", {"max_length": MAX_META_BYTES}),
                "f": ("JSON", {}),
                "vecs": ("VARCHAR", {"max_length": PART_CHARS}),
                "dummy": ("FLOAT_VECTOR", {"dim": 2})}

    def _build_schema(self, name: str) -> tuple[Any, Any]:
        DataType = _pymilvus().DataType
        schema = self.client.create_schema(auto_id=True, enable_dynamic_field=False,
                                           description=self._description())
        ip = self.client.prepare_index_params()
        schema.add_field("pk", DataType.INT64, is_primary=True)
        schema.add_field("doc_id", DataType.VARCHAR, max_length=ID_BYTES)
        schema.add_field("ver", DataType.INT64)
        if name == self.rows_name:
            schema.add_field("f", DataType.JSON)
            schema.add_field("vec", getattr(DataType, self.PROFILES[self.profile][0]), dim=DIM)
            ip.add_index("vec", index_type=self.index_type, metric_type="IP", params=self.index_params)
        else:
            schema.add_field("part", DataType.INT64)
            schema.add_field("n_parts", DataType.INT64)
            schema.add_field("n_rows", DataType.INT64)
            schema.add_field("meta", DataType.VARCHAR, max_length=MAX_META_BYTES)
            schema.add_field("f", DataType.JSON)
            schema.add_field("vecs", DataType.VARCHAR, max_length=PART_CHARS)
            schema.add_field("dummy", DataType.FLOAT_VECTOR, dim=2)  # Milvus 2.3 needs a vector
            ip.add_index("dummy", index_type="FLAT", metric_type="L2")
        return schema, ip

    def _marker(self, desc: dict) -> Any:
        """The collection description, else (Milvus Lite does not keep descriptions) the marker
        row of the docs collection (doc_id '', part -1)."""
        info = super()._marker(desc)
        if info is not None or "part" not in {f["name"] for f in desc.get("fields", [])}:
            return info
        res = self.client.query(self.docs_name, filter='doc_id == "" and part == -1',
                                output_fields=["meta"], timeout=self.timeout)
        try:
            return json.loads(res[0]["meta"]) if res else None
        except ValueError:
            return None

    def _write_marker(self) -> None:
        self.client.insert(self.docs_name, [{"doc_id": "", "ver": 0, "part": -1, "n_parts": 0,
                                             "n_rows": 0, "meta": self._description(), "f": {},
                                             "vecs": "", "dummy": [0.0, 0.0]}],
                           timeout=self.timeout)

    def _index_problems(self, name: str) -> list[str]:
        if name != self.rows_name:
            return []
        problems = []
        metric = self._index_metric(name, "vec")
        if metric is not None and metric != "IP":
            problems.append(f"the vector index uses metric {metric}, expected IP "
                            "(COSINE/L2 would change MaxSim scores)")
        idx = self._index_type(name, "vec")
        if self.exact and idx not in (None, "FLAT"):
            problems.append(f"exact=True needs a FLAT row index, the collection has {idx}")
        return problems

    # -- writes ----------------------------------------------------------------------------
    def _write(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict],
               texts: list[str]) -> None:
        ver = self._versions.next(after=self._newest_version(ids))
        doc_rows: list[dict] = []
        doc_sizes: list[int] = []
        vec_rows: list[dict] = []
        for x, v, m, t in zip(ids, vectors, metadata, texts, strict=True):
            f = filter_fields(m)
            n_parts = -(-len(v) // PART_ROWS)
            for p in range(n_parts):
                chunk = v[p * PART_ROWS:(p + 1) * PART_ROWS]
                doc_rows.append({"doc_id": x, "ver": ver, "part": p, "n_parts": n_parts,
                                 "n_rows": len(v), "meta": t if p == 0 else "",
                                 "f": f if p == 0 else {}, "vecs": _b64(chunk),
                                 "dummy": [0.0, 0.0]})
                doc_sizes.append(len(chunk))
            vec_rows.extend({"doc_id": x, "ver": ver, "f": f, "vec": r} for r in self._rows(v))
        # 1. the new version's rows, 2. its lists (the commit point: readers use the newest
        # complete list), 3. drop older versions, lists first (see repair())
        self._id_bytes = max([self._id_bytes, *(len(x.encode()) for x in ids)])
        for batch in self._batches((vec_rows, [1] * len(vec_rows)), (doc_rows, doc_sizes)):
            self.client.insert(self.docs_name if "vecs" in batch[0] else self.rows_name, batch,
                               timeout=self.timeout)
        self._delete_versions(ids, f"ver < {ver}")

    def _rows(self, v: np.ndarray) -> list:
        """Row vectors as the row field takes them: float lists, or float16 arrays."""
        return list(v.astype(np.float16)) if self.profile == "float16" else v.tolist()

    def _newest_version(self, ids: Sequence[str]) -> int:
        """The highest version stored for any of ``ids`` (complete or not; 0 for none), read at
        the collection's ``Strong`` consistency point, so it includes every acknowledged write."""
        newest = 0
        for chunk in batched(list(dict.fromkeys(ids)), 128):
            res = self.client.query(self.docs_name, filter=_ids_expr(chunk) + " and part >= 0",
                                    output_fields=["ver"], limit=MAX_LIMIT, timeout=self.timeout)
            newest = max([newest, *(int(r["ver"]) for r in res)])
        return newest

    # -- reads -----------------------------------------------------------------------------
    def _doc_filter(self, expr: str) -> str:
        # one row per document holds its metadata: part 0
        return "part == 0" + (f" and ({expr})" if expr else "")

    _scan_fields = ("doc_id", "ver", "meta")

    def _part_rows(self, ids: Sequence[str], level: dict) -> list[dict]:
        """Every part row of ``ids`` (:data:`_PART_FIELDS`: no list, no metadata), in queries that
        each answer at most ``MAX_LIMIT`` rows and about ``_request_bytes`` bytes."""
        todo = [list(c) for c in batched(list(dict.fromkeys(ids)), 256)]
        rows: list[dict] = []
        while todo:
            chunk = todo.pop()
            per_row = 6 * _FIELD_BYTES + max(len(x.encode()) for x in chunk)
            limit = max(1, min(MAX_LIMIT, self._request_bytes // per_row))
            expr = _ids_expr(chunk) + " and part >= 0"
            res = self.client.query(self.docs_name, filter=expr, output_fields=_PART_FIELDS,
                                    limit=limit, timeout=self.timeout, **level)
            if len(res) >= limit:  # maybe truncated: split and ask again
                if len(chunk) == 1:
                    res = self._query_all(self.docs_name, expr, _PART_FIELDS,
                                          batch=max(1, min(4096, limit)), **level)
                else:
                    todo += [chunk[: len(chunk) // 2], chunk[len(chunk) // 2:]]
                    continue
            rows.extend(res)
        return rows

    def _read_parts(self, parts: list[dict], level: dict) -> dict[int, dict]:
        """The part rows ``parts`` (from :meth:`_part_rows`) with their lists and metadata, by
        primary key, in queries of about ``_request_bytes`` bytes (a part holds up to 44 KB of
        base64, part 0 up to 64 KB of metadata); a part deleted meanwhile is absent."""
        out: dict[int, dict] = {}
        chunk: list[int] = []
        nbytes = 0

        def read() -> None:
            res = self.client.query(self.docs_name, filter=f"pk in [{', '.join(map(str, chunk))}]",
                                    output_fields=["pk", "doc_id", "ver", "part", "n_parts", "n_rows",
                                                   "meta", "vecs"],
                                    limit=len(chunk), timeout=self.timeout, **level)
            out.update((int(r["pk"]), r) for r in res)

        for r in parts:
            n_vecs = min(PART_ROWS, int(r["n_rows"]) - PART_ROWS * int(r["part"]))
            b = (8 * _FIELD_BYTES + len(r["doc_id"].encode()) + 4 * -(-max(n_vecs, 0) * DIM * 4 // 3)
                 + (MAX_META_BYTES if int(r["part"]) == 0 else 0))
            if chunk and nbytes + b > self._request_bytes:
                read()
                chunk, nbytes = [], 0
            chunk.append(int(r["pk"]))
            nbytes += b
        if chunk:
            read()
        return out

    def _fetch(self, ids: Sequence[str], *, wait: bool = True) -> dict[str, _Stored]:
        """Newest complete stored list, metadata and version of each id (missing ids absent);
        an incomplete version (a write that crashed) is never used. ``wait=False``: see
        :meth:`MilvusStore._fetch` (the ``Strong`` point is one time tick, ~200 ms on 2.3).

        Two reads, so that no answer outgrows Milvus' message limit whatever the documents'
        lengths: which parts each document has (small rows), then the parts of each one's newest
        complete version by primary key, in pieces of about ``_request_bytes``. The second read
        does not wait for the consistency point the first one reached; a document whose chosen
        version is no longer whole by then (a newer write replaced it, or it was deleted) is read
        again, waiting."""
        out: dict[str, _Stored] = {}
        level = {} if wait else {"consistency_level": "Eventually"}
        pending = list(dict.fromkeys(ids))
        broken: set[tuple[str, int]] = set()  # complete versions whose stored list does not decode
        for attempt in range(_READS):
            if not pending:
                return out
            chosen: dict[str, tuple[int, list[dict]]] = {}
            for doc_id, versions in complete_versions(self._part_rows(pending, level)).items():
                usable = [v for v in versions if (doc_id, v[0]) not in broken]
                if usable:
                    chosen[doc_id] = usable[0]
            got = self._read_parts([r for _, parts in chosen.values() for r in parts],
                                   {"consistency_level": "Eventually"} if attempt == 0 else {})
            pending = []
            for doc_id, (ver, parts) in chosen.items():
                rows = [got.get(int(r["pk"])) for r in parts]
                if any(r is None for r in rows):
                    pending.append(doc_id)  # replaced or deleted since the first read: read again
                    continue
                flat = np.concatenate([_unb64(r["vecs"]) for r in rows])
                n_rows = int(rows[0]["n_rows"])
                if flat.size != n_rows * DIM:
                    broken.add((doc_id, ver))
                    pending.append(doc_id)
                    continue
                out[doc_id] = (flat.reshape(n_rows, DIM), json.loads(rows[0]["meta"]), ver)
                self._id_bytes = max(self._id_bytes, len(doc_id.encode()))
            level = {}  # a second read waits for the consistency point
        if pending:
            raise BackendUnavailable(f"documents {pending[:5]} were replaced during each of {_READS} reads; "
                                     "retry when their writers are done")
        return out

    def _visible(self, rows: list[dict]) -> list[dict]:
        """The rows of a scan page whose version is the one :meth:`_fetch` reads: the newest
        complete one (an interrupted write leaves an older or an incomplete version beside it).
        The versions are read without waiting for the consistency point (a Strong read costs a
        time tick, 30-60 ms a page here); a row that read finds not visible is checked again,
        waiting, so a version written just before the page is never left out."""

        def newest(ids: list[str], level: dict) -> dict[str, int]:
            return {doc_id: versions[0][0] for doc_id, versions in
                    complete_versions(self._part_rows(ids, level)).items()}

        now = newest([r["doc_id"] for r in rows], {"consistency_level": "Eventually"})
        doubt = [r["doc_id"] for r in rows if now.get(r["doc_id"]) != int(r["ver"])]
        if doubt:
            now.update(newest(doubt, {}))
        return [r for r in rows if now.get(r["doc_id"]) == int(r["ver"])]

    @serialized
    def count(self) -> int:
        """Documents with a complete version (one pass over the part rows, without their lists:
        an interrupted write leaves a second version, which is not counted twice)."""
        rows = self._query_all(self.docs_name, "part >= 0", ["doc_id", "ver", "part", "n_parts"],
                               batch=max(1, min(4096, self._request_bytes // (ID_BYTES + 64))))
        return len(complete_versions(rows))

    # -- search ----------------------------------------------------------------------------
    def _search_one(self, q: np.ndarray, k: int, conditions: tuple[Node, ...], pool: int,
                    explain: bool) -> list[Hit]:
        expr = filter_expression(conditions)
        depth = min(max(pool, 1), MAX_LIMIT)
        cache: dict[str, _Stored | None] = {}  # lists fetched at a shallower depth: not read again
        while True:
            upper, seen, bound, complete = self._row_candidates(q, depth, expr)
            hits, kth = self._rescore(q, list(upper), k, conditions, cache, upper, seen, explain)
            if complete or (len(hits) == k and (not self.exact or kth >= bound)):
                return hits  # fewer than k hits from an incomplete row search: deeper
            if depth >= MAX_LIMIT:  # unproven at Milvus' deepest search: rescore everything
                return self._rescore(q, self._all_ids(expr), k, conditions, cache, explain=explain)[0]
            depth = min(depth * 4, MAX_LIMIT)

    def _row_candidates(self, q: np.ndarray, depth: int,
                        expr: str) -> tuple[dict[str, float], dict[str, int], float, bool]:
        """Documents owning each query vector's ``depth`` nearest rows, with score upper bounds.

        Returns ``{doc_id: upper bound of its MaxSim}`` ordered best bound first, the newest
        version of each document among its returned rows, the bound for
        documents outside the union (sum over query vectors of the last returned score) and
        whether some list came back short (then every row passing the filter was seen, so the
        union is every matching document). A document's bound takes, per query vector, its best
        returned row, or the last returned score where it has none; with an exhaustive row
        search (FLAT) it is a true upper bound, so rescoring in bound order can stop early."""
        params = {"metric_type": "IP", "params": dict(self.search_params)}
        if self.index_type == "HNSW":
            params["params"].setdefault("ef", max(depth, 64))
        elif self.index_type.startswith("IVF"):
            params["params"].setdefault("nprobe", 32)
        gain: dict[str, float] = {}  # sum over query vectors of (best row - last row)
        seen: dict[str, int] = {}
        bound = 0.0
        complete = False
        # an answer holds depth rows per query vector (id, score, doc_id, ver): sized by the
        # longest id seen, and split in halves should longer ids outgrow Milvus' message limit
        per_row = 4 * _FIELD_BYTES + self._id_bytes
        per_call = max(1, min(len(q), 2_000_000 // depth, self._request_bytes // (depth * per_row)))
        for qs in batched(q, per_call):
            for hits in self._search_rows(np.asarray(qs), depth, expr, params):
                if len(hits) < depth:
                    complete = True
                if not hits:
                    continue
                last = min(float(h["distance"]) for h in hits)
                bound += last
                best: dict[str, float] = {}
                for h in hits:
                    d, s = h["entity"]["doc_id"], float(h["distance"])
                    if s > best.get(d, -math.inf):
                        best[d] = s
                    seen[d] = max(seen.get(d, 0), int(h["entity"]["ver"]))
                for d, s in best.items():
                    gain[d] = gain.get(d, 0.0) + (s - last)
        if gain:
            self._id_bytes = max(self._id_bytes, *(len(d.encode()) for d in gain))
        upper = {d: bound + g for d, g in sorted(gain.items(), key=lambda kv: -kv[1])}
        return upper, seen, bound, complete

    def _search_rows(self, qs: np.ndarray, depth: int, expr: str, params: dict) -> list:
        """The ``depth`` nearest rows of each query vector in ``qs``; a call whose answer Milvus
        refuses as over its message limit is made again in halves."""
        try:
            return list(self.client.search(self.rows_name, data=self._rows(qs), limit=depth, filter=expr,
                                           output_fields=["doc_id", "ver"], search_params=params,
                                           anns_field="vec", timeout=self.timeout))
        except Exception as e:
            if not too_large(e):
                raise
            if len(qs) == 1:
                raise ValueError(
                    f"the {depth:,} nearest rows of one query vector are over Milvus' gRPC message "
                    f"limit ({GRPC_LIMIT_BYTES // 2**20} MiB); search with a smaller rows_per_vector"
                ) from e
            self._id_bytes = ID_BYTES  # ids longer than estimated: assume the longest from now on
            half = len(qs) // 2
            return (self._search_rows(qs[:half], depth, expr, params)
                    + self._search_rows(qs[half:], depth, expr, params))

    # -- maintenance -----------------------------------------------------------------------
    @serialized
    def repair(self, abandoned_after: float = ABANDONED_AFTER) -> int:
        """Remove versions left behind by interrupted writes; returns how many documents were fixed.

        Only versions known to be stale when they are deleted are deleted, each by its exact
        version number (never "every version but the one kept": a write of another store object
        landing during the repair makes a newer version, which stays):

        * a version older than the document's newest complete version (every part and its
          token rows present: a write stores all its rows, then its parts);
        * any other version once it is older than ``abandoned_after`` seconds (its number is
          its writer's clock when the write began): rows or parts of a write that died, or
          rows of a delete that died between the two collections. A younger one may be a
          write still in progress. ``abandoned_after=0`` when no write is running removes
          every interrupted write now; ``float("inf")`` counts no write as interrupted.

        A version is complete when each of its part numbers is stored, once or more (a retried
        insert may store a part twice), as :meth:`_fetch` reads it.

        >>> from uibk_embedding.adapters.milvus import open_milvus_lite
        >>> with open_milvus_lite() as store:
        ...     store.repair()
        0
        """
        if not isinstance(abandoned_after, int | float) or not abandoned_after >= 0:
            raise ValueError(f"abandoned_after must be a number of seconds >= 0, got {abandoned_after!r}")
        # rows first: a write stores every row before its first part, so a version whose parts
        # are all seen but no row (a write landed between the scans, or a store written before
        # rows came first crashed between parts and rows) is not kept over one with rows
        row_vers: dict[str, set[int]] = defaultdict(set)
        for r in self._query_all(self.rows_name, "", ["doc_id", "ver"], batch=4096):
            row_vers[r["doc_id"]].add(int(r["ver"]))
        rows = self._query_all(self.docs_name, "part >= 0", ["doc_id", "ver", "part", "n_parts"])
        now = time.time_ns()
        # versions are nanosecond clocks: a float of seconds past now (inf) abandons nothing
        old_enough = now - int(abandoned_after * 1e9) if abandoned_after * 1e9 < now else 0
        by_doc: dict[str, set[int]] = defaultdict(set)
        for r in rows:
            by_doc[r["doc_id"]].add(int(r["ver"]))
        complete = complete_versions(rows)  # a part stored twice (a retried insert) counts once
        fixed = 0
        for doc_id in sorted(set(by_doc) | set(row_vers)):
            vers = by_doc.get(doc_id, set())
            with_rows = row_vers.get(doc_id, set())
            keep = max((v for v, _ in complete.get(doc_id, []) if v in with_rows), default=None)
            stale = {v for v in set(vers) | with_rows if v != keep and (
                (keep is not None and v < keep)  # superseded by a complete version
                or v <= old_enough)}  # an interrupted write or delete, old enough to be no running one
            if stale:
                fixed += 1
                self._delete_versions([doc_id], f"ver in [{', '.join(map(str, sorted(stale)))}]")
        return fixed
