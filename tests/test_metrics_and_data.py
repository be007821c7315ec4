"""Metrics against hand-computed values; BEIR/JSONL readers, including fuzzed input."""

from __future__ import annotations

import json
import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uibk_embedding.apps.data import DataError, load_beir, read_corpus, read_qrels, read_queries
from uibk_embedding.metrics import evaluate, ndcg_at_k, overlap_at_k, recall_at_k


def test_ndcg_by_hand():
    qrels = {"q1": {"a": 3, "b": 1, "c": 0}, "q2": {"x": 1}}
    run = {"q1": ["c", "b", "a"], "q2": ["x"]}
    dcg1 = 0 + 1 / math.log2(3) + 3 / math.log2(4)
    idcg1 = 3 + 1 / math.log2(3)
    assert ndcg_at_k(run, qrels, 10) == pytest.approx((dcg1 / idcg1 + 1.0) / 2)
    assert ndcg_at_k(run, qrels, 1) == pytest.approx((0 + 1) / 2)


def test_recall_and_missing_queries():
    qrels = {"q1": {"a": 1, "b": 2}, "q2": {"x": 1}, "q3": {"z": 0}}  # q3 has no relevant doc
    run = {"q1": ["a", "zz", "b"]}
    assert recall_at_k(run, qrels, 2) == pytest.approx((0.5 + 0) / 2)
    assert recall_at_k(run, qrels, 3) == pytest.approx((1 + 0) / 2)
    assert set(evaluate(run, qrels)) == {"ndcg@10", "recall@2", "recall@10", "recall@100"}
    assert overlap_at_k({"q": ["a", "b", "c"]}, {"q": ["c", "a", "d"]}, 3) == pytest.approx(2 / 3)


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_k_must_be_a_positive_int(k):
    # k=0 divided by zero in nDCG; k=-1 scored ranked[:-1]
    for metric in (ndcg_at_k, recall_at_k):
        with pytest.raises(ValueError, match="k must be a positive int"):
            metric({"q": ["a"]}, {"q": {"a": 1}}, k)


def test_a_run_that_lists_a_document_twice_is_refused():
    """Scored twice, ``a`` gave nDCG@2 = 1.0 where it ranks one relevant document of two."""
    qrels = {"q": {"a": 1, "b": 1}}
    for metric in (ndcg_at_k, recall_at_k):
        with pytest.raises(ValueError, match="the run lists document 'a' twice for query 'q'"):
            metric({"q": ["a", "x", "a"]}, qrels, 2)
    assert ndcg_at_k({"q": ["a", "x"]}, qrels, 2) == pytest.approx(1 / (1 + 1 / math.log2(3)))


def _write_beir(root, corpus, queries, qrels):
    root.mkdir(parents=True, exist_ok=True)
    (root / "qrels").mkdir(exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels))


def test_load_beir(tmp_path):
    _write_beir(tmp_path / "c", [{"_id": "1", "title": "T", "text": "body"}, {"_id": "2", "text": "x"}],
                [{"_id": "q", "text": "?"}, {"_id": "u", "text": "unjudged"}], [("q", "1", 1)])
    c = load_beir(tmp_path / "c")
    assert [d.id for d in c.corpus] == ["1", "2"] and c.corpus[0].full_text == "T. body"
    assert c.queries == {"q": "?"} and c.qrels == {"q": {"1": 1}}


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ('{"_id": "1", "text": "a"}\n{"_id": "1", "text": "b"}\n', "duplicate document id"),
        ('{"_id": "1", "text": "a"}\nnot json\n', r":2: not valid JSON"),
        ('["a list"]\n', "expected a JSON object"),
        ('{"text": "no id"}\n', "missing field"),
        ('{"_id": "1", "text": ["x"]}\n', "must be a string"),
        ('{"_id": "", "text": "x"}\n', "empty document id"),
        # a lone surrogate, which JSON allows: the tokenizer failed on it mid-index
        ('{"_id": "1", "text": "ok"}\n{"_id": "2", "text": "wing \\ud800 lift"}\n',
         r":2: the text is not valid Unicode: a lone surrogate"),
        ('{"_id": "1", "title": "\\udfff", "text": "ok"}\n', r":1: the title is not valid Unicode"),
        ("", "no documents"),
    ],
)
def test_corpus_errors(tmp_path, content, match):
    p = tmp_path / "c.jsonl"
    p.write_text(content)
    with pytest.raises(DataError, match=match):
        read_corpus(p)


def test_queries_errors_name_the_line(tmp_path):
    p = tmp_path / "queries.jsonl"
    cases = [('{"_id": "q1", "text": "ok"}\n{"_id": "q2", "text": "  "}\n', r":2: query 'q2' has an empty"),
             ('{"_id": "q1", "text": "a \\ud800"}\n', r":1: query 'q1' is not valid Unicode")]
    for content, match in cases:
        p.write_text(content)
        with pytest.raises(DataError, match=match):
            read_queries(p)


