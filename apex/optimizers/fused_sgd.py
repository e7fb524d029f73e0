"""FusedSGD: SGD with momentum in one multi-tensor kernel launch per param group and dtype."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.optimizer import required

from apex._ops import ops
from apex.optimizers._fused_optimizer import CHUNK_SIZE, FusedOptimizer, momentum_defaults


class FusedSGD(FusedOptimizer):
    """SGD with optional (Nesterov) momentum, as ``torch.optim.SGD``, NVIDIA apex's arguments.

    Params may be float32, float16 or bfloat16 on CUDA or CPU (one device per group);
    ``state['momentum_buffer']`` has the param's dtype and shape, so state dicts load into
    ``torch.optim.SGD`` and back. Like apex, a buffer is kept even when ``momentum == 0``. With
    16-bit params the kernel rounds where torch.optim.SGD's fp16 arithmetic rounds, so the two
    follow the same trajectory.

    Under ``apex.amp`` with fp32 master params (an ``_amp_stash`` holding
    ``fp32_from_fp16_groups``), fp16 model params are updated through their masters in the same
    launch, and the grads are divided by ``most_recent_scale`` (the loss scale amp last used)
    inside the kernel.

    Args:
        params: iterable of tensors or of param-group dicts.
        lr: learning rate (required).
        momentum, dampening, nesterov: as ``torch.optim.SGD``.
        weight_decay: L2 penalty added to the grad.
        wd_after_momentum: add the weight decay after the momentum update instead of before.
        materialize_master_grads: (amp) the fp32 masters hold the grads; when False the
            kernel reads the fp16 model grads directly.
        set_grad_none: ``zero_grad()`` sets grads to None.
    """

    _STATE = ("momentum_buffer",)
    _COUNTS_STEPS = False  # torch.optim.SGD keeps no step count

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = required,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        wd_after_momentum: bool = False,
        materialize_master_grads: bool = True,
        set_grad_none: bool = False,
    ) -> None:
        defaults = momentum_defaults(lr, momentum, dampening, weight_decay, nesterov)
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        # apex.amp sets these to the loss scale of the last backward.
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False
        super().__init__(params, defaults, set_grad_none)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def _eager_step(self) -> None:
        stash = getattr(self, "_amp_stash", None)
        if stash is not None and hasattr(stash, "fp32_from_fp16_groups"):
            self._step_amp_masters(stash)
        else:
            super()._eager_step()
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False

    def _launch(self, group, params, grads, states, steps, fresh) -> None:
        self._sgd(group, grads, params, states[0], [], fresh)

    def _prime_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        # momentum * buf + (1 - dampening) * grad = grad, torch.optim.SGD's first buffer: buf = 0
        # without dampening (exact), else dampening / momentum * grad.
        if group["momentum"] != 0 and group["dampening"] != 0:
            state["momentum_buffer"].copy_(param.grad).mul_(group["dampening"] / group["momentum"])

    def _step_amp_masters(self, stash: Any) -> None:
        """apex.amp O2: the groups hold fp32 masters of the fp16 model params (and fp32 params)."""
        for index, group in enumerate(self.param_groups):
            fp32_params = [p for p in stash.fp32_from_fp32_groups[index] if p.grad is not None]
            if fp32_params:
                buffers, fresh = self._buffers(group, fp32_params)
                self._sgd(group, [p.grad for p in fp32_params], fp32_params, buffers, [], fresh)
            pairs = zip(stash.fp16_groups[index], stash.fp32_from_fp16_groups[index])
            if self.materialize_master_grads:
                triples = [(master.grad, master, model) for model, master in pairs if master.grad is not None]
            else:
                triples = [(model.grad, master, model) for model, master in pairs if model.grad is not None]
            if triples:
                grads, masters, models = (list(column) for column in zip(*triples))
                buffers, fresh = self._buffers(group, masters)
                self._sgd(group, grads, masters, buffers, models, fresh)

    def _buffers(self, group: dict[str, Any], params: list[torch.Tensor]) -> tuple[list[torch.Tensor], tuple[int, ...]]:
        """The params' momentum buffers (created where missing) and the positions of new ones."""
        fresh = []
        for position, param in enumerate(params):
            state = self.state[param]
            if state.get("momentum_buffer") is None:
                self._init_state(group, param, state)
                fresh.append(position)
        return [self.state[p]["momentum_buffer"] for p in params], tuple(fresh)

    def _sgd(self, group: dict[str, Any], grads: list[torch.Tensor], weights: list[torch.Tensor],
             buffers: list[torch.Tensor], copies: list[torch.Tensor], fresh: tuple[int, ...]) -> None:
        """Launch [grads, weights, buffers(, fp16 copies)]. A new buffer starts from the grad
        (``first_run``, as torch.optim.SGD does), so new buffers go in a launch of their own."""
        lists = [grads, weights, buffers, copies]
        if fresh and group["momentum"] != 0 and len(fresh) < len(weights):
            old = [i for i in range(len(weights)) if i not in fresh]
            for positions, first_run in ((fresh, True), (old, False)):
                picked = [[column[i] for i in positions] for column in lists[:3]]
                self._call(group, *picked, [copies[i] for i in positions] if copies else [], first_run)
            return
        self._call(group, *lists, first_run=bool(fresh))

    def _call(self, group: dict[str, Any], grads, weights, buffers, copies, first_run: bool) -> None:
        ops("amp_C").multi_tensor_sgd(
            CHUNK_SIZE, self._noop_flag(weights[0].device), grads, weights, buffers, copies, group["weight_decay"],
            group["momentum"], group["dampening"], group["lr"], group["nesterov"], first_run, self.wd_after_momentum,
            1.0 / self.most_recent_scale,
        )  # fmt: skip
