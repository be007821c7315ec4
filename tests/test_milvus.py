"""Milvus-specific behaviour (the shared behaviour is in the conformance suite).

Runs on Milvus Lite in-process; the version and existing-collection checks also run against the
real standalone server that the conformance suite starts (one per session, shared).
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from uibk_embedding.errors import BackendUnavailable, CollectionMismatch, ServerTooOld

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.milvus import (
    DIM,
    PART_ROWS,
    MilvusStore,
    open_milvus_lite,
)
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list
from uibk_embedding.testing.milvus_server import user_namespaces_available


@pytest.fixture
def lite(tmp_path):
    s = open_milvus_lite(path=tmp_path / "m.db", exact=True, index_type="FLAT")
    yield s
    s.close()


@pytest.fixture(scope="module")
def standalone():
    pytest.importorskip("milvus")
    if not user_namespaces_available():
        pytest.skip("cannot confine the Milvus standalone server to 127.0.0.1 (no user namespaces)")
    from uibk_embedding.testing.milvus_server import LocalMilvusServer

    return LocalMilvusServer.shared()


def test_close_ends_the_lite_server_cleanly_and_the_data_reopens(tmp_path, fmt, rng):
    """close() ends the Milvus Lite server with SIGTERM (milvus-lite's own release waits 2 s and
    then SIGKILLs it); everything written before reopens unchanged, also after a second close."""
    import signal

    from milvus_lite.server_manager import server_manager_instance

    path = tmp_path / "m.db"
    docs = [make_list(fmt, rng, n) for n in (3, 40, PART_ROWS + 5)]
    metadata = [{"n": i} for i in range(3)]
    for round_ in range(2):
        with open_milvus_lite(path=path) as s:
            if round_ == 0:
                s.upsert(["a", "b", "c"], docs, metadata)
            got = {r.id: r for r in s.get(["a", "b", "c"])}
            server = server_manager_instance._servers[str(path.resolve())]
            proc = server._p
        assert proc.returncode is not None, "the server still runs after close()"
        assert proc.returncode != -signal.SIGKILL, "the server was killed, not ended"
        assert str(path.resolve()) not in server_manager_instance._servers
        for i, x in enumerate("abc"):
            np.testing.assert_array_equal(got[x].vectors, docs[i])
            assert got[x].metadata == metadata[i]


def test_existing_collection_is_validated_never_modified(tmp_path, fmt, rng):
    path = tmp_path / "m.db"
    with open_milvus_lite(path=path, collection="c1") as s:
        s.upsert(["a"], [make_list(fmt, rng, 5)])
    # another tagged format: refused, and the data is still there afterwards
    with pytest.raises(CollectionMismatch, match=r"holds lists of beta=0\.9, lambda=0\.75, not beta=0\.8"):
        open_milvus_lite(path=path, collection="c1", format=TaggedFormat(beta=0.8))
    # a foreign collection with the same name: refused with a precise message, left unchanged
    from pymilvus import DataType, MilvusClient

    with open_milvus_lite(path=path, collection="other") as probe:
        client: MilvusClient = probe.client
        schema = client.create_schema(auto_id=True)
        schema.add_field("pk", DataType.INT64, is_primary=True)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=DIM)
        ip = client.prepare_index_params()
        ip.add_index("vec", index_type="FLAT", metric_type="COSINE")
        for n in ("foreign_rows", "foreign_docs"):
            client.create_collection(n, schema=schema, index_params=ip)
        client.insert("foreign_rows", [{"vec": [1.0] + [0.0] * (DIM - 1)}])
    with pytest.raises(CollectionMismatch, match=r"does not fit this store.*left unchanged"):
        open_milvus_lite(path=path, collection="foreign")
    with open_milvus_lite(path=path, collection="other") as probe:
        res = probe.client.query("foreign_rows", filter="", output_fields=["count(*)"])
        assert res[0]["count(*)"] == 1
        assert [f["name"] for f in probe.client.describe_collection("foreign_rows")["fields"]] == \
            ["pk", "vec"]
    with open_milvus_lite(path=path, collection="c1") as s:
        assert s.count() == 1


def test_half_created_store_is_refused(tmp_path, fmt):
    path = tmp_path / "m.db"
    with open_milvus_lite(path=path, collection="half") as s:
        s.client.drop_collection("half_docs")
    with pytest.raises(CollectionMismatch, match="incomplete"):
        open_milvus_lite(path=path, collection="half")


@pytest.mark.parametrize("value", [
    'x" or 1==1 or "',
    "a' || true || 'b",
    'back\\slash \\" and " quote',
    '"]) or (f["k"] == "s',
    "line\nbreak\ttab \u00e9\U0001F600",
    "exists f",
])
def test_metadata_with_quotes_and_operators_is_literal(lite, fmt, rng, value):
    docs = [make_list(fmt, rng, 6) for _ in range(4)]
    md = [{"k": value}, {"k": "other"}, {"k": value + " "}, {}]
    lite.upsert(["hit", "miss", "near", "none"], docs, md)
    assert lite.get(["hit"])[0].metadata == {"k": value}
    for flt in ({"k": value}, {"k": {"$in": [value, "nothing"]}}):
        hits = lite.search(docs[1], k=4, filter=flt)
        assert [h.id for h in hits] == ["hit"]


def test_filter_types_are_not_conflated(lite, fmt, rng):
    """Milvus Lite's JSON comparison treats True as 1; the stored type tags keep them apart."""
    docs = [make_list(fmt, rng, 5) for _ in range(4)]
    lite.upsert(["bool", "int", "str", "float"], docs,
                [{"v": True}, {"v": 1}, {"v": "1"}, {"v": 1.0}])
    q = docs[0]
    assert {h.id for h in lite.search(q, k=4, filter={"v": True})} == {"bool"}
    assert {h.id for h in lite.search(q, k=4, filter={"v": 1})} == {"int", "float"}
    assert {h.id for h in lite.search(q, k=4, filter={"v": "1"})} == {"str"}
    assert {h.id for h in lite.search(q, k=4, filter={"v": {"$in": [False, "2"]}})} == set()


