"""FusedAdam: Adam / AdamW in one multi-tensor kernel launch per param group and dtype."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, REDUCED_PRECISION, FusedOptimizer, check_hyperparameters


class FusedAdam(FusedOptimizer):
    """Adam (``adam_w_mode=False``, L2 regularization) or AdamW (default, decoupled weight decay).

    A drop-in for ``torch.optim.Adam``/``AdamW`` with NVIDIA apex's arguments. Params may be
    float32, float16 or bfloat16, on CUDA or CPU (one device per param group); the moments
    ``state['exp_avg']``/``state['exp_avg_sq']`` are float32 and shaped like the param, and
    ``state['step']`` is a float32 scalar on the param's device, so state dicts load into
    ``torch.optim.Adam`` (and back) where the math is the same.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate (a float, or a tensor).
        bias_correction: divide the moments by ``1 - beta**step``.
        betas: decay rates of the first and second moments.
        eps: added to the denominator.
        adam_w_mode: decoupled weight decay (AdamW) when True, L2 added to the grad when False.
        weight_decay: weight decay factor.
        amsgrad: not supported; True raises RuntimeError.
        set_grad_none: ``zero_grad()`` sets grads to None.
        capturable: keep ``lr`` on the device and read the skip decision from the device, so
            that ``step()`` can be captured in a CUDA graph and works with
            ``torch.amp.GradScaler`` without a host sync (the scaler's inverse scale is
            applied inside the kernel, the grads are unscaled in place, and an overflow skips
            the update and the step count).
        master_weights: (capturable only) keep a float32 copy of each fp16/bf16 param in
            ``state['master_param']``; the update runs on the copy and is written back rounded.
    """

    _STATE = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
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
        self.master_weights = master_weights
        # GradScaler hands a capturable FusedAdam its scale and found_inf instead of unscaling.
        self._step_supports_amp_scaling = capturable
        self._steps_skip_on_overflow = capturable
        self._lr_on_device = capturable
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

    def _state_keys(self, group: dict[str, Any], dtype: torch.dtype) -> tuple[str, ...]:
        if self.master_weights and dtype in REDUCED_PRECISION:
            return (*self._STATE, "master_param")
        return self._STATE

    def _initial_state(self, group: dict[str, Any], param: torch.Tensor, key: str) -> torch.Tensor:
        if key == "master_param":
            return param.detach().float()
        return super()._initial_state(group, param, key)

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        return torch.float32

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        beta1, beta2 = group["betas"]
        device = params[0].device
        flag = self._noop_flag(device)
        if self.capturable:
            found_inf, _, inv_scale = self._amp_scaling(device)
            flag.copy_(found_inf)
        else:
            inv_scale = self._constant(1.0)
        scalars = (self._lr(group), beta1, beta2, group["eps"], steps, self.adam_w_mode,
                   1 if group["bias_correction"] else 0, group["weight_decay"], inv_scale)
        amp_C = ops("amp_C")
        if len(states) == 3:
            amp_C.multi_tensor_adam_capturable_master(CHUNK_SIZE, flag, grads, params, *states, *scalars)
        else:
            amp_C.multi_tensor_adam_capturable(CHUNK_SIZE, flag, grads, params, *states, *scalars)
