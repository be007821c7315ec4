"""Stores of tagged multi-vectors: one interface, many backends.

>>> from uibk_embedding.adapters import open_store
>>> open_store("exact").backend
'exact'
"""

from uibk_embedding.adapters.base import Hit, MultiVectorStore, Record
from uibk_embedding.adapters.filters import parse_filter
from uibk_embedding.adapters.registry import BACKENDS, open_store

__all__ = ["BACKENDS", "Hit", "MultiVectorStore", "Record", "open_store", "parse_filter"]
