"""User-chosen casts around functions, on top of torch.autocast (apex's O1 registry API).

`register_half_function(module, name)` and friends replace `module.name` with a casting wrapper
when amp is initialized with O1/O4; the `half_function`/`bfloat16_function`/`float_function`/
`promote_function` decorators wrap a function right away. Either way the wrapper casts only
inside an autocast region (amp's O1/O4 forward, or the user's own `torch.autocast`) and does
nothing elsewhere, so registering costs nothing when amp is off or `disable_casts()` is active.
"""
import contextlib
import functools

import torch
from torch.utils._pytree import tree_leaves

from ._amp_state import _amp_state
from .model_casting import cast_floating

PROMOTE = "promote"  # cast target: the widest floating type among the arguments
_AUTOCAST_DEVICES = ("cpu", "cuda")
_REGISTRY = []  # (module, name, target) for initialize to apply


def _autocast_device(tree):
    """Device type of the first tensor argument when autocast is on for it, else None."""
    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor):
            device = leaf.device.type
            return device if device in _AUTOCAST_DEVICES and torch.is_autocast_enabled(device) else None
    return None


def _widest_floating_type(tree):
    widest = None
    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            widest = leaf.dtype if widest is None else torch.promote_types(widest, leaf.dtype)
    return widest


def _casting_wrapper(fn, target):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        device = _autocast_device((args, kwargs))
        if device is None:
            return fn(*args, **kwargs)
        dtype = _widest_floating_type((args, kwargs)) if target == PROMOTE else target
        if dtype is not None:
            args, kwargs = cast_floating((args, kwargs), dtype)
        if target is torch.float32:
            # A float function guards numerically sensitive code: the ops inside stay fp32 too.
            with torch.autocast(device, enabled=False):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    wrapper._amp_cast_target = target
    return wrapper


def half_function(fn):
    """Decorator: inside an autocast region, run `fn` on fp16 copies of its floating tensor args."""
    return _casting_wrapper(fn, torch.float16)


def bfloat16_function(fn):
    """Decorator: inside an autocast region, run `fn` on bf16 copies of its floating tensor args."""
    return _casting_wrapper(fn, torch.bfloat16)


def float_function(fn):
    """Decorator: inside an autocast region, run `fn` on fp32 args with autocast off inside it."""
    return _casting_wrapper(fn, torch.float32)


def promote_function(fn):
    """Decorator: inside an autocast region, cast floating args to the widest type among them."""
    return _casting_wrapper(fn, PROMOTE)


def _register(module, name, target):
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")
    _REGISTRY.append((module, name, target))
    properties = _amp_state.opt_properties
    if properties is not None and properties.enabled and properties.patch_torch_functions:
        apply_registrations()


def register_half_function(module, name):
    """Cast `module.name`'s floating args to fp16 under O1/O4. Call before amp.initialize."""
    _register(module, name, torch.float16)


def register_bfloat16_function(module, name):
    """Cast `module.name`'s floating args to bf16 under O1/O4. Call before amp.initialize."""
    _register(module, name, torch.bfloat16)


def register_float_function(module, name):
    """Run `module.name` in fp32 under O1/O4. Call before amp.initialize."""
    _register(module, name, torch.float32)


def register_promote_function(module, name):
    """Cast `module.name`'s floating args to their widest type under O1/O4. Call before amp.initialize."""
    _register(module, name, PROMOTE)


def apply_registrations():
    """Wrap every registered function once (initialize may run again in the same process)."""
    for module, name, target in _REGISTRY:
        fn = getattr(module, name)
        if getattr(fn, "_amp_cast_target", None) != target:
            setattr(module, name, _casting_wrapper(fn, target))


@contextlib.contextmanager
def disable_casts():
    """Run the enclosed code without amp's (or any enclosing autocast's) casts."""
    with contextlib.ExitStack() as stack:
        for device in _AUTOCAST_DEVICES:
            if torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield
