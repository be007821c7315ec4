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

Per-document overhead (section ``overhead``): the encoder's time against its model's forward
passes alone on the same batches (tokenised and padded beforehand, outside the timing), for the
tiny random UIBK model on 300-token documents and for the embedded default on the texts above:
``(encode - forward) / documents`` is what tokenisation, the tagged construction and the copies
to the host cost per document.

Server (section ``server``): ``uibk-embed serve`` (a subprocess, the embedded default, the same
device and torch threads) with ``--clients`` (4) concurrent clients, each a
:class:`~uibk_embedding.encoder.remote.RemoteEncoder` sending its share of the texts in requests
of ``--request-texts`` texts, against the in-process encoder on the same texts; both timed
alternately in one run.

With ``--uibk`` (automatic when CUDA is present) it also measures randomly initialised UIBK
models (the tiny test configuration and the full-size released configuration, 179M
parameters) on 300-token documents, in bfloat16 on a GPU (paper Table 11: 899 docs/s on an
H100 for the full-size model). ``--uibk-cpu-docs N`` runs those on CPU with N documents.

Usage::

    python benchmarks/encode_throughput.py [--docs 300] [--runs 3] [--threads N] [--json out.json]
        [--sections hybrid overhead server] [--overhead-docs N] [--profile 25]

``--profile N`` prints the N most expensive functions (cProfile, own time) of one run of (a).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTIONS = ("hybrid", "overhead", "server")


