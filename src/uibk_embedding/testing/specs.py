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

from uibk_embedding._optional import missing_extra
from uibk_embedding.adapters.base import MultiVectorStore
from uibk_embedding.encoder import load_encoder
from uibk_embedding.tagged import TaggedFormat

REPO = Path(__file__).resolve().parents[3]  # src/uibk_embedding/testing/specs.py


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
    shared_writers: any number of store objects and processes may write to one store at once
    (a database server serialises them): the one-writer-per-folder test does not apply.
    index_used(store) -> bool: after the real-data searches, whether they went through the
    engine's index (for stores that scan small collections exactly, so a spec meant to test
    the engine cannot silently test the scan); None: not checked.
    takes_create: ``reopen(dir, create=False)`` opens only a store that exists (the class takes
        ``create``); the folder backends are checked by ``open_store`` before their class runs
        (tests/test_open_store.py).
    variant: another configuration of a backend that a main spec (variant False) stands for in
    the framework suites (LangChain's standard suites, the LlamaIndex store tests): the
    conformance suite runs it, those suites do not (unless ``UIBK_ALL_SPECS=1``).
    """

    name: str
    make: Callable[[Path], MultiVectorStore]
    reopen: Callable[..., MultiVectorStore] | None = None
    contract: str = "exact"
    recall_floor: float = 1.0
    score_rtol: float = 1e-5
    get_atol: float = 1e-6
    skip: str | None = None
    shared_writers: bool = False
    index_used: Callable[[MultiVectorStore], bool] | None = None
    takes_create: bool = False
    variant: bool = False


def engine_indexed(store: MultiVectorStore) -> bool:
    """Whether an engine-indexed store (PLAID, WARP) has its engine index and holds nothing
    pending beside it: a search then took its candidates from the engine (``index_used``).

    >>> from uibk_embedding.adapters.exact import ExactStore
    >>> engine_indexed(ExactStore())
    False
    """
    return bool(getattr(store, "has_index", False)) and getattr(store, "n_pending", 1) == 0


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` of this checkout, imported as a module (the folder is no
    package; its scripts import each other by bare name, so it is on ``sys.path`` while one
    loads).

    >>> load_benchmark("scale").ENGINES
    ('exact', 'exact16', 'compact', 'exact-rerank', 'plaid', 'warp')
    """
    import importlib.util
    import sys

    folder = REPO / "benchmarks"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(folder))
    return mod


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
# conformance suite covers every configuration's search. Specs marked ``variant`` are left out
# of them; UIBK_ALL_SPECS=1 runs every spec.
ALL_SPECS = os.environ.get("UIBK_ALL_SPECS", "") not in ("", "0")


def open_spec(spec: BackendSpec, folder: Path, *, representative_only: bool = False) -> MultiVectorStore:
    """An empty store of ``spec`` (for pytest: skips the test when an optional extra the spec
    needs is not installed, or, with ``representative_only``, when the spec is a ``variant``).

    >>> from uibk_embedding.adapters.exact import ExactStore
    >>> open_spec(BackendSpec("exact-doc", lambda d: ExactStore()), Path(".")).count()
    0
    """
    import pytest

    if representative_only and spec.variant and not ALL_SPECS:
        pytest.skip(f"{spec.name} is a variant of a backend whose main spec runs the framework "
                    "suites (UIBK_ALL_SPECS=1 runs every configuration)")
    try:
        return spec.make(folder)
    except ImportError as e:
        if not missing_extra(e):  # a broken import (this package's own included) fails, never skips
            raise
        pytest.skip(f"{spec.name}: an optional extra is not installed ({e})")


class InstrumentedEncoderFactory:
    """Builds an encoder (``load_encoder(path, **options)``) that logs each ``encode_documents``
    call and can kill its own process once: for tests of distributed runs, where encoders live
    in other processes (Ray actors) and the factory is pickled to them.

    Each call appends ``"<pid> <number of texts>"`` to ``log`` (after the kill check, so a killed
    call logs nothing). With ``kill_at_call=k`` the ``k``-th call of an encoder first creates
    ``marker`` (exclusively, holding the pid) and then sends SIGKILL to its own process; once the
    marker exists no encoder kills again, so a retried batch succeeds.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> enc = InstrumentedEncoderFactory(os.path.join(d, "log"))()
    >>> [v.shape[1] for v in enc.encode_documents(["a wing"])]
    [128]
    >>> encoded_counts(os.path.join(d, "log")) == {os.getpid(): 1}
    True
    """

    def __init__(self, log: str | os.PathLike, kill_at_call: int | None = None,
                 marker: str | os.PathLike | None = None, path: str | None = None, **options: object) -> None:
        if kill_at_call is not None and marker is None:
            raise ValueError("kill_at_call needs a marker file")
        self.log, self.kill_at_call, self.marker = str(log), kill_at_call, marker and str(marker)
        self.path, self.options = path, options

    def __call__(self) -> _InstrumentedEncoder:
        return _InstrumentedEncoder(load_encoder(self.path, **self.options), self)


