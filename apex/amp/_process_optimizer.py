"""Turning a user's optimizer into an amp optimizer: fp32 masters (O2/O5), grad layout, patched
step/zero_grad. The optimizer keeps its class, so isinstance checks and state dicts still work."""
import types

import torch

from ._amp_state import _amp_state
from .grads import FlatMasterGrads, FlatParamGrads, MasterGrads, ParamGrads
from .multi_tensor import FlagBuffers, launch
from .properties import LOW_PRECISION_TYPES


class AmpOptimizerState:
    """What amp keeps on `optimizer._amp_stash`: the grad layouts and the scale_loss bookkeeping."""

    def __init__(self, grad_sets, masters_to_model=None):
        self.grad_sets = grad_sets
        self.params_have_scaled_gradients = False  # a delay_unscale backward has not been unscaled yet
        self.already_patched = False  # step is replaced by a one-shot skip after an overflow
        self._masters_to_model = masters_to_model or ([], [])
        self._copy_flags = FlagBuffers()

    def before_backward(self):
        for grads in self.grad_sets:
            grads.before_backward()

    def unscale(self, scaler):
        for grads in self.grad_sets:
            grads.unscale(scaler)

    def after_step(self, copy_masters=True):
        """Publish the updated masters to the model (one multi_tensor_scale launch per dtype)."""
        masters, model_params = self._masters_to_model
        if copy_masters and masters:
            launch("multi_tensor_scale", self._copy_flags, [masters, model_params], 1.0)
        for grads in self.grad_sets:
            grads.after_step()


def _replace_with_masters(optimizer, fp32_originals):
    """Put an fp32 master in place of each fp16/bf16 param in the optimizer's groups.
    Returns (model_params, masters, fp32_params)."""
    model_params, masters, fp32_params = [], [], []
    for group in optimizer.param_groups:
        for i, param in enumerate(group["params"]):
            if not param.requires_grad:
                continue
            if param.dtype in LOW_PRECISION_TYPES:
                # Taken from the weights as they were before the model cast, so initialize loses nothing.
                master = fp32_originals.get(param, param.detach()).clone().float().requires_grad_()
                group["params"][i] = master
                if param in optimizer.state:
                    optimizer.state[master] = optimizer.state.pop(param)
                model_params.append(param)
                masters.append(master)
                _amp_state.master_of[param] = master
            elif param.dtype == torch.float32:
                fp32_params.append(param)
            else:
                raise TypeError("Optimizer's parameters must be float32, float16 or bfloat16. "
                                f"Received {param.type()}")
    return model_params, masters, fp32_params


def process_optimizer(optimizer, properties, combine_grad, fp32_originals):
    """Attach `_amp_stash` and patch `step`/`zero_grad` of `optimizer` in place."""
    if properties.master_weights:
        model_params, masters, fp32_params = _replace_with_masters(optimizer, fp32_originals)
        master_grads = (FlatMasterGrads if combine_grad else MasterGrads)(model_params, masters)
        grad_sets = [master_grads, (FlatParamGrads if combine_grad else ParamGrads)(fp32_params)]
        optimizer._amp_stash = AmpOptimizerState(grad_sets, (masters, model_params))
        # Recast per-param state that existed before (e.g. exp_avg of a resumed run) to fp32.
        optimizer.load_state_dict(optimizer.state_dict())
    else:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        optimizer._amp_stash = AmpOptimizerState([(FlatParamGrads if combine_grad else ParamGrads)(params)])

    def step(self, closure=None):
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        result = unpatched_step()
        self._amp_stash.after_step()
        return result

    def zero_grad(self, set_to_none=True):
        for grads in self._amp_stash.grad_sets:
            grads.zero(set_to_none)

    unpatched_step = optimizer.step
    # Bound methods, not plain functions: LR schedulers wrap `optimizer.step.__func__`.
    optimizer.step = types.MethodType(step, optimizer)
    optimizer.zero_grad = types.MethodType(zero_grad, optimizer)
    return optimizer
