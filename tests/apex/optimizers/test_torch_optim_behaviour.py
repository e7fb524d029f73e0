"""Fused optimizers behave like torch.optim where scripts rely on it: any param/grad strides
(no copy where layouts match), replaced or reset state is what the next step uses and
state_dict() saves, one validation of hyperparameters with torch.optim's messages, duplicate
params updated as torch.optim's for-loop updates them."""
import inspect

import pytest
import torch
from all_optimizers import FACTORIES, TORCH_COUNTERPARTS
from optimizer_testing import DEVICES, grads_at, make_params, set_grads

from apex import optimizers


def twins(name, device, shapes, seed=0):
    """(apex params, apex optimizer, torch params, torch optimizer) starting from the same values."""
    params = make_params(torch.float32, device, seed=seed, shapes=shapes)
    twin = [p.detach().clone().requires_grad_() for p in params]
    return params, FACTORIES[name](params), twin, TORCH_COUNTERPARTS[name](twin)


def fresh_state(name, param):
    """The state torch.optim's counterpart gives a param it has not stepped yet: empty for those that
    create state on a param's first step. torch.optim.Adagrad fills it in its constructor, and in
    torch 2.11 only there (2.13 also on the first step), so a reset to {} fails there with
    KeyError: 'sum'."""
    stand_in = param.detach().clone().requires_grad_()
    return dict(TORCH_COUNTERPARTS[name]([stand_in]).state[stand_in])


def assert_same(params, expected):
    for param, other in zip(params, expected):
        torch.testing.assert_close(param.detach(), other.detach(), rtol=5e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["adam", "sgd", "rmsprop"])
def test_any_grad_layout(device, name):
    """A channels-last grad of a contiguous conv weight, a transposed grad, a grad that is a strided view."""
    shapes = [(8, 4, 3, 3), (6, 10), (5, 9)]
    params, optimizer, twin, reference = twins(name, device, shapes)
    for step in range(4):
        grads = grads_at(step, params)
        base = torch.randn(5, 18, generator=torch.Generator().manual_seed(step)).to(device)
        odd = [grads[0].contiguous(memory_format=torch.channels_last), grads[1].t().contiguous().t(), base[:, ::2]]
        assert not odd[0].is_contiguous() and not odd[1].is_contiguous() and not odd[2].is_contiguous()
        set_grads(params, odd)
        set_grads(twin, [g.clone() for g in odd])
        optimizer.step()
        reference.step()
    assert_same(params, twin)


def copies_of(shape, optimizer):
    """The copies a step makes of tensors shaped `shape` (the profiler's record of aten::copy_)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profile:
        optimizer.step()
    return [e for e in profile.events() if e.name == "aten::copy_" and list(shape) in e.input_shapes]


@pytest.mark.parametrize("name", ["adam", "sgd", "adadelta"])
def test_matching_layouts_are_not_copied(name):
    """Params, grads and state laid out alike (channels-last all through, here) take no copy."""
    params, optimizer, _, _ = twins(name, "cpu", [(8, 4, 3, 3)])
    with torch.no_grad():
        params[0].data = params[0].contiguous(memory_format=torch.channels_last)
    set_grads(params, [grads_at(0, params)[0].contiguous(memory_format=torch.channels_last)])
    optimizer.step()  # state created in the params' layout
    assert not copies_of(params[0].shape, optimizer)
    set_grads(params, [grads_at(1, params)[0].contiguous()])  # now the grad differs: copied
    assert copies_of(params[0].shape, optimizer)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(TORCH_COUNTERPARTS))
def test_replaced_and_reset_state_is_used_and_saved(device, name):
    params, optimizer, twin, reference = twins(name, device, [(12, 5), (7,), (3, 3)])

    def steps(first, last):
        for step in range(first, last):
            set_grads(params, grads_at(step, params))
            set_grads(twin, grads_at(step, twin))
            optimizer.step()
            reference.step()

    steps(0, 3)
    optimizer.state[params[1]] = {}  # reset: starts over, as torch.optim does
    reference.state[twin[1]] = fresh_state(name, twin[1])
    steps(3, 5)
    key = next(k for k, v in optimizer.state[params[0]].items() if k != "step" and v.shape == params[0].shape)
    replacement = torch.full_like(optimizer.state[params[0]][key], 0.25)
    optimizer.state[params[0]][key] = replacement  # replaced: the kernel must use the new tensor
    reference.state[twin[0]][key] = replacement.clone().to(reference.state[twin[0]][key].dtype)
    steps(5, 7)
    assert optimizer.state[params[0]][key] is replacement
    assert_same(params, twin)
    saved, expected = optimizer.state_dict()["state"], reference.state_dict()["state"]
    for index in expected:
        for k, value in expected[index].items():
            if k == "step":
                assert float(saved[index][k]) == float(value)
            elif isinstance(value, torch.Tensor):
                torch.testing.assert_close(saved[index][k].float(), value.float(), rtol=5e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(optimizers.__all__))
def test_nan_lr_is_refused_everywhere(name):
    cls = getattr(optimizers, name)
    params = make_params(torch.float32, "cpu", shapes=[(3,)])
    with pytest.raises(ValueError, match="Invalid learning rate: nan"):
        cls(params, lr=float("nan"))


@pytest.mark.parametrize("name", sorted(optimizers.__all__))
def test_negative_lr_is_refused(name):
    with pytest.raises(ValueError, match="Invalid learning rate"):
        getattr(optimizers, name)(make_params(torch.float32, "cpu", shapes=[(3,)]), lr=-1.0)


def test_every_optimizer_is_covered():
    """Each public optimizer class is exercised by all_optimizers (or is an alias/subclass of one)."""
    built = {type(f(make_params(torch.float32, "cpu", shapes=[(2,)]))) for f in FACTORIES.values()}
    for name in optimizers.__all__:
        cls = getattr(optimizers, name)
        assert inspect.isclass(cls) and (cls in built or any(issubclass(cls, b) or issubclass(b, cls) for b in built)
                                         or cls is optimizers.Lamb), name


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_duplicate_params_warn_and_update_like_torch(name):
    """torch.optim warns about a param listed twice in a group; its for-loop then updates it twice."""
    params, _, twin, _ = twins(name, "cpu", [(6,), (4,)])
    factory = {"adam": lambda ps: optimizers.FusedAdam(ps, lr=1e-3, weight_decay=0.01),
               "sgd": lambda ps: optimizers.FusedSGD(ps, lr=0.05)}[name]
    reference_factory = {"adam": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=False),
                         "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, foreach=False)}[name]
    with pytest.warns(UserWarning, match="duplicate parameters"):
        optimizer = factory([params[0], params[1], params[0]])
    with pytest.warns(UserWarning, match="duplicate parameters"):
        reference = reference_factory([twin[0], twin[1], twin[0]])
    for step in range(3):
        set_grads(params, grads_at(step, params))
        set_grads(twin, grads_at(step, twin))
        optimizer.step()
        reference.step()
    assert_same(params, twin)
