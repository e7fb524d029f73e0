"""FusedAdam: Adam / AdamW in one multi-tensor kernel launch per param group and dtype."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import REDUCED_PRECISION, FusedOptimizer, amp_c, check_hyperparameters


class FusedAdam(FusedOptimizer):
    """Adam (``adam_w_mode=False``, L2 regularization) or AdamW (default, decoupled weight decay).

    A drop-in for ``torch.optim.Adam``/``AdamW`` with NVIDIA apex's arguments. Params may be
    float32, float16 or bfloat16, on CUDA or CPU (one device per param group); the moments
    ``state['exp_avg']``/``state['exp_avg_sq']`` are float32 and shaped like the param, and
    ``state['step']`` is a float32 scalar, so state dicts load into ``torch.optim.Adam``
    (and back) where the math is the same.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate.
        bias_correction: divide the moments by ``1 - beta**step``.
        betas: decay rates of the first and second moments.
        eps: added to the denominator.
        adam_w_mode: decoupled weight decay (AdamW) when True, L2 added to the grad when False.
        weight_decay: weight decay factor.
        amsgrad: not supported; True raises RuntimeError.
        set_grad_none: ``zero_grad()`` sets grads to None.
        capturable: keep ``lr`` and ``step`` on the device and read the skip decision from
            the device, so that ``step()`` can be captured in a CUDA graph and works with
            ``torch.amp.GradScaler`` without a host sync (the scaler's inverse scale is
            applied inside the kernel and an overflow skips the update).
        master_weights: (capturable only) keep a float32 copy of each fp16/bf16 param in
            ``state['master_param']``; the update runs on the copy and is written back rounded.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
        capturable: bool = False,
        master_weights: bool = False,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if master_weights and not capturable:
            raise RuntimeError("Master weights is currently only supported with the capturable version.")
        check_hyperparameters(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.capturable = capturable
        self.steps_on_device = capturable
        self.master_weights = master_weights
        # GradScaler hands a capturable FusedAdam its scale and found_inf instead of unscaling.
        self._step_supports_amp_scaling = capturable
        super().__init__(params, defaults, set_grad_none)

    def step(
        self,
        closure: Callable[[], torch.Tensor] | None = None,
        grads: Any = None,
        output_params: Any = None,
        scale: Any = None,
        grad_norms: Any = None,
    ) -> torch.Tensor | None:
        """One Adam step. The extra arguments of apex's old API are refused."""
        if any(arg is not None for arg in (grads, output_params, scale, grad_norms)):
            raise RuntimeError(
                "FusedAdam has been updated. Simply initialize it identically to torch.optim.Adam, "
                "and call step() with no arguments."
            )
        return super().step(closure)

    def _init_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = self._new_step(param)
        state["exp_avg"] = self._zeros_state(param, "exp_avg")
        state["exp_avg_sq"] = self._zeros_state(param, "exp_avg_sq")
        if self.master_weights and param.dtype in REDUCED_PRECISION:
            state["master_param"] = param.detach().float()

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        return torch.float32

    def _update(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        self._ensure_state(group, params)
        beta1, beta2 = group["betas"]
        device = params[0].device
        flag = self._noop_flag(device)
        bias_correction = 1 if group["bias_correction"] else 0
        if not self.capturable:
            for step, same_step in self._advance_steps(params).items():
                multi_tensor_applier(
                    amp_c().multi_tensor_adam, flag, self._tensor_lists(same_step, "exp_avg", "exp_avg_sq"),
                    group["lr"], beta1, beta2, group["eps"], step, self.adam_w_mode, bias_correction,
                    group["weight_decay"],
                )  # fmt: skip
            return
        found_inf, _, inv_scale = self._amp_scaling(device)
        flag.copy_(found_inf)
        step = self._advance_device_steps(params, found_inf)
        with_master = self.master_weights and params[0].dtype in REDUCED_PRECISION
        if with_master:
            kernel = amp_c().multi_tensor_adam_capturable_master
            tensor_lists = self._tensor_lists(params, "exp_avg", "exp_avg_sq", "master_param")
        else:
            kernel = amp_c().multi_tensor_adam_capturable
            tensor_lists = self._tensor_lists(params, "exp_avg", "exp_avg_sq")
        multi_tensor_applier(
            kernel, flag, tensor_lists, self._lr_tensor(group, device), beta1, beta2, group["eps"], step,
            self.adam_w_mode, bias_correction, group["weight_decay"], inv_scale,
        )  # fmt: skip
