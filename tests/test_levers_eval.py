"""benchmarks/levers_eval.py: its default setting rebuilds exactly the encoder's lists from the
cached heads (all positions kept), and each lever changes only the rows it names."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.encoder.projection import tagged_from_heads
from uibk_embedding.testing import load_benchmark


@pytest.fixture(scope="module")
def le():
    return load_benchmark("levers_eval")


def _part(dense, states, ids, lens):
    off = np.concatenate([[0], np.cumsum([len(s) for s in states])]).astype(np.int64)
    return {"dense": dense, "mat": np.concatenate(states), "off": off, "ids": np.concatenate(ids),
            "n": np.asarray(lens, np.int64)}


def test_default_setting_is_the_encoder(le, cranfield):
    coll = cranfield
    enc = le.pe._encoder()
    docs = [d.full_text for d in coll.corpus[:5]] + ["a, b; c."]
    queries = [*list(coll.queries.values())[:3], "flutter of panels " * 40]  # past the 64 cap
    heads = {"docs": _part(*le.full_heads(enc, docs, is_query=False)),
             "queries": _part(*le.full_heads(enc, queries, is_query=True)),
             "queries-expand": _part(*le.full_heads(enc, queries, is_query=True, expand=32))}
    R, P = le.default_projection(heads)
    assert np.array_equal(R, enc.R) and np.array_equal(P, enc.P)
    dd, dt, qd, qt = le.build(heads, [])
    pairs = ((tagged_from_heads(dd, dt, R, P, enc.format), enc.encode_documents(docs)),
             (tagged_from_heads(qd, qt, R, P, enc.format), enc.encode_queries(queries, dense_weight=1.0)))
    for got, want in pairs:
        assert [a.shape for a in got] == [a.shape for a in want]
        assert max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True)) < 1e-6
    assert len(qt[-1]) == 64
    # the skiplist drops exactly the punctuation rows of documents, never of queries
    punct = le.punctuation_ids(enc.tokenizer)
    skipped = le.build(heads, [], doc_skip=punct)
    assert len(skipped[1][-1]) == 3 and [len(t) for t in skipped[3]] == [len(t) for t in qt]
    # positions: [CLS] and [SEP] come back as token rows
    both = le.build(heads, [], positions="none")
    assert [len(t) for t in both[1]] == [len(t) + 2 for t in dt]
    # expansion: the text rows are unchanged (masks not attended), masks fill up to 32 positions
    ex = le.build(heads, [], expand="queries-expand")
    assert np.allclose(ex[2][:3], qd[:3], atol=1e-6)
    assert all(len(e) == max(30, len(t)) for e, t in zip(ex[3][:3], qt[:3], strict=True))
    assert np.allclose(ex[3][0][:len(qt[0])], qt[0], atol=1e-5)


def test_the_collection_cache_resumes_and_refuses_another_encoding(tmp_path):
    """``projection_eval.cache_collection``, which both scripts' ``cache`` use: chunks written
    once, a run that passes its deadline stops after the chunk and the next run goes on, and a
    cache of another encoding is refused."""
    pe = load_benchmark("projection_eval")
    class Doc:
        def __init__(self, i):
            self.id, self.full_text = f"d{i}", f"text {i}"

    class Coll:
        name, corpus, queries = "tiny", [Doc(i) for i in range(5)], {"q1": "a query"}

    written = []

    def docs(path, texts):
        written.append(texts)
        np.savez(path, n=np.array(len(texts)))

    folder = tmp_path / "tiny"
    assert not pe.cache_collection(Coll, folder, "enc-1", 2, deadline=-1.0,
                                   write_queries=lambda f: None, write_docs=docs)  # deadline passed
    assert written == [] and (folder / "meta.json").exists()
    assert pe.cache_collection(Coll, folder, "enc-1", 2, deadline=float("inf"),
                               write_queries=lambda f: None, write_docs=docs)
    assert written == [["text 0", "text 1"], ["text 2", "text 3"], ["text 4"]]
    assert pe.cache_collection(Coll, folder, "enc-1", 2, deadline=float("inf"),
                               write_queries=lambda f: None, write_docs=docs)
    assert len(written) == 3  # nothing encoded twice
    with pytest.raises(SystemExit, match="another encoding"):
        pe.cache_collection(Coll, folder, "enc-2", 2, deadline=float("inf"),
                            write_queries=lambda f: None, write_docs=docs)
