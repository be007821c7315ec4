"""Issue #42: ``index`` / ``eval`` print periodic progress lines when stderr is not a terminal,
and say the truncation once, with the count, at the end (not one warning per batch)."""

from __future__ import annotations

import json

from uibk_embedding.apps.cli import main

LONG = "wing lift " * 400  # 800 tokens: past the embedded model's document length


def _corpus(folder):
    folder.mkdir(parents=True, exist_ok=True)
    docs = [{"_id": f"d{i}", "text": LONG if i % 2 else f"short document number {i} about a wing"}
            for i in range(8)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder


def test_index_prints_progress_lines_and_one_truncation_line(tmp_path, capsys):
    data = _corpus(tmp_path / "beir") / "corpus.jsonl"
    assert main(["index", str(data), "--path", str(tmp_path / "store"), "--batch-size", "2"]) == 0
    err = capsys.readouterr().err  # captured: not a terminal
    progress = [ln for ln in err.splitlines() if ln.startswith("uibk-embed: indexing into exact:")]
    assert progress and progress[-1].startswith("uibk-embed: indexing into exact: 8 of 8 (100%)"), err
    cut = [ln for ln in err.splitlines() if "were truncated" in ln]
    assert cut == ["uibk-embed: 4 of 8 documents were longer than 512 tokens and were truncated to them"], err
    assert "warnings.warn" not in err and "UserWarning" not in err


def test_quiet_index_prints_no_progress(tmp_path, capsys):
    data = _corpus(tmp_path / "beir") / "corpus.jsonl"
    assert main(["index", str(data), "--path", str(tmp_path / "store"), "--quiet"]) == 0
    assert "indexing into exact:" not in capsys.readouterr().err


def test_eval_prints_progress_lines(tmp_path, capsys):
    beir = _corpus(tmp_path / "beir")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "wing lift"}) + "\n")
    (beir / "qrels").mkdir()
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert main(["eval", str(beir), "--no-cache", "--json"]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert any(ln.startswith("uibk-embed: encoding ") and "8 of 8 (100%)" in ln for ln in lines), err
    assert [ln for ln in err.splitlines() if "were truncated" in ln] == [
        "uibk-embed: 4 of 8 documents were longer than 512 tokens and were truncated to them"], err


def test_other_warnings_pass_through_once_and_end():
    # showing another warning while recording appended it to the list being read: the loop
    # never ended and filled the memory (an `index` into LanceDB died at 20 GB). A child process
    # with bounded memory and time, so the old code could not take the test run down with it.
    import subprocess
    import sys

    child = ("import io, resource, warnings\n"
             "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
             "from uibk_embedding.apps.cli import truncation_said_once\n"
             "out = io.StringIO()\n"
             "with truncation_said_once(out, encoded={'documents': 6}):\n"
             "    for _ in range(3):\n"
             "        warnings.warn('an engine deprecation', DeprecationWarning)\n"
             "        warnings.warn('1 of 2 documents were longer than 512 tokens and were truncated')\n"
             "print(out.getvalue().strip())\n")
    done = subprocess.run([sys.executable, "-W", "default", "-c", child], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    said = "uibk-embed: 3 of 6 documents were longer than 512 tokens and were truncated to them"
    assert done.stdout.strip() == said
    assert done.stderr.count("an engine deprecation") == 1


def test_the_truncation_count_is_out_of_every_document_encoded(tmp_path, capsys):
    # the total added up only the batches that cut something: one long text among 6 documents in
    # batches of 2 said "1 of 2 documents"
    docs = [{"_id": f"d{i}", "text": LONG if i == 3 else f"short document number {i}"} for i in range(6)]
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    assert main(["index", str(data), "--path", str(tmp_path / "store"), "--batch-size", "2", "--quiet"]) == 0
    cut = [ln for ln in capsys.readouterr().err.splitlines() if "were truncated" in ln]
    assert cut == ["uibk-embed: 1 of 6 documents were longer than 512 tokens and were truncated to them"]


def test_eval_counts_the_truncation_out_of_the_whole_corpus(tmp_path, capsys, monkeypatch):
    import functools

    from uibk_embedding.apps import cli

    # eval encodes in batches of 1024: batches of 2 here, so 6 documents make 3 batches
    monkeypatch.setattr(cli, "encode_collection", functools.partial(cli.encode_collection, batch_size=2))
    beir = tmp_path / "beir"
    beir.mkdir()
    docs = [{"_id": f"d{i}", "text": LONG if i == 0 else f"short document number {i}"} for i in range(6)]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "wing lift"}) + "\n")
    (beir / "qrels").mkdir()
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\n")
    assert main(["eval", str(beir), "--no-cache", "--json"]) == 0
    cut = [ln for ln in capsys.readouterr().err.splitlines() if "were truncated" in ln]
    assert cut == ["uibk-embed: 1 of 6 documents were longer than 512 tokens and were truncated to them"]
