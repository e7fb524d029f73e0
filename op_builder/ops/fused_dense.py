from ..builder import CUDAOpBuilder


class FusedDenseBuilder(CUDAOpBuilder):
    """GEMMs with fused epilogues (bias, ReLU, GELU; cuBLASLt on GPUs): apex.fused_dense, apex.mlp, wgrad accumulation."""

    NAME = "fused_dense"
