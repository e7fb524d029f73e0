"""Fused optimizers: torch.optim.Optimizer subclasses whose step is a few multi-tensor
kernel launches (amp_C) per param group, on CUDA or CPU, with NVIDIA apex's arguments."""
from apex.optimizers.fused_adagrad import FusedAdagrad
from apex.optimizers.fused_adam import FusedAdam
from apex.optimizers.fused_lamb import FusedLAMB
from apex.optimizers.fused_mixed_precision_lamb import FusedMixedPrecisionLamb
from apex.optimizers.fused_novograd import FusedNovoGrad
from apex.optimizers.fused_sgd import FusedSGD

__all__ = ["FusedAdagrad", "FusedAdam", "FusedLAMB", "FusedMixedPrecisionLamb", "FusedNovoGrad", "FusedSGD"]
