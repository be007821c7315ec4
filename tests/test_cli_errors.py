"""Every user error of ``uibk-embed``, in every subcommand, is one line on stderr and exit status 2
(issue #42): no traceback for a bad filter, an empty query, a missing file."""

from __future__ import annotations

import json

import pytest

from uibk_embedding.apps.cli import build_parser, main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli-errors")
    corpus = tmp / "three.jsonl"
    texts = ["the lift of a wing", "a sourdough bread", "boundary layers"]
    corpus.write_text("\n".join(json.dumps({"_id": f"d{i}", "text": t, "title": t.split()[0]})
                                for i, t in enumerate(texts)) + "\n")
    assert main(["index", str(corpus), "--path", str(tmp / "store"), "--quiet"]) == 0
    return tmp / "store"


BAD = [
    (["search", "wing", "--filter", '{"title": {"$like": "x"}}'], "unknown operator '$like'"),
    (["search", "wing", "--filter", "[1]"], "must be a mapping"),
    (["search", "wing", "--filter", '{"title": {"$in": []}}'], "needs at least one value"),
    (["search", "wing", "--filter", "{not json"], "not valid JSON"),
    (["search", "", ], "the query is empty"),
    (["search", "   "], "the query is empty"),
    (["search", "wing \udcff"], "is not valid Unicode"),  # a byte that is not UTF-8, in argv
    (["quickstart", "--query", " "], "the query is empty"),
    (["search", "wing", "-k", "0"], "must be positive"),
    (["search", "wing", "--dense-weight", "nan"], "positive number"),
    (["search", "wing", "--option", "nokv"], "KEY=VALUE"),
    (["search", "wing", "--dense", "{tmp}"], "needs both dense="),
    (["search", "wing", "--backend", "nosuch"], "invalid choice"),
    (["index", "{tmp}/missing.jsonl", "--path", "{tmp}/new"], "cannot read"),
    (["eval", "{tmp}/missing"], "is not a BEIR folder"),
    (["fit-projection", "{tmp}/missing.jsonl", "--out", "{tmp}/fit"], "cannot read"),
    (["compare", "{tmp}/missing", "--backends", "exact"], "is not a BEIR folder"),
    (["compare", "{tmp}/missing", "--backends", "nosuch"], "unknown backend"),
    # options that were accepted and ignored
    (["index", "{tmp}/x.jsonl", "--path", "{tmp}/new", "--encoder-url", "http://127.0.0.1:9",
      "--projection", "pca"], "--projection does not apply"),
    (["index", "{tmp}/x.jsonl", "--path", "{tmp}/new", "--encoder-url", "http://127.0.0.1:9",
      "--encoder-url", "http://127.0.0.1:8"], "need --ray"),
    (["index", "{tmp}/x.jsonl", "--path", "{tmp}/new", "--save-encoder", "{tmp}/fit"],
     "--save-encoder needs --fit-projection"),
    (["index", "{tmp}/x.jsonl", "--path", "{tmp}/new", "--fit-sample", "10"],
     "--fit-sample needs --fit-projection"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a)[:40] for a, _ in BAD])
