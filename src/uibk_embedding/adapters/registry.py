"""Backend names -> store classes, imported only when asked for.

Each backend lives in its own module; ``open_store("name", **options)`` imports it on first
use, so a missing optional dependency only matters for the backend that needs it.
``open_store(..., create=False)`` opens an existing store for reading and never creates one.

>>> sorted(BACKENDS)[:3]
['exact', 'lancedb', 'milvus']
>>> open_store("exact").count()
0
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from uibk_embedding._optional import require
from uibk_embedding.adapters.base import MultiVectorStore
from uibk_embedding.errors import CollectionMismatch, StoreNotFound, UnknownBackend

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
    "lancedb": ("uibk_embedding.adapters.lancedb:LanceDBStore", "lancedb"),
}


READ_ONLY_BACKENDS = frozenset({"exact", "plaid", "warp", "lancedb"})
"""The backends whose store takes ``read_only=True`` (refuses writes; a folder shared with a
writer, or made read-only, is searched: docs/serving.md)."""


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


def import_engine(backend: str) -> None:
    """Import a backend's adapter and its engine's libraries, opening nothing.

    A prefork server's master (gunicorn ``--preload``) calls it for a store it leaves to each
    worker (LanceDB's: its runtime must not run before the fork), so the forked workers share the
    libraries' pages instead of each importing its own copy: 4 LanceDB workers beside a writer took
    2.3x the memory of one when each imported LanceDB itself (benchmarks/results/shared_readers.md).
    An adapter names its engine's modules in ``ENGINE_MODULES``; a missing one raises the
    ImportError naming the extra to install.

    >>> import_engine("exact")  # no engine library of its own: imports the adapter only
    >>> try:
    ...     import_engine("nosuch")
    ... except UnknownBackend as e:
    ...     print(str(e)[:32])
    unknown backend 'nosuch'; known:
    """
    factory = backend_factory(backend)
    module = importlib.import_module(factory.__module__)
    for name in getattr(module, "ENGINE_MODULES", ()):
        require(name, BACKENDS[backend][1], f"the {backend} adapter")


def open_store(backend: str | None = None, *, create: bool = True, **options: Any) -> MultiVectorStore:
    """Open (or, with ``create=True``, create) a store of the named backend with
    backend-specific ``options``.

    ``backend=None`` (the default): the backend whose store is at ``path=``, read from its files
    by :func:`find_backend` (the detector ``uibk-embed search`` uses), so
    ``open_store(path=FOLDER)`` opens a folder written by ``uibk-embed index --backend lancedb``
    (or ``qdrant``, ``qdrant-edge``, ``plaid``, ...) as it is; ``"exact"`` when there is no
    ``path`` or nothing is there yet. When the files do not say which backend wrote them, the
    error names the backends to pass.

    ``create=False`` opens a store that exists and creates nothing: for a backend that keeps its
    store in a local folder or file (``exact``, ``plaid``, ``warp``, ``qdrant`` with ``path=``,
    ``qdrant-edge``, ``milvus-lite``, ``lancedb`` with a local ``uri`` or ``path``) a ``path``
    that does not exist, or holds no store of that backend (for ``qdrant`` and ``milvus-lite``: no
    such collection; for ``lancedb``: no such ``table``), raises
    :class:`~uibk_embedding.errors.StoreNotFound` naming the path and the backend, before the
    store class runs, so nothing is created or changed. Without a ``path`` those backends would
    make a new store in memory or a temporary folder, so ``create=False`` refuses that too. A
    backend whose class takes ``create`` (``qdrant``, ``milvus`` and ``weaviate`` servers,
    ``pgvector``, ``lancedb`` on object storage) gets it, and refuses a missing collection or
    table itself.

    >>> import pathlib, tempfile
    >>> store = open_store("exact")
    >>> store.backend
    'exact'
    >>> where = pathlib.Path(tempfile.mkdtemp()) / "never-made"
    >>> try:
    ...     open_store("exact", path=where, create=False)
    ... except StoreNotFound as e:
    ...     print(str(e).replace(str(where), "WHERE"))
    no store at WHERE (no exact store: the path does not exist; nothing was created)
    >>> where.exists()
    False
    >>> with open_store("exact", path=where) as s:        # create=True (the default) makes it
    ...     pass
    >>> open_store("exact", path=where, create=False).count()
    0
    """
    if backend is None:
        backend = find_backend(options)
    factory = backend_factory(backend)
    if not create:
        try:
            require_store(backend, options)
        except StoreNotFound as e:
            found = detect_backend(options["path"], options) if options.get("path") is not None else None
            if found is None or found == backend:
                raise
            raise StoreNotFound(f"{e}; the folder holds {_a(found)} store: pass backend={found!r}") from None
    elif options.get("path") is not None:  # a store of another backend is never written over
        found = detect_backend(options["path"], options)
        if found is not None and found != backend:
            raise CollectionMismatch(f"{options['path']} holds {_a(found)} store, not {_a(backend)} one: "
                                     f"pass backend={found!r} (or give another path); nothing was written")
    if "create" in _parameters(factory):
        options = {**options, "create": create}
    return factory(**options)


def _a(name: str) -> str:
    """``name`` with its article: ``an exact``, ``a lancedb``."""
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def takes_option(backend: str, option: str) -> bool:
    """Whether a backend's store takes a keyword (``profile``, ``read_only``, ...).

    >>> takes_option("exact", "profile"), takes_option("exact", "no_such_option")
    (True, False)
    """
    return option in _parameters(backend_factory(backend))


def _parameters(factory: Any) -> set[str]:
    try:  # a class's own __init__ (MilvusStore's __new__ takes **kwargs)
        return set(inspect.signature(factory.__init__ if isinstance(factory, type) else factory).parameters)
    except (TypeError, ValueError):
        return set()


def require_store(backend: str, options: dict[str, Any]) -> None:
    """Raise :class:`~uibk_embedding.errors.StoreNotFound` unless ``options`` point at an existing
    store of ``backend`` (read from the files alone; nothing is opened, created or changed).
    Server backends are not checked here (their class checks, when it takes ``create``).

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> try:
    ...     require_store("plaid", {"path": d})
    ... except StoreNotFound as e:
    ...     print(str(e).replace(d, "D"))
    no store at D (no plaid store: the folder holds no store.sqlite; nothing was created)
    """
    check = _CHECKS.get(backend)
    if check is None:
        return
    if backend == "qdrant" and options.get("path") is None:
        if any(options.get(k) is not None for k in ("url", "host", "client")) \
                or options.get("location") not in (None, ":memory:"):
            return  # a server: QdrantStore(create=False) refuses a missing collection itself
    if backend == "lancedb":
        if "://" in str(options.get("uri") or ""):
            return  # object storage: LanceDBStore(create=False) refuses a missing table itself
        options = {**options, "path": options.get("path", options.get("uri"))}
    path = options.get("path")
    if path is None:
        raise StoreNotFound(f"no store to read: the {backend} backend without path= would make a new, "
                            "empty store (in memory or a temporary folder); give the path of the store")
    path = Path(os.fspath(path))
    if backend == "milvus-lite" and not path.name.endswith(".db"):
        path = path / "milvus.db"  # where open_milvus_lite keeps a folder's database
    if not path.exists():
        why = "the path does not exist"
    else:
        why = check(path, options)
    if why is not None:
        raise StoreNotFound(f"no store at {path} (no {backend} store: {why}; nothing was created)")


def detect_backend(path: str | os.PathLike, options: dict[str, Any] | None = None) -> str | None:
    """The folder backend whose store is at ``path``, read from that backend's own record (as
    :func:`require_store` reads it: nothing is opened or changed); ``None`` when none is there.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> detect_backend(d) is None
    True
    >>> open_store("exact", path=d).close()
    >>> detect_backend(d)
    'exact'
    """
    options = {**(options or {}), "path": path}
    for backend in _CHECKS:
        try:
            require_store(backend, options)
        except StoreNotFound:
            continue
        return backend
    return None


def find_backend(options: dict[str, Any], default: str = "exact") -> str:
    """The backend whose store is at ``options["path"]``: :func:`detect_backend` (the store and,
    for qdrant, milvus-lite and lancedb, the ``collection`` or ``table`` the options name), else
    the one backend whose files are there (its collection or table is then missing: opening it
    says which it has), else ``default`` (no ``path``, nothing there, or files of no backend).
    Files of several backends and none of them a store: :class:`~uibk_embedding.errors.UnknownBackend`
    naming them, to pass one. Nothing is opened or changed.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> find_backend({"path": d}), find_backend({})
    ('exact', 'exact')
    >>> open_store("lancedb", path=d).close()
    >>> find_backend({"path": d})
    'lancedb'
    """
    path = options.get("path")
    if path is None:
        return default
    found = detect_backend(path, options)
    if found is not None:
        return found
    kinds = _backends_of_files(Path(os.fspath(path)))
    if len(kinds) == 1:
        return kinds[0]
    if kinds:
        raise UnknownBackend(f"cannot tell which backend's store is at {path}: it holds files of "
                             f"{' and '.join(kinds)}, and no store of either that the options name; "
                             f"pass the backend (one of {', '.join(repr(k) for k in kinds)})")
    return default


def _backends_of_files(path: Path) -> list[str]:
    """The folder backends whose files lie at ``path`` (whatever collection or table they hold)."""
    if path.is_file():
        milvus = _sqlite_rows(path, "SELECT 1 FROM collection_meta LIMIT 1") is not None
        return ["milvus-lite"] if milvus else []
    if not path.is_dir():
        return []
    kinds = []
    if (path / "store.sqlite").is_file() or (path / "store.json").is_file():
        rows = _sqlite_rows(path / "store.sqlite", "SELECT value FROM state WHERE key = 'config'") or []
        try:
            kinds.append(json.loads(rows[0][0]).get("backend") or "exact" if rows else "exact")
        except (ValueError, AttributeError):
            kinds.append("exact")
    if (path / "meta.json").is_file():
        kinds.append("qdrant")
    if (path / "edge_config.json").is_file():
        kinds.append("qdrant-edge")
    if (path / "milvus.db").is_file():
        kinds.append("milvus-lite")
    if any(path.glob("*.lance")):
        kinds.append("lancedb")
    return [k for k in kinds if k in BACKENDS]


def _read_json(path: Path) -> dict | None:
    """The JSON object in ``path``; None when it is missing, unreadable or not an object."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _sqlite_rows(db: Path, sql: str, args: tuple = ()) -> list | None:
    """Rows of a query on an SQLite file opened read-only and immutable (nothing written, not even
    a ``-wal``/``-shm`` file); ``None`` when it cannot be read that way. When that finds nothing
    and a ``-wal`` file lies beside it (a writer was killed before its checkpoint), the file is
    read again read-only through the WAL, where the rows then are."""
    rows = _read_only(db, "ro&immutable=1", sql, args)
    if not rows and Path(f"{db}-wal").is_file():
        rows = _read_only(db, "ro", sql, args) or rows
    return rows


