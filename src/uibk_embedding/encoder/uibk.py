"""UIBK-Embedding-v1: the ModernBERT architecture with a token top and a dense top (docs/model.md).

One trunk, two tops, one forward pass:

* the ModernBERT trunk (``transformers``) runs its first ``N - 4`` layers once (shared);
* the **token top** is the trunk's last 4 layers + final norm + ``Linear(hidden -> 128)``,
  normalised: one 128-d vector per token, reduced to 127-d by the fixed ``R'`` (the base
  class's ``P``) and renormalised;
* the **dense top** is a second copy of the last 4 layers + its own final norm + NV-Embed style
  latent-attention pooling (the token states attend to ``L`` trainable latents, then a
  feed-forward layer, then the mean over tokens): the sentence vector ``g`` (``hidden``-d),
  split by the fixed ``R`` (381 x hidden) into the three slot vectors.

Every text is read as ``[CLS] marker prompt text... [SEP]``; the three slots take the place of
the first three positions, so a tagged list has ``3 + n_text_tokens`` rows. Queries: the model
reads up to 256 tokens, the first 64 text tokens take part in token matching; documents: up to
2048 tokens (or the trunk's maximum if lower).

A saved encoder is a folder in this library's own layout (:meth:`UIBKEncoder.save_pretrained`,
:meth:`UIBKEncoder.from_pretrained`); it is not the released checkpoint's format: the release is a
PyLate model folder (docs/model.md), loaded by ``load_encoder(folder, trust_remote_code=True)``
(:mod:`uibk_embedding.encoder.pylate_model`), and :meth:`UIBKEncoder.save_pylate` writes a model
of this architecture in that format::

    uibk_encoder.json   kind "uibk", format, caps, dense weight, the "model" block (UIBKConfig)
    config.json         the ModernBERT trunk configuration (Hugging Face format)
    model.safetensors   all weights (trunk.*, dense_layers.*, dense_norm.*, pooler.*, token_proj.*)
    tokenizer.json      a ``tokenizers`` tokenizer holding the marker and prompt tokens
    projections.npz     the fixed matrices R (381 x hidden) and R' (127 x 128), saved as R and P

Example
-------
>>> import tempfile
>>> cfg = UIBKConfig.tiny()
>>> enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["a wing in a slipstream"] * 4), seed=0)
>>> d = enc.encode_documents(["a wing in a slipstream"])[0]
>>> d.shape[1], int((d[:, 0] < 0).sum())
(128, 3)
>>> with tempfile.TemporaryDirectory() as tmp:
...     _ = enc.save_pretrained(tmp)
...     again = UIBKEncoder.from_pretrained(tmp)
...     bool((again.encode_documents(["a wing in a slipstream"])[0] == d).all())
True
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.encoder.base import TaggedEncoder
from uibk_embedding.encoder.fixed_projections import CONFIG_NAME, PROJECTIONS_NAME
from uibk_embedding.encoder.inputs import resolve_device, resolve_dtype
from uibk_embedding.encoder.padding import TokenBatch, pad_ids
from uibk_embedding.encoder.projection import load_projections, projection_id, refuse_other_kind
from uibk_embedding.tagged import TaggedFormat

WEIGHTS_NAME = "model.safetensors"
BACKBONE_CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
REQUIRED_FILES = (CONFIG_NAME, BACKBONE_CONFIG_NAME, WEIGHTS_NAME, TOKENIZER_NAME, PROJECTIONS_NAME)
N_PREFIX = 3  # [CLS], marker, prompt word: the positions the three slots take


@dataclass
class UIBKConfig:
    """Sizes and special tokens of a UIBK model; the trunk is a ModernBERT configuration.

    Parameters
    ----------
    backbone: keyword arguments of ``transformers.ModernBertConfig`` (``{}``: ModernBERT-base,
        22 layers, hidden 768).
    top_layers: layers in each top (the last ``top_layers`` of the trunk form the token top; the
        dense top is a second copy of them).
    num_latents, latent_heads, ff_mult: latent-attention pooling (latents, attention heads,
        feed-forward expansion).
    token_dim: output size of the token head (128).
    query_marker, document_marker, prompt_word: tokens at positions 2 and 3 of every input;
        each must be one entry of the tokenizer's vocabulary.

    >>> cfg = UIBKConfig()
    >>> cfg.backbone_config().num_hidden_layers, cfg.num_latents, cfg.token_dim
    (22, 512, 128)
    """

    backbone: dict[str, Any] = field(default_factory=dict)
    top_layers: int = 4
    num_latents: int = 512
    latent_heads: int = 8
    ff_mult: int = 4
    token_dim: int = 128
    query_marker: str = "[Q]"
    document_marker: str = "[D]"
    prompt_word: str = "[P]"

    def __post_init__(self) -> None:
        bc = self.backbone_config()
        n, h = int(bc.num_hidden_layers), int(bc.hidden_size)
        if not 1 <= self.top_layers < n:
            raise ValueError(f"top_layers must be in [1, {n - 1}] for a {n}-layer trunk, "
                             f"got {self.top_layers}")
        if self.num_latents < 1 or self.latent_heads < 1 or self.ff_mult < 1 or self.token_dim < 2:
            raise ValueError("num_latents, latent_heads, ff_mult must be >= 1 and token_dim >= 2")
        if h % self.latent_heads:
            raise ValueError(f"hidden size {h} is not a multiple of latent_heads={self.latent_heads}")

    @classmethod
    def released(cls) -> UIBKConfig:
        """The configuration of the released UIBK-Embedding-v1 (ModernBERT-base trunk)."""
        return cls()

    @classmethod
    def tiny(cls, **backbone: Any) -> UIBKConfig:
        """A very small configuration for tests and examples (6 layers, hidden 32).

        >>> UIBKConfig.tiny().backbone_config().hidden_size
        32
        """
        bb = dict(vocab_size=512, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                  num_attention_heads=2, max_position_embeddings=2048, local_attention=16,
                  pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3)
        bb.update(backbone)
        return cls(backbone=bb, num_latents=16, latent_heads=2, ff_mult=2)

    def backbone_config(self):
        """The trunk's ``transformers.ModernBertConfig``."""
        from transformers import ModernBertConfig

        return ModernBertConfig(**self.backbone)

    def to_dict(self) -> dict[str, Any]:
        """The ``model`` block of ``uibk_encoder.json`` (the backbone goes to config.json)."""
        d = asdict(self)
        d.pop("backbone")
        return d

    @classmethod
    def from_dict(cls, block: dict[str, Any], backbone: dict[str, Any]) -> UIBKConfig:
        known = {f.name for f in fields(cls)} - {"backbone"}
        unknown = sorted(set(block) - known)
        if unknown:
            raise ValueError(f"unknown UIBK model settings {unknown}; known: {sorted(known)}")
        return cls(backbone=dict(backbone), **block)


