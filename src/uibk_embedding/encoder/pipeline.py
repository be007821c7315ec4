"""The encoding pipeline's moving parts: the prefetch thread, the tagged construction of a
whole padded batch on the model's device, and the copy of its rows to the host.

:meth:`TaggedEncoder._tagged_batches <uibk_embedding.encoder.base.TaggedEncoder._tagged_batches>`
strings them together: a background thread tokenises batch ``i + 1`` while batch ``i`` runs
(:func:`prefetched`, a bounded queue); the host computes the gather/scatter indices of each
batch (:func:`gather_indices`); on the device, one forward pass and a few tensor operations
build every tagged list of the batch (:func:`tag_batch`: the layout of
:class:`~uibk_embedding.tagged.TaggedFormat`); then ONE device-to-host copy per batch
(:func:`to_host`: pinned memory, non-blocking, on CUDA) and one split into lists
(:func:`finish`). The lists of one batch are views of one float32 array.

>>> list(prefetched(lambda x: x * x, [1, 2, 3], depth=2))
[1, 4, 9]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from uibk_embedding.encoder.padding import TokenBatch
from uibk_embedding.tagged import BODY, DIM, N_SLOTS, TaggedFormat, apply_dense_weight

T = TypeVar("T")
U = TypeVar("U")


# -- the prefetch thread -------------------------------------------------------------------------
class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


def prefetched(make: Callable[[T], U], items: Sequence[T], depth: int) -> Iterator[U]:
    """``make(item)`` for each item, in order; made ahead in a background thread (at most
    ``depth`` waiting) when there are several items and ``depth > 0``. An error in the thread is
    raised here, in the consumer; a consumer that stops early stops the thread."""
    if len(items) <= 1 or depth == 0:
        for item in items:
            yield make(item)
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
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
            for item in items:
                if not put(make(item)):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            put(_Failed(e))
            return
        put(_DONE)

    worker = threading.Thread(target=work, name="uibk-tokenize", daemon=True)
    worker.start()
    try:
        while True:
            got = q.get()
            if got is _DONE:
                return
            if isinstance(got, _Failed):
                raise got.error
            yield got
    finally:
        stop.set()
        worker.join()


# -- host side: where each row goes ---------------------------------------------------------
def gather_indices(starts: np.ndarray, ends: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Rows of each tagged list and the gather/scatter indices of a batch of ``B`` texts padded to
    ``width`` tokens (vectorised): ``(index, counts, n_tokens)``, ``index`` the concatenation of
    ``src`` (rows of the flattened ``(B * width)`` states), ``dst_tok`` (their rows in the packed
    output) and ``dst_slot`` (the 3 slot rows of each list), ``counts`` the rows of each list.

    >>> index, counts, n = gather_indices(np.array([1, 1]), np.array([3, 2]), 4)
    >>> index.tolist(), counts.tolist(), n
    ([1, 2, 5, 3, 4, 8, 0, 1, 2, 5, 6, 7], [5, 4], 3)
    """
    n = np.maximum(ends - starts, 0)
    b = len(starts)
    counts = N_SLOTS + n
    first = np.concatenate([[0], np.cumsum(counts)])  # first row of each list
    n_tok = int(n.sum())
    tok_first = np.concatenate([[0], np.cumsum(n)])[:-1]
    doc = np.repeat(np.arange(b), n)
    k = np.arange(n_tok) - np.repeat(tok_first, n)  # token index within its text
    src = doc * width + starts[doc] + k  # rows of the flattened (B * T) states
    dst_tok = first[doc] + N_SLOTS + k  # rows of the packed output
    dst_slot = (first[:-1, None] + np.arange(N_SLOTS)).reshape(-1)
    return np.concatenate([src, dst_tok, dst_slot]), counts, n_tok


# -- device side: the tagged construction of a batch ------------------------------------------
def device_constants(R: np.ndarray, P: np.ndarray, dev: str) -> dict[str, Any]:
    """``R`` and ``P`` as tensors on ``dev``: ``R`` in float64 where the device has it (the
    tagged construction then rounds once, like the float64 construction of
    :meth:`TaggedFormat.build`), ``P`` in float32 (the token matmul runs in float32)."""
    import torch

    hi = torch.float32 if dev.startswith("mps") else torch.float64
    return {"hi": hi,
            "R": torch.from_numpy(R).to(dev, dtype=hi),
            "P": torch.from_numpy(P).to(dev, dtype=torch.float32)}


