"""Small fused_bias_swiglu cases for compute-sanitizer memcheck (run under APEX_SWIGLU_VARIANT=flat_cs,
which takes every new kernel: flat_forward/flat_backward with and without a bias, streaming loads
and stores, the dependent launches of backward_kernel and the fold), bf16 and fp16: a partial
column tile (half 136), whole tiles (half 256), a partial row group (rows 13)."""
import torch

import fused_bias_swiglu as historical
from apex.transformer.functional import fused_bias_swiglu

for dtype in (torch.bfloat16, torch.float16):
    for rows, half in ((13, 136), (8, 256), (1, 8)):
        x = torch.randn(rows, 2 * half, device="cuda", dtype=dtype, requires_grad=True)
        bias = torch.randn(2 * half, device="cuda", dtype=dtype, requires_grad=True)
        g = torch.randn(rows, half, device="cuda", dtype=dtype)
        for b in (None, bias):
            y = fused_bias_swiglu(x, b)
            y.backward(g)
            historical.backward(g, x.detach(), bias.detach())  # grad_x with a bias, no bias gradient
        torch.cuda.synchronize()
        assert torch.isfinite(x.grad).all().item() and torch.isfinite(bias.grad).all().item()
print("memcheck case done")
