"""apex.contrib.layer_norm.FastLayerNorm and the fast_layer_norm module, against float64 references.

Both are served by the fused_layer_norm_cuda ops (no second implementation): checked here by result
and by dtype rule (the output takes the parameters' dtype), CPU always, CUDA under the gpu marker.
"""
import pytest
import torch

import fast_layer_norm
from apex.contrib.layer_norm import FastLayerNorm, FastLayerNormFN
from apex.contrib.layer_norm.layer_norm import FastLayerNorm as FastLayerNormByPath  # upstream's import path

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (input dtype, parameter dtype): upstream's kernel list, plus float32 parameters with 16-bit data.
DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
               (torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)]
# Relative error bounds (sum |err| / sum |ref|), as upstream's test measures, per output dtype.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def relerr(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).abs().sum() / want.abs().sum().clamp_min(1e-30)).item()


def reference(x, gamma, beta, dz, eps):
    """Float64 LayerNorm forward and backward: z, mu, rsigma, dx, dgamma, dbeta."""
    x64, g64, b64 = (t.detach().double().requires_grad_() for t in (x, gamma, beta))
    mu = x64.mean(-1)
    rsigma = ((x64 - mu[:, None]).square().mean(-1) + eps).rsqrt()
    z = (x64 - mu[:, None]) * rsigma[:, None] * g64 + b64
    z.backward(dz.double())
    return z, mu, rsigma, x64.grad, g64.grad, b64.grad


def inputs(device, itype, wtype, rows=37, hidden=264):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=g, dtype=torch.float64).to(device, itype)
    gamma = (torch.randn(hidden, generator=g, dtype=torch.float64) * 0.2 + 1).to(device, wtype)
    beta = (torch.randn(hidden, generator=g, dtype=torch.float64) * 0.2).to(device, wtype)
    dz = torch.randn(rows, hidden, generator=g, dtype=torch.float64).to(device, wtype)
    return x, gamma, beta, dz


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("itype, wtype", DTYPE_PAIRS, ids=lambda t: str(t).replace("torch.", ""))
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_ln_fwd_ln_bwd(device, itype, wtype, memory_efficient):
    x, gamma, beta, dz = inputs(device, itype, wtype)
    z, mu, rsigma = fast_layer_norm.ln_fwd(x, gamma, beta, 1e-5)
    assert z.dtype == wtype and mu.dtype == rsigma.dtype == torch.float32 and mu.shape == (x.shape[0],)
    z64, mu64, rs64, dx64, dg64, db64 = reference(x, gamma, beta, dz, 1e-5)
    tol = max(REL_TOL[itype], REL_TOL[wtype])
    for got, want in ((z, z64), (mu, mu64), (rsigma, rs64)):
        assert relerr(got, want) < tol
    kept = z if memory_efficient else x
    dx, dgamma, dbeta, dgamma_part, dbeta_part = fast_layer_norm.ln_bwd(dz, kept, mu, rsigma, gamma, beta,
                                                                       memory_efficient)
    assert dx.dtype == kept.dtype and dgamma.dtype == dbeta.dtype == wtype
    assert dgamma_part.dtype == torch.float32 and dgamma_part.shape[-1] == gamma.numel()
    # The parts are float32; dgamma / dbeta are their sums rounded once to the parameters' dtype.
    torch.testing.assert_close(dgamma_part.sum(0).to(wtype), dgamma, rtol=0, atol=0)
    torch.testing.assert_close(dbeta_part.sum(0).to(wtype), dbeta, rtol=0, atol=0)
    # memory_efficient recovers xhat from the rounded output: a few ulps of the output dtype more.
    slack = 4 if memory_efficient and wtype != torch.float32 else 1
    for got, want in ((dx, dx64), (dgamma, dg64), (dbeta, db64)):
        assert relerr(got, want) < slack * tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("itype, wtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)],
                         ids=["float32", "bfloat16"])
