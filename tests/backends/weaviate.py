"""Weaviate (>= 1.29) in the conformance suite: runs only against a live server.

Set ``WEAVIATE_URL`` (e.g. ``http://localhost:8080``; optional ``WEAVIATE_GRPC_PORT``, default
50051, and ``WEAVIATE_API_KEY``) to run it; otherwise every case is skipped with that reason.
Each test gets its own throw-away collection (``UibkTest_<run>_<n>``), dropped when the test
process exits. Three variants: plain HNSW, HNSW + exact rerank of candidates, MUVERA (skipped
on servers older than 1.31).

The recall floors are first guesses, not yet measured against a live server.
"""

from __future__ import annotations

import atexit
import os
import uuid
from pathlib import Path

from uibk_embedding.testing import BackendSpec

URL = os.environ.get("WEAVIATE_URL")
SKIP = None if URL else "WEAVIATE_URL is not set: no Weaviate server to run the live Weaviate suite against"

_RUN = uuid.uuid4().hex[:8]
_NAMES: dict[str, str] = {}  # test directory -> collection name (reopen finds the same one)


def _options() -> dict:
    opts: dict = {"url": URL}
    if os.environ.get("WEAVIATE_GRPC_PORT"):
        opts["grpc_port"] = int(os.environ["WEAVIATE_GRPC_PORT"])
    if os.environ.get("WEAVIATE_API_KEY"):
        opts["api_key"] = os.environ["WEAVIATE_API_KEY"]
    return opts


def _name(d: Path, variant: str) -> str:
    key = f"{d}:{variant}"
    if key not in _NAMES:
        _NAMES[key] = f"UibkTest_{_RUN}_{len(_NAMES)}"
    return _NAMES[key]


def _client():
    import weaviate

    from uibk_embedding.adapters.weaviate import connection_kwargs

    opts = _options()
    auth = weaviate.classes.init.Auth.api_key(opts["api_key"]) if "api_key" in opts else None
    return weaviate.connect_to_custom(
        **connection_kwargs(opts["url"], grpc_port=opts.get("grpc_port")), auth_credentials=auth)


def _drop_all() -> None:
    if not _NAMES:
        return
    client = _client()
    try:
        for name in _NAMES.values():
            if client.collections.exists(name):
                client.collections.delete(name)
    finally:
        client.close()


if URL:
    atexit.register(_drop_all)


def _make(variant: str, **kw):
    def make(d: Path, **extra):
        from uibk_embedding.adapters.weaviate import WeaviateStore

        if variant == "muvera":
            import pytest

            from uibk_embedding.adapters.weaviate import MUVERA_MIN_VERSION, parse_version

            with _client() as client:
                version = str(client.get_meta().get("version", "0"))
            if parse_version(version) < MUVERA_MIN_VERSION:
                pytest.skip(f"MUVERA needs Weaviate >= 1.31, the server runs {version}")
        return WeaviateStore(_name(d, variant), **_options(), **kw, **extra)

    return make


SPECS = [
    BackendSpec("weaviate", make=_make("plain"), reopen=_make("plain"), contract="approximate",
                recall_floor=0.9, skip=SKIP, takes_create=True),
    BackendSpec("weaviate-rerank", make=_make("rerank", rerank=True), reopen=_make("rerank", rerank=True),
                contract="approximate", recall_floor=0.9, skip=SKIP, takes_create=True, variant=True),
    BackendSpec("weaviate-muvera", make=_make("muvera", muvera=True), contract="approximate",
                recall_floor=0.7, skip=SKIP, variant=True),
]
