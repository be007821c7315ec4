"""What is specific to the Qdrant adapters (the store contract itself is the conformance suite):
existing collections are validated and left untouched, ids map to UUIDv5 points, prefetch
mode, payload indexes, filter value types, and retries / unreachable servers."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import numpy as np
import pytest

pytest.importorskip("qdrant_client")
qdrant_edge = pytest.importorskip("qdrant_edge")

from qdrant_client import QdrantClient, models  # noqa: E402

from uibk_embedding.adapters.qdrant import (  # noqa: E402
    ID_KEY,
    POINT_ID_NAMESPACE,
    CollectionMismatch,
    QdrantStore,
    QdrantUnavailable,
    _is_transient,
    point_id,
)
from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore  # noqa: E402
from uibk_embedding.errors import StoreNotFound  # noqa: E402
from uibk_embedding.maxsim import maxsim  # noqa: E402
from uibk_embedding.tagged import TaggedFormat  # noqa: E402
from uibk_embedding.testing import make_list  # noqa: E402

MULTI = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)


def _vp(size=128, distance=models.Distance.DOT, multi=MULTI):
    return models.VectorParams(size=size, distance=distance, multivector_config=multi)


def _user_collection(client, name, vectors_config):
    """A collection as a user would have made it, with one point in it."""
    client.create_collection(name, vectors_config=vectors_config)
    if isinstance(vectors_config, dict):
        vec = {}
        for k, p in vectors_config.items():
            v = np.full(p.size, 1 / np.sqrt(p.size)).tolist()
            vec[k] = [v, v] if p.multivector_config else v
    else:
        v = np.full(vectors_config.size, 1 / np.sqrt(vectors_config.size)).tolist()
        vec = [v, v] if vectors_config.multivector_config else v
    client.upsert(name, [models.PointStruct(id=7, vector=vec, payload={"owner": "user"})])
    return client.get_collection(name).config.model_dump_json()


@pytest.fixture
def client():
    c = QdrantClient(location=":memory:")
    yield c
    c.close()


# -- existing collections ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("vectors", "message"),
    [
        ({"tagged": _vp(distance=models.Distance.COSINE), "dense": _vp(381, multi=None)},
         "'tagged' uses distance Cosine, needs Dot"),
        ({"tagged": _vp(multi=None), "dense": _vp(381, multi=None)},
         "'tagged' is not a multivector with comparator max_sim"),
        ({"tagged": _vp(size=64), "dense": _vp(381, multi=None)}, "'tagged' has size 64, needs 128"),
        ({"colbert": _vp(), "sentence": _vp(381, multi=None)},
         "it has no vector named 'tagged' (it has ['colbert', 'sentence'])"),
        ({"tagged": _vp()}, "it has no dense vector named 'dense'"),
        ({"tagged": _vp(), "dense": _vp(384, multi=None)}, "'dense' has size 384, needs 381"),
        (_vp(), "it has a single unnamed vector"),
    ],
    ids=["cosine", "no-multivector", "wrong-size", "wrong-names", "no-dense", "dense-size", "unnamed"],
)
def test_wrong_existing_collection_is_refused_and_untouched(client, vectors, message):
    before = _user_collection(client, "theirs", vectors)
    with pytest.raises(CollectionMismatch) as err:
        QdrantStore("theirs", client=client)
    assert message in str(err.value)
    assert "The collection was not changed" in str(err.value)
    assert client.get_collection("theirs").config.model_dump_json() == before
    assert client.count("theirs").count == 1
    assert client.retrieve("theirs", [7])[0].payload == {"owner": "user"}


def test_all_differences_reported_at_once(client):
    _user_collection(client, "theirs", {"tagged": _vp(size=96, distance=models.Distance.COSINE)})
    with pytest.raises(CollectionMismatch, match=r"size 96.*distance Cosine.*no dense vector"):
        QdrantStore("theirs", client=client)


def test_matching_existing_collection_is_used_as_is(client, fmt, rng):
    _user_collection(client, "theirs", {"colbert": _vp()})
    store = QdrantStore("theirs", client=client, vector_name="colbert", dense_name=None)
    assert not store.created and store.count() == 1
    doc = make_list(fmt, rng, 5)
    store.upsert(["mine"], [doc])
    assert store.search(doc, k=1)[0].id == "mine"
    assert client.retrieve("theirs", [7])[0].payload == {"owner": "user"}
    with pytest.raises(PermissionError, match="not created by this store"):
        store.drop_collection()
    assert client.collection_exists("theirs")
    with pytest.raises(ValueError, match="needs the dense vector"):
        store.search(doc, k=1, mode="prefetch")


def test_missing_collection_without_create(client):
    with pytest.raises(StoreNotFound, match="does not exist"):
        QdrantStore("nothing", client=client, create=False)
    assert not client.collection_exists("nothing")


def test_format_recorded_and_checked(client):
    QdrantStore("c", client=client, format=TaggedFormat(beta=0.8))
    with pytest.raises(CollectionMismatch, match=r"holds lists of beta=0\.8, lambda=0\.75, not beta=0\.9"):
        QdrantStore("c", client=client, format=TaggedFormat())
    assert QdrantStore("c", client=client, format=TaggedFormat(beta=0.8)).count() == 0
    assert QdrantStore("c", client=client).format.beta == 0.8  # no format given: the recorded one


def test_created_collection_layout(client):
    QdrantStore("c", client=client, shard_number=2, replication_factor=1, on_disk=True)
    params = client.get_collection("c").config.params
    mv, dv = params.vectors["tagged"], params.vectors["dense"]
    assert (mv.size, mv.distance, mv.multivector_config.comparator) == (
        128, models.Distance.DOT, models.MultiVectorComparator.MAX_SIM)
    assert mv.hnsw_config.m == 0 and mv.on_disk
    assert (dv.size, dv.distance, dv.multivector_config) == (381, models.Distance.DOT, None)


def test_wrong_edge_shard_is_refused_and_untouched(tmp_path):
    e = qdrant_edge
    path = tmp_path / "shard"
    cfg = e.EdgeConfig(vectors={"tagged": e.EdgeVectorParams(
        128, e.Distance.Cosine, multivector_config=e.MultiVectorConfig(e.MultiVectorComparator.MaxSim))})
    e.EdgeShard.create(str(path), cfg).close()
    before = (path / "edge_config.json").read_bytes()
    with pytest.raises(CollectionMismatch, match=r"distance Cosine, needs Dot.*no dense vector"):
        QdrantEdgeStore(path=path)
    assert (path / "edge_config.json").read_bytes() == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(CollectionMismatch, match="not an empty directory"):
        QdrantEdgeStore(path=tmp_path / "other")


@pytest.mark.parametrize("kind", ["local", "edge"])
def test_dense_name_none_on_a_collection_with_a_dense_head_is_refused(kind, tmp_path, fmt, rng):
    """Opened with ``dense_name=None``, a collection that has our dense head would get documents
    without it, which prefetch mode can never find: refused, naming the vector, nothing written."""
    path = tmp_path / "q"
    make = (lambda **kw: QdrantStore("c", path=path, **kw)) if kind == "local" else (
        lambda **kw: QdrantEdgeStore(path=path, **kw))
    with make() as s:
        s.upsert(["a"], [make_list(fmt, rng, 3)])
    with pytest.raises(CollectionMismatch, match=r"dense vector 'dense' .* pass dense_name='dense'"):
        make(dense_name=None)
    with make() as s:
        assert s.count() == 1
        q = make_list(fmt, rng, 2)
        assert [h.id for h in s.search(q, k=5, mode="prefetch", prefetch=10)] == ["a"]


# -- ids -------------------------------------------------------------------------------------------
def test_uuid5_point_ids_keep_the_original_id(client, fmt, rng):
    store = QdrantStore("c", client=client)
    ids = ["doc-1", "ünïcode id", "x" * 512]
    store.upsert(ids, [make_list(fmt, rng, 4) for _ in ids], [{"k": i} for i in range(3)])
    for i, x in enumerate(ids):
        pid = str(uuid.uuid5(POINT_ID_NAMESPACE, x))
        assert point_id(x) == pid
        rec = client.retrieve("c", [pid], with_payload=True)[0]
        assert rec.payload == {"k": i, ID_KEY: x}
    got = store.get(ids)
    assert [r.id for r in got] == ids and got[1].metadata == {"k": 1}
    assert all(not k.startswith("_uibk") for h in store.search(got[0].vectors, k=3) for k in h.metadata)


def test_edge_uses_the_same_point_ids(tmp_path, fmt, rng):
    with QdrantEdgeStore(path=tmp_path / "s") as s:
        s.upsert(["doc-1"], [make_list(fmt, rng, 4)], [{"flag": True}])
        rec = s.shard.retrieve([point_id("doc-1")], with_payload=True, with_vector=False)
        assert rec[0].payload[ID_KEY] == "doc-1"
        assert s.get(["doc-1"])[0].metadata == {"flag": True}


def test_batched_upserts(client, fmt, rng):
    store = QdrantStore("c", client=client, batch_size=3, show_progress=False)
    docs = [make_list(fmt, rng, 4) for _ in range(10)]
    store.upsert([f"d{i}" for i in range(10)], docs)
    assert store.count() == 10
    assert [r.id for r in store.get(["d9", "d0"])] == ["d9", "d0"]


# -- prefetch mode ---------------------------------------------------------------------------------
@pytest.fixture(params=["qdrant", "edge"])
def loaded(request, real_data, tmp_path):
    store = (QdrantStore(location=":memory:") if request.param == "qdrant"
             else QdrantEdgeStore(path=tmp_path / "edge"))
    store.upsert(real_data.doc_ids, real_data.docs)
    yield store
    store.close()


def test_prefetch_reranks_dense_candidates_exactly(loaded, real_data):
    docs = dict(zip(real_data.doc_ids, real_data.docs, strict=True))
    from uibk_embedding.tagged import dense_vector

    dense = np.stack([dense_vector(d) for d in real_data.docs])
    for q in real_data.queries[:2]:  # local mode is pure Python: keep it short
        exact = loaded.search(q, k=10)
        # N >= collection size: prefetch mode is exact
        full = loaded.search(q, k=10, mode="prefetch", prefetch=len(docs))
        assert [h.id for h in full] == [h.id for h in exact]
        # small N: the hits are the N dense candidates, reranked by exact MaxSim
        hits = loaded.search(q, k=10, mode="prefetch", prefetch=20)
        cand = {real_data.doc_ids[i] for i in np.argsort(-(dense @ dense_vector(q)))[:20]}
        assert {h.id for h in hits} <= cand and len(hits) == 10
        for h in hits:
            assert h.score == pytest.approx(maxsim(q, docs[h.id]), rel=1e-5)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_prefetch_with_filter_and_batch(loaded, real_data):
    md = [{"half": i % 2} for i in range(len(real_data.doc_ids))]
    loaded.upsert(real_data.doc_ids, real_data.docs, md)
    allowed = {x for x, m in zip(real_data.doc_ids, md, strict=True) if m["half"] == 1}
    qs = real_data.queries[:2]
    batch = loaded.search_batch(qs, k=5, filter={"half": 1}, mode="prefetch", prefetch=30)
    for q, hits in zip(qs, batch, strict=True):
        assert {h.id for h in hits} <= allowed and len(hits) == 5
        single = loaded.search(q, k=5, filter={"half": 1}, mode="prefetch", prefetch=30)
        assert [h.id for h in single] == [h.id for h in hits]


def test_mode_arguments(fmt, rng):
    store = QdrantStore(location=":memory:", mode="prefetch", prefetch=5)
    assert store.exact is False and QdrantStore.exact is True
    docs = [make_list(fmt, rng, 4) for _ in range(8)]
    store.upsert([f"d{i}" for i in range(8)], docs)
    q = make_list(fmt, rng, 3)
    # the base signature (positional k, filter, explain) still works
    hits = store.search(q, 3, None, explain=True)
    assert len(hits) == 3 and hits[0].decomposition is not None
    assert [h.id for h in store.search(q, k=8, mode="exact")] == [
        h.id for h in store.search(q, k=8, mode="prefetch", prefetch=100)]
    with pytest.raises(ValueError, match="mode must be one of"):
        store.search(q, mode="fast")
    with pytest.raises(ValueError, match="prefetch must be a positive int"):
        store.search(q, mode="prefetch", prefetch=0)
    with pytest.raises(ValueError, match="token rows only"):
        store.search(q[3:], mode="prefetch")
    assert len(store.search(q[3:], k=2, mode="exact")) == 2
    with pytest.raises(ValueError, match="needs the dense vector"):
        QdrantStore(location=":memory:", dense_name=None, mode="prefetch")


# -- filters and payload indexes -------------------------------------------------------------------
@pytest.fixture(params=["qdrant", "edge"])
def typed(request, tmp_path, fmt, rng):
    store = (QdrantStore(location=":memory:") if request.param == "qdrant"
             else QdrantEdgeStore(path=tmp_path / "edge"))
    md = {"t": {"v": True}, "one": {"v": 1}, "onef": {"v": 1.0}, "s": {"v": "1"}, "f": {"v": False},
          "zero": {"v": 0}, "big": {"v": 2**60}, "dot": {"a.b": "x"}, "list": {"v": ["1", 1]},
          "none": {}}
    store.upsert(list(md), [make_list(fmt, rng, 4) for _ in md], list(md.values()))
    yield store
    store.close()


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({"v": True}, {"t"}),
        ({"v": False}, {"f"}),
        ({"v": 1}, {"one", "onef"}),
        ({"v": 1.0}, {"one", "onef"}),
        ({"v": 0}, {"zero"}),
        ({"v": "1"}, {"s"}),
        ({"v": {"$in": [True, "1"]}}, {"t", "s"}),
        ({"v": {"$in": [False, 0, 2**60]}}, {"f", "zero", "big"}),
        ({"v": 2**60}, {"big"}),
        ({"a.b": "x"}, {"dot"}),
        ({"a": "x"}, set()),
        ({"missing": 1}, set()),
    ],
)
def test_filter_value_types(typed, fmt, rng, flt, expected):
    """Types match as in the exact store (True is not 1, "1" is not 1, 1 is 1.0), and a
    list-valued field equals nothing, as everywhere (Qdrant itself would match one element: the
    payload names its list fields under ``_uibk_lists`` and filters exclude them)."""
    hits = typed.search(make_list(fmt, rng, 3), k=20, filter=flt)
    assert {h.id for h in hits} == expected


def test_filter_field_with_quote_is_refused(typed, fmt, rng):
    for field in ('a"b', "C:\\dir"):  # Edge's JSON path parser refused the backslash mid-search
        with pytest.raises(ValueError, match="double quote or a backslash"):
            typed.search(make_list(fmt, rng, 3), k=3, filter={field: 1})


def test_payload_indexes_on_request(tmp_path, fmt, rng):
    with QdrantEdgeStore(path=tmp_path / "e", payload_indexes={"lang": "keyword", "year": "float"}) as s:
        schema = s.shard.info().payload_schema
        assert {"lang", "year"} <= set(schema)
        s.upsert(["a", "b"], [make_list(fmt, rng, 4) for _ in "ab"],
                 [{"lang": "en", "year": 2024}, {"lang": "de", "year": 2023}])
        assert [h.id for h in s.search(make_list(fmt, rng, 3), k=5, filter={"year": 2024})] == ["a"]
        s.upsert(["c"], [make_list(fmt, rng, 4)], [{"year": 2023.5}])
        assert {h.id for h in s.search(make_list(fmt, rng, 3), k=5, filter={"year": {"$gt": 2023}})} == {
            "a", "c"}  # with an integer index Edge left 2023.5 out: refused below
        with pytest.raises(ValueError, match="unknown payload schema"):
            s.create_payload_index("x", "fancy")
        with pytest.raises(ValueError, match="index numeric fields as \"float\""):
            s.create_payload_index("year", "integer")
    store = QdrantStore(location=":memory:", payload_indexes={"lang": "keyword"})
    with pytest.raises(ValueError, match="unknown payload schema"):
        store.create_payload_index("x", "fancy")
    for schema in ("integer", models.PayloadSchemaType.INTEGER, models.IntegerIndexParams(type="integer")):
        with pytest.raises(ValueError, match="integer index leaves non-integral values out"):
            store.create_payload_index("year", schema)
    with pytest.raises(ValueError, match="integer index"):
        QdrantEdgeStore(path=tmp_path / "f", payload_indexes={"year": "integer"})
    assert not (tmp_path / "f").exists() or not any((tmp_path / "f").iterdir())



@pytest.mark.parametrize("kind", ["qdrant", "edge"])
def test_equality_at_2_53_matches_as_in_the_exact_store(kind, tmp_path, fmt, rng):
    """2**53 itself went down the float64 range path, where 2**53 + 1 rounds to it: on Edge
    ``{"a": 2**53}`` matched the stored int 2**53 + 1 (and ``$ne`` left it out)."""
    from uibk_embedding.adapters import open_store

    md = {"p1": {"a": 2**53 + 1}, "p0": {"a": 2**53}, "n1": {"a": -(2**53) - 1}, "n0": {"a": -(2**53)},
          "small": {"a": 2**53 - 1}}
    docs = [make_list(fmt, rng, 4) for _ in md]
    qdrant = QdrantStore(location=":memory:") if kind == "qdrant" else QdrantEdgeStore(path=tmp_path / "e")
    stores = {"exact": open_store("exact"), kind: qdrant}
    try:
        for s in stores.values():
            s.upsert(list(md), docs, list(md.values()))
        q = make_list(fmt, rng, 3)
        for v in (2**53, -(2**53)):
            for flt in ({"a": v}, {"a": {"$in": [v]}}, {"a": {"$ne": v}}, {"a": {"$nin": [v]}}):
                got = {name: {h.id for h in s.search(q, k=10, filter=flt)} for name, s in stores.items()}
                assert got[kind] == got["exact"], flt
    finally:
        for s in stores.values():
            s.close()

# -- retries and unreachable servers ---------------------------------------------------------------
def test_transient_errors_are_classified():
    import httpx
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    def resp(code):
        return UnexpectedResponse(code, "x", b"", httpx.Headers())

    assert all(_is_transient(resp(c)) for c in (429, 502, 503, 504))
    assert not any(_is_transient(resp(c)) for c in (400, 401, 403, 404, 409, 422))
    assert _is_transient(ResponseHandlingException(httpx.ConnectError("refused")))
    assert _is_transient(ResponseHandlingException(httpx.ReadTimeout("slow")))
    assert not _is_transient(ValueError("bad vector"))


def test_retries_only_transient_failures():
    import httpx

    store = QdrantStore(location=":memory:", max_retries=2, backoff=0.01)
    calls = []

    def flaky(kind):
        calls.append(kind)
        raise httpx.ConnectError("refused") if kind == "net" else ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        store._call("op", flaky, "bad")
    assert calls == ["bad"]  # not retried
    calls.clear()
    with pytest.raises(QdrantUnavailable, match="op failed after 3 attempt"):
        store._call("op", flaky, "net")
    assert calls == ["net"] * 3
    calls.clear()

    def recovers():
        calls.append(1)
        if len(calls) < 2:
            raise httpx.ReadTimeout("slow")
        return "ok"

    assert store._call("op", recovers) == "ok" and len(calls) == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_url_fails_fast_with_a_clear_error():
    port = _free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(QdrantUnavailable, match=rf"Qdrant at http://127.0.0.1:{port}.*failed after 2"):
        QdrantStore(url=f"http://127.0.0.1:{port}", timeout=1, max_retries=1, backoff=0.1)
    assert time.monotonic() - t0 < 5


def test_silent_server_times_out_within_the_configured_timeout():
    """A socket that accepts connections and never answers: each attempt ends at the timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    accepted = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(srv.accept()[0])
            except OSError:
                continue

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(QdrantUnavailable, match="failed after 2 attempt"):
            QdrantStore(url=f"http://127.0.0.1:{srv.getsockname()[1]}", timeout=1, max_retries=1,
                        backoff=0.1)
        elapsed = time.monotonic() - t0
        assert 1.5 < elapsed < 6, elapsed  # two attempts of ~1 s each, plus the backoff
        assert len(accepted) >= 2  # the read was retried
    finally:
        stop.set()
        th.join()
        for c in accepted:
            c.close()
        srv.close()


