"""Token pooling at index time (issue #59): stored vectors and nDCG@10 at pool factor 1, 2 and 3,
by each pooling method (``content``, the default, and ``ward``).

For every BEIR collection under the shared datasets folder (``$UIBK_DATASETS`` or
``../shared/datasets``; read from there, never copied), with the embedded default encoder and the
exact store (in memory, exact MaxSim): the corpus is encoded once (``pool_factor=1``, cached by
:func:`~uibk_embedding.apps.evaluation.encode_collection`), then each pool factor's and method's
lists are those lists pooled by :func:`~uibk_embedding.token_pooling.pool_documents`, the
function the encoder's ``pool_factor=`` runs on each batch it encodes, with the encoder's own
token rows (``encoder.token_rows``) and, for ``content``, the frequent ids fitted on the
collection (``encoder.fit_pooling``, as ``uibk-embed index`` does). Checked here on a sample: an
encoder made with that pooling gives the same lists, within the model's float noise across
batches.
Each pool factor's lists go into their own exact store opened with that format; the queries
(never pooled) are searched at the encoder's dense weight, top 100, and scored with the
metrics of ``uibk-embed eval``. Recall@10 against pool factor 1 (the same store's top 10
without pooling) says how much of the ranking moved.

Reported per collection and pool factor: stored vectors (slots included: three a document,
never pooled) and token vectors, their ratio to pool factor 1, nDCG@10, recall@10 and
recall@100, overlap@10 with pool factor 1, the time pooling took and the search p50. nDCG and
the vector counts do not depend on the machine's load; the timings do (the load average at the
start and the end is recorded).

Usage::

    .venv/bin/python benchmarks/pooling.py                # every shared collection, factors 1 2 3
    .venv/bin/python benchmarks/pooling.py --collections cranfield --factors 1 2

Writes ``benchmarks/results/pooling.json`` and ``pooling.md`` (``--out`` for another stem).

``--levers`` compares ways to pool by 2 instead (issue #59's aim: stored token vectors halved,
nDCG@10 within 0.5 points of no pooling on every shared collection): today's Ward clustering
against average and complete linkage on cosine distance, two other cluster centers (weighted
mean, minimax), the first or last tokens kept, long documents pooled harder and a cosine
threshold with a factor that adapts per document. Every variant's rows are written by
:func:`~uibk_embedding.token_pooling.pool_clusters` (slots untouched, tags exact, renormalised),
so the variants differ only in their clusters and centers. The ``tok:`` levers also use what
the tokenizer says about each token row (:func:`document_tokens`: the encoder's own input ids over
each text's span, so ``[CLS]``, ``[SEP]`` and padding are not rows): function tokens
(punctuation, special tokens, whole stopwords) merged among themselves first, repeated token ids,
the pieces of one word, content protected, function tokens skipped; and (second round) function
tokens found from the collection's document frequencies (every token id in at least X% of the
documents: :func:`with_document_frequency`, :func:`frequent_as_function`), IDF-scaled merge costs,
one merge-cost threshold for the whole collection (:func:`budget_pool`) and a penalty for merging
tokens of different segments (between punctuation). Quality and vector counts only
(no timing; the load average is recorded anyway); needs scipy (its ``linkage``) for the linkages
other than Ward::

    .venv/bin/python benchmarks/pooling.py --levers          # results/pooling_levers.{json,md}
    .venv/bin/python benchmarks/pooling.py --levers --only tok:kinds tok:protect   # merged into them

With ``--only`` the chosen levers run and their rows replace (or join) those of the existing
report; a hand-written ``## Reading`` section at the end of the markdown is kept.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding import open_store
from uibk_embedding.apps.data import load_beir
from uibk_embedding.apps.evaluation import Encoded, encode_collection, fused_run, index_into
from uibk_embedding.encoder import load_encoder
from uibk_embedding.metrics import evaluate, overlap_at_k
from uibk_embedding.tagged import N_SLOTS, POOL_METHODS
from uibk_embedding.testing.specs import datasets_dir
from uibk_embedding.token_pooling import (
    STOPWORDS,
    numbered_by_first,
    pool_clusters,
    pool_documents,
    pooled_token_count,
    ward_clusters,
)

HERE = Path(__file__).resolve().parent
SAMPLE = 32  # documents encoded again through the encoder's own pool_factor= as a check


def check_option_path(enc: Any, texts: list[str], pooled: list[np.ndarray]) -> float:
    """Encode ``texts`` with ``enc`` (an encoder made with the pooling, fitted as the benchmark's
    lists were) and return the largest difference from ``pooled`` (the lists pooled here); a shape
    that differs is an error."""
    got = enc.encode_documents(texts, show_progress=False)
    worst = 0.0
    for a, b in zip(got, pooled, strict=True):
        if a.shape != b.shape:
            raise AssertionError(f"{enc.format.pool_method} pool_factor={enc.format.pool_factor}: the "
                                 f"encoder gave {a.shape}, pooling {b.shape}")
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


def run_collection(name: str, factors: list[int], methods: Sequence[str] = POOL_METHODS) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coll = load_beir(datasets_dir() / name)
        enc = load_encoder()
        t0 = time.perf_counter()
        base = encode_collection(enc, coll)
    encode_s = time.perf_counter() - t0
    texts = [d.full_text for d in coll.corpus]
    print(f"{name}: {len(base.docs)} documents, {len(base.queries)} queries, encoded (or read from the "
          f"cache) in {encode_s:.1f} s", flush=True)
    rows = []
    reference: dict[str, list[str]] | None = None
    for p in factors:
        for method in methods if p > 1 else ("none",):
            # the encoder a user makes: load_encoder(pool_factor=p, pool_method=...), fitted on the
            # collection as `uibk-embed index` does (the content method's frequent ids)
            pooled_enc = load_encoder(pool_factor=p, pool_method=None if p == 1 else method)
            t0 = time.perf_counter()
            fit_s = 0.0
            token_rows = None
            if p > 1 and method == "content":
                pooled_enc.fit_pooling(texts, show_progress=False)
                fit_s = time.perf_counter() - t0
                token_rows = pooled_enc.token_rows(texts)
            docs = pool_documents(base.docs, pooled_enc.format, token_rows)
            pool_s = time.perf_counter() - t0
            drift = check_option_path(pooled_enc, texts[:SAMPLE], docs[:SAMPLE])
            store = open_store("exact", format=pooled_enc.format)
            index_into(store, Encoded(base.doc_ids, docs, base.query_ids, base.queries), coll,
                       show_progress=False)
            t0 = time.perf_counter()
            encoded = Encoded(base.doc_ids, docs, base.query_ids, base.queries)
            run = fused_run(store, encoded, enc.dense_weight)
            search_s = time.perf_counter() - t0
            per_query = []
            for q in base.queries[: min(50, len(base.queries))]:  # p50 over single searches
                t1 = time.perf_counter()
                store.search(q, k=10)
                per_query.append(time.perf_counter() - t1)
            store.close()
            if reference is None:
                reference = run
            m = evaluate(run, coll.qrels)
            row = {
                "pool_factor": p,
                "pool_method": method,
                "frequent_ids": len(pooled_enc.format.pool_frequent_ids),
                "documents": len(docs),
                "stored_vectors": int(sum(len(d) for d in docs)),
                "token_vectors": int(sum(len(d) - N_SLOTS for d in docs)),
                "ndcg@10": m["ndcg@10"],
                "recall@10": m["recall@10"],
                "recall@100": m["recall@100"],
                "overlap@10_vs_pool1": overlap_at_k(run, reference, 10),
                "fit_seconds": fit_s,
                "pool_seconds": pool_s,
                "search_all_seconds": search_s,
                "search_p50_ms": 1000 * float(np.median(per_query)),
                "option_path_max_abs_diff": drift,
            }
            rows.append(row)
            print(f"  pool {p} {method}: {row['stored_vectors']:,} vectors ({row['token_vectors']:,} "
                  f"tokens), nDCG@10 {row['ndcg@10']:.4f}, pooled in {pool_s:.1f} s, p50 "
                  f"{row['search_p50_ms']:.1f} ms", flush=True)
    one = rows[0]
    for r in rows:
        r["stored_ratio"] = r["stored_vectors"] / one["stored_vectors"]
        r["token_ratio"] = r["token_vectors"] / one["token_vectors"]
        r["ndcg@10_delta_points"] = 100 * (r["ndcg@10"] - one["ndcg@10"])
    return {"collection": name, "queries": len(base.queries), "encode_seconds": encode_s,
            "dense_weight": enc.dense_weight, "rows": rows}


def markdown(report: dict) -> str:
    w = report["collections"][0]["dense_weight"]
    lines = [
        "# Token pooling at index time: stored vectors and nDCG@10",
        "",
        f"Run {report['date']} on {report['machine']} ({report['cpus']} CPUs), `benchmarks/pooling.py`; "
        f"load average {report['loadavg_start']} at the start, {report['loadavg_end']} at the end "
        "(the timing columns are quiet figures only where nothing else ran; nDCG, recall and the "
        "vector counts do not depend on load).",
        "",
        f"Embedded default encoder (dense weight {w:g}), exact store (exact MaxSim, in memory), queries "
        "never pooled. Stored vectors count the three slot vectors of every document, which are never "
        "pooled; token vectors are pooled to `max(n // pool_factor, 1)` per document. Aim (issue #59): "
        "pool factor 2 halves stored vectors with nDCG@10 within 0.5 points on every shared collection.",
        "",
        "Methods (`pool_method`): `content`, the default (function tokens out, the collection's token "
        "ids in >= 90% of its documents counted as function tokens, content average-linked inside "
        "segments; fitted on the collection as `uibk-embed index` does, the count of frequent ids in "
        "the JSON), and `ward` (Ward's clustering of every token, PyLate's `pool_factor`).",
        "",
        "| collection | pool factor | method | stored vectors | ratio | token vectors | ratio | nDCG@10 "
        "| delta (points) | recall@10 | recall@100 | overlap@10 vs pool 1 | pooling s | search p50 ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["collections"]:
        for r in c["rows"]:
            lines.append(
                f"| {c['collection']} | {r['pool_factor']} | {r.get('pool_method', 'ward')} "
                f"| {r['stored_vectors']:,} "
                f"| {r['stored_ratio']:.3f} | {r['token_vectors']:,} | {r['token_ratio']:.3f} "
                f"| {r['ndcg@10']:.4f} | {r['ndcg@10_delta_points']:+.2f} | {r['recall@10']:.4f} "
                f"| {r['recall@100']:.4f} | {r['overlap@10_vs_pool1']:.3f} | {r['pool_seconds']:.1f} "
                f"| {r['search_p50_ms']:.1f} |")
    lines += ["", "## Against the aim", ""]
    for c in report["collections"]:
        for two in (r for r in c["rows"] if r["pool_factor"] == 2):
            halved = "halved" if two["token_ratio"] <= 0.5 else "not halved"
            d = two["ndcg@10_delta_points"]
            within = "within 0.5 points (or better)" if d >= -0.5 else "more than 0.5 points worse"
            lines.append(
                f"- {c['collection']}, {two.get('pool_method', 'ward')}: pool factor 2 keeps "
                f"{two['token_ratio']:.1%} of token vectors ({two['stored_ratio']:.1%} of stored vectors, "
                f"slots included): {halved}; nDCG@10 {d:+.2f} points: {within}.")
    lines += ["", "The lists of each pool factor are the pool factor 1 lists pooled with the function "
              "the encoder's `pool_factor=` runs; on the first "
              f"{SAMPLE} documents of every collection an encoder made with that pool factor gave the "
              "same shapes, the largest difference per coordinate in `option_path_max_abs_diff` of the "
              "JSON (float noise of the model between batch compositions).", ""]
    return "\n".join(lines)


# --- levers: ways to pool by 2 (issue #59) -------------------------------------------------------

MINIMAX_STEPS = 30  # Badoiu-Clarkson steps towards the smallest cap holding a cluster's members
SHORT = 16  # "long documents harder": documents of at most this many tokens are not pooled


_by_first = numbered_by_first  # labels renumbered 0 .. k - 1 by each cluster's first row


def _units(bodies: np.ndarray) -> np.ndarray:
    return bodies / np.linalg.norm(bodies, axis=1, keepdims=True)


def linkage_labels(bodies: np.ndarray, k: int | None, method: str,
                   max_distance: float | None = None) -> np.ndarray:
    """Agglomerative clusters of the rows of ``bodies`` by ``method`` ("average", "complete")
    linkage on cosine distance (scipy), cut after its ``n - k`` first merges, or (``k=None``)
    after every merge at a cosine distance of at most ``max_distance``."""
    from scipy.cluster.hierarchy import linkage

    n = len(bodies)
    if n < 2 or k == n:
        return np.arange(n)
    z = linkage(_units(bodies), method=method, metric="cosine")  # heights monotone for both
    merges = n - k if k is not None else int(np.sum(z[:, 2] <= max_distance))
    parent = np.arange(2 * n - 1)
    for m in range(merges):
        parent[int(z[m, 0])] = parent[int(z[m, 1])] = n + m
    roots = np.arange(n)
    for _ in range(merges):  # at most one step per merge above a row
        up = parent[roots]
        if np.array_equal(up, roots):
            break
        roots = up
    return _by_first(roots)


def dedup_centers(bodies: np.ndarray, labels: np.ndarray, power: float = 4.0) -> np.ndarray:
    """Each cluster's mean with member ``i`` weighted by ``1 / sum_j max(cos(i, j), 0)^power``
    over its cluster: near-duplicates (fifty commas) count about once, so the center stays close
    to the cluster's distinct members."""
    u = _units(bodies)
    out = np.zeros((int(labels.max()) + 1, u.shape[1]))
    for c in range(len(out)):
        m = u[labels == c]
        w = 1.0 / (np.clip(m @ m.T, 0.0, None) ** power).sum(1)
        out[c] = w @ m
    return out