def test_a_user_error_is_one_line_and_exit_status_2(argv, message, store, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "search":
        argv += ["--path", str(store)]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err, err
    last = err.strip().splitlines()
    assert last[-1].startswith(("uibk-embed: ", "uibk-embed index: ", "uibk-embed compare: ",
                                "uibk-embed search: ")), err
    if not any(m in message for m in ("invalid choice", "must be positive", "positive number")):
        assert len(last) == 1, err  # argparse prints its usage line first
    assert not (tmp_path / "new").exists() and not (tmp_path / "fit").exists()


def test_export_pylate_never_writes_over_a_folder_with_files(tmp_path, capsys):
    """It wrote its config.json, weights and tokenizer over another model's files there."""
    (tmp_path / "config.json").write_text('{"someone": "else"}')
    with pytest.raises(SystemExit) as e:
        main(["export-pylate", str(tmp_path)])
    assert e.value.code == 2 and "is not an empty folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    assert (tmp_path / "config.json").read_text() == '{"someone": "else"}'


def test_a_damaged_store_is_one_line_and_left_as_it_was(store, tmp_path, capsys):
    """A store.sqlite cut short (a bad copy): SQLite says it is malformed; one line naming the
    file, the folder's bytes unchanged, for a read and for a write."""
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(store, damaged)
    db = damaged / "store.sqlite"
    db.write_bytes(db.read_bytes()[:5000])
    before = {p.name: p.read_bytes() for p in damaged.iterdir() if p.is_file()}
    corpus = tmp_path / "one.jsonl"
    corpus.write_text(json.dumps({"_id": "x", "text": "a new document"}) + "\n")
    for argv in (["search", "wing", "--path", str(damaged)],
                 ["index", str(corpus), "--path", str(damaged), "--quiet"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and "store.sqlite is damaged" in err, err
    after = {p.name: p.read_bytes() for p in damaged.iterdir() if p.is_file()}
    assert {n: after.get(n) for n in before} == before  # every file as it was
    assert set(after) - set(before) <= {"store.sqlite-wal", "store.sqlite-shm"}  # SQLite's side files


def test_a_bug_keeps_its_traceback(monkeypatch, store):
    """An error that is not the user's (here an AttributeError inside a command) is not hidden."""
    import uibk_embedding.apps.cli as cli

    def broken(*a, **k):
        raise AttributeError("a bug")

    monkeypatch.setattr(cli, "_print_hits", broken)
    with pytest.raises(AttributeError, match="a bug"):
        main(["search", "wing", "--path", str(store)])


def test_debug_env_shows_the_traceback_of_a_user_error(monkeypatch, store):
    monkeypatch.setenv("UIBK_EMBED_DEBUG", "1")
    with pytest.raises(ValueError, match="unknown operator"):
        main(["search", "wing", "--path", str(store), "--filter", '{"title": {"$nope": 1}}'])


# -- --version, and help text on every option (issue #42) ----------------------------------------
def _parsers():
    """The uibk-embed parser, its subcommands' parsers and the delegated commands' own parsers."""
    import argparse

    from uibk_embedding.apps.compare import build_parser as compare_parser
    from uibk_embedding.encoder.server import build_parser as serve_parser

    top = build_parser()
    found = [("uibk-embed", top)]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += [(f"uibk-embed {n}", sp) for n, sp in action.choices.items()
                      if n not in ("serve", "compare")]
    return [*found, ("uibk-embed compare", compare_parser()), ("uibk-embed serve", serve_parser())]


def test_every_option_has_help_text():
    missing = [f"{name} {'/'.join(a.option_strings)}" for name, p in _parsers() for a in p._actions
               if a.option_strings and a.dest != "help" and not (a.help or "").strip()]
    assert not missing, missing


def test_version(capsys):
    import uibk_embedding

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"uibk-embed {uibk_embedding.__version__}"


def test_index_ray_hands_the_projection_to_the_actors(monkeypatch, tmp_path):
    """``index --ray --projection pca`` encoded with the seeded random projection: the option
    never reached the actors' encoders."""
    from uibk_embedding.apps import cli

    seen = {}

    def index_distributed(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stopped here by the test")

    monkeypatch.setattr(cli, "index_distributed", index_distributed)
    with pytest.raises(SystemExit, match="stopped here by the test"):
        main(["index", str(tmp_path / "x.jsonl"), "--backend", "milvus", "--option", "uri=http://127.0.0.1:9",
              "--ray", "--projection", "pca"])
    assert seen["encoder_options"] == {"projection": "pca"}
    with pytest.raises(SystemExit, match="does not apply to --dense/--tokens"):
        main(["index", str(tmp_path / "x.jsonl"), "--backend", "milvus", "--option", "uri=http://127.0.0.1:9",
              "--ray", "--projection", "pca", "--dense", str(tmp_path), "--tokens", str(tmp_path)])


def test_a_corpus_warning_is_one_uibk_embed_line(tmp_path, capsys, recwarn):
    """It reached the user as a Python warning with cli.py's source line under it."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in [
        {"_id": "d1", "text": "the lift of a wing"}, {"_id": "d2", "text": ""}, {"_id": "d3", "text": " "}]))
    assert main(["index", str(corpus), "--path", str(tmp_path / "store"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [f"uibk-embed: {corpus}: skipped 2 documents with no text"], err
    assert not [w for w in recwarn if "skipped" in str(w.message)]  # not shown as a Python warning


def test_another_librarys_warning_still_passes_through(tmp_path, capsys, recwarn, monkeypatch):
    import warnings

    import uibk_embedding.apps.cli as cli

    read = cli.read_corpus

    def read_corpus(path):  # this module is not the library: its warning stays Python's
        warnings.warn("a warning from elsewhere", UserWarning, stacklevel=1)
        return read(path)

    monkeypatch.setattr(cli, "read_corpus", read_corpus)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"_id": "d1", "text": "the lift of a wing"}) + "\n")
    assert main(["index", str(corpus), "--path", str(tmp_path / "store"), "--quiet"]) == 0
    assert "a warning from elsewhere" not in capsys.readouterr().err
    shown = [w for w in recwarn if str(w.message) == "a warning from elsewhere"]
    assert len(shown) == 1 and shown[0].filename == __file__
