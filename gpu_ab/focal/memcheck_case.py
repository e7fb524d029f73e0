"""Small focal loss cases for compute-sanitizer memcheck of rows_forward_fix_kernel (run under
APEX_FOCAL_VARIANT=fix_fwd or fix_fwd_occ): forward (and backward, unchanged) in bf16 and fp16 at
gamma 2, over shapes that take it: 96 / 91 classes (one slot a lane), 64 (two a lane), 72 / 65
(a last pack of one class); fewer rows than a block's step, a partial last step, many steps; labels
in the first and last real class, padding labels, ignored and background rows."""
import torch

from apex.contrib.focal_loss import focal_loss

for dtype in (torch.bfloat16, torch.float16):
    for anchors, classes, real in ((3, 96, 91), (1037, 96, 91), (20000, 64, 64), (517, 72, 65)):
        logits = torch.randn(anchors, classes, device="cuda", dtype=dtype, requires_grad=True)
        labels = torch.randint(-2, real + 1, (anchors,), device="cuda")
        labels[0::4] = 0
        labels[1::4] = real - 1
        npos = ((labels >= 0) & (labels < real)).sum().float().clamp(min=1).reshape(1)
        loss = focal_loss.focal_loss(logits, labels, npos, real, 0.25, 2.0, 0.1)
        loss.backward()
        torch.cuda.synchronize()
        assert torch.isfinite(loss).item() and torch.isfinite(logits.grad).all().item()
print("memcheck case done")
