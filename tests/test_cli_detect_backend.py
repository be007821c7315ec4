"""Issue #42: ``uibk-embed search`` / ``eval`` on a folder another backend wrote detect that
backend from its own record (``adapters.registry.detect_backend``), instead of "not an exact
store ... give an empty or new folder"."""

from __future__ import annotations

import json

import pytest

from uibk_embedding.adapters.registry import detect_backend
from uibk_embedding.apps.cli import main

pytest.importorskip("qdrant_client", reason="the qdrant extra is not installed")

TEXTS = ["the lift of a wing in a slipstream", "a sourdough bread recipe", "laminar boundary layers"]


@pytest.fixture(scope="module")
def qdrant_folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("detect")
    corpus = tmp / "three.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    assert main(["index", str(corpus), "--backend", "qdrant", "--path", str(tmp / "q"), "--quiet"]) == 0
    return tmp / "q"


def test_detect_backend_reads_each_folder_backend_record(qdrant_folder, tmp_path):
    assert detect_backend(qdrant_folder) == "qdrant"
    assert detect_backend(tmp_path) is None
    assert detect_backend(tmp_path / "missing") is None


def test_search_without_backend_reads_the_store_that_is_there(qdrant_folder, capsys):
    assert main(["search", "wing lift", "--path", str(qdrant_folder), "-k", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["backend"] == "qdrant" and got["hits"][0]["id"] == "d0"
    assert f"{qdrant_folder} holds a qdrant store; reading it with --backend qdrant" in err


def test_search_with_another_backend_names_the_one_to_give(qdrant_folder, capsys):
    with pytest.raises(SystemExit) as e:
        main(["search", "wing", "--path", str(qdrant_folder), "--backend", "exact"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "holds a qdrant store: give --backend qdrant" in err and "empty or new folder" not in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_eval_reads_the_store_that_is_there(qdrant_folder, tmp_path, capsys):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(TEXTS)))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "wing lift"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\n")
    assert main(["eval", str(beir), "--path", str(qdrant_folder), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.strip().splitlines()[-1])["backend"] == "qdrant"
    assert "reading it with --backend qdrant" in err


def test_a_record_that_is_no_object_is_no_store(tmp_path):
    # valid JSON but a list: AttributeError ('list' object has no attribute 'get') before
    (tmp_path / "store.json").write_text('[{"id": 1}]')
    assert detect_backend(tmp_path) is None
    edge = tmp_path / "edge"
    edge.mkdir()
    (edge / "edge_config.json").write_text("{}")
    (edge / "uibk_embedding.json").write_text("[1]")
    assert detect_backend(edge) == "qdrant-edge"


def test_the_backend_of_a_store_whose_writer_was_killed_is_read_from_its_wal(tmp_path):
    # the configuration of a new store lies in the SQLite WAL until a checkpoint; the immutable
    # read ignored it, so every folder backend matched and the first, "exact", was picked
    import subprocess
    import sys

    pytest.importorskip("xtr_warp")
    child = ("import os, sys, numpy as np\n"
             "from uibk_embedding.adapters.warp import WarpStore\n"
             "from uibk_embedding.testing import make_list\n"
             "s = WarpStore(sys.argv[1])\n"
             "s.upsert(['a'], [make_list(s.format, np.random.default_rng(0), 5)])\n"
             "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", child, str(tmp_path / "w")], check=True, timeout=300)
    assert (tmp_path / "w" / "store.sqlite-wal").is_file()
    assert detect_backend(tmp_path / "w") == "warp"
