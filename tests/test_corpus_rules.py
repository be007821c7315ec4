"""One corpus reader, one set of bad-row rules: ``read_corpus`` (CLI, evaluation) and the
distributed run's ``read_rows`` find the same rows bad, for the same reason; ``read_queries``
refuses the same ids and texts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from uibk_embedding.adapters.exact import ExactStore
from uibk_embedding.adapters.indexing import stored_metadata, upsert_batches
from uibk_embedding.apps.data import DataError, read_corpus, read_queries
from uibk_embedding.apps.distributed import read_rows
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import make_list

BAD_ROWS = [
    {"text": "no id"},
    {"_id": "", "text": "an empty id"},
    {"_id": 1.5, "text": "a fractional id"},
    {"_id": True, "text": "a boolean id"},
    {"_id": "d", "text": 42},
    {"_id": "d", "text": "x", "title": ["t"]},
    {"_id": "d", "text": "x", "metadata": [1]},
    {"_id": "d", "text": "x", "metadata": {"_uibk_x": 1}},
    {"_id": "x" * 513, "text": "x"},
]


@pytest.mark.parametrize("row", BAD_ROWS, ids=lambda r: json.dumps(r)[:40])
def test_both_readers_refuse_a_bad_row_for_the_same_reason(tmp_path, row):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"_id": "ok", "text": "a wing"}) + "\n" + json.dumps(row) + "\n")
    rows = read_rows(p)
    assert rows[0]["_error"] == "" and rows[1]["_error"], rows
    with pytest.raises(DataError) as e:
        read_corpus(p)
    assert str(e.value) == f"{p}:2: {rows[1]['_error']}"


@pytest.mark.parametrize("row", BAD_ROWS[:5], ids=lambda r: json.dumps(r)[:40])
def test_the_query_reader_refuses_a_bad_id_or_text_as_the_corpus_reader_does(tmp_path, row):
    """queries.jsonl had laxer rules: an empty id became a query id, the number 42 the query "42"."""
    p = tmp_path / "queries.jsonl"
    p.write_text(json.dumps({"_id": "ok", "text": "a wing"}) + "\n" + json.dumps(row) + "\n")
    reason = read_rows(p)[1]["_error"].replace("document id", "query id")
    with pytest.raises(DataError) as e:
        read_queries(p)
    assert str(e.value).startswith(f"{p}:2: ") and str(e.value).endswith(reason), (str(e.value), reason)


def test_rows_without_text_are_skipped_by_one_and_reported_by_the_other(tmp_path):
    p = _corpus(tmp_path, [{"_id": "a", "text": "wing"}, {"_id": "b", "text": " "}, {"_id": "c"}])
    with pytest.warns(UserWarning, match="skipped 2 documents with no text"):
        assert [d.id for d in read_corpus(p)] == ["a"]
    assert [r["_error"] for r in read_rows(p)] == ["", "text is empty or whitespace only", "no text"]


def test_the_indexing_loop_stores_what_the_cli_always_stored(tmp_path):
    """Title and text win over metadata keys of the same name (the stores on disk have that)."""
    docs = read_corpus(_corpus(tmp_path, [{"_id": "a", "title": "T", "text": "wing", "metadata": {"y": 1}}]))
    store = ExactStore()
    n = upsert_batches(store, [d.id for d in docs], [d.stored_metadata() for d in docs],
                       vectors=[make_list(TaggedFormat(), np.random.default_rng(0), 4)])
    assert n == 1
    assert store.get(["a"])[0].metadata == {"y": 1, "title": "T", "text": "wing"}
    assert stored_metadata({"text": "old"}, text="new") == {"text": "new"}


def _corpus(tmp_path, rows):
    p = tmp_path / "corpus.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p
