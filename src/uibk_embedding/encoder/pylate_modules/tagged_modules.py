"""A UIBK-Embedding model as a sentence-transformers 6 ``MultiVectorEncoder`` (custom modules).

:func:`~uibk_embedding.encoder.pylate_model.save_sentence_transformers` copies this file (with
``uibk_architecture.py`` and ``sentence_pooling.py``) into the model folder, whose ``modules.json``
names the two modules below, so that
``sentence_transformers.MultiVectorEncoder(folder, trust_remote_code=True).encode_query(texts)``
(and ``encode_document``) returns the tagged lists themselves, without this library:

* :class:`TaggedInput` (an ``InputModule``): tokenises as the native encoder does (``"uibk"``:
  ``[CLS] marker prompt-word text... [SEP]``; ``"transformer"``: the tokenizer's own template,
  as the embedded default) and runs the model once, giving the token states, the sentence vector
  and where each text's own tokens sit (``text_mask``); or, for a composed encoder,
  :class:`ComposedInput`: its sentence-transformers model and its multi-vector model (copied
  into ``dense/`` and ``tokens/``), each on its own tokenisation (two passes), giving the same
  three outputs;
* :class:`TaggedLists` (a ``Module``): the fixed projections ``R`` and ``R'`` and the tagged
  construction (docs/format.md#constants): ``token_embeddings`` becomes the 3 slot rows then one
  row per text token (a query's first ``query_token_cap``), ``attention_mask`` the rows of the
  list, which ``MultiVectorEncoder.encode`` keeps.

``load_encoder(folder, trust_remote_code=True)`` runs the same modules through this library's
batching. Imports only torch, transformers, tokenizers, safetensors and sentence-transformers 6.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file, save_file
from sentence_transformers.base.modules import InputModule, Module
from tokenizers import Tokenizer

from .sentence_pooling import pool

CONFIG_NAME = "tagged_input.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"
LISTS_CONFIG = "config.json"
PROJECTIONS_NAME = "projections.safetensors"
N_SLOTS = 3
N_PREFIX = 3  # uibk: [CLS], marker, prompt word: the positions the slots take
_UIBK_TOKENS = ("cls", "sep", "pad", "query_marker", "document_marker", "prompt_word")


def _task_is_query(task: str | None) -> bool:
    return task == "query"


def _span_mask(start: torch.Tensor, end: torch.Tensor, width: int) -> torch.Tensor:
    """``(B, T)``: True at each row's positions ``start .. end - 1`` (the text's own tokens)."""
    cols = torch.arange(width).view(1, -1)
    return (cols >= start.view(-1, 1)) & (cols < end.view(-1, 1))


def _padded(rows: list[list[int]], pad: int, width: int | None = None) -> torch.Tensor:
    width = width if width is not None else max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


class TaggedInput(InputModule):
    """Tokenise, one forward pass, both heads (see the module docstring).

    Parameters
    ----------
    folder: the model folder (``config.json``, ``model.safetensors``, ``tokenizer.json``).
    layout: ``"uibk"`` (the UIBK architecture) or ``"transformer"`` (one Hugging Face model).
    query_length, document_length: tokens read, special tokens included (the native
        ``query_max_length`` / ``doc_max_length``).
    uibk: sizes of the UIBK tops (``top_layers``, ``num_latents``, ``latent_heads``,
        ``ff_mult``, ``token_dim``) and its special tokens (``cls``, ``sep``, ``pad``,
        ``query_marker``, ``document_marker``, ``prompt_word``), for ``"uibk"``.
    pooling: ``{"modes": [...], "normalize": bool}``, for ``"transformer"``.
    tokenizer_facts: ``pad_token_id``, ``truncation_side``, ``takes_token_types``,
        ``pad_token_type_id``, for ``"transformer"``.
    do_lower_case: lower-case texts before the tokenizer (as sentence-transformers does).
    model_kwargs: ``dtype`` / ``torch_dtype`` for the weights.

    >>> import tempfile
    >>> from uibk_embedding.encoder.uibk import UIBKConfig, UIBKEncoder, train_tokenizer
    >>> cfg = UIBKConfig.tiny()
    >>> native = UIBKEncoder.random(cfg, train_tokenizer(cfg, ["a wing"]), device="cpu")
    >>> from uibk_embedding.encoder.pylate_model import save_sentence_transformers
    >>> folder = save_sentence_transformers(native, tempfile.mkdtemp())
    >>> m = TaggedInput.load(str(folder))
    >>> f = m(m.preprocess(["a wing"], task="document"))
    >>> tuple(f["token_embeddings"].shape), f["text_mask"].long().tolist()
    ((1, 6, 128), [[0, 0, 0, 1, 1, 0]])
    """

    config_file_name = CONFIG_NAME
    config_keys: ClassVar[list[str]] = ["layout", "query_length", "document_length", "uibk", "pooling",
                                        "tokenizer_facts", "do_lower_case"]
    save_in_root = True

    def __init__(self, folder: str, *, layout: str, query_length: int, document_length: int,
                 uibk: dict[str, Any] | None = None, pooling: dict[str, Any] | None = None,
                 tokenizer_facts: dict[str, Any] | None = None, do_lower_case: bool = False,
                 model_kwargs: dict[str, Any] | None = None, trust_remote_code: bool = False,
                 **_: Any) -> None:
        super().__init__()
        if layout not in ("uibk", "transformer"):
            raise ValueError(f"layout must be 'uibk' or 'transformer', got {layout!r}")
        self.layout = layout
        self.query_length, self.document_length = int(query_length), int(document_length)
        self.uibk = dict(uibk or {})
        self.pooling = dict(pooling) if pooling else None
        self.tokenizer_facts = dict(tokenizer_facts or {})
        self.do_lower_case = bool(do_lower_case)
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, TOKENIZER_NAME))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        from transformers import AutoConfig

        trust = trust_remote_code is True
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust)
        if layout == "uibk":
            from .uibk_architecture import UIBKModel

            sizes = {k: self.uibk[k] for k in ("top_layers", "num_latents", "latent_heads", "ff_mult",
                                               "token_dim") if k in self.uibk}
            self.branches = UIBKModel(config, **sizes)
            self.branches.load_state_dict(load_file(os.path.join(folder, WEIGHTS_NAME)), strict=True)
            self.ids = {}
            for role in _UIBK_TOKENS:
                i = self.tokenizer.token_to_id(self.uibk[role])
                if i is None:
                    raise ValueError(f"{folder}: the {role} token {self.uibk[role]!r} is not in "
                                     f"{TOKENIZER_NAME}")
                self.ids[role] = int(i)
        else:
            from transformers import AutoModel

            self.auto_model = AutoModel.from_pretrained(folder, config=config, trust_remote_code=trust)
        args = dict(model_kwargs or {})
        dtype = args.get("dtype", args.get("torch_dtype"))
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        if isinstance(dtype, torch.dtype):
            self.to(dtype)
        self.max_seq_length = max(self.query_length, self.document_length)

    # -- tokenising ------------------------------------------------------------------------------
    def preprocess(self, inputs: list[str], prompt: str | None = None, task: str | None = None,
                   **kwargs: Any) -> dict[str, Any]:
        """Token ids, attention mask, each text's token span and whether it was cut."""
        texts = [str(t) for t in inputs]
        if prompt:
            texts = [prompt + t for t in texts]
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        is_query = _task_is_query(task)
        limit = self.query_length if is_query else self.document_length
        if self.layout == "uibk":
            return self._uibk_batch(texts, is_query, limit)
        return self._transformer_batch(texts, limit)

    def _uibk_batch(self, texts: list[str], is_query: bool, limit: int) -> dict[str, Any]:
        ids = self.ids
        room = limit - N_PREFIX - 1
        encs = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        marker = ids["query_marker"] if is_query else ids["document_marker"]
        rows = [[ids["cls"], marker, ids["prompt_word"], *e.ids[:room], ids["sep"]] for e in encs]
        n = torch.tensor([min(len(e.ids), room) for e in encs], dtype=torch.long)
        input_ids = _padded(rows, ids["pad"])
        mask = (torch.arange(input_ids.shape[1]) <= (N_PREFIX + n)[:, None]).long()
        # a text with no token (e.g. "\u200b") keeps [SEP]'s row: every list holds a token row
        return {"input_ids": input_ids, "attention_mask": mask,
                "text_mask": _span_mask(torch.full_like(n, N_PREFIX), N_PREFIX + n.clamp(min=1),
                                        input_ids.shape[1]),
                "truncated": torch.tensor([len(e.ids) > room for e in encs])}

    def _transformer_batch(self, texts: list[str], limit: int) -> dict[str, Any]:
        facts = self.tokenizer_facts
        # special tokens added, cut at the limit (what overflowed is the truncation report)
        encs = self._cutting(limit, facts.get("truncation_side", "right")).encode_batch(texts)
        n = torch.tensor([len(e.ids) for e in encs], dtype=torch.long)
        if len(n) and int(n.min()) == 0:
            raise ValueError("the model's tokenizer gives no token at all for a text: nothing to encode")
        input_ids = _padded([e.ids for e in encs], int(facts.get("pad_token_id", 0)))
        mask = (torch.arange(input_ids.shape[1]) < n[:, None]).long()
        out: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask}
        if facts.get("takes_token_types", False):
            pad_type = int(facts.get("pad_token_type_id", 0))
            types = [e.type_ids for e in encs]
            if pad_type == 0 and not any(map(any, types)):
                out["token_type_ids"] = torch.zeros_like(input_ids)
            else:
                out["token_type_ids"] = _padded(types, pad_type, input_ids.shape[1])
        # the text's own positions: between the template's special tokens (BERT: 1 .. n - 2); a
        # text left with no token of its own keeps one row (the position after the first)
        special = _padded([e.special_tokens_mask for e in encs], 1, input_ids.shape[1]).bool()
        own = ~special
        has = own.any(dim=1)
        first = own.long().argmax(dim=1)
        last = own.shape[1] - own.flip(1).long().argmax(dim=1)
        one = torch.clamp(n - 1, max=1)
        out["text_mask"] = _span_mask(torch.where(has, first, one), torch.where(has, last, one + 1),
                                      input_ids.shape[1])
        out["truncated"] = torch.tensor([bool(e.overflowing) for e in encs])
        return out

    def _cutting(self, limit: int, side: str) -> Tokenizer:
        cache = self.__dict__.setdefault("_cut", {})
        if limit not in cache:
            tok = Tokenizer.from_str(self.tokenizer.to_str())
            tok.no_padding()
            tok.enable_truncation(limit, stride=0, strategy="longest_first", direction=side)
            cache[limit] = tok
        return cache[limit]

    # -- the model ---------------------------------------------------------------------------
    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        ids, mask = features["input_ids"], features["attention_mask"]
        if self.layout == "uibk":
            g, tok = self.branches(ids, mask)
        else:
            inputs = {k: features[k] for k in ("input_ids", "attention_mask", "token_type_ids")
                      if k in features}
            states = self.auto_model(**inputs, return_dict=True).last_hidden_state.float()
            spec = self.pooling or {"modes": ["mean"], "normalize": True}
            g = pool(states, mask, spec["modes"], bool(spec.get("normalize")))
            tok = states
        features["token_embeddings"] = tok.float()
        features["sentence_embedding"] = g.float()
        return features

    def get_embedding_dimension(self) -> int:
        if self.layout == "uibk":
            return int(self.uibk.get("token_dim", 128))
        return int(self.auto_model.config.hidden_size)

    get_word_embedding_dimension = get_embedding_dimension

    def __repr__(self) -> str:
        return f"TaggedInput({self.get_config_dict()})"

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        os.makedirs(output_path, exist_ok=True)
        if self.layout == "uibk":
            self.branches.trunk.config.save_pretrained(output_path)
            state = {k: v.detach().float().cpu().contiguous() for k, v in self.branches.state_dict().items()}
            save_file(state, os.path.join(output_path, WEIGHTS_NAME))
        else:
            self.auto_model.save_pretrained(output_path, safe_serialization=True)
        self.tokenizer.save(os.path.join(output_path, TOKENIZER_NAME))
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None,
             local_files_only: bool = False, model_kwargs: dict[str, Any] | None = None,
             **kwargs: Any) -> TaggedInput:
        folder = cls.load_dir_path(model_name_or_path, subfolder=subfolder, token=token,
                                   cache_folder=cache_folder, revision=revision,
                                   local_files_only=local_files_only)
        with open(os.path.join(folder, CONFIG_NAME)) as f:
            config = json.load(f)
        config.pop("trust_remote_code", None)  # the caller's choice, not the file's
        return cls(folder, model_kwargs=model_kwargs,
                   trust_remote_code=kwargs.get("trust_remote_code") is True, **config)


