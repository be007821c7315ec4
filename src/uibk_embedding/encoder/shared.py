"""One encoder, one device, many callers: :class:`SharedEncoder`.

A :class:`SharedEncoder` owns a tagged encoder (and so the model and the device) and one worker
thread. Callers, from any thread, put requests on a queue; the worker takes the requests that
are waiting (and those that arrive within ``max_wait_ms``), up to about ``8 * batch_tokens / 64``
texts, sorts all their texts by length, cuts
them into batches by a token budget (not a fixed count), runs the model and hands each caller
its own lists back. Concurrent callers are therefore batched together, and only the worker ever
touches the model. It is what ``uibk-embed serve`` exposes over HTTP.

* device: CUDA when present, else CPU (or ``device=``); the model runs in bfloat16 on a GPU and
  float32 on CPU (outputs are float32 either way);
* long jobs are cut into chunks of ``chunk_texts`` texts and show a progress bar
  (``show_progress``: True, False, or None = on a terminal for 256 texts or more);
* :meth:`SharedEncoder.encode_documents_iter` streams over any iterable with a bounded number
  of chunks in flight, so a million texts never sit in memory at once;
* :meth:`SharedEncoder.stats` counts requests, forward passes and the passes that merged
  several requests (or several clients of a server).

Results of a text can differ in the last bits depending on which texts share its batch (the
padding length changes the arithmetic); a single caller's call of at most ``chunk_texts``
texts gets the batches the wrapped encoder would make itself, a longer one is cut into
requests that may be batched otherwise (within the batching noise, docs/model.md).

Example
-------
>>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
>>> cfg = UIBKConfig.tiny()
>>> inner = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["lift of a wing", "heat transfer"]))
>>> with SharedEncoder(inner) as enc:
...     d = enc.encode_documents(["lift of a wing", "heat transfer"])
...     q = enc.encode_queries(["wing lift"], dense_weight=2.0)
...     [x.shape for x in d], enc.stats()["texts"]
([(7, 128), (5, 128)], 3)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uibk_embedding.encoder import load_encoder
from uibk_embedding.encoder.base import TaggedEncoder
from uibk_embedding.encoder.inputs import resolve_device, text_chunks, validate_texts, warn_truncated
from uibk_embedding.encoder.pipeline import DegenerateVector
from uibk_embedding.tagged import check_dense_weight

_STOP = object()
log = logging.getLogger("uibk_embedding.shared")


@dataclass
class _Request:
    texts: list[str]
    is_query: bool
    weight: float
    client: str
    future: Future = field(default_factory=Future)
    results: list[np.ndarray | None] = field(default_factory=list)
    remaining: int = 0
    cut: set[int] = field(default_factory=set)  # texts truncated at the token limit
    rid: int = 0
    start: int = 0  # the position of texts[0] in the caller's call or stream (for messages)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.texts)
        self.remaining = len(self.texts)


class EncodeResult(list):
    """The tagged lists of one request, with ``cut``: the positions of the texts truncated at the
    token limit, and ``truncated``: how many they are."""

    cut: frozenset[int] = frozenset()

    @property
    def truncated(self) -> int:
        return len(self.cut)


MAX_WAIT_MS = 60_000  # the merging window's cap: a minute (queue.get fails past about 9e12 ms)


PASS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    """Counts in cumulative buckets (Prometheus style), for ``/metrics``.

    >>> h = Histogram((1, 10))
    >>> h.observe(3); h.lines("x")[:2]
    ['x_bucket{le="1"} 0', 'x_bucket{le="10"} 1']
    """

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets, self.counts, self.total, self.n = tuple(buckets), [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        self.n += 1
        self.total += v
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts, strict=True)]
        return [*out, f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.total:.6f}",
                f"{name}_count {self.n}"]

class SharedEncoder:
    """A thread-safe front of one :class:`~uibk_embedding.encoder.base.TaggedEncoder`.

    Parameters
    ----------
    encoder: a TaggedEncoder, or a path for :func:`~uibk_embedding.encoder.load_encoder`
        (None: the embedded default), loaded on ``device``.
    device: where to load a model given by path (default: CUDA when present, else CPU).
    batch_tokens: padded tokens per forward pass (default: the encoder's).
    max_wait_ms: how long the worker waits for more requests before a pass (merging window), a
        finite number of milliseconds from 0 to 60,000.
    chunk_texts: texts per queued request when a caller passes a long list.
    show_progress: progress bar for long calls (None: on a terminal, 256 texts or more).
    **load_options: passed to ``load_encoder`` when ``encoder`` is a path.

    Should the worker thread itself fail (a bug, not a model error: those reach the request
    they belong to), the requests it holds and every later call raise ``RuntimeError`` naming
    the failure, and ``worker_error`` holds it (the server's ``/health`` then answers 503).

    >>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
    >>> cfg = UIBKConfig.tiny()
    >>> enc = SharedEncoder(UIBKEncoder.random(cfg, train_tokenizer(cfg, ["a flat plate"])))
    >>> len(list(enc.encode_documents_iter(iter(["a flat plate"] * 5), chunk_size=2)))
    5
    >>> enc.close()
    """

    def __init__(
        self,
        encoder: TaggedEncoder | str | os.PathLike | None = None,
        *,
        device: str | None = None,
        batch_tokens: int | None = None,
        max_wait_ms: float = 2.0,
        chunk_texts: int = 256,
        show_progress: bool | None = None,
        **load_options: Any,
    ) -> None:
        if encoder is None or isinstance(encoder, str | os.PathLike):
            encoder = load_encoder(encoder, device=resolve_device(device), **load_options)
        if not isinstance(encoder, TaggedEncoder):
            raise TypeError(
                f"SharedEncoder wraps an in-process TaggedEncoder, got {type(encoder).__name__}; "
                "a RemoteEncoder is already shared by its server")
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, int | float) or not (
                0 <= max_wait_ms <= MAX_WAIT_MS):  # NaN and infinity fail the comparison
            raise ValueError(f"max_wait_ms must be a number of milliseconds from 0 to {MAX_WAIT_MS}, "
                             f"got {max_wait_ms!r}")
        if isinstance(chunk_texts, bool) or not isinstance(chunk_texts, int) or chunk_texts < 1:
            raise ValueError(f"chunk_texts must be a positive integer, got {chunk_texts!r}")
        self.encoder = encoder
        if batch_tokens is not None:
            encoder.batch_tokens = int(batch_tokens)
        self.format = encoder.format
        self.max_wait = max_wait_ms / 1000.0
        self.chunk_texts = int(chunk_texts)
        self.show_progress = show_progress
        self._queue: queue.Queue = queue.Queue()
        self._ids = itertools.count(1)
        self._stats_lock = threading.Lock()
        self._stats = {"requests": 0, "texts": 0, "passes": 0, "merged_passes": 0,
                       "multi_client_passes": 0, "max_requests_per_pass": 0, "errors": 0}
        self.pass_sizes = Histogram(PASS_BUCKETS)  # texts per forward pass
        self._closed = False
        self.worker_error: BaseException | None = None  # set when the worker thread failed
        self._submit_lock = threading.Lock()  # a request is queued before the worker fails, or refused
        self._worker = threading.Thread(target=self._run, name="uibk-shared-encoder", daemon=True)
        self._worker.start()

    # -- what the protocol needs (uibk_embedding.encoder.protocol.Encoder) ---------------------
    @property
    def dense_weight(self) -> float:
        return self.encoder.dense_weight

    @property
    def model_name(self) -> str:
        return str(getattr(self.encoder, "model_name", type(self.encoder).__name__))

    @property
    def device(self) -> str:
        return str(getattr(self.encoder, "device", "cpu"))

    @property
    def query_max_length(self) -> int:
        return self.encoder.query_max_length

    @property
    def doc_max_length(self) -> int:
        return self.encoder.doc_max_length

    def encode_queries(self, texts: Sequence[str], *, dense_weight: float | None = None,
                       show_progress: bool | None = None) -> list[np.ndarray]:
        """Tagged query lists (see :meth:`TaggedEncoder.encode_queries`)."""
        w = check_dense_weight(self.encoder.dense_weight if dense_weight is None else dense_weight)
        return self._call(validate_texts(texts), True, w, show_progress)

    def encode_documents(self, texts: Sequence[str], *,
                         show_progress: bool | None = None) -> list[np.ndarray]:
        """Tagged document lists (see :meth:`TaggedEncoder.encode_documents`)."""
        return self._call(validate_texts(texts), False, 1.0, show_progress)

    def encode_documents_iter(self, texts: Iterable[str], *, chunk_size: int | None = None,
                              in_flight: int = 2) -> Iterator[np.ndarray]:
        """Stream tagged lists over any iterable, in order, ``in_flight`` chunks queued at most."""
        pending: deque[Future] = deque()
        chunks = text_chunks(texts, self.chunk_texts if chunk_size is None else chunk_size)
        start = 0
        while True:
            chunk = next(chunks, None)
            if chunk:
                pending.append(self.submit(chunk, is_query=False, start=start))
                start += len(chunk)
            while pending and (len(pending) >= in_flight or not chunk):
                res = pending.popleft().result()
                warn_truncated(res.truncated, len(res), self.encoder.doc_max_length, "documents")
                yield from res
            if not chunk and not pending:
                return

    # -- requests --------------------------------------------------------------------------
    def submit(self, texts: list[str], *, is_query: bool, dense_weight: float = 1.0,
               client: str = "", start: int = 0) -> Future:
        """Queue one request (validated texts); the future gives an :class:`EncodeResult`.

        ``client`` names the caller in :meth:`stats` (the server passes the client's id);
        ``start``: the position of ``texts[0]`` in the caller's whole call or stream, so an
        error names a text by its position there.
        """
        req = _Request(list(texts), bool(is_query), float(dense_weight), client, rid=next(self._ids),
                       start=int(start))
        with self._submit_lock:
            if self.worker_error is not None:
                raise self._failure()
            if self._closed:
                raise RuntimeError("this SharedEncoder is closed")
            with self._stats_lock:
                self._stats["requests"] += 1
            if not req.texts:
                req.future.set_result(EncodeResult())
            else:
                self._queue.put(req)
        return req.future

    def _failure(self) -> RuntimeError:
        e = self.worker_error
        return RuntimeError(f"the SharedEncoder's worker thread failed ({type(e).__name__}: {e}); it encodes "
                            "nothing more: make a new SharedEncoder (restart the server)")

    def _call(self, texts: list[str], is_query: bool, w: float,
              show_progress: bool | None) -> list[np.ndarray]:
        if not texts:
            return []
        from tqdm.auto import tqdm

        progress = self.show_progress if show_progress is None else show_progress
        disable = {True: False, False: True}.get(progress, None if len(texts) >= 256 else True)
        futures = [self.submit(texts[i:i + self.chunk_texts], is_query=is_query, dense_weight=w,
                               start=i)
                   for i in range(0, len(texts), self.chunk_texts)]
        out: list[np.ndarray] = []
        truncated = 0
        desc = "encoding queries" if is_query else "encoding documents"
        with tqdm(total=len(texts), desc=desc, unit="text", disable=disable) as bar:
            for f in futures:
                res = f.result()
                out.extend(res)
                truncated += res.truncated
                bar.update(len(res))
        limit = self.encoder.query_max_length if is_query else self.encoder.doc_max_length
        warn_truncated(truncated, len(texts), limit, "queries" if is_query else "documents")
        return out

    # -- the worker ------------------------------------------------------------------------
    def _gather(self, reqs: list[_Request]) -> bool:
        """Add the requests that wait (or arrive within ``max_wait``) to ``reqs``; True on _STOP."""
        stop = False
        budget = 8 * self.encoder.batch_tokens
        est = len(reqs[0].texts)
        deadline = time.monotonic() + self.max_wait
        while est * 64 < budget:
            timeout = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stop = True
                break
            reqs.append(item)
            est += len(item.texts)
        return stop

    def _run(self) -> None:
        taken: list[_Request] = []  # the requests out of the queue, for the callers' sake on a failure
        try:
            while True:
                first = self._queue.get()
                if first is _STOP:
                    return
                taken = [first]
                stop = self._gather(taken)
                # a request whose caller cancelled its future (a client gone during shutdown) is
                # dropped here; the others are marked running, so they can no longer be cancelled
                # and resolving them cannot fail (before, the cancelled one made set_result raise,
                # which failed every request batched with it)
                reqs = [r for r in taken if r.future.set_running_or_notify_cancel()]
                for is_query in (True, False):
                    group = [r for r in reqs if r.is_query == is_query]
                    if group:
                        self._process(group, is_query)
                if stop:
                    return
        except BaseException as e:  # the worker itself failed (before, its thread died silently and
            # every caller waited forever): no request is left waiting, and none is taken any more
            with self._submit_lock:
                self.worker_error = e
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not _STOP:
                        taken.append(item)
            log.error("the SharedEncoder's worker thread failed; it encodes nothing more", exc_info=e)
            err = self._failure()
            for r in taken:
                with contextlib.suppress(InvalidStateError):  # done, or cancelled meanwhile
                    r.future.set_exception(err)

    def _process(self, group: list[_Request], is_query: bool) -> None:
        enc = self.encoder
        items = [(r, i) for r in group for i in range(len(r.texts))]
        texts = [r.texts[i] for r, i in items]
        weights = np.array([r.weight for r, _ in items]) if is_query else 1.0
        try:
            # the wrapped encoder's own pipeline (prefetching tokeniser, batched tagging)
            for batch, arrays, cut in enc._tagged_batches(texts, is_query, weights):
                owners = {items[j][0].rid for j in batch}
                clients = {items[j][0].client for j in batch}
                with self._stats_lock:
                    s = self._stats
                    s["passes"] += 1
                    self.pass_sizes.observe(len(batch))
                    s["texts"] += len(batch)
                    s["merged_passes"] += len(owners) > 1
                    s["multi_client_passes"] += len(clients) > 1
                    s["max_requests_per_pass"] = max(s["max_requests_per_pass"], len(owners))
                for j, arr, was_cut in zip(batch, arrays, cut, strict=True):
                    req, i = items[j]
                    req.results[i] = arr
                    if was_cut:
                        req.cut.add(i)
                    req.remaining -= 1
                    if req.remaining == 0:
                        res = EncodeResult(req.results)
                        res.cut = frozenset(req.cut)
                        req.future.set_result(res)
        except BaseException as e:  # the callers get the error; the worker lives on
            if len(group) > 1 and isinstance(e, Exception):
                # one request's input may be what failed: each alone, so the others get their lists
                for r in group:
                    if not r.future.done():
                        r.results, r.remaining, r.cut = [None] * len(r.texts), len(r.texts), set()
                        self._process([r], is_query)
                return
            with self._stats_lock:
                self._stats["errors"] += 1
            if isinstance(e, DegenerateVector):  # named by its place in the request: in the call
                e = e.moved(group[0].start)
            for r in group:
                if not r.future.done():
                    r.future.set_exception(e)

    # -- status and lifetime -----------------------------------------------------------------
    def queue_depth(self) -> int:
        """Requests waiting for the worker (not yet gathered into a pass)."""
        return self._queue.qsize()

    def stats(self) -> dict[str, Any]:
        """Counters: requests, texts, forward ``passes``, ``merged_passes`` (texts of several
        requests in one pass), ``multi_client_passes`` (of several clients), ``errors``.
        """
        with self._stats_lock:
            s = dict(self._stats)
        s["queued"] = self._queue.qsize()
        s["device"] = self.device
        return s

    def close(self) -> None:
        """Finish the queued work and stop the worker thread."""
        with self._submit_lock:  # a submit past its check queues before the stop, never after it
            stopping = not self._closed
            self._closed = True
            if stopping:
                self._queue.put(_STOP)
        if stopping:
            self._worker.join()

    def __enter__(self) -> SharedEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["EncodeResult", "SharedEncoder"]
