"""sentence-transformers' pooling modes (then ``Normalize``) over right-padded token states.

One function for both places that pool: :class:`uibk_embedding.encoder.pooling.PoolingSpec`
(the library's one-pass encoders) and ``branched_transformer.py`` in a saved PyLate model folder,
so the two give the same sentence vector. Imports only torch, and that when it pools (importing
the library's encoders stays light).

Example
-------
>>> import torch
>>> states = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [9.0, 9.0]]])
>>> pool(states, torch.tensor([[1, 1, 0]]), ["cls", "mean", "lasttoken"], normalize=False).tolist()
[[1.0, 0.0, 2.0, 1.0, 3.0, 2.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def pool(states: torch.Tensor, mask: torch.Tensor, modes: Sequence[str], normalize: bool) -> torch.Tensor:
    """Pool ``states`` ``(B, T, H)`` under ``mask`` ``(B, T)`` (1 = a real token, right padding)
    with each of ``modes`` (``cls``, ``max``, ``mean``, ``mean_sqrt_len``, ``weightedmean``,
    ``lasttoken``), concatenated in that order, L2-normalised when ``normalize``."""
    import torch

    m = mask.to(states.dtype).unsqueeze(-1)
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(states[:, 0])
        elif mode == "max":
            out.append(states.masked_fill(m == 0, -1e9).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len"):
            total = (states * m).sum(1)
            count = m.sum(1).clamp(min=1e-9)
            out.append(total / (count if mode == "mean" else torch.sqrt(count)))
        elif mode == "weightedmean":
            w = m * torch.arange(1, states.shape[1] + 1, device=states.device,
                                 dtype=states.dtype).view(1, -1, 1)
            out.append((states * w).sum(1) / w.sum(1).clamp(min=1e-9))
        elif mode == "lasttoken":  # the last position with mask 1
            last = (mask.sum(1).long() - 1).clamp(min=0)
            out.append(states[torch.arange(states.shape[0], device=states.device), last]
                       * (mask.sum(1, keepdim=True) > 0).to(states.dtype))
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    g = out[0] if len(out) == 1 else torch.cat(out, dim=1)
    return torch.nn.functional.normalize(g, dim=-1) if normalize else g
