"""``uibk-embed compare``: every backend on one collection, side by side, against exact MaxSim.

The collection is encoded once (cached on disk by :func:`~uibk_embedding.apps.evaluation.encode_collection`)
and written as plain arrays to a work folder. Each backend then runs in a FRESH Python process
(so its peak memory is its own and a crash or a missing dependency only skips that backend):
open the store, upsert every document, ``flush()`` it where it has one (WARP builds its index
there) and run one warm-up query, time every query one by one (``--repeat`` passes; a backend that reaches
80% of ``--timeout`` stops there and its figures cover the queries it ran, ``queries_run``) and
once as a batch,
measure the store's folder on disk, close. The parent scores the top-10 of each backend against
the qrels (nDCG@10, recall@10) and against exact MaxSim (recall@10 = overlap of the top-10s, the
share of identical top-10s, and of the documents both top-10s hold, the share of pairs in exact
MaxSim's order; the exact store's own top-10s when it ran every query, else computed in the
parent), and writes ``compare.json``, ``compare.md`` and two PNG plots to ``--out``.

Every backend and the exact reference score the queries at one dense weight, ``--dense-weight``
(default: the encoder's own, as ``search`` and ``eval``), and in one retrieval mode,
``--retrieval-mode`` (``hybrid`` by default; ``dense`` or ``tokens`` cut every query to its slot
or token rows, :func:`~uibk_embedding.tagged.query_for_mode`, no re-index); the report states both.

Backends are taken by registry name (``--backends exact,plaid,qdrant-edge``; ``all``: every
registered one; default: the local ones, :data:`~uibk_embedding.apps.compare_options.LOCAL_BACKENDS`);
a backend added to the registry later works here unchanged. ``LABEL=NAME`` runs a backend under
another label, and ``--option LABEL:KEY=VALUE`` passes it options (JSON values), e.g. two PLAID runs::

    uibk-embed compare npl --backends exact,plaid,plaid-raw=plaid --option plaid-raw:rerank=false
 Benchmark defaults per backend (:data:`DEFAULT_OPTIONS`): a store folder inside the work folder,
so its size on disk can be measured; servers from ``QDRANT_URL`` / ``MILVUS_URI`` /
``WEAVIATE_URL`` / ``PG_DSN`` when set. ``milvus`` without ``MILVUS_URI`` starts the local
standalone server (:class:`~uibk_embedding.testing.milvus_server.LocalMilvusServer`) in the
worker, ``pgvector`` without ``PG_DSN`` a local PostgreSQL server
(:class:`~uibk_embedding.testing.pg_server.LocalPostgresServer`); ``weaviate`` without
``WEAVIATE_URL`` is skipped. A backend that fails to import, open or index is reported as
skipped with the reason.

Peak memory: ``peak_rss_mb`` is the worker's peak resident set (``VmHWM`` from ``/proc``; ``getrusage``
where that is unavailable), which includes
the document vectors the worker loads to index (``base_rss_mb``, measured before the store is
opened); the difference is what the backend itself used. A server child (local Milvus) is
counted separately (``server_peak_rss_mb``); a remote server's memory is not visible.

``--interleave`` runs every backend in ONE process instead (:func:`interleaved`): each store is
built in turn, then the queries go round the stores (query i to every store before query i + 1,
the stores' order rotating), ``--repeat`` passes, each query's latency the median of its passes;
no store is timed alone on a machine another one left warm or busy. Peak memory is then not
reported per backend, ``--timeout`` does not apply and ``--threads`` is refused (set ``OMP_NUM_THREADS``
and the like in the environment), and backends that start a local server are skipped. The NPL
side by side of docs/lancedb.md::

    uibk-embed compare npl --interleave --repeat 5 --backends exact,warp,qdrant-edge,\
        lancedb-exact=lancedb,lancedb-index=lancedb --option lancedb-index:mode=index

``--max-docs`` / ``--max-queries`` take the first documents and queries of the encoded
collection; when the whole collection is not in the encoding cache yet, only those are encoded
(and cached on their own).

``--scale 10000,100000`` repeats the comparison on collections of those sizes: the real
documents first, then synthetic ones made from them (:func:`synthetic_corpus`: each copy of a
real document with noisy slot and token directions and a random tenth of its tokens dropped;
no re-encoding), and plots latency against collection size.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.testing import make_list
>>> from uibk_embedding.tagged import TaggedFormat
>>> docs = [make_list(TaggedFormat(), np.random.default_rng(i), 4) for i in range(3)]
>>> more = synthetic_corpus(docs, 5, seed=0)
>>> len(more), more[3].shape[1], bool(np.allclose(np.linalg.norm(more[4], axis=1), 1, atol=1e-5))
(5, 128, True)
>>> rank_agreement(["a", "b", "c"], ["a", "c", "b"])
0.6666666666666666
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from uibk_embedding.adapters.registry import BACKENDS, open_store
from uibk_embedding.apps.cli import _dense_weight, _positive_int
from uibk_embedding.apps.compare_metrics import K, exact_runs, rank_agreement, summarise
from uibk_embedding.apps.compare_options import (
    DEFAULT_OPTIONS,
    LOCAL_BACKENDS,
    _Skip,
    default_backends,
    default_options,
)
from uibk_embedding.apps.compare_report import _fmt, markdown_table, plot, plot_scale
from uibk_embedding.apps.compare_worker import (
    _dir_bytes,
    _run_backend,
    _save_arrays,
    _worker_main,
    finish_build,
    run_worker,
    search_path,
)
from uibk_embedding.apps.data import Collection, DataError, load_beir
from uibk_embedding.apps.evaluation import _fingerprint, cache_dir, encode_collection, with_dense_weight
from uibk_embedding.encoder import load_encoder
from uibk_embedding.tagged import N_SLOTS, RETRIEVAL_MODES, infer_format, query_for_mode

__all__ = [
    "DEFAULT_OPTIONS",
    "K",
    "build_parser",
    "chosen_backends",
    "compare",
    "default_options",
    "exact_runs",
    "interleaved",
    "main",
    "markdown_table",
    "plot",
    "plot_scale",
    "rank_agreement",
    "run_worker",
    "summarise",
    "synthetic_corpus",
]


# -- synthetic collections ------------------------------------------------------------------------
def synthetic_corpus(docs: Sequence[np.ndarray], n: int, *, seed: int = 0, noise: float = 0.3,
                     drop: float = 0.1) -> list[np.ndarray]:
    """``n`` tagged documents made from ``docs`` with realistic token statistics, no encoder.

    Copy ``i`` is a random real document whose slot and token directions get Gaussian noise
    (``noise`` times a random unit direction, then renormalised, tags kept) and which loses a
    random ``drop`` fraction of its tokens (at least one kept): the lengths, tag layout and
    similarity structure stay those of real encoded text.
    """
    fmt = infer_format(docs[0])
    rng = np.random.default_rng(seed)
    out = []
    for base in rng.integers(0, len(docs), n):
        d = np.asarray(docs[base], dtype=np.float32)
        toks = d[N_SLOTS:, 1:]
        keep = rng.random(len(toks)) >= drop
        if len(toks) and not keep.any():
            keep[rng.integers(len(toks))] = True
        toks = toks[keep]

        def jitter(x: np.ndarray) -> np.ndarray:
            x = x / np.linalg.norm(x, axis=1, keepdims=True)
            e = rng.standard_normal(x.shape).astype(np.float32)
            return x + noise * e / np.linalg.norm(e, axis=1, keepdims=True)

        slots = fmt.slot_vectors(jitter(d[:N_SLOTS, 1:]))
        tv = fmt.token_vectors(jitter(toks)) if len(toks) else np.zeros((0, d.shape[1]))
        out.append(np.concatenate([slots, tv]).astype(np.float32))
    return out


# -- the comparison ------------------------------------------------------------------------------------
def _parse_backends(text: str) -> list[tuple[str, str]]:
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        label, _, name = item.partition("=") if "=" in item else (item, "", item)
        if name not in BACKENDS:
            raise SystemExit(f"uibk-embed compare: unknown backend {name!r}; known: "
                             f"{', '.join(sorted(BACKENDS))}")
        if label in (x[0] for x in out):
            raise SystemExit(f"uibk-embed compare: backend label {label!r} given twice")
        out.append((label, name))
    if not out:
        raise SystemExit("uibk-embed compare: --backends is empty")
    return out


def chosen_backends(text: str | None) -> list[tuple[str, str]]:
    """``--backends`` as ``(label, registry name)`` pairs: ``None`` (not given) is the local
    backends, ``all`` every registered one.

    >>> chosen_backends("exact,raw=plaid")
    [('exact', 'exact'), ('raw', 'plaid')]
    >>> ("milvus", "milvus") in chosen_backends(None), ("exact", "exact") in chosen_backends(None)
    (False, True)
    """
    if text is None:
        return [(n, n) for n in default_backends(BACKENDS)]
    if text.strip() == "all":
        return [(n, n) for n in BACKENDS]
    return _parse_backends(text)


def _parse_options(pairs: Sequence[str], labels: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in pairs:
        label, sep, kv = p.partition(":")
        if not sep or "=" not in kv or label not in labels:
            raise SystemExit(f"uibk-embed compare: --option expects LABEL:KEY=VALUE with LABEL one of "
                             f"{', '.join(labels)}; got {p!r}")
        k, v = kv.split("=", 1)
        try:
            out.setdefault(label, {})[k] = json.loads(v)
        except json.JSONDecodeError:
            out.setdefault(label, {})[k] = v
    return out


def _store_options(label: str, name: str, options: dict[str, dict[str, Any]],
                   workdir: Path) -> tuple[Path, dict[str, Any]]:
    """The folder of ``label``'s store under ``workdir`` and its options: the backend's defaults
    for that folder, overridden by the user's ``--option``s (``_Skip`` when it cannot run here)."""
    folder = workdir / "stores" / label
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder, {**default_options(name, folder), **options.get(label, {})}