def _read_only(db: Path, mode: str, sql: str, args: tuple) -> list | None:
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode={mode}", uri=True)
    except sqlite3.Error:
        return None
    try:
        return con.execute(sql, args).fetchall()
    except sqlite3.Error:
        return None
    finally:
        con.close()


def _lacks(what: str, name: str, have: Iterable[str]) -> str:
    """Why a store file or folder is refused: it holds ``what`` by other names than ``name``.

    >>> _lacks("collection", "uibk", ["papers", "notes"])
    "it has no collection 'uibk' (it has ['notes', 'papers'])"
    """
    return f"it has no {what} {name!r} (it has {sorted(have)})"


def _exact(path: Path, options: dict[str, Any]) -> str | None:
    """The exact store: ``store.sqlite`` naming it, or a folder of 0.4 or older (``store.json``,
    converted when the store opens it)."""
    if path.is_dir() and not (path / "store.sqlite").exists() and (path / "store.json").exists():
        cfg = _read_json(path / "store.json")
        if cfg is None:
            return "the folder holds no readable store.json"
        if cfg.get("backend", "exact") != "exact":
            return f"its store.json is a {cfg.get('backend')!r} store's"
        return None
    return _engine("exact")(path, options)


def _engine(name: str):
    """A file-backed store (exact, PLAID, WARP): ``store.sqlite`` whose configuration names the backend."""

    def check(path: Path, options: dict[str, Any]) -> str | None:
        if not path.is_dir():
            return "the path is not a folder"
        db = path / "store.sqlite"
        if not db.is_file():
            return "the folder holds no store.sqlite"
        rows = _sqlite_rows(db, "SELECT value FROM state WHERE key = 'config'")
        if rows:  # else (none, even in a WAL): a store whose creation died; the class decides
            try:
                found = json.loads(rows[0][0]).get("backend")
            except (ValueError, AttributeError):
                found = None
            if found != name:
                return f"its store.sqlite holds a {found!r} store"
        return None

    return check


