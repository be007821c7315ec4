"""Weaviate adapter: what can be checked honestly without a server, plus live-only checks.

Offline, everything goes through the real ``weaviate-client`` classes: the collection request
as the client serialises it, the gRPC batch objects and filters the client would send, and the
client's own config dataclasses for existing-collection validation. No fake server, no mocks.
The conformance suite covers the store's behaviour live (``tests/backends/weaviate.py``); the
tests marked ``live`` here run only when ``WEAVIATE_URL`` is set.
"""

from __future__ import annotations

import json
import os
import uuid

import numpy as np
import pytest

pytest.importorskip("weaviate")

from weaviate.collections.batch.grpc_batch import _BatchGRPC
from weaviate.collections.classes import config as wc
from weaviate.collections.classes.batch import _BatchObject
from weaviate.collections.filters import _FilterToGRPC
from weaviate.collections.grpc.shared import _BaseGRPC, _Unpack
from weaviate.proto.v1 import base_pb2
from weaviate.util import _ServerVersion

from uibk_embedding.adapters import weaviate as wa
from uibk_embedding.adapters.filters import matches, parse_filter
from uibk_embedding.maxsim import maxsim
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

URL = os.environ.get("WEAVIATE_URL")
live = pytest.mark.skipif(not URL, reason="WEAVIATE_URL is not set: no Weaviate server for live checks")


# -- collection configuration ----------------------------------------------------------------
def _request(**kw) -> dict:
    """The JSON body ``client.collections.create(**collection_spec(...))`` sends."""
    return wc._CollectionConfigCreate(**wa.collection_spec("docs", **kw))._to_dict()


def test_collection_request_multivector_dot_maxsim():
    req = _request()
    assert req["class"] == "Docs"  # the client capitalises, as the server would
    vec = req["vectorConfig"]["uibk"]
    assert vec["vectorizer"] == {"none": {}}
    assert vec["vectorIndexType"] == "hnsw"
    idx = vec["vectorIndexConfig"]
    assert idx["distance"] == "dot"
    assert idx["multivector"] == {"enabled": True, "aggregation": "maxSim"}
    props = {p["name"]: p for p in req["properties"]}
    assert props["uibk_id"]["dataType"] == ["text"] and props["uibk_id"]["tokenization"] == "field"
    assert props["uibk_terms"]["dataType"] == ["text[]"] and props["uibk_terms"]["indexFilterable"]
    assert props["uibk_terms"]["tokenization"] == "field"
    assert props["uibk_metadata"]["indexFilterable"] is False
    assert props["uibk_metadata"]["indexSearchable"] is False


def test_collection_request_muvera_and_hnsw_options():
    idx = _request(muvera={"ksim": 4, "dprojections": 8, "repetitions": 10}, ef=300,
                   ef_construction=256, max_connections=48)["vectorConfig"]["uibk"]["vectorIndexConfig"]
    assert idx["multivector"]["muvera"] == {"enabled": True, "ksim": 4, "dprojections": 8, "repetitions": 10}
    assert (idx["ef"], idx["efConstruction"], idx["maxConnections"]) == (300, 256, 48)
    assert _request(muvera=True)["vectorConfig"]["uibk"]["vectorIndexConfig"]["multivector"]["muvera"] == {
        "enabled": True}
    assert "muvera" not in _request(muvera=False)["vectorConfig"]["uibk"]["vectorIndexConfig"]["multivector"]
    named = wc._CollectionConfigCreate(**wa.collection_spec("x", vector_name="colbert"))._to_dict()
    assert list(named["vectorConfig"]) == ["colbert"]


def test_muvera_options_are_checked():
    with pytest.raises(ValueError, match="unknown MUVERA options"):
        wa.vector_config(muvera={"k_sim": 4})
    with pytest.raises(TypeError, match="muvera must be"):
        wa.vector_config(muvera="yes")


