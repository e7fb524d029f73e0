"""Small calls that reach every kernel of csrc/xentropy/xentropy_fast.cuh, for compute-sanitizer
(run with APEX_XENTROPY_VARIANT=warp): the block-per-row forward and backward (5 rows) and the
warp-per-row forward (16 rows per SM + 3), bf16 and fp16, contiguous and misaligned rows, ignored
rows, a label out of range."""
import torch

from apex.contrib.xentropy import softmax_cross_entropy

warp_rows = 16 * torch.cuda.get_device_properties(0).multi_processor_count + 3
for dtype in (torch.bfloat16, torch.float16):
    for rows in (5, warp_rows):
        for classes, start in ((1000, 0), (33, 1), (4099, 3), (7, 5)):
            wide = torch.randn(rows, classes + 8, device="cuda").to(dtype)
            x = wide[:, start:start + classes]
            if start == 0:
                x = x.contiguous()
            x.requires_grad_()
            labels = torch.randint(0, classes, (rows,), device="cuda")
            labels[0] = -100  # ignored
            labels[1] = classes  # out of range: NaN row
            losses = softmax_cross_entropy(x, labels, smoothing=0.1)
            losses.backward(torch.rand_like(losses))
            torch.cuda.synchronize()
print("memcheck cases done")
