"""The framework-neutral core of the LangChain and LlamaIndex integrations.

:class:`RetrievalCore` holds an encoder and a store (any backend of
:func:`~uibk_embedding.adapters.open_store`) and speaks in *texts*: it encodes and adds texts
with their metadata (the text itself is kept in the metadata under ``text_key``), deletes,
gets by id and searches with ``k``, a filter and a query-time dense weight, returning hits
with their score and its decomposition (token part, dense part). It only uses the public
:class:`~uibk_embedding.adapters.base.MultiVectorStore` interface, so it never knows which
backend it talks to; the framework wrappers are thin layers over it.

Filters are the library's filter language (:mod:`~uibk_embedding.adapters.filters`);
:func:`translate_langchain_filter` (LangChain) and
:func:`uibk_embedding.integrations.llama_index.translate_filters` (LlamaIndex) turn the
frameworks' filter shapes into it and refuses what it cannot express with a precise error.

Example
-------
>>> import uibk_embedding as ue
>>> core = RetrievalCore(encoder=ue.load_encoder(), store=ue.open_store("exact"))
>>> core.add_texts(["lift on a wing in a propeller slipstream", "sourdough bread recipe"],
...                [{"topic": "aero"}, {"topic": "food"}], ids=["wing", "bread"])
['wing', 'bread']
>>> hit = core.search("propeller slipstream", k=1)[0]
>>> hit.id, hit.text, hit.metadata
('wing', 'lift on a wing in a propeller slipstream', {'topic': 'aero'})
>>> abs(hit.score - (hit.decomposition.constant + hit.token_part + hit.dense_part)) < 1e-4
True
>>> [h.id for h in core.search("propeller slipstream", k=2, filter={"topic": "food"})]
['bread']
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uibk_embedding.adapters.base import (
    MultiVectorStore,
    settle_format,
    validate_ids,
    validate_k,
    validate_metadata,
)
from uibk_embedding.adapters.filters import Filter, matches, parse_filter
from uibk_embedding.adapters.indexing import upsert_batches
from uibk_embedding.adapters.qdrant_filters import native_filter_kind, native_filter_refused
from uibk_embedding.encoder.base import Encoder, validate_texts
from uibk_embedding.errors import InvalidInput
from uibk_embedding.rank import (  # noqa: F401 - relevance's home moved to rank; imported here as before
    RELEVANCE_KNOTS,
    hybrid_fraction,
    query_span,
    relevance,
    rerank,
)
from uibk_embedding.tagged import (
    Decomposition,
    check_dense_weight,
    check_retrieval_mode,
    check_text,
    decompose,
    dense_vector,
    query_for_mode,
)
from uibk_embedding.token_pooling import check_pool_factor, pool_factor_problem

DEFAULT_TEXT_KEY = "text"
DEFAULT_FETCH_K = 20  # candidates MMR chooses from (LangChain's default)
ADD_BATCH = 256  # texts encoded and upserted per store call
# metadata keys under which the wrappers return each hit's explanation (ScoredText.explanation):
# refused in the metadata of added texts, so a user's own value is never replaced
EXPLAIN_KEYS = ("score", "token_part", "dense_part", "relevance")


class _NeverMatches:
    """A filter no document can satisfy (e.g. ``a == 1 AND a == 2``): searches return []."""

    def __repr__(self) -> str:
        return "NEVER_MATCHES"


NEVER_MATCHES = _NeverMatches()


@dataclass
class StoredText:
    """A stored document as the frameworks see it: id, text and the user's metadata."""

    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScoredText(StoredText):
    """A search hit: a :class:`StoredText` with its MaxSim ``score`` and its decomposition
    (``None`` when the search was run with ``explain=False``) and its :func:`relevance`."""

    score: float = 0.0
    decomposition: Decomposition | None = None
    relevance: float | None = None

    @property
    def token_part(self) -> float | None:
        """Contribution of token matching to the score (``beta * token MaxSim``)."""
        return None if self.decomposition is None else self.decomposition.token_part

    @property
    def dense_part(self) -> float | None:
        """Contribution of the dense head to the score (``beta * lambda * w * cosine``)."""
        return None if self.decomposition is None else self.decomposition.dense_part

    def explanation(self) -> dict[str, Any]:
        """``score``, ``token_part``, ``dense_part``, ``relevance`` (the keys the wrappers put in
        metadata)."""
        return {"score": self.score, "token_part": self.token_part, "dense_part": self.dense_part,
                "relevance": self.relevance}


