"""Small helpers several backends share: server version strings, batches, exact numbers for
engines that compare a number's text, and a per-store call guard.

Example
-------
>>> parse_version("v2.3.5-lite"), parse_version("1.31.2-rc.1"), parse_version("0.7")
((2, 3, 5), (1, 31, 2), (0, 7, 0))
>>> [list(b) for b in batched([1, 2, 3, 4, 5], 2)]
[[1, 2], [3, 4], [5]]
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_VERSION = re.compile(r"\d+(?:\.\d+){0,2}")


def parse_version(text: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of the first version number in a server or extension version
    string (missing parts are 0; ``(0, 0, 0)`` when there is none), for comparing with minimum
    versions.

    >>> parse_version("2.6.4"), parse_version("v1.29.0"), parse_version("0.8.6+build"), parse_version("")
    ((2, 6, 4), (1, 29, 0), (0, 8, 6), (0, 0, 0))
    """
    m = _VERSION.search(text)
    nums = [int(x) for x in m.group(0).split(".")] if m else []
    nums += [0] * (3 - len(nums))
    return nums[0], nums[1], nums[2]


def batched(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size`` (``itertools.batched`` is 3.12+)."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def exact_number(v: Any) -> Any:
    """An integral float as the int it equals, else ``v``, for engines that compare a number's
    JSON text (pgvector's jsonb) or its type (Weaviate): the shortest spelling of a large float
    (``1.152921504606847e+18``) is not its value (``2**60``), and ``1 == 1.0`` must hold.

    >>> exact_number(float(2**60)), exact_number(2.5), exact_number(True)
    (1152921504606846976, 2.5, True)
    """
    return int(v) if isinstance(v, float) and v.is_integer() else v


def serialized(method: Callable[..., T]) -> Callable[..., T]:
    """Run a store method under the store's ``_guard`` (a lock, or a no-op context), so calls of
    one store object in one process take turns where the engine needs it (Milvus: a write spans
    two collections; qdrant-client's local mode is not thread-safe). The base's ``upsert`` and
    ``delete`` already run ``_upsert``/``_delete`` under it; reads and maintenance use this."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> T:
        with self._guard:
            return method(self, *args, **kwargs)

    return wrapper
