"""Lazy imports of optional dependencies with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from uibk_embedding.errors import MissingDependency


def require(module: str, extra: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise ImportError naming the ``extra`` that provides it.

    >>> require("json", "none").__name__
    'json'
    >>> try:
    ...     require("surely_not_installed_xyz", "qdrant", "the Qdrant adapter")
    ... except ImportError as e:
    ...     print(type(e).__name__, "|", e)  # doctest: +ELLIPSIS
    MissingDependency | the Qdrant adapter needs ...: pip install 'uibk-embedding[qdrant]'
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        what = purpose or f"this feature ({extra})"
        raise MissingDependency(
            f"{what} needs {module.split('.')[0]!r}: pip install 'uibk-embedding[{extra}]'"
        ) from e
