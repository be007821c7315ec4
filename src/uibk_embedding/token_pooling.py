"""Token pooling at index time: fewer stored vectors per document, no training.

The ``n`` token rows of a document list become ``max(n // pool_factor, 1)`` rows (the floor, at
least one), by one of two methods (the format's ``pool_method``):

* ``"content"`` (the default): function tokens (punctuation, special tokens, whole stopwords and
  the token ids in >= 90% of the collection's documents, the format's ``pool_frequent_ids``)
  are removed, and the content tokens are merged by average linkage on ``1 - cos`` plus
  :data:`SEGMENT_PENALTY` across segments (a segment runs between punctuation); where the
  content alone is under the count, the function tokens are merged among themselves to fill it
  (:func:`pool_content`). On the shared collections at ``pool_factor=2`` it changes nDCG@10 by
  -0.32 / +0.57 / +0.14 points (cranfield / LIMIT-small / NPL), Ward's by +0.25 / -2.77 / -0.78
  (benchmarks/results/pooling_levers.md). It needs each row's token id: the encoders give it.
* ``"ward"``: hierarchical clustering of every token row with Ward's criterion, as PyLate's
  ``pool_factor`` does (:func:`ward_clusters`); what stores pooled before 0.5 hold.

Each pooled row is the mean of one cluster. In the tagged format only the 127-d token
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
pooled store; writing is not: :func:`check_pool_factor` refuses documents pooled otherwise (another
factor, method or set of frequent ids) than the store records.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(9, 127)))
>>> pooled = pool_tokens(doc, 2, fmt, method="ward")
>>> doc.shape, pooled.shape          # 3 slots + 9 tokens -> 3 slots + 9 // 2 tokens
((12, 128), (7, 128))
>>> bool(np.array_equal(pooled[:3], doc[:3])), bool(np.allclose(np.linalg.norm(pooled, axis=1), 1))
(True, True)
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.tagged import MAX_POOL_FACTOR, N_SLOTS, POOL_METHODS, TaggedFormat

SEGMENT_PENALTY = 0.2
"""Added to the merge cost ``1 - cos`` of two content tokens of different segments (a segment
runs between punctuation tokens) by the ``"content"`` method: the items of a list and the
clauses of a sentence stay apart. Chosen on LIMIT-small and cranfield
(``benchmarks/pooling.py --levers``: it helps from 0.1 to 0.2 and hurts from 0.3 up)."""

FREQUENT_CUTOFF = 0.9
"""A token id found in at least this share of a collection's documents is a function token of
the ``"content"`` method (:func:`frequent_token_ids`): "likes" in LIMIT's "X likes A, B and C"."""

MIN_FIT_DOCUMENTS = 20
"""Fewer documents than this give no frequent ids (:func:`frequent_token_ids`): in a handful of
documents many words are in 90% of them. At 20, a word must be in 18 of them (LIMIT-small, the
smallest shared collection, has 46 documents)."""

