from ..builder import CUDAOpBuilder


class FusedBiasSwigluBuilder(CUDAOpBuilder):
    """Bias-SwiGLU y = silu(x1 + b1) * (x2 + b2) over the two halves of the last dim, forward and backward (bias grad fused)."""

    NAME = "fused_bias_swiglu"
    SOURCE_DIR = "fused_swiglu"
