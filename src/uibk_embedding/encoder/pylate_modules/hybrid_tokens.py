"""Second module of a UIBK-Embedding PyLate model: the tagged construction (docs/format.md#constants).

A PyLate ``Dense`` (PyLate replaces any other module after the first by a plain ``Dense``). Its
``linear`` layer is the fixed token projection ``R'`` (127 x d) with a zero first row: the
128-d output's coordinate 0 is left for the tag. It also holds the fixed ``R`` (381 x D) and a
float32 copy of ``R'``, kept out of the parameters so that a cast of the model to bfloat16
rounds neither (the copy is used when the linear layer is in a lower precision).

From ``token_embeddings`` ``(B, T, d)`` and ``sentence_embedding`` ``(B, D)`` (the first module)
it writes ``token_embeddings`` ``(B, T, 128)``: rows 0-2 are the slots
``[-sqrt(1 - delta); sqrt(delta) g_s]`` (``g_s`` the normalised 127-d slices of ``R g``), then
one row per text token ``[+sqrt(1 - beta); sqrt(beta) u_t]`` (``u_t`` = ``R' h_t`` normalised),
and sets ``attention_mask`` to the rows of the list, so that PyLate's ``encode`` returns exactly
the tagged list (its skiplist is empty, its query expansion off). Queries (the query marker at
position 1) keep their first ``query_token_cap`` text tokens.

Written into the model folder by ``uibk_embedding``'s ``save_pylate``; imports only torch,
safetensors and pylate.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any

import torch
from pylate.models import Dense
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
PROJECTIONS_NAME = "projections.safetensors"
N_SLOTS = 3
#: where the first text token sits in PyLate's positions: after [CLS] marker prompt (uibk), after
#: [CLS] and the marker (transformer)
FIRST_TOKEN = {"uibk": 3, "transformer": 2}


class HybridTokens(Dense):
    """Tagged lists from the two heads (see the module docstring).

    Parameters
    ----------
    in_features: size ``d`` of the token states.
    R: ``(381, D)`` float32, the slot projection; P: ``(127, d)``, the token projection ``R'``.
    beta, lambda_: the format's constants.
    layout: ``"uibk"`` or ``"transformer"`` (where the text tokens sit).
    query_marker_id: the id PyLate inserts at position 1 of a query.
    query_token_cap: text tokens of a query that take part in token matching.

    >>> R, P = torch.linalg.qr(torch.randn(381, 32))[0], torch.linalg.qr(torch.randn(127, 16))[0]
    >>> m = HybridTokens(16, R=R, P=P, query_marker_id=5)
    >>> ids = torch.tensor([[2, 5, 7, 11, 12, 3], [2, 6, 7, 11, 3, 0]])  # a query, a document
    >>> f = m({"token_embeddings": torch.randn(2, 6, 16), "sentence_embedding": torch.randn(2, 32),
    ...        "input_ids": ids, "attention_mask": (ids > 0).long()})
    >>> f["attention_mask"].tolist()  # rows of each list: 3 slots, then the text tokens
    [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]
    >>> [round(float(v), 4) for v in f["token_embeddings"][0, 2:4, 0]]  # slot tag, token tag
    [-0.8803, 0.3162]
    """

    def __init__(self, in_features: int, out_features: int = 128, bias: bool = False,
                 activation_function: nn.Module | None = None, init_weight: torch.Tensor | None = None,
                 init_bias: torch.Tensor | None = None, use_residual: bool = False, *,
                 R: torch.Tensor | None = None, P: torch.Tensor | None = None, beta: float = 0.9,
                 lambda_: float = 0.75, layout: str = "uibk", query_marker_id: int = -1,
                 query_token_cap: int = 64) -> None:
        if P is not None and init_weight is None:
            init_weight = torch.cat([torch.zeros(1, P.shape[1], dtype=P.dtype), P]).float()
        super().__init__(in_features, out_features, bias=False, activation_function=nn.Identity(),
                         init_weight=init_weight, use_residual=False)
        if out_features != 128 or (P is not None and tuple(P.shape) != (127, in_features)):
            raise ValueError(f"out_features must be 128 and P (127, {in_features}), got {out_features} "
                             f"and {tuple(P.shape) if P is not None else None}")
        if layout not in FIRST_TOKEN:
            raise ValueError(f"layout must be one of {sorted(FIRST_TOKEN)}, got {layout!r}")
        self.R = None if R is None else R.detach().to(torch.float32).cpu()
        self.P = None if P is None else P.detach().to(torch.float32).cpu()
        self.beta, self.lambda_ = float(beta), float(lambda_)
        self.delta = self.lambda_ * self.beta / N_SLOTS
        self.layout = layout
        self.query_marker_id = int(query_marker_id)
        self.query_token_cap = int(query_token_cap)
        self._R_on: dict[str, torch.Tensor] = {}

    def get_config_dict(self) -> dict[str, Any]:
        return {"in_features": self.in_features, "out_features": self.out_features,
                "beta": self.beta, "lambda_": self.lambda_, "layout": self.layout,
                "query_marker_id": self.query_marker_id, "query_token_cap": self.query_token_cap}

    def __repr__(self) -> str:
        return f"HybridTokens({self.get_config_dict()})"

    def _R(self, device: torch.device) -> torch.Tensor:
        key = str(device)
        if key not in self._R_on:  # float64 where the device has it: one rounding, like the native encoder
            hi = torch.float32 if device.type == "mps" else torch.float64
            self._R_on[key] = self.R.to(device=device, dtype=hi)
        return self._R_on[key]

    def _token_weight(self, device: torch.device) -> torch.Tensor:
        """The linear layer's weight, or the saved float32 ``R'`` (zero first row) when the model
        was cast to a lower precision: the fixed projection is never rounded."""
        w = self.linear.weight
        if w.dtype in (torch.float32, torch.float64) or self.P is None:
            return w.float()
        key = f"P:{device}"
        if key not in self._R_on:
            self._R_on[key] = torch.cat([torch.zeros(1, self.P.shape[1]), self.P]).to(device)
        return self._R_on[key]

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        states = features["token_embeddings"]
        g = features["sentence_embedding"]
        ids, mask = features["input_ids"], features["attention_mask"]
        b, t = ids.shape
        dev = states.device
        R = self._R(dev)
        hi = R.dtype
        # slots: R g -> 3 slices of 127, each normalised, tagged
        z = (g.to(hi) @ R.T).reshape(b, N_SLOTS, -1)
        slots = torch.empty((b, N_SLOTS, self.out_features), dtype=hi, device=dev)
        slots[..., 0] = -math.sqrt(1 - self.delta)
        slots[..., 1:] = z * (math.sqrt(self.delta) / torch.linalg.vector_norm(z, dim=-1, keepdim=True))
        # tokens: R' (the linear layer, zero first row), normalised, tagged
        u = nn.functional.linear(states.float(), self._token_weight(dev))[..., 1:].to(hi)
        toks = torch.empty((b, t, self.out_features), dtype=hi, device=dev)
        toks[..., 0] = math.sqrt(1 - self.beta)
        toks[..., 1:] = u * (math.sqrt(self.beta) / torch.linalg.vector_norm(u, dim=-1, keepdim=True))
        # rows: 3 slots, then the text tokens (no [SEP]); a query keeps its first query_token_cap
        first = FIRST_TOKEN[self.layout]
        n_tok = mask.sum(1) - first - 1
        is_query = ids[:, 1] == self.query_marker_id
        # a text with no token (e.g. "\u200b") keeps [SEP] as its one token row, as the native
        # encoders do (a list without token rows is refused by every store)
        n_tok = torch.where(is_query, n_tok.clamp(max=self.query_token_cap), n_tok).clamp(min=1)
        rows = torch.arange(t, device=dev)
        src = (rows - N_SLOTS + first).clamp(0, t - 1)
        out = torch.gather(toks, 1, src.view(1, t, 1).expand(b, t, self.out_features))
        out[:, :N_SLOTS] = slots
        keep = (rows.view(1, t) < N_SLOTS) | (rows.view(1, t) - N_SLOTS < n_tok.view(b, 1))
        features["token_embeddings"] = torch.where(keep.unsqueeze(-1), out, 0).to(torch.float32)
        features["attention_mask"] = keep.to(mask.dtype)
        return features

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        os.makedirs(output_path, exist_ok=True)
        with open(os.path.join(output_path, CONFIG_NAME), "w") as f:
            json.dump(self.get_config_dict(), f, indent=2)
        save_file({"linear.weight": self.linear.weight.detach().float().cpu().contiguous()},
                  os.path.join(output_path, WEIGHTS_NAME))
        save_file({"R": self.R.contiguous(), "P": self.P.contiguous()},
                  os.path.join(output_path, PROJECTIONS_NAME))
        # sentence-transformers' save copies a custom module's file into the module's own folder,
        # but loads "hybrid_tokens.HybridTokens" from the model's root: put a copy there too, so
        # that a model saved by ColBERT.save loads again
        root = os.path.dirname(os.path.abspath(output_path))
        try:
            shutil.copyfile(os.path.abspath(__file__), os.path.join(root, os.path.basename(__file__)))
        except shutil.SameFileError:
            pass

    @staticmethod
    def load(input_path: str) -> HybridTokens:
        with open(os.path.join(input_path, CONFIG_NAME)) as f:
            config = json.load(f)
        proj = load_file(os.path.join(input_path, PROJECTIONS_NAME))
        weight = load_file(os.path.join(input_path, WEIGHTS_NAME))["linear.weight"]
        return HybridTokens(init_weight=weight, R=proj["R"], P=proj["P"], **config)
