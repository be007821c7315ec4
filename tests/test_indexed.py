"""The file-backed engine store (:mod:`uibk_embedding.adapters.indexed`) as such: stores written
with the state keys of the code before it (PLAID ``plaid_dir``..., WARP ``vf_generation``...)
open without a rebuild and have their keys renamed in one go; the demonstration engine goes
through writes, a reopen and the repair of a dirty index; the deprecated option names keep
working; WARP's in-place flush is durable before it is marked clean."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from uibk_embedding._sqlite_state import connect, state_set, stored_state, transaction
from uibk_embedding.adapters.indexed import DEFAULT_MIN_INDEX_VECTORS, ScanEngine
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

NEW_KEYS = ["index_dir", "vector_gen", "vector_rows", "built_vectors"]


def docs_for(seed: int, n: int, rows: int = 20) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_list(TaggedFormat(), rng, rows) for _ in range(n)]


def _state(path: Path) -> dict[str, str]:
    db = sqlite3.connect(path / "store.sqlite")
    try:
        return dict(db.execute("SELECT key, value FROM state"))
    finally:
        db.close()


def _write_old_layout(path: Path, renames: dict[str, str], drop: tuple[str, ...] = ()) -> None:
    """Rewrite the state rows of a closed store as the code before the shared store wrote them:
    ``renames`` maps today's key to the old one; ``drop`` lists keys the old code never wrote."""
    db = sqlite3.connect(path / "store.sqlite")
    with db:
        for new, old in renames.items():
            db.execute("UPDATE state SET key = ? WHERE key = ?", (old, new))
        for key in drop:
            db.execute("DELETE FROM state WHERE key = ?", (key,))
    db.close()


def _reopened_cleanly(make, path: Path, vecs: list[np.ndarray], ids: list[str], old_keys: list[str]):
    before = _state(path)
    renamed = {o: n for o, n in zip(old_keys, NEW_KEYS, strict=True) if o != n}
    assert set(renamed) <= set(before) and not set(renamed.values()) & set(before)  # the old layout
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no rebuild, no conversion
        s = make(path)
    try:
        after = _state(path)
        assert not set(renamed) & set(after)
        assert [after[k] for k in NEW_KEYS] == [before[o] for o in old_keys]
        assert after["generation"] == before["generation"]  # the index it had is the one it uses
        assert s.has_index and s.count() == len(ids)
        rerank, s.rerank = s.rerank, False  # the engine's own hits: its id map decides
        try:
            assert [s.search(v, k=1)[0].id for v in vecs[:8]] == ids[:8]
        finally:
            s.rerank = rerank
        s.upsert(["extra"], docs_for(99, 1))  # and it goes on writing under the new keys
        assert s.count() == len(ids) + 1
    finally:
        s.close()
    again = make(path)
    try:
        assert again.count() == len(ids) + 1 and again.get(["extra"])[0].id == "extra"
    finally:
        again.close()


def test_plaid_store_with_the_previous_state_keys_opens(tmp_path):
    pytest.importorskip("fast_plaid")
    from uibk_embedding.plaid_backend.store import PlaidStore

    def make(p):
        return PlaidStore(p, nbits=2, kmeans_niters=1, num_threads=1, min_index_vectors=64)

    path, vecs = tmp_path / "p", docs_for(1, 40)
    ids = [f"d{i}" for i in range(40)]
    s = make(path)
    s.upsert(ids, vecs)
    assert s.has_index
    s.close()
    # the PLAID code before the shared store: plaid_dir, and no last_seq
    _write_old_layout(path, {"index_dir": "plaid_dir"}, drop=("last_seq",))
    _reopened_cleanly(make, path, vecs, ids, ["plaid_dir", "vector_gen", "vector_rows", "built_vectors"])


