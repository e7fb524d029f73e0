"""FusedNovoGrad: NovoGrad (layer-wise second moments) in multi-tensor kernel launches."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import FusedOptimizer, amp_c, check_hyperparameters

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

    def _init_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = self._new_step(param)
        state["exp_avg"] = self._zeros_state(param, "exp_avg")
        if group["init_zero"]:
            state["exp_avg_sq"] = torch.zeros((), dtype=torch.float32, device=param.device)
        else:
            ord = _NORM_ORDS[group["norm_type"]]
            state["exp_avg_sq"] = torch.linalg.vector_norm(param.grad, ord, dtype=torch.float32)

    def _update(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        self._ensure_state(group, params)
        beta1, beta2 = group["betas"]
        flag = self._noop_flag(params[0].device)
        for step, same_step in self._advance_steps(params).items():
            multi_tensor_applier(
                amp_c().multi_tensor_novograd, flag, self._tensor_lists(same_step, "exp_avg"), self._norms(same_step),
                group["lr"], beta1, beta2, group["eps"], step, 1 if group["bias_correction"] else 0,
                group["weight_decay"], 1 if group["grad_averaging"] else 0, self.moment_mode, group["norm_type"],
            )  # fmt: skip

    def _norms(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The params' ``state['exp_avg_sq']`` as views of one float32 vector, which the kernel
        blends the new grad norms into in place (kept between steps like the launch lists)."""
        def stack() -> torch.Tensor:
            norms = torch.stack([self.state[p]["exp_avg_sq"] for p in params])
            for param, view in zip(params, norms.unbind()):
                self.state[param]["exp_avg_sq"] = view
            return norms

        return self._kept(params, "norms", stack)
