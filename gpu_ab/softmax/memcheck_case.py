"""Small cases of the row kernel under compute-sanitizer (memcheck): per dtype, long rows in one block
and in a cluster (1024- and 512-thread blocks), a [b, 1, sq, sk] mask shared by 2 heads, a [b, 1, 1, sk]
mask, none; more rows than a few blocks take, rows of odd count. Run with APEX_SOFTMAX_VARIANT set."""
import torch

from apex._ops import ops

softmax = ops("fused_softmax")
for dtype in (torch.bfloat16, torch.float32):
    per_vector = 128 // torch.finfo(dtype).bits
    for sk in (2 * 1024 * per_vector + per_vector, 4 * 1024 * per_vector, 4 * 1024 * per_vector + per_vector):
        for b, heads, sq in ((1, 2, 3), (2, 3, 1)):
            x = torch.randn(b, heads, sq, sk, device="cuda").to(dtype)
            for mask in (torch.rand(b, 1, sq, sk, device="cuda") < 0.2, torch.rand(b, 1, 1, sk, device="cuda") < 0.2):
                y = softmax.scaled_masked_softmax_forward(x, mask, 0.5)
                ref = torch.softmax((x.float() * 0.5).masked_fill(mask, float("-inf")), -1)
                assert (y.float() - ref).abs().max().item() < 1e-2
            y = softmax.scaled_softmax_forward(x, 0.5)
            assert (y.float() - torch.softmax(x.float() * 0.5, -1)).abs().max().item() < 1e-2
torch.cuda.synchronize()
print("memcheck case done")
