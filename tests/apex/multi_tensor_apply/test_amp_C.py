"""amp_C kernels against plain-PyTorch float64 references, on CPU and (gpu marker) CUDA."""
import pytest
import torch

import amp_C_reference as ref

CHUNK = 2048 * 32
# Sizes not divisible by the chunk, the vector width or the CUDA tile; a zero-size tensor.
SIZES = [1, 7, 0, 4099, CHUNK + 3, 3 * CHUNK - 1]
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-5}  # float64 math, float32 scalars (as apex)


def randn(sizes, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device) for n in sizes]


def assert_close(actual, expected, dtype=None):
    for a, e in zip(actual, expected):
        tol = TOL[dtype or a.dtype]
        torch.testing.assert_close(a.double().cpu(), e.double().cpu(), rtol=tol, atol=tol)


# ---------------------------------------------------------------- scale / axpby
@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float32),
                                                (torch.float32, torch.float16), (torch.bfloat16, torch.bfloat16)])
def test_scale(amp_C, device, flag, in_dtype, out_dtype):
    xs = randn(SIZES, in_dtype, device)
    outs = [torch.full_like(x, float("nan"), dtype=out_dtype) for x in xs]
    amp_C.multi_tensor_scale(CHUNK, flag, [xs, outs], 0.25)
    assert flag.item() == 0
    for x, o in zip(xs, outs):
        assert torch.equal(o, (x.float() * 0.25).to(out_dtype))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_scale_flags_non_finite_input(amp_C, device, flag, bad):
    xs = randn(SIZES, torch.float32, device)
    xs[4][CHUNK + 1] = bad
    amp_C.multi_tensor_scale(CHUNK, flag, [xs, [torch.empty_like(x) for x in xs]], 2.0)
    assert flag.item() == 1


def test_scale_many_tensors(amp_C, device, flag):
    """More tensors than one CUDA launch's table holds."""
    sizes = [(i * 37) % 1500 for i in range(1100)]
    xs = randn(sizes, torch.float32, device)
    outs = [torch.empty_like(x) for x in xs]
    amp_C.multi_tensor_scale(CHUNK, flag, [xs, outs], 3.0)
    assert all(torch.equal(o, x * 3.0) for x, o in zip(xs, outs))
    xs[1050][5] = float("nan")
    amp_C.multi_tensor_scale(CHUNK, flag, [xs, outs], 3.0)
    assert flag.item() == 1


@pytest.mark.parametrize("arg_to_check", [-1, 0, 1])
def test_axpby(amp_C, device, flag, arg_to_check):
    xs = randn(SIZES, torch.float16, device, seed=1)
    ys = randn(SIZES, torch.float32, device, seed=2)
    outs = [torch.empty_like(y) for y in ys]
    amp_C.multi_tensor_axpby(CHUNK, flag, [xs, ys, outs], 2.0, -0.5, arg_to_check)
    assert flag.item() == 0
    assert_close(outs, [2.0 * x.double() - 0.5 * y.double() for x, y in zip(xs, ys)])
    xs[3][0] = float("inf")  # only seen when x is checked
    amp_C.multi_tensor_axpby(CHUNK, flag, [xs, ys, outs], 2.0, -0.5, arg_to_check)
    assert flag.item() == (1 if arg_to_check in (-1, 0) else 0)


# x, y and out each pick their own dtype, as in NVIDIA and ROCm apex (ROCm's run_amp fuzzes them).
@pytest.mark.parametrize("x_dtype,y_dtype,out_dtype", [(torch.float32, torch.float16, torch.float32),
                                                       (torch.float16, torch.float32, torch.float16),
                                                       (torch.bfloat16, torch.float16, torch.float32)])
def test_axpby_dtypes_of_their_own(amp_C, device, flag, x_dtype, y_dtype, out_dtype):
    xs = randn(SIZES, x_dtype, device, seed=3)
    ys = randn(SIZES, y_dtype, device, seed=4)
    outs = [torch.empty_like(y, dtype=out_dtype) for y in ys]
    amp_C.multi_tensor_axpby(CHUNK, flag, [xs, ys, outs], 1.5, 0.25, -1)
    assert flag.item() == 0
    assert_close(outs, [1.5 * x.double() + 0.25 * y.double() for x, y in zip(xs, ys)], dtype=out_dtype)


