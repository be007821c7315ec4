"""Every hit a store returns carries its relevance (issue #61: ``Hit.relevance`` was named in the
README and was an AttributeError): in [0, 1], equal to :func:`uibk_embedding.rank.relevance` of the
query and the hit's score, on every backend (through the shared base, from ``search``, ``search``
with ``explain=True`` and ``search_batch``)."""

from __future__ import annotations

import numpy as np
import pytest

from uibk_embedding.rank import relevance
from uibk_embedding.tagged import TaggedFormat, query_for_mode
from uibk_embedding.testing import BackendSpec, make_list


@pytest.fixture(scope="module")
def filled(spec: BackendSpec, tmp_path_factory):
    """30 random documents in one store of ``spec`` (shared by this module's tests: they only search)."""
    fmt, rng = TaggedFormat(), np.random.default_rng(61)
    s = spec.make(tmp_path_factory.mktemp(f"relevance-{spec.name}"))
    docs = [make_list(fmt, rng, int(rng.integers(4, 30))) for _ in range(30)]
    try:
        s.upsert([f"doc-{i}" for i in range(30)], docs)
        yield s, docs
    finally:
        s.close()


def _check(query: np.ndarray, hits: list) -> None:
    assert hits
    for h in hits:
        assert h.relevance is not None and 0.0 <= h.relevance <= 1.0, (h.id, h.relevance)
        assert h.relevance == pytest.approx(relevance(query, h.score), abs=1e-12), h.id
    rel = [h.relevance for h in hits]
    assert rel == sorted(rel, reverse=True), "relevance does not keep the order of the scores"


def test_every_hit_has_its_relevance(filled, fmt):
    store, _ = filled
    rng = np.random.default_rng(7)
    queries = [make_list(fmt, rng, 12), make_list(fmt, rng, 3, dense_weight=4.0)]
    for q in [*queries, query_for_mode(queries[0], "dense"), query_for_mode(queries[0], "tokens")]:
        _check(q, store.search(q, k=5))
        _check(q, store.search(q, k=5, explain=True))
    for q, hits in zip(queries, store.search_batch(queries, k=5), strict=True):
        _check(q, hits)


def test_a_stored_document_as_its_own_query_is_a_perfect_match(spec, filled):
    """A query equal to a stored list reaches the largest score it can: relevance 1 (float16
    storage within rounding). Exact backends only: an engine's own approximate score
    (``rerank=False``) is not MaxSim, so its relevance is that score's."""
    if spec.contract != "exact":
        pytest.skip("an approximate engine's score need not be the MaxSim of a perfect match")
    store, docs = filled
    hits = store.search(docs[3], k=3)
    top = next(h for h in hits if h.id == "doc-3")
    assert top.relevance == pytest.approx(1.0, abs=2e-3)
    assert top.as_dict()["relevance"] == top.relevance


def test_the_old_import_is_the_same_function():
    from uibk_embedding.integrations import core

    assert core.relevance is relevance
