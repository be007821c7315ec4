"""Helpers for testing stores: how the conformance suite drives a backend.

A backend joins the conformance suite (``tests/conformance/``) with a file
``tests/backends/<name>.py`` that defines ``SPECS``, a list of :class:`BackendSpec`:

>>> from uibk_embedding.adapters.exact import ExactStore
>>> spec = BackendSpec("exact-memory", make=lambda d: ExactStore())
>>> spec.contract
'exact'
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uibk_embedding.adapters.base import MultiVectorStore
from uibk_embedding.encoder.tagged import TaggedFormat

REPO = Path(__file__).resolve().parent.parent


def datasets_dir() -> Path:
    """``$UIBK_DATASETS``, else ``../shared/datasets`` beside the checkout."""
    return Path(os.environ.get("UIBK_DATASETS", REPO.parent / "shared" / "datasets"))


def make_list(fmt: TaggedFormat, rng: np.random.Generator, n_tokens: int,
              dense_weight: float = 1.0) -> np.ndarray:
    """A random tagged list (3 slots + ``n_tokens`` tokens).

    >>> make_list(TaggedFormat(), np.random.default_rng(0), 5).shape
    (8, 128)
    """
    return fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n_tokens, 127)), dense_weight)


@dataclass
class BackendSpec:
    """How the conformance suite drives one backend.

    make(dir) -> an empty store whose files (if any) live under ``dir``;
    reopen(dir, **options) -> the same store opened again after ``close()``, ``options`` (e.g.
    ``format=``) passed to the constructor (None: not persistent);
    contract "exact": same ids, order and scores (rel. 1e-5) as exact MaxSim;
    contract "approximate": recall@10 against exact MaxSim >= recall_floor on real data.
    get_atol: how close ``get`` must return the stored vectors.
    skip: a reason to skip (e.g. the server URL is not set).
    """

    name: str
    make: Callable[[Path], MultiVectorStore]
    reopen: Callable[..., MultiVectorStore] | None = None
    contract: str = "exact"
    recall_floor: float = 1.0
    score_rtol: float = 1e-5
    get_atol: float = 1e-6
    skip: str | None = None


def load_backend_specs(folder: str | os.PathLike) -> list[BackendSpec]:
    """All ``SPECS`` of the ``*.py`` files in ``folder`` (``tests/backends``), in name order."""
    import importlib.util

    specs: list[BackendSpec] = []
    for path in sorted(Path(folder).glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"uibk_test_backends_{path.stem}", path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        specs.extend(mod.SPECS)
    return specs


# One configuration per backend runs the framework suites (LangChain's standard suites, the
# LlamaIndex store tests): they test the wrappers' semantics on each engine, while the
# conformance suite covers every configuration's search. The first spec of a backend name is
# its representative; UIBK_ALL_SPECS=1 runs every spec.
ALL_SPECS = os.environ.get("UIBK_ALL_SPECS", "") not in ("", "0")
_REPRESENTATIVE: dict[str, str] = {}


def open_spec(spec: BackendSpec, folder: Path, *, representative_only: bool = False) -> MultiVectorStore:
    """An empty store of ``spec`` (for pytest: skips the test when the spec's module has not
    landed yet, or, with ``representative_only``, when another spec represents its backend).

    >>> from uibk_embedding.adapters.exact import ExactStore
    >>> open_spec(BackendSpec("exact-doc", lambda d: ExactStore()), Path(".")).count()
    0
    """
    import pytest

    try:
        store = spec.make(folder)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("uibk_embedding"):
            pytest.skip(f"{spec.name}: module {e.name} has not landed yet")
        raise
    first = _REPRESENTATIVE.setdefault(store.backend, spec.name)
    if representative_only and first != spec.name and not ALL_SPECS:
        store.close()
        pytest.skip(f"backend {store.backend!r} runs the framework suites as {first!r} "
                    "(UIBK_ALL_SPECS=1 runs every configuration)")
    return store
