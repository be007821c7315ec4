"""PyLate interop (issues 26, 60): our tagged lists in PyLate's own PLAID index, and encoding speed.

1. Speed: documents per second on CPU for the same model: our native encoder and the model saved
   with ``save_pylate`` and run by PyLate's ``ColBERT.encode`` (its own loop, batch size 32); and,
   where sentence-transformers >= 6 is installed (not in PyLate's environment), the model saved
   with ``save_sentence_transformers`` and loaded back with ``load_encoder`` (sentence-transformers
   6's ``MultiVectorEncoder``, our pipeline). For the tiny random UIBK model and the embedded
   default (MiniLM).
2. Interop: the tagged lists of MiniLM (the native encoder's; PyLate's encode of the export gives
   the same within 1e-5, tests/test_pylate_interop.py) on a slice of a shared collection, indexed by
   ``pylate.indexes.PLAID`` (fast-plaid) with its defaults and searched with
   ``pylate.retrieve.ColBERT``, unchanged, against our exact store: recall@10 vs exact, build time,
   latency per query; beside our PLAID backend (``open_store("plaid")``) on the same vectors.

PyLate 1.6.0 pins ``sentence-transformers==5.3.0`` and ``transformers<=5.3.0`` (and fast-plaid
<=1.4.6.2110, while the ``plaid`` extra pins 1.7.0.2110, which its PLAID index also runs on): it
cannot share an environment with the package's ``colbert`` extra (sentence-transformers >= 6), so
it has its own, which ``make pylate-env`` builds (``.venv-pylate``: the package with its ``plaid``
and ``bench`` extras, sentence-transformers 5.3.0 and PyLate's other requirements, then PyLate
with ``--no-deps``)::

    make pylate-env
    .venv-pylate/bin/python benchmarks/pylate_interop.py --docs 2000 --json out.json

About 10 minutes on 2 CPU cores (most of it in the speed runs and the two PLAID builds). Encoding
speed: the median of ``--runs`` runs, the encoders taking turns (after one warm-up each); the load
average is recorded before and after. Our PLAID store is indexed at any size here
(``min_index_vectors=1``; by default it searches exactly below 6,000,000 vectors) and its figures
say which path answered. Figures printed; GPU figures are not measured by this script's CPU run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "npl"


def read_jsonl(path: Path, limit: int | None = None) -> list[dict]:
    out = []
    with path.open() as f:
        for line in f:
            out.append(json.loads(line))
            if limit and len(out) >= limit:
                break
    return out


def rates(fns: dict, n: int, runs: int) -> dict[str, float]:
    """Documents per second of each function: the median of ``runs`` timed runs, the functions
    taking turns, so that a slow phase of the machine hits all of them alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: n / statistics.median(v) for k, v in times.items()}


def speed(native, folder: Path, st_folder: Path | None, texts: list[str], runs: int = 3) -> dict[str, float]:
    from pylate.models import ColBERT

    from uibk_embedding.encoder import load_encoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cb = ColBERT(str(folder), trust_remote_code=True, device="cpu")
        ours = (load_encoder(st_folder, trust_remote_code=True, device="cpu")
                if st_folder is not None else None)
    fns = {
        "native_docs_per_s": lambda: native.encode_documents(texts, show_progress=False),
        "pylate_encode_docs_per_s": lambda: cb.encode(texts, is_query=False, batch_size=32,
                                                      show_progress_bar=False),
    }
    if ours is not None:
        fns["load_encoder_st6_docs_per_s"] = lambda: ours.encode_documents(texts, show_progress=False)
    for fn in fns.values():  # one-time costs out
        fn()
    return rates(fns, len(texts), runs)


def sentence_transformers_6() -> bool:
    """Whether sentence-transformers >= 6 (MultiVectorEncoder) is installed here."""
    try:
        import sentence_transformers
    except ImportError:
        return False
    return hasattr(sentence_transformers, "MultiVectorEncoder")


def recall(found: list[list[str]], exact: list[list[str]], k: int = 10) -> float:
    return float(np.mean([len(set(f[:k]) & set(e[:k])) / max(1, len(e[:k]))
                          for f, e in zip(found, exact, strict=True)]))


