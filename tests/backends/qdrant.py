"""Qdrant through qdrant-client (local mode in memory and on disk, and a live server when
``QDRANT_URL`` is set) and Qdrant Edge (the Rust engine in-process), all exact."""

from __future__ import annotations

import atexit
import hashlib
import os
from pathlib import Path

from uibk_embedding.testing import BackendSpec

URL = os.environ.get("QDRANT_URL")
API_KEY = os.environ.get("QDRANT_API_KEY") or None
_created: list[str] = []


def _qdrant(**kw):
    from uibk_embedding.adapters.qdrant import QdrantStore

    return QdrantStore(**kw)


def _edge(path: Path, **kw):
    from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore

    return QdrantEdgeStore(path=path, **kw)


def _server_name(d: Path) -> str:
    """One collection per test directory, so reopening finds the same collection."""
    return "uibk_test_" + hashlib.sha1(str(d).encode()).hexdigest()[:16]


def _server(d: Path, **kw):
    name = _server_name(d)
    store = _qdrant(collection=name, url=URL, api_key=API_KEY, timeout=30, **kw)
    if store.created:
        _created.append(name)
    return store


@atexit.register
def _drop_test_collections() -> None:
    """Drop the collections the server spec created (only those: names made by this run)."""
    if not _created or URL is None:
        return
    from qdrant_client import QdrantClient

    client = QdrantClient(url=URL, api_key=API_KEY, timeout=30)
    for name in _created:
        client.delete_collection(name)
    client.close()


SPECS = [
    BackendSpec("qdrant-memory", make=lambda d: _qdrant(location=":memory:")),
    BackendSpec("qdrant-path", make=lambda d: _qdrant(path=d / "qdrant"),
                reopen=lambda d, **kw: _qdrant(path=d / "qdrant", **kw), takes_create=True, variant=True),
    BackendSpec("qdrant-edge", make=lambda d: _edge(d / "edge"),
                reopen=lambda d, **kw: _edge(d / "edge", **kw)),
    BackendSpec("qdrant-server", make=_server, reopen=_server, takes_create=True,
                skip=None if URL else "QDRANT_URL is not set (no live Qdrant server to test against)"),
]
