"""apex.parallel.SyncBatchNorm in one process, through every layout its autograd function
handles itself (NCHW, channels_last-strided NCHW, NHWC): outputs, gradients and running
statistics equal torch.nn.BatchNorm2d's, step after step, and the output behaves as
any autograd output (in-place ops after it, one graph node)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from apex.parallel import SyncBatchNorm

C = 4
LAYOUTS = ("nchw", "channels_last", "nhwc")
TOL = dict(rtol=1e-5, atol=1e-5)


def to_layout(t, layout):
    if layout == "channels_last":
        return t.contiguous(memory_format=torch.channels_last)
    if layout == "nhwc":
        return t.permute(0, 2, 3, 1).contiguous()
    return t


def from_layout(t, layout):
    return t.permute(0, 3, 1, 2) if layout == "nhwc" else t


def make_pair(layout, **options):
    torch.manual_seed(0)
    bn = SyncBatchNorm(C, channel_last=layout == "nhwc", **options)
    ref = torch.nn.BatchNorm2d(C, momentum=bn.momentum, affine=bn.affine)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    ref.load_state_dict({k: v for k, v in bn.state_dict().items()})
    return bn, ref


def step_both(bn, ref, layout, batch, seed, inplace_relu=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, C, 3, 5, generator=g) * 2 + 1
    dy = torch.randn(x.shape, generator=g)
    xa = to_layout(x, layout).requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    ya, yr = bn(xa), ref(xr)
    if inplace_relu:
        ya, yr = ya.relu_(), yr.relu_()
    ya.backward(to_layout(dy, layout))
    yr.backward(dy)
    torch.testing.assert_close(from_layout(ya.detach(), layout), yr.detach(), **TOL)
    torch.testing.assert_close(from_layout(xa.grad, layout), xr.grad, **TOL)
    torch.testing.assert_close(bn.weight.grad, ref.weight.grad, **TOL)
    torch.testing.assert_close(bn.bias.grad, ref.bias.grad, **TOL)
    bn.zero_grad()
    ref.zero_grad()
    return ya


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_training_steps_of_varying_batch_then_eval_match_batchnorm(layout, momentum):
    bn, ref = make_pair(layout, momentum=momentum)
    for seed, batch in enumerate((4, 3, 4, 2)):  # counts change and recur
        step_both(bn, ref, layout, batch, seed)
        torch.testing.assert_close(bn.running_mean, ref.running_mean, **TOL)
        torch.testing.assert_close(bn.running_var, ref.running_var, **TOL)
    assert bn.num_batches_tracked.item() == 4
    bn.eval()
    ref.eval()
    step_both(bn, ref, layout, 3, seed=9)  # running statistics as constants, in backward too


@pytest.mark.parametrize("layout", LAYOUTS)
def test_in_place_op_on_the_output(layout):
    bn, ref = make_pair(layout)
    y = step_both(bn, ref, layout, 4, seed=1, inplace_relu=True)
    if layout == "channels_last":
        assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_output_hangs_from_one_autograd_node(layout):
    bn, _ = make_pair(layout)
    x = to_layout(torch.randn(2, C, 3, 3), layout).requires_grad_(True)
    y = bn(x)
    assert y.grad_fn.name() == "apex::syncbn_batch_norm_backward"  # one step of one process: one C++ op
    leaves = [fn.variable for fn, _ in y.grad_fn.next_functions if fn is not None]
    assert leaves[0] is x and leaves[1] is bn.weight and leaves[2] is bn.bias


@pytest.mark.parametrize("z_layout", ["channels_last", "nchw"])
def test_channels_last_strided_residual_and_fused_relu(z_layout):
    bn = SyncBatchNorm(C, fuse_relu=True)
    ref = torch.nn.BatchNorm2d(C)
    g = torch.Generator().manual_seed(3)
    x, z, dy = (torch.randn(3, C, 4, 4, generator=g) for _ in range(3))
    xa = x.contiguous(memory_format=torch.channels_last).requires_grad_(True)
    za = to_layout(z, z_layout).requires_grad_(True)
    xr, zr = x.detach().clone().requires_grad_(True), z.detach().clone().requires_grad_(True)
    ya, yr = bn(xa, za), torch.relu(ref(xr) + zr)
    ya.backward(dy.contiguous(memory_format=torch.channels_last))
    yr.backward(dy)
    assert ya.is_contiguous(memory_format=torch.channels_last)
    for got, want in ((ya.detach(), yr.detach()), (xa.grad, xr.grad), (za.grad, zr.grad)):
        torch.testing.assert_close(got, want, **TOL)


def test_training_step_after_one_under_inference_mode():
    """Counts made under inference_mode are later saved for backward: they must not be inference tensors."""
    bn, ref = make_pair("nchw")
    with torch.inference_mode():
        bn(torch.randn(5, C, 2, 2))
        ref(torch.randn(5, C, 2, 2))
    x = torch.randn(5, C, 2, 2, requires_grad=True)
    bn(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-5, rtol=0)  # sum of a normalized batch


def test_eval_backward_with_running_statistics_matches_functional_batch_norm():
    bn = SyncBatchNorm(C).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, C, 3, 3).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    xr = x.detach().clone().requires_grad_(True)
    bn(x).backward(torch.ones_like(x))
    F.batch_norm(xr, bn.running_mean, bn.running_var, bn.weight, bn.bias, False).backward(torch.ones_like(xr))
    torch.testing.assert_close(x.grad, xr.grad, **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_eval_inverse_std_is_rsqrt_of_running_var_plus_eps(dtype):
    """The eval op computes 1 / sqrt(running_var + eps) in a kernel, in the statistics dtype; on CPU
    bitwise what the ATen formula gives."""
    from apex._ops import ops

    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, C, 3, generator=g).to(dtype)
    running_mean, running_var = torch.randn(C, generator=g), torch.rand(C, generator=g) * 3
    statistics = torch.float64 if dtype == torch.float64 else torch.float32
    _, inv_std = ops("syncbn").syncbn_batch_norm_eval(x, None, None, None, running_mean.to(dtype),
                                                      running_var.to(dtype), 1e-3, False, False, False)
    assert inv_std.dtype == statistics
    assert torch.equal(inv_std, (running_var.to(dtype).to(statistics) + 1e-3).rsqrt())


@pytest.mark.gpu
def test_forward_captured_in_a_cuda_graph_then_run_eagerly():
    """Tensors made during capture are only filled at replay: an eager call after capture must not see them."""
    bn = SyncBatchNorm(C).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, with another batch size
        bn(torch.randn(5, C, 3, 3, device="cuda"))
    torch.cuda.current_stream().wait_stream(side)
    x = torch.randn(7, C, 3, 3, device="cuda") * 2 + 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bn(x)
    y = bn(x)  # eager, same count, graph never replayed
    torch.testing.assert_close(y, F.batch_norm(x, None, None, bn.weight, bn.bias, True), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["train", "train, running statistics", "eval"])
def test_single_process_ops_pass_opcheck(layout, mode):
    """syncbn_batch_norm / syncbn_batch_norm_eval (one process's step, C++ formulas): schema (running
    statistics mutated in training), Meta kernel, autograd and tracing agree."""
    from apex._ops import ops

    g = torch.Generator().manual_seed(4)
    x = to_layout(torch.randn(3, C, 5, 2, generator=g), layout).requires_grad_(True)
    weight, bias = torch.rand(C, generator=g).requires_grad_(True), torch.randn(C, generator=g).requires_grad_(True)
    running_mean, running_var = torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5
    innermost, permuted = layout != "nchw", layout == "channels_last"
    z = torch.randn(x.shape, generator=g).requires_grad_(True) if layout == "nhwc" else None
    layout_args = (innermost, permuted, layout == "nhwc")
    if mode == "eval":
        op, args = ops("syncbn").syncbn_batch_norm_eval.default, (running_mean, running_var, 1e-5)
    elif mode == "train":
        op, args = ops("syncbn").syncbn_batch_norm.default, (None, None, 0.1, 1e-5)
    else:
        op, args = ops("syncbn").syncbn_batch_norm.default, (running_mean, running_var, 0.1, 1e-5)
    torch.library.opcheck(op, (x, z, weight, bias, *args, *layout_args))


PERMUTED_INPUTS = {  # (N, C, *) inputs of the permuted (channels-innermost) ops that are not stored channels_last
    "4-D contiguous": lambda t: t,  # copied into channels_last order
    "3-D contiguous": lambda t: t.flatten(2),
    "3-D channels innermost": lambda t: t.flatten(2).transpose(1, 2).contiguous().transpose(1, 2),  # no format names it
}


@pytest.mark.parametrize("stored", PERMUTED_INPUTS)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_permuted_ops_read_any_storage_and_return_channels_innermost(stored, mode):
    """The permuted step ops read a channels_last input's memory as it is; any other storage is copied
    into that order first, and every output (and grad_input) comes back stored channels-innermost."""
    from apex._ops import ops

    g = torch.Generator().manual_seed(5)
    x = PERMUTED_INPUTS[stored](torch.randn(3, C, 5, 2, generator=g)).requires_grad_(True)
    weight, bias = torch.rand(C, generator=g).requires_grad_(True), torch.randn(C, generator=g).requires_grad_(True)
    running_mean, running_var = torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5
    dy = torch.randn(x.shape, generator=g)
    if mode == "eval":
        op, args = ops("syncbn").syncbn_batch_norm_eval.default, (running_mean.clone(), running_var.clone(), 1e-5)
    else:
        op, args = ops("syncbn").syncbn_batch_norm.default, (running_mean.clone(), running_var.clone(), 0.1, 1e-5)
    y = op(x, None, weight, bias, *args, True, True, False)[0]
    xr = x.detach().clone().requires_grad_(True)
    ref = F.batch_norm(xr, running_mean, running_var, weight, bias, mode == "train", 0.1, 1e-5)
    assert y.movedim(1, -1).is_contiguous()
    torch.testing.assert_close(y, ref, **TOL)
    x_grad, = torch.autograd.grad(y, x, dy)
    ref_grad, = torch.autograd.grad(ref, xr, dy)
    assert x_grad.movedim(1, -1).is_contiguous()
    torch.testing.assert_close(x_grad, ref_grad, **TOL)
    torch.library.opcheck(op, (x, None, weight, bias, *args, True, True, False))


def test_single_process_step_compiles_fullgraph():
    bn, ref = make_pair("nchw")
    x = torch.randn(4, C, 3, 5)
    y = torch.compile(bn, fullgraph=True, dynamic=True)(x.requires_grad_(True))
    torch.testing.assert_close(y, ref(x), **TOL)
    torch.testing.assert_close(bn.running_var, ref.running_var, **TOL)


def test_running_statistics_of_another_dtype_follow_the_batch():
    """float16 running statistics of float32 data (a module converted with .half()): updated from the
    float32 batch statistics outside the kernel, with torch's rule."""
    bn = SyncBatchNorm(C, momentum=0.25).half()
    x = torch.randn(6, C, 3, 3) * 3 + 1
    bn(x)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    torch.testing.assert_close(bn.running_mean, (0.25 * mean).half(), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(bn.running_var, (0.75 + 0.25 * var).half(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_parametrized_weight_is_read_through_the_attribute(training):
    """forward reads its tensors from the parameter and buffer tables (no nn.Module.__getattr__); a
    parametrized weight has left the table, and is read (computed) through the attribute instead."""
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    apex_bn, torch_bn = SyncBatchNorm(C), torch.nn.BatchNorm2d(C)
    for bn in (apex_bn, torch_bn):
        parametrize.register_parametrization(bn, "weight", Doubled())
        bn.train(training)
    x = torch.randn(2, C, 3, 3)
    torch.testing.assert_close(apex_bn(x), torch_bn(x), **TOL)
    torch.testing.assert_close(apex_bn.running_mean, torch_bn.running_mean, **TOL)
    assert int(apex_bn.num_batches_tracked) == int(torch_bn.num_batches_tracked)