def test_warp_store_with_the_previous_state_keys_opens(tmp_path):
    pytest.importorskip("xtr_warp")
    from uibk_embedding.adapters.warp import WarpStore

    def make(p):
        return WarpStore(p, nbits=2, kmeans_niters=1, min_index_vectors=64, buffer_size=0)

    path, vecs = tmp_path / "w", docs_for(2, 40)
    ids = [f"d{i}" for i in range(40)]
    s = make(path)
    s.upsert(ids, vecs)
    s.delete(["d39"])  # a dead pid in the table
    s.upsert(["d39"], [vecs[39]])
    s.flush()
    assert s.has_index and s.n_pending == 0
    s.close()
    old = {"vector_gen": "vf_generation", "vector_rows": "vf_rows", "built_vectors": "trained_vectors"}
    _write_old_layout(path, old)
    _reopened_cleanly(make, path, vecs, ids, ["index_dir", "vf_generation", "vf_rows", "trained_vectors"])


def test_scan_engine_writes_reopens_and_repairs_a_dirty_index(tmp_path):
    """The demonstration engine: the whole store life cycle on 30 lines of engine."""
    path, vecs = tmp_path / "s", docs_for(3, 12, rows=6)
    ids = [f"d{i}" for i in range(12)]
    s = ScanEngine(path, min_index_vectors=40, candidates=3)
    s.upsert(ids[:4], vecs[:4])
    assert not s.has_index  # 4 * 6 vectors: below min_index_vectors, exact
    s.upsert(ids[4:], vecs[4:], [{"i": i} for i in range(4, 12)])
    assert s.has_index and stored_state(path, "index_dir") == "scan-000002"
    s.delete(["d5"])
    s.upsert(["d6"], [vecs[6]], [{"i": 66}])  # an overwrite: in-place updates, no rebuild
    assert stored_state(path, "generation") == "2" and stored_state(path, "dirty") == "0"
    expect = [x for x in ids if x != "d5"]
    assert [s.search(vecs[int(x[1:])], k=1)[0].id for x in expect] == expect
    assert [h.id for h in s.search(vecs[6], k=3, filter={"i": 66})] == ["d6"]
    s.close()
    db = connect(path / "store.sqlite")
    with transaction(db):
        state_set(db, dirty="1")  # an interrupted write
    db.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # opening repairs nothing: a reader
        s = ScanEngine(path, min_index_vectors=40, candidates=3)
    try:
        assert not s.has_index and stored_state(path, "dirty") == "1"
        assert s.count() == 11 and [s.search(vecs[8], k=1)[0].id] == ["d8"]  # exact meanwhile
        with pytest.warns(RuntimeWarning, match="interrupted write"):
            s.flush()  # the first write repairs it
        assert stored_state(path, "dirty") == "0" and stored_state(path, "index_dir") == "scan-000003"
        assert not (path / "scan-000002").exists()  # the stale index is gone
        assert s.count() == 11 and [s.search(vecs[7], k=1)[0].id] == ["d7"]
    finally:
        s.close()


def test_deprecated_option_names_are_aliases(tmp_path):
    with pytest.warns(DeprecationWarning, match="n_rerank is deprecated; use candidates"):
        s = ScanEngine(tmp_path / "s", n_rerank=7)
    try:
        assert (s.candidates, s.n_rerank) == (7, 7)
        s.n_rerank = 9  # the attribute too (benchmarks set it)
        assert s.candidates == 9
        with pytest.raises(TypeError, match="not both"):
            ScanEngine(tmp_path / "t", n_rerank=7, candidates=7)
        with pytest.raises(ValueError, match="n_rerank must be a positive int"):
            ScanEngine(tmp_path / "u", n_rerank=0)
        with pytest.raises(TypeError, match=r"unknown option.*takes rerank, candidates"):
            s.search(docs_for(4, 1)[0], k=1, n_rerank=5)
        with pytest.raises(ValueError, match="candidates must be a positive int"):
            s.search(docs_for(4, 1)[0], k=1, candidates=0)
    finally:
        s.close()


