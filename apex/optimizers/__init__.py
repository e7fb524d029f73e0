"""Fused optimizers: torch.optim.Optimizer subclasses whose step is one multi-tensor kernel call
(amp_C) per param group and dtype, on CUDA or CPU: NVIDIA apex's (FusedAdam, FusedLAMB, FusedSGD,
...), ROCm apex's FusedLARS, and Ascend apex-patch's set (FusedAdamP, FusedBertAdam, FusedAdadelta,
FusedRMSprop, FusedRMSpropTF, Lamb, and the NpuFused* names)."""
from apex.optimizers.fused_adadelta import FusedAdadelta
from apex.optimizers.fused_adagrad import FusedAdagrad
from apex.optimizers.fused_adam import FusedAdam
from apex.optimizers.fused_adamp import FusedAdamP
from apex.optimizers.fused_bert_adam import FusedBertAdam
from apex.optimizers.fused_lamb import FusedLAMB
from apex.optimizers.fused_lars import FusedLARS
from apex.optimizers.fused_mixed_precision_lamb import FusedMixedPrecisionLamb
from apex.optimizers.fused_novograd import FusedNovoGrad
from apex.optimizers.fused_rmsprop import FusedRMSprop, FusedRMSpropTF
from apex.optimizers.fused_sgd import FusedSGD
from apex.optimizers.lamb import Lamb, NpuFusedLamb
from apex.optimizers.npu import (
    NpuFusedAdadelta,
    NpuFusedAdam,
    NpuFusedAdamP,
    NpuFusedAdamW,
    NpuFusedBertAdam,
    NpuFusedRMSprop,
    NpuFusedRMSpropTF,
    NpuFusedSGD,
)

__all__ = [
    "FusedAdadelta", "FusedAdagrad", "FusedAdam", "FusedAdamP", "FusedBertAdam", "FusedLAMB", "FusedLARS",
    "FusedMixedPrecisionLamb", "FusedNovoGrad", "FusedRMSprop", "FusedRMSpropTF", "FusedSGD", "Lamb",
    "NpuFusedAdadelta", "NpuFusedAdam", "NpuFusedAdamP", "NpuFusedAdamW", "NpuFusedBertAdam", "NpuFusedLamb",
    "NpuFusedRMSprop", "NpuFusedRMSpropTF", "NpuFusedSGD",
]