class _InstrumentedEncoder:
    def __init__(self, inner: object, factory: InstrumentedEncoderFactory) -> None:
        self.inner, self.factory, self.calls = inner, factory, 0
        self.format = inner.format  # type: ignore[attr-defined]

    def encode_queries(self, texts, **kw):  # type: ignore[no-untyped-def]
        return self.inner.encode_queries(texts, **kw)  # type: ignore[attr-defined]

    def encode_documents(self, texts, **kw):  # type: ignore[no-untyped-def]
        import signal

        f = self.factory
        self.calls += 1
        if f.kill_at_call is not None and self.calls == f.kill_at_call and f.marker:
            try:
                fd = os.open(f.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        with open(f.log, "a") as log:
            log.write(f"{os.getpid()} {len(texts)}\n")
        return self.inner.encode_documents(texts, **kw)  # type: ignore[attr-defined]


def encoded_counts(log: str | os.PathLike) -> dict[int, int]:
    """Texts encoded per process, from an :class:`InstrumentedEncoderFactory` log ({} if none)."""
    out: dict[int, int] = {}
    if os.path.exists(log):
        for line in Path(log).read_text().splitlines():
            pid, n = line.split()
            out[int(pid)] = out.get(int(pid), 0) + int(n)
    return out


def batching_noise(encoder: object, texts: list[str], *, is_query: bool = False,
                   batchings: tuple[tuple[int, int], ...] = ((7, 1), (20, 2), (64, 2)),
                   shuffles: int = 0, seed: int = 0) -> float:
    """The encoder's own batching noise on ``texts``, measured: the largest coordinate difference
    between a text's tagged list encoded alone (one text, no padding, the current torch thread
    count) and the same text encoded inside other batches: for each ``(batch size, threads)`` in
    ``batchings``, consecutive batches of that size under that torch thread count, and as many
    shuffled orders again as ``shuffles``.

    What the encoders promise (docs/model.md, "Batching"): the same text in the same batch gives
    bit-identical lists; in another batch it differs only by float32 rounding (padding changes
    the shape of the attention reductions), by at most this amount from its unbatched list. Two
    encodings of one text in any two batches therefore differ by at most twice it (triangle
    inequality): the tolerance of every test that compares vectors made by different batchings
    comes from here, measured on the machine that runs it, never a constant.

    >>> from uibk_embedding.encoder import load_encoder
    >>> texts = ["a wing", "the lift of a swept wing in a slipstream"]
    >>> 0.0 <= batching_noise(load_encoder(), texts, batchings=((2, 1),)) < 1e-4
    True
    """
    import torch

    encode = encoder.encode_queries if is_query else encoder.encode_documents  # type: ignore[attr-defined]
    texts = list(texts)
    before = torch.get_num_threads()
    rng = np.random.default_rng(seed)
    alone = [encode([t], show_progress=False)[0] for t in texts]
    orders = [np.arange(len(texts))] + [rng.permutation(len(texts)) for _ in range(shuffles)]
    worst = 0.0
    try:
        for size, n_threads in batchings:
            torch.set_num_threads(n_threads)
            for order in orders:
                for a in range(0, len(texts), size):
                    part = [int(i) for i in order[a:a + size]]
                    got = encode([texts[i] for i in part], show_progress=False)
                    for i, v in zip(part, got, strict=True):
                        if v.shape != alone[i].shape:
                            raise AssertionError(f"text {i}: {v.shape} rows in a batch, "
                                                 f"{alone[i].shape} alone")
                        worst = max(worst, float(np.abs(v - alone[i]).max()))
    finally:
        torch.set_num_threads(before)
    return worst


def score_bound(query: np.ndarray, vector_bound: float) -> float:
    """How far a MaxSim score of ``query`` can move when every document coordinate moves by at most
    ``vector_bound``: each query vector's best match moves by at most ``|q_i| * |dv|``, with
    ``|dv| <= sqrt(dim) * vector_bound``.

    >>> round(score_bound(np.ones((2, 4)) / 2, 1e-6), 9)
    4e-06
    """
    q = np.asarray(query, dtype=np.float64)
    return float(np.linalg.norm(q, axis=1).sum() * np.sqrt(q.shape[1]) * vector_bound)


def assert_same_ranking(got: list[tuple[str, float]], want: list[tuple[str, float]], tol: float) -> None:
    """Two top-k lists of one query over the same documents whose scores may differ by ``tol``:
    the scores agree position by position within ``tol`` (sorted lists move by at most the largest
    perturbation), and where the ids differ the two documents were tied within ``2 * tol``.

    >>> assert_same_ranking([("a", 2.0), ("b", 1.0)], [("a", 2.0), ("b", 1.0)], 0.0)
    >>> assert_same_ranking([("b", 1.5), ("a", 1.5)], [("a", 1.5), ("b", 1.5)], 1e-6)
    """
    assert len(got) == len(want), (got, want)
    want_score = dict(want)
    for j, ((gid, gs), (wid, ws)) in enumerate(zip(got, want, strict=True)):
        assert abs(gs - ws) <= tol, f"rank {j}: score {gs} vs {ws} (bound {tol:.2e})"
        if gid != wid:
            # a document outside ``want`` tied with its last entry
            other = want_score.get(gid, want[-1][1])
            assert abs(other - ws) <= 2 * tol and abs(gs - other) <= 2 * tol, (
                f"rank {j}: {gid!r} instead of {wid!r}, not a tie within {2 * tol:.2e}")
