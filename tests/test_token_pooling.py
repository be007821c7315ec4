"""Token pooling at index time (uibk_embedding.token_pooling): the rule, the format record, the
identity on pooled documents, and the store's refusal of documents of another pool factor."""

from __future__ import annotations

import json

import numpy as np
import pytest

from uibk_embedding import open_store
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.maxsim import maxsim
from uibk_embedding.tagged import N_SLOTS, TaggedFormat, check_separation, decompose
from uibk_embedding.token_pooling import (
    TokenRows,
    TokenVocabulary,
    average_clusters,
    check_pool_factor,
    frequent_token_ids,
    pool_clusters,
    pool_content,
    pool_documents,
    pool_tokens,
    pooled_token_count,
    ward_clusters,
)


def _partition(labels: np.ndarray) -> set[frozenset[int]]:
    return {frozenset(np.flatnonzero(labels == c).tolist()) for c in np.unique(labels)}


@pytest.mark.parametrize("n", [2, 3, 7, 40, 129])
def test_ward_clusters_match_scipy(n, rng):
    hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
    x = rng.normal(size=(n, 127))
    tree = hierarchy.linkage(x, method="ward")
    for k in sorted({1, max(n // 3, 1), max(n // 2, 1), n - 1, n}):
        if k < 1:
            continue
        ours = ward_clusters(x, k)
        assert len(np.unique(ours)) == k
        theirs = hierarchy.fcluster(tree, t=k, criterion="maxclust")
        assert _partition(ours) == _partition(theirs), (n, k)


@pytest.mark.parametrize("n", [2, 3, 7, 40, 129])
def test_average_clusters_match_scipy(n, rng):
    """Average linkage on the content method's cost (cosine distance plus a penalty across
    segments): the clusters of scipy's linkage cut after the same number of merges."""
    hierarchy = pytest.importorskip("scipy.cluster.hierarchy")
    from scipy.spatial.distance import squareform

    u = rng.normal(size=(n, 127))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    seg = rng.integers(0, 3, size=n)
    cost = np.clip(1 - u @ u.T, 0, 2) + 0.2 * (seg[:, None] != seg[None, :])
    np.fill_diagonal(cost, 0)
    tree = hierarchy.linkage(squareform(cost, checks=False), method="average")
    for k in sorted({1, max(n // 3, 1), max(n // 2, 1), n - 1, n}):
        ours = average_clusters(cost, k)
        assert len(np.unique(ours)) == k
        theirs = hierarchy.fcluster(tree, t=k, criterion="maxclust")
        assert _partition(ours) == _partition(theirs), (n, k)


def test_content_pooling_is_the_benchmarks_measured_rule(encoder, real_data):
    """pool_factor=2's default method, fitted on a collection, is the rule benchmarks/pooling.py
    --levers measured as tok:df90%-skip+segment (its nDCG@10 figures are this method's), on 200
    real documents: the same frequent ids, the same pooled lists."""
    pytest.importorskip("scipy")
    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.testing import load_benchmark

    pl = load_benchmark("pooling")
    two = load_encoder(pool_factor=2)
    frequent = two.fit_pooling(real_data.texts)
    assert frequent and two.format.pool_frequent_ids == frequent
    infos = pl.with_document_frequency(pl.document_tokens(encoder, real_data.texts, real_data.docs))
    theirs = {int(t) for i in infos for t in i["ids"][i["df"] >= 0.9 * i["n_docs"]]}
    assert theirs == set(frequent)
    for doc, info, out in zip(real_data.docs, infos, two.encode_documents(real_data.texts), strict=True):
        keep = pooled_token_count(len(doc) - N_SLOTS, 2)
        ref = pl.token_lever_pool(doc, encoder.format, keep, pl.frequent_as_function(info, 0.9),
                                  "skip-function", segment_penalty=0.2)
        assert out.shape == ref.shape and np.abs(out - ref).max() < 1e-5


def test_content_method_keeps_content_and_fills_with_function_rows(fmt, rng):
    doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(8, 127)))
    seg = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    # 3 content rows, keep 4: the content rows stay byte for byte, the 5 function rows become 1
    few = TokenRows(np.array([1, 0, 1, 0, 1, 1, 0, 1], bool), seg)
    out = pool_content(doc, 4, few, fmt)
    assert len(out) == N_SLOTS + 4
    assert out[N_SLOTS + 1].tobytes() == doc[N_SLOTS + 1].tobytes()  # first content row, in order
    assert {out[N_SLOTS + i].tobytes() for i in (1, 2, 3)} == {doc[N_SLOTS + i].tobytes() for i in (1, 3, 6)}
    # 6 content rows, keep 3: the function rows go, the content merges to 3
    many = TokenRows(np.array([1, 0, 0, 0, 0, 0, 0, 1], bool), seg)
    out = pool_content(doc, 3, many, fmt)
    assert len(out) == N_SLOTS + 3 and np.allclose(np.linalg.norm(out, axis=1), 1)
    # exactly 4 content rows, keep 4: they are the list's token rows
    four = TokenRows(np.array([1, 0, 1, 0, 1, 0, 1, 0], bool), seg)
    kept = doc[N_SLOTS + np.array([1, 3, 5, 7])]
    assert pool_content(doc, 4, four, fmt)[N_SLOTS:].tobytes() == kept.tobytes()
    # function rows only: merged as a whole
    assert len(pool_content(doc, 2, TokenRows(np.ones(8, bool), seg), fmt)) == N_SLOTS + 2
    with pytest.raises(ValueError, match="rows must describe the list's 8 token rows"):
        pool_content(doc, 2, TokenRows(np.ones(7, bool), seg[:7]), fmt)
    with pytest.raises(ValueError, match="pool_method='content' needs each token row's kind"):
        pool_tokens(doc, 2, fmt)


@pytest.mark.parametrize("scheme", ["wordpiece", "sentencepiece", "bpe"])
def test_token_vocabulary_reads_each_word_piece_scheme(scheme):
    """The same sentence, "the asymmetry , of wings", in each scheme's pieces: "the" and "of" are
    whole stopwords, "as" begins a longer word (no stopword), "," is punctuation and ends a
    segment, [CLS]/<s> are special."""
    if scheme == "wordpiece":
        pieces = ["[CLS]", "the", "as", "##ym", "##metry", ",", "of", "wing", "##s"]
        filler = [f"##x{i}" for i in range(20)]  # enough to tell the scheme
    else:
        m = {"sentencepiece": "\u2581", "bpe": "\u0120"}[scheme]  # the word-start marker
        pieces = ["<s>", f"{m}the", f"{m}as", "ym", "metry", ",", f"{m}of", f"{m}wing", "s"]
        filler = [f"{m}w{i}" for i in range(20)]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(pieces + filler))}
    rows = TokenVocabulary(vocab).rows(np.array([vocab[t] for t in pieces]))
    assert rows.function.tolist() == [True, True, False, False, False, True, True, False, False]
    assert rows.segments.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert TokenVocabulary(vocab).rows(np.array([10_000])).function.tolist() == [False]  # unknown id


def test_frequent_token_ids_count_documents():
    docs = [np.array([1, 1, 2]), np.array([1, 3])] * 15  # 30 documents: 1 in all, 2 and 3 in half
    assert frequent_token_ids(docs) == (1,)
    assert frequent_token_ids(docs, cutoff=0.5) == (1, 2, 3)
    assert frequent_token_ids(docs[:19]) == ()  # too few documents to tell
    with pytest.raises(ValueError, match="cutoff"):
        frequent_token_ids(docs, cutoff=0)


def test_ward_clusters_with_ties_give_exactly_k():
    x = np.zeros((6, 4))  # all distances equal: any merge order, but still k clusters
    for k in range(1, 7):
        assert len(np.unique(ward_clusters(x, k))) == k
    x = np.repeat(np.eye(3), 4, axis=0)  # three groups of duplicates
    assert _partition(ward_clusters(x, 3)) == {frozenset(range(i, i + 4)) for i in (0, 4, 8)}


@pytest.fixture(scope="module")
def real_rows(encoder, real_data):
    """What the content method reads of the real documents' token rows (no frequent ids)."""
    return encoder.token_rows(real_data.texts)


@pytest.mark.parametrize("method", ["content", "ward"])
def test_pooled_rows_rule_slots_tags_and_norms(real_data, real_rows, fmt, method):
    for p in (2, 3, 4):
        for doc, rows in zip(real_data.docs[:60], real_rows, strict=False):
            out = pool_tokens(doc, p, fmt, rows, method=method)
            n = len(doc) - N_SLOTS
            assert len(out) - N_SLOTS == max(n // p, 1) == pooled_token_count(n, p)
            assert out.dtype == np.float32
            assert out[:N_SLOTS].tobytes() == doc[:N_SLOTS].tobytes()  # slots untouched
            assert out[N_SLOTS:, 0].tobytes() == np.full(len(out) - N_SLOTS, doc[N_SLOTS, 0]).tobytes()
            assert np.abs(np.linalg.norm(out.astype(np.float64), axis=1) - 1).max() < 1e-6
            # every pooled token is a renormalised mean of tokens: each row of the list is
            # closer to some original token than the original tokens are to nothing at all
            assert (out[N_SLOTS:] @ doc[N_SLOTS:].T).max(axis=1).min() > 0.5


def test_pool_tokens_is_pool_clusters_of_its_ward_clusters(real_data, fmt):
    # the rows pool_factor writes and the rows any other clustering gets (benchmarks/pooling.py
    # --levers) come from one function: they can differ only in their clusters
    for doc in real_data.docs[:30]:
        n = len(doc) - N_SLOTS
        if n < 2:
            continue
        labels = ward_clusters(doc[N_SLOTS:, 1:].astype(np.float64), pooled_token_count(n, 2))
        assert pool_clusters(doc, labels, fmt).tobytes() == pool_tokens(doc, 2, fmt, method="ward").tobytes()


def test_pool_clusters_rows_of_given_clusters_and_centers(real_data, fmt, rng):
    doc = next(d for d in real_data.docs if len(d) - N_SLOTS >= 12)
    n = len(doc) - N_SLOTS
    labels = np.concatenate([[0, 0, 1], np.arange(2, n - 1)])  # rows 0, 1 together, 2 alone, ...
    labels[-1] = 1  # ... and the last row with row 2
    out = pool_clusters(doc, labels, fmt)
    k = n - 2
    assert out.shape == (N_SLOTS + k, doc.shape[1]) and out.dtype == doc.dtype
    assert out[:N_SLOTS].tobytes() == doc[:N_SLOTS].tobytes()
    assert out[N_SLOTS:, 0].tobytes() == np.full(k, doc[N_SLOTS, 0]).tobytes()  # the exact tag
    assert np.abs(np.linalg.norm(out.astype(np.float64), axis=1) - 1).max() < 1e-6
    bodies = doc[N_SLOTS:, 1:].astype(np.float64)
    for c, members in ((0, [0, 1]), (1, [2, n - 1])):
        mean = bodies[members].sum(0)
        got = out[N_SLOTS + c, 1:].astype(np.float64)
        assert np.abs(got / np.linalg.norm(got) - mean / np.linalg.norm(mean)).max() < 1e-6
    assert out[N_SLOTS + 2:].tobytes() == doc[N_SLOTS + 3:-1].tobytes()  # tokens alone: copied
    centers = rng.normal(size=(k, doc.shape[1] - 1))
    other = pool_clusters(doc, labels, fmt, centers)
    body = other[N_SLOTS, 1:].astype(np.float64)
    assert np.abs(body / np.linalg.norm(body) - centers[0] / np.linalg.norm(centers[0])).max() < 1e-6
    assert other[N_SLOTS + 2:].tobytes() == out[N_SLOTS + 2:].tobytes()  # a center of one: the token


@pytest.mark.parametrize("labels", [[0, 0, 2], [0, 1], [-1, 0, 1], [0, 1, 1, 1]])
def test_pool_clusters_refuses_labels_that_are_not_a_partition(fmt, rng, labels):
    doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(3, 127)))
    with pytest.raises(ValueError, match="labels must give each of the 3 token rows a cluster"):
        pool_clusters(doc, np.array(labels), fmt)


def test_pool_factor_one_is_the_same_bytes(encoder, real_data):
    from uibk_embedding.encoder import load_encoder

    texts = real_data.texts[:20]
    plain = encoder.encode_documents(texts)
    one = load_encoder(pool_factor=1)
    assert one.format == encoder.format and one.format.to_stored() == encoder.format.to_stored()
    for a, b in zip(plain, one.encode_documents(texts), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    assert pool_documents(plain, encoder.format)[3] is plain[3]


@pytest.mark.parametrize("method", ["content", "ward"])
def test_encoder_pools_documents_never_queries(encoder, real_data, real_rows, method):
    from uibk_embedding.encoder import load_encoder

    two = load_encoder(pool_factor=2, pool_method=method)
    assert two.format.pool_factor == 2 and two.config()["format"]["pool_factor"] == 2
    assert two.config()["format"]["pool_method"] == method
    texts = real_data.texts[:20]
    plain, pooled = encoder.encode_documents(texts), two.encode_documents(texts)
    for a, b, rows in zip(plain, pooled, real_rows, strict=False):
        assert len(b) - N_SLOTS == max((len(a) - N_SLOTS) // 2, 1)
        assert np.array_equal(b, pool_tokens(a, 2, encoder.format, rows, method=method))
    streamed = list(two.encode_documents_iter(texts, chunk_size=7))
    for a, b in zip(streamed, pooled, strict=True):  # other batches: float noise of the model only
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-4
    q = real_data.query_texts[:5]
    for a, b in zip(encoder.encode_queries(q), two.encode_queries(q), strict=True):
        assert a.tobytes() == b.tobytes()


def test_a_shared_encoder_pools_as_its_encoder_does(real_data):
    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.encoder.shared import SharedEncoder

    inner = load_encoder(pool_factor=3)
    texts = real_data.texts[:6]
    direct = inner.encode_documents(texts)
    with SharedEncoder(inner) as shared:
        assert shared.format.pool_factor == 3
        for a, b in zip(direct, shared.encode_documents(texts), strict=True):
            assert a.shape == b.shape and np.abs(a - b).max() < 1e-4
        qs = real_data.query_texts[:3]
        assert [q.shape for q in shared.encode_queries(qs)] == [q.shape for q in inner.encode_queries(qs)]


@pytest.mark.parametrize("method", ["content", "ward"])
def test_identity_and_decomposition_hold_on_pooled_documents(real_data, real_rows, fmt, method):
    docs = [pool_tokens(d, 2, fmt, r, method=method)
            for d, r in zip(real_data.docs[:50], real_rows, strict=False)]
    queries = real_data.queries[:10]
    report = check_separation(queries, docs)
    assert report.held, report  # no query token selects a slot, no query slot a token
    closed_form = 0
    for q in queries:
        for d in docs:
            parts = decompose(q, d, fmt)
            assert parts.total == pytest.approx(float(maxsim(q, d)), abs=1e-4)
            assert parts.total == pytest.approx(
                parts.constant + fmt.beta * (parts.token + fmt.lambda_ * parts.dense_weight * parts.dense),
                abs=1e-5)
            if parts.separated and parts.slots_aligned:
                c = fmt.constant(parts.n_query_tokens, parts.dense_weight)
                assert parts.constant == pytest.approx(c, abs=1e-5)  # C(q): the same for every document
                closed_form += 1
    assert closed_form > 0


def test_format_record_of_the_pool_factor():
    two = TaggedFormat(projection="random-1", pool_factor=2)
    assert two.to_stored()["pool_factor"] == 2
    assert TaggedFormat.from_stored(json.loads(json.dumps(two.to_stored()))) == two
    # an unpooled format's record is what it was before pooling; an old record reads as 1
    assert "pool_factor" not in TaggedFormat().to_stored()
    assert TaggedFormat.from_stored({"beta": 0.9, "lambda_": 0.75}).pool_factor == 1
    for bad in (0, -1, 65, 1.5, True, "2"):
        with pytest.raises(ValueError, match="pool_factor"):
            TaggedFormat(pool_factor=bad)
    with pytest.raises(ValueError, match="pool_factor"):
        TaggedFormat.from_stored({"beta": 0.9, "lambda_": 0.75, "pool_factor": 2.0})
    # searching does not depend on it: conflict() leaves it to the write check
    assert two.conflict(TaggedFormat(projection="random-1")) is None
    # the method and frequent ids: recorded with a pool factor; a record of a pooled store from
    # before methods were recorded was pooled by Ward's method
    fitted = TaggedFormat(pool_factor=2, pool_frequent_ids=[9, 3, 3])
    assert fitted.pool_frequent_ids == (3, 9) and fitted.to_stored()["pool_frequent_ids"] == [3, 9]
    assert TaggedFormat.from_stored(json.loads(json.dumps(fitted.to_stored()))) == fitted
    assert TaggedFormat.from_stored({"beta": 0.9, "lambda_": 0.75, "pool_factor": 2}).pool_method == "ward"
    assert TaggedFormat(pool_method="ward") == TaggedFormat()  # unpooled: the method means nothing
    assert TaggedFormat(pool_factor=2, pool_method="ward", pool_frequent_ids=(3,)).pool_frequent_ids == ()
    for bad in ({"pool_method": "mean"}, {"pool_frequent_ids": (-1,)}, {"pool_frequent_ids": (True,)},
                {"pool_frequent_ids": "12"}):
        with pytest.raises(ValueError, match=r"pool_method|pool_frequent_ids"):
            TaggedFormat(pool_factor=2, **bad)


def test_store_records_the_pool_factor_and_refuses_other_documents(tmp_path, encoder, real_data):
    from uibk_embedding.encoder import load_encoder

    two = load_encoder(pool_factor=2)
    path = tmp_path / "pooled"
    with open_store("exact", path=str(path), format=two.format) as store:
        store.upsert(["a", "b"], two.encode_documents(real_data.texts[:2]))
    with open_store("exact", path=str(path)) as store:  # no encoder: the record says
        assert store.format.pool_factor == 2
    # an unpooled encoder searches it (queries are never pooled) ...
    with open_store("exact", path=str(path), format=encoder.format, create=False) as store:
        assert store.format.pool_factor == 2
        assert len(store.search(encoder.encode_queries(["flow"])[0], k=2)) == 2
        # ... but its documents are refused, naming both factors and the way out
        with pytest.raises(CollectionMismatch, match=r"pool_factor=2, pool_method='content' and this "
                                                     r"encoder's documents get no pooling.*--pool-factor 2"):
            check_pool_factor(store.format, encoder.format, "the exact store")
    check_pool_factor(TaggedFormat(pool_factor=2), two.format, "the exact store")  # the same: fine
    with pytest.raises(CollectionMismatch, match="were not pooled and this encoder's documents get "
                                                 "pool_factor=3"):
        check_pool_factor(TaggedFormat(), TaggedFormat(pool_factor=3), "an old store")
    # the method and the frequent ids count as the factor does
    with pytest.raises(CollectionMismatch, match=r"pool_method='ward'.*--pool-method ward"):
        check_pool_factor(TaggedFormat(pool_factor=2, pool_method="ward"), two.format, "a Ward store")
    with pytest.raises(CollectionMismatch, match=r"1 frequent token ids.*adopt_pooling"):
        check_pool_factor(TaggedFormat(pool_factor=2, pool_frequent_ids=(7,)), two.format, "a fitted store")