def test_ln_bwd_five_argument_form(device, itype, wtype):
    # ROCm apex's (and older NVIDIA apex's) call: ln_bwd(dz, x, mu, rsigma, gamma), the input kept.
    x, gamma, beta, dz = inputs(device, itype, wtype)
    z, mu, rsigma = fast_layer_norm.ln_fwd(x, gamma, beta, 1e-5)
    five = fast_layer_norm.ln_bwd(dz, x, mu, rsigma, gamma)
    seven = fast_layer_norm.ln_bwd(dz, x, mu, rsigma, gamma, beta, False)
    assert len(five) == 5
    for got, want in zip(five, seven):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_ln_bwd_memory_efficient_without_beta_raises(device):
    x, gamma, beta, dz = inputs(device, torch.float32, torch.float32)
    z, mu, rsigma = fast_layer_norm.ln_fwd(x, gamma, beta, 1e-5)
    with pytest.raises(ValueError, match="needs beta"):
        fast_layer_norm.ln_bwd(dz, z, mu, rsigma, gamma, None, True)


@pytest.mark.parametrize("device", DEVICES)
def test_ln_bwd_without_beta_still_gives_dbeta(device):
    x, gamma, beta, dz = inputs(device, torch.float32, torch.float32)
    z, mu, rsigma = fast_layer_norm.ln_fwd(x, gamma, beta, 1e-5)
    _, _, dbeta, _, _ = fast_layer_norm.ln_bwd(dz, x, mu, rsigma, gamma, None, False)
    torch.testing.assert_close(dbeta, dz.sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("itype, wtype", DTYPE_PAIRS, ids=lambda t: str(t).replace("torch.", ""))
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_module_matches_reference(device, itype, wtype, memory_efficient):
    module = FastLayerNorm(264, eps=1e-5, memory_efficient=memory_efficient).to(device=device, dtype=wtype)
    x, gamma, beta, dz = inputs(device, itype, wtype, rows=12)
    with torch.no_grad():
        module.weight.copy_(gamma)
        module.bias.copy_(beta)
    x = x.view(3, 4, 264).requires_grad_()
    z = module(x)
    assert z.dtype == wtype and z.shape == x.shape
    z.backward(dz.view(3, 4, 264))
    z64, _, _, dx64, dg64, db64 = reference(x.view(12, 264), gamma, beta, dz, 1e-5)
    tol = max(REL_TOL[itype], REL_TOL[wtype])
    slack = 4 if memory_efficient and wtype != torch.float32 else 1
    assert relerr(z.view(12, 264), z64) < tol
    assert x.grad.dtype == itype and relerr(x.grad.view(12, 264), dx64) < slack * tol
    assert relerr(module.weight.grad, dg64) < slack * tol and relerr(module.bias.grad, db64) < slack * tol


@pytest.mark.parametrize("device", DEVICES)
def test_module_is_fused_layer_norm(device):
    """Same op, same numbers as MixedFusedLayerNorm (upstream's FastLayerNorm is a mixed-dtype LayerNorm)."""
    from apex.normalization import MixedFusedLayerNorm

    fast, fused = FastLayerNorm(64).to(device), MixedFusedLayerNorm(64).to(device)
    x = torch.randn(5, 64, device=device, dtype=torch.bfloat16)
    torch.testing.assert_close(fast(x), fused(x), rtol=0, atol=0)
    assert type(fast(x.requires_grad_()).grad_fn).__name__ == "CppFunction"
    assert FastLayerNormByPath is FastLayerNorm
    torch.testing.assert_close(FastLayerNormFN.apply(x, fast.weight, fast.bias, 1e-5), fast(x), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_autocast(device, dtype):
    """Upstream's test_compat_with_autocast: output in the autocast dtype, weight grads in float32."""
    module = FastLayerNorm(128).to(device)
    x = torch.randn(8, 4, 128, device=device)
    with torch.autocast(device_type=device, dtype=dtype):
        out = module(x)
    assert out.dtype == dtype
    out.backward(torch.randn_like(out))
    assert module.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_bad_input(device):
    module = FastLayerNorm(16).to(device)
    x = torch.randn(0, 16, device=device, requires_grad=True)
    module(x).sum().backward()
    torch.testing.assert_close(module.weight.grad, torch.zeros(16, device=device))
    with pytest.raises(RuntimeError, match="trailing dimensions"):
        module(torch.randn(4, 15, device=device))
    with pytest.raises(RuntimeError, match="must be float32"):
        module(torch.ones(4, 16, device=device, dtype=torch.int32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()
    module = FastLayerNorm(32).to(device)
    compiled = torch.compile(module, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for rows in (3, 6):
        x = torch.randn(rows, 32, device=device, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        compiled(x).sin().sum().backward()
        module(xr).sin().sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
