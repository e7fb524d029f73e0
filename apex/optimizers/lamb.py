"""Lamb as its paper and pytorch-lamb define it (Ascend apex-patch's ``Lamb``), and its fused
version ``NpuFusedLamb`` (one multi-tensor launch per param group and dtype)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from apex.optimizers._fused_optimizer import check_hyperparameters, evaluate_closure
from apex.optimizers.fused_lamb import TRUST_ALL, TRUST_NONE, FusedLAMB

# ||param|| is clamped to this in the trust ratio (pytorch-lamb's choice).
MAX_TRUST_PARAM_NORM = 10.0


class Lamb(torch.optim.Optimizer):
    """Lamb (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"),
    unfused: a plain PyTorch loop over the params, the reference ``NpuFusedLamb`` is checked against.

    Per param: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2`` (no bias correction),
    ``u = m / (sqrt(v) + eps) + weight_decay * p`` and ``p -= lr * r * u`` with the trust ratio
    ``r = min(||p||, 10) / ||u||`` (1 if either norm is 0, or with ``adam=True``). The norms and
    the ratio are kept in ``state`` ('weight_norm', 'adam_norm', 'trust_ratio').

    Args:
        params: iterable of tensors or of param-group dicts.
        lr, betas, eps: as in Adam.
        weight_decay: decoupled weight decay, added to the update.
        adam: take the trust ratio as 1 (plain Adam steps without bias correction), for comparison.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False) -> None:
        check_hyperparameters(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        self.adam = adam
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = exp_avg / exp_avg_sq.sqrt().add(group["eps"])
                if group["weight_decay"] != 0:
                    update.add_(param, alpha=group["weight_decay"])
                weight_norm = torch.linalg.vector_norm(param).clamp(0, MAX_TRUST_PARAM_NORM)
                adam_norm = torch.linalg.vector_norm(update)
                trust_ratio = torch.where((weight_norm == 0) | (adam_norm == 0), torch.ones_like(weight_norm),
                                          weight_norm / adam_norm)
                state["weight_norm"], state["adam_norm"], state["trust_ratio"] = weight_norm, adam_norm, trust_ratio
                if self.adam:
                    trust_ratio = torch.ones_like(trust_ratio)
                param.sub_(update * (group["lr"] * trust_ratio))
        return loss


class NpuFusedLamb(FusedLAMB):
    """:class:`Lamb` fused (Ascend apex-patch's ``NpuFusedLamb``): the same update, one
    multi-tensor launch per param group and dtype; moments are float32.

    Args: as :class:`Lamb`, plus
        use_global_grad_norm: divide the grads by their global L2 norm (over every group) when
            it exceeds 1.
    """

    _max_param_norm = MAX_TRUST_PARAM_NORM

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False,
                 use_global_grad_norm: bool = False) -> None:
        self.adam = adam
        self.use_global_grad_norm = use_global_grad_norm
        super().__init__(params, lr=lr, bias_correction=False, betas=betas, eps=eps, weight_decay=weight_decay,
                         adam_w_mode=True, grad_averaging=True, max_grad_norm=1.0, use_nvlamb=True)

    def _trust(self) -> int:
        return TRUST_NONE if self.adam else TRUST_ALL

    def _prepare_step(self, launches: list[tuple[dict[str, Any], list[torch.Tensor]]]) -> None:
        self._global_grad_norm = self._grad_norm(launches) if self.use_global_grad_norm else None
