"""The norms' eager fast path (straight to the op when nothing needs handling) against the full path.

The fast path is decided by ``_eager_as_is`` and fed by ``_registered_parameters`` and ``_as_shape``'s
table; these tests check it gives the full path's results and that every unusual call (autocast, a
``__torch_function__`` subclass, a tracer or compiler, parameters of another dtype, a parametrized
weight) still takes the full path.
"""
import importlib

import numpy as np
import pytest
import torch
from torch.nn.utils import parametrize

from apex.contrib.layer_norm import FastLayerNorm
from apex.normalization import (FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm,
                                fused_layer_norm_affine)

# The module, not the function apex.normalization exports under the same name.
fln = importlib.import_module("apex.normalization.fused_layer_norm")
MODULES = [FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm, FastLayerNorm]


def _randomized(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    return module


def _run(module, x):
    y = module(x)
    y.backward(torch.ones_like(y))
    return y.detach(), x.grad, [p.grad for p in module.parameters()]


@pytest.mark.parametrize("cls", MODULES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("memory_efficient", [False, True])
def test_fast_path_matches_full_path(cls, memory_efficient, monkeypatch):
    torch.manual_seed(0)
    module = _randomized(cls(16, memory_efficient=memory_efficient))
    x = torch.randn(3, 5, 16)
    fast = _run(module, x.clone().requires_grad_())
    module.zero_grad(set_to_none=True)
    monkeypatch.setattr(fln, "_eager_as_is", lambda *args: False)  # every call down the full path
    full = _run(module, x.clone().requires_grad_())
    torch.testing.assert_close(fast, full, rtol=0, atol=0)


class _Tagged(torch.Tensor):
    """A __torch_function__ subclass that records the functions it sees."""

    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_eager_as_is_decides_plain_calls_only():
    x, w, b = torch.randn(2, 8), torch.randn(8), torch.randn(8)
    assert fln._eager_as_is(x, w, b, False)
    assert fln._eager_as_is(x, None, None, False)
    # Parameters of another dtype: cast first (same-dtype rule), or taken as they are (mixed rule).
    assert not fln._eager_as_is(x.bfloat16(), w, b, False)
    assert fln._eager_as_is(x.bfloat16(), w, b, True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fln._eager_as_is(x, w, b, False)
    assert not fln._eager_as_is(x.as_subclass(_Tagged), w, b, False)
    assert not fln._eager_as_is(x, None, b.as_subclass(_Tagged), True)


def test_eager_as_is_refuses_while_compiling_or_tracing(monkeypatch):
    x, w, b = torch.randn(2, 8), torch.randn(8), torch.randn(8)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)  # what torch.export's non-strict mode sets
    assert not fln._eager_as_is(x, w, b, False)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", False)
    seen = []

    def traced(t):
        seen.append(fln._eager_as_is(t, w, b, False))
        return t + 1

    torch.jit.trace(traced, (x,), check_trace=False)
    assert seen == [False]


def test_autocast_takes_the_full_path():
    module = FusedLayerNorm(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module(torch.randn(2, 8))
    assert y.dtype == torch.bfloat16


def test_torch_function_subclass_sees_the_op():
    module = FusedLayerNorm(8)
    _Tagged.seen.clear()
    y = module(torch.randn(2, 8).as_subclass(_Tagged))
    assert isinstance(y, _Tagged)
    assert any("layer_norm_fwd" in str(f) for f in _Tagged.seen)


def test_compiled_module_traces_the_full_path():
    module = _randomized(FusedLayerNorm(8))
    x = torch.randn(4, 8)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), module(x))
    torch.testing.assert_close(compiled(x), module(x))  # a second call reuses the graph (no flag guard fails)


def test_meta_tensors():
    module = FusedLayerNorm(8).to("meta")
    y = module(torch.empty(3, 8, device="meta"))
    assert y.device.type == "meta" and y.shape == (3, 8)


def test_parametrized_weight_is_read_through_the_attribute():
    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    module = FusedLayerNorm(8)
    parametrize.register_parametrization(module, "weight", Doubled())
    x = torch.randn(3, 8)
    expected = torch.nn.functional.layer_norm(x, (8,), 2 * module.parametrizations.weight.original, module.bias,
                                              module.eps)
    torch.testing.assert_close(module(x), expected)


def test_replaced_parameter_is_read_through_the_attribute():
    module = FusedLayerNorm(8)
    del module.weight
    module.weight = torch.full((8,), 3.0)  # a plain attribute now
    x = torch.randn(3, 8)
    expected = torch.nn.functional.layer_norm(x, (8,), module.weight, module.bias, module.eps)
    torch.testing.assert_close(module(x), expected)


@pytest.mark.parametrize("shape", [8, (8,), [8], torch.Size([8]), (np.int64(8),), (torch.tensor(8),), np.int64(8)],
                         ids=repr)
def test_normalized_shape_forms(shape):
    x, w, b = torch.randn(2, 8), torch.randn(8), torch.randn(8)
    for _ in range(2):  # the second call may come from the table
        assert fln._as_shape(shape) == (8,)
        torch.testing.assert_close(fused_layer_norm_affine(x, w, b, shape, 1e-5),
                                   torch.nn.functional.layer_norm(x, (8,), w, b, 1e-5))


def test_shape_table_keeps_exact_ints_only():
    fln._as_shape((torch.tensor(5), 7))
    fln._as_shape((np.int64(6),))
    assert all(type(d) is int for key in fln._CANONICAL_SHAPES
               for d in (key if isinstance(key, tuple) else (key,)))