def test_edge_bool_workaround_is_needed():
    """Why the Edge store keeps ``_uibk_bools``: the binding turns MatchValue(True) into 1."""
    value = qdrant_edge.MatchValue(True).value
    assert type(value) is int and value == 1


# -- the redo log never bricks a store (local mode on disk and Edge) ---------------------------
def _deep(n):
    x: object = 1
    for _ in range(n):
        x = {"a": x}
    return x


LOGGED = {  # store kind -> (how to open it, its redo folder, metadata its engine refuses)
    "path": (lambda d: QdrantStore(path=d / "q"), lambda d: d / "q" / "uibk-redo" / "uibk",
             {"d": _deep(600)}),  # qdrant-client: RecursionError while pickling the point
    "edge": (lambda d: QdrantEdgeStore(path=d / "e"), lambda d: d / "e" / "uibk-redo",
             {"k": "v\ud800"}),  # qdrant-edge: TypeError extracting the payload value
}


@pytest.mark.parametrize("kind", sorted(LOGGED))
def test_a_write_the_engine_would_refuse_never_bricks_the_store(kind, tmp_path, fmt, rng):
    """Inputs that passed validation and failed inside the engine used to stay in the redo log
    and fail again before every later write and on every open: now they are refused up front
    (InvalidInput) and the next write, and the next open, work."""
    from uibk_embedding.errors import InvalidInput

    make, _folder, refused = LOGGED[kind]
    doc = make_list(fmt, rng, 5)
    s = make(tmp_path)
    try:
        s.upsert(["a"], [doc], [{"n": 1}])
        for i, (ids, md) in enumerate([(["x\ud800"], None), (["b"], [{"k": "v\ud800"}]),
                                       (["b"], [{"k\udc00": 1}]), (["b"], [{"d": _deep(600)}]),
                                       (["b"], [refused])]):
            with pytest.raises(InvalidInput):
                s.upsert(ids, [doc], md)
            s.upsert([f"after-{i}"], [doc])  # the next write goes through
    finally:
        s.close()
    s = make(tmp_path)
    try:
        assert s.count() == 6 and s.get(["b"]) == []
    finally:
        s.close()


