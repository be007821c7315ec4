"""Input checks and device choices shared by every encoder (in-process, shared, remote).

>>> validate_texts(["a", "b"])
['a', 'b']
>>> resolve_dtype("cpu", None)
'float32'
"""

from __future__ import annotations

import itertools
import operator
import warnings
from collections.abc import Iterable, Iterator, Sequence

from uibk_embedding.tagged import check_text


def validate_texts(texts: Sequence[str], what: str = "texts", start: int = 0) -> list[str]:
    """Texts must be a list of non-empty strings of valid Unicode (no lone surrogate such as
    ``"\\ud800"``, which Python strings allow and tokenizers refuse with an unclear error).
    ``start``: the position of ``texts[0]`` in the caller's whole list or stream (for messages).

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
    for i, t in enumerate(out, start):
        if not isinstance(t, str):
            raise TypeError(f"{what}[{i}] must be a str, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"{what}[{i}] is empty or whitespace only; there is nothing to encode")
        check_text(t, f"{what}[{i}]")
    return out


def text_chunks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    """Validated lists of ``size`` texts (the last shorter) from any iterable; a bad text is
    named by its position in the whole stream. ``size`` (a caller's ``chunk_size``) must be a
    positive integer, checked at once: 0 would give no chunk at all, so no text encoded.

    >>> list(text_chunks(iter("abc"), 2))
    [['a', 'b'], ['c']]
    >>> list(text_chunks(["a", "b", " "], 2))
    Traceback (most recent call last):
    ...
    ValueError: texts[2] is empty or whitespace only; there is nothing to encode
    >>> text_chunks(["a"], 0)
    Traceback (most recent call last):
    ...
    ValueError: chunk_size must be a positive integer, got 0
    """
    try:
        n = operator.index(size) if not isinstance(size, bool) else 0
    except TypeError:
        n = 0
    if n < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {size!r}")
    return _chunks(iter(texts), n)


def _chunks(it: Iterator[str], size: int) -> Iterator[list[str]]:
    start = 0
    while chunk := list(itertools.islice(it, size)):
        yield validate_texts(chunk, start=start)
        start += len(chunk)


def cut_text(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters after its leading whitespace (which a tokenizer
    reads past), so the cut never leaves only whitespace of a text that has words.

    >>> cut_text("a wing in a slipstream", 6), cut_text(" " * 9 + "lift", 2)
    ('a wing', '         li')
    """
    lead = len(text) - len(text.lstrip())
    return text[:lead + max_chars]


def resolve_device(device: str | None = None) -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"`` (or the device asked for)."""
    if device:
        return device
    import torch  # lazily: importing torch costs seconds, and the remote client never needs it

    return "cuda" if torch.cuda.is_available() else "cpu"


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


def warn_truncated(n: int, total: int, limit: int, what: str) -> None:
    """One warning per call naming how many texts were cut (not one per text)."""
    if n:
        warnings.warn(
            f"{n} of {total} {what} were longer than {limit} tokens and were truncated",
            stacklevel=5,
        )


__all__ = ["resolve_device", "resolve_dtype", "validate_texts", "warn_truncated"]
