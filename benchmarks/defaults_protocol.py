"""Leave-one-collection-out report of a tuned default (issue: every constant picked by looking at
the shared collections gets this protocol): for each collection, the dense weight ``w`` is
picked on the OTHER collections (best mean fused nDCG@10) and reported on the held-out one,
beside the default ``w = 4`` and the held-out collection's own best (which no one may pick).

It reads the measured sweeps of ``benchmarks/projection_eval.py eval --dense-weight W``
(``benchmarks/results/projection_w{1,2,4,8,16}.json``); it measures nothing itself.

Usage::

    python benchmarks/defaults_protocol.py [--variants random-s0,pca-shipped,pca-other] \
        [--md benchmarks/results/defaults_protocol.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
WEIGHTS = (1, 2, 4, 8, 16)
DEFAULT_W = 4


def load(variants: list[str]) -> dict[str, dict[str, dict[int, dict]]]:
    """variant -> collection -> w -> {"fused"/"dense"/"tokens": nDCG@10}."""
    out: dict[str, dict[str, dict[int, dict]]] = {}
    for w in WEIGHTS:
        data = json.loads((RESULTS / f"projection_w{w}.json").read_text())
        for coll, c in data["collections"].items():
            for v in variants:
                m = c["variants"].get(v)
                if m is None:
                    continue
                out.setdefault(v, {}).setdefault(coll, {})[w] = {
                    head: m["metrics"][head]["ndcg@10"] for head in ("fused", "dense", "tokens")}
    return out


def loco(table: dict[str, dict[int, dict]]) -> list[dict]:
    rows = []
    colls = sorted(table)
    for held in colls:
        others = [c for c in colls if c != held]
        mean = {w: sum(table[c][w]["fused"] for c in others) / len(others) for w in WEIGHTS}
        picked = max(WEIGHTS, key=lambda w: (mean[w], -w))
        best = max(WEIGHTS, key=lambda w: table[held][w]["fused"])
        rows.append({"held_out": held, "picked_on": others, "picked_w": picked,
                     "fused_at_picked": table[held][picked]["fused"],
                     "fused_at_default": table[held][DEFAULT_W]["fused"],
                     "best_w": best, "fused_at_best": table[held][best]["fused"],
                     "dense": table[held][DEFAULT_W]["dense"], "tokens": table[held][DEFAULT_W]["tokens"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="random-s0,pca-shipped,pca-other")
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    variants = args.variants.split(",")
    data = load(variants)
    lines = ["nDCG@10, exact MaxSim; w picked on the other two collections (mean fused nDCG@10), "
             "reported on the held-out one", "",
             "| projection | held out | w picked (on) | fused at picked w | fused at w=4 | "
             "held-out best w (fused) | dense | tokens |", "|---|---|---|---|---|---|---|---|"]
    for v in variants:
        for r in loco(data[v]):
            lines.append(f"| {v} | {r['held_out']} | {r['picked_w']} ({', '.join(r['picked_on'])}) | "
                         f"{r['fused_at_picked']:.4f} | {r['fused_at_default']:.4f} | "
                         f"{r['best_w']} ({r['fused_at_best']:.4f}) | {r['dense']:.4f} | {r['tokens']:.4f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
