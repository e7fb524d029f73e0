"""apex.normalization forward and backward against float64 references, on CPU and (gpu marker) CUDA."""
import pytest
import torch

from apex.normalization import (
    FusedLayerNorm,
    FusedRMSNorm,
    MixedFusedLayerNorm,
    MixedFusedRMSNorm,
    fused_layer_norm,
    fused_layer_norm_affine,
    fused_rms_norm,
    fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine,
    mixed_dtype_fused_rms_norm_affine,
)

from norm_reference import DEVICES, assert_close_rel, grad_input_scale, random_parameter, reference_norm

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
EPS = 1e-5


def run_norm(x, normalized_shape, rms, affine, memory_efficient, mixed=False, param_dtype=None):
    """Forward + backward through the functional API, and the same in float64 with plain PyTorch."""
    torch.manual_seed(0)
    device = x.device
    param_dtype = param_dtype or x.dtype
    weight = random_parameter(normalized_shape, device, param_dtype).requires_grad_() if affine else None
    bias = random_parameter(normalized_shape, device, param_dtype).requires_grad_() if affine and not rms else None
    x = x.detach().requires_grad_()
    if rms:
        fn = mixed_dtype_fused_rms_norm_affine if mixed else fused_rms_norm_affine
        y = fn(x, weight, normalized_shape, EPS, memory_efficient) if affine else \
            fused_rms_norm(x, normalized_shape, EPS, memory_efficient)
    else:
        fn = mixed_dtype_fused_layer_norm_affine if mixed else fused_layer_norm_affine
        y = fn(x, weight, bias, normalized_shape, EPS, memory_efficient) if affine else \
            fused_layer_norm(x, normalized_shape, EPS, memory_efficient)
    dy = torch.randn(y.shape, dtype=torch.float64).to(device=device, dtype=y.dtype)
    y.backward(dy)

    params = [p for p in (weight, bias) if p is not None]
    x64 = x.detach().double().requires_grad_()
    p64 = [p.detach().double().requires_grad_() for p in params]
    y64 = reference_norm(x64, normalized_shape, p64[0] if affine else None, p64[1] if len(p64) > 1 else None,
                         EPS, rms)
    y64.backward(dy.double())
    return y, x, params, dy, y64, x64, p64


def check(x, normalized_shape, rms, affine, memory_efficient, **kwargs):
    y, x, params, dy, y64, x64, p64 = run_norm(x, normalized_shape, rms, affine, memory_efficient, **kwargs)
    out_dtype = params[0].dtype if kwargs.get("mixed") and params else x.dtype
    assert y.dtype == out_dtype and y.shape == x.shape
    assert_close_rel(y, y64, y.dtype, "output")
    # memory_efficient recovers xhat = (y - b) / w from the rounded output: in half precision that
    # costs a few more ulps of the output dtype (NVIDIA apex's trade-off).
    slack = 4.0 if memory_efficient and y.dtype in (torch.float16, torch.bfloat16) else 1.0
    assert x.grad.dtype == x.dtype
    scale = grad_input_scale(x, dy, params[0] if affine else None, normalized_shape, EPS, rms)
    assert_close_rel(x.grad, x64.grad, x.dtype, "grad_input", scale=slack * max(scale, x64.grad.norm()))
    # Parameter grads are sums over rows: their rounding follows the sum of |terms| (|dy * xhat|, |dy|).
    row_dims = tuple(range(x.dim() - len(normalized_shape)))
    xhat = reference_norm(x.detach(), normalized_shape, None, None, EPS, rms)
    terms = ((dy.double().cpu() * xhat.cpu()).abs(), dy.double().cpu().abs())
    for name, p, ref, term in zip(("grad_weight", "grad_bias"), params, p64, terms):
        assert p.grad.dtype == p.dtype
        term_scale = term.sum(row_dims).norm()
        assert_close_rel(p.grad, ref.grad, p.dtype, name, scale=slack * max(ref.grad.norm(), term_scale))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
