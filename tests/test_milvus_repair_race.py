"""``repair()`` of the Milvus ``token_rows`` layout while another store object writes.

repair() scans both collections, then deletes, per document, the versions it judged stale. A
write of another store object (another process or host) can land at any point in between; it
must survive. Each test runs the other writer's upsert at one point inside repair() (the hook
replaces nothing: it calls the real step afterwards), on Milvus Lite and on the real Milvus 2.3.5
standalone server when this machine can run it.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

import numpy as np
import pytest

pytest.importorskip("pymilvus")

from uibk_embedding.adapters.milvus import MilvusStore, open_milvus_lite
from uibk_embedding.testing import make_list


@pytest.fixture(params=["lite", "standalone"])
def pair(request, tmp_path) -> Iterator[tuple[MilvusStore, MilvusStore]]:
    """Two store objects on one collection: the one repairing and another writer."""
    if request.param == "lite":
        pytest.importorskip("milvus_lite")
        first = open_milvus_lite(path=tmp_path / "m.db", collection="race", exact=True)
        # Milvus Lite allows one store object per collection and process: the other writer
        # shares its client (its own versions, its own lock, as another process would have)
        second = MilvusStore(uri=first.uri, collection="race", client=first.client,
                             index_type="FLAT", exact=True)
        yield first, second
        second.close()
        first.close()
        return
    pytest.importorskip("milvus")
    from uibk_embedding.testing.milvus_server import LocalMilvusServer, user_namespaces_available

    if not user_namespaces_available():
        pytest.skip("cannot confine the Milvus standalone server to 127.0.0.1 (no user namespaces)")
    uri = LocalMilvusServer.shared().uri
    name = "race_" + str(abs(hash(str(tmp_path))))[:12]
    first = MilvusStore(uri=uri, collection=name, index_type="FLAT", exact=True)
    second = MilvusStore(uri=uri, collection=name, index_type="FLAT", exact=True)
    yield first, second
    second.close()
    first.drop()
    first.close()


def _leave_two_versions(store: MilvusStore, doc_id: str, old: np.ndarray, new: np.ndarray) -> None:
    """An upsert interrupted before it deleted the older version: two complete versions."""
    store.upsert([doc_id], [old], [{"v": "old"}])
    real = store._delete_versions
    store._delete_versions = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crash"))
    with pytest.raises(RuntimeError, match="crash"):
        store.upsert([doc_id], [new], [{"v": "new"}])
    store._delete_versions = real


def _leave_orphan_rows(store: MilvusStore, doc_id: str, v: np.ndarray) -> None:
    """A delete interrupted between its two collections: token rows without a document."""
    store.upsert([doc_id], [v])
    real, calls = store.client.delete, []

    def dies_on_the_second(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.EIO, "injected")
        return real(*a, **kw)

    store.client.delete = dies_on_the_second
    with pytest.raises(OSError, match="injected"):
        store.delete([doc_id])
    store.client.delete = real


def _assert_is(store: MilvusStore, doc_id: str, vectors: np.ndarray, md: dict) -> None:
    got = store.get([doc_id])
    assert [r.metadata for r in got] == [md], f"{doc_id}: the acknowledged write is gone"
    np.testing.assert_array_equal(got[0].vectors, vectors)
    assert store.search(vectors, k=1)[0].id == doc_id


@pytest.mark.parametrize("leftover", ["older version", "orphan rows"])
def test_an_upsert_landing_before_repairs_delete_is_kept(pair, fmt, rng, leftover):
    """repair() scanned (the document had leftovers) and is about to delete; another writer's
    upsert of that document is acknowledged now. Before the fix repair deleted every version
    but the one it chose to keep (or all, with no complete version): the upsert was lost."""
    first, second = pair
    if leftover == "older version":
        _leave_two_versions(first, "d", make_list(fmt, rng, 6), make_list(fmt, rng, 7))
    else:
        _leave_orphan_rows(first, "d", make_list(fmt, rng, 6))
    newest = make_list(fmt, rng, 9)
    real, landed = first._delete_versions, []

    def upsert_lands_first(ids, *a, **k):
        if not landed:
            landed.append(second.upsert(["d"], [newest], [{"v": "newest"}]))
        return real(ids, *a, **k)

    first._delete_versions = upsert_lands_first
    # orphan rows are removed once old enough (rows without parts may be a write in progress)
    assert first.repair(**({"abandoned_after": 0} if leftover == "orphan rows" else {})) == 1
    first._delete_versions = real
    assert landed
    _assert_is(second, "d", newest, {"v": "newest"})
    assert first.count() == 1 and first.repair(abandoned_after=0) == 0


def test_an_upsert_landing_between_repairs_scans_is_kept(pair, fmt, rng):
    """The upsert lands after one collection was scanned and before the other: its version is
    seen in one of them only. Before the fix (documents scanned first) its rows looked like
    leftovers of a deleted version, and repair deleted it."""
    first, second = pair
    first.upsert(["d"], [make_list(fmt, rng, 5)], [{"v": "old"}])
    newest = make_list(fmt, rng, 8)
    real, scans = first._query_all, []

    def upsert_lands_after_the_first_scan(*a, **k):
        out = real(*a, **k)
        scans.append(1)
        if len(scans) == 1:
            second.upsert(["d"], [newest], [{"v": "newest"}])
        return out

    first._query_all = upsert_lands_after_the_first_scan
    first.repair()
    first._query_all = real
    assert len(scans) == 2
    _assert_is(second, "d", newest, {"v": "newest"})


def test_a_write_in_progress_is_not_repaired_away(pair, fmt, rng):
    """repair() runs while another writer's upsert has stored one of its three parts: the new
    version is incomplete, not abandoned. Before the fix repair deleted that part, the write
    went on and deleted the old version: the document was gone once the upsert was
    acknowledged."""
    first, second = pair
    first.upsert(["d"], [make_list(fmt, rng, 5)], [{"v": "old"}])
    newest = make_list(fmt, rng, 150)  # three parts of 64 vectors
    second.batch_rows = 64  # one part per insert call
    real, batches = second._batches, []

    def repair_after_the_first_batch(*a, **k):
        for b in real(*a, **k):
            yield b
            batches.append(1)
            if len(batches) == 1:
                first.repair()

    second._batches = repair_after_the_first_batch
    second.upsert(["d"], [newest], [{"v": "newest"}])
    assert len(batches) > 3
    _assert_is(second, "d", newest, {"v": "newest"})


def test_repair_still_removes_an_interrupted_write(pair, fmt, rng):
    """An incomplete newer version (a write that died while storing its parts): kept while it
    may be a running write, removed once older than ``abandoned_after``."""
    first, _ = pair
    v = make_list(fmt, rng, 5)
    first.upsert(["d"], [v], [{"v": 1}])
    ver = first._versions.next()
    first.client.insert(first.docs_name, [{"doc_id": "d", "ver": ver, "part": 0, "n_parts": 2,
                                           "n_rows": 100, "meta": "{}", "f": {}, "vecs": "",
                                           "dummy": [0.0, 0.0]}])
    assert first.repair() == 0  # young: maybe a write in progress
    assert first.repair(abandoned_after=0) == 1
    assert first.repair(abandoned_after=0) == 0
    _assert_is(first, "d", v, {"v": 1})
    with pytest.raises(ValueError, match="abandoned_after"):
        first.repair(abandoned_after=-1)
