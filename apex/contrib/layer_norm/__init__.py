"""apex.contrib.layer_norm: NVIDIA apex's FastLayerNorm, served by apex.normalization's fused kernels."""
from apex.contrib.layer_norm.layer_norm import FastLayerNorm, FastLayerNormFN, fast_layer_norm

__all__ = ["FastLayerNorm", "FastLayerNormFN", "fast_layer_norm"]