@pytest.mark.parametrize("shape", [(6, 64), (5, 1003)], ids=str)
def test_matches_float64(device, dtype, rms, affine, memory_efficient, shape):
    x = torch.randn(shape, dtype=torch.float64).to(device=device, dtype=dtype) * 2 + 0.5
    check(x, shape[-1:], rms, affine, memory_efficient)


# Widths around the vector width (8 halves / 4 floats per 16 bytes), the warp- and block-per-row
# layouts, and the scalar fallbacks (odd widths, rows wider than the register path).
CPU_WIDTHS = [1, 3, 8, 33, 768, 4099]
GPU_WIDTHS = [1, 2, 3, 7, 8, 31, 32, 33, 63, 64, 127, 256, 512, 768, 1000, 1024, 1025, 2048, 4096, 5120, 6144,
              8192, 12288, 16384, 16392, 20000, 24576, 32768, 32776, 65536]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("cols", CPU_WIDTHS)
def test_widths_cpu(dtype, rms, cols):
    x = torch.randn(7, cols, dtype=torch.float64).to(dtype)
    check(x, [cols], rms, affine=True, memory_efficient=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
@pytest.mark.parametrize("cols", GPU_WIDTHS)
def test_widths_cuda(dtype, rms, memory_efficient, cols):
    rows = max(3, min(300, (1 << 21) // cols))  # enough rows for several persistent-grid iterations
    x = torch.randn(rows, cols, dtype=torch.float64).to(device="cuda", dtype=dtype)
    check(x, [cols], rms, affine=True, memory_efficient=memory_efficient)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rms, cols", [(False, 6120), (True, 12264)], ids=["layer-6120", "rms-12264"])
def test_backward_shared_memory_just_under_48k_cuda(dtype, rms, cols):
    """Backward accumulators (4 bytes per column and parameter grad) just under 48 KiB, so that only the
    kernel's static shared memory takes the block over the default limit: the launch must still opt in
    (6144 / 12288 columns, exactly 48 KiB, are in test_widths_cuda)."""
    x = torch.randn(64, cols, dtype=torch.float64).to(device="cuda", dtype=dtype)
    check(x, [cols], rms, affine=True, memory_efficient=False)


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("cols", [1024, 4096])
def test_many_rows_cuda(rms, cols):
    """More rows than the persistent backward grid holds at once; dy with a nonzero mean per column."""
    x = torch.randn(20000, cols, device="cuda", dtype=torch.bfloat16)
    check(x, [cols], rms, affine=True, memory_efficient=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
@pytest.mark.parametrize("mixed", [False, True], ids=["same_dtype", "fp32_params"])
@pytest.mark.parametrize("cols", [14336, 16384])
def test_wide_rows_cuda(dtype, memory_efficient, mixed, cols):
    """LayerNorm rows wide enough that the backward splits each over a cluster of blocks (sm_90+),
    with more rows than the persistent grid holds at once."""
    if mixed and dtype == torch.float32:
        pytest.skip("mixed dtypes need a half input")
    x = torch.randn(700, cols, dtype=torch.float64).to(device="cuda", dtype=dtype)
    check(x, [cols], rms=False, affine=True, memory_efficient=memory_efficient, mixed=mixed,
          param_dtype=torch.float32 if mixed else None)


@pytest.mark.gpu
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_unaligned_input_cuda(rms):
    """A view starting 2 bytes into its storage cannot use 16-byte loads: the scalar path must agree."""
    storage = torch.randn(64 * 1024 + 1, device="cuda", dtype=torch.float16)
    x = storage[1:].view(64, 1024)
    check(x, [1024], rms, affine=True, memory_efficient=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_mixed_dtypes(device, rms, memory_efficient, dtype):
    """float32 parameters with a half input: output and weight grads in float32, grad_input in the input's dtype."""
    x = torch.randn(9, 256, dtype=torch.float64).to(device=device, dtype=dtype)
    check(x, [256], rms, affine=True, memory_efficient=memory_efficient, mixed=True, param_dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_multi_dim_normalized_shape(device, rms, memory_efficient):
    x = torch.randn(3, 5, 4, 6, dtype=torch.float64).to(device=device, dtype=torch.float32)
    check(x, (4, 6), rms, affine=True, memory_efficient=memory_efficient)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("shape", [(1, 1), (5, 1), (1, 300)], ids=str)
def test_tiny_rows(device, rms, shape):
    """Rows of one element, and a single row."""
    x = torch.randn(shape, dtype=torch.float64).to(device=device, dtype=torch.float32)
    check(x, shape[-1:], rms, affine=True, memory_efficient=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("dtype, scale", [(torch.float16, 3e4), (torch.bfloat16, 1e15)], ids=["fp16", "bf16"])
def test_large_magnitude(device, rms, dtype, scale):
    """Squares of these values overflow the input dtype; statistics in float32 must not."""
    x = (torch.randn(4, 512, dtype=torch.float64).clamp(-2, 2) * scale).to(device=device, dtype=dtype)
    check(x, [512], rms, affine=True, memory_efficient=False)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_gradcheck_float64(rms, memory_efficient):
    torch.manual_seed(0)
    shape = [3, 5]
    x = torch.randn(4, *shape, dtype=torch.float64, requires_grad=True)
    w = random_parameter(shape, "cpu", torch.float64).requires_grad_()
    b = random_parameter(shape, "cpu", torch.float64).requires_grad_()
    if rms:
        torch.autograd.gradcheck(lambda x, w: fused_rms_norm_affine(x, w, shape, EPS, memory_efficient), (x, w))
    else:
        torch.autograd.gradcheck(lambda x, w, b: fused_layer_norm_affine(x, w, b, shape, EPS, memory_efficient),
                                 (x, w, b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused_cls, torch_cls", [(FusedLayerNorm, torch.nn.LayerNorm),
                                                  (FusedRMSNorm, torch.nn.RMSNorm)], ids=["layer", "rms"])
@pytest.mark.parametrize("elementwise_affine", [True, False], ids=["affine", "plain"])
def test_module_is_drop_in(device, fused_cls, torch_cls, elementwise_affine):
    """State dicts load both ways and outputs agree with torch.nn's module."""
    reference = torch_cls((4, 8), eps=1e-5, elementwise_affine=elementwise_affine).to(device)
    if elementwise_affine:
        with torch.no_grad():
            for p in reference.parameters():
                p.copy_(torch.randn_like(p))
    fused = fused_cls((4, 8), eps=1e-5, elementwise_affine=elementwise_affine).to(device)
    fused.load_state_dict(reference.state_dict())
    reference.load_state_dict(fused.state_dict())
    assert list(fused.state_dict()) == list(reference.state_dict())
    x = torch.randn(3, 4, 8, device=device)
    torch.testing.assert_close(fused(x), reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [MixedFusedLayerNorm, MixedFusedRMSNorm])
def test_mixed_modules(device, cls):
    module = cls(64, memory_efficient=True).to(device)
    x = torch.randn(5, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    y = module(x)
    y.float().sum().backward()
    assert y.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    assert module.weight.grad.dtype == torch.float32
    with pytest.raises(ValueError, match="elementwise_affine=False"):
        cls(64, elementwise_affine=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [FusedLayerNorm, FusedRMSNorm])
def test_module_parameters_cast_to_input_dtype(device, cls):
    """Float32 parameters with a bfloat16 input (no autocast): output in bfloat16, like torch.nn.LayerNorm."""
    module = cls(32).to(device)
    x = torch.randn(4, 32, device=device, dtype=torch.bfloat16)
    y = module(x)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and module.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm])
def test_autocast(device, cls):
    """Under autocast, input and parameters are cast to the autocast dtype (NVIDIA apex behaviour)."""
    dtype = torch.bfloat16
    module = cls(16).to(device)
    x = torch.randn(2, 16, device=device)
    with torch.autocast(device_type=device, dtype=dtype):
        y = module(x)
    assert y.dtype == dtype
    ref = reference_norm(x, [16], module.weight, module.bias, module.eps, cls in (FusedRMSNorm, MixedFusedRMSNorm))
    assert_close_rel(y, ref, dtype, "autocast output")
