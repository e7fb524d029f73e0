"""The typed Python entry of the norms' eager ops (apex/op.h, reached through apex._ops.eager_op).

It must be the boxed call made cheaper, nothing else: the same outputs and autograd node, the same
errors with the same messages, and every argument it does not convert handed to the boxed call.
"""
import functools

import numpy as np
import pytest
import torch

from apex._ops import eager_op

LIBRARY = "fused_layer_norm_cuda"
OPS = ["layer_norm_fwd_output", "rms_norm_fwd_output"]


def _boxed(name):
    handle = torch._C._dispatch_find_schema_or_throw(f"apex::{name}", "")
    return functools.partial(torch._C._dispatch_call_boxed, handle)


def _arguments(name, x, shape, weight, bias, eps, *rest):
    """The op's positional arguments (RMSNorm has no bias)."""
    return (x, shape, weight, eps, *rest) if name.startswith("rms") else (x, shape, weight, bias, eps, *rest)


def test_output_ops_get_a_typed_entry():
    for name in OPS:
        assert type(eager_op(LIBRARY, name)).__name__ == "builtin_function_or_method"
    assert isinstance(eager_op(LIBRARY, "layer_norm_fwd"), functools.partial)  # no entry: the boxed call


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("shape", [(8,), [8], torch.Size([8]), (np.int64(8),), (torch.tensor(8),)],
                         ids=["tuple", "list", "Size", "numpy-int", "tensor-int"])
@pytest.mark.parametrize("eps", [1e-5, 1, np.float64(1e-5)], ids=["float", "int", "numpy-float"])
def test_typed_matches_boxed_forward_and_backward(name, shape, eps):
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 8), torch.randn(8), torch.randn(8)
    results = []
    for call in (eager_op(LIBRARY, name), _boxed(name)):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        y = call(*_arguments(name, *leaves[:1], shape, *leaves[1:], eps, True))
        assert y.grad_fn.name() == f"apex::{name.replace('_output', '')}_backward"
        y.backward(torch.ones_like(y))
        results.append((y.detach(), [t.grad for t in leaves]))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


@pytest.mark.parametrize("name", OPS)
def test_defaults_and_none_parameters(name):
    x = torch.randn(2, 4)
    typed, boxed = eager_op(LIBRARY, name), _boxed(name)
    arguments = _arguments(name, x, (4,), None, None, 1e-5)  # memory_efficient left to its default
    torch.testing.assert_close(typed(*arguments), boxed(*arguments), rtol=0, atol=0)
    with torch.no_grad():
        assert typed(*_arguments(name, x, (4,), None, None, 1e-5, False)).grad_fn is None


def _outcome(call, *args):
    """("returned", output) or ("raised", exception type, message)."""
    try:
        return ("returned", call(*args))
    except Exception as error:  # noqa: BLE001 - what is raised is the point
        return ("raised", type(error), str(error))


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("case", ["int-input", "shape", "weight-shape", "weight-dtype", "meta-weight",
                                  "flag-as-int", "too-many", "string-eps", "float-shape", "tensor-eps",
                                  "sparse-input"])
def test_unusual_calls_end_as_the_boxed_calls(name, case):
    """Bad arguments raise the boxed call's error; unusual ones it takes give its result."""
    x, w, b = torch.randn(2, 4), torch.randn(4), torch.randn(4)
    arguments = {
        "int-input": _arguments(name, x.long(), (4,), None, None, 1e-5, False),
        "shape": _arguments(name, x, (5,), w, b, 1e-5, False),
        "weight-shape": _arguments(name, x, (4,), torch.randn(5), b, 1e-5, False),
        "weight-dtype": _arguments(name, x, (4,), w.double(), b, 1e-5, False),
        "meta-weight": _arguments(name, x, (4,), w.to("meta"), None, 1e-5, False),
        "flag-as-int": _arguments(name, x, (4,), w, b, 1e-5, 1),
        "too-many": _arguments(name, x, (4,), w, b, 1e-5, False, 7),
        "string-eps": _arguments(name, x, (4,), w, b, "1e-5", False),
        "float-shape": _arguments(name, x, (4.0,), w, b, 1e-5, False),
        "tensor-eps": _arguments(name, x, (4,), w, b, torch.tensor(1e-5), False),
        # converted by the entry, refused by the dispatcher (no SparseCPU kernel): NotImplementedError
        "sparse-input": _arguments(name, x.to_sparse(), (4,), w, b, 1e-5, False),
    }[case]
    boxed = _outcome(_boxed(name), *arguments)
    for call in (eager_op(LIBRARY, name), getattr(torch.ops.apex, name)):
        outcome = _outcome(call, *arguments)
        if boxed[0] == "returned":
            assert outcome[0] == "returned", outcome
            torch.testing.assert_close(outcome[1], boxed[1], rtol=0, atol=0)
        else:
            assert outcome == boxed


@pytest.mark.parametrize("name", OPS)
def test_python_errors_raised_inside_the_call_come_out_unchanged(name):
    """A Python exception raised below the entry (here by a dispatch mode) crosses the C++ call and comes
    out as itself, as from the boxed call: torch's error handling around the entry's whole call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Refused(KeyError):
        pass

    class Refusing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            raise Refused(f"refused {func}")

    arguments = _arguments(name, torch.randn(2, 4), (4,), None, None, 1e-5, False)
    for call in (eager_op(LIBRARY, name), _boxed(name)):
        with Refusing(), pytest.raises(Refused, match="refused apex") as raised:
            call(*arguments)
        assert type(raised.value) is Refused


@pytest.mark.parametrize("name", OPS)
def test_warnings_issued_inside_the_call_are_python_warnings(name):
    """A C++ warning (TORCH_WARN) issued below the entry surfaces as a Python warning, as torch's own
    bindings do (HANDLE_TH_ERRORS' warning handler; the boxed _dispatch_call_boxed only prints it):
    here functorch's fallback for an op without a batching rule, which warns under vmap (on by default)."""
    import warnings

    x = torch.randn(3, 2, 4)
    typed = eager_op(LIBRARY, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.vmap(lambda row: typed(*_arguments(name, row, (4,), None, None, 1e-5, False)))(x)
    assert any(issubclass(w.category, UserWarning) and f"batching rule for apex::{name}" in str(w.message)
               for w in caught), [str(w.message) for w in caught]


def test_dispatch_mode_sees_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(2, 4), torch.randn(4)
    with Recording():
        eager_op(LIBRARY, "rms_norm_fwd_output")(x, (4,), w, 1e-5, False)
    assert "apex.rms_norm_fwd.default" in seen
