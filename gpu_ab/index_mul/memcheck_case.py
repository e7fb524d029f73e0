"""Small index_mul_2d backward and double backward cases for compute-sanitizer memcheck, under the
APEX_INDEX_MUL_VARIANT the caller sets (keys16_deep: the pairs16 keys, the 16-bit sort and the deep
walk's kernels): aligned bf16 / fp32 rows (16-byte packs), odd widths (one element a pack), sources
with no rows, one source over many ranges, invalid indices, and 65536 sources (keys16's fallback)."""
import torch

from apex._ops import ops

torch.manual_seed(0)
lib = ops("fused_index_mul_2d")
for dtype in (torch.bfloat16, torch.float32):
    for sources, rows, features in ((300, 5000, 64), (7, 1029, 5), (1, 700, 8), (65_536, 3000, 8)):
        in1 = torch.randn(sources, features, device="cuda", dtype=dtype)
        in2 = torch.randn(rows, features, device="cuda", dtype=dtype)
        idx = torch.randint(0, sources, (rows,), device="cuda")
        idx[::9] = sources + 2  # invalid: NaN rows
        idx[1::5] = 0  # a source over many of the walk's ranges
        grad_out = torch.randn_like(in2)
        grad_in1, grad_in2 = lib.index_mul_2d_backward(grad_out, in1, in2, idx)
        outputs = lib.index_mul_2d_backward_backward(torch.randn_like(in1), torch.randn_like(in2), grad_out,
                                                     in1, in2, idx)
        torch.cuda.synchronize()
        assert torch.isfinite(grad_in1).all().item() and grad_in2[::9].isnan().all().item()
print("memcheck case done")
