"""The uibk-embed command line: quickstart, index -> search, eval --json, argument errors."""

from __future__ import annotations

import json

import pytest

from uibk_embedding.apps.cli import main


def test_quickstart(capsys):
    assert main(["quickstart", "-k", "3"]) == 0
    out = capsys.readouterr().out
    assert "wing-slipstream" in out.split("query:")[1].splitlines()[3]  # the top hit
    assert "score = constant" in out and "token part" in out and "dense part" in out


@pytest.mark.parametrize("backend", ["exact", "lancedb"])
def test_index_then_search(backend, tmp_path, capsys):
    """Index into a folder, then search it (the backend detected from the folder)."""
    if backend != "exact":
        pytest.importorskip(backend)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join(json.dumps(d) for d in [
        {"_id": "d1", "text": "the lift of a wing in a propeller slipstream", "metadata": {"lang": "en"}},
        {"_id": "d2", "text": "a sourdough bread recipe", "metadata": {"lang": "en"}},
        {"_id": "d3", "text": "Auftrieb eines Flügels im Propellerstrahl", "metadata": {"lang": "de"}},
    ]) + "\n")
    store = tmp_path / "store"
    assert main(["index", str(corpus), "--backend", backend, "--path", str(store), "--quiet"]) == 0
    assert "indexed 3 documents" in capsys.readouterr().out
    assert main(["search", "wing lift in a slipstream", "--path", str(store), "--json", "-k", "2"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["hits"][0]["id"] == "d1"
    d = res["hits"][0]["decomposition"]
    assert d["total"] == pytest.approx(d["constant"] + d["token_part"] + d["dense_part"], abs=1e-4)
    assert main(["search", "wing", "--path", str(store), "--json", "--filter", '{"lang": "de"}']) == 0
    assert [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]] == ["d3"]


def test_eval_json_limit_small(datasets, capsys):
    assert main(["eval", str(datasets / "limit-small"), "--json", "--dense-weight", "1"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["dataset"] == "limit-small" and res["backend"] == "exact" and res["dense_weight"] == 1
    for head in ("fused", "dense", "tokens"):
        m = res["metrics"][head]
        assert set(m) == {"ndcg@10", "recall@2", "recall@10", "recall@100"}
        assert all(0 <= v <= 1 for v in m.values())
    # token matching dominates on LIMIT (measured: tokens recall@2 0.96, dense 0.16)
    assert res["metrics"]["tokens"]["recall@2"] > res["metrics"]["dense"]["recall@2"] + 0.5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "{missing}"], "is not a BEIR folder"),
        (["index", "{missing}.jsonl", "--path", "{tmp}/uibk-never-written"], "cannot read"),
        (["index", "{missing}.jsonl"], "would index into memory"),
        (["index", "x.jsonl", "--backend", "qdrant"], r"--option url=URL \(a server\)"),
        (["index", "x.jsonl", "--backend", "lancedb"], r"without --path DIR or --option uri=URI"),
        (["search", "q", "--filter", "{not json"], "not valid JSON"),
    ],
)
def test_errors_are_clear(argv, message, tmp_path):
    """``{missing}``: a path under ``tmp_path`` that is never made (not a fixed path that may exist)."""
    argv = [a.replace("{missing}", str(tmp_path / "missing")).replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "search":  # a store to search, so that the filter is what fails
        _index_three(tmp_path)
        argv += ["--path", str(tmp_path / "store")]
    with pytest.raises(SystemExit, match=message):
        main(argv)
    assert not (tmp_path / "missing").exists() and not (tmp_path / "uibk-never-written").exists()


# -- a read never creates or writes a store ------------------------------------------------------
def _index_three(tmp_path):
    corpus = tmp_path / "three.jsonl"
    corpus.write_text("\n".join(json.dumps({"_id": f"mine{i}", "text": t}) for i, t in enumerate(
        ["the lift of a wing", "a sourdough bread recipe", "boundary layer transition"])) + "\n")
    assert main(["index", str(corpus), "--path", str(tmp_path / "store"), "--quiet"]) == 0
    return tmp_path / "store"


def _listing(folder):
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_search_on_a_missing_store_is_an_error_that_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(SystemExit) as e:
        main(["search", "wing", "--path", str(missing)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"uibk-embed: no store at {missing} (") and len(err.strip().splitlines()) == 1
    assert not missing.exists()
    with pytest.raises(SystemExit) as e:  # no --path: an exact store in memory would be a new, empty one
        main(["search", "wing"])
    assert e.value.code == 2 and "no store" in capsys.readouterr().err


def test_eval_reads_an_existing_store_as_it_is(tmp_path, datasets, capsys):
    """The review's finding: `eval DATASET --path STORE` wrote the corpus into the store (46 documents
    became 1,444). Now it searches the stored vectors and writes nothing."""
    from uibk_embedding.adapters.registry import open_store

    store = _index_three(tmp_path)
    capsys.readouterr()
    before = _listing(store)
    assert main(["eval", str(datasets / "limit-small"), "--path", str(store), "--json"]) == 0
    out, err = capsys.readouterr()
    res = json.loads(out)
    assert res["backend"] == "exact" and set(res["metrics"]) == {"fused", "dense", "tokens"}
    assert "46 of 46 documents the qrels name are not in the store" in err
    assert _listing(store) == before
    with open_store("exact", path=store, create=False) as s:
        assert sorted(s.ids()) == ["mine0", "mine1", "mine2"]


def test_eval_without_a_store_warns_of_judged_documents_the_corpus_lacks(tmp_path, capsys):
    # they scored 0 without a word (with --path the same case warned)
    data = tmp_path / "tiny"
    (data / "qrels").mkdir(parents=True)
    texts = ["the lift of a wing", "a sourdough bread recipe", "boundary layer transition"]
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(texts)))
    (data / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "wing lift"}) + "\n")
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\td0\t1\nq\tgone\t1\n")
    assert main(["eval", str(data), "--json", "--no-cache"]) == 0
    assert "1 of 2 documents the qrels name are not in the corpus of" in capsys.readouterr().err


