"""Child process of the crash test: opens a store and upserts (and deletes) batches forever,
appending ``ACK <op>`` to a log after each call returns. The parent kills it with SIGKILL.

Usage: python crash_child.py SPEC_NAME STORE_DIR ACK_FILE SEED
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from uibk_embedding.tagged import TaggedFormat
from uibk_embedding.testing import load_backend_specs, make_list

BATCH = 8
# engine calls smaller than one batch, so a kill can land between two calls of one upsert (the
# store must make the batch all-or-nothing itself): Qdrant Edge and local mode 3 points a call,
# pgvector 3 rows a statement (a kill lands inside one upsert's transaction).
# Not Milvus: a Milvus upsert larger than one insert call (8,192 vectors) is all-or-nothing per
# document, not per batch (docs/milvus.md); with 64-vector calls this test saw 4-8 torn batches in
# 5 kills, every document whole and no acknowledged batch lost
ENGINE_CALLS = {"qdrant-edge": {"batch_size": 3}, "qdrant-path": {"batch_size": 3},
                "pgvector-exact": {"batch_size": 3}, "pgvector-hnsw": {"batch_size": 3}}


def main() -> None:
    name, store_dir, ack_file, seed = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    spec = next(s for s in load_backend_specs(Path(__file__).parent.parent / "backends") if s.name == name)
    store = spec.reopen(store_dir, **ENGINE_CALLS.get(name, {}))
    rng = np.random.default_rng(seed)
    fmt = TaggedFormat()
    with open(ack_file, "a", buffering=1) as ack:
        # a database server's session on this machine (the local PostgreSQL): its backend finishes
        # a COMMIT already sent after this process is killed, so the parent waits for it to end
        session = getattr(getattr(getattr(store, "conn", None), "info", None), "backend_pid", None)
        ack.write(f"OPEN {session}\n" if session else "OPEN\n")
        for i in range(10_000):
            if i % 4 == 3:  # every fourth operation deletes the batch two before
                ack.write(f"START-DEL s{seed}-b{i - 2}\n")
                store.delete([f"s{seed}-b{i - 2}-{j}" for j in range(BATCH)])
                ack.write(f"DEL s{seed}-b{i - 2}\n")
                continue
            ids = [f"s{seed}-b{i}-{j}" for j in range(BATCH)]
            ack.write(f"START-ACK s{seed}-b{i}\n")
            store.upsert(ids, [make_list(fmt, rng, int(rng.integers(4, 30))) for _ in ids],
                         [{"seed": seed, "batch": i} for _ in ids])
            ack.write(f"ACK s{seed}-b{i}\n")


if __name__ == "__main__":
    main()
