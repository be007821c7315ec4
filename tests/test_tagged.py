"""The tagged format (docs/format.md#constants) and its identity (docs/format.md#identity), on random
and real vectors."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from uibk_embedding.maxsim import maxsim
from uibk_embedding.tagged import (
    TaggedFormat,
    check_separation,
    compute_bounds,
    decompose,
    dense_vector,
    infer_format,
    orthonormal_rows,
)
from uibk_embedding.testing import make_list


def test_constants_and_vectors(fmt, rng):
    assert fmt.delta == pytest.approx(0.225)
    x = make_list(fmt, rng, 6)
    assert x.shape == (9, 128) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(x[:3, 0], -math.sqrt(1 - 0.225), atol=1e-7)
    np.testing.assert_allclose(x[3:, 0], math.sqrt(0.1), atol=1e-7)


@pytest.mark.parametrize("beta", [0, 1, -0.1, 1.5, float("nan"), "0.9"])
def test_beta_is_validated(beta):
    with pytest.raises(ValueError, match="beta"):
        TaggedFormat(beta=beta)


def test_a_lambda_that_breaks_property_i_names_the_largest_that_keeps_it():
    # the message said "use lambda_ <= 1", which breaks it too at beta=0.99
    with pytest.raises(ValueError, match=r"use lambda_ <= 0\.84\d* with beta=0\.99"):
        TaggedFormat(beta=0.99, lambda_=1.0)
    TaggedFormat(beta=0.99, lambda_=0.84)


@pytest.mark.parametrize("beta", [0.9, 0.5, 0.05])
@pytest.mark.parametrize("lam", [70.0, 1e3, 1e300, sys.float_info.max])
def test_a_huge_lambda_names_the_same_largest_lambda(beta, lam):
    # the bisection ran over [0, lambda_]: from about 1e3 up it ended at "use lambda_ <= 0"
    # (1e300: its midpoints never came near 1.15); property (i) always fails from delta = 1
    # (lambda_ = 3 / beta) on, where a slot-slot product can be -1
    import re

    with pytest.raises(ValueError, match="use lambda_") as small:
        TaggedFormat(beta=beta, lambda_=3 / beta)
    largest = float(re.search(r"use lambda_ <= ([0-9.]+)", str(small.value)).group(1))
    assert largest > 0
    TaggedFormat(beta=beta, lambda_=largest)  # the named value keeps property (i)
    with pytest.raises(ValueError, match=rf"use lambda_ <= {re.escape(f'{largest:g}')} with"):
        TaggedFormat(beta=beta, lambda_=lam)


@pytest.mark.parametrize("lam", [math.inf, -math.inf, math.nan])
def test_a_lambda_that_is_not_finite_is_refused_as_such(lam):
    with pytest.raises(ValueError, match=r"lambda_ must be a positive finite number, got (inf|-inf|nan)"):
        TaggedFormat(lambda_=lam)


def test_bounds_table():
    """Paper Table 12 values for the released constants; property (i) fails above ~1.16."""
    table = {lam: compute_bounds(0.9, lam) for lam in (0.5, 0.75, 1.0, 1.5)}
    assert table[0.75].slot_slot_min == pytest.approx(0.55)
    assert table[0.75].slot_token_max == pytest.approx(0.17, abs=5e-3)
    assert [table[lam].property_i for lam in (0.5, 0.75, 1.0, 1.5)] == [True, True, True, False]
    for lam in (0.5, 0.75, 1.0):
        TaggedFormat(lambda_=lam)
    with pytest.raises(ValueError, match=r"property \(i\)"):
        TaggedFormat(lambda_=1.5)
    with pytest.raises(ValueError, match="lambda_"):
        TaggedFormat(lambda_=0)


@pytest.mark.parametrize("lam", [0.5, 0.75, 1.0])
def test_bounds_hold_on_adversarial_vectors(lam, rng):
    """Slot-slot never below its bound, slot-token never above, even for opposite bodies."""
    fmt = TaggedFormat(lambda_=lam)
    b = fmt.bounds()
    g = rng.normal(size=(3, 127))
    q = fmt.build(g, g[:1])
    d = fmt.build(-g, -g[:1])  # opposite bodies: the worst case for slot-slot
    assert (q[:3] @ d[:3].T).diagonal().min() >= b.slot_slot_min - 1e-6
    assert (q[:3] @ d[:3].T).diagonal().min() == pytest.approx(b.slot_slot_min, abs=1e-5)
    # a token aligned with a slot body: the worst case for slot-token
    t = fmt.build(g, g[:1])[3]
    assert float(q[0] @ t) == pytest.approx(b.slot_token_max, abs=1e-5)


def test_decompose_identity_random(fmt, rng):
    for w in (1.0, 0.3, 4.0):
        g = rng.normal(size=(3, 127))
        q = fmt.build(g, rng.normal(size=(8, 127)), dense_weight=w)
        # a related document: its slots are noisy copies of the query's, so slot s selects slot s
        d = fmt.build(g + 0.5 * rng.normal(size=(3, 127)), rng.normal(size=(20, 127)))
        p = decompose(q, d, fmt)
        assert p.total == pytest.approx(maxsim(q, d), abs=1e-6)
        assert p.total == pytest.approx(
            p.constant + fmt.beta * (p.token + fmt.lambda_ * w * p.dense), abs=1e-5)
        assert p.dense_weight == pytest.approx(w, rel=1e-5)
        assert p.separated and p.slots_aligned
        assert p.constant == pytest.approx(fmt.constant(8, w), abs=1e-5)


def test_decompose_reports_selected_pairs_not_the_closed_form(fmt, rng):
    """Swap two document slots: query slot 0 selects document slot 1, and the flags say so."""
    q = make_list(fmt, rng, 4)
    d = make_list(fmt, rng, 6)
    d2 = d.copy()
    d2[0, 1:] = q[1, 1:]  # document slot 0 now looks like query slot 1 ...
    d2[1, 1:] = q[0, 1:]  # ... and document slot 1 like query slot 0
    p = decompose(q, d2, fmt)
    assert p.separated and not p.slots_aligned
    assert p.selected[0] == 1 and p.selected[1] == 0
    assert p.total == pytest.approx(maxsim(q, d2), abs=1e-6)


def test_infer_format_reads_tags(rng):
    fmt = TaggedFormat(beta=0.8, lambda_=0.5)
    got = infer_format(make_list(fmt, rng, 5))
    assert got.beta == pytest.approx(0.8, abs=1e-5) and got.lambda_ == pytest.approx(0.5, abs=1e-4)


def test_orthonormal_rows_and_columns():
    m = orthonormal_rows(381, 384, seed=3)
    np.testing.assert_allclose(m @ m.T, np.eye(381), atol=1e-10)
    tall = orthonormal_rows(381, 256, seed=3)  # a dense model with fewer than 381 dims
    np.testing.assert_allclose(tall.T @ tall, np.eye(256), atol=1e-10)
    np.testing.assert_array_equal(m, orthonormal_rows(381, 384, seed=3))


def test_dense_vector_dot_is_the_dense_part(fmt, rng):
    g = rng.normal(size=(3, 127))
    q = fmt.build(g, rng.normal(size=(3, 127)), dense_weight=2.5)
    d = fmt.build(g + rng.normal(size=(3, 127)), rng.normal(size=(9, 127)))
    p = decompose(q, d, fmt)
    assert p.slots_aligned
    assert float(dense_vector(q) @ dense_vector(d)) == pytest.approx(p.dense, abs=1e-5)


# -- on real MiniLM outputs -----------------------------------------------------------------
def test_identity_on_real_minilm_outputs(real_data, encoder):
    """The identity (docs/format.md#identity) on real vectors: total == C + beta (token + lambda w dense),
    separation held."""
    fmt = encoder.format
    worst = 0.0
    n_aligned = n_pairs = 0
    for q in real_data.queries[:10]:
        for w in (1.0, 4.0):
            qw = q.copy()
            qw[:3] *= w
            for d in real_data.docs[:60]:
                p = decompose(qw, d, fmt)
                closed = fmt.constant(p.n_query_tokens, w) + fmt.beta * (
                    p.token + fmt.lambda_ * w * p.dense)
                assert p.separated
                n_pairs += 1
                n_aligned += p.slots_aligned
                if p.slots_aligned:
                    worst = max(worst, abs(p.total - closed))
                assert p.total == pytest.approx(maxsim(qw, d), abs=1e-5)
    assert worst < 1e-5
    # property (iii) (slot s selects slot s) fails on many low-scoring pairs of this untrained
    # composition (measured: 68% of all Cranfield pairs aligned, 92% of each query's top 10)
    assert n_aligned / n_pairs > 0.5


def test_slots_align_on_top_documents(real_data):
    aligned = []
    for q in real_data.queries:
        scores = [maxsim(q, d) for d in real_data.docs]
        for i in np.argsort(scores)[::-1][:10]:
            aligned.append(decompose(q, real_data.docs[i]).slots_aligned)
    assert np.mean(aligned) >= 0.85


def test_separation_on_real_data(real_data):
    rep = check_separation(real_data.queries, real_data.docs[:100])
    assert rep.held, rep.as_dict()
    assert rep.pairs == len(real_data.queries) * 100


def test_ranking_equals_hybrid_score_ranking(real_data, encoder):
    """MaxSim ranks documents exactly as C + beta (token MaxSim + lambda w dense cosine)."""
    fmt = encoder.format
    q = real_data.queries[3]
    docs = real_data.docs
    u_q = q[3:, 1:] / math.sqrt(fmt.beta)
    hybrid = []
    for d in docs:
        tok = float(((u_q @ (d[3:, 1:] / math.sqrt(fmt.beta)).T).max(axis=1)).sum())
        dense = float(dense_vector(q) @ dense_vector(d))
        hybrid.append(fmt.beta * (tok + fmt.lambda_ * dense))
    total = [maxsim(q, d) for d in docs]
    top = lambda s: list(np.argsort(-np.asarray(s), kind="stable")[:20])  # noqa: E731
    aligned = [decompose(q, d, fmt).slots_aligned for d in docs]
    # where the closed form applies the two agree to float precision
    diffs = [t - h for t, h, a in zip(total, hybrid, aligned, strict=True) if a]
    assert np.ptp(diffs) < 1e-5
    assert top(total) == top(hybrid)
