"""FusedMixedPrecisionLamb: LAMB on float32 master weights of reduced-precision params,
with no host sync (lr, step, overflow and loss scale stay on the device)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

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

    _lr_on_device = True
    _steps_skip_on_overflow = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
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

    def _has_master(self, dtype: torch.dtype) -> bool:
        return dtype == self.reduced_precision_dtype

    def _state_keys(self, group: dict[str, Any], dtype: torch.dtype) -> tuple[str, ...]:
        return (*self._STATE, "master_param") if self._has_master(dtype) else self._STATE

    def _new_step(self, param: torch.Tensor, value: float | None = None) -> torch.Tensor:
        return super()._new_step(param, self._initial_step if value is None else value)

    def _initial_state(self, group: dict[str, Any], param: torch.Tensor, key: str) -> torch.Tensor:
        if key == "master_param":
            return param.detach().float()
        return super()._initial_state(group, param, key)

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        if params[0].dtype != torch.float32 and not self._has_master(params[0].dtype):
            raise TypeError(
                f"FusedMixedPrecisionLamb updates {params[0].dtype} params through float32 master copies: "
                f"construct it with reduced_precision_dtype={params[0].dtype} (got {self.reduced_precision_dtype})"
            )
        device = params[0].device
        flag = self._noop_flag(device)
        found_inf, scale, inv_scale = self._amp_scaling(device)
        flag.copy_(found_inf)
        max_grad_norm = self._constant(float(group["max_grad_norm"]), device) * scale
        if len(states) == 3:  # [exp_avg, exp_avg_sq, master_param]: the masters step, the params get copies
            self._lamb(group, grads, states[2], states, params, steps, flag, found_inf, inv_scale, max_grad_norm)
        else:
            self._lamb(group, grads, params, states, [], steps, flag, found_inf, inv_scale, max_grad_norm)
