"""The encoder protocol and the machinery every tagged encoder shares.

An encoder turns texts into tagged lists (``float32``, ``(n_i, 128)``, unit rows except
query slots, which carry the query-time dense weight ``w``)::

    encoder.encode_queries(texts, dense_weight=None)  -> list[np.ndarray]
    encoder.encode_documents(texts)                    -> list[np.ndarray]

:class:`TaggedEncoder` implements both on top of one method that subclasses provide:

* ``_tokenize(texts, is_query) -> TokenBatch``: the padded model inputs of one batch, built on
  the CPU with the ``tokenizers`` fast path (no per-token Python), and where each text's token
  vectors sit in the model's output;
* ``_forward(inputs) -> (dense, states)``: one forward pass, both heads, on the model's device.

The pipeline is the same for every encoder, on CPU and GPU (:meth:`TaggedEncoder._tagged_batches`):
a background thread tokenises batch ``i + 1`` while batch ``i`` runs (a bounded prefetch queue);
the tagged lists of a whole padded batch are built on the model's device in a few tensor
operations (the fixed projections ``R``: dense -> 3 x 127 and ``P``: tokens -> 127, the
normalisation, the tag column, the query slots scaled by the dense weight, the caps of
docs/format.md#constants); then ONE device-to-host copy per batch (pinned memory, non-blocking, on CUDA) and
one split into documents. The lists of one batch are views of one float32 array.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from uibk_embedding.encoder.tagged import BODY, DIM, N_SLOTS, TaggedFormat, orthonormal_rows

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


@dataclass
class TokenBatch:
    """One padded batch of tokenised texts: what ``_tokenize`` returns and ``_forward`` reads.

    Attributes
    ----------
    inputs: model inputs, ``(B, T)`` CPU tensors (``input_ids``, ``attention_mask``, ...).
    starts, ends: int64 ``(B,)``; the token vectors of text ``i`` are the model's output
        positions ``starts[i] .. ends[i] - 1`` (before the query cap).
    truncated: bool ``(B,)``, texts cut at the length limit.
    positions: where the texts sit in the caller's list (set by the pipeline).
    """

    inputs: dict[str, Any]
    starts: np.ndarray
    ends: np.ndarray
    truncated: np.ndarray
    positions: list[int] = field(default_factory=list)
    # set by TaggedEncoder._prepare: rows of each tagged list, and the gather/scatter indices
    counts: np.ndarray | None = None
    index: Any = None
    n_tokens: int = 0


def pad_ids(rows: Sequence[Sequence[int]], pad_id: int, offset: int = 0,
            width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded int64 matrix of id rows, starting at column ``offset``, and the lengths.

    One ``fromiter`` over all ids and one masked assignment: no per-token Python loop.

    >>> ids, n = pad_ids([[5, 6, 7], [8]], pad_id=0, offset=1)
    >>> ids.tolist(), n.tolist()
    ([[0, 5, 6, 7], [0, 8, 0, 0]], [3, 1])
    """
    import itertools

    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    total = int(lengths.sum())
    width = int(width if width is not None else offset + (lengths.max() if len(rows) else 0))
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    if total:
        cols = np.arange(width)
        mask = (cols >= offset) & (cols < offset + lengths[:, None])
        out[mask] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=total)
    return out, lengths


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class _Pending:
    """One batch whose tagged rows are on their way to the host."""

    __slots__ = ("batch", "event", "host", "offsets")

    def __init__(self, batch: TokenBatch, host: Any, event: Any, offsets: np.ndarray) -> None:
        self.batch, self.host, self.event, self.offsets = batch, host, event, offsets