def minimax_centers(bodies: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each cluster's center of the smallest cap holding its members (approximately, Badoiu-
    Clarkson): the direction whose worst cosine to a member is the best, so no member's match is
    lost more than it must be."""
    u = _units(bodies)
    out = np.zeros((int(labels.max()) + 1, u.shape[1]))
    for c in range(len(out)):
        m = u[labels == c]
        v = m.sum(0)
        v /= np.linalg.norm(v)
        for i in range(1, MINIMAX_STEPS + 1):
            v = v + (m[np.argmin(m @ v)] - v) / (i + 1)
            v /= np.linalg.norm(v)
        out[c] = v
    return out


def lever_pool(doc: np.ndarray, fmt: Any, keep: int | None, method: str, *, center: str = "mean",
               first: int = 0, last: int = 0, max_distance: float | None = None) -> np.ndarray:
    """``doc`` pooled to ``keep`` token rows (``None``: by ``max_distance``) with ``method``'s
    clusters and ``center``'s directions, its ``first`` and ``last`` token rows kept alone (when
    the rest still has room for at least one cluster and a merge)."""
    tokens = doc[N_SLOTS:]
    n = len(tokens)
    if n < 2 or (keep is not None and keep >= n):
        return doc
    bodies = tokens[:, 1:].astype(np.float64)
    kept_alone = first + last
    mid = np.arange(first, n - last)
    if kept_alone and (keep is None or 1 <= keep - kept_alone < len(mid)):
        inner = keep - kept_alone if keep is not None else None
    else:
        mid, first, last, inner = np.arange(n), 0, 0, keep
    if method == "ward":
        part = ward_clusters(bodies[mid], inner)
    else:
        part = linkage_labels(bodies[mid], inner, method, max_distance)
    labels = np.concatenate([np.arange(first), first + part,
                             first + part.max() + 1 + np.arange(last)]).astype(np.int64)
    labels = _by_first(labels)
    centers = None
    if center == "dedup":
        centers = dedup_centers(bodies, labels)
    elif center == "minimax":
        centers = minimax_centers(bodies, labels)
    return pool_clusters(doc, labels, fmt, centers)


def long_harder_keep(lengths: list[int], short: int = SHORT, target: float = 0.5) -> tuple[list[int], float]:
    """Token rows to keep per document so the collection keeps ``target`` of its token rows:
    documents of at most ``short`` tokens keep all, longer ones ``max(short, floor(r n))`` with
    the largest ``r`` that meets the target (found on this collection: a per-collection setting,
    not a per-document rule)."""
    n = np.asarray(lengths)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        r = (lo + hi) / 2
        keep = np.where(n > short, np.maximum(short, np.floor(n * r)).astype(int), n)
        lo, hi = (r, hi) if keep.sum() <= target * n.sum() else (lo, r)
    keep = np.where(n > short, np.maximum(short, np.floor(n * lo)).astype(int), n)
    return keep.tolist(), lo


# -- token-aware levers: what the tokenizer says about each token row ----------------------
# the product's stopword list (a token is one only when it is a whole word)


CONTENT, CONTINUATION, FUNCTION = 0, 1, 2  # token kinds (token_kinds)


def token_kinds(tokens: Sequence[str], specials: Sequence[str] = (),
                continuation: str = "##") -> tuple[np.ndarray, np.ndarray]:
    """The kind of each token of one text and the word it belongs to: ``(kinds, words)``, two
    int64 arrays of ``len(tokens)``. Kinds: :data:`FUNCTION` (a special token of ``specials``, a
    token of punctuation only, or a whole word of :data:`STOPWORDS`), :data:`CONTINUATION` (a
    later piece of a word: it starts with ``continuation``, WordPiece's ``"##"``) or
    :data:`CONTENT` (the first piece of any other word). ``words``: the index of each token's
    word (a continuation belongs to the word before it).

    >>> kinds, words = token_kinds(["the", "as", "##ym", "##metry", ",", "wing", "[SEP]"], ["[SEP]"])
    >>> kinds.tolist(), words.tolist()
    ([2, 0, 1, 1, 2, 0, 2], [0, 1, 1, 1, 2, 3, 4])
    """
    n = len(tokens)
    kinds = np.zeros(n, dtype=np.int64)
    words = np.zeros(n, dtype=np.int64)
    special = set(specials)
    w = -1
    for i, t in enumerate(tokens):
        cont = bool(continuation) and t.startswith(continuation) and len(t) > len(continuation)
        if not cont or w < 0:
            w += 1
        words[i] = w
        nxt = tokens[i + 1] if i + 1 < n else ""
        whole = not (continuation and nxt.startswith(continuation) and len(nxt) > len(continuation))
        if t in special or not any(c.isalnum() for c in t) or (whole and not cont and t.lower() in STOPWORDS):
            kinds[i] = FUNCTION
        elif cont and w >= 0 and i > 0:
            kinds[i] = CONTINUATION
    return kinds, words


def tiered_clusters(bodies: np.ndarray, n_clusters: int, tiers: np.ndarray) -> np.ndarray:
    """Average-linkage clusters of the rows of ``bodies`` on cosine distance, the merges taken
    tier by tier: ``tiers[i, j]`` (a symmetric ``n x n`` matrix of whole numbers >= 0) is added
    to the distance of rows ``i`` and ``j`` times 4 (more than any cosine distance), so every
    merge of a lower tier comes before any of a higher one and, inside a tier, the closest pairs
    merge first. The dendrogram is cut to exactly ``n_clusters`` clusters, labels numbered by each
    cluster's first row.

    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> tiers = np.array([[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]])
    >>> tiered_clusters(x, 2, tiers).tolist()      # rows 0 and 2 share tier 0, so they merge
    [0, 1, 0, 1]
    >>> tiered_clusters(x, 2, np.zeros((4, 4), dtype=int)).tolist()
    [0, 0, 1, 1]
    """
    n = len(bodies)
    if not 1 <= n_clusters <= max(n, 1):
        raise ValueError(f"n_clusters must be from 1 to {n}, got {n_clusters}")
    if n_clusters == n:
        return np.arange(n)
    z = penalised_linkage(bodies, 4.0 * np.asarray(tiers, dtype=np.float64))
    return cut_linkage(z, n, n - n_clusters)


def penalised_linkage(bodies: np.ndarray, penalty: np.ndarray | float = 0.0, method: str = "average",
                      scale: np.ndarray | None = None) -> np.ndarray:
    """scipy's linkage matrix (``method``: "average", "complete", "weighted", ...) of the rows of
    ``bodies`` on the merge cost ``(1 - cos(i, j)) * scale[i, j] + penalty[i, j]`` (``scale``
    omitted: 1; ``penalty`` a symmetric matrix or one number). Rows of ``bodies`` need not be unit.

    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    >>> penalised_linkage(x)[:, :2].tolist()    # rows 0 and 1 first, then the pair with row 2
    [[0.0, 1.0], [2.0, 3.0]]
    """
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    u = np.asarray(bodies, dtype=np.float64)
    if len(u) < 2:
        raise ValueError(f"a linkage needs at least 2 rows, got {len(u)}")
    u = u / np.linalg.norm(u, axis=1, keepdims=True)
    d = np.clip(1.0 - u @ u.T, 0.0, 2.0)
    if scale is not None:
        d = d * np.asarray(scale, dtype=np.float64)
    d = d + penalty
    np.fill_diagonal(d, 0.0)
    return linkage(squareform(d, checks=False), method=method)


def cut_linkage(z: np.ndarray, n: int, merges: int) -> np.ndarray:
    """Cluster labels of ``n`` rows after the first ``merges`` merges of the linkage matrix ``z``
    (``n - merges`` clusters), numbered by each cluster's first row.

    >>> z = penalised_linkage(np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]))
    >>> cut_linkage(z, 3, 0).tolist(), cut_linkage(z, 3, 1).tolist(), cut_linkage(z, 3, 2).tolist()
    ([0, 1, 2], [0, 0, 1], [0, 0, 0])
    """
    if not 0 <= merges <= max(n - 1, 0):
        raise ValueError(f"merges must be from 0 to {max(n - 1, 0)} for {n} rows, got {merges}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    parent = np.arange(2 * n - 1)
    for m in range(merges):
        parent[int(z[m, 0])] = parent[int(z[m, 1])] = n + m
    roots = np.arange(n)
    while True:
        up = parent[roots]
        if np.array_equal(up, roots):
            break
        roots = up
    return _by_first(roots)


def document_tokens(enc: Any, texts: list[str], docs: list[np.ndarray], batch: int = 256) -> list[dict]:
    """What the tokenizer says about each token row of each document: ``ids`` (token ids),
    ``kinds`` and ``words`` (:func:`~uibk_embedding.token_pooling.token_kinds`) and ``segments``
    (a new one after each punctuation token). The rows are the encoder's own: its ``_tokenize``
    gives the model's input ids and each text's span (the positions whose vectors are the token
    rows: ``[CLS]``/``[SEP]`` and padding are outside it); a span whose length differs from the
    list's token rows is an error."""
    tok = enc._base_tokenizer
    specials = [t for t in ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]") if tok.token_to_id(t) is not None]
    out: list[dict] = []
    for s in range(0, len(texts), batch):
        tb = enc._tokenize(texts[s:s + batch], False)
        x = tb.inputs["input_ids"].numpy()
        for i, (a, b) in enumerate(zip(tb.starts, tb.ends, strict=True)):
            ids = x[i, a:b].copy()
            if len(ids) != len(docs[s + i]) - N_SLOTS:
                raise AssertionError(f"document {s + i}: {len(ids)} token ids, "
                                     f"{len(docs[s + i]) - N_SLOTS} token rows")
            strings = [tok.id_to_token(int(t)) for t in ids]
            kinds, words = token_kinds(strings, specials)
            punct = np.array([not any(c.isalnum() for c in t) for t in strings])
            segments = np.concatenate([[0], np.cumsum(punct)[:-1]])
            out.append({"ids": ids, "kinds": kinds, "words": words, "segments": segments})
    return out


