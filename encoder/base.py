"""The encoder protocol and the machinery every tagged encoder shares.

An encoder turns texts into tagged lists (``float32``, ``(n_i, 128)``, unit rows except
query slots, which carry the query-time dense weight ``w``)::

    encoder.encode_queries(texts, dense_weight=None)  -> list[np.ndarray]
    encoder.encode_documents(texts)                    -> list[np.ndarray]

:class:`TaggedEncoder` implements both on top of one method that subclasses provide,
``_embed(texts, is_query)``, returning for each text its dense sentence vector and its token
vectors; it applies the fixed projections ``R`` (dense -> 3 x 127) and ``P`` (tokens -> 127),
the caps of DESIGN 1.1 and the tagged construction.
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from uibk_embedding.encoder.tagged import BODY, N_SLOTS, TaggedFormat, orthonormal_rows

CONFIG_NAME = "uibk_encoder.json"
PROJECTIONS_NAME = "projections.npz"


@runtime_checkable
class Encoder(Protocol):
    """What stores, the CLI and the framework integrations need from an encoder."""

    format: TaggedFormat

    def encode_queries(
        self, texts: Sequence[str], *, dense_weight: float | None = None, **kw: Any
    ) -> list[np.ndarray]: ...

    def encode_documents(self, texts: Sequence[str], **kw: Any) -> list[np.ndarray]: ...


def validate_texts(texts: Sequence[str], what: str = "texts") -> list[str]:
    """Texts must be a list of non-empty strings.

    >>> validate_texts(["a", "b"])
    ['a', 'b']
    >>> validate_texts(["a", "  "])
    Traceback (most recent call last):
    ...
    ValueError: texts[1] is empty or whitespace only; there is nothing to encode
    """
    if isinstance(texts, str | bytes):
        raise TypeError(f"{what} must be a list of strings, not a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"{what}[{i}] must be a str, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"{what}[{i}] is empty or whitespace only; there is nothing to encode")
    return out


def resolve_device(device: str | None = None) -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"`` (or the device asked for)."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class TaggedEncoder:
    """Base of the encoders that build tagged lists from a dense vector + token vectors.

    Parameters
    ----------
    dense_dim, token_dim: sizes of the model's sentence vector and token vectors.
    format: the tagged format (beta, lambda).
    seed: seed of the fixed projections ``R`` (381 x dense_dim) and ``P`` (127 x token_dim);
        ignored when ``projections`` (a dict with arrays ``R`` and ``P``) is given.
    dense_weight: default query-time dense weight ``w`` (DESIGN 1.4).
    query_token_cap: query tokens that take part in token matching (64).
    query_max_length: tokens the dense head reads of a query (256).
    doc_max_length: tokens read of a document (2048, or the model's maximum if lower).
    """

    kind = "abstract"

    def __init__(
        self,
        dense_dim: int,
        token_dim: int,
        *,
        format: TaggedFormat | None = None,
        seed: int = 0,
        projections: dict[str, np.ndarray] | None = None,
        dense_weight: float = 1.0,
        query_token_cap: int = 64,
        query_max_length: int = 256,
        doc_max_length: int = 2048,
        batch_tokens: int = 16384,
        show_progress: bool | None = None,
    ) -> None:
        self.format = format or TaggedFormat()
        if projections is None:
            projections = {
                "R": orthonormal_rows(N_SLOTS * BODY, dense_dim, seed),
                "P": orthonormal_rows(BODY, token_dim, seed + 1),
            }
        self.R = np.asarray(projections["R"], dtype=np.float32)
        self.P = np.asarray(projections["P"], dtype=np.float32)
        if self.R.shape != (N_SLOTS * BODY, dense_dim) or self.P.shape != (BODY, token_dim):
            raise ValueError(
                f"projection shapes {self.R.shape} / {self.P.shape} do not fit dense_dim="
                f"{dense_dim} / token_dim={token_dim}"
            )
        self.seed = seed
        self._check_weight(dense_weight)
        self.dense_weight = float(dense_weight)
        if query_token_cap < 1 or query_max_length < 2 or doc_max_length < 2:
            raise ValueError("token caps and lengths must be positive")
        self.query_token_cap = int(query_token_cap)
        self.query_max_length = int(query_max_length)
        self.doc_max_length = int(doc_max_length)
        self.batch_tokens = int(batch_tokens)
        self.show_progress = show_progress
        self._lock = threading.Lock()
        self._tls = threading.local()

    @staticmethod
    def _check_weight(w: float) -> None:
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"dense_weight must be a positive finite number, got {w!r}")

    # -- subclasses ------------------------------------------------------------------------
    def _embed(
        self, texts: list[str], is_query: bool
    ) -> list[tuple[np.ndarray, np.ndarray]]:  # pragma: no cover - abstract
        """For each text: (dense sentence vector (dense_dim,), token vectors (n, token_dim))."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """What :func:`~uibk_embedding.encoder.load_encoder` needs to rebuild this encoder."""
        return {
            "kind": self.kind,
            "format": self.format.to_dict(),
            "seed": self.seed,
            "dense_weight": self.dense_weight,
            "query_token_cap": self.query_token_cap,
            "query_max_length": self.query_max_length,
            "doc_max_length": self.doc_max_length,
        }

    # -- the protocol ------------------------------------------------------------------------
    def encode_queries(
        self,
        texts: Sequence[str],
        *,
        dense_weight: float | None = None,
        show_progress: bool | None = None,
    ) -> list[np.ndarray]:
        """Tagged query lists: 3 slots scaled by ``dense_weight`` then <= 64 token vectors."""
        w = self.dense_weight if dense_weight is None else dense_weight
        self._check_weight(w)
        texts = validate_texts(texts)
        return self._encode(texts, True, w, show_progress)

    def encode_documents(
        self, texts: Sequence[str], *, show_progress: bool | None = None
    ) -> list[np.ndarray]:
        """Tagged document lists: 3 unit slots then one vector per token read."""
        texts = validate_texts(texts)
        return self._encode(texts, False, 1.0, show_progress)

    def encode_documents_iter(
        self, texts: Iterable[str], *, chunk_size: int = 1024
    ) -> Iterator[np.ndarray]:
        """Stream over any iterable of texts, ``chunk_size`` at a time (bounded memory)."""
        chunk: list[str] = []
        for t in texts:
            chunk.append(t)
            if len(chunk) >= chunk_size:
                yield from self.encode_documents(chunk)
                chunk = []
        if chunk:
            yield from self.encode_documents(chunk)

    def _encode(
        self, texts: list[str], is_query: bool, w: float, show_progress: bool | None
    ) -> list[np.ndarray]:
        if not texts:
            return []
        from tqdm.auto import tqdm

        progress = self.show_progress if show_progress is None else show_progress
        # True: always; False: never; None: on a terminal, for long jobs only
        disable = {True: False, False: True}.get(progress, None if len(texts) >= 256 else True)
        order = self._length_order(texts)
        out: list[np.ndarray | None] = [None] * len(texts)
        desc = "encoding queries" if is_query else "encoding documents"
        bar = tqdm(total=len(texts), desc=desc, unit="text", disable=disable)
        self._tls.truncated = 0
        try:
            for batch in self._batches(texts, order, is_query):
                with self._lock:
                    embedded = self._embed([texts[i] for i in batch], is_query)
                for i, (g, toks) in zip(batch, embedded, strict=True):
                    out[i] = self._tag(g, toks, is_query, w)
                bar.update(len(batch))
        finally:
            bar.close()
        limit = self.query_max_length if is_query else self.doc_max_length
        warn_truncated(self._tls.truncated, len(texts), limit, "queries" if is_query else "documents")
        return out  # type: ignore[return-value]

    def _note_truncated(self, n: int) -> None:
        """Subclasses report texts cut at the length limit; one warning per call follows."""
        self._tls.truncated = getattr(self._tls, "truncated", 0) + n

    def _tag(self, g: np.ndarray, toks: np.ndarray, is_query: bool, w: float) -> np.ndarray:
        if is_query:
            toks = toks[: self.query_token_cap]
        slices = self.format.split(g, self.R)
        u = np.asarray(toks, dtype=np.float32) @ self.P.T
        return self.format.build(slices, u, dense_weight=w)

    # -- batching ----------------------------------------------------------------------------
    def _length_order(self, texts: list[str]) -> list[int]:
        return sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)

    def _batches(self, texts: list[str], order: list[int], is_query: bool) -> Iterator[list[int]]:
        """Batches of similar length whose padded size stays within ``batch_tokens``."""
        max_len = self.query_max_length if is_query else self.doc_max_length
        batch: list[int] = []
        longest = 0
        for i in order:
            est = min(max_len, len(texts[i]) // 3 + 8)  # cheap upper-ish token estimate
            longest = max(longest, est)
            if batch and longest * (len(batch) + 1) > self.batch_tokens:
                yield batch
                batch, longest = [], est
            batch.append(i)
        if batch:
            yield batch

    # -- persistence -------------------------------------------------------------------------
    def save_projections(self, path: str | os.PathLike) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        np.savez(path / PROJECTIONS_NAME, R=self.R, P=self.P)
        (path / CONFIG_NAME).write_text(json.dumps(self.config(), indent=2))


def warn_truncated(n: int, total: int, limit: int, what: str) -> None:
    """One warning per call naming how many texts were cut (not one per text)."""
    if n:
        warnings.warn(
            f"{n} of {total} {what} were longer than {limit} tokens and were truncated",
            stacklevel=5,
        )
