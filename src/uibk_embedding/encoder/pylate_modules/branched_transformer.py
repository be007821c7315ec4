"""First module of a UIBK-Embedding PyLate model: tokenise, one forward pass, both heads.

A sentence-transformers ``Transformer`` (PyLate keeps only such modules as a model's first
module). ``forward`` adds to the features:

* ``token_embeddings`` ``(B, T, d)``: the token head (for ``architecture="uibk"``: the unit
  128-d vectors of the token top; for ``"transformer"``: the model's last hidden states);
* ``sentence_embedding`` ``(B, D)``: the dense head (latent-attention pooling of the dense top;
  or the pooling the source model declared: CLS, mean, ..., then normalised if it was).

Layouts (``hybrid_tokens.py`` builds the tagged list from them):

* ``"uibk"``: ``[CLS] marker prompt text... [SEP]`` is the model's input; PyLate inserts the
  marker (its ``query_prefix`` / ``document_prefix``), the prompt word is PyLate's prompt;
* ``"transformer"``: the model reads ``[CLS] text... [SEP]``; PyLate still inserts a marker at
  position 1, which this module removes before the model runs (it only tells a query from a
  document) and gives back as a zero state, so the positions PyLate sees are unchanged.

Written into the model folder by ``uibk_embedding``'s ``save_pylate``; imports only torch,
transformers, safetensors, sentence-transformers 5 (its ``Transformer``, whose ``tokenizer``
sentence-transformers 6 made a read-only property), PyLate and the folder's
``sentence_pooling.py`` and ``uibk_architecture.py``. Without PyLate, ``load_encoder`` reads such
a folder's files with ``tagged_modules.py`` instead (sentence-transformers 6).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pylate  # noqa: F401  (a PyLate model's module: PyLate 1.6 on sentence-transformers 5.3 runs it)
import torch
from safetensors.torch import load_file, save_file
from sentence_transformers.models import Transformer
from transformers import AutoConfig, AutoModel, AutoTokenizer

from .sentence_pooling import pool
from .uibk_architecture import UIBKModel

CONFIG_NAME = "branched_transformer.json"
WEIGHTS_NAME = "model.safetensors"


class BranchedTransformer(Transformer):
    """One trunk, two heads, one pass (see the module docstring).

    Parameters
    ----------
    folder: the model folder (``config.json``, ``model.safetensors``, the tokenizer files).
    architecture: ``"uibk"`` or ``"transformer"``.
    max_seq_length: tokens read (PyLate sets it per call from its query / document length).
    uibk: sizes of the UIBK tops (``top_layers``, ``num_latents``, ``latent_heads``,
        ``ff_mult``, ``token_dim``), for ``"uibk"``.
    pooling: ``{"modes": [...], "normalize": bool}``, for ``"transformer"``.
    strip_marker: remove the marker PyLate inserted at position 1 before the model runs.
    model_args: ``dtype`` / ``torch_dtype`` (e.g. ``torch.bfloat16``) for the weights.

    >>> import tempfile
    >>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
    >>> cfg = UIBKConfig.tiny()
    >>> folder = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["a wing"])).save_pylate(tempfile.mkdtemp())
    >>> m = BranchedTransformer.load(str(folder))
    >>> f = m(m.tokenize(["[P] a wing"]))
    >>> tuple(f["token_embeddings"].shape), tuple(f["sentence_embedding"].shape)
    ((1, 5, 128), (1, 32))
    """

    config_file_name = CONFIG_NAME
    save_in_root = True

    def __init__(self, folder: str, *, architecture: str, max_seq_length: int | None = None,
                 uibk: dict[str, Any] | None = None, pooling: dict[str, Any] | None = None,
                 strip_marker: bool = False, do_lower_case: bool = False,
                 model_args: dict[str, Any] | None = None, trust_remote_code: bool = False,
                 **_: Any) -> None:
        super(Transformer, self).__init__()  # not Transformer.__init__: this module loads its own model
        if architecture not in ("uibk", "transformer"):
            raise ValueError(f"architecture must be 'uibk' or 'transformer', got {architecture!r}")
        args = dict(model_args or {})
        dtype = args.get("dtype", args.get("torch_dtype"))
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        self.architecture = architecture
        self.uibk = dict(uibk or {})
        self.pooling = dict(pooling) if pooling else None
        self.strip_marker = bool(strip_marker)
        self.do_lower_case = bool(do_lower_case)
        self.backend = "torch"
        trust = trust_remote_code is True  # what the loader was given, passed on to transformers
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust)
        if architecture == "uibk":
            self.branches = UIBKModel(config, **self.uibk)
            self.branches.load_state_dict(load_file(os.path.join(folder, WEIGHTS_NAME)), strict=True)
            self.auto_model = self.branches.trunk  # what PyLate resizes and reads the config of
        else:
            self.auto_model = AutoModel.from_pretrained(folder, config=config, trust_remote_code=trust)
        if isinstance(dtype, torch.dtype):
            self.to(dtype)
        self.model_forward_params = {"input_ids", "attention_mask", "token_type_ids"}
        self.tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)
        self.max_seq_length = max_seq_length or int(config.max_position_embeddings)

    def get_config_dict(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "max_seq_length": self.max_seq_length,
                "uibk": self.uibk, "pooling": self.pooling, "strip_marker": self.strip_marker,
                "do_lower_case": self.do_lower_case}

    def __repr__(self) -> str:
        return f"BranchedTransformer({self.get_config_dict()})"

    def forward(self, features: dict[str, torch.Tensor], **kwargs: Any) -> dict[str, torch.Tensor]:
        ids, mask = features["input_ids"], features["attention_mask"]
        if self.architecture == "uibk":
            g, tok = self.branches(ids, mask)
        else:
            inputs = {k: v for k, v in features.items() if k in self.model_forward_params}
            if self.strip_marker:  # the marker only says query or document: the model never reads it
                inputs = {k: torch.cat([v[:, :1], v[:, 2:]], dim=1) for k, v in inputs.items()}
            states = self.auto_model(**inputs, return_dict=True).last_hidden_state
            pooling = self.pooling or {"modes": ["mean"], "normalize": True}
            g = pool(states.float(), inputs["attention_mask"], pooling["modes"],
                     bool(pooling.get("normalize")))
            tok = states.float()
            if self.strip_marker:  # back to PyLate's positions: a zero state where the marker was
                tok = torch.cat([tok[:, :1], torch.zeros_like(tok[:, :1]), tok[:, 1:]], dim=1)
        features["token_embeddings"] = tok
        features["sentence_embedding"] = g
        return features

    def get_word_embedding_dimension(self) -> int:
        if self.architecture == "uibk":
            return int(self.uibk.get("token_dim", 128))
        return int(self.auto_model.config.hidden_size)

    def save(self, output_path: str, safe_serialization: bool = True, **kwargs: Any) -> None:
        os.makedirs(output_path, exist_ok=True)
        if self.architecture == "uibk":
            self.auto_model.config.save_pretrained(output_path)
            state = {k: v.detach().float().cpu().contiguous() for k, v in self.branches.state_dict().items()}
            save_file(state, os.path.join(output_path, WEIGHTS_NAME))
        else:
            self.auto_model.save_pretrained(output_path, safe_serialization=True)
        self.tokenizer.save_pretrained(output_path)
        with open(os.path.join(output_path, CONFIG_NAME), "w") as f:
            json.dump(self.get_config_dict(), f, indent=2)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None,
             local_files_only: bool = False, model_kwargs: dict[str, Any] | None = None,
             **kwargs: Any) -> BranchedTransformer:
        folder = cls.load_dir_path(model_name_or_path, subfolder=subfolder, token=token,
                                   cache_folder=cache_folder, revision=revision,
                                   local_files_only=local_files_only)
        with open(os.path.join(folder, CONFIG_NAME)) as f:
            config = json.load(f)
        config.pop("trust_remote_code", None)  # the caller's choice, not the file's
        return cls(folder, model_args=model_kwargs, trust_remote_code=kwargs.get("trust_remote_code") is True,
                   **config)