# -- ids -----------------------------------------------------------------------------------
def test_object_uuid_deterministic_and_distinct():
    ids = ["a", "A", "doc-1", "ü/é 漢字", 'q"uote', "x" * 512, " a", "a "]
    uuids = [wa.object_uuid(x) for x in ids]
    assert len(set(uuids)) == len(ids)
    assert uuids == [wa.object_uuid(x) for x in ids]
    assert all(uuid.UUID(u).version == 5 for u in uuids)
    # pinned: a changed namespace would orphan every object already stored
    assert wa.object_uuid("doc-1") == str(uuid.uuid5(wa.UUID_NAMESPACE, "doc-1"))
    assert str(wa.UUID_NAMESPACE) == str(uuid.uuid5(uuid.NAMESPACE_URL, "uibk-embedding/weaviate/object-id"))


# -- payload -------------------------------------------------------------------------------
def test_batch_objects_as_the_client_serialises_them():
    fmt, rng = TaggedFormat(), np.random.default_rng(0)
    docs = [make_list(fmt, rng, 5), make_list(fmt, rng, 17)]
    md = [{"lang": "ü\"x'", "n": 3, "ok": True, "nested": {"a": [1, 2]}}, {}]
    objs = wa.data_objects(["a", "b"], docs, md)
    grpc = _BatchGRPC(_ServerVersion(1, 30, 0), None, None)
    for i, (obj, doc) in enumerate(zip(objs, docs, strict=True)):
        pb = grpc.grpc_object(_BatchObject(collection="Docs", vector=obj.vector, uuid=str(obj.uuid),
                                           properties=obj.properties, tenant=None, references=None, index=i))
        assert pb.uuid == wa.object_uuid(["a", "b"][i])
        assert not pb.vector_bytes  # no unnamed single vector
        (vec,) = pb.vectors
        assert vec.name == "uibk" and vec.type == base_pb2.Vectors.VECTOR_TYPE_MULTI_FP32
        np.testing.assert_array_equal(np.asarray(_Unpack.multi(vec.vector_bytes), np.float32), doc)
        fields = pb.properties.non_ref_properties.fields
        assert fields["uibk_id"].string_value == ["a", "b"][i]
        assert json.loads(fields["uibk_metadata"].string_value) == md[i]
    first = grpc.grpc_object(_BatchObject(collection="Docs", vector=objs[0].vector, uuid=str(objs[0].uuid),
                                          properties=objs[0].properties, tenant=None, references=None,
                                          index=0))
    (terms,) = first.properties.text_array_properties
    assert terms.prop_name == "uibk_terms"
    assert set(terms.values) == {'["lang","ü\\"x\'"]', '["n",3]', '["ok",true]'}  # nested: not indexed


def test_query_is_sent_as_one_multi_vector():
    q = make_list(TaggedFormat(), np.random.default_rng(1), 6)
    q[:3] *= 2.5  # a dense weight: DOT keeps it (no normalisation on the client side)
    nv = _BaseGRPC(_ServerVersion(1, 30, 0), None, False)._parse_near_vector(
        q.astype(np.float32).tolist(), None, None, "uibk")
    (vec,) = nv.vectors
    assert vec.type == base_pb2.Vectors.VECTOR_TYPE_MULTI_FP32
    np.testing.assert_array_equal(np.asarray(_Unpack.multi(vec.vector_bytes), np.float32), q)


# -- filters -------------------------------------------------------------------------------
def _sent(flt) -> base_pb2.Filters:
    return _FilterToGRPC.convert(wa.to_weaviate_filter(parse_filter(flt)))


def test_filter_translation_as_sent():
    pb = _sent({"lang": 'it\'s "ü" 漢'})
    assert pb.operator == base_pb2.Filters.OPERATOR_CONTAINS_ANY
    assert pb.target.property == "uibk_terms"
    assert list(pb.value_text_array.values) == [json.dumps(["lang", 'it\'s "ü" 漢'], ensure_ascii=False,
                                                           separators=(",", ":"))]
    pb = _sent({"year": {"$in": [2023, 2024.0, 2023]}, "ok": True})
    assert pb.operator == base_pb2.Filters.OPERATOR_AND
    a, b = pb.filters
    assert list(a.value_text_array.values) == ['["year",2023]', '["year",2024]']
    assert list(b.value_text_array.values) == ['["ok",true]']
    assert wa.to_weaviate_filter(()) is None