def with_document_frequency(infos: list[dict]) -> list[dict]:
    """``infos`` (one dict a document, with its rows' token ``ids``, as :func:`document_tokens`
    gives) with two keys added to each: ``df``, for each row the number of the collection's
    documents that hold its token id, and ``n_docs``, the number of documents. A collection-wide
    statistic of the index, like an inverted index's document frequencies (no query is read).

    >>> infos = with_document_frequency([{"ids": np.array([5, 7, 5])}, {"ids": np.array([5, 9])}])
    >>> infos[0]["df"].tolist(), infos[1]["df"].tolist(), infos[0]["n_docs"]
    ([2, 1, 2], [2, 1], 2)
    """
    if not infos:
        return []
    ids, counts = np.unique(np.concatenate([np.unique(np.asarray(i["ids"], dtype=np.int64)) for i in infos]),
                            return_counts=True)
    out = []
    for i in infos:
        rows = np.asarray(i["ids"], dtype=np.int64)
        out.append({**i, "df": counts[np.searchsorted(ids, rows)], "n_docs": len(infos)})
    return out


def frequent_as_function(info: dict, cutoff: float) -> dict:
    """``info`` (from :func:`with_document_frequency`) with every row whose token id occurs in at
    least ``cutoff`` of the collection's documents (``df >= cutoff * n_docs``) made a
    :data:`FUNCTION` token, besides the rows that already are (punctuation, special tokens,
    whole stopwords): data-driven function tokens, e.g. "likes" in "X likes A, B and C."
    everywhere.

    >>> info = {"ids": np.array([5, 7]), "kinds": np.array([CONTENT, CONTENT]), "df": np.array([9, 1]),
    ...         "n_docs": 10}
    >>> frequent_as_function(info, 0.9)["kinds"].tolist(), frequent_as_function(info, 0.95)["kinds"].tolist()
    ([2, 0], [0, 0])
    """
    if not 0.0 < cutoff <= 1.0:
        raise ValueError(f"cutoff is a fraction of the documents, in (0, 1], got {cutoff}")
    if "df" not in info or "n_docs" not in info:
        raise ValueError("info has no document frequencies: pass it through with_document_frequency first")
    frequent = np.asarray(info["df"]) >= cutoff * info["n_docs"]
    return {**info, "kinds": np.where(frequent, FUNCTION, info["kinds"])}