def _qdrant_local(path: Path, options: dict[str, Any]) -> str | None:
    if not path.is_dir():
        return "the path is not a folder"
    meta = _read_json(path / "meta.json")
    if not isinstance(meta, dict):
        return "the folder holds no Qdrant local-mode meta.json"
    collection = options.get("collection", "uibk")
    if collection not in (meta.get("collections") or {}):
        return _lacks("collection", collection, meta.get("collections") or {})
    return None


def _qdrant_edge(path: Path, options: dict[str, Any]) -> str | None:
    if not path.is_dir():
        return "the path is not a folder"
    if not (path / "edge_config.json").is_file():
        return "the folder holds no Edge shard (edge_config.json)"
    ours = _read_json(path / "uibk_embedding.json")
    if ours is not None and ours.get("backend", "qdrant-edge") != "qdrant-edge":
        return f"its uibk_embedding.json is a {ours.get('backend')!r} store's"
    return None


def _milvus_lite(path: Path, options: dict[str, Any]) -> str | None:
    if not path.is_file():
        return "the path is not a Milvus Lite database file"
    collection = options.get("collection", "uibk")
    rows = _sqlite_rows(path, "SELECT DISTINCT collection_name FROM collection_meta")
    if rows is None:
        return "the file is not a Milvus Lite database"
    names = {r[0] for r in rows}
    if f"{collection}_docs" not in names:  # the token_rows layout: <name>_rows and <name>_docs
        return _lacks("collection", collection,
                      (n[: -len("_docs")] for n in names if isinstance(n, str) and n.endswith("_docs")))
    return None


def _lancedb(path: Path, options: dict[str, Any]) -> str | None:
    if not path.is_dir():
        return "the path is not a folder"
    table = options.get("table", "uibk")
    if not (path / f"{table}.lance" / "_versions").is_dir():
        return _lacks("LanceDB table", table, (p.name[: -len(".lance")] for p in path.glob("*.lance")))
    return None


_CHECKS = {"exact": _exact, "plaid": _engine("plaid"), "warp": _engine("warp"), "qdrant": _qdrant_local,
           "qdrant-edge": _qdrant_edge, "milvus-lite": _milvus_lite,
           "lancedb": _lancedb}