def test_an_empty_filter_inside_and_or_not_needs_no_negation_operator():
    """``{}`` inside ``$and``/``$or`` was sent as ContainsNone, which servers before 1.33 lack:
    an ``$and`` leaves it out, an ``$or`` with it passes everything, ``$not`` of it nothing."""
    pb = _sent({"$and": [{}, {"lang": "en"}]})
    assert pb.operator == base_pb2.Filters.OPERATOR_CONTAINS_ANY
    assert list(pb.value_text_array.values) == ['["lang","en"]']
    assert wa.to_weaviate_filter(parse_filter({"$or": [{"lang": "en"}, {}]})) is None
    pb = _sent({"$not": {}})
    assert pb.operator == base_pb2.Filters.OPERATOR_CONTAINS_ANY
    assert list(pb.value_text_array.values) == ["[]"]


def test_negations_are_refused_before_weaviate_1_33():
    """``$ne``/``$nin``/``$not`` become ContainsNone and Not, which Weaviate has from 1.33; the
    store accepts 1.29, so an older server failed the query (or ignored the Not)."""
    assert wa.server_operators("1.29.0") == {"$eq", "$in", "$and", "$or"}
    assert wa.server_operators("1.32.9-rc.1") == {"$eq", "$in", "$and", "$or"}
    assert wa.server_operators("1.33.0") == wa.server_operators("1.34.2") == wa.WEAVIATE_OPERATORS


def test_bool_int_str_float_terms_differ_as_the_reference_does():
    assert wa.filter_term("f", True) != wa.filter_term("f", 1)
    assert wa.filter_term("f", False) != wa.filter_term("f", 0)
    assert wa.filter_term("f", "1") != wa.filter_term("f", 1)
    assert wa.filter_term("f", 1) == wa.filter_term("f", 1.0)
    assert wa.filter_term("f", -0.0) == wa.filter_term("f", 0)
    assert wa.filter_term("f", 0.1) != wa.filter_term("f", 0.10000000000000002)
    assert wa.filter_term("f", 2**60) != wa.filter_term("f", 2**60 + 1)
    assert wa.filter_term("a", "b,c") != wa.filter_term('a","b', "c")  # no delimiter confusion
    long = "é" * 400
    t = wa.filter_term("f", long)
    assert t.startswith("sha256:") and len(t) < wa.MAX_TERM_CHARS and t == wa.filter_term("f", long)
    assert t != wa.filter_term("f", long + "x")


def test_terms_reproduce_reference_filter_semantics():
    """A filter matches a document iff every condition shares a term with the document's terms
    (what ``ContainsAny`` on a field-tokenised text[] does), and that agrees with ``matches``."""
    rng = np.random.default_rng(7)
    pool = ["en", "EN", "en ", "", 'q"', "ü", 0, 1, 2, -1, 1.0, 2.5, True, False, None, [1], {"a": 1}]
    for _ in range(3000):
        md = {f: pool[rng.integers(len(pool))] for f in ("a", "b", "c") if rng.random() < 0.7}
        flt = {}
        for f in ("a", "b", "d"):
            if rng.random() < 0.5:
                vals = [v for v in pool if v is None or isinstance(v, bool | int | float | str)]
                vals = [v for v in vals if v is not None]
                pick = [vals[i] for i in rng.choice(len(vals), size=int(rng.integers(1, 4)), replace=False)]
                flt[f] = {"$in": pick} if len(pick) > 1 else pick[0]
        conds = parse_filter(flt)
        doc_terms = set(wa.metadata_terms(md))
        by_terms = all(doc_terms & {wa.filter_term(c.field, v) for v in c.values} for c in conds)
        assert by_terms == matches(md, conds), (md, flt)


# -- existing collections --------------------------------------------------------------------
def _prop(name, dtype, tok="field", filterable=True):
    return wc._Property(name=name, description=None, data_type=dtype, index_filterable=filterable,
                        index_range_filters=False, index_searchable=False, nested_properties=None,
                        text_analyzer=None, tokenization=tok, vectorizer_config=None, vectorizer=None,
                        vectorizer_configs=None)


