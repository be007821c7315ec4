"""Tiny ColBERT model folders for tests, in the two formats sentence-transformers 6 loads.

* :func:`pylate_colbert` writes what ``pylate.models.ColBERT(...).save(folder)`` (PyLate 1.6)
  writes -- ``modules.json`` naming ``sentence_transformers.models.Transformer`` and
  ``pylate.models.Dense.Dense``, PyLate's keys in ``config_sentence_transformers.json``
  (``model_type`` ColBERT, ``query_prefix`` ``"[Q] "``, ``query_length``, the punctuation
  ``skiplist_words``, ``do_query_expansion``), the markers added to the tokenizer and the
  embeddings resized, ``[MASK]`` as the pad token, a ``1_Dense`` projection -- without PyLate,
  which no longer installs beside sentence-transformers 6. ``tests/test_composed.py`` compares
  this layout with a real PyLate save where PyLate is installed.
* :func:`st6_colbert` is the classic ColBERT recipe saved by sentence-transformers 6 itself
  (``Transformer`` with ``[MASK]`` query expansion, token-level ``Dense``, ``MultiVectorMask``
  with the punctuation skiplist, ``Normalize``; ``"[Q] "`` / ``"[D] "`` prompts).

Both start from a Hugging Face BERT folder (:func:`~uibk_embedding.testing.tiny_models.tiny_bert`)
and draw the projection from ``seed``.

>>> import tempfile, string, json
>>> from pathlib import Path
>>> from uibk_embedding.testing.tiny_models import SPECIAL, tiny_bert
>>> root = Path(tempfile.mkdtemp())
>>> tiny_bert(root / "bert", [*SPECIAL, *string.ascii_lowercase], seed=0)
>>> folder = pylate_colbert(root / "colbert", root / "bert", seed=1)
>>> [m["type"] for m in json.loads((folder / "modules.json").read_text())]
['sentence_transformers.models.Transformer', 'pylate.models.Dense.Dense']
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path


def pylate_colbert(folder: str | os.PathLike, backbone: str | os.PathLike, *, seed: int = 0,
                   query_length: int = 16, document_length: int = 40, embedding_size: int = 128,
                   query_prefix: str = "[Q] ", document_prefix: str = "[D] ",
                   do_query_expansion: bool = True) -> Path:
    """Write a PyLate 1.6 ColBERT folder over the BERT at ``backbone`` (see the module docstring)
    and return it."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(backbone))
    model = AutoModel.from_pretrained(str(backbone))
    added = [p for p in (query_prefix, document_prefix) if p and p not in tok.get_vocab()]
    if added:  # PyLate adds its markers as tokens and resizes the embeddings
        tok.add_tokens(added)
        model.resize_token_embeddings(len(tok), mean_resizing=False)
    tok.pad_token = tok.mask_token  # PyLate pads queries with [MASK]
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    hidden = int(model.config.hidden_size)
    (out / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": int(model.config.max_position_embeddings), "do_lower_case": False}, indent=4))
    dense = out / "1_Dense"
    dense.mkdir(exist_ok=True)
    (dense / "config.json").write_text(json.dumps(
        {"in_features": hidden, "out_features": embedding_size, "bias": False,
         "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}, indent=4))
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.rand(embedding_size, hidden, generator=gen) * 2 - 1) / hidden ** 0.5
    save_file({"linear.weight": weight.contiguous()}, str(dense / "model.safetensors"))
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}], indent=2))
    (out / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "ColBERT",
        "__version__": {"sentence_transformers": "5.3.0", "transformers": "5.3.0", "pytorch": "2.11.0"},
        "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
        "similarity_fn_name": "MaxSim", "query_prefix": query_prefix, "document_prefix": document_prefix,
        "query_length": query_length, "document_length": document_length,
        "attend_to_expansion_tokens": False, "skiplist_words": list(string.punctuation),
        "do_query_expansion": do_query_expansion}, indent=2))
    return out


def st6_colbert(folder: str | os.PathLike, backbone: str | os.PathLike, *, seed: int = 0,
                query_length: int = 16, document_length: int = 40, embedding_size: int = 128) -> Path:
    """Save the classic ColBERT recipe over the BERT at ``backbone`` with sentence-transformers 6
    (``MultiVectorEncoder.save_pretrained``) and return the folder."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    transformer = Transformer(str(backbone), document_length=document_length,
                              query_expansion={"strategy": "fixed", "length": query_length})
    torch.manual_seed(seed)
    dense = Dense(in_features=transformer.get_embedding_dimension(), out_features=embedding_size,
                  bias=False, activation_function=torch.nn.Identity(), module_input_name="token_embeddings")
    model = MultiVectorEncoder(
        modules=[transformer, dense, MultiVectorMask(skiplist_words=list(string.punctuation)),
                 Normalize(module_input_name="token_embeddings")],
        prompts={"query": "[Q] ", "document": "[D] "}, device="cpu")
    model.save_pretrained(str(folder))
    return Path(folder)


__all__ = ["pylate_colbert", "st6_colbert"]
