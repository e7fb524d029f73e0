"""What amp does to a model: cast its weights (O2/O3/O5), wrap its forward (input/output casts),
and keep its state dict in fp32."""
import torch
from torch.utils._pytree import tree_map_only

from ._amp_state import _amp_state
from .properties import LOW_PRECISION_TYPES


def cast_floating(tree, dtype):
    """Cast every floating-point tensor in a (nested) tuple/list/dict to `dtype`; leave the rest."""
    return tree_map_only(torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, tree)


def convert_module(module, dtype):
    """Cast `module`'s own floating params (and their grads) and buffers to `dtype` in place: the
    Parameter objects an optimizer holds stay the same."""
    for param in module.parameters(recurse=False):
        if param.is_floating_point():
            param.data = param.data.to(dtype)
            if param.grad is not None:
                param.grad = param.grad.to(dtype)
    for buffer in module.buffers(recurse=False):
        if buffer.is_floating_point():
            buffer.data = buffer.data.to(dtype)


def convert_network(model, dtype, keep_batchnorm_fp32):
    """Cast every module of `model` to `dtype` (convert_module), optionally leaving affine
    batchnorms in fp32 for stable statistics. Returns `model`."""
    for module in model.modules():
        if keep_batchnorm_fp32 and isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine:
            continue
        convert_module(module, dtype)
        if isinstance(module, torch.nn.RNNBase):
            module.flatten_parameters()
    return model


class AmpForward:
    """Stands in for `model.forward`: casts floating inputs to the model's type (O2/O3/O5), runs
    the original forward and casts floating outputs.

    A callable object rather than a closure so `copy.deepcopy(model)` rebinds it to the copy."""

    def __init__(self, forward, input_type=None, output_type=None):
        self.forward = forward
        self.input_type = input_type
        self.output_type = output_type

    def __call__(self, *args, **kwargs):
        if self.input_type is not None:
            args, kwargs = cast_floating((args, kwargs), self.input_type)
        output = self.forward(*args, **kwargs)
        return output if self.output_type is None else cast_floating(output, self.output_type)


def _state_dict_in_fp32(module, state_dict, prefix, local_metadata):
    """Checkpoints hold fp32: a param's fp32 master where it has one (so a resumed run restores
    the exact weights the optimizer updates), else the low-precision value cast up."""
    for name, tensor in list(module._parameters.items()) + list(module._buffers.items()):
        key = prefix + name
        if tensor is None or key not in state_dict:
            continue
        master = _amp_state.master_of.get(tensor)
        if master is not None:
            state_dict[key] = master.detach()
        elif state_dict[key].dtype in LOW_PRECISION_TYPES:
            state_dict[key] = state_dict[key].float()


def _load_masters_too(module, state_dict, prefix, *unused):
    """Loading a checkpoint into an amp model also restores the fp32 masters of its params."""
    with torch.no_grad():
        for name, param in module._parameters.items():
            master = _amp_state.master_of.get(param) if param is not None else None
            value = state_dict.get(prefix + name)
            if master is not None and isinstance(value, torch.Tensor) and value.shape == master.shape:
                master.copy_(value)


def keep_state_dict_fp32(model):
    for module in model.modules():
        module.register_state_dict_post_hook(_state_dict_in_fp32)
        module.register_load_state_dict_pre_hook(_load_masters_too)