def idf_of(info: dict) -> np.ndarray:
    """Each row's inverse document frequency ``log((n_docs + 1) / (df + 0.5))`` (> 0)."""
    return np.log((info["n_docs"] + 1.0) / (np.asarray(info["df"], dtype=np.float64) + 0.5))


def content_linkage(bodies: np.ndarray, info: dict, rows: np.ndarray, method: str = "average",
                    segment_penalty: float = 0.0, idf_cost: bool = False) -> np.ndarray:
    """The linkage matrix (:func:`penalised_linkage`) of the rows ``rows`` of a document: cosine
    distance, times ``sqrt(idf_i idf_j) / mean idf`` with ``idf_cost`` (low-IDF tokens merge
    first, the rarest last), plus ``segment_penalty`` for two rows of different segments (between
    punctuation: the items of a list, the clauses of a sentence)."""
    penalty: np.ndarray | float = 0.0
    if segment_penalty:
        seg = np.asarray(info["segments"])[rows]
        penalty = segment_penalty * (seg[:, None] != seg[None, :])
    scale = None
    if idf_cost:
        g = idf_of(info)[rows]
        scale = np.sqrt(g[:, None] * g[None, :]) / g.mean()
    return penalised_linkage(bodies[rows], penalty, method, scale)


def collection_threshold(heights: Sequence[np.ndarray], rows: int, target: int) -> float:
    """One merge-cost threshold for a whole collection: the smallest ``t`` such that merging, in
    every document, the merges of cost ``<= t`` (``heights``: each document's linkage heights,
    monotone) leaves at most ``target`` of the ``rows`` rows. ``-inf`` when no merge is needed.

    >>> collection_threshold([np.array([0.1, 0.5]), np.array([0.2])], rows=5, target=3)
    0.2
    """
    need = rows - target
    if need <= 0:
        return float("-inf")
    allh = np.sort(np.concatenate([np.asarray(h, dtype=np.float64) for h in heights]))
    if need > len(allh):
        raise ValueError(f"{rows} rows cannot be merged down to {target}: only {len(allh)} merges")
    return float(allh[need - 1])


