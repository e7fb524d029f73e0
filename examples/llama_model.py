"""A small Llama-style decoder (pre-norm RMSNorm, rotary attention through
F.scaled_dot_product_attention, SwiGLU MLP, no biases) whose norm, rotary embedding and SwiGLU are
passed in, so the same model runs on plain PyTorch ops or on apex's fused ones.

    model = Llama(vocab, context, dim=256, heads=4, layers=4, hidden=704, parts=torch_parts())
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

RMS_EPS = 1e-5
ROPE_BASE = 10000.0


@dataclass
class Parts:
    """The swappable pieces: a norm layer factory, RoPE of q/k [batch, time, heads, head_dim] given
    cos/sin tables [time, head_dim] (float32), and SwiGLU of a gate/up tensor [..., 2 * hidden]."""

    name: str
    norm: Callable[[int], nn.Module]
    rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    swiglu: Callable[[torch.Tensor], torch.Tensor]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def torch_parts() -> Parts:
    """Plain PyTorch: nn.RMSNorm (F.rms_norm), Llama's rotate-half RoPE, F.silu(gate) * up."""

    def rope(x, cos, sin):
        cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)  # [time, 1, head_dim]
        return x * cos + _rotate_half(x) * sin

    def swiglu(x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    return Parts("PyTorch ops", lambda dim: nn.RMSNorm(dim, eps=RMS_EPS), rope, swiglu)


def apex_parts() -> Parts:
    """apex: FusedRMSNorm, fused RoPE (bshd, cached tables), fused SwiGLU."""
    from apex.normalization import FusedRMSNorm
    from apex.transformer.functional import fused_apply_rotary_pos_emb_cached, fused_bias_swiglu

    def rope(x, cos, sin):
        return fused_apply_rotary_pos_emb_cached(x, cos[:, None, None], sin[:, None, None], tensor_format="bshd")

    return Parts("apex fused ops", lambda dim: FusedRMSNorm(dim, eps=RMS_EPS), rope, fused_bias_swiglu)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, parts: Parts):
        super().__init__()
        self.heads, self.parts = heads, parts
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):  # x: [batch, time, dim]
        batch, time, dim = x.shape
        q, k, v = self.qkv(x).view(batch, time, 3, self.heads, dim // self.heads).unbind(2)  # [b, t, h, d] views
        q, k = self.parts.rope(q, cos, sin), self.parts.rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, time, dim))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, parts: Parts):
        super().__init__()
        self.parts = parts
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)  # gate and up projections in one GEMM
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(self.parts.swiglu(self.gate_up(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, parts: Parts):
        super().__init__()
        self.attention_norm, self.attention = parts.norm(dim), Attention(dim, heads, parts)
        self.mlp_norm, self.mlp = parts.norm(dim), MLP(dim, hidden, parts)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """tokens [batch, time] int64 -> logits [batch, time, vocab]."""

    def __init__(self, vocab: int, context: int, *, dim: int, heads: int, layers: int, hidden: int, parts: Parts):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden, parts) for _ in range(layers))
        self.norm = parts.norm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inverse = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(context, dtype=torch.float32), inverse)
        angles = torch.cat((angles, angles), dim=-1)  # [context, head_dim]: half-split (GPT-NeoX) pairs
        # cos + i sin as one complex64 buffer: it moves with the model, and amp O2/O5, which cast
        # every floating tensor of the model to 16 bits, leave it (and the tables' precision) alone.
        self.register_buffer("rotations", torch.polar(torch.ones_like(angles), angles), persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens):
        time = tokens.shape[1]
        table = torch.view_as_real(self.rotations[:time])  # float32 [time, head_dim, (cos, sin)]
        cos, sin = table[..., 0].contiguous(), table[..., 1].contiguous()
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))
