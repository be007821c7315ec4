"""The ONE conformance suite every backend passes (parametrised by ``spec``, see conftest).

The reference is exact MaxSim in float64 (``uibk_embedding.maxsim``). Backends with the
"exact" contract must return the same ids, in the same order, with scores within a relative
1e-5; "approximate" backends must reach their declared recall@10 floor on real data.
"""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.adapters.base import MultiVectorStore
from uibk_embedding.adapters.filters import matches, parse_filter
from uibk_embedding.errors import CollectionMismatch, MissingDependency, UIBKError, UnknownBackend
from uibk_embedding.maxsim import maxsim, maxsim_scores, pack, top_k
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import BackendSpec, make_list


@pytest.fixture
def store(spec: BackendSpec, tmp_path):
    s = spec.make(tmp_path)
    yield s
    s.close()


@pytest.fixture(scope="module")
def real_store(spec: BackendSpec, real_data, tmp_path_factory):
    """The 200 real documents in one store of ``spec``, filled once per spec (``spec`` is
    parametrised per module, see conftest) and shared by the tests that only search it: they
    must not write to it."""
    s = spec.make(tmp_path_factory.mktemp(f"shared-{spec.name}"))
    try:
        s.upsert(real_data.doc_ids, real_data.docs)
        yield s
    finally:
        s.close()


def reference_top(query, docs, ids, k, allowed=None):
    mat, off = pack(docs, dtype=np.float64)
    scores = maxsim_scores([query], mat, off, dtype=np.float64)[0]
    if allowed is not None:
        scores[[i for i, x in enumerate(ids) if x not in allowed]] = -np.inf
    idx = top_k(scores, k)
    return [ids[i] for i in idx], scores[idx]


def check_ranking(spec: BackendSpec, hits, ref_ids, ref_scores, k):
    got = [h.id for h in hits]
    if spec.contract == "exact":
        assert got == ref_ids, f"{spec.name}: ranking differs from exact MaxSim"
        np.testing.assert_allclose([h.score for h in hits], ref_scores, rtol=spec.score_rtol,
                                   atol=spec.score_rtol)
    else:
        assert len(got) == min(k, len(ref_ids))
        assert len(set(got)) == len(got), "duplicate ids in one result"


def fill(store: MultiVectorStore, fmt, rng, n=30):
    ids = [f"doc-{i}" for i in range(n)]
    docs = [make_list(fmt, rng, int(rng.integers(4, 40))) for _ in ids]
    md = [{"group": ["a", "b", "c"][i % 3], "n": i, "even": i % 2 == 0} for i in range(n)]
    store.upsert(ids, docs, md)
    return ids, docs, md


def test_empty_store(store, fmt, rng):
    assert store.count() == 0
    assert store.search(make_list(fmt, rng, 5), k=5) == []
    assert store.get(["nope"]) == []
    store.delete(["nope"])  # deleting a missing id is not an error
    assert store.count() == 0


def test_upsert_get_count(spec, store, fmt, rng):
    ids, docs, md = fill(store, fmt, rng)
    assert store.count() == len(ids)
    got = store.get([ids[3], "missing", ids[0], ids[3]])
    assert [r.id for r in got] == [ids[3], ids[0], ids[3]]  # the order asked, repeats kept
    np.testing.assert_allclose(got[0].vectors, docs[3], atol=spec.get_atol)
    assert got[0].metadata == md[3]
    got[0].vectors[:] = 0  # each record is the caller's own copy
    got[0].metadata["group"] = "edited"
    assert got[2].metadata == md[3]
    np.testing.assert_allclose(got[2].vectors, docs[3], atol=spec.get_atol)
    again = store.get([ids[3]])[0]
    np.testing.assert_allclose(again.vectors, docs[3], atol=spec.get_atol)
    assert again.metadata == md[3]


def test_search_matches_exact_reference_random(spec, store, fmt, rng):
    ids, docs, _ = fill(store, fmt, rng, n=40)
    for _ in range(3):
        q = make_list(fmt, rng, 12)
        ref_ids, ref_scores = reference_top(q, docs, ids, 10)
        check_ranking(spec, store.search(q, k=10), ref_ids, ref_scores, 10)


