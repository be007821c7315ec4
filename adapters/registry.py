"""Backend names -> store classes, imported only when asked for.

Each backend lives in its own module; ``open_store("name", **options)`` imports it on first
use, so a missing optional dependency only matters for the backend that needs it.

>>> sorted(BACKENDS)[:3]
['exact', 'milvus', 'milvus-lite']
>>> open_store("exact").count()
0
"""

from __future__ import annotations

import importlib
from typing import Any

from uibk_embedding.adapters.base import MultiVectorStore
from uibk_embedding.errors import UnknownBackend

# name -> ("module:callable", extra that provides its dependencies)
BACKENDS: dict[str, tuple[str, str]] = {
    "exact": ("uibk_embedding.adapters.exact:ExactStore", ""),
    "plaid": ("uibk_embedding.plaid_backend.store:PlaidStore", "plaid"),
    "warp": ("uibk_embedding.adapters.warp:WarpStore", "warp"),
    "qdrant": ("uibk_embedding.adapters.qdrant:QdrantStore", "qdrant"),
    "qdrant-edge": ("uibk_embedding.adapters.qdrant_edge:QdrantEdgeStore", "qdrant"),
    "milvus-lite": ("uibk_embedding.adapters.milvus:open_milvus_lite", "milvus"),
    "milvus": ("uibk_embedding.adapters.milvus:MilvusStore", "milvus"),
    "weaviate": ("uibk_embedding.adapters.weaviate:WeaviateStore", "weaviate"),
    "pgvector": ("uibk_embedding.adapters.pgvector:PgVectorStore", "pgvector"),
}


def backend_factory(backend: str) -> Any:
    """The class (or factory function) behind a backend name."""
    if backend not in BACKENDS:
        raise UnknownBackend(f"unknown backend {backend!r}; known: {', '.join(sorted(BACKENDS))}")
    target, _extra = BACKENDS[backend]
    mod_name, attr = target.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("uibk_embedding"):
            raise UnknownBackend(f"backend {backend!r} is not available in this version") from e
        raise
    return getattr(mod, attr)


def open_store(backend: str = "exact", **options: Any) -> MultiVectorStore:
    """Open (or create) a store of the named backend with backend-specific ``options``.

    >>> store = open_store("exact")
    >>> store.backend
    'exact'
    """
    return backend_factory(backend)(**options)
