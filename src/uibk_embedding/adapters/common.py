"""Small helpers several backends share: server version strings and a per-store call guard.

Example
-------
>>> parse_version("v2.3.5-lite"), parse_version("1.31.2-rc.1"), parse_version("0.7")
((2, 3, 5), (1, 31, 2), (0, 7, 0))
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
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


def serialized(method: Callable[..., T]) -> Callable[..., T]:
    """Run a store method under the store's ``_guard`` (a lock, or a no-op context), so calls of
    one store object in one process take turns where the engine needs it (Milvus: a write spans
    two collections; qdrant-client's local mode is not thread-safe)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> T:
        with self._guard:
            return method(self, *args, **kwargs)

    return wrapper