# -- parameter counts ------------------------------------------------------------------------
def _layer_params(h: int, inter: int, first: bool, norm_bias: bool, attn_bias: bool,
                  mlp_bias: bool) -> int:
    ln = h * (2 if norm_bias else 1)
    attn = h * 3 * h + (3 * h if attn_bias else 0) + h * h + (h if attn_bias else 0)
    mlp = h * 2 * inter + (2 * inter if mlp_bias else 0) + inter * h + (h if mlp_bias else 0)
    return attn + mlp + ln + (0 if first else ln)


def param_counts(config: UIBKConfig) -> dict[str, int]:
    """Parameters of each part, computed from the configuration alone (no weights).

    Returns ``backbone`` (the ModernBERT trunk, token top included), ``dense_top`` (the copied
    layers and their norm), ``pooling_projection`` (latent-attention pooling + the token head's
    linear layer) and ``total``.

    >>> c = param_counts(UIBKConfig.released())
    >>> [round(c[k] / 1e6, 1) for k in ("total", "backbone", "dense_top", "pooling_projection")]
    [179.0, 149.0, 20.1, 9.9]
    """
    bc = config.backbone_config()
    h, inter, n = int(bc.hidden_size), int(bc.intermediate_size), int(bc.num_hidden_layers)
    nb, ab, mb = bool(bc.norm_bias), bool(bc.attention_bias), bool(bc.mlp_bias)
    ln = h * (2 if nb else 1)
    layers = [_layer_params(h, inter, i == 0, nb, ab, mb) for i in range(n)]
    backbone = int(bc.vocab_size) * h + ln + sum(layers) + ln
    dense_top = sum(layers[n - config.top_layers:]) + ln
    m = config.ff_mult * h
    pooling = (config.num_latents * h + 3 * 2 * h  # latents, three LayerNorms with bias
               + h * h + h * 2 * h + h * h + h  # to_q, to_kv, to_out (+ bias)
               + h * 2 * m + 2 * m + m * h + h)  # feed-forward (GEGLU)
    projection = h * config.token_dim + config.token_dim
    return {
        "backbone": backbone,
        "dense_top": dense_top,
        "pooling": pooling,
        "token_projection": projection,
        "pooling_projection": pooling + projection,
        "total": backbone + dense_top + pooling + projection,
    }


