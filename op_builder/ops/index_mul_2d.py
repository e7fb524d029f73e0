from ..builder import CUDAOpBuilder


class FusedIndexMul2dBuilder(CUDAOpBuilder):
    """in1[idx] * in2 with backward and double backward (apex.contrib.index_mul_2d), CPU and CUDA."""

    NAME = "fused_index_mul_2d"
    SOURCE_DIR = "index_mul_2d"
    FACE_PREFIX = "index_mul_2d_"
    FACE_MODULE = "apex.contrib.index_mul_2d._historical"
