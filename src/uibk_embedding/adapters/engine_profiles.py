"""Profiles on the engines' own compression: one set of names, checked and compared the same way
for every backend whose store takes ``profile=`` (Qdrant, Milvus, pgvector, LanceDB, PLAID).

The names are the exact store's (:data:`uibk_embedding.adapters.exact.PROFILES`); each engine maps
the ones it has a meaning for onto its own settings (``supported``: name -> what it does there) and
refuses the others by name. The profile is recorded with the collection (in the engine's own
config or our record) and checked on open: asking for another profile than the one recorded is a
:class:`~uibk_embedding.errors.CollectionMismatch` naming both (:func:`profile_conflict`).

Example
-------
>>> supported = {"exact": "float32", "float16": "halves"}
>>> check_profile("float16", supported, "qdrant")
'float16'
>>> check_profile(None, supported, "qdrant") is None
True
>>> check_profile("compact", supported, "qdrant")
Traceback (most recent call last):
...
ValueError: profile='compact' has no meaning on qdrant; it takes 'exact' (float32), 'float16' (halves)
>>> print(profile_conflict("float16", "int8", "Qdrant collection 'docs'"))  # doctest: +NORMALIZE_WHITESPACE
Qdrant collection 'docs' has profile='float16', not 'int8': open it without profile, or index into a
new collection
>>> profile_conflict("float16", None, "x") is None, profile_conflict("int8", "int8", "x") is None
(True, True)
"""

from __future__ import annotations

from collections.abc import Mapping

PROFILE_NAMES: tuple[str, ...] = ("exact", "float16", "compact", "exact-rerank", "int8", "int8-rerank")
"""Every profile name a store may be asked for (the exact store's :data:`PROFILES`, in its order;
a test keeps the two equal)."""


def check_profile(name: str | None, supported: Mapping[str, str], backend: str) -> str | None:
    """``name`` if ``backend`` takes it (a key of ``supported``); ``None`` for ``None`` (the
    profile a collection already has, or the engine's default for a new one).

    Parameters
    ----------
    name: the profile asked for.
    supported: the profiles the backend has a meaning for, each with a short description of what
        it configures there (shown in the error for the others).
    backend: the backend's name, for the error.

    Raises
    ------
    ValueError: ``name`` is no profile at all, or one ``backend`` does not take (the message lists
        the ones it takes).

    >>> check_profile("int8", {"int8": "scalar int8"}, "milvus")
    'int8'
    >>> check_profile("fast", {"int8": "scalar int8"}, "milvus")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: profile must be one of 'exact', 'float16', ..., got 'fast'
    """
    if name is None:
        return None
    if name not in PROFILE_NAMES:
        raise ValueError(f"profile must be one of {', '.join(map(repr, PROFILE_NAMES))}, got {name!r}")
    if name not in supported:
        takes = ", ".join(f"{k!r} ({v})" for k, v in supported.items())
        raise ValueError(f"profile={name!r} has no meaning on {backend}; it takes {takes}")
    return name


def profile_conflict(saved: str | None, asked: str | None, where: str) -> str | None:
    """The :class:`~uibk_embedding.errors.CollectionMismatch` message when an existing collection
    (``where``, e.g. ``"Qdrant collection 'docs' at /data/q"``) recorded ``saved`` and the caller
    asked for another profile; ``None`` when they agree or nothing was asked.

    >>> profile_conflict(None, "int8", "table 'd'")[:40]
    "table 'd' has profile=None, not 'int8': "
    """
    if asked is None or saved == asked:
        return None
    return (f"{where} has profile={saved!r}, not {asked!r}: open it without profile, or index into a "
            "new collection")
