"""FusedLARS: layer-wise adaptive rate scaling (ROCm apex's), one multi-tensor launch per param
group and dtype after the per-tensor norms."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.optim.optimizer import required

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer, momentum_defaults


class FusedLARS(FusedOptimizer):
    """LARS (You et al., "Large Batch Training of Convolutional Networks") as ROCm apex's
    FusedLARS computes it: SGD with momentum whose lr is scaled, per tensor, by the trust ratio
    ``trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)`` (1 when a norm is 0)::

        g = grad + weight_decay * w
        buf = momentum * buf - lr * trust_ratio * g
        w = w + buf        (nesterov: w + momentum * buf - lr * trust_ratio * g)

    A group with ``is_skipped=True`` takes plain lr (no trust ratio), as in ROCm apex. A step
    whose grads hold inf/nan is skipped. ``state['momentum_buffer']`` has the param's dtype.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate (required).
        momentum: momentum factor.
        dampening: must be 0 (ROCm apex's kernel ignores it; refused rather than ignored).
        weight_decay: L2 penalty, also in the trust ratio's denominator.
        trust_coefficient: LARS's eta.
        eps: added to the trust ratio's denominator.
        nesterov: Nesterov momentum.
        wd_after_momentum: must be False (as dampening).
        materialize_master_grads: accepted for ROCm apex's signature (amp's master-grad path,
            which ROCm's FusedLARS disables too).
        set_grad_none: ``zero_grad()`` sets grads to None.
    """

    _STATE = ("momentum_buffer",)
    _COUNTS_STEPS = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = required,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 0.0,
        nesterov: bool = False,
        wd_after_momentum: bool = False,
        materialize_master_grads: bool = True,
        set_grad_none: bool = False,
    ) -> None:
        defaults = momentum_defaults(lr, momentum, dampening, weight_decay, nesterov, eps=eps,
                                     trust_coefficient=trust_coefficient)
        if dampening != 0:
            raise ValueError("FusedLARS does not support dampening (ROCm apex's kernel ignores it)")
        if wd_after_momentum:
            raise ValueError("FusedLARS does not support wd_after_momentum (ROCm apex's kernel ignores it)")
        defaults["is_skipped"] = False
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        super().__init__(params, defaults, set_grad_none)

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        amp_C = ops("amp_C")
        flag = self._noop_flag(params[0].device)
        flag.zero_()  # the norms flag inf/nan grads, and the step then skips
        param_norms = amp_C.multi_tensor_l2norm(CHUNK_SIZE, flag, params, True)[1]
        grad_norms = amp_C.multi_tensor_l2norm(CHUNK_SIZE, flag, grads, True)[1]
        amp_C.multi_tensor_lars(
            CHUNK_SIZE, flag, grads, params, states[0], [], grad_norms, param_norms, float(group["lr"]),
            group["trust_coefficient"], group["eps"], group["weight_decay"], group["momentum"], group["dampening"],
            group["nesterov"], False, self.wd_after_momentum, 1.0, group["is_skipped"],
        )  # fmt: skip
