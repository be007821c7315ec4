"""Encoders that emit tagged multi-vector lists, and the format itself.

>>> from uibk_embedding.encoder import TaggedFormat
>>> TaggedFormat().beta
0.9
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from uibk_embedding.encoder.base import CONFIG_NAME, Encoder, TaggedEncoder, validate_texts
from uibk_embedding.encoder.tagged import (
    Decomposition,
    TaggedFormat,
    check_separation,
    decompose,
    dense_vector,
)


def load_encoder(path: str | os.PathLike | None = None, **options: Any) -> Encoder:
    """Load an encoder.

    * ``None``: the embedded default (all-MiniLM-L6-v2 composition, offline);
    * a folder with ``uibk_encoder.json``: an encoder saved by this library;
    * any other local Hugging Face model folder: one-pass composition of that model
      (mean-pooled sentence vector + contextual token states).

    ``options`` go to the encoder (``dense_weight``, ``device``, ``format``, ...).

    >>> enc = load_encoder()
    >>> enc.model_name
    'embedded:all-MiniLM-L6-v2'
    """
    from uibk_embedding.encoder.transformer import EMBEDDED_NAME, TransformerEncoder

    if path is None or str(path) == EMBEDDED_NAME:
        return TransformerEncoder(EMBEDDED_NAME, **options)
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no encoder at {p}")
    cfg_file = p / CONFIG_NAME
    if cfg_file.exists():
        cfg = json.loads(cfg_file.read_text())
        kind = cfg.get("kind")
        if kind == "uibk":
            from uibk_embedding.encoder.uibk import UIBKEncoder

            return UIBKEncoder.from_pretrained(p, **options)
        if kind == "transformer":
            from uibk_embedding.encoder.projection import read_saved_projections

            opts = {k: cfg[k] for k in ("seed", "dense_weight", "query_token_cap", "projection",
                                       "query_max_length", "doc_max_length") if k in cfg}
            opts["format"] = TaggedFormat.from_dict(cfg["format"])
            saved = read_saved_projections(p, cfg)  # None: seeded, redrawn from the seed
            if saved is not None:
                opts["projections"] = saved
            return TransformerEncoder(cfg.get("model", p), **{**opts, **options})
        raise ValueError(f"{cfg_file}: unknown encoder kind {kind!r}")
    if (p / "config.json").exists():
        return TransformerEncoder(p, **options)
    raise FileNotFoundError(f"{p} holds neither {CONFIG_NAME} nor a Hugging Face config.json")


__all__ = [
    "Decomposition",
    "Encoder",
    "TaggedEncoder",
    "TaggedFormat",
    "check_separation",
    "decompose",
    "dense_vector",
    "load_encoder",
    "validate_texts",
]
