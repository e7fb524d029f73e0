"""The syncbn op's kernels against plain torch, on CPU (and CUDA under the gpu marker)."""
from __future__ import annotations

import pytest
import torch

import syncbn

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# NCHW shapes: vectorizable planes, odd planes (scalar path), one element per plane, 3-D.
SHAPES = [(4, 8, 4, 8), (3, 5, 3, 7), (6, 10, 1, 1), (2, 3, 17)]


def tol(dtype):
    return {torch.float16: dict(rtol=1e-2, atol=1e-2), torch.bfloat16: dict(rtol=5e-2, atol=5e-2),
            torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}[dtype]


def stats_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def make(shape, dtype, device, seed=0, shift=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + shift).to(dtype).to(device)


def reduce_dims(x):
    return [d for d in range(x.dim()) if d != 1]


def channels_last_view(x):
    """The same values as an (N, *spatial, C) contiguous tensor."""
    return x.movedim(1, -1).contiguous()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_welford_mean_var(device, dtype, shape):
    x = make(shape, dtype, device)
    ref = x.double()
    want_mean, want_var = ref.mean(reduce_dims(x)), ref.var(reduce_dims(x), unbiased=False)
    for mean, var in (syncbn.welford_mean_var(x), syncbn.welford_mean_var_c_last(channels_last_view(x))):
        assert mean.dtype == stats_dtype(dtype)
        torch.testing.assert_close(mean.double(), want_mean, **tol(torch.float32 if dtype != torch.float64 else dtype))
        torch.testing.assert_close(var.double(), want_var, **tol(torch.float32 if dtype != torch.float64 else dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_welford_is_stable_when_mean_dwarfs_std(device):
    # E[x^2] - E[x]^2 in float32 would be off by ~ulp(1e8) = 8 here; the variance is ~4.
    x = make((8, 4, 16, 16), torch.float32, device, shift=1e4)
    for mean, var in (syncbn.welford_mean_var(x), syncbn.welford_mean_var_c_last(channels_last_view(x))):
        torch.testing.assert_close(var.double(), x.double().var((0, 2, 3), unbiased=False), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_welford_parallel_merges_unequal_parts(device):
    parts = [make((n, 6, 3), torch.float32, device, seed=n) for n in (1, 4, 9)]
    means = torch.stack([p.mean((0, 2)) for p in parts])
    variances = torch.stack([p.var((0, 2), unbiased=False) for p in parts])
    counts = torch.tensor([p.numel() // 6 for p in parts], device=device, dtype=torch.int32)
    mean, var, inv_std = syncbn.welford_parallel(means, variances, counts, 1e-5)
    whole = torch.cat(parts).double()
    torch.testing.assert_close(mean.double(), whole.mean((0, 2)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var.double(), whole.var((0, 2), unbiased=True), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(inv_std.double(), (whole.var((0, 2), unbiased=False) + 1e-5).rsqrt(), rtol=1e-5, atol=1e-5)


def affine_inputs(shape, dtype, device):
    C = shape[1]
    x = make(shape, dtype, device)
    mean = make((C,), torch.float32, device, seed=1)
    inv_std = make((C,), torch.float32, device, seed=2, shift=0).abs() + 0.5
    weight = make((C,), torch.float32, device, seed=3, shift=1)
    shift = make((C,), torch.float32, device, seed=4, shift=0)
    return x, mean, inv_std, weight, shift


def per_channel(v, x):
    return v.double().view(1, -1, *([1] * (x.dim() - 2)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_batchnorm_forward_both_layouts(device, dtype, shape):
    x, mean, inv_std, weight, shift = affine_inputs(shape, dtype, device)
    z = make(shape, dtype, device, seed=5)
    normalized = (x.double() - per_channel(mean, x)) * per_channel(inv_std.double() * weight.double(), x) + per_channel(shift, x)
    out = syncbn.batchnorm_forward(x, mean, inv_std, weight, shift)
    torch.testing.assert_close(out.double(), normalized.to(dtype).double(), **tol(dtype))
    out_cl = syncbn.batchnorm_forward_c_last(channels_last_view(x), channels_last_view(z), mean, inv_std, weight,
                                             shift, True)
    want = torch.relu(normalized + z.double())
    torch.testing.assert_close(out_cl.double(), channels_last_view(want).to(dtype).double(), **tol(dtype))
    bare = syncbn.batchnorm_forward(x, mean, inv_std, None, None)
    torch.testing.assert_close(bare.double(), ((x.double() - per_channel(mean, x)) * per_channel(inv_std, x)).to(dtype).double(), **tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_reduce_bn_and_backward_both_layouts(device, dtype, shape):
    x, mean, inv_std, weight, _ = affine_inputs(shape, dtype, device)
    dy = make(shape, dtype, device, seed=6, shift=0)
    dims = reduce_dims(x)
    xmu = x.double() - per_channel(mean, x)
    want_sum_dy, want_sum_dy_xmu = dy.double().sum(dims), (dy.double() * xmu).sum(dims)
    count = torch.tensor([x.numel() // x.size(1), 7], device=device)
    total = count.sum().item()
    want_dx = (dy.double() - per_channel(want_sum_dy / total, x)
               - xmu * per_channel(inv_std.double() ** 2 * want_sum_dy_xmu / total, x)) * per_channel(inv_std.double() * weight.double(), x)
    stat_tol = tol(torch.float32 if dtype != torch.float64 else dtype) | dict(atol=1e-3 if dtype != torch.float64 else 1e-9)
    for layout, (dy_l, x_l) in (("nchw", (dy, x)), ("c_last", (channels_last_view(dy), channels_last_view(x)))):
        reduce_bn = syncbn.reduce_bn_c_last if layout == "c_last" else syncbn.reduce_bn
        backward = syncbn.batchnorm_backward_c_last if layout == "c_last" else syncbn.batchnorm_backward
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = reduce_bn(dy_l, x_l, mean, inv_std, weight)
        torch.testing.assert_close(sum_dy.double(), want_sum_dy, **stat_tol)
        torch.testing.assert_close(sum_dy_xmu.double(), want_sum_dy_xmu, **stat_tol)
        # grad_weight / grad_bias come in the weight's dtype (float32 here).
        assert grad_weight.dtype == grad_bias.dtype == weight.dtype
        param_tol = dict(rtol=1e-5, atol=1e-3)
        torch.testing.assert_close(grad_weight.double(), want_sum_dy_xmu * inv_std.double(), **param_tol)
        torch.testing.assert_close(grad_bias.double(), want_sum_dy, **param_tol)
        dx = backward(dy_l, x_l, mean, inv_std, weight, sum_dy, sum_dy_xmu, count)
        want = want_dx if layout == "nchw" else channels_last_view(want_dx)
        torch.testing.assert_close(dx.double(), want.to(dtype).double(), **tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_relu_bw_c_last_masks_where_output_was_clipped(device):
    x, mean, inv_std, weight, shift = affine_inputs((4, 16, 3, 3), torch.float32, device)
    x, z, dy = channels_last_view(x), make((4, 3, 3, 16), torch.float32, device, seed=8, shift=0), make((4, 3, 3, 16), torch.float32, device, seed=9)
    pre_relu = (x - mean) * (inv_std * weight) + shift + z
    out = syncbn.relu_bw_c_last(dy, x, z, mean, inv_std, weight, shift)
    torch.testing.assert_close(out, torch.where(pre_relu > 0, dy, torch.zeros_like(dy)))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_input_gives_zero_statistics_and_empty_outputs(device):
    x = torch.empty(0, 3, 4, 4, device=device)
    mean, var = syncbn.welford_mean_var(x)
    assert mean.tolist() == [0.0] * 3 and var.tolist() == [0.0] * 3
    ones = torch.ones(3, device=device)
    assert syncbn.batchnorm_forward(x, ones, ones, None, None).shape == x.shape
    sum_dy, *_ = syncbn.reduce_bn(x, x, ones, ones, None)
    assert sum_dy.tolist() == [0.0] * 3


def test_bad_inputs_raise_clear_errors():
    x = torch.randn(2, 3, 4)
    ones = torch.ones(3)
    with pytest.raises(RuntimeError, match="at least 2 dimensions"):
        syncbn.welford_mean_var(torch.randn(5))
    with pytest.raises(RuntimeError, match="input must be float32, float16 or bfloat16"):
        syncbn.welford_mean_var(torch.ones(2, 3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"mean must have shape \[3\]"):
        syncbn.batchnorm_forward(x, torch.ones(4), ones, None, None)
    with pytest.raises(RuntimeError, match="grad_output must have the shape of input"):
        syncbn.reduce_bn(torch.randn(2, 3, 5), x, ones, ones, None)
    with pytest.raises(RuntimeError, match="grad_output must have the dtype of input"):
        syncbn.reduce_bn(x.double(), x, ones, ones, None)
    with pytest.raises(RuntimeError, match="count must be a non-empty 1-D tensor"):
        syncbn.batchnorm_backward(x, x, ones, ones, None, ones, ones, torch.tensor([], dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"count must have shape \[2\]"):
        syncbn.welford_parallel(torch.ones(2, 3), torch.ones(2, 3), torch.ones(3, dtype=torch.long), 1e-5)
    with pytest.raises(RuntimeError, match="z must have the shape of input"):
        syncbn.batchnorm_forward_c_last(torch.randn(2, 4, 3), torch.randn(2, 4, 2), ones, ones, None, None, False)
