"""Where does fast-plaid's Rust create spend time on CPU? fp16 vs fp32 inputs, k."""
import sys, time, tempfile, functools
import numpy as np, torch
sys.path.insert(0, "/work/wt-plaid/benchmarks")
from plaid_scale import load_vectors
import fast_plaid.search.fast_plaid as fpm
from fast_plaid.search import FastPlaid
import importlib.metadata as m
print("fast-plaid", m.version("fast-plaid"), "threads", torch.get_num_threads(), flush=True)
a = torch.randn(50000, 128); b = torch.randn(4096, 128)
for dt in (torch.float32, torch.float16, torch.bfloat16):
    x, y = a.to(dt), b.to(dt)
    x @ y.T
    t0 = time.perf_counter(); x @ y.T; t = time.perf_counter() - t0
    print(f"matmul 50000x128 @ 128x4096 {dt}: {t*1000:.0f} ms = {50000*4096*256/t/1e9:.0f} GFLOPS", flush=True)
ids, docs, _ = load_vectors("/tmp/npl-vectors.npz", 3000)
n = sum(len(d) for d in docs)
print("docs", len(docs), "vectors", n, flush=True)
for dtype, k in ((torch.float16, 1024), (torch.float32, 1024), (torch.float16, 256)):
    tens = [torch.from_numpy(d).to(dtype) for d in docs]
    orig = fpm.compute_kmeans
    tk = {}
    def km(*a, **kw):
        t0 = time.perf_counter(); r = orig(*a, num_partitions=k, **kw); tk["k"] = time.perf_counter() - t0; return r
    fpm.compute_kmeans = km
    with tempfile.TemporaryDirectory() as d:
        fp = FastPlaid(index=d, device="cpu")
        t0 = time.perf_counter()
        fp.create(tens, nbits=4, seed=42)
        t = time.perf_counter() - t0
    fpm.compute_kmeans = orig
    print(f"create {dtype} k={k}: total {t:.1f} s, kmeans {tk['k']:.1f} s, rest {t - tk['k']:.1f} s", flush=True)