def safe_norm(x: Any) -> Any:
    """Row norms (last axis, kept) with zero and non-finite norms made NaN, so that the
    division marks the row and :func:`finish` can refuse it."""
    import torch

    n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return torch.where(torch.isfinite(n) & (n > 0), n, torch.full_like(n, float("nan")))


def tag_batch(fmt: TaggedFormat, g: Any, states: Any, index: Any, tb: TokenBatch,
              consts: dict[str, Any], w: float | np.ndarray) -> Any:
    """The packed tagged rows ``(sum(counts), 128)`` float32 of one batch, on the device: from the
    sentence vectors ``g`` ``(B, D)``, the token states ``(B, T, d)`` and the batch's
    :func:`gather_indices` (on the device); query slots scaled by ``w`` (one weight, or one per
    text)."""
    import torch

    hi = consts["hi"]
    dev = g.device
    b, t = states.shape[0], states.shape[1]
    n_tok = tb.n_tokens
    src, dst_tok, dst_slot = index[:n_tok], index[n_tok: 2 * n_tok], index[2 * n_tok:]
    out = torch.empty((int(tb.counts.sum()), DIM), dtype=torch.float32, device=dev)
    # slots: R g -> 3 slices of 127, each normalised, tagged, scaled by the query weight
    z = (g.to(hi) @ consts["R"].T).reshape(b, N_SLOTS, BODY)
    slots = fmt.write_slots(torch.empty((b, N_SLOTS, DIM), dtype=hi, device=dev), z, safe_norm(z))
    apply_dense_weight(slots, w)
    out.index_copy_(0, dst_slot, slots.reshape(b * N_SLOTS, DIM).to(torch.float32))
    if n_tok:
        # tokens: the chosen positions only, P (127 x token_dim), normalised, tagged
        h = states.reshape(b * t, states.shape[-1]).index_select(0, src)
        u = (h.float() @ consts["P"].T).to(hi)
        toks = fmt.write_tokens(torch.empty((n_tok, DIM), dtype=torch.float32, device=dev), u, safe_norm(u))
        out.index_copy_(0, dst_tok, toks)
    return out


# -- the copy to the host -----------------------------------------------------------------------
class DegenerateVector(ValueError):
    """The model gave a text a zero or non-finite vector, which cannot be normalised.
    ``position``: the text's place in the caller's input; whoever encodes a part of that input
    (a chunk of a stream, a request of a longer call) moves it to the whole with :meth:`moved`.

    >>> str(DegenerateVector(1).moved(4))
    'text 5: the model gave a zero or non-finite vector; cannot normalise it'
    """

    def __init__(self, position: int) -> None:
        super().__init__(f"text {position}: the model gave a zero or non-finite vector; "
                         "cannot normalise it")
        self.position = position

    def moved(self, offset: int) -> DegenerateVector:
        """The same error for the text ``offset`` places further on (its part's start)."""
        return DegenerateVector(self.position + offset)

    def __reduce__(self) -> tuple[type, tuple[int]]:  # pickled (another process) with its position
        return DegenerateVector, (self.position,)


class Pending:
    """One batch whose tagged rows are on their way to the host."""

    __slots__ = ("batch", "event", "host", "offsets")

    def __init__(self, batch: TokenBatch, host: Any, event: Any, offsets: np.ndarray) -> None:
        self.batch, self.host, self.event, self.offsets = batch, host, event, offsets


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


def finish(p: Pending) -> tuple[list[int], list[np.ndarray], np.ndarray]:
    """Wait for the copy, split the packed rows into one list per text: (positions in the
    caller's list, the lists, their truncation flags). A row made NaN on the device (a zero or
    non-finite vector) is refused naming its text (:class:`DegenerateVector`)."""
    if p.event is not None:
        p.event.synchronize()
        packed = p.host.numpy().copy()  # pageable memory of its own: the pinned buffer is reused
    else:
        packed = p.host.numpy()
    bad = np.isnan(packed[:, 1])  # a zero or non-finite vector was made NaN on the device
    if bad.any():
        row = int(np.argmax(bad))
        i = int(np.searchsorted(p.offsets, row, side="right")) - 1
        raise DegenerateVector(p.batch.positions[i])
    return p.batch.positions, np.split(packed, p.offsets[1:-1]), p.batch.truncated


__all__ = ["DegenerateVector", "Pending", "device_constants", "finish", "gather_indices", "prefetched",
           "safe_norm", "tag_batch", "to_host"]
