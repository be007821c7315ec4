"""LangChain integration: a ``VectorStore`` and a ``BaseRetriever`` over any uibk store.

Both take our encoder (``encoder=``) and a store of :func:`~uibk_embedding.open_store`
(``store=``), whatever its backend: a multi-vector encoder does not fit LangChain's
single-vector ``Embeddings`` interface, so the store encodes texts itself. ``embeddings``
returns :class:`UIBKDenseEmbeddings`, the encoder's dense head as a plain ``Embeddings``
(for other LangChain components; searches never use it).

* :class:`UIBKVectorStore`: ``add_texts`` / ``add_documents`` (ids kept, generated when
  missing, re-adding an id overwrites it), ``delete`` (by ids or by filter), ``get_by_ids``,
  ``similarity_search`` / ``similarity_search_with_score`` (the MaxSim score), ``from_texts``,
  ``from_existing_store`` (e.g. a store indexed by ``uibk-embed index``), async variants
  (LangChain's default executor) and ``as_retriever``.
* :class:`UIBKRetriever`: ``k``, ``filter``, ``dense_weight`` and ``retrieval_mode`` as fields or
  per call (``invoke(query, k=3)``); every returned Document carries ``score``, ``token_part`` and
  ``dense_part`` in its metadata: one hybrid search, explained.

``retrieval_mode`` (langchain-qdrant's word): ``"hybrid"`` (default: slots and tokens),
``"dense"`` (the query's slot rows only) or ``"tokens"`` (its token rows only), chosen per
store, per retriever or per query (``similarity_search(q, retrieval_mode="dense")``), with no
re-index (:func:`~uibk_embedding.tagged.query_for_mode`).

Filters: the library's filter language (``$eq $ne $gt $gte $lt $lte $in $nin $exists``,
``$and $or $not``), or a native Qdrant ``Filter`` on a Qdrant store; other operators are
refused with an error naming them.

Example
-------
>>> import uibk_embedding as ue
>>> from uibk_embedding.integrations.langchain import UIBKVectorStore
>>> vs = UIBKVectorStore(encoder=ue.load_encoder(), store=ue.open_store("exact"))
>>> vs.add_texts(["lift on a wing in a propeller slipstream", "a sourdough bread recipe"],
...              [{"topic": "aero"}, {"topic": "food"}], ids=["wing", "bread"])
['wing', 'bread']
>>> [d.id for d in vs.similarity_search("propeller slipstream", k=1)]
['wing']
>>> doc = vs.as_retriever(search_kwargs={"k": 1}).invoke("bread recipe")[0]
>>> doc.id, doc.metadata["topic"], sorted(k for k in doc.metadata if k.endswith("_part"))
('bread', 'food', ['dense_part', 'token_part'])
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from uibk_embedding._optional import require
from uibk_embedding.adapters import open_store
from uibk_embedding.adapters.base import MultiVectorStore, validate_k
from uibk_embedding.adapters.registry import find_backend
from uibk_embedding.encoder import load_encoder
from uibk_embedding.errors import CollectionMismatch
from uibk_embedding.integrations.core import (
    DEFAULT_FETCH_K,
    DEFAULT_TEXT_KEY,
    NEVER_MATCHES,
    RetrievalCore,
    ScoredText,
    StoredText,
    check_lambda_mult,
    check_score_threshold,
    translate_langchain_filter,
)
from uibk_embedding.tagged import TaggedFormat, check_dense_weight, check_retrieval_mode, dense_vector

require("langchain_core", "langchain", "the LangChain integration")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables.config import run_in_executor  # noqa: E402
from langchain_core.vectorstores import VectorStore  # noqa: E402
from pydantic import ConfigDict, Field, PrivateAttr, model_validator  # noqa: E402

__all__ = ["UIBKDenseEmbeddings", "UIBKRetriever", "UIBKVectorStore"]

SEARCH_KWARGS = ("k", "filter", "dense_weight", "fetch_k", "lambda_mult", "score_threshold", "retrieval_mode")
SEARCH_TYPES = ("similarity", "mmr", "similarity_score_threshold")


def _document(t: StoredText, extra: dict[str, Any] | None = None) -> Document:
    # the stored metadata wins: add_texts refuses the explanation's keys, so they clash only in
    # a store written elsewhere (e.g. by uibk-embed index), whose values come back as stored
    return Document(page_content=t.text, metadata={**(extra or {}), **t.metadata}, id=t.id)


def _texts(texts: Iterable[str]) -> list[str]:
    """``texts`` as a list; one string is refused (``list("gh")`` would be two texts)."""
    if isinstance(texts, str | bytes):
        raise TypeError("texts must be a list of strings, not a single string")
    return list(texts)


def _default_encoder() -> Any:
    return load_encoder()


def _encoder_argument(embedding: Any, encoder: Any) -> Any:
    """The encoder given as LangChain's ``embedding`` argument or as ``encoder=``."""
    if embedding is None:
        return encoder
    if isinstance(embedding, Embeddings) or not hasattr(embedding, "encode_queries"):
        raise TypeError(
            "UIBKVectorStore encodes with a uibk multi-vector encoder, not a LangChain "
            "Embeddings: pass encoder=uibk_embedding.load_encoder(...) (or leave it out "
            "for the embedded default)"
        )
    if encoder is not None:
        raise TypeError("give the encoder once: as embedding or as encoder=, not both")
    return embedding


