"""FusedAdagrad: Adagrad in one multi-tensor kernel launch per param group and dtype."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer, check_hyperparameters


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

    _STATE = ("sum",)

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

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        # Adagrad's math needs no step count; it is kept for torch.optim.Adagrad's state layout.
        ops("amp_C").multi_tensor_adagrad(
            CHUNK_SIZE, self._noop_flag(params[0].device), grads, params, states[0], float(group["lr"]),
            group["eps"], self.adagrad_w_mode, group["weight_decay"],
        )  # fmt: skip
