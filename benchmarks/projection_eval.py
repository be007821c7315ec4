"""Random vs PCA-fitted projections ``R`` and ``P`` of the embedded default, on BEIR collections.

The transformer's forward pass does not depend on ``R`` or ``P``, so it runs ONCE per collection:
``cache`` stores the heads before the projections (normalised sentence vectors and the token
states of exactly the positions the encoder keeps, float32, :func:`encode_heads`) in chunks that
survive an interrupted run (``--budget-s``: stop after the chunk that passes it; run again to
go on). ``eval`` then applies every projection to the cached heads
(:func:`tagged_from_heads`, the encoder's own arithmetic: ``tests/test_projection.py`` checks it
against ``encode_documents`` / ``encode_queries``), indexes the lists into the exact store and
scores them as ``uibk-embed eval`` does (:func:`uibk_embedding.apps.evaluation.run_eval`: fused =
the store's exact MaxSim at the dense weight, dense-only and token-only exactly from the same
lists). Variants:

* ``random-s0``, ``random-s1``, ``random-s2``: the encoder's seeded matrices (seed 0 is today's
  default: ``R`` from seed s, ``P`` from seed s + 1);
* ``pca-own``: ``P`` fitted by PCA on the collection's own documents, ``R`` seed 0 (what
  ``uibk-embed fit-projection`` on the corpus you index gives);
* ``pca-other``: ``P`` fitted on the documents of the OTHER collections given (a sample that has
  not seen this corpus), ``R`` seed 0;
* ``pca-shipped``: the matrices shipped for ``load_encoder(projection="pca")``: ``P`` fitted on
  the documents of cranfield, npl and limit-small together (``ship``; so this row has seen the
  collection it is scored on: ``pca-other`` is the held-out estimate), ``R`` seed 0;
* ``pca-R-own`` / ``pca-RP-own``: ``R`` fitted too (``fit_dense=True``; slots interleaved), with
  random-s0's ``P`` (seed 1) / fitted. A collection with fewer documents than the 381 directions of ``R``
  (limit-small: 46) adds its queries to the sample.

Besides nDCG@10 and recall, ``aligned@10``: the share of (query, top-10 document) pairs whose
score decomposes exactly (every query slot selected its own document slot, docs/format.md#identity).

Usage::

    python benchmarks/projection_eval.py cache cranfield npl limit-small [--budget-s 480]
    python benchmarks/projection_eval.py ship cranfield npl limit-small \
        --out src/uibk_embedding/encoder/data/minilm_pca.npz
    python benchmarks/projection_eval.py eval cranfield npl limit-small \
        [--out benchmarks/results/projection_eval.json] [--md benchmarks/results/projection_eval.md]
    python benchmarks/projection_eval.py eval cranfield npl limit-small --dense-weight 8 \
        --variants random-s0,pca-shipped,pca-other --out benchmarks/results/projection_w8.json

Collections are names under ``$UIBK_DATASETS`` (default ``../shared/datasets``) or folders.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from uibk_embedding.tagged import TaggedFormat

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path(os.environ.get("UIBK_PROJECTION_CACHE", "/tmp/uibk-projection-cache"))
SEEDS = (0, 1, 2)


def _dataset(name: str) -> Path:
    p = Path(name)
    if p.is_dir():
        return p
    root = Path(os.environ.get("UIBK_DATASETS", REPO.parent / "shared" / "datasets"))
    if not (root / name).is_dir():
        root = Path("/work/shared/datasets")
    return root / name


def _encoder():
    from uibk_embedding.encoder import load_encoder

    return load_encoder(projection="random", show_progress=False)  # heads: before any projection


def _ident(enc, coll) -> str:
    from uibk_embedding.apps.evaluation import collection_fingerprint

    cfg = {k: v for k, v in enc.config().items() if k in (
        "model", "query_token_cap", "query_max_length", "doc_max_length")}
    return collection_fingerprint(cfg, coll, 16)


def _save_chunk(path: Path, dense: np.ndarray, toks: list[np.ndarray]) -> None:
    off = np.concatenate([[0], np.cumsum([len(t) for t in toks])]).astype(np.int64)
    mat = np.concatenate(toks) if off[-1] else np.zeros((0, dense.shape[1]), np.float32)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    with open(tmp, "wb") as f:
        np.savez(f, dense=dense, tok_mat=mat.astype(np.float32), tok_off=off)
    os.replace(tmp, path)


def _load_chunk(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with np.load(path) as z:
        return z["dense"], z["tok_mat"], z["tok_off"]


def cache_collection(coll, folder: Path, ident: str, chunk: int, deadline: float,
                     write_queries: Callable[[Path], None],
                     write_docs: Callable[[Path, list[str]], None]) -> bool:
    """The resumable cache of one collection in ``folder``: ``meta.json`` (refused when it names
    another encoding), the queries (``write_queries(folder)``) and the documents chunk by chunk
    (``write_docs(path, texts)``, one ``docs-NNNN.npz`` each) until ``time.perf_counter()``
    passes ``deadline``. True when every chunk is cached."""
    folder.mkdir(parents=True, exist_ok=True)
    meta_path = folder / "meta.json"
    n_chunks = (len(coll.corpus) + chunk - 1) // chunk
    meta = {"ident": ident, "chunk": chunk, "n_docs": len(coll.corpus), "n_chunks": n_chunks,
            "doc_ids": [d.id for d in coll.corpus], "query_ids": list(coll.queries)}
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if old["ident"] != ident or old["chunk"] != chunk:
            raise SystemExit(f"{folder} holds another encoding (encoder/collection/chunk); "
                             "remove it or pass --cache-dir")
    else:
        meta_path.write_text(json.dumps(meta))
    write_queries(folder)
    for c in range(n_chunks):
        cpath = folder / f"docs-{c:04d}.npz"
        if cpath.exists():
            continue
        if time.perf_counter() > deadline:
            break
        docs = coll.corpus[c * chunk:(c + 1) * chunk]
        t1 = time.perf_counter()
        write_docs(cpath, [d.full_text for d in docs])
        print(f"{coll.name}: chunk {c + 1}/{n_chunks} ({len(docs)} docs) in "
              f"{time.perf_counter() - t1:.1f} s", flush=True)
    done = sum((folder / f"docs-{c:04d}.npz").exists() for c in range(n_chunks))
    print(f"{coll.name}: {done}/{n_chunks} chunks cached in {folder}", flush=True)
    return done == n_chunks


def cmd_cache(args: argparse.Namespace) -> int:
    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.encoder.projection import encode_heads

    deadline = time.perf_counter() + args.budget_s
    enc = _encoder()
    complete = True
    for name in args.data:
        coll = load_beir(_dataset(name))

        def queries(folder: Path, coll=coll) -> None:
            if not (folder / "queries.npz").exists():
                texts = [coll.queries[q] for q in coll.queries]
                _save_chunk(folder / "queries.npz", *encode_heads(enc, texts, is_query=True))

        def docs(path: Path, texts: list[str]) -> None:
            _save_chunk(path, *encode_heads(enc, texts, is_query=False))

        done = cache_collection(coll, args.cache_dir / coll.name, _ident(enc, coll), args.chunk, deadline,
                                queries, docs)
        complete = complete and done
    print("complete" if complete else "partial: run again to go on", flush=True)
    return 0


def load_doc_chunks(folder: Path, load: Callable[[Path], T]) -> tuple[dict, list[T]]:
    """``meta.json`` of a cached collection and its document chunks, each read by ``load``
    (refuses an incomplete cache)."""
    meta = json.loads((folder / "meta.json").read_text())
    parts = []
    for c in range(meta["n_chunks"]):
        p = folder / f"docs-{c:04d}.npz"
        if not p.exists():
            raise SystemExit(f"{folder}: chunk {c} is missing; run `cache` again")
        parts.append(load(p))
    return meta, parts


def join_offsets(offsets: list[np.ndarray]) -> np.ndarray:
    """The token offsets of chunks laid end to end (each chunk's offsets start at 0)."""
    offs, base = [np.zeros(1, np.int64)], 0
    for off in offsets:
        offs.append(off[1:] + base)
        base += int(off[-1])
    return np.concatenate(offs)


def load_heads(folder: Path) -> dict:
    """The cached heads of one collection: dense (n, D), token matrix + offsets, for docs and
    queries, and the ids (refuses an incomplete cache)."""
    meta, parts = load_doc_chunks(folder, _load_chunk)
    dense = np.concatenate([p[0] for p in parts])
    mat = np.concatenate([p[1] for p in parts])
    qd, qm, qo = _load_chunk(folder / "queries.npz")
    return {"doc_ids": meta["doc_ids"], "query_ids": meta["query_ids"], "ident": meta["ident"],
            "doc_dense": dense, "doc_mat": mat, "doc_off": join_offsets([p[2] for p in parts]),
            "q_dense": qd, "q_mat": qm, "q_off": qo}


def _split(mat: np.ndarray, off: np.ndarray) -> list[np.ndarray]:
    return [mat[off[i]:off[i + 1]] for i in range(len(off) - 1)]


def _shipped() -> dict[str, np.ndarray] | None:
    from uibk_embedding.encoder.transformer import EMBEDDED_PCA_FILE

    if not EMBEDDED_PCA_FILE.exists():
        return None
    with np.load(EMBEDDED_PCA_FILE) as z:
        return {"R": z["R"], "P": z["P"]}


def variants(heads: dict, others: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    """Every projection the benchmark compares (see the module docstring)."""
    from uibk_embedding.encoder.projection import pca_from_heads
    from uibk_embedding.tagged import BODY, N_SLOTS, orthonormal_rows

    D, d = heads["doc_dense"].shape[1], heads["doc_mat"].shape[1]
    out = {f"random-s{s}": {"R": orthonormal_rows(N_SLOTS * BODY, D, s).astype(np.float32),
                            "P": orthonormal_rows(BODY, d, s + 1).astype(np.float32)} for s in SEEDS}
    R0, P0 = out["random-s0"]["R"], out["random-s0"]["P"]
    if len(heads["doc_dense"]) >= N_SLOTS * BODY:
        own = pca_from_heads(heads["doc_dense"], [heads["doc_mat"]])
    else:  # too few documents for R's 381 directions (limit-small: 46): its queries too
        own = pca_from_heads(np.concatenate([heads["doc_dense"], heads["q_dense"]]),
                             [heads["doc_mat"], heads["q_mat"]])
    out["pca-own"] = {"R": R0, "P": own["P"]}
    if others:
        out["pca-other"] = {"R": R0, "P": pca_from_heads(None, [o["doc_mat"] for o in others])["P"]}
    shipped = _shipped()
    if shipped is not None and shipped["R"].shape == (N_SLOTS * BODY, D):
        out["pca-shipped"] = shipped
    out["pca-R-own"] = {"R": own["R"], "P": P0}
    out["pca-RP-own"] = {"R": own["R"], "P": own["P"]}
    return out


def aligned_at_10(store, enc, dense_weight: float) -> float:
    """Share of (query, top-10 document) pairs whose score decomposes exactly (docs/format.md#identity:
    separated, and every query slot selected its own document slot)."""
    from uibk_embedding.apps.evaluation import fused_run, with_dense_weight
    from uibk_embedding.tagged import decompose

    run = fused_run(store, enc, dense_weight, k=10)
    docs = dict(zip(enc.doc_ids, enc.docs, strict=True))
    ok = n = 0
    for qid, q in zip(enc.query_ids, enc.queries, strict=True):
        qw = with_dense_weight(q, dense_weight)
        for did in run[qid]:
            parts = decompose(qw, docs[did])
            ok += parts.separated and parts.slots_aligned
            n += 1
    return ok / n


def eval_variant(coll, heads: dict, proj: dict, dense_weight: float) -> dict:
    from uibk_embedding.adapters import open_store
    from uibk_embedding.apps.evaluation import Encoded, index_into, run_eval
    from uibk_embedding.encoder.projection import tagged_from_heads

    fmt = TaggedFormat()
    docs = tagged_from_heads(heads["doc_dense"], _split(heads["doc_mat"], heads["doc_off"]),
                             proj["R"], proj["P"], fmt)
    qs = tagged_from_heads(heads["q_dense"], _split(heads["q_mat"], heads["q_off"]),
                           proj["R"], proj["P"], fmt)
    enc = Encoded(heads["doc_ids"], docs, heads["query_ids"], qs)
    store = open_store("exact")
    index_into(store, enc, coll, show_progress=False)
    res = run_eval(coll, enc, store, dense_weight)
    res["metrics"]["aligned@10"] = aligned_at_10(store, enc, dense_weight)
    store.close()
    return res["metrics"]


def cmd_eval(args: argparse.Namespace) -> int:
    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.encoder.projection import projection_id
    from uibk_embedding.encoder.transformer import DEFAULT_DENSE_WEIGHT

    w = args.dense_weight or DEFAULT_DENSE_WEIGHT
    colls = {n: load_beir(_dataset(n)) for n in args.data}
    heads = {n: load_heads(args.cache_dir / colls[n].name) for n in args.data}
    result: dict = {"dense_weight": w, "encoder": "embedded:all-MiniLM-L6-v2", "collections": {},
                    "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                                "load_average": list(os.getloadavg())}}
    for n in args.data:
        t0 = time.perf_counter()
        vs = variants(heads[n], [heads[o] for o in args.data if o != n])
        if args.variants:
            unknown = set(args.variants) - set(vs)
            if unknown:
                raise SystemExit(f"unknown variants {sorted(unknown)}; known: {sorted(vs)}")
            vs = {v: vs[v] for v in args.variants}
        rows = {}
        for v, proj in vs.items():
            rows[v] = {"projection_id": projection_id(proj["R"], proj["P"]),
                       "metrics": eval_variant(colls[n], heads[n], proj, w)}
            m = rows[v]["metrics"]
            print(f"{colls[n].name:<12} {v:<11} " + "  ".join(
                f"{h} {m[h]['ndcg@10']:.4f}/{m[h]['recall@100']:.4f}"
                for h in ("dense", "tokens", "fused")) + f"  aligned@10 {m['aligned@10']:.3f}",
                flush=True)
        result["collections"][colls[n].name] = {
            "n_docs": len(heads[n]["doc_ids"]), "n_queries": len(heads[n]["query_ids"]),
            "cache_ident": heads[n]["ident"], "seconds": round(time.perf_counter() - t0, 1),
            "variants": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)  # after each collection
        args.out.write_text(json.dumps(result, indent=1))
        if args.md:
            args.md.write_text(markdown(result))
    print(f"wrote {args.out}" + (f" and {args.md}" if args.md else ""))
    return 0


def markdown(result: dict) -> str:
    """The table of docs/model.md: nDCG@10 (and recall@100; recall@2 on limit-small) per head."""
    lines = [f"dense weight w = {result['dense_weight']:g}; exact MaxSim; random: mean (min-max) over "
             f"seeds {', '.join(map(str, SEEDS))}", ""]
    for name, c in result["collections"].items():
        second = "recall@2" if name.startswith("limit") else "recall@100"
        lines += [f"**{name}** ({c['n_docs']} docs, {c['n_queries']} queries): nDCG@10 / {second}", "",
                  "| projection | dense | tokens | fused | fused aligned@10 |", "|---|---|---|---|---|"]
        vs = c["variants"]
        rnd = [vs[f"random-s{s}"]["metrics"] for s in SEEDS]

        def cell(ms: list[dict], head: str, second: str = second) -> str:
            a = [m[head]["ndcg@10"] for m in ms]
            b = [m[head][second] for m in ms]
            if len(ms) == 1:
                return f"{a[0]:.4f} / {b[0]:.4f}"
            return (f"{np.mean(a):.4f} ({min(a):.4f}-{max(a):.4f}) / "
                    f"{np.mean(b):.4f} ({min(b):.4f}-{max(b):.4f})")

        heads = ("dense", "tokens", "fused")
        al = [m["aligned@10"] for m in rnd]
        lines.append("| random (3 seeds) | " + " | ".join(cell(rnd, h) for h in heads)
                     + f" | {np.mean(al):.3f} ({min(al):.3f}-{max(al):.3f}) |")
        for v in vs:
            m = vs[v]["metrics"]
            lines.append(f"| {v} | " + " | ".join(cell([m], h) for h in heads)
                         + f" | {m['aligned@10']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def cmd_ship(args: argparse.Namespace) -> int:
    """Fit the PCA projection shipped with the embedded default (``projection="pca"``): ``P`` on
    the token states of the documents of the cached collections (in the order given), ``R`` the
    seed-0 matrix of the seeded default; save both."""
    from uibk_embedding.encoder.projection import pca_from_heads, projection_id
    from uibk_embedding.tagged import BODY, N_SLOTS, orthonormal_rows

    heads = [load_heads(args.cache_dir / name) for name in args.data]
    proj = pca_from_heads(None, [h["doc_mat"] for h in heads])
    proj["R"] = orthonormal_rows(N_SLOTS * BODY, heads[0]["doc_dense"].shape[1], 0).astype(np.float32)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, R=proj["R"], P=proj["P"])
    n = sum(len(h["doc_ids"]) for h in heads)
    print(f"wrote {args.out}: PCA on {n} documents of {', '.join(args.data)}, "
          f"projection {projection_id(proj['R'], proj['P'])}")
    return 0


def add_cache_parser(sub: Any, help: str) -> argparse.ArgumentParser:
    """The ``cache`` subcommand: the collections, documents per chunk, the time budget."""
    c = sub.add_parser("cache", help=help)
    c.add_argument("data", nargs="+")
    c.add_argument("--chunk", type=int, default=500)
    c.add_argument("--budget-s", type=float, default=480.0)
    return c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = add_cache_parser(sub, "run the forward pass once, cache the heads (resumable)")
    e = sub.add_parser("eval", help="score every projection on the cached heads")
    e.add_argument("data", nargs="+")
    e.add_argument("--dense-weight", type=float, default=None)
    e.add_argument("--variants", type=lambda t: t.split(","), default=None,
                   help="comma-separated subset, e.g. random-s0,pca-shipped (default: all)")
    e.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "projection_eval.json")
    e.add_argument("--md", type=Path, default=None)
    s = sub.add_parser("ship", help="fit the PCA projection shipped with the embedded default")
    s.add_argument("data", nargs="+")
    s.add_argument("--out", type=Path, required=True)
    for sp in (c, e, s):
        sp.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = p.parse_args(argv)
    return {"cache": cmd_cache, "eval": cmd_eval, "ship": cmd_ship}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
