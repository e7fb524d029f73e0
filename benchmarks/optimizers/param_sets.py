"""The parameter sets the optimizer benchmarks share."""
from __future__ import annotations


def gpt_medium_shapes(layers: int = 24, d: int = 1024, vocab: int = 50304, positions: int = 1024) -> list[tuple[int, ...]]:
    """289 tensors, 354.9M parameters: 24 layers x 12 tensors (qkv 3072x1024, proj 1024x1024, fc1
    4096x1024, fc2 1024x4096, each with its bias, and two LayerNorms' weight and bias) plus one
    embedding table holding the 50304 token rows, the 1024 position rows and the final LayerNorm
    (51330x1024), so the parameter count matches GPT-2 medium's."""
    per_layer = [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,), (d,), (d,), (d,), (d,)]
    return [(vocab + positions + 2, d)] + per_layer * layers