def test_per_query_rerank_and_candidates(tmp_path):
    """A pool of 1 with rerank returns the engine's single best candidate; rerank=False the
    engine's own order and scores; candidates=k*... per query widens the pool."""
    vecs = docs_for(5, 30, rows=6)
    ids = [f"d{i}" for i in range(30)]
    s = ScanEngine(tmp_path / "s", min_index_vectors=8, candidates=1)
    s.upsert(ids, vecs)
    try:
        q = vecs[11]
        exact = s.search(q, k=5, candidates=1000)  # the pool holds every document: exact
        engine = s.search(q, k=5, rerank=False)
        assert exact[0].id == "d11"
        assert [h.score for h in engine] == sorted((h.score for h in engine), reverse=True)
        assert [h.id for h in s.search(q, k=5, candidates=1000)] == [h.id for h in exact]
        assert len(s.search(q, k=5)) == 5  # the pool is at least k
    finally:
        s.close()


def test_warp_retrain_factor_is_the_deprecated_name_of_rebuild_growth(tmp_path):
    pytest.importorskip("xtr_warp")
    from uibk_embedding.adapters.warp import WarpStore

    with pytest.warns(DeprecationWarning, match="retrain_factor is deprecated; use rebuild_growth"):
        s = WarpStore(tmp_path / "w", retrain_factor=3.0)
    try:
        assert (s.rebuild_growth, s.retrain_factor) == (3.0, 3.0)
    finally:
        s.close()
    with pytest.raises(ValueError, match="retrain_factor must be a number > 1"):
        WarpStore(tmp_path / "x", retrain_factor=1)
    with pytest.raises(ValueError, match="rebuild_growth must be a number > 1"):
        WarpStore(tmp_path / "y", rebuild_growth=0.5)


class _OrderedEngine(ScanEngine):
    """The scan engine with a candidate order set by the test (``order``: seqs, best first)."""

    order: ClassVar[list[int]] = []

    def _engine_candidates(self, queries, top, subset):
        allowed = None if subset is None else set(subset)
        cands = [(s, 0.0) for s in self.order if allowed is None or s in allowed][:top]
        return [cands for _ in queries]


def _ordered_store(tmp_path, n=64, **options):
    """A store of ``n`` documents and a query whose exact ranking is known: ``ranking`` lists the
    seqs, best first."""
    from uibk_embedding.maxsim import maxsim

    vecs = docs_for(7, n, rows=6)
    q = docs_for(8, 1, rows=6)[0]
    s = _OrderedEngine(tmp_path / "s", min_index_vectors=8, **options)
    s.upsert([f"d{i}" for i in range(n)], vecs)
    seqs = sorted(s._id_of)
    ranking = sorted(seqs, key=lambda i: -maxsim(q, vecs[seqs.index(i)]))
    scored: list[int] = []
    real = s._fetch

    def counting(keys):  # the rerank's reads of stored lists
        scored.append(len(keys))
        return real(keys)

    s._fetch = counting
    return s, q, ranking, scored


def test_the_pool_doubles_while_the_top_k_reaches_deep(tmp_path):
    """The engine puts the 1st and 2nd best documents first, the 3rd at rank 40 and the others
    worst first, so every pool's best 3 include its deepest candidate: the pool doubles from 8
    to 64 and finds the 3rd; held at 8 (``candidates_limit=8``) it cannot."""
    s, q, ranking, scored = _ordered_store(tmp_path, candidates=8, candidates_limit=64)
    try:
        top3, rest = ranking[:3], ranking[3:][::-1]
        s.order = [top3[0], top3[1], *rest[:38], top3[2], *rest[38:]]
        want = [s._id_of[i] for i in top3]
        assert [h.id for h in s.search(q, k=3)] == want
        assert scored == [8, 8, 16, 32]  # 8 -> 16 -> 32 -> 64 candidates, each scored once
        scored.clear()
        held = [h.id for h in s.search(q, k=3, candidates_limit=8)]
        assert held[:2] == want[:2] and want[2] not in held and scored == [8]
    finally:
        s.close()