# ---------------------------------------------------------------- norms
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_l2norm(amp_C, device, flag, dtype):
    xs = randn(SIZES, dtype, device)
    total, per_tensor = amp_C.multi_tensor_l2norm(CHUNK, flag, [xs], True)
    expected = torch.stack([x.double().norm() for x in xs])
    assert flag.item() == 0
    torch.testing.assert_close(per_tensor.double().cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total.double().cpu(), expected.norm().reshape(1).cpu(), rtol=1e-5, atol=1e-6)
    total, per_tensor = amp_C.multi_tensor_l2norm(CHUNK, flag, [xs], False)
    assert per_tensor.numel() == 0 and total.shape == (1,) and total.dtype == torch.float32


def test_l2norm_many_tensors_is_deterministic(amp_C, device, flag):
    xs = randn([(i * 53) % 3000 for i in range(1500)], torch.float32, device)
    first = amp_C.multi_tensor_l2norm(CHUNK, flag, [xs], True)
    second = amp_C.multi_tensor_l2norm(CHUNK, flag, [xs], True)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    expected = torch.stack([x.double().norm() for x in xs])
    torch.testing.assert_close(first[1].double().cpu(), expected.cpu(), rtol=1e-5, atol=1e-6)


def test_l2norm_flags_inf_and_overflow(amp_C, device, flag):
    xs = randn(SIZES, torch.float32, device)
    xs[5][7] = float("nan")
    amp_C.multi_tensor_l2norm(CHUNK, flag, [xs])
    assert flag.item() == 1
    flag.zero_()
    big = [torch.full((10,), 1e30, device=device)]  # finite values whose squares overflow, as apex flags
    amp_C.multi_tensor_l2norm(CHUNK, flag, [big])
    assert flag.item() == 1


def test_l2norm_mp_skips_when_flag_set(amp_C, device, flag):
    xs = randn(SIZES, torch.float32, device)
    total, per_tensor = amp_C.multi_tensor_l2norm_mp(CHUNK, flag, [xs], True)
    torch.testing.assert_close(total.double().cpu(), torch.stack([x.double().norm() for x in xs]).norm().reshape(1).cpu(),
                               rtol=1e-5, atol=1e-6)
    flag.fill_(1)
    total, per_tensor = amp_C.multi_tensor_l2norm_mp(CHUNK, flag, [xs], True)
    assert total.item() == 0 and per_tensor.abs().sum().item() == 0


def test_l2norm_scale(amp_C, device, flag):
    xs = randn(SIZES, torch.float16, device)
    outs = [torch.empty_like(x, dtype=torch.float32) for x in xs]
    total, per_tensor = amp_C.multi_tensor_l2norm_scale(CHUNK, flag, [xs, outs], 0.5, True)
    assert_close(outs, [x.double() * 0.5 for x in xs])
    torch.testing.assert_close(per_tensor.double().cpu(), torch.stack([x.double().norm() for x in xs]).cpu(),
                               rtol=1e-5, atol=1e-6)


def test_unscale_l2norm(amp_C, device, flag):
    xs = randn(SIZES, torch.float32, device)
    before = [x.clone() for x in xs]
    inv_scale = torch.tensor([1 / 128.0], device=device)
    total, per_tensor = amp_C.multi_tensor_unscale_l2norm(CHUNK, flag, [xs], inv_scale, True)
    torch.testing.assert_close(per_tensor.double().cpu(), torch.stack([x.double().norm() / 128 for x in xs]).cpu(),
                               rtol=1e-5, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(xs, before))


# ---------------------------------------------------------------- optimizers
ADAM_DTYPES = [(torch.float32, torch.float32), (torch.float16, torch.float32), (torch.bfloat16, torch.float32),
               (torch.bfloat16, torch.bfloat16), (torch.float64, torch.float64)]