@pytest.mark.parametrize("kind", sorted(LOGGED))
def test_a_logged_operation_the_engine_refuses_is_quarantined_on_open(kind, tmp_path, fmt, rng):
    """Log entries on disk that the engine refuses (written past validation, e.g. by an older
    version): the store still opens, applies the good entries around them in order, moves the
    bad ones to the quarantine folder with a ReplayFailed warning, and accepts later writes."""
    import warnings

    from uibk_embedding.adapters.redo import RedoLog, ReplayFailed

    make, folder, refused = LOGGED[kind]
    doc = make_list(fmt, rng, 5)
    s = make(tmp_path)
    s.upsert(["a", "z"], [doc, doc])
    s.close()
    log = RedoLog(folder(tmp_path))
    log._write("upsert", ["g1"], [doc], [{"n": 1}])
    log._write("upsert", ["x\ud800"], [doc], [{}])  # no engine takes this id
    log._write("upsert", ["bad-md"], [doc], [refused])
    log._write("delete", ["a"], None, None)
    with pytest.warns(ReplayFailed) as caught:
        s = make(tmp_path)
    try:
        failed = [w for w in caught if issubclass(w.category, ReplayFailed)]
        assert len(failed) == 2 and all("moved to" in str(w.message) for w in failed)
        assert sorted(r.id for r in s.get(["a", "z", "g1", "bad-md"])) == ["g1", "z"]
        assert len(list((folder(tmp_path) / "failed").glob("*.npz"))) == 2
        s.upsert(["later"], [doc])
        s.delete(["z"])
    finally:
        s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplayFailed)  # quarantined once: never replayed again
        s = make(tmp_path)
    try:
        assert sorted(x for x, _ in s.scan()) == ["g1", "later"]
    finally:
        s.close()


