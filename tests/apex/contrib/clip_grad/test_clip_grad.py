"""apex.contrib.clip_grad.clip_grad_norm_ against torch.nn.utils.clip_grad_norm_ on CPU and (marker
gpu) CUDA: mixed dtypes and devices, other norm types, non-finite norms, tracing."""
import pytest
import torch

from apex.contrib.clip_grad import clip_grad_norm_

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# Norms are accumulated in float32 by both; only the summation order differs. Float16 grads are
# rounded once after scaling, by a coefficient that may differ in its last float32 bit.
TOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float64: 1e-14}


def make_params(count, dtypes, devices, seed=0):
    generator = torch.Generator().manual_seed(seed)
    params = []
    for i in range(count):
        shape = [int(s) for s in torch.randint(1, 6, (1 + i % 3,), generator=generator)]
        p = torch.nn.Parameter(torch.randn(shape, generator=generator).to(dtypes[i % len(dtypes)]).to(
            devices[i % len(devices)]))
        p.grad = torch.randn(shape, generator=generator).to(p)
        params.append(p)
    return params


def copies(params):
    out = []
    for p in params:
        q = p.detach().clone()
        q.grad = None if p.grad is None else p.grad.clone()
        out.append(q)
    return out


def assert_same_as_torch(params, max_norm, norm_type=2.0, **kwargs):
    expected_params = copies(params)
    expected = torch.nn.utils.clip_grad_norm_(expected_params, max_norm, norm_type, **kwargs)
    norm = clip_grad_norm_(params, max_norm, norm_type, **kwargs)
    # One coefficient scales every gradient: it is as precise as the least precise dtype's norm.
    tol = max(TOL[p.dtype] for p in params)
    torch.testing.assert_close(norm.double(), expected.double(), rtol=tol, atol=0)
    assert norm.device == params[0].device
    for p, q in zip(params, expected_params):
        torch.testing.assert_close(p.grad, q.grad, rtol=max(tol, TOL[p.dtype]), atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", [[torch.float32], [torch.float16], [torch.bfloat16], [torch.float64],
                                    [torch.float32, torch.float16, torch.float64]])
@pytest.mark.parametrize("max_norm", [0.54321, 1e6])  # clipped, and left alone (coefficient 1)
def test_matches_torch(device, dtypes, max_norm):
    assert_same_as_torch(make_params(41, dtypes, [device]), max_norm)


@pytest.mark.gpu
def test_mixed_devices():
    params = make_params(23, [torch.float32, torch.float16, torch.float64], ["cuda", "cpu"])
    assert_same_as_torch(params, 0.5)
    assert_same_as_torch(list(reversed(params)), 0.5)  # the norm lands on the first grad's device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_type", [1.0, float("inf"), 3.0])
def test_other_norms_are_torchs(device, norm_type):
    assert_same_as_torch(make_params(9, [torch.float32], [device]), 0.3, norm_type)


@pytest.mark.parametrize("device", DEVICES)
def test_single_tensor_generator_and_missing_grads(device):
    params = make_params(5, [torch.float32], [device])
    params[1].grad = None
    expected = copies(params)
    torch.nn.utils.clip_grad_norm_(expected, 0.1)
    clip_grad_norm_((p for p in params), 0.1)
    assert params[1].grad is None
    for p, q in zip(params, expected):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad)
    one = make_params(1, [torch.float32], [device])[0]  # a bare tensor, not a list
    reference = copies([one])[0]
    torch.testing.assert_close(clip_grad_norm_(one, 0.2), torch.nn.utils.clip_grad_norm_(reference, 0.2))
    torch.testing.assert_close(one.grad, reference.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_no_gradients(device):
    p = torch.nn.Parameter(torch.randn(3, device=device))
    assert clip_grad_norm_([p], 1.0).item() == 0.0
    assert clip_grad_norm_([], 1.0).item() == 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_norm(device, bad):
    params = make_params(5, [torch.float32], [device])
    params[2].grad.view(-1)[-1] = bad
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    assert not clip_grad_norm_(params, 1.0).isfinite()  # and without the check, no error


@pytest.mark.parametrize("device", DEVICES)
def test_foreach_false_is_torchs_loop(device):
    assert_same_as_torch(make_params(7, [torch.float32], [device]), 0.3, foreach=False)


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_with_fullgraph(device):
    torch._dynamo.reset()
    params = make_params(6, [torch.float32, torch.bfloat16], [device])
    expected = copies(params)
    clip_grad_norm_(params[:1], 1e9)  # loads the op outside the trace, as a training loop would have

    @torch.compile(fullgraph=True)
    def clip(ps):
        return clip_grad_norm_(ps, 0.25)

    norm = clip(params)
    torch.testing.assert_close(norm.double(), torch.nn.utils.clip_grad_norm_(expected, 0.25).double(), rtol=8e-3,
                               atol=0)
    for p, q in zip(params, expected):  # the coefficient is as precise as the bfloat16 norms
        torch.testing.assert_close(p.grad, q.grad, rtol=TOL[torch.bfloat16], atol=0)