def adam_state(sizes, param_dtype, state_dtype, device):
    g = randn(sizes, param_dtype, device, seed=1)
    p = randn(sizes, param_dtype, device, seed=2)
    m = [x.abs().to(state_dtype) * 0.1 for x in randn(sizes, torch.float32, device, seed=3)]
    v = [x.abs().to(state_dtype) * 0.01 for x in randn(sizes, torch.float32, device, seed=4)]
    return g, p, m, v


@pytest.mark.parametrize("param_dtype,state_dtype", ADAM_DTYPES)
@pytest.mark.parametrize("mode", [0, 1])
def test_adam(amp_C, device, flag, param_dtype, state_dtype, mode):
    g, p, m, v = adam_state(SIZES, param_dtype, state_dtype, device)
    expected = ref.adam(g, p, m, v, 1e-2, 0.9, 0.999, 1e-8, 3, mode, True, 0.05)
    amp_C.multi_tensor_adam(CHUNK, flag, [g, p, m, v], 1e-2, 0.9, 0.999, 1e-8, 3, mode, 1, 0.05)
    assert_close(p, [e[0] for e in expected])
    assert_close(m, [e[1] for e in expected])
    assert_close(v, [e[2] for e in expected])


def test_adam_matches_torch_adamw(amp_C, device, flag):
    g, p, m, v = adam_state([5, 1000, CHUNK + 9], torch.float32, torch.float32, device)
    m, v = [torch.zeros_like(x) for x in p], [torch.zeros_like(x) for x in p]
    params = [x.clone().requires_grad_() for x in p]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    for step in (1, 2, 3):
        for q, gg in zip(params, g):
            q.grad = gg.clone()
        opt.step()
        amp_C.multi_tensor_adam(CHUNK, flag, [g, p, m, v], 1e-3, 0.9, 0.99, 1e-8, step, 1, 1, 0.1)
    assert_close(p, [q.detach() for q in params])


@pytest.mark.parametrize("param_dtype,state_dtype", ADAM_DTYPES[:4])
def test_adam_capturable(amp_C, device, flag, param_dtype, state_dtype):
    g, p, m, v = adam_state(SIZES, param_dtype, state_dtype, device)
    scaled = [x * 4 for x in g]
    expected = ref.adam(g, p, m, v, 1e-2, 0.9, 0.999, 1e-8, 2, 1, True, 0.01)
    lr = torch.tensor(1e-2, device=device)
    step = torch.tensor([2], dtype=torch.int32, device=device)
    inv_scale = torch.tensor([0.25], device=device)
    amp_C.multi_tensor_adam_capturable(CHUNK, flag, [scaled, p, m, v], lr, 0.9, 0.999, 1e-8, step, 1, 1, 0.01,
                                       inv_scale)
    assert_close(p, [e[0] for e in expected])
    assert_close(scaled, g)  # grads are unscaled in place
    # A set flag (amp found an overflow) skips the step.
    before = [x.clone() for x in p]
    flag.fill_(1)
    amp_C.multi_tensor_adam_capturable(CHUNK, flag, [scaled, p, m, v], lr, 0.9, 0.999, 1e-8, step, 1, 1, 0.01,
                                       inv_scale)
    assert all(torch.equal(a, b) for a, b in zip(p, before))


@pytest.mark.parametrize("param_dtype", [torch.float16, torch.bfloat16])
def test_adam_capturable_master(amp_C, device, flag, param_dtype):
    g, master, m, v = adam_state(SIZES, torch.float32, torch.float32, device)
    g = [x.to(param_dtype) for x in g]
    p = [x.to(param_dtype) for x in master]
    expected = ref.adam(g, master, m, v, 1e-3, 0.9, 0.999, 1e-8, 1, 0, True, 0.01)
    one = torch.ones(1, device=device)
    amp_C.multi_tensor_adam_capturable_master(CHUNK, flag, [g, p, m, v, master], one * 1e-3, 0.9, 0.999, 1e-8,
                                              one, 0, 1, 0.01, one)
    assert_close(master, [e[0] for e in expected])
    assert_close(p, [e[0] for e in expected])


