"""Milvus' own row types behind ``profile=`` (issue 59): ``float16`` keeps the ``token_rows``
layout's rows (the candidate search) as FLOAT16_VECTOR, on Milvus Lite 2.5 and servers >= 2.4;
the real 2.3.5 standalone server lacks the type and is refused, naming its version."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.errors import CollectionMismatch, ServerTooOld

pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from uibk_embedding.adapters.milvus import MilvusStore, open_milvus_lite
from uibk_embedding.maxsim import maxsim
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list
from uibk_embedding.testing.milvus_server import user_namespaces_available

FMT = TaggedFormat()


def test_lite_float16_rows_recorded_and_checked(tmp_path):
    """The rows field is FLOAT16_VECTOR; scores are the float32 lists' MaxSim (rescored); the
    profile is recorded and reopening with another one is refused naming both."""
    rng = np.random.default_rng(0)
    docs = [make_list(FMT, rng, int(rng.integers(3, 20))) for _ in range(30)]
    ids = [f"d{i}" for i in range(30)]
    path = tmp_path / "m.db"
    with open_milvus_lite(path=path, profile="float16", rows_per_vector=64) as s:
        s.upsert(ids, docs)
        fields = {f["name"]: f for f in s.client.describe_collection(s.rows_name)["fields"]}
        assert fields["vec"]["type"].name == "FLOAT16_VECTOR"
        q = make_list(FMT, rng, 5)
        hits = s.search(q, k=5)
        for h in hits:
            assert h.score == pytest.approx(maxsim(q, docs[ids.index(h.id)]), rel=1e-5)
        assert s.stats()["profile"] == "float16" and not s.exact
    with open_milvus_lite(path=path) as s:
        assert s.profile == "float16" and s.count() == 30
    with pytest.raises(CollectionMismatch, match="has profile='float16', not 'exact'"):
        open_milvus_lite(path=path, profile="exact")
    with open_milvus_lite(path=path, profile="float16") as s:  # nothing was changed
        assert s.count() == 30


def test_refused_profiles(tmp_path):
    with pytest.raises(ValueError, match=r"profile='int8' has no meaning on milvus layout 'token_rows'; "
                                         r"it takes 'exact' \(FLOAT_VECTOR rows\), 'float16'"):
        open_milvus_lite(path=tmp_path / "a.db", profile="int8")
    with pytest.raises(ValueError, match="exact=True proves the top k from the rows' float32 scores"):
        open_milvus_lite(path=tmp_path / "b.db", profile="float16", exact=True)
    with pytest.raises(ValueError, match="has no meaning on milvus layout 'embedding_list'"):
        MilvusStore(uri="http://127.0.0.1:9", layout="embedding_list", profile="float16")  # before connecting


def test_float16_refused_on_standalone_2_3():
    """The real Milvus 2.3.5 server has no FLOAT16_VECTOR: refused naming its version, before
    any collection is made."""
    pytest.importorskip("milvus")
    if not user_namespaces_available():
        pytest.skip("cannot confine the Milvus standalone server to 127.0.0.1 (no user namespaces)")
    from uibk_embedding.testing.milvus_server import LocalMilvusServer

    server = LocalMilvusServer.shared()
    with pytest.raises(ServerTooOld, match=r"profile='float16' keeps FLOAT16_VECTOR rows, which Milvus "
                                           r"'v2\.3\.5[^']*' lacks \(they need Milvus >= 2\.4\.0\)"):
        MilvusStore(uri=server.uri, collection="f16_refused", profile="float16")
    with MilvusStore(uri=server.uri, collection="probe_f16") as s:
        assert not s.client.has_collection("f16_refused_rows")
        s.drop()