def test_search_matches_exact_reference_real(spec, real_store, real_data):
    """Exact specs rank as exact MaxSim on every query; approximate ones reach their declared
    recall@10 against it (their defaults' promise), and a spec meant to test an engine index
    searched through it (``index_used``), not the exact scan small stores fall back to."""
    recalls = []
    for q in real_data.queries:
        ref_ids, ref_scores = reference_top(q, real_data.docs, real_data.doc_ids, 10)
        hits = real_store.search(q, k=10)
        check_ranking(spec, hits, ref_ids, ref_scores, 10)
        recalls.append(len(set(ref_ids) & {h.id for h in hits}) / 10)
    assert np.mean(recalls) >= spec.recall_floor, (
        f"{spec.name}: recall@10 vs exact {np.mean(recalls):.3f} over {len(recalls)} queries "
        f"(lowest {min(recalls):.1f}), below its floor {spec.recall_floor}")
    if spec.index_used is not None:
        assert spec.index_used(real_store), f"{spec.name}: the searches never reached the engine index"


def test_dense_weight_survives(spec, real_store, real_data):
    """Scaled query slots (the query-time dense weight) change scores as exact MaxSim does."""
    q = real_data.queries[0].copy()
    q[:3] *= 8.0
    ref_ids, ref_scores = reference_top(q, real_data.docs, real_data.doc_ids, 10)
    hits = real_store.search(q, k=10)
    check_ranking(spec, hits, ref_ids, ref_scores, 10)
    if spec.contract == "approximate":
        assert len(set(ref_ids[:5]) & {h.id for h in hits}) >= 3


def test_upsert_overwrites(spec, store, fmt, rng):
    ids, docs, _ = fill(store, fmt, rng, n=10)
    new = make_list(fmt, rng, 7)
    store.upsert([ids[4]], [new], [{"group": "z"}])
    assert store.count() == 10
    rec = store.get([ids[4]])[0]
    np.testing.assert_allclose(rec.vectors, new, atol=spec.get_atol)
    assert rec.metadata == {"group": "z"}
    docs[4] = new
    hits = store.search(new, k=3)
    assert hits[0].id == ids[4]
    if spec.contract == "exact":
        assert hits[0].score == pytest.approx(maxsim(new, new), rel=1e-5)


def test_delete(spec, store, fmt, rng):
    ids, docs, _ = fill(store, fmt, rng, n=12)
    store.delete([ids[0], ids[5], "never-stored"])
    assert store.count() == 10
    assert store.get([ids[0], ids[5]]) == []
    hits = store.search(docs[0], k=12)
    assert ids[0] not in {h.id for h in hits} and ids[5] not in {h.id for h in hits}
    remaining = [i for i in range(12) if i not in (0, 5)]
    ref_ids, ref_scores = reference_top(docs[0], [docs[i] for i in remaining],
                                        [ids[i] for i in remaining], 10)
    check_ranking(spec, hits[:10], ref_ids, ref_scores, 10)
    store.upsert([ids[0]], [docs[0]])  # re-adding a deleted id works
    assert store.count() == 11
    assert store.search(docs[0], k=1)[0].id == ids[0]


def test_filters(spec, store, fmt, rng):
    ids, docs, md = fill(store, fmt, rng, n=30)
    q = make_list(fmt, rng, 10)
    for flt, allowed in [
        ({"group": "b"}, {x for x, m in zip(ids, md, strict=True) if m["group"] == "b"}),
        ({"group": {"$in": ["a", "c"]}}, {x for x, m in zip(ids, md, strict=True) if m["group"] in "ac"}),
        ({"n": {"$eq": 7}}, {ids[7]}),
        ({"group": "a", "even": True}, {x for x, m in zip(ids, md, strict=True)
                                        if m["group"] == "a" and m["even"]}),
    ]:
        hits = store.search(q, k=5, filter=flt)
        assert {h.id for h in hits} <= allowed
        ref_ids, ref_scores = reference_top(q, docs, ids, 5, allowed)
        check_ranking(spec, hits, ref_ids, ref_scores, 5)
    assert store.search(q, k=5, filter={"no_such_field": 1}) == []
    assert store.search(q, k=5, filter={"group": "zzz"}) == []


def test_k_larger_than_store(spec, store, fmt, rng):
    ids, docs, _ = fill(store, fmt, rng, n=6)
    q = make_list(fmt, rng, 8)
    hits = store.search(q, k=50)
    assert sorted(h.id for h in hits) == sorted(ids)
    ref_ids, ref_scores = reference_top(q, docs, ids, 50)
    check_ranking(spec, hits, ref_ids, ref_scores, 50)


