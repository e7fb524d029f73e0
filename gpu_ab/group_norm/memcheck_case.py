"""Small group norm cases for compute-sanitizer memcheck under each APEX_GN_VARIANT (pipe, lean,
stream, wide and nocheck are separate kernels): forward + backward with SiLU, 16-bit / float32 / float64 data, NHWC and
NCHW, walks of 0 to 10 packs a thread (the pipelined walk's partial batches and its tail)."""
import torch

from apex.contrib.group_norm import group_norm

CASES = [((2, 64, 9, 5), torch.channels_last), ((2, 64, 20, 16), torch.channels_last),
         ((3, 320, 6, 7), torch.channels_last), ((2, 16, 8, 40), torch.contiguous_format),
         ((1, 32, 3, 8), torch.contiguous_format)]
for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
    for shape, memory_format in CASES:
        x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=memory_format).requires_grad_()
        weight = torch.randn(shape[1], device="cuda", dtype=torch.float64 if dtype == torch.float64 else torch.float32,
                             requires_grad=True)
        bias = torch.randn_like(weight, requires_grad=True)
        y = group_norm(x, 8, weight, bias, 1e-5, "silu")
        y.backward(torch.randn_like(y))
        torch.cuda.synchronize()
        assert torch.isfinite(x.grad).all().item() and torch.isfinite(weight.grad).all().item()
print("memcheck case done")
