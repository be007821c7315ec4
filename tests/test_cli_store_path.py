"""Issue #61: ``index --path FILE`` is one clear line (it was ``[Errno 17] File exists``); a failed
``index`` leaves no new, empty store folder behind (a key the server refuses, a text it cannot
take); ``search`` takes ``--encoder-url``; ``quickstart`` says its folder is temporary."""

from __future__ import annotations

import json
import re

import pytest

from uibk_embedding.apps.cli import main

pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")

from uibk_embedding.encoder.server import serve_subprocess
from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer

TEXTS = ["the lift of a wing in a slipstream", "a sourdough bread recipe", "laminar boundary layers"]
KEY = "k3y-for-tests-0123456789"


def _corpus(path, texts=TEXTS):
    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = UIBKConfig.tiny()
    enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, TEXTS), seed=2)
    return enc.save_pretrained(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def small_server(checkpoint):
    """A server whose request bodies may hold 104 bytes: the short texts pass, a text whose
    leading whitespace alone is longer cannot be sent."""
    with serve_subprocess("--encoder", str(checkpoint), "--device", "cpu", "--max-body-mb", "0.0001") as url:
        yield url


@pytest.fixture(scope="module")
def guarded(checkpoint, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY + "\n")
    with serve_subprocess("--encoder", str(checkpoint), "--device", "cpu",
                          "--api-key-file", str(key_file)) as url:
        yield url


def test_a_file_given_as_the_store_path_is_one_line(tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus.jsonl")
    before = corpus.read_bytes()
    with pytest.raises(SystemExit) as e:
        main(["index", str(corpus), "--path", str(corpus), "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == (f"uibk-embed index: --path {corpus} is a file, not a store folder: --path names the "
                   "folder the store is written to, the data to index is the first argument "
                   f"(`uibk-embed index {corpus} --path ./my-index`)\n")
    assert corpus.read_bytes() == before


def test_search_takes_an_encoder_url(small_server, tmp_path, capsys):
    idx = tmp_path / "idx"
    assert main(["index", str(_corpus(tmp_path / "c.jsonl")), "--path", str(idx), "--encoder-url",
                 small_server, "--quiet"]) == 0
    assert main(["search", "sourdough bread", "--path", str(idx), "--encoder-url", small_server,
                 "-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["hits"][0]["id"] == "d1"
    with pytest.raises(SystemExit):  # the server's model encodes: no local encoder option applies
        main(["search", "bread", "--path", str(idx), "--encoder-url", small_server, "--projection", "pca"])
    assert "--projection does not apply" in capsys.readouterr().err


def test_a_failed_index_leaves_no_new_empty_store(small_server, tmp_path, capsys):
    idx = tmp_path / "idx"
    corpus = _corpus(tmp_path / "c.jsonl", [" " * 300 + "wing"])  # the store is made, then encoding fails
    with pytest.raises(SystemExit):
        main(["index", str(corpus), "--path", str(idx), "--encoder-url", small_server, "--quiet"])
    assert "cannot be sent" in capsys.readouterr().err
    assert not idx.exists()


def test_a_failed_index_keeps_a_store_that_was_there(small_server, tmp_path, capsys):
    idx = tmp_path / "idx"
    assert main(["index", str(_corpus(tmp_path / "c.jsonl")), "--path", str(idx), "--encoder-url",
                 small_server, "--quiet"]) == 0
    with pytest.raises(SystemExit):
        main(["index", str(_corpus(tmp_path / "bad.jsonl", [" " * 300 + "wing"])), "--path", str(idx),
              "--encoder-url", small_server, "--quiet"])
    assert main(["search", "bread", "--path", str(idx), "--encoder-url", small_server, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out.splitlines()[-1])["hits"]) == 3


def test_a_refused_key_is_said_so_and_leaves_no_store(guarded, tmp_path, capsys, monkeypatch):
    idx = tmp_path / "idx"
    monkeypatch.setenv("UIBK_API_KEY", "wrong-key-0123456789")
    with pytest.raises(SystemExit):
        main(["index", str(_corpus(tmp_path / "c.jsonl")), "--path", str(idx), "--encoder-url", guarded,
              "--quiet"])
    err = capsys.readouterr().err
    assert (f"the uibk-embed server at {guarded} refused the API key (HTTP 401; the key of "
            "$UIBK_API_KEY)") in err
    assert "needs an API key" not in err
    assert not idx.exists()
    monkeypatch.setenv("UIBK_API_KEY", KEY)
    assert main(["index", str(_corpus(tmp_path / "c.jsonl")), "--path", str(idx), "--encoder-url", guarded,
                 "--quiet"]) == 0


def test_quickstart_says_its_folder_is_temporary(capsys):
    assert main(["quickstart", "-k", "1"]) == 0
    out = capsys.readouterr().out
    wrote = re.search(r"wrote 12 documents to (\S+) \(a temporary folder, removed when quickstart ends\)",
                      out)
    assert wrote, out
    removed = re.search(r"removed the temporary folder (\S+);", out)
    assert removed and wrote.group(1).startswith(removed.group(1))
