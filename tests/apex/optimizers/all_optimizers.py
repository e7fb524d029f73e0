"""Every apex optimizer, made the same way, for the tests that cover them all."""
import torch

from apex import optimizers as o

# name -> (factory, param dtype): each with settings that exercise its kernel.
FACTORIES = {
    "adam": lambda ps: o.FusedAdam(ps, lr=1e-3, weight_decay=0.01),
    "adam_l2": lambda ps: o.FusedAdam(ps, lr=1e-3, weight_decay=0.01, adam_w_mode=False),
    "adam_capturable": lambda ps: o.FusedAdam(ps, lr=1e-3, capturable=True),
    "adam_master": lambda ps: o.FusedAdam(ps, lr=1e-3, capturable=True, master_weights=True),
    "sgd": lambda ps: o.FusedSGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01),
    "lamb": lambda ps: o.FusedLAMB(ps, lr=1e-2),
    "mixed_precision_lamb": lambda ps: o.FusedMixedPrecisionLamb(ps, lr=1e-2),
    "novograd": lambda ps: o.FusedNovoGrad(ps, lr=1e-2),
    "adagrad": lambda ps: o.FusedAdagrad(ps, lr=0.05),
    "adadelta": lambda ps: o.FusedAdadelta(ps, lr=0.5),
    "rmsprop": lambda ps: o.FusedRMSprop(ps, lr=1e-3, momentum=0.9, centered=True),
    "rmsprop_tf": lambda ps: o.FusedRMSpropTF(ps, lr=1e-3, momentum=0.9),
    "lars": lambda ps: o.FusedLARS(ps, lr=0.1, momentum=0.9),
    "bert_adam": lambda ps: o.FusedBertAdam(ps, lr=1e-3, warmup=0.1, t_total=100, max_grad_norm=1.0),
    "adamp": lambda ps: o.FusedAdamP(ps, lr=1e-3, weight_decay=0.01),
    "npu_lamb": lambda ps: o.NpuFusedLamb(ps, lr=1e-2, weight_decay=0.01, use_global_grad_norm=True),
}

# torch.optim's counterparts, where the math is the same: (apex name, torch factory).
TORCH_COUNTERPARTS = {
    "adam": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=False),
    "adam_l2": lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.01, foreach=False),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05, foreach=False),
    "adadelta": lambda ps: torch.optim.Adadelta(ps, lr=0.5, foreach=False),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9, centered=True, foreach=False),
}