def _config(distance=wc.VectorDistances.DOT, aggregation="maxSim", multi=True, vectorizer="none",
            muvera=None, props=None, tenants=False, name="uibk", description=None):
    hnsw = wc._VectorIndexConfigHNSW(
        multi_vector=wc._MultiVectorConfig(encoding=muvera, aggregation=aggregation) if multi else None,
        quantizer=None, cleanup_interval_seconds=300, distance_metric=distance, dynamic_ef_min=100,
        dynamic_ef_max=500, dynamic_ef_factor=8, ef=-1, ef_construction=128,
        filter_strategy=wc.VectorFilterStrategy.SWEEPING, flat_search_cutoff=40000, max_connections=32,
        skip=False, vector_cache_max_objects=10**12)
    named = wc._NamedVectorConfig(
        vectorizer=wc._NamedVectorizerConfig(vectorizer=vectorizer, model={}, source_properties=None),
        vector_index_config=hnsw)
    if props is None:
        props = [_prop("uibk_id", wc.DataType.TEXT), _prop("uibk_metadata", wc.DataType.TEXT, None, False),
                 _prop("uibk_terms", wc.DataType.TEXT_ARRAY)]
    return wc._CollectionConfig(
        name="Docs", description=description, generative_config=None, inverted_index_config=None,
        multi_tenancy_config=wc._MultiTenancyConfig(enabled=tenants, auto_tenant_creation=False,
                                                    auto_tenant_activation=False),
        object_ttl_config=None, properties=props, references=[], replication_config=None,
        reranker_config=None, sharding_config=None, vector_index_config=None, vector_index_type=None,
        vectorizer_config=None, vectorizer=None, vector_config={name: named})


def test_existing_collection_accepted():
    assert wa.collection_problems(_config()) == []
    muv = wc._MuveraConfig(enabled=True, ksim=4, dprojections=16, repetitions=20)
    assert wa.collection_problems(_config(muvera=muv), muvera=True) == []
    assert wa.collection_problems(_config(muvera=muv)) == []  # None: either is fine
    # a dict turns MUVERA on, {} included (it created a MUVERA collection, then refused it)
    cfg = wa.collection_spec("Docs", muvera={})["vector_config"]._to_dict()["vectorIndexConfig"]
    assert cfg["multivector"]["muvera"]["enabled"] is True
    assert wa.collection_problems(_config(muvera=muv), muvera={}) == []
    assert any("on was asked for" in p for p in wa.collection_problems(_config(), muvera={}))


@pytest.mark.parametrize("kw, opts, message", [
    ({"distance": wc.VectorDistances.COSINE}, {}, "uses distance 'cosine'; it must be 'dot'"),
    ({"multi": False}, {}, "is not a multi-vector"),
    ({"vectorizer": "text2colbert-jinaai"}, {}, "uses vectorizer 'text2colbert-jinaai'"),
    ({"name": "colbert"}, {}, "no named vector 'uibk' (named vectors: ['colbert'])"),
    ({"tenants": True}, {}, "multi-tenancy is enabled"),
    ({}, {"muvera": True}, "MUVERA is off in the collection but on was asked for"),
    ({"props": [_prop("uibk_id", wc.DataType.TEXT)]}, {}, "property 'uibk_metadata' (text) is missing"),
    ({"props": [_prop("uibk_id", wc.DataType.TEXT, "word"), _prop("uibk_metadata", wc.DataType.TEXT),
                _prop("uibk_terms", wc.DataType.TEXT)]}, {},
     "property 'uibk_id' has tokenization 'word'; it must be 'field'"),
    ({"props": [_prop("uibk_id", wc.DataType.TEXT), _prop("uibk_metadata", wc.DataType.TEXT),
                _prop("uibk_terms", wc.DataType.TEXT)]}, {},
     "property 'uibk_terms' has data type 'text'; it must be 'text[]'"),
    ({"props": [_prop("uibk_id", wc.DataType.TEXT), _prop("uibk_metadata", wc.DataType.TEXT),
                _prop("uibk_terms", wc.DataType.TEXT_ARRAY, filterable=False)]}, {},
     "property 'uibk_terms' must be filterable"),
])
def test_existing_collection_mismatch_is_named(kw, opts, message):
    problems = wa.collection_problems(_config(**kw), **opts)
    assert any(message in p for p in problems), problems


