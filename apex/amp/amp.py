"""`amp.init()`: install amp's casts (the cast lists, RNNs, user registrations), and the decorators
and `register_*` functions that add casts around the user's own functions.

    handle = amp.init()                      # fp16 (patch_type=torch.bfloat16 for bf16)
    y = torch.nn.functional.linear(x, w)     # runs in fp16 now
    handle._deactivate()                     # original functions back

`amp.initialize(..., opt_level="O1"|"O4")` calls `init` itself: the legacy and the current API
share this one implementation of casting.
"""
import functools

import torch

from ._amp_state import _amp_state
from .casting_handle import AmpHandle, NoOpHandle
from .lists import functional_overrides, tensor_overrides, torch_overrides
from .rnn_compat import install_rnn_casts
from .wrap import (cast_wrapper, fp32_inplace_wrapper, match_self_wrapper, promote_wrapper,
                   refuse_low_precision_wrapper, sequence_promote_wrapper)

PROMOTE = "promote"  # a registration's target: the widest floating type among the arguments
_LOW_PRECISION_LISTS = {torch.float16: "FP16_FUNCS", torch.bfloat16: "BFLOAT16_FUNCS"}
# (module, name, torch.float16 | torch.bfloat16 | torch.float32 | PROMOTE), applied by every init.
# A list, not a dict: the "module" may be any object holding the function, hashable or not.
_USER_REGISTRY = []


class _CurrentHandle:
    """The handle a decorated function consults: whichever one is current when it runs."""

    def __getattr__(self, name):
        return getattr(_amp_state.handle, name)


_CURRENT_HANDLE = _CurrentHandle()


def _wrapper_for(target, handle, name):
    """make_wrapper(fn) for a registration or decorator target."""
    if target == PROMOTE:
        return functools.partial(promote_wrapper, handle=handle, name=name)
    # Low-precision casts of params are cached; fp32 casts of fp32 params are no casts at all.
    return functools.partial(cast_wrapper, dtype=target, handle=handle, name=name,
                             try_caching=target is not torch.float32)


def half_function(fn):
    """Decorator: while amp's casts are active, run `fn` on fp16 copies of its floating tensor args."""
    return _wrapper_for(torch.float16, _CURRENT_HANDLE, fn.__name__)(fn)


def bfloat16_function(fn):
    """Decorator: while amp's casts are active, run `fn` on bf16 copies of its floating tensor args."""
    return _wrapper_for(torch.bfloat16, _CURRENT_HANDLE, fn.__name__)(fn)


def float_function(fn):
    """Decorator: while amp's casts are active, run `fn` on fp32 copies of its floating tensor args."""
    return _wrapper_for(torch.float32, _CURRENT_HANDLE, fn.__name__)(fn)


def promote_function(fn):
    """Decorator: while amp's casts are active, cast `fn`'s mixed floating args to the widest type."""
    return _wrapper_for(PROMOTE, _CURRENT_HANDLE, fn.__name__)(fn)


def _register(module, name, target):
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")
    _USER_REGISTRY[:] = [entry for entry in _USER_REGISTRY if not (entry[0] is module and entry[1] == name)]
    _USER_REGISTRY.append((module, name, target))


def register_half_function(module, name):
    """Run `module.name` in fp16 whenever amp's casts are installed. Call before amp.init / initialize."""
    _register(module, name, torch.float16)


def register_bfloat16_function(module, name):
    """Run `module.name` in bf16 whenever amp's casts are installed. Call before amp.init / initialize."""
    _register(module, name, torch.bfloat16)


def register_float_function(module, name):
    """Run `module.name` in fp32 whenever amp's casts are installed. Call before amp.init / initialize."""
    _register(module, name, torch.float32)


def register_promote_function(module, name):
    """Cast `module.name`'s mixed floating args to the widest type whenever amp's casts are installed."""
    _register(module, name, PROMOTE)


def _install_cast_lists(handle, patch_type, allow_banned, user_cast_preferred):
    low_precision_list = _LOW_PRECISION_LISTS[patch_type]
    user_preferred = [(module, name) for module, name, _ in _USER_REGISTRY] if user_cast_preferred else []

    def patch(owner, name, factory, **options):
        if any(module is owner and registered == name for module, registered in user_preferred):
            return  # the user's own cast is the only one
        handle._patch(owner, name, functools.partial(factory, handle=handle, name=name, **options))

    # The user's registrations go innermost: where one also names a listed function, its cast
    # is the last one before the call.
    for module, name, target in _USER_REGISTRY:
        handle._patch(module, name, _wrapper_for(target, handle, name))

    for lists in (functional_overrides, torch_overrides, tensor_overrides):
        for name in getattr(lists, low_precision_list):
            patch(lists.MODULE, name, cast_wrapper, dtype=patch_type, try_caching=True)
        for name in lists.FP32_FUNCS:
            patch(lists.MODULE, name, cast_wrapper, dtype=torch.float32)
    for lists in (torch_overrides, tensor_overrides):
        for name in lists.CASTS:
            patch(lists.MODULE, name, promote_wrapper)
        for name in lists.SEQUENCE_CASTS:
            patch(lists.MODULE, name, sequence_promote_wrapper)

    # In-place forms: an fp32 function may not write into fp16/bf16 (torch.exp_ refuses any
    # low-precision arg, Tensor.exp_ a low-precision self); the others cast to self's type.
    for name in torch_overrides.FP32_FUNCS:
        patch(torch, name + "_", refuse_low_precision_wrapper)
    for name in tensor_overrides.FP32_FUNCS:
        patch(torch.Tensor, name + "_", fp32_inplace_wrapper)
    for name in getattr(tensor_overrides, low_precision_list) + tensor_overrides.CASTS:
        patch(torch.Tensor, name + "_", match_self_wrapper)

    install_rnn_casts(handle, patch_type)

    for name, advice in functional_overrides.BANNED_FUNCS:
        if allow_banned:
            patch(functional_overrides.MODULE, name, cast_wrapper, dtype=torch.float32)
        else:
            patch(functional_overrides.MODULE, name, refuse_low_precision_wrapper, message=advice)


def init(enabled=True, loss_scale="dynamic", patch_type=torch.float16, enable_caching=True, verbose=False,
         allow_banned=False, user_cast_preferred=None):
    """Install amp's casts process-wide and return their handle (the legacy amp API).

    From now on the listed torch / torch.nn.functional / Tensor functions run in `patch_type`
    (torch.float16: NVIDIA apex's lists; torch.bfloat16: ROCm apex's), or in fp32, or promote
    mixed inputs to the widest type (see apex.amp.lists); RNNs run in `patch_type`; banned
    functions raise with advice on fp16/bf16 input (or run in fp32 with `allow_banned`).
    `enable_caching` casts each fp32 param once per iteration; `verbose` prints every cast.
    `user_cast_preferred` (Ascend apex's option): a function registered with `register_*_function`
    gets only that cast, not the lists' as well.
    Casts made by an earlier init are removed first: one set is installed at a time.
    `handle._deactivate()` removes them; `amp.disable_casts()` pauses them.
    """
    _amp_state.handle._deactivate()
    if not enabled:
        _amp_state.handle = NoOpHandle()
        return _amp_state.handle
    if patch_type not in _LOW_PRECISION_LISTS:
        raise RuntimeError("Unsupported patch_torch_functions_type passed to initialize. "
                           "Supported types are: torch.float16 and torch.bfloat16.")
    handle = AmpHandle(loss_scale, enable_caching, verbose, patch_type)
    _install_cast_lists(handle, patch_type, allow_banned, user_cast_preferred)
    _amp_state.handle = handle
    return handle
