"""amp_C: NVIDIA (and ROCm) apex's multi-tensor kernels (fused optimizers, amp unscale, norms): torch.ops.apex.* ops, compiled on first attribute access."""
from apex._faces import face_module
__getattr__, __dir__ = face_module(__name__)