def test_search_batch_equals_search(store, fmt, rng):
    fill(store, fmt, rng, n=20)
    qs = [make_list(fmt, rng, n) for n in (3, 9, 20)]
    batch = store.search_batch(qs, k=5)
    for q, hits in zip(qs, batch, strict=True):
        single = store.search(q, k=5)
        assert [h.id for h in hits] == [h.id for h in single]


def test_explain_decomposition(spec, real_store, real_data):
    hits = real_store.search(real_data.queries[1], k=3, explain=True)
    assert len(hits) == 3
    for h in hits:
        d = h.decomposition
        assert d is not None and d.separated
        fmt = real_store.format
        assert d.total == pytest.approx(
            d.constant + fmt.beta * (d.token + fmt.lambda_ * d.dense_weight * d.dense), abs=1e-5)
        if spec.contract == "exact":
            assert d.total == pytest.approx(h.score, rel=1e-5)


def test_persistence_round_trip(spec, tmp_path, fmt, rng):
    if spec.reopen is None:
        pytest.skip(f"{spec.name} does not persist locally")
    s = spec.make(tmp_path)
    ids, docs, _ = fill(s, fmt, rng, n=15)
    s.delete([ids[2]])
    s.upsert([ids[3]], [docs[4]], [{"group": "moved"}])
    q = make_list(fmt, rng, 9)
    before = [(h.id, round(h.score, 4)) for h in s.search(q, k=10)]
    s.close()
    s2 = spec.reopen(tmp_path)
    try:
        assert s2.count() == 14
        assert [(h.id, round(h.score, 4)) for h in s2.search(q, k=10)] == before
        assert s2.get([ids[3]])[0].metadata == {"group": "moved"}
        assert s2.get([ids[2]]) == []
    finally:
        s2.close()


def test_scan_lists_exactly_the_matches(spec, store, fmt, rng):
    ids, _docs, md = fill(store, fmt, rng, n=40)
    stored = dict(zip(ids, md, strict=True))
    for flt in [None, {"group": "b"}, {"n": {"$in": [3, 4, 39, 1000]}}, {"even": True, "group": "a"},
                {"n": True}, {"missing": 1}]:
        want = {x for x, m in stored.items() if matches(m, parse_filter(flt))}
        got = list(store.scan(flt, batch_size=7))  # several pages
        assert len(got) == len({x for x, _ in got}), f"{spec.name}: duplicate ids in scan({flt})"
        assert {x for x, _ in got} == want, f"{spec.name}: scan({flt})"
        for x, m in got:
            assert m == stored[x]
    with pytest.raises(ValueError, match="batch_size"):
        list(store.scan(None, batch_size=0))