def _store_bytes(store: Any, folder: Path) -> int | None:
    """What the store takes on disk: a database's own size, else its folder (None: in memory)."""
    if hasattr(store, "size_bytes"):
        return int(store.size_bytes())
    return _dir_bytes(folder) if folder.exists() and any(folder.iterdir()) else None


def interleaved(doc_ids: list[str], docs: Sequence[np.ndarray], query_ids: list[str],
                queries: Sequence[np.ndarray], backends: Sequence[tuple[str, str]],
                options: dict[str, dict[str, Any]], workdir: Path, *, repeat: int = 1,
                progress: Any = None) -> dict[str, dict[str, Any]]:
    """Every ``(label, backend)`` in this process, side by side (``compare --interleave``): the
    raw figures per label that :func:`~uibk_embedding.apps.compare_metrics.summarise` reads.

    Each store is built in turn (``build_s``: upserts of 512 documents, the store's ``flush()``
    where it has one and one warm-up query,
    :func:`~uibk_embedding.apps.compare_worker.finish_build`). Then ``repeat`` passes over the
    queries: query ``i`` goes to every store before query ``i + 1``, the stores' order rotated
    by one per query and pass, and a query's latency is the median of its passes. Sizes on disk
    are read after the queries. A store that fails to open, build or answer is reported as
    skipped with the reason.

    >>> import numpy as np, tempfile
    >>> from uibk_embedding.testing import make_list
    >>> from uibk_embedding.tagged import TaggedFormat
    >>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
    >>> docs, qs = [make_list(fmt, rng, 6) for _ in range(5)], [make_list(fmt, rng, 4) for _ in range(3)]
    >>> raw = interleaved([f"d{i}" for i in range(5)], docs, ["q0", "q1", "q2"], qs,
    ...                   [("a", "exact"), ("b", "exact")], {}, Path(tempfile.mkdtemp()), repeat=3)
    >>> [r.get("skipped") for r in raw.values()]
    [None, None]
    >>> raw["a"]["runs"] == raw["b"]["runs"], len(raw["b"]["latencies_s"]), raw["a"]["count"]
    (True, 3, 5)
    """
    raw: dict[str, dict[str, Any]] = {}
    stores: dict[str, tuple[Any, Path]] = {}
    try:
        for label, name in backends:
            if progress is not None:
                progress.set_postfix_str(f"{label}: build, {len(doc_ids):,} docs")
            try:
                folder, opts = _store_options(label, name, options, workdir)
                if any(key.startswith("_") for key in opts):  # _local_server, _local_pg, ...
                    raise _Skip("it starts a local server; run it without --interleave")
                t0 = time.perf_counter()
                store = open_store(name, **{"format": infer_format(docs[0]), **opts})  # the lists' own
                stores[label] = (store, folder)
                open_s, t0 = time.perf_counter() - t0, time.perf_counter()
                for i in range(0, len(docs), 512):
                    store.upsert(doc_ids[i:i + 512], docs[i:i + 512])
                upsert_s = time.perf_counter() - t0
                finish_build(store, queries[0])
                raw[label] = {"open_s": open_s, "upsert_s": upsert_s, "build_s": time.perf_counter() - t0,
                              "count": store.count(), "peak_rss_mb": None, "base_rss_mb": None}
            except Exception as e:  # reported, as the worker reports it
                why = str(e) if isinstance(e, _Skip) else f"failed: {type(e).__name__}: {e}"
                raw[label] = {"skipped": why}
        live = [label for label, _ in backends if "skipped" not in raw[label]]
        lat: dict[str, list[list[float]]] = {label: [[] for _ in queries] for label in live}
        runs: dict[str, dict[str, list[str]]] = {label: {} for label in live}
        for p in range(max(1, repeat)):
            if progress is not None:
                progress.set_postfix_str(f"queries interleaved, pass {p + 1} of {max(1, repeat)}")
            for i, (qid, q) in enumerate(zip(query_ids, queries, strict=True)):
                shift = (i + p) % len(live) if live else 0
                for label in live[shift:] + live[:shift]:
                    if "skipped" in raw[label]:
                        continue
                    try:
                        t1 = time.perf_counter()
                        hits = stores[label][0].search(q, k=K)
                        lat[label][i].append(time.perf_counter() - t1)
                    except Exception as e:
                        raw[label] = {"skipped": f"failed on query {qid}: {type(e).__name__}: {e}"}
                        continue
                    runs[label].setdefault(qid, [h.id for h in hits])
        for label in live:
            if "skipped" not in raw[label]:
                store, folder = stores[label]
                raw[label].update(runs=runs[label], latencies_s=[statistics.median(x) for x in lat[label]],
                                  index_bytes=_store_bytes(store, folder), search=search_path(store))
    finally:
        for store, _ in stores.values():
            store.close()
        if progress is not None:
            progress.update(len(backends))
    return raw


