"""The code of a UIBK-Embedding model saved as a model folder with custom modules.

Two exports copy these files into the model folder, where ``modules.json`` names two modules
(which import the other files), so that other tools run the model without this library:

* sentence-transformers 6 (:func:`~uibk_embedding.encoder.pylate_model.save_sentence_transformers`):
  ``sentence_transformers.MultiVectorEncoder(folder, trust_remote_code=True)`` runs
  ``tagged_modules.py`` (``TaggedInput``: tokenise as the native encoder, one pass, both heads;
  ``TaggedLists``: ``R``, ``R'`` and the tagged construction), so that ``encode_query`` /
  ``encode_document`` return the tagged lists; ``load_encoder`` runs the same modules;
* PyLate (:func:`~uibk_embedding.encoder.pylate_model.save_pylate`):
  ``pylate.models.ColBERT(folder, trust_remote_code=True)`` (and through it MTEB and any tool that
  loads PyLate models) runs ``branched_transformer.py`` (a sentence-transformers 5 ``Transformer``:
  tokenises, runs the model once and gives the token states and the sentence vector) and
  ``hybrid_tokens.py`` (a PyLate ``Dense``: the fixed projections and the tagged construction),
  so that ``ColBERT.encode`` returns the tagged lists. These two need PyLate's environment
  (PyLate pins sentence-transformers 5.3); without it, ``load_encoder`` reads such a folder's
  files with ``tagged_modules.py``.

Both share ``uibk_architecture.py`` (the UIBK-v1 architecture: ModernBERT trunk, a token top and a
dense top with latent-attention pooling, docs/model.md; :mod:`uibk_embedding.encoder.uibk` builds
its models from it too, so the exported and the native model are one code) and
``sentence_pooling.py`` (sentence-transformers' pooling modes, shared with
:class:`~uibk_embedding.encoder.pooling.PoolingSpec`). They import only torch, transformers,
tokenizers, safetensors, sentence-transformers and (the PyLate modules) PyLate.
"""

from pathlib import Path

#: the files written into a PyLate model folder, in the order they are copied (the
#: sentence-transformers 6 export's: pylate_model.ST_FILES)
FILES = ("uibk_architecture.py", "sentence_pooling.py", "branched_transformer.py", "hybrid_tokens.py")
FOLDER = Path(__file__).resolve().parent
