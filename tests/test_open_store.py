"""``open_store(..., create=False)``: a read never creates a store. A missing store, or a folder
holding no store of the backend, is :class:`StoreNotFound` naming the path and the backend, and
nothing is created or changed; an existing store opens as before."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.adapters.registry import open_store
from uibk_embedding.errors import StoreNotFound
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

# backend -> the option naming where its store lives
FOLDER_BACKENDS = {
    "exact": lambda p: {"path": p},
    "plaid": lambda p: {"path": p},
    "warp": lambda p: {"path": p},
    "qdrant": lambda p: {"path": p, "collection": "docs"},
    "qdrant-edge": lambda p: {"path": p},
    "milvus-lite": lambda p: {"path": p / "milvus.db", "collection": "docs"},
}


def _listing(folder):
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.parametrize("backend", sorted(FOLDER_BACKENDS))
def test_a_missing_store_is_not_created(tmp_path, backend):
    where = tmp_path / "never-made"
    with pytest.raises(StoreNotFound, match=f"(?s){backend}.*never-made|never-made.*{backend}") as e:
        open_store(backend, create=False, **FOLDER_BACKENDS[backend](where))
    assert isinstance(e.value, FileNotFoundError)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("backend", sorted(FOLDER_BACKENDS))
def test_a_folder_without_a_store_is_left_unchanged(tmp_path, backend):
    where = tmp_path / "folder"
    where.mkdir()
    (where / "notes.txt").write_text("mine")
    before = _listing(tmp_path)
    with pytest.raises(StoreNotFound, match="folder"):
        open_store(backend, create=False, **FOLDER_BACKENDS[backend](where))
    assert _listing(tmp_path) == before


def test_another_backends_store_is_not_this_backends(tmp_path):
    with open_store("exact", path=tmp_path / "s") as s:
        s.upsert(["a"], [make_list(TaggedFormat(), np.random.default_rng(0), 4)])
    before = _listing(tmp_path)
    for other in ("plaid", "warp", "qdrant-edge"):
        with pytest.raises(StoreNotFound, match=f"{other}"):
            open_store(other, create=False, path=tmp_path / "s")
    assert _listing(tmp_path) == before


def test_a_qdrant_folder_without_the_collection_is_not_found(tmp_path):
    with open_store("qdrant", path=tmp_path / "q", collection="one"):
        pass
    before = _listing(tmp_path)
    with pytest.raises(StoreNotFound, match="'two'"):
        open_store("qdrant", create=False, path=tmp_path / "q", collection="two")
    assert _listing(tmp_path) == before


def test_a_store_in_memory_cannot_be_read(tmp_path):
    with pytest.raises(StoreNotFound, match="path"):
        open_store("exact", create=False)


@pytest.mark.parametrize("backend", ["exact", "plaid", "qdrant", "qdrant-edge"])
def test_an_existing_store_opens_for_reading(tmp_path, backend):
    opts = FOLDER_BACKENDS[backend](tmp_path / "s")
    doc = make_list(TaggedFormat(), np.random.default_rng(0), 4)
    with open_store(backend, **opts) as s:
        s.upsert(["a"], [doc])
    with open_store(backend, create=False, **opts) as s:
        assert s.count() == 1 and s.backend == backend


@pytest.mark.parametrize("backend", ["exact", "plaid", "warp"])
def test_an_unknown_option_is_refused_with_the_valid_ones(tmp_path, backend):
    """A misspelt constructor option (``pth=``) names itself and lists the options the backend
    takes, before anything is created; so does an unknown search option."""
    with pytest.raises(TypeError, match=r"got unknown option\(s\) pth; it takes path, format, "):
        open_store(backend, pth=tmp_path / "s")
    assert not list(tmp_path.iterdir())
    with open_store(backend, path=tmp_path / "s") as store:
        with pytest.raises(TypeError, match=r"search\(\) got unknown option\(s\) candidate; it takes "):
            store.search(make_list(TaggedFormat(), np.random.default_rng(0), 4), k=1, candidate=5)


# the backends whose engine makes its own files: a write (create=True) into a place that is not
# theirs is refused too, before the engine adds anything (README: "never writes into a folder
# that is not one of its own"); qdrant-edge, exact, PLAID and WARP refuse it themselves
FOREIGN = {
    "qdrant": lambda d: {"path": d, "collection": "docs"},
    "lancedb": lambda d: {"uri": d, "table": "docs"},
    "milvus-lite": lambda d: {"path": d / "mine.db", "collection": "docs"},
}


@pytest.mark.parametrize("backend", sorted(FOREIGN))
def test_a_write_into_a_place_that_is_not_the_backends_is_refused(tmp_path, backend):
    import sqlite3

    from uibk_embedding.errors import CollectionMismatch

    where = tmp_path / "folder"
    where.mkdir()
    (where / "notes.txt").write_text("mine")
    db = sqlite3.connect(where / "mine.db")  # a user's own SQLite file: Milvus Lite added its tables
    db.execute("CREATE TABLE mine (x)")
    db.commit()
    db.close()
    before = _listing(tmp_path)
    with pytest.raises(CollectionMismatch, match="nothing was written"):
        open_store(backend, **FOREIGN[backend](where))
    assert _listing(tmp_path) == before  # no lock file, no table, nothing
    with open_store(backend, **FOREIGN[backend](tmp_path / "new")) as s:  # a new place: made
        s.upsert(["a"], [make_list(TaggedFormat(), np.random.default_rng(0), 4)])
    with open_store(backend, create=False, **FOREIGN[backend](tmp_path / "new")) as s:
        assert s.count() == 1


@pytest.mark.parametrize("backend", ["qdrant", "milvus", "weaviate", "pgvector", "lancedb"])
def test_server_backends_get_create_from_open_store(backend):
    # their class refuses a missing collection itself (tests/conformance: create=False); MilvusStore
    # never got ``create`` (its __new__ hid __init__'s parameters) and PgVectorStore took none
    from uibk_embedding.adapters.registry import _parameters, backend_factory

    pytest.importorskip({"qdrant": "qdrant_client", "milvus": "pymilvus", "weaviate": "weaviate",
                         "pgvector": "psycopg", "lancedb": "lancedb"}[backend])
    assert "create" in _parameters(backend_factory(backend))
