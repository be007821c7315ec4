"""Issue #61: one backend detector for the CLI and Python. ``ue.open_store(path=FOLDER)`` and
``UIBKVectorStore.from_existing_collection(path=FOLDER)`` (LangChain; LlamaIndex takes the store)
open a folder that ``uibk-embed index --backend lancedb | qdrant-edge | qdrant`` wrote, as
``uibk-embed search`` does; when the files do not say, the error names the backend to pass."""

from __future__ import annotations

import json

import pytest

import uibk_embedding as ue
from uibk_embedding.adapters.registry import find_backend
from uibk_embedding.apps.cli import main
from uibk_embedding.errors import CollectionMismatch, StoreNotFound, UnknownBackend

TEXTS = ["the lift of a wing in a slipstream", "a sourdough bread recipe", "laminar boundary layers"]
BACKENDS = {"lancedb": "lancedb", "qdrant-edge": "qdrant_edge", "qdrant": "qdrant_client"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("written")
    corpus = tmp / "three.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    out = {}
    for backend, module in BACKENDS.items():
        try:
            __import__(module)
        except ImportError:
            continue
        out[backend] = tmp / backend
        assert main(["index", str(corpus), "--backend", backend, "--path", str(out[backend]), "--quiet"]) == 0
    return out


def _folder(folders, backend):
    if backend not in folders:
        pytest.skip(f"{BACKENDS[backend]} is not installed")
    return folders[backend]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_open_store_reads_the_backend_of_the_folder(folders, backend):
    folder = _folder(folders, backend)
    assert find_backend({"path": folder}) == backend
    for create in (False, True):  # create=True opens the store that is there, too
        with ue.open_store(path=folder, create=create) as store:
            assert (store.backend, store.count()) == (backend, 3)
            enc = ue.load_encoder()
            assert store.search(enc.encode_queries(["wing lift"])[0], k=1)[0].id == "d0"


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_langchain_from_existing_collection_reads_the_folder(folders, backend):
    pytest.importorskip("langchain_core")
    from uibk_embedding.integrations.langchain import UIBKVectorStore

    vs = UIBKVectorStore.from_existing_collection(path=_folder(folders, backend))
    try:
        assert vs.store.backend == backend
        assert vs.similarity_search("bread", k=1)[0].id == "d1"
    finally:
        vs.store.close()


def test_llama_index_takes_the_store_open_store_finds(folders):
    pytest.importorskip("llama_index.core")
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from uibk_embedding.integrations.llama_index import UIBKVectorStore

    vs = UIBKVectorStore(store=ue.open_store(path=_folder(folders, "lancedb"), create=False))
    try:
        got = vs.query(VectorStoreQuery(query_str="boundary layers", similarity_top_k=1))
        assert got.ids == ["d2"]
    finally:
        vs.client.close()


def test_a_wrong_backend_is_told_the_one_to_pass(folders):
    folder = _folder(folders, "lancedb")
    with pytest.raises(StoreNotFound) as e:
        ue.open_store("exact", path=folder, create=False)
    assert str(e.value).endswith("the folder holds a lancedb store: pass backend='lancedb'")
    with pytest.raises(StoreNotFound) as e:
        ue.open_store("lancedb", path=_folder(folders, "qdrant"), create=False)
    assert "the folder holds a qdrant store" in str(e.value)


@pytest.mark.parametrize(("asked", "there"), [("qdrant", "lancedb"), ("exact", "qdrant"),
                                              ("lancedb", "qdrant-edge"), ("qdrant-edge", "exact")])
def test_a_wrong_backend_with_create_names_the_one_to_pass(folders, tmp_path, asked, there):
    """``create=True`` (what users type) said "not a Qdrant local-mode folder and is not empty"
    without the backend to pass; the store that is there is left as it was."""
    if there == "exact":
        folder = tmp_path / "exact"
        with ue.open_store("exact", path=folder) as s:
            s.upsert(["x"], ue.load_encoder().encode_documents(["a wing"]))
    else:
        folder = _folder(folders, there)
    before = sorted((p.relative_to(folder), p.stat().st_size) for p in folder.rglob("*") if p.is_file())
    with pytest.raises(CollectionMismatch) as e:
        ue.open_store(asked, path=folder)
    article = "an" if there == "exact" else "a"
    assert f"holds {article} {there} store, not " in str(e.value)
    assert f"pass backend={there!r}" in str(e.value)
    after = sorted((p.relative_to(folder), p.stat().st_size) for p in folder.rglob("*") if p.is_file())
    assert after == before


def test_a_missing_collection_is_said_by_the_backend_the_files_are_of(folders):
    folder = _folder(folders, "qdrant")
    with pytest.raises(StoreNotFound) as e:
        ue.open_store(path=folder, collection="papers", create=False)
    assert "no qdrant store: it has no collection 'papers' (it has ['uibk'])" in str(e.value)


def test_files_of_two_backends_and_no_store_name_both(tmp_path):
    (tmp_path / "meta.json").write_text('{"collections": {"other": {}}}')
    (tmp_path / "notes.lance").mkdir()
    with pytest.raises(UnknownBackend) as e:
        ue.open_store(path=tmp_path, create=False)
    assert "holds files of qdrant and lancedb" in str(e.value)
    assert "pass the backend (one of 'qdrant', 'lancedb')" in str(e.value)


def test_a_new_or_empty_path_is_still_a_new_exact_store(tmp_path):
    assert find_backend({"path": tmp_path / "new"}) == "exact"
    with ue.open_store(path=tmp_path / "new") as store:
        assert store.backend == "exact"
    with pytest.raises(StoreNotFound, match="no exact store: the path does not exist"):
        ue.open_store(path=tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


def test_the_cli_reads_a_folder_with_the_same_detector(folders, capsys):
    folder = _folder(folders, "qdrant-edge")
    assert main(["search", "bread", "--path", str(folder), "-k", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["backend"] == "qdrant-edge"
    assert f"{folder} holds a qdrant-edge store; reading it with --backend qdrant-edge" in err
