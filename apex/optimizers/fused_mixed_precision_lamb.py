"""FusedMixedPrecisionLamb: LAMB on float32 master weights of reduced-precision params,
with no host sync (lr, step, overflow and loss scale stay on the device)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import amp_c
from apex.optimizers.fused_lamb import FusedLAMB


class FusedMixedPrecisionLamb(FusedLAMB):
    """LAMB whose params of ``reduced_precision_dtype`` (fp16 or bf16) are updated through
    float32 master copies (``state['master_param']``) and written back rounded; other params
    must be float32. Moments are float32.

    Works with ``torch.amp.GradScaler`` without unscaling first: the scaler's inverse scale
    is applied in the kernel, ``max_grad_norm`` is compared against the scaled grad norm,
    and a step with an overflow changes nothing (its step count included).

    Args: as :class:`FusedLAMB`, plus
        step: the step count new state starts from (to continue a schedule).
        reduced_precision_dtype: the dtype whose params get float32 master copies, or None.
    """

    steps_on_device = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        step: int = 0,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        adam_w_mode: bool = True,
        grad_averaging: bool = True,
        max_grad_norm: float = 1.0,
        use_nvlamb: bool = False,
        reduced_precision_dtype: torch.dtype | None = None,
    ) -> None:
        if reduced_precision_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(
                f"reduced_precision_dtype must be None, torch.float16 or torch.bfloat16, got {reduced_precision_dtype}"
            )
        if step < 0:
            raise ValueError(f"Invalid step value: {step}")
        self.reduced_precision_dtype = reduced_precision_dtype
        self._initial_step = step
        self._step_supports_amp_scaling = True
        super().__init__(
            params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
            amsgrad=amsgrad, adam_w_mode=adam_w_mode, grad_averaging=grad_averaging, set_grad_none=True,
            max_grad_norm=max_grad_norm, use_nvlamb=use_nvlamb,
        )  # fmt: skip

    def _has_master(self, param: torch.Tensor) -> bool:
        return param.dtype == self.reduced_precision_dtype

    def _init_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        super()._init_state(group, param, state)
        state["step"] = self._new_step(param, self._initial_step)
        if self._has_master(param):
            state["master_param"] = param.detach().float()

    def _update(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        if params[0].dtype != torch.float32 and not self._has_master(params[0]):
            raise TypeError(
                f"FusedMixedPrecisionLamb updates {params[0].dtype} params through float32 master copies: "
                f"construct it with reduced_precision_dtype={params[0].dtype} (got {self.reduced_precision_dtype})"
            )
        self._ensure_state(group, params)
        beta1, beta2 = group["betas"]
        device = params[0].device
        flag = self._noop_flag(device)
        found_inf, scale, inv_scale = self._amp_scaling(device)
        flag.copy_(found_inf)
        step = self._advance_device_steps(params, found_inf)
        if self._has_master(params[0]):
            grads, model_params, exp_avgs, exp_avg_sqs, masters = self._tensor_lists(
                params, "exp_avg", "exp_avg_sq", "master_param"
            )
            tensor_lists = [grads, masters, exp_avgs, exp_avg_sqs, model_params]
        else:
            tensor_lists = self._tensor_lists(params, "exp_avg", "exp_avg_sq")
        multi_tensor_applier(
            amp_c().multi_tensor_lamb_mp, flag, tensor_lists, self._lr_tensor(group, device), beta1, beta2,
            group["eps"], step, 1 if group["bias_correction"] else 0, group["weight_decay"],
            1 if group["grad_averaging"] else 0, self.adam_w_mode, self._global_grad_norm.to(device),
            group["max_grad_norm"] * scale, self.use_nvlamb, found_inf, inv_scale,
        )  # fmt: skip