def _same(a: np.ndarray) -> np.ndarray:
    return a[:, None] == a[None, :]


def tiers_of(rule: str, info: dict) -> np.ndarray:
    """The tier matrix of :func:`~uibk_embedding.token_pooling.tiered_clusters` for one
    document under ``rule`` (lower tiers merge first):

    * ``kinds``: two function tokens 0, any other pair 1;
    * ``same-id``: two occurrences of one token id 0, any other pair 1;
    * ``subword``: two pieces of one word 0, any other pair 1;
    * ``kinds+subword``: function-function or one word 0, any other pair 1;
    * ``protect``: function-function 0, content-content 1, a function token with a content token 2;
    * ``all``: function-function, one word or one token id 0, content-content 1, mixed 2;
    * ``segment``: function-function or one word 0, two words of one segment (between
      punctuation) 1, any other pair 2;
    * ``skip-function``: no tiers (:func:`token_lever_pool` removes the function rows).
    """
    f = info["kinds"] == FUNCTION
    ff = f[:, None] & f[None, :]
    mixed = f[:, None] ^ f[None, :]
    word = _same(info["words"])
    if rule == "kinds":
        zero = ff
    elif rule == "same-id":
        zero = _same(info["ids"])
    elif rule == "subword":
        zero = word
    elif rule == "kinds+subword":
        zero = ff | word
    elif rule == "protect":
        return np.where(ff, 0, np.where(mixed, 2, 1))
    elif rule == "all":
        zero = ff | word | (_same(info["ids"]) & ~mixed)
        return np.where(zero, 0, np.where(mixed, 2, 1))
    elif rule == "skip-function":
        return np.zeros((len(f), len(f)), dtype=np.int64)
    elif rule == "segment":
        zero = ff | word
        return np.where(zero, 0, np.where(_same(info["segments"]), 1, 2))
    else:
        raise ValueError(f"unknown tier rule {rule!r}")
    return np.where(zero, 0, 1)


def token_lever_pool(doc: np.ndarray, fmt: Any, keep: int, info: dict, rule: str,
                     center: str = "mean", method: str = "average", segment_penalty: float = 0.0,
                     idf_cost: bool = False) -> np.ndarray:
    """``doc`` pooled to ``keep`` token rows by :func:`tiered_clusters` under ``rule``; rule
    ``skip-function`` removes the function rows instead (ColBERT's skiplist) and clusters the
    content rows (``method`` linkage on :func:`content_linkage`'s cost: ``segment_penalty``,
    ``idf_cost``) to ``keep``, or, where the content rows alone are fewer than ``keep``, merges
    the function rows among themselves into the rows left."""
    n = len(doc) - N_SLOTS
    if n < 2 or keep >= n:
        return doc
    bodies = doc[N_SLOTS:, 1:].astype(np.float64)
    if rule == "skip-function":
        f = info["kinds"] == FUNCTION
        content = np.flatnonzero(~f)
        if len(content) == 0 or len(content) + 1 > keep:
            if len(content) == 0:
                content = np.arange(n)
            sub = doc[np.concatenate([np.arange(N_SLOTS), N_SLOTS + content])]
            if len(content) <= keep:
                return sub
            z = content_linkage(bodies, info, content, method, segment_penalty, idf_cost)
            return pool_clusters(sub, cut_linkage(z, len(content), len(content) - keep), fmt)
        fi = np.flatnonzero(f)  # content rows stay alone, the function rows fill the rest
        labels = np.empty(n, dtype=np.int64)
        labels[content] = np.arange(len(content))
        labels[fi] = len(content) + tiered_clusters(bodies[fi], keep - len(content),
                                                    np.zeros((len(fi),) * 2, dtype=np.int64))
        return pool_clusters(doc, _by_first(labels), fmt)
    labels = tiered_clusters(bodies, keep, tiers_of(rule, info))
    centers = minimax_centers(bodies, labels) if center == "minimax" else None
    return pool_clusters(doc, labels, fmt, centers)


def budget_pool(docs: list[np.ndarray], fmt: Any, infos: list[dict] | None, target: float = 0.5, *,
                skip: bool = False, method: str = "average", segment_penalty: float = 0.0,
                idf_cost: bool = False) -> tuple[list[np.ndarray], float]:
    """A collection-wide budget: every document's rows (with ``skip``, its content rows only: the
    function rows of ``infos`` removed) clustered by ``method`` linkage (:func:`content_linkage`'s
    cost), and every merge cheaper than one threshold for the whole collection
    (:func:`collection_threshold`) taken, so the collection keeps ``floor(target * n)`` of its
    ``n`` token rows at most: documents with many close tokens pool more, others less. Returns
    the pooled lists and the threshold. A document with no content row keeps all its rows as
    candidates."""
    candidates, links = [], []
    for i, doc in enumerate(docs):
        n = len(doc) - N_SLOTS
        rows = np.arange(n)
        if skip:
            if infos is None:
                raise ValueError("skip=True needs the documents' token infos")
            content = np.flatnonzero(infos[i]["kinds"] != FUNCTION)
            rows = content if len(content) else rows
        candidates.append(rows)
        if len(rows) >= 2:
            info = infos[i] if infos is not None else {}
            links.append(content_linkage(doc[N_SLOTS:, 1:].astype(np.float64), info, rows, method,
                                         segment_penalty, idf_cost))
        else:
            links.append(np.zeros((0, 4)))
    total = sum(len(d) - N_SLOTS for d in docs)
    t = collection_threshold([z[:, 2] for z in links], sum(len(r) for r in candidates),
                             int(np.floor(target * total)))
    out = []
    for doc, rows, z in zip(docs, candidates, links, strict=True):
        sub = doc[np.concatenate([np.arange(N_SLOTS), N_SLOTS + rows])]
        merges = int(np.sum(z[:, 2] <= t))
        out.append(pool_clusters(sub, cut_linkage(z, len(rows), merges), fmt) if merges else sub)
    return out, t


