"""Benchmark options per backend for ``uibk-embed compare`` (:mod:`uibk_embedding.apps.compare`):
a store folder inside the work folder, servers from the environment, backends that cannot run
here skipped with the reason.

>>> from pathlib import Path
>>> default_options("exact", Path("/tmp/w"))
{'path': '/tmp/w'}
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from uibk_embedding.adapters.registry import BACKENDS, backend_factory


# -- benchmark defaults per backend -------------------------------------------------------------
def _url_or(env: str, key: str, local: dict[str, Any]) -> Callable[[Path], dict[str, Any]]:
    def make(d: Path) -> dict[str, Any]:
        return {key: os.environ[env]} if os.environ.get(env) else dict(local, path=str(d))

    return make


def _milvus(d: Path) -> dict[str, Any]:
    if os.environ.get("MILVUS_URI"):
        return {"uri": os.environ["MILVUS_URI"], "token": os.environ.get("MILVUS_TOKEN", ""),
                "collection": f"uibk_compare_{os.getpid()}"}
    return {"_local_server": True, "collection": f"uibk_compare_{os.getpid()}"}


def _pgvector(d: Path) -> dict[str, Any]:
    table = f"uibk_compare_{os.getpid()}"
    if os.environ.get("PG_DSN"):  # the table is dropped again at the end
        return {"dsn": os.environ["PG_DSN"], "table": table, "_drop_table": True}
    return {"_local_pg": True, "table": table}


def _weaviate(d: Path) -> dict[str, Any]:
    if not os.environ.get("WEAVIATE_URL"):
        raise _Skip("WEAVIATE_URL is not set (Weaviate needs a server)")
    return {"url": os.environ["WEAVIATE_URL"], "collection": f"UibkCompare{os.getpid()}"}


DEFAULT_OPTIONS: dict[str, Callable[[Path], dict[str, Any]]] = {
    # name -> options from the backend's own folder inside the work folder
    "exact": lambda d: {"path": str(d)},
    # PLAID and WARP search exactly below min_index_vectors (6,000,000 and 1,000,000 vectors by
    # default), which would time the exact scan under their names: compare measures the engines,
    # so they index at any size (compare flushes every store before its warm-up query)
    "plaid": lambda d: {"path": str(d), "min_index_vectors": 1},
    "warp": lambda d: {"path": str(d), "min_index_vectors": 1},
    "qdrant": _url_or("QDRANT_URL", "url", {"collection": "uibk"}),  # else local mode on disk
    "qdrant-edge": lambda d: {"path": str(d)},
    "milvus-lite": lambda d: {"path": str(d / "milvus.db")},
    "lancedb": lambda d: {"path": str(d)},  # exact mode (flat MaxSim) unless --option mode=index
    "milvus": _milvus,
    "pgvector": _pgvector,
    "weaviate": _weaviate,
}
"""Options a backend gets in a benchmark unless ``--option`` overrides them. A backend not listed
gets ``path=<its folder>`` when its constructor takes a ``path``, else nothing. The report says
which path answered each backend's searches (``search``: ``"index"`` or ``"exact"``, from the
store's ``stats()``) where the store tells."""


LOCAL_BACKENDS = ("exact", "plaid", "warp", "qdrant", "qdrant-edge", "milvus-lite", "lancedb")
"""The backends that run inside the worker process with nothing else to start or reach: the default
of ``uibk-embed compare --backends``. ``qdrant`` counts only in local mode (``QDRANT_URL`` unset);
``milvus``, ``pgvector`` and ``weaviate`` need a server (or start one) and run only when named."""


def default_backends(registered: Any = None) -> list[str]:
    """The backends ``uibk-embed compare`` runs without ``--backends``: the local ones registered.

    >>> import os
    >>> "milvus" in default_backends(), "exact" in default_backends()
    (False, True)
    """
    if registered is None:
        registered = BACKENDS
    return [n for n in LOCAL_BACKENDS if n in registered
            and not (n == "qdrant" and os.environ.get("QDRANT_URL"))]


class _Skip(Exception):
    """A backend that cannot run here (the message says why)."""


def default_options(name: str, folder: Path) -> dict[str, Any]:
    """The benchmark options of backend ``name`` with its store in ``folder``.

    >>> default_options("exact", Path("/tmp/x"))
    {'path': '/tmp/x'}
    """
    if name in DEFAULT_OPTIONS:
        return DEFAULT_OPTIONS[name](folder)

    try:
        params = inspect.signature(backend_factory(name)).parameters
    except (TypeError, ValueError):
        return {}
    return {"path": str(folder)} if "path" in params else {}
