"""A small focal loss forward + backward for compute-sanitizer: every dtype the rows kernels take,
a padded last pack (91 of 96, 33 of 40), an odd row count (a thread's last pair holds one row), and
ignored, background and positive rows (including the last real class)."""
import torch

from apex.contrib.focal_loss import focal_loss

torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for anchors, classes, real in ((67, 96, 91), (37, 40, 33), (5, 8, 8)):
        logits = torch.randn(anchors, classes, device="cuda", dtype=dtype, requires_grad=True)
        targets = torch.randint(-2, real, (anchors,), device="cuda")
        targets[::5] = real - 1
        num_positives = (targets >= 0).sum().float().clamp(min=1).reshape(1)
        loss = focal_loss.focal_loss(logits, targets, num_positives, real, 0.25, 2.0, 0.1)
        loss.backward()
        torch.cuda.synchronize()
        assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
print("memcheck case done")