def test_the_format_record_of_the_description_is_checked():
    """The description ``collection_spec`` writes is the store's record (base.record_problems): a
    different format or an unreadable record is named; a description holding no record (a
    collection made without ``collection_spec``) has no format to conflict with."""
    fmt, other = TaggedFormat(), TaggedFormat(beta=TaggedFormat().beta / 2)
    recorded = _config(description=wa.collection_spec(format=fmt)["description"])
    assert wa.collection_problems(recorded, format=fmt) == []
    assert wa.saved_format(recorded) == fmt
    assert any(f"beta={other.beta}" in p for p in wa.collection_problems(recorded, format=other))
    broken = _config(description=json.dumps({wa.FORMAT_MARKER: {"beta": "x"}}))
    assert any("unreadable format record" in p for p in wa.collection_problems(broken, format=fmt))
    for unrecorded in (None, "my documents", json.dumps({"owner": "me"})):
        assert wa.collection_problems(_config(description=unrecorded), format=other) == []
        assert wa.saved_format(_config(description=unrecorded)) is None


def test_muvera_off_requested_on_muvera_collection():
    muv = wc._MuveraConfig(enabled=True, ksim=4, dprojections=16, repetitions=20)
    assert wa.collection_problems(_config(muvera=muv), muvera=False) == [
        "MUVERA is on in the collection but off was asked for"]


# -- connection arguments, errors, score convention ------------------------------------------
def test_connection_kwargs():
    """Every result is one the client accepts: an https URL without a port gave gRPC the HTTP
    host and port 443, which weaviate-client refuses (a pydantic ValidationError, no connection)."""
    from weaviate.connect.base import ConnectionParams

    assert wa.connection_kwargs("https://wv.example.org") == {
        "http_host": "wv.example.org", "http_port": 443, "http_secure": True,
        "grpc_host": "wv.example.org", "grpc_port": 50051, "grpc_secure": True}
    cloud_like = wa.connection_kwargs("https://wv.example.org", grpc_host="grpc-wv.example.org")
    assert (cloud_like["grpc_host"], cloud_like["grpc_port"]) == ("grpc-wv.example.org", 443)
    for url in ["https://wv.example.org", "http://localhost:8080", "https://a:8443"]:
        ConnectionParams.from_params(**wa.connection_kwargs(url))
    ConnectionParams.from_params(**cloud_like)
    with pytest.raises(ValueError, match=r"HTTP and gRPC cannot share wv\.example\.org:443"):
        wa.connection_kwargs("https://wv.example.org", grpc_port=443)
    kw = wa.connection_kwargs("http://localhost:8080/", grpc_port=50052, grpc_host="grpc.local")
    assert (kw["http_port"], kw["grpc_port"], kw["grpc_host"], kw["http_secure"]) == (
        8080, 50052, "grpc.local", False)
    for bad in ["localhost:8080", "ftp://x", "http://x:8080/v1", "http://x?y=1", "http://"]:
        with pytest.raises(ValueError):
            wa.connection_kwargs(bad)


def test_store_refuses_unusable_arguments_before_connecting():
    with pytest.raises(ValueError, match="needs client=, url= or host="):
        wa.WeaviateStore("Docs")
    with pytest.raises(ValueError, match="cloud=True needs url="):
        wa.WeaviateStore("Docs", url="https://x.weaviate.cloud", cloud=True)
    with pytest.raises(ValueError, match="not both"):
        wa.WeaviateStore("Docs", url="http://a:8080", host="a")
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        wa.WeaviateStore("Docs", url="http://a:8080", batch_size=0)
    with pytest.raises(ValueError, match="max_rows_per_request must be a positive int, got -1"):
        wa.WeaviateStore("Docs", url="http://a:8080", max_rows_per_request=-1)
    for bad in (0, "10", True):  # the one rerank-option check every backend uses
        with pytest.raises(ValueError, match=f"candidates must be a positive int, got {bad!r}"):
            wa.WeaviateStore("Docs", url="http://a:8080", candidates=bad)


