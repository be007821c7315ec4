"""Why WARP's CPU builds run at very different speeds on machines of one kind.

xtr-warp-rs compresses each chunk of documents with float16 matrix products on the CPU (its
tokens against the float16 centroids, through libtorch), ``compression_batch_size`` token rows
at a time. How fast libtorch does a float16 product depends on the CPU: on an AVX2-only CPU it
falls back to a dot-product loop many times slower than the float32 product of the same shape,
and slower still the more rows a product takes (CPUs with float16 matrix instructions were not
measured with this script). This script times one compression chunk
(``--tokens`` token vectors of 128 dimensions against ``--partitions`` centroids) done in products
of each ``--batch`` rows, in float32, float16 and bfloat16, the median of ``--rounds`` runs each
after one warm-up, and prints the CPU's flags that decide it, so a build time measured on one
machine can be read on another::

    python benchmarks/fp16_gemm.py        # 11,800 tokens (256 NPL documents) x 8,192 centroids
    python benchmarks/fp16_gemm.py --batch 128 256 512 1024 16384 --rounds 7 \\
        --out benchmarks/results/fp16-gemm-amd-avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from encode_throughput import median_time


def cpu_facts() -> dict[str, object]:
    """The CPU's model name and the instruction-set flags that decide libtorch's float16 path.

    >>> sorted(cpu_facts())
    ['capability', 'flags', 'model', 'threads']
    """
    import torch

    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ("avx2", "f16c", "avx512f", "avx512_fp16", "avx512_bf16", "amx_bf16", "amx_fp16")
    return {"model": model, "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "flags": [f for f in wanted if f in flags]}


def time_product(tokens: int, partitions: int, dtype: str, rounds: int, batch: int) -> float:
    """Median seconds of ``tokens x 128`` times ``(partitions x 128)^T`` in ``dtype`` on the CPU,
    done ``batch`` token rows at a time.

    >>> time_product(64, 64, "float32", 1, batch=16) >= 0.0
    True
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(tokens, 128, generator=gen).to(getattr(torch, dtype))
    c = torch.randn(partitions, 128, generator=gen).to(getattr(torch, dtype))
    def chunk() -> None:
        for start in range(0, tokens, batch):
            _ = a[start:start + batch] @ c.T

    return median_time(chunk, rounds)


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=11_800, help="token vectors in one chunk")
    p.add_argument("--partitions", type=int, default=8_192, help="centroids")
    p.add_argument("--batch", type=int, nargs="+", default=[1024, 16384],
                   help="token rows per product (xtr-warp-rs compression_batch_size)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    load_before = list(os.getloadavg())  # another load on the cores changes every timing
    seconds = {str(b): {dt: time_product(args.tokens, args.partitions, dt, args.rounds, b)
                        for dt in ("float32", "float16", "bfloat16")} for b in args.batch}
    result = {**cpu_facts(), "load_average": {"before": load_before, "after": list(os.getloadavg())},
              "tokens": args.tokens, "partitions": args.partitions,
              "rounds": args.rounds, "seconds": seconds,
              "vs_float32": {b: {dt: round(x / by["float32"], 2) for dt, x in by.items()}
                             for b, by in seconds.items()}}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
