"""Shared fixtures: tagged test data, the embedded encoder, real vectors, backend specs.

Backends register themselves for the conformance suite in ``tests/backends/<name>.py``: each
file defines ``SPECS``, a list of :class:`BackendSpec`. Adding a backend needs no change here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding._optional import missing_extra
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import datasets_dir, load_backend_specs, open_spec

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


BACKEND_SPECS = load_backend_specs(HERE / "backends")


def _spec_params() -> list:
    params = []
    for s in BACKEND_SPECS:
        marks = [pytest.mark.skip(reason=s.skip)] if s.skip else []
        params.append(pytest.param(s, id=s.name, marks=marks))
    return params


def _registry_gaps() -> list:
    """A skipped parameter for each registry backend that cannot be built here (saying why)."""
    from uibk_embedding.adapters.registry import BACKENDS, backend_factory

    params = []
    for name in sorted(BACKENDS):
        try:
            backend_factory(name)
        except NotImplementedError as e:
            reason = f"backend {name!r}: {e} (its module has not landed yet)"
        except ImportError as e:
            if not missing_extra(e):  # a broken import inside the package fails, never skips
                raise
            reason = f"backend {name!r}: optional dependency missing ({e})"
        else:
            continue
        params.append(pytest.param(None, id=f"{name}-unavailable", marks=[pytest.mark.skip(reason=reason)]))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that takes a ``spec`` argument runs once per registered backend spec; one that
    takes ``backend_spec`` (through :func:`backend_store`) once per backend (see there)."""
    if "spec" in metafunc.fixturenames:
        metafunc.parametrize("spec", _spec_params())
    if "backend_spec" in metafunc.fixturenames:
        metafunc.parametrize("backend_spec", _spec_params() + _registry_gaps())


@pytest.fixture
def backend_store(backend_spec, tmp_path):
    """An empty store, once per backend (its representative spec, see
    :func:`uibk_embedding.testing.open_spec`), closed afterwards."""
    store = open_spec(backend_spec, tmp_path, representative_only=True)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def fmt() -> TaggedFormat:
    return TaggedFormat()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def datasets() -> Path:
    root = datasets_dir()
    if not (root / "cranfield").exists():
        pytest.fail(f"test collections missing under {root} (set UIBK_DATASETS)")
    return root


@pytest.fixture(scope="session")
def encoder():
    from uibk_embedding.encoder import load_encoder

    return load_encoder()


@dataclass
class RealData:
    doc_ids: list[str]
    docs: list[np.ndarray]
    texts: list[str]
    queries: list[np.ndarray]
    query_texts: list[str]


@pytest.fixture(scope="session")
def real_data(encoder) -> RealData:
    """200 Cranfield documents and 25 queries encoded by the embedded default (cached)."""
    from uibk_embedding.apps.data import Collection, load_beir
    from uibk_embedding.apps.evaluation import encode_collection

    root = datasets_dir() / "cranfield"
    if not root.exists():
        pytest.fail(f"test collection missing: {root} (set UIBK_DATASETS)")
    full = load_beir(root)
    qids = list(full.queries)[:25]
    coll = Collection("cranfield-test-subset", full.corpus[:200],
                      {q: full.queries[q] for q in qids}, {q: full.qrels[q] for q in qids})
    enc = encode_collection(encoder, coll)
    return RealData(enc.doc_ids, enc.docs, [d.full_text for d in coll.corpus],
                    enc.queries, [coll.queries[q] for q in qids])
