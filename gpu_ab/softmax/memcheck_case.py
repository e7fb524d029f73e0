"""Small cases of the row kernel under compute-sanitizer (memcheck), run with APEX_SOFTMAX_VARIANT set:
per dtype, long rows at the smallest row-kernel width (+1 vector), one block, one vector past it (a
2-block cluster, ragged chunks) and a 2-block cluster's row; a [b, 1, sq, sk] mask shared by 2 heads,
a [b, 1, 1, sk] mask, none; 1-3 rows (blocks without rows) and odd row counts."""
import torch

from apex._ops import ops

softmax = ops("fused_softmax")
for dtype in (torch.bfloat16, torch.float32):
    per_vector = 128 // torch.finfo(dtype).bits
    block = 4 * 1024 * per_vector
    for sk in (256 * per_vector + per_vector, block, block + per_vector, 2 * block):
        for b, heads, sq in ((1, 2, 3), (2, 3, 1), (1, 1, 1)):
            x = torch.randn(b, heads, sq, sk, device="cuda").to(dtype)
            for mask in (torch.rand(b, 1, sq, sk, device="cuda") < 0.2, torch.rand(b, 1, 1, sk, device="cuda") < 0.2):
                y = softmax.scaled_masked_softmax_forward(x, mask, 0.5)
                ref = torch.softmax((x.float() * 0.5).masked_fill(mask, float("-inf")), -1)
                assert (y.float() - ref).abs().max().item() < 1e-2
            y = softmax.scaled_softmax_forward(x, 0.5)
            assert (y.float() - torch.softmax(x.float() * 0.5, -1)).abs().max().item() < 1e-2
torch.cuda.synchronize()
print("memcheck case done")