def check_score_threshold(threshold: Any) -> float:
    """``score_threshold``: a relevance in [0, 1] (the scale of :func:`relevance`), else a
    ``ValueError``.

    >>> check_score_threshold(5)
    Traceback (most recent call last):
    ...
    ValueError: score_threshold is a relevance in [0, 1] (start with 0.5), got 5
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
        raise ValueError(f"score_threshold is a relevance in [0, 1] (start with 0.5), got {threshold!r}")
    return float(threshold)


def check_lambda_mult(lambda_mult: Any) -> float:
    """MMR's ``lambda_mult`` as a float in [0, 1], else a ``ValueError``.

    >>> check_lambda_mult(1)
    1.0
    """
    if (isinstance(lambda_mult, bool) or not isinstance(lambda_mult, int | float | np.integer | np.floating)
            or not 0.0 <= lambda_mult <= 1.0):
        raise ValueError(f"lambda_mult must be in [0, 1], got {lambda_mult!r}")
    return float(lambda_mult)


def mmr_select(relevances: Sequence[float], similarity: np.ndarray, k: int, lambda_mult: float) -> list[int]:
    """Maximal marginal relevance (Carbonell and Goldstein, 1998), greedy: repeatedly take the
    candidate maximising ``lambda_mult * relevance - (1 - lambda_mult) * max similarity to the
    ones taken``; the first is the most relevant. Returns positions into ``relevances``.

    >>> sim = np.array([[1, .9, 0], [.9, 1, 0], [0, 0, 1]])
    >>> mmr_select([1.0, .95, .5], sim, 2, 0.5)   # the near-duplicate of the first loses
    [0, 2]
    >>> mmr_select([1.0, .95, .5], sim, 2, 1.0)   # lambda 1: plain relevance order
    [0, 1]
    """
    lambda_mult = check_lambda_mult(lambda_mult)
    rel = np.asarray(relevances, dtype=np.float64)
    chosen: list[int] = []
    left = list(range(len(rel)))
    closest = np.full(len(rel), -np.inf)  # max similarity of each candidate to the chosen ones
    while left and len(chosen) < k:
        if chosen:
            gain = lambda_mult * rel[left] - (1 - lambda_mult) * closest[left]
        else:
            gain = rel[left]
        pick = left[int(np.argmax(gain))]  # ties: the earlier (more relevant) candidate
        chosen.append(pick)
        left.remove(pick)
        closest = np.maximum(closest, similarity[pick])
    return chosen


class RetrievalCore:
    """An encoder plus a store, speaking texts; see the module docstring for an example.

    Parameters
    ----------
    encoder: a tagged encoder (:func:`~uibk_embedding.load_encoder`).
    store: any :class:`~uibk_embedding.adapters.base.MultiVectorStore`.
    text_key: metadata key that holds each document's text (``"text"``, as ``uibk-embed
        index`` writes it, so stores indexed by the CLI are read back with their texts).
    dense_weight: default query-time dense weight (``None``: the encoder's default).
    retrieval_mode: default mode, ``"hybrid"`` (slots and tokens), ``"dense"`` (the query's slot
        rows only) or ``"tokens"`` (its token rows only): :func:`~uibk_embedding.tagged.query_for_mode`;
        every search also takes ``retrieval_mode=`` per query (no re-index).
    """

    def __init__(
        self,
        encoder: Encoder,
        store: MultiVectorStore,
        *,
        text_key: str = DEFAULT_TEXT_KEY,
        dense_weight: float | None = None,
        retrieval_mode: str = "hybrid",
    ) -> None:
        if not (hasattr(encoder, "encode_queries") and hasattr(encoder, "encode_documents")):
            raise TypeError(
                f"encoder must be a uibk encoder (uibk_embedding.load_encoder()), got "
                f"{type(encoder).__name__}"
            )
        if not isinstance(store, MultiVectorStore):
            raise TypeError(
                f"store must be a uibk store (uibk_embedding.open_store(...)), got {type(store).__name__}"
            )
        if not isinstance(text_key, str) or not text_key:
            raise ValueError(f"text_key must be a non-empty string, got {text_key!r}")
        settle_format(store.format, getattr(encoder, "format", None), f"the {store.backend} store")
        warn_unrecorded_format(store, encoder)
        pooling = pool_factor_problem(store.format, getattr(encoder, "format", None))
        if pooling:  # searching needs no pool factor; adding texts is refused (add_texts)
            warnings.warn(f"the {store.backend} store: {pooling}. Searching it works; adding texts "
                          "with this encoder is refused", UserWarning, stacklevel=3)
        if dense_weight is not None:
            check_dense_weight(dense_weight)
        self.encoder = encoder
        self.store = store
        self.text_key = text_key
        self.dense_weight = dense_weight
        self.retrieval_mode = check_retrieval_mode(retrieval_mode)

    # -- writing ---------------------------------------------------------------------------
    def add_texts(
        self,
        texts: Sequence[str],
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
        ids: Sequence[str | None] | None = None,
        *,
        what: str = "texts",
    ) -> list[str]:
        """Encode and upsert ``texts``; returns their ids (a fresh UUID where none is given).

        Every input is checked before anything is encoded or written, each text also as the
        metadata string it is stored as (no NUL character); an id that is already stored is
        overwritten (text, vectors and metadata). ``what``: the texts' name in messages (the
        LlamaIndex wrapper says ``"nodes"``).
        """
        texts = validate_texts(texts, what)
        check_pool_factor(self.store.format, getattr(self.encoder, "format", None),
                          f"the {self.store.backend} store")
        for i, t in enumerate(texts):  # validate_texts refused lone surrogates; the metadata rules add NUL
            if "\x00" in t:
                raise InvalidInput(
                    f"{what}[{i}]: the text holds a NUL character ('\\x00', common in text extracted "
                    f"from PDFs), which not every backend can store in metadata, where the text is kept "
                    f"(under {self.text_key!r}; PostgreSQL's jsonb cannot hold one); remove it, e.g. "
                    "text.replace('\\x00', ''). Nothing was written"
                )
        n = len(texts)
        if ids is None:
            ids = [None] * n
        if isinstance(ids, str | bytes):
            raise TypeError("ids must be a list of strings, not a single string")
        ids = list(ids)
        if len(ids) != n:
            raise ValueError(f"got {n} texts but {len(ids)} ids")
        out_ids = validate_ids([str(uuid.uuid4()) if x is None else x for x in ids])
        mds = validate_metadata(metadatas, n)
        for i, m in enumerate(mds):
            if self.text_key in m:
                raise ValueError(
                    f"metadata[{i}] has the key {self.text_key!r}, which holds the document text in "
                    "this store; rename that metadata key or choose another text_key"
                )
            for key in EXPLAIN_KEYS:
                if key in m:
                    raise ValueError(
                        f"metadata[{i}] has the key {key!r}, under which search results return their "
                        f"explanation ({', '.join(EXPLAIN_KEYS)}); rename that metadata key"
                    )
            m[self.text_key] = texts[i]
        upsert_batches(self.store, out_ids, mds, texts=texts, encode=self.encoder.encode_documents,
                       batch_size=ADD_BATCH)
        return out_ids

    def delete(self, ids: Sequence[str]) -> None:
        """Delete documents by id (ids that are not stored are ignored)."""
        self.store.delete(ids)

    def delete_where(self, filter: Filter) -> int:
        """Delete every document whose metadata matches ``filter``; returns how many.

        One call to the store's own filtered delete (``store.delete(filter=...)``): every match
        goes, on every backend, approximate ones included. ``{}`` deletes everything."""
        return int(self.store.delete(filter=filter) or 0)

    def scan(self, filter: Filter | None = None) -> Iterator[StoredText]:
        """Every stored document (id, text, metadata) whose metadata matches ``filter``."""
        for doc_id, md in self.store.scan(filter):
            yield self._stored(doc_id, md)

    # -- reading ---------------------------------------------------------------------------
    def get(self, ids: Sequence[str], filter: Filter | None = None) -> list[StoredText]:
        """Stored documents for the ids that exist, in the order asked (missing ids skipped);
        with ``filter``, those whose stored metadata (the text under ``text_key`` included, as
        :meth:`search` and :meth:`scan` match it) matches."""
        conds = parse_filter(filter)
        return [self._stored(r.id, r.metadata) for r in self.store.get(ids) if matches(r.metadata, conds)]

    def count(self) -> int:
        """Number of stored documents."""
        return self.store.count()

    def encode_query(self, query: str, dense_weight: float | None = None,
                     retrieval_mode: str | None = None) -> np.ndarray:
        """The tagged query list of ``query`` with the given (or default) dense weight, cut to the
        given (or default) retrieval mode."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        if not query.strip():
            raise ValueError("the query is empty or whitespace only; there is nothing to search for")
        check_text(query, "the query")
        w = dense_weight if dense_weight is not None else self.dense_weight
        if w is not None:
            check_dense_weight(w)
        mode = check_retrieval_mode(self.retrieval_mode if retrieval_mode is None else retrieval_mode)
        return query_for_mode(self.encoder.encode_queries([query], dense_weight=w)[0], mode)

    def search(
        self,
        query: str,
        k: int = 4,
        filter: Filter | _NeverMatches | None = None,
        *,
        dense_weight: float | None = None,
        explain: bool = True,
        retrieval_mode: str | None = None,
    ) -> list[ScoredText]:
        """The ``k`` best documents for ``query``, best first, with score and decomposition.

        ``filter`` is the library's filter language (or :data:`NEVER_MATCHES`);
        ``dense_weight`` scales the dense head for this query only (no re-index);
        ``retrieval_mode`` (``"hybrid"``, ``"dense"``, ``"tokens"``) overrides the default.
        """
        k = validate_k(k)
        if filter is NEVER_MATCHES:
            return []
        self._check_filter(filter)
        q = self.encode_query(query, dense_weight, retrieval_mode)
        return self._hits(q, k, filter, explain)

    def search_with_relevance(
        self, query: str, k: int = 4, filter: Filter | _NeverMatches | None = None, *,
        dense_weight: float | None = None, score_threshold: float | None = None,
        retrieval_mode: str | None = None,
    ) -> list[tuple[ScoredText, float]]:
        """``(hit, relevance in [0, 1])`` pairs (:func:`relevance`), best first; with
        ``score_threshold`` only those at or above it."""
        k = validate_k(k)
        if score_threshold is not None:
            score_threshold = check_score_threshold(score_threshold)
        if filter is NEVER_MATCHES:
            return []
        q = self.encode_query(query, dense_weight, retrieval_mode)
        out = [(h, h.relevance) for h in self._hits(q, k, filter, explain=True)]
        if score_threshold is not None:
            out = [(h, r) for h, r in out if r >= score_threshold]
        return out

    def mmr_search(
        self, query: str, k: int = 4, fetch_k: int = DEFAULT_FETCH_K, lambda_mult: float = 0.5,
        filter: Filter | _NeverMatches | None = None, *, dense_weight: float | None = None,
        retrieval_mode: str | None = None,
    ) -> list[ScoredText]:
        """``k`` documents chosen by maximal marginal relevance among the ``fetch_k`` best.

        Relevance is the hit's :func:`relevance` (MaxSim over the reachable maximum, in [0, 1]);
        the similarity between two candidates is the cosine of their dense heads (the slot
        vectors, :func:`~uibk_embedding.tagged.dense_vector`, in [-1, 1]): symmetric,
        independent of the documents' lengths (MaxSim between two lists is neither), and what
        "says the same thing" means for a sentence encoder. :func:`mmr_select` picks.
        """
        k, fetch_k = validate_k(k), validate_k(fetch_k, "fetch_k")
        lambda_mult = check_lambda_mult(lambda_mult)
        if filter is NEVER_MATCHES:
            return []
        q = self.encode_query(query, dense_weight, retrieval_mode)
        return self.mmr_pick(self._hits(q, max(k, fetch_k), filter, explain=True), k, lambda_mult)

    def mmr_pick(self, hits: Sequence[ScoredText], k: int, lambda_mult: float) -> list[ScoredText]:
        """``k`` of ``hits`` (candidates of one query, with their relevance) chosen by
        :func:`mmr_select`, the similarity between two the cosine of their dense heads (see
        :meth:`mmr_search`)."""
        if not hits:
            return []
        recs = {r.id: r.vectors for r in self.store.get([h.id for h in hits])}
        hits = [h for h in hits if h.id in recs]  # deleted meanwhile
        dense = np.stack([dense_vector(recs[h.id]) for h in hits]).astype(np.float64)
        picked = mmr_select([float(h.relevance or 0.0) for h in hits], dense @ dense.T, k, lambda_mult)
        return [hits[i] for i in picked]

    def _hits(self, q: np.ndarray, k: int, filter: Filter | _NeverMatches | None,
              explain: bool) -> list[ScoredText]:
        self._check_filter(filter)
        hits = self.store.search(q, k=k, filter=filter, explain=explain)  # type: ignore[arg-type]
        return [ScoredText(**vars(self._stored(h.id, h.metadata)), score=float(h.score),
                           decomposition=h.decomposition, relevance=h.relevance)
                for h in hits]

    def rank_ids(
        self, query: str, ids: Sequence[str], k: int, filter: Filter | _NeverMatches | None = None, *,
        dense_weight: float | None = None, retrieval_mode: str | None = None,
    ) -> list[ScoredText]:
        """Exact MaxSim ranking of the stored documents ``ids`` only (best ``k``), with
        ``filter`` those whose stored metadata matches it (as :meth:`search` matches it).

        For callers that restrict a search to known ids (LlamaIndex ``node_ids``): the
        vectors are fetched and scored here, exactly, whatever the backend.
        """
        k = validate_k(k)
        ids = validate_ids(ids, unique=False)  # one string is refused, not split into characters
        if filter is NEVER_MATCHES:
            return []
        conds = parse_filter(filter)
        q = self.encode_query(query, dense_weight, retrieval_mode)
        recs = [r for r in self.store.get(list(dict.fromkeys(ids))) if matches(r.metadata, conds)]
        out = []
        for i, score in rerank(q, [r.vectors for r in recs], k, dtype=np.float64):
            r = recs[i]
            out.append(ScoredText(**vars(self._stored(r.id, r.metadata)), score=score,
                                  decomposition=decompose(q, r.vectors, self.store.format),
                                  relevance=relevance(q, score)))
        return out

    # -- helpers ---------------------------------------------------------------------------
    def _check_filter(self, filter: Any) -> None:
        """The filter language, checked; or a native Qdrant ``Filter``, which only a Qdrant store
        takes (passed through to it; a clear ``TypeError`` on any other backend)."""
        if filter is None:
            return
        if native_filter_kind(filter) is not None:
            native_filter_refused(filter, self.store.backend)
            return
        parse_filter(filter)

    def _stored(self, id: str, metadata: Mapping[str, Any]) -> StoredText:
        md = dict(metadata)
        text = md.pop(self.text_key, "")
        return StoredText(id=id, text=text if isinstance(text, str) else str(text), metadata=md)