def test_long_document_split_across_rows(lite, fmt, rng):
    per_part = PART_ROWS
    long_doc = make_list(fmt, rng, 5 * per_part + 7)  # 6 parts
    short = make_list(fmt, rng, 4)
    lite.upsert(["long", "short"], [long_doc, short], [{"n": 1}, None])
    parts = lite.client.query(lite.docs_name, filter='doc_id == "long"', output_fields=["part"])
    assert sorted(p["part"] for p in parts) == list(range(6))
    got = lite.get(["long"])[0]
    np.testing.assert_array_equal(got.vectors, long_doc)
    assert got.metadata == {"n": 1}
    hit = lite.search(long_doc[:20], k=1)[0]
    assert hit.id == "long"
    # overwrite with a shorter version: no stale part survives
    lite.upsert(["long"], [short])
    parts = lite.client.query(lite.docs_name, filter='doc_id == "long"', output_fields=["part"])
    assert [p["part"] for p in parts] == [0]
    np.testing.assert_array_equal(lite.get(["long"])[0].vectors, short)


def test_interrupted_upsert_keeps_old_or_new_and_repair_cleans(lite, fmt, rng):
    old, new = make_list(fmt, rng, 40), make_list(fmt, rng, 9)
    lite.upsert(["d"], [old], [{"v": "old"}])
    # simulate a crash after the new version's parts were written but before the rest
    lite.batch_rows = 10**9
    original = lite._delete_versions
    lite._delete_versions = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("crash"))
    with pytest.raises(RuntimeError, match="crash"):
        lite.upsert(["d"], [new], [{"v": "new"}])
    lite._delete_versions = original
    rec = lite.get(["d"])[0]  # the newest complete version wins
    np.testing.assert_array_equal(rec.vectors, new)
    assert rec.metadata == {"v": "new"}
    assert [h.id for h in lite.search(new, k=5)] == ["d"]
    assert lite.repair() == 1
    assert lite.count() == 1 and lite.repair() == 0
    # an incomplete newer version (crash while writing parts) is ignored
    ver = lite._versions.next()
    lite.client.insert(lite.docs_name, [{"doc_id": "d", "ver": ver, "part": 0, "n_parts": 2,
                                         "n_rows": 40, "meta": "{}", "f": {},
                                         "vecs": "", "dummy": [0.0, 0.0]}])
    np.testing.assert_array_equal(lite.get(["d"])[0].vectors, new)
    assert lite.repair() == 0  # a young one may be a write in progress: left alone
    assert lite.repair(abandoned_after=0) == 1
    np.testing.assert_array_equal(lite.get(["d"])[0].vectors, new)


