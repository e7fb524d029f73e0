"""FusedRMSprop and FusedRMSpropTF: RMSprop as torch.optim and as TensorFlow compute it, in one
multi-tensor kernel launch per param group and dtype."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer, check_hyperparameters


class FusedRMSprop(FusedOptimizer):
    """RMSprop as ``torch.optim.RMSprop`` computes it (Ascend apex-patch's ``NpuFusedRMSprop``).

    State (``square_avg``; ``momentum_buffer`` with momentum; ``grad_avg`` when centered; the
    params' dtype; and ``step``) is torch.optim.RMSprop's, so state dicts load either way.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate.
        alpha: smoothing constant of the running average of squared grads.
        eps: added to the denominator.
        weight_decay: L2 penalty added to the grad.
        momentum: momentum factor.
        centered: normalise by the variance of the grad (running mean subtracted).
        set_grad_none: ``zero_grad()`` sets grads to None.
    """

    # The kernel's TensorFlow variant (timm's RMSpropTF) and its state initialisation.
    _tf_style = False
    _square_avg_start = 0.0

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        set_grad_none: bool = True,
        **extra: Any,
    ) -> None:
        check_hyperparameters(lr=lr, eps=eps, weight_decay=weight_decay, momentum=momentum, alpha=alpha)
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum, centered=centered,
                        **extra)
        super().__init__(params, defaults, set_grad_none)

    def _state_keys(self, group: dict[str, Any], dtype: torch.dtype) -> tuple[str, ...]:
        return ("square_avg", *(("momentum_buffer",) if group["momentum"] > 0 else ()),
                *(("grad_avg",) if group["centered"] else ()))

    def _initial_state(self, group: dict[str, Any], param: torch.Tensor, key: str) -> torch.Tensor:
        value = super()._initial_state(group, param, key)
        return value.fill_(self._square_avg_start) if key == "square_avg" else value

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        lists = dict(zip(self._state_keys(group, params[0].dtype), states))
        ops("amp_C").multi_tensor_rmsprop(
            CHUNK_SIZE, self._noop_flag(params[0].device), grads, params, lists["square_avg"],
            lists.get("momentum_buffer", []), lists.get("grad_avg", []), float(group["lr"]), group["alpha"],
            group["eps"], group["weight_decay"], group["momentum"], group["centered"], self._tf_style,
            group.get("decoupled_decay", False), group.get("lr_in_momentum", False),
        )  # fmt: skip


class FusedRMSpropTF(FusedRMSprop):
    """RMSprop as TensorFlow computes it (timm's ``RMSpropTF``; Ascend apex-patch's ``NpuFusedRMSpropTF``):
    ``square_avg`` starts at one, ``eps`` is added inside the square root, and the lr can be
    accumulated in the momentum buffer.

    Args: as :class:`FusedRMSprop` (other defaults), plus
        decoupled_decay: decay the params directly (``p *= 1 - lr * weight_decay``) instead of
            adding the L2 penalty to the grad.
        lr_in_momentum: the momentum buffer accumulates ``lr * grad / avg`` (TensorFlow) rather
            than the update being scaled by the lr (PyTorch).
    """

    _tf_style = True
    _square_avg_start = 1.0

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        alpha: float = 0.9,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        decoupled_decay: bool = False,
        lr_in_momentum: bool = True,
        set_grad_none: bool = True,
    ) -> None:
        super().__init__(params, lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                         centered=centered, set_grad_none=set_grad_none, decoupled_decay=decoupled_decay,
                         lr_in_momentum=lr_in_momentum)