def test_eval_builds_a_store_only_when_asked(tmp_path, datasets, capsys):
    data, new = str(datasets / "limit-small"), tmp_path / "new-store"
    with pytest.raises(SystemExit) as e:
        main(["eval", data, "--path", str(new), "--json"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"uibk-embed: no store at {new} (") and "--create" in err
    assert not new.exists()

    assert main(["eval", data, "--path", str(new), "--create", "--json"]) == 0
    out, err = capsys.readouterr()
    assert f"indexing 46 documents into a new store at {new}" in err
    built = json.loads(out)
    before = _listing(new)
    # the second run reads the store it built: the same figures, nothing written
    assert main(["eval", data, "--path", str(new), "--create", "--json"]) == 0
    out, err = capsys.readouterr()
    assert "indexing" not in err and "not in the store" not in err
    again = json.loads(out)
    assert _listing(new) == before
    for head in ("fused", "dense", "tokens"):
        for m, v in built["metrics"][head].items():
            assert again["metrics"][head][m] == pytest.approx(v, abs=1e-6), (head, m)


@pytest.mark.parametrize("argv", [["search", "q", "-k", "0"], ["search", "q", "--dense-weight", "-1"],
                                  ["search", "q", "--backend", "nosuch"]])
def test_argument_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


# -- fuzzing the argument parsers (hypothesis) --------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from uibk_embedding.adapters.filters import parse_filter  # noqa: E402
from uibk_embedding.apps.cli import _parse_options, build_parser  # noqa: E402

_tokens = st.one_of(st.sampled_from(["-k", "--dense-weight", "--backend", "--option", "--path", "--json",
                                     "--filter", "--split", "exact", "qdrant", "0", "-1", "nan", "1e309",
                                     "x=1", "x", "=", "{}", "--", ""]), st.text(max_size=12))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["search", "index", "eval", "quickstart"]), st.lists(_tokens, max_size=6))
def test_fuzz_cli_arguments(command, rest):
    """Any argument list either parses into valid values or exits with argparse's usage error."""
    try:
        args = build_parser().parse_args([command, *rest])
    except SystemExit as e:
        assert e.code == 2
        return
    if getattr(args, "k", None) is not None:
        assert args.k > 0
    if getattr(args, "dense_weight", None) is not None:
        assert 0 < args.dense_weight < float("inf")
    try:
        _parse_options(getattr(args, "option", []))
    except SystemExit as e:
        assert "KEY=VALUE" in str(e)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                     max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_fuzz_filters(value):
    """Whatever JSON a user passes as --filter: parsed, or a ValueError / TypeError that says why."""
    try:
        parse_filter(value)
    except (ValueError, TypeError) as e:
        assert str(e)