@pytest.mark.parametrize("dies_on", ["rows", "docs"])
def test_a_write_that_dies_half_way_leaves_the_old_content_in_every_read(lite, fmt, rng, dies_on):
    """The insert into one collection fails (``rows``: the first step now; it was the second):
    get, count, scan and search all keep the old content. Before, when the rows failed after
    the parts were stored, get/count returned the new content that search never found, and
    repair() deleted the old version's rows with it: the document became unsearchable."""
    others = [make_list(fmt, rng, 8) for _ in range(20)]
    lite.upsert([f"o{i}" for i in range(20)], others)
    old, new, fresh = make_list(fmt, rng, 12), make_list(fmt, rng, 9), make_list(fmt, rng, 7)
    lite.upsert(["d"], [old], [{"v": "old"}])
    real, target = lite.client.insert, getattr(lite, f"{dies_on}_name")

    def insert(name, *a, **kw):
        if name == target:
            raise OSError("injected: the server went away")
        return real(name, *a, **kw)

    lite.client.insert = insert
    for doc_id, v in (("d", new), ("n", fresh)):
        with pytest.raises(OSError, match="injected"):
            lite.upsert([doc_id], [v], [{"v": "new"}])
    lite.client.insert = real

    def assert_old_content() -> None:
        assert [(r.id, r.metadata) for r in lite.get(["d", "n"])] == [("d", {"v": "old"})]
        assert lite.count() == 21 and "n" not in {x for x, _ in lite.scan()}
        assert lite.search(old, k=1)[0].id == "d"
        assert "n" not in [h.id for h in lite.search(fresh, k=21)]

    assert_old_content()
    assert lite.repair() == 0  # young leftovers may be a write in progress
    lite.repair(abandoned_after=0)
    assert_old_content()
    assert lite.repair(abandoned_after=0) == 0
    lite.upsert(["d", "n"], [new, fresh])
    assert lite.search(new, k=1)[0].id == "d" and lite.search(fresh, k=1)[0].id == "n"


def test_repair_undoes_a_version_whose_rows_were_never_stored(lite, fmt, rng):
    """A store written before rows came first could die between a version's parts and its rows:
    repair() keeps the newest version with rows and, once old enough, removes the other."""
    old, new, fresh = make_list(fmt, rng, 12), make_list(fmt, rng, 9), make_list(fmt, rng, 7)
    lite.upsert(["d"], [old], [{"v": "old"}])
    real = lite.client.insert
    lite.client.insert = lambda name, *a, **kw: None if name == lite.rows_name else real(name, *a, **kw)
    lite.upsert(["n"], [fresh])
    real_delete = lite._delete_versions
    lite._delete_versions = lambda *a, **kw: None  # died before deleting the old version
    lite.upsert(["d"], [new], [{"v": "new"}])
    lite._delete_versions, lite.client.insert = real_delete, real
    assert lite.repair() == 0
    assert lite.repair(abandoned_after=0) == 2
    assert [(r.id, r.metadata) for r in lite.get(["d", "n"])] == [("d", {"v": "old"})]
    assert lite.search(old, k=1)[0].id == "d" and lite.count() == 1


def test_budget_small_is_approximate_but_scores_exact(tmp_path, real_data):
    """With a tiny budget and exact=False, every returned score is still exact MaxSim."""
    ref = ExactStore()
    ref.upsert(real_data.doc_ids[:80], real_data.docs[:80])
    with open_milvus_lite(path=tmp_path / "m.db", rows_per_vector=2, index_type="FLAT") as s:
        s.upsert(real_data.doc_ids[:80], real_data.docs[:80])
        q = real_data.queries[3]
        exact = ref.scores(q, dtype=np.float64)
        for h in s.search(q, k=10):
            assert h.score == pytest.approx(exact[h.id], rel=1e-6)