def test_delete_by_filter_removes_every_match_and_nothing_else(spec, store, fmt, rng):
    """1,200 matching documents among 1,600: a filtered delete removes all of them (a search
    based emulation stops early on approximate backends) and leaves every other one intact."""
    n = 1600
    ids = [f"doc-{i}" for i in range(n)]
    docs = [make_list(fmt, rng, int(rng.integers(1, 5))) for _ in ids]
    md = [{"doomed": i % 4 != 0, "i": i} for i in range(n)]
    for lo in range(0, n, 400):
        store.upsert(ids[lo:lo + 400], docs[lo:lo + 400], md[lo:lo + 400])
    assert store.count() == n
    assert store.delete(filter={"doomed": True}) == 1200
    keep = [i for i in range(n) if i % 4 == 0]
    assert store.count() == len(keep)
    assert sorted(x for x, _ in store.scan({"doomed": True})) == []
    recs = {r.id: r for r in store.get(ids)}
    assert sorted(recs) == sorted(ids[i] for i in keep)
    for i in keep:
        np.testing.assert_allclose(recs[ids[i]].vectors, docs[i], atol=spec.get_atol)
        assert recs[ids[i]].metadata == md[i]
    for i in keep[:: len(keep) // 8]:  # still found by search
        assert store.search(docs[i], k=1)[0].id == ids[i]
    assert store.delete(filter={"doomed": True}) == 0
    assert store.delete(filter={}) == len(keep)
    assert store.count() == 0


def test_delete_takes_ids_or_a_filter(store, fmt, rng):
    fill(store, fmt, rng, n=5)
    with pytest.raises(TypeError, match="exactly one"):
        store.delete()
    with pytest.raises(TypeError, match="exactly one"):
        store.delete(["doc-1"], filter={"n": 1})
    with pytest.raises(ValueError, match="filter"):
        store.delete(filter={"n": {"$regex": "1"}})
    assert store.count() == 5


def _through_bfloat16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (8 significant bits, to nearest even), back in float32 with each
    row scaled to its norm before (a model's output computed in bfloat16 and normalised in
    float32; rows left as rounded miss unit norm by up to 2**-8, which the unit check refuses)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return r * (np.linalg.norm(x, axis=1) / np.linalg.norm(r, axis=1))[:, None]


def test_lists_must_carry_the_stores_tags(spec, store, fmt, rng, real_data):
    """The tags are the format: a document whose token tag (``sqrt(1 - beta)``) or slot tag
    (``-sqrt(1 - delta)``), or a query whose token tag or slot tag per unit norm (its slots are
    scaled by the dense weight) is not the store's, is refused with a ValueError naming the list
    and the expected and found tag, and nothing is written: with mixed tags ``C(q)`` depends on
    the document, so MaxSim no longer ranks as the hybrid score, and explain splits scores with
    the wrong beta. The encoder's own lists, float32 or rounded to float16 or bfloat16, and
    dense-weighted queries are accepted."""
    ids, _, _ = fill(store, fmt, rng, n=4)
    other_beta, other_lambda = TaggedFormat(beta=0.5), TaggedFormat(lambda_=0.5)
    with pytest.raises(ValueError, match=r"multivectors\[1\] \(id 'x'\): row 3 \(a token row\) has tag "
                                         r"0\.7071; .* expects 0\.3162"):
        store.upsert(["ok", "x"], [make_list(fmt, rng, 5), make_list(other_beta, rng, 5)])
    with pytest.raises(ValueError, match=r"multivectors\[0\] \(id 'y'\): row 0 \(a slot row\) has tag "
                                         r"-0\.9220; .* expects -0\.8803"):
        store.upsert(["y"], [make_list(other_lambda, rng, 5)])
    assert store.count() == 4 and store.get(["ok", "x", "y"]) == []
    for q in (make_list(other_beta, rng, 6), make_list(other_lambda, rng, 6, dense_weight=3.0)):
        with pytest.raises(ValueError, match=r"^query: row \d \(a (token|slot) row\) has tag"):
            store.search(q, k=3)
        with pytest.raises(ValueError, match=r"^queries\[1\]: row \d"):
            store.search_batch([make_list(fmt, rng, 4), q], k=3)
        with pytest.raises(ValueError, match=r"^query: row \d"):
            store.explain(q, ids[0])
    # what an encoder brings: its lists as they are, rounded to float16 or bfloat16
    enc_docs, enc_q = real_data.docs[:2], real_data.queries[0]
    weighted = enc_q.copy()
    weighted[:3] *= 2.5  # the dense weight scales the query slots (tags included)
    lists = [*enc_docs, *(d.astype(np.float16) for d in enc_docs), *map(_through_bfloat16, enc_docs)]
    store.upsert([f"enc-{i}" for i in range(len(lists))], lists)
    assert store.count() == 4 + len(lists)
    for q in (enc_q, weighted, enc_q.astype(np.float16), _through_bfloat16(weighted),
              make_list(fmt, rng, 5, dense_weight=1e3).astype(np.float16)):
        assert len(store.search(q, k=3)) == 3
        assert store.explain(q, "enc-0").beta == fmt.beta


def test_reopen_with_another_format_raises_collection_mismatch(spec, tmp_path, fmt, rng):
    """The same condition, the same type on every backend: an existing store built with another
    tagged format is refused with CollectionMismatch (a ValueError) and left unchanged."""
    if spec.reopen is None:
        pytest.skip(f"{spec.name} does not persist")
    s = spec.make(tmp_path)
    try:
        fill(s, fmt, rng, n=6)
    finally:
        s.close()
    with pytest.raises(CollectionMismatch) as e:
        spec.reopen(tmp_path, format=TaggedFormat(beta=0.8))
    assert isinstance(e.value, ValueError | UIBKError)
    again = spec.reopen(tmp_path)
    try:
        assert again.count() == 6 and again.format == fmt
    finally:
        again.close()


def test_store_records_the_encoders_projection(spec, tmp_path, rng):
    """A store created with an encoder's format records its projection: reopened for lists of
    another projection it raises CollectionMismatch naming both and stays unchanged; opened
    without a format it takes the recorded one. A store created without a format (undeclared)
    records none and checks nothing."""
    if spec.reopen is None:
        pytest.skip(f"{spec.name} does not persist")
    made = TaggedFormat(projection="random-00aa11bb22cc33dd")
    other = TaggedFormat(projection="pca-44ee55ff66aa77bb")
    s = spec.reopen(tmp_path / "declared", format=made)
    try:
        fill(s, made, rng, n=6)
    finally:
        s.close()
    with pytest.raises(CollectionMismatch, match=f"projection {made.projection}, not {other.projection}"):
        spec.reopen(tmp_path / "declared", format=other)
    for options in ({}, {"format": made}):
        again = spec.reopen(tmp_path / "declared", **options)
        try:
            assert again.count() == 6 and again.format == made
        finally:
            again.close()
    s = spec.make(tmp_path / "undeclared")
    try:
        fill(s, made, rng, n=3)
    finally:
        s.close()
    again = spec.reopen(tmp_path / "undeclared", format=other)
    try:
        assert again.count() == 3 and again.format.projection is None
    finally:
        again.close()


def test_registry_errors_have_one_type_each():
    from uibk_embedding.adapters.registry import open_store

    with pytest.raises(UnknownBackend, match="unknown backend"):
        open_store("no-such-engine")
    from uibk_embedding._optional import require

    with pytest.raises(MissingDependency, match=r"uibk-embedding\[qdrant\]"):
        require("surely_not_installed_xyz", "qdrant", "the Qdrant adapter")


_SECOND_OPENER = """
import sys
from pathlib import Path
from uibk_embedding.errors import StoreInUse
from uibk_embedding.testing import load_backend_specs
spec = next(s for s in load_backend_specs(sys.argv[1]) if s.name == sys.argv[2])
try:
    store = spec.reopen(Path(sys.argv[3]))
except StoreInUse as e:
    print("StoreInUse:", e)
    sys.exit(3)
store.upsert(["from-the-second-process"], [store.get(["doc-0"])[0].vectors])
print("opened and wrote")
"""


def test_a_delete_by_filter_lists_and_deletes_in_one_step(spec, tmp_path, fmt, rng):
    """A write from another thread of the same store object that lands between a delete by
    filter's listing and its delete waits for the delete: a document it made stop matching is
    kept (it was deleted all the same, on every store that deletes what it listed)."""
    import threading

    store = spec.make(tmp_path)
    try:
        v = make_list(fmt, rng, 4)
        store.upsert(["x", "y"], [v, v], [{"v": 0}, {"v": 0}])
        listing, writer = store._scan, []

        def scan(conditions, batch_size):
            for page in listing(conditions, batch_size):
                if not writer:  # the write starts once the listing has read x
                    writer.append(threading.Thread(target=store.upsert, args=(["x"], [v], [{"v": 1}])))
                    writer[0].start()
                    writer[0].join(0.5)  # done by now unless it waits for the delete
                yield page

        store._scan = scan
        deleted = store.delete(filter={"v": 0})
        if not writer:
            pytest.skip(f"{spec.name} deletes by filter in the engine (nothing listed)")
        writer[0].join()
        assert deleted == 2
        assert [(r.id, r.metadata) for r in store.get(["x", "y"])] == [("x", {"v": 1})]
    finally:
        store.close()


def test_create_false_refuses_a_missing_store_and_creates_nothing(spec, tmp_path, fmt, rng):
    """A read never creates: ``create=False`` on a store that does not exist is StoreNotFound,
    twice (the first refusal left nothing for the second to open); a store that exists opens."""
    from uibk_embedding.errors import StoreNotFound

    if not spec.takes_create or spec.skip:
        pytest.skip(f"{spec.name}: open_store checks its folder before the class runs "
                    "(tests/test_open_store.py)" if not spec.skip else spec.skip)
    for _ in range(2):
        with pytest.raises(StoreNotFound, match="nothing was created"):
            spec.reopen(tmp_path / "never", create=False)
    first = spec.make(tmp_path / "made")
    try:
        ids, _, _ = fill(first, fmt, rng, n=4)
    finally:
        first.close()
    with spec.reopen(tmp_path / "made", create=False) as again:
        assert again.count() == len(ids)


def test_a_second_store_object_or_process_on_the_same_files_is_refused(spec, tmp_path, fmt, rng):
    """One writer per local store: a second store object (this process) and a second process on
    the same files get StoreInUse and write nothing; the first keeps every document."""
    import subprocess
    import sys
    from pathlib import Path

    from uibk_embedding.errors import StoreInUse

    if spec.shared_writers:
        pytest.skip(f"{spec.name} lets several writers share one store (its engine keeps each write)")
    if spec.reopen is None or spec.skip or any(r in spec.name for r in ("server", "standalone", "live")):
        pytest.skip(f"{spec.name} keeps no local files of its own (a server serialises its writers)")
    first = spec.make(tmp_path)
    if getattr(first, "write_timeout", None) is not None:  # exact, PLAID, WARP folders (issue 62)
        first.close()
        pytest.skip(f"{spec.name} shares its folder: many readers, one writer per write "
                    "(tests/test_sharing.py)")
    try:
        ids, docs, _ = fill(first, fmt, rng, n=8)
        with pytest.raises(StoreInUse, match="open in another"):
            spec.reopen(tmp_path)
        backends = Path(__file__).resolve().parent.parent / "backends"
        argv = [sys.executable, "-c", _SECOND_OPENER, str(backends), spec.name, str(tmp_path)]
        child = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert child.returncode == 3, (child.returncode, child.stdout, child.stderr[-2000:])
        assert "StoreInUse" in child.stdout
        assert first.count() == len(ids)  # the first object still works
        first.upsert(["one-more"], [docs[0]])
    finally:
        first.close()
    again = spec.reopen(tmp_path)
    try:
        assert again.count() == len(ids) + 1
        assert sorted(r.id for r in again.get([*ids, "one-more", "from-the-second-process"])) == \
            sorted([*ids, "one-more"])
    finally:
        again.close()


def test_a_dropped_store_is_closed_and_a_new_one_starts_empty(spec, tmp_path, fmt, rng):
    """``drop()`` (the server stores') removes the data and closes the store: later calls raise
    StoreInUse like a closed store's (each engine raised its own missing-table or
    missing-collection error before), and the next store of that name starts empty."""
    from uibk_embedding.errors import StoreInUse

    s = spec.make(tmp_path)
    if not hasattr(s, "drop"):
        s.close()
        pytest.skip(f"{spec.name} has no drop()")
    fill(s, fmt, rng, n=3)
    s.drop()
    new = make_list(fmt, rng, 4)
    for call in (s.count, lambda: s.get(["doc-0"]), lambda: s.upsert(["x"], [new]), s.drop):
        with pytest.raises(StoreInUse, match="is closed"):
            call()
    s.close()  # nothing to do
    again = spec.make(tmp_path)
    try:
        assert again.count() == 0
    finally:
        again.close()


def test_a_closed_store_refuses_every_method(spec, tmp_path, fmt, rng):
    """After ``close()`` every public method raises StoreInUse (before any engine call, so never
    a bare RuntimeError or AttributeError from a released client), on every backend; ``close()``
    again does nothing."""
    import inspect

    from uibk_embedding.errors import StoreInUse

    s = spec.make(tmp_path)
    ids, docs, _ = fill(s, fmt, rng, n=4)
    s.close()
    q = make_list(fmt, rng, 5)
    calls = {
        "upsert": lambda: s.upsert(["new"], [docs[0]]),
        "delete": lambda: s.delete([ids[0]]),
        "delete by filter": lambda: s.delete(filter={"group": "a"}),
        "scan": lambda: list(s.scan()),
        "search": lambda: s.search(q, k=3),
        "search explained": lambda: s.search(q, k=3, explain=True),
        "search_batch": lambda: s.search_batch([q, q], k=3),
        "get": lambda: s.get([ids[0]]),
        "explain": lambda: s.explain(q, ids[0]),
        "count": lambda: s.count(),
        "len": lambda: len(s),
    }
    # every other public method and property of the backend's class (and its mixins): refused
    # before its arguments are even looked at (a property read LanceDB's released table handle)
    for name in dir(type(s)):
        if name.startswith("_") or name == "close" or name in calls:
            continue
        static = inspect.getattr_static(type(s), name)
        if inspect.isfunction(static):
            calls[name] = getattr(s, name)
        elif isinstance(static, property):
            calls[f"reading {name}"] = lambda name=name: getattr(s, name)
    for what, call in calls.items():
        with pytest.raises(StoreInUse, match="is closed"):
            try:
                call()
            except StoreInUse:
                raise
            except BaseException as e:
                raise AssertionError(f"{what}: {type(e).__name__} instead of StoreInUse") from e
    s.close()  # a second close is a no-op
    with pytest.raises(StoreInUse, match="is closed"):
        s.count()
    if spec.reopen is not None:  # closing released the files: the store opens again, intact
        again = spec.reopen(tmp_path)
        try:
            assert again.count() == len(ids)
        finally:
            again.close()
