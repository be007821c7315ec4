"""The reports of ``uibk-embed compare``: the markdown table and the plots.

>>> print(markdown_table({"exact": {"skipped": "not here"}}).splitlines()[-1])  # doctest: +ELLIPSIS
- exact: ...not here...
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


# -- reports ------------------------------------------------------------------------------------------
def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def markdown_table(backends: dict[str, dict[str, Any]]) -> str:
    """The comparison as a markdown table (skipped backends listed under it with the reason).

    Against exact MaxSim: ``recall@10 vs exact`` (the overlap of the top-10 sets), ``identical
    top-10 vs exact`` (the share of queries with the very same ids in the same order) and ``shared
    pairs in exact order`` (of the documents in both top-10s, the share of pairs ordered alike).
    ``search``: which path answered (``index`` or ``exact``) where the store tells.

    >>> print(markdown_table({"x": {"skipped": "no server"}}).splitlines()[-1])
    - x: skipped (no server)
    """
    head = ("| backend | nDCG@10 | recall@10 | recall@10 vs exact | identical top-10 vs exact "
            "| shared pairs in exact order | build (s) "
            "| index (MiB) | peak RSS (MiB) | p50 (ms) | p95 (ms) | QPS | queries | search |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    skipped = []
    for name, r in backends.items():
        if "skipped" in r:
            skipped.append(f"- {name}: skipped ({r['skipped']})")
            continue
        size = r["index_bytes"] / 2**20 if r.get("index_bytes") is not None else None
        lines.append(
            f"| {name} | {_fmt(r['ndcg@10'])} | {_fmt(r['recall@10'])} | {_fmt(r['recall@10_vs_exact'])} "
            f"| {_fmt(r.get('identical_top10'))} | {_fmt(r.get('shared_pair_order@10'))} "
            f"| {_fmt(r['build_s'], 1)} | {_fmt(size, 1)} "
            f"| {_fmt(r['peak_rss_mb'], 0)} | {_fmt(r['latency_ms_p50'], 2)} "
            f"| {_fmt(r['latency_ms_p95'], 2)} | {_fmt(r['qps'], 1)} | {r.get('queries_run', '-')} "
            f"| {r.get('search') or '-'} |")
    return "\n".join(lines + (["", *skipped] if skipped else []))


def plot(backends: dict[str, dict[str, Any]], out: Path, title: str) -> list[Path]:
    """``recall_vs_latency.png`` and ``index_size.png`` in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {k: v for k, v in backends.items() if "skipped" not in v}
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in ok.items():
        y = r["recall@10_vs_exact"]
        ax.scatter([r["latency_ms_p50"]], [y if y is not None else math.nan])
        ax.annotate(name, (r["latency_ms_p50"], y if y is not None else 0), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("query latency p50 (ms, log)")
    ax.set_ylabel("recall@10 vs exact MaxSim")
    ax.set_title(f"{title}: recall vs latency")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    paths.append(out / "recall_vs_latency.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    sized = {k: v["index_bytes"] / 2**20 for k, v in ok.items() if v.get("index_bytes") is not None}
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(list(sized), list(sized.values()))
    ax.set_ylabel("index size on disk (MiB)")
    ax.set_title(f"{title}: index size")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    paths.append(out / "index_size.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def plot_scale(scale: dict[str, dict[str, dict[str, Any]]], out: Path, title: str) -> Path:
    """``latency_vs_size.png``: p50 latency of each backend against the number of documents."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    names = sorted({b for per in scale.values() for b in per})
    for name in names:
        pts = [(int(n), per[name]["latency_ms_p50"]) for n, per in scale.items()
               if name in per and "skipped" not in per[name]]
        if pts:
            xs, ys = zip(*sorted(pts), strict=True)
            ax.plot(xs, ys, marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("documents")
    ax.set_ylabel("query latency p50 (ms)")
    ax.set_title(f"{title}: latency vs collection size")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "latency_vs_size.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