def test_rows_per_vector_is_the_token_rows_pool_and_candidates_its_old_name(tmp_path, real_data):
    """On token rows the pool option counts rows per query vector: ``rows_per_vector``; the old
    spelling ``candidates`` still works (store and per query) with a DeprecationWarning. The
    embedding-list layout keeps ``candidates`` (documents) and has no ``rows_per_vector``."""
    ids, docs = real_data.doc_ids[:40], real_data.docs[:40]
    with pytest.warns(DeprecationWarning, match="candidates is deprecated; use rows_per_vector"):
        old = open_milvus_lite(path=tmp_path / "old.db", candidates=3)
    with old, open_milvus_lite(path=tmp_path / "new.db", rows_per_vector=3) as new:
        assert old.rows_per_vector == new.rows_per_vector == old.candidates == 3
        for s in (old, new):
            s.upsert(ids, docs)
        q = real_data.queries[1]
        want = [(h.id, h.score) for h in new.search(q, k=5)]
        assert [(h.id, h.score) for h in old.search(q, k=5)] == want
        with pytest.warns(DeprecationWarning, match="candidates is deprecated"):
            assert [(h.id, h.score) for h in new.search(q, k=5, candidates=3)] == want
        assert [(h.id, h.score) for h in new.search(q, k=5, rows_per_vector=3)] == want
        with pytest.raises(TypeError, match="give rows_per_vector or candidates"):
            new.search(q, k=5, rows_per_vector=3, candidates=3)
        with pytest.raises(ValueError, match=r"rows_per_vector must be an int in 1\.\.16384, got 0"):
            new.search(q, k=5, rows_per_vector=0)
        with pytest.warns(DeprecationWarning, match="candidates is deprecated"):
            old.candidates = 4  # the old attribute (benchmarks/milvus_budget.py sets it) still sets the pool
        assert old.rows_per_vector == 4
        with pytest.raises(ValueError, match=r"rows_per_vector must be an int in 1\.\.16384, got 0"), \
                pytest.warns(DeprecationWarning):
            old.candidates = 0


def test_explain_decomposes_the_rescored_lists_without_a_second_read(lite, real_data):
    """explain=True: each hit decomposed from the list the rescoring fetched (no fetch after the
    search), equal to ``explain`` of that hit."""
    lite.upsert(real_data.doc_ids[:40], real_data.docs[:40])
    q = real_data.queries[2]
    plain = lite.search(q, k=5)
    calls: list[int] = []
    fetch = lite._fetch
    lite._fetch = lambda ids, **kw: calls.append(len(ids)) or fetch(ids, **kw)  # counts reads; real store
    hits = lite.search(q, k=5, explain=True)
    n_search = len(calls)
    lite.search(q, k=5)
    assert n_search == len(calls) - n_search  # the same reads as a plain search
    lite._fetch = fetch
    assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in plain]
    for h in hits:
        assert h.decomposition == lite.explain(q, h.id)


def test_embedding_list_refused_on_lite(tmp_path):
    with pytest.raises(ValueError, match="Milvus Lite supports only layout='token_rows'"):
        open_milvus_lite(path=tmp_path / "m.db", layout="embedding_list")
    with pytest.raises(ServerTooOld, match=r"needs a Milvus server >= 2\.6\.4.*milvus_lite"):
        MilvusStore(uri=str(tmp_path / "x.db"), layout="embedding_list")


def test_embedding_list_refused_on_standalone_2_3(standalone):
    with pytest.raises(ServerTooOld, match=r"needs a Milvus server >= 2\.6\.4.*v2\.3\.5"):
        MilvusStore(uri=standalone.uri, collection="refused", layout="embedding_list")


def test_exact_needs_flat_index(tmp_path):
    with pytest.raises(ValueError, match="exact=True needs"):
        open_milvus_lite(path=tmp_path / "m.db", exact=True, index_type="HNSW")
    with pytest.raises(ValueError, match="batch_rows must be a positive int, got 0"):
        MilvusStore(uri="http://127.0.0.1:9", batch_rows=0)  # refused before connecting
    with pytest.raises(TypeError, match=r"Store\(\) got unknown option\(s\) colection; it takes uri, "):
        MilvusStore(uri="http://127.0.0.1:9", colection="x")


def test_unreachable_uri_fails_fast_with_clear_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(BackendUnavailable, match=f"cannot connect to Milvus at 'http://127.0.0.1:{port}'"):
        MilvusStore(uri=f"http://127.0.0.1:{port}", timeout=2.0)
    assert time.monotonic() - t < 10