def _check_search_params(p: dict[str, Any], search_type: str) -> None:
    """Every search parameter of a retriever (fields, ``search_kwargs``, per-call arguments
    merged), checked as the searches check them: when the retriever is built, and per call."""
    translate_langchain_filter(p["filter"])
    validate_k(p["k"])
    validate_k(p["fetch_k"], "fetch_k")
    check_lambda_mult(p["lambda_mult"])
    if p["dense_weight"] is not None:
        check_dense_weight(p["dense_weight"])
    if p["retrieval_mode"] is not None:
        check_retrieval_mode(p["retrieval_mode"])
    if p["score_threshold"] is not None:
        check_score_threshold(p["score_threshold"])
        if search_type == "mmr":
            raise ValueError("score_threshold does not apply to search_type 'mmr' (it ranks by "
                             "diversity too); use 'similarity' or 'similarity_score_threshold'")


def _store_target(backend: str | None, collection_name: str | None, path: Any, url: str | None,
                  client: Any, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(backend, options)`` for open_store from langchain-qdrant's argument names. Without a
    ``backend``, a ``path`` is read by the detector ``open_store`` and ``uibk-embed search`` use
    (:func:`~uibk_embedding.adapters.registry.find_backend`); otherwise, and for a new ``path``,
    ``"qdrant"`` with a collection, url or client, else ``"exact"``."""
    default = "qdrant" if (collection_name, url, client) != (None, None, None) else "exact"
    opts = dict(options)
    for key, value in (("path", path), ("url", url), ("client", client), ("collection", collection_name)):
        if value is not None:
            opts[key] = os.fspath(value) if key == "path" else value
    if backend is None:
        backend = find_backend(opts, default) if url is None and client is None else default
    return backend, opts


def _open_for(encoder: Any, backend: str, options: dict[str, Any], *,
              create: bool = True) -> MultiVectorStore:
    """``open_store(backend, **options)`` with ``format=`` the encoder's format: a new store records
    it (its projection included), an existing one is checked against it, so a store made here
    refuses an encoder of another projection later (:class:`~uibk_embedding.errors.CollectionMismatch`).
    A ``format=`` in ``options`` the encoder cannot use is refused before anything is opened.

    >>> import uibk_embedding as ue
    >>> enc = ue.load_encoder()
    >>> _open_for(enc, "exact", {}).format == enc.format
    True
    """
    wanted = getattr(encoder, "format", None)
    given = options.get("format")
    problem = given.conflict(wanted) if isinstance(given, TaggedFormat) else None
    if problem:  # refused before a store is created or opened
        raise CollectionMismatch(f"format= does not fit the encoder: a store of that format cannot be "
                                 f"searched with it ({problem}); leave format= out, and the store takes "
                                 "the encoder's format")
    return open_store(backend, create=create, **{**options, "format": given or wanted})


class UIBKDenseEmbeddings(Embeddings):
    """The encoder's dense head as a LangChain ``Embeddings`` (381-d unit vectors).

    Dot products of these vectors are the dense cosine of the tagged lists (the three slot
    bodies, see :func:`~uibk_embedding.tagged.dense_vector`). The vector store does
    not search with them; they are for LangChain components that need one vector per text.

    >>> import uibk_embedding as ue
    >>> len(UIBKDenseEmbeddings(ue.load_encoder()).embed_query("wing lift"))
    381
    """

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [dense_vector(x).tolist() for x in self.encoder.encode_documents(texts)]

    def embed_query(self, text: str) -> list[float]:
        q = self.encoder.encode_queries([text])[0]
        return dense_vector(q).tolist()


class UIBKVectorStore(VectorStore):
    """LangChain vector store over a uibk store; see the module docstring for an example.

    Parameters
    ----------
    encoder: a uibk encoder (``uibk_embedding.load_encoder()``; also the default).
    store: a store of ``uibk_embedding.open_store(...)``, any backend.
    text_key: metadata key holding the page content in the store (``"text"``).
    dense_weight: default query-time dense weight (``None``: the encoder's default).
    retrieval_mode: default ``"hybrid"``, ``"dense"`` or ``"tokens"``; every search also takes
        ``retrieval_mode=`` for that query only.

    >>> import uibk_embedding as ue
    >>> vs = UIBKVectorStore.from_texts(["wing lift", "bread"], ids=["w", "b"])
    >>> [d.id for d in vs.similarity_search("lift of a wing", k=1, retrieval_mode="tokens")]
    ['w']
    """

    def __init__(
        self,
        *,
        encoder: Any = None,
        store: MultiVectorStore | None = None,
        client: Any = None,
        collection_name: str | None = None,
        text_key: str = DEFAULT_TEXT_KEY,
        dense_weight: float | None = None,
        retrieval_mode: str = "hybrid",
    ) -> None:
        if store is None and client is None:
            raise TypeError("UIBKVectorStore needs store= (uibk_embedding.open_store(...)) or "
                            "client= (a qdrant_client.QdrantClient) with collection_name=")
        if store is not None and (client is not None or collection_name is not None):
            raise TypeError("give store=, or client= with collection_name=, not both")
        encoder = encoder if encoder is not None else _default_encoder()
        if store is None:  # the collection records the encoder's format (or is checked against it)
            store = _open_for(encoder, "qdrant", {"client": client, "collection": collection_name or "uibk"})
        self.core = RetrievalCore(encoder, store, text_key=text_key, dense_weight=dense_weight,
                                  retrieval_mode=retrieval_mode)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_existing_store(cls, store: MultiVectorStore, encoder: Any = None,
                            **kwargs: Any) -> UIBKVectorStore:
        """Wrap a store that already holds documents (e.g. indexed by ``uibk-embed index``).

        >>> import uibk_embedding as ue
        >>> s = ue.open_store("exact")
        >>> enc = ue.load_encoder()
        >>> s.upsert(["a"], enc.encode_documents(["wing flutter"]), [{"text": "wing flutter"}])
        >>> UIBKVectorStore.from_existing_store(s, enc).get_by_ids(["a"])[0].page_content
        'wing flutter'
        """
        return cls(encoder=encoder, store=store, **kwargs)

    @classmethod
    def from_existing_collection(
        cls,
        collection_name: str | None = None,
        embedding: Any = None,
        *,
        backend: str | None = None,
        path: str | os.PathLike | None = None,
        url: str | None = None,
        client: Any = None,
        encoder: Any = None,
        text_key: str = DEFAULT_TEXT_KEY,
        dense_weight: float | None = None,
        retrieval_mode: str = "hybrid",
        **options: Any,
    ) -> UIBKVectorStore:
        """Open a store that exists, creating nothing (langchain-qdrant's constructor).

        ``backend`` defaults to the backend whose store is at ``path`` (read from its files, as
        ``uibk-embed search`` reads them: a folder of ``uibk-embed index --backend lancedb``,
        ``qdrant``, ``qdrant-edge``... opens as it is), else ``"qdrant"`` when a
        ``collection_name``, ``url`` or ``client`` is given, else ``"exact"``; other
        ``options`` go to :func:`~uibk_embedding.open_store`. Fails with a precise message when
        the collection does not fit: :class:`~uibk_embedding.errors.StoreNotFound` when nothing
        is there, a format conflict when it was written by another model, a ``ValueError`` when
        its documents have no ``text_key`` (no page content to return).

        >>> import tempfile, uibk_embedding as ue
        >>> where = tempfile.mkdtemp() + "/idx"
        >>> UIBKVectorStore.from_texts(["wing lift"], ids=["w"], path=where).store.close()
        >>> vs = UIBKVectorStore.from_existing_collection(path=where)
        >>> vs.get_by_ids(["w"])[0].page_content
        'wing lift'
        >>> vs.store.close()
        >>> UIBKVectorStore.from_existing_collection(path=where + "-nope")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        uibk_embedding.errors.StoreNotFound: no store at ...
        """
        encoder = _encoder_argument(embedding, encoder)
        encoder = encoder if encoder is not None else _default_encoder()
        name, opts = _store_target(backend, collection_name, path, url, client, options)
        store = _open_for(encoder, name, opts, create=False)  # its record checked against the encoder's
        vs = cls(encoder=encoder, store=store, text_key=text_key, dense_weight=dense_weight,
                 retrieval_mode=retrieval_mode)
        first = next(iter(vs.core.store.scan(None)), None)
        if first is not None and text_key not in first[1]:
            raise ValueError(
                f"the {store.backend} store's documents have no {text_key!r} metadata key (document "
                f"{first[0]!r} has {sorted(first[1])}), so there is no page content to return: "
                "pass text_key= the key that holds each document's text")
        return vs

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Any = None,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        encoder: Any = None,
        store: MultiVectorStore | None = None,
        backend: str | None = None,
        path: str | os.PathLike | None = None,
        url: str | None = None,
        client: Any = None,
        collection_name: str | None = None,
        **kwargs: Any,
    ) -> UIBKVectorStore:
        """A store filled with ``texts``. ``store`` defaults to a new store: in memory (exact),
        or where ``path=`` / ``url=`` / ``client=`` / ``collection_name=`` say (as langchain-qdrant
        takes them; ``backend`` defaults to ``"qdrant"`` with a collection, url or client, else
        ``"exact"``). ``embedding`` may be a uibk encoder (LangChain ``Embeddings`` cannot be used).

        >>> vs = UIBKVectorStore.from_texts(["wing lift", "bread"], ids=["w", "b"])
        >>> vs.similarity_search("lift of a wing", k=1)[0].id
        'w'
        """
        texts = _texts(texts)  # before a store is created
        where = (backend, path, url, client, collection_name)
        if store is not None and any(x is not None for x in where):
            raise TypeError("give store=, or backend= / path= / url= / client= / collection_name=, "
                            "not both")
        encoder = _encoder_argument(embedding, encoder)
        encoder = encoder if encoder is not None else _default_encoder()  # its format makes the store
        if store is None:
            own = ("text_key", "dense_weight", "retrieval_mode")
            opts = {k: kwargs.pop(k) for k in list(kwargs) if k not in own}
            if any(x is not None for x in where):
                name, opts = _store_target(backend, collection_name, path, url, client, opts)
            else:
                name = "exact"
            store = _open_for(encoder, name, opts)
        vs = cls(encoder=encoder, store=store, **kwargs)
        vs.add_texts(texts, metadatas, ids=ids)
        return vs

    # -- properties --------------------------------------------------------------------------
    @property
    def embeddings(self) -> Embeddings | None:
        """The encoder's dense head as an ``Embeddings`` (not used for searching)."""
        return UIBKDenseEmbeddings(self.core.encoder)

    @property
    def store(self) -> MultiVectorStore:
        """The uibk store this vector store writes to and searches."""
        return self.core.store

    @property
    def encoder(self) -> Any:
        """The uibk encoder."""
        return self.core.encoder

    # -- writing -----------------------------------------------------------------------------
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str | None] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Encode and add ``texts``; ids not given (or ``None``) get a UUID."""
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(kwargs))}")
        return self.core.add_texts(_texts(texts), metadatas, ids)

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete by ``ids``, or every document matching ``filter=`` (``filter={}``: all).

        Deleting ids that are not stored is not an error.
        """
        flt = kwargs.pop("filter", None)
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(kwargs))}")
        if ids is None and flt is None:
            raise ValueError("delete needs ids, or filter=... ({} deletes every document)")
        if ids is not None and flt is not None:
            raise ValueError("delete takes ids or a filter, not both")
        if ids is not None:
            self.core.delete(ids)  # the store's check refuses one string (list("ab") is a, b)
        else:
            translated = translate_langchain_filter(flt)
            if translated is NEVER_MATCHES:
                return True  # the filter can match nothing
            self.core.delete_where(translated if translated is not None else {})
        return True

    # -- reading -----------------------------------------------------------------------------
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """Documents for the ids that exist, in the order asked (missing ids skipped)."""
        return [_document(t) for t in self.core.get(ids)]

    def _search(self, query: str, k: int, filter: dict | None, dense_weight: float | None,
                explain: bool, **kwargs: Any) -> list[ScoredText]:
        threshold = kwargs.pop("score_threshold", None)
        mode = kwargs.pop("retrieval_mode", None)
        if kwargs:
            raise TypeError(f"unexpected search arguments: {', '.join(sorted(kwargs))}")
        if threshold is None:
            return self.core.search(query, k, translate_langchain_filter(filter),
                                    dense_weight=dense_weight, explain=explain, retrieval_mode=mode)
        pairs = self.core.search_with_relevance(query, k, translate_langchain_filter(filter),
                                                dense_weight=dense_weight, score_threshold=threshold,
                                                retrieval_mode=mode)
        return [t for t, _ in pairs]

    def similarity_search(self, query: str, k: int = 4, filter: dict | None = None,
                          dense_weight: float | None = None, **kwargs: Any) -> list[Document]:
        """The ``k`` best documents for ``query`` (metadata exactly as stored); ``retrieval_mode=``
        (``"hybrid"``, ``"dense"``, ``"tokens"``) for this query only. With ``score_threshold=``
        (a relevance in [0, 1], :func:`~uibk_embedding.integrations.core.relevance`;
        start with 0.5) only those at or above it."""
        return [_document(t) for t in self._search(query, k, filter, dense_weight, False, **kwargs)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: dict | None = None,
        dense_weight: float | None = None, **kwargs: Any,
    ) -> list[tuple[Document, float]]:
        """``(document, MaxSim score)`` pairs, best first (higher is better). ``score_threshold=``
        keeps those whose relevance in [0, 1] is at or above it (the raw score depends on the
        query's length; the relevance does not)."""
        hits = self._search(query, k, filter, dense_weight, False, **kwargs)
        return [(_document(t), t.score) for t in hits]

    def similarity_search_with_explanation(
        self, query: str, k: int = 4, filter: dict | None = None,
        dense_weight: float | None = None, retrieval_mode: str | None = None,
    ) -> list[Document]:
        """Like ``similarity_search``, with ``score``, ``token_part``, ``dense_part`` and
        ``relevance`` added to each Document's metadata (what :class:`UIBKRetriever` returns)."""
        hits = self._search(query, k, filter, dense_weight, True, retrieval_mode=retrieval_mode)
        return [_document(t, t.explanation()) for t in hits]

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4,
                                    **kwargs: Any) -> list[Document]:
        """Not supported: a single vector cannot express a multi-vector query."""
        raise NotImplementedError(
            "UIBKVectorStore searches with multi-vector queries it encodes itself: "
            "use similarity_search(query_text)"
        )

    def _similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, filter: dict | None = None, dense_weight: float | None = None,
        retrieval_mode: str | None = None, **kwargs: Any,
    ) -> list[tuple[Document, float]]:
        """``(document, relevance)``: the MaxSim score over the largest score the query can
        reach, in [0, 1] (:func:`~uibk_embedding.integrations.core.relevance`); LangChain's
        ``similarity_search_with_relevance_scores(score_threshold=...)`` builds on it."""
        if kwargs:
            raise TypeError(f"unexpected search arguments: {', '.join(sorted(kwargs))}")
        pairs = self.core.search_with_relevance(query, k, translate_langchain_filter(filter),
                                                dense_weight=dense_weight, retrieval_mode=retrieval_mode)
        return [(_document(t), r) for t, r in pairs]

    def similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any,
    ) -> list[tuple[Document, float]]:
        """``(document, relevance in [0, 1])`` pairs, best first; ``score_threshold=`` (a
        relevance in [0, 1]) keeps those at or above it."""
        if kwargs.get("score_threshold") is not None:
            check_score_threshold(kwargs["score_threshold"])  # LangChain's own would take any number
        return super().similarity_search_with_relevance_scores(query, k, **kwargs)

    async def asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any,
    ) -> list[tuple[Document, float]]:
        """The async :meth:`similarity_search_with_relevance_scores`, with the same checks."""
        if kwargs.get("score_threshold") is not None:
            check_score_threshold(kwargs["score_threshold"])
        return await super().asimilarity_search_with_relevance_scores(query, k, **kwargs)

    async def _asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any,
    ) -> list[tuple[Document, float]]:
        # LangChain's default would ask for a score-to-relevance function, which MaxSim has not
        return await run_in_executor(None, partial(self._similarity_search_with_relevance_scores,
                                                   query, k, **kwargs))

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                      lambda_mult: float = 0.5, filter: dict | None = None,
                                      dense_weight: float | None = None, retrieval_mode: str | None = None,
                                      **kwargs: Any) -> list[Document]:
        """``k`` documents by maximal marginal relevance among the ``fetch_k`` best: relevance is
        the normalised MaxSim score, the similarity between two documents the cosine of their
        dense heads (:meth:`~uibk_embedding.integrations.core.RetrievalCore.mmr_search`);
        ``lambda_mult`` 1 is plain relevance order, 0 the most diverse."""
        if kwargs:
            raise TypeError(f"unexpected search arguments: {', '.join(sorted(kwargs))}")
        hits = self.core.mmr_search(query, k, fetch_k, lambda_mult, translate_langchain_filter(filter),
                                    dense_weight=dense_weight, retrieval_mode=retrieval_mode)
        return [_document(t) for t in hits]

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4,
                                                fetch_k: int = 20, lambda_mult: float = 0.5,
                                                **kwargs: Any) -> list[Document]:
        """Not supported: a single vector cannot express a multi-vector query."""
        raise NotImplementedError(
            "UIBKVectorStore searches with multi-vector queries it encodes itself: "
            "use max_marginal_relevance_search(query_text)"
        )

    def as_retriever(self, **kwargs: Any) -> UIBKRetriever:  # type: ignore[override]
        """A :class:`UIBKRetriever` over this store. ``search_type``: ``"similarity"`` (default),
        ``"mmr"`` (``search_kwargs`` ``fetch_k``, ``lambda_mult``) or
        ``"similarity_score_threshold"`` (``search_kwargs`` ``score_threshold`` in [0, 1]);
        ``search_kwargs`` may also hold ``k``, ``filter``, ``dense_weight`` and ``retrieval_mode``."""
        tags = [*(kwargs.pop("tags", None) or []), *self._get_retriever_tags()]  # not the caller's list
        return UIBKRetriever(vectorstore=self, tags=tags, **kwargs)


