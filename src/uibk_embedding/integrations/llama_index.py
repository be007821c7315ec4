"""LlamaIndex integration: a vector store and a retriever over any uibk store.

LlamaIndex's ``VectorStoreQuery`` holds one query vector, and a tagged query is a list of
vectors: :class:`UIBKVectorStore` therefore sets ``is_embedding_query=False`` and encodes
``query_str`` itself, with our encoder (docs/engines.md#pitfalls). It stores text (``stores_text=True``):
each node's text is kept in the store's metadata, next to LlamaIndex's node record, so nodes
come back whole, and ``delete(ref_doc_id)`` removes every node of a source document.

Scores are on the relevance scale of the LangChain wrapper
(:func:`~uibk_embedding.integrations.core.relevance`, in [0, 1], 1 a perfect match whatever the
query's length; start a threshold at 0.5): ``VectorStoreQueryResult.similarities`` and so every
``NodeWithScore.score``, from :class:`UIBKRetriever` or ``index.as_retriever()``. The raw MaxSim
score is in the node metadata as ``score``, beside ``token_part``, ``dense_part`` and
``relevance`` (kept out of the LLM and embedding views).

To use LlamaIndex's ``VectorStoreIndex`` / query engines on top, build the index with
:func:`index_from_store`: it passes :class:`NoEmbedding` as the embed model, so no
single-vector model ever runs (documents inserted through the index are encoded once, by the
store; queries are encoded by the store).

Filters: ``MetadataFilters`` of ``EQ NE GT GTE LT LTE IN NIN IS_EMPTY`` with ``AND`` / ``OR`` /
``NOT``, nested; the list and text operators (``ANY``, ``ALL``, ``CONTAINS``, ``TEXT_MATCH``) are
refused with an error naming them. The value ``None`` answers as in LlamaIndex's own filter:
``EQ None`` matches no node, ``NE None`` every node, a range with ``None`` is refused (use
``IS_EMPTY``). ``VectorStoreQuery.doc_ids`` restricts to source documents, ``node_ids`` to nodes;
an empty list is no restriction (``VectorStoreIndex.as_retriever()`` sends ``node_ids=[]`` over a
store that keeps the text).

Example
-------
>>> import uibk_embedding as ue
>>> from llama_index.core.schema import TextNode
>>> from llama_index.core.vector_stores.types import MetadataFilters, MetadataFilter
>>> vs = UIBKVectorStore(encoder=ue.load_encoder(), store=ue.open_store("exact"))
>>> vs.add([TextNode(id_="wing", text="lift on a wing in a propeller slipstream",
...                  metadata={"topic": "aero"}),
...         TextNode(id_="bread", text="a sourdough bread recipe", metadata={"topic": "food"})])
['wing', 'bread']
>>> r = UIBKRetriever(vector_store=vs, similarity_top_k=1)
>>> hit = r.retrieve("propeller slipstream")[0]
>>> hit.node.node_id, hit.node.metadata["topic"], "dense_part" in hit.node.metadata
('wing', 'aero', True)
>>> only_food = MetadataFilters(filters=[MetadataFilter(key="topic", value="food")])
>>> [n.node.node_id for n in UIBKRetriever(vector_store=vs, filters=only_food).retrieve("wing")]
['bread']
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from uibk_embedding._optional import require
from uibk_embedding.adapters.base import MultiVectorStore, validate_k
from uibk_embedding.adapters.filters import matches, parse_filter
from uibk_embedding.encoder import load_encoder
from uibk_embedding.integrations.core import (
    DEFAULT_FETCH_K,
    DEFAULT_TEXT_KEY,
    NEVER_MATCHES,
    RetrievalCore,
    ScoredText,
)
from uibk_embedding.tagged import check_retrieval_mode, dense_vector

require("llama_index.core", "llamaindex", "the LlamaIndex integration")

from llama_index.core.base.base_retriever import BaseRetriever  # noqa: E402
from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.callbacks import CallbackManager  # noqa: E402
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402

__all__ = ["NoEmbedding", "UIBKEmbedding", "UIBKRetriever", "UIBKVectorStore", "index_from_store",
           "translate_filters"]

REF_DOC_KEY = "ref_doc_id"  # written by LlamaIndex's node_to_metadata_dict
DEFAULT_TOP_K = 2  # LlamaIndex's DEFAULT_SIMILARITY_TOP_K


def _default_encoder() -> Any:
    return load_encoder()


# -- filters -----------------------------------------------------------------------------------
_OPERATORS = {"EQ": "$eq", "NE": "$ne", "GT": "$gt", "GTE": "$gte", "LT": "$lt", "LTE": "$lte",
              "IN": "$in", "NIN": "$nin"}
_NOTHING = {"$not": {}}  # the filter no node matches (the complement of the empty filter)


def _translate(f: MetadataFilters | MetadataFilter) -> dict[str, Any]:
    if isinstance(f, MetadataFilters):
        subs = [_translate(x) for x in f.filters]
        cond = f.condition or FilterCondition.AND
        if cond == FilterCondition.NOT:  # LlamaIndex: none of the filters holds
            return {"$not": {"$or": subs}} if subs else {}  # none of no filters: every node
        if not subs:
            return {}
        if cond == FilterCondition.OR:
            return {"$or": subs}
        keys = [k for sub in subs for k in sub]
        if len(set(keys)) == len(keys) and not any(k.startswith("$") for k in keys):
            return {k: v for sub in subs for k, v in sub.items()}  # one dict, as a user writes it
        return {"$and": subs}
    op = f.operator
    if op == FilterOperator.IS_EMPTY:  # LlamaIndex: missing, None, "" or []
        return {"$or": [{f.key: {"$exists": False}}, {f.key: ""}]}
    if op.name not in _OPERATORS:
        raise ValueError(
            f"filter operator {op.name} ({op.value!r}) on {f.key!r} is not supported: the filter "
            "language compares whole values (a list-valued field equals nothing); use "
            f"{', '.join(_OPERATORS)}, IS_EMPTY, with AND / OR / NOT")
    if f.value is None:  # as LlamaIndex's own filter: no stored value equals None (null is missing)
        if op == FilterOperator.EQ:
            return dict(_NOTHING)
        if op == FilterOperator.NE:
            return {}  # every node
        raise ValueError(
            f"filter on {f.key!r}: {op.value!r} needs a value, got None (a range has no bound in None, "
            "and LlamaIndex's own filter raises TypeError comparing with it); use IS_EMPTY for a "
            "missing or empty field")
    if op in (FilterOperator.IN, FilterOperator.NIN):
        if not isinstance(f.value, list):
            raise ValueError(f"filter on {f.key!r}: {op.name} takes a list of values, got {f.value!r}")
    elif isinstance(f.value, list):
        raise ValueError(f"filter on {f.key!r}: {op.name} takes one value; use IN for a list")
    return {f.key: {_OPERATORS[op.name]: f.value}}


def translate_filters(filters: MetadataFilters | None) -> Any:
    """LlamaIndex ``MetadataFilters`` -> the library's filter language (or ``None``).

    Every operator but the list and text ones (ANY, ALL, CONTAINS, TEXT_MATCH) maps onto the
    language, with AND / OR / NOT (none of the filters, as LlamaIndex defines it) and nesting;
    IS_EMPTY holds for a missing field, None, ``""`` or ``[]``, as in LlamaIndex. With the value
    ``None``, as LlamaIndex's own filter answers: EQ matches nothing (``{"$not": {}}``), NE
    everything (``{}``); a range has no bound in None and is refused.

    >>> from llama_index.core.vector_stores.types import MetadataFilter
    >>> translate_filters(MetadataFilters(filters=[
    ...     MetadataFilter(key="lang", value="en"),
    ...     MetadataFilter(key="year", value=2020, operator=">")]))
    {'lang': {'$eq': 'en'}, 'year': {'$gt': 2020}}
    >>> translate_filters(MetadataFilters(condition="not", filters=[
    ...     MetadataFilter(key="lang", value=["en", "de"], operator="in")]))
    {'$not': {'$or': [{'lang': {'$in': ['en', 'de']}}]}}
    >>> translate_filters(MetadataFilters(filters=[MetadataFilter(key="tags", value="x", operator="any")]))
    Traceback (most recent call last):
    ...
    ValueError: filter operator ANY ('any') on 'tags' is not supported: the filter language ...
    >>> translate_filters(MetadataFilters(filters=[MetadataFilter(key="lang", value=None)]))
    {'$and': [{'$not': {}}]}
    """
    if filters is None:
        return None
    out = _translate(filters)
    parse_filter(out)  # types, emptiness and operators, with the library's message
    return out


# -- the embed model for VectorStoreIndex ------------------------------------------------------
class UIBKEmbedding(BaseEmbedding):
    """The encoder's dense head as a LlamaIndex embed model: this library's embedding object for
    ``Settings.embed_model`` or ``embed_model=``, so LlamaIndex's documented patterns work over a
    :class:`UIBKVectorStore` without an OpenAI package::

        VectorStoreIndex.from_vector_store(vs, embed_model=UIBKEmbedding())
        VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(
            vector_store=vs), embed_model=UIBKEmbedding())
        Settings.embed_model = UIBKEmbedding()   # then both without embed_model=

    Its vectors are the 381-d unit dense heads (:func:`~uibk_embedding.tagged.dense_vector`;
    dot products are the dense cosine of the tagged lists), so other LlamaIndex components
    that want one vector per text get a real one. :class:`UIBKVectorStore` does not search
    with them: it encodes every text and query itself, as a tagged list.

    >>> e = UIBKEmbedding()
    >>> v, w = e.get_text_embedding("wing lift"), e.get_query_embedding("lift of a wing")
    >>> len(v), round(sum(x * x for x in v), 3), sum(a * b for a, b in zip(v, w)) > 0.3
    (381, 1.0, True)
    """

    model_name: str = "uibk-embedding-dense-head"
    embed_batch_size: int = 64
    _encoder: Any = PrivateAttr()

    def __init__(self, encoder: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if encoder is not None and not hasattr(encoder, "encode_documents"):
            raise TypeError(f"encoder must be a uibk encoder (uibk_embedding.load_encoder()), got "
                            f"{type(encoder).__name__}")
        self._encoder = encoder if encoder is not None else _default_encoder()

    @classmethod
    def class_name(cls) -> str:
        return "UIBKEmbedding"

    @property
    def encoder(self) -> Any:
        """The uibk encoder whose dense head this is."""
        return self._encoder

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [dense_vector(x).tolist() for x in self._encoder.encode_documents(list(texts))]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_query_embedding(self, query: str) -> list[float]:
        return dense_vector(self._encoder.encode_queries([query])[0]).tolist()

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return await asyncio.to_thread(self._get_text_embedding, text)


class NoEmbedding(BaseEmbedding):
    """The embed model to give ``VectorStoreIndex`` over a :class:`UIBKVectorStore`: it runs no model.

    ``VectorStoreIndex`` insists on an embed model and asks it for a vector per inserted node;
    the store ignores those vectors (it encodes each text itself, as a multi-vector list), so
    this returns a one-number placeholder instead of running a single-vector model for
    nothing. Query embeddings are never needed (``is_embedding_query=False``) and are refused.

    >>> NoEmbedding().get_text_embedding("anything")
    [0.0]
    """

    model_name: str = "uibk-store-encodes"

    def _get_text_embedding(self, text: str) -> list[float]:
        return [0.0]

    def _get_query_embedding(self, query: str) -> list[float]:
        raise RuntimeError(
            "NoEmbedding produces no query vectors: UIBKVectorStore encodes query_str itself "
            "(is_embedding_query=False); search it through a retriever or query engine"
        )

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


def index_from_store(vector_store: UIBKVectorStore, **kwargs: Any) -> Any:
    """A ``VectorStoreIndex`` on ``vector_store`` that never runs a single-vector embed model.

    ``index.insert(document)`` splits and stores nodes (encoded once, by the store);
    ``index.as_retriever(similarity_top_k=...)`` and ``index.as_query_engine(...)`` search it.

    >>> import uibk_embedding as ue
    >>> from llama_index.core import Document
    >>> vs = UIBKVectorStore(encoder=ue.load_encoder(), store=ue.open_store("exact"))
    >>> index = index_from_store(vs)
    >>> index.insert(Document(text="Flutter of thin panels in supersonic flow.", doc_id="d1"))
    >>> index.as_retriever(similarity_top_k=1).retrieve("panel flutter")[0].node.ref_doc_id
    'd1'
    """
    from llama_index.core import VectorStoreIndex

    kwargs.setdefault("embed_model", NoEmbedding())
    return VectorStoreIndex.from_vector_store(vector_store, **kwargs)


# -- the vector store --------------------------------------------------------------------------
class UIBKVectorStore(BasePydanticVectorStore):
    """LlamaIndex vector store over a uibk store; see the module docstring for an example.

    Parameters
    ----------
    encoder: a uibk encoder (default: the embedded default, ``uibk_embedding.load_encoder()``).
    store: a store of ``uibk_embedding.open_store(...)``, any backend.
    text_key: metadata key holding each node's text in the store (``"text"``).
    dense_weight: default query-time dense weight (``None``: the encoder's default).
    retrieval_mode: default ``retrieval_mode`` of queries (``"hybrid"``, ``"dense"``,
        ``"tokens"``; per query: ``query(..., retrieval_mode=)``).
    """

    stores_text: bool = True
    is_embedding_query: bool = False
    flat_metadata: bool = False
    text_key: str = DEFAULT_TEXT_KEY
    dense_weight: float | None = None

    _core: RetrievalCore = PrivateAttr()

    def __init__(
        self,
        *,
        encoder: Any = None,
        store: MultiVectorStore,
        text_key: str = DEFAULT_TEXT_KEY,
        dense_weight: float | None = None,
        retrieval_mode: str = "hybrid",
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - set(type(self).model_fields))  # pydantic would drop them
        if unknown:
            raise TypeError(f"UIBKVectorStore got unexpected arguments {unknown}; it takes encoder, "
                            "store, text_key, dense_weight and retrieval_mode")
        super().__init__(text_key=text_key, dense_weight=dense_weight, **kwargs)
        self._core = RetrievalCore(encoder if encoder is not None else _default_encoder(), store,
                                   text_key=text_key, dense_weight=dense_weight,
                                   retrieval_mode=check_retrieval_mode(retrieval_mode))

    @classmethod
    def class_name(cls) -> str:
        return "UIBKVectorStore"

    @property
    def client(self) -> MultiVectorStore:
        """The uibk store."""
        return self._core.store

    @property
    def core(self) -> RetrievalCore:
        """The framework-neutral core (encoder + store)."""
        return self._core

    # -- writing -------------------------------------------------------------------------------
    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Encode and store ``nodes`` (their text and metadata); returns their ids.

        Node embeddings, if any, are ignored: the store encodes each text as a tagged list.
        """
        if add_kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(add_kwargs))}")
        texts = [n.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
        metadatas = [node_to_metadata_dict(n, remove_text=True, flat_metadata=self.flat_metadata)
                     for n in nodes]
        return self._core.add_texts(texts, metadatas, [n.node_id for n in nodes], what="nodes")

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        return await asyncio.to_thread(self.add, nodes, **kwargs)

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node whose source document is ``ref_doc_id``."""
        if not isinstance(ref_doc_id, str) or not ref_doc_id:
            raise ValueError(f"ref_doc_id must be a non-empty string, got {ref_doc_id!r}")
        self._core.delete_where({REF_DOC_KEY: ref_doc_id})

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        await asyncio.to_thread(self.delete, ref_doc_id, **delete_kwargs)

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Delete nodes by id, by filters, or the ids among ``node_ids`` that match ``filters``."""
        if node_ids is None and filters is None:
            raise ValueError("delete_nodes needs node_ids or filters (clear() deletes everything)")
        flt = translate_filters(filters)
        if flt is NEVER_MATCHES:
            return
        if node_ids is None:
            self._core.delete_where(flt or {})
            return
        if flt is not None:
            conds = parse_filter(flt)
            node_ids = [r.id for r in self._core.store.get(node_ids) if matches(r.metadata, conds)]
        self._core.delete(node_ids)

    def clear(self) -> None:
        """Delete every node."""
        self._core.delete_where({})

    def get_nodes(self, node_ids: list[str] | None = None,
                  filters: MetadataFilters | None = None) -> list[BaseNode]:
        """Stored nodes by id (those that exist, in the order asked), optionally filtered;
        without ``node_ids``, every stored node that matches ``filters`` (the store's listing)."""
        flt = translate_filters(filters)
        if flt is NEVER_MATCHES:
            return []
        if node_ids is None:
            return [self._to_node(t.id, t.text, t.metadata) for t in self._core.scan(flt)]
        return [self._to_node(t.id, t.text, t.metadata) for t in self._core.get(node_ids, flt)]

    # -- searching -----------------------------------------------------------------------------
    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Search with ``query.query_str`` (encoded here), ``similarity_top_k``, ``filters``,
        ``doc_ids`` and ``node_ids``. ``dense_weight=`` and ``retrieval_mode=`` (``"hybrid"``,
        ``"dense"``, ``"tokens"``: per query, no re-index) may be given as keywords (from a
        retriever: ``index.as_retriever(vector_store_kwargs={"retrieval_mode": "dense"})``).
        ``similarities`` are relevances in [0, 1] (the same function as LangChain's relevance
        scores, :func:`~uibk_embedding.integrations.core.relevance`; same order as MaxSim); each
        node's metadata holds the raw MaxSim ``score`` and its parts."""
        dense_weight = kwargs.pop("dense_weight", None)
        mode = kwargs.pop("retrieval_mode", None)
        explain = kwargs.pop("explain", True)
        fetch_k = kwargs.pop("mmr_fetch_k", None)
        mmr_lambda = kwargs.pop("mmr_threshold", None)  # index.as_retriever(vector_store_kwargs=...)
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(kwargs))}")
        if query.query_str is None or not query.query_str.strip():
            raise ValueError(
                "UIBKVectorStore encodes the query text itself (a tagged query is many vectors, "
                "VectorStoreQuery holds one): set query_str; query_embedding is not used"
            )
        modes = (VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.HYBRID, VectorStoreQueryMode.MMR)
        try:  # VectorStoreQuery is a dataclass: mode may be a plain string ("mmr")
            qmode = VectorStoreQueryMode(query.mode)
        except ValueError:
            qmode = None
        if qmode not in modes:
            shown = getattr(query.mode, "value", query.mode)
            raise ValueError(
                f"query mode {shown!r} is not supported: UIBKVectorStore runs one hybrid "
                "MaxSim search (mode 'default' or 'hybrid'), or 'mmr' over its candidates"
            )
        for name in ("doc_ids", "node_ids"):
            if isinstance(getattr(query, name), str | bytes):  # list("d1") would be "d", "1"
                raise TypeError(f"{name} must be a list of strings, not a single string")
        if fetch_k is not None:
            validate_k(fetch_k, "mmr_fetch_k")
        parts = [translate_filters(query.filters)] if query.filters is not None else []
        # an empty doc_ids or node_ids is no restriction: VectorStoreIndex.as_retriever() sends
        # node_ids=[] (its list of nodes is empty when the store keeps the text), as LlamaIndex's
        # text-storing stores read it
        if query.doc_ids:
            parts.append({REF_DOC_KEY: {"$in": list(query.doc_ids)}})
        flt = parts[0] if len(parts) == 1 else {"$and": parts} if parts else None
        k = query.similarity_top_k
        if qmode == VectorStoreQueryMode.MMR:
            # lambda: query.mmr_threshold (LlamaIndex's name; 0.5 when unset); candidates:
            # mmr_fetch_k= (default max(20, 4 k)); see RetrievalCore.mmr_search
            lam = query.mmr_threshold if query.mmr_threshold is not None else mmr_lambda
            lam = 0.5 if lam is None else float(lam)
            fetch_k = fetch_k or max(DEFAULT_FETCH_K, 4 * k)
            if query.node_ids:  # MMR among those nodes, the best fetch_k of them
                cands = self._core.rank_ids(query.query_str, query.node_ids, max(k, fetch_k), flt,
                                            dense_weight=dense_weight, retrieval_mode=mode)
                hits = self._core.mmr_pick(cands, k, lam)
            else:
                hits = self._core.mmr_search(query.query_str, k, fetch_k, lam, flt,
                                             dense_weight=dense_weight, retrieval_mode=mode)
        elif query.node_ids:  # exact ranking of those nodes only
            hits = self._core.rank_ids(query.query_str, query.node_ids, k, flt, dense_weight=dense_weight,
                                       retrieval_mode=mode)
        else:
            hits = self._core.search(query.query_str, k, flt, dense_weight=dense_weight, explain=explain,
                                     retrieval_mode=mode)
        nodes = [self._to_node(h.id, h.text, h.metadata, h) for h in hits]
        return VectorStoreQueryResult(nodes=nodes, similarities=[float(h.relevance or 0.0) for h in hits],
                                      ids=[h.id for h in hits])

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return await asyncio.to_thread(self.query, query, **kwargs)

    def _to_node(self, id: str, text: str, metadata: dict[str, Any],
                 hit: ScoredText | None = None) -> BaseNode:
        if "_node_content" in metadata:
            node = metadata_dict_to_node(metadata, text=text)
        else:  # stored by someone else (e.g. uibk-embed index): text + metadata only
            node = TextNode(id_=id, text=text, metadata=dict(metadata))
        if hit is not None and hit.decomposition is not None:
            # the stored metadata wins: add() refuses these keys, so they clash only in a store
            # written elsewhere (e.g. by uibk-embed index), whose values come back as stored
            added = {k: v for k, v in hit.explanation().items() if k not in node.metadata}
            node.metadata.update(added)
            for keys in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
                keys.extend(k for k in added if k not in keys)
        return node


