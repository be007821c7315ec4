"""Encoders that emit tagged multi-vector lists, and the format itself.

>>> from uibk_embedding.encoder import TaggedFormat
>>> TaggedFormat().beta
0.9
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from uibk_embedding.encoder.base import TaggedEncoder
from uibk_embedding.encoder.composed import ComposedEncoder
from uibk_embedding.encoder.fixed_projections import CONFIG_NAME
from uibk_embedding.encoder.hub import is_hub_id, resolve_model
from uibk_embedding.encoder.inputs import validate_texts
from uibk_embedding.encoder.projection import read_saved_projections, refuse_other_kind
from uibk_embedding.encoder.protocol import Encoder, LocalEncoder
from uibk_embedding.encoder.pylate_model import MODULES_NAME, PyLateEncoder, is_pylate_folder
from uibk_embedding.encoder.transformer import EMBEDDED_NAME, TransformerEncoder
from uibk_embedding.encoder.uibk import UIBKEncoder, read_json
from uibk_embedding.tagged import (
    Decomposition,
    TaggedFormat,
    check_separation,
    decompose,
    dense_vector,
)


def load_encoder(
    path: str | os.PathLike | None = None,
    *,
    dense: str | os.PathLike | None = None,
    tokens: str | os.PathLike | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    token: bool | str | None = None,
    cache_folder: str | os.PathLike | None = None,
    local_files_only: bool = False,
    **options: Any,
) -> LocalEncoder:
    """Load an encoder (in this process; every one satisfies :class:`LocalEncoder`).

    * ``None``: the embedded default (all-MiniLM-L6-v2 composition, offline);
    * a multi-vector model folder (``modules.json`` + a ``config_sentence_transformers.json`` of
      sentence-transformers 6's ``MultiVectorEncoder`` or of PyLate), such as our exports
      (``save_sentence_transformers``, ``save_pylate``) or the released UIBK-Embedding-v1: run by
      sentence-transformers 6's ``MultiVectorEncoder`` and checked to emit tagged lists
      (:class:`~uibk_embedding.encoder.pylate_model.PyLateEncoder`; the ``colbert`` extra; what
      loads: docs/loading.md). A folder with its own module code needs ``trust_remote_code=True``;
    * a folder with ``uibk_encoder.json``: an encoder saved by this library;
    * any other local Hugging Face model folder: one-pass composition of that model (its
      sentence vector pooled as its sentence-transformers ``modules.json`` says -- CLS, mean,
      max, ... then ``Normalize`` --, mean pooling without one; and its contextual token states);
    * ``dense=FOLDER, tokens=FOLDER`` (no ``path``): bring your own models -- a
      sentence-transformers dense model and a ColBERT model (any checkpoint ``MultiVectorEncoder``
      loads: its own saves, PyLate's, Stanford ColBERT) composed into one tagged list, two forward
      passes (:mod:`uibk_embedding.encoder.composed`, the ``colbert`` extra).
      With a saved composed encoder as ``path``, ``dense=`` / ``tokens=`` say where its
      models moved (their content must be unchanged).

    ``path``, ``dense`` and ``tokens`` may also be Hugging Face Hub ids (``"org/name"``, when no
    such local path exists): fetched, or found in the cache, by ``huggingface_hub`` as
    sentence-transformers does (:mod:`uibk_embedding.encoder.hub`): ``revision`` (a branch, tag
    or commit hash, for every id of the call), ``token`` (a private or gated model; default: the
    login's), ``cache_folder`` (default ``HF_HUB_CACHE``) and ``local_files_only`` (as
    ``HF_HUB_OFFLINE=1``: the cache only). The snapshot folder is then loaded as any folder, under
    the same trust rules.

    ``options`` go to the encoder (``dense_weight``, ``device``, ``format``, ...);
    ``backend="onnx"``, ``"openvino"`` or ``"openvino-bf16"`` runs the embedded default (or a
    folder saved from it) on ONNX Runtime or OpenVINO, on the CPU
    (:class:`~uibk_embedding.encoder.transformer.TransformerEncoder`; docs/loading.md, "CPU backends").
    ``trust_remote_code``: let a model folder run the Python code it ships (read it first).
    Without it, a folder that would import any Python file of its own -- a ``modules.json``
    type that is not an exact installed sentence-transformers / PyLate class, an ``auto_map``
    in ``config.json`` or ``tokenizer_config.json``, a file shadowing an installed package
    (:func:`~uibk_embedding.encoder.trust.code_risks`) -- is refused with
    :class:`~uibk_embedding.errors.UntrustedCode` before anything loads, on every route
    (a folder, ``dense=`` / ``tokens=``, a saved encoder's models).

    >>> enc = load_encoder()
    >>> enc.model_name
    'embedded:all-MiniLM-L6-v2'
    >>> load_encoder(dense="some/folder")
    Traceback (most recent call last):
    ...
    ValueError: composing two models needs both dense= (a sentence-transformers model folder) ...
    """
    backend = options.get("backend", "torch")
    embedded = path is None or str(path) == EMBEDDED_NAME
    if backend != "torch" and not embedded and not _saved_embedded(path):
        raise ValueError(f"backend={backend!r} runs the embedded default only (load_encoder(backend=...) "
                         "or a folder saved from it); other encoders run on torch")
    composing = dense is not None or tokens is not None
    if composing and path is None and (dense is None or tokens is None):
        raise ValueError("composing two models needs both dense= (a sentence-transformers "
                         "model folder) and tokens= (a ColBERT model folder)")
    if revision is not None and (path is None or str(path) == EMBEDDED_NAME) and not composing:
        raise ValueError("revision= applies to a Hugging Face Hub id; the embedded default has none")
    hub = {"revision": revision, "token": token, "cache_folder": cache_folder,
           "local_files_only": local_files_only}
    if path is not None and str(path) != EMBEDDED_NAME:
        path = _local(path, hub)
    dense = _local(dense, hub) if dense is not None else None
    tokens = _local(tokens, hub) if tokens is not None else None
    if composing and path is None:
        return ComposedEncoder(dense, tokens, trust_remote_code=trust_remote_code, **options)
    if path is None or str(path) == EMBEDDED_NAME:
        if composing:
            raise ValueError("dense= / tokens= relocate the models of a saved composed encoder; "
                             "the embedded default has none")
        return TransformerEncoder(EMBEDDED_NAME, trust_remote_code=trust_remote_code, **options)
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(_no_encoder_message(str(path)))

    if is_pylate_folder(p) and not (p / CONFIG_NAME).exists():
        if composing:
            raise ValueError(f"{p} is a PyLate model: dense= / tokens= compose two models without a "
                             "path; a PyLate model that emits tagged lists is loaded alone")
        return PyLateEncoder(p, trust_remote_code=trust_remote_code, **options)
    cfg_file = p / CONFIG_NAME
    cfg = read_json(cfg_file) if cfg_file.exists() else None
    kind = cfg.get("kind") if cfg is not None else None
    if composing and kind != "composed":
        raise ValueError(f"{p} is not a saved composed encoder: dense= / tokens= without a path "
                         "compose two models; with a path they relocate a saved composed encoder")
    if cfg is not None:
        if kind == "composed":
            return ComposedEncoder.from_pretrained(p, dense=dense, tokens=tokens,
                                                   trust_remote_code=trust_remote_code, **options)
        if kind == "uibk":
            return UIBKEncoder.from_pretrained(p, **options)
        if kind == "transformer":
            opts = {k: cfg[k] for k in ("seed", "dense_weight", "query_token_cap", "projection",
                                       "query_max_length", "doc_max_length") if k in cfg}
            opts.setdefault("projection", "random")  # saved without one: seeded (not the default)
            opts["format"] = TaggedFormat.from_dict(cfg["format"])
            saved = read_saved_projections(p, cfg)  # None: seeded, redrawn from the seed
            if saved is not None:
                opts["projections"] = saved
                refuse_other_kind(p, opts["projection"], options)
            return TransformerEncoder(cfg.get("model", p), trust_remote_code=trust_remote_code,
                                      **{**opts, **options})
        raise ValueError(f"{cfg_file}: unknown encoder kind {kind!r}")
    if (p / "config.json").exists():
        missing = _missing_own_config(p)
        if missing:
            raise ValueError(f"{p} looks like {missing[0]} but has no {missing[1]}: restore that file "
                             "(without it the folder would load as a plain Hugging Face model, "
                             "its weights unread)")
        return TransformerEncoder(p, trust_remote_code=trust_remote_code, **options)
    raise FileNotFoundError(f"{p} holds neither {CONFIG_NAME} nor a Hugging Face config.json")


def _saved_embedded(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an encoder folder saved from the embedded default (its configuration
    names the embedded model: a fitted projection, ...)."""
    cfg_file = Path(path) / CONFIG_NAME
    try:
        cfg = read_json(cfg_file) if cfg_file.is_file() else None
    except Exception:  # the loader reports a damaged configuration
        return False
    return isinstance(cfg, dict) and cfg.get("kind") == "transformer" and cfg.get("model") == EMBEDDED_NAME


def _local(name: str | os.PathLike, hub: dict[str, Any]) -> str | os.PathLike:
    """``name`` as given when it is a local path (or none at all: the missing folder is reported
    by the loader), the Hub snapshot folder of a Hub id
    (:func:`~uibk_embedding.encoder.hub.resolve_model`)."""
    if Path(name).exists() or not is_hub_id(str(name)):
        if hub["revision"] is not None:
            return resolve_model(name, revision=hub["revision"])  # refused: a local folder
        return name
    return resolve_model(name, **hub)


def _missing_own_config(folder: Path) -> tuple[str, str] | None:
    """What a folder with a Hugging Face ``config.json`` but no configuration of its own looks
    like, and the file it lacks: a UIBK folder (``trunk.*`` weights, :data:`CONFIG_NAME`
    missing) or a PyLate export (``branched_transformer.json``, ``modules.json`` missing).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "branched_transformer.json").write_text("{}")
    >>> _missing_own_config(d)
    ('a PyLate model folder', 'modules.json')
    """
    if not (folder / MODULES_NAME).exists() and ((folder / "branched_transformer.json").exists()
                                                 or (folder / "1_HybridTokens").is_dir()):
        return "a PyLate model folder", MODULES_NAME
    weights = folder / "model.safetensors"
    if weights.is_file():
        try:
            from safetensors import safe_open

            with safe_open(str(weights), framework="pt") as f:
                uibk = any(k.startswith("trunk.") for k in f.keys())
        except Exception:  # damaged weights: the model's own loader names them
            return None
        if uibk:
            return "a UIBK model folder", CONFIG_NAME
    return None


def _no_encoder_message(path: str) -> str:
    """What a missing encoder path says (a Hub id never gets here: :func:`_local` fetches it).

    >>> _no_encoder_message("/srv/models/mine")
    'no encoder at /srv/models/mine'
    """
    return f"no encoder at {path}"


__all__ = [
    "Decomposition",
    "Encoder",
    "LocalEncoder",
    "TaggedEncoder",
    "TaggedFormat",
    "check_separation",
    "decompose",
    "dense_vector",
    "load_encoder",
    "validate_texts",
]