LEVERS: list[tuple[str, str, dict]] = [
    # (name, what it is, lever_pool keywords; keep is n // 2 unless "keep" says otherwise)
    ("ward", "Ward on Euclidean distance, mean (today's pool_factor=2)", {"method": "ward"}),
    ("average", "average linkage on cosine distance, mean", {"method": "average"}),
    ("complete", "complete linkage on cosine distance, mean", {"method": "complete"}),
    ("average+dedup", "average linkage, near-duplicates weighted down in the mean",
     {"method": "average", "center": "dedup"}),
    ("complete+dedup", "complete linkage, near-duplicates weighted down in the mean",
     {"method": "complete", "center": "dedup"}),
    ("average+minimax", "average linkage, minimax center (closest to the farthest member)",
     {"method": "average", "center": "minimax"}),
    ("average+first4", "average linkage, the first 4 tokens kept alone",
     {"method": "average", "first": 4}),
    ("average+last1", "average linkage, the last token kept alone", {"method": "average", "last": 1}),
    ("average+long-harder", f"average linkage; documents of <= {SHORT} tokens not pooled, longer ones "
     "harder so the collection keeps half its token vectors (calibrated per collection)",
     {"method": "average", "keep": "long-harder"}),
    ("average 60%", "average linkage to floor(0.6 n) tokens (not halved: where the loss starts)",
     {"method": "average", "keep": 0.6}),
    ("average 55%", "average linkage to floor(0.55 n) tokens (not halved)",
     {"method": "average", "keep": 0.55}),
    ("threshold 0.8", "average linkage, only merges at cosine >= 0.8 (factor adapts per document)",
     {"method": "average", "keep": None, "max_distance": 0.2}),
    ("threshold 0.7", "average linkage, only merges at cosine >= 0.7", {"method": "average", "keep": None,
                                                                         "max_distance": 0.3}),
    ("threshold 0.6", "average linkage, only merges at cosine >= 0.6", {"method": "average", "keep": None,
                                                                         "max_distance": 0.4}),

    # token-aware levers (what the tokenizer says about each row: its id, kind, word)
    ("tok:kinds", "function tokens (punctuation, special tokens, whole stopwords) merged among "
     "themselves first, then average linkage", {"tiers": "kinds"}),
    ("tok:same-id", "repeated occurrences of one token id merged first, then average linkage",
     {"tiers": "same-id"}),
    ("tok:subword", "the pieces of one word merged first, then average linkage", {"tiers": "subword"}),
    ("tok:kinds+subword", "function tokens among themselves and the pieces of one word first, then "
     "average linkage", {"tiers": "kinds+subword"}),
    ("tok:protect", "function tokens absorb the halving; content merged with content only when they "
     "do not suffice, a content token with a function token last", {"tiers": "protect"}),
    ("tok:all", "function tokens, one word's pieces and one token id's occurrences first; then "
     "content with content; a content token with a function token last", {"tiers": "all"}),
    ("tok:all+minimax", "tok:all with the minimax center", {"tiers": "all", "center": "minimax"}),
    ("tok:segment", "function tokens and one word's pieces first, then words of one segment "
     "(between punctuation), then anything", {"tiers": "segment"}),
    ("tok:skip-function", "function tokens removed (ColBERT's skiplist: their mass is lost), the content "
     "tokens average-linked to half the document's tokens; where content alone is under half, the "
     "function tokens merged among themselves to fill it", {"tiers": "skip-function"}),

    # second round (issue #59): data-driven function tokens, IDF costs, a collection-wide budget,
    # segments. "dfX%": function tokens are the stopword-list ones plus every token id found in at
    # least X% of the collection's documents (with_document_frequency, frequent_as_function)
    ("tok:df20%-skip", "function tokens = punctuation, special tokens, whole stopwords and every "
     "token id in >= 20% of the collection's documents; then the skip-function rule",
     {"tiers": "skip-function", "df": 0.2}),
    ("tok:df50%-skip", "tok:df20%-skip with ids in >= 50% of the documents",
     {"tiers": "skip-function", "df": 0.5}),
    ("tok:df90%-skip", "tok:df20%-skip with ids in >= 90% of the documents",
     {"tiers": "skip-function", "df": 0.9}),
    ("tok:df50%-kinds", "function tokens as in tok:df50%-skip, merged among themselves first (the "
     "tok:kinds rule)", {"tiers": "kinds", "df": 0.5}),
    ("tok:idf-cost", "skip-function; the content merge cost (1 - cos) scaled by sqrt(idf_i idf_j) / "
     "its mean over the document: low-IDF tokens merge first, the rarest last",
     {"tiers": "skip-function", "idf_cost": True}),
    ("tok:df90%-skip+idf-cost", "tok:df90%-skip with tok:idf-cost's merge cost",
     {"tiers": "skip-function", "df": 0.9, "idf_cost": True}),
    ("budget", "average linkage, every merge under one cost threshold per collection, chosen so "
     "the collection keeps 50% of its token vectors (documents pool unequally)",
     {"method": "average", "keep": "collection"}),
    ("tok:skip-function+budget", "function tokens removed, the content average-linked under one "
     "threshold per collection (50% of token vectors kept)", {"tiers": "skip-function",
                                                              "keep": "collection"}),
    ("tok:df90%-skip+budget", "tok:skip-function+budget with tok:df90%-skip's function tokens",
     {"tiers": "skip-function", "df": 0.9, "keep": "collection"}),
    ("tok:skip+segment", "skip-function; two content tokens of different segments (between "
     "punctuation: the items of a list, the clauses of a sentence) cost 0.2 more to merge",
     {"tiers": "skip-function", "segment_penalty": 0.2}),
    ("tok:df90%-skip+segment", "tok:df90%-skip with tok:skip+segment's cost: tokens in >= 90% of "
     "the documents and stopwords removed, content average-linked on cosine distance + 0.2 across "
     "segments", {"tiers": "skip-function", "df": 0.9, "segment_penalty": 0.2}),
    ("tok:df90%-skip+segment+complete", "tok:df90%-skip+segment with complete linkage",
     {"tiers": "skip-function", "df": 0.9, "segment_penalty": 0.2, "method": "complete"}),
    ("tok:df90%-skip+segment0.1", "tok:df90%-skip+segment, 0.1 across segments",
     {"tiers": "skip-function", "df": 0.9, "segment_penalty": 0.1}),
    ("tok:df90%-skip+segment0.15", "tok:df90%-skip+segment, 0.15 across segments",
     {"tiers": "skip-function", "df": 0.9, "segment_penalty": 0.15}),
    ("tok:df90%-skip+segment0.3", "tok:df90%-skip+segment, 0.3 across segments",
     {"tiers": "skip-function", "df": 0.9, "segment_penalty": 0.3}),
    ("tok:df90%-skip+segment0.5", "tok:df90%-skip+segment, 0.5 across segments",
     {"tiers": "skip-function", "df": 0.9, "segment_penalty": 0.5}),
    ("tok:df90%-skip+hard-segment", "tok:df90%-skip+segment, 4 across segments (every merge inside "
     "a segment first)", {"tiers": "skip-function", "df": 0.9, "segment_penalty": 4.0}),
    ("tok:df50%-skip+segment", "tok:df90%-skip+segment with ids in >= 50% of the documents",
     {"tiers": "skip-function", "df": 0.5, "segment_penalty": 0.2}),
    ("tok:df90%-skip+segment+budget", "tok:df90%-skip+segment under one threshold per collection",
     {"tiers": "skip-function", "df": 0.9, "segment_penalty": 0.2, "keep": "collection"}),
]