def test_long_filters_and_ranges_past_2_53_answer_as_the_exact_store(lite, fmt, rng):
    """An ``$in`` of 100 values or an ``$or`` of 64 branches failed in Milvus Lite ("unsupported
    expr proto node": a flat chain of about 50 terms); a range with a bound past 2**53 missed
    stored ints that Milvus rounds to the bound as doubles (``$gt 1.7e18`` missed 1.7e18 + 1)."""
    ids = [f"d{i}" for i in range(30)]
    docs = [make_list(fmt, rng, 6) for _ in ids]
    md = [{"n": i, "ts": 1_700_000_000_000_000_000 + i - 15, "x": float(i) / 2} for i in range(30)]
    lite.upsert(ids, docs, md)
    ref = ExactStore()
    ref.upsert(ids, docs, md)
    q = make_list(fmt, rng, 5)
    filters = [{"n": {"$in": list(range(3, 103))}}, {"$or": [{"n": i} for i in range(64)]},
               {"$and": [{"n": {"$gte": -i}} for i in range(60)] + [{"x": {"$gte": 1}}]},
               {"ts": {"$gt": 1.7e18}}, {"ts": {"$lt": 1.7e18}}, {"ts": {"$gt": 1_700_000_000_000_000_000}},
               {"ts": {"$lte": 1.7e18}}, {"x": {"$gt": -2.0**60}}]
    for flt in filters:
        want = [h.id for h in ref.search(q, k=30, filter=flt)]
        assert want and [h.id for h in lite.search(q, k=30, filter=flt)] == want, flt
        assert sorted(x for x, _ in lite.scan(flt)) == sorted(x for x, _ in ref.scan(flt)), flt
    assert lite.delete(filter={"n": {"$in": list(range(0, 200, 2))}}) == 15 and lite.count() == 15


def test_an_approximate_search_returns_k_hits_when_k_documents_match(tmp_path, fmt, rng):
    """exact=False: the union of each query vector's nearest rows held fewer than k documents
    (k past the union, or a negation that Milvus cannot filter), and fewer hits came back."""
    with open_milvus_lite(path=tmp_path / "m.db", rows_per_vector=1) as s:
        ids = [f"d{i}" for i in range(40)]
        s.upsert(ids, [make_list(fmt, rng, 6) for _ in ids],
                 [{"lang": "de" if i % 10 == 0 else "en"} for i in range(40)])
        q = make_list(fmt, rng, 4)
        assert len(s.search(q, k=25)) == 25
        assert sorted(h.id for h in s.search(q, k=10, filter={"lang": {"$ne": "en"}})) == \
            ["d0", "d10", "d20", "d30"]


def test_one_lite_file_by_two_paths_is_one_server_and_one_lock(tmp_path, fmt, rng):
    """Through a symlinked folder, two stores counted two servers of one file: closing one
    stopped the server the other used; a symlinked file opened one collection twice."""
    from uibk_embedding.errors import StoreInUse

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    a = open_milvus_lite(path=tmp_path / "real" / "m.db", collection="a")
    b = open_milvus_lite(path=tmp_path / "link" / "m.db", collection="b")
    try:
        b.upsert(["x"], [make_list(fmt, rng, 5)])
        with pytest.raises(StoreInUse):
            open_milvus_lite(path=tmp_path / "link" / "m.db", collection="a")
        a.close()
        assert b.count() == 1
    finally:
        a.close()
        b.close()


def test_scan_pages_past_the_milvus_limit_and_close_during_scan(lite, fmt, rng):
    from uibk_embedding.errors import StoreInUse

    lite.upsert(["a", "b", "c"], [make_list(fmt, rng, 4) for _ in range(3)])
    assert sorted(x for x, _ in lite.scan(batch_size=20_000)) == ["a", "b", "c"]  # ParamError before
    pages = lite.scan(batch_size=1)
    next(pages)
    lite.close()
    with pytest.raises(StoreInUse, match="closed"):  # a raw MilvusException before
        next(pages)


def test_milvus_lite_servers_started_at_once_all_come_up(tmp_path):
    """A starting Milvus Lite server empties and re-creates ``~/.cache/milvus``; two starting
    at once (two test workers, two processes of a user) failed one of them: "create dir ...
    failed", then "Mmap manager has not been init" on its first call. Starts are now taken one
    at a time. Each round gives its processes a new HOME, as on a fresh machine."""
    import os
    import subprocess
    import sys

    code = ("import sys, warnings; warnings.simplefilter('ignore')\n"
            "from uibk_embedding.adapters.milvus import open_milvus_lite\n"
            "with open_milvus_lite(path=sys.argv[1]) as s:\n"
            "    print(s.count())\n")
    failed = []
    for r in range(3):
        env = {**os.environ, "HOME": str(tmp_path / f"home{r}")}
        procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"r{r}p{i}" / "m.db")],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for i in range(6)]
        for p in procs:
            out = p.communicate(timeout=180)[0]
            if p.returncode != 0:
                failed.append(out.strip().splitlines()[-1])
    assert not failed, failed


