"""One small bf16 focal loss backward for compute-sanitizer memcheck (run under APEX_FOCAL_VARIANT):
rows past one block's step and a partial last pair, a padded last pack, ignored rows, smoothing."""
import torch

from apex.contrib.focal_loss import focal_loss

for anchors, classes, real in [(173, 96, 91), (40, 16, 12), (5, 8, 8)]:
    logits = (4 * torch.randn(anchors, classes, device="cuda")).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(-2, real, (anchors,), device="cuda")
    num_positives = (targets >= 0).sum().float().clamp(min=1).reshape(1)
    focal_loss.focal_loss(logits, targets, num_positives, real, 0.25, 2.0, 0.1).backward()
    torch.cuda.synchronize()
    assert torch.isfinite(logits.grad.float()).all()
print("memcheck case done")
