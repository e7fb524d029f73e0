"""amp's casting wrappers: what stands in for a listed function while amp's casts are installed.

Each factory takes the original function and a handle and returns a function that reads
`handle._is_active` first (one attribute read when `disable_casts()` is on), then casts the
tensor arguments by one rule and calls the original:

    cast_wrapper               floating args to one dtype (fp16, bf16 or fp32)
    promote_wrapper            mixed floating args to their widest type
    sequence_promote_wrapper   the same over the tensors of a sequence argument (torch.cat)
    match_self_wrapper         in-place methods: the other args to self's dtype
    fp32_inplace_wrapper       in-place methods of fp32 functions: refused on fp16/bf16 self
    refuse_low_precision_wrapper  refused when any argument is fp16/bf16 (banned functions)

Only fp16, bf16 and fp32 tensors are cast; float64 and integer tensors pass through untouched.
A handle provides `_is_active`, `has_cache`, `cache` (a CastCache) and `verbose`.
"""
import functools
import itertools

import torch
from torch.nn import Parameter

CASTABLE = frozenset((torch.float16, torch.bfloat16, torch.float32))
LOW_PRECISION = frozenset((torch.float16, torch.bfloat16))
_TYPE_NAMES = {torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float32: "Float"}


class CastCache:
    """fp32 params cast to fp16/bf16 once and reused by every later call, so a weight used by
    several layers, or an RNN cell unrolled over time steps, is cast once per iteration.

    An entry is reused while the param is unchanged in place (its version counter) and, with
    autograd on, while it matches the param's requires_grad (a cast made under no_grad has no
    graph to train through). amp clears the cache after each backward, since `param.data`
    updates bypass the version counter. Traced code (torch.compile) casts without the cache."""

    def __init__(self):
        self._entries = {}

    def cast(self, param, dtype):
        if torch.compiler.is_compiling():
            return param.to(dtype)
        entry = self._entries.get(param)
        if entry is not None:
            cast, version = entry
            if (version == param._version and cast.dtype is dtype
                    and (cast.requires_grad == param.requires_grad or not torch.is_grad_enabled())):
                return cast
        cast = param.to(dtype)
        self._entries[param] = (cast, param._version)
        return cast

    def remove(self, param):
        self._entries.pop(param, None)

    def clear(self):
        self._entries.clear()

    def __contains__(self, param):
        return param in self._entries

    def __len__(self):
        return len(self._entries)


def _is_castable(value):
    return isinstance(value, torch.Tensor) and value.dtype in CASTABLE


def caster(dtype, handle, name, try_caching=False):
    """x -> x cast to `dtype` when it is an fp16/bf16/fp32 tensor (or a list/tuple of only such
    tensors); fp32 params go through the handle's cache when `try_caching`."""

    def cast(value):
        if isinstance(value, torch.Tensor):
            if value.dtype is dtype or value.dtype not in CASTABLE:
                return value
            if handle.verbose:
                print(f"{_TYPE_NAMES[value.dtype]}->{_TYPE_NAMES[dtype]} ({name})")
            if try_caching and isinstance(value, Parameter) and value.dtype is torch.float32 and handle.has_cache:
                return handle.cache.cast(value, dtype)
            return value.to(dtype)
        if type(value) in (list, tuple) and value and all(_is_castable(item) for item in value):
            return type(value)(cast(item) for item in value)
        return value

    return cast


def _promoted_type(values):
    """The widest type among the fp16/bf16/fp32 tensors in `values` (one level of list/tuple
    nesting looked into) when they are of more than one type, else None."""
    found, mixed = None, False
    for value in values:
        for item in (value if type(value) in (list, tuple) else (value,)):
            if isinstance(item, torch.Tensor) and item.dtype in CASTABLE and item.dtype is not found:
                mixed = found is not None
                found = item.dtype if found is None else torch.promote_types(found, item.dtype)
    return found if mixed else None


def _cast_all(cast, args, kwargs):
    return [cast(arg) for arg in args], {key: cast(value) for key, value in kwargs.items()}


def cast_wrapper(fn, dtype, handle, name, try_caching=False):
    cast = caster(dtype, handle, name, try_caching)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not handle._is_active:
            return fn(*args, **kwargs)
        args, kwargs = _cast_all(cast, args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


def _casters(handle, name):
    return {dtype: caster(dtype, handle, name) for dtype in CASTABLE}


def promote_wrapper(fn, handle, name):
    casts = _casters(handle, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if handle._is_active:
            dtype = _promoted_type(itertools.chain(args, kwargs.values()) if kwargs else args)
            if dtype is not None:
                args, kwargs = _cast_all(casts[dtype], args, kwargs)
        return fn(*args, **kwargs)

    return wrapper


def sequence_promote_wrapper(fn, handle, name):
    casts = _casters(handle, name)

    @functools.wraps(fn)
    def wrapper(seq, *args, **kwargs):
        if handle._is_active:
            dtype = _promoted_type(seq)
            if dtype is not None:
                seq = [casts[dtype](tensor) for tensor in seq]
        return fn(seq, *args, **kwargs)

    return wrapper


def match_self_wrapper(fn, handle, name):
    casts = _casters(handle, name)

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if handle._is_active and isinstance(self, torch.Tensor) and self.dtype in CASTABLE:
            args, kwargs = _cast_all(casts[self.dtype], args, kwargs)
        return fn(self, *args, **kwargs)

    return wrapper


def fp32_inplace_wrapper(fn, handle, name):
    cast = caster(torch.float32, handle, name)

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if handle._is_active and isinstance(self, torch.Tensor):
            if self.dtype in LOW_PRECISION:
                raise NotImplementedError(f"Cannot call in-place method {name} with fp16 or bfloat16 args.")
            if self.dtype is torch.float32:
                args, kwargs = _cast_all(cast, args, kwargs)
        return fn(self, *args, **kwargs)

    return wrapper


def _holds_low_precision(values):
    for value in values:
        for item in (value if type(value) in (list, tuple) else (value,)):
            if isinstance(item, torch.Tensor) and item.dtype in LOW_PRECISION:
                return True
    return False


def refuse_low_precision_wrapper(fn, handle, name, message=None):
    message = message or f"Cannot call in-place function {name} with fp16 or bfloat16 args."

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if handle._is_active and _holds_low_precision(itertools.chain(args, kwargs.values())):
            raise NotImplementedError(message)
        return fn(*args, **kwargs)

    return wrapper