def _fail_second_docs_insert(store: MilvusStore) -> None:
    """The second insert call into the documents collection fails (a network drop mid-upsert)."""
    real, calls = store.client.insert, []

    def insert(name, *a, **kw):
        if name == store.docs_name:
            calls.append(1)
            if len(calls) == 2:
                raise ConnectionError("injected: network dropped")
        return real(name, *a, **kw)

    store.client.insert = insert


@pytest.mark.parametrize("fails", ["second part insert", "delete of the old version"])
def test_scan_and_delete_by_filter_see_the_version_get_sees(lite, fmt, rng, fails):
    """A failed upsert leaves two versions of "a": ``parts`` an incomplete newer one (its second
    part never stored), ``delete`` two complete ones. get() showed the newest complete version,
    but scan() listed both versions (or the invisible one's metadata) and delete(filter=...)
    deleted "a" by the metadata of a version no read returns."""
    others = [make_list(fmt, rng, 5) for _ in range(3)]
    lite.upsert(["o0", "o1", "o2"], others, [{"v": 0}] * 3)
    old, new = make_list(fmt, rng, 100), make_list(fmt, rng, 100)  # two parts each
    lite.upsert(["a"], [old], [{"v": 1}])
    lite.batch_rows = PART_ROWS  # one part per insert call
    real_insert, real_delete = lite.client.insert, lite._delete_versions
    if fails == "second part insert":
        _fail_second_docs_insert(lite)
    else:
        lite._delete_versions = lambda *a, **k: (_ for _ in ()).throw(ConnectionError("injected"))
    with pytest.raises(ConnectionError, match="injected"):
        lite.upsert(["a"], [new], [{"v": 2}])
    lite.client.insert, lite._delete_versions = real_insert, real_delete
    visible, hidden = ({"v": 1}, {"v": 2}) if fails == "second part insert" else ({"v": 2}, {"v": 1})
    assert [r.metadata for r in lite.get(["a"])] == [visible]
    for batch_size in (1000, 1):  # both versions in one page, and in two
        assert sorted(lite.scan(batch_size=batch_size), key=lambda xm: xm[0]) == \
            [("a", visible), ("o0", {"v": 0}), ("o1", {"v": 0}), ("o2", {"v": 0})]
    assert list(lite.scan(hidden)) == [] and list(lite.scan(visible)) == [("a", visible)]
    assert lite.count() == 4
    assert lite.delete(filter=hidden) == 0
    assert [r.metadata for r in lite.get(["a"])] == [visible]
    assert lite.delete(filter=visible) == 1 and lite.get(["a"]) == [] and lite.count() == 3


def test_a_retried_part_insert_keeps_an_acknowledged_document(lite, fmt, rng):
    """pymilvus retries an insert whose reply was lost (UNAVAILABLE, CANCELLED): when the
    server had applied the first try, each part is stored twice. The version's part numbers
    were then not exactly 0..n-1, so get(), search and scan lost the acknowledged document,
    count() counted it twice and repair(abandoned_after=0) deleted it for good."""
    short, long_ = make_list(fmt, rng, 8), make_list(fmt, rng, 100)
    lite.upsert(["s", "l"], [make_list(fmt, rng, 8), make_list(fmt, rng, 70)], [{"v": "old"}] * 2)
    real = lite.client.insert

    def retried(name, rows, **kw):
        if name == lite.docs_name:
            real(name, rows, **kw)  # applied, but the reply was lost: pymilvus sends it again
        return real(name, rows, **kw)

    lite.client.insert = retried
    lite.upsert(["s", "l"], [short, long_], [{"v": "new"}] * 2)  # acknowledged
    lite.client.insert = real

    def assert_new() -> None:
        got = {r.id: r for r in lite.get(["s", "l"])}
        assert {x: r.metadata for x, r in got.items()} == {"s": {"v": "new"}, "l": {"v": "new"}}
        np.testing.assert_array_equal(got["s"].vectors, short)
        np.testing.assert_array_equal(got["l"].vectors, long_)
        assert lite.search(short, k=1)[0].id == "s" and lite.search(long_, k=1)[0].id == "l"
        assert sorted(lite.scan(), key=lambda xm: xm[0]) == [("l", {"v": "new"}), ("s", {"v": "new"})]
        assert lite.count() == 2

    assert_new()
    lite.repair(abandoned_after=0)
    assert_new()


