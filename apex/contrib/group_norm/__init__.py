"""GroupNorm for NHWC (channels_last) and NCHW data with a fused SiLU/Swish, any channel and group count."""
from .group_norm import GroupNorm, group_norm

__all__ = ["GroupNorm", "group_norm"]
