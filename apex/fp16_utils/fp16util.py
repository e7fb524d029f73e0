"""Manual fp16 training helpers: a network in fp16 with fp32 batchnorms, fp32 master copies of its
params, and the grad / weight copies between the two (one multi-tensor launch per dtype)."""
import torch
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from apex.amp.model_casting import cast_floating, convert_module, convert_network as _convert_network
from apex.amp.multi_tensor import FlagBuffers, launch

__all__ = [
    "tofp16", "BN_convert_float", "network_to_half", "convert_module", "convert_network", "FP16Model",
    "prep_param_lists", "model_grads_to_master_grads", "master_params_to_model_params", "to_python_float",
    "clip_grad_norm",
]

clip_grad_norm = torch.nn.utils.clip_grad_norm_


class tofp16(nn.Module):  # noqa: N801  (apex's name)
    """A layer that casts its input to fp16."""

    def forward(self, input):
        return input.half()


def BN_convert_float(module):  # noqa: N802  (apex's name)
    """Cast every affine batchnorm inside `module` back to fp32 (after `module.half()`). Returns `module`."""
    for layer in module.modules():
        if isinstance(layer, nn.modules.batchnorm._BatchNorm) and layer.affine:
            layer.float()
    return module


def network_to_half(network):
    """`network` in fp16 with fp32 affine batchnorms, behind a layer casting its input to fp16.
    FP16Model does the same and also takes several inputs."""
    return nn.Sequential(tofp16(), BN_convert_float(network.half()))


def convert_network(network, dtype):
    """Cast `network`'s params, grads and buffers to `dtype` in place, except affine batchnorms
    (their statistics need fp32). Returns `network`."""
    return _convert_network(network, dtype, keep_batchnorm_fp32=True)


class FP16Model(nn.Module):
    """`network` converted to fp16 (affine batchnorms stay fp32); floating inputs are cast to fp16."""

    def __init__(self, network):
        super().__init__()
        self.network = convert_network(network, dtype=torch.half)

    def forward(self, *inputs):
        return self.network(*cast_floating(inputs, torch.half))


def prep_param_lists(model, flat_master=False):
    """(model_params, master_params): the model's trainable params and fp32 copies of them that
    require grad, for an optimizer to update. With `flat_master`, the masters are one flat fp32
    Parameter (with a grad buffer) holding all of them; the params must then share one dtype."""
    model_params = [param for param in model.parameters() if param.requires_grad]
    if not flat_master:
        return model_params, [param.detach().clone().float().requires_grad_() for param in model_params]
    if len({param.dtype for param in model_params}) > 1:
        raise TypeError("prep_param_lists(flat_master=True) needs params of one dtype; this model mixes "
                        f"{sorted(str(dtype) for dtype in {param.dtype for param in model_params})}. "
                        "Use flat_master=False, or FP16_Optimizer.")
    master = nn.Parameter(_flatten_dense_tensors([param.detach() for param in model_params]).float())
    master.grad = torch.empty_like(master)
    return model_params, [master]


def _copy(sources, destinations):
    """destinations[i] = sources[i] (any dtypes): one multi_tensor_scale launch per dtype pair."""
    if sources:
        launch("multi_tensor_scale", FlagBuffers(), [sources, destinations], 1.0)


def model_grads_to_master_grads(model_params, master_params, flat_master=False):
    """Copy the model params' grads into the masters' grads (allocated as needed). A master whose
    model param has no grad gets none."""
    if flat_master:
        master_grads = _unflatten_dense_tensors(master_params[0].grad, model_params)
        _copy([param.grad for param in model_params], list(master_grads))
        return
    sources, destinations = [], []
    for model, master in zip(model_params, master_params):
        if model.grad is None:
            master.grad = None
            continue
        if master.grad is None:
            master.grad = torch.empty_like(master)
        sources.append(model.grad)
        destinations.append(master.grad)
    _copy(sources, destinations)


def master_params_to_model_params(model_params, master_params, flat_master=False):
    """Copy the (updated) masters' values into the model params."""
    masters = _unflatten_dense_tensors(master_params[0].detach(), model_params) if flat_master else master_params
    _copy([master.detach() for master in masters], [param.detach() for param in model_params])


def to_python_float(t):
    """A one-element tensor's value as a Python float (anything with `.item()`; else `t[0]`)."""
    return t.item() if hasattr(t, "item") else t[0]
