"""Ascend apex-patch's optimizer names, with the arguments Ascend documents, on apex's fused
optimizers (CUDA and CPU). Where Ascend's signature is apex's, the name is the class itself."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.optim.optimizer import required

from apex.optimizers.fused_adadelta import FusedAdadelta
from apex.optimizers.fused_adam import FusedAdam
from apex.optimizers.fused_adamp import FusedAdamP
from apex.optimizers.fused_bert_adam import FusedBertAdam
from apex.optimizers.fused_rmsprop import FusedRMSprop, FusedRMSpropTF
from apex.optimizers.fused_sgd import FusedSGD
from apex.optimizers.lamb import NpuFusedLamb

NpuFusedAdamP = FusedAdamP
NpuFusedBertAdam = FusedBertAdam
NpuFusedAdadelta = FusedAdadelta
NpuFusedRMSprop = FusedRMSprop
NpuFusedRMSpropTF = FusedRMSpropTF


class NpuFusedSGD(FusedSGD):
    """SGD with momentum (torch.optim.SGD's arguments): :class:`FusedSGD`."""

    def __init__(self, params: Iterable[Any], lr: float = required, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov)


class NpuFusedAdam(FusedAdam):
    """Adam with L2 weight decay (torch.optim.Adam's arguments): :class:`FusedAdam` with ``adam_w_mode=False``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         adam_w_mode=False)


class NpuFusedAdamW(FusedAdam):
    """AdamW (torch.optim.AdamW's arguments): :class:`FusedAdam` with decoupled weight decay."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         adam_w_mode=True)


__all__ = ["NpuFusedSGD", "NpuFusedAdam", "NpuFusedAdamW", "NpuFusedAdamP", "NpuFusedBertAdam", "NpuFusedAdadelta",
           "NpuFusedLamb", "NpuFusedRMSprop", "NpuFusedRMSpropTF"]