@pytest.mark.parametrize(("row", "message"), [
    ({"_id": 1.10, "text": "a wing"}, "a JSON number with a fraction"),
    ({"_id": "x" * 513, "text": "a wing"}, "513 characters long"),
    ({"_id": "d1", "text": "a wing", "metadata": {"_uibk_x": 1}}, "reserved prefix"),
    ({"_id": "d1", "text": "a wing", "metadata": {"year": float("nan")}}, "not JSON-serialisable"),
])
def test_index_refuses_what_a_store_would_refuse_before_writing(tmp_path, row, message):
    """The reader refuses, naming file and line, what upsert would refuse later (after earlier
    batches were committed): nothing is written."""
    import json

    good = [json.dumps({"_id": f"ok{i}", "text": "the lift of a wing"}) for i in range(3)]
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join([*good, json.dumps(row)]) + "\n")
    with pytest.raises(SystemExit, match=message) as e:
        main(["index", str(data), "--path", str(tmp_path / "store"), "--quiet", "--batch-size", "1"])
    assert "docs.jsonl:4" in str(e.value)
    assert not (tmp_path / "store").exists(), "the store was written before the bad row was seen"


def test_qrels_with_an_infinite_score_is_a_data_error(tmp_path):
    from uibk_embedding.apps.data import read_qrels
    from uibk_embedding.errors import DataError

    (tmp_path / "q.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\tinf\nq1\td2\t1.5\n")
    with pytest.raises(DataError, match=r"q.tsv:2: score 'inf' is not a finite whole number"):
        read_qrels(tmp_path / "q.tsv")


def _beir_of_six(tmp_path):
    """A BEIR folder of 6 documents, 2 queries judging d0, d1, d4 and d5; and a store of its first 3
    documents (an `index` stopped part-way)."""
    data = tmp_path / "six"
    (data / "qrels").mkdir(parents=True)
    texts = ["the lift of a wing", "a sourdough bread recipe", "boundary layer transition",
             "heat transfer at high Mach number", "flutter of thin panels", "ferrite core memories"]
    rows = [json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)]
    (data / "corpus.jsonl").write_text("".join(rows))
    (data / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "wing lift"}) + "\n"
                                        + json.dumps({"_id": "q2", "text": "panel flutter"}) + "\n")
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\nq1\td1\t1\n"
                                             "q2\td4\t1\nq2\td5\t1\n")
    part = tmp_path / "part.jsonl"
    part.write_text("".join(rows[:3]))
    assert main(["index", str(part), "--path", str(tmp_path / "store"), "--quiet"]) == 0
    return data, tmp_path / "store"


def test_eval_json_says_what_the_store_lacks(tmp_path, capsys):
    """`eval --path --json` on a store missing documents only warned on stderr: a script recorded
    the low nDCG without knowing why."""
    data, store = _beir_of_six(tmp_path)
    capsys.readouterr()
    assert main(["eval", str(data), "--path", str(store), "--json"]) == 0
    out, err = capsys.readouterr()
    res = json.loads(out)
    assert "2 of 4 documents the qrels name are not in the store" in err
    assert res["store_documents"] == 3 and res["qrels_documents_missing"] == 2, res
    assert "uibk-embed index" not in err  # no --create: the store may be a subset on purpose
    # a whole corpus in a new store: nothing missing
    assert main(["eval", str(data), "--json", "--no-cache"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["store_documents"] == 6 and res["qrels_documents_missing"] == 0, res


def test_eval_create_on_a_store_short_of_the_corpus_says_how_to_finish_it(tmp_path, capsys):
    data, store = _beir_of_six(tmp_path)
    capsys.readouterr()
    before = _listing(store)
    assert main(["eval", str(data), "--path", str(store), "--create", "--json"]) == 0
    err = capsys.readouterr().err
    assert f"the store has 3 of the 6 documents of {data}" in err, err
    assert f"uibk-embed index {data} --path {store}" in err, err
    assert _listing(store) == before  # still read as it is
