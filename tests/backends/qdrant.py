"""Qdrant through qdrant-client (local mode in memory and on disk, and a live server when
``QDRANT_URL`` is set) and Qdrant Edge (the Rust engine in-process), exact by default.

Profiles (Qdrant's own compression, adapters/qdrant_profiles.py), on Edge, which applies them:
the store optimizes after every write here (:class:`_Settled`), so each search scans the codes a
settled shard holds (``index_used``: they were built), not the originals of new segments.

* ``qdrant-edge-float16``: float16 vectors, exact MaxSim over them: recall floor 1.0, ``get``
  within float16 rounding.
* ``qdrant-edge-compact``: TurboQuant 8-bit rows (``datatype=turbo8``), no originals: recall
  floor RECALL_COMPACT (measured), ``get`` within GET_ATOL_TURBO8 (measured).
* ``qdrant-edge-int8``: scalar int8 codes scanned, not rescored: recall floor RECALL_INT8.
* ``qdrant-edge-int8-rerank``, ``qdrant-edge-exact-rerank``: the codes' best max(100, 4 k)
  rescored from float16 originals: the exact top k of that pool (tests/test_qdrant_profiles.py
  checks the scores), recall floor RECALL_RERANK (measured), ``get`` the float16 originals.
* ``qdrant-path-exact-rerank``: local mode keeps and checks a profile's settings but searches
  exactly: contract "exact".
"""

from __future__ import annotations

import atexit
import hashlib
import os
from pathlib import Path

from uibk_embedding.testing import BackendSpec

URL = os.environ.get("QDRANT_URL")
API_KEY = os.environ.get("QDRANT_API_KEY") or None
_created: list[str] = []
RECALL_COMPACT = 0.99
"""Edge's compact (turbo8 rows) recall@10 floor against exact MaxSim: the lowest measured, rounded
down: 1.0 over the conformance set's 25 real queries; 0.993 (LIMIT-small), 0.996 (Cranfield),
0.999 (NPL) on the shared collections (benchmarks/compact.py --backend qdrant-edge)."""
RECALL_INT8 = 0.96
"""Edge's int8 (scalar codes, not rescored) floor: 0.980 over the conformance set (lowest 0.9),
0.968 (LIMIT-small), 0.984 (Cranfield), 0.982 (NPL)."""
RECALL_RERANK = 1.0
"""int8-rerank and exact-rerank: 1.000 measured everywhere (the conformance set, LIMIT-small,
Cranfield, NPL): the codes' best max(100, 4 k) hold the exact top 10."""
GET_ATOL_TURBO8 = 4e-3
"""turbo8 rows read back: at most 0.0019 a coordinate measured on the conformance set's random
tagged rows, 0.0025 on random unit rows."""


def _qdrant(**kw):
    from uibk_embedding.adapters.qdrant import QdrantStore

    return QdrantStore(**kw)


def _edge(path: Path, **kw):
    from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore

    return QdrantEdgeStore(path=path, **kw)


def _settled(path: Path, profile: str, **kw):
    from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore

    class _Settled(QdrantEdgeStore):
        """Optimizes after every write: its searches scan the codes (a real Edge shard, settled)."""

        def _upsert(self, *a, **k):
            super()._upsert(*a, **k)
            self.optimize()

    return _Settled(path=path, profile=profile, **kw)


def _codes_built(store) -> bool:
    return store.stats()["resident_bytes"] > 0


def _edge_profile(profile: str, **kw) -> BackendSpec:
    return BackendSpec(f"qdrant-edge-{profile}", make=lambda d: _settled(d / "edge", profile),
                       reopen=lambda d, **o: _settled(d / "edge", **{"profile": profile, **o}),
                       contract="approximate", variant=True, **kw)


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
    BackendSpec("qdrant-path-exact-rerank", make=lambda d: _qdrant(path=d / "qdrant", profile="exact-rerank"),
                reopen=lambda d, **kw: _qdrant(path=d / "qdrant", **{"profile": "exact-rerank", **kw}),
                variant=True),
    _edge_profile("float16", recall_floor=1.0, get_atol=1e-3),
    _edge_profile("compact", recall_floor=RECALL_COMPACT, get_atol=GET_ATOL_TURBO8, index_used=_codes_built),
    _edge_profile("int8", recall_floor=RECALL_INT8, get_atol=1e-3, index_used=_codes_built),
    _edge_profile("int8-rerank", recall_floor=RECALL_RERANK, get_atol=1e-3, index_used=_codes_built),
    _edge_profile("exact-rerank", recall_floor=RECALL_RERANK, get_atol=1e-3, index_used=_codes_built),
    BackendSpec("qdrant-server", make=_server, reopen=_server, takes_create=True,
                skip=None if URL else "QDRANT_URL is not set (no live Qdrant server to test against)"),
]
