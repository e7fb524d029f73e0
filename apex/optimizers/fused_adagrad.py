"""FusedAdagrad: Adagrad in one multi-tensor kernel launch per param group and dtype."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import FusedOptimizer, amp_c, check_hyperparameters


class FusedAdagrad(FusedOptimizer):
    """Adagrad, as ``torch.optim.Adagrad`` with ``lr_decay=0`` and ``initial_accumulator_value=0``,
    NVIDIA apex's arguments.

    ``state['sum']`` (the param's dtype and shape) and ``state['step']`` match
    torch.optim.Adagrad's, so its state dicts load here.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate.
        eps: added to the denominator.
        weight_decay: weight decay factor.
        set_grad_none: ``zero_grad()`` sets grads to None.
        adagrad_w_mode: decoupled weight decay (added to the update) when True, L2 added to
            the grad when False.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
        set_grad_none: bool = True,
        adagrad_w_mode: bool = False,
    ) -> None:
        check_hyperparameters(lr=lr, eps=eps, weight_decay=weight_decay)
        self.adagrad_w_mode = 1 if adagrad_w_mode else 0
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay), set_grad_none)

    def _init_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        state["step"] = self._new_step(param)
        state["sum"] = self._zeros_state(param, "sum")

    def _update(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        self._ensure_state(group, params)
        # Adagrad's math needs no step count; it is kept for torch.optim.Adagrad's state layout.
        self._advance_steps(params)
        multi_tensor_applier(
            amp_c().multi_tensor_adagrad, self._noop_flag(params[0].device), self._tensor_lists(params, "sum"),
            group["lr"], group["eps"], self.adagrad_w_mode, group["weight_decay"],
        )  # fmt: skip
