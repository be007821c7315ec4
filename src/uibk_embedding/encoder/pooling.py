"""The pooling a sentence-transformers folder declares, applied to token states (one pass).

A sentence-transformers model folder says how its sentence vector is made: ``modules.json``
lists the modules (``Transformer``, then ``Pooling``, then optionally ``Normalize``) and
``1_Pooling/config.json`` the pooling modes (CLS, max, mean, mean / sqrt(length), weighted
mean, last token; several modes are concatenated, in that order). :class:`PoolingSpec` reads
that and pools token states the same way, so the one-pass composition of a single folder
(:class:`~uibk_embedding.encoder.transformer.TransformerEncoder`) gives the sentence vector the
model was trained with. A folder without ``modules.json`` (a plain Hugging Face model) gets
normalised mean pooling.

Modules that one pass cannot honour (a ``Dense`` layer after pooling, a ``Router``, a PyLate
projection, ...) are refused with the reason: compose such a model with
``load_encoder(dense=..., tokens=...)`` (:mod:`uibk_embedding.encoder.composed`), which runs
the model's own sentence-transformers modules.

Example
-------
>>> import torch
>>> spec = PoolingSpec(modes=("cls", "mean"), normalize=False)
>>> states = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [9.0, 9.0]]])
>>> mask = torch.tensor([[1, 1, 0]])
>>> spec.pool(states, mask).tolist()
[[1.0, 0.0, 2.0, 1.0]]
>>> spec.dim(2)
4
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uibk_embedding.encoder.pylate_modules.sentence_pooling import pool

# ``1_Pooling/config.json`` keys, in the order sentence-transformers concatenates the modes
_MODES = (
    ("cls", "pooling_mode_cls_token"),
    ("max", "pooling_mode_max_tokens"),
    ("mean", "pooling_mode_mean_tokens"),
    ("mean_sqrt_len", "pooling_mode_mean_sqrt_len_tokens"),
    ("weightedmean", "pooling_mode_weightedmean_tokens"),
    ("lasttoken", "pooling_mode_lasttoken"),
)


def _short(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1]


def read_modules(folder: str | os.PathLike) -> list[dict[str, Any]] | None:
    """The entries of a folder's ``modules.json`` (None when it has none).

    >>> import tempfile, pathlib
    >>> read_modules(pathlib.Path(tempfile.mkdtemp()) / "missing") is None
    True
    """
    f = Path(folder) / "modules.json"
    if not f.exists():
        return None
    try:
        mods = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from e
    if not isinstance(mods, list) or not all(isinstance(m, dict) and "type" in m for m in mods):
        raise ValueError(f"{f}: expected a list of modules with a 'type' each")
    return sorted(mods, key=lambda m: int(m.get("idx", 0)))


@dataclass(frozen=True)
class PoolingSpec:
    """How a sentence vector is pooled from token states.

    Parameters
    ----------
    modes: pooling modes, concatenated in this order (``cls``, ``max``, ``mean``,
        ``mean_sqrt_len``, ``weightedmean``, ``lasttoken``).
    normalize: L2-normalise the pooled vector (a ``Normalize`` module).
    source: where the spec came from (for messages).

    >>> PoolingSpec().modes, PoolingSpec().normalize
    (('mean',), True)
    """

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = True
    source: str = "default: normalised mean pooling"

    def __post_init__(self) -> None:
        known = {m for m, _ in _MODES}
        if not self.modes or any(m not in known for m in self.modes):
            raise ValueError(f"pooling modes must be a non-empty subset of {sorted(known)}, "
                             f"got {self.modes!r}")

    @classmethod
    def from_folder(cls, folder: str | os.PathLike) -> PoolingSpec:
        """The pooling a model folder declares; normalised mean pooling when it declares none.

        A ``modules.json`` must be ``Transformer``, ``Pooling`` and optionally ``Normalize``:
        anything else cannot be reproduced from one pass of token states and is refused.
        """
        folder = Path(folder)
        mods = read_modules(folder)
        if mods is None:
            return cls()
        # by class name: sentence-transformers versions spell the module path differently
        names = [_short(str(m["type"])) for m in mods]
        if (len(names) < 2 or names[0] != "Transformer" or names[1] != "Pooling"
                or any(n != "Normalize" for n in names[2:])):
            raise ValueError(
                f"{folder / 'modules.json'} lists the modules {names}: one-pass composition "
                "honours Transformer -> Pooling [-> Normalize] only. Compose this model with "
                "load_encoder(dense=folder, tokens=colbert_folder), which runs its own "
                "sentence-transformers modules (two forward passes)")
        cfg_file = folder / str(mods[1].get("path", "")) / "config.json"
        try:
            cfg = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{cfg_file}: cannot read the pooling configuration ({e})") from e
        modes = tuple(m for m, key in _MODES if cfg.get(key))
        declared = cfg.get("pooling_mode")  # sentence-transformers 6: one mode or a list, in order
        if not modes and declared:
            names6 = (declared,) if isinstance(declared, str) else tuple(str(m) for m in declared)
            modes = tuple("mean_sqrt_len" if m == "mean_sqrt_len_tokens" else m for m in names6)
        if not modes:
            raise ValueError(f"{cfg_file}: no pooling mode is switched on")
        if not cfg.get("include_prompt", True):
            raise ValueError(f"{cfg_file}: include_prompt=false (the prompt is cut before "
                             "pooling) needs the model's own modules: use load_encoder(dense=...)")
        return cls(modes=modes, normalize=len(names) > 2, source=str(cfg_file))

    def dim(self, hidden: int) -> int:
        """Size of the pooled vector for token states of size ``hidden``."""
        return hidden * len(self.modes)

    def pool(self, states: Any, mask: Any) -> Any:
        """Pool ``states`` ``(B, T, H)`` under ``mask`` ``(B, T)`` (1 = a real token, right
        padding) as sentence-transformers' ``Pooling`` (then ``Normalize``) does."""
        return pool(states, mask, self.modes, self.normalize)

    def describe(self) -> str:
        """A short human-readable form, e.g. ``'cls + normalize'``.

        >>> PoolingSpec(modes=("cls",)).describe()
        'cls + normalize'
        """
        return " + ".join(self.modes) + (" + normalize" if self.normalize else "")


__all__ = ["PoolingSpec", "read_modules"]
