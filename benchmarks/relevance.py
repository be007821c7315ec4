"""Calibrate and report the relevance scale of ``uibk_embedding.rank.relevance`` (``Hit.relevance``).

``calibrate``: paragraphs of Python standard-library module docstrings (not an evaluation
collection). Each paragraph's first sentence is a query; the rest of its paragraph is a
related document, the best of N random other paragraphs the off-topic match. Prints the hybrid
fractions' quantiles and the knots of ``RELEVANCE_KNOTS``: x of the 0.5 knot is the off-topic best
matches' 90th percentile (OFF_TOPIC_BELOW_HALF), so that an off-topic query's best document falls
below 0.5 nine times in ten (the aim of issue #42; the equal-error point, used before, left a third
above); x of the 0.25 knot is the smaller of the off-topic 5th percentile and half
the 0.5 knot's x. Also scores gibberish queries against
the paragraphs. Writes the per-threshold table of this calibration data (related documents
kept, off-topic and gibberish best matches rejected, precision) into the "Calibration" section
of benchmarks/results/relevance.md, beside the shared collections' tables (which ``report``
writes and keeps this section).

``report``: for ../shared/datasets/{cranfield,npl} (a few hundred documents: every judged one
of the first queries, plus others), the relevance of judged-relevant vs non-relevant top-10
pairs and the precision/recall of each threshold 0.3..0.8. Writes benchmarks/results/relevance.md.

``python benchmarks/relevance.py [calibrate | report]`` (no argument: ``calibrate``).

    python benchmarks/relevance.py calibrate
    python benchmarks/relevance.py report
"""

from __future__ import annotations

import importlib
import re
import sys
import time
from pathlib import Path

import numpy as np

import uibk_embedding as ue
from uibk_embedding.rank import RELEVANCE_KNOTS, hybrid_fraction, relevance, rerank

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "relevance.md"
CALIBRATION = "## Calibration"  # the section calibrate writes and report keeps
GIBBERISH = ["zzz qqq xxy", "asdf qwer zxcv", "blorp fnarg wibble", "xq zv kj pw", "lorem ipsum dolor",
             "qzx vlorp ttrank mmnbv", "florb gnix wubba", "kkrp vntz qqlo", "hjkl yuio bnm",
             "wibble wobble fnord", "xyzzy plugh", "mmm nnn ooo ppp", "grok zorp blat", "qwop qwop",
             "zxcvbnm asdfghjkl", "blah blah blah", "oook eek", "vrrm vrrm skrt", "plonk twee fizz",
             "nrrg hmmf"]
THRESHOLDS = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6)
OFF_TOPIC_BELOW_HALF = 0.9  # the share of off-topic best matches the 0.5 knot puts below 0.5
SKIP = ("test", "idlelib", "tkinter", "turtle", "antigravity", "this", "lib2to3", "ensurepip", "__")


def stdlib_paragraphs(limit: int = 400, seed: int = 0) -> list[str]:
    paras: list[str] = []
    for m in sorted(sys.stdlib_module_names):
        if m.startswith(SKIP):
            continue
        try:
            mod = importlib.import_module(m)
        except Exception:
            continue
        docs = [mod.__doc__ if isinstance(mod.__doc__, str) else ""]
        for _, obj in sorted(vars(mod).items()):
            if callable(obj) and getattr(obj, "__module__", None) == m and isinstance(obj.__doc__, str):
                docs.append(obj.__doc__)
        for d in docs:
            for p in re.split(r"\n\s*\n", d):
                p = " ".join(p.split())
                if 200 <= len(p) <= 1500 and p.count(".") >= 2 and not p.startswith((">>>", "-", "*")):
                    paras.append(p)
    paras = list(dict.fromkeys(paras))
    rng = np.random.default_rng(seed)
    return [paras[i] for i in rng.permutation(len(paras))[:limit]]


def split_first(p: str) -> tuple[str, str]:
    """(first sentence, the rest): the rest is the related document, so the query is not
    copied into it."""
    parts = re.split(r"(?<=[.!?])\s", p, maxsplit=1)
    return parts[0], parts[1] if len(parts) > 1 else ""


def equal_error(pos: np.ndarray, neg: np.ndarray) -> float:
    """The threshold where the share of related pairs below it equals the share of off-topic
    pairs at or above it."""
    grid = np.linspace(0, 1, 2001)
    gap = [abs(np.mean(pos < t) - np.mean(neg >= t)) for t in grid]
    return float(grid[int(np.argmin(gap))])