def test_repair_with_an_infinite_abandoned_after_abandons_nothing(lite, fmt, rng):
    """repair(abandoned_after=float("inf")) (never count a write as abandoned) and 1e300 raised
    OverflowError; NaN is refused with a message naming the option."""
    v = make_list(fmt, rng, 5)
    lite.upsert(["d"], [v], [{"v": 1}])
    lite.client.insert(lite.docs_name, [{"doc_id": "d", "ver": lite._versions.next(), "part": 0,
                                         "n_parts": 2, "n_rows": 100, "meta": "{}", "f": {},
                                         "vecs": "", "dummy": [0.0, 0.0]}])  # a write in progress
    assert lite.repair(abandoned_after=float("inf")) == 0
    assert lite.repair(abandoned_after=1e300) == 0
    with pytest.raises(ValueError, match="abandoned_after must be a number of seconds >= 0, got nan"):
        lite.repair(abandoned_after=float("nan"))
    assert lite.repair(abandoned_after=0) == 1
    np.testing.assert_array_equal(lite.get(["d"])[0].vectors, v)


def _wire_bytes(value) -> int:
    """About what a value costs in a Milvus gRPC message (independent of the adapter's estimate)."""
    import json

    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, dict):
        return len(json.dumps(value, ensure_ascii=False).encode())
    if isinstance(value, list | tuple) and value and isinstance(value[0], float):
        return 4 * len(value)
    if isinstance(value, list | tuple):  # struct elements (embedding_list): their fields
        return sum(_wire_bytes(f) for v in value for f in (v.values() if isinstance(v, dict) else [v]))
    return 8


def test_inserts_reads_and_searches_stay_under_the_request_byte_budget(lite, fmt, rng):
    """Milvus refuses a gRPC message over 64 MiB (RESOURCE_EXHAUSTED on the 2.3.5 server:
    tests/test_milvus_server.py). Insert batches were sized by vector count only, though every
    token row carries the document's filter JSON; a fetch asked for 128 documents whatever their
    length; a row search for every query vector's rows at once. Here the budget is lowered to
    1 MiB (one query vector's 16,384 rows of 300-character ids take 0.6 MB) and every request and
    answer is measured (Milvus Lite has no such limit)."""
    budget = 2**20
    lite._request_bytes = budget
    sizes: list[tuple[str, int]] = []
    client = lite.client
    real_insert, real_query, real_search = client.insert, client.query, client.search

    def insert(name, rows, **kw):
        sizes.append(("insert", sum(_wire_bytes(v) for r in rows for v in r.values())))
        return real_insert(name, rows, **kw)

    def query(name, **kw):
        res = real_query(name, **kw)
        sizes.append(("query", sum(_wire_bytes(v) for r in res for v in r.values())))
        return res

    def search(name, **kw):
        res = real_search(name, **kw)
        sizes.append(("search", sum(_wire_bytes(v) for hits in res for h in hits
                                    for v in h["entity"].values()) + 12 * sum(map(len, res))))
        return res

    client.insert, client.query, client.search = insert, query, search
    ids = [f"https://example.org/{'x' * 280}/{i:04d}" for i in range(12)]
    docs = [make_list(fmt, rng, 97) for _ in range(8)] + [make_list(fmt, rng, 300) for _ in range(4)]
    md = [{"text": "w" * 12000, "i": i} for i in range(12)]
    lite.upsert(ids, docs, md)  # 97 token rows of 12 KB filter JSON each: 1.2 MB per document
    got = {r.id: r for r in lite.get(ids)}  # 4 documents of 5 parts (44 KB each)
    assert len(got) == 12
    for x, v, m in zip(ids, docs, md, strict=True):
        np.testing.assert_array_equal(got[x].vectors, v)
        assert got[x].metadata == m
    q = make_list(fmt, rng, 35)
    hits = lite.search(q, k=12, rows_per_vector=16384)  # every row per query vector: 61 KB each
    assert sorted(h.id for h in hits) == sorted(ids)
    assert sorted(x for x, _ in lite.scan(batch_size=1000)) == sorted(ids)  # 12 KB metadata each
    client.insert, client.query, client.search = real_insert, real_query, real_search
    kinds = {k for k, _ in sizes}
    assert kinds == {"insert", "query", "search"}
    too_big = [(k, n) for k, n in sizes if n > budget]
    assert not too_big, f"requests over the {budget}-byte budget: {too_big[:5]}"


