"""Multi-tensor apply: one kernel launch over many tensors (NVIDIA apex's API).

    from apex.multi_tensor_apply import multi_tensor_applier
    import amp_C
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [grads, grads], 1.0 / loss_scale)
"""
from apex.multi_tensor_apply.multi_tensor_apply import MultiTensorApply

# apex's default: 64K elements per chunk.
multi_tensor_applier = MultiTensorApply(2048 * 32)

__all__ = ["MultiTensorApply", "multi_tensor_applier"]