def test_edge_max_search_threads_is_a_creation_option(tmp_path):
    """Reopening with it failed inside the engine ("EdgeConfig requires at least one of vectors
    or sparse_vectors"); now a ValueError that says what to do, and the shard opens without it."""
    QdrantEdgeStore(path=tmp_path / "e", max_search_threads=1).close()
    with pytest.raises(ValueError, match="max_search_threads is set when a shard is created"):
        QdrantEdgeStore(path=tmp_path / "e", max_search_threads=2)
    with QdrantEdgeStore(path=tmp_path / "e") as s:
        assert s.count() == 0


# -- local-mode folders: one redo log per collection, nothing of another collection or owner ------
def _torn_upsert(store, monkeypatch, doc, doc_id="old"):
    """An upsert whose engine call fails transiently (disk full): its redo entry stays logged."""
    def disk_full(*args):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(store, "_write_points", disk_full)
        with pytest.raises(OSError, match="No space left"):
            store.upsert([doc_id], [doc], [{"from": "the dropped collection"}])
    assert store._redo.dirty


def test_a_dropped_collections_unfinished_write_never_reaches_a_new_one(tmp_path, fmt, rng, monkeypatch):
    """drop() left ``uibk-redo/<collection>`` behind, and a new collection of the same name
    replayed the dropped one's unfinished write into itself (count 1 instead of 0)."""
    from uibk_embedding.adapters.qdrant import redo_folder

    path = tmp_path / "q"
    s = QdrantStore("papers", path=path)
    _torn_upsert(s, monkeypatch, make_list(fmt, rng, 4))
    s.drop()
    s.close()
    assert not redo_folder(path, "papers").exists()
    with QdrantStore("papers", path=path) as s:
        assert s.created and s.count() == 0
    with QdrantStore("papers", path=path) as s:
        assert s.count() == 0


