"""Plain-PyTorch optimizers written from the published definitions of the optimizers torch.optim
lacks (AdamP, BertAdam, RMSpropTF, LARS, Lamb): the references the fused ones are checked against.
Each is a for-loop over the params, as their authors wrote them; RoundedShadow runs them on
float32 copies."""
import math

import torch


class _Reference(torch.optim.Optimizer):
    def _params(self):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    yield group, param, param.grad, self.state[param]


class AdamPReference(_Reference):
    """AdamP (Heo et al. 2021), from the authors' code (clovaai/AdamP; Ascend's NpuFusedAdamP)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, delta=0.1, wd_ratio=0.1,
                 nesterov=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, delta=delta,
                                      wd_ratio=wd_ratio, nesterov=nesterov))

    @staticmethod
    def _cosine_similarity(x, y, eps):  # rows of x, y: |x.y| / ((||x|| + eps)(||y|| + eps))
        return (x * y).sum(dim=1).abs() / x.norm(dim=1).add(eps) / y.norm(dim=1).add(eps)

    def _projection(self, p, grad, perturb, delta, wd_ratio, eps):
        expand = [-1] + [1] * (p.dim() - 1)
        for view in (lambda x: x.reshape(x.size(0), -1), lambda x: x.reshape(1, -1)):
            if self._cosine_similarity(view(grad), view(p), eps).max() < delta / math.sqrt(view(p).size(1)):
                p_n = p / view(p).norm(dim=1).view(expand).add(eps)
                perturb = perturb - p_n * view(p_n * perturb).sum(dim=1).view(expand)
                return perturb, wd_ratio
        return perturb, 1.0

    @torch.no_grad()
    def step(self):
        for group, p, grad, state in self._params():
            beta1, beta2 = group["betas"]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            bias_correction1 = 1 - beta1 ** state["step"]
            bias_correction2 = 1 - beta2 ** state["step"]
            exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
            step_size = group["lr"] / bias_correction1
            if group["nesterov"]:
                perturb = (beta1 * exp_avg + (1 - beta1) * grad) / denom
            else:
                perturb = exp_avg / denom
            wd_ratio = 1.0
            if p.dim() > 1:
                perturb, wd_ratio = self._projection(p, grad, perturb, group["delta"], group["wd_ratio"], group["eps"])
            if group["weight_decay"] > 0:
                p.mul_(1 - group["lr"] * group["weight_decay"] * wd_ratio)
            p.add_(perturb, alpha=-step_size)


def _warmup_schedule(name, x, warmup):
    """pytorch-pretrained-BERT's schedules of x = progress through t_total."""
    if x < warmup:
        return x / warmup
    return {
        "warmup_linear": lambda: max((x - 1.0) / (warmup - 1.0), 0.0),
        "warmup_cosine": lambda: 0.5 * (1.0 + math.cos(math.pi * x)),
        "warmup_constant": lambda: 1.0,
        "warmup_poly": lambda: (1.0 - x) ** 0.5,
    }[name]()


class BertAdamReference(_Reference):
    """BertAdam (pytorch-pretrained-BERT), grads clipped by their norm over the group as Ascend's
    NpuFusedBertAdam does: no bias correction, decoupled decay, lr scheduled by the step count
    before its increment."""

    def __init__(self, params, lr, warmup=-1, t_total=-1, schedule="warmup_linear", b1=0.9, b2=0.99, e=1e-6,
                 weight_decay=0.01, max_grad_norm=-1):
        super().__init__(params, dict(lr=lr, warmup=warmup, t_total=t_total, schedule=schedule, b1=b1, b2=b2, e=e,
                                      weight_decay=weight_decay, max_grad_norm=max_grad_norm))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            grads = [p.grad for p in group["params"] if p.grad is not None]
            if group["max_grad_norm"] > 0 and grads:
                norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
                coefficient = group["max_grad_norm"] / (norm + 1e-6)
                if coefficient < 1:
                    for grad in grads:
                        grad.mul_(coefficient)
        for group, p, grad, state in self._params():
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["exp_avg"].mul_(group["b1"]).add_(grad, alpha=1 - group["b1"])
            state["exp_avg_sq"].mul_(group["b2"]).addcmul_(grad, grad, value=1 - group["b2"])
            update = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + group["e"])
            if group["weight_decay"] > 0.0:
                update += group["weight_decay"] * p
            lr = group["lr"]
            if group["t_total"] != -1:
                lr *= _warmup_schedule(group["schedule"], state["step"] / group["t_total"], group["warmup"])
            p.add_(update, alpha=-lr)
            state["step"] += 1