class TaggedEncoder:
    """Base of the encoders that build tagged lists from a dense vector + token vectors.

    Parameters
    ----------
    dense_dim, token_dim: sizes of the model's sentence vector and token vectors.
    format: the tagged format (beta, lambda).
    seed: seed of the fixed projections ``R`` (381 x dense_dim) and ``P`` (127 x token_dim);
        ignored when ``projections`` (a dict with arrays ``R`` and ``P``) is given.
    projection: what ``projections`` are, recorded in :meth:`config`: ``"random"`` (drawn from
        ``seed``, the default) or ``"pca"`` (fitted, :meth:`fit_projection`); a non-random
        projection is saved and reloaded from ``projections.npz``, never redrawn.
    dense_weight: default query-time dense weight ``w`` (docs/format.md#composing).
    query_token_cap: query tokens that take part in token matching (64).
    query_max_length: tokens the dense head reads of a query (256).
    doc_max_length: tokens read of a document (2048, or the model's maximum if lower).
    batch_tokens: padded tokens per forward pass.
    prefetch: batches tokenised ahead of the one on the device (a background thread; 0: none).
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
        projection: str = "random",
        dense_weight: float = 1.0,
        query_token_cap: int = 64,
        query_max_length: int = 256,
        doc_max_length: int = 2048,
        batch_tokens: int = 16384,
        show_progress: bool | None = None,
        prefetch: int = 2,
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
        self.projection = _check_projection_kind(projection)
        self._declare_projection()
        self._check_weight(dense_weight)
        self.dense_weight = float(dense_weight)
        if query_token_cap < 1 or query_max_length < 2 or doc_max_length < 2:
            raise ValueError("token caps and lengths must be positive")
        self.query_token_cap = int(query_token_cap)
        self.query_max_length = int(query_max_length)
        self.doc_max_length = int(doc_max_length)
        self.batch_tokens = int(batch_tokens)
        self.show_progress = show_progress
        self.prefetch = max(0, int(prefetch))
        self._lock = threading.Lock()
        self._device_consts: dict[str, Any] = {}

    @staticmethod
    def _check_weight(w: float) -> None:
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"dense_weight must be a positive finite number, got {w!r}")

    # -- subclasses ------------------------------------------------------------------------
    def _tokenize(self, texts: list[str], is_query: bool) -> TokenBatch:  # pragma: no cover
        """Padded model inputs of one batch (CPU), token spans and truncation flags."""
        raise NotImplementedError

    def _forward(self, inputs: dict[str, Any]) -> tuple[Any, Any]:  # pragma: no cover
        """One forward pass on device inputs: (dense ``(B, dense_dim)``, token states
        ``(B, T, token_dim)``), both float32 tensors on the model's device."""
        raise NotImplementedError

    def _embed(self, texts: list[str], is_query: bool) -> list[tuple[np.ndarray, np.ndarray]]:
        """The raw heads of each text, one batch: (dense vector, token vectors before ``P`` and
        before the query cap), as float32 arrays; for inspection and tests, not the pipeline."""
        import torch

        tb = self._tokenize(list(texts), is_query)
        with self._lock, torch.inference_mode():
            g, states = self._forward(self._to_device(tb.inputs))
            g, states = g.float().cpu().numpy(), states.float().cpu().numpy()
        return [(g[i], states[i, a:b]) for i, (a, b) in enumerate(zip(tb.starts, tb.ends, strict=True))]

    def config(self) -> dict[str, Any]:
        """What :func:`~uibk_embedding.encoder.load_encoder` needs to rebuild this encoder.

        A fitted projection adds ``projection`` and ``projection_id`` (a content hash of
        ``R`` and ``P``), so it can never be mistaken for the seeded one (the configuration of
        a seeded encoder is unchanged, and so are the eval cache keys made from it).
        """
        cfg = {
            "kind": self.kind,
            "format": self.format.to_dict(),
            "seed": self.seed,
            "dense_weight": self.dense_weight,
            "query_token_cap": self.query_token_cap,
            "query_max_length": self.query_max_length,
            "doc_max_length": self.doc_max_length,
        }
        if self.projection != "random":
            from uibk_embedding.encoder.projection import projection_id

            cfg["projection"] = self.projection
            cfg["projection_id"] = projection_id(self.R, self.P)
        return cfg

    def fit_projection(self, texts: Sequence[str], *, fit_dense: bool = False,
                       max_token_rows: int = 200_000) -> TaggedEncoder:
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
        from uibk_embedding.encoder.projection import fit_pca_projections

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
            self.projection = _check_projection_kind(kind)
            self._declare_projection()
            self._device_consts = {}

    def _declare_projection(self) -> None:
        """Put the projection's identity (``"<kind>-<content hash of R and P>"``) into
        ``self.format``: what a store records and checks (:meth:`TaggedFormat.conflict`)."""
        from uibk_embedding.encoder.projection import projection_id

        self.format = replace(self.format, projection=f"{self.projection}-{projection_id(self.R, self.P)}")

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
        out: list[np.ndarray | None] = [None] * len(texts)
        desc = "encoding queries" if is_query else "encoding documents"
        truncated = 0
        with tqdm(total=len(texts), desc=desc, unit="text", disable=disable) as bar:
            for positions, arrays, cut in self._tagged_batches(texts, is_query, w):
                for i, a in zip(positions, arrays, strict=True):
                    out[i] = a
                truncated += int(cut.sum())
                bar.update(len(positions))
        limit = self.query_max_length if is_query else self.doc_max_length
        warn_truncated(truncated, len(texts), limit, "queries" if is_query else "documents")
        return out  # type: ignore[return-value]

    # -- the pipeline --------------------------------------------------------------------------
    def _tagged_batches(
        self, texts: list[str], is_query: bool, weights: float | np.ndarray,
    ) -> Iterator[tuple[list[int], list[np.ndarray], np.ndarray]]:
        """Tagged lists of ``texts``, one batch at a time: (positions in ``texts``, their
        lists, their truncation flags). ``weights``: the query dense weight, one for all texts
        or one per text (the shared encoder merges requests with different weights).

        Batches are tokenised ahead in a background thread; each batch runs on the device (model
        + tagged construction) while the previous one is copied out and split.
        """
        batches = list(self._batches(texts, self._length_order(texts), is_query))
        per_text = np.ndim(weights) > 0
        pending: _Pending | None = None
        for tb in self._prefetched(texts, batches, is_query):
            w = np.asarray(weights, dtype=np.float64)[tb.positions] if per_text else float(weights)
            launched = self._launch(tb, w)
            if pending is not None:
                yield self._finish(pending)
            pending = launched
        if pending is not None:
            yield self._finish(pending)

    def _prefetched(self, texts: list[str], batches: list[list[int]],
                    is_query: bool) -> Iterator[TokenBatch]:
        """Tokenised batches in order; from a background thread when there are several."""

        def make(batch: list[int]) -> TokenBatch:
            tb = self._tokenize([texts[i] for i in batch], is_query)
            tb.positions = batch
            return self._prepare(tb, is_query)

        if len(batches) <= 1 or self.prefetch == 0:
            for batch in batches:
                yield make(batch)
            return
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item: object) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for batch in batches:
                    if not put(make(batch)):
                        return
            except BaseException as e:  # handed to the consumer, raised there
                put(_Failed(e))
                return
            put(_DONE)

        worker = threading.Thread(target=work, name="uibk-tokenize", daemon=True)
        worker.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failed):
                    raise item.error
                yield item
        finally:
            stop.set()
            worker.join()

    def _prepare(self, tb: TokenBatch, is_query: bool) -> TokenBatch:
        """Query cap, rows per list and the gather/scatter indices of the tagged construction
        (host side, vectorised), pinned for a non-blocking copy when the model is on CUDA."""
        import torch

        starts = np.asarray(tb.starts, dtype=np.int64)
        ends = np.asarray(tb.ends, dtype=np.int64)
        if is_query:
            ends = np.minimum(ends, starts + self.query_token_cap)
        n = np.maximum(ends - starts, 0)
        b, t = tb.inputs["input_ids"].shape
        counts = N_SLOTS + n
        first = np.concatenate([[0], np.cumsum(counts)])  # first row of each list
        n_tok = int(n.sum())
        tok_first = np.concatenate([[0], np.cumsum(n)])[:-1]
        doc = np.repeat(np.arange(b), n)
        k = np.arange(n_tok) - np.repeat(tok_first, n)  # token index within its text
        src = doc * t + starts[doc] + k  # rows of the flattened (B * T) states
        dst_tok = first[doc] + N_SLOTS + k  # rows of the packed output
        dst_slot = (first[:-1, None] + np.arange(N_SLOTS)).reshape(-1)
        tb.index = torch.from_numpy(np.concatenate([src, dst_tok, dst_slot]))
        tb.counts = counts
        tb.n_tokens = n_tok
        tb.truncated = np.asarray(tb.truncated, dtype=bool)
        if self._is_cuda():
            tb.inputs = {k_: v.pin_memory() for k_, v in tb.inputs.items()}
            tb.index = tb.index.pin_memory()
        return tb

    def _is_cuda(self) -> bool:
        return str(getattr(self, "device", "cpu")).startswith("cuda")

    def _to_device(self, inputs: dict[str, Any]) -> dict[str, Any]:
        dev = getattr(self, "device", "cpu")
        return {k: v.to(dev, non_blocking=True) for k, v in inputs.items()}

    def _constants(self) -> dict[str, Any]:
        """``R`` and ``P`` as tensors on the model's device (made once per device)."""
        import torch

        dev = str(getattr(self, "device", "cpu"))
        consts = self._device_consts.get(dev)
        if consts is None:
            # float64 where the device has it: the tagged construction then rounds once, like
            # the per-document float64 construction of TaggedFormat.build
            hi = torch.float32 if dev.startswith("mps") else torch.float64
            consts = {"hi": hi,
                      "R": torch.from_numpy(self.R).to(dev, dtype=hi),
                      "P": torch.from_numpy(self.P).to(dev, dtype=torch.float32)}
            self._device_consts[dev] = consts
        return consts

    def _launch(self, tb: TokenBatch, w: float | np.ndarray) -> _Pending:
        """Forward pass and tagged construction of one batch on the device, then the copy of
        its packed rows to the host (asynchronous on CUDA)."""
        import torch

        fmt = self.format
        with self._lock, torch.inference_mode():
            c = self._constants()
            hi = c["hi"]
            inputs = self._to_device(tb.inputs)
            index = tb.index.to(inputs["input_ids"].device, non_blocking=True)
            g, states = self._forward(inputs)
            dev = g.device
            b, t = states.shape[0], states.shape[1]
            n_tok = tb.n_tokens
            src, dst_tok, dst_slot = index[:n_tok], index[n_tok: 2 * n_tok], index[2 * n_tok:]
            out = torch.empty((int(tb.counts.sum()), DIM), dtype=torch.float32, device=dev)
            # slots: R g -> 3 slices of 127, each normalised, tagged, scaled by the query weight
            z = (g.to(hi) @ c["R"].T).reshape(b, N_SLOTS, BODY)
            slots = torch.empty((b, N_SLOTS, DIM), dtype=hi, device=dev)
            slots[..., 0] = fmt.slot_tag
            slots[..., 1:] = z * (math.sqrt(fmt.delta) / _safe_norm(z))
            if isinstance(w, np.ndarray):
                slots *= torch.from_numpy(w).to(dev, dtype=hi).reshape(b, 1, 1)
            elif w != 1.0:
                slots *= w
            out.index_copy_(0, dst_slot, slots.reshape(b * N_SLOTS, DIM).to(torch.float32))
            if n_tok:
                # tokens: the chosen positions only, P (127 x token_dim), normalised, tagged
                h = states.reshape(b * t, states.shape[-1]).index_select(0, src)
                u = (h.float() @ c["P"].T).to(hi)
                toks = torch.empty((n_tok, DIM), dtype=torch.float32, device=dev)
                toks[:, 0] = fmt.token_tag
                toks[:, 1:] = u * (math.sqrt(fmt.beta) / _safe_norm(u))
                out.index_copy_(0, dst_tok, toks)
            host, event = to_host(out)
        return _Pending(tb, host, event, np.concatenate([[0], np.cumsum(tb.counts)]))

    def _finish(self, p: _Pending) -> tuple[list[int], list[np.ndarray], np.ndarray]:
        """Wait for the copy, split the packed rows into one list per text."""
        if p.event is not None:
            p.event.synchronize()
            packed = p.host.numpy().copy()  # pageable memory of its own: the pinned buffer is reused
        else:
            packed = p.host.numpy()
        bad = np.isnan(packed[:, 1])  # a zero or non-finite vector was made NaN on the device
        if bad.any():
            row = int(np.argmax(bad))
            i = int(np.searchsorted(p.offsets, row, side="right")) - 1
            raise ValueError(
                f"text {p.batch.positions[i]}: the model gave a zero or non-finite vector; "
                "cannot normalise it")
        return p.batch.positions, np.split(packed, p.offsets[1:-1]), p.batch.truncated

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
    def save_pylate(self, path: str | os.PathLike) -> Path:
        """Save as a PyLate ColBERT model folder with custom modules, which
        ``pylate.models.ColBERT(path, trust_remote_code=True)`` and
        ``load_encoder(path, trust_remote_code=True)`` load
        (:func:`~uibk_embedding.encoder.pylate_model.save_pylate`; the ``colbert`` extra)."""
        from uibk_embedding.encoder.pylate_model import save_pylate

        return save_pylate(self, path)

    def save_projections(self, path: str | os.PathLike) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        np.savez(path / PROJECTIONS_NAME, R=self.R, P=self.P)
        (path / CONFIG_NAME).write_text(json.dumps(self.config(), indent=2))