def test_queries_follow_the_corpus_rules(tmp_path):
    """An empty or blank query id, a number as text: the corpus reader refuses them, the query
    reader took them ("" became a query id; 42 the query "42")."""
    p = tmp_path / "queries.jsonl"
    cases = [('{"_id": "q1", "text": "ok"}\n{"_id": "", "text": "x"}\n',
              r"queries\.jsonl:2: id must be a non-empty string, got an empty query id"),
             ('{"_id": " ", "text": "x"}\n', r":1: id must be a non-empty string, got an empty query id"),
             ('{"_id": "q2", "text": 42}\n', r":1: query 'q2': text must be a string, got int"),
             ('{"_id": "q2", "text": ["a"]}\n', r":1: query 'q2': text must be a string, got list"),
             ('{"_id": 1.5, "text": "x"}\n', r":1: id 1\.5 is a JSON number with a fraction"),
             ('{"_id": true, "text": "x"}\n', r":1: id must be a non-empty string, got bool True"),
             ('{"text": "x"}\n', r":1: id must be a non-empty string: missing field '_id' or 'id'"),
             ('{"_id": "q3"}\n', r":1: query 'q3' has no text")]
    for content, match in cases:
        p.write_text(content)
        with pytest.raises(DataError, match=match):
            read_queries(p)
    p.write_text('{"_id": 7, "text": "wing"}\n{"id": "q8", "text": "flap"}\n')
    assert read_queries(p) == {"7": "wing", "q8": "flap"}  # a JSON integer id as its digits, as in a corpus


def test_qrels_refuse_an_empty_id(tmp_path):
    p = tmp_path / "q.tsv"
    for content, match in [("query-id\tcorpus-id\tscore\nq1\td1\t1\n\td2\t1\n", r"q\.tsv:3: empty query id"),
                           ("q1\t \t1\n", r"q\.tsv:1: empty corpus id")]:
        p.write_text(content)
        with pytest.raises(DataError, match=match):
            read_qrels(p)


def test_judged_queries_missing_from_queries_jsonl_are_named(tmp_path):
    """Queries the qrels judge (with a relevant document) that queries.jsonl lacks were dropped
    without a word: the scores were then averaged over fewer queries than the qrels judge."""
    _write_beir(tmp_path / "c", [{"_id": "1", "text": "body"}], [{"_id": "q", "text": "?"}],
                [("q", "1", 1), ("q7", "1", 2), ("q9", "1", 1), ("q0", "1", 0)])
    want = (r"2 queries with a relevant document in qrels/test\.tsv are not in queries\.jsonl \(q7, q9\); "
            r"the scores are averaged over the other 1")
    with pytest.warns(UserWarning, match=want):
        c = load_beir(tmp_path / "c")
    assert c.queries == {"q": "?"} and c.qrels == {"q": {"1": 1}}
    _write_beir(tmp_path / "d", [{"_id": "1", "text": "body"}], [{"_id": "q", "text": "?"}], [("q", "1", 1)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_beir(tmp_path / "d")


def test_a_bom_is_read_past_and_unjudged_queries_are_refused_before_encoding(tmp_path):
    """Files a Windows editor saved start with a byte order mark: read past it (the qrels
    header was taken for a score); a collection whose qrels judge none of its queries is refused
    when it is read (it failed after the whole corpus was encoded, 'need at least one array')."""
    _write_beir(tmp_path / "c", [{"_id": "1", "text": "body"}], [{"_id": "q", "text": "?"}], [("q", "1", 1)])
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        f = tmp_path / "c" / name
        f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    c = load_beir(tmp_path / "c")
    assert [d.id for d in c.corpus] == ["1"] and c.qrels == {"q": {"1": 1}}
    _write_beir(tmp_path / "d", [{"_id": "1", "text": "body"}], [{"_id": "q", "text": "?"}], [("x", "1", 1)])
    with pytest.raises(DataError, match=r"no query of queries\.jsonl has a relevant document"):
        load_beir(tmp_path / "d")


def test_qrels_errors(tmp_path):
    p = tmp_path / "q.tsv"
    p.write_text("query-id\tcorpus-id\tscore\nq1\td1\n")
    with pytest.raises(DataError, match="3 tab-separated"):
        read_qrels(p)
    p.write_text("q1\td1\thigh\n")
    with pytest.raises(DataError, match="not a number"):
        read_qrels(p)
    with pytest.raises(DataError, match="cannot read"):
        read_qrels(tmp_path / "nope.tsv")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_fuzz_readers_fail_only_with_data_error(tmp_path, blob):
    """Arbitrary bytes: the readers either parse them or raise DataError, never anything else."""
    for reader, name in ((read_corpus, "c.jsonl"), (read_queries, "q.jsonl"), (read_qrels, "r.tsv")):
        p = tmp_path / name
        p.write_bytes(blob)
        try:
            reader(p)
        except DataError:
            pass


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({"_id": st.text(min_size=1, max_size=8),
                                       "text": st.text(max_size=30)}), max_size=6))
def test_fuzz_corpus_records(tmp_path, docs):
    p = tmp_path / "c.jsonl"
    p.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    try:
        out = read_corpus(p)
    except DataError:
        return
    assert all(d.full_text.strip() for d in out)
    assert len({d.id for d in out}) == len(out)
