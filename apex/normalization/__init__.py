"""Fused normalization layers (NVIDIA apex's apex.normalization): LayerNorm and RMSNorm, CPU and CUDA."""
from apex.normalization.fused_layer_norm import (
    FusedLayerNorm,
    FusedRMSNorm,
    MixedFusedLayerNorm,
    MixedFusedRMSNorm,
    fused_layer_norm,
    fused_layer_norm_affine,
    fused_rms_norm,
    fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine,
    mixed_dtype_fused_rms_norm_affine,
)

__all__ = [
    "FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm",
    "fused_layer_norm", "fused_layer_norm_affine", "mixed_dtype_fused_layer_norm_affine",
    "fused_rms_norm", "fused_rms_norm_affine", "mixed_dtype_fused_rms_norm_affine",
]