@pytest.mark.parametrize("momentum,nesterov,first_run,wd_after", [(0.0, False, False, False), (0.9, False, True, False),
                                                                   (0.9, True, False, True), (0.9, False, False, False)])
def test_sgd(amp_C, device, flag, momentum, nesterov, first_run, wd_after):
    g, w, mom, _ = adam_state(SIZES, torch.float32, torch.float32, device)
    expected = ref.sgd(g, w, mom, 1e-4, momentum, 0.1, 0.05, nesterov, first_run, wd_after, 0.5)
    amp_C.multi_tensor_sgd(CHUNK, flag, [g, w, mom], 1e-4, momentum, 0.1, 0.05, nesterov, first_run, wd_after, 0.5)
    assert_close(w, [e[0] for e in expected])
    if momentum:
        assert_close(mom, [e[1] for e in expected])


@pytest.mark.parametrize("grad_dtype,out_dtype", [(torch.float16, torch.float16), (torch.float32, torch.bfloat16)])
def test_sgd_mixed_precision_copy(amp_C, device, flag, grad_dtype, out_dtype):
    g, w, mom, _ = adam_state(SIZES, torch.float32, torch.float32, device)
    g = [x.to(grad_dtype) for x in g]
    out = [torch.empty_like(x, dtype=out_dtype) for x in w]
    expected = ref.sgd(g, w, mom, 0.0, 0.9, 0.0, 0.1, False, False, False, 1.0)
    amp_C.multi_tensor_sgd(CHUNK, flag, [g, w, mom, out], 0.0, 0.9, 0.0, 0.1, False, False, False, 1.0)
    assert_close(w, [e[0] for e in expected])
    assert_close(out, [e[0] for e in expected])
    before = [x.clone() for x in w]
    flag.fill_(1)  # skipped while the flag is set
    amp_C.multi_tensor_sgd(CHUNK, flag, [g, w, mom, out], 0.0, 0.9, 0.0, 0.1, False, False, False, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(w, before))


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("use_nvlamb", [False, True])
def test_lamb(amp_C, device, flag, mode, use_nvlamb):
    g, p, m, v = adam_state(SIZES[:5], torch.float32, torch.float32, device)
    gnorm = torch.stack([x.norm() for x in g]).norm()
    expected = ref.lamb(g, p, m, v, 1e-2, 0.9, 0.999, 1e-6, 2, True, 0.01, True, mode, gnorm.item(), 1.0, use_nvlamb)
    amp_C.multi_tensor_lamb(CHUNK, flag, [g, p, m, v], 1e-2, 0.9, 0.999, 1e-6, 2, 1, 0.01, 1, mode,
                            gnorm.reshape(1), 1.0, use_nvlamb)
    assert_close(m, [e[1] for e in expected])
    assert_close(p, [e[0] for e in expected])


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_lamb_mp(amp_C, device, flag, grad_dtype):
    g, p, m, v = adam_state(SIZES[:5], torch.float32, torch.float32, device)
    g = [(x * 8).to(grad_dtype) for x in g]
    out = [torch.empty_like(x, dtype=grad_dtype) for x in p]
    gnorm = torch.stack([x.double().norm() / 8 for x in g]).norm().float()
    expected = ref.lamb(g, p, m, v, 1e-2, 0.9, 0.999, 1e-6, 3, True, 0.01, True, 1, gnorm.item(), 0.5, False,
                        inv_scale=1 / 8)
    t = lambda x, dtype=torch.float32: torch.tensor([x], dtype=dtype, device=device)  # noqa: E731
    amp_C.multi_tensor_lamb_mp(CHUNK, flag, [g, p, m, v, out], t(1e-2), 0.9, 0.999, 1e-6, t(3, torch.int32), 1, 0.01,
                               1, 1, gnorm.reshape(1).to(device), t(0.5), False, t(0.0), t(1 / 8))
    assert_close(p, [e[0] for e in expected], torch.float32 if grad_dtype == torch.float32 else torch.bfloat16)
    assert_close(out, [e[0] for e in expected])
    before = [x.clone() for x in p]
    amp_C.multi_tensor_lamb_mp(CHUNK, flag, [g, p, m, v, out], t(1e-2), 0.9, 0.999, 1e-6, t(4, torch.int32), 1, 0.01,
                               1, 1, gnorm.reshape(1).to(device), t(0.5), False, t(1.0), t(1 / 8))
    assert all(torch.equal(a, b) for a, b in zip(p, before))  # found_inf skips the step