class _EmbeddingListServer:
    """A stand-in for the pymilvus client of a Milvus >= 2.6.4 server (none runs here): one
    ``embedding_list`` collection whose search ranks by exact MaxSim and takes no filter, as a
    filter that Milvus cannot answer exactly is sent as none. Records the bytes of each answer."""

    def __init__(self, fmt: TaggedFormat) -> None:
        import json

        from pymilvus import DataType

        self.docs: dict[str, tuple[np.ndarray, str]] = {}
        self.answers: list[int] = []
        self.desc = {"description": json.dumps({"uibk": "embedding_list", "schema": 1,
                                                "format": fmt.to_stored()}, sort_keys=True),
                     "fields": [{"name": "doc_id", "type": DataType.VARCHAR, "params": {"max_length": 2048}},
                                {"name": "meta", "type": DataType.VARCHAR, "params": {"max_length": 65535}},
                                {"name": "f", "type": DataType.JSON, "params": {}},
                                {"name": "n_rows", "type": DataType.INT64, "params": {}}]}

    def get_server_version(self, **kw):
        return "v2.6.4"

    def has_collection(self, name, **kw):
        return True

    def describe_collection(self, name, **kw):
        return self.desc

    def load_collection(self, name, **kw):
        pass

    def close(self):
        pass

    def upsert(self, name, rows, **kw):
        for r in rows:
            self.docs[r["doc_id"]] = (np.array([e["v"] for e in r["vectors"]], dtype=np.float32), r["meta"])

    def query(self, name, filter, output_fields, **kw):
        import json

        assert filter.startswith("doc_id in [")
        out = []
        for x in json.loads(filter[len("doc_id in "):]):
            if x in self.docs:
                v, meta = self.docs[x]
                row = {"doc_id": x, "n_rows": len(v), "meta": meta, "vectors": [{"v": r} for r in v.tolist()]}
                out.append({f: row[f] for f in output_fields})
        self.answers.append(sum(_wire_bytes(v) for r in out for v in r.values()))
        return out

    def search(self, name, data, limit, filter, **kw):
        assert filter == ""
        q = data[0].to_numpy()
        scores = sorted(((float((q @ v.T).max(axis=1).sum()), x) for x, (v, _) in self.docs.items()),
                        reverse=True)
        return [[{"entity": {"doc_id": x}, "distance": s} for s, x in scores[:limit]]]


def test_embedding_list_searches_deeper_for_a_filter_milvus_cannot_apply(fmt, rng):
    """A negation is checked on the rescored documents only; the embedding_list layout rescored
    the max(k, candidates) documents Milvus named and returned fewer than k hits when k
    documents matched further down (token_rows searches deeper). Its fetch asked for 256
    documents at once, up to 4096 vectors each, past Milvus' 64 MiB message limit. Runs on a
    stand-in client (no Milvus >= 2.6.4 here)."""
    server = _EmbeddingListServer(fmt)
    store = MilvusStore(uri="http://stand-in:19530", collection="el", layout="embedding_list",
                        client=server, candidates=2)
    store._request_bytes = 2**20
    ids = [f"d{i}" for i in range(40)]
    docs = [make_list(fmt, rng, 300) for _ in ids]
    md = [{"lang": "de" if i % 10 == 0 else "en"} for i in range(40)]
    store.upsert(ids, docs, md)
    ref = ExactStore()
    ref.upsert(ids, docs, md)
    q = docs[5][:20]  # the nearest documents are "en"
    for flt, k in (({"lang": {"$ne": "en"}}, 10), ({"lang": {"$nin": ["de"]}}, 5), (None, 12)):
        want = [(h.id, round(h.score, 4)) for h in ref.search(q, k=k, filter=flt)]
        assert [(h.id, round(h.score, 4)) for h in store.search(q, k=k, filter=flt)] == want, flt
    server.answers.clear()
    assert sorted(r.id for r in store.get(ids)) == sorted(ids)  # 40 lists of 150 KB
    assert server.answers and max(server.answers) <= 2**20, server.answers
