"""apex.fused_dense and apex.mlp modules under amp.initialize's opt levels, on CPU and (marker gpu) CUDA:
O1/O4 (amp's casts) run them in float16/bfloat16, O2/O5 run the cast model; a training step works."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from apex import amp
from apex.amp._amp_state import _amp_state
from apex.fused_dense import FusedDense, FusedDenseGeluDense
from apex.mlp import MLP
from dense_reference import linear_gelu_linear, rounded

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LEVELS = {"O1": torch.float16, "O2": torch.float16, "O4": torch.bfloat16, "O5": torch.bfloat16}
TOL = {torch.float16: 5e-3, torch.bfloat16: 4e-2}


@pytest.fixture(autouse=True)
def remove_amp_casts():
    yield
    _amp_state.handle._deactivate()  # O1/O4 patch torch's functions process-wide


def reference(model, x, dtype):
    """The model's function in float64 from its parameters and x rounded to dtype (what the op sees), its
    intermediates rounded to dtype where the op stores them (dense_reference.py)."""
    p = {name: t.detach().to(dtype).double() for name, t in model.named_parameters()}
    x = x.to(dtype).double()
    if isinstance(model, FusedDense):
        return F.linear(x, p["weight"], p["bias"])
    if isinstance(model, FusedDenseGeluDense):
        return linear_gelu_linear(x, p["weight1"], p["bias1"], p["weight2"], p["bias2"], dtype)
    for i in range(model.num_layers):
        x = rounded(torch.relu(F.linear(x, p[f"weight_{i}"], p[f"bias_{i}"])), dtype)
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_level", list(LEVELS))
@pytest.mark.parametrize("make", [lambda: FusedDense(8, 4), lambda: FusedDenseGeluDense(8, 16, 4),
                                  lambda: MLP([8, 16, 4])], ids=["FusedDense", "FusedDenseGeluDense", "MLP"])
def test_opt_level_dtypes(device, opt_level, make):
    dtype = LEVELS[opt_level]
    torch.manual_seed(0)
    model = make().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
    x = torch.randn(5, 8, device=device)
    out = model(x)
    if opt_level in ("O1", "O4"):  # amp's casts: fp32 parameters, the op in the low-precision type
        assert out.dtype == dtype and next(model.parameters()).dtype == torch.float32
    else:  # O2/O5: the model itself is cast (amp hands back fp32 outputs)
        assert next(model.parameters()).dtype == dtype
    expected = reference(model, x, dtype)
    torch.testing.assert_close(out.double(), expected, rtol=TOL[dtype], atol=TOL[dtype] * expected.abs().max().item())
    with amp.scale_loss(out.float().square().sum(), optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
