"""Turning a user's optimizer into an amp optimizer: fp32 masters (O2/O5), grad layout, patched
step/zero_grad/add_param_group. The optimizer keeps its class, so isinstance checks and state
dicts still work."""
import types

import torch

from ._amp_state import _amp_state
from .grads import FlatMasterGrads, FlatOptions, FlatParamGrads, MasterGrads, ParamGrads
from .multi_tensor import FlagBuffers, launch
from .properties import LOW_PRECISION_TYPES


def is_optimizer(obj):
    """A torch optimizer, or apex.parallel.LARC (which wraps one without subclassing it)."""
    if isinstance(obj, torch.optim.Optimizer):
        return True
    try:
        from apex.parallel.LARC import LARC
    except ImportError:  # no torch.distributed: no apex.parallel
        return False
    return isinstance(obj, LARC)


def _replace_with_masters(optimizer, groups, fp32_originals):
    """Put an fp32 master in place of each fp16/bf16 param in `groups` (the optimizer's state
    moves with it). Returns (model_params, masters, fp32_params)."""
    model_params, masters, fp32_params = [], [], []
    for group in groups:
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


class AmpOptimizerState:
    """What amp keeps on `optimizer._amp_stash`: the grad layouts of its param groups (one set
    per group added), the master -> model copy lists and the scale_loss bookkeeping.
    `flat_options` (grads.FlatOptions) applies to the combine_grad layouts."""

    def __init__(self, master_weights, combine_grad, flat_options=None):
        self.master_weights = master_weights
        self.combine_grad = combine_grad
        self.flat_options = flat_options or FlatOptions()
        self.grad_sets = []
        self.params_have_scaled_gradients = False  # a delay_unscale backward has not been unscaled yet
        self.already_patched = False  # step is replaced by a one-shot skip after an overflow
        self._masters, self._model_params = [], []
        self._copy_flags = FlagBuffers()

    def take_groups(self, optimizer, groups, fp32_originals=None):
        """Manage the grads of `groups` (already in optimizer.param_groups); with master weights,
        their fp16/bf16 params are replaced by fp32 masters first.
        Returns (fp16/bf16 model params, their masters, the params updated directly)."""
        model_params, masters = [], []
        if self.master_weights:
            model_params, masters, direct_params = _replace_with_masters(optimizer, groups, fp32_originals or {})
            if model_params:
                self.grad_sets.append(FlatMasterGrads(model_params, masters, self.flat_options) if self.combine_grad
                                      else MasterGrads(model_params, masters))
                self._masters += masters
                self._model_params += model_params
        else:
            direct_params = [p for group in groups for p in group["params"] if p.requires_grad]
        if direct_params:
            self.grad_sets.append(FlatParamGrads(direct_params, self.flat_options) if self.combine_grad
                                  else ParamGrads(direct_params))
        return model_params, masters, direct_params

    @property
    def reduces_grads(self):
        """Whether combine_ddp averages this optimizer's grads over ranks after each backward."""
        return self.flat_options.reducer is not None

    def before_backward(self):
        for grads in self.grad_sets:
            grads.before_backward()

    def arm_reduction(self, overlap):
        """combine_ddp: before a backward, let grads start reducing as they complete when `overlap`
        (the grads are unscaled right after this backward)."""
        for grads in self.grad_sets:
            if getattr(grads, "reducer", None) is not None:
                grads.reducer.arm(overlap)

    def unscale(self, scaler):
        for grads in self.grad_sets:
            grads.unscale(scaler)

    def publish_masters(self):
        """Copy the masters into their model params (one multi_tensor_scale launch per dtype)."""
        if self._masters:
            launch("multi_tensor_scale", self._copy_flags, [self._masters, self._model_params], 1.0)

    def after_step(self, copy_masters=True):
        if copy_masters:
            self.publish_masters()
        for grads in self.grad_sets:
            grads.after_step()


def process_optimizer(optimizer, properties, fp32_originals, flat_options=None):
    """Attach `_amp_stash` and patch `step`/`zero_grad`/`add_param_group` of `optimizer` in place."""
    stash = AmpOptimizerState(properties.master_weights, bool(properties.combine_grad), flat_options)
    optimizer._amp_stash = stash
    stash.take_groups(optimizer, optimizer.param_groups, fp32_originals)
    if properties.master_weights:
        # Recast per-param state that existed before (e.g. exp_avg of a resumed run) to fp32.
        optimizer.load_state_dict(optimizer.state_dict())

    def step(self, closure=None):
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        with _amp_state.handle._disable_casts():  # the update is fp32 math: no O1/O4 casts
            result = unpatched_step()
        self._amp_stash.after_step()
        return result

    def zero_grad(self, set_to_none=True):
        for grads in self._amp_stash.grad_sets:
            grads.zero(set_to_none)

    def add_param_group(self, param_group):
        unpatched_add_param_group(param_group)
        self._amp_stash.take_groups(self, self.param_groups[-1:])

    unpatched_step = optimizer.step
    unpatched_add_param_group = optimizer.add_param_group
    # Bound methods, not plain functions: LR schedulers wrap `optimizer.step.__func__`.
    optimizer.step = types.MethodType(step, optimizer)
    optimizer.zero_grad = types.MethodType(zero_grad, optimizer)
    optimizer.add_param_group = types.MethodType(add_param_group, optimizer)
    return optimizer
