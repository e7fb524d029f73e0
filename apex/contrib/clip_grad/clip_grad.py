"""``clip_grad_norm_`` with torch's signature and results, the 2-norm taken by ``amp_C.multi_tensor_l2norm``.

Gradients are grouped by (device, dtype). Each float32 / float16 / bfloat16 group's norm is one
multi-tensor launch over all its tensors (torch launches one norm kernel per ~100 tensors and then
combines per-tensor norms); float64 groups use torch's foreach norms. Each group is then scaled in
place by the clip coefficient, which stays on the device: no host synchronisation unless
``error_if_nonfinite`` asks for a check, so the call can be captured in a CUDA graph and traced by
``torch.compile``.
"""
from __future__ import annotations

from typing import Iterable, Optional, Union

import torch
from torch.utils._foreach_utils import _group_tensors_by_device_and_dtype

__all__ = ["clip_grad_norm_"]

# The dtypes amp_C's multi-tensor L2 norm reads (it accumulates in float32).
_MULTI_TENSOR_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# torch's clip coefficient: max_norm / (total_norm + eps).
_EPS = 1e-6

# One noop flag per device for the norm launches. multi_tensor_l2norm only sets it (on a
# non-finite norm) and never skips on it, so it is never read and never needs zeroing.
_noop_flags: dict[torch.device, torch.Tensor] = {}


def _noop_flag(device: torch.device) -> torch.Tensor:
    if device not in _noop_flags:
        _noop_flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _noop_flags[device]


def _group_norms(grads: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """The 2-norm of a group of same-device, same-dtype gradients, as 0-dim tensors to combine."""
    if dtype in _MULTI_TENSOR_DTYPES:
        import amp_C
        from apex.multi_tensor_apply import multi_tensor_applier

        total, _ = multi_tensor_applier(amp_C.multi_tensor_l2norm, _noop_flag(device), [grads], False)
        return [total[0]]
    return list(torch._foreach_norm(grads, 2.0))


@torch.no_grad()
def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> torch.Tensor:
    """Scales the gradients of ``parameters`` in place so that their total norm is at most ``max_norm``.

    Same signature and results as ``torch.nn.utils.clip_grad_norm_``: the norm is taken over all
    gradients as if concatenated, the coefficient is ``min(1, max_norm / (total_norm + 1e-6))``.

    Args:
        parameters: a tensor or an iterable of tensors (parameters whose ``.grad`` is None are
            skipped); gradients may mix devices (CPU and CUDA) and dtypes.
        max_norm: the largest total norm allowed.
        norm_type: the p of the p-norm. The 2-norm takes the fused path; any other (``inf``, 1, ...)
            is torch's implementation.
        error_if_nonfinite: raise if the total norm is nan or inf (a host synchronisation, as in torch).
        foreach: ``False`` runs torch's per-tensor implementation instead; ``None``/``True`` the fused one.

    Returns:
        The total norm, a 0-dim tensor on the device of the first gradient: float32 when any
        gradient is float32/float16/bfloat16 (their norm is accumulated in float32, where torch's
        16-bit norms are 16-bit), float64 for float64-only gradients.
    """
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if norm_type != 2.0 or foreach is False or any(g.is_sparse for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite, foreach)
    if not grads:
        return torch.tensor(0.0)
    first_device = grads[0].device
    groups = _group_tensors_by_device_and_dtype([grads])
    norms = []
    for (device, dtype), ([group], _) in groups.items():
        norms.extend(norm.to(first_device) for norm in _group_norms(group, device, dtype))
    total_norm = torch.linalg.vector_norm(torch.stack(norms), 2.0)
    if error_if_nonfinite and torch.logical_or(total_norm.isnan(), total_norm.isinf()):
        raise RuntimeError(
            "The total norm of order 2.0 for gradients from `parameters` is non-finite, so it cannot be clipped. "
            "To disable this error and scale the gradients by the non-finite norm anyway, set "
            "`error_if_nonfinite=False`")
    clip_coef = torch.clamp(max_norm / (total_norm + _EPS), max=1.0)
    for (device, _), ([group], _) in groups.items():
        torch._foreach_mul_(group, clip_coef.to(device))
    return total_norm