def test_a_log_left_by_a_collection_that_is_gone_is_not_replayed_into_a_new_one(tmp_path, fmt, rng):
    """A crash between drop's two steps (collection deleted, its log not yet): the log is
    forgotten when the collection is created again, before it exists, so no later open replays it."""
    from uibk_embedding.adapters.qdrant import redo_folder
    from uibk_embedding.adapters.redo import RedoLog

    path = tmp_path / "q"
    QdrantStore("other", path=path).close()
    RedoLog(redo_folder(path, "papers"))._write("upsert", ["old"], [make_list(fmt, rng, 4)], [{}])
    with QdrantStore("papers", path=path) as s:
        assert s.created and s.count() == 0
        s.upsert(["new"], [make_list(fmt, rng, 4)])
    with QdrantStore("papers", path=path) as s:
        assert sorted(x for x, _ in s.scan()) == ["new"]
    with QdrantStore("other", path=path) as s:
        assert s.count() == 0
    # a 0.2.0 log (no collection named) in a folder that holds no collection any more
    path = tmp_path / "q2"
    s = QdrantStore("x", path=path)
    s.drop()
    s.close()
    RedoLog(path / "uibk-redo")._write("upsert", ["old"], [make_list(fmt, rng, 4)], [{}])
    for _ in range(2):
        with QdrantStore("papers", path=path) as s:
            assert s.count() == 0


