"""The code of a UIBK-Embedding model saved in PyLate's format (the custom modules).

:meth:`~uibk_embedding.encoder.base.TaggedEncoder.save_pylate` copies these files into the model
folder, where ``modules.json`` names the two modules (which import the other files), so that
``pylate.models.ColBERT(folder, trust_remote_code=True)`` (and through it MTEB and any tool that
loads PyLate models) runs them without this library:

* ``uibk_architecture.py``: the UIBK-v1 architecture (ModernBERT trunk, a token top and a
  dense top with latent-attention pooling, docs/model.md); :mod:`uibk_embedding.encoder.uibk`
  builds its models from it too, so the exported and the native model are one code;
* ``branched_transformer.py``: the first module (a sentence-transformers ``Transformer``):
  tokenises, runs the model once and gives the token states and the sentence vector;
* ``sentence_pooling.py``: sentence-transformers' pooling modes, which the first module and
  :class:`~uibk_embedding.encoder.pooling.PoolingSpec` share;
* ``hybrid_tokens.py``: the second module (a PyLate ``Dense``): the fixed projections ``R`` and
  ``R'`` and the tagged construction (docs/format.md#constants), so that ``ColBERT.encode`` returns the tagged
  lists themselves.

They import only torch, transformers, safetensors, sentence-transformers and pylate.
"""

from pathlib import Path

#: the files written into a PyLate model folder, in the order they are copied
FILES = ("uibk_architecture.py", "sentence_pooling.py", "branched_transformer.py", "hybrid_tokens.py")
FOLDER = Path(__file__).resolve().parent
