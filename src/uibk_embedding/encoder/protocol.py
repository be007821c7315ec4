"""The encoder protocols: what the callers of an encoder use, said once.

An encoder turns texts into tagged lists (``float32``, ``(n_i, 128)``, unit rows except
query slots, which carry the query-time dense weight ``w``)::

    encoder.encode_queries(texts, dense_weight=None)  -> list[np.ndarray]
    encoder.encode_documents(texts)                    -> list[np.ndarray]

* :class:`Encoder`: what every encoder offers and the stores, the CLI (``index``, ``search``,
  ``eval``), distributed indexing, the server, the evaluation and the framework integrations
  use. Satisfied by the in-process encoders
  (:class:`~uibk_embedding.encoder.base.TaggedEncoder`: transformer, uibk, composed, pylate),
  by :class:`~uibk_embedding.encoder.shared.SharedEncoder` and by
  :class:`~uibk_embedding.encoder.remote.RemoteEncoder`.
* :class:`LocalEncoder`: an :class:`Encoder` that runs in this process with its own fixed
  projections: what ``fit-projection``, ``index --fit-projection``, ``export-pylate``, the
  server (which wraps one) and the evaluation cache keys use besides. The in-process encoders
  satisfy it (a PyLate model holds its projections inside the model: its
  ``fit_projection`` / ``set_projections`` / ``save_projections`` raise
  ``NotImplementedError``); a shared or remote encoder does not (fit the encoder, then share
  or serve it).

:func:`protocol_gaps` says what an object lacks of a protocol (``isinstance`` only says whether).

>>> class Half:
...     def encode_documents(self, texts, *, show_progress=None): ...
>>> protocol_gaps(Half(), Encoder)[:3]
['dense_weight', 'doc_max_length', 'encode_documents_iter']
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from uibk_embedding.tagged import TaggedFormat


@runtime_checkable
class Encoder(Protocol):
    """What every encoder offers (see the module docstring for who uses it)."""

    #: the tagged format of its lists, with its projection's identity: what a store records and checks
    format: TaggedFormat
    #: the default query-time dense weight ``w`` (``encode_queries(dense_weight=None)``)
    dense_weight: float
    #: the model it runs, as the CLI and the server name it
    model_name: str
    #: tokens read of a query / a document (longer texts are truncated, with one warning per call)
    query_max_length: int
    doc_max_length: int

    def encode_queries(self, texts: Sequence[str], *, dense_weight: float | None = None,
                       show_progress: bool | None = None) -> list[np.ndarray]:
        """Tagged query lists: 3 slots scaled by ``dense_weight``, then the query's token vectors."""
        ...

    def encode_documents(self, texts: Sequence[str], *,
                         show_progress: bool | None = None) -> list[np.ndarray]:
        """Tagged document lists: 3 unit slots, then one vector per token read."""
        ...

    def encode_documents_iter(self, texts: Iterable[str], *, chunk_size: int = ...) -> Iterator[np.ndarray]:
        """The document lists of any iterable of texts, in order, a chunk at a time (bounded memory)."""
        ...


@runtime_checkable
class LocalEncoder(Encoder, Protocol):
    """An :class:`Encoder` in this process with its own fixed projections ``R`` and ``P``."""

    #: the kind recorded in its configuration (``"transformer"``, ``"uibk"``, ``"composed"``, ``"pylate"``)
    kind: str
    #: the fixed projections: ``R`` (381 x D) of the sentence vector, ``P`` (127 x d) of the token states
    R: np.ndarray
    P: np.ndarray
    #: query tokens that take part in token matching
    query_token_cap: int
    #: padded tokens per forward pass (the shared encoder's batching budget)
    batch_tokens: int

    def config(self) -> dict[str, Any]:
        """What ``load_encoder`` needs to rebuild it (and what keys the evaluation cache)."""
        ...

    def fit_projection(self, texts: Sequence[str], *, fit_dense: bool = False,
                       max_token_rows: int = ...) -> LocalEncoder:
        """Replace ``P`` (and ``R`` with ``fit_dense``) by a PCA fitted on ``texts``; ``self``."""
        ...

    def set_projections(self, projections: dict[str, np.ndarray], kind: str) -> None:
        """Use other fixed matrices ``R`` and ``P`` of the same shapes from now on."""
        ...

    def save_projections(self, path: str | os.PathLike) -> None:
        """Write the projections and the configuration into the folder ``path``."""
        ...

    def save_pylate(self, path: str | os.PathLike) -> Path:
        """Save as a PyLate model folder (refused by encoders that cannot be exported)."""
        ...


def _members(protocol: type) -> list[str]:
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (object, Protocol) or klass.__name__ == "Generic":
            continue
        names.update(getattr(klass, "__annotations__", {}))
        names.update(n for n, v in vars(klass).items() if inspect.isfunction(v) and not n.startswith("_"))
    return sorted(names)


def protocol_gaps(obj: object, protocol: type) -> list[str]:
    """What ``obj`` lacks of ``protocol`` (:class:`Encoder` or :class:`LocalEncoder`): the
    members it does not have, and for each method a keyword parameter of the protocol that the
    object's method does not accept (``"encode_queries(dense_weight=)"``); empty when it has all.
    """
    gaps = []
    for name in _members(protocol):
        if not hasattr(obj, name):
            gaps.append(name)
            continue
        want = getattr(protocol, name, None)
        if not inspect.isfunction(want):
            continue
        try:
            have = inspect.signature(getattr(obj, name)).parameters
        except (TypeError, ValueError):  # a builtin without a signature: presence must do
            continue
        if any(p.kind is p.VAR_KEYWORD for p in have.values()):
            continue
        for p in inspect.signature(want).parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.name not in have:
                gaps.append(f"{name}({p.name}=)")
    return gaps


__all__ = ["Encoder", "LocalEncoder", "protocol_gaps"]
