"""LARC: layer-wise adaptive rate control wrapped around any torch optimizer."""
from __future__ import annotations

import torch


class LARC:
    r"""Wraps ``optimizer`` so each parameter's gradient is rescaled by a local learning
    rate before ``optimizer.step()`` (You et al., "Large Batch Training of Convolutional
    Networks"; NVIDIA apex's LARC):

        local_lr = trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps)
        g <- (g + weight_decay * p) * (min(local_lr / lr, 1) if clip else local_lr)

    Parameters whose weight or gradient norm is zero keep their gradient (and get no
    weight decay). Weight decay is applied here, so the wrapped optimizer's
    ``weight_decay`` is set to 0 during its step and restored afterwards. Everything
    else (``param_groups``, ``state``, ``state_dict``, ``zero_grad``) is the wrapped
    optimizer's. The norms are computed without synchronizing the host.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, trust_coefficient: float = 0.02, clip: bool = True,
                 eps: float = 1e-8):
        self.optim = optimizer
        self.trust_coefficient = trust_coefficient
        self.eps = eps
        self.clip = clip

    def __getstate__(self):
        return self.optim.__getstate__()

    def __setstate__(self, state):
        self.optim.__setstate__(state)

    def __repr__(self):
        return f"LARC(trust_coefficient={self.trust_coefficient}, clip={self.clip}, eps={self.eps}, {self.optim!r})"

    @property
    def state(self):
        return self.optim.state

    @property
    def param_groups(self):
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optim.param_groups = value

    def state_dict(self):
        return self.optim.state_dict()

    def load_state_dict(self, state_dict):
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True):
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group):
        self.optim.add_param_group(param_group)

    @torch.no_grad()
    def _rescale_gradients(self, group, weight_decay: float) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        param_norms = torch._foreach_norm(params)
        grad_norms = torch._foreach_norm(grads)
        for p, g, p_norm, g_norm in zip(params, grads, param_norms, grad_norms):
            local_lr = self.trust_coefficient * p_norm / (g_norm + p_norm * weight_decay + self.eps)
            if self.clip:
                local_lr = torch.clamp(local_lr / group["lr"], max=1.0)
            active = (p_norm != 0) & (g_norm != 0)
            scale = torch.where(active, local_lr, torch.ones_like(local_lr)).to(g.dtype)
            decay = torch.where(active, weight_decay, 0.0).to(g.dtype)
            g.add_(p * decay).mul_(scale)

    def step(self):
        weight_decays = []
        for group in self.optim.param_groups:
            weight_decays.append(group.get("weight_decay", 0))
            group["weight_decay"] = 0
        try:
            for group, weight_decay in zip(self.optim.param_groups, weight_decays):
                self._rescale_gradients(group, weight_decay)
            return self.optim.step()
        finally:
            for group, weight_decay in zip(self.optim.param_groups, weight_decays):
                group["weight_decay"] = weight_decay