def test_the_pool_stays_when_the_engine_order_is_good(tmp_path):
    """With the exact order from the engine the best 3 sit in the first half of the pool: one
    pool of 8 is scored, whatever the limit."""
    s, q, ranking, scored = _ordered_store(tmp_path, candidates=8, candidates_limit=64)
    try:
        s.order = ranking
        assert [h.id for h in s.search(q, k=3)] == [s._id_of[i] for i in ranking[:3]]
        assert scored == [8]
        for bad in (0, -1, 1.5, "64"):
            with pytest.raises(ValueError, match="candidates_limit"):
                s.search(q, k=3, candidates_limit=bad)
        with pytest.raises(ValueError, match="candidates_limit"):
            _OrderedEngine(tmp_path / "t", candidates_limit=0)
    finally:
        s.close()


def _engine(name: str):
    """A store factory of the engine ``name`` (cheap build parameters), or a skip."""
    if name == "plaid":
        pytest.importorskip("fast_plaid")
        from uibk_embedding.plaid_backend.store import PlaidStore

        return lambda p, **o: PlaidStore(p, nbits=2, kmeans_niters=1, num_threads=1, **o)
    if name == "warp":
        pytest.importorskip("xtr_warp")
        from uibk_embedding.adapters.warp import WarpStore

        return lambda p, **o: WarpStore(p, nbits=2, kmeans_niters=1, buffer_size=0, **o)
    return lambda p, **o: ScanEngine(p, candidates=3, **o)


@pytest.mark.parametrize("engine", ["scan", "plaid", "warp"])
def test_a_store_deleted_below_min_index_vectors_searches_exactly(tmp_path, engine):
    """Every engine: deletes that take the store under ``min_index_vectors`` and under half the
    vectors its index was built from drop the index (its folder, and WARP's pids); the store
    answers the exact MaxSim top k, before and after a reopen, and ``rebuild()`` of 2 documents
    keeps it that way."""
    from uibk_embedding.maxsim import maxsim

    make, path = _engine(engine), tmp_path / "s"
    vecs, ids = docs_for(20, 12), [f"d{i}" for i in range(12)]  # 12 x 23 = 276 vectors
    s = make(path, min_index_vectors=200)
    s.upsert(ids, vecs)
    s.flush()
    assert s.has_index
    s.delete(ids[:7])  # 5 x 23 = 115 < 200, and < 138 (half of 276)
    s.flush()
    assert not s.has_index and stored_state(path, "index_dir") == ""
    stored = {x: s.get([x])[0].vectors for x in ids[7:]}
    queries = [vecs[8], *docs_for(21, 2)]

    def exact_hits(store) -> None:
        for q in queries:
            want = sorted(stored, key=lambda x: -maxsim(q, stored[x]))[:4]
            for rerank in (True, False):
                got = store.search(q, k=4, rerank=rerank)
                assert [h.id for h in got] == want, rerank
                np.testing.assert_allclose([h.score for h in got], [maxsim(q, stored[x]) for x in want],
                                           rtol=1e-5)

    exact_hits(s)
    s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing to repair
        s = make(path, min_index_vectors=200)
    try:
        assert s.count() == 5 and not s.has_index
        exact_hits(s)
        s.delete(ids[7:10])
        stored = {x: stored[x] for x in ids[10:]}
        s.rebuild()  # 2 documents
        assert not s.has_index and s.count() == 2
        exact_hits(s)
    finally:
        s.close()


def _assert_exact_top(store, stored: dict[str, np.ndarray], queries: list[np.ndarray], k: int = 4) -> None:
    """``store`` answers every query with the exact MaxSim top ``k`` of ``stored`` (ids in order)."""
    from uibk_embedding.maxsim import maxsim

    for q in queries:
        want = sorted(stored, key=lambda x: -maxsim(q, stored[x]))[:k]
        assert [h.id for h in store.search(q, k=k)] == want


