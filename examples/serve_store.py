"""Serve one store folder from a pool of worker processes (docs/serving.md).

Every worker opens the same folder read-only at start-up, with its own copy of the encoder; a
writer (``examples/index_more.py`` or ``uibk-embed index``) adds documents beside the running
service, and every worker answers from the newest committed state: the store checks for newer
writes before each search (one ``PRAGMA data_version``, some microseconds; docs/sharing.md).

    UIBK_STORE=./my-index uvicorn examples.serve_store:app --workers 2 --port 8000
    curl 'http://127.0.0.1:8000/search?q=slipstream+lift&k=5'

Prefork, the memory-sharing mode (the ``serve`` extra installs gunicorn): with
``UIBK_PRELOAD=1`` the module imports the backend's libraries (torch, the engine), opens the
store and loads the encoder when it is imported, and ``gunicorn --preload`` imports it once in
its master before forking the workers, so those pages are shared copy-on-write instead of
loaded again in each worker (docs/sharing.md, "Memory of N workers"):

    UIBK_PRELOAD=1 UIBK_STORE=./my-index gunicorn --preload -k uvicorn.workers.UvicornWorker \
        -w 2 -b 127.0.0.1:8000 examples.serve_store:app

Each worker's first call on the inherited store object opens its own SQLite connection (a
connection is never used across a fork; docs/sharing.md, "Forked workers"); a store object that
is not fork-safe (LanceDB's) is opened in each worker instead (the master only imports its
libraries, which the workers then share: registry.import_engine).

Settings (environment variables, read by each worker):

* ``UIBK_STORE``: the store folder (required; it must exist: build it first).
* ``UIBK_BACKEND``: the backend that wrote it (default: read from the folder, as
  ``uibk-embed search`` does; ``exact``, ``plaid``, ``warp``, ``lancedb``, ...).
* ``UIBK_ENCODER``: an encoder folder (default: the embedded default, offline).
* ``UIBK_ENCODER_URL``: encode queries on a ``uibk-embed serve`` server instead (one model for
  every worker, instead of one per worker).
* ``UIBK_TORCH_THREADS``: torch threads per worker for the query encoder (default 1: with as
  many workers as cores, more threads only compete for the same cores).
* ``UIBK_PRELOAD``: ``1`` opens the store and loads the encoder at import time (for
  ``gunicorn --preload``; see above); otherwise each worker does at its start-up.

Endpoints:

* ``GET /search?q=TEXT&k=10[&w=DENSE_WEIGHT][&filter=JSON][&min_relevance=0.5]``:
  ``{"hits": [{"id", "score", "relevance", "metadata"}, ...], "pid"}``.
* ``GET /health``: 200 once the worker has its store and encoder (``pid``, ``backend``,
  ``count``, ``encoder``, ``loaded_by``: the process that loaded the encoder, gunicorn's
  master when preloaded).

Every answer carries the worker's process id in ``X-Worker-Pid`` (and ``pid`` in the body).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request

import uibk_embedding as ue
from uibk_embedding.adapters.registry import detect_backend, import_engine
from uibk_embedding.errors import UnknownBackend

_state: dict[str, Any] = {}
_encode_lock = threading.Lock()  # one query encoding at a time per worker (the torch model's rule)


FORK_SAFE = {"exact", "plaid", "warp"}
"""Backends whose store objects may be opened before a fork and used in the child (each child
opens its own SQLite connection: docs/sharing.md, "Forked workers")."""


def _open_store(path: str) -> Any:
    # read_only: this worker never writes (a write is refused), and several workers and a writer
    # share the folder; create=False: a wrong path is an error, not a new empty store.
    return ue.open_store(os.environ.get("UIBK_BACKEND") or None, path=path, read_only=True, create=False)


def _open(preloading: bool = False) -> None:
    """Open the store (read-only, never created) and the query encoder of this worker; when
    ``preloading`` (gunicorn's master, before the fork), a store that is not fork-safe is left to
    each worker (its adapter and engine libraries only imported: LanceDB's runtime must not run
    before the fork)."""
    path = os.environ.get("UIBK_STORE")
    if not path:
        raise RuntimeError("set UIBK_STORE to the store folder to serve (build it first: "
                           "uibk-embed index corpus.jsonl --path FOLDER, or examples/index_more.py)")
    store = None
    backend = os.environ.get("UIBK_BACKEND") or detect_backend(path)
    if preloading and backend not in FORK_SAFE:  # its libraries shared, its runtime never started
        with contextlib.suppress(ImportError, UnknownBackend):  # each worker's open says what is wrong
            import_engine(backend)
    else:
        store = _open_store(path)
    try:
        url = os.environ.get("UIBK_ENCODER_URL")
        if url:
            from uibk_embedding.encoder.remote import RemoteEncoder

            enc: Any = RemoteEncoder(url)
        else:
            threads = int(os.environ.get("UIBK_TORCH_THREADS", "1"))
            enc = ue.load_encoder(os.environ.get("UIBK_ENCODER") or None, num_threads=threads)
    except BaseException:
        if store is not None:
            store.close()
        raise
    _state.update(store=store, encoder=enc, path=path, loaded_by=os.getpid())


@asynccontextmanager
async def lifespan(app: FastAPI):
    if "encoder" not in _state:  # not preloaded: this worker opens its own
        _open()
    elif _state["store"] is None:  # preloaded, but the store is not fork-safe: opened per worker
        _state["store"] = _open_store(_state["path"])
    try:
        yield
    finally:
        store = _state.pop("store", None)
        if store is not None:
            store.close()
        enc = _state.pop("encoder", None)
        if enc is not None and hasattr(enc, "close"):
            enc.close()


app = FastAPI(title="uibk-embedding store", lifespan=lifespan)

if os.environ.get("UIBK_PRELOAD") == "1":
    # gunicorn --preload: loaded once in the master, shared copy-on-write by the forked workers;
    # gc.freeze() keeps the cyclic GC of a worker from writing to (and so copying) these pages
    _open(preloading=True)
    gc.collect()
    gc.freeze()


@app.middleware("http")
async def worker_pid(request: Request, call_next):
    response = await call_next(request)
    response.headers["X-Worker-Pid"] = str(os.getpid())
    return response


@app.get("/health")
def health() -> dict[str, Any]:
    store, enc = _state["store"], _state["encoder"]
    return {"status": "ok", "pid": os.getpid(), "store": _state["path"], "backend": store.backend,
            "count": store.count(), "encoder": getattr(enc, "model_name", type(enc).__name__),
            "loaded_by": _state["loaded_by"]}


@app.get("/search")
def search(
    q: Annotated[str, Query(min_length=1, max_length=4096, description="the query text")],
    k: Annotated[int, Query(ge=1, le=1000)] = 10,
    w: Annotated[float | None, Query(ge=0, description="dense weight (default: the encoder's)")] = None,
    filter: Annotated[str | None, Query(description='a JSON filter, e.g. {"topic": "finance"}')] = None,
    min_relevance: Annotated[float, Query(ge=0, le=1)] = 0.0,
) -> dict[str, Any]:
    # A plain `def`: FastAPI runs it in its thread pool, so the event loop keeps accepting.
    store, enc = _state["store"], _state["encoder"]
    try:
        try:
            flt = json.loads(filter) if filter is not None else None
        except ValueError as e:
            raise ValueError(f"filter is not JSON: {e}") from None
        with _encode_lock:
            query = enc.encode_queries([q], dense_weight=w)[0]
        hits = store.search(query, k=k, filter=flt)  # sees the writer's newest committed state
    except (ValueError, TypeError) as e:  # a bad filter, an empty query after tokenisation, ...
        raise HTTPException(status_code=400, detail=str(e)) from None
    return {"pid": os.getpid(),
            "hits": [{"id": h.id, "score": h.score, "relevance": h.relevance, "metadata": h.metadata}
                     for h in hits if h.relevance is not None and h.relevance >= min_relevance]}
