"""FusedBertAdam: BERT's Adam (pytorch-pretrained-BERT; Ascend apex-patch's NpuFusedBertAdam) in
one multi-tensor launch per param group and dtype (after the grad norm when clipping)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.optimizer import required

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer

# The kernel's lr schedules (multi_tensor_bert_adam's `schedule`), by pytorch-pretrained-BERT's names.
SCHEDULES = {"warmup_linear": 1, "warmup_cosine": 2, "warmup_constant": 3, "warmup_poly": 4}


class FusedBertAdam(FusedOptimizer):
    """Adam with BERT's fixes: no bias correction, decoupled weight decay, grad clipping and a
    warmup schedule of the lr. Per step, for the params of each group and dtype::

        g = grad * min(1, max_grad_norm / (||grads|| + 1e-6))        if max_grad_norm > 0
        m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g
        p = p - lr_t * (m / (sqrt(v) + e) + weight_decay * p)

    with ``lr_t = lr * schedule((step - 1) / t_total, warmup)`` when ``t_total > 0`` (step
    counts from 1), else ``lr``. The grads are clipped in place, as Ascend's optimizer does.
    Moments are float32 (``state['exp_avg']``, ``state['exp_avg_sq']``), ``state['step']`` a
    float32 count on the params' device.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate (required).
        warmup: fraction of t_total spent warming up; -1 for none.
        t_total: steps of the schedule; -1 keeps the lr constant.
        schedule: 'warmup_linear', 'warmup_cosine', 'warmup_constant' or 'warmup_poly'.
        b1, b2: decay rates of the moments.
        e: added to the denominator.
        weight_decay: decoupled weight decay.
        max_grad_norm: clip threshold of the grads' L2 norm (per group and dtype); -1 for none.
        set_grad_none: ``zero_grad()`` sets grads to None.
    """

    _STATE = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = required,
        warmup: float = -1,
        t_total: int = -1,
        schedule: str = "warmup_linear",
        b1: float = 0.9,
        b2: float = 0.99,
        e: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float = -1,
        set_grad_none: bool = True,
    ) -> None:
        if lr is not required and not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not (warmup == -1 or 0.0 <= warmup < 1.0):
            raise ValueError(f"Invalid warmup: {warmup}")
        if schedule not in SCHEDULES:
            raise ValueError(f"Invalid schedule parameter: {schedule}")
        if not 0.0 <= b1 < 1.0:
            raise ValueError(f"Invalid b1 parameter: {b1}")
        if not 0.0 <= b2 < 1.0:
            raise ValueError(f"Invalid b2 parameter: {b2}")
        if not 0.0 <= e:
            raise ValueError(f"Invalid epsilon value: {e}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, schedule=schedule, warmup=warmup, t_total=t_total, b1=b1, b2=b2, e=e,
                        weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults, set_grad_none)

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        return torch.float32

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        ops("amp_C").multi_tensor_bert_adam(
            CHUNK_SIZE, self._noop_flag(params[0].device), grads, params, *states, float(group["lr"]), group["b1"],
            group["b2"], group["e"], steps, group["weight_decay"], group["max_grad_norm"], SCHEDULES[group["schedule"]],
            group["warmup"], group["t_total"],
        )  # fmt: skip
