"""Padded batches: what a tokeniser hands the model, and how texts are cut into batches.

A batch holds texts of similar length (longest first) whose padded size stays within a token
budget, so little of a forward pass is spent on padding. The batches are cut on an estimate
from the characters (tokenising comes later, in the prefetch thread); an encoder whose batch
turns out larger in real tokens (Chinese text: about a token per character) runs it in
:func:`budget_runs` of rows that keep to the budget.

>>> ids, n = pad_ids([[5, 6, 7], [8]], pad_id=0)
>>> ids.tolist(), n.tolist()
([[5, 6, 7], [8, 0, 0]], [3, 1])
>>> list(padded_batches(["a" * 300, "b" * 30, "c"], [0, 1, 2], max_len=256, batch_tokens=120))
[[0], [1, 2]]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    total = int(lengths.sum())
    width = int(width if width is not None else offset + (lengths.max() if len(rows) else 0))
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    if total:
        cols = np.arange(width)
        mask = (cols >= offset) & (cols < offset + lengths[:, None])
        out[mask] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=total)
    return out, lengths


def length_order(texts: Sequence[str]) -> list[int]:
    """Positions of ``texts``, longest first (ties in input order)."""
    return sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)


def padded_batches(texts: Sequence[str], order: Sequence[int], max_len: int,
                   batch_tokens: int) -> Iterator[list[int]]:
    """Batches (lists of positions, in ``order``) of similar length whose padded size stays
    within ``batch_tokens``; a text's tokens are estimated from its characters, at most
    ``max_len``."""
    batch: list[int] = []
    longest = 0
    for i in order:
        est = min(max_len, len(texts[i]) // 3 + 8)  # cheap token estimate (not a bound: budget_runs)
        longest = max(longest, est)
        if batch and longest * (len(batch) + 1) > batch_tokens:
            yield batch
            batch, longest = [], est
        batch.append(i)
    if batch:
        yield batch


def budget_runs(lengths: Sequence[int], batch_tokens: int) -> list[slice]:
    """Consecutive runs of rows (``lengths``: their real token counts, in batch order) whose
    padded size, rows times the longest, stays within ``batch_tokens``; a row longer than the
    budget runs alone.

    >>> budget_runs([5, 4, 4, 3, 9], 12)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    runs: list[slice] = []
    first = longest = 0
    for i, n in enumerate(lengths):
        longest = max(longest, int(n))
        if i > first and longest * (i - first + 1) > batch_tokens:
            runs.append(slice(first, i))
            first, longest = i, int(n)
    if len(lengths):
        runs.append(slice(first, len(lengths)))
    return runs


__all__ = ["TokenBatch", "budget_runs", "length_order", "pad_ids", "padded_batches"]
