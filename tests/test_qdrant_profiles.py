"""Qdrant's own compression behind ``profile=`` (issue 59): Qdrant Edge (the Rust engine, which
applies it) and qdrant-client's local mode (pure Python: keeps and checks the settings a server
applies, searches exactly). What each profile sets: adapters/qdrant_profiles.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from uibk_embedding.adapters.qdrant_profiles import SETTINGS, search_params
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.maxsim import maxsim
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

pytest.importorskip("qdrant_edge")
pytest.importorskip("qdrant_client")

from uibk_embedding.adapters.qdrant import QdrantStore
from uibk_embedding.adapters.qdrant_edge import QdrantEdgeStore

FMT = TaggedFormat()


def corpus(n: int = 120, seed: int = 0) -> tuple[list[str], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [f"d{i}" for i in range(n)], [make_list(FMT, rng, int(rng.integers(4, 16))) for _ in range(n)]


@pytest.mark.parametrize("profile", list(SETTINGS))
def test_edge_profile_sets_the_engine_and_is_recorded(tmp_path, profile):
    """The shard's own config holds the profile's datatype and quantization, our record its name;
    reopening without a profile reports it, with another one is refused naming both."""
    ids, docs = corpus(20)
    with QdrantEdgeStore(tmp_path / "s", profile=profile) as s:
        s.upsert(ids, docs)
    mv = json.loads((tmp_path / "s" / "edge_config.json").read_text())["vectors"]["tagged"]
    want = SETTINGS[profile]
    assert mv.get("datatype", "float32") == want.datatype
    assert ("quantization_config" in mv) == (want.quantization is not None)
    assert mv.get("on_disk", False) == bool(want.on_disk)
    assert json.loads((tmp_path / "s" / "uibk_embedding.json").read_text())["profile"] == profile
    with QdrantEdgeStore(tmp_path / "s") as s:
        assert s.profile == profile and s.stats()["profile"] == profile and s.count() == 20
        assert s.exact == (profile == "exact")
    other = "exact" if profile != "exact" else "int8"
    with pytest.raises(CollectionMismatch, match=f"has profile='{profile}', not '{other}'"):
        QdrantEdgeStore(tmp_path / "s", profile=other)
    with QdrantEdgeStore(tmp_path / "s", profile=profile) as s:  # nothing was changed
        assert s.count() == 20


def test_edge_codes_are_scanned_and_rescored(tmp_path):
    """int8 scores the scan by the int8 codes (its scores are not the originals' MaxSim);
    int8-rerank and exact-rerank give the originals' MaxSim (float16 rows, as get returns them) of
    their hits, best first: the exact top k of the pool they rescore."""
    ids, docs = corpus()
    q = make_list(FMT, np.random.default_rng(9), 6)
    errors = {}
    for profile in ("int8", "int8-rerank", "exact-rerank"):
        with QdrantEdgeStore(tmp_path / profile, profile=profile) as s:
            s.upsert(ids, docs)
            s.optimize()
            hits = s.search(q, k=10)
            rows = {r.id: r.vectors for r in s.get([h.id for h in hits])}
            errors[profile] = max(abs(h.score - maxsim(q, rows[h.id])) for h in hits)
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            assert s.stats()["resident_bytes"] > 0  # the codes were built
    assert errors["int8"] > 0.01
    assert errors["int8-rerank"] < 1e-3 and errors["exact-rerank"] < 1e-3


def test_edge_coded_profile_keeps_less_in_ram(tmp_path):
    """A coded profile's resident part (its codes) is smaller than exact's float32 vectors:
    int8 about a quarter, exact-rerank's 2-bit codes well under int8's (at this size the codes'
    files' 4 KiB blocks weigh on both)."""
    ids, docs = corpus(200)
    resident = {}
    for profile in ("exact", "int8", "exact-rerank"):
        with QdrantEdgeStore(tmp_path / profile, profile=profile) as s:
            s.upsert(ids, docs)
            resident[profile] = s.stats()["resident_bytes"]
    assert 0 < resident["int8"] < 0.3 * resident["exact"]
    assert 0 < resident["exact-rerank"] < 0.5 * resident["int8"]


def test_refused_names_and_settings(tmp_path):
    with pytest.raises(ValueError, match="profile must be one of 'exact'"):
        QdrantEdgeStore(tmp_path / "a", profile="int4")
    with pytest.raises(ValueError, match=r"profile='int8' scans .* pass multivector_hnsw=False"):
        QdrantEdgeStore(tmp_path / "b", profile="int8", multivector_hnsw=True)
    with pytest.raises(ValueError, match="profile must be one of"):
        QdrantStore("c", location=":memory:", profile="fast")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_local_mode_records_and_checks_what_a_server_applies(tmp_path):
    """Local mode keeps the settings a server applies (checked on open), searches exactly."""
    ids, docs = corpus(10)
    s = QdrantStore("c", path=tmp_path, profile="exact-rerank")
    s.upsert(ids, docs)
    mv = s.client.get_collection("c").config.params.vectors["tagged"]
    assert mv.datatype.value == "float16" and mv.on_disk
    assert mv.quantization_config.binary.encoding.value == "two_bits"
    q = docs[3]
    assert s.search(q, k=1)[0].id == "d3" and s.exact  # local mode: exact
    s.close()
    s = QdrantStore("c", path=tmp_path)
    assert s.profile == "exact-rerank" and s.stats()["profile"] == "exact-rerank"
    s.close()
    with pytest.raises(CollectionMismatch, match="has profile='exact-rerank', not 'float16'"):
        QdrantStore("c", path=tmp_path, profile="float16")


def test_collection_without_profile_record(tmp_path):
    """A collection from before profiles (record without one) opens as exact; one made by hand
    with float16 vectors and no record is refused as before, saying what it stores."""
    from qdrant_client import models as m

    s = QdrantStore("old", path=tmp_path)
    meta = s.client.get_collection("old").config.metadata
    s.client.update_collection("old", metadata={"uibk_embedding": {k: v for k, v in
                                                                     meta["uibk_embedding"].items()
                                                                     if k != "profile"}})
    s.close()
    s = QdrantStore("old", path=tmp_path)
    assert s.profile == "exact"
    s.client.create_collection("hand", vectors_config={"tagged": m.VectorParams(
        size=128, distance=m.Distance.DOT, datatype=m.Datatype.FLOAT16,
        multivector_config=m.MultiVectorConfig(comparator=m.MultiVectorComparator.MAX_SIM))})
    client = s.client
    with pytest.raises(CollectionMismatch, match="datatype float16, needs float32 for profile 'exact'"):
        QdrantStore("hand", client=client, dense_name=None)
    assert QdrantStore("hand", client=client, dense_name=None, profile="float16").profile == "float16"
    s.close()


def test_server_search_params():
    """What a server is sent: a coded profile's scan with exact=False (an exact search ignores the
    codes), rescored from max(100, 4 k) of them where the profile rescores."""
    from qdrant_client import models as m

    p = search_params("int8-rerank", 10, m.SearchParams, m.QuantizationSearchParams)
    assert not p.exact and p.quantization.rescore and p.quantization.oversampling == 10.0
    p = search_params("int8", 50, m.SearchParams, m.QuantizationSearchParams)
    assert not p.exact and p.quantization.rescore is False
    assert search_params("float16", 10, m.SearchParams, m.QuantizationSearchParams) is None


def test_cli_index_qdrant_edge_profile(tmp_path, capsys):
    from uibk_embedding.apps.cli import main

    corpus_file = tmp_path / "c.jsonl"
    lines = [json.dumps({"id": f"t{i}", "text": f"wing lift in a slipstream, part {i}"}) for i in range(12)]
    corpus_file.write_text("\n".join(lines) + "\n")
    where = tmp_path / "edge"
    assert main(["index", str(corpus_file), "--path", str(where), "--backend", "qdrant-edge",
                 "--profile", "int8-rerank", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["stats", "--path", str(where), "--backend", "qdrant-edge", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["profile"] == "int8-rerank" and st["documents"] == 12 and st["resident_bytes"] > 0
    with QdrantEdgeStore(where) as s:
        assert s.profile == "int8-rerank"
    with pytest.raises(SystemExit, match="has profile='int8-rerank', not 'float16'") as e:  # exit 2
        main(["index", str(corpus_file), "--path", str(where), "--backend", "qdrant-edge",
              "--profile", "float16", "--quiet"])
    assert e.value.code == 2