def run_levers(name: str, levers: list[tuple[str, str, dict]]) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coll = load_beir(datasets_dir() / name)
        enc = load_encoder()
        base = encode_collection(enc, coll)  # encoded once (cached), every variant pools these lists
    fmt = replace(enc.format, pool_factor=1)  # the variants are not pool_factor's own rule
    lengths = [len(d) - N_SLOTS for d in base.docs]
    infos = (document_tokens(enc, [d.full_text for d in coll.corpus], base.docs)
             if any("tiers" in kw for _, _, kw in levers) else None)
    if infos is not None and any("df" in kw or kw.get("idf_cost") for _, _, kw in levers):
        infos = with_document_frequency(infos)
    if infos is not None:
        kinds = np.concatenate([i["kinds"] for i in infos])
        token_facts = {k: float(np.mean(kinds == v)) for k, v in
                       (("function", FUNCTION), ("continuation", CONTINUATION), ("content", CONTENT))}
        print(f"{name}: token kinds " + ", ".join(f"{k} {v:.1%}" for k, v in token_facts.items()), flush=True)

    def score(docs: list[np.ndarray]) -> tuple[dict[str, float], dict[str, list[str]]]:
        store = open_store("exact", format=fmt)
        encoded = Encoded(base.doc_ids, docs, base.query_ids, base.queries)
        index_into(store, encoded, show_progress=False)
        run = fused_run(store, encoded, enc.dense_weight)
        store.close()
        return evaluate(run, coll.qrels), run

    m0, run0 = score(base.docs)
    tokens0, stored0 = sum(lengths), sum(len(d) for d in base.docs)
    rows = [{"lever": "none", "what": "no pooling", "token_vectors": tokens0, "stored_vectors": stored0,
             "token_ratio": 1.0, "stored_ratio": 1.0, "ndcg@10": m0["ndcg@10"], "recall@10": m0["recall@10"],
             "ndcg@10_delta_points": 0.0, "overlap@10_vs_none": 1.0, "meets_aim": False}]
    print(f"{name}: {len(base.docs)} documents, {tokens0:,} token vectors, nDCG@10 {m0['ndcg@10']:.4f}",
          flush=True)
    for lever, what, kw in levers:
        kw = dict(kw)
        keep_rule = kw.pop("keep", "half")
        note = ""
        if keep_rule == "half":
            keeps: list[int | None] = [pooled_token_count(n, 2) for n in lengths]
        elif keep_rule == "long-harder":
            keeps, r = long_harder_keep(lengths)
            note = f"longer documents keep floor({r:.3f} n), at least {SHORT}"
        elif keep_rule == "collection":
            keeps = []
        elif isinstance(keep_rule, float):
            keeps = [max(int(n * keep_rule), 1) for n in lengths]
        else:
            keeps = [None] * len(lengths)
        rule = kw.pop("tiers", None)
        cutoff = kw.pop("df", None)
        lever_infos = infos if cutoff is None or infos is None else [frequent_as_function(i, cutoff)
                                                                     for i in infos]
        if cutoff is not None and lever_infos is not None:
            frac = float(np.mean(np.concatenate([i["kinds"] for i in lever_infos]) == FUNCTION))
            note = f"function tokens (stopwords and ids in >= {cutoff:.0%} of documents) {frac:.1%}"
        if keep_rule == "collection":
            docs, t = budget_pool(base.docs, fmt, lever_infos, skip=rule == "skip-function", **kw)
            note = (note + "; " if note else "") + f"merge-cost threshold {t:.3f}"
        elif rule is not None:
            assert lever_infos is not None
            docs = [token_lever_pool(d, fmt, k, info, rule, **kw)
                    for d, k, info in zip(base.docs, keeps, lever_infos, strict=True)]
        else:
            docs = [lever_pool(d, fmt, k, **kw) for d, k in zip(base.docs, keeps, strict=True)]
        m, run = score(docs)
        tokens = sum(len(d) - N_SLOTS for d in docs)
        delta = 100 * (m["ndcg@10"] - m0["ndcg@10"])
        row = {"lever": lever, "what": what, "note": note, "token_vectors": tokens,
               "stored_vectors": sum(len(d) for d in docs), "token_ratio": tokens / tokens0,
               "stored_ratio": sum(len(d) for d in docs) / stored0, "ndcg@10": m["ndcg@10"],
               "recall@10": m["recall@10"], "ndcg@10_delta_points": delta,
               "overlap@10_vs_none": overlap_at_k(run, run0, 10),
               "meets_aim": bool(tokens <= tokens0 / 2 and delta >= -0.5)}
        rows.append(row)
        print(f"  {lever:20s} token vectors {row['token_ratio']:.1%}, nDCG@10 {m['ndcg@10']:.4f} "
              f"({delta:+.2f} points){' ' + note if note else ''}", flush=True)
    out = {"collection": name, "documents": len(base.docs), "queries": len(base.queries),
           "dense_weight": enc.dense_weight, "rows": rows}
    if infos is not None:
        out["token_kinds"] = token_facts
    return out


def runs_line(report: dict) -> str:
    """``Run DATE`` (load average at its start and end), one per run the report's rows come from."""
    runs = report.get("runs") or [report]

    def one(r: dict) -> str:
        load = (f" (load average {r['loadavg_start'][0]:.1f} -> {r['loadavg_end'][0]:.1f})"
                if r.get("loadavg_start") and r.get("loadavg_end") else "")
        return f"{r['date']}{load}"

    return ("Run " if len(runs) == 1 else "Runs ") + ", ".join(one(r) for r in runs)


