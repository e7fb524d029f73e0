"""How apex's Python code reaches its compiled ops: ``ops(library)`` then ``torch.ops.apex.<function>``.

    from apex._ops import ops
    out = ops("fused_layer_norm_cuda").layer_norm_fwd(x, [1024], w, b, 1e-5)[0]

``ops`` makes sure the op library (the builder's NAME: "amp_C", "fused_layer_norm_cuda", ...) is
loaded, building it on first use, and returns the ``torch.ops.apex`` namespace. It is the only way
apex's modules load an op. It is traceable: under torch.compile the library is loaded at trace time
(without a guard on loader state), so ``fullgraph=True`` holds even for an op's very first call. An
op that cannot be built here raises ``OpNotCompatibleError`` (why) or ``OpBuildError`` (the build log).

Hot eager paths (a norm layer's forward) call ``eager_op(library, name)`` instead: the op's typed
entry where it has one (``<op>_output`` ops; apex/op.h), else its boxed dispatcher call, without
torch.ops' Python layers, where ``through_torch_ops(*arguments)`` is false (no tracer running, no
``__torch_function__`` override among the arguments).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.compiler
from torch._C import _has_torch_function_variadic, _is_tracing
from torch.compiler import is_dynamo_compiling

_loaded: dict[str, str] = {}  # library -> the path of its loaded shared library


def _load(library: str) -> bool:
    from apex.op_builder import load_op

    _loaded[library] = str(load_op(library))
    return True


# Traced code calls the loader through this: dynamo runs it while tracing and keeps no guard on it.
_load_while_tracing = torch._dynamo.assume_constant_result(_load)


def ops(library: str) -> torch._ops._OpNamespace:
    """``torch.ops.apex``, with the op library ``library`` loaded (built on first use)."""
    if torch.compiler.is_compiling():
        _load_while_tracing(library)
    elif library not in _loaded:
        _load(library)
    return torch.ops.apex


def through_torch_ops(*tensors: Any) -> bool:
    """Whether a call must go through torch.ops by name rather than ``eager_op``: while torch.compile,
    torch.export or torch.jit traces, or when one of ``tensors`` (None allowed) overrides ``__torch_function__``.

    torch.compiler.is_compiling(), spelled out: its Python layers cost 0.1 us of a ~4 us norm call.
    is_dynamo_compiling() comes first because dynamo folds it to True and so never reads the flag (a
    guard on the flag's trace-time value, True, would fail on every compiled call). The norms' fast path
    (apex/normalization/fused_layer_norm.py, ``_eager_as_is``) spells this condition out to save a call:
    change both together."""
    return (is_dynamo_compiling() or torch.compiler._is_compiling_flag or _is_tracing()
            or _has_torch_function_variadic(*tensors))


@functools.cache
def eager_op(library: str, name: str) -> Callable[..., Any]:
    """``torch.ops.apex.<name>.default`` as a plain call into the dispatcher: positional arguments, outputs
    as torch.ops returns them (a Tensor, or a tuple). Made once per op (cached), so callers need not keep it.

    torch.ops' own entry (``OpOverload``) first looks for ``__torch_function__`` overrides among the
    arguments, then converts them to the schema's types as IValues and calls the op boxed. This skips
    the first step (0.5 us of a ~4 us CPU LayerNorm call) and, where the op has a typed entry (apex/op.h:
    ``<op>_output`` ops), the boxing too (~1 us more): the entry converts plain arguments straight to
    the op's C++ types and hands any other call to the boxed one. Everything below is the same
    dispatcher call: autograd, autocast, ``__torch_dispatch__`` subclasses and modes, the device kernels.
    So callers use it only where ``through_torch_ops`` is false for the arguments.
    """
    ops(library)
    handle = torch._C._dispatch_find_schema_or_throw(f"apex::{name}", "")
    boxed = functools.partial(torch._C._dispatch_call_boxed, handle)
    typed = _typed_entry(library, f"apex::{name}", boxed)
    return boxed if typed is None else typed


def _typed_entry(library: str, qualified_name: str, fallback: Callable[..., Any]) -> Any:
    """The op's typed entry (a builtin function calling ``fallback`` with what it does not convert), or
    None: the op has none, or its library predates them."""
    import ctypes

    try:
        # The library is loaded already: this only looks the symbol up in it (the GIL stays held).
        find = ctypes.PyDLL(_loaded[library]).apex_python_entry
    except (AttributeError, KeyError, OSError):
        return None
    find.restype, find.argtypes = ctypes.py_object, (ctypes.c_char_p, ctypes.py_object)
    return find(qualified_name.encode(), fallback)
