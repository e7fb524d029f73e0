"""A small GPT (pre-norm decoder) whose norm layer is a constructor argument, so the same model
runs with torch.nn.LayerNorm or apex's FusedLayerNorm/FusedRMSNorm."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):  # x: (batch, time, dim)
        batch, time, dim = x.shape
        q, k, v = self.qkv(x).view(batch, time, 3, self.heads, dim // self.heads).transpose(1, 3).unbind(2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, heads, time, head_dim)
        return self.proj(y.transpose(1, 2).reshape(batch, time, dim))


class Block(nn.Module):
    def __init__(self, dim, heads, norm):
        super().__init__()
        self.norm1, self.attn = norm(dim), CausalSelfAttention(dim, heads)
        self.norm2 = norm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """tokens (batch, time) int64 -> logits (batch, time, vocab)."""

    def __init__(self, vocab, context, dim=128, heads=4, layers=2, norm=nn.LayerNorm):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)
        self.position_embedding = nn.Parameter(torch.zeros(context, dim))
        self.blocks = nn.Sequential(*(Block(dim, heads, norm) for _ in range(layers)))
        self.norm = norm(dim)
        self.head = nn.Linear(dim, vocab)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)

    def forward(self, tokens):
        x = self.token_embedding(tokens) + self.position_embedding[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(x)))
