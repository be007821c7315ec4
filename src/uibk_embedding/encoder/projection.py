"""The fixed projections ``R`` and ``P``: random (from a seed) or fitted by PCA.

A tagged encoder reduces two things to the 127-d bodies of the tagged format (docs/format.md#constants):

* ``R`` (381 x D): the sentence vector ``g`` into three 127-d slices, one per slot;
* ``P`` (127 x d): each contextual token state into a 127-d token direction.

Both are fixed matrices with orthonormal rows, saved with the encoder. By default they are
drawn from a seed (:func:`~uibk_embedding.tagged.orthonormal_rows`). This module
offers the alternative of fitting them once by PCA on a sample of texts
(:func:`fit_pca_projections`, :meth:`TaggedEncoder.fit_projection
<uibk_embedding.encoder.base.TaggedEncoder.fit_projection>`, ``uibk-embed fit-projection``):

* ``P`` = the top 127 principal directions of the sample's token states (uncentred: the
  directions that keep the most of ``h . h'``, the quantity MaxSim compares);
* ``R`` (only on request, ``fit_dense=True``) = the top ``min(381, D)`` principal directions of
  the sentence vectors, dealt to the three slots in turn (component ``k`` goes to slot
  ``k mod 3``), so every slot gets a balanced share of the variance. For MiniLM (D = 384) this
  drops the 3 weakest directions instead of 3 random ones. Measured, it does not help the dense
  head and breaks slot alignment far more often, so by default ``R`` stays the seeded one.

The fit is deterministic (an SVD of the sample's second-moment matrix with a sign fix) and
depends only on the texts given; the encoder's output then depends on that sample, so fit once,
save the encoder (``save_projections``) and load that folder on the query and the document side.

It also gives the heads *before* the projections (:func:`encode_heads`) and the tagged lists
from them (:func:`tagged_from_heads`), so that several projections can be compared on one
forward pass (``benchmarks/projection_eval.py``).

Example
-------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(500, 384)) * np.linspace(3, 0.1, 384)  # decreasing variance
>>> R = pca_rows(X, 381, interleave=3)
>>> bool(np.allclose(R @ R.T, np.eye(381), atol=1e-6)), R.shape
(True, (381, 384))
>>> bool(np.allclose(pca_rows(X, 381, interleave=3), R))  # deterministic
True
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.encoder.inputs import validate_texts
from uibk_embedding.tagged import (
    BODY,
    DIM,
    N_SLOTS,
    TaggedFormat,
    apply_dense_weight,
    check_dense_weight,
)

PROJECTION_KINDS = ("random", "pca")
DEFAULT_MAX_TOKEN_ROWS = 200_000


def projection_id(R: np.ndarray, P: np.ndarray) -> str:
    """A short content hash of the two float32 matrices: the identity of a projection.

    >>> projection_id(np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32))[:8]
    '628862c4'
    """
    h = hashlib.sha256()
    for m in (R, P):
        a = np.ascontiguousarray(m, dtype=np.float32)
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def _principal_directions(X: np.ndarray) -> np.ndarray:
    """All principal directions of the rows of ``X`` (uncentred), strongest first, as the
    rows of a ``(k, D)`` matrix, ``k = min(n, D)``; the sign of each is fixed so that its
    largest-magnitude coordinate is positive (the SVD alone leaves it free)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or len(X) == 0:
        raise ValueError(f"need a non-empty (n, D) sample, got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("the sample holds NaN or infinite values")
    # eigenvectors of the D x D second moment: same directions as the SVD of X, but memory
    # and time do not grow with n beyond one pass
    m = X.T @ X
    evals, evecs = np.linalg.eigh(m)
    order = np.argsort(evals)[::-1]
    rank = int(np.sum(evals > evals.max() * 1e-10)) if evals.max() > 0 else 0
    V = evecs[:, order].T  # rows: directions, strongest first
    V = V[: max(rank, 0)]
    big = np.argmax(np.abs(V), axis=1)
    V *= np.sign(V[np.arange(len(V)), big])[:, None]
    return V


def pca_rows(X: np.ndarray, n_rows: int, *, interleave: int = 1) -> np.ndarray:
    """An ``(n_rows, D)`` matrix of the top principal directions of the rows of ``X``.

    Rows are orthonormal when ``n_rows <= D``; when ``n_rows > D`` the ``D`` columns are
    orthonormal instead (every direction is kept, the other rows are zero). With
    ``interleave = s`` the rows form ``s`` equal blocks and direction ``k`` goes to block
    ``k mod s`` (the three slot slices of ``R``). The sample must have at least
    ``min(n_rows, D)`` linearly independent rows (a direction fitted on too few rows would be
    arbitrary).

    >>> X = np.diag([3.0, 2.0, 1.0])
    >>> pca_rows(X, 2).tolist()
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    >>> pca_rows(X, 4, interleave=2).tolist()  # blocks of 2 rows: directions 0, 2 | 1, -
    [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    """
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"need an (n, D) sample, got shape {X.shape}")
    d = X.shape[1]
    if n_rows < 1 or interleave < 1 or n_rows % interleave:
        raise ValueError(f"n_rows={n_rows} must be a positive multiple of interleave={interleave}")
    V = _principal_directions(X)
    need = min(n_rows, d)
    if len(V) < need:
        raise ValueError(
            f"the sample spans only {len(V)} directions; {need} are needed for a {n_rows} x {d} "
            "projection: fit on more (or more varied) texts")
    block = n_rows // interleave
    out = np.zeros((n_rows, d), dtype=np.float64)
    for k in range(need):
        out[(k % interleave) * block + k // interleave] = V[k]
    return out


def _sample_rows(states: Sequence[np.ndarray], max_rows: int) -> np.ndarray:
    """All token rows, or ``max_rows`` of them taken at even strides (deterministic)."""
    total = sum(len(s) for s in states)
    mat = np.concatenate([np.asarray(s, dtype=np.float32) for s in states]) if total else None
    if mat is None:
        raise ValueError("the texts gave no token vectors to fit P on")
    if total > max_rows:
        mat = mat[np.linspace(0, total - 1, max_rows).round().astype(np.int64)]
    return mat


def pca_from_heads(dense: np.ndarray | None, tokens: Sequence[np.ndarray], *,
                   max_token_rows: int = DEFAULT_MAX_TOKEN_ROWS) -> dict[str, np.ndarray]:
    """``P`` (and ``R`` when sentence vectors ``dense`` ``(n, D)`` are given) by PCA from token
    states (lists of ``(n_i, d)``), as float32.

    >>> rng = np.random.default_rng(1)
    >>> pr = pca_from_heads(rng.normal(size=(400, 384)), [rng.normal(size=(200, 384))])
    >>> pr["R"].shape, pr["P"].shape
    ((381, 384), (127, 384))
    """
    out = {"P": pca_rows(_sample_rows(tokens, max_token_rows), BODY).astype(np.float32)}
    if dense is not None:
        out["R"] = pca_rows(np.asarray(dense), N_SLOTS * BODY, interleave=N_SLOTS).astype(np.float32)
    return out


def encode_heads(encoder: Any, texts: Sequence[str], *, is_query: bool = False
                 ) -> tuple[np.ndarray, list[np.ndarray]]:
    """The two heads of every text *before* ``R`` and ``P``: the sentence vectors
    ``(n, D)`` float32 and, per text, the token states ``(n_i, d)`` float32 of exactly the
    positions the encoder turns into token vectors (the query cap applied). Same tokenizer,
    length limits and batches as ``encode_queries`` / ``encode_documents``, so
    ``tagged_from_heads(*encode_heads(enc, texts), enc.R, enc.P, enc.format)`` is what the
    encoder returns, up to float32 rounding.
    """
    import torch

    texts = validate_texts(texts)
    n = len(texts)
    dense: np.ndarray | None = None
    toks: list[np.ndarray | None] = [None] * n
    for batch in encoder._batches(texts, encoder._length_order(texts), is_query):
        tb = encoder._tokenize([texts[i] for i in batch], is_query)
        starts = np.asarray(tb.starts, dtype=np.int64)
        ends = np.asarray(tb.ends, dtype=np.int64)
        if is_query:
            ends = np.minimum(ends, starts + encoder.query_token_cap)
        with encoder._lock, torch.inference_mode():
            g, states = encoder._forward(encoder._to_device(tb.inputs))
            g = g.float().cpu().numpy()
            states = states.float().cpu().numpy()
        if dense is None:
            dense = np.empty((n, g.shape[1]), dtype=np.float32)
        for j, i in enumerate(batch):
            dense[i] = g[j]
            toks[i] = states[j, starts[j]:max(starts[j], ends[j])].copy()
    assert dense is not None
    return dense, toks  # type: ignore[return-value]


def tagged_from_heads(dense: np.ndarray, tokens: Sequence[np.ndarray], R: np.ndarray,
                      P: np.ndarray, fmt: TaggedFormat | None = None,
                      dense_weight: float = 1.0) -> list[np.ndarray]:
    """Tagged lists from the heads, with the arithmetic of the encoder's pipeline
    (``R g`` in float64, ``P h`` in float32, normalisation in float64, float32 out).

    >>> rng = np.random.default_rng(2)
    >>> lists = tagged_from_heads(rng.normal(size=(2, 384)), [rng.normal(size=(4, 384))] * 2,
    ...                           np.eye(381, 384), np.eye(127, 384))
    >>> lists[0].shape, bool(np.allclose(np.linalg.norm(lists[0], axis=1), 1, atol=1e-6))
    ((7, 128), True)
    """
    fmt = fmt or TaggedFormat()
    w = check_dense_weight(dense_weight)
    g = np.asarray(dense, dtype=np.float64)
    z = (g @ np.asarray(R, dtype=np.float32).astype(np.float64).T).reshape(len(g), N_SLOTS, BODY)
    slots = fmt.write_slots(np.empty((len(g), N_SLOTS, DIM)), z, np.linalg.norm(z, axis=-1, keepdims=True))
    apply_dense_weight(slots, w)
    lengths = [len(t) for t in tokens]
    P32 = np.asarray(P, dtype=np.float32)
    if sum(lengths):
        h = np.concatenate([np.asarray(t, dtype=np.float32) for t in tokens if len(t)])
        u = (h @ P32.T).astype(np.float64)
        toks = fmt.write_tokens(np.empty((len(u), DIM)), u, np.linalg.norm(u, axis=-1, keepdims=True))
    else:
        toks = np.zeros((0, DIM))
    out: list[np.ndarray] = []
    pos = 0
    for i, m in enumerate(lengths):
        a = np.empty((N_SLOTS + m, DIM), dtype=np.float32)
        a[:N_SLOTS] = slots[i]
        a[N_SLOTS:] = toks[pos:pos + m]
        pos += m
        out.append(a)
    return out


def read_saved_projections(folder: str | os.PathLike, cfg: dict[str, Any]
                           ) -> dict[str, np.ndarray] | None:
    """The matrices of a saved encoder whose configuration ``cfg`` names a fitted projection
    (``None`` for a seeded one: it is redrawn from its seed). A missing file raises
    ``FileNotFoundError``; one that does not hold exactly the matrices the configuration's
    ``projection_id`` names, a ``ValueError`` naming the file: an encoder never silently runs with
    other matrices than it was saved with.
    """
    kind = cfg.get("projection", "random")
    if kind == "random":
        return None
    if kind not in PROJECTION_KINDS:
        raise ValueError(f"{folder}: unknown projection {kind!r} (known: {PROJECTION_KINDS})")
    path = Path(folder) / "projections.npz"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the encoder was saved with a {kind} projection")
    out = load_projections(path)
    want = cfg.get("projection_id")
    got = projection_id(out["R"], out["P"])
    if want is not None and got != want:
        raise ValueError(f"{path} holds projection {got}, but the encoder was saved with {want}")
    return out


def load_projections(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """``R`` and ``P`` (float32) from a ``projections.npz``; a file that is not one (damaged,
    cut short by a crash during a save of an older version) is a ``ValueError`` naming it.

    >>> import tempfile, pathlib
    >>> bad = pathlib.Path(tempfile.mkdtemp()) / "projections.npz"
    >>> _ = bad.write_bytes(b"PK\x03\x04 cut short")
    >>> load_projections(bad)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: .../projections.npz is not a readable projections file (...): ...
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            if "R" not in z or "P" not in z:
                raise ValueError(f"{path} must hold arrays R and P")
            return {"R": z["R"].astype(np.float32), "P": z["P"].astype(np.float32)}
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise ValueError(f"{path} is not a readable projections file ({type(e).__name__}: {e}): save "
                         "the encoder again (fit-projection, index --fit-projection) or restore the "
                         "file") from None


def refuse_other_kind(folder: str | os.PathLike, saved: str, options: dict[str, Any]) -> None:
    """A ``projection=`` option that contradicts the fitted projection a saved folder holds is
    refused: the encoder would run the folder's matrices under the other kind's name (stores
    keep its lists under that name).

    >>> refuse_other_kind("enc", "pca", {"projection": "random"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: enc holds a fitted pca projection; projection='random' cannot replace it: ...
    """
    want = options.get("projection")
    if want is not None and want != saved:
        raise ValueError(f"{folder} holds a fitted {saved} projection; projection={want!r} cannot replace "
                         "it: load the model folder itself for the seeded one (or leave projection= out)")


def fit_pca_projections(encoder: Any, texts: Sequence[str], *, fit_dense: bool = False,
                        max_token_rows: int = DEFAULT_MAX_TOKEN_ROWS) -> dict[str, np.ndarray]:
    """``P`` fitted by PCA on ``texts`` read as documents (one forward pass); ``R`` too with
    ``fit_dense=True``, else the encoder's own ``R`` (its seeded random matrix).

    ``R`` is left random by default: fitted, it does not move the dense head's nDCG@10 (the
    sentence vector keeps 381 of its 384 directions either way) and the slot alignment of
    docs/format.md#identity (query slot s selects document slot s) fails far more often, because the first
    principal directions carry the mean of the sentence vectors, which every slot then shares
    (docs/model.md, "Fitted projections"). Needs enough token states for ``P`` (and at least
    ``min(381, D)`` texts for ``R``); a few thousand passages of the kind you index is a good
    sample. ``max_token_rows``: token states used for ``P`` (evenly spaced over the sample).
    """
    texts = list(texts)
    if not texts:
        raise ValueError("fit_projection needs texts to fit on (read as documents), got none")
    dense, tokens = encode_heads(encoder, texts, is_query=False)
    out = pca_from_heads(dense if fit_dense else None, tokens, max_token_rows=max_token_rows)
    out.setdefault("R", np.asarray(encoder.R, dtype=np.float32))
    return out


__all__ = [
    "PROJECTION_KINDS",
    "encode_heads",
    "fit_pca_projections",
    "pca_from_heads",
    "pca_rows",
    "projection_id",
    "read_saved_projections",
    "tagged_from_heads",
]
