"""Every docstring example in the package runs (numpy-style Examples are doctests)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import uibk_embedding
from uibk_embedding._optional import missing_extra


def _modules() -> list[str]:
    """All modules of the package."""
    names = {"uibk_embedding"}
    for info in pkgutil.walk_packages(uibk_embedding.__path__, "uibk_embedding."):
        names.add(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        if not missing_extra(e):  # a broken import inside the package fails, never skips
            raise
        pytest.skip(f"{name}: an optional extra is not installed ({e})")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