# -- the model ---------------------------------------------------------------------------------
def _build_model(config: UIBKConfig):
    """The torch module of ``config`` (the architecture lives in
    :mod:`uibk_embedding.encoder.pylate_modules.uibk_architecture`, the file a PyLate export
    carries, so the native and the exported model are one code)."""
    from uibk_embedding.encoder.pylate_modules.uibk_architecture import UIBKModel

    return UIBKModel(config.backbone_config(), top_layers=config.top_layers,
                     num_latents=config.num_latents, latent_heads=config.latent_heads,
                     ff_mult=config.ff_mult, token_dim=config.token_dim)


# -- tokenizer -------------------------------------------------------------------------------
def train_tokenizer(config: UIBKConfig, texts: Iterable[str], vocab_size: int | None = None):
    """Train a small WordPiece ``tokenizers.Tokenizer`` whose special tokens fit ``config``.

    Ids 0-4 are ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (the ids of :meth:`UIBKConfig.tiny`), then
    the two markers and the prompt word. For tests and examples: a released checkpoint ships
    its own tokenizer.

    >>> tok = train_tokenizer(UIBKConfig.tiny(), ["flow over a flat plate"])
    >>> tok.token_to_id("[CLS]"), tok.token_to_id("[Q]")
    (2, 5)
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    bc = config.backbone_config()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
               config.query_marker, config.document_marker, config.prompt_word]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size or int(bc.vocab_size),
                                        special_tokens=special, show_progress=False)
    tok.train_from_iterator(list(texts), trainer)
    if tok.get_vocab_size() > bc.vocab_size:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} entries, the trunk only {bc.vocab_size}")
    return tok


# -- the encoder -----------------------------------------------------------------------------
def weights_digest(model: Any, tokenizer: Any) -> str:
    """A short content hash of a model's weights (each tensor by name, rounded to bfloat16) and its
    tokenizer's vocabulary: the same for a checkpoint and its copies saved and loaded again, on
    any device and dtype, different for other weights. Rounded to bfloat16 because a model run
    in bfloat16 (on a GPU) and saved again (``index --fit-projection`` saves the whole checkpoint)
    holds its weights rounded so: still the model that made the store's lists.

    >>> cfg = UIBKConfig.tiny()
    >>> tok = train_tokenizer(cfg, ["a b"])
    >>> a, b = (weights_digest(_build_model(cfg), tok) for _ in range(2))
    >>> len(a), a == b  # freshly initialised weights differ
    (16, False)
    """
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        a = t.detach().to(device="cpu", dtype=torch.bfloat16).to(torch.float32).contiguous().numpy()
        h.update(f"{name}\0{a.shape}\0".encode())
        h.update(memoryview(a).cast("B"))
    h.update(json.dumps(sorted(tokenizer.get_vocab(with_added_tokens=True).items())).encode())
    return h.hexdigest()[:16]


class UIBKEncoder(TaggedEncoder):
    """UIBK-Embedding-v1 as a tagged encoder (one forward pass gives both heads).

    Build it with :meth:`from_pretrained` (a saved folder) or :meth:`random` (random weights,
    for tests and benchmarks). On a GPU the weights are cast to bfloat16, on CPU they stay
    float32; the outputs are always float32.

    Parameters
    ----------
    model: the torch module built from ``config``.
    tokenizer: a ``tokenizers.Tokenizer`` holding the marker and prompt tokens.
    config: the :class:`UIBKConfig`.
    device: ``"cuda"``, ``"cpu"``, ... (default: CUDA when present, else CPU).
    dtype: ``"bfloat16"`` or ``"float32"`` (default: bfloat16 on CUDA, float32 otherwise).
    num_threads: CPU threads for torch (``torch.set_num_threads``); None leaves it alone.
    name: a name for reports (default ``"uibk"``; :meth:`from_pretrained` uses the folder,
        :meth:`random` ``"uibk-random"``).
    **kwargs: see :class:`~uibk_embedding.encoder.base.TaggedEncoder` (format, seed,
        projections, dense_weight, query_token_cap, query_max_length, doc_max_length, batch_tokens).

    >>> cfg = UIBKConfig.tiny()
    >>> enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["lift of a wing"]))
    >>> q = enc.encode_queries(["lift of a wing"])[0]
    >>> q.shape  # 3 slots + 4 text tokens
    (7, 128)
    """

    kind = "uibk"

    def __init__(self, model: Any, tokenizer: Any, config: UIBKConfig, *, device: str | None = None,
                 dtype: str | None = None, num_threads: int | None = None, name: str | None = None,
                 **kwargs: Any) -> None:
        import torch

        if num_threads:
            torch.set_num_threads(int(num_threads))
        self.uibk_config = config
        bc = config.backbone_config()
        self._model_id = weights_digest(model, tokenizer)  # the same on any device and dtype
        self.device = resolve_device(device)
        self.dtype = dtype = resolve_dtype(self.device, dtype)
        self.model = model.to(device=self.device, dtype=getattr(torch, dtype)).eval()
        self.model_name = name or "uibk"
        self.tokenizer = tokenizer.__class__.from_str(tokenizer.to_str())  # private copy
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self._cutting: dict[int, Any] = {}  # private copies cutting at a limit, one per limit
        self._cutting_lock = threading.Lock()
        self._ids = self._special_ids(bc)
        self.model_max_length = int(bc.max_position_embeddings)
        kwargs.setdefault("batch_tokens", 8192 if self.device == "cpu" else 65536)
        super().__init__(int(bc.hidden_size), config.token_dim, **kwargs)
        self.doc_max_length = min(self.doc_max_length, self.model_max_length)
        self.query_max_length = min(self.query_max_length, self.model_max_length)
        if min(self.doc_max_length, self.query_max_length) <= N_PREFIX + 1:
            raise ValueError("length limits must leave room for the 3 prefix tokens and [SEP]")

    def _special_ids(self, bc: Any) -> dict[str, int]:
        cfg = self.uibk_config
        ids: dict[str, int] = {}
        for role, tok in [("query_marker", cfg.query_marker), ("document_marker", cfg.document_marker),
                          ("prompt_word", cfg.prompt_word)]:
            i = self.tokenizer.token_to_id(tok)
            if i is None:
                raise ValueError(
                    f"{role} {tok!r} is not one entry of the tokenizer's vocabulary; add it to "
                    f"tokenizer.json (as an added token) or set {role} in {CONFIG_NAME}")
            ids[role] = i
        for role in ("cls_token_id", "sep_token_id", "pad_token_id"):
            v = getattr(bc, role, None)
            if v is None:
                raise ValueError(f"the trunk config.json has no {role}")
            ids[role] = int(v)
        size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        if size > bc.vocab_size:
            raise ValueError(f"tokenizer has {size} entries but the trunk's vocab_size is {bc.vocab_size}")
        return ids

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def random(cls, config: UIBKConfig, tokenizer: Any, *, seed: int = 0, **kwargs: Any) -> UIBKEncoder:
        """Randomly initialised weights (``torch.manual_seed(seed)``), for tests and benchmarks."""
        import torch

        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            model = _build_model(config)
        finally:
            torch.random.set_rng_state(state)
        kwargs.setdefault("name", "uibk-random")
        return cls(model, tokenizer, config, seed=seed, **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **options: Any) -> UIBKEncoder:
        """Load a folder written by :meth:`save_pretrained` (the layout in the module docstring).

        ``path`` may also be a Hugging Face repository id (``owner/name``) already in the local
        cache; nothing is downloaded. ``options`` override the saved settings (``device``,
        ``dtype``, ``dense_weight``, caps, ``batch_tokens``, ``num_threads``).
        """
        import torch
        from safetensors import SafetensorError, safe_open
        from tokenizers import Tokenizer

        p = _resolve_folder(path)
        missing = [f for f in REQUIRED_FILES if not (p / f).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{p} is not a complete UIBK checkpoint: missing {', '.join(missing)} "
                f"(a UIBK folder holds {', '.join(REQUIRED_FILES)})")
        meta = read_json(p / CONFIG_NAME)
        if meta.get("kind") != cls.kind:
            raise ValueError(f"{p / CONFIG_NAME}: kind is {meta.get('kind')!r}, expected 'uibk'")
        backbone = read_json(p / BACKBONE_CONFIG_NAME)
        backbone = {k: v for k, v in backbone.items()
                    if k not in ("architectures", "model_type", "transformers_version", "dtype",
                                 "torch_dtype", "_attn_implementation_autoset")}
        config = UIBKConfig.from_dict(meta.get("model", {}), backbone)
        model = _build_model(config)
        expected = model.state_dict()
        try:
            with safe_open(str(p / WEIGHTS_NAME), framework="pt") as f:
                keys = set(f.keys())
                problems = [f"missing weight {k}" for k in sorted(set(expected) - keys)]
                problems += [f"unexpected weight {k}" for k in sorted(keys - set(expected))]
                state = {}
                for k in sorted(keys & set(expected)):
                    t = f.get_tensor(k)
                    if tuple(t.shape) != tuple(expected[k].shape):
                        problems.append(f"{k} has shape {tuple(t.shape)}, the configuration expects "
                                        f"{tuple(expected[k].shape)}")
                    state[k] = t
        except SafetensorError as e:
            raise ValueError(f"{p / WEIGHTS_NAME} is damaged (not a readable safetensors file: "
                             f"{e})") from None
        if problems:
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            raise ValueError(f"{p / WEIGHTS_NAME} does not fit {p / BACKBONE_CONFIG_NAME} and "
                             f"{CONFIG_NAME}: " + "; ".join(problems[:5]) + more)
        with torch.no_grad():
            model.load_state_dict(state, strict=True)
        projections = load_projections(p / PROJECTIONS_NAME)

        want = meta.get("projection_id")
        if want is not None and projection_id(projections["R"], projections["P"]) != want:
            raise ValueError(f"{p / PROJECTIONS_NAME} does not hold the projection {want} "
                             f"that {p / CONFIG_NAME} names")
        opts: dict[str, Any] = {k: meta[k] for k in ("seed", "dense_weight", "query_token_cap",
                                                     "projection", "query_max_length",
                                                     "doc_max_length") if k in meta}
        if "format" in meta:
            opts["format"] = TaggedFormat.from_dict(meta["format"])
        if opts.get("projection", "random") != "random":  # fitted: its matrices keep their kind
            refuse_other_kind(p, opts["projection"], options)
        opts.update(options)
        opts.setdefault("name", str(path))
        try:
            tokenizer = Tokenizer.from_file(str(p / TOKENIZER_NAME))
        except Exception as e:  # tokenizers raises a bare Exception ("EOF while parsing ...")
            raise ValueError(f"{p / TOKENIZER_NAME} is damaged (not a readable tokenizer: {e})") from None
        return cls(model, tokenizer, config, projections=projections, **opts)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "model": self.uibk_config.to_dict(), "weights": WEIGHTS_NAME}

    def save_pretrained(self, path: str | os.PathLike) -> Path:
        """Write the folder layout of the module docstring (weights as float32) and return it."""
        from safetensors.torch import save_file

        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        bc = self.uibk_config.backbone_config()
        bc_dict = bc.to_dict()
        bc_dict.pop("_attn_implementation_autoset", None)
        (p / BACKBONE_CONFIG_NAME).write_text(json.dumps(bc_dict, indent=2, sort_keys=True))
        state = {k: v.detach().float().cpu().contiguous() for k, v in self.model.state_dict().items()}
        for name, write in ((WEIGHTS_NAME, lambda f: save_file(state, f)),
                            (TOKENIZER_NAME, self.tokenizer.save)):
            tmp = p / f".tmp-{os.getpid()}-{name}"  # atomic: a crash leaves the old file or the new
            write(str(tmp))
            os.replace(tmp, p / name)
        super().save_projections(p)  # projections.npz + uibk_encoder.json
        return p

    def save_projections(self, path: str | os.PathLike) -> None:
        """The whole checkpoint (:meth:`save_pretrained`): a UIBK folder loads only with its
        weights, so a fitted projection saved beside a store (``index --fit-projection``) or by
        ``fit-projection --out`` carries them."""
        self.save_pretrained(path)

    # -- encoding --------------------------------------------------------------------------
    def token_ids(self, texts: Sequence[str], is_query: bool) -> tuple[list[list[int]], list[bool]]:
        """Model input ids ``[CLS] marker prompt text... [SEP]`` and which texts were cut.

        >>> cfg = UIBKConfig.tiny()
        >>> enc = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["a b"]))
        >>> enc.token_ids(["a b"], is_query=True)[0]
        [[2, 5, 7, 8, 9, 3]]
        """
        ids = self._ids
        limit = (self.query_max_length if is_query else self.doc_max_length) - N_PREFIX - 1
        marker = ids["query_marker"] if is_query else ids["document_marker"]
        prefix = [ids["cls_token_id"], marker, ids["prompt_word"]]
        out, cut = [], []
        for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False):
            body = e.ids
            cut.append(len(body) > limit)
            out.append([*prefix, *body[:limit], ids["sep_token_id"]])
        return out, cut

    # -- the pipeline's two hooks (see TaggedEncoder) ---------------------------------------
    def _cutting_tokenizer(self, limit: int) -> Any:
        """A private copy of the tokenizer that cuts the text at ``limit`` tokens (never mutated
        later, so threads can share it)."""
        tok = self._cutting.get(limit)
        if tok is None:
            with self._cutting_lock:
                tok = self._cutting.get(limit)
                if tok is None:
                    tok = self.tokenizer.__class__.from_str(self.tokenizer.to_str())
                    tok.no_padding()
                    tok.enable_truncation(limit, stride=0, strategy="longest_first", direction="right")
                    self._cutting[limit] = tok
        return tok

    def _tokenize(self, texts: list[str], is_query: bool) -> TokenBatch:
        """``[CLS] marker prompt text... [SEP]`` for a batch, padded (same ids as :meth:`token_ids`)."""
        import torch

        ids_ = self._ids
        limit = (self.query_max_length if is_query else self.doc_max_length) - N_PREFIX - 1
        encs = self._cutting_tokenizer(limit).encode_batch(texts, add_special_tokens=False)
        cut = np.fromiter((bool(e.overflowing) for e in encs), dtype=bool, count=len(encs))
        body = [e.ids for e in encs]
        n = np.fromiter((len(x) for x in body), dtype=np.int64, count=len(body))
        ids, _ = pad_ids(body, ids_["pad_token_id"], offset=N_PREFIX, width=N_PREFIX + int(n.max()) + 1)
        ids[:, 0] = ids_["cls_token_id"]
        ids[:, 1] = ids_["query_marker"] if is_query else ids_["document_marker"]
        ids[:, 2] = ids_["prompt_word"]
        ids[np.arange(len(n)), N_PREFIX + n] = ids_["sep_token_id"]
        mask = (np.arange(ids.shape[1]) <= (N_PREFIX + n)[:, None]).astype(np.int64)
        # token vectors: the text's own positions (the slots replace the first three); a text with
        # no token (e.g. "\u200b") keeps [SEP]'s: every list holds a token row, as stores require
        return TokenBatch({"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)},
                          starts=np.full_like(n, N_PREFIX), ends=N_PREFIX + np.maximum(n, 1), truncated=cut)

    def _forward(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """Both heads of a batch, in passes that keep to ``batch_tokens``
        (:meth:`~uibk_embedding.encoder.base.TaggedEncoder._in_budget`)."""
        return self._in_budget(inputs, lambda x: self.model(x["input_ids"], x["attention_mask"]),
                               (False, True))


def read_json(file: Path) -> dict[str, Any]:
    """The JSON object of ``file`` (an encoder folder's configuration); damaged, a ValueError
    that names it.

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "uibk_encoder.json"; _ = f.write_text('{"kind": "ui')
    >>> read_json(f)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: ...uibk_encoder.json is damaged (not valid JSON: ...
    """
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is damaged (not valid JSON: {e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} is damaged (not a JSON object)")
    return data


def _resolve_folder(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.is_dir():
        return p
    text = str(path)
    if p.exists():
        raise NotADirectoryError(f"{p} is a file; a UIBK checkpoint is a folder")
    if text.count("/") == 1 and not text.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(text, local_files_only=True))
        except Exception as e:  # not cached, or huggingface_hub missing
            raise FileNotFoundError(
                f"{text!r} is neither a folder nor a repository in the local Hugging Face cache "
                f"({type(e).__name__}); nothing is downloaded: pass the checkpoint folder") from None
    raise FileNotFoundError(f"no UIBK checkpoint folder at {p}")


def sizes_in_millions(counts: dict[str, int]) -> dict[str, float]:
    """``param_counts`` rounded to 0.1M, as the paper reports them.

    >>> sizes_in_millions({"total": 179_014_784})
    {'total': 179.0}
    """
    return {k: math.floor(v / 1e5 + 0.5) / 10 for k, v in counts.items()}


__all__ = ["UIBKConfig", "UIBKEncoder", "param_counts", "sizes_in_millions", "train_tokenizer"]
