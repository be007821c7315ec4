"""Encode a collection once (cached), index it into any backend, and score it.

The fused ranking comes from the backend's own search. The dense-only and token-only rankings
are computed exactly from the same vectors: dense = cosine of the slot bodies (the mean of the
three ``g_s . g'_s``), tokens = MaxSim of query token rows over document token rows.

Example
-------
>>> import numpy as np
>>> from uibk_embedding.tagged import TaggedFormat
>>> fmt, rng = TaggedFormat(), np.random.default_rng(0)
>>> q = fmt.build(rng.normal(size=(3, 127)), rng.normal(size=(2, 127)))
>>> bool(np.allclose(with_dense_weight(q, 2.0)[:3], 2 * q[:3]))
True
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.adapters.base import MultiVectorStore
from uibk_embedding.adapters.indexing import upsert_batches
from uibk_embedding.apps.data import Collection, load_beir
from uibk_embedding.encoder.composed import model_digest
from uibk_embedding.maxsim import maxsim_scores, pack, top_k
from uibk_embedding.metrics import evaluate
from uibk_embedding.tagged import N_SLOTS, apply_dense_weight, dense_vector


def cache_dir() -> Path:
    """Where encoded collections are cached (``$UIBK_CACHE`` or ``~/.cache/uibk_embedding``)."""
    return Path(os.environ.get("UIBK_CACHE", Path.home() / ".cache" / "uibk_embedding"))


def with_dense_weight(query: np.ndarray, w: float) -> np.ndarray:
    """The same query list with its slots rescaled to dense weight ``w`` (no re-encoding)."""
    q = np.array(query, dtype=np.float32, copy=True)
    n = np.linalg.norm(q[:N_SLOTS], axis=1, keepdims=True)
    q[:N_SLOTS] = apply_dense_weight(q[:N_SLOTS] / n, w)
    return q


@dataclass
class Encoded:
    doc_ids: list[str]
    docs: list[np.ndarray]
    query_ids: list[str]
    queries: list[np.ndarray]  # at dense weight 1


def collection_fingerprint(config: dict[str, Any], coll: Collection, length: int = 24) -> str:
    """A hex digest of an encoder configuration and a collection's texts (ids, documents,
    queries): the key of cached encodings.

    >>> from uibk_embedding.apps.data import Document
    >>> c = Collection("c", [Document("d1", "a wing")], {"q1": "wing"}, {})
    >>> collection_fingerprint({"model": "m"}, c) == collection_fingerprint({"model": "m"}, c)
    True
    >>> collection_fingerprint({"model": "m"}, c) != collection_fingerprint({"model": "n"}, c)
    True
    """
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True).encode())
    for d in coll.corpus:
        h.update(d.id.encode() + b"\0" + d.full_text.encode() + b"\0")
    for q, t in coll.queries.items():
        h.update(q.encode() + b"\1" + t.encode() + b"\1")
    return h.hexdigest()[:length]


def _fingerprint(encoder: Any, coll: Collection) -> str:
    cfg = encoder.config() if hasattr(encoder, "config") else {"repr": repr(encoder)}
    cfg = {k: v for k, v in cfg.items() if k != "dense_weight"}
    return collection_fingerprint({**cfg, "weights": weights_digest(encoder, cfg)}, coll)


def weights_digest(encoder: Any, cfg: dict[str, Any]) -> str | None:
    """What the encoder computes with, by content, for the cache key: a configuration names
    a model folder by its path (retrained weights in the same folder reused the old vectors),
    so the folder's files are hashed (:func:`~uibk_embedding.encoder.composed.model_digest`),
    else the loaded module's parameters; ``None`` when neither is there (a remote encoder)."""
    folder = cfg.get("model")
    if isinstance(folder, str) and os.path.isdir(folder):
        return model_digest(folder)
    state = getattr(getattr(encoder, "model", None), "state_dict", None)
    if state is None:
        return None
    import torch

    h = hashlib.sha256()
    for name, t in sorted(state().items()):
        h.update(name.encode() + str(tuple(t.shape)).encode() + str(t.dtype).encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _save(path: Path, lists: Sequence[np.ndarray], ids: Sequence[str], prefix: str, out: dict):
    mat, off = pack(list(lists))
    out[f"{prefix}_mat"] = mat.astype(np.float32)
    out[f"{prefix}_off"] = off
    out[f"{prefix}_ids"] = np.array(json.dumps(list(ids)))


def _load(z, prefix: str) -> tuple[list[str], list[np.ndarray]]:
    mat, off = z[f"{prefix}_mat"], z[f"{prefix}_off"]
    return json.loads(str(z[f"{prefix}_ids"])), [mat[off[i]:off[i + 1]] for i in range(len(off) - 1)]


def encode_collection(encoder: Any, coll: Collection, *, use_cache: bool = True,
                      on_batch: Callable[[int], None] | None = None, batch_size: int = 1024) -> Encoded:
    """Encode corpus and queries (queries at dense weight 1), cached on disk by content.

    ``on_batch``: called with the number of documents after each ``batch_size`` of them is
    encoded (progress where no bar shows); without it the corpus is encoded in one call."""
    path = cache_dir() / f"{coll.name}-{_fingerprint(encoder, coll)}.npz"
    if use_cache and path.exists():
        with np.load(path, allow_pickle=False) as z:
            dids, docs = _load(z, "doc")
            qids, qs = _load(z, "query")
        return Encoded(dids, docs, qids, qs)
    texts = [d.full_text for d in coll.corpus]
    if on_batch is None:
        docs = encoder.encode_documents(texts)
    else:
        docs = []
        for start in range(0, len(texts), batch_size):
            docs.extend(encoder.encode_documents(texts[start:start + batch_size], show_progress=False))
            on_batch(len(texts[start:start + batch_size]))
    qids = list(coll.queries)
    qs = encoder.encode_queries([coll.queries[q] for q in qids], dense_weight=1.0)
    enc = Encoded([d.id for d in coll.corpus], docs, qids, qs)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        _save(path, docs, enc.doc_ids, "doc", arrays)
        _save(path, qs, qids, "query", arrays)
        tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    return enc


def encode_beir(folder: str | os.PathLike, encoder: Any) -> tuple[Collection, Encoded, list[np.ndarray]]:
    """A BEIR folder loaded and encoded by ``encoder`` (cached: :func:`encode_collection`), with
    its queries at the encoder's dense weight; the encoder's truncation warnings are silenced.

    >>> from uibk_embedding.encoder import load_encoder
    >>> coll, base, queries = encode_beir("../shared/datasets/limit-small", load_encoder())  # doctest: +SKIP
    >>> len(base.docs), len(queries)  # doctest: +SKIP
    (46, 1000)
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coll = load_beir(folder)
        base = encode_collection(encoder, coll)
    return coll, base, [with_dense_weight(q, encoder.dense_weight) for q in base.queries]


def encode_queries_for_store(encoder: Any, coll: Collection, store: MultiVectorStore,
                             batch_size: int = 1000) -> tuple[Encoded, list[str]]:
    """The collection's queries encoded (at dense weight 1) and the documents read back from
    ``store`` (its stored vectors): the evaluation of an existing store, which encodes no
    document and writes nothing. Also returns the ids the qrels name that the store lacks.

    >>> import numpy as np
    >>> from uibk_embedding.adapters.registry import open_store
    >>> from uibk_embedding.apps.data import Document
    >>> from uibk_embedding.encoder import load_encoder
    >>> enc = load_encoder()
    >>> store = open_store("exact", format=enc.format)
    >>> store.upsert(["d1"], enc.encode_documents(["a wing"]))
    >>> coll = Collection("c", [Document("d1", "a wing")], {"q1": "wing"}, {"q1": {"d1": 1, "d2": 1}})
    >>> encoded, missing = encode_queries_for_store(enc, coll, store)
    >>> encoded.doc_ids, encoded.query_ids, missing, store.count()
    (['d1'], ['q1'], ['d2'], 1)
    """
    doc_ids: list[str] = []
    docs: list[np.ndarray] = []
    page: list[str] = []
    for doc_id, _md in store.scan(batch_size=batch_size):
        page.append(doc_id)
        if len(page) == batch_size:
            _read_vectors(store, page, doc_ids, docs)
            page = []
    _read_vectors(store, page, doc_ids, docs)
    qids = list(coll.queries)
    qs = encoder.encode_queries([coll.queries[q] for q in qids], dense_weight=1.0)
    stored = set(doc_ids)
    named = sorted({d for rel in coll.qrels.values() for d in rel})
    return Encoded(doc_ids, docs, qids, list(qs)), [d for d in named if d not in stored]


def _read_vectors(store: MultiVectorStore, ids: list[str], doc_ids: list[str],
                  docs: list[np.ndarray]) -> None:
    if ids:
        for rec in store.get(ids):
            doc_ids.append(rec.id)
            docs.append(np.asarray(rec.vectors, dtype=np.float32))


def index_into(store: MultiVectorStore, enc: Encoded, coll: Collection | None = None,
               batch_size: int = 512, show_progress: bool | None = None) -> None:
    """Upsert every encoded document into ``store`` in batches, with a progress bar
    (:func:`~uibk_embedding.adapters.indexing.upsert_batches`), stored with the metadata
    ``uibk-embed index`` writes (its own, title and text) when ``coll`` is given."""
    md = {d.id: d.stored_metadata() for d in coll.corpus} if coll else {}
    upsert_batches(store, enc.doc_ids, [md.get(x, {}) for x in enc.doc_ids], vectors=enc.docs,
                   batch_size=batch_size, progress=show_progress)


def _rank(scores: np.ndarray, ids: Sequence[str], k: int) -> list[str]:
    return [ids[i] for i in top_k(scores, k)]


def head_runs(enc: Encoded, k: int = 100) -> dict[str, dict[str, list[str]]]:
    """Exact dense-only and token-only rankings."""
    dq = np.stack([dense_vector(q) for q in enc.queries])
    dd = np.stack([dense_vector(d) for d in enc.docs])
    dense = dq @ dd.T
    tok_mat, tok_off = pack([d[N_SLOTS:] for d in enc.docs])
    tok = maxsim_scores([q[N_SLOTS:] for q in enc.queries], tok_mat, tok_off)
    return {
        "dense": {q: _rank(dense[i], enc.doc_ids, k) for i, q in enumerate(enc.query_ids)},
        "tokens": {q: _rank(tok[i], enc.doc_ids, k) for i, q in enumerate(enc.query_ids)},
    }


def fused_run(store: MultiVectorStore, enc: Encoded, dense_weight: float,
              k: int = 100) -> dict[str, list[str]]:
    """The backend's own MaxSim ranking of every query at dense weight ``dense_weight``."""
    qs = [with_dense_weight(q, dense_weight) for q in enc.queries]
    hits = store.search_batch(qs, k=k)
    return {q: [h.id for h in hs] for q, hs in zip(enc.query_ids, hits, strict=True)}


def run_eval(coll: Collection, enc: Encoded, store: MultiVectorStore,
             dense_weight: float) -> dict[str, Any]:
    """The JSON object of `uibk-embed eval --json` (hybrid mode; ``--retrieval-mode`` replaces its
    ``fused`` run)."""
    heads = head_runs(enc)
    fused = fused_run(store, enc, dense_weight)
    return {
        "dataset": coll.name,
        "backend": store.backend,
        "dense_weight": dense_weight,
        "metrics": {
            "fused": evaluate(fused, coll.qrels),
            "dense": evaluate(heads["dense"], coll.qrels),
            "tokens": evaluate(heads["tokens"], coll.qrels),
        },
    }
