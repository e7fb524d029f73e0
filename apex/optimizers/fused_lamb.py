"""FusedLAMB: layer-wise adaptive moments (LAMB) in multi-tensor kernel launches."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import FusedOptimizer, amp_c, check_hyperparameters


class FusedLAMB(FusedOptimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning"), NVIDIA apex's arguments.

    Each step clips the grads by their global L2 norm (over every group) to
    ``max_grad_norm``, forms the Adam update, and scales it per tensor by the trust ratio
    ``||param|| / ||update||`` (only for tensors with weight decay, unless ``use_nvlamb``).
    Params may be float32, float16 or bfloat16 on CUDA or CPU (one device per group); the
    moments ``state['exp_avg']``/``state['exp_avg_sq']`` are float32 (apex keeps them in the
    param's dtype, where fp16 second moments of clipped grads underflow).

    Note: like apex, the kernel stores the update in ``param.grad`` during the step.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr, betas, eps, bias_correction: as in Adam.
        weight_decay: decoupled (``adam_w_mode=True``) or L2 (``False``) weight decay.
        amsgrad: not supported; True raises RuntimeError.
        adam_w_mode: decoupled weight decay when True.
        grad_averaging: scale the new grad by ``1 - beta1`` in the first moment (else by 1).
        set_grad_none: ``zero_grad()`` sets grads to None.
        max_grad_norm: clip threshold of the global grad norm, > 0 (``float('inf')`` never clips).
        use_nvlamb: apply the trust ratio to every tensor, also those without weight decay.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        adam_w_mode: bool = True,
        grad_averaging: bool = True,
        set_grad_none: bool = True,
        max_grad_norm: float = 1.0,
        use_nvlamb: bool = False,
    ) -> None:
        if amsgrad:
            raise RuntimeError(f"{type(self).__name__} does not support the AMSGrad variant.")
        check_hyperparameters(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        if not 0.0 < max_grad_norm:
            raise ValueError(f"Invalid max_grad_norm value: {max_grad_norm}")
        defaults = dict(
            lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
            grad_averaging=grad_averaging, max_grad_norm=max_grad_norm,
        )  # fmt: skip
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.use_nvlamb = use_nvlamb
        self._global_grad_norm: torch.Tensor | None = None
        super().__init__(params, defaults, set_grad_none)

    def _init_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = self._new_step(param)
        state["exp_avg"] = self._zeros_state(param, "exp_avg")
        state["exp_avg_sq"] = self._zeros_state(param, "exp_avg_sq")

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        return torch.float32

    def _prepare_step(self, buckets: list[tuple[dict[str, Any], dict[torch.dtype, list[torch.Tensor]]]]) -> None:
        # One L2 norm per (device, dtype) of all grads, then the norm of those norms.
        grads: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for _, by_dtype in buckets:
            for dtype, params in by_dtype.items():
                grads.setdefault((params[0].device, dtype), []).extend(p.grad for p in params)
        if not grads:
            self._global_grad_norm = None
            return
        home = next(iter(grads))[0]
        norms = [
            multi_tensor_applier(amp_c().multi_tensor_l2norm, self._noop_flag(device), [same], False)[0].to(home)
            for (device, _), same in grads.items()
        ]
        if len(norms) > 1:
            norms = [multi_tensor_applier(amp_c().multi_tensor_l2norm, self._noop_flag(home), [norms], False)[0]]
        self._global_grad_norm = norms[0]

    def _update(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        self._ensure_state(group, params)
        beta1, beta2 = group["betas"]
        device = params[0].device
        for step, same_step in self._advance_steps(params).items():
            multi_tensor_applier(
                amp_c().multi_tensor_lamb, self._noop_flag(device), self._tensor_lists(same_step, "exp_avg", "exp_avg_sq"),
                group["lr"], beta1, beta2, group["eps"], step, 1 if group["bias_correction"] else 0,
                group["weight_decay"], 1 if group["grad_averaging"] else 0, self.adam_w_mode,
                self._global_grad_norm.to(device), group["max_grad_norm"], self.use_nvlamb,
            )  # fmt: skip