def warn_unrecorded_format(store: MultiVectorStore, encoder: Any) -> None:
    """Warn when ``store`` is empty and records no encoder projection (it was opened without
    ``format=``) while ``encoder`` declares one: documents added now could later be searched
    with an encoder of another projection, which the store would accept, scoring queries against
    vectors they do not match. The stores record their format only when they are made, so the fix
    is the caller's: ``format=encoder.format`` when opening. Not for a store in memory (``path``
    ``None``), which is never reopened, nor for a filled one (written before projections were
    recorded, it keeps working as it did).

    >>> import uibk_embedding as ue
    >>> warn_unrecorded_format(ue.open_store("exact"), ue.load_encoder())  # in memory: silent
    """
    wanted = getattr(getattr(encoder, "format", None), "projection", None)
    if wanted is None or store.format.projection is not None or getattr(store, "path", "") is None:
        return
    if store.count() != 0:
        return
    warnings.warn(
        f"the {store.backend} store records no encoder projection (it was opened without format=): "
        f"documents added now could later be searched with an encoder of another projection (not "
        f"{wanted}), which the store would accept, scoring queries against vectors they do not "
        "match. Open it with format=encoder.format (ue.open_store(..., format=enc.format)); "
        "LangChain's from_texts(path=...) does so", UserWarning, stacklevel=4)


