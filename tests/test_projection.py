"""Fitted (PCA) projections R and P: orthonormal, deterministic, saved and reloaded, the
identity of docs/format.md#identity with them; and the cached-heads path of benchmarks/projection_eval.py
equals the encoder's own output."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from uibk_embedding.apps.evaluation import _fingerprint
from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.projection import (
    encode_heads,
    pca_from_heads,
    pca_rows,
    projection_id,
    tagged_from_heads,
)
from uibk_embedding.tagged import BODY, N_SLOTS, decompose


@pytest.fixture(scope="module")
def sample(cranfield) -> list[str]:
    """400 Cranfield titles: short (cheap to encode), more than the 381 directions R needs."""
    titles = [d.title or d.text[:80] for d in cranfield.corpus]
    return [t for t in titles if t.strip()][:400]


@pytest.fixture(scope="module")
def fitted(sample):
    """A fresh seeded embedded encoder with a PCA projection fitted on cranfield."""
    return load_encoder(projection="random", show_progress=False).fit_projection(sample)


def _orthonormal_rows(m: np.ndarray, tol: float) -> bool:
    m = np.asarray(m, dtype=np.float64)
    return bool(np.abs(m @ m.T - np.eye(len(m))).max() < tol)


def test_pca_rows_on_synthetic_data():
    rng = np.random.default_rng(0)
    scale = 1.15 ** -np.arange(64.0)
    X = rng.normal(size=(5000, 64)) * scale  # axis-aligned, well separated variances
    R = pca_rows(X, 30, interleave=3)
    assert _orthonormal_rows(R, 1e-10)
    # direction k is axis k (up to noise); it sits in block k % 3, row k // 3
    for k in range(30):
        row = R[(k % 3) * 10 + k // 3]
        assert int(np.argmax(np.abs(row))) == k and row[k] > 0.95
    # more rows than dimensions: orthonormal columns, every direction kept once
    W = pca_rows(X, 129, interleave=3)
    assert W.shape == (129, 64) and np.allclose(W.T @ W, np.eye(64), atol=1e-10)
    with pytest.raises(ValueError, match="spans only 10 directions"):
        pca_rows(X[:10], 30, interleave=3)
    with pytest.raises(ValueError, match="multiple of interleave"):
        pca_rows(X, 31, interleave=3)
    with pytest.raises(ValueError, match="NaN"):
        pca_rows(np.full((5, 3), np.nan), 2)


def test_fitted_projection_is_orthonormal_and_recorded(fitted):
    assert fitted.R.shape == (N_SLOTS * BODY, 384) and fitted.P.shape == (BODY, 384)
    assert fitted.R.dtype == np.float32 and fitted.P.dtype == np.float32
    assert _orthonormal_rows(fitted.R, 1e-5) and _orthonormal_rows(fitted.P, 1e-5)
    cfg = fitted.config()
    assert cfg["projection"] == "pca" and cfg["projection_id"] == projection_id(fitted.R, fitted.P)
    seeded = load_encoder(projection="random", show_progress=False)
    assert "projection" not in seeded.config()  # seeded config (and eval cache keys) unchanged
    # by default only P is fitted; R stays the seeded matrix
    np.testing.assert_array_equal(fitted.R, seeded.R)
    assert not np.allclose(fitted.P, seeded.P)


def test_fit_dense_too(sample):
    both = load_encoder(show_progress=False).fit_projection(sample, fit_dense=True)
    seeded = load_encoder(projection="random", show_progress=False)
    assert _orthonormal_rows(both.R, 1e-5) and not np.allclose(both.R, seeded.R)
    again = load_encoder(show_progress=False).fit_projection(sample, fit_dense=True)
    np.testing.assert_array_equal(again.R, both.R)
    enc = load_encoder(projection="random", show_progress=False)
    with pytest.raises(ValueError, match="spans only 50 directions"):
        enc.fit_projection(sample[:50], fit_dense=True)
    np.testing.assert_array_equal(enc.R, seeded.R)  # nothing changed
    assert "projection" not in enc.config()


def test_fit_is_deterministic(fitted, sample):
    again = load_encoder(show_progress=False).fit_projection(sample)
    np.testing.assert_array_equal(again.R, fitted.R)
    np.testing.assert_array_equal(again.P, fitted.P)
    # and it depends on the sample: another sample gives another projection
    shifted = load_encoder(show_progress=False).fit_projection(sample[5:] + ["a new text"] * 5)
    assert projection_id(shifted.R, shifted.P) != projection_id(fitted.R, fitted.P)


def test_saved_and_reloaded(fitted, tmp_path, cranfield):
    fitted.save_projections(tmp_path)
    again = load_encoder(tmp_path, show_progress=False)
    np.testing.assert_array_equal(again.R, fitted.R)
    np.testing.assert_array_equal(again.P, fitted.P)
    assert again.config() == fitted.config()
    texts = [d.full_text for d in cranfield.corpus[:3]]
    for a, b in zip(again.encode_documents(texts), fitted.encode_documents(texts), strict=True):
        np.testing.assert_array_equal(a, b)
    # a PCA encoder's encoded collections are cached apart from the seeded encoder's
    assert _fingerprint(fitted, cranfield) != _fingerprint(load_encoder(), cranfield)
    # the saved matrices are the truth: a changed file is refused, a missing one too
    with np.load(tmp_path / "projections.npz") as z:
        R, P = z["R"], z["P"]
    np.savez(tmp_path / "projections.npz", R=R, P=P[::-1])
    with pytest.raises(ValueError, match=r"holds projection .* but the encoder was saved with"):
        load_encoder(tmp_path)
    (tmp_path / "projections.npz").unlink()
    with pytest.raises(FileNotFoundError, match="saved with a pca projection"):
        load_encoder(tmp_path)


def test_a_saved_fitted_folder_refuses_what_would_mislabel_or_break_it(fitted, tmp_path):
    """A cut-short ``projections.npz`` (a crash during a save, which was not atomic) was a
    ``BadZipFile`` traceback; it is a ValueError naming the file. ``projection="random"`` on a
    folder with a fitted projection ran the fitted matrices under the seeded kind's name (a
    store of the seeded encoder took its lists): refused. Fitting on no text was a bare
    AssertionError."""
    fitted.save_projections(tmp_path)
    assert not [f.name for f in tmp_path.iterdir() if f.name.startswith(".")]  # no temporary left
    with pytest.raises(ValueError, match="holds a fitted pca projection; projection='random'"):
        load_encoder(tmp_path, projection="random")
    assert load_encoder(tmp_path, projection="pca").format == fitted.format
    data = (tmp_path / "projections.npz").read_bytes()
    (tmp_path / "projections.npz").write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match=r"projections\.npz is not a readable projections file"):
        load_encoder(tmp_path)
    with pytest.raises(ValueError, match="needs texts to fit on"):
        load_encoder(show_progress=False).fit_projection([])


def test_cached_heads_give_the_encoders_output(fitted, cranfield):
    """The path benchmarks/projection_eval.py takes (one forward pass, any projection later)
    equals encode_documents / encode_queries, for the seeded and the fitted projections, with
    a truncated document and a query past the 64-token cap."""
    docs = [d.full_text for d in cranfield.corpus[:6]] + ["turbulence " * 700]
    queries = [*list(cranfield.queries.values())[:5], "flutter of panels " * 40]
    seeded = load_encoder(projection="random", show_progress=False)
    for enc in (seeded, fitted):
        with pytest.warns(UserWarning, match="truncated"):
            want = enc.encode_documents(docs)
        got = tagged_from_heads(*encode_heads(enc, docs), enc.R, enc.P, enc.format)
        assert [a.shape for a in got] == [a.shape for a in want]
        assert max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True)) < 1e-6
        want = enc.encode_queries(queries, dense_weight=4.0)
        got = tagged_from_heads(*encode_heads(enc, queries, is_query=True), enc.R, enc.P,
                                enc.format, dense_weight=4.0)
        assert [len(a) for a in got] == [len(a) for a in want] and len(got[-1]) == N_SLOTS + 64
        assert max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True)) < 1e-6


def test_identity_of_design_1_2_with_pca(fitted, cranfield):
    """MaxSim = C(q) + beta (token MaxSim + lambda w dense), with token MaxSim and the slot
    cosines computed here from the raw heads and the fitted R and P, on real pairs."""
    fmt = fitted.format
    w = 4.0
    docs = [d.full_text for d in cranfield.corpus[:40]]
    queries = list(cranfield.queries.values())[:8]
    dq, tq = encode_heads(fitted, queries, is_query=True)
    dd, td = encode_heads(fitted, docs)
    Q = fitted.encode_queries(queries, dense_weight=w)
    D = fitted.encode_documents(docs)

    def slices(g):
        z = (fitted.R.astype(np.float64) @ g).reshape(N_SLOTS, BODY)
        return z / np.linalg.norm(z, axis=1, keepdims=True)

    def units(h):
        u = h.astype(np.float64) @ fitted.P.astype(np.float64).T
        return u / np.linalg.norm(u, axis=1, keepdims=True)

    aligned = 0
    for i, q in enumerate(Q):
        gq, uq = slices(dq[i]), units(tq[i])
        for j, d in enumerate(D):
            parts = decompose(q, d, fmt)
            assert parts.separated  # property (i)/(ii) on real data
            if not parts.slots_aligned:
                continue
            aligned += 1
            s_tok = float((uq @ units(td[j]).T).max(axis=1).sum())
            dense = float(np.mean(np.sum(gq * slices(dd[j]), axis=1)))
            closed = fmt.constant(len(uq), w) + fmt.beta * (s_tok + fmt.lambda_ * w * dense)
            maxsim = float((q.astype(np.float64) @ d.astype(np.float64).T).max(axis=1).sum())
            assert maxsim == pytest.approx(closed, rel=1e-5, abs=1e-4)
    assert aligned >= 0.5 * len(Q) * len(D), aligned


def test_pca_from_heads_matches_fit(fitted, sample):
    dense, toks = encode_heads(fitted, sample)
    pr = pca_from_heads(dense, toks)
    np.testing.assert_array_equal(pr["P"], fitted.P)
    with pytest.raises(ValueError, match="no token vectors"):
        pca_from_heads(None, [np.zeros((0, 384))])


def test_cli_fit_projection(tmp_path, cranfield, capsys):
    from uibk_embedding.apps import cli

    corpus = tmp_path / "corpus.jsonl"
    docs = cranfield.corpus[:400]
    corpus.write_text("".join(json.dumps({"_id": d.id, "text": d.title or d.text[:80]}) + "\n"
                              for d in docs))
    out = tmp_path / "enc"
    assert cli.main(["fit-projection", str(corpus), "--out", str(out), "--max-docs", "390"]) == 0
    printed = capsys.readouterr().out
    enc = load_encoder(out)
    assert enc.config()["projection"] == "pca" and enc.config()["projection_id"] in printed
    assert printed.startswith("fitted P (127, 384)") and "R (381, 384): the seeded one" in printed
    np.testing.assert_array_equal(enc.R, load_encoder().R)  # what it says: R is not fitted
    assert math.isclose(float(np.linalg.norm(enc.P[0])), 1.0, rel_tol=1e-5)
    with pytest.raises(SystemExit, match="spans only"):  # 2 titles: too few token states for P
        cli.main(["fit-projection", str(corpus), "--out", str(tmp_path / "x"), "--max-docs", "2"])


def test_shipped_pca_of_the_embedded_model(tmp_path):
    from uibk_embedding.encoder.transformer import EMBEDDED_PCA_FILE, embedded_model_path

    enc = load_encoder(projection="pca", show_progress=False)
    with np.load(EMBEDDED_PCA_FILE) as z:
        np.testing.assert_array_equal(enc.R, z["R"])
        np.testing.assert_array_equal(enc.P, z["P"])
    assert _orthonormal_rows(enc.R, 1e-5) and _orthonormal_rows(enc.P, 1e-5)
    np.testing.assert_array_equal(enc.R, load_encoder(projection="random").R)  # R: the seeded one
    assert enc.format.projection.startswith(f"pca-{projection_id(enc.R, enc.P)}@")
    default = load_encoder(show_progress=False)  # since 0.3.0 the seeded one again (as in 0.1.0)
    assert default.format.projection == load_encoder(seed=0).format.projection
    assert default.format.projection.startswith("random-") and "projection_id" not in default.config()
    cfg = enc.config()
    assert cfg["projection"] == "pca" and cfg["projection_id"] == projection_id(enc.R, enc.P)
    enc.save_projections(tmp_path)
    again = load_encoder(tmp_path)
    assert again.config() == cfg
    text = ["pressure distribution on a cone in hypersonic flow"]
    np.testing.assert_array_equal(again.encode_documents(text)[0], enc.encode_documents(text)[0])
    with pytest.raises(ValueError, match="no PCA projection is shipped"):
        load_encoder(embedded_model_path(), projection="pca")
    with pytest.raises(ValueError, match="projection must be 'random' or 'pca'"):
        load_encoder(projection="whitened")


def test_cli_projection_option():
    from uibk_embedding.apps import cli

    args = cli.build_parser().parse_args(["eval", "somewhere", "--projection", "pca"])
    assert cli._load_encoder(args).config()["projection"] == "pca"
    args = cli.build_parser().parse_args(["search", "a query", "--path", "x"])
    assert "projection" not in cli._load_encoder(args).config()  # seeded: the default since 0.3.0
    args = cli.build_parser().parse_args(["search", "a query", "--projection", "random"])
    assert "projection" not in cli._load_encoder(args).config()
