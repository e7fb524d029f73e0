"""Bad arguments raise a clear exception before any kernel runs."""
import pytest
import torch

import fused_layer_norm_cuda
from apex.normalization import (
    FusedLayerNorm,
    fused_layer_norm,
    fused_layer_norm_affine,
    fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine,
    mixed_dtype_fused_rms_norm_affine,
)

from norm_reference import DEVICES


@pytest.mark.parametrize("device", DEVICES)
def test_normalized_shape_not_trailing_dims(device):
    x = torch.randn(4, 6, 8, device=device)
    with pytest.raises(RuntimeError, match="normalized_shape .* trailing dimensions"):
        fused_layer_norm(x, (6,))
    with pytest.raises(RuntimeError, match="normalized_shape .* trailing dimensions"):
        FusedLayerNorm((4, 6, 8, 1)).to(device)(x)


@pytest.mark.parametrize("device", DEVICES)
def test_weight_of_wrong_shape(device):
    x = torch.randn(4, 8, device=device)
    w = torch.ones(9, device=device)
    with pytest.raises(RuntimeError, match=r"weight has shape \[9\] but normalized_shape is \[8\]"):
        fused_rms_norm_affine(x, w, (8,))
    with pytest.raises(RuntimeError, match=r"bias has shape \[9\]"):
        fused_layer_norm_affine(x, torch.ones(8, device=device), w, (8,))


@pytest.mark.parametrize("device", DEVICES)
def test_weight_of_wrong_dtype(device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises(RuntimeError, match="dtype .* is incompatible with input dtype"):
        mixed_dtype_fused_layer_norm_affine(x, torch.ones(8, device=device, dtype=torch.half),
                                            torch.zeros(8, device=device, dtype=torch.half), (8,))
    with pytest.raises(RuntimeError, match="bias has dtype"):
        mixed_dtype_fused_layer_norm_affine(x.bfloat16(), torch.ones(8, device=device),
                                            torch.zeros(8, device=device, dtype=torch.bfloat16), (8,))
    with pytest.raises(RuntimeError, match="use forward_affine_mixed_dtypes"):
        fused_layer_norm_cuda.forward_affine(x.half(), [8], torch.ones(8, device=device),
                                             torch.zeros(8, device=device), 1e-5)


@pytest.mark.gpu
def test_weight_on_another_device():
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="weight is on cpu but input is on cuda"):
        mixed_dtype_fused_rms_norm_affine(x, torch.ones(8), (8,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=str)
def test_integer_input(device, dtype):
    x = torch.ones(4, 8, device=device, dtype=dtype)
    with pytest.raises(RuntimeError, match="input must be float32, float16 or bfloat16"):
        fused_layer_norm(x, (8,))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_arguments(device):
    x = torch.randn(4, 8, device=device)
    out, mean, invvar = fused_layer_norm_cuda.forward(x, [8], 1e-5)
    with pytest.raises(RuntimeError, match="grad_output has shape"):
        fused_layer_norm_cuda.backward(torch.ones(4, 9, device=device), mean, invvar, x, [8], 1e-5, False)
    with pytest.raises(RuntimeError, match="invvar has 3 elements, expected one per row"):
        fused_layer_norm_cuda.backward(torch.ones_like(x), mean, invvar[:3], x, [8], 1e-5, False)
    with pytest.raises(RuntimeError, match="grad_output has dtype"):
        fused_layer_norm_cuda.backward(torch.ones_like(x).double(), mean, invvar, x, [8], 1e-5, False)
    with pytest.raises(RuntimeError, match="needs mean"):
        fused_layer_norm_cuda.backward(torch.ones_like(x), None, invvar, x, [8], 1e-5, False)
    with pytest.raises(RuntimeError, match="invvar must be float32 or float64"):
        fused_layer_norm_cuda.backward(torch.ones_like(x), mean, invvar.half(), x, [8], 1e-5, False)
