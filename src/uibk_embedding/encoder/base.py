"""The tagged encoder: the machinery every in-process encoder shares.

An encoder turns texts into tagged lists (``float32``, ``(n_i, 128)``, unit rows except
query slots, which carry the query-time dense weight ``w``)::

    encoder.encode_queries(texts, dense_weight=None)  -> list[np.ndarray]
    encoder.encode_documents(texts)                    -> list[np.ndarray]

:class:`TaggedEncoder` implements both on top of two methods that subclasses provide:

* ``_tokenize(texts, is_query) -> TokenBatch``: the padded model inputs of one batch, built on
  the CPU with the ``tokenizers`` fast path (no per-token Python), and where each text's token
  vectors sit in the model's output;
* ``_forward(inputs) -> (dense, states)``: one forward pass, both heads, on the model's device.

The pipeline is the same for every encoder, on CPU and GPU (:meth:`TaggedEncoder._tagged_batches`,
its parts in :mod:`uibk_embedding.encoder.pipeline`): a background thread tokenises batch
``i + 1`` while batch ``i`` runs (a bounded prefetch queue); the tagged lists of a whole padded
batch are built on the model's device in a few tensor operations (the fixed projections ``R``:
dense -> 3 x 127 and ``P``: tokens -> 127, :mod:`uibk_embedding.encoder.fixed_projections`; the
normalisation, the tag column, the query slots scaled by the dense weight, the caps of
docs/format.md#constants); then ONE device-to-host copy per batch (pinned memory,
non-blocking, on CUDA) and one split into documents.

The protocols (:class:`~uibk_embedding.encoder.protocol.Encoder`, which every encoder satisfies,
and :class:`~uibk_embedding.encoder.protocol.LocalEncoder`, which a ``TaggedEncoder`` does), the input checks
(:mod:`~uibk_embedding.encoder.inputs`) and the padded batches
(:mod:`~uibk_embedding.encoder.padding`) live in their own modules; their names are importable
from here too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.encoder.fixed_projections import CONFIG_NAME, PROJECTIONS_NAME, FixedProjections
from uibk_embedding.encoder.inputs import (
    resolve_device,
    resolve_dtype,
    text_chunks,
    validate_texts,
    warn_truncated,
)
from uibk_embedding.encoder.padding import TokenBatch, budget_runs, length_order, pad_ids, padded_batches
from uibk_embedding.encoder.pipeline import (
    DegenerateVector,
    Pending,
    device_constants,
    finish,
    gather_indices,
    prefetched,
    tag_batch,
    to_host,
)
from uibk_embedding.encoder.protocol import Encoder, LocalEncoder, protocol_gaps
from uibk_embedding.tagged import TaggedFormat, check_dense_weight
from uibk_embedding.token_pooling import (
    FREQUENT_CUTOFF,
    MIN_FIT_DOCUMENTS,
    TokenRows,
    TokenVocabulary,
    check_pool_factor_value,
    frequent_token_ids,
    pool_documents,
    token_vocabulary,
)


class TaggedEncoder(FixedProjections):
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
    pool_factor: token pooling of documents (:mod:`uibk_embedding.token_pooling`; queries never):
        ``n`` token vectors become ``max(n // pool_factor, 1)``; recorded in :attr:`format`, which
        a store records. ``None``: the format's (1, off, unless ``format`` says otherwise).
    pool_method: how documents are pooled, ``"content"`` (the default) or ``"ward"``
        (:data:`~uibk_embedding.tagged.POOL_METHODS`); ``None``: the format's. The content method
        also treats the collection's most frequent token ids as function words once
        :meth:`fit_pooling` has read the corpus (``uibk-embed index`` does).
    """

    kind = "abstract"
    #: set by each subclass: the model it runs (the protocol's ``model_name``)
    model_name: str

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
        pool_factor: int | None = None,
        pool_method: str | None = None,
    ) -> None:
        self.format = format or TaggedFormat()
        if pool_factor is not None:
            self.format = replace(self.format, pool_factor=check_pool_factor_value(pool_factor))
        if pool_method is not None:
            self.format = replace(self.format, pool_method=pool_method)
        self._vocabulary: TokenVocabulary | None = None
        self._init_projections(dense_dim, token_dim, projections, seed, projection)
        self.dense_weight = check_dense_weight(dense_weight)
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

    # -- subclasses ------------------------------------------------------------------------
    def _tokenize(self, texts: list[str], is_query: bool) -> TokenBatch:  # pragma: no cover
        """Padded model inputs of one batch (CPU), token spans and truncation flags."""
        raise NotImplementedError

    def _forward(self, inputs: dict[str, Any]) -> tuple[Any, Any]:  # pragma: no cover
        """The forward pass on device inputs: (dense ``(B, dense_dim)``, token states
        ``(B, T, token_dim)``), both float32 tensors on the model's device; a batch over
        ``batch_tokens`` in real tokens runs in several passes (:meth:`_in_budget`)."""
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
        return {
            "kind": self.kind,
            "format": self.format.to_dict(),
            "seed": self.seed,
            "dense_weight": self.dense_weight,
            "query_token_cap": self.query_token_cap,
            "query_max_length": self.query_max_length,
            "doc_max_length": self.doc_max_length,
            **self._projection_config(),
        }

    # -- the protocol ------------------------------------------------------------------------
    def encode_queries(
        self,
        texts: Sequence[str],
        *,
        dense_weight: float | None = None,
        show_progress: bool | None = None,
    ) -> list[np.ndarray]:
        """Tagged query lists: 3 slots scaled by ``dense_weight`` then at most
        ``query_token_cap`` (64 by default) token vectors."""
        w = check_dense_weight(self.dense_weight if dense_weight is None else dense_weight)
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
        """Stream over any iterable of texts, ``chunk_size`` at a time (bounded memory); an error
        about one text names its place in the stream."""
        start = 0
        for chunk in text_chunks(texts, chunk_size):
            try:
                lists = self.encode_documents(chunk)
            except DegenerateVector as e:
                raise e.moved(start) from None
            yield from lists
            start += len(chunk)

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
        pending: Pending | None = None
        for tb in self._prefetched(texts, batches, is_query):
            w = np.asarray(weights, dtype=np.float64)[tb.positions] if per_text else float(weights)
            launched = self._launch(tb, w)
            if pending is not None:
                yield self._pooled(self._finish(pending), is_query, pending.batch)
            pending = launched
        if pending is not None:
            yield self._pooled(self._finish(pending), is_query, pending.batch)

    def _pooled(self, done: tuple[list[int], list[np.ndarray], np.ndarray],
                is_query: bool, tb: TokenBatch) -> tuple[list[int], list[np.ndarray], np.ndarray]:
        """A finished batch with its documents' tokens pooled by the format's pooling (the one
        place documents are pooled: every encoding path, shared and served ones included, runs
        through :meth:`_tagged_batches`); queries and ``pool_factor=1`` as they are."""
        if is_query or self.format.pool_factor == 1:
            return done
        positions, arrays, cut = done
        rows = None
        if self.format.pool_method == "content":
            rows = self._token_rows(tb, [len(a) - self.format.n_slots for a in arrays])
        return positions, pool_documents(arrays, self.format, rows), cut

    # -- what the content pooling reads of the tokens --------------------------------------------
    def _row_token_ids(self, tb: TokenBatch) -> list[np.ndarray] | None:
        """The token id of each token row of each document of a tokenised batch (in the batch's
        order), or ``None`` when this encoder cannot tell. Default: the ids of each text's span
        ``starts[i] .. ends[i] - 1``."""
        ids = tb.inputs["input_ids"].numpy()
        return [ids[i, a:b].astype(np.int64) for i, (a, b) in enumerate(zip(tb.starts, tb.ends, strict=True))]

    def _known_row_token_ids(self, tb: TokenBatch) -> list[np.ndarray]:
        """:meth:`_row_token_ids`, or a ValueError naming the fix when this encoder cannot tell."""
        ids = self._row_token_ids(tb)
        if ids is None:
            raise ValueError(f"{type(self).__name__} cannot tell the token id of each row it emits, which "
                             "pool_method='content' needs: use pool_method='ward'")
        return ids

    def _vocabulary_tokenizer(self) -> Any:
        """The tokenizer whose vocabulary names the ids :meth:`_row_token_ids` gives."""
        base = getattr(self, "_base_tokenizer", None)
        return base if base is not None else getattr(self, "tokenizer", None)

    def _token_vocabulary(self) -> TokenVocabulary:
        if self._vocabulary is None:
            self._vocabulary = token_vocabulary(self._vocabulary_tokenizer(), type(self).__name__)
        return self._vocabulary

    def _token_rows(self, tb: TokenBatch, counts: list[int]) -> list[TokenRows]:
        """:class:`~uibk_embedding.token_pooling.TokenRows` of a batch's documents, checked
        against the token rows each list holds (``counts``)."""
        ids = self._known_row_token_ids(tb)
        vocabulary = self._token_vocabulary()
        out = []
        for i, n in zip(ids, counts, strict=True):
            if len(i) != n and n > 1:  # a list of one token row is never pooled
                raise ValueError(f"{type(self).__name__}: token ids of {len(i)} rows for a list of {n} "
                                 "token rows, so pool_method='content' cannot run: use pool_method='ward'")
            out.append(vocabulary.rows(i if len(i) == n else np.zeros(n, dtype=np.int64),
                                       self.format.pool_frequent_ids))
        return out

    def fit_pooling(self, texts: Iterable[str], *, cutoff: float = FREQUENT_CUTOFF,
                    min_documents: int = MIN_FIT_DOCUMENTS, batch_size: int = 1024,
                    show_progress: bool | None = None) -> tuple[int, ...]:
        """Read a collection's documents (tokenised only: no model runs) and set the format's
        ``pool_frequent_ids`` to the token ids found in at least ``cutoff`` of them (fewer than
        ``min_documents`` documents: none), which the ``"content"`` pooling then treats as
        function words. Call it once on the corpus (or a sample of it) before encoding documents
        for a new store; the store records the ids with the format. Returns the ids.

        >>> from uibk_embedding.encoder import load_encoder
        >>> enc = load_encoder(pool_factor=2)
        >>> enc.fit_pooling(["Alice likes apples."] * 100 + ["Bob likes pears."] * 20)  # ".", "likes"
        (1012, 7777)
        """
        rows = self._document_token_ids(texts, batch_size, show_progress, "reading token frequencies")
        frequent = frequent_token_ids(rows, cutoff, min_documents)  # streamed: one batch held at a time
        self.format = replace(self.format, pool_frequent_ids=frequent)
        return frequent

    def token_rows(self, texts: Sequence[str], *, batch_size: int = 1024) -> list[TokenRows]:
        """What the ``"content"`` pooling reads of each document's token rows (before pooling):
        which are function words (with this format's frequent ids) and their segments. Tokenises
        only; for checks and benchmarks (:func:`~uibk_embedding.token_pooling.pool_content`).

        >>> from uibk_embedding.encoder import load_encoder
        >>> load_encoder().token_rows(["the lift of a wing, measured"])[0].function.tolist()
        [True, False, True, True, False, True, False]
        """
        vocabulary = self._token_vocabulary()
        return [vocabulary.rows(i, self.format.pool_frequent_ids)
                for i in self._document_token_ids(texts, batch_size, False, "reading tokens")]

    def _document_token_ids(self, texts: Iterable[str], batch_size: int, show_progress: bool | None,
                            desc: str) -> Iterator[np.ndarray]:
        """The token ids of each text's token rows, a batch of texts tokenised at a time."""
        from tqdm.auto import tqdm

        texts = validate_texts(list(texts))
        progress = self.show_progress if show_progress is None else show_progress
        disable = {True: False, False: True}.get(progress, None if len(texts) >= 4096 else True)
        with tqdm(total=len(texts), desc=desc, unit="text", disable=disable) as bar:
            for s in range(0, len(texts), batch_size):
                chunk = texts[s:s + batch_size]
                yield from self._known_row_token_ids(self._tokenize(chunk, False))
                bar.update(len(chunk))

    def adopt_pooling(self, stored: TaggedFormat) -> None:
        """Pool documents as a store recorded (``store.format``: its pool factor, method and
        frequent token ids), so that this encoder may write into it.

        >>> from uibk_embedding.encoder import load_encoder
        >>> from uibk_embedding.tagged import TaggedFormat
        >>> enc = load_encoder()
        >>> enc.adopt_pooling(TaggedFormat(pool_factor=2, pool_frequent_ids=(1012,)))
        >>> enc.format.pool_factor, enc.format.pool_method, enc.format.pool_frequent_ids
        (2, 'content', (1012,))
        """
        self.format = replace(self.format, pool_factor=stored.pool_factor, pool_method=stored.pool_method,
                              pool_frequent_ids=stored.pool_frequent_ids)

    def _prefetched(self, texts: list[str], batches: list[list[int]],
                    is_query: bool) -> Iterator[TokenBatch]:
        """Tokenised batches in order; from a background thread when there are several."""

        def make(batch: list[int]) -> TokenBatch:
            tb = self._tokenize([texts[i] for i in batch], is_query)
            tb.positions = batch
            return self._prepare(tb, is_query)

        return prefetched(make, batches, self.prefetch)

    def _prepare(self, tb: TokenBatch, is_query: bool) -> TokenBatch:
        """Query cap, rows per list and the gather/scatter indices of the tagged construction
        (host side, vectorised), pinned for a non-blocking copy when the model is on CUDA."""
        import torch

        starts = np.asarray(tb.starts, dtype=np.int64)
        ends = np.asarray(tb.ends, dtype=np.int64)
        if is_query:
            ends = np.minimum(ends, starts + self.query_token_cap)
        index, tb.counts, tb.n_tokens = gather_indices(starts, ends, tb.inputs["input_ids"].shape[1])
        tb.index = torch.from_numpy(index)
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
        dev = str(getattr(self, "device", "cpu"))
        consts = self._device_consts.get(dev)
        if consts is None:
            consts = self._device_consts[dev] = device_constants(self.R, self.P, dev)
        return consts

    def _launch(self, tb: TokenBatch, w: float | np.ndarray) -> Pending:
        """Forward pass and tagged construction of one batch on the device, then the copy of
        its packed rows to the host (asynchronous on CUDA)."""
        import torch

        with self._lock, torch.inference_mode():
            consts = self._constants()
            inputs = self._to_device(tb.inputs)
            index = tb.index.to(inputs["input_ids"].device, non_blocking=True)
            g, states = self._forward(inputs)
            host, event = to_host(tag_batch(self.format, g, states, index, tb, consts, w))
        return Pending(tb, host, event, np.concatenate([[0], np.cumsum(tb.counts)]))

    def _in_budget(self, inputs: dict[str, Any], run: Callable[[dict[str, Any]], tuple[Any, ...]],
                   token_axis: Sequence[bool], crop: bool = True) -> tuple[Any, ...]:
        """``run(inputs)`` (a forward pass: a tuple of tensors, one row per text), kept to
        ``batch_tokens``: a batch over it in real tokens (it was cut on an estimate from the
        characters) runs in :func:`~uibk_embedding.encoder.padding.budget_runs` of consecutive
        rows, each padded to its own longest text (``crop``; else the batch's width), as if
        batched so; the outputs are joined, those with a token axis (``token_axis``: dim 1)
        zero-padded back to the batch's width. Inputs that are no ``(B, T)`` tensor pass whole.

        >>> import torch
        >>> enc = TaggedEncoder(4, 4, batch_tokens=4)
        >>> x = {"attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])}
        >>> shapes = []
        >>> run = lambda v: (shapes.append(tuple(v["attention_mask"].shape)) or (v["attention_mask"],))
        >>> out = enc._in_budget(x, run, (True,))
        >>> shapes, out[0].tolist() == x["attention_mask"].tolist()
        ([(1, 3), (2, 2)], True)
        """
        import torch

        mask = inputs["attention_mask"]
        b, t = mask.shape
        if b == 1 or b * t <= self.batch_tokens:
            return run(inputs)
        lengths = mask.sum(1).tolist()
        parts = []
        for rows in budget_runs(lengths, self.batch_tokens):
            width = max(lengths[rows]) if crop else t
            sub = {k: v[rows, :width] if isinstance(v, torch.Tensor) and v.shape[:2] == (b, t) else v
                   for k, v in inputs.items()}
            parts.append(run(sub))
        out = []
        for i, seq in enumerate(token_axis):
            pieces = [p[i] for p in parts]
            if seq:
                pieces = [torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, t - x.shape[1]))
                          for x in pieces]
            out.append(torch.cat(pieces))
        return tuple(out)

    def _finish(self, p: Pending) -> tuple[list[int], list[np.ndarray], np.ndarray]:
        """Wait for the copy, split the packed rows into one list per text."""
        return finish(p)

    # -- batching ----------------------------------------------------------------------------
    def _length_order(self, texts: list[str]) -> list[int]:
        return length_order(texts)

    def _batches(self, texts: list[str], order: list[int], is_query: bool) -> Iterator[list[int]]:
        """Batches of similar length whose padded size stays within ``batch_tokens``."""
        max_len = self.query_max_length if is_query else self.doc_max_length
        return padded_batches(texts, order, max_len, self.batch_tokens)

    # -- persistence -------------------------------------------------------------------------
    def save_pylate(self, path: str | os.PathLike) -> Path:
        """Save as a PyLate ColBERT model folder with custom modules, which
        ``pylate.models.ColBERT(path, trust_remote_code=True)`` and
        ``load_encoder(path, trust_remote_code=True)`` load
        (:func:`~uibk_embedding.encoder.pylate_model.save_pylate`; the ``colbert`` extra)."""
        from uibk_embedding.encoder.pylate_model import save_pylate

        return save_pylate(self, path)


# the names this module has always offered (importers may keep `from ...encoder.base import X`)
__all__ = [
    "CONFIG_NAME",
    "PROJECTIONS_NAME",
    "Encoder",
    "LocalEncoder",
    "TaggedEncoder",
    "TokenBatch",
    "pad_ids",
    "protocol_gaps",
    "resolve_device",
    "resolve_dtype",
    "to_host",
    "validate_texts",
    "warn_truncated",
]
