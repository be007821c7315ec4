"""Token pooling at index time: fewer stored vectors per document, no training.

A document's token vectors are merged by hierarchical clustering (Ward's criterion), as PyLate's
``pool_factor`` does: the ``n`` token rows of a list become ``max(n // pool_factor, 1)`` rows (the
floor, at least one), each the mean of one cluster. In the tagged format only the 127-d token
parts ``u_t`` are pooled: the mean of a cluster's ``u_t`` is renormalised and written back with the
exact token tag ``sqrt(1 - beta)`` (:meth:`~uibk_embedding.tagged.TaggedFormat.write_tokens`), so
every stored vector is still unit norm and the score identity of docs/format.md#identity holds
with its bounds unchanged (a pooled token row is a token row like any other). What is never
pooled:

* the three slot rows (they carry the dense part): copied byte for byte;
* a token alone in its cluster: its row copied byte for byte;
* a query (only documents are pooled: ``encode_queries`` never calls this module).

``pool_factor=1`` (the default) returns the lists themselves, the same arrays, untouched.

The pool factor is part of the tagged format (:attr:`TaggedFormat.pool_factor
<uibk_embedding.tagged.TaggedFormat.pool_factor>`): an encoder made with ``pool_factor=N`` pools
its documents and a store opened with its format records ``N``. Searching is unaffected by it
(queries are never pooled), so any encoder of the same constants and projection searches a
pooled store; writing is not: :func:`check_pool_factor` refuses documents encoded with another
pool factor than the one the store records.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(9, 127)))
>>> pooled = pool_tokens(doc, 2, fmt)
>>> doc.shape, pooled.shape          # 3 slots + 9 tokens -> 3 slots + 9 // 2 tokens
((12, 128), (7, 128))
>>> bool(np.array_equal(pooled[:3], doc[:3])), bool(np.allclose(np.linalg.norm(pooled, axis=1), 1))
(True, True)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.tagged import MAX_POOL_FACTOR, N_SLOTS, TaggedFormat


def check_pool_factor_value(pool_factor: Any) -> int:
    """``pool_factor`` as an int, or a ``ValueError``: a whole number from 1 (off) to
    :data:`MAX_POOL_FACTOR` (a bool is not a pool factor).

    >>> check_pool_factor_value(2)
    2
    >>> check_pool_factor_value(0)
    Traceback (most recent call last):
    ...
    ValueError: pool_factor must be a whole number from 1 (no pooling) to 64, got 0
    """
    ok = (isinstance(pool_factor, numbers.Integral) and not isinstance(pool_factor, bool | np.bool_)
          and 1 <= int(pool_factor) <= MAX_POOL_FACTOR)
    if not ok:
        raise ValueError(f"pool_factor must be a whole number from 1 (no pooling) to {MAX_POOL_FACTOR}, "
                         f"got {pool_factor!r}")
    return int(pool_factor)


def pooled_token_count(n_tokens: int, pool_factor: int) -> int:
    """How many token rows a list of ``n_tokens`` keeps: ``max(n_tokens // pool_factor, 1)``
    (PyLate's rule: the floor, and at least one), ``n_tokens`` itself at ``pool_factor=1``.

    >>> [pooled_token_count(n, 2) for n in (1, 2, 3, 9, 10)]
    [1, 1, 1, 4, 5]
    >>> pooled_token_count(5, 1)
    5
    """
    if n_tokens <= 0:
        return 0
    return max(n_tokens // pool_factor, 1)


def ward_clusters(x: np.ndarray, n_clusters: int) -> np.ndarray:
    """Cluster labels ``0 .. n_clusters - 1`` of the rows of ``x`` from agglomerative clustering
    with Ward's criterion, the dendrogram cut to exactly ``n_clusters`` clusters. Labels are
    numbered by each cluster's first row, so the pooled rows keep the document's order.

    The dendrogram is built with the nearest-neighbour chain (``O(n^2)`` time and memory, one
    numpy row update per merge; Ward's criterion is reducible, so the chain finds the same
    merges as the greedy algorithm up to ties) and the Lance-Williams update on squared
    Euclidean distances, then cut by applying its ``n - n_clusters`` lowest merges, children
    before parents (a merge's height is taken as at least its children's, so a float rounding
    cannot put a parent first).

    >>> x = np.array([[0.0, 0.0], [0.0, 0.1], [5.0, 5.0], [5.1, 5.0], [9.0, 0.0]])
    >>> ward_clusters(x, 3).tolist()
    [0, 0, 1, 1, 2]
    >>> ward_clusters(x, 1).tolist(), ward_clusters(x, 5).tolist()
    ([0, 0, 0, 0, 0], [0, 1, 2, 3, 4])
    """
    n = len(x)
    if not 1 <= n_clusters <= max(n, 1):
        raise ValueError(f"n_clusters must be from 1 to {n}, got {n_clusters}")
    if n_clusters == n:
        return np.arange(n)
    if n_clusters == 1:
        return np.zeros(n, dtype=np.int64)
    x = np.asarray(x, dtype=np.float64)
    sq = np.einsum("ij,ij->i", x, x)
    d = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0)
    np.fill_diagonal(d, np.inf)
    size = np.ones(n)
    heights = np.empty(n - 1)
    pairs = np.empty((n - 1, 2), dtype=np.int64)
    last_merge = np.full(n, -1)  # the latest merge each representative row took part in
    alive = list(range(n - 1, -1, -1))  # candidates to start a chain from (popped from the end)
    chain: list[int] = []
    for m in range(n - 1):
        if not chain:
            while size[alive[-1]] == 0:
                alive.pop()
            chain.append(alive[-1])
        while True:
            a = chain[-1]
            b = int(np.argmin(d[a]))
            if len(chain) > 1 and d[a, chain[-2]] <= d[a, b]:
                b = chain[-2]  # a tie with the previous link closes the chain (no cycle)
            if len(chain) > 1 and b == chain[-2]:
                break
            chain.append(b)
        b, a = chain.pop(), chain.pop()
        h = d[a, b]
        na, nb = size[a], size[b]
        new = ((na + size) * d[a] + (nb + size) * d[b] - size * h) / (na + nb + size)
        d[a, :] = new
        d[:, a] = new
        d[b, :] = np.inf
        d[:, b] = np.inf
        d[a, a] = np.inf
        size[a], size[b] = na + nb, 0
        children = [last_merge[i] for i in (a, b) if last_merge[i] >= 0]
        heights[m] = max([h, *(heights[c] for c in children)])
        pairs[m] = a, b
        last_merge[a] = m
    order = np.argsort(heights, kind="stable")[: n - n_clusters]  # children were found first
    parent = np.arange(n)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    for m in order:
        ra, rb = root(int(pairs[m, 0])), root(int(pairs[m, 1]))
        parent[max(ra, rb)] = min(ra, rb)
    roots = np.array([root(i) for i in range(n)])
    _, labels = np.unique(roots, return_inverse=True)  # roots are each cluster's first row
    return labels.astype(np.int64)


def pool_tokens(document: np.ndarray, pool_factor: int, fmt: TaggedFormat | None = None) -> np.ndarray:
    """One tagged document list with its token rows pooled (module docstring): the slot rows as
    they are, then ``max(n // pool_factor, 1)`` token rows (``n`` token rows in), in the order of
    each cluster's first token. ``fmt``: the list's format (its ``beta`` scales the pooled bodies;
    the released one by default). ``pool_factor=1`` returns ``document`` itself.

    >>> fmt = TaggedFormat(); rng = np.random.default_rng(1)
    >>> doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(4, 127)))
    >>> out = pool_tokens(doc, 4, fmt)
    >>> out.shape, out.dtype, bool(np.all(out[3:, 0] == doc[3, 0]))
    ((4, 128), dtype('float32'), True)
    >>> pool_tokens(doc, 1) is doc
    True
    """
    pool_factor = check_pool_factor_value(pool_factor)
    if pool_factor == 1:
        return document
    fmt = fmt or TaggedFormat()
    x, tokens = _tagged_list(document, "pool_tokens")
    n = len(tokens)
    k = pooled_token_count(n, pool_factor)
    if k == n:
        return document
    return pool_clusters(x, ward_clusters(tokens[:, 1:].astype(np.float64), k), fmt)



def _tagged_list(document: np.ndarray, who: str) -> tuple[np.ndarray, np.ndarray]:
    """``document`` as an array and its token rows; a ValueError naming ``who`` unless it is one
    tagged list (its first N_SLOTS rows slots, tag < 0)."""
    x = np.asarray(document)
    if x.ndim != 2 or x.shape[0] < N_SLOTS or not np.all(x[:N_SLOTS, 0] < 0):
        raise ValueError(f"{who} takes one tagged list ({N_SLOTS} slot rows, then token rows), "
                         f"got shape {x.shape}")
    return x, x[N_SLOTS:]

def pool_clusters(document: np.ndarray, labels: np.ndarray, fmt: TaggedFormat | None = None,
                  centers: np.ndarray | None = None) -> np.ndarray:
    """One tagged list with its token rows replaced by one row per cluster of ``labels`` (one
    label ``0 .. k - 1`` per token row, every label used, numbered in the order of each cluster's
    first token), the rows :func:`pool_tokens` writes for the clusters it finds: the slot rows as
    they are, each cluster's 127-d direction (``centers[c]``, by default the sum of its members'
    bodies, i.e. their mean) renormalised under the list's own token tag, and a token alone in its
    cluster copied byte for byte. ``benchmarks/pooling.py --levers`` builds every clustering it
    compares through this function, so they differ only in their clusters and centers.

    >>> fmt = TaggedFormat(); rng = np.random.default_rng(3)
    >>> doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(5, 127)))
    >>> out = pool_clusters(doc, np.array([0, 0, 1, 2, 1]), fmt)
    >>> out.shape, bool(np.array_equal(out[:3], doc[:3])), bool(np.array_equal(out[5], doc[6]))
    ((6, 128), True, True)
    >>> bool(np.allclose(np.linalg.norm(out, axis=1), 1))
    True
    """
    fmt = fmt or TaggedFormat()
    x, tokens = _tagged_list(document, "pool_clusters")
    n = len(tokens)
    labels = np.asarray(labels)
    ok = labels.shape == (n,) and (n == 0 or (np.issubdtype(labels.dtype, np.integer) and labels.min() >= 0))
    counts = np.bincount(labels, minlength=1) if ok and n else np.zeros(0, dtype=np.int64)
    if not ok or np.any(counts == 0):
        raise ValueError(f"labels must give each of the {n} token rows a cluster 0 .. k - 1, every "
                         f"cluster used, got {labels.tolist()!r}")
    k = len(counts)
    bodies = tokens[:, 1:].astype(np.float64)
    if centers is None:
        sums = np.zeros((k, bodies.shape[1]))
        np.add.at(sums, labels, bodies)
    else:
        sums = np.array(centers, dtype=np.float64)
        if sums.shape != (k, bodies.shape[1]):
            raise ValueError(f"centers must have shape ({k}, {bodies.shape[1]}), got {sums.shape}")
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    first = np.full(k, n)
    np.minimum.at(first, labels, np.arange(n))
    degenerate = norms[:, 0] <= 1e-12 * counts  # members cancelling out: keep the first member
    sums[degenerate] = bodies[first[degenerate]]
    norms[degenerate] = np.linalg.norm(sums[degenerate], axis=1, keepdims=True)
    pooled = fmt.write_tokens(np.empty((k, x.shape[1])), sums, norms)
    if n:
        pooled[:, 0] = tokens[0, 0]  # the list's own token tag, bit for bit
    out = np.empty((N_SLOTS + k, x.shape[1]), dtype=x.dtype)
    out[:N_SLOTS] = x[:N_SLOTS]
    out[N_SLOTS:] = pooled
    single = counts == 1
    out[N_SLOTS:][single] = tokens[first[single]]  # a token alone keeps its row exactly
    return out


def pool_documents(documents: Sequence[np.ndarray], fmt: TaggedFormat) -> list[np.ndarray]:
    """:func:`pool_tokens` of every list by ``fmt.pool_factor`` (the encoders call it on each
    batch of documents they encode); at ``pool_factor=1`` the lists themselves.

    >>> fmt = TaggedFormat(pool_factor=3); rng = np.random.default_rng(2)
    >>> docs = [fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127))) for n in (2, 7)]
    >>> [len(d) for d in pool_documents(docs, fmt)]
    [4, 5]
    """
    if fmt.pool_factor == 1:
        return list(documents)
    return [pool_tokens(d, fmt.pool_factor, fmt) for d in documents]


def pool_factor_problem(stored: TaggedFormat, encoder: TaggedFormat | None) -> str | None:
    """Why documents encoded with ``encoder``'s format may not be written into a store that
    recorded ``stored`` (its pool factor), or ``None`` when they may (``encoder=None``: not
    declared). A store that recorded no pool factor (written before pool factors were recorded,
    or without pooling) holds unpooled lists: pool factor 1.

    >>> print(pool_factor_problem(TaggedFormat(pool_factor=2), TaggedFormat()))  # doctest: +ELLIPSIS
    its documents were pooled with pool_factor=2 and this encoder pools with pool_factor=1: ...
    >>> pool_factor_problem(TaggedFormat(pool_factor=2), TaggedFormat(pool_factor=2)) is None
    True
    """
    if encoder is None or stored.pool_factor == encoder.pool_factor:
        return None
    how = ("without pooling" if stored.pool_factor == 1
           else f"with pool_factor={stored.pool_factor}")
    return (f"its documents were pooled with pool_factor={stored.pool_factor} and this encoder pools "
            f"with pool_factor={encoder.pool_factor}: one store keeps one pool factor (searching it "
            f"needs none: queries are never pooled). Encode documents for it {how} "
            f"(load_encoder(pool_factor={stored.pool_factor}), CLI: uibk-embed index --pool-factor "
            f"{stored.pool_factor}), or index into a new store opened with format=encoder.format "
            "(which records the encoder's pool factor)")


def check_pool_factor(stored: TaggedFormat, encoder: TaggedFormat | None, where: str) -> None:
    """:class:`~uibk_embedding.errors.CollectionMismatch` naming ``where`` when documents of
    ``encoder``'s pool factor may not be written into a store that recorded ``stored``
    (:func:`pool_factor_problem`). Called before anything is encoded or written by every path
    that writes an encoder's documents into a store: the CLI's ``index``, the LangChain and
    LlamaIndex stores and the Ray path.

    >>> check_pool_factor(TaggedFormat(), TaggedFormat(pool_factor=2), "the exact store")
    ...                                                      # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    uibk_embedding.errors.CollectionMismatch: the exact store refuses these documents: its ...
    """
    problem = pool_factor_problem(stored, encoder)
    if problem:
        raise CollectionMismatch(f"{where} refuses these documents: {problem}. Nothing was written.")


def stored_vector_ratio(n_tokens: Sequence[int], pool_factor: int) -> float:
    """Stored vectors with pooling over stored vectors without, for documents of ``n_tokens``
    token rows each (slots count: three a document, never pooled).

    >>> round(stored_vector_ratio([10, 20], 2), 3)
    0.583
    """
    before = sum(N_SLOTS + n for n in n_tokens)
    after = sum(N_SLOTS + pooled_token_count(n, pool_factor) for n in n_tokens)
    return after / before if before else math.nan
