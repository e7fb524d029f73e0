"""torch.nn.utils.clip_grad_norm_ on apex's multi-tensor L2 norm."""
from .clip_grad import clip_grad_norm_

__all__ = ["clip_grad_norm_"]
