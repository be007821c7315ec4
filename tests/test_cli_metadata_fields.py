"""Issue #61: a JSONL line's other fields (``{"id", "text", "topic"}``) are kept as metadata, said
by ``uibk-embed index`` in one line, and found by ``search --filter``; a clash with a nested
``metadata`` object is refused, never resolved silently."""

from __future__ import annotations

import json

import pytest

from uibk_embedding.apps.cli import main
from uibk_embedding.apps.data import DataError, read_corpus
from uibk_embedding.apps.distributed import read_rows

ROWS = [
    {"id": "f1", "text": "interest rates and the bond market", "topic": "finance"},
    {"id": "f2", "text": "a stock market crash and bank runs", "topic": "finance", "year": 1929},
    {"id": "s1", "text": "the serve and volley style in tennis", "topic": "sport"},
    {"id": "s2", "text": "a marathon runner's training plan", "metadata": {"topic": "sport"}},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fields")
    corpus = _write(tmp / "docs.jsonl", ROWS)
    return corpus, tmp / "idx"


def test_index_keeps_top_level_fields_and_says_so_and_search_filters_on_them(indexed, capsys):
    corpus, idx = indexed
    assert main(["index", str(corpus), "--path", str(idx), "--quiet"]) == 0
    err = capsys.readouterr().err
    said = [ln for ln in err.splitlines() if "kept as metadata" in ln]
    assert said == ["uibk-embed: kept as metadata (for --filter): topic, year (1 of 4 documents)"], err
    assert main(["search", "market", "--path", str(idx), "--filter", '{"topic": "finance"}',
                 "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert sorted(h["id"] for h in hits) == ["f1", "f2"]
    assert {h["metadata"]["topic"] for h in hits} == {"finance"}
    assert next(h for h in hits if h["id"] == "f2")["metadata"]["year"] == 1929
    # a nested metadata object keeps working, and is found by the same filter
    assert main(["search", "running", "--path", str(idx), "--filter", '{"topic": "sport"}',
                 "--json"]) == 0
    assert sorted(h["id"] for h in json.loads(capsys.readouterr().out)["hits"]) == ["s1", "s2"]


def test_a_corpus_without_other_fields_says_nothing_about_metadata(tmp_path, capsys):
    corpus = _write(tmp_path / "plain.jsonl", [{"_id": "a", "text": "a wing"}, {"_id": "b", "text": "bread"}])
    assert main(["index", str(corpus), "--path", str(tmp_path / "idx"), "--quiet"]) == 0
    assert "kept as metadata" not in capsys.readouterr().err


def test_a_list_field_is_said_to_match_no_filter(tmp_path, capsys):
    """The new-user run: ``tags`` was listed "for --filter", and ``--filter '{"tags": "solar"}'``
    then printed an empty table; a list is kept, and said to match no filter."""
    rows = [{"_id": "a", "text": "solar panels", "tags": ["solar", "energy"], "topic": "energy"},
            {"_id": "b", "text": "bread", "topic": "food"}]
    corpus = _write(tmp_path / "tags.jsonl", rows)
    assert main(["index", str(corpus), "--path", str(tmp_path / "idx"), "--quiet"]) == 0
    said = [ln for ln in capsys.readouterr().err.splitlines() if "kept as metadata" in ln]
    assert said == ["uibk-embed: kept as metadata (for --filter): topic; kept, but no filter matches "
                    "a list: tags"]


def test_the_ray_reader_keeps_the_same_fields(tmp_path):
    rows = read_rows(_write(tmp_path / "c.jsonl", ROWS))
    assert [json.loads(r["_meta"]) for r in rows] == [
        {"topic": "finance"}, {"topic": "finance", "year": 1929}, {"topic": "sport"}, {"topic": "sport"}]


def test_top_level_and_nested_fields_merge_and_an_equal_value_is_no_clash(tmp_path):
    doc, = read_corpus(_write(tmp_path / "c.jsonl", [
        {"_id": "a", "text": "x", "topic": "f", "lang": "en", "metadata": {"year": 1, "lang": "en"}}]))
    assert doc.metadata == {"year": 1, "lang": "en", "topic": "f"}


@pytest.mark.parametrize("row, reason", [
    ({"_id": "a", "text": "x", "topic": "f", "metadata": {"topic": "s"}},
     "field 'topic' is both a top-level field ('f') and a metadata key ('s'): keep one"),
    ({"_id": "a", "text": "x", "metadata": {"title": "T"}},
     "metadata key 'title' would be replaced by the document's title (stored under 'title'): rename it"),
])
def test_a_clash_is_refused_with_the_field_named(tmp_path, row, reason):
    p = _write(tmp_path / "c.jsonl", [row])
    with pytest.raises(DataError) as e:
        read_corpus(p)
    assert str(e.value) == f"{p}:1: {reason}"
    assert read_rows(p)[0]["_error"] == reason  # the Ray reader refuses it alike


def test_an_id_beside_another_underscore_id_is_kept_as_metadata(tmp_path):
    docs = read_corpus(_write(tmp_path / "c.jsonl", [{"_id": "a", "id": "legacy-7", "text": "x"},
                                                     {"_id": "b", "id": "b", "text": "y"}]))
    assert [(d.id, d.metadata) for d in docs] == [("a", {"id": "legacy-7"}), ("b", {})]


def test_beir_title_is_encoded_with_the_text_and_stored_under_title(tmp_path):
    doc, = read_corpus(_write(tmp_path / "corpus.jsonl", [
        {"_id": "d1", "title": "Wings", "text": "lift in a slipstream", "url": "http://x"}]))
    assert doc.full_text == "Wings. lift in a slipstream"
    assert doc.stored_metadata() == {"url": "http://x", "title": "Wings", "text": "lift in a slipstream"}
    assert doc.stored_metadata(store_text=False) == {"url": "http://x"}  # --no-store-text keeps the fields
