"""Test harnesses: how the conformance suite drives a backend, and local servers for tests.

The layer just below :mod:`uibk_embedding.apps` (docs/architecture.md): it may import every
layer but apps; nothing in the library imports it except the applications' benchmarks.

* :mod:`~uibk_embedding.testing.specs`: backend specs, random tagged lists, batching noise and
  ranking checks (re-exported here, so ``uibk_embedding.testing.batching_noise`` keeps its name);
* :mod:`~uibk_embedding.testing.milvus_server`: a loopback-only Milvus standalone;
* :mod:`~uibk_embedding.testing.pg_server`: a temporary PostgreSQL + pgvector server.
* :mod:`~uibk_embedding.testing.tiny_models`: tiny random BERT folders for loader tests.

>>> from uibk_embedding.testing import BackendSpec, make_list
>>> BackendSpec.__module__
'uibk_embedding.testing.specs'
"""

from uibk_embedding.testing.specs import (
    ALL_SPECS,
    REPO,
    BackendSpec,
    InstrumentedEncoderFactory,
    assert_same_ranking,
    batching_noise,
    datasets_dir,
    encoded_counts,
    load_backend_specs,
    load_benchmark,
    make_list,
    open_spec,
    score_bound,
)

__all__ = [
    "ALL_SPECS",
    "REPO",
    "BackendSpec",
    "InstrumentedEncoderFactory",
    "assert_same_ranking",
    "batching_noise",
    "datasets_dir",
    "encoded_counts",
    "load_backend_specs",
    "load_benchmark",
    "make_list",
    "open_spec",
    "score_bound",
]
