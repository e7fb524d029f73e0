from ..builder import CUDAOpBuilder


class GroupNormBuilder(CUDAOpBuilder):
    """GroupNorm over NHWC or NCHW data with fused SiLU (apex.contrib.group_norm), any channel/group count."""

    NAME = "group_norm_cuda"
    SOURCE_DIR = "group_norm"
    FACE_PREFIX = "group_norm_"
    FACE_MODULE = "apex.contrib.group_norm._historical"