def median_time(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_times(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Medians of ``runs`` timed runs of each function, the functions taking turns (one warm-up
    each), so that a slow phase of the machine hits all of them alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(runs):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def load_texts(datasets: list[str], n: int) -> list[str]:
    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.testing import datasets_dir

    texts: list[str] = []
    for name in datasets:
        coll = load_beir(datasets_dir() / name)
        texts += [d.full_text for d in coll.corpus[:n]]
    return texts


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def bench_hybrid(enc, texts: list[str], runs: int, device: str) -> dict:
    from sentence_transformers import SentenceTransformer

    from uibk_embedding.encoder.transformer import embedded_model_path

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
        t = median_times({"a": a, "b": b, "c": c}, runs)  # taking turns: ratios side by side
    ta, tb, tc = t["a"], t["b"], t["c"]
    n = len(texts)
    return {
        "texts": n,
        "max_tokens": enc.doc_max_length,
        "docs_per_s": {"a_one_pass_tagged": n / ta, "b_st_dense_only": n / tb, "c_two_pass_hybrid": n / tc},
        "seconds": {"a": ta, "b": tb, "c": tc},
        "ratios": {"time_c_over_a": tc / ta, "time_a_over_b": ta / tb, "time_c_over_b": tc / tb},
    }


def forward_batches(enc, texts: list[str]) -> Callable[[], object]:
    """The encoder's model alone on the batches the encoder makes of ``texts`` (documents),
    tokenised and padded here beforehand; returns a function that runs all the passes."""
    import torch

    from uibk_embedding.encoder.uibk import UIBKEncoder

    order = enc._length_order(texts)
    batches = [[texts[i] for i in b] for b in enc._batches(texts, order, False)]
    inputs = []
    for bt in batches:
        if isinstance(enc, UIBKEncoder):
            ids, _ = enc.token_ids(bt, False)
            longest = max(len(x) for x in ids)
            input_ids = torch.full((len(ids), longest), enc._ids["pad_token_id"], dtype=torch.long)
            mask = torch.zeros((len(ids), longest), dtype=torch.long)
            for i, x in enumerate(ids):
                input_ids[i, : len(x)] = torch.tensor(x)
                mask[i, : len(x)] = 1
            inputs.append({"input_ids": input_ids.to(enc.device), "attention_mask": mask.to(enc.device)})
        else:
            t = enc.tokenizer(bt, padding=True, truncation=True, max_length=enc.doc_max_length,
                              return_tensors="pt")
            inputs.append({k: v.to(enc.device) for k, v in t.items()})
    amp = enc.device.startswith("cuda") and not isinstance(enc, UIBKEncoder)

    def run() -> object:
        with torch.inference_mode(), torch.autocast(device_type="cuda", dtype=torch.bfloat16,
                                                    enabled=amp):
            for x in inputs:
                if isinstance(enc, UIBKEncoder):
                    enc.model(x["input_ids"], x["attention_mask"])
                else:
                    enc.model(**x)
        synchronize(enc.device)
        return None

    return run


def overhead_row(enc, texts: list[str], runs: int) -> dict:
    fwd = forward_batches(enc, texts)

    def encode() -> object:
        out = enc.encode_documents(texts, show_progress=False)
        synchronize(enc.device)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cut documents on purpose
        t = median_times({"encode": encode, "forward": fwd}, runs)
    n = len(texts)
    dtype = getattr(enc, "dtype", None) or ("bfloat16" if enc.device.startswith("cuda") else "float32")
    return {"docs": n, "device": enc.device, "dtype": str(dtype),
            "encode_s": t["encode"], "forward_only_s": t["forward"],
            "docs_per_s": n / t["encode"], "forward_only_docs_per_s": n / t["forward"],
            "overhead_ms_per_doc": 1000 * (t["encode"] - t["forward"]) / n}


def synthetic_docs(corpus: list[str], n_docs: int, words: int = 400) -> list[str]:
    pool = " ".join(corpus).split()
    return [" ".join(pool[(i * 37 + j) % len(pool)] for j in range(words)) for i in range(n_docs)]


def bench_overhead(enc, texts: list[str], n_docs: int, runs: int, device: str) -> dict:
    from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer

    cfg = UIBKConfig.tiny()
    tok = train_tokenizer(cfg, texts[:1000], vocab_size=min(cfg.backbone_config().vocab_size, 8000))
    tiny = UIBKEncoder.random(cfg, tok, seed=0, device=device, doc_max_length=300)
    return {"tiny UIBK, 300-token documents": overhead_row(tiny, synthetic_docs(texts, n_docs), runs),
            "embedded default (a), same texts as (a)": overhead_row(enc, texts, runs)}


def bench_uibk(corpus: list[str], n_docs: int, runs: int, device: str) -> dict:
    import torch

    from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, param_counts, train_tokenizer

    docs = synthetic_docs(corpus, n_docs)
    out = {}
    for name, cfg in [("tiny", UIBKConfig.tiny()), ("full-size (released config)", UIBKConfig.released())]:
        tok = train_tokenizer(cfg, corpus, vocab_size=min(cfg.backbone_config().vocab_size, 8000))
        enc = UIBKEncoder.random(cfg, tok, seed=0, device=device, doc_max_length=300)
        lengths = {len(x) for x in enc.token_ids(docs, False)[0]}

        def run(enc=enc) -> object:
            out = enc.encode_documents(docs, show_progress=False)
            synchronize(device)
            return out

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # every document is cut at 300 tokens on purpose
            t = median_time(run, runs)
        out[name] = {"params": param_counts(cfg)["total"], "docs": n_docs, "tokens_per_doc": sorted(lengths),
                     "device": enc.device, "dtype": enc.dtype, "docs_per_s": n_docs / t}
        del enc
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def bench_server(enc, texts: list[str], runs: int, device: str, threads: int, clients: int,
                 request_texts: int) -> dict:
    """``uibk-embed serve`` (embedded default) with concurrent clients vs the in-process encoder."""
    from uibk_embedding.encoder.remote import RemoteEncoder
    from uibk_embedding.encoder.server import serve_subprocess

    with serve_subprocess("--device", device, "--threads", str(threads),
                          "--max-texts", str(max(request_texts, 1))) as url:
        remotes = [RemoteEncoder(url, show_progress=False, request_texts=request_texts, in_flight=2)
                   for _ in range(clients)]
        shares = [texts[k::clients] for k in range(clients)]  # interleaved: long and short texts each

        def one_at_a_time(k: int, out: list) -> None:  # a call per request, waiting for each answer
            part = shares[k]
            for i in range(0, len(part), request_texts):
                out.extend(remotes[k].encode_documents(part[i:i + request_texts]))

        def pipelined(k: int, out: list) -> None:  # one call; the client keeps 2 requests open
            out.extend(remotes[k].encode_documents(shares[k]))

        def served(client) -> Callable[[], object]:
            def run() -> object:
                outs: list[list] = [[] for _ in range(clients)]
                ts = [threading.Thread(target=client, args=(k, outs[k])) for k in range(clients)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                if sum(map(len, outs)) != len(texts):
                    raise RuntimeError("a client lost texts")
                return outs
            return run

        def in_process() -> object:
            return enc.encode_documents(texts, show_progress=False)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = median_times({"in_process": in_process, "server": served(one_at_a_time),
                              "server_pipelined": served(pipelined)}, runs)
        stats = remotes[0].stats()
        for r in remotes:
            r.close()
    n = len(texts)
    return {"texts": n, "clients": clients, "request_texts": request_texts, "server_threads": threads,
            "docs_per_s": {k: n / v for k, v in t.items()},
            "server_over_in_process": t["in_process"] / t["server"],
            "server_pipelined_over_in_process": t["in_process"] / t["server_pipelined"],
            "server_stats": {k: stats.get(k) for k in ("requests", "passes", "merged_passes",
                                                      "multi_client_passes", "clients")}}


def profile_a(enc, texts: list[str], top: int) -> str:
    import cProfile
    import io
    import pstats

    enc.encode_documents(texts[:32], show_progress=False)  # warm-up
    prof = cProfile.Profile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof.enable()
        enc.encode_documents(texts, show_progress=False)
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["npl", "cranfield"])
    p.add_argument("--docs", type=int, default=300, help="documents per dataset")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default=None)
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--overhead-docs", type=int, default=None,
                   help="300-token documents of the tiny UIBK model in the overhead section "
                        "(default 1024 on CPU, 8192 on CUDA)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients of the server section")
    p.add_argument("--request-texts", type=int, default=32, help="texts per client request")
    p.add_argument("--uibk", action="store_true", help="also time random UIBK models (default on CUDA)")
    p.add_argument("--uibk-docs", type=int, default=2048, help="300-token documents for --uibk on CUDA")
    p.add_argument("--uibk-cpu-docs", type=int, default=0, help="run the UIBK models on CPU with N docs")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="print the N most expensive functions of one run of (a)")
    p.add_argument("--json", default=None, help="write the results to this file")
    args = p.parse_args(argv)

    import torch

    from uibk_embedding.encoder.transformer import EMBEDDED_NAME, TransformerEncoder

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    texts = load_texts(args.datasets, args.docs)
    result: dict = {"device": device, "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
                    "datasets": args.datasets, "runs": args.runs, "sections": args.sections,
                    "load_average_before": list(os.getloadavg())}
    where = result["gpu"] or f"{result['torch_threads']} CPU threads"
    enc = TransformerEncoder(EMBEDDED_NAME, device=device)
    print(f"device {device} ({where}), {len(texts)} documents from {', '.join(args.datasets)}, "
          f"median of {args.runs} runs, max {enc.doc_max_length} tokens")

    if "hybrid" in args.sections:
        result["hybrid"] = h = bench_hybrid(enc, texts, args.runs, device)
        print(f"\n{'':<44}{'docs/s':>10}{'seconds':>10}")
        labels = {"a_one_pass_tagged": "(a) uibk-embedding, one pass, both heads",
                  "b_st_dense_only": "(b) sentence-transformers, dense only",
                  "c_two_pass_hybrid": "(c) two-pass hybrid (dense + token pass)"}
        for k, label in labels.items():
            print(f"{label:<44}{h['docs_per_s'][k]:>10.1f}{h['seconds'][k[0]]:>10.2f}")
        r = h["ratios"]
        print(f"time (c)/(a) = {r['time_c_over_a']:.2f}   time (a)/(b) = {r['time_a_over_b']:.2f}   "
              f"time (c)/(b) = {r['time_c_over_b']:.2f}")

    if "overhead" in args.sections:
        n = args.overhead_docs or (8192 if device.startswith("cuda") else 1024)
        result["overhead"] = o = bench_overhead(enc, texts, n, args.runs, device)
        print("\nper-document overhead: encode vs the model's forward passes alone, same batches")
        print(f"{'':<42}{'docs':>6}{'docs/s':>10}{'fwd docs/s':>12}{'overhead ms/doc':>17}")
        for name, row in o.items():
            print(f"{name:<42}{row['docs']:>6}{row['docs_per_s']:>10.1f}"
                  f"{row['forward_only_docs_per_s']:>12.1f}{row['overhead_ms_per_doc']:>17.3f}")

    if "server" in args.sections:
        result["server"] = s = bench_server(enc, texts, args.runs, device, torch.get_num_threads(),
                                            args.clients, args.request_texts)
        print(f"\nuibk-embed serve, {s['clients']} concurrent clients, {s['request_texts']} texts a request: "
              f"{s['docs_per_s']['server']:.1f} docs/s vs {s['docs_per_s']['in_process']:.1f} in-process "
              f"(ratio {s['server_over_in_process']:.2f}, one request per call); "
              f"{s['docs_per_s']['server_pipelined']:.1f} docs/s (ratio "
              f"{s['server_pipelined_over_in_process']:.2f}) with one call per client and 2 requests "
              f"in flight; server counters {s['server_stats']}")

    if device.startswith("cuda") or args.uibk or args.uibk_cpu_docs:
        on_cpu = not device.startswith("cuda")
        n = args.uibk_cpu_docs or 16 if on_cpu else args.uibk_docs
        result["uibk"] = u = bench_uibk(texts[:1000], n, args.runs, device)
        print(f"\nrandom UIBK models, 300-token documents, {n} docs, {device}")
        for name, row in u.items():
            print(f"  {name:<28} {row['params'] / 1e6:7.1f}M params  {row['dtype']:<9} "
                  f"{row['docs_per_s']:10.1f} docs/s")
    else:
        result["uibk"] = None
        print("\nno CUDA device here: the GPU figures of the random UIBK models (tiny and full-size, "
              "300-token documents; paper: 899 docs/s on an H100) were not measured "
              "(--uibk-cpu-docs N runs them on CPU)")
    if args.profile:
        result["profile_top"] = prof = profile_a(enc, texts, args.profile)
        print("\ncProfile of one run of (a), by own time:\n" + prof)
    result["load_average_after"] = list(os.getloadavg())
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
