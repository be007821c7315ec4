"""The exact store before (0.4's operation log, ``old_exact.py``) and after (the file-backed store
with no index), on the same vectors in one process: load, reopen, p50/p95 of single-query search
unfiltered and filtered, queries going round every store; top 10 asserted equal to the old store's.

Usage: bench.py VECTORS.npz [ROUNDS] (see README.md here for the old module)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from uibk_embedding.adapters.exact import ExactStore as New

OLD = "/tmp/notes/old_exact.py"


def _old_class() -> type:
    spec = importlib.util.spec_from_file_location("old_exact", OLD)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_exact"] = module
    spec.loader.exec_module(module)
    return module.ExactStore


def main(vectors: str, rounds: int) -> None:
    z = np.load(vectors)
    dmat, doff, qmat, qoff = z["doc_mat"], z["doc_off"], z["query_mat"], z["query_off"]
    docs = [dmat[doff[i]:doff[i + 1]] for i in range(len(doff) - 1)]
    queries = [qmat[qoff[i]:qoff[i + 1]] for i in range(len(qoff) - 1)]
    ids = [f"d{i}" for i in range(len(docs))]
    md = [{"n": i % 7} for i in range(len(docs))]
    work = Path(tempfile.mkdtemp(prefix="bench-exact-"))
    print("load average", os.getloadavg(), "docs", len(docs), "vectors", len(dmat), "queries", len(queries))
    old = _old_class()
    kinds = [("old-f32", old, "float32"), ("new-f32", New, "float32"), ("old-f16", old, "float16"),
             ("new-f16", New, "float16"), ("old-memory", old, None), ("new-memory", New, None)]
    stores, res = {}, {}
    for name, cls, dtype in kinds:
        path = work / name if dtype else None
        t0 = time.perf_counter()
        s = cls(path=path, vector_dtype=dtype) if path else cls()
        for lo in range(0, len(docs), 2000):
            s.upsert(ids[lo:lo + 2000], docs[lo:lo + 2000], md[lo:lo + 2000])
        load, open_s = time.perf_counter() - t0, 0.0
        if path:
            s.close()
            t0 = time.perf_counter()
            s = cls(path=path)
            open_s = time.perf_counter() - t0
        stores[name] = s
        disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20 if path else 0.0
        res[name] = {"load_s": load, "open_s": open_s, "disk_MiB": disk, "times": [], "filtered": []}
    reference: dict[tuple[str, int], list[str]] = {}
    for _ in range(rounds):
        for qi, q in enumerate(queries):
            for name, s in stores.items():
                t0 = time.perf_counter()
                top = [h.id for h in s.search(q, k=10)]
                res[name]["times"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                s.search(q, k=10, filter={"n": 3})
                res[name]["filtered"].append(time.perf_counter() - t0)
                rows = "f16" if name.endswith("f16") else "f32"
                assert top == reference.setdefault((rows, qi), top), (name, qi)
    out = {}
    for name, v in res.items():
        t, f = np.array(v["times"]) * 1000, np.array(v["filtered"]) * 1000
        out[name] = {"load_s": round(v["load_s"], 1), "open_s": round(v["open_s"], 3),
                     "disk_MiB": round(v["disk_MiB"], 1), "p50_ms": round(float(np.median(t)), 1),
                     "p95_ms": round(float(np.percentile(t, 95)), 1),
                     "filtered_p50_ms": round(float(np.median(f)), 1)}
        print(name, out[name])
    print("load average", os.getloadavg())
    print(json.dumps(out))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