def test_a_collection_named_like_a_log_file_opens(tmp_path, fmt, rng):
    """``uibk-redo/papers.npz`` (the log folder of collection ``papers.npz``) was taken for an
    entry of the 0.2.0 log: IsADirectoryError on create and on every open, and every other
    collection of the folder warned of unfinished writes."""
    import warnings

    path = tmp_path / "q"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        QdrantStore("other", path=path).close()
        with QdrantStore("papers.npz", path=path) as s:
            s.upsert(["a"], [make_list(fmt, rng, 4)])
        with QdrantStore("papers.npz", path=path) as s:
            assert s.count() == 1
        with QdrantStore("other", path=path) as s:
            assert s.count() == 0
    # a 0.2.0 log beside it, in a folder whose only collection is papers.npz: replayed into it
    from uibk_embedding.adapters.redo import RedoLog

    path = tmp_path / "q2"
    QdrantStore("papers.npz", path=path).close()
    RedoLog(path / "uibk-redo")._write("upsert", ["old"], [make_list(fmt, rng, 4)], [{}])
    with QdrantStore("papers.npz", path=path) as s:
        assert [r.id for r in s.get(["old"])] == ["old"]


@pytest.mark.parametrize("content", ['{"name": "my dataset", "rows": 3}', "[1, 2]", "not json",
                                     '{"collections": [1], "aliases": {}}', '{"collections": {"c": 1}}',
                                     None])
def test_a_folder_with_someone_elses_meta_json_is_refused(tmp_path, content):
    """Any folder holding a file named meta.json was taken for a local-mode folder, and
    qdrant-client failed on it (KeyError, TypeError, JSONDecodeError, IsADirectoryError)."""
    from uibk_embedding.errors import CollectionMismatch as Mismatch

    path = tmp_path / "data"
    path.mkdir()
    (path / "data.csv").write_text("a,b\n")
    if content is None:
        (path / "meta.json").mkdir()
    else:
        (path / "meta.json").write_text(content)
    before = sorted(p.name for p in path.iterdir())
    for create in (True, False):
        with pytest.raises(Mismatch, match=r"meta\.json.*not .*Qdrant local-mode.*nothing was written"):
            QdrantStore("c", path=path, create=create)
    assert sorted(p.name for p in path.iterdir()) == before
    if content is not None:
        assert (path / "meta.json").read_text() == content