def to_host(rows: Any) -> tuple[Any, Any]:
    """The packed rows of one batch on their way to the host: on CUDA a non-blocking copy into
    pinned memory and the event that marks its end; on the CPU the rows themselves, no event."""
    import torch

    if rows.device.type != "cuda":
        return rows, None
    host = torch.empty(rows.shape, dtype=torch.float32, pin_memory=True)
    host.copy_(rows, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def resolve_dtype(device: str, dtype: str | None) -> str:
    """The model dtype: bfloat16 on CUDA, float32 elsewhere, unless given (one of the two).

    >>> resolve_dtype("cpu", None), resolve_dtype("cuda:0", None), resolve_dtype("cpu", "bfloat16")
    ('float32', 'bfloat16', 'bfloat16')
    """
    if dtype is None:
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
    return dtype


def _check_projection_kind(kind: str) -> str:
    if kind not in ("random", "pca"):
        raise ValueError(f"projection must be 'random' or 'pca', got {kind!r}")
    return kind


def _safe_norm(x: Any) -> Any:
    """Row norms (last axis, kept) with zero and non-finite norms made NaN, so that the
    division marks the row and :meth:`TaggedEncoder._finish` can refuse it."""
    import torch

    n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return torch.where(torch.isfinite(n) & (n > 0), n, torch.full_like(n, float("nan")))


def warn_truncated(n: int, total: int, limit: int, what: str) -> None:
    """One warning per call naming how many texts were cut (not one per text)."""
    if n:
        warnings.warn(
            f"{n} of {total} {what} were longer than {limit} tokens and were truncated",
            stacklevel=5,
        )
