"""A plain-PyTorch LAMB written from apex's definition: the reference of FusedLAMB and
FusedMixedPrecisionLamb."""
import math

import torch
from optimizer_testing import float32_copies


class LambReference:
    """LAMB as apex computes it: grads clipped by their global norm, Adam moments, then a
    per-tensor trust ratio ||param|| / ||update|| (tensors with weight decay, or all with
    use_nvlamb). Moments and the update are float32; params are stored in ``param_dtype`` (by
    default the params')."""

    def __init__(self, params, groups=None, *, lr, betas, eps, weight_decay, adam_w_mode=True,
                 grad_averaging=True, max_grad_norm=1.0, use_nvlamb=False, bias_correction=True,
                 param_dtype=None, step=0):  # fmt: skip
        self.param_dtype = param_dtype or params[0].dtype
        self.params = float32_copies(params)
        self.exp_avgs = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in self.params]
        self.steps = [step] * len(params)
        self.weight_decays = groups or [weight_decay] * len(params)
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.adam_w_mode, self.grad_averaging, self.max_grad_norm = adam_w_mode, grad_averaging, max_grad_norm
        self.use_nvlamb, self.bias_correction = use_nvlamb, bias_correction

    def step(self, grads):
        present = [g.float() for g in grads if g is not None]
        global_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in present))
        clip = global_norm / self.max_grad_norm if global_norm > self.max_grad_norm else 1.0
        beta3 = 1 - self.beta1 if self.grad_averaging else 1.0
        for index, grad in enumerate(grads):
            if grad is None:
                continue
            self.steps[index] += 1
            step, param, decay = self.steps[index], self.params[index], self.weight_decays[index]
            bias1 = 1 - self.beta1**step if self.bias_correction else 1.0
            bias2 = 1 - self.beta2**step if self.bias_correction else 1.0
            grad = grad.float() / clip
            if not self.adam_w_mode:
                grad = grad + decay * param
            m = self.exp_avgs[index] = self.exp_avgs[index] * self.beta1 + beta3 * grad
            v = self.exp_avg_sqs[index] = self.exp_avg_sqs[index] * self.beta2 + (1 - self.beta2) * grad * grad
            update = (m / bias1) / ((v / bias2).sqrt() + self.eps)
            if self.adam_w_mode:
                update = update + decay * param
            ratio = self.lr
            if self.use_nvlamb or decay != 0:
                param_norm, update_norm = param.norm(), update.norm()
                if param_norm != 0 and update_norm != 0:
                    ratio = self.lr * float(param_norm / update_norm)
            self.params[index] = (param - ratio * update).to(self.param_dtype).float()