def test_lamb_two_stages(amp_C, device, flag):
    g, p, m, v = adam_state(SIZES[:5], torch.float32, torch.float32, device)
    updates = [torch.empty_like(x) for x in p]
    decay = torch.full((len(p),), 0.01, device=device)
    gnorm = torch.tensor([0.5], device=device)
    expected = ref.lamb(g, p, m, v, 1e-2, 0.9, 0.999, 1e-6, 4, True, 0.01, True, 1, 0.5, 1.0)
    amp_C.multi_tensor_lamb_stage1_cuda(CHUNK, flag, [g, p, m, v, updates], decay, 4, 0.9, 0.999, 1e-6, gnorm, 1.0)
    assert_close(updates, [e[3] for e in expected])
    _, p_norms = amp_C.multi_tensor_l2norm(CHUNK, flag, [p], True)
    _, u_norms = amp_C.multi_tensor_l2norm(CHUNK, flag, [updates], True)
    amp_C.multi_tensor_lamb_stage2_cuda(CHUNK, flag, [p, updates], p_norms, u_norms, 1e-2, 0.01, False)
    assert_close(p, [e[0] for e in expected])


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("bias_correction,grad_averaging", [(True, True), (False, False)])
@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_lamb_direction(amp_C, device, flag, mode, bias_correction, grad_averaging, grad_dtype):
    """LAMB's update direction alone: scaled grads clipped by their global norm, the moments, bias
    correction and weight decay, as in a whole LAMB step."""
    g, p, m, v = adam_state(SIZES[:5], torch.float32, torch.float32, device)
    g = [(x * 8).to(grad_dtype) for x in g]
    gnorm = torch.stack([x.double().norm() / 8 for x in g]).norm().float()  # of the unscaled grads, above 0.5
    expected = ref.lamb(g, p, m, v, 1e-2, 0.9, 0.999, 1e-6, 3, bias_correction, 0.01, grad_averaging, mode,
                        gnorm.item(), 0.5, inv_scale=1 / 8)
    updates = [torch.full_like(x, float("nan")) for x in p]
    t = lambda x: torch.tensor([x], dtype=torch.float32, device=device)  # noqa: E731
    amp_C.multi_tensor_lamb_direction(CHUNK, flag, [g, p, m, v, updates], 0.9, 0.999, 1e-6, t(3), int(bias_correction),
                                      0.01, int(grad_averaging), mode, gnorm.reshape(1).to(device), 0.5, t(1 / 8))
    assert_close(updates, [e[3] for e in expected])
    assert_close(m, [e[1] for e in expected])
    assert_close(v, [e[2] for e in expected])


def test_lamb_direction_over_the_grads(amp_C, device, flag):
    """Written over the grads (DistributedFusedLAMB's call), one step count per tensor, never clipped."""
    g, p, m, v = adam_state(SIZES[:4], torch.float32, torch.float32, device)
    steps = [1, 2, 5, 9]
    expected = [ref.lamb([g_], [p_], [m_], [v_], 1e-2, 0.9, 0.999, 1e-6, step, True, 0.01, True, 1, 1e30,
                         float("inf"))[0] for g_, p_, m_, v_, step in zip(g, p, m, v, steps)]
    one = torch.ones(1, device=device)
    amp_C.multi_tensor_lamb_direction(CHUNK, flag, [g, p, m, v, g], 0.9, 0.999, 1e-6,
                                      torch.tensor(steps, dtype=torch.float32, device=device), 1, 0.01, 1, 1, one * 1e30,
                                      float("inf"), one)
    assert_close(g, [e[3] for e in expected])
    assert_close(m, [e[1] for e in expected])


