"""The encoder protocol: what stores, the CLI and the framework integrations need.

An encoder turns texts into tagged lists (``float32``, ``(n_i, 128)``, unit rows except
query slots, which carry the query-time dense weight ``w``)::

    encoder.encode_queries(texts, dense_weight=None)  -> list[np.ndarray]
    encoder.encode_documents(texts)                    -> list[np.ndarray]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from uibk_embedding.encoder.tagged import TaggedFormat


@runtime_checkable
class Encoder(Protocol):
    """What stores, the CLI and the framework integrations need from an encoder."""

    format: TaggedFormat

    def encode_queries(
        self, texts: Sequence[str], *, dense_weight: float | None = None, **kw: Any
    ) -> list[np.ndarray]: ...

    def encode_documents(self, texts: Sequence[str], **kw: Any) -> list[np.ndarray]: ...


__all__ = ["Encoder"]