class UIBKRetriever(BaseRetriever):
    """LangChain retriever over a uibk store: hybrid MaxSim search, explained.

    Build it from ``encoder=`` and ``store=`` (or ``vectorstore=`` a :class:`UIBKVectorStore`).
    ``k``, ``filter``, ``dense_weight`` and ``retrieval_mode`` (``"hybrid"``, ``"dense"``,
    ``"tokens"``; ``None``: the vector store's default) are fields, may come in ``search_kwargs``,
    and may be given per call: ``retriever.invoke("query", k=3, retrieval_mode="dense")``. Each
    Document's metadata holds the stored metadata plus ``score`` (MaxSim), ``token_part`` and ``dense_part``.

    >>> import uibk_embedding as ue
    >>> store = ue.open_store("exact")
    >>> vs = UIBKVectorStore(encoder=ue.load_encoder(), store=store)
    >>> _ = vs.add_texts(["wing lift", "panel flutter", "bread"], ids=["w", "p", "b"])
    >>> r = UIBKRetriever(encoder=vs.encoder, store=store, k=2)
    >>> len(r.invoke("lift of a wing")), len(r.invoke("lift of a wing", k=1))
    (2, 1)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    encoder: Any = None
    store: Any = None
    vectorstore: UIBKVectorStore | None = None
    k: int = 4
    filter: Any = None  # a dict of the filter language, or a native Qdrant Filter (Qdrant stores)
    dense_weight: float | None = None
    retrieval_mode: str | None = None
    search_type: str = "similarity"
    search_kwargs: dict[str, Any] = Field(default_factory=dict)
    text_key: str = DEFAULT_TEXT_KEY
    _core: RetrievalCore = PrivateAttr()

    @model_validator(mode="after")
    def _build_core(self) -> UIBKRetriever:
        unknown = set(self.search_kwargs) - set(SEARCH_KWARGS)
        if unknown:
            raise ValueError(f"unknown search_kwargs {sorted(unknown)}; allowed: {list(SEARCH_KWARGS)}")
        if self.search_type not in SEARCH_TYPES:
            raise ValueError(f"search_type {self.search_type!r} is not supported; "
                             f"one of {list(SEARCH_TYPES)}")
        threshold = self.search_kwargs.get("score_threshold")
        if self.search_type == "similarity_score_threshold" and threshold is None:
            raise ValueError("search_type 'similarity_score_threshold' needs search_kwargs "
                             "score_threshold, a number in [0, 1]")
        if self.vectorstore is not None:
            if self.store is not None and self.store is not self.vectorstore.store:
                raise ValueError("give store= or vectorstore=, not two different stores")
            if self.encoder is not None and self.encoder is not self.vectorstore.encoder:
                raise ValueError("give encoder= or vectorstore=, not two different encoders")
            self._core = self.vectorstore.core
        else:
            if self.store is None:
                raise ValueError("UIBKRetriever needs store= (a uibk_embedding.open_store store) "
                                 "or vectorstore= (a UIBKVectorStore)")
            enc = self.encoder if self.encoder is not None else _default_encoder()
            self._core = RetrievalCore(enc, self.store, text_key=self.text_key)
        if self.encoder is None:
            self.encoder = self._core.encoder
        if self.store is None:
            self.store = self._core.store
        for mode in (self.retrieval_mode, self.search_kwargs.get("retrieval_mode")):
            if mode is not None:
                check_retrieval_mode(mode)  # the field too, when search_kwargs overrides it
        _check_search_params(self._params({}), self.search_type)  # refuse bad values now, not per query
        return self

    def _params(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(kwargs) - set(SEARCH_KWARGS)
        if unknown:
            raise TypeError(f"unexpected arguments {sorted(unknown)}; allowed: {list(SEARCH_KWARGS)}")
        p = {"k": self.k, "filter": self.filter, "dense_weight": self.dense_weight,
             "fetch_k": DEFAULT_FETCH_K, "lambda_mult": 0.5, "score_threshold": None,
             "retrieval_mode": self.retrieval_mode}
        p.update(self.search_kwargs)
        p.update(kwargs)
        return p

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        p = self._params(kwargs)
        _check_search_params(p, self.search_type)
        flt = translate_langchain_filter(p["filter"])
        mode = p["retrieval_mode"]
        threshold = p["score_threshold"]
        if self.search_type == "mmr":
            hits = self._core.mmr_search(query, p["k"], p["fetch_k"], p["lambda_mult"], flt,
                                         dense_weight=p["dense_weight"], retrieval_mode=mode)
            return [_document(t, t.explanation()) for t in hits]
        if threshold is not None:  # "similarity_score_threshold", or "similarity" given a threshold
            pairs = self._core.search_with_relevance(query, p["k"], flt, dense_weight=p["dense_weight"],
                                                     score_threshold=threshold, retrieval_mode=mode)
            return [_document(t, {**t.explanation(), "relevance": r}) for t, r in pairs]
        hits = self._core.search(query, p["k"], flt, dense_weight=p["dense_weight"], explain=True,
                                 retrieval_mode=mode)
        return [_document(t, t.explanation()) for t in hits]


    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        # encoding and searching block: run them in LangChain's default executor
        return await run_in_executor(None, partial(self._get_relevant_documents, query,
                                                   run_manager=run_manager.get_sync(), **kwargs))
