"""CPU encoding of the embedded default: ``backend="torch"`` against ``backend="onnx"``.

Documents per second of ``encode_documents`` on the same texts, both encoders in one process on
the same threads (``--threads``, torch's and the ONNX session's), timed alternately (torch, onnx,
torch, onnx, ...) so that a change of load on shared cores hits both; the figures are medians of
``--runs`` rounds after one warm-up round, with the largest difference between the two backends'
lists (float32 noise is expected: the same network). Two text sets: NPL documents (short
abstracts, ``--docs`` of them) and ``--long`` texts of 512 tokens (cut from Cranfield documents
joined; the model's limit). The load average is printed with each round: on shared cores treat
the figures as preliminary.

``--int8`` adds a third encoder, not offered by the library: the same export dynamically quantized
(``onnxruntime.quantization.quantize_dynamic``, QInt8 weights; ``--per-channel``). ``--quality
NAME ...`` then encodes those shared collections (``../shared/datasets``) with every encoder and
reports nDCG@10 of the fused score (the encoder's dense weight), the dense head and the token head,
exactly (MaxSim over all documents), and each encoder's documents/s on the corpus.

Usage::

    python benchmarks/encode_backends.py [--docs 300] [--long 40] [--runs 3] [--threads 2] [--json out.json]
        [--int8 [--per-channel]] [--quality cranfield npl ...]
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


def int8_encoder(onnx_enc, threads: int, per_channel: bool):
    """A copy of the ONNX encoder running the dynamically quantized export (made once, beside it)."""
    import copy

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from uibk_embedding.encoder.onnx_backend import OnnxBert

    src = onnx_enc._net.path
    out = src.with_name(src.stem + (".int8pc" if per_channel else ".int8") + ".onnx")
    if not out.is_file():
        quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, per_channel=per_channel)
    enc = copy.copy(onnx_enc)
    enc._net = OnnxBert(out, num_threads=threads)
    return enc


def quality(name: str, encoders: dict) -> dict[str, object]:
    """nDCG@10 (x 100) of the fused score, the dense head and the token head on a shared
    collection, exactly, for each encoder; and its documents/s on the corpus."""
    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.apps.evaluation import Encoded, head_runs, with_dense_weight
    from uibk_embedding.maxsim import maxsim_scores, pack, top_k
    from uibk_embedding.metrics import evaluate

    coll = load_beir(datasets_dir() / name)
    texts = [d.full_text for d in coll.corpus]
    qids = list(coll.queries)
    out: dict[str, object] = {"docs": len(texts), "queries": len(qids)}
    for label, enc in encoders.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            docs = enc.encode_documents(texts, show_progress=False)
            rate = len(texts) / (time.perf_counter() - t0)
            qs = enc.encode_queries([coll.queries[q] for q in qids], dense_weight=1.0)
        e = Encoded([d.id for d in coll.corpus], docs, qids, qs)
        heads = head_runs(e)
        mat, off = pack(docs)
        scores = maxsim_scores([with_dense_weight(q, enc.dense_weight) for q in qs], mat, off)
        heads["fused"] = {q: [e.doc_ids[j] for j in top_k(scores[i], 100)] for i, q in enumerate(qids)}
        out[label] = {"docs_per_s": round(rate, 1), "load_average_1min": round(os.getloadavg()[0], 2),
                      **{k: round(100 * evaluate(heads[k], coll.qrels)["ndcg@10"], 2)
                         for k in ("fused", "dense", "tokens")}}
        print(name, label, out[label], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--int8", action="store_true", help="also a dynamically quantized export")
    ap.add_argument("--per-channel", action="store_true", help="--int8 with per-channel scales")
    ap.add_argument("--quality", nargs="*", default=[], help="shared collections for nDCG@10")
    args = ap.parse_args(argv)

    import torch

    from uibk_embedding.encoder import load_encoder

    torch.set_num_threads(args.threads)
    encoders = {"torch": load_encoder(device="cpu"),
                "onnx": load_encoder(backend="onnx", num_threads=args.threads)}
    if args.int8:
        encoders["onnx-int8"] = int8_encoder(encoders["onnx"], args.threads, args.per_channel)
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
        med = {k: round(statistics.median(v), 1) for k, v in rates.items()}
        report["sets"][set_name] = {
            "texts": len(texts), "docs_per_s": med,
            **{f"{k}_over_torch": round(med[k] / med["torch"], 2) for k in encoders if k != "torch"},
            **{f"max_abs_difference_{k}": max(float(np.abs(a - b).max())
                                              for a, b in zip(lists["torch"], lists[k], strict=True))
               for k in encoders if k != "torch"},
            "load_average_1min": loads}
    report["quality"] = {name: quality(name, encoders) for name in args.quality}
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
