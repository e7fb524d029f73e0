"""How apex's Python code reaches its compiled ops: ``ops(library)`` then ``torch.ops.apex.<function>``.

    from apex._ops import ops
    out = ops("fused_layer_norm_cuda").layer_norm_fwd(x, [1024], w, b, 1e-5)[0]

``ops`` makes sure the op library (the builder's NAME: "amp_C", "fused_layer_norm_cuda", ...) is
loaded, building it on first use, and returns the ``torch.ops.apex`` namespace. It is the only way
apex's modules load an op. It is traceable: under torch.compile the library is loaded at trace time
(without a guard on loader state), so ``fullgraph=True`` holds even for an op's very first call. An
op that cannot be built here raises ``OpNotCompatibleError`` (why) or ``OpBuildError`` (the build log).

Hot eager paths (a norm layer's forward) call ``eager_op(library, name)`` instead: the op's boxed
dispatcher call without torch.ops' Python layers, where ``through_torch_ops(*arguments)`` is false
(no tracer running, no ``__torch_function__`` override among the arguments).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

_loaded: set[str] = set()


def _load(library: str) -> bool:
    from apex.op_builder import load_op

    load_op(library)
    _loaded.add(library)
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
    """Whether a call must go through torch.ops by name rather than ``eager_op``: while torch.compile
    or torch.jit traces, or when one of ``tensors`` (None allowed) overrides ``__torch_function__``."""
    return torch.compiler.is_compiling() or torch._C._is_tracing() or torch._C._has_torch_function_variadic(*tensors)


@functools.cache
def eager_op(library: str, name: str) -> Callable[..., Any]:
    """``torch.ops.apex.<name>.default`` as a plain call into the dispatcher: positional arguments, outputs
    as torch.ops returns them (a Tensor, or a tuple). Made once per op (cached), so callers need not keep it.

    torch.ops' own entry (``OpOverload``) first looks for ``__torch_function__`` overrides among the
    arguments, then converts them to the schema's types; this skips the first step (measured: 0.5 us of
    a ~4 us LayerNorm call on a CPU). Everything below the Python layer is the same call: autograd,
    autocast, ``__torch_dispatch__`` subclasses and modes, the device kernels. So callers use it only
    where ``through_torch_ops`` is false for the arguments.
    """
    ops(library)
    handle = torch._C._dispatch_find_schema_or_throw(f"apex::{name}", "")
    return functools.partial(torch._C._dispatch_call_boxed, handle)