def threshold_table(own: list[float], off: list[float], gib: list[float]) -> list[str]:
    """Markdown rows: per relevance threshold, the related documents kept (recall), the related
    queries' top hits kept, the off-topic and gibberish best matches rejected, and the precision
    of what is kept when each query meets one related document and its best off-topic one.

    >>> threshold_table([0.9, 0.2], [0.1, 0.6], [0.3])[2].split(" | ")[:4]
    ['| 0.20', '2/2 (1.00)', '2/2 (1.00)', '1/2 (0.50)']
    """
    rows = ["| threshold | related document kept (recall) | related query's top hit kept "
            "| off-topic best rejected | gibberish best rejected | precision |",
            "|---:|---:|---:|---:|---:|---:|"]
    top = [max(o, f) for o, f in zip(own, off, strict=True)]  # its own document or a better other

    def share(n: int, of: int) -> str:
        return f"{n}/{of} ({n / of:.2f})" if of else "0/0"

    for th in THRESHOLDS:
        kept, kept_off = sum(r >= th for r in own), sum(r >= th for r in off)
        prec = kept / (kept + kept_off) if kept + kept_off else float("nan")
        rows.append(f"| {th:.2f} | {share(kept, len(own))} | {share(sum(r >= th for r in top), len(top))} "
                    f"| {share(len(off) - kept_off, len(off))} | {share(sum(r < th for r in gib), len(gib))} "
                    f"| {prec:.3f} |")
    return rows


def calibrate(n_random: int = 50) -> None:
    t0 = time.time()
    enc = ue.load_encoder()
    paras = stdlib_paragraphs()
    split = [s for s in map(split_first, paras) if len(s[1]) >= 100]
    docs = enc.encode_documents([rest for _, rest in split])
    queries = enc.encode_queries([first for first, _ in split])
    rng = np.random.default_rng(1)
    own, off = [], []
    for i, q in enumerate(queries):
        others = [j for j in rng.choice(len(split), n_random + 1, replace=False) if j != i][:n_random]
        own.append(hybrid_fraction(q, rerank(q, [docs[i]], 1, dtype=np.float64)[0][1]))
        best = rerank(q, [docs[j] for j in others], 1, dtype=np.float64)[0][1]
        off.append(hybrid_fraction(q, best))
    gib = [hybrid_fraction(q, rerank(q, docs, 1, dtype=np.float64)[0][1])
           for q in enc.encode_queries(GIBBERISH)]
    own_a, off_a = np.array(own), np.array(off)
    qs = [0.05, 0.25, 0.5, 0.75, 0.95]
    x_half = float(np.quantile(off_a, OFF_TOPIC_BELOW_HALF))
    x_quarter = min(float(np.quantile(off_a, 0.05)), x_half / 2)
    log = [f"{len(split)} stdlib paragraphs, off-topic = best of {n_random} random others, "
           f"{len(GIBBERISH)} gibberish queries, {time.time() - t0:.0f} s",
           f"hybrid fraction quantiles {qs}",
           f"  related (rest of its paragraph): {np.round(np.quantile(own_a, qs), 3).tolist()}",
           f"  off-topic best:         {np.round(np.quantile(off_a, qs), 3).tolist()}",
           f"  gibberish best over all paragraphs: {np.round(np.quantile(gib, qs), 3).tolist()}",
           f"equal-error point (not used): {equal_error(own_a, off_a):.3f}",
           f"RELEVANCE_KNOTS = ((0.0, 0.0), ({x_quarter:.3f}, 0.25), ({x_half:.3f}, 0.5), (1.0, 1.0))",
           f"in code: RELEVANCE_KNOTS = {RELEVANCE_KNOTS}"]
    print("\n".join(log))
    rel = [[relevance_of(h) for h in xs] for xs in (own, off, gib)]
    table = threshold_table(*rel)
    print("\n".join(table))
    section = [f"{CALIBRATION}: what each threshold keeps on the calibration data", "",
               "`python benchmarks/relevance.py calibrate`: paragraphs of Python standard-library",
               "docstrings (no evaluation collection, no qrels). Each paragraph's first sentence is a",
               "query; the rest of its paragraph its related document; the best of 50 random other",
               "paragraphs its off-topic match; gibberish queries meet every paragraph. Relevance",
               "through the knots in code (`uibk_embedding.rank.RELEVANCE_KNOTS`). A query's top hit is",
               "its related document or an off-topic one that scores higher. Precision: of the pairs",
               "kept, the related ones, when each query meets its related document and its best",
               "off-topic match.", "", *table, "", "```", *log, "```", ""]
    write_section(section)