class RMSpropTFReference(_Reference):
    """RMSprop as TensorFlow computes it (timm's RMSpropTF)."""

    def __init__(self, params, lr=1e-2, alpha=0.9, eps=1e-10, weight_decay=0, momentum=0.0, centered=False,
                 decoupled_decay=False, lr_in_momentum=True):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, decoupled_decay=decoupled_decay,
                                      lr_in_momentum=lr_in_momentum))

    @torch.no_grad()
    def step(self):
        for group, p, grad, state in self._params():
            if not state:
                state["square_avg"] = torch.ones_like(p)  # TensorFlow starts at one
                if group["momentum"] > 0:
                    state["momentum_buffer"] = torch.zeros_like(p)
                if group["centered"]:
                    state["grad_avg"] = torch.zeros_like(p)
            square_avg = state["square_avg"]
            one_minus_alpha = 1.0 - group["alpha"]
            if group["weight_decay"] != 0:
                if group["decoupled_decay"]:
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
                else:
                    grad = grad.add(p, alpha=group["weight_decay"])
            square_avg.add_(grad.pow(2) - square_avg, alpha=one_minus_alpha)
            if group["centered"]:
                grad_avg = state["grad_avg"]
                grad_avg.add_(grad - grad_avg, alpha=one_minus_alpha)
                avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).add(group["eps"]).sqrt_()
            else:
                avg = square_avg.add(group["eps"]).sqrt_()
            if group["momentum"] > 0:
                buf = state["momentum_buffer"]
                if group["lr_in_momentum"]:
                    buf.mul_(group["momentum"]).addcdiv_(grad, avg, value=group["lr"])
                    p.add_(-buf)
                else:
                    buf.mul_(group["momentum"]).addcdiv_(grad, avg)
                    p.add_(buf, alpha=-group["lr"])
            else:
                p.addcdiv_(grad, avg, value=-group["lr"])


class LarsReference(_Reference):
    """LARS (You et al. 2017) with momentum, as ROCm apex writes it: the local lr is
    lr * eta * ||w|| / (||g|| + beta ||w|| + eps) (lr where a norm is 0), applied to g + beta w."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, trust_coefficient=0.001, eps=0.0,
                 nesterov=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps, nesterov=nesterov))

    @torch.no_grad()
    def step(self):
        for group, p, grad, state in self._params():
            weight_decay, momentum = group["weight_decay"], group["momentum"]
            w_norm, g_norm = p.norm(), grad.norm()
            local_lr = group["lr"]
            if w_norm > 0 and g_norm > 0:
                local_lr *= float(group["trust_coefficient"] * w_norm / (g_norm + w_norm * weight_decay + group["eps"]))
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            update = grad + weight_decay * p
            buf.mul_(momentum).add_(update, alpha=-local_lr)
            if group["nesterov"]:
                p.add_(buf * momentum - local_lr * update)
            else:
                p.add_(buf)


class LambFormula(_Reference):
    """Lamb (You et al. 2019) as pytorch-lamb writes it: no bias correction, ||p|| clamped to 10
    in the trust ratio, which applies to every tensor; the grads divided by their global norm
    when it exceeds 1 (use_global_grad_norm)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0, adam=False,
                 use_global_grad_norm=False):
        self.adam, self.use_global_grad_norm = adam, use_global_grad_norm
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        scale = 1.0
        if self.use_global_grad_norm:
            norm = math.sqrt(sum(float(g.pow(2).sum()) for _, _, g, _ in self._params()))
            scale = norm if norm > 1 else 1.0
        for group, p, grad, state in self._params():
            beta1, beta2 = group["betas"]
            grad = grad / scale
            if not state:
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            m = state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
            v = state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            update = m / (v.sqrt() + group["eps"]) + group["weight_decay"] * p
            weight_norm, update_norm = float(p.norm().clamp(0, 10)), float(update.norm())
            ratio = 1.0 if self.adam or weight_norm == 0 or update_norm == 0 else weight_norm / update_norm
            p.add_(update, alpha=-group["lr"] * ratio)
