"""The UIBK-Embedding-v1 architecture (docs/model.md): one ModernBERT trunk, a token top and a dense top.

The first ``N - top_layers`` trunk layers run once (shared); the token top is the trunk's last
layers + its final norm + ``Linear(hidden -> token_dim)``, normalised; the dense top is a second
copy of those layers + its own norm + NV-Embed latent-attention pooling, giving the sentence
vector ``g``. Written into a PyLate model folder by ``save_pylate`` (it imports only torch and
transformers) and used by :mod:`uibk_embedding.encoder.uibk` to build its models.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import ModernBertModel
from transformers.models.modernbert import modeling_modernbert as mm


class LatentAttentionPooling(nn.Module):
    """NV-Embed pooling: token states attend to trainable latents, feed-forward, mean."""

    def __init__(self, hidden: int, num_latents: int, heads: int, ff_mult: int, eps: float):
        super().__init__()
        self.heads = heads
        self.latents = nn.Parameter(torch.randn(num_latents, hidden) * 0.02)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.context_norm = nn.LayerNorm(hidden, eps=eps)
        self.to_q = nn.Linear(hidden, hidden, bias=False)
        self.to_kv = nn.Linear(hidden, 2 * hidden, bias=False)
        self.to_out = nn.Linear(hidden, hidden)
        self.ff_norm = nn.LayerNorm(hidden, eps=eps)
        self.ff_in = nn.Linear(hidden, 2 * ff_mult * hidden)
        self.ff_out = nn.Linear(ff_mult * hidden, hidden)

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, h = states.shape
        d = h // self.heads
        q = self.to_q(self.norm(states)).view(b, t, self.heads, d).transpose(1, 2)
        k, v = self.to_kv(self.context_norm(self.latents)).chunk(2, dim=-1)
        k = k.view(-1, self.heads, d).transpose(0, 1).unsqueeze(0).expand(b, -1, -1, -1)
        v = v.view(-1, self.heads, d).transpose(0, 1).unsqueeze(0).expand(b, -1, -1, -1)
        att = torch.softmax((q @ k.transpose(-1, -2)) * d ** -0.5, dim=-1) @ v
        states = states + self.to_out(att.transpose(1, 2).reshape(b, t, h))
        x, gate = self.ff_in(self.ff_norm(states)).chunk(2, dim=-1)
        states = states + self.ff_out(x * nn.functional.gelu(gate))
        m = mask.unsqueeze(-1).to(states.dtype)
        return (states * m).sum(1) / m.sum(1).clamp(min=1)


class UIBKModel(nn.Module):
    """Both heads in one forward pass: ``(g (B, hidden), unit token vectors (B, T, token_dim))``.

    ``backbone``: a ``transformers.ModernBertConfig``; the other sizes as in ``UIBKConfig``.
    """

    def __init__(self, backbone, *, top_layers: int = 4, num_latents: int = 512, latent_heads: int = 8,
                 ff_mult: int = 4, token_dim: int = 128):
        super().__init__()
        bc = backbone
        bc._attn_implementation = bc._attn_implementation or "sdpa"
        n, h = bc.num_hidden_layers, bc.hidden_size
        self.n_shared = n - top_layers
        self.trunk = ModernBertModel(bc)
        self.dense_layers = nn.ModuleList(
            [mm.ModernBertEncoderLayer(bc, i) for i in range(self.n_shared, n)])
        # the dense top starts as a copy of the token top
        for mine, theirs in zip(self.dense_layers, self.trunk.layers[self.n_shared:], strict=True):
            mine.load_state_dict(theirs.state_dict())
        self.dense_norm = nn.LayerNorm(h, eps=bc.norm_eps, bias=bc.norm_bias)
        self.pooler = LatentAttentionPooling(h, num_latents, latent_heads, ff_mult, bc.norm_eps)
        self.token_proj = nn.Linear(h, token_dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        trunk = self.trunk
        hs = trunk.embeddings(input_ids=input_ids)
        mk = {"config": trunk.config, "inputs_embeds": hs, "attention_mask": attention_mask}
        masks = {"full_attention": mm.create_bidirectional_mask(**mk),
                 "sliding_attention": mm.create_bidirectional_sliding_window_mask(**mk)}
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        rope = {lt: trunk.rotary_emb(hs, pos, lt) for lt in set(trunk.config.layer_types)}

        def run(layers, x):
            for layer in layers:
                x = layer(x, attention_mask=masks[layer.attention_type],
                          position_embeddings=rope[layer.attention_type])
            return x

        shared = run(trunk.layers[: self.n_shared], hs)
        tok = trunk.final_norm(run(trunk.layers[self.n_shared:], shared))
        tok = nn.functional.normalize(self.token_proj(tok).float(), dim=-1)
        dense = self.dense_norm(run(self.dense_layers, shared))
        g = self.pooler(dense, attention_mask).float()
        return g, tok
