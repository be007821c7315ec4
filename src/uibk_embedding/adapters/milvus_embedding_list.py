"""The ``embedding_list`` Milvus layout (Milvus >= 2.6.4): native multi-vectors and MAX_SIM.

One collection (``<collection>``) with an ``ARRAY<STRUCT{FLOAT_VECTOR}>`` field indexed with
``MAX_SIM_IP`` and searched with ``EmbeddingList`` queries; the ``candidates`` best documents
are rescored exactly. Older servers and Milvus Lite are refused with a clear message (Lite 3.x
silently drops struct fields and rejects ``MAX_SIM``). Writes are Milvus upserts by document
id (the primary key): nothing of an older version is left for :meth:`repair` to remove.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from uibk_embedding.adapters.base import Hit
from uibk_embedding.adapters.common import batched, parse_version
from uibk_embedding.adapters.filters import Node
from uibk_embedding.adapters.milvus_base import (
    _FIELD_BYTES,
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
from uibk_embedding.errors import ServerTooOld
from uibk_embedding.tagged import DIM

ARRAY_CAPACITY = 4096  # Milvus: largest ARRAY max_capacity (struct elements per document)
EMBEDDING_LIST_MIN = (2, 6, 4)


class MilvusEmbeddingListStore(MilvusStore):
    """The ``embedding_list`` layout (see the module docstring; parameters: :class:`MilvusStore`)."""

    layout: ClassVar[str] = "embedding_list"
    _docs_suffix: ClassVar[str] = ""

    def _check_server(self, version: str) -> None:
        if "milvus_lite" in version.lower() or parse_version(version) < EMBEDDING_LIST_MIN:
            need = ".".join(map(str, EMBEDDING_LIST_MIN))
            raise ServerTooOld(
                f"layout='embedding_list' needs a Milvus server >= {need} (ARRAY of STRUCT with "
                f"MAX_SIM_IP); this server reports {version!r}. Use layout='token_rows', which "
                "runs on every Milvus including Milvus Lite."
            )

    # -- schema ----------------------------------------------------------------------------
    def _names(self) -> list[str]:
        return [self.docs_name]

    def _expected_fields(self, name: str) -> dict[str, tuple[str, dict]]:
        return {"doc_id": ("VARCHAR", {"max_length": ID_BYTES}),
                "meta": ("VARCHAR", {"max_length": MAX_META_BYTES}), "f": ("JSON", {}),
                "n_rows": ("INT64", {})}

    def _build_schema(self, name: str) -> tuple[Any, Any]:
        DataType = _pymilvus().DataType
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False,
                                           description=self._description())
        ip = self.client.prepare_index_params()
        schema.add_field("doc_id", DataType.VARCHAR, is_primary=True, max_length=ID_BYTES)
        schema.add_field("meta", DataType.VARCHAR, max_length=MAX_META_BYTES)
        schema.add_field("f", DataType.JSON)
        schema.add_field("n_rows", DataType.INT64)
        struct = self.client.create_struct_field_schema()
        struct.add_field("v", DataType.FLOAT_VECTOR, dim=DIM)
        schema.add_field("vectors", DataType.ARRAY, element_type=DataType.STRUCT,
                         struct_schema=struct, max_capacity=ARRAY_CAPACITY)
        ip.add_index("vectors[v]", index_type=self.index_type, metric_type="MAX_SIM_IP",
                     params=self.index_params)
        return schema, ip

    # -- writes ----------------------------------------------------------------------------
    def _write(self, ids: list[str], vectors: list[np.ndarray], metadata: list[dict],
               texts: list[str]) -> None:
        for x, v in zip(ids, vectors, strict=True):
            if len(v) > ARRAY_CAPACITY:
                raise ValueError(f"document {x!r} has {len(v)} vectors; the embedding_list layout "
                                 f"holds at most {ARRAY_CAPACITY} per document")
        rows = [{"doc_id": x, "meta": t, "f": filter_fields(m), "n_rows": len(v),
                 "vectors": [{"v": r} for r in v.tolist()]}
                for x, v, m, t in zip(ids, vectors, metadata, texts, strict=True)]
        for batch in self._batches((rows, [len(v) for v in vectors])):
            self.client.upsert(self.docs_name, batch, timeout=self.timeout)

    # -- reads -----------------------------------------------------------------------------
    def _fetch(self, ids: Sequence[str], *, wait: bool = True) -> dict[str, _Stored]:
        """Stored list and metadata of each id (version 0: upserts replace in place).

        Each document's length is read first (small rows), then the documents in queries of
        about ``_request_bytes`` bytes (a document holds up to 4096 vectors, 2 MiB): Milvus
        refuses an answer over 64 MiB. A query refused all the same (documents rewritten longer
        in between) is asked again in halves."""
        level = {} if wait else {"consistency_level": "Eventually"}
        sizes: dict[str, int] = {}
        for chunk in batched(list(dict.fromkeys(ids)), 256):
            res = self.client.query(self.docs_name, filter=_ids_expr(list(chunk)),
                                    output_fields=["doc_id", "n_rows"], timeout=self.timeout, **level)
            for r in res:
                sizes[r["doc_id"]] = (4 * _FIELD_BYTES + 2 * len(r["doc_id"].encode()) + MAX_META_BYTES
                                      + 4 * DIM * int(r["n_rows"]))
        out: dict[str, _Stored] = {}
        chunk: list[str] = []
        nbytes = 0
        for x, b in sizes.items():
            if chunk and nbytes + b > self._request_bytes:
                self._read_lists(chunk, out, level)
                chunk, nbytes = [], 0
            chunk.append(x)
            nbytes += b
        if chunk:
            self._read_lists(chunk, out, level)
        return out

    def _read_lists(self, ids: list[str], out: dict[str, _Stored], level: dict) -> None:
        try:
            res = self.client.query(self.docs_name, filter=_ids_expr(ids),
                                    output_fields=["doc_id", "meta", "vectors"], timeout=self.timeout,
                                    **level)
        except Exception as e:
            if not too_large(e) or len(ids) == 1:
                raise
            self._read_lists(ids[: len(ids) // 2], out, level)
            self._read_lists(ids[len(ids) // 2:], out, level)
            return
        for r in res:
            vec = np.array([e["v"] for e in r["vectors"]], dtype=np.float32).reshape(-1, DIM)
            out[r["doc_id"]] = (vec, json.loads(r["meta"]), 0)

    def _search_one(self, q: np.ndarray, k: int, conditions: tuple[Node, ...], pool: int,
                    explain: bool) -> list[Hit]:
        """Milvus' own MaxSim search names ``max(k, candidates)`` documents (at most the
        16,384 a Milvus search returns); rescored exactly. A filter part that Milvus cannot
        answer exactly (see :func:`~uibk_embedding.adapters.milvus_base.filter_expression`) is
        checked on the rescored documents: while fewer than ``k`` of them match and Milvus
        named as many as asked for, the search deepens (x4, up to 16,384), then rescores every
        document the expression passes, as ``token_rows`` does."""
        if k > MAX_LIMIT:
            raise ValueError(f"k={k}: a Milvus search returns at most {MAX_LIMIT:,} documents, and the "
                             "embedding_list layout ranks with Milvus' own search")
        _pymilvus()  # pymilvus exports EmbeddingList only from this module (3.0.2)
        from pymilvus.client.embedding_list import EmbeddingList

        emb = EmbeddingList(q, dim=DIM)
        expr = filter_expression(conditions)
        limit = min(max(k, pool), MAX_LIMIT)
        cache: dict[str, _Stored | None] = {}  # lists fetched at a shallower depth: not read again
        while True:
            res = self.client.search(self.docs_name, data=[emb], anns_field="vectors[v]", limit=limit,
                                     filter=expr, output_fields=["doc_id"],
                                     search_params={"metric_type": "MAX_SIM_IP",
                                                    "params": dict(self.search_params)},
                                     timeout=self.timeout)
            ids = [h["entity"]["doc_id"] for h in res[0]]
            hits = self._rescore(q, ids, k, conditions, cache, explain=explain)[0]
            if len(hits) >= k or len(ids) < limit:
                return hits  # k hits, or every document the expression passes was named
            if limit >= MAX_LIMIT:
                return self._rescore(q, self._all_ids(expr), k, conditions, cache, explain=explain)[0]
            limit = min(limit * 4, MAX_LIMIT)