@pytest.mark.parametrize("engine", ["scan", "plaid", "warp"])
def test_the_crossover_below_it_no_index_crossing_builds_one_and_an_index_is_kept(tmp_path, engine):
    """Every engine, issue #43: with the default ``min_index_vectors`` (the measured crossover) a
    small store builds no index and answers the exact top k, and ``stats()`` says so; a store that
    reaches its threshold builds the index; a folder indexed under a lower threshold, reopened
    with the default, keeps its index (updated by later writes) until it holds fewer than half
    the vectors it was built from."""
    make, path = _engine(engine), tmp_path / "s"
    vecs, ids = docs_for(30, 12), [f"d{i}" for i in range(12)]  # 23 vectors each
    queries = [vecs[3], *docs_for(31, 2)]
    with make(tmp_path / "default") as s:
        s.upsert(ids, vecs)
        s.flush()
        assert s.min_index_vectors == type(s).default_min_index_vectors >= DEFAULT_MIN_INDEX_VECTORS > 12 * 23
        assert not s.has_index and not list((tmp_path / "default").glob(f"{s.index_prefix}*"))
        st = s.stats()
        assert (st["search"], st["vectors"], st["has_index"]) == ("exact", 276, False)
        assert "below min_index_vectors" in st["reason"]
        _assert_exact_top(s, dict(zip(ids, vecs, strict=True)), queries)

    s = make(path, min_index_vectors=200)
    s.upsert(ids[:8], vecs[:8])  # 184 vectors < 200
    s.flush()
    assert not s.has_index and s.stats()["search"] == "exact"
    s.upsert(ids[8:10], vecs[8:10])  # 230: crosses it
    s.flush()
    assert s.has_index and s.stats()["search"] == "index" and s.n_pending == 0
    assert "at least min_index_vectors=200" in s.stats()["reason"]
    s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing to repair or rebuild
        s = make(path)  # the default threshold, far above the 230 vectors
    try:
        st = s.stats()
        assert s.has_index and st["search"] == "index" and "built from 230 vectors" in st["reason"]
        s.upsert(ids[10:], vecs[10:])  # an update of the kept index
        s.flush()
        assert s.has_index and s.n_pending == 0
        s.delete(ids[:6])  # 6 x 23 = 138 >= 115 (half of 230): kept
        s.flush()
        assert s.has_index and s.stats()["search"] == "index"
        s.delete(ids[6:8])  # 4 x 23 = 92 < 115: dropped, exact scan
        s.flush()
        assert not s.has_index and stored_state(path, "index_dir") == "" and s.stats()["search"] == "exact"
        _assert_exact_top(s, {x: v for x, v in zip(ids, vecs, strict=True) if x in ids[8:]}, queries)
    finally:
        s.close()


