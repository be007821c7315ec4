"""CPU encoding of the embedded default: ``backend="torch"`` against ``backend="onnx"``.

Documents per second of ``encode_documents`` on the same texts, both encoders in one process on
the same threads (``--threads``, torch's and the ONNX session's), timed alternately (torch, onnx,
torch, onnx, ...) so that a change of load on shared cores hits both; the figures are medians of
``--runs`` rounds after one warm-up round, with the largest difference between the two backends'
lists (float32 noise is expected: the same network). Two text sets: NPL documents (short
abstracts, ``--docs`` of them) and ``--long`` texts of 512 tokens (cut from Cranfield documents
joined; the model's limit). The load average is printed with each round: on shared cores treat
the figures as preliminary.

Usage::

    python benchmarks/encode_backends.py [--docs 300] [--long 40] [--runs 3] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from uibk_embedding.testing import datasets_dir


def read_texts(name: str, n: int) -> list[str]:
    out = []
    with open(datasets_dir() / name / "corpus.jsonl") as f:
        for line in f:
            d = json.loads(line)
            out.append(f"{d.get('title', '')} {d['text']}".strip())
            if len(out) == n:
                break
    return out


def long_texts(n: int) -> list[str]:
    """``n`` texts of at least 512 tokens (the encoder cuts them there)."""
    words = " ".join(read_texts("cranfield", 1400)).split()
    return [" ".join(words[i * 600:(i + 1) * 600]) for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    from uibk_embedding.encoder import load_encoder

    torch.set_num_threads(args.threads)
    encoders = {"torch": load_encoder(device="cpu"),
                "onnx": load_encoder(backend="onnx", num_threads=args.threads)}
    report: dict[str, object] = {"threads": args.threads, "cores": os.cpu_count(), "sets": {}}
    for set_name, texts in (("npl", read_texts("npl", args.docs)), ("512 tokens", long_texts(args.long))):
        rates: dict[str, list[float]] = {k: [] for k in encoders}
        loads = []
        lists: dict[str, list[np.ndarray]] = {}
        for rnd in range(args.runs + 1):
            for name, enc in encoders.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # truncation of the long texts
                    t0 = time.perf_counter()
                    lists[name] = enc.encode_documents(texts, show_progress=False)
                    dt = time.perf_counter() - t0
                if rnd:  # the first round warms up
                    rates[name].append(len(texts) / dt)
            loads.append(round(os.getloadavg()[0], 2))
            print(set_name, rnd, {k: round(v[-1], 1) for k, v in rates.items() if v}, "load", loads[-1],
                  flush=True)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(lists["torch"], lists["onnx"], strict=True))
        med = {k: round(statistics.median(v), 1) for k, v in rates.items()}
        report["sets"][set_name] = {"texts": len(texts), "docs_per_s": med,
                                    "onnx_over_torch": round(med["onnx"] / med["torch"], 2),
                                    "max_abs_difference": diff, "load_average_1min": loads}
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
