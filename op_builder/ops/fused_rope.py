from ..builder import CUDAOpBuilder


class FusedRopeBuilder(CUDAOpBuilder):
    """Rotary positional embedding (sbhd/bshd, packed thd, 2-D; half-split or interleaved) forward and backward."""

    NAME = "fused_rotary_positional_embedding"
    SOURCE_DIR = "fused_rope"
    FACE_PREFIX = "fused_rope_"