def test_lamb_direction_refuses_what_it_cannot_compute(amp_C, device, flag):
    g, p, m, v = adam_state(SIZES[:2], torch.float32, torch.float32, device)
    one = torch.ones(1, device=device)
    with pytest.raises(RuntimeError, match="max_grad_norm must be positive"):
        amp_C.multi_tensor_lamb_direction(CHUNK, flag, [g, p, m, v, g], 0.9, 0.999, 1e-6, one, 1, 0.0, 1, 1, one,
                                          0.0, one)
    with pytest.raises(RuntimeError, match="updates must be float32"):
        amp_C.multi_tensor_lamb_direction(CHUNK, flag, [g, p, m, v, [x.half() for x in g]], 0.9, 0.999, 1e-6, one, 1,
                                          0.0, 1, 1, one, 1.0, one)


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("norm_type", [0, 2])
def test_novograd(amp_C, device, flag, mode, norm_type):
    g, p, m, _ = adam_state(SIZES, torch.float32, torch.float32, device)
    norms = torch.rand(len(g), dtype=torch.float32, device=device)
    expected, expected_norms = ref.novograd(g, p, m, norms.cpu(), 1e-2, 0.95, 0.98, 1e-8, 5, True, 0.001, True, mode,
                                            norm_type)
    amp_C.multi_tensor_novograd(CHUNK, flag, [g, p, m], norms, 1e-2, 0.95, 0.98, 1e-8, 5, 1, 0.001, 1, mode, norm_type)
    torch.testing.assert_close(norms.double().cpu(), expected_norms, rtol=1e-5, atol=1e-6)
    assert_close(p, [e[0] for e in expected])
    assert_close(m, [e[1] for e in expected])


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("param_dtype,state_dtype", ADAM_DTYPES[:3])
def test_adagrad(amp_C, device, flag, mode, param_dtype, state_dtype):
    g, p, _, h = adam_state(SIZES, param_dtype, state_dtype, device)
    expected = ref.adagrad(g, p, h, 0.1, 1e-10, mode, 0.01)
    amp_C.multi_tensor_adagrad(CHUNK, flag, [g, p, h], 0.1, 1e-10, mode, 0.01)
    assert_close(p, [e[0] for e in expected])
    assert_close(h, [e[1] for e in expected])


def test_update_scale_hysteresis(amp_C, device):
    scale = torch.tensor([1024.0], device=device)
    growth = torch.zeros(1, dtype=torch.int32, device=device)
    hyst = torch.full((1,), 2, dtype=torch.int32, device=device)
    inf, ok = torch.ones(1, device=device), torch.zeros(1, device=device)

    def step(found_inf):
        amp_C.update_scale_hysteresis(scale, growth, hyst, found_inf, 2.0, 0.5, 3, 2)
        return scale.item(), growth.item(), hyst.item()

    assert step(inf) == (1024.0, 0, 1)  # first overflow tolerated
    assert step(inf) == (512.0, 0, 0)   # second backs off
    assert step(ok) == (512.0, 1, 2)
    assert step(ok) == (512.0, 2, 2)
    assert step(ok) == (1024.0, 0, 2)   # growth_interval clean steps
    scale.fill_(3e38)
    growth.fill_(2)
    assert step(ok)[0] == pytest.approx(3e38)  # never grows to inf


def test_dispatcher_op_and_applier(amp_C, device, flag):
    from apex.multi_tensor_apply import multi_tensor_applier

    xs = randn(SIZES, torch.float32, device)
    outs = [torch.empty_like(x) for x in xs]
    torch.ops.apex.multi_tensor_scale(CHUNK, flag, xs, outs, 2.0)
    assert all(torch.equal(o, x * 2) for x, o in zip(xs, outs))
    assert multi_tensor_applier.available
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [xs, outs], 4.0)
    assert all(torch.equal(o, x * 4) for x, o in zip(xs, outs))
