"""The library's exceptions: one base class, one type per condition, on every backend.

Each also subclasses the builtin it stands for, so code written against the builtin
(``except ValueError``, ``except ConnectionError``, ...) keeps working.

====================== ======================= ==================================================
exception              also a                  raised when
====================== ======================= ==================================================
``UIBKError``          ``Exception``           (the base: catch every error of this library)
``CollectionMismatch`` ``ValueError``          an existing store, collection or shard does not fit
                                               (another tagged format, layout, metric, build
                                               parameters, or not a store at all); it is left
                                               unchanged
``BackendUnavailable`` ``ConnectionError``     a server (Qdrant, Milvus, Weaviate, PostgreSQL,
                                               a uibk-embed encoder server) cannot be reached
``ServerTooOld``       ``RuntimeError``        the server runs but lacks a feature the store needs
``MissingDependency``  ``ImportError``         an optional dependency is not installed (the
                                               message names the extra to install)
``UnknownBackend``     ``ValueError``          ``open_store`` got a backend name it does not know
``EngineError``        ``RuntimeError``        the engine failed or returned something impossible
``StoreInUse``         ``RuntimeError``        a store folder is open in another store object or
                                               process, or the store was closed
``ReadOnlyStore``      ``StoreInUse``          a write to a store opened with ``read_only=True``;
                                               nothing written
``DataError``          ``ValueError``          an input file (JSONL, BEIR, qrels) is malformed
``ModelChanged``       ``ValueError``          a saved encoder's model folder is not the model it
                                               was saved with (its content hash differs): its
                                               vectors must not join the old ones
``UntrustedCode``      ``ValueError``          a model folder would run its own Python code on
                                               loading and ``trust_remote_code`` was not given
``StoreNotFound``      ``FileNotFoundError``   a store opened for reading does not exist (a read
                                               never creates one)
``InvalidInput``       ``ValueError``          an id, metadata value or filter is past a limit
                                               every backend shares (lone surrogates, NUL
                                               characters in metadata, nesting depth,
                                               integers beyond 64 bits); nothing written
====================== ======================= ==================================================

Example
-------
>>> from uibk_embedding.adapters.registry import open_store
>>> try:
...     open_store("no-such-engine")
... except UIBKError as e:
...     print(type(e).__name__, isinstance(e, ValueError))
UnknownBackend True
"""

from __future__ import annotations

from typing import Any


class UIBKError(Exception):
    """Base class of every exception this library raises on purpose."""


class CollectionMismatch(UIBKError, ValueError):
    """An existing store/collection/shard does not have the layout the store needs (unchanged)."""


class BackendUnavailable(UIBKError, ConnectionError):
    """A server could not be reached (after the configured retries and timeout)."""


class ServerTooOld(UIBKError, RuntimeError):
    """The server is reachable but its version lacks a feature this store needs."""


class MissingDependency(UIBKError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""


class UnknownBackend(UIBKError, ValueError):
    """A backend name that ``open_store`` does not know."""


class EngineError(UIBKError, RuntimeError):
    """The engine failed, panicked or answered something impossible."""


def call_engine(engine: str, error: type[EngineError], what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, with the engine's errors and Rust panics raised as ``error``.

    A Rust panic reaches Python as pyo3's ``PanicException``, which derives from
    ``BaseException``, so ``except Exception`` does not catch it; this does (and lets
    KeyboardInterrupt / SystemExit through).

    >>> try:
    ...     call_engine("an engine", EngineError, "a division", lambda: 1 / 0)
    ... except EngineError as e:
    ...     print(e)
    an engine failed during a division: ZeroDivisionError: division by zero
    """
    try:
        return fn(*args, **kwargs)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except Exception as e:
        raise error(f"{engine} failed during {what}: {type(e).__name__}: {e}") from e
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
        raise error(f"{engine} panicked during {what}: {first}") from e


class StoreInUse(UIBKError, RuntimeError):
    """The store's folder is held by another open store, or this store was closed."""


class ReadOnlyStore(StoreInUse):
    """A write to a store opened with ``read_only=True`` (a ``StoreInUse``, as it was before it
    had a type of its own); nothing was written.

    >>> issubclass(ReadOnlyStore, StoreInUse), issubclass(ReadOnlyStore, RuntimeError)
    (True, True)
    """


class DataError(UIBKError, ValueError):
    """A malformed input file; the message names the file and line."""


class ModelChanged(UIBKError, ValueError):
    """A saved encoder refers to a model folder whose files changed since it was saved."""


class UntrustedCode(UIBKError, ValueError):
    """A model folder holds custom module code and ``trust_remote_code=True`` was not given."""


class StoreNotFound(UIBKError, FileNotFoundError):
    """A store opened for reading does not exist; nothing was created."""


class InvalidInput(UIBKError, ValueError):
    """An input past a limit that every backend shares; refused before any engine sees it."""