def compare(doc_ids: list[str], docs: Sequence[np.ndarray], query_ids: list[str],
            queries: Sequence[np.ndarray], qrels: dict[str, dict[str, int]],
            backends: Sequence[tuple[str, str]], options: dict[str, dict[str, Any]], *,
            repeat: int = 1, timeout: float = 3600.0, threads: int | None = None,
            progress: Any = None, workdir: Path | None = None,
            interleave: bool = False) -> dict[str, dict[str, Any]]:
    """Run every ``(label, backend)`` in its own process on these vectors (with ``interleave``:
    all in this process, :func:`interleaved`); figures per label."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="uibk-compare-")) if own else Path(workdir)  # type: ignore[arg-type]
    try:
        if interleave:
            raw = interleaved(doc_ids, docs, query_ids, queries, backends, options, work, repeat=repeat,
                              progress=progress)
        else:
            raw = {}
            arrays = work / "arrays"
            _save_arrays(arrays, doc_ids, docs, query_ids, queries)
            for label, name in backends:
                if progress is not None:
                    progress.set_postfix_str(f"{label}, {len(doc_ids):,} docs")
                try:
                    folder, opts = _store_options(label, name, options, work)
                except _Skip as e:
                    raw[label] = {"skipped": str(e)}
                else:
                    raw[label] = _run_backend(label, name, opts, arrays, folder, repeat, timeout, threads)
                    shutil.rmtree(folder, ignore_errors=True)
                if progress is not None:
                    progress.update(1)
        ref_label = next((lab for lab, n in backends if n == "exact" and "runs" in raw[lab]
                          and not options.get(lab) and set(raw[lab]["runs"]) >= set(query_ids)), None)
        if ref_label is not None:  # the exact store ran the reference kernel on every query
            reference = raw[ref_label]["runs"]
        else:  # none, or it stopped at its time budget: the reference is computed here
            reference = exact_runs(docs, doc_ids, queries, query_ids)
        return {label: summarise(raw[label], qrels, reference) for label, _ in backends}
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)


def first_part(coll: Collection, max_docs: int | None, max_queries: int | None) -> Collection:
    """The first ``max_docs`` documents and ``max_queries`` queries of ``coll`` (None: all), with
    their judgments.

    >>> from uibk_embedding.apps.data import Document
    >>> c = Collection("c", [Document("d1", "a"), Document("d2", "b")], {"q1": "a", "q2": "b"},
    ...                {"q1": {"d1": 1}, "q2": {"d2": 1}})
    >>> part = first_part(c, 1, 1)
    >>> [d.id for d in part.corpus], part.queries, part.qrels
    (['d1'], {'q1': 'a'}, {'q1': {'d1': 1}})
    """
    queries = dict(list(coll.queries.items())[:max_queries])
    return Collection(coll.name, coll.corpus[:max_docs], queries,
                      {q: r for q, r in coll.qrels.items() if q in queries})


def _seconds(text: str) -> float:
    """``--timeout``: a positive, finite number of seconds (-1 skipped every backend, NaN ran them all)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="uibk-embed compare", description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    p.add_argument("--backends", default=None,
                   help="comma-separated registry names or LABEL=NAME, or 'all' for every registered "
                        "backend (default: the local ones, " + ", ".join(LOCAL_BACKENDS) + "; qdrant "
                        "in local mode only; servers such as milvus, pgvector, weaviate when named)")
    p.add_argument("--dense-weight", type=_dense_weight, default=None,
                   help="the query-time dense weight w every backend and the exact reference score at "
                        "(default: the encoder's own, 4 for the embedded model, as search and eval); "
                        "the report states it")
    p.add_argument("--retrieval-mode", choices=RETRIEVAL_MODES, default="hybrid",
                   help="hybrid (default), dense (the queries' slot rows only) or tokens (their token rows "
                        "only), for every backend and the exact reference, no re-index; the report states it")
    p.add_argument("--option", action="append", default=[], metavar="LABEL:KEY=VALUE",
                   help="backend option (JSON value), repeatable")
    p.add_argument("--out", default="compare-out", help="folder for compare.json, compare.md, PNGs")
    p.add_argument("--encoder", default=None, help="encoder folder (default: the embedded model)")
    p.add_argument("--split", default="test", help="the qrels split to score (default test)")
    p.add_argument("--repeat", type=_positive_int, default=1, help="timed passes over the queries")
    p.add_argument("--interleave", action="store_true",
                   help="every backend in this one process, the queries going round the backends (each "
                        "query's latency: the median of its --repeat passes); no per-backend peak memory")
    p.add_argument("--max-docs", type=_positive_int, default=None, help="use the first N documents only")
    p.add_argument("--max-queries", type=_positive_int, default=None, help="use the first N queries only")
    p.add_argument("--scale", default=None,
                   help="comma-separated collection sizes (synthetic documents beyond the real ones)")
    p.add_argument("--timeout", type=_seconds, default=3600.0, help="seconds per backend")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="cap the worker's BLAS/OpenMP/Rayon threads (default: the libraries' own)")
    p.add_argument("--no-cache", action="store_true", help="do not cache the encoded vectors")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """``uibk-embed compare``; returns the exit status.

    >>> import pathlib, tempfile
    >>> missing = pathlib.Path(tempfile.mkdtemp()) / "missing"
    >>> try:
    ...     main([str(missing), "--backends", "exact"])
    ... except SystemExit as e:
    ...     print(str(e).replace(str(missing), "MISSING"))
    uibk-embed compare: MISSING is not a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return _worker_main(argv[1], argv[2])
    args = build_parser().parse_args(argv)
    backends = chosen_backends(args.backends)
    options = _parse_options(args.option, [lab for lab, _ in backends])
    sizes = sorted({int(x) for x in args.scale.split(",") if x.strip()}) if args.scale else []
    if any(n <= 0 for n in sizes):
        raise SystemExit("uibk-embed compare: --scale sizes must be positive")
    if args.interleave and args.threads:
        raise SystemExit("uibk-embed compare: --threads caps the worker processes, which --interleave "
                         "does not start; set OMP_NUM_THREADS (and the like) in the environment instead")

    try:
        coll = load_beir(args.data, split=args.split)
    except (DataError, FileNotFoundError) as e:
        raise SystemExit(f"uibk-embed compare: {e}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rounds = sizes or [None]
    load_before = os.getloadavg()  # another load on the cores changes every timing: said in the report
    bar = tqdm(total=1 + len(rounds) * len(backends) + 1, desc="compare", unit="stage",
               disable=args.quiet)
    try:
        bar.set_postfix_str("encoding (cached)")

        # the whole collection is encoded (and cached) once; subsets are taken from the vectors
        encoder = load_encoder(args.encoder)
        if (args.max_docs is not None or args.max_queries is not None) and (args.no_cache or not (
                cache_dir() / f"{coll.name}-{_fingerprint(encoder, coll)}.npz").exists()):
            coll = first_part(coll, args.max_docs, args.max_queries)  # the whole is not encoded yet
        w = args.dense_weight if args.dense_weight is not None else float(encoder.dense_weight)
        enc = encode_collection(encoder, coll, use_cache=not args.no_cache)  # queries at w = 1
        mode = args.retrieval_mode
        enc.queries = [query_for_mode(with_dense_weight(q, w), mode) for q in enc.queries]
        if args.max_docs is not None:
            enc.doc_ids, enc.docs = enc.doc_ids[: args.max_docs], enc.docs[: args.max_docs]
        if args.max_queries is not None:
            enc.query_ids, enc.queries = enc.query_ids[: args.max_queries], enc.queries[: args.max_queries]
        coll.qrels = {q: r for q, r in coll.qrels.items() if q in set(enc.query_ids)}
        bar.update(1)
        per_size: dict[str, dict[str, dict[str, Any]]] = {}
        for n in rounds:
            docs, ids = list(enc.docs), list(enc.doc_ids)
            if n is not None:
                if n <= len(docs):
                    docs, ids = docs[:n], ids[:n]
                else:
                    docs += synthetic_corpus(enc.docs, n - len(docs), seed=n)
                    ids += [f"synthetic-{i}" for i in range(n - len(ids))]
            per_size[str(len(ids))] = compare(ids, docs, enc.query_ids, enc.queries, coll.qrels,
                                              backends, options, repeat=args.repeat,
                                              timeout=args.timeout, threads=args.threads,
                                              progress=bar, interleave=args.interleave)
        bar.set_postfix_str("report")
        key = str(len(enc.doc_ids)) if not sizes else str(max(int(k) for k in per_size))
        report = {"dataset": coll.name, "n_docs": int(key), "n_queries": len(enc.query_ids),
                  "k": K, "dense_weight": w, "retrieval_mode": mode, "interleaved": args.interleave,
                  "repeat": args.repeat,
                  "load_average": {"before": [round(x, 2) for x in load_before],
                                   "after": [round(x, 2) for x in os.getloadavg()]},
                  "backends": per_size[key]}
        if sizes:
            report["scale"] = per_size
        (out / "compare.json").write_text(json.dumps(report, indent=2))
        md = [f"## {coll.name}: {int(key):,} documents, {len(enc.query_ids)} queries, dense weight {w:g}, "
              f"retrieval mode {mode}"
              + (f", queries interleaved across the backends (median of {args.repeat} passes)"
                 if args.interleave else "") + "\n",
              "Load average (1, 5, 15 min) before: {}; after: {}\n".format(
                  *(", ".join(f"{x:.2f}" for x in report["load_average"][w]) for w in ("before", "after"))),
              markdown_table(per_size[key])]
        if sizes:
            md.append("\n### Latency p50 (ms) by collection size\n")
            names = [lab for lab, _ in backends]
            md.append("| documents | " + " | ".join(names) + " |")
            md.append("|---:|" + "---:|" * len(names))
            for n, per in per_size.items():
                md.append(f"| {int(n):,} | " + " | ".join(
                    _fmt(per[b].get("latency_ms_p50"), 2) if "skipped" not in per[b] else "skipped"
                    for b in names) + " |")
            plot_scale(per_size, out, coll.name)
        (out / "compare.md").write_text("\n".join(md) + "\n")
        plot(per_size[key], out, coll.name)
        bar.update(1)
    finally:
        bar.close()
    print("\n".join(md))
    print(f"\nwrote {out / 'compare.json'}, {out / 'compare.md'} and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
