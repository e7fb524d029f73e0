"""FusedNovoGrad against a plain-PyTorch NovoGrad written here from apex's definition."""
import math

import pytest
import torch
from optimizer_testing import DEVICES, DTYPES, compare_with_reference, float32_copies, make_params

from apex.optimizers import FusedNovoGrad


class NovoGradReference:
    """NovoGrad as apex computes it: one second moment per tensor, the running blend of
    the grad's L2 (norm_type=2) or max (norm_type=0) norm, kept unsquared."""

    def __init__(self, params, *, lr, betas, eps, weight_decay, reg_inside_moment=False, grad_averaging=True,
                 norm_type=2, init_zero=False, bias_correction=True):  # fmt: skip
        self.store_dtype = params[0].dtype
        self.params = float32_copies(params)
        self.exp_avgs = [torch.zeros_like(p) for p in self.params]
        self.norms = [None] * len(params)
        self.steps = [0] * len(params)
        self.lr, (self.beta1, self.beta2), self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.reg_inside_moment, self.grad_averaging = reg_inside_moment, grad_averaging
        self.ord, self.init_zero, self.bias_correction = {2: 2, 0: math.inf}[norm_type], init_zero, bias_correction

    def step(self, grads):
        beta3 = 1 - self.beta1 if self.grad_averaging else 1.0
        for index, grad in enumerate(grads):
            if grad is None:
                continue
            grad = grad.float()
            grad_norm = float(torch.linalg.vector_norm(grad, self.ord))
            norm = self.norms[index]
            if norm is None:
                norm = 0.0 if self.init_zero else grad_norm
            if self.ord == 2:
                norm = math.sqrt(self.beta2 * norm**2 + (1 - self.beta2) * grad_norm**2)
            else:
                norm = self.beta2 * norm + (1 - self.beta2) * grad_norm
            self.norms[index] = norm
            self.steps[index] += 1
            step, param = self.steps[index], self.params[index]
            bias1 = 1 - self.beta1**step if self.bias_correction else 1.0
            bias2 = math.sqrt(1 - self.beta2**step) if self.bias_correction else 1.0
            denom = norm / bias2 + self.eps
            if self.reg_inside_moment:
                m = self.exp_avgs[index] * self.beta1 + beta3 * (grad / denom + self.weight_decay * param)
                update = m / bias1
            else:
                m = self.exp_avgs[index] * self.beta1 + beta3 * grad
                update = (m / bias1) / denom + self.weight_decay * param
            self.exp_avgs[index] = m.to(self.store_dtype).float()
            self.params[index] = (param - self.lr * update).to(self.store_dtype).float()


HYPER = dict(lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_type", [2, 0])
def test_matches_reference(device, dtype, norm_type):
    params = make_params(dtype, device)
    optimizer = FusedNovoGrad(params, norm_type=norm_type, **HYPER)
    reference = NovoGradReference(params, norm_type=norm_type, **HYPER)
    compare_with_reference(optimizer, params, reference, late=True)
    assert optimizer.state[params[0]]["exp_avg_sq"].dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "options",
    [dict(reg_inside_moment=True), dict(init_zero=True), dict(grad_averaging=False, bias_correction=False)],
    ids=["reg_inside_moment", "init_zero", "no_averaging_no_bias_correction"],
)
def test_options_match_reference(device, options):
    params = make_params(torch.float32, device)
    optimizer = FusedNovoGrad(params, **HYPER, **options)
    compare_with_reference(optimizer, params, NovoGradReference(params, **HYPER, **options))