class TaggedLists(Module):
    """The tagged lists from the two heads (see the module docstring).

    Parameters
    ----------
    R: ``(381, D)``, the slot projection; P: ``(127, d)``, the token projection ``R'``.
    beta, lambda_: the format's constants.
    query_token_cap: text tokens of a query that take part in token matching.

    >>> R, P = torch.linalg.qr(torch.randn(381, 32))[0], torch.linalg.qr(torch.randn(127, 16))[0]
    >>> m = TaggedLists(R=R, P=P)
    >>> own = torch.tensor([[0, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.bool)
    >>> f = m({"token_embeddings": torch.randn(2, 6, 16), "sentence_embedding": torch.randn(2, 32),
    ...        "text_mask": own}, task="query")
    >>> f["attention_mask"].sum(1).tolist()  # 3 slots, then the text tokens
    [7, 5]
    >>> [round(float(v), 4) for v in f["token_embeddings"][0, 2:4, 0]]  # slot tag, token tag
    [-0.8803, 0.3162]
    """

    config_keys: ClassVar[list[str]] = ["beta", "lambda_", "query_token_cap"]
    forward_kwargs: ClassVar[set[str]] = {"task"}

    def __init__(self, R: torch.Tensor, P: torch.Tensor, beta: float = 0.9, lambda_: float = 0.75,
                 query_token_cap: int = 64) -> None:
        super().__init__()
        if R.shape[0] != N_SLOTS * 127 or P.shape[0] != 127:
            raise ValueError(f"R must be (381, D) and P (127, d), got {tuple(R.shape)} and {tuple(P.shape)}")
        self.R = R.detach().to(torch.float32).cpu()
        self.P = P.detach().to(torch.float32).cpu()
        self.beta, self.lambda_ = float(beta), float(lambda_)
        self.delta = self.lambda_ * self.beta / N_SLOTS
        self.query_token_cap = int(query_token_cap)
        self._on: dict[str, torch.Tensor] = {}

    def _cached(self, name: str, device: torch.device) -> torch.Tensor:
        key = f"{name}:{device}"
        if key not in self._on:  # float64 where the device has it: one rounding, like the native encoder
            hi = torch.float32 if device.type == "mps" else torch.float64
            self._on[key] = (self.R.to(device=device, dtype=hi) if name == "R"
                             else self.P.to(device=device, dtype=torch.float32))
        return self._on[key]

    def forward(self, features: dict[str, Any], task: str | None = None, **kwargs: Any) -> dict[str, Any]:
        states, g = features["token_embeddings"], features["sentence_embedding"]
        dev = states.device
        own = features["text_mask"].to(dev).bool()
        b = states.shape[0]
        n = own.sum(1)
        if _task_is_query(task):
            n = n.clamp(max=self.query_token_cap)
        # the text's positions first, in order (a stable sort of "not own")
        order = torch.sort((~own).to(torch.int8), dim=1, stable=True).indices
        R = self._cached("R", dev)
        hi = R.dtype
        z = (g.to(hi) @ R.T).reshape(b, N_SLOTS, -1)
        slots = torch.empty((b, N_SLOTS, 128), dtype=hi, device=dev)
        slots[..., 0] = -math.sqrt(1 - self.delta)
        slots[..., 1:] = z * (math.sqrt(self.delta) / torch.linalg.vector_norm(z, dim=-1, keepdim=True))
        width = int(n.max()) if b else 0
        pos = order[:, :width]
        chosen = torch.gather(states.float(), 1, pos.unsqueeze(-1).expand(b, width, states.shape[-1]))
        u = (chosen @ self._cached("P", dev).T).to(hi)
        toks = torch.empty((b, width, 128), dtype=hi, device=dev)
        toks[..., 0] = math.sqrt(1 - self.beta)
        toks[..., 1:] = u * (math.sqrt(self.beta) / torch.linalg.vector_norm(u, dim=-1, keepdim=True))
        rows = torch.cat([slots, toks], dim=1)
        keep = torch.arange(N_SLOTS + width, device=dev).view(1, -1) < (N_SLOTS + n).view(b, 1)
        features["token_embeddings"] = torch.where(keep.unsqueeze(-1), rows, 0).to(torch.float32)
        features["attention_mask"] = keep.long()
        return features

    def get_embedding_dimension(self) -> int:
        return 128

    def __repr__(self) -> str:
        return f"TaggedLists({self.get_config_dict()})"

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        os.makedirs(output_path, exist_ok=True)
        self.save_config(output_path, LISTS_CONFIG)
        save_file({"R": self.R.contiguous(), "P": self.P.contiguous()},
                  os.path.join(output_path, PROJECTIONS_NAME))

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None,
             local_files_only: bool = False, **kwargs: Any) -> TaggedLists:
        folder = cls.load_dir_path(model_name_or_path, subfolder=subfolder, token=token,
                                   cache_folder=cache_folder, revision=revision,
                                   local_files_only=local_files_only)
        with open(os.path.join(folder, LISTS_CONFIG)) as f:
            config = json.load(f)
        proj = load_file(os.path.join(folder, PROJECTIONS_NAME))
        return cls(R=proj["R"], P=proj["P"], **{k: config[k] for k in cls.config_keys if k in config})




