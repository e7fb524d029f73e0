"""in1[idx1] * in2 for 2-D tensors, with backward and double backward, in one pass each."""
from .index_mul_2d import index_mul_2d

__all__ = ["index_mul_2d"]
