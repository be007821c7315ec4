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
    ID_BYTES,
    MAX_LIMIT,
    MAX_META_BYTES,
    MilvusStore,
    _ids_expr,
    _pymilvus,
    _Stored,
    filter_expression,
    filter_fields,
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
        for batch in self._batches(rows, [len(v) for v in vectors]):
            self.client.upsert(self.docs_name, batch, timeout=self.timeout)

    # -- reads -----------------------------------------------------------------------------
    def _fetch(self, ids: Sequence[str], *, wait: bool = True) -> dict[str, _Stored]:
        """Stored list and metadata of each id (version 0: upserts replace in place)."""
        out: dict[str, _Stored] = {}
        for chunk in batched(list(dict.fromkeys(ids)), 256):
            res = self.client.query(self.docs_name, filter=_ids_expr(chunk),
                                    output_fields=["doc_id", "meta", "vectors"], timeout=self.timeout)
            for r in res:
                vec = np.array([e["v"] for e in r["vectors"]], dtype=np.float32).reshape(-1, DIM)
                out[r["doc_id"]] = (vec, json.loads(r["meta"]), 0)
        return out

    def _search_one(self, q: np.ndarray, k: int, conditions: tuple[Node, ...], pool: int,
                    explain: bool) -> list[Hit]:
        """Milvus' own MaxSim search names ``max(k, candidates)`` documents (at most the
        16,384 a Milvus search returns); rescored exactly."""
        if k > MAX_LIMIT:
            raise ValueError(f"k={k}: a Milvus search returns at most {MAX_LIMIT:,} documents, and the "
                             "embedding_list layout ranks with Milvus' own search")
        emb = _pymilvus().EmbeddingList(q, dim=DIM)
        res = self.client.search(self.docs_name, data=[emb], anns_field="vectors[v]",
                                 limit=min(max(k, pool), MAX_LIMIT), filter=filter_expression(conditions),
                                 output_fields=["doc_id"],
                                 search_params={"metric_type": "MAX_SIM_IP",
                                                "params": dict(self.search_params)},
                                 timeout=self.timeout)
        ids = [h["entity"]["doc_id"] for h in res[0]]
        return self._rescore(q, ids, k, conditions, explain=explain)[0]
