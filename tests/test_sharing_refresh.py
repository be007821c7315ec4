"""A reader moves on to newer writes by reading only what changed (issue 62): on a store without
an index (the exact store; PLAID and WARP below ``min_index_vectors``) the documents written since
its snapshot are added to its view and the removed ones dropped, and the view then equals what a
fresh reader reads; a compaction (a new vector-file generation) or an index makes it read the
whole view again."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

FMT = TaggedFormat()


def _docs(seed: int, n: int, rows: int = 6) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(FMT, rng, rows) for _ in range(n)]


def _view(store) -> tuple:
    return (list(store._id_of.items()), dict(store._seq_of), dict(store._start), dict(store._rows),
            store._n_vectors, store._last_seq, store._vf.n_rows, store.count())


def _same_as_a_fresh_reader(reader, path) -> None:
    with ExactStore(path, read_only=True) as fresh:
        assert _view(reader) == _view(fresh)
        for q in _docs(99, 3):
            got, want = reader.search(q, k=5), fresh.search(q, k=5)
            assert [(h.id, h.score, h.metadata) for h in got] == [(h.id, h.score, h.metadata) for h in want]


def test_a_reader_reads_only_the_changes_and_ends_where_a_fresh_reader_starts(tmp_path):
    path = tmp_path / "s"
    docs = _docs(1, 60)
    with ExactStore(path) as w:
        w.upsert([f"d{i}" for i in range(40)], docs[:40], [{"i": i} for i in range(40)])
        r = ExactStore(path, read_only=True)
        try:
            view = r._id_of  # the view's own dictionary: replaced by a full read, kept by a catch-up
            w.upsert([f"d{i}" for i in range(40, 50)], docs[40:50], [{"i": i} for i in range(40, 50)])
            assert r.refresh() and r._id_of is view and r.count() == 50
            _same_as_a_fresh_reader(r, path)
            # overwritten ids (new rows, the old ones removed) and deletes
            w.upsert(["d3", "d45"], docs[50:52], [{"i": "again"}, {"i": "again"}])
            w.delete(["d7", "d41", "missing"])
            assert r.refresh() and r._id_of is view and r.count() == 48
            assert [h.metadata for h in r.search(docs[50], k=1)] == [{"i": "again"}]
            _same_as_a_fresh_reader(r, path)
            assert not r.refresh()  # nothing new
            # the writer compacts the vector file into a new generation: the reader reads it whole
            gen = r._vgen
            w.delete([f"d{i}" for i in range(8, 40)])
            w.compact()
            assert w._vgen != gen
            assert r.refresh() and r._id_of is not view and r._vgen == w._vgen
            _same_as_a_fresh_reader(r, path)
        finally:
            r.close()


def test_a_plaid_reader_reads_the_whole_view_once_the_index_exists(tmp_path):
    pytest.importorskip("fast_plaid")
    from uibk_embedding.plaid_backend.store import PlaidStore

    opts = {"nbits": 2, "kmeans_niters": 1, "num_threads": 1, "min_index_vectors": 200}
    path = tmp_path / "s"
    docs = _docs(2, 40, 9)
    with PlaidStore(path, **opts) as w:
        w.upsert([f"d{i}" for i in range(10)], docs[:10])  # 120 vectors: no index yet
        with PlaidStore(path, read_only=True, **opts) as r:
            view = r._id_of
            w.upsert([f"d{i}" for i in range(10, 15)], docs[10:15])
            assert r.refresh() and r._id_of is view and not r.has_index and r.count() == 15
            w.upsert([f"d{i}" for i in range(15, 40)], docs[15:40])  # 480 vectors: the index is built
            assert w.has_index
            assert r.refresh() and r._id_of is not view and r.has_index and r.count() == 40
            assert [h.id for h in r.search(docs[33], k=1)] == ["d33"]