# -- the retriever -----------------------------------------------------------------------------
class UIBKRetriever(BaseRetriever):
    """LlamaIndex retriever: hybrid MaxSim search with each hit's decomposition.

    Build it from ``vector_store=`` (a :class:`UIBKVectorStore`) or from ``encoder=`` and
    ``store=`` (a store of ``uibk_embedding.open_store``). ``similarity_top_k``, ``filters``
    (``MetadataFilters``) and ``dense_weight`` follow LlamaIndex's names; ``retrieval_mode``
    (``"hybrid"``, ``"dense"``, ``"tokens"``) picks the heads per retriever. Each
    ``NodeWithScore.score`` is the hit's relevance in [0, 1], the LangChain wrapper's scale
    (:func:`~uibk_embedding.integrations.core.relevance`); its node metadata adds the raw MaxSim
    ``score``, ``token_part``, ``dense_part`` and ``relevance``.

    >>> import uibk_embedding as ue
    >>> from llama_index.core.schema import TextNode
    >>> store = ue.open_store("exact")
    >>> vs = UIBKVectorStore(encoder=ue.load_encoder(), store=store)
    >>> _ = vs.add([TextNode(id_=i, text=t) for i, t in [("w", "wing lift"), ("b", "bread")]])
    >>> hits = UIBKRetriever(encoder=vs.core.encoder, store=store).retrieve("wing lift")
    >>> [n.node.node_id for n in hits], hits[0].score == hits[0].node.metadata["relevance"]
    (['w', 'b'], True)
    >>> f"{hits[0].score:.3f}"   # a perfect match up to float32 rounding: 1.8e-7 to 4.4e-7 below 1,
    ...                          # measured in other batches and thread counts
    '1.000'
    """

    def __init__(
        self,
        *,
        vector_store: UIBKVectorStore | None = None,
        encoder: Any = None,
        store: MultiVectorStore | None = None,
        similarity_top_k: int = DEFAULT_TOP_K,
        filters: MetadataFilters | None = None,
        dense_weight: float | None = None,
        text_key: str = DEFAULT_TEXT_KEY,
        callback_manager: CallbackManager | None = None,
        retrieval_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        if vector_store is not None:
            if store is not None and store is not vector_store.client:
                raise ValueError("give store= or vector_store=, not two different stores")
            if encoder is not None and encoder is not vector_store.core.encoder:
                raise ValueError("give encoder= or vector_store=, not two different encoders")
        elif store is not None:
            vector_store = UIBKVectorStore(encoder=encoder, store=store, text_key=text_key)
        else:
            raise ValueError("UIBKRetriever needs vector_store= (a UIBKVectorStore) or store= "
                             "(a uibk_embedding.open_store store) with encoder=")
        if isinstance(similarity_top_k, bool) or not isinstance(similarity_top_k, int) \
                or similarity_top_k <= 0:
            raise ValueError(f"similarity_top_k must be a positive int, got {similarity_top_k!r}")
        translate_filters(filters)  # refuse unsupported filters now, not at query time
        self._vector_store = vector_store
        self._similarity_top_k = similarity_top_k
        self._filters = filters
        self._dense_weight = dense_weight
        self._retrieval_mode = None if retrieval_mode is None else check_retrieval_mode(retrieval_mode)
        super().__init__(callback_manager=callback_manager, **kwargs)

    @property
    def vector_store(self) -> UIBKVectorStore:
        return self._vector_store

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        q = VectorStoreQuery(query_str=query_bundle.query_str, similarity_top_k=self._similarity_top_k,
                             filters=self._filters)
        res = self._vector_store.query(q, dense_weight=self._dense_weight,
                                       retrieval_mode=self._retrieval_mode)
        return [NodeWithScore(node=n, score=s) for n, s in zip(res.nodes or [], res.similarities or [],
                                                               strict=True)]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)
