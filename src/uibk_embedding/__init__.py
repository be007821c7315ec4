"""uibk-embedding: dense + late-interaction retrieval from one tagged multi-vector list.

Quick start (embedded default encoder, exact store)::

    >>> import uibk_embedding as ue
    >>> enc = ue.load_encoder()
    >>> store = ue.open_store("exact")
    >>> texts = ["the wing lift in a propeller slipstream", "boundary layer transition"]
    >>> store.upsert(["a", "b"], enc.encode_documents(texts))
    >>> hit = store.search(enc.encode_queries(["slipstream lift"])[0], k=1, explain=True)[0]
    >>> hit.id, hit.decomposition.separated
    ('a', True)
"""

from uibk_embedding.adapters import Hit, MultiVectorStore, open_store
from uibk_embedding.encoder import TaggedFormat, decompose, load_encoder

__version__ = "0.3.0"  # as pyproject.toml
__all__ = [
    "Hit",
    "MultiVectorStore",
    "TaggedFormat",
    "__version__",
    "decompose",
    "load_encoder",
    "open_store",
]
