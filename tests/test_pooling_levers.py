"""benchmarks/pooling.py --levers, second round (issue #59): document frequencies and the
data-driven function tokens, the linkage helpers, the segment penalty and the collection-wide
budget. Every pooled list keeps its slot rows, exact tags and unit rows."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.tagged import N_SLOTS, TaggedFormat
from uibk_embedding.testing import load_benchmark

pytest.importorskip("scipy")


@pytest.fixture(scope="module")
def pl():
    return load_benchmark("pooling")


def _check_pooled(doc: np.ndarray, out: np.ndarray, fmt: TaggedFormat) -> None:
    assert np.array_equal(out[:N_SLOTS], doc[:N_SLOTS])  # slots never pooled
    assert np.all(out[N_SLOTS:, 0] == doc[N_SLOTS, 0])  # the token tag, exact
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0)


def test_document_frequency_counts_documents_not_occurrences(pl):
    infos = pl.with_document_frequency([{"ids": np.array([4, 4, 4, 8])}, {"ids": np.array([4, 9])},
                                        {"ids": np.array([9])}])
    assert [i["df"].tolist() for i in infos] == [[2, 2, 2, 1], [2, 2], [2]]
    assert {i["n_docs"] for i in infos} == {3}
    assert pl.with_document_frequency([]) == []


def test_frequent_as_function_cutoff(pl):
    kinds = np.array([pl.CONTENT, pl.CONTINUATION, pl.FUNCTION, pl.CONTENT])
    info = {"ids": np.array([1, 2, 3, 4]), "kinds": kinds, "df": np.array([5, 9, 1, 10]), "n_docs": 10}
    got = pl.frequent_as_function(info, 0.5)["kinds"]
    # df 5 of 10 is at the cutoff (>=), 9 and 10 are above; a stopword stays a function token
    assert got.tolist() == [pl.FUNCTION, pl.FUNCTION, pl.FUNCTION, pl.FUNCTION]
    assert pl.frequent_as_function(info, 0.95)["kinds"].tolist() == [pl.CONTENT, pl.CONTINUATION,
                                                                     pl.FUNCTION, pl.FUNCTION]
    assert np.array_equal(info["kinds"], kinds)  # the input is not changed
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="cutoff"):
            pl.frequent_as_function(info, bad)
    with pytest.raises(ValueError, match="with_document_frequency"):
        pl.frequent_as_function({"ids": info["ids"], "kinds": kinds}, 0.5)


@pytest.mark.parametrize("n", [2, 5, 17, 60])
def test_cut_linkage_matches_scipy(pl, n, rng):
    hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
    x = rng.normal(size=(n, 127))
    tree = hierarchy.linkage(x / np.linalg.norm(x, axis=1, keepdims=True), method="average", metric="cosine")
    z = pl.penalised_linkage(x)
    assert np.allclose(z[:, 2], tree[:, 2])
    for k in sorted({1, max(n // 2, 1), n}):
        ours = pl.cut_linkage(z, n, n - k)
        theirs = hierarchy.fcluster(tree, t=k, criterion="maxclust")
        assert len(np.unique(ours)) == k
        assert ({frozenset(np.flatnonzero(ours == c)) for c in np.unique(ours)}
                == {frozenset(np.flatnonzero(theirs == c)) for c in np.unique(theirs)})
    with pytest.raises(ValueError, match="merges"):
        pl.cut_linkage(z, n, n)


def test_segment_penalty_keeps_merges_inside_a_segment(pl):
    fmt = TaggedFormat()
    rng = np.random.default_rng(0)
    a = np.zeros(127)
    a[0] = 1.0
    b = a.copy()
    b[1] = 0.5  # cos(a, b) ~ 0.89: closer than 0.2 plus the cost of (b, c)
    c = b.copy()
    c[2] = 0.1  # cos(b, c) ~ 0.996: the closest pair, across segments
    doc = fmt.build(rng.normal(size=(N_SLOTS, 127)), np.stack([a, b, c]))
    info = {"kinds": np.array([pl.CONTENT] * 3), "segments": np.array([0, 0, 1])}
    plain = pl.token_lever_pool(doc, fmt, 2, info, "skip-function")
    seg = pl.token_lever_pool(doc, fmt, 2, info, "skip-function", segment_penalty=0.2)
    for out in (plain, seg):
        assert len(out) == N_SLOTS + 2
        _check_pooled(doc, out, fmt)
    assert np.array_equal(plain[N_SLOTS], doc[N_SLOTS])  # a alone, b and c merged
    assert np.array_equal(seg[N_SLOTS + 1], doc[N_SLOTS + 2])  # a and b merged, c alone


def test_collection_threshold(pl):
    heights = [np.array([0.1, 0.4, 0.9]), np.array([0.2, 0.3]), np.array([])]
    rows = 4 + 3 + 1
    for target in range(3, rows + 1):
        t = pl.collection_threshold(heights, rows, target)
        merges = sum(int(np.sum(h <= t)) for h in heights)
        assert rows - merges <= target
        if np.isfinite(t):  # one merge fewer would be too many rows
            assert rows - (merges - 1) > target
    assert pl.collection_threshold(heights, rows, rows) == float("-inf")
    with pytest.raises(ValueError, match="cannot be merged"):
        pl.collection_threshold(heights, rows, 2)


@pytest.mark.parametrize("skip", [False, True])
def test_budget_pool_keeps_half_over_the_collection(pl, skip, rng):
    fmt = TaggedFormat()
    lengths = [1, 2, 9, 30, 31]
    docs = [fmt.build(rng.normal(size=(N_SLOTS, 127)), rng.normal(size=(n, 127))) for n in lengths]
    infos = [{"kinds": np.where(np.arange(n) % 4 == 0, pl.FUNCTION, pl.CONTENT),
              "segments": np.arange(n) // 5} for n in lengths]
    out, _ = pl.budget_pool(docs, fmt, infos, skip=skip, segment_penalty=0.2)
    kept = sum(len(d) - N_SLOTS for d in out)
    assert kept <= sum(lengths) // 2
    assert kept >= sum(lengths) // 2 - 1  # ties aside, the budget is used
    for doc, o in zip(docs, out, strict=True):
        _check_pooled(doc, o, fmt)
    if skip:  # a function row is in no output (docs 2.. have content rows)
        for doc, o, info in zip(docs[2:], out[2:], infos[2:], strict=True):
            for r in np.flatnonzero(info["kinds"] == pl.FUNCTION):
                assert not np.any(np.all(o[N_SLOTS:] == doc[N_SLOTS + r], axis=1))
    with pytest.raises(ValueError, match="infos"):
        pl.budget_pool(docs, fmt, None, skip=True)