# -- Qdrant Edge: our record and the flush before a redo entry goes ---------------------------------
def test_an_edge_shard_without_our_record_gets_one_on_reopen(tmp_path):
    """Creation killed between the engine's flush and our record: every format= was accepted on
    each open and no record was ever written, so writes under two formats mixed in one shard."""
    from uibk_embedding.adapters.qdrant_edge import CONFIG_FILE

    other = TaggedFormat(beta=0.8)
    for given, kept in ((other, other), (None, TaggedFormat())):
        path = tmp_path / f"e-{given is None}"
        QdrantEdgeStore(path=path).close()
        (path / CONFIG_FILE).unlink()  # what the killed creation left
        with QdrantEdgeStore(path=path, format=given) as s:
            assert s.format == kept
        assert (path / CONFIG_FILE).exists()
        with pytest.raises(CollectionMismatch, match="it holds lists of"):
            QdrantEdgeStore(path=path, format=TaggedFormat(beta=0.7))
        with QdrantEdgeStore(path=path) as s:
            assert s.format == kept


def test_an_edge_creation_killed_before_the_engines_config_is_made_again(tmp_path, fmt, rng):
    """``EdgeShard.create`` writes ``wal/`` and ``segments/`` before ``edge_config.json``: a kill
    in between left a folder that every later open refused as "not an Edge shard" (the crash test
    hit it under load). Such a folder is cleared and created again; one holding anything else is
    still refused and kept as it is."""
    import shutil

    from uibk_embedding.adapters.qdrant_edge import CONFIG_FILE, EDGE_CONFIG

    made = tmp_path / "made"
    QdrantEdgeStore(path=made).close()
    killed = {  # what the kills left, in the order the engine writes: real engine files
        "wal-only": ["wal"],
        "wal-and-segments": ["wal", "segments"],
        "with-temporaries": ["wal", "segments", ".atomicwriteAbC123", ".tmp-uibk-1-2-" + CONFIG_FILE],
    }
    for name, left in killed.items():
        path = tmp_path / name
        path.mkdir()
        for entry in left:
            if (made / entry).is_dir():
                shutil.copytree(made / entry, path / entry)
            else:
                (path / entry).mkdir() if entry.startswith(".atomicwrite") else (path / entry).write_text("{")
        lists = [make_list(fmt, rng, 4), make_list(fmt, rng, 5)]
        with QdrantEdgeStore(path=path, format=fmt) as s:
            s.upsert(["a", "b"], lists)
        with QdrantEdgeStore(path=path) as s:
            assert s.count() == 2 and s.format == fmt, name
        assert not list(path.glob(".atomicwrite*")) and not list(path.glob(".tmp-uibk-*")), name
    foreign = tmp_path / "foreign"
    shutil.copytree(made / "wal", foreign / "wal")
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(CollectionMismatch, match="not an empty directory or an Edge shard"):
        QdrantEdgeStore(path=foreign)
    assert (foreign / "notes.txt").read_text() == "mine" and (foreign / "wal").is_dir()
    assert not (foreign / EDGE_CONFIG).exists()


def test_edge_flushes_before_a_redo_entry_is_removed(tmp_path, fmt, rng, monkeypatch):
    """The redo entry may go only once the shard is flushed (a power cut could otherwise lose
    the write and its entry both). Replays (on open, and after a failed write) removed entries
    with no flush at all, and a delete by filter was never flushed. The real flush is wrapped to
    record how many entries are still logged when it runs."""
    from uibk_embedding.adapters.qdrant_edge import REDO_DIR
    from uibk_embedding.adapters.redo import RedoLog

    path = tmp_path / "e"
    doc = make_list(fmt, rng, 4)
    QdrantEdgeStore(path=path).close()
    RedoLog(path / REDO_DIR)._write("upsert", ["a"], [doc], [{}])  # a write that did not finish
    logged: list[int] = []
    real = QdrantEdgeStore._flush_engine

    def flush(self):
        logged.append(len(list((path / REDO_DIR).glob("*.npz"))))
        real(self)

    monkeypatch.setattr(QdrantEdgeStore, "_flush_engine", flush)
    with QdrantEdgeStore(path=path) as s:
        assert logged == [1] and s.count() == 1  # replayed on open, flushed before its entry went
        logged.clear()
        _torn_upsert(s, monkeypatch, doc, "b")
        s.upsert(["c"], [doc], [{"k": 1}])  # replays b first
        assert logged == [1, 1] and s.count() == 3
        logged.clear()
        assert s.delete(filter={"k": 1}) == 1
        assert logged == [0]
    assert list((path / REDO_DIR).glob("*.npz")) == []


def test_an_edge_shard_the_engine_cannot_load_is_an_engine_error_naming_it(tmp_path, fmt, rng):
    # the engine's own failures (here a damaged segment.json; on a read-only folder, its
    # bookkeeping rewrites) reached the caller as a bare Exception: a traceback from the CLI
    from uibk_embedding.errors import EngineError

    path = tmp_path / "edge"
    with QdrantEdgeStore(path=path) as s:
        s.upsert(["a"], [make_list(fmt, rng, 4)])
    segment = next(path.glob("segments/*/segment.json"))
    segment.write_text("{")
    for _ in range(2):  # the failed open released the folder's lock: the same error again
        with pytest.raises(EngineError, match=f"Qdrant Edge could not open the shard at {path}"):
            QdrantEdgeStore(path=path)


