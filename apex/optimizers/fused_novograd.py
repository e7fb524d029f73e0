"""FusedNovoGrad: NovoGrad (layer-wise second moments) in multi-tensor kernel launches."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer, check_hyperparameters

# norm_type values apex accepts, as the ord of the per-tensor grad norm.
_NORM_ORDS = {2: 2.0, 0: float("inf")}


class FusedNovoGrad(FusedOptimizer):
    """NovoGrad (Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive
    Moments"), NVIDIA apex's arguments.

    The second moment is one number per tensor: a running blend of the grad's norm,
    ``v = sqrt(beta2 * v**2 + (1 - beta2) * ||g||**2)`` for ``norm_type=2`` or
    ``v = beta2 * v + (1 - beta2) * max|g|`` for ``norm_type=0``, kept (as apex names it) in
    ``state['exp_avg_sq']``, a float32 scalar; ``state['exp_avg']`` has the param's dtype.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr, betas, eps, bias_correction: as in Adam.
        weight_decay: weight decay factor.
        amsgrad: not supported; True raises RuntimeError.
        reg_inside_moment: add the weight decay to the normalized grad inside the first moment
            (else decoupled, added to the update).
        grad_averaging: scale the new grad by ``1 - beta1`` in the first moment (else by 1).
        norm_type: 2 (L2) or 0 (L-infinity) per-tensor grad norm.
        init_zero: start the norm average at 0 (else at the first step's grad norm, so
            that the first blend changes nothing).
        set_grad_none: ``zero_grad()`` sets grads to None.
    """

    _STATE = ("exp_avg", "exp_avg_sq")
    _STACKED = ("exp_avg_sq",)  # one norm per param: the kernel blends the new norms into one vector

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        reg_inside_moment: bool = False,
        grad_averaging: bool = True,
        norm_type: int = 2,
        init_zero: bool = False,
        set_grad_none: bool = True,
    ) -> None:
        if amsgrad:
            raise RuntimeError("FusedNovoGrad does not support the AMSGrad variant.")
        check_hyperparameters(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        if norm_type not in _NORM_ORDS:
            raise ValueError(f"FusedNovoGrad supports norm_type 2 (L2) and 0 (L-infinity), got {norm_type}")
        defaults = dict(
            lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
            grad_averaging=grad_averaging, norm_type=norm_type, init_zero=init_zero,
        )  # fmt: skip
        self.moment_mode = 0 if reg_inside_moment else 1
        super().__init__(params, defaults, set_grad_none)

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        return torch.float32 if key == "exp_avg_sq" else param.dtype

    def _initial_state(self, group: dict[str, Any], param: torch.Tensor, key: str) -> torch.Tensor:
        if key != "exp_avg_sq":
            return super()._initial_state(group, param, key)
        if group["init_zero"]:
            return torch.zeros((), dtype=torch.float32, device=param.device)
        return torch.linalg.vector_norm(param.grad, _NORM_ORDS[group["norm_type"]], dtype=torch.float32)

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        exp_avgs, norms = states
        # The norms are one float32 vector (views of it are the states) eagerly; traced, the scalars.
        vector = norms if isinstance(norms, torch.Tensor) else torch.stack(norms)
        beta1, beta2 = group["betas"]
        ops("amp_C").multi_tensor_novograd_step(
            CHUNK_SIZE, self._noop_flag(params[0].device), grads, params, exp_avgs, vector, group["lr"], beta1, beta2,
            group["eps"], steps, 1 if group["bias_correction"] else 0, group["weight_decay"],
            1 if group["grad_averaging"] else 0, self.moment_mode, group["norm_type"],
        )  # fmt: skip
        if vector is not norms:
            torch._foreach_copy_(norms, list(vector.unbind()))
