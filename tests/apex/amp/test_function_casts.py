"""O1/O4 run each model's forward under torch.autocast; the register_*/decorator API and
disable_casts() adjust the casts around chosen functions."""
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from apex import amp


class Probe(nn.Module):
    """A linear layer followed by a call to `fn`, recording the dtypes `fn` received and returned."""

    def __init__(self, fn):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.fn = fn
        self.seen = []

    def forward(self, x):
        h = self.linear(x)
        out = self.fn(h, x)
        self.seen = [h.dtype, out.dtype]
        return out


def namespace_with(fn):
    """A stand-in module holding `fn`, so registering never rewires torch itself in the tests."""
    return types.SimpleNamespace(fn=fn)


def run_probe(namespace, opt_level):
    model = Probe(lambda a, b: namespace.fn(a, b))
    model = amp.initialize(model, opt_level=opt_level, verbosity=0)
    out = model(torch.randn(4, 8))
    return model.seen, out


def record_dtypes(a, b):
    record_dtypes.args = (a.dtype, b.dtype)
    record_dtypes.inner = (a @ b.t()).dtype
    return a + b


@pytest.mark.parametrize("opt_level,autocast_type", [("O1", torch.float16), ("O4", torch.bfloat16)])
def test_forward_runs_under_autocast_and_returns_fp32(opt_level, autocast_type):
    model = amp.initialize(nn.Sequential(nn.Linear(8, 8)), opt_level=opt_level, verbosity=0)
    assert model[0].weight.dtype == torch.float32
    seen = []
    model[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    assert model(torch.randn(4, 8)).dtype == torch.float32  # the loss outside sees fp32
    assert seen == [autocast_type]
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("register,cast_type,inner_type", [
    (amp.register_float_function, torch.float32, torch.float32),
    (amp.register_half_function, torch.float16, torch.float16),
    (amp.register_bfloat16_function, torch.bfloat16, torch.float16),
])
def test_registered_functions_get_their_casts(register, cast_type, inner_type):
    namespace = namespace_with(record_dtypes)
    register(namespace, "fn")
    run_probe(namespace, "O1")
    assert record_dtypes.args == (cast_type, cast_type)
    # A float function keeps autocast off inside; the others leave O1's policy in force.
    assert record_dtypes.inner == inner_type


def test_registered_promote_function_casts_to_widest_type():
    namespace = namespace_with(record_dtypes)
    amp.register_promote_function(namespace, "fn")
    run_probe(namespace, "O1")  # (fp16 linear output, fp32 input)
    assert record_dtypes.args == (torch.float32, torch.float32)


@pytest.mark.parametrize("decorator,cast_type", [
    (amp.float_function, torch.float32), (amp.half_function, torch.float16),
    (amp.bfloat16_function, torch.bfloat16), (amp.promote_function, torch.float32),
])
def test_decorators_cast_inside_autocast_only(decorator, cast_type):
    fn = decorator(record_dtypes)
    run_probe(namespace_with(fn), "O1")
    assert record_dtypes.args == (cast_type, cast_type)
    fn(torch.randn(2, 2, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64))  # no autocast: no casts
    assert record_dtypes.args == (torch.float64, torch.float64)


def test_registration_is_inert_without_function_casting_levels():
    namespace = namespace_with(record_dtypes)
    amp.register_half_function(namespace, "fn")
    run_probe(namespace, "O0")
    assert record_dtypes.args == (torch.float32, torch.float32)


def test_disable_casts_inside_forward():
    model = Probe(lambda a, b: a)

    def forward(x):
        with amp.disable_casts():
            return F.linear(x, model.linear.weight)

    model.fn = lambda h, x: forward(x)
    model = amp.initialize(model, opt_level="O1", verbosity=0)
    model(torch.randn(4, 8))
    assert model.seen == [torch.float16, torch.float32]


def test_register_unknown_function_raises():
    with pytest.raises(ValueError, match="No function named no_such_function in module"):
        amp.register_half_function(torch, "no_such_function")