# -- request size, concurrent creation, collections we cannot write ---------------------------------
def test_upsert_requests_are_capped_by_vector_rows(client, fmt, rng, monkeypatch):
    """Qdrant refuses a JSON body over 32 MB: batches are cut by rows as well as by documents."""
    store = QdrantStore("c", client=client, batch_size=64, max_rows_per_request=40, show_progress=False)
    sizes = [5, 30, 12, 60, 3, 3, 20, 1]  # token rows; 60 (+ slots) is over the cap: sent alone
    docs = [make_list(fmt, rng, n) for n in sizes]
    rows_per_call: list[list[int]] = []
    upsert = client.upsert

    def spy(collection, points, **kw):
        rows_per_call.append([len(p.vector["tagged"]) for p in points])
        return upsert(collection, points=points, **kw)

    monkeypatch.setattr(client, "upsert", spy)
    ids = [f"d{i}" for i in range(len(docs))]
    store.upsert(ids, docs)
    big = max(len(d) for d in docs)
    assert big > 40
    for rows in rows_per_call:
        assert sum(rows) <= 40 or rows == [big], rows_per_call
    assert sorted(r for call in rows_per_call for r in call) == sorted(len(d) for d in docs)
    got = {r.id: r.vectors for r in store.get(ids)}
    assert all(np.array_equal(got[i], d) for i, d in zip(ids, docs, strict=True))
    with pytest.raises(ValueError, match="max_rows_per_request"):
        QdrantStore("c", client=client, max_rows_per_request=0)


def test_default_request_cap_keeps_300_token_documents_under_32_mb(client, fmt, rng, monkeypatch):
    """The reported case: 64 documents of 300 token rows in one request made a 49.5 MB body."""
    store = QdrantStore("c", client=client, show_progress=False)
    bodies: list[int] = []
    upsert = client.upsert

    def spy(collection, points, **kw):
        bodies.append(len(models.PointsList(points=points).model_dump_json()))
        return upsert(collection, points=points, **kw)

    monkeypatch.setattr(client, "upsert", spy)
    store.upsert([f"d{i}" for i in range(70)], [make_list(fmt, rng, 300) for _ in range(70)])
    assert max(bodies) < 32 * 2**20, bodies
    assert store.count() == 70


def test_losing_a_creation_race_opens_the_winners_collection(client, fmt, rng, monkeypatch):
    """Another writer creates the collection between our existence check and our create."""
    winner = QdrantStore("c", client=client)
    winner.upsert(["w"], [make_list(fmt, rng, 4)])
    exists = client.collection_exists

    def not_yet_once(name: str) -> bool:  # the first check runs before the winner's create
        calls.append(name)
        return len(calls) > 1 and exists(name)

    calls: list[str] = []
    monkeypatch.setattr(client, "collection_exists", not_yet_once)
    loser = QdrantStore("c", client=client)
    assert calls == ["c", "c"]  # the check that said "missing", then the one after the 'exists' error
    assert not loser.created and loser.count() == 1
    calls.clear()
    with pytest.raises(CollectionMismatch, match="no vector named 'other'"):  # and still validated
        QdrantStore("c", client=client, vector_name="other")


def test_a_collection_without_dense_vectors_is_refused(client):
    client.create_collection("sparse", vectors_config={},
                             sparse_vectors_config={"bm25": models.SparseVectorParams()})
    before = client.get_collection("sparse").config.model_dump_json()
    with pytest.raises(CollectionMismatch, match=r"it has no vector named 'tagged' \(it has no dense "
                                                 r"vectors; sparse vectors: \['bm25'\]\)"):
        QdrantStore("sparse", client=client)
    assert client.get_collection("sparse").config.model_dump_json() == before


@pytest.mark.parametrize("datatype", [models.Datatype.FLOAT16, models.Datatype.UINT8])
@pytest.mark.parametrize("vector", ["tagged", "dense"])
def test_a_collection_storing_vectors_below_float32_is_refused(client, datatype, vector):
    """float16 rounds and uint8 truncates what is written: scores would not be the exact store's."""
    vectors = {"tagged": _vp(), "dense": _vp(381, multi=None)}
    vectors[vector] = vectors[vector].model_copy(update={"datatype": datatype})
    before = _user_collection(client, "theirs", vectors)
    message = f"'{vector}' stores datatype {datatype.value}, needs float32"
    with pytest.raises(CollectionMismatch, match=message):
        QdrantStore("theirs", client=client)
    assert client.get_collection("theirs").config.model_dump_json() == before
    assert client.count("theirs").count == 1
    vectors[vector] = vectors[vector].model_copy(update={"datatype": models.Datatype.FLOAT32})
    _user_collection(client, "f32", vectors)
    assert not QdrantStore("f32", client=client).created
