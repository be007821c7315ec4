"""Quality levers of the embedded default that need no training (issue #30, item 4), and when
fitting ``P`` on your own corpus helps (item 2), on BEIR collections.

One forward pass per collection (``cache``, resumable like ``benchmarks/projection_eval.py``,
whose helpers it reuses) keeps, per text, the sentence vector, the token states of EVERY
position (``[CLS]`` and ``[SEP]`` included) and the token ids; queries are read up to the
encoder's 256 tokens with no cap, and once more padded PyLate-style with ``[MASK]`` to 32
positions. ``eval`` then builds each variant's tagged lists from those heads with the
encoder's arithmetic (:func:`uibk_embedding.encoder.projection.tagged_from_heads`; the default
variant gives exactly the encoder's lists, ``tests/test_levers_eval.py``) and scores them as
``uibk-embed eval`` does (exact MaxSim, fused at w = 4, dense-only and token-only from the
same lists). Every variant uses the default seeded random ``R`` and ``P``. Levers:

* ``skiplist``: ``none`` (default) or ``punct``, PyLate's default document-side skiplist (the
  token ids of ``string.punctuation``, each character through ``convert_tokens_to_ids``, dropped
  from documents only, as ``ColBERT(skiplist_words=None)`` does);
* ``positions``: which of the model's positions give no token vector, i.e. which ones the 3
  slots stand in for: ``cls+sep`` (default: text tokens only), ``sep`` (``[CLS]`` kept as a
  token vector), ``cls`` (``[SEP]`` kept), ``none`` (both kept);
* ``query_tokens``: the query token cap (8, 16, 32, 64 = default, 128, 256 = no cap), and PyLate's
  query expansion to 32 positions with ``[MASK]`` (``expand32``: masks not attended, PyLate's
  default ``attend_to_expansion_tokens=False``; ``expand32-attend``: attended);
* ``normalisation``: what happens to the heads before ``R`` / ``P`` (a scale of ``g`` or ``h``
  changes nothing, as every slice and every token body is normalised after the projection, so
  only non-scalar maps are levers): ``none`` (default), token states centred by the mean token
  state of the other collections' documents (``center-other``; a fixed vector that could ship)
  or of the collection's own documents (``center-own``; a fit on your corpus, no labels),
  standardised per dimension by the own documents (``zscore-own``), and the sentence vector
  centred by the own documents' mean before ``R`` (``dense-center-own``).

The protocol is ``benchmarks/defaults_protocol.py``'s: for each held-out collection the
setting with the best mean fused nDCG@10 on the other two is picked and reported on the third;
a lever is kept only when that pick beats the default on every held-out collection.

``fit``: ``P`` fitted by PCA (``pca-own``) on seeded random samples of each collection's own
documents of several sizes, against the random default, with the number of token states the
fit saw.

Usage::

    python benchmarks/levers_eval.py cache cranfield npl limit-small [--budget-s 480]
    python benchmarks/levers_eval.py eval cranfield npl limit-small \
        --out benchmarks/results/levers_eval.json --md benchmarks/results/levers_eval.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import string
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import projection_eval as pe  # the cache helpers and dataset lookup

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path(os.environ.get("UIBK_LEVERS_CACHE", "/tmp/uibk-levers-cache"))
EXPAND_TO = 32  # PyLate's default query_length
QUERY_CAPS = (8, 16, 32, 64, 128, 256)
FIT_SIZES = (10, 30, 100, 300, 1000, 3000)
FIT_STATE_CAPS = (300, 1000, 3000, 10000, 50000)  # token states of the whole corpus, even strides
FIT_SEEDS = (0, 1, 2)
DEFAULTS = {"skiplist": "none", "positions": "cls+sep", "query_tokens": "cap64",
            "normalisation": "none"}


# -- cache ------------------------------------------------------------------------------------
def _save(path: Path, dense: np.ndarray, states: list[np.ndarray], ids: list[np.ndarray],
          keep_from: list[int]) -> None:
    off = np.concatenate([[0], np.cumsum([len(t) for t in states])]).astype(np.int64)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    with open(tmp, "wb") as f:
        np.savez(f, dense=dense, tok_mat=np.concatenate(states).astype(np.float32), tok_off=off,
                 ids=np.concatenate(ids).astype(np.int32), n_text=np.asarray(keep_from, np.int64))
    os.replace(tmp, path)


def full_heads(enc, texts: list[str], *, is_query: bool, expand: int = 0, attend: bool = False):
    """Per text: the sentence vector, the states of all its positions, their ids and its length
    without expansion. ``expand``: pad queries with ``[MASK]`` to that many positions (PyLate's
    query expansion), attended or not. Same tokenizer, limits, batches and forward as the
    encoder (``encode_heads``)."""
    import torch

    mask_id = int(enc.tokenizer.mask_token_id)
    n = len(texts)
    dense: np.ndarray | None = None
    states_out: list = [None] * n
    ids_out: list = [None] * n
    lens = [0] * n
    for batch in enc._batches(texts, enc._length_order(texts), is_query):
        tb = enc._tokenize([texts[i] for i in batch], is_query)
        inputs = dict(tb.inputs)
        ids = inputs["input_ids"]
        n_real = inputs["attention_mask"].sum(1)
        if expand and ids.shape[1] < expand:
            width = expand
            pad = torch.full((ids.shape[0], width - ids.shape[1]), 0, dtype=ids.dtype)
            ids = torch.cat([ids, pad], 1)
            inputs["attention_mask"] = torch.cat([inputs["attention_mask"], pad], 1)
            if "token_type_ids" in inputs:
                inputs["token_type_ids"] = torch.zeros_like(ids)
        if expand:
            cols = torch.arange(ids.shape[1])[None, :]
            is_pad = (cols >= n_real[:, None]) & (cols < expand)
            ids = torch.where(is_pad, torch.full_like(ids, mask_id), ids)
            if attend:
                inputs["attention_mask"] = torch.where(is_pad, 1, inputs["attention_mask"])
        inputs["input_ids"] = ids
        with enc._lock, torch.inference_mode():
            g, st = enc._forward(enc._to_device(inputs))
        g = g.float().cpu().numpy()
        st = st.float().cpu().numpy()
        if dense is None:
            dense = np.empty((n, g.shape[1]), np.float32)
        for j, i in enumerate(batch):
            m = int(n_real[j])
            end = max(m, expand) if expand else m
            dense[i] = g[j]
            states_out[i] = st[j, :end].copy()
            ids_out[i] = ids[j, :end].numpy().copy()
            lens[i] = m
    return dense, states_out, ids_out, lens


def cmd_cache(args: argparse.Namespace) -> int:
    from uibk_embedding.apps.data import load_beir

    deadline = time.perf_counter() + args.budget_s
    enc = pe._encoder()
    complete = True
    for name in args.data:
        coll = load_beir(pe._dataset(name))

        def queries(folder: Path, coll=coll) -> None:
            qtexts = [coll.queries[q] for q in coll.queries]
            for fname, kw in (("queries.npz", {}), ("queries-expand.npz", {"expand": EXPAND_TO}),
                              ("queries-expand-attend.npz", {"expand": EXPAND_TO, "attend": True})):
                if not (folder / fname).exists():
                    _save(folder / fname, *full_heads(enc, qtexts, is_query=True, **kw))

        def docs(path: Path, texts: list[str]) -> None:
            _save(path, *full_heads(enc, texts, is_query=False))

        done = pe.cache_collection(coll, args.cache_dir / coll.name, pe._ident(enc, coll), args.chunk,
                                   deadline, queries, docs)
        complete = complete and done
    print("complete" if complete else "partial: run again to go on", flush=True)
    return 0


# -- heads and variants -----------------------------------------------------------------------
def _load(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def load_full(folder: Path) -> dict:
    """The cached heads of one collection (refuses an incomplete cache): for ``docs``,
    ``queries``, ``queries-expand``, ``queries-expand-attend``: ``dense`` (n, D), ``mat``
    (all positions), ``off``, ``ids``, ``n`` (length without expansion)."""
    meta, parts = pe.load_doc_chunks(folder, _load)
    out = {"doc_ids": meta["doc_ids"], "query_ids": meta["query_ids"], "ident": meta["ident"],
           "docs": {"dense": np.concatenate([p["dense"] for p in parts]),
                    "mat": np.concatenate([p["tok_mat"] for p in parts]),
                    "off": pe.join_offsets([p["tok_off"] for p in parts]),
                    "ids": np.concatenate([p["ids"] for p in parts]),
                    "n": np.concatenate([p["n_text"] for p in parts])}}
    for name in ("queries", "queries-expand", "queries-expand-attend"):
        z = _load(folder / f"{name}.npz")
        out[name] = {"dense": z["dense"], "mat": z["tok_mat"], "off": z["tok_off"], "ids": z["ids"],
                     "n": z["n_text"]}
    return out


def punctuation_ids(tokenizer) -> np.ndarray:
    """PyLate's default skiplist: ``convert_tokens_to_ids`` of each ``string.punctuation``
    character (pylate/models/colbert.py), minus the unknown-token id it gives a miss."""
    ids = {int(tokenizer.convert_tokens_to_ids(c)) for c in string.punctuation}
    ids.discard(int(tokenizer.unk_token_id))
    return np.asarray(sorted(ids), np.int64)


def select_rows(part: dict, *, positions: str = "cls+sep", cap: int | None = None,
                expanded: bool = False, skip_ids: np.ndarray | None = None) -> np.ndarray:
    """A boolean mask over ``part['mat']``: the rows that become token vectors. ``positions``
    names the positions the slots stand in for (default ``cls+sep``: the encoder's ``starts=1``,
    ``ends=max(2, n-1)``); ``cap``: the first ``cap`` kept rows of a text from its start (the
    encoder's query cap); ``expanded``: the ``[MASK]`` rows after the text are kept too;
    ``skip_ids``: rows with these token ids are dropped (after the cap)."""
    off, n = part["off"], part["n"]
    lens = np.diff(off)
    text = np.repeat(np.arange(len(lens)), lens)
    pos = np.arange(off[-1]) - off[:-1][text]
    nt = n[text]
    start = 0 if positions in ("sep", "none") else 1
    end = nt if positions in ("cls", "none") else np.maximum(2, nt - 1)
    if cap is not None:
        end = np.minimum(end, start + cap)
    keep = (pos >= start) & (pos < end)
    if expanded:
        keep |= pos >= nt
    if skip_ids is not None and len(skip_ids):
        keep &= ~np.isin(part["ids"], skip_ids)
    return keep


def split_rows(part: dict, keep: np.ndarray, mat: np.ndarray | None = None) -> list[np.ndarray]:
    m = part["mat"] if mat is None else mat
    counts = np.add.reduceat(keep.astype(np.int64), part["off"][:-1]) if len(keep) else \
        np.zeros(len(part["n"]), np.int64)
    counts = np.where(np.diff(part["off"]) == 0, 0, counts)
    rows = m[keep]
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [rows[bounds[i]:bounds[i + 1]] for i in range(len(counts))]


def default_projection(heads: dict) -> tuple[np.ndarray, np.ndarray]:
    """The encoder's default seeded matrices: ``R`` from seed 0, ``P`` from seed 1."""
    from uibk_embedding.tagged import BODY, N_SLOTS, orthonormal_rows

    D, d = heads["docs"]["dense"].shape[1], heads["docs"]["mat"].shape[1]
    return (orthonormal_rows(N_SLOTS * BODY, D, 0).astype(np.float32),
            orthonormal_rows(BODY, d, 1).astype(np.float32))


def lever_settings(punct: np.ndarray) -> dict[str, dict[str, dict]]:
    """lever -> setting -> keyword arguments of :func:`build`."""
    return {
        "skiplist": {"none": {}, "punct": {"doc_skip": punct}},
        "positions": {p: {"positions": p} for p in ("cls+sep", "sep", "cls", "none")},
        "query_tokens": {**{f"cap{c}": {"cap": c} for c in QUERY_CAPS},
                         "expand32": {"expand": "queries-expand"},
                         "expand32-attend": {"expand": "queries-expand-attend"}},
        "normalisation": {s: {"norm": s} for s in ("none", "center-other", "center-own",
                                                   "zscore-own", "dense-center-own")},
    }


def build(heads: dict, others: list[dict], *, positions: str = "cls+sep", cap: int = 64,
          expand: str | None = None, doc_skip: np.ndarray | None = None, norm: str = "none"):
    """(doc dense, doc token states per text, query dense, query token states per text) of
    one setting; the defaults give exactly the heads the encoder turns into its lists."""
    d = heads["docs"]
    dkeep = select_rows(d, positions=positions, skip_ids=doc_skip)
    qpart = heads[expand or "queries"]
    qkeep = select_rows(qpart, positions=positions, cap=cap, expanded=expand is not None)
    dmat, qmat = d["mat"], qpart["mat"]
    ddense, qdense = d["dense"], qpart["dense"]
    if norm != "none":
        own = d["mat"][select_rows(d)]
        if norm == "center-other":
            mu = np.concatenate([o["docs"]["mat"][select_rows(o["docs"])] for o in others]
                                ).mean(0, dtype=np.float64).astype(np.float32)
        else:
            mu = own.mean(0, dtype=np.float64).astype(np.float32)
        if norm in ("center-other", "center-own"):
            dmat, qmat = dmat - mu, qmat - mu
        elif norm == "zscore-own":
            sd = own.std(0, dtype=np.float64).astype(np.float32)
            dmat, qmat = (dmat - mu) / sd, (qmat - mu) / sd
        elif norm == "dense-center-own":
            gmu = ddense.mean(0, dtype=np.float64).astype(np.float32)
            ddense, qdense = ddense - gmu, qdense - gmu
        else:
            raise ValueError(norm)
    return ddense, split_rows(d, dkeep, dmat), qdense, split_rows(qpart, qkeep, qmat)


def score(coll, heads: dict, built, R: np.ndarray, P: np.ndarray, dense_weight: float) -> dict:
    """nDCG@10 (and recall) of dense, tokens and fused, as ``uibk-embed eval`` scores them."""
    from uibk_embedding.adapters import open_store
    from uibk_embedding.apps.evaluation import Encoded, index_into, run_eval
    from uibk_embedding.encoder.projection import tagged_from_heads
    from uibk_embedding.tagged import TaggedFormat

    fmt = TaggedFormat()
    ddense, dtoks, qdense, qtoks = built
    enc = Encoded(heads["doc_ids"], tagged_from_heads(ddense, dtoks, R, P, fmt),
                  heads["query_ids"], tagged_from_heads(qdense, qtoks, R, P, fmt))
    store = open_store("exact")
    index_into(store, enc, coll, show_progress=False)
    m = run_eval(coll, enc, store, dense_weight)["metrics"]
    store.close()
    return {h: {k: round(float(v), 6) for k, v in m[h].items()} for h in ("dense", "tokens", "fused")}


def loco(table: dict[str, dict[str, float]], default: str) -> list[dict]:
    """Leave-one-collection-out (benchmarks/defaults_protocol.py): per held-out collection the
    setting with the best mean fused nDCG@10 on the other two (ties: the default, then the
    order given), its fused nDCG@10 there and the default's."""
    colls = list(table)
    settings = list(table[colls[0]])
    rows = []
    for held in colls:
        others = [c for c in colls if c != held]
        mean = {s: float(np.mean([table[c][s] for c in others])) for s in settings}
        best = max(mean.values())
        picked = default if mean[default] >= best - 1e-12 else next(s for s in settings if mean[s] == best)
        own_best = max(settings, key=lambda x: table[held][x])
        rows.append({"held_out": held, "picked_on": others, "picked": picked,
                     "held_out_best": own_best, "fused_at_held_out_best": table[held][own_best],
                     "mean_fused_on_picking": round(mean[picked], 6),
                     "fused_at_picked": table[held][picked], "fused_at_default": table[held][default],
                     "helps": picked != default and table[held][picked] > table[held][default]})
    return rows


def fit_rows(coll, heads: dict, R: np.ndarray, P0: np.ndarray, w: float) -> list[dict]:
    """``pca-own`` on seeded random samples of the collection's own documents."""
    from uibk_embedding.encoder.projection import pca_from_heads

    n_docs = len(heads["doc_ids"])
    built = build(heads, [])
    dtoks = built[1]
    sizes = [s for s in FIT_SIZES if s < n_docs] + [n_docs]
    total = int(sum(len(t) for t in dtoks))
    jobs = [(size, seed, None) for size in sizes for seed in (FIT_SEEDS if size < n_docs else (0,))]
    jobs += [(n_docs, 0, cap) for cap in FIT_STATE_CAPS if cap < total]
    out = []
    for size, seed, cap in jobs:
        pick = np.sort(np.random.default_rng(seed).choice(n_docs, size, replace=False))
        sample = [dtoks[i] for i in pick]
        n_states = int(sum(len(t) for t in sample))
        if cap is not None:
            n_states = min(n_states, cap)
        row = {"n_docs": int(size), "seed": int(seed), "token_states": n_states, "state_cap": cap}
        try:
            P = pca_from_heads(None, sample, **({} if cap is None else {"max_token_rows": cap}))["P"]
        except ValueError as e:
            row["refused"] = str(e)
            out.append(row)
            print(f"{coll.name:<12} fit {size:>6} docs seed {seed}: refused ({e})", flush=True)
            continue
        row["metrics"] = score(coll, heads, built, R, P, w)
        out.append(row)
        print(f"{coll.name:<12} fit {size:>6} docs seed {seed} ({n_states} states): "
              f"tokens {row['metrics']['tokens']['ndcg@10']:.4f} "
              f"fused {row['metrics']['fused']['ndcg@10']:.4f}", flush=True)
    return out


def cmd_eval(args: argparse.Namespace) -> int:
    from uibk_embedding.apps.data import load_beir
    from uibk_embedding.encoder.transformer import DEFAULT_DENSE_WEIGHT

    w = DEFAULT_DENSE_WEIGHT
    enc = pe._encoder()
    punct = punctuation_ids(enc.tokenizer)
    colls = {n: load_beir(pe._dataset(n)) for n in args.data}
    heads = {n: load_full(args.cache_dir / colls[n].name) for n in args.data}
    levers = lever_settings(punct)
    if args.levers:
        levers = {k: levers[k] for k in args.levers}
    result: dict = {
        "dense_weight": w, "encoder": "embedded:all-MiniLM-L6-v2, projection random (R seed 0, P seed 1)",
        "defaults": DEFAULTS, "punctuation_ids": punct.tolist(),
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "load_average_start": list(os.getloadavg())},
        "collections": {}, "levers": {}, "fit": {}}
    if args.resume and args.out.exists():  # keep what an interrupted run measured
        old = json.loads(args.out.read_text())
        for k in ("collections", "levers", "fit"):
            result[k] = old[k]
        result["machine"]["load_average_start"] = old["machine"]["load_average_start"]
        result["machine"]["resumed_at_load_average"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["machine"]["load_average_end"] = list(os.getloadavg())
        args.out.write_text(json.dumps(result, indent=1))
        if args.md:
            args.md.write_text(markdown(result))

    default_cache: dict[str, dict] = {}
    for n in args.data:
        c = colls[n]
        R, P = default_projection(heads[n])
        others = [heads[o] for o in args.data if o != n]
        d = heads[n]["docs"]
        result["collections"][c.name] = {
            "n_docs": len(heads[n]["doc_ids"]), "n_queries": len(heads[n]["query_ids"]),
            "cache_ident": heads[n]["ident"],
            "doc_token_states": int(select_rows(d).sum()),
            "doc_punctuation_states": int(select_rows(d, skip_ids=None).sum()
                                          - select_rows(d, skip_ids=punct).sum())}
        for lever, settings in levers.items():
            for s, kw in settings.items():
                if kw.get("norm") == "center-other" and not others:
                    continue  # needs another collection's documents
                t0 = time.perf_counter()
                done = result["levers"].get(lever, {}).get(c.name, {}).get(s)
                if done is not None:
                    if not kw or s == DEFAULTS.get(lever):
                        default_cache[n] = {"m": done}
                    continue
                if not kw or s == DEFAULTS.get(lever):
                    if "m" not in default_cache.get(n, {}):
                        default_cache[n] = {"m": score(c, heads[n], build(heads[n], others), R, P, w)}
                    m = default_cache[n]["m"]
                else:
                    m = score(c, heads[n], build(heads[n], others, **kw), R, P, w)
                result["levers"].setdefault(lever, {}).setdefault(c.name, {})[s] = m
                print(f"{c.name:<12} {lever:<13} {s:<17} " + "  ".join(
                    f"{h} {m[h]['ndcg@10']:.4f}" for h in ("dense", "tokens", "fused"))
                    + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
                save()
        if not args.no_fit and c.name not in result["fit"]:
            result["fit"][c.name] = {"random_default": default_cache[n]["m"] if n in default_cache
                                     else score(c, heads[n], build(heads[n], others), R, P, w),
                                     "rows": fit_rows(c, heads[n], R, P, w)}
            save()
    add_loco(result)
    save()
    print(f"wrote {args.out}" + (f" and {args.md}" if args.md else ""))
    return 0


def add_loco(result: dict) -> None:
    """The LOCO rows and the decision of every lever measured on three collections."""
    result["loco"] = {}
    for lever in result["levers"]:
        table = {c: {s: m["fused"]["ndcg@10"] for s, m in v.items()}
                 for c, v in result["levers"][lever].items()}
        if len(table) == 3 and len({tuple(v) for v in table.values()}) == 1:
            rows = loco(table, DEFAULTS[lever])
            result["loco"][lever] = {"rows": rows, "kept": all(r["helps"] for r in rows)}


def cmd_report(args: argparse.Namespace) -> int:
    """LOCO and markdown again from a results file (and the collections of others merged in)."""
    result = json.loads(args.out.read_text())
    for extra in args.merge or []:
        other = json.loads(Path(extra).read_text())
        result["collections"].update(other["collections"])
        result["fit"].update(other["fit"])
        for lever, per in other["levers"].items():
            result["levers"].setdefault(lever, {}).update(per)
        result["machine"].setdefault("merged", []).append({"file": str(extra), **other["machine"]})
    add_loco(result)
    args.out.write_text(json.dumps(result, indent=1))
    if args.md:
        args.md.write_text(markdown(result))
    print(f"wrote {args.out}" + (f" and {args.md}" if args.md else ""))
    return 0


def _mm(a: list[float], sign: str = "") -> str:
    if len(a) == 1:
        return f"{a[0]:{sign}.4f}"
    return f"{np.mean(a):{sign}.4f} ({min(a):{sign}.4f}..{max(a):{sign}.4f})"


def markdown(result: dict) -> str:
    """Per lever: nDCG@10 of every setting on every collection, the LOCO table and the
    decision; then the own-corpus fits."""
    la = result["machine"]
    lines = [f"Embedded default ({result['encoder']}), dense weight w = {result['dense_weight']:g}, "
             f"exact MaxSim, nDCG@10. Load average at start {la['load_average_start'][0]:.2f}, at end "
             f"{la.get('load_average_end', la['load_average_start'])[0]:.2f} (2 cores, shared; "
             "quality figures do not depend on it). Generated by `benchmarks/levers_eval.py eval`.", ""]
    for name, c in result["collections"].items():
        lines.append(f"- {name}: {c['n_docs']} docs, {c['n_queries']} queries, {c['doc_token_states']} "
                     f"document token states, {c['doc_punctuation_states']} of them punctuation")
    lines.append("")
    for lever, per in result["levers"].items():
        lines += [f"### {lever} (default `{result['defaults'][lever]}`)", "",
                  "| setting | " + " | ".join(f"{c} dense / tokens / fused" for c in per) + " |",
                  "|---|" + "---|" * len(per)]
        for s in next(iter(per.values())):
            lines.append(f"| {s} | " + " | ".join(
                " / ".join(f"{per[c][s][h]['ndcg@10']:.4f}" for h in ("dense", "tokens", "fused"))
                if s in per[c] else "-" for c in per) + " |")
        lo = result.get("loco", {}).get(lever)
        if lo:
            lines += ["", "| held out | picked (on) | fused at picked | fused at default | helps | "
                      "held-out best (no one may pick it) |", "|---|---|---|---|---|---|"]
            for r in lo["rows"]:
                lines.append(f"| {r['held_out']} | {r['picked']} ({', '.join(r['picked_on'])}) | "
                             f"{r['fused_at_picked']:.4f} | {r['fused_at_default']:.4f} | "
                             f"{'yes' if r['helps'] else 'no'} | "
                             f"{r['held_out_best']} ({r['fused_at_held_out_best']:.4f}) |")
            verdict = "KEPT (helps on every held-out collection)" if lo["kept"] else "not kept"
            lines += ["", f"Decision: {verdict}"]
        lines.append("")
    if result["fit"]:
        lines += ["### Own-corpus fit of `P` (`pca-own` on a random sample of the documents)", "",
                  "| collection | sample docs | seeds | token states (mean) | tokens | fused | "
                  "tokens - random | fused - random |", "|---|---|---|---|---|---|---|---|"]
        for name, f in result["fit"].items():
            base = f["random_default"]
            lines.append(f"| {name} | random default | - | - | {base['tokens']['ndcg@10']:.4f} | "
                         f"{base['fused']['ndcg@10']:.4f} | - | - |")
            for size, cap in dict.fromkeys((r["n_docs"], r.get("state_cap")) for r in f["rows"]):
                rs = [r for r in f["rows"] if r["n_docs"] == size and r.get("state_cap") == cap]
                label = f"{size}" if cap is None else f"{size}, {cap} states kept"
                ok = [r for r in rs if "metrics" in r]
                st = int(np.mean([r["token_states"] for r in rs]))
                if not ok:
                    lines.append(f"| {name} | {label} | {len(rs)} | {st} | refused | refused | - | - |")
                    continue
                tk = [r["metrics"]["tokens"]["ndcg@10"] for r in ok]
                fu = [r["metrics"]["fused"]["ndcg@10"] for r in ok]
                dt = [x - base["tokens"]["ndcg@10"] for x in tk]
                df = [x - base["fused"]["ndcg@10"] for x in fu]
                lines.append(f"| {name} | {label} | {len(ok)} | {st} | {_mm(tk)} | {_mm(fu)} | "
                             f"{_mm(dt, '+')} | {_mm(df, '+')} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = pe.add_cache_parser(sub, "one forward pass per collection, all positions (resumable)")
    e = sub.add_parser("eval", help="score every lever setting and the own-corpus fits")
    e.add_argument("data", nargs="+")
    e.add_argument("--levers", type=lambda t: t.split(","), default=None)
    e.add_argument("--no-fit", action="store_true", help="skip the own-corpus P fits")
    e.add_argument("--resume", action="store_true", help="keep the figures --out already holds")
    e.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "levers_eval.json")
    e.add_argument("--md", type=Path, default=None)
    r = sub.add_parser("report", help="LOCO and markdown again from a results file")
    r.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "levers_eval.json")
    r.add_argument("--merge", nargs="*", help="results files of other collections to merge in")
    r.add_argument("--md", type=Path, default=None)
    for sp in (c, e):
        sp.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    args = p.parse_args(argv)
    return {"cache": cmd_cache, "eval": cmd_eval, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
