"""The functions of NVIDIA apex contrib's ``fast_layer_norm`` module, over the fused_layer_norm_cuda ops.

``import fast_layer_norm`` (compatibility/) serves these. ``x`` is ``[rows, hidden]``, gamma / beta
``[hidden]``; outputs take gamma's dtype, statistics (mu, rsigma) are float32 per row.
"""
from __future__ import annotations

import torch

from apex._ops import ops

__all__ = ["ln_fwd", "ln_bwd"]

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)
# The backward op's eps only bounds |gamma| away from 0 when recovering xhat = (z - beta) / gamma;
# upstream's ln_bwd takes no epsilon and divides by gamma itself.
_NO_CLAMP = 0.0


def _widened(data: torch.Tensor, gamma: torch.Tensor) -> bool:
    """float32 data with 16-bit parameters: upstream has kernels for it, these ops compute it with
    float32 parameters and round the results to gamma's dtype once."""
    return data.dtype == torch.float32 and gamma.dtype in _SIXTEEN_BIT


def ln_fwd(x, gamma, beta, epsilon):
    """LayerNorm forward -> [z, mu, rsigma]."""
    apex = ops("fused_layer_norm_cuda")
    shape = [gamma.numel()]
    if _widened(x, gamma):
        z, mu, rsigma = apex.layer_norm_fwd(x, shape, gamma.float(), beta.float(), epsilon)
        return [z.to(gamma.dtype), mu, rsigma]
    return list(apex.layer_norm_fwd(x, shape, gamma, beta, epsilon))


def ln_bwd(dz, x_or_z, mu, rsigma, gamma, beta=None, memory_efficient=False):
    """LayerNorm backward -> [dx, dgamma, dbeta, dgamma_part, dbeta_part].

    ``x_or_z`` is the forward input, or its output z when memory_efficient (then ``beta`` is needed and
    ``mu`` may be None). The parts are the float32 partial sums whose column sums are dgamma / dbeta:
    here a single row each (the kernels fold their per-block partials before returning).
    ``beta`` and ``memory_efficient`` are optional so that the five-argument call of ROCm apex and of
    NVIDIA apex before memory_efficient, ``ln_bwd(dz, x, mu, rsigma, gamma)``, works unchanged.
    """
    if memory_efficient and beta is None:
        raise ValueError("fast_layer_norm.ln_bwd: memory_efficient=True recovers x from z and needs beta")
    apex = ops("fused_layer_norm_cuda")
    shape = [gamma.numel()]
    # beta's values are read only when memory_efficient; otherwise gamma stands in for a missing one,
    # so that the op still returns dbeta (the row sums of dz), as upstream does.
    stand_in = beta if beta is not None else gamma
    if _widened(x_or_z, gamma):
        dx, dgamma, dbeta = apex.layer_norm_bwd(dz.float(), mu, rsigma, x_or_z, shape, gamma.float(),
                                                stand_in.float(), _NO_CLAMP, memory_efficient)
        dgamma_part, dbeta_part = dgamma.unsqueeze(0), dbeta.unsqueeze(0)
        return [dx, dgamma.to(gamma.dtype), dbeta.to(gamma.dtype), dgamma_part, dbeta_part]
    dx, dgamma, dbeta = apex.layer_norm_bwd(dz, mu, rsigma, x_or_z, shape, gamma, stand_in, _NO_CLAMP, memory_efficient)
    return [dx, dgamma, dbeta, dgamma.float().unsqueeze(0), dbeta.float().unsqueeze(0)]
