"""FusedAdamP: AdamP in one multi-tensor call per param group and dtype (three kernels: the
moments with per-row sums, the projection decisions, the update)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer, check_hyperparameters


class FusedAdamP(FusedOptimizer):
    """AdamP (Heo et al., "AdamP: Slowing Down the Slowdown for Momentum Optimizers on
    Scale-invariant Weights"), as its authors' code (and Ascend apex-patch's ``NpuFusedAdamP``)
    computes it.

    Adam's direction ``perturb = m / (sqrt(v) / sqrt(1 - b2^t) + eps)`` (Nesterov's with
    ``b1 m + (1 - b1) g`` for m) is, for params of 2+ dims that look scale-invariant, projected
    off the param: per channel (rows of dim 0) when ``max_c |cos(g_c, p_c)| < delta / sqrt(channel
    size)``, else per tensor when ``|cos(g, p)| < delta / sqrt(numel)``, with
    ``cos(x, y) = x.y / ((||x|| + eps)(||y|| + eps))``; there ``perturb -= p_n (p_n . perturb)``
    with ``p_n = p / (||p|| + eps)``, and weight decay is scaled by ``wd_ratio``. Then
    ``p = p (1 - lr wd [wd_ratio]) - lr / (1 - b1^t) * perturb``.

    Moments (``state['exp_avg']``, ``state['exp_avg_sq']``) are float32; ``state['step']`` a
    float32 count on the params' device.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr, betas, eps: as in Adam.
        weight_decay: decoupled weight decay factor.
        delta: the cosine threshold.
        wd_ratio: weight decay scale of projected params.
        nesterov: Nesterov momentum in the direction.
        set_grad_none: ``zero_grad()`` sets grads to None.
    """

    _STATE = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        delta: float = 0.1,
        wd_ratio: float = 0.1,
        nesterov: bool = False,
        set_grad_none: bool = True,
    ) -> None:
        check_hyperparameters(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay, delta=delta, wd_ratio=wd_ratio)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, delta=delta, wd_ratio=wd_ratio,
                        nesterov=nesterov)
        super().__init__(params, defaults, set_grad_none)

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        return torch.float32

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        beta1, beta2 = group["betas"]
        ops("amp_C").multi_tensor_adamp(
            CHUNK_SIZE, self._noop_flag(params[0].device), grads, params, *states, float(group["lr"]), beta1, beta2,
            group["eps"], steps, group["weight_decay"], group["delta"], group["wd_ratio"], group["nesterov"],
        )  # fmt: skip
