"""amp.init(): the cast lists. Listed functions run in fp16/bf16 or in fp32, multi-input ones
promote to the widest input type, in-place forms keep self's type, banned ones refuse low
precision; gradients come back in each input's own dtype. Removing the casts restores torch."""
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_testing import CUDA
from apex import amp
from apex.amp._amp_state import _amp_state
from apex.amp.casting_handle import NoOpHandle
from apex.amp.lists import functional_overrides, tensor_overrides, torch_overrides

DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


@pytest.fixture(params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def low(request):
    """The patch type of casts installed for the test (the conftest removes them afterwards)."""
    amp.init(patch_type=request.param)
    return request.param


def check(fn, input_dtype, expected_dtype, device, shape, backward=True):
    x = torch.randn(shape, dtype=input_dtype, device=device, requires_grad=True)
    y = fn(x)
    assert y.dtype == expected_dtype, f"{fn} on {input_dtype} gave {y.dtype}"
    if backward:
        y.float().sum().backward()
        assert x.grad.dtype == input_dtype


@pytest.mark.parametrize("device", DEVICES)
def test_matrix_products_and_convolutions_run_in_low_precision(low, device):
    linear = nn.Linear(8, 8).to(device)
    conv = nn.Conv2d(3, 4, 3).to(device)
    other = torch.randn(8, 8, device=device)
    cases = [
        ((8, 8), [linear, functools.partial(F.linear, weight=linear.weight, bias=linear.bias),
                  lambda x: x @ other, lambda x: other @ x, lambda x: x.matmul(other), lambda x: other.matmul(x),
                  lambda x: torch.mm(x, other), lambda x: torch.addmm(other, x, other)]),
        ((2, 3, 6, 6), [conv, functools.partial(F.conv2d, weight=conv.weight, bias=conv.bias)]),
    ]
    for shape, fns in cases:
        for input_dtype in (torch.float32, low):
            for fn in fns:
                check(fn, input_dtype, low, device, shape)


@pytest.mark.parametrize("device", DEVICES)
def test_sensitive_functions_run_in_fp32(low, device):
    target = torch.randn(4, 8, device=device)
    fns = [nn.Softmax(dim=1), functools.partial(F.softmax, dim=1), functools.partial(F.log_softmax, dim=1),
           lambda x: F.mse_loss(x, target), lambda x: F.layer_norm(x, (8,)), lambda x: x.pow(2.), lambda x: x ** 2.,
           lambda x: x.sum(), torch.exp, lambda x: x.log1p().exp(), lambda x: torch.cumsum(x, 1)]
    for input_dtype in (torch.float32, low):
        for fn in fns:
            check(fn, input_dtype, torch.float32, device, (4, 8))
        check(nn.GroupNorm(2, 4).to(device), input_dtype, torch.float32, device, (2, 4, 3, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_unlisted_functions_keep_the_input_type(low, device):
    batchnorm = nn.BatchNorm2d(3).to(device)
    for input_dtype in (torch.float32, low):
        check(F.relu, input_dtype, input_dtype, device, (4, 8))
        check(nn.ReLU(), input_dtype, input_dtype, device, (4, 8))
        check(batchnorm.train(), input_dtype, input_dtype, device, (2, 3, 4, 4))
        check(batchnorm.eval(), input_dtype, input_dtype, device, (2, 3, 4, 4), backward=False)


@pytest.mark.parametrize("device", DEVICES)
def test_a_tensor_leaving_for_the_cpu_is_fp32(low, device):
    for input_dtype in (torch.float32, low):
        out = torch.randn(4, dtype=input_dtype, device=device).cpu()
        assert out.device.type == "cpu" and out.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_inputs_promote_to_the_widest_type(low, device):
    fns = [torch.mul, torch.Tensor.mul, torch.atan2, torch.Tensor.atan2, torch.add, lambda x, y: x + y,
           lambda x, y: x * y, lambda x, y: torch.cat([x, y]), lambda x, y: torch.stack([y, x])]
    for fn in fns:
        for x_type in (torch.float32, low):
            for y_type in (torch.float32, low):
                x = torch.randn(6, dtype=x_type, device=device, requires_grad=True)
                y = torch.randn(6, dtype=y_type, device=device)
                out = fn(x, y)
                assert out.dtype == (low if x_type == y_type == low else torch.float32)
                out.float().sum().backward()
                assert x.grad.dtype == x_type


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_forms_keep_self_type_and_refuse_low_precision_fp32_functions(low, device):
    for self_type in (torch.float32, low):
        for other_type in (torch.float32, low):
            leaf = torch.randn(6, dtype=self_type, device=device, requires_grad=True)
            x = leaf.clone()
            out = x.add_(torch.randn(6, dtype=other_type, device=device))
            assert out.dtype == self_type
            out.float().sum().backward()
            assert leaf.grad.dtype == self_type
    torch.randn(6, device=device).exp_()  # fp32: allowed
    with pytest.raises(NotImplementedError, match="Cannot call in-place method exp_ with fp16 or bfloat16"):
        torch.randn(6, dtype=low, device=device).exp_()
    with pytest.raises(NotImplementedError, match="Cannot call in-place function exp_ with fp16 or bfloat16"):
        torch.exp_(torch.randn(6, dtype=low, device=device))


def test_bf16_lists_leave_prelu_and_batched_products_alone():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    weight = torch.tensor([0.25])
    amp.init(patch_type=torch.float16)
    assert torch.bmm(a, b).dtype == torch.float16 and torch.prelu(a, weight).dtype == torch.float16
    amp.init(patch_type=torch.bfloat16)
    assert torch.bmm(a, b).dtype == torch.float32 and torch.prelu(a, weight).dtype == torch.float32
    assert torch.mm(a[0], b[0]).dtype == torch.bfloat16
    assert "prelu" not in torch_overrides.BFLOAT16_FUNCS and "bmm" in torch_overrides.FP16_FUNCS
    assert "mm" in tensor_overrides.BFLOAT16_FUNCS and "__matmul__" in tensor_overrides.FP16_FUNCS


def test_float64_and_integer_tensors_are_not_cast(low):
    x, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64)
    assert F.linear(x, w).dtype == torch.float64
    assert torch.mm(torch.ones(2, 2, dtype=torch.int64), torch.ones(2, 2, dtype=torch.int64)).dtype == torch.int64


@pytest.mark.parametrize("module", [lambda x, t: nn.BCELoss()(x, t), lambda x, t: F.binary_cross_entropy(x, t)],
                         ids=["BCELoss", "F.binary_cross_entropy"])
def test_binary_cross_entropy_is_banned_unless_allowed(low, module):
    target = torch.rand(4, 8)
    assert module(torch.rand(4, 8), target).dtype == torch.float32  # fp32 input: fine
    with pytest.raises(NotImplementedError, match="BCEWithLogitsLoss"):
        module(torch.rand(4, 8, dtype=low), target)
    amp.init(patch_type=low, allow_banned=True)
    assert module(torch.rand(4, 8, dtype=low), target).dtype == torch.float32


def namespaces():
    """What amp patches, by identity: module and class dictionaries, the RNN module's _VF."""
    return {id(owner): dict(vars(owner)) for owner in (torch, F, torch.Tensor, torch.nn.modules.rnn,
                                                       torch.nn.modules.rnn.RNNBase)}


def test_deactivate_restores_every_function_exactly():
    before = namespaces()
    handle = amp.init()
    assert F.linear is not before[id(F)]["linear"] and "mm" in vars(torch.Tensor)
    handle._deactivate()
    after = namespaces()
    for key, namespace in before.items():
        assert namespace.keys() == after[key].keys()
        assert all(after[key][name] is value for name, value in namespace.items())
    assert not handle.is_active()


def test_one_set_of_casts_at_a_time():
    original = F.linear
    first = amp.init()
    count = len(first._all_wrappers)
    second = amp.init()
    assert not first.is_active() and first._all_wrappers == []
    assert len(second._all_wrappers) == count
    assert F.linear.__wrapped__ is original  # wrapped once, not a wrapper of a wrapper
    assert _amp_state.handle is second


def test_disabled_init_and_bad_patch_type():
    original = F.linear
    handle = amp.init(enabled=False)
    assert isinstance(handle, NoOpHandle) and F.linear is original and _amp_state.handle is handle
    with pytest.raises(RuntimeError, match="Supported types are: torch.float16 and torch.bfloat16"):
        amp.init(patch_type=torch.float64)


def test_edited_lists_are_honoured(monkeypatch):
    monkeypatch.setattr(functional_overrides, "FP32_FUNCS",
                        [name for name in functional_overrides.FP32_FUNCS if name != "softmax"])
    amp.init()
    assert F.softmax(torch.randn(4, 8, dtype=torch.float16), dim=1).dtype == torch.float16


def test_disable_casts_pauses_and_restores():
    amp.init()
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with amp.disable_casts():
        assert F.linear(x, w).dtype == torch.float32
        with pytest.raises(ZeroDivisionError):
            with amp.disable_casts():
                raise ZeroDivisionError
        assert F.linear(x, w).dtype == torch.float32  # the inner block restored "paused", not "active"
    assert F.linear(x, w).dtype == torch.float16


def test_verbose_prints_each_cast(capsys):
    amp.init(verbose=True)
    F.linear(torch.randn(2, 4), torch.randn(4, 4))
    F.softmax(torch.randn(2, 4, dtype=torch.float16), dim=1)
    printed = capsys.readouterr().out
    assert "Float->Half (linear)" in printed and "Half->Float (softmax)" in printed


def test_lists_name_functions_this_torch_has():
    for lists in (torch_overrides, functional_overrides, tensor_overrides):
        for list_name in ("FP16_FUNCS", "BFLOAT16_FUNCS", "FP32_FUNCS"):
            missing = [name for name in getattr(lists, list_name) if not hasattr(lists.MODULE, name)]
            assert missing == [], f"{lists.__name__}.{list_name}: {missing}"


def test_torch_compile_traces_through_the_casts():
    """fullgraph compiles see the casts while they are installed and retrace when they go."""
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))

    def step(x):
        y = model(x)
        return F.softmax(y, -1), y, (x @ x.t()).sum()

    compiled = torch.compile(step, fullgraph=True)
    x = torch.randn(4, 8)
    assert [t.dtype for t in compiled(x)] == [torch.float32] * 3
    handle = amp.init()
    eager, traced = step(x), compiled(x)
    assert [t.dtype for t in traced] == [t.dtype for t in eager] == [torch.float32, torch.float16, torch.float32]
    for want, got in zip(eager, traced):
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    with amp.disable_casts():
        assert [t.dtype for t in compiled(x)] == [torch.float32] * 3
    handle._deactivate()
    assert [t.dtype for t in compiled(x)] == [torch.float32] * 3
