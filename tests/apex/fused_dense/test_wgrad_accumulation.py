"""fused_weight_gradient_mlp_cuda (Megatron's gradient-accumulation fusion, built by the fused_dense
library): main_grad += d_output^T @ input, float32 or 16-bit main_grad, against a float64 reference on
CPU and (marker gpu) CUDA; N-D and strided operands; tracing; bad input."""
import pytest
import torch
from torch.library import opcheck

import fused_weight_gradient_mlp_cuda as wgrad

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# Products are exact in float32; the sums over tokens are accumulated in float32 and rounded once
# into main_grad (16-bit main_grad: one rounding of the sum to its dtype).
FP32_TOL = 1e-5
MAIN_GRAD_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def inputs(tokens_shape, in_features, out_features, dtype, device):
    x = torch.randn(*tokens_shape, in_features, dtype=torch.float64).to(dtype).to(device)
    dy = torch.randn(*tokens_shape, out_features, dtype=torch.float64).to(dtype).to(device)
    return x, dy


def expected(main_grad, x, dy):
    return main_grad.double() + dy.double().reshape(-1, dy.shape[-1]).t() @ x.double().reshape(-1, x.shape[-1])


def assert_accumulated(main_grad, want, tol):
    scale = want.abs().max().item() if want.numel() else 1.0
    torch.testing.assert_close(main_grad.double(), want, rtol=tol, atol=tol * max(scale, 1.0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens_shape,in_features,out_features",
                         [((7,), 5, 3), ((4, 6), 16, 24), ((1,), 1, 1), ((3, 2, 5), 33, 8)])
def test_fp32_main_grad_accumulates(device, dtype, tokens_shape, in_features, out_features):
    x, dy = inputs(tokens_shape, in_features, out_features, dtype, device)
    main_grad = torch.randn(out_features, in_features, device=device)
    want = expected(main_grad, x, dy)
    wgrad.wgrad_gemm_accum_fp32(x, dy, main_grad)
    assert_accumulated(main_grad, want, FP32_TOL)
    want = expected(main_grad, x, dy)
    wgrad.wgrad_gemm_accum_fp32(x, dy, main_grad)  # accumulates again
    assert_accumulated(main_grad, want, FP32_TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_main_grad_accumulates(device, dtype):
    x, dy = inputs((6, 3), 24, 16, dtype, device)
    main_grad = torch.randn(16, 24, device=device).to(dtype)
    want = expected(main_grad, x, dy)
    wgrad.wgrad_gemm_accum_fp16(x, dy, main_grad)
    assert_accumulated(main_grad, want, MAIN_GRAD_TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_strided_operands_and_main_grad(device):
    """A transposed input, a sliced d_output and a strided view of a larger main_grad buffer."""
    x = torch.randn(24, 10, device=device).t()          # [10 tokens, 24 features], column-major
    dy = torch.randn(10, 40, device=device)[:, ::4]      # [10, 10]
    buffer = torch.zeros(10, 48, device=device)
    main_grad = buffer[:, 8:32]                          # row stride 48
    want = expected(main_grad, x, dy)
    wgrad.wgrad_gemm_accum_fp32(x, dy, main_grad)
    assert_accumulated(main_grad, want, FP32_TOL)
    assert torch.equal(buffer[:, :8], torch.zeros(10, 8, device=device))
    main_t = torch.zeros(24, 10, device=device).t()      # column-major main_grad
    wgrad.wgrad_gemm_accum_fp32(x, dy, main_t)
    assert_accumulated(main_t, expected(torch.zeros(10, 24), x.cpu(), dy.cpu()).to(device), FP32_TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_no_tokens_leaves_main_grad(device):
    main_grad = torch.randn(3, 4, device=device)
    before = main_grad.clone()
    wgrad.wgrad_gemm_accum_fp32(torch.zeros(0, 4, device=device, dtype=torch.bfloat16),
                                torch.zeros(0, 3, device=device, dtype=torch.bfloat16), main_grad)
    assert torch.equal(main_grad, before)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    x, dy = inputs((4,), 6, 5, torch.bfloat16, device)
    with pytest.raises(RuntimeError, match="main_grad must be Float"):
        wgrad.wgrad_gemm_accum_fp32(x, dy, torch.zeros(5, 6, device=device, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="main_grad must be BFloat16"):
        wgrad.wgrad_gemm_accum_fp16(x, dy, torch.zeros(5, 6, device=device))
    with pytest.raises(RuntimeError, match="main_grad must have 6 columns"):
        wgrad.wgrad_gemm_accum_fp32(x, dy, torch.zeros(5, 7, device=device))
    with pytest.raises(RuntimeError, match="d_output must have shape"):
        wgrad.wgrad_gemm_accum_fp32(x, dy[:3], torch.zeros(5, 6, device=device))
    with pytest.raises(RuntimeError, match="d_output must have the input's dtype"):
        wgrad.wgrad_gemm_accum_fp32(x, dy.float(), torch.zeros(5, 6, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_and_opcheck(device):
    x, dy = inputs((4,), 8, 6, torch.bfloat16, device)
    opcheck(torch.ops.apex.fused_weight_gradient_mlp_wgrad_gemm_accum_fp32, (x, dy, torch.zeros(6, 8, device=device)))
    opcheck(torch.ops.apex.fused_weight_gradient_mlp_wgrad_gemm_accum_fp16,
            (x, dy, torch.zeros(6, 8, device=device, dtype=torch.bfloat16)))
    torch._dynamo.reset()

    def step(x, dy, main_grad):
        wgrad.wgrad_gemm_accum_fp32(x, dy, main_grad)
        return main_grad.sum()

    main_grad = torch.zeros(6, 8, device=device)
    torch.compile(step, fullgraph=True)(x, dy, main_grad)
    assert_accumulated(main_grad, expected(torch.zeros(6, 8, device=device), x, dy), FP32_TOL)