def test_batch_error_names_every_outcome():
    e = wa.WeaviateBatchError({"a": "vector lengths don't match", "b": "boom"}, ["c"], ["d", "e"])
    text = str(e)
    assert "rejected 2 of 5 objects" in text and "'a': vector lengths don't match" in text
    assert "1 were written" in text and "2 not attempted" in text
    assert e.failed["b"] == "boom" and e.written == ["c"] and e.not_attempted == ["d", "e"]


def test_version_and_score_helpers():
    assert wa.parse_version("1.28.9") < wa.MIN_VERSION <= wa.parse_version("1.29.0-rc.1")
    assert wa.distance_to_score(-3.25) == 3.25
    with pytest.raises(RuntimeError, match="NaN"):
        wa.distance_to_score(float("nan"))


# -- live only ------------------------------------------------------------------------------
@pytest.fixture
def live_store():
    store = wa.WeaviateStore(f"UibkLive_{uuid.uuid4().hex[:10]}", url=URL,
                             api_key=os.environ.get("WEAVIATE_API_KEY"),
                             grpc_port=int(os.environ.get("WEAVIATE_GRPC_PORT", "50051")))
    yield store
    store.drop()
    store.close()


@live
def test_live_distance_is_negated_maxsim(live_store):
    """The sign convention of :func:`distance_to_score`, checked against the server."""
    fmt, rng = TaggedFormat(), np.random.default_rng(3)
    docs = [make_list(fmt, rng, int(n)) for n in rng.integers(4, 30, size=20)]
    live_store.upsert([f"d{i}" for i in range(20)], docs)
    q = make_list(fmt, rng, 9)
    q[:3] *= 3.0  # a dense weight must survive (DOT, no renormalisation)
    hits = live_store.search(q, k=5)
    assert hits
    for h in hits:
        assert h.score == pytest.approx(maxsim(q, docs[int(h.id[1:])]), rel=1e-5)


@live
@pytest.mark.parametrize("rerank", [False, True])
def test_live_explain_reads_the_vectors_once(live_store, rerank):
    """explain=True: each hit decomposed from the vectors the search returned (no ``get``
    afterwards), equal to ``explain`` of that hit; with and without the exact rerank."""
    fmt, rng = TaggedFormat(), np.random.default_rng(4)
    docs = [make_list(fmt, rng, int(n)) for n in rng.integers(4, 30, size=20)]
    live_store.upsert([f"d{i}" for i in range(20)], docs)
    q = make_list(fmt, rng, 9)
    plain = live_store.search(q, k=5, rerank=rerank)
    reads: list[list[str]] = []
    get = live_store._get
    live_store._get = lambda xs: reads.append(xs) or get(xs)  # counts reads; the store is real
    hits = live_store.search(q, k=5, rerank=rerank, explain=True)
    live_store._get = get
    assert reads == []
    assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in plain]
    for h in hits:
        assert h.decomposition == live_store.explain(q, h.id)


@live
def test_live_existing_collection_never_changed():
    import weaviate
    from weaviate.classes.config import Configure, VectorDistances

    name = f"UibkCosine_{uuid.uuid4().hex[:10]}"
    client = weaviate.connect_to_custom(**wa.connection_kwargs(URL))
    try:
        cosine = Configure.VectorIndex.hnsw(distance_metric=VectorDistances.COSINE)
        client.collections.create(name, vector_config=Configure.MultiVectors.self_provided(
            name="uibk", vector_index_config=cosine))
        before = client.collections.get(name).config.get().to_dict()
        with pytest.raises(ValueError, match="it must be 'dot'"):
            wa.WeaviateStore(name, client=client)
        assert client.collections.get(name).config.get().to_dict() == before
    finally:
        client.collections.delete(name)
        client.close()
