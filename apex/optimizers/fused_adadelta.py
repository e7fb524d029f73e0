"""FusedAdadelta: Adadelta in one multi-tensor kernel launch per param group and dtype."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer, check_hyperparameters


class FusedAdadelta(FusedOptimizer):
    """Adadelta (Zeiler, "ADADELTA: An Adaptive Learning Rate Method"), as ``torch.optim.Adadelta``
    computes it; Ascend apex-patch's ``NpuFusedAdadelta`` arguments.

    Params may be float32, float16 or bfloat16 on CUDA or CPU (one device per group);
    ``state['square_avg']``, ``state['acc_delta']`` (the params' dtype) and ``state['step']``
    are torch.optim.Adadelta's, so state dicts load either way.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: scales the delta before it is applied.
        rho: decay rate of the running averages of squared grads and squared deltas.
        eps: added inside the square roots.
        weight_decay: L2 penalty added to the grad.
        set_grad_none: ``zero_grad()`` sets grads to None.
    """

    _STATE = ("square_avg", "acc_delta")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        set_grad_none: bool = True,
    ) -> None:
        check_hyperparameters(lr=lr, eps=eps, weight_decay=weight_decay)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay), set_grad_none)

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        ops("amp_C").multi_tensor_adadelta(
            CHUNK_SIZE, self._noop_flag(params[0].device), grads, params, *states, float(group["lr"]), group["rho"],
            group["eps"], group["weight_decay"],
        )  # fmt: skip
