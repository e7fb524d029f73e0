"""Misuse of the fused optimizers raises a clear exception before any kernel runs."""
import pytest
import torch
from optimizer_testing import make_params

from apex.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad, FusedSGD

ALL_OPTIMIZERS = {
    "adam": lambda ps: FusedAdam(ps),
    "lamb": lambda ps: FusedLAMB(ps),
    "sgd": lambda ps: FusedSGD(ps, lr=0.1, momentum=0.9),
    "novograd": lambda ps: FusedNovoGrad(ps),
    "adagrad": lambda ps: FusedAdagrad(ps),
    "mixed_precision_lamb": lambda ps: FusedMixedPrecisionLamb(ps),
}


@pytest.mark.parametrize("name", ALL_OPTIMIZERS)
def test_group_mixing_devices_is_refused_at_step(name):
    # As NVIDIA apex: the optimizer is built, its step raises before any kernel ("meta" stands in for
    # a second device).
    params = [torch.zeros(3, requires_grad=True), torch.zeros(3, device="meta", requires_grad=True)]
    optimizer = ALL_OPTIMIZERS[name](params)
    for param in params:
        param.grad = torch.zeros_like(param)
    with pytest.raises(RuntimeError, match="not on the same device"):
        optimizer.step()


def test_group_edited_to_mix_devices_is_refused_at_step():
    params = make_params(torch.float32, "cpu", shapes=[(3,)])
    optimizer = FusedAdam(params)
    intruder = torch.zeros(3, device="meta", requires_grad=True)
    optimizer.param_groups[0]["params"].append(intruder)
    for param in [*params, intruder]:
        param.grad = torch.zeros_like(param)
    with pytest.raises(RuntimeError, match="not on the same device"):
        optimizer.step()


@pytest.mark.parametrize("name", ALL_OPTIMIZERS)
def test_sparse_grads_are_refused(name):
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse gradients"):
        ALL_OPTIMIZERS[name]([embedding.weight]).step()


@pytest.mark.parametrize("name", ALL_OPTIMIZERS)
def test_unsupported_param_dtype_is_refused(name):
    param = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    param.grad = torch.ones_like(param)
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        ALL_OPTIMIZERS[name]([param]).step()


@pytest.mark.parametrize("name", ALL_OPTIMIZERS)
def test_empty_param_list_is_refused(name):
    with pytest.raises(ValueError, match="empty parameter list"):
        ALL_OPTIMIZERS[name]([])


@pytest.mark.parametrize("name", ALL_OPTIMIZERS)
def test_step_without_grads_changes_nothing(name):
    params = make_params(torch.float32, "cpu", shapes=[(5,)])
    before = params[0].detach().clone()
    optimizer = ALL_OPTIMIZERS[name](params)
    optimizer.step()
    assert torch.equal(params[0], before) and not optimizer.state


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda ps: FusedAdam(ps, lr=-1.0), "Invalid learning rate"),
        (lambda ps: FusedAdam(ps, betas=(1.0, 0.999)), "Invalid beta parameter at index 0"),
        (lambda ps: FusedAdam(ps, eps=-1e-8), "Invalid epsilon"),
        (lambda ps: FusedLAMB(ps, weight_decay=-0.1), "Invalid weight_decay"),
        (lambda ps: FusedLAMB(ps, max_grad_norm=0.0), "Invalid max_grad_norm"),
        (lambda ps: FusedNovoGrad(ps, betas=(0.9, -0.1)), "Invalid beta parameter at index 1"),
        (lambda ps: FusedNovoGrad(ps, norm_type=1), "norm_type"),
        (lambda ps: FusedAdagrad(ps, lr=-0.1), "Invalid learning rate"),
        (lambda ps: FusedSGD(ps, lr=-0.1), "Invalid learning rate"),
        (lambda ps: FusedSGD(ps, lr=0.1, momentum=-0.5), "Invalid momentum"),
        (lambda ps: FusedSGD(ps, lr=0.1, nesterov=True), "Nesterov momentum requires"),
        (lambda ps: FusedMixedPrecisionLamb(ps, reduced_precision_dtype=torch.float64), "reduced_precision_dtype"),
        (lambda ps: FusedMixedPrecisionLamb(ps, step=-1), "Invalid step"),
    ],
)
def test_invalid_hyperparameters_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make(make_params(torch.float32, "cpu", shapes=[(3,)]))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda ps: FusedAdam(ps, amsgrad=True), "AMSGrad"),
        (lambda ps: FusedLAMB(ps, amsgrad=True), "AMSGrad"),
        (lambda ps: FusedNovoGrad(ps, amsgrad=True), "AMSGrad"),
        (lambda ps: FusedMixedPrecisionLamb(ps, amsgrad=True), "AMSGrad"),
        (lambda ps: FusedAdam(ps, master_weights=True), "only supported with the capturable"),
    ],
)
def test_unsupported_variants_are_refused(make, match):
    with pytest.raises(RuntimeError, match=match):
        make(make_params(torch.float32, "cpu", shapes=[(3,)]))


def test_sgd_without_lr_is_refused():
    with pytest.raises(ValueError, match="required optimization parameter lr"):
        FusedSGD(make_params(torch.float32, "cpu", shapes=[(3,)]))


def test_adam_old_step_arguments_are_refused():
    optimizer = FusedAdam(make_params(torch.float32, "cpu", shapes=[(3,)]))
    with pytest.raises(RuntimeError, match="call step\\(\\) with no arguments"):
        optimizer.step(scale=128.0)


def test_mixed_precision_lamb_needs_reduced_precision_dtype_for_16_bit_params():
    params = make_params(torch.bfloat16, "cpu", shapes=[(3,)])
    params[0].grad = torch.ones_like(params[0])
    with pytest.raises(TypeError, match="reduced_precision_dtype=torch.bfloat16"):
        FusedMixedPrecisionLamb(params).step()
