"""Fused transformer functions: scale-mask-softmax, rotary embedding, bias-SwiGLU."""
from apex.transformer.functional.fused_bias_swiglu import FusedBiasSwiGLU, FusedBiasSwiGLUFunction, fused_bias_swiglu
from apex.transformer.functional.fused_rope import (
    fused_apply_rotary_pos_emb,
    fused_apply_rotary_pos_emb_2d,
    fused_apply_rotary_pos_emb_cached,
    fused_apply_rotary_pos_emb_thd,
)
from apex.transformer.functional.fused_softmax import (
    FusedScaleMaskSoftmax,
    GenericFusedScaleMaskSoftmax,
    GenericScaledMaskedSoftmax,
    ScaledMaskedSoftmax,
    ScaledSoftmax,
    ScaledUpperTriangMaskedSoftmax,
)

__all__ = [
    "FusedScaleMaskSoftmax", "GenericFusedScaleMaskSoftmax", "ScaledUpperTriangMaskedSoftmax", "ScaledMaskedSoftmax",
    "GenericScaledMaskedSoftmax", "ScaledSoftmax", "fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_cached",
    "fused_apply_rotary_pos_emb_thd", "fused_apply_rotary_pos_emb_2d", "fused_bias_swiglu", "FusedBiasSwiGLUFunction",
    "FusedBiasSwiGLU",
]
