"""FusedLAMB: layer-wise adaptive moments (LAMB) in one multi-tensor launch per param group and dtype."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer, check_hyperparameters

# Which tensors the trust ratio ||p|| / ||update|| scales (multi_tensor_lamb_step's `trust`).
TRUST_DECAYED, TRUST_ALL, TRUST_NONE = 0, 1, 2


class FusedLAMB(FusedOptimizer):
    """LAMB (You et al., "Large Batch Optimization for Deep Learning"), NVIDIA apex's arguments.

    Each step clips the grads by their global L2 norm (over every group) to
    ``max_grad_norm``, forms the Adam update, and scales it per tensor by the trust ratio
    ``||param|| / ||update||`` (only for tensors with weight decay, unless ``use_nvlamb``).
    Params may be float32, float16 or bfloat16 on CUDA or CPU (one device per group); the
    moments ``state['exp_avg']``/``state['exp_avg_sq']`` are float32 (apex keeps them in the
    param's dtype, where fp16 second moments of clipped grads underflow).

    Two passes over the params and state per step after the global grad norm (the moments with
    the per-tensor norms, then the trust-scaled update, recomputed from the new moments); unlike
    apex's kernel, the grads are left as they were.

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

    _STATE = ("exp_avg", "exp_avg_sq")
    # ||param|| is clamped to this in the trust ratio (Lamb clamps it to 10).
    _max_param_norm: float = math.inf

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | torch.Tensor = 1e-3,
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

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        return torch.float32

    def _trust(self) -> int:
        return TRUST_ALL if self.use_nvlamb else TRUST_DECAYED

    def _prepare_step(self, launches: list[tuple[dict[str, Any], list[torch.Tensor]]]) -> None:
        self._global_grad_norm = self._grad_norm(launches)

    def _grad_norm(self, launches: list[tuple[dict[str, Any], list[torch.Tensor]]]) -> torch.Tensor | None:
        """The L2 norm of every grad of the step: one norm per (device, dtype), then their norm."""
        grads: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for _, launch_grads in launches:
            grads.setdefault((launch_grads[0].device, launch_grads[0].dtype), []).extend(launch_grads)
        if not grads:
            return None
        amp_C = ops("amp_C")
        home = next(iter(grads))[0]
        norms = [amp_C.multi_tensor_l2norm(CHUNK_SIZE, self._noop_flag(device), same, False)[0].to(home)
                 for (device, _), same in grads.items()]
        return norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.cat(norms)).reshape(1)

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        device = params[0].device
        cpu = torch.device("cpu")
        self._lamb(group, grads, params, states, [], steps, self._noop_flag(device),
                   found_inf=self._constant(0.0, cpu), inv_scale=self._constant(1.0, cpu),
                   max_grad_norm=self._constant(float(group["max_grad_norm"]), cpu))

    def _lamb(self, group, grads, params, states, params_out, steps, flag, found_inf, inv_scale, max_grad_norm) -> None:
        beta1, beta2 = group["betas"]
        device = params[0].device
        # No global norm (Lamb without use_global_grad_norm): 0 never clips.
        norm = self._constant(0.0, device) if self._global_grad_norm is None else self._global_grad_norm.to(device)
        ops("amp_C").multi_tensor_lamb_step(
            CHUNK_SIZE, flag, grads, params, states[0], states[1], params_out, self._lr(group), beta1, beta2,
            group["eps"], steps, 1 if group["bias_correction"] else 0, group["weight_decay"],
            1 if group["grad_averaging"] else 0, self.adam_w_mode, norm,
            max_grad_norm, self._trust(), self._max_param_norm, found_inf, inv_scale,
        )  # fmt: skip