def interop(enc, docs: list[dict], queries: list[dict], work: Path) -> dict[str, object]:
    from pylate import indexes, retrieve

    from uibk_embedding.adapters import open_store

    ids = [d["_id"] for d in docs]
    texts = [(d.get("title", "") + " " + d["text"]).strip() for d in docs]
    t0 = time.perf_counter()
    dvecs = enc.encode_documents(texts, show_progress=False)
    enc_s = time.perf_counter() - t0
    qvecs = enc.encode_queries([q["text"] for q in queries], show_progress=False)
    out: dict[str, object] = {"documents": len(docs), "queries": len(queries),
                              "encode_s": round(enc_s, 1),
                              "vectors": int(sum(len(v) for v in dvecs))}
    exact = open_store("exact", format=enc.format)
    exact.upsert(ids, dvecs, [{} for _ in ids])
    t0 = time.perf_counter()
    ref = [[h.id for h in exact.search(q, k=10)] for q in qvecs]
    out["exact_ms_per_query"] = round(1000 * (time.perf_counter() - t0) / len(qvecs), 2)
    exact.close()
    # PyLate's own PLAID, its defaults
    try:
        t0 = time.perf_counter()
        index = indexes.PLAID(index_folder=str(work / "pylate-index"), index_name="npl", override=True,
                              show_progress=False)
        index.add_documents(documents_ids=ids, documents_embeddings=dvecs)
        build = time.perf_counter() - t0
        retriever = retrieve.ColBERT(index=index)
        t0 = time.perf_counter()
        res = retriever.retrieve(queries_embeddings=qvecs, k=10)
        lat = (time.perf_counter() - t0) / len(qvecs)
        found = [[r["id"] for r in hits] for hits in res]
        out["pylate_plaid"] = {"recall@10_vs_exact": round(recall(found, ref), 4),
                               "build_s": round(build, 1), "ms_per_query": round(1000 * lat, 2)}
    except Exception as e:  # say precisely what fails
        out["pylate_plaid"] = {"error": f"{type(e).__name__}: {e}"}
    # ours, same vectors (its defaults: exact rerank of 100 PLAID candidates), and without rerank;
    # indexed at this size (by default it searches exactly below 6,000,000 vectors)
    for name, opts in (("our_plaid", {}), ("our_plaid_no_rerank", {"rerank": False})):
        t0 = time.perf_counter()
        store = open_store("plaid", format=enc.format, path=str(work / name), min_index_vectors=1, **opts)
        store.upsert(ids, dvecs, [{} for _ in ids])
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        found = [[h.id for h in store.search(q, k=10)] for q in qvecs]
        lat = (time.perf_counter() - t0) / len(qvecs)
        answered_by = store.stats()["search"]
        store.close()
        out[name] = {"recall@10_vs_exact": round(recall(found, ref), 4), "build_s": round(build, 1),
                     "ms_per_query": round(1000 * lat, 2), "search": answered_by}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(DATA), help="BEIR folder (default: the shared NPL)")
    p.add_argument("--docs", type=int, default=2000, help="first N documents of the corpus")
    p.add_argument("--speed-docs", type=int, default=512, help="documents for the speed runs")
    p.add_argument("--runs", type=int, default=3, help="timed runs of each encoder (median)")
    p.add_argument("--json", default=None, help="write the figures to this file")
    args = p.parse_args(argv)

    import torch

    from uibk_embedding.encoder import load_encoder
    from uibk_embedding.encoder.pylate_model import save_pylate, save_sentence_transformers
    from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer

    data = Path(args.data)
    docs = read_jsonl(data / "corpus.jsonl", args.docs)
    queries = read_jsonl(data / "queries.jsonl")
    texts = [(d.get("title", "") + " " + d["text"]).strip() for d in docs]
    report: dict[str, object] = {"torch_threads": torch.get_num_threads(),
                                 "load_average_before": list(os.getloadavg())}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg = UIBKConfig.tiny()
        tiny = UIBKEncoder.random(cfg, train_tokenizer(cfg, texts[:500]), seed=0, device="cpu")
        minilm = load_encoder(device="cpu")
        st6 = sentence_transformers_6()
        report["sentence_transformers_6"] = st6
        for name, enc in (("tiny_uibk", tiny), ("minilm", minilm)):
            folder = save_pylate(enc, work / name)
            st_folder = save_sentence_transformers(enc, work / f"{name}-st6") if st6 else None
            report[f"speed_{name}"] = speed(enc, folder, st_folder, texts[: args.speed_docs], args.runs)
            print(name, report[f"speed_{name}"], flush=True)
        report["interop_minilm"] = interop(minilm, docs, queries, work)
        print(json.dumps(report["interop_minilm"], indent=2), flush=True)
    report["load_average_after"] = list(os.getloadavg())
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