def levers_markdown(report: dict, reading: str = "") -> str:
    cols = report["collections"]
    present = list(dict.fromkeys(r["lever"] for c in cols for r in c["rows"][1:]))
    order = {lv[0]: i for i, lv in enumerate(LEVERS)}
    names = sorted(present, key=lambda n: order.get(n, len(order)))  # LEVERS' order, then the rest
    lines = [
        "# Token pooling by 2: which lever (issue #59)",
        "",
        f"{runs_line(report)}, `benchmarks/pooling.py --levers`. Embedded default encoder (dense "
        f"weight {cols[0]['dense_weight']:g}), fused score, exact store (exact MaxSim), queries never "
        "pooled; each collection encoded once and every variant pools those lists through "
        "`pool_clusters` (slots untouched, tags exact, renormalised). Quality and vector counts only: "
        "nothing here depends on the machine's load.",
        "",
        "Aim: the stored token vectors halved (<= 50.0%) with nDCG@10 within 0.5 points of no pooling "
        "on every shared collection. Cells: token vectors kept / nDCG@10 change in points; **bold** "
        "where both hold.",
        "",
        "| lever | " + " | ".join(c["collection"] for c in cols) + " | meets the aim everywhere |",
        "|---|" + "---:|" * len(cols) + "---|",
    ]
    for lever in names:
        cells, ok = [], True
        for c in cols:
            r = next((x for x in c["rows"] if x["lever"] == lever), None)
            if r is None:  # a lever left out on a collection (see the Reading)
                cells.append("not run")
                ok = False
                continue
            cell = f"{r['token_ratio']:.1%} / {r['ndcg@10_delta_points']:+.2f}"
            cells.append(f"**{cell}**" if r["meets_aim"] else cell)
            ok &= r["meets_aim"]
        lines.append(f"| {lever} | " + " | ".join(cells) + f" | {'yes' if ok else 'no'} |")
    kinds = [c for c in cols if c.get("token_kinds")]
    if kinds:
        lines += ["", "Token kinds of the token vectors (the `tok:` levers; function = punctuation, special "
                  "tokens and whole stopwords, continuation = a later WordPiece of a word): " + "; ".join(
                      f"{c['collection']} " + ", ".join(f"{k} {v:.1%}" for k, v in c["token_kinds"].items())
                      for c in kinds) + "."]
    lines += ["", "Best lever by 2 per collection (token vectors <= 50%): " + "; ".join(
        f"{c['collection']} {b['lever']} {b['ndcg@10_delta_points']:+.2f}" for c in cols
        for b in [max((r for r in c["rows"][1:] if r["token_ratio"] <= 0.5),
                      key=lambda r: r["ndcg@10_delta_points"])]) + "."]
    lines += ["", "No pooling: " + ", ".join(
        f"{c['collection']} {c['rows'][0]['token_vectors']:,} token vectors, nDCG@10 "
        f"{c['rows'][0]['ndcg@10']:.4f}" for c in cols) + ".", "", "Levers:", ""]
    for lever, what, _ in LEVERS:
        if lever in names:
            lines.append(f"- **{lever}**: {what}.")
    notes = [f"{c['collection']} {r['lever']}: {r['note']}" for c in cols for r in c["rows"] if r.get("note")]
    if notes:
        lines += ["", "Settings found per collection (long documents harder: the factor; dfX%: the "
                  "function tokens' share of token vectors; budget: the threshold): "
                  + "; ".join(notes) + "."]
    lines += ["", "Per collection (stored vectors count the three slot vectors of every document, "
              "never pooled):", "",
              "| collection | lever | token vectors | kept | stored vectors | kept | nDCG@10 | change "
              "(points) | recall@10 | overlap@10 vs none |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in cols:
        for r in sorted(c["rows"], key=lambda r: -1 if r["lever"] == "none" else order.get(r["lever"], 1e9)):
            lines.append(f"| {c['collection']} | {r['lever']} | {r['token_vectors']:,} "
                         f"| {r['token_ratio']:.1%} | {r['stored_vectors']:,} | {r['stored_ratio']:.1%} "
                         f"| {r['ndcg@10']:.4f} "
                         f"| {r['ndcg@10_delta_points']:+.2f} | {r['recall@10']:.4f} "
                         f"| {r['overlap@10_vs_none']:.3f} |")
    if reading:
        lines += ["", reading.strip()]
    return "\n".join(lines) + "\n"


def kept_reading(md: Path) -> str:
    """The hand-written ``## Reading`` section of an existing report (kept when it is written again)."""
    if not md.exists():
        return ""
    text = md.read_text()
    at = text.find("\n## Reading")
    return text[at:] if at >= 0 else ""


def merged_report(old: dict, new: dict) -> dict:
    """``old`` with the rows of ``new`` put in (a lever's row replaced where ``old`` has it, added
    after the others where not), collection by collection; the runs' dates and load averages
    kept as a list (``runs``), each row naming its own run."""
    runs = old.get("runs") or [{k: old.get(k) for k in ("date", "loadavg_start", "loadavg_end")}]
    runs = [*runs, {k: new.get(k) for k in ("date", "loadavg_start", "loadavg_end")}]
    by_name = {c["collection"]: c for c in new["collections"]}
    cols = []
    for c in old["collections"]:
        fresh = by_name.pop(c["collection"], None)
        if fresh is None:
            cols.append(c)
            continue
        for r in c["rows"]:
            r.setdefault("run", old.get("date"))
        rows = {r["lever"]: r for r in c["rows"]}
        rows.update({r["lever"]: r for r in fresh["rows"]})
        cols.append({**c, **{k: v for k, v in fresh.items() if k != "rows"}, "rows": list(rows.values())})
    cols += list(by_name.values())
    return {**old, "date": new["date"], "runs": runs, "levers": new["levers"], "collections": cols}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", nargs="*", default=None, help="folders under the datasets folder "
                    "(default: every one with a corpus.jsonl)")
    ap.add_argument("--factors", nargs="*", type=int, default=[1, 2, 3])
    ap.add_argument("--methods", nargs="*", choices=list(POOL_METHODS), default=list(POOL_METHODS),
                    help="pooling methods to measure at each factor above 1 (default: both)")
    ap.add_argument("--out", default=None, help="output stem (default results/pooling, with --levers "
                    "results/pooling_levers)")
    ap.add_argument("--levers", action="store_true", help="compare ways to pool by 2 (issue #59) "
                    "instead of pool factors")
    ap.add_argument("--only", nargs="*", default=None, help="with --levers: run these levers only and "
                    "merge their rows into the existing report (the other rows keep their own run)")
    args = ap.parse_args()
    root = datasets_dir()
    names = args.collections or sorted(p.name for p in root.iterdir() if (p / "corpus.jsonl").exists())
    if args.levers:
        out = Path(args.out or HERE / "results" / "pooling_levers")
        chosen = [lv for lv in LEVERS if args.only is None or lv[0] in args.only]
        unknown = set(args.only or ()) - {lv[0] for lv in LEVERS}
        if unknown:
            ap.error(f"--only: no lever named {sorted(unknown)}; known: {[lv[0] for lv in LEVERS]}")
        date = dt.datetime.now().astimezone().isoformat(timespec="seconds")
        load = [round(x, 2) for x in os.getloadavg()]
        report = {"date": date, "datasets": str(root), "loadavg_start": load,
                  "levers": [{"lever": n, "what": w} for n, w, _ in LEVERS],
                  "collections": [run_levers(n, chosen) for n in names]}
        report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        for c in report["collections"]:
            for r in c["rows"]:
                r["run"] = date
        if args.only is not None and out.with_suffix(".json").exists():
            report = merged_report(json.loads(out.with_suffix(".json").read_text()), report)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(levers_markdown(report, kept_reading(out.with_suffix(".md"))))
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
        return
    factors = sorted(set(args.factors) | {1})
    report = {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "datasets": str(root),
        "factors": factors,
        "methods": args.methods,
        "collections": [run_collection(n, factors, args.methods) for n in names],
    }
    report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out or HERE / "results" / "pooling")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
