"""Encoding throughput: one pass for both heads vs a dense pass vs a two-pass hybrid.

Measured side by side in one process on the same texts (NPL and Cranfield documents):

(a) this library's encoder (the embedded all-MiniLM-L6-v2 composition): ONE forward pass gives
    the dense sentence vector and the token vectors, then the tagged construction;
(b) sentence-transformers encoding the same model, dense vector only (one pass);
(c) the two-pass hybrid: (b)'s dense pass + a second pass for the token vectors
    (sentence-transformers ``output_value="token_embeddings"``), as a "dense index + ColBERT
    index" setup runs it.

Each figure is the median of ``--runs`` timed runs after one warm-up run. Both libraries read
the same number of tokens (``max_seq_length`` of (b) and (c) is set to (a)'s document cap).
The ratio ``time(c) / time(a)`` says what one pass saves; ``time(a) / time(b)`` what the
tagged construction costs on top of a dense pass.

With ``--uibk`` (automatic when CUDA is present) it also measures randomly initialised UIBK
models (the tiny test configuration and the full-size released configuration, 179M
parameters) on 300-token documents, in bfloat16 on a GPU (paper Table 11: 899 docs/s on an
H100 for the full-size model). ``--uibk-cpu-docs N`` runs those on CPU with N documents.

Usage::

    python benchmarks/encode_throughput.py [--docs 300] [--runs 3] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def median_time(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def load_texts(datasets: list[str], n: int) -> list[str]:
    from uibk_embedding.data import load_beir
    from uibk_embedding.testing import datasets_dir

    texts: list[str] = []
    for name in datasets:
        coll = load_beir(datasets_dir() / name)
        texts += [d.full_text for d in coll.corpus[:n]]
    return texts


def bench_hybrid(texts: list[str], runs: int, device: str) -> dict:
    from sentence_transformers import SentenceTransformer
    from uibk_embedding.encoder.transformer import EMBEDDED_NAME, TransformerEncoder, embedded_model_path

    enc = TransformerEncoder(EMBEDDED_NAME, device=device)
    st = SentenceTransformer(str(embedded_model_path()), device=device)
    st.max_seq_length = enc.doc_max_length
    bs = 32

    def a() -> object:
        return enc.encode_documents(texts, show_progress=False)

    def b() -> object:
        return st.encode(texts, batch_size=bs, normalize_embeddings=True, show_progress_bar=False)

    def token_pass() -> object:
        return st.encode(texts, batch_size=bs, output_value="token_embeddings", show_progress_bar=False)

    def c() -> object:
        b()
        return token_pass()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation notices
        ta, tb, tc = (median_time(f, runs) for f in (a, b, c))
    n = len(texts)
    return {
        "texts": n,
        "max_tokens": enc.doc_max_length,
        "docs_per_s": {"a_one_pass_tagged": n / ta, "b_st_dense_only": n / tb, "c_two_pass_hybrid": n / tc},
        "seconds": {"a": ta, "b": tb, "c": tc},
        "ratios": {"time_c_over_a": tc / ta, "time_a_over_b": ta / tb, "time_c_over_b": tc / tb},
    }


def bench_uibk(corpus: list[str], n_docs: int, runs: int, device: str) -> dict:
    import torch
    from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, param_counts, train_tokenizer

    words = " ".join(corpus).split()
    docs = [" ".join(words[(i * 37 + j) % len(words)] for j in range(400)) for i in range(n_docs)]
    out = {}
    for name, cfg in [("tiny", UIBKConfig.tiny()), ("full-size (released config)", UIBKConfig.released())]:
        tok = train_tokenizer(cfg, corpus, vocab_size=min(cfg.backbone_config().vocab_size, 8000))
        enc = UIBKEncoder.random(cfg, tok, seed=0, device=device, doc_max_length=300)
        lengths = {len(x) for x in enc.token_ids(docs, False)[0]}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # every document is cut at 300 tokens on purpose
            t = median_time(lambda enc=enc: enc.encode_documents(docs, show_progress=False), runs)
        out[name] = {"params": param_counts(cfg)["total"], "docs": n_docs, "tokens_per_doc": sorted(lengths),
                     "device": enc.device, "dtype": enc.dtype, "docs_per_s": n_docs / t}
        del enc
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["npl", "cranfield"])
    p.add_argument("--docs", type=int, default=300, help="documents per dataset")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default=None)
    p.add_argument("--uibk", action="store_true", help="also time random UIBK models (default on CUDA)")
    p.add_argument("--uibk-docs", type=int, default=2048, help="300-token documents for --uibk on CUDA")
    p.add_argument("--uibk-cpu-docs", type=int, default=0, help="run the UIBK models on CPU with N docs")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    texts = load_texts(args.datasets, args.docs)
    result: dict = {"device": device, "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
                    "datasets": args.datasets, "runs": args.runs}
    result["hybrid"] = h = bench_hybrid(texts, args.runs, device)
    where = result["gpu"] or f"{result['torch_threads']} CPU threads"
    print(f"device {device} ({where}), "
          f"{h['texts']} documents from {', '.join(args.datasets)}, median of {args.runs} runs, "
          f"max {h['max_tokens']} tokens")
    print(f"{'':<44}{'docs/s':>10}{'seconds':>10}")
    labels = {"a_one_pass_tagged": "(a) uibk-embedding, one pass, both heads",
              "b_st_dense_only": "(b) sentence-transformers, dense only",
              "c_two_pass_hybrid": "(c) two-pass hybrid (dense + token pass)"}
    for k, label in labels.items():
        print(f"{label:<44}{h['docs_per_s'][k]:>10.1f}{h['seconds'][k[0]]:>10.2f}")
    r = h["ratios"]
    print(f"time (c)/(a) = {r['time_c_over_a']:.2f}   time (a)/(b) = {r['time_a_over_b']:.2f}   "
          f"time (c)/(b) = {r['time_c_over_b']:.2f}")

    if device.startswith("cuda") or args.uibk or args.uibk_cpu_docs:
        on_cpu = not device.startswith("cuda")
        n = args.uibk_cpu_docs or 16 if on_cpu else args.uibk_docs
        corpus = texts[:1000]
        result["uibk"] = u = bench_uibk(corpus, n, args.runs, device)
        print(f"\nrandom UIBK models, 300-token documents, {n} docs, {device}")
        for name, row in u.items():
            print(f"  {name:<28} {row['params'] / 1e6:7.1f}M params  {row['dtype']:<9} "
                  f"{row['docs_per_s']:10.1f} docs/s")
    else:
        result["uibk"] = None
        print("\nno CUDA device here: the GPU figures of the random UIBK models (tiny and full-size, "
              "300-token documents; paper: 899 docs/s on an H100) were not measured "
              "(--uibk-cpu-docs N runs them on CPU)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