COMPOSED_CONFIG_NAME = "composed_input.json"
#: the Transformer settings of the token model that a composed encoder may override
_TOKEN_KNOBS = ("query_length", "document_length", "query_expansion")


def _pad_to(x: torch.Tensor, width: int, value: int) -> torch.Tensor:
    """``(B, T)`` -> ``(B, width)``, right-padded with ``value``."""
    if x.shape[1] >= width:
        return x
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


def _crop(features: dict[str, Any], width: int) -> dict[str, Any]:
    return {k: v[:, :width] if isinstance(v, torch.Tensor) and v.dim() == 2 else v
            for k, v in features.items()}


class ComposedInput(InputModule):
    """A composed encoder's two models as one input module: a sentence-transformers model (the
    dense head) and a multi-vector (ColBERT) model (the token head), each run on its own
    tokenisation as ``load_encoder(dense=..., tokens=...)`` runs them (two forward passes).

    The folder holds both model folders (``dense/``, ``tokens/``, copied unchanged) and
    ``composed_input.json``: each head's prompts, the dense head's lengths and the token model's
    overridden lengths / query expansion. The output is what :class:`TaggedLists` reads: the token
    model's vectors (``token_embeddings``), the dense model's normalised sentence vector, and the
    rows the token model scores (``text_mask``: its ``MultiVectorMask``). Both models' inputs are
    padded to one width, ``attention_mask`` being the union of what either reads, so a batch split
    by rows and cropped to its longest ``attention_mask`` stays whole for both.

    Parameters
    ----------
    folder: the export folder (``composed_input.json``, ``dense/``, ``tokens/``).
    dense_folder, tokens_folder: the two model folders, relative to ``folder``.
    dense_prompts, token_prompts: ``{"query": ..., "document": ...}``, the prompt of each head.
    dense_lengths: ``{"query": ..., "document": ...}``, the tokens the dense head reads.
    token_knobs: the token model's ``query_length`` / ``document_length`` / ``query_expansion``
        set after it loads (the composed encoder's ``colbert_options``).
    query_length, document_length: what the composed encoder reads at most (reported only).
    trust_remote_code: passed to both models' loaders.

    ``tests/test_composed.py`` builds one from tiny models and checks it against the
    composed encoder.
    """

    config_file_name = COMPOSED_CONFIG_NAME
    config_keys: ClassVar[list[str]] = ["dense_folder", "tokens_folder", "dense_prompts", "token_prompts",
                                        "dense_lengths", "token_knobs", "query_length", "document_length"]
    forward_kwargs: ClassVar[set[str]] = {"task"}
    save_in_root = True

    def __init__(self, folder: str, *, dense_folder: str = "dense", tokens_folder: str = "tokens",
                 dense_prompts: dict[str, str] | None = None, token_prompts: dict[str, str] | None = None,
                 dense_lengths: dict[str, int] | None = None, token_knobs: dict[str, Any] | None = None,
                 query_length: int | None = None, document_length: int | None = None,
                 trust_remote_code: bool = False, **_: Any) -> None:
        super().__init__()
        from sentence_transformers import MultiVectorEncoder, SentenceTransformer

        trust = trust_remote_code is True
        self.dense_folder, self.tokens_folder = str(dense_folder), str(tokens_folder)
        for sub in (self.dense_folder, self.tokens_folder):
            if os.path.isabs(sub) or ".." in sub.replace("\\", "/").split("/"):
                raise ValueError(f"{folder}: a model folder must lie inside the export, got {sub!r}")
        self.dense_prompts = {"query": "", "document": "", **(dense_prompts or {})}
        self.token_prompts = {"query": "", "document": "", **(token_prompts or {})}
        self.token_knobs = {k: v for k, v in (token_knobs or {}).items() if k in _TOKEN_KNOBS}
        self.dense_model = SentenceTransformer(os.path.join(folder, self.dense_folder), device="cpu",
                                               local_files_only=True, trust_remote_code=trust).eval()
        self.token_model = MultiVectorEncoder(os.path.join(folder, self.tokens_folder), device="cpu",
                                              local_files_only=True, trust_remote_code=trust).eval()
        first = self.token_model[0]
        for k, v in self.token_knobs.items():
            setattr(first, k, v)
        dense_max = int(self.dense_model.max_seq_length or 512)
        lengths = {"query": dense_max, "document": dense_max, **(dense_lengths or {})}
        self.dense_lengths = {k: int(v) for k, v in lengths.items()}
        self.query_length = int(query_length or self.dense_lengths["query"])
        self.document_length = int(document_length or self.dense_lengths["document"])
        self.max_seq_length = max(self.query_length, self.document_length)
        self.tokenizer = self.token_model.tokenizer
        limit = getattr(first, "document_length", None) or getattr(first, "max_seq_length", None)
        self._token_doc_limit = int(limit) if limit else None

    # -- tokenising ------------------------------------------------------------------------------
    def preprocess(self, inputs: list[str], prompt: str | None = None, task: str | None = None,
                   **kwargs: Any) -> dict[str, Any]:
        """Both models' inputs (``tokens.*``, ``dense.*``) at one width, their union
        ``attention_mask`` and which texts either model cut (``truncated``)."""
        texts = [str(t) for t in inputs]
        if prompt:
            texts = [prompt + t for t in texts]
        is_query = _task_is_query(task)
        name = "query" if is_query else "document"
        task = name
        cprompt = self.token_prompts[name]
        tok = dict(self.token_model.preprocess(texts, prompt=cprompt or None, task=task))
        dprompt = self.dense_prompts[name]
        limit = self.dense_lengths[name]
        self.dense_model.max_seq_length = limit
        dense = dict(self.dense_model.preprocess(texts, prompt=dprompt or None, task=task))
        cut = self._dense_truncated([dprompt + t for t in texts] if dprompt else texts,
                                    dense["attention_mask"], limit)
        if not is_query:
            cut |= self._token_truncated([cprompt + t for t in texts] if cprompt else texts)
        width = max(tok["attention_mask"].shape[1], dense["attention_mask"].shape[1])
        pads = {"input_ids": int(getattr(self.token_model.tokenizer, "pad_token_id", 0) or 0)}
        dpads = {"input_ids": int(getattr(self.dense_model.tokenizer, "pad_token_id", 0) or 0)}
        out: dict[str, Any] = {}
        union = torch.zeros((len(texts), width), dtype=torch.long)
        for prefix, feats, pad in (("tokens.", tok, pads), ("dense.", dense, dpads)):
            for k, v in feats.items():
                if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[0] == len(texts):
                    v = _pad_to(v, width, pad.get(k, 0))
                    if k in ("attention_mask", "query_expansion_positions"):
                        union |= v.long()
                out[prefix + k] = v
        out["attention_mask"] = union
        out["truncated"] = torch.from_numpy(cut) if not isinstance(cut, torch.Tensor) else cut
        return out

    def _dense_truncated(self, texts: list[str], mask: torch.Tensor, limit: int) -> torch.Tensor:
        lengths = mask.sum(1)
        cut = torch.zeros(len(texts), dtype=torch.bool)
        full = [i for i in range(len(texts)) if int(lengths[i]) >= limit]  # only these can be cut
        if full:
            enc = self.dense_model.tokenizer([texts[i] for i in full], add_special_tokens=True,
                                             truncation=False, verbose=False)
            for i, ids in zip(full, enc["input_ids"], strict=True):
                cut[i] = len(ids) > limit
        return cut

    def _token_truncated(self, texts: list[str]) -> torch.Tensor:
        if self._token_doc_limit is None:
            return torch.zeros(len(texts), dtype=torch.bool)
        enc = self.token_model.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)
        return torch.tensor([len(x) > self._token_doc_limit for x in enc["input_ids"]], dtype=torch.bool)

    # -- the models ---------------------------------------------------------------------------
    @staticmethod
    def _own(features: dict[str, Any], prefix: str) -> dict[str, Any]:
        """One model's inputs, cropped to the width its rows need (as it padded them itself)."""
        own = {k[len(prefix):]: v for k, v in features.items() if k.startswith(prefix)}
        need = own["attention_mask"].bool()
        if "query_expansion_positions" in own:
            need = need | own["query_expansion_positions"].bool()
        cols = need.any(dim=0).nonzero()
        width = int(cols.max()) + 1 if len(cols) else need.shape[1]
        own = _crop(own, width)
        own["attention_mask"] = own["attention_mask"].clone()  # pooling may edit it in place
        return own

    def forward(self, features: dict[str, Any], task: str | None = None, **kwargs: Any) -> dict[str, Any]:
        task = "query" if _task_is_query(task) else "document"
        out = self.token_model(self._own(features, "tokens."), task=task)
        g = self.dense_model(self._own(features, "dense."), task=task)["sentence_embedding"]
        features["token_embeddings"] = out["token_embeddings"].float()
        features["sentence_embedding"] = torch.nn.functional.normalize(g.float(), dim=-1)
        features["text_mask"] = out["attention_mask"].bool()
        return features

    def get_embedding_dimension(self) -> int:
        return int(self.token_model.get_embedding_dimension())

    get_word_embedding_dimension = get_embedding_dimension

    def __repr__(self) -> str:
        return f"ComposedInput({self.get_config_dict()})"

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        os.makedirs(output_path, exist_ok=True)
        self.dense_model.save(os.path.join(output_path, self.dense_folder))
        self.token_model.save_pretrained(os.path.join(output_path, self.tokens_folder))
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None,
             local_files_only: bool = False, **kwargs: Any) -> ComposedInput:
        folder = cls.load_dir_path(model_name_or_path, subfolder=subfolder, token=token,
                                   cache_folder=cache_folder, revision=revision,
                                   local_files_only=local_files_only)
        with open(os.path.join(folder, COMPOSED_CONFIG_NAME)) as f:
            config = json.load(f)
        config.pop("trust_remote_code", None)  # the caller's choice, not the file's
        return cls(folder, trust_remote_code=kwargs.get("trust_remote_code") is True, **config)


__all__ = ["ComposedInput", "TaggedInput", "TaggedLists"]
