"""Every backend against PLAID and exact MaxSim on one collection: ``uibk-embed compare``.

A thin wrapper over :func:`uibk_embedding.apps.compare.main` (same arguments), so the benchmark and
the CLI cannot drift apart. Examples::

    python benchmarks/compare_backends.py ../shared/datasets/npl \\
        --backends exact,plaid,qdrant,qdrant-edge,milvus-lite --threads 1 --out benchmarks/results/npl
    python benchmarks/compare_backends.py ../shared/datasets/npl --backends exact,qdrant-edge,plaid \\
        --scale 10000,30000,100000 --max-queries 20 --out benchmarks/results/npl-scale

See ``docs/benchmarks.md`` for what is measured and how.
"""

from __future__ import annotations

import sys

from uibk_embedding.apps.compare import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
