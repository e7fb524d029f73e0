"""amp's cast lists: which functions run in fp16/bf16, which in fp32, which promote to the widest
input type, and which are refused, for `torch`, `torch.nn.functional` and `torch.Tensor`.

The fp16 lists are NVIDIA apex's, the bf16 lists ROCm apex's (O4/O5). They are plain mutable
lists read when casts are installed (`amp.init()`, or `amp.initialize` at O1/O4), so a script may
edit them first, as apex allows, e.g.
`apex.amp.lists.functional_overrides.FP32_FUNCS.remove("softmax")`.
Names a torch version lacks are skipped.
"""
from . import functional_overrides, tensor_overrides, torch_overrides

__all__ = ["functional_overrides", "tensor_overrides", "torch_overrides"]
