"""FusedSGD: SGD with momentum in multi-tensor kernel launches."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.optimizer import required

from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import FusedOptimizer, amp_c


class FusedSGD(FusedOptimizer):
    """SGD with optional (Nesterov) momentum, as ``torch.optim.SGD``, NVIDIA apex's arguments.

    Params may be float32, float16 or bfloat16 on CUDA or CPU (one device per group);
    ``state['momentum_buffer']`` has the param's dtype and shape, so state dicts load into
    ``torch.optim.SGD`` and back. Like apex, a buffer is kept even when ``momentum == 0``.

    Under ``apex.amp`` (an ``_amp_stash`` with fp32 master params), fp16 model params are
    updated through their fp32 masters in the same launch, and the grads are divided by
    ``most_recent_scale`` (the loss scale amp last used) inside the kernel.

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
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
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

    def _step_groups(self) -> None:
        stash = getattr(self, "_amp_stash", None)
        if stash is not None and hasattr(stash, "fp32_from_fp16_groups"):
            self._step_amp_masters(stash)
        else:
            super()._step_groups()
        self.most_recent_scale = 1.0
        self.scale_set_by_backward = False

    def _update(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        self._launch(group, [self._grads(params), params])

    def _step_amp_masters(self, stash: Any) -> None:
        """apex.amp O2: the groups hold fp32 masters of the fp16 model params (and fp32 params)."""
        for index, group in enumerate(self.param_groups):
            fp32_params = [p for p in stash.fp32_from_fp32_groups[index] if p.grad is not None]
            if fp32_params:
                self._launch(group, [[p.grad for p in fp32_params], fp32_params])
            pairs = zip(stash.fp16_groups[index], stash.fp32_from_fp16_groups[index])
            if self.materialize_master_grads:
                triples = [(master.grad, master, model) for model, master in pairs if master.grad is not None]
            else:
                triples = [(model.grad, master, model) for model, master in pairs if model.grad is not None]
            if triples:
                self._launch(group, [list(column) for column in zip(*triples)])

    def _launch(self, group: dict[str, Any], lists: list[list[torch.Tensor]]) -> None:
        """Launch ``[grads, params(, fp16 model copies)]`` with the params' momentum buffers.

        The kernel starts a new buffer from the grad (``first_run``, as torch.optim.SGD does)
        or blends into it, so params with and without a buffer go in separate launches.
        """
        params = lists[1]
        memo = self._memo(params)
        buffers = None if memo is None else memo.get("momentum_buffers")
        if buffers is not None:  # every param has had its buffer since an earlier step
            self._launch_sgd(group, [lists[0], params, buffers, *lists[2:]], first_run=False)
            return
        is_new = ["momentum_buffer" not in self.state[p] for p in params]
        for first_run in (True, False):
            picked = [i for i, new in enumerate(is_new) if new == first_run]
            if not picked:
                continue
            grads, weights, *model_copies = ([column[i] for i in picked] for column in lists)
            if first_run:
                for param in weights:
                    self.state[param]["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            buffers = [self.state[p]["momentum_buffer"] for p in weights]
            self._launch_sgd(group, [grads, weights, buffers, *model_copies], first_run)
        if memo is not None:
            memo["momentum_buffers"] = [self.state[p]["momentum_buffer"] for p in params]

    def _launch_sgd(self, group: dict[str, Any], lists: list[list[torch.Tensor]], first_run: bool) -> None:
        multi_tensor_applier(
            amp_c().multi_tensor_sgd, self._noop_flag(lists[1][0].device), lists, group["weight_decay"],
            group["momentum"], group["dampening"], group["lr"], group["nesterov"], first_run, self.wd_after_momentum,
            1.0 / self.most_recent_scale,
        )  # fmt: skip
