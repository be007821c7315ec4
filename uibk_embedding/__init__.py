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

import os as _os

try:
    from uibk_embedding.adapters import Hit, MultiVectorStore, open_store
    from uibk_embedding.encoder import TaggedFormat, decompose, load_encoder
except ModuleNotFoundError as e:  # a plain checkout: the subpackages are not mapped in yet
    if not (e.name or "").startswith("uibk_embedding."):
        raise
    _repo = _os.path.dirname(__path__[0])
    raise ImportError(
        f"uibk_embedding is imported from a plain checkout ({__path__[0]}) without its "
        f"subpackages ({e.name} is missing): they live in the top-level folders adapters/, "
        "encoder/, plaid_backend/, integrations/, testing/ and apps/, which pyproject.toml maps "
        "into the package when it is installed. Install it first: `make setup` (a .venv with "
        f"everything) or `pip install -e .` in {_repo}, then use that environment's python."
    ) from None

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
