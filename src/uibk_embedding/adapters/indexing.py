"""The one indexing loop: documents -> (encode in batches) -> upsert, with progress.

Every writer of many documents goes through :func:`upsert_batches`: ``uibk-embed index``, the
evaluation's ``index_into``, the Ray actors of ``index_distributed`` and the framework
integrations' ``add_texts``. It holds no policy of its own: the caller has checked the input
(one corpus reader, :func:`uibk_embedding.apps.data.read_corpus`) and built the metadata (one
convention, :func:`stored_metadata`).

Example
-------
>>> import uibk_embedding as ue
>>> enc, store = ue.load_encoder(), ue.open_store("exact")
>>> texts = ["lift of a wing", "a sourdough bread recipe", "laminar boundary layers"]
>>> upsert_batches(store, ["a", "b", "c"], [stored_metadata({}, text=t) for t in texts],
...                texts=texts, encode=enc.encode_documents, batch_size=2)
3
>>> store.count(), store.get(["b"])[0].metadata
(3, {'text': 'a sourdough bread recipe'})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from uibk_embedding.adapters.base import MultiVectorStore, check_positive

TEXT_KEY = "text"
TITLE_KEY = "title"


def stored_metadata(metadata: Mapping[str, Any] | None, *, text: str | None = None,
                    title: str | None = None) -> dict[str, Any]:
    """The metadata a document is stored with: its own, then its ``title`` and ``text`` under
    those keys when given (they win over metadata keys of the same name).

    This is what ``uibk-embed index`` has always written (and the integrations read ``text``
    back), so stores already on disk keep their meaning.

    >>> stored_metadata({"year": 1962, "text": "old"}, text="body", title="T")
    {'year': 1962, 'text': 'body', 'title': 'T'}
    >>> stored_metadata({"year": 1962})
    {'year': 1962}
    """
    out = dict(metadata or {})
    if title is not None:
        out[TITLE_KEY] = title
    if text is not None:
        out[TEXT_KEY] = text
    return out


def upsert_batches(
    store: MultiVectorStore,
    ids: Sequence[str],
    metadata: Sequence[Mapping[str, Any]] | None = None,
    *,
    vectors: Sequence[np.ndarray] | None = None,
    texts: Sequence[str] | None = None,
    encode: Callable[[Sequence[str]], Sequence[np.ndarray]] | None = None,
    batch_size: int = 256,
    progress: bool | None = False,
    desc: str | None = None,
) -> int:
    """Upsert ``ids`` into ``store`` ``batch_size`` at a time; returns how many were upserted.

    Give either the ``vectors`` (already encoded) or the ``texts`` and an ``encode`` function
    (e.g. ``encoder.encode_documents``), called once per batch, so no more than one batch of
    vectors is held at a time. ``progress``: a bar of documents (None: on a terminal only).

    >>> upsert_batches(None, ["a"], vectors=None, texts=None)
    Traceback (most recent call last):
    ...
    ValueError: give the vectors, or the texts and an encode function
    """
    if vectors is None and (texts is None or encode is None):
        raise ValueError("give the vectors, or the texts and an encode function")
    check_positive("batch_size", batch_size)
    n = len(ids)
    disable = {True: False, False: True}.get(progress, None)  # type: ignore[arg-type]
    label = desc or f"indexing into {getattr(store, 'backend', type(store).__name__)}"
    with tqdm(total=n, desc=label, unit="doc", disable=disable) as bar:
        for start in range(0, n, batch_size):
            sl = slice(start, start + batch_size)
            vecs = vectors[sl] if vectors is not None else encode(texts[sl])  # type: ignore[misc,index]
            store.upsert(list(ids[sl]), vecs, None if metadata is None else list(metadata[sl]))
            bar.update(len(ids[sl]))
    return n