def write_section(section: list[str]) -> None:
    """Put the calibration ``section`` into :data:`RESULTS`, replacing the one there."""
    old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    head = old.split(f"\n{CALIBRATION}", 1)[0].rstrip() if old else "# Relevance scale"
    RESULTS.write_text(head + "\n\n" + "\n".join(section), encoding="utf-8")
    print("wrote", RESULTS)


def relevance_of(h: float) -> float:
    xs, ys = zip(*RELEVANCE_KNOTS, strict=True)
    return float(np.interp(h, xs, ys))


def report(n_queries: int = 40, n_docs: int = 400) -> None:
    from uibk_embedding.apps.data import read_corpus, read_qrels, read_queries

    enc = ue.load_encoder()
    lines = ["# Relevance scale on the shared collections", "",
             "`python benchmarks/relevance.py report` (relevance: `uibk_embedding.rank.relevance`, knots",
             "calibrated on stdlib docstrings by `benchmarks/relevance.py calibrate`, never on qrels).",
             f"Per collection: the first {n_queries} queries with judgements; corpus: every judged document",
             f"of those queries plus random others, {n_docs} documents in all; embedded default encoder;",
             "exact store. Pairs: each query's top 10. Recall: of the judged-relevant documents in the",
             "corpus, the share retrieved in the top 10 at or above the threshold.", ""]
    for name in ("cranfield", "npl"):
        t0 = time.time()
        path = ROOT.parent / "shared" / "datasets" / name
        corpus = {d.id: d for d in read_corpus(path)}
        qtext = read_queries(path)
        qrels = read_qrels(path)
        qids = [q for q in qtext if any(v > 0 for v in qrels.get(q, {}).values())][:n_queries]
        ids = list(dict.fromkeys(d for q in qids for d, v in qrels[q].items() if v > 0 and d in corpus))
        rng = np.random.default_rng(0)
        rest = [d for d in corpus if d not in set(ids)]
        ids += [rest[i] for i in rng.permutation(len(rest))[: max(0, n_docs - len(ids))]]
        store = ue.open_store("exact", format=enc.format)
        store.upsert(ids, enc.encode_documents([corpus[d].full_text for d in ids]))
        rel_pos, rel_neg, n_judged, best = [], [], 0, []
        pairs = []
        for qid, q in zip(qids, enc.encode_queries([qtext[q] for q in qids]), strict=True):
            judged = {d for d, v in qrels[qid].items() if v > 0 and d in set(ids)}
            n_judged += len(judged)
            hits = store.search(q, k=10)
            best.append(relevance(q, hits[0].score))
            for h in hits:
                r = relevance(q, h.score)
                pairs.append((r, h.id in judged))
                (rel_pos if h.id in judged else rel_neg).append(r)
        qs = [0.1, 0.25, 0.5, 0.75, 0.9]
        lines += [f"## {name}: {len(qids)} queries, {len(ids)} documents, {n_judged} judged-relevant pairs"
                  f" ({time.time() - t0:.0f} s)", "",
                  "| top-10 pairs | n | p10 | p25 | median | p75 | p90 |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for label, xs in (("judged relevant", rel_pos), ("not judged relevant", rel_neg),
                          ("each query's best", best)):
            qv = np.quantile(xs, qs) if xs else [float("nan")] * 5
            lines.append(f"| {label} | {len(xs)} | " + " | ".join(f"{v:.3f}" for v in qv) + " |")
        lines += ["", "| threshold | pairs kept | precision | recall |", "|---:|---:|---:|---:|"]
        for t in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
            kept = [j for r, j in pairs if r >= t]
            prec = sum(kept) / len(kept) if kept else float("nan")
            lines.append(f"| {t:.1f} | {len(kept)} | {prec:.3f} | {sum(kept) / max(1, n_judged):.3f} |")
        lines.append("")
        print("\n".join(lines[-20:]))
    old = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    mark = f"\n{CALIBRATION}"
    calibration = mark + old.split(mark, 1)[1] if mark in old else ""
    RESULTS.write_text("\n".join(lines).rstrip() + "\n" + calibration, encoding="utf-8")
    print("wrote", RESULTS)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else "calibrate"
    {"calibrate": calibrate, "report": report}[cmd]()
