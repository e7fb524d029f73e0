"""apex.contrib.group_norm against F.group_norm (+ SiLU) in float64 on CPU and (marker gpu) CUDA:
outputs and gradients over layouts (channels_last, channels_last_3d, NCHW, 3-D, 2-D), dtypes
(mixed with float32 parameters), odd channel and group counts, SiLU, no affine, empty and strided
input, NVIDIA apex's module face, tracing, and bad input."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import group_norm_cuda
from apex.contrib.group_norm import GroupNorm, group_norm

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# One rounding of the output to its dtype; gradients go through group sums in float32.
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2),
       torch.float64: (1e-10, 1e-10)}
GRAD_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 3e-2),
            torch.float64: (1e-9, 1e-9)}


def reference(x, groups, weight, bias, eps, silu):
    y = F.group_norm(x.double(), groups, None if weight is None else weight.double(), None, eps)
    # The bias added here, not by F.group_norm: torch before 2.14 fails the backward of group_norm with
    # a bias but no weight ("tensor does not have a device", in its own derivative).
    if bias is not None:
        y = y + bias.double().view(-1, *([1] * (x.dim() - 2)))
    return F.silu(y) if silu else y


def check(x, groups, weight=None, bias=None, eps=1e-5, act=None, check_grads=True):
    dtype = x.dtype
    silu = act is not None
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    y = group_norm(leaves[0], groups, leaves[1], leaves[2], eps, act)
    assert y.dtype == dtype and y.shape == x.shape and y.stride() == x.contiguous(
        memory_format=_format(x)).stride()
    ref_leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    y_ref = reference(ref_leaves[0], groups, ref_leaves[1], ref_leaves[2], eps, silu)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(y.double(), y_ref, rtol=rtol, atol=atol)
    if not check_grads:
        return
    dy = torch.randn_like(y)
    y.backward(dy)
    y_ref.backward(dy.double())
    for mine, theirs in zip(leaves, ref_leaves):
        if mine is None:
            continue
        assert mine.grad.dtype == mine.dtype
        # A gradient is no closer than its own dtype allows (float32 parameters of float64 data).
        rtol, atol = (max(a, b) for a, b in zip(GRAD_TOL[dtype], GRAD_TOL[mine.dtype]))
        scale = max(1.0, theirs.grad.abs().max().item())
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=rtol, atol=atol * scale)


def _format(x):
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous():
        return torch.channels_last_3d
    return torch.contiguous_format


def make(shape, dtype, device, memory_format=torch.contiguous_format, param_dtype=None):
    x = (-2.3 + 0.5 * torch.randn(shape, dtype=torch.float64)).to(dtype).to(device)
    x = x.contiguous(memory_format=memory_format)
    c = shape[1]
    param_dtype = param_dtype or dtype
    weight = (1 + 0.5 * torch.randn(c, dtype=torch.float64)).to(param_dtype).to(device)
    bias = (0.5 * torch.randn(c, dtype=torch.float64)).to(param_dtype).to(device)
    return x, weight, bias


LAYOUTS = {"nhwc": ((2, 24, 5, 7), torch.channels_last), "nchw": ((2, 24, 5, 7), torch.contiguous_format),
           "ndhwc": ((2, 12, 3, 4, 5), torch.channels_last_3d), "ncl": ((3, 16, 9), torch.contiguous_format),
           "nc": ((5, 12), torch.contiguous_format)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("act", [None, "silu"])
def test_matches_torch(device, dtype, layout, act):
    shape, memory_format = LAYOUTS[layout]
    x, weight, bias = make(shape, dtype, device, memory_format)
    check(x, 4, weight, bias, act=act)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.contiguous_format])
@pytest.mark.parametrize("channels,groups", [(1, 1), (7, 7), (6, 3), (40, 4), (128, 32), (1000, 10), (30, 1),
                                             (33, 11)])
def test_any_channel_and_group_count(device, memory_format, channels, groups):
    x, weight, bias = make((2, channels, 3, 5), torch.float32, device, memory_format)
    check(x, groups, weight, bias, act="swish")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float32_parameters_with_16_bit_data(device, dtype):
    x, weight, bias = make((3, 64, 6, 6), dtype, device, torch.channels_last, param_dtype=torch.float32)
    check(x, 16, weight, bias, act="silu")


@pytest.mark.parametrize("device", DEVICES)
def test_without_affine_and_with_one_parameter(device):
    x, weight, bias = make((2, 32, 4, 4), torch.float32, device, torch.channels_last)
    check(x, 8)
    check(x, 8, weight=weight)
    check(x, 8, bias=bias)
    module = GroupNorm(8, 32, affine=False, device=device)
    torch.testing.assert_close(module(x), F.group_norm(x, 8))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_strided_input(device):
    x, weight, bias = make((0, 8, 3, 3), torch.float32, device)
    assert group_norm(x, 2, weight, bias).shape == (0, 8, 3, 3)
    x, weight, bias = make((2, 8, 0, 3), torch.float32, device)
    y = group_norm(x.requires_grad_(), 2, weight.requires_grad_(), bias)
    y.sum().backward()
    assert y.shape == x.shape and (weight.grad == 0).all()
    wide, weight, bias = make((2, 8, 6, 9), torch.float32, device)
    check(wide[:, :, 1:5, ::2], 4, weight, bias, act="silu")
    check(wide.permute(0, 1, 3, 2), 4, weight, bias)


@pytest.mark.parametrize("device", DEVICES)
def test_module_and_historical_face(device):
    x, weight, bias = make((2, 32, 4, 4), torch.float16, device, torch.channels_last, param_dtype=torch.float32)
    module = GroupNorm(8, 32, eps=1e-4, device=device, dtype=torch.float32, act="Swish")
    with torch.no_grad():
        module.weight.copy_(weight)
        module.bias.copy_(bias)
    assert "act=swish" in repr(module)
    y = module(x)
    torch.testing.assert_close(y.double(), reference(x, 8, weight, bias, 1e-4, True), rtol=2e-3, atol=2e-3)
    y2, sums = group_norm_cuda.forward(x, 8, weight, bias, 1e-4, 1, True)
    torch.testing.assert_close(y2, y)
    assert sums.shape == (2 * 2 * 8,) and sums.dtype == torch.float32
    dy = torch.randn_like(y)
    dx, dw, db = group_norm_cuda.backward(dy, sums, x, 8, weight, bias, 1e-4, 2, True)
    xr = x.detach().requires_grad_()
    wr, br = weight.detach().requires_grad_(), bias.detach().requires_grad_()
    module.weight.grad = None
    module(xr).backward(dy)
    torch.testing.assert_close(dx, xr.grad)
    torch.testing.assert_close(dw, module.weight.grad)
    del wr, br


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    x, weight, bias = make((2, 12, 3, 3), torch.float32, device)
    cases = [
        ((x.long(), 4, weight, bias), RuntimeError, "x must be float32"),
        ((x, 5, weight, bias), RuntimeError, r"must be a multiple of num_groups \(5\)"),
        ((x[0, 0, 0], 4, weight, bias), RuntimeError, "at least 2-D"),
        ((x, 4, weight[:6], bias), RuntimeError, r"weight must have shape \[12\]"),
        ((x, 4, weight, bias.long()), RuntimeError, "bias must be float32"),
        ((x, 4, weight.cpu() if device == "cuda" else weight.to("meta"), bias), RuntimeError, "weight is on"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            group_norm(*args)
    with pytest.raises(ValueError, match="act must be"):
        group_norm(x, 4, weight, bias, act="relu")
    with pytest.raises(ValueError, match="divisible"):
        GroupNorm(5, 12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()

    def fn(x, w, b):
        return group_norm(x * 2, 4, w, b, 1e-5, "silu").sum()

    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    for n in (2, 3):
        x, weight, bias = make((n, 16, 4, 4), torch.float32, device, torch.channels_last)
        inputs = [t.clone().requires_grad_() for t in (x, weight, bias)]
        expected = [t.clone().requires_grad_() for t in (x, weight, bias)]
        compiled(*inputs).backward()
        fn(*expected).backward()
        for mine, theirs in zip(inputs, expected):
            torch.testing.assert_close(mine.grad, theirs.grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.contiguous_format])
def test_opcheck(device, memory_format):
    x, weight, bias = make((2, 8, 3, 3), torch.float32, device, memory_format)
    opcheck(torch.ops.apex.group_norm_forward, (x.requires_grad_(), 4, weight, bias, 1e-5, True))
    y, mean, rstd = torch.ops.apex.group_norm_forward(x.detach(), 4, weight, bias, 1e-5, True)
    opcheck(torch.ops.apex.group_norm_backward, (torch.randn_like(y), x.detach(), mean, rstd, 4, weight, bias, True))


# CUDA: large and long samples, rows wider than a block (C > 4096 16-bit), unvectorizable C, and the
# ways a group meets the kernels' chunks of channels (at most 32 packs: 256 16-bit channels).
@pytest.mark.gpu
@pytest.mark.parametrize("shape,groups,memory_format", [
    ((64, 320, 32, 32), 32, torch.channels_last),
    ((2, 64, 256, 256), 32, torch.channels_last),
    ((3, 8200, 2, 3), 8, torch.channels_last),
    ((5, 1001, 7, 9), 7, torch.channels_last),
    ((16, 320, 32, 32), 32, torch.contiguous_format),
    ((2, 128, 129, 65), 16, torch.contiguous_format),
    # channels in several chunks of a block's width (2560 16-bit channels: 320 packs > 256 threads)
    ((2, 2560, 9, 7), 32, torch.channels_last),
    # more samples than the grid wants blocks (one split per sample), and few channels with a long
    # spatial axis (many splits per channel)
    ((300, 64, 4, 4), 8, torch.channels_last),
    ((1, 4, 512, 1024), 2, torch.contiguous_format),
    ((1, 6, 300, 700), 3, torch.channels_last),
    # groups straddling chunk boundaries (40 and 20 channels a group over chunks of 256 and 216), with
    # a short spatial axis (the backward caps its splits to keep its per-channel sums small)
    ((16, 1280, 16, 16), 32, torch.channels_last),
    ((8, 640, 8, 8), 32, torch.channels_last),
    # one group across every chunk; one channel a group (a chunk touches 256 groups)
    ((4, 640, 8, 8), 1, torch.channels_last),
    ((2, 512, 9, 5), 512, torch.channels_last),
    ((2, 512, 9, 5), 512, torch.contiguous_format),
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_large_shapes_on_gpu(shape, groups, memory_format, dtype):
    x, weight, bias = make(shape, dtype, "cuda", memory_format, param_dtype=torch.float32)
    check(x, groups, weight, bias, act="silu")


# Every sum is taken in a fixed order (per-block partials, folded by split): two runs agree bitwise.
@pytest.mark.gpu
@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.contiguous_format])
def test_deterministic_on_gpu(memory_format):
    x, weight, bias = make((8, 320, 24, 24), torch.bfloat16, "cuda", memory_format, param_dtype=torch.float32)
    dy = torch.randn_like(x)
    results = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
        y = group_norm(leaves[0], 32, leaves[1], leaves[2], 1e-5, "silu")
        y.backward(dy)
        results.append([y.detach()] + [t.grad for t in leaves])
    for first, second in zip(*results):
        assert torch.equal(first, second)


# The CUDA launch plans over shapes unlike the benchmark's: many samples of many tiles, one sample (every
# block in one sample's folds), samples smaller than a tile, odd channel counts (one-element packs), a
# channel a group, groups straddling chunks, float64; with and without weight / bias.
@pytest.mark.gpu
@pytest.mark.parametrize("shape,groups,memory_format,dtype", [
    ((24, 320, 48, 48), 32, torch.channels_last, torch.bfloat16),
    ((12, 640, 32, 32), 32, torch.channels_last, torch.float16),
    ((24, 320, 40, 40), 32, torch.contiguous_format, torch.bfloat16),
    ((1, 320, 96, 96), 32, torch.channels_last, torch.bfloat16),
    ((1, 96, 200, 200), 8, torch.contiguous_format, torch.float32),
    ((1000, 32, 3, 3), 4, torch.channels_last, torch.bfloat16),
    ((64, 33, 17, 19), 11, torch.channels_last, torch.float32),
    ((16, 96, 20, 20), 96, torch.channels_last, torch.float16),
    ((4, 2560, 12, 12), 20, torch.channels_last, torch.bfloat16),
    ((6, 120, 45, 45), 6, torch.contiguous_format, torch.float64),
])
def test_launch_plans_on_gpu(shape, groups, memory_format, dtype):
    x, weight, bias = make(shape, dtype, "cuda", memory_format, param_dtype=torch.float32)
    check(x, groups, weight, bias, act="silu")
    check(x, groups, weight, None)
    check(x, groups)


# The walk's lengths: packs a thread takes (0 to 17 in one split; NHWC 64 16-bit channels: blocks of 8
# packs x 32 rows; NCHW: 32 lanes of 8-element packs) around the vector path's pipelined batches (two
# of 1 pack in the backward sums, of 2 in the backward apply, of 4 in the forward passes): fewer than
# a batch, one, between one and two, two, one past; 15 to 17: several rounds of the pipeline.
@pytest.mark.gpu
@pytest.mark.parametrize("spatial,memory_format", [
    (2, torch.channels_last), (20, torch.channels_last), (100, torch.channels_last),
    (128, torch.channels_last), (160, torch.channels_last), (200, torch.channels_last),
    (256, torch.channels_last), (288, torch.channels_last), (480, torch.channels_last),
    (512, torch.channels_last), (544, torch.channels_last),
    (8, torch.contiguous_format), (320, torch.contiguous_format), (800, torch.contiguous_format),
    (1040, torch.contiguous_format), (2048, torch.contiguous_format), (2080, torch.contiguous_format),
    (3840, torch.contiguous_format), (4096, torch.contiguous_format), (4352, torch.contiguous_format),
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_thread_walk_lengths_on_gpu(spatial, memory_format, dtype):
    x, weight, bias = make((2, 64, spatial, 1), dtype, "cuda", memory_format, param_dtype=torch.float32)
    check(x, 8, weight, bias, act="silu")


# More than 2^31 elements: element offsets are 64-bit (forward; statistics against torch's, and the
# output of the last group).
@pytest.mark.gpu
def test_int64_offsets_on_gpu():
    numel = 2**31 + 2**20
    if torch.cuda.mem_get_info()[0] < 8 * numel:
        pytest.skip("needs ~17 GB of free GPU memory")
    groups, channels = 4, 8
    x = torch.randn(1, channels, numel // channels, dtype=torch.bfloat16, device="cuda")
    y, mean, rstd = torch.ops.apex.group_norm_forward(x, groups, None, None, 1e-5, False)
    for g in range(groups):
        part = x[0, g * 2:(g + 1) * 2].float()
        var, m = torch.var_mean(part, unbiased=False)
        torch.testing.assert_close(mean[0, g], m, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(rstd[0, g], torch.rsqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
        del part
    tail = x[0, -2:, -4096:].float()
    torch.testing.assert_close(y[0, -2:, -4096:].float(), (tail - mean[0, -1]) * rstd[0, -1], rtol=1.6e-2, atol=1.6e-2)
