"""The fixed projections of a tagged encoder, held, replaced, declared and saved.

A tagged encoder reduces its sentence vector with ``R`` (381 x D, three 127-d slices) and each
token state with ``P`` (127 x d). :class:`FixedProjections` is the part of
:class:`~uibk_embedding.encoder.base.TaggedEncoder` that owns them: drawn from a seed or given,
refitted by PCA (:meth:`FixedProjections.fit_projection`, see
:mod:`uibk_embedding.encoder.projection`), declared in the encoder's format (what a store
records and checks) and saved beside the encoder's configuration.

>>> check_projection_kind("pca")
'pca'
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Self

import numpy as np

from uibk_embedding._durable import atomic_savez, atomic_write_text
from uibk_embedding.encoder.projection import fit_pca_projections, projection_id
from uibk_embedding.tagged import BODY, N_SLOTS, TaggedFormat, orthonormal_rows

CONFIG_NAME = "uibk_encoder.json"
PROJECTIONS_NAME = "projections.npz"


def check_projection_kind(kind: str) -> str:
    """``kind`` if it names a kind of projection (``"random"`` or ``"pca"``), else a ValueError."""
    if kind not in ("random", "pca"):
        raise ValueError(f"projection must be 'random' or 'pca', got {kind!r}")
    return kind


def seeded_projections(dense_dim: int, token_dim: int, seed: int) -> dict[str, np.ndarray]:
    """The random projections drawn from ``seed``: ``R`` from ``seed``, ``P`` from ``seed + 1``.

    Drawn once per ``(dense_dim, token_dim, seed)`` and shared read-only (an orthonormalisation
    took 0.4-2.7 s per encoder load on a loaded 2-core machine).

    >>> p = seeded_projections(384, 384, 0)
    >>> p["R"].shape, p["P"].shape, p["R"].flags.writeable
    ((381, 384), (127, 384), False)
    """
    r, p = _seeded(dense_dim, token_dim, seed)
    return {"R": r, "P": p}


@functools.lru_cache(maxsize=8)
def _seeded(dense_dim: int, token_dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    # Two small QR factorisations (~10 ms on one thread). On threads they stalled for 0.7-1.7 s
    # here when other processes held the cores (BLAS threads wait on each other), so one thread;
    # the float32 matrices were the same bit for bit either way (tests/test_encoder_startup.py).
    with _one_blas_thread():
        r = orthonormal_rows(N_SLOTS * BODY, dense_dim, seed)
        p = orthonormal_rows(BODY, token_dim, seed + 1)
    r.setflags(write=False)
    p.setflags(write=False)
    return r, p


def _one_blas_thread() -> Any:
    """A context in which numpy's BLAS runs on one thread (``threadpoolctl``; without it, as is)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a core dependency
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


class FixedProjections:
    """The projections part of a tagged encoder (a mixin of
    :class:`~uibk_embedding.encoder.base.TaggedEncoder`, which calls
    :meth:`_init_projections` first thing).

    Attributes: ``R`` and ``P`` (float32), ``seed``, ``projection`` (``"random"`` or ``"pca"``),
    and ``format``, whose ``projection`` names the matrices in use.
    """

    format: TaggedFormat
    R: np.ndarray
    P: np.ndarray
    seed: int
    projection: str
    _lock: threading.Lock
    _device_consts: dict[str, Any]
    config: Callable[[], dict[str, Any]]  # the encoder's configuration (TaggedEncoder.config)
    _model_id: str | None = None
    """A short content hash of the model the encoder runs, set by each encoder before its
    projections: declared beside them, since two models of one width share seeded projections."""

    def _init_projections(self, dense_dim: int, token_dim: int, projections: dict[str, np.ndarray] | None,
                          seed: int, projection: str) -> None:
        if projections is None:
            projections = seeded_projections(dense_dim, token_dim, seed)
        self.R = np.asarray(projections["R"], dtype=np.float32)
        self.P = np.asarray(projections["P"], dtype=np.float32)
        if self.R.shape != (N_SLOTS * BODY, dense_dim) or self.P.shape != (BODY, token_dim):
            raise ValueError(
                f"projection shapes {self.R.shape} / {self.P.shape} do not fit dense_dim="
                f"{dense_dim} / token_dim={token_dim}"
            )
        self.seed = seed
        self.projection = check_projection_kind(projection)
        self._declare_projection()

    def _projection_config(self) -> dict[str, Any]:
        """What :meth:`config` adds for a fitted projection: ``projection`` and ``projection_id``
        (a content hash of ``R`` and ``P``), so it can never be mistaken for the seeded one (the
        configuration of a seeded encoder has neither, and so the eval cache keys made from it
        are unchanged)."""
        if self.projection == "random":
            return {}
        return {"projection": self.projection, "projection_id": projection_id(self.R, self.P)}

    def fit_projection(self, texts: Sequence[str], *, fit_dense: bool = False,
                       max_token_rows: int = 200_000) -> Self:
        """Replace the random token projection ``P`` (and ``R`` with ``fit_dense=True``) by a
        PCA fitted on ``texts`` (read as documents; see
        :mod:`uibk_embedding.encoder.projection`) and return ``self``.

        Deterministic for given texts. Lists encoded before the fit do not match lists encoded
        after it: fit first, then :meth:`save_projections` and use that folder on both sides.

        >>> from uibk_embedding.encoder import load_encoder
        >>> enc = load_encoder()
        >>> texts = [f"report {i} on the lift of wing {i % 7} at Mach {i % 5}" for i in range(400)]
        >>> enc.fit_projection(texts).config()["projection"]
        'pca'
        """
        fitted = fit_pca_projections(self, texts, fit_dense=fit_dense, max_token_rows=max_token_rows)
        self.set_projections(fitted, "pca")
        return self

    def set_projections(self, projections: dict[str, np.ndarray], kind: str) -> None:
        """Use other fixed matrices ``R`` and ``P`` (same shapes) from now on."""
        R = np.asarray(projections["R"], dtype=np.float32)
        P = np.asarray(projections["P"], dtype=np.float32)
        if R.shape != self.R.shape or P.shape != self.P.shape:
            raise ValueError(f"projection shapes {R.shape} / {P.shape} do not fit this encoder's "
                             f"{self.R.shape} / {self.P.shape}")
        with self._lock:
            self.R, self.P = R, P
            self.projection = check_projection_kind(kind)
            self._declare_projection()
            self._device_consts = {}

    def _declare_projection(self) -> None:
        """Put the lists' identity (``"<kind>-<content hash of R and P>@<content hash of the
        model>"``) into ``self.format``: what a store records and checks
        (:meth:`TaggedFormat.conflict`). The seeded projections depend only on the widths and the
        seed, so the model's hash is what tells two models of one width apart."""
        ident = f"{self.projection}-{projection_id(self.R, self.P)}"
        if self._model_id:
            ident += f"@{self._model_id}"
        self.format = replace(self.format, projection=ident)

    def save_projections(self, path: str | os.PathLike) -> None:
        """Write ``R`` and ``P`` (``projections.npz``) and :meth:`config` (``uibk_encoder.json``)
        into the folder ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        # atomic: a crash leaves the old file or the new one (a cut-short .npz could not be read)
        atomic_savez(path / PROJECTIONS_NAME, R=self.R, P=self.P)
        atomic_write_text(path / CONFIG_NAME, json.dumps(self.config(), indent=2))


__all__ = ["CONFIG_NAME", "PROJECTIONS_NAME", "FixedProjections", "check_projection_kind",
           "seeded_projections"]
