"""CPU encoding of the embedded default: ``backend="torch"`` against every other CPU backend.

Documents per second of ``encode_documents`` on the same texts, all encoders in one process on
the same threads (``--threads``: torch's, the ONNX Runtime session's, OpenVINO's), timed
alternately (torch, onnx, openvino, ..., torch, onnx, ...) so that a change of load on shared
cores hits all of them; the figures are medians of ``--runs`` rounds after one warm-up round, with
the ratio to torch and the largest difference between each backend's lists and torch's. Two text
sets: NPL documents (short abstracts, ``--docs`` of them) and ``--long`` texts of 512 tokens (cut
from Cranfield documents joined; the model's limit). The load average is recorded with each
round: run it alone on the cores (on shared cores treat the figures as preliminary).

``--backends`` (default: every one offered whose package is installed: onnx, openvino,
openvino-bf16). ``--int8 MODE ...`` adds encoders the library does not offer, for the record: the
fused ONNX export dynamically quantized (``onnxruntime.quantization.quantize_dynamic``, int8
weights: ``per-tensor``, ``per-channel``, ``per-channel-7bit`` with ``reduce_range``; activations
uint8 per batch). ``--quality NAME ...`` then encodes those shared collections
(``../shared/datasets``) with every encoder and reports nDCG@10 of the fused score (the encoder's
dense weight), the dense head and the token head, exactly (MaxSim over all documents), and each
encoder's documents/s on the corpus. The CPU's flags that decide the fast paths (avx512_bf16,
AMX, VNNI) and the precision OpenVINO ran are written with the figures: a quality figure of
``openvino-bf16`` holds for CPUs with native bfloat16 (elsewhere it runs float32).

Writes ``--json`` and ``--md`` (default ``benchmarks/results/encode_backends_cpu.{json,md}``).

Usage::

    python benchmarks/encode_backends.py [--docs 300] [--long 40] [--runs 5] [--threads 2]
        [--backends onnx openvino openvino-bf16] [--int8 per-channel ...] [--quality cranfield npl ...]
        [--json PATH] [--md PATH]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

from uibk_embedding.testing import datasets_dir

RESULTS = Path(__file__).resolve().parent / "results"
INT8_MODES = {"per-tensor": (False, False), "per-channel": (True, False), "per-channel-7bit": (True, True)}


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


def offered_backends() -> list[str]:
    """The CPU backends besides torch whose packages are installed."""
    out = []
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnx"):
        out.append("onnx")
    if importlib.util.find_spec("openvino") and importlib.util.find_spec("onnx"):
        out += ["openvino", "openvino-bf16"]
    return out


def cpu_flags() -> list[str]:
    """The CPU flags that choose kernels here (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    wanted = {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8",
              "avx512_fp16"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(wanted & set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def cpu_name() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def int8_encoder(onnx_enc, threads: int, mode: str):
    """A copy of the ONNX encoder running its fused export dynamically quantized (made once, beside
    it): not offered by the library (docs/loading.md, "int8")."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from uibk_embedding.encoder.onnx_backend import OnnxBert

    per_channel, reduce_range = INT8_MODES[mode]
    src = onnx_enc._net.path
    out = src.with_name(f"{src.stem}.int8-{mode}.onnx")
    if not out.is_file():
        logging.getLogger().setLevel(logging.ERROR)
        quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, per_channel=per_channel,
                         reduce_range=reduce_range, op_types_to_quantize=["MatMul", "Attention"],
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
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


def speed(texts: list[str], encoders: dict, runs: int, set_name: str) -> dict[str, object]:
    """Medians of ``runs`` alternating rounds (after one warm-up round) of each encoder's
    documents/s on ``texts``, the ratios to torch and the largest list difference to torch."""
    rates: dict[str, list[float]] = {k: [] for k in encoders}
    loads = []
    lists: dict[str, list[np.ndarray]] = {}
    for rnd in range(runs + 1):
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
    med = {k: round(statistics.median(v), 2) for k, v in rates.items()}
    return {"texts": len(texts), "docs_per_s": med,
            "over_torch": {k: round(med[k] / med["torch"], 2) for k in encoders if k != "torch"},
            "max_abs_difference": {k: max(float(np.abs(a - b).max())
                                          for a, b in zip(lists["torch"], lists[k], strict=True))
                                   for k in encoders if k != "torch"},
            "all_runs": {k: [round(r, 2) for r in v] for k, v in rates.items()},
            "load_average_1min": loads}


def markdown(report: dict) -> str:
    """The report as markdown tables."""
    names = list(next(iter(report["sets"].values()))["docs_per_s"]) if report["sets"] else []
    lines = [f"# CPU encoding backends ({report['when']})", "",
             f"{report['threads']} threads on {report['cores']} cores, {report['cpu']}; CPU flags: "
             f"{', '.join(report['cpu_flags']) or 'unknown'}; OpenVINO precision: "
             f"{report.get('openvino_precision', {}) or 'n/a'}. Medians of {report['runs']} alternating "
             "rounds after a warm-up round.", ""]
    if names:
        lines += ["| texts | " + " | ".join(f"{n} docs/s" for n in names) + " | "
                  + " | ".join(f"{n} / torch" for n in names if n != "torch") + " | load |",
                  "|---" * (2 * len(names)) + "|---|"]
        for set_name, r in report["sets"].items():
            lines.append(f"| {set_name}, {r['texts']} texts | "
                         + " | ".join(str(r["docs_per_s"][n]) for n in names) + " | "
                         + " | ".join(f"{r['over_torch'][n]:.2f}" for n in names if n != "torch")
                         + f" | {min(r['load_average_1min'])}-{max(r['load_average_1min'])} |")
        lines.append("")
    for coll, q in report.get("quality", {}).items():
        lines += [f"nDCG@10 x 100 on {coll} ({q['docs']} documents, {q['queries']} queries):", "",
                  "| encoder | fused | dense | tokens | docs/s (load) |", "|---|---|---|---|---|"]
        for label, v in q.items():
            if isinstance(v, dict):
                lines.append(f"| {label} | {v['fused']} | {v['dense']} | {v['tokens']} | "
                             f"{v['docs_per_s']} ({v['load_average_1min']}) |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backends", nargs="*", default=None, help="default: every installed one")
    ap.add_argument("--int8", nargs="*", default=[], choices=sorted(INT8_MODES),
                    help="also quantized exports (not offered by the library)")
    ap.add_argument("--quality", nargs="*", default=[], help="shared collections for nDCG@10")
    ap.add_argument("--no-speed", action="store_true", help="only --quality")
    ap.add_argument("--json", default=str(RESULTS / "encode_backends_cpu.json"))
    ap.add_argument("--md", default=str(RESULTS / "encode_backends_cpu.md"))
    args = ap.parse_args(argv)

    import torch

    from uibk_embedding.encoder import load_encoder

    torch.set_num_threads(args.threads)
    backends = offered_backends() if args.backends is None else args.backends
    encoders = {"torch": load_encoder(device="cpu")}
    for b in backends:
        encoders[b] = load_encoder(backend=b, num_threads=args.threads)
    for mode in args.int8:
        onnx_enc = encoders.get("onnx") or load_encoder(backend="onnx", num_threads=args.threads)
        encoders[f"onnx-int8-{mode}"] = int8_encoder(onnx_enc, args.threads, mode)
    report: dict[str, object] = {
        "when": time.strftime("%Y-%m-%d %H:%M"), "threads": args.threads, "cores": os.cpu_count(),
        "cpu": cpu_name(), "cpu_flags": cpu_flags(), "runs": args.runs,
        "openvino_precision": {k: e._net.precision for k, e in encoders.items()
                               if hasattr(e._net, "precision")},
        "sets": {}}
    if not args.no_speed:
        for set_name, texts in (("npl", read_texts("npl", args.docs)), ("512 tokens", long_texts(args.long))):
            report["sets"][set_name] = speed(texts, encoders, args.runs, set_name)
    report["quality"] = {name: quality(name, encoders) for name in args.quality}
    print(json.dumps(report, indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    Path(args.md).write_text(markdown(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
