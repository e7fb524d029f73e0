"""FP16_Optimizer: fp32 master weights and loss scaling around any optimizer, by hand (deprecated
in apex in favour of amp; kept for the scripts that use it). Built on amp's own pieces: the
masters and grad bookkeeping of O2 (`AmpOptimizerState`) and amp's `LossScaler`."""
import torch

from apex.amp._amp_state import maybe_print
from apex.amp._process_optimizer import AmpOptimizerState
from apex.amp.scaler import LossScaler

from .fp16util import clip_grad_norm


def _wrapped_optimizer_attribute(name):
    """A property reading and writing `self.optimizer.<name>`."""
    return property(lambda self: getattr(self.optimizer, name),
                    lambda self, value: setattr(self.optimizer, name, value))


class FP16_Optimizer:  # noqa: N801  (apex's name)
    """Wraps `init_optimizer`, whose param groups may hold fp16/bf16 and fp32 params: the fp16/bf16
    ones are replaced in the groups by fp32 masters that the optimizer updates, and copied back
    into the model after each step.

        optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True)
        optimizer.zero_grad()
        optimizer.backward(loss)      # instead of loss.backward()
        optimizer.step()              # skipped (and the scale reduced) when the grads overflowed

    Args:
        init_optimizer: a torch.optim optimizer (or apex fused optimizer) over the model's params.
        static_loss_scale (float, default 1.0): the loss scale when not dynamic.
        dynamic_loss_scale (bool, default False): adjust the scale automatically.
        dynamic_loss_args (dict, optional): options of the dynamic scaler (init_scale, scale_factor,
            scale_window, min_loss_scale, max_loss_scale).
        verbose (bool, default True): print what happens to each param group.
    """

    def __init__(self, init_optimizer, static_loss_scale=1.0, dynamic_loss_scale=False, dynamic_loss_args=None,
                 verbose=True):
        from apex import deprecated_warning

        deprecated_warning("apex.fp16_utils.FP16_Optimizer is deprecated; use apex.amp (opt_level O2 keeps "
                           "fp32 master weights the same way) or torch.amp.")
        self.verbose = verbose
        self.optimizer = init_optimizer
        self._stash = AmpOptimizerState(master_weights=True, combine_grad=False)
        self.fp16_groups, self.fp32_from_fp16_groups, self.fp32_from_fp32_groups = [], [], []
        for index, group in enumerate(init_optimizer.param_groups):
            model_params, masters, fp32_params = self._stash.take_groups(init_optimizer, [group])
            self.maybe_print(f"FP16_Optimizer processing param group {index}: {len(model_params)} fp16/bf16 "
                             f"params get fp32 masters, {len(fp32_params)} fp32 params are updated directly")
            self.fp16_groups.append(model_params)
            self.fp32_from_fp16_groups.append(masters)
            self.fp32_from_fp32_groups.append(fp32_params)
        self.all_fp16_params = [p for group in self.fp16_groups for p in group]
        self.all_fp32_from_fp16_params = [p for group in self.fp32_from_fp16_groups for p in group]
        self.all_fp32_from_fp32_params = [p for group in self.fp32_from_fp32_groups for p in group]
        # Recast per-param state the optimizer already holds to the fp32 masters.
        init_optimizer.load_state_dict(init_optimizer.state_dict())

        self.dynamic_loss_scale = dynamic_loss_scale
        self.loss_scaler = (LossScaler("dynamic", **(dynamic_loss_args or {})) if dynamic_loss_scale
                            else LossScaler(static_loss_scale))
        self.overflow = False
        self.first_closure_call_this_step = True
        self.clip_grad_norm = clip_grad_norm

    def maybe_print(self, msg):
        if self.verbose:
            print(msg)

    def __getstate__(self):
        raise RuntimeError("FP16_Optimizer should be serialized using state_dict().")

    def __setstate__(self, state):
        raise RuntimeError("FP16_Optimizer should be deserialized using load_state_dict().")

    def zero_grad(self, set_grads_to_None=False):  # noqa: N803  (apex's name)
        """Zero (or drop) the grads of the masters, the fp32 params and the fp16/bf16 model params."""
        for param in [p for group in self.optimizer.param_groups for p in group["params"]] + self.all_fp16_params:
            if set_grads_to_None:
                param.grad = None
            elif param.grad is not None:
                param.grad.detach_()
                param.grad.zero_()

    def backward(self, loss, update_master_grads=True, retain_graph=False):
        """`(loss.float() * loss_scale).backward()`, then (with `update_master_grads`) the unscaled
        grads land in the masters' and fp32 params' `.grad`, added to what earlier backward calls
        of this step left there. With `update_master_grads=False` the grads stay scaled until
        `update_master_grads()` (several losses, one unscale)."""
        if not self._stash.params_have_scaled_gradients:
            self._stash.before_backward()
        (loss.float() * self.loss_scaler.loss_scale()).backward(retain_graph=retain_graph)
        self._stash.params_have_scaled_gradients = True
        if update_master_grads:
            self.update_master_grads()

    def update_master_grads(self):
        """Unscale the grads of the backward passes since the last call into the masters' grads
        (one launch per dtype) and decide whether the next step overflows."""
        if not self._stash.params_have_scaled_gradients:
            return
        self.loss_scaler.clear_overflow_state()
        self._stash.unscale(self.loss_scaler)
        self._stash.params_have_scaled_gradients = False
        self.overflow = self.loss_scaler.update_scale()

    def step(self, closure=None):
        """Update the masters with the wrapped optimizer and copy them into the model; a no-op when
        the last backward overflowed. A `closure` must call `self.backward(loss)` itself."""
        if self.overflow:
            maybe_print(f"Gradient overflow.  Skipping step, reducing loss scale to {self.loss_scaler.loss_scale()}")
            self._stash.after_step(copy_masters=False)
            return None
        retval = self._step_with_closure(closure) if closure is not None else self.optimizer.step()
        self._stash.after_step()
        return retval

    def _step_with_closure(self, closure):
        def wrapped_closure():
            if self.first_closure_call_this_step:
                self.first_closure_call_this_step = False
            else:  # the optimizer evaluates the closure again after changing the masters
                self._stash.publish_masters()
            loss = closure()
            while self.overflow:
                maybe_print(f"OVERFLOW within closure! Skipping step, reducing loss scale to "
                            f"{self.loss_scaler.loss_scale()}")
                loss = closure()
            return loss

        retval = self.optimizer.step(wrapped_closure)
        self.first_closure_call_this_step = True
        return retval

    def clip_master_grads(self, max_norm, norm_type=2):
        """Clip the masters' and fp32 params' grads to total norm `max_norm`; returns the norm
        before clipping, or -1 when the last backward overflowed."""
        if self.overflow:
            return -1
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return self.clip_grad_norm(params, max_norm, norm_type)

    def inspect_master_grad_data(self):
        """The masters' and fp32 params' grads, one list per param group (None while overflowed)."""
        if self.overflow:
            print("Warning:  calling FP16_Optimizer.inspect_master_grad_data while in an overflow state.  "
                  "Gradients are currently invalid (may be inf, nan, or stale).  Returning None.")
            return None
        return [[None if p.grad is None else p.grad.data for p in group["params"]]
                for group in self.optimizer.param_groups]

    def state_dict(self):
        """The wrapped optimizer's state dict, the loss scale and the fp32 masters."""
        return {
            "loss_scaler": self.loss_scaler.state_dict(),
            "dynamic_loss_scale": self.dynamic_loss_scale,
            "overflow": self.overflow,
            "first_closure_call_this_step": self.first_closure_call_this_step,
            "optimizer_state_dict": self.optimizer.state_dict(),
            "fp32_from_fp16": self.fp32_from_fp16_groups,
        }

    def load_state_dict(self, state_dict):
        """Restore a `state_dict()`; call `model.load_state_dict` first (the masters are restored
        from the checkpoint's own fp32 copies, not from the model)."""
        saved_scaler = state_dict["loss_scaler"]
        if isinstance(saved_scaler, LossScaler):  # checkpoints that pickled the scaler itself
            saved_scaler = saved_scaler.state_dict()
        self.loss_scaler.load_state_dict(saved_scaler)
        self.dynamic_loss_scale = state_dict["dynamic_loss_scale"]
        self.overflow = state_dict["overflow"]
        self.first_closure_call_this_step = state_dict["first_closure_call_this_step"]
        self.optimizer.load_state_dict(state_dict["optimizer_state_dict"])
        with torch.no_grad():
            for current_group, saved_group in zip(self.fp32_from_fp16_groups, state_dict["fp32_from_fp16"]):
                for current, saved in zip(current_group, saved_group):
                    current.copy_(saved)

    @property
    def loss_scale(self):
        return self.loss_scaler.loss_scale()

    @loss_scale.setter
    def loss_scale(self, value):
        self.loss_scaler._loss_scale = value

    state = _wrapped_optimizer_attribute("state")
    param_groups = _wrapped_optimizer_attribute("param_groups")