def _listing(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> its bytes), folders as ``b"<dir>"``."""
    return {str(p.relative_to(folder)): (b"<dir>" if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("engine", ["scan", "plaid", "warp"])
def test_a_foreign_folder_is_refused_before_anything_is_created_in_it(tmp_path, engine):
    """A folder holding a user's files and no store, or a SQLite database of the user's named
    like the store's, is refused with CollectionMismatch naming it, and left byte for byte as it
    was: no ``store.lock`` (the lock used to be created before the refusal, and stayed), no
    SQLite file or journal, nothing deleted."""
    from uibk_embedding.errors import CollectionMismatch

    make = _engine(engine)
    user = tmp_path / "downloads"
    user.mkdir()
    (user / "notes.txt").write_text("buy milk\n")
    (user / ".tmp-download.part").write_bytes(b"\x00\x01partial")
    (user / "vectors-000001.f16").write_bytes(b"not ours")
    before = _listing(user)
    for _ in range(2):  # and again: the first refusal left nothing that makes it look like a store
        with pytest.raises(CollectionMismatch, match="is not empty") as err:
            make(user)
        assert str(user) in str(err.value)
        assert _listing(user) == before
    # a database of the user's under the store's file name (no state table): not a store either
    db = sqlite3.connect(user / "store.sqlite")
    with db:
        db.execute("CREATE TABLE notes (text TEXT)")
        db.execute("INSERT INTO notes VALUES ('keep me')")
    db.close()
    before = _listing(user)
    with pytest.raises(CollectionMismatch, match="no configuration") as err:
        make(user)
    assert str(user) in str(err.value)
    assert _listing(user) == before
    only_db = tmp_path / "db-only"
    only_db.mkdir()
    (user / "store.sqlite").rename(only_db / "store.sqlite")
    before = _listing(only_db)
    with pytest.raises(CollectionMismatch, match="no configuration"):
        make(only_db)
    assert _listing(only_db) == before
    # an empty folder is ours, and so is a store this library wrote
    empty = tmp_path / "empty"
    empty.mkdir()
    make(empty).close()
    assert {"store.lock", "store.sqlite"} <= set(_listing(empty))
    make(empty).close()


def test_a_store_of_another_engine_is_refused_untouched(tmp_path):
    """A PLAID store opened as WARP (or the scan engine) is refused before any file of it is
    touched: the same bytes, no journal mode switched, no lock taken."""
    from uibk_embedding.errors import CollectionMismatch

    path = tmp_path / "s"
    s = ScanEngine(path)
    s.upsert(["a"], docs_for(30, 1))
    s.close()
    before = _listing(path)
    for make in (_engine("plaid"), _engine("warp")):
        with pytest.raises(CollectionMismatch, match=r"backend 'scan'"):
            make(path)
        assert _listing(path) == before


def test_explain_decomposes_the_reranked_lists_without_a_second_read(tmp_path):
    """explain=True: the hits, scores and order of a plain search, each decomposed from the list
    the rerank read (no ``get``), equal to ``explain`` of that hit; also with rerank off."""
    s = ScanEngine(tmp_path / "s", min_index_vectors=8, candidates=8)
    try:
        s.upsert([f"d{i}" for i in range(64)], docs_for(11, 64, rows=6))
        q = docs_for(12, 1, rows=5)[0]
        reads: list[list[str]] = []
        get = s._get
        s._get = lambda xs: reads.append(xs) or get(xs)  # counts reads; the store is real
        for options in ({}, {"rerank": False}):
            plain = s.search(q, k=4, **options)
            hits = s.search(q, k=4, explain=True, **options)
            assert reads == []
            assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in plain]
            for h in hits:
                assert h.decomposition == s.explain(q, h.id)
            reads.clear()
    finally:
        s.close()


def test_stats_of_an_index_reopened_below_its_keep_rule_say_what_happens(tmp_path):
    """Reopened with a higher ``min_index_vectors``, a store that holds under half the vectors
    its index was built from keeps the index until the next write; stats() said it "still holds
    at least half" of them."""
    path, ids = tmp_path / "s", [f"d{i}" for i in range(100)]
    with ScanEngine(path, min_index_vectors=64) as s:
        s.upsert(ids, docs_for(4, 100, rows=7))
        s.delete(ids[:70])  # updated in place: built from 1,000 vectors, 300 left
    with ScanEngine(path, min_index_vectors=10_000) as s:
        st = s.stats()
        assert st["has_index"] and st["vectors"] == 300
        assert st["reason"] == ("its index was built from 1000 vectors; it holds 300, below "
                                "min_index_vectors=10000 and below half of them: the scan index "
                                "proposes candidates until the next rebuild drops it (at the next "
                                "write or flush())")
        s.upsert(["one"], docs_for(5, 1, rows=7))
        assert not s.has_index and "below min_index_vectors=10000: no index is built" in s.stats()["reason"]
