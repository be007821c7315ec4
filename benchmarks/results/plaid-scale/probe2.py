"""fast-plaid CPU search: cost vs top_k, n_full_scores, n_ivf_probe, threads (engine call alone)."""
import sys, time, statistics
import numpy as np, torch
sys.path.insert(0, "/work/wt-plaid/benchmarks")
from plaid_scale import load_vectors
from fast_plaid.search import FastPlaid
import importlib.metadata as m
_, _, queries = load_vectors("/tmp/npl-vectors.npz", 0)
queries = queries[:30]
index = sys.argv[1]
fp = FastPlaid(index=index, device="cpu")
print("fast-plaid", m.version("fast-plaid"), index, flush=True)
for threads in (2, 1):
    torch.set_num_threads(threads)
    for probe, full in ((1, 128), (2, 256), (8, 1024)):
        for top in (10, 30, 100):
            lat = []
            for q in queries:
                t = torch.from_numpy(q[None].astype(np.float16))
                t0 = time.perf_counter()
                fp.search(t, top_k=top, n_full_scores=max(full, top), n_ivf_probe=probe, show_progress=False, n_processes=1)
                lat.append((time.perf_counter() - t0) * 1000)
            print(f"threads {threads} probe {probe} full {full} top_k {top}: median {statistics.median(lat):.1f} ms", flush=True)
