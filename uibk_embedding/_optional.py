"""Lazy imports of optional dependencies with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise ImportError naming the ``extra`` that provides it.

    >>> require("json", "none").__name__
    'json'
    >>> require("surely_not_installed_xyz", "qdrant", "the Qdrant adapter")
    Traceback (most recent call last):
    ...
    ImportError: the Qdrant adapter needs 'surely_not_installed_xyz': pip install 'uibk-embedding[qdrant]'
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        what = purpose or f"this feature ({extra})"
        raise ImportError(
            f"{what} needs {module.split('.')[0]!r}: pip install 'uibk-embedding[{extra}]'"
        ) from e
