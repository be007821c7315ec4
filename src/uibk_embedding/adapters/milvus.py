"""Milvus adapter: tagged multi-vectors on every Milvus, from Milvus Lite to a cluster.

Two layouts behind one entry point, ``MilvusStore(..., layout=...)``, which makes the layout's
class: :class:`~uibk_embedding.adapters.milvus_token_rows.MilvusTokenRowsStore` and
:class:`~uibk_embedding.adapters.milvus_embedding_list.MilvusEmbeddingListStore`, each in its
own module over the shared :class:`~uibk_embedding.adapters.milvus_base.MilvusStore`
(connection, collections and marker, metadata rows, the exact rescoring of candidates):

``token_rows`` (default; every Milvus, Milvus Lite included)
    Two collections. ``<name>_rows`` holds one row per vector (document id, version, 128-d
    ``FLOAT_VECTOR`` with the ``IP`` metric, type-tagged filter values); ``<name>_docs`` holds
    each document's whole tagged list as float32 bytes (base64 in ``VARCHAR`` parts of 64 vectors;
    long documents span several parts) plus its metadata. A base64 part decodes ~100x faster than
    an ``ARRAY<FLOAT>`` (whose ``max_capacity`` Milvus caps at 4096 floats, 32 vectors) and holds
    twice as many vectors.
    A search sends every query vector (slots included) to the row index, takes the union of the
    documents owning the ``rows_per_vector`` nearest rows of each query vector (``candidates`` is
    its deprecated name on this layout), fetches their lists and rescores them with exact
    MaxSim, best score bound first (a candidate's bound takes, per query vector, its best
    returned row or else the last returned score), stopping once the k-th exact score reaches
    the next bound. Scores are therefore always exact MaxSim; the ranking is exact
    when the candidate union contains the true top-k and the row search is exhaustive. Only the
    row search waits for ``Strong`` consistency; lists are read without waiting and re-read if
    older than the rows that nominated them.

    ``exact=True`` (needs ``index_type="FLAT"``, an exhaustive row search) makes that a
    guarantee: a document outside the union can score at most the sum, over query vectors, of
    the score of the last row returned for it (the threshold-algorithm bound). When the k-th
    rescored score reaches that bound, the top-k is provably exact; otherwise the search
    deepens (x4, up to Milvus' 16,384 limit) and, if still unproven, rescores every stored
    document that passes the filter. With the default ``exact=False`` the budget is a plain
    recall/latency knob (see ``benchmarks/milvus_budget.py``).

``embedding_list`` (Milvus >= 2.6.4 only)
    One collection with an ``ARRAY<STRUCT{FLOAT_VECTOR}>`` field indexed with ``MAX_SIM_IP``
    and searched with ``EmbeddingList`` queries; the ``candidates`` best documents are rescored
    exactly. Older servers and Milvus Lite are refused with a clear message (Lite 3.x silently
    drops struct fields and rejects ``MAX_SIM``).

Writes (``upsert``): each call writes a new *version* of its documents (token rows first, then
the document parts, the commit point), then deletes older versions (parts first). Readers only
use the newest *complete* version of a document (every part present; a part stored twice by
a retried insert counts once): ``get``, ``scan``, ``count``, ``delete(filter=...)`` and the
rescoring of a search alike, so a crash between the steps leaves each document either at its
old or its new content in every read, never a mix; leftovers (rows of an unfinished version may
nominate the document, which is then scored on its stored list) are removed by the next write
of that id or by :meth:`MilvusStore.repair`. repair() deletes only
versions known to be stale, each by its exact number, so a write of another store object
landing during it survives; an unfinished version may be a running write, and is removed only
once older than ``abandoned_after`` (one hour; ``repair(abandoned_after=0)`` when no write is
running, ``float("inf")`` never).

Requests stay within Milvus' 64 MiB gRPC message limit: inserts, fetches, scan pages and row
searches are sized to about 16 MiB each (see docs/milvus.md, "Limits").

Filters become Milvus boolean expressions over a JSON field that stores each metadata value
with its type (strings as ``"s<text>"``, booleans as ``"b1"``/``"b0"``, numbers as numbers), so
``True`` never equals ``1`` (Milvus Lite conflates them) and string literals are escaped, never
interpolated raw: a value cannot inject an operator.

Example (Milvus Lite, in-process; a temporary directory is used and removed on ``close``)
-------
>>> import numpy as np
>>> from uibk_embedding.testing import make_list
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> docs = [make_list(fmt, rng, n) for n in (5, 40, 9)]
>>> with open_milvus_lite() as store:
...     store.upsert(["a", "b", "c"], docs, [{"lang": "en"}, {"lang": 'de" or 1==1'}, {}])
...     [h.id for h in store.search(docs[1], k=2)]
...     [h.id for h in store.search(docs[1], k=3, filter={"lang": 'de" or 1==1'})]
['b', 'c']
['b']

A server: ``MilvusStore(uri="http://localhost:19530", collection="papers")``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from uibk_embedding._sqlite_state import lock_folder, sqlite_tables
from uibk_embedding.adapters.milvus_base import (
    DEFAULT_CANDIDATES,
    LAYOUTS,
    MAX_LIMIT,
    MilvusStore,
    encode_filter_value,
    filter_expression,
    filter_fields,
)
from uibk_embedding.adapters.milvus_embedding_list import (
    ARRAY_CAPACITY,
    EMBEDDING_LIST_MIN,
    MilvusEmbeddingListStore,
)
from uibk_embedding.adapters.milvus_token_rows import PART_ROWS, MilvusTokenRowsStore
from uibk_embedding.errors import BackendUnavailable, CollectionMismatch
from uibk_embedding.tagged import DIM

__all__ = [
    "ARRAY_CAPACITY", "DEFAULT_CANDIDATES", "DIM", "EMBEDDING_LIST_MIN", "LAYOUTS", "MAX_LIMIT",
    "PART_ROWS", "MilvusEmbeddingListStore", "MilvusStore", "MilvusTokenRowsStore",
    "encode_filter_value", "filter_expression", "filter_fields", "open_milvus_lite",
]


# -- Milvus Lite -----------------------------------------------------------------------------------
_lite_refs: dict[str, int] = {}
LITE_START_TIMEOUT = 60.0  # seconds to wait for the server of a crashed process to let go
_lite_lock = threading.Lock()


def _stop_lite_server(uri: str) -> None:
    """Stop the Milvus Lite server of ``uri``.

    milvus-lite's own ``release_server`` lets go of the lock file the server watches, waits 2 s
    for it to notice and then SIGKILLs it: every close took 2 s. The server ends at once, and
    cleanly, on SIGTERM (its data reopens complete: tests/test_milvus.py), so it gets that first;
    ``release_server`` then finds it ended and removes its socket and lock file. The process
    handle is milvus-lite's private ``Server._p``: where a release lacks it, the slow path stays.
    """
    from milvus_lite.server_manager import server_manager_instance

    server = server_manager_instance._servers.get(str(Path(uri).absolute().resolve()))
    proc = getattr(server, "_p", None)
    if isinstance(proc, subprocess.Popen) and proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
    server_manager_instance.release_server(uri)


def open_milvus_lite(path: str | os.PathLike | None = None, collection: str = "uibk",
                     **options: Any) -> MilvusStore:
    """A :class:`MilvusStore` on Milvus Lite, in-process (``token_rows`` layout).

    ``path``: the Milvus Lite data directory (named ``*.db`` by pymilvus' convention; created when
    missing, reopened when it holds a store). Without ``path`` a temporary directory is used and
    removed on ``close()``. Other ``options`` go to :class:`MilvusStore`; the row index defaults to
    ``FLAT`` here (Milvus Lite 2.5 builds no HNSW index: FLAT, IVF_FLAT and AUTOINDEX only).

    >>> s = open_milvus_lite()
    >>> s.backend, s.layout, s.count()
    ('milvus-lite', 'token_rows', 0)
    >>> s.close()
    """
    tmp = None
    if path is None:
        tmp = tempfile.mkdtemp(prefix="uibk-milvus-lite-")
        path = os.path.join(tmp, "milvus.db")
    uri = os.path.realpath(os.fspath(path))  # one server per file, as milvus-lite keys them
    if not uri.endswith(".db"):
        uri = os.path.join(uri, "milvus.db")
    if options.get("layout") not in (None, "token_rows"):
        raise ValueError("Milvus Lite supports only layout='token_rows' (no ARRAY of STRUCT, "
                         "no MAX_SIM): embedding_list needs a Milvus server >= 2.6.4")
    options.setdefault("index_type", "FLAT")
    if os.path.lexists(uri):  # before the server opens it (it adds its tables to any SQLite file)
        tables = sqlite_tables(uri) if os.path.isfile(uri) else None
        if tables is None or (tables and "collection_meta" not in tables):
            raise CollectionMismatch(f"{uri} is not a Milvus Lite database (no collection_meta table"
                                     f"{'' if tables is None else f'; it holds {tables[:5]}'}): give "
                                     "its own file, or a new path; nothing was written")
    os.makedirs(os.path.dirname(uri), exist_ok=True)
    # one store object per collection of a Milvus Lite folder, in this and other processes
    lock = lock_folder(f"{uri}.{collection}.lock", f"the Milvus Lite collection {collection!r} at {uri}")
    with _lite_lock:
        _lite_refs[uri] = _lite_refs.get(uri, 0) + 1

    def release() -> None:
        lock.close()
        with _lite_lock:
            _lite_refs[uri] -= 1
            last = _lite_refs[uri] == 0
            if last:
                del _lite_refs[uri]
        if last:
            _stop_lite_server(uri)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    deadline = time.monotonic() + LITE_START_TIMEOUT
    try:
        while True:
            try:
                store = MilvusStore(uri=uri, collection=collection, _on_close=release, **options)
                break
            except BackendUnavailable:
                # the server of a process that died with this folder open stops only once it sees
                # that process's lock released (it polls); until then a new one cannot open the
                # files ("database is locked", or a socket that never answers): wait, bounded
                if time.monotonic() > deadline:  # (a local file: "unavailable" is a server
                    raise                                # that did not come up, or not yet)
                time.sleep(0.5)
    except BaseException:
        release()
        raise
    store.backend = "milvus-lite"  # type: ignore[misc]
    return store
