"""Cast lists for functions of the `torch` namespace."""
import torch

MODULE = torch

# Tensor-core work: convolutions and matrix products take fp16 inputs.
FP16_FUNCS = [
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
    "prelu",
    "addmm", "addmv", "addr", "matmul", "mm", "mv",
    # Batched products: fp16 since CUDA 9.1 (NVIDIA apex puts them here on every CUDA build).
    "addbmm", "baddbmm", "bmm",
]

# ROCm apex's bf16 list: the fp16 one without prelu and the batched products.
BFLOAT16_FUNCS = [
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc",
    "addmm", "addmv", "addr", "matmul", "mm", "mv",
]

# Range- or precision-sensitive math stays fp32.
FP32_FUNCS = [
    # pointwise functions that overflow or lose precision in fp16
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "reciprocal", "rsqrt",
    "sinh", "tan", "pow",
    # reductions (mean is safe: torch accumulates it in fp32 since 1.1)
    "cumprod", "cumsum", "dist", "norm", "prod", "std", "sum", "var",
    "renorm",
]

# Functions of several tensors: mixed fp16/fp32 inputs are all cast to the widest type.
CASTS = [
    "addcdiv", "addcmul", "atan2", "cross", "bilinear", "dot",
    "add", "div", "mul",
    "eq", "equal", "ge", "gt", "le", "lt", "ne",
]

# Functions taking a sequence of tensors, promoted to the widest type in the sequence.
SEQUENCE_CASTS = ["cat", "stack"]