#: English function words (NLTK's English stopword list, lower case). A token is one only when it
#: is a whole word: the first piece of a longer word ("as" of "as ##ym ##metry") is not.
STOPWORDS = frozenset("""
a about above after again against ain all am an and any are aren aren't as at be because been
before being below between both but by can couldn couldn't d did didn didn't do does doesn
doesn't doing don don't down during each few for from further had hadn hadn't has hasn hasn't
have haven haven't having he her here hers herself him himself his how i if in into is isn isn't
it it's its itself just ll m ma me mightn mightn't more most mustn mustn't my myself needn
needn't no nor not now o of off on once only or other our ours ourselves out over own re s same
shan shan't she she's should should've shouldn shouldn't so some such t than that that'll the
their theirs them themselves then there these they this those through to too under until up
ve very was wasn wasn't we were weren weren't what when where which while who whom why will
with won won't wouldn wouldn't y you you'd you'll you're you've your yours yourself yourselves
""".split())


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

    The dendrogram is built with the nearest-neighbour chain (:func:`_agglomerate`) and the
    Lance-Williams update on squared Euclidean distances.

    >>> x = np.array([[0.0, 0.0], [0.0, 0.1], [5.0, 5.0], [5.1, 5.0], [9.0, 0.0]])
    >>> ward_clusters(x, 3).tolist()
    [0, 0, 1, 1, 2]
    >>> ward_clusters(x, 1).tolist(), ward_clusters(x, 5).tolist()
    ([0, 0, 0, 0, 0], [0, 1, 2, 3, 4])
    """
    x = np.asarray(x, dtype=np.float64)
    sq = np.einsum("ij,ij->i", x, x) if len(x) else np.zeros(0)
    d = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (x @ x.T), 0.0) if len(x) else np.zeros((0, 0))

    def ward(d: np.ndarray, size: np.ndarray, a: int, b: int, h: float) -> np.ndarray:
        na, nb = size[a], size[b]
        return ((na + size) * d[a] + (nb + size) * d[b] - size * h) / (na + nb + size)

    return _agglomerate(d, n_clusters, ward)


def average_clusters(cost: np.ndarray, n_clusters: int) -> np.ndarray:
    """Cluster labels of average linkage (UPGMA) on a symmetric ``n x n`` matrix of merge costs,
    cut to exactly ``n_clusters`` clusters, numbered by each cluster's first row: the clusters
    scipy's ``linkage(squareform(cost), "average")`` gives, up to ties (:func:`_agglomerate`).

    >>> cost = np.array([[0, .1, .9, .8], [.1, 0, .9, .9], [.9, .9, 0, .2], [.8, .9, .2, 0]])
    >>> average_clusters(cost, 2).tolist()
    [0, 0, 1, 1]
    """
    def average(d: np.ndarray, size: np.ndarray, a: int, b: int, h: float) -> np.ndarray:
        return (size[a] * d[a] + size[b] * d[b]) / (size[a] + size[b])

    return _agglomerate(np.array(cost, dtype=np.float64), n_clusters, average)


def _agglomerate(d: np.ndarray, n_clusters: int, update: Any) -> np.ndarray:
    """Agglomerative clustering of ``n`` items on the dissimilarities ``d`` (``n x n``,
    symmetric, changed in place), cut to ``n_clusters`` clusters numbered by their first item.
    ``update(d, size, a, b, h)`` is the Lance-Williams update: the dissimilarities of the union of
    clusters ``a`` and ``b`` (merged at height ``h``) to every cluster.

    The dendrogram is built with the nearest-neighbour chain (``O(n^2)`` time and memory, one
    numpy row update per merge; for a reducible criterion, Ward's and average linkage among them,
    the chain finds the same merges as the greedy algorithm up to ties), then cut by applying its
    ``n - n_clusters`` lowest merges, children before parents (a merge's height is taken as at
    least its children's, so a float rounding cannot put a parent first).
    """
    n = len(d)
    if not 1 <= n_clusters <= max(n, 1):
        raise ValueError(f"n_clusters must be from 1 to {n}, got {n_clusters}")
    if n_clusters == n:
        return np.arange(n)
    if n_clusters == 1:
        return np.zeros(n, dtype=np.int64)
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
        new = update(d, size, a, b, h)
        d[a, :] = new
        d[:, a] = new
        d[b, :] = np.inf
        d[:, b] = np.inf
        d[a, a] = np.inf
        size[a], size[b] = size[a] + size[b], 0
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


@dataclass(frozen=True)
class TokenRows:
    """What the ``"content"`` method knows of a document's token rows, one entry a row:
    ``function`` (bool: punctuation, a special token, a whole stopword or a frequent id) and
    ``segments`` (int: a new segment starts after each punctuation token)."""

    function: np.ndarray
    segments: np.ndarray


class TokenVocabulary:
    """What a tokenizer's vocabulary says of each token id, for the ``"content"`` method: special,
    punctuation, a stopword (:data:`STOPWORDS`, when it starts a word) and a word's continuation
    piece. Word pieces are read from the vocabulary's own scheme: WordPiece's ``"##"`` marks a
    continuation; SentencePiece's ``"▁"`` and byte-level BPE's ``"Ġ"`` mark a word's start,
    so a piece without it continues the word before it.

    >>> voc = TokenVocabulary({"[CLS]": 0, "the": 1, "wing": 2, ",": 3, "as": 4, "##ym": 5})
    >>> r = voc.rows(np.array([1, 2, 3, 4, 5, 2]))      # "the wing , as ##ym wing"
    >>> r.function.tolist(), r.segments.tolist()        # "as" is not whole: no stopword
    ([True, False, True, False, False, False], [0, 0, 0, 1, 1, 1])
    >>> voc.rows(np.array([2, 2]), frequent=(2,)).function.tolist()
    [True, True]
    """

    def __init__(self, tokens: Mapping[str, int], specials: Iterable[int] = ()) -> None:
        size = max(tokens.values(), default=-1) + 1
        self.special = np.zeros(size, dtype=bool)
        self.punct = np.zeros(size, dtype=bool)
        self.stop = np.zeros(size, dtype=bool)
        self.continuation = np.zeros(size, dtype=bool)
        strings = list(tokens)

        def share(prefix: str) -> float:
            return sum(t.startswith(prefix) for t in strings) / max(len(strings), 1)

        marker, starts = ("##", False) if share("##") >= 0.01 else next(
            ((m, True) for m in ("\u2581", "\u0120") if share(m) >= 0.1), ("", False))
        for t, i in tokens.items():
            word = t[len(marker):] if marker and t.startswith(marker) and len(t) > len(marker) else t
            special = bool(re.fullmatch(r"\[[A-Za-z_]+\]|<[^<>\s]+>", t))
            # WordPiece marks the continuation, the others mark a word's start
            cont = bool(marker) and not special and (word != t) != starts
            self.special[i] = special
            self.punct[i] = not special and not any(c.isalnum() for c in word)
            self.continuation[i] = cont
            self.stop[i] = not cont and not special and word.lower() in STOPWORDS
        for i in specials:
            if 0 <= i < size:
                self.special[i], self.punct[i], self.stop[i] = True, False, False

    @staticmethod
    def _look(flags: np.ndarray, ids: np.ndarray) -> np.ndarray:
        out = np.zeros(len(ids), dtype=bool)
        known = (ids >= 0) & (ids < len(flags))
        out[known] = flags[ids[known]]
        return out

    def rows(self, ids: np.ndarray, frequent: Sequence[int] = ()) -> TokenRows:
        """:class:`TokenRows` of one document's token rows, given their token ids (an id the
        vocabulary does not hold: a content word); ``frequent``: more ids to treat as function
        words (:attr:`TaggedFormat.pool_frequent_ids <uibk_embedding.tagged.TaggedFormat>`)."""
        ids = np.asarray(ids, dtype=np.int64)
        punct = self._look(self.punct, ids)
        next_continues = np.append(self._look(self.continuation, ids)[1:], False)
        function = (self._look(self.special, ids) | punct
                    | (self._look(self.stop, ids) & ~next_continues))
        if len(frequent):
            function |= np.isin(ids, np.asarray(frequent, dtype=np.int64))
        segments = np.concatenate([[0], np.cumsum(punct)[:-1]]).astype(np.int64) if len(ids) else ids
        return TokenRows(function, segments)


def token_vocabulary(tokenizer: Any, who: str = "the encoder") -> TokenVocabulary:
    """:class:`TokenVocabulary` of a ``tokenizers.Tokenizer`` or a transformers tokenizer (its
    ``get_vocab()``, and its special tokens: ``get_added_tokens_decoder()`` entries marked special,
    or ``all_special_ids``); a ValueError naming ``who`` when it has no vocabulary to read.

    >>> from tokenizers import Tokenizer, models
    >>> voc = token_vocabulary(Tokenizer(models.WordLevel({"[CLS]": 0, "the": 1, "wing": 2}, "[CLS]")))
    >>> voc.rows(np.array([0, 1, 2])).function.tolist()
    [True, True, False]
    """
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        raise ValueError(f"{who} has no tokenizer vocabulary to read, which pool_method='content' needs: "
                         "use pool_method='ward'")
    specials: set[int] = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "get_added_tokens_decoder", None)
    if callable(added):
        specials |= {int(i) for i, t in added().items() if getattr(t, "special", False)}
    return TokenVocabulary(get_vocab(), specials)


def frequent_token_ids(documents: Iterable[np.ndarray], cutoff: float = FREQUENT_CUTOFF,
                       min_documents: int = MIN_FIT_DOCUMENTS) -> tuple[int, ...]:
    """The token ids found in at least ``cutoff`` of ``documents`` (each the token ids of one
    document's rows): a statistic of the collection, like an inverted index's document
    frequencies, that the ``"content"`` method treats as function words. Fewer than
    ``min_documents`` documents: none.

    >>> docs = [np.array([5, 7, 5])] * 95 + [np.array([9])] * 5
    >>> frequent_token_ids(docs), frequent_token_ids(docs, cutoff=0.96), frequent_token_ids(docs[:19])
    ((5, 7), (), ())
    """
    if not 0.0 < cutoff <= 1.0:
        raise ValueError(f"cutoff is a share of the documents, in (0, 1], got {cutoff}")
    counts = np.zeros(0, dtype=np.int64)  # documents holding each id: memory of the vocabulary only
    n = 0
    for d in documents:
        ids = np.unique(np.asarray(d, dtype=np.int64))
        ids = ids[ids >= 0]
        n += 1
        if len(ids) and ids[-1] >= len(counts):
            counts = np.concatenate([counts, np.zeros(int(ids[-1]) + 1 - len(counts), dtype=np.int64)])
        counts[ids] += 1
    if n < max(min_documents, 1):
        return ()
    return tuple(int(i) for i in np.flatnonzero(counts >= cutoff * n))


def _cosine_cost(bodies: np.ndarray) -> np.ndarray:
    u = bodies / np.maximum(np.linalg.norm(bodies, axis=1, keepdims=True), 1e-12)
    return np.clip(1.0 - u @ u.T, 0.0, 2.0)


def numbered_by_first(labels: np.ndarray) -> np.ndarray:
    """Cluster labels renumbered ``0 .. k - 1`` in the order of each cluster's first row.

    >>> numbered_by_first(np.array([7, 3, 7, 5])).tolist()
    [0, 1, 0, 2]
    """
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.ravel()]


def pool_content(document: np.ndarray, keep: int, rows: TokenRows, fmt: TaggedFormat | None = None,
                 segment_penalty: float = SEGMENT_PENALTY) -> np.ndarray:
    """One tagged list with its token rows pooled to ``keep`` rows by the ``"content"`` method:

    * the function rows (``rows.function``) are removed, and the content rows average-linked on
      the cost ``1 - cos`` plus ``segment_penalty`` across segments, down to ``keep``;
    * where the content rows are fewer than ``keep``, they all stay as they are and the function
      rows are average-linked among themselves into the rows left;
    * a list of function rows only is average-linked as a whole.

    Rows are written as :func:`pool_clusters` writes them (a row alone copied byte for byte), in
    the order of each cluster's first token; a list of ``keep`` rows or fewer is returned as it is.

    >>> fmt = TaggedFormat(); rng = np.random.default_rng(4)
    >>> doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(6, 127)))
    >>> rows = TokenRows(np.array([1, 0, 0, 1, 0, 0], bool), np.array([0, 0, 0, 0, 1, 1]))
    >>> out = pool_content(doc, 3, rows, fmt)
    >>> out.shape, bool(np.allclose(np.linalg.norm(out, axis=1), 1))
    ((6, 128), True)
    """
    fmt = fmt or TaggedFormat()
    x, tokens = _tagged_list(document, "pool_content")
    n = len(tokens)
    function = np.asarray(rows.function, dtype=bool)
    segments = np.asarray(rows.segments)
    if function.shape != (n,) or segments.shape != (n,):
        raise ValueError(f"rows must describe the list's {n} token rows, got {function.shape} function "
                         f"flags and {segments.shape} segments")
    if keep >= n:
        return document
    bodies = tokens[:, 1:].astype(np.float64)
    content = np.flatnonzero(~function)
    if len(content) >= keep or len(content) == 0:
        if len(content) == 0:
            content = np.arange(n)
        sub = x[np.concatenate([np.arange(N_SLOTS), N_SLOTS + content])]
        if len(content) == keep:
            return sub
        seg = segments[content]
        cost = _cosine_cost(bodies[content]) + segment_penalty * (seg[:, None] != seg[None, :])
        return pool_clusters(sub, average_clusters(cost, keep), fmt)
    fi = np.flatnonzero(function)  # content rows alone, the function rows fill the rest
    labels = np.empty(n, dtype=np.int64)
    labels[content] = np.arange(len(content))
    labels[fi] = len(content) + average_clusters(_cosine_cost(bodies[fi]), keep - len(content))
    return pool_clusters(document, numbered_by_first(labels), fmt)


def pool_tokens(document: np.ndarray, pool_factor: int, fmt: TaggedFormat | None = None,
                rows: TokenRows | None = None, method: str | None = None) -> np.ndarray:
    """One tagged document list with its token rows pooled (module docstring): the slot rows as
    they are, then ``max(n // pool_factor, 1)`` token rows (``n`` token rows in), in the order of
    each cluster's first token. ``fmt``: the list's format (its ``beta`` scales the pooled bodies;
    the released one by default); ``method``: ``"content"`` or ``"ward"`` (default: the format's
    ``pool_method``); ``rows``: what the ``"content"`` method needs to know of the token rows
    (:meth:`TokenVocabulary.rows`). ``pool_factor=1`` returns ``document`` itself.

    >>> fmt = TaggedFormat(); rng = np.random.default_rng(1)
    >>> doc = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(4, 127)))
    >>> out = pool_tokens(doc, 4, fmt, method="ward")
    >>> out.shape, out.dtype, bool(np.all(out[3:, 0] == doc[3, 0]))
    ((4, 128), dtype('float32'), True)
    >>> rows = TokenRows(np.array([True, False, False, False]), np.zeros(4, dtype=int))
    >>> pool_tokens(doc, 2, fmt, rows).shape
    (5, 128)
    >>> pool_tokens(doc, 1) is doc
    True
    """
    pool_factor = check_pool_factor_value(pool_factor)
    if pool_factor == 1:
        return document
    fmt = fmt or TaggedFormat()
    method = method or fmt.pool_method
    if method not in POOL_METHODS:
        raise ValueError(f"method must be one of {POOL_METHODS}, got {method!r}")
    x, tokens = _tagged_list(document, "pool_tokens")
    n = len(tokens)
    k = pooled_token_count(n, pool_factor)
    if k == n:
        return document
    if method == "ward":
        return pool_clusters(x, ward_clusters(tokens[:, 1:].astype(np.float64), k), fmt)
    if rows is None:
        raise ValueError("pool_method='content' needs each token row's kind (rows=TokenRows(...), from "
                         "TokenVocabulary.rows of the row's token ids); pass method='ward' to pool "
                         "without them")
    return pool_content(x, k, rows, fmt)


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


def pool_documents(documents: Sequence[np.ndarray], fmt: TaggedFormat,
                   rows: Sequence[TokenRows] | None = None) -> list[np.ndarray]:
    """:func:`pool_tokens` of every list by ``fmt.pool_factor`` and ``fmt.pool_method`` (the
    encoders call it on each batch of documents they encode; ``rows``: one :class:`TokenRows` a
    list, for the ``"content"`` method); at ``pool_factor=1`` the lists themselves.

    >>> fmt = TaggedFormat(pool_factor=3, pool_method="ward"); rng = np.random.default_rng(2)
    >>> docs = [fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(n, 127))) for n in (2, 7)]
    >>> [len(d) for d in pool_documents(docs, fmt)]
    [4, 5]
    """
    if fmt.pool_factor == 1:
        return list(documents)
    if rows is None:
        return [pool_tokens(d, fmt.pool_factor, fmt) for d in documents]
    if len(rows) != len(documents):
        raise ValueError(f"{len(rows)} TokenRows for {len(documents)} documents")
    return [pool_tokens(d, fmt.pool_factor, fmt, r) for d, r in zip(documents, rows, strict=True)]


def _pooling(fmt: TaggedFormat) -> str:
    """How ``fmt`` pools documents, in words."""
    if fmt.pool_factor == 1:
        return "no pooling"
    ids = len(fmt.pool_frequent_ids)
    return (f"pool_factor={fmt.pool_factor}, pool_method={fmt.pool_method!r}"
            + (f", {ids} frequent token ids" if ids else ""))


def pool_factor_problem(stored: TaggedFormat, encoder: TaggedFormat | None) -> str | None:
    """Why documents encoded with ``encoder``'s format may not be written into a store that
    recorded ``stored`` (its pooling: factor, method and frequent ids), or ``None`` when they
    may (``encoder=None``: not declared). A store that recorded no pool factor (written before
    pool factors were recorded, or without pooling) holds unpooled lists: pool factor 1; one that
    recorded a factor and no method was pooled by Ward's method.

    >>> print(pool_factor_problem(TaggedFormat(pool_factor=2), TaggedFormat()))  # doctest: +ELLIPSIS
    its documents were pooled with pool_factor=2, pool_method='content' and this encoder's documents ...
    >>> pool_factor_problem(TaggedFormat(pool_factor=2), TaggedFormat(pool_factor=2)) is None
    True
    """
    if encoder is None:
        return None
    keys = ("pool_factor", "pool_method", "pool_frequent_ids")
    if all(getattr(stored, k) == getattr(encoder, k) for k in keys):
        return None
    if stored.pool_factor == 1:
        python, cli = "load_encoder() without pool_factor", "uibk-embed index without --pool-factor"
    else:
        method = ", pool_method='ward'" if stored.pool_method == "ward" else ""
        python = (f"load_encoder(pool_factor={stored.pool_factor}{method})"
                  + (", then encoder.adopt_pooling(store.format)" if stored.pool_frequent_ids else ""))
        cli = f"uibk-embed index --pool-factor {stored.pool_factor}{' --pool-method ward' if method else ''}"
        if stored.pool_frequent_ids:
            cli += ", which adopts the store's frequent ids"
    were = f"pooled with {_pooling(stored)}" if stored.pool_factor > 1 else "not pooled"
    return (f"its documents were {were} and this encoder's documents get {_pooling(encoder)}: one store "
            f"keeps one pooling (searching it needs none: queries are never pooled). Encode documents "
            f"for it as it was ({python}; CLI: {cli}), or index into a new store opened with "
            "format=encoder.format (which records the encoder's pooling)")


def same_pooling_but_ids(stored: TaggedFormat, encoder: TaggedFormat | None) -> bool:
    """Whether ``encoder`` pools as the store recorded but for the frequent token ids: a writer
    that owns its encoder (the CLI's ``index``, the Ray path's actors) then adopts the store's
    ids (``encoder.adopt_pooling``), the statistic of the corpus the store was made from.

    >>> same_pooling_but_ids(TaggedFormat(pool_factor=2, pool_frequent_ids=(7,)), TaggedFormat(pool_factor=2))
    True
    >>> same_pooling_but_ids(TaggedFormat(pool_factor=2), TaggedFormat(pool_factor=2))
    False
    """
    return (encoder is not None and stored.pool_factor == encoder.pool_factor
            and stored.pool_method == encoder.pool_method
            and stored.pool_frequent_ids != encoder.pool_frequent_ids)


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
