"""Bring your own models: a sentence-transformers dense model + a ColBERT model, one list.

:class:`ComposedEncoder` (``load_encoder(dense=..., tokens=...)``) fuses two models you already
own into the tagged format of docs/format.md#composing, so a "dense index + ColBERT index + fusion" setup
becomes one index and one search:

* the **dense head** is the sentence-transformers model run through its own modules (its
  tokeniser, pooling -- CLS, mean, ... --, ``Normalize``, any ``Dense`` layer) with its own
  prompts (``encode_query`` / ``encode_document`` choose them: the ``"query"`` prompt for
  queries; ``"document"``, ``"passage"`` or ``"corpus"`` for documents), L2-normalised: the
  vector ``SentenceTransformer.encode(..., normalize_embeddings=True)`` returns. ``R``
  (381 x D) splits it into the three slots;
* the **token head** is any checkpoint sentence-transformers 6's ``MultiVectorEncoder`` loads
  (its native saves, PyLate ColBERT models, Stanford ColBERT checkpoints), run as it runs it
  (its ``[Q]``/``[D]`` prompts, query length and ``[MASK]`` expansion, its document length and
  punctuation skiplist -- its ``MultiVectorMask`` --, its trained projection, ``Normalize``):
  the vectors ``encode_query`` / ``encode_document`` return, in order, then the fixed
  orthonormal ``R'`` (127 x 128 for a 128-d model; ``P`` in the code), renormalised and tagged.

That is **two forward passes** per text (one per model, each on its own tokenisation), where
the embedded default and the UIBK model need one. The list is the 3 slots followed by every
vector of the token model (``[CLS]`` and the marker included, as ``MultiVectorEncoder`` emits
them), so a query list has ``3 + query_length`` rows with ``[MASK]`` expansion (32 for a PyLate
model, the expansion tokens included; at most ``query_token_cap`` = 64 are kept) and a document
list ``3 +`` its non-punctuation tokens. The dense head reads up to ``query_max_length`` (256)
tokens of a query and ``doc_max_length`` (2048) of a document, or the dense model's
``max_seq_length`` if lower; the token head reads its own query / document lengths.

Saving (:meth:`ComposedEncoder.save`) writes a small folder: which two model folders it
composes, a content hash of each, the format, the dense weight and the projections. Loading
it refuses a model whose files changed since (:class:`~uibk_embedding.errors.ModelChanged`):
vectors of the old and the new model must not be mixed in one index. To run the composed encoder
without this library, ``save_sentence_transformers(encoder, FOLDER)`` (CLI: ``uibk-embed
export-st``) writes one sentence-transformers 6 folder holding copies of both models, which
``MultiVectorEncoder(FOLDER, trust_remote_code=True)`` loads to the same tagged lists
(docs/loading.md).

Needs the ``colbert`` extra (``sentence-transformers>=6``; PyLate is not used).

Example (folders you trained or downloaded; ``tests/test_composed.py`` builds tiny random ones)::

    import uibk_embedding as ue
    enc = ue.load_encoder(dense="models/bge-small-en-v1.5", tokens="models/colbertv2-pylate")
    enc.save("my-encoder")                 # refers to both folders, with their content hashes
    enc = ue.load_encoder("my-encoder")    # refused if either model changed since
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from uibk_embedding.encoder.base import TaggedEncoder
from uibk_embedding.encoder.fixed_projections import CONFIG_NAME, PROJECTIONS_NAME
from uibk_embedding.encoder.inputs import resolve_device
from uibk_embedding.encoder.padding import TokenBatch
from uibk_embedding.encoder.pooling import read_modules
from uibk_embedding.encoder.projection import read_saved_projections, refuse_other_kind
from uibk_embedding.encoder.pylate_model import (
    _limits,
    _sentence_transformers_6,
    load_multi_vector_model,
    task_prompts,
)
from uibk_embedding.encoder.transformer import quiet_transformers
from uibk_embedding.encoder.trust import check_loader_options, model_digest, require_trust
from uibk_embedding.errors import ModelChanged
from uibk_embedding.tagged import TaggedFormat

KIND = "composed"
_DOC_PROMPTS = ("document", "passage", "corpus")  # sentence-transformers' encode_document order
_HOST_KEYS = frozenset({"dense.task_is_query", "dense.prompt_length"})


#: the modules a ColBERT model may list after its Transformer (sentence-transformers 6 names; a
#: PyLate model lists a Dense only, the mask and Normalize are added when it loads)
_TOKEN_HEAD_MODULES = frozenset({"Dense", "MultiVectorMask", "Normalize"})


def check_colbert_folder(folder: str | os.PathLike, *, trust_remote_code: bool = False) -> None:
    """Refuse a token-model folder that is not a trained ColBERT model: ``MultiVectorEncoder``
    would quietly add a randomly initialised projection to a plain encoder, and the vectors would
    mean nothing. Refuse too, unless ``trust_remote_code=True``, a folder that would run its own
    code when it loads (:func:`~uibk_embedding.encoder.trust.require_trust`: module types are
    compared as exact class paths, so ``evil.Transformer`` is not a Transformer).

    >>> import tempfile, pathlib
    >>> missing = pathlib.Path(tempfile.mkdtemp()) / "missing"
    >>> check_colbert_folder(missing)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: ColBERT model folder .../missing does not exist
    """
    p = Path(folder)
    if not p.is_dir():
        raise FileNotFoundError(f"ColBERT model folder {p} does not exist")
    require_trust(p, trust_remote_code, what="the token model, tokens=")
    mods = read_modules(p)
    if mods is None:
        if (p / "artifact.metadata").exists() or _stanford(p):  # Stanford ColBERT: read as such
            return
        raise ValueError(
            f"{p} is not a ColBERT model (no modules.json: a PyLate or sentence-transformers "
            "MultiVectorEncoder save) nor a Stanford ColBERT checkpoint (no artifact.metadata): its "
            "token projection would be random")
    names = [str(m["type"]).rsplit(".", 1)[-1] for m in mods]
    if (len(names) < 2 or names[0] != "Transformer" or "Dense" not in names[1:]
            or any(n not in _TOKEN_HEAD_MODULES for n in names[1:])):
        raise ValueError(
            f"{p / 'modules.json'} lists {names}: a ColBERT model is a Transformer followed by its "
            "Dense projection(s) (and, saved by sentence-transformers 6, a MultiVectorMask and "
            "Normalize). For a sentence-transformers model use dense=")


def _stanford(folder: Path) -> bool:
    try:
        archs = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    return "HF_ColBERT" in archs


class ComposedEncoder(TaggedEncoder):
    """Tagged lists from a sentence-transformers dense model and a ColBERT model.

    Parameters
    ----------
    dense: folder of a sentence-transformers model (bge, gte, e5, MiniLM, ...).
    tokens: folder of a ColBERT model ``MultiVectorEncoder`` loads (its own save, PyLate's
        format, a Stanford ColBERT checkpoint).
    device: ``"cuda"``, ``"cpu"``, ... (default: CUDA when present, else CPU).
    num_threads: CPU threads for torch; None leaves it alone.
    query_prompt, document_prompt: override the dense model's own prompts (e.g. bge's query
        instruction when the folder does not declare it); ``""`` for none.
    colbert_options: options for ``MultiVectorEncoder`` (``model_kwargs``, ...) and the
        token model's ``query_length``, ``document_length``, ``query_expansion`` (e.g.
        ``None``: no ``[MASK]`` expansion); by default the model's own.
    trust_remote_code: let either folder run the Python code it ships (custom module types,
        an ``auto_map``: :func:`~uibk_embedding.encoder.trust.code_risks`); without it such a
        folder is refused with :class:`~uibk_embedding.errors.UntrustedCode` before anything
        loads, and both libraries are called with ``trust_remote_code=False``.
    **kwargs: see :class:`~uibk_embedding.encoder.base.TaggedEncoder` (``format``, ``seed``,
        ``projections``, ``dense_weight`` -- 1.0 by default --, caps, ``batch_tokens``).
    """

    kind = KIND

    def __init__(
        self,
        dense: str | os.PathLike,
        tokens: str | os.PathLike,
        *,
        device: str | None = None,
        num_threads: int | None = None,
        query_prompt: str | None = None,
        document_prompt: str | None = None,
        colbert_options: dict[str, Any] | None = None,
        trust_remote_code: bool = False,
        **kwargs: Any,
    ) -> None:

        self.dense_path = Path(dense).resolve()
        self.tokens_path = Path(tokens).resolve()
        if not self.dense_path.is_dir():
            raise FileNotFoundError(f"dense model folder {self.dense_path} does not exist")
        self.model_name = f"composed:{self.dense_path.name}+{self.tokens_path.name}"
        if kwargs.get("projection", "random") != "random" and kwargs.get("projections") is None:
            # the seeded matrices must not be declared as fitted ones
            raise ValueError(
                f"no PCA projection is shipped for {self.model_name}: fit one with "
                "encoder.fit_projection(texts) or `uibk-embed fit-projection`, save it and load "
                "that folder")
        trust = trust_remote_code is True
        require_trust(self.dense_path, trust, what="the dense model, dense=")
        check_colbert_folder(self.tokens_path, trust_remote_code=trust)
        st = _sentence_transformers_6("a composed encoder (dense= and tokens=)")
        import torch

        mods = read_modules(self.dense_path)
        if mods is not None and [str(m["type"]).rsplit(".", 1)[-1] for m in mods][1:2] == ["Dense"]:
            raise ValueError(f"{self.dense_path} looks like a ColBERT model (Transformer -> Dense, no "
                             "pooling): pass it as tokens=, and a sentence-transformers model as dense=")
        # hashed before loading: what the saved folder will refer to is what was loaded
        self.dense_sha256 = model_digest(self.dense_path)
        self.tokens_sha256 = model_digest(self.tokens_path)
        if num_threads:
            torch.set_num_threads(int(num_threads))
        self.device = resolve_device(device)
        self.colbert_options = dict(colbert_options or {})
        check_loader_options(self.colbert_options, trust)
        with quiet_transformers():
            self.dense_model = st.SentenceTransformer(
                str(self.dense_path), device=self.device, local_files_only=True,
                trust_remote_code=trust).eval()
        self.colbert = load_multi_vector_model(self.tokens_path, trust_remote_code=trust,
                                               device=self.device, options=self.colbert_options)
        if any(isinstance(m, st.multi_vector_encoder.modules.BaseTokenPooling) for m in self.colbert):
            raise ValueError(f"{self.tokens_path}: its modules pool document tokens; the token head "
                             "takes one vector per token (pool in the store: pool_factor=)")
        self._masks = [m for m in self.colbert
                       if isinstance(m, st.multi_vector_encoder.modules.MultiVectorMask)]
        self.amp_dtype = torch.bfloat16 if self.device.startswith("cuda") else None
        prompts = self.dense_model.prompts
        default = prompts.get(self.dense_model.default_prompt_name or "", None)
        doc_name = next((n for n in _DOC_PROMPTS if n in prompts), None)
        self.query_prompt = (query_prompt if query_prompt is not None
                             else prompts.get("query", default) or "")
        self.document_prompt = (document_prompt if document_prompt is not None
                                else (prompts[doc_name] if doc_name else default) or "")
        self._overrides = {"query_prompt": query_prompt, "document_prompt": document_prompt}
        cb = self.colbert
        self._colbert_prompts = task_prompts(dict(cb.prompts or {}),
                                             cb.prompts.get(cb.default_prompt_name or "", None))
        self._colbert_prompt = self._colbert_prompts[False]  # (part of the model id, as before)
        self._colbert_limits = dict(zip((True, False), _limits(cb[0]), strict=True))
        dense_dim = int(self.dense_model.get_embedding_dimension())
        token_dim = int(cb.get_embedding_dimension())
        kwargs.setdefault("batch_tokens", 8192 if self.device == "cpu" else 65536)
        # the lists' source, beside the projections: both models' files and the prompts
        self._model_id = hashlib.sha256("\0".join((
            self.dense_sha256, self.tokens_sha256, self.query_prompt, self.document_prompt,
            *self._colbert_prompts.values())).encode()).hexdigest()[:16]
        super().__init__(dense_dim, token_dim, **kwargs)
        self._requested = {"query_max_length": self.query_max_length,
                           "doc_max_length": self.doc_max_length}
        dense_max = int(self.dense_model.max_seq_length or self.doc_max_length)
        self.dense_lengths = {True: min(self.query_max_length, dense_max),
                              False: min(self.doc_max_length, dense_max)}
        # what the truncation warning names: the lower of the two heads' limits
        self.query_max_length = self.dense_lengths[True]
        self.doc_max_length = min(self.dense_lengths[False],
                                  self._colbert_limits[False] or self.doc_max_length)
        self._tok_lock = threading.Lock()  # both libraries set a length on the model to tokenise

    # -- persistence -----------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        return {
            **super().config(),
            **self._requested,
            "dense": str(self.dense_path),
            "tokens": str(self.tokens_path),
            "dense_sha256": self.dense_sha256,
            "tokens_sha256": self.tokens_sha256,
            "colbert_options": self.colbert_options,
            **{k: v for k, v in self._overrides.items() if v is not None},
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the encoder's folder (``uibk_encoder.json`` + ``projections.npz``); the two
        model folders are referred to by path and content hash, not copied."""
        self.save_projections(path)

    def write_st_input(self, out: Path) -> dict[str, Any]:
        """Copy the two model folders into ``out`` (``dense/``, ``tokens/``, checked against the
        content hashes taken when they loaded) and write ``composed_input.json``, the first module
        (:class:`~uibk_embedding.encoder.pylate_modules.tagged_modules.ComposedInput`) of the
        sentence-transformers 6 folder that
        :func:`~uibk_embedding.encoder.pylate_model.save_sentence_transformers` writes; return it."""
        options = dict(self.colbert_options)
        knobs = {k: options.pop(k) for k in ("query_length", "document_length", "query_expansion")
                 if k in options}
        if options:
            raise NotImplementedError(
                f"colbert_options {sorted(options)} are loader options of this session (not part of the "
                "model): a sentence-transformers export records only query_length, document_length and "
                "query_expansion; load the composed encoder without them to export it")
        for sub, src, digest in (("dense", self.dense_path, self.dense_sha256),
                                 ("tokens", self.tokens_path, self.tokens_sha256)):
            dst = out / sub
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".*", "__pycache__"))
            if model_digest(dst) != digest:
                raise ModelChanged(
                    f"the {sub} model at {src} changed since this composed encoder loaded it (its files "
                    "no longer hash to what it runs): load the encoder again, then export it")
        cfg = {"dense_folder": "dense", "tokens_folder": "tokens",
               "dense_prompts": {"query": self.query_prompt, "document": self.document_prompt},
               "token_prompts": {"query": self._colbert_prompts[True],
                                 "document": self._colbert_prompts[False]},
               "dense_lengths": {"query": int(self.dense_lengths[True]),
                                 "document": int(self.dense_lengths[False])},
               "token_knobs": knobs, "query_length": int(self.query_max_length),
               "document_length": int(self.doc_max_length)}
        (out / "composed_input.json").write_text(json.dumps(cfg, indent=2))
        return cfg

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        dense: str | os.PathLike | None = None,
        tokens: str | os.PathLike | None = None,
        **options: Any,
    ) -> ComposedEncoder:
        """Reload a saved composed encoder. ``dense=`` / ``tokens=`` point it at moved model
        folders; either way each model's content hash must equal the saved one."""
        path = Path(path)
        cfg = json.loads((path / CONFIG_NAME).read_text())
        if cfg.get("kind") != KIND:
            raise ValueError(f"{path / CONFIG_NAME}: not a composed encoder (kind {cfg.get('kind')!r})")
        folders = {"dense": Path(dense or cfg["dense"]), "tokens": Path(tokens or cfg["tokens"])}
        for head, folder in folders.items():
            if not folder.is_dir():
                raise FileNotFoundError(
                    f"{path}: its {head} model folder {folder} does not exist (moved? pass "
                    f"{head}=NEW_FOLDER to load_encoder)")
            now = model_digest(folder)
            if now != cfg[f"{head}_sha256"]:
                raise ModelChanged(
                    f"{path}: the {head} model at {folder} is not the one this encoder was saved "
                    f"with (content sha256 {now[:12]}... now, {cfg[f'{head}_sha256'][:12]}... "
                    "saved). Vectors of the two models must not share an index: re-encode the "
                    "collection with a new encoder, or point to the original model folder")
        opts: dict[str, Any] = {k: cfg[k] for k in (
            "seed", "dense_weight", "query_token_cap", "projection", "query_max_length",
            "doc_max_length", "colbert_options", "query_prompt", "document_prompt") if k in cfg}
        opts["format"] = TaggedFormat.from_dict(cfg["format"])
        saved = read_saved_projections(path, cfg)  # a fitted projection: its checked matrices
        if saved is not None:  # fitted: its matrices keep their kind
            refuse_other_kind(path, opts["projection"], options)
        elif options.get("projection", "random") != "random" and options.get("projections") is None:
            # seeded: there are no fitted matrices to load
            raise ValueError(
                f"{path} holds the seeded random projection; projection={options['projection']!r} "
                "needs fitted matrices: fit them with encoder.fit_projection(texts) or `uibk-embed "
                "fit-projection`, save the encoder and load that folder (or leave projection= out)")
        if saved is None and (path / PROJECTIONS_NAME).exists():  # seeded: the matrices saved
            with np.load(path / PROJECTIONS_NAME) as z:
                saved = {"R": z["R"], "P": z["P"]}
        if saved is not None:
            opts["projections"] = saved
        return cls(folders["dense"], folders["tokens"], **{**opts, **options})

    # -- the pipeline's two hooks (see TaggedEncoder) ---------------------------------------
    def _tokenize(self, texts: list[str], is_query: bool) -> TokenBatch:
        import torch

        cb = self.colbert
        task = "query" if is_query else "document"
        with self._tok_lock:
            # token head: the model's own preprocessing (its prompt / marker, lengths, expansion)
            cprompt = self._colbert_prompts[is_query]
            tok = dict(cb.preprocess(texts, prompt=cprompt or None, task=task))
            # dense head: the model's prompt, then its own tokeniser, cut at our length
            prompt = self.query_prompt if is_query else self.document_prompt
            dtexts = [prompt + t for t in texts] if prompt else texts
            limit = self.dense_lengths[is_query]
            self.dense_model.max_seq_length = limit
            dense = dict(self.dense_model.preprocess(texts, prompt=prompt or None, task=task))
        keep = self._kept(tok, task).numpy()
        n = keep.sum(axis=1).astype(np.int64)
        order = np.argsort(~keep, axis=1, kind="stable")  # kept positions first, in order
        inputs: dict[str, Any] = {k: v for k, v in tok.items() if isinstance(v, torch.Tensor)}
        inputs["keep"] = torch.from_numpy(np.ascontiguousarray(order, dtype=np.int64))
        for k, v in dense.items():
            if isinstance(v, torch.Tensor):
                inputs[f"dense.{k}"] = v
        inputs["dense.task_is_query"] = torch.tensor(int(is_query))
        if isinstance(dense.get("prompt_length"), int):
            inputs["dense.prompt_length"] = torch.tensor(int(dense["prompt_length"]))
        cut = self._dense_truncated(dtexts, dense["attention_mask"], limit)
        if not is_query:
            cut |= self._colbert_truncated([cprompt + t for t in texts] if cprompt else texts)
        return TokenBatch(inputs, starts=np.zeros_like(n), ends=n, truncated=cut)

    def _row_token_ids(self, tb: TokenBatch) -> list[np.ndarray] | None:
        """The ids at the positions the token model keeps (``keep``: kept positions first)."""
        ids, order = tb.inputs["input_ids"].numpy(), tb.inputs["keep"].numpy()
        return [ids[i, order[i, :n]].astype(np.int64) for i, n in enumerate(tb.ends)]

    def _vocabulary_tokenizer(self) -> Any:
        return getattr(self.colbert, "tokenizer", None)

    def _kept(self, features: dict[str, Any], task: str) -> Any:
        """The positions the token model scores (its ``MultiVectorMask``: the document
        skiplist, the query expansion), computed on the host from the ids alone."""
        f = {k: features[k] for k in ("input_ids", "query_expansion_positions") if k in features}
        f["attention_mask"] = features["attention_mask"].clone()
        for m in self._masks:
            f = m(f, task=task)
        return f["attention_mask"].bool()

    def _dense_truncated(self, texts: list[str], mask: Any, limit: int) -> np.ndarray:
        lengths = mask.sum(1).numpy()
        cut = np.zeros(len(texts), dtype=bool)
        full = np.flatnonzero(lengths >= limit)  # only these can have been cut
        if len(full):
            enc = self.dense_model.tokenizer([texts[i] for i in full], add_special_tokens=True,
                                             truncation=False, verbose=False)
            cut[full] = [len(x) > limit for x in enc["input_ids"]]
        return cut

    def _colbert_truncated(self, texts: list[str]) -> np.ndarray:
        """Documents the token model cut: their full token count, prompt and special tokens
        included, over its document length."""
        limit = self._colbert_limits[False]
        if limit is None:
            return np.zeros(len(texts), dtype=bool)
        enc = self.colbert.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)
        return np.array([len(x) > limit for x in enc["input_ids"]], dtype=bool)

    def _to_device(self, inputs: dict[str, Any]) -> dict[str, Any]:
        # the 0-d settings (task, prompt length) stay on the host: reading them then never
        # waits for the device
        return {k: v if k in _HOST_KEYS else v.to(self.device, non_blocking=True)
                for k, v in inputs.items()}

    def _forward(self, inputs: dict[str, Any]) -> tuple[Any, Any]:
        import torch

        keep = inputs["keep"]
        tok = {k: v for k, v in inputs.items() if k != "keep" and not k.startswith("dense.")}
        dense = {k[6:]: v for k, v in inputs.items() if k.startswith("dense.")}
        task = "query" if int(dense.pop("task_is_query")) else "document"
        if "prompt_length" in dense:
            dense["prompt_length"] = int(dense["prompt_length"])
        if "attention_mask" in dense:  # pooling may edit the mask in place (include_prompt=False)
            dense["attention_mask"] = dense["attention_mask"].clone()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=self.amp_dtype is not None):
            emb = self.colbert(tok, task=task)["token_embeddings"].float()
            g = self.dense_model(dense, task=task)["sentence_embedding"].float()
        # the token model's kept vectors (skiplist / expansion rules), left-aligned: row i holds
        # them in positions 0 .. ends[i] - 1 (TokenBatch.starts = 0)
        states = torch.gather(emb, 1, keep.unsqueeze(-1).expand(-1, -1, emb.shape[-1]))
        return torch.nn.functional.normalize(g, dim=-1), states


__all__ = ["ComposedEncoder", "check_colbert_folder", "model_digest"]
