"""Small focal loss cases for compute-sanitizer memcheck: forward and backward in bf16 and fp16 at
gamma 2 (the lean kernels under APEX_FOCAL_VARIANT=lean) over shapes that reach their edges: a
padded last pack, no padding, packs past the real classes, a partial last group of rows."""
import torch

from apex.contrib.focal_loss import focal_loss

for dtype in (torch.bfloat16, torch.float16):
    for anchors, classes, real in ((1037, 96, 91), (33, 16, 16), (70, 32, 8), (5, 24, 17), (1, 8, 0)):
        logits = torch.randn(anchors, classes, device="cuda", dtype=dtype, requires_grad=True)
        labels = torch.randint(-2, max(real, 1), (anchors,), device="cuda")
        npos = (labels >= 0).sum().float().clamp(min=1).reshape(1)
        loss = focal_loss.focal_loss(logits, labels, npos, real, 0.25, 2.0, 0.1)
        loss.backward()
        torch.cuda.synchronize()
        assert torch.isfinite(loss).item() and torch.isfinite(logits.grad).all().item()
print("memcheck case done")
