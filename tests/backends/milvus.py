"""Milvus in the conformance suite: Milvus Lite, the real standalone server, a live server.

* ``milvus-lite``: Milvus Lite in-process, ``token_rows`` layout with a FLAT row index and
  ``exact=True`` (the exactness bound is checked on every search; unproven searches deepen and,
  at worst, rescore every document), so the contract is "exact".
* ``milvus-standalone``: the real ``milvus run standalone`` 2.3.5 binary from the ``milvus``
  package (test extra), one server per test session, confined to 127.0.0.1 in a private network
  namespace with a temporary data directory, stopped by pid (SIGTERM, grace, SIGKILL) at exit.
  Each store gets its own collections; collections of earlier tests are dropped when the next
  store is made, so the server holds at most one test's data at a time, beside the stores
  shared read-only by several tests (made in folders named ``shared-*``).
* ``milvus-lite-float16``: ``profile="float16"``: FLAT FLOAT16_VECTOR rows find the candidates
  (``rows_per_vector`` each, no exactness bound: it assumes the rows' float32 scores) and the
  float32 lists rescore them: contract "approximate" with recall floor 1.0 (measured 1.0 over
  the conformance set), ``get`` the float32 lists.
* ``milvus-live-*``: the server at ``$MILVUS_URI`` (skipped when unset): ``embedding_list``
  (Milvus >= 2.6.4, HNSW over MAX_SIM_IP: approximate) and ``token_rows``.
"""

import hashlib
import importlib.util
import os
from pathlib import Path

from uibk_embedding.testing import BackendSpec

HAVE_PYMILVUS = importlib.util.find_spec("pymilvus") is not None
HAVE_LITE = HAVE_PYMILVUS and importlib.util.find_spec("milvus_lite") is not None
HAVE_SERVER_PKG = HAVE_PYMILVUS and importlib.util.find_spec("milvus") is not None
MILVUS_URI = os.environ.get("MILVUS_URI", "")


def _name(d: Path, prefix: str) -> str:
    return f"{prefix}_{hashlib.sha1(str(d).encode()).hexdigest()[:16]}"


def _lite(d: Path, **kw):
    from uibk_embedding.adapters.milvus import open_milvus_lite

    return open_milvus_lite(path=d / "lite.db", exact=True, index_type="FLAT", **kw)


def _lite_f16(d: Path, **kw):
    from uibk_embedding.adapters.milvus import open_milvus_lite

    return open_milvus_lite(path=d / "lite.db", index_type="FLAT", **{"profile": "float16", **kw})


_SHARED: set[str] = set()  # collections of stores shared by several tests (folders "shared-*")


def _standalone(d: Path, fresh: bool, **kw):
    from uibk_embedding.adapters.milvus import MilvusStore
    from uibk_embedding.testing.milvus_server import LocalMilvusServer

    server = LocalMilvusServer.shared()
    name = _name(d, "conf")
    if d.name.startswith("shared-"):
        _SHARED.add(name)
    if fresh:  # drop earlier tests' collections: the server holds one test's data at a time
        from pymilvus import MilvusClient

        client = MilvusClient(uri=server.uri)
        try:
            for c in client.list_collections():
                if c.startswith("conf_") and not c.startswith(name + "_") and \
                        not any(c.startswith(s + "_") for s in _SHARED):
                    client.drop_collection(c)
        finally:
            client.close()
    return MilvusStore(uri=server.uri, collection=name, exact=True, index_type="FLAT", **kw)


def _live(d: Path, layout: str):
    from uibk_embedding.adapters.milvus import MilvusStore

    kw = {"index_type": "FLAT", "exact": True} if layout == "token_rows" else {"candidates": 100}
    return MilvusStore(uri=MILVUS_URI, token=os.environ.get("MILVUS_TOKEN", ""),
                       collection=_name(d, f"uibk_test_{layout}"), layout=layout, **kw)


def _skip_standalone() -> str | None:
    if not HAVE_SERVER_PKG:
        return "the 'milvus' package (test extra) is not installed"
    from uibk_embedding.testing.milvus_server import user_namespaces_available

    if not user_namespaces_available():
        return ("cannot confine the Milvus standalone server to 127.0.0.1 here (unprivileged user "
                "namespaces unavailable); set MILVUS_URI to test against a server")
    return None


SPECS = [
    BackendSpec("milvus-lite", make=_lite, reopen=_lite, takes_create=True,
                skip=None if HAVE_LITE else "pymilvus / milvus-lite not installed"),
    BackendSpec("milvus-lite-float16", make=_lite_f16, reopen=_lite_f16, takes_create=True,
                contract="approximate", recall_floor=1.0, variant=True,
                skip=None if HAVE_LITE else "pymilvus / milvus-lite not installed"),
    BackendSpec("milvus-standalone", make=lambda d: _standalone(d, True),
                reopen=lambda d, **kw: _standalone(d, False, **kw), skip=_skip_standalone(),
                takes_create=True),
    BackendSpec("milvus-live-embedding-list", make=lambda d: _live(d, "embedding_list"),
                contract="approximate", recall_floor=0.9,
                skip=None if MILVUS_URI else "MILVUS_URI is not set (a Milvus >= 2.6.4 server)",
                variant=True),
    BackendSpec("milvus-live-token-rows", make=lambda d: _live(d, "token_rows"),
                skip=None if MILVUS_URI else "MILVUS_URI is not set (a Milvus server)"),
]
