"""Cast lists for `torch.Tensor` methods and operators: the operator forms below, plus every
function of the `torch` lists that also exists as a Tensor method (`x.mm(y)`, `x.sum()`, ...)."""
import torch

from . import torch_overrides

MODULE = torch.Tensor

FP16_FUNCS = ["__matmul__"]
BFLOAT16_FUNCS = ["__matmul__"]

FP32_FUNCS = [
    "__ipow__", "__pow__", "__rpow__",
    "cpu",  # a tensor leaving the device does so as fp32
]

CASTS = [
    "__add__", "__div__", "__eq__", "__ge__", "__gt__", "__iadd__", "__idiv__", "__imul__", "__isub__",
    "__itruediv__", "__le__", "__lt__", "__mul__", "__ne__", "__radd__", "__rdiv__", "__rmul__", "__rsub__",
    "__rtruediv__", "__sub__", "__truediv__",
]

SEQUENCE_CASTS = []

for _list_name in ("FP16_FUNCS", "BFLOAT16_FUNCS", "FP32_FUNCS", "CASTS", "SEQUENCE_CASTS"):
    globals()[_list_name] += [name for name in getattr(torch_overrides, _list_name) if hasattr(MODULE, name)]
