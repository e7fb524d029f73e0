"""apex.fp16_utils: fp16 training by hand (NVIDIA apex's module, which apex.amp superseded).

    model = FP16Model(model)                                   # fp16, batchnorms fp32
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True)
    optimizer.backward(loss); optimizer.step()

or step by step: network_to_half / convert_network, prep_param_lists, model_grads_to_master_grads,
master_params_to_model_params, LossScaler / DynamicLossScaler.
"""
from .fp16_optimizer import FP16_Optimizer
from .fp16util import (
    BN_convert_float,
    FP16Model,
    clip_grad_norm,
    convert_module,
    convert_network,
    master_params_to_model_params,
    model_grads_to_master_grads,
    network_to_half,
    prep_param_lists,
    to_python_float,
    tofp16,
)
from .loss_scaler import DynamicLossScaler, LossScaler

__all__ = [
    "FP16_Optimizer", "FP16Model", "BN_convert_float", "network_to_half", "convert_module", "convert_network",
    "prep_param_lists", "model_grads_to_master_grads", "master_params_to_model_params", "to_python_float",
    "clip_grad_norm", "tofp16", "LossScaler", "DynamicLossScaler",
]
