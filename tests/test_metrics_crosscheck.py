"""The in-house nDCG@k and recall@k against trec_eval (pytrec-eval-terrier), per query, on real
runs over the test collections.

The runs are real rankings of the whole corpus by a plain TF-IDF cosine (no encoder, so the
test is cheap), 100 documents per query. trec_eval orders a run by score (ties by document id),
the in-house metrics take the list order: the scores given to trec_eval are ``-rank``, so both
read the same order and the comparison is of the metric definitions only.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
import pytrec_eval

from uibk_embedding.apps.data import load_beir
from uibk_embedding.metrics import evaluate, ndcg_at_k, recall_at_k
from uibk_embedding.testing import datasets_dir

_WORD = re.compile(r"\w+")


def tfidf_run(coll, depth: int = 100) -> dict[str, list[str]]:
    """Top ``depth`` documents of each query by TF-IDF cosine (log tf, idf = log(N / df))."""
    from scipy import sparse

    docs = [Counter(_WORD.findall(d.full_text.lower())) for d in coll.corpus]
    vocab: dict[str, int] = {}
    rows, cols, vals = [], [], []
    for i, c in enumerate(docs):
        for w, n in c.items():
            rows.append(i)
            cols.append(vocab.setdefault(w, len(vocab)))
            vals.append(1 + math.log(n))
    m = sparse.csr_matrix((vals, (rows, cols)), shape=(len(docs), len(vocab)))
    df = np.bincount(cols, minlength=len(vocab))
    idf = np.log(len(docs) / np.maximum(df, 1))
    m = sparse.csr_matrix(m.multiply(idf[None, :]))
    norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1))).ravel()
    m = sparse.csr_matrix(m.multiply(1 / np.maximum(norms, 1e-12)[:, None]))
    ids = [d.id for d in coll.corpus]
    run = {}
    for qid, text in coll.queries.items():
        q = np.zeros(len(vocab))
        for w, n in Counter(_WORD.findall(text.lower())).items():
            if w in vocab:
                q[vocab[w]] = (1 + math.log(n)) * idf[vocab[w]]
        s = m @ q
        order = np.lexsort((np.arange(len(s)), -s))[:depth]  # score desc, then corpus order
        run[qid] = [ids[i] for i in order]
    return run


@pytest.fixture(scope="module", params=["cranfield", "npl", "limit-small"])
def real_run(request):
    coll = load_beir(datasets_dir() / request.param)
    return coll, tfidf_run(coll)


def test_per_query_agreement_with_trec_eval(real_run):
    coll, run = real_run
    judged = {q: r for q, r in coll.qrels.items() if any(v > 0 for v in r.values())}
    trec_run = {q: {d: float(-i) for i, d in enumerate(run[q])} for q in judged}
    measures = {"ndcg_cut_10", "recall_2", "recall_10", "recall_100"}
    ref = pytrec_eval.RelevanceEvaluator(judged, measures).evaluate(trec_run)
    assert set(ref) == set(judged)
    worst = 0.0
    for q in judged:
        one_run, one_qrels = {q: run[q]}, {q: judged[q]}
        mine = {"ndcg_cut_10": ndcg_at_k(one_run, one_qrels, 10),
                "recall_2": recall_at_k(one_run, one_qrels, 2),
                "recall_10": recall_at_k(one_run, one_qrels, 10),
                "recall_100": recall_at_k(one_run, one_qrels, 100)}
        for m, v in mine.items():
            assert v == pytest.approx(ref[q][m], abs=1e-6), (coll.name, q, m)
            worst = max(worst, abs(v - ref[q][m]))
    # the means `uibk-embed eval` reports, over the same judged queries
    ours = evaluate(run, coll.qrels)
    for mine, theirs in (("ndcg@10", "ndcg_cut_10"), ("recall@100", "recall_100")):
        assert ours[mine] == pytest.approx(np.mean([ref[q][theirs] for q in judged]), abs=1e-9)
    # the run is a real one: it finds relevant documents, and some queries are ranked imperfectly
    # (TF-IDF is near perfect on limit-small, whose queries name a word of the relevant documents)
    assert ours["ndcg@10"] > 0.05, ours
    assert min(ref[q]["ndcg_cut_10"] for q in judged) < 0.9, "every query ranked (near) perfectly"
    print(f"{coll.name}: {len(judged)} queries, nDCG@10 {ours['ndcg@10']:.4f}, "
          f"largest per-query difference {worst:.2e}")