# -- filter translation ----------------------------------------------------------------------
def translate_langchain_filter(filter: Mapping[str, Any] | None) -> Filter | None:
    """A LangChain-style metadata filter -> the library's filter language (checked).

    The dict style of LangChain's Qdrant, Chroma and PGVector stores is the language itself:
    ``{"field": value}``, ``$eq $ne $gt $gte $lt $lte $in $nin $exists``, ``$and $or $not``.
    Other operators (``$like``, ``$contains``, ``$between`` ...) are refused by name. A native
    Qdrant ``Filter`` (``qdrant_client.models.Filter``) is returned as it is: a Qdrant store runs
    it untranslated, every other backend refuses it with a clear error.

    >>> translate_langchain_filter({"$and": [{"lang": "en"}, {"year": {"$gte": 2023}}]})
    {'$and': [{'lang': 'en'}, {'year': {'$gte': 2023}}]}
    >>> translate_langchain_filter({"title": {"$like": "%x%"}})
    Traceback (most recent call last):
    ...
    ValueError: filter on 'title': unknown operator '$like'; the operators are ...
    """
    if filter is None:
        return None
    if native_filter_kind(filter) is not None:
        return filter  # type: ignore[return-value]
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a dict, got {type(filter).__name__}")
    parse_filter(filter)
    return dict(filter)
