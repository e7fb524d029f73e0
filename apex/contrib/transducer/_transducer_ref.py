"""Plain PyTorch references of the transducer joint and loss (slow, for tests), with NVIDIA apex's
signatures:

    alpha, beta, x_grad, loss = transducer_loss_reference(x, label, f_len, y_len, blank_idx, loss_grad)
    h, f_grad, g_grad = transducer_joint_reference(f, g, h_grad, f_len, g_len, pack_output, relu, dropout,
                                                   dropout_prob=0, mask=None)

The loss reference takes log_softmax in x's dtype and runs alpha/beta in float32 (float64 for float64
x), as NVIDIA apex does; x must require grad (x.grad is returned). The joint reference applies
dropout in place, as NVIDIA apex's does: with relu=True its backward raises autograd's in-place error."""
from __future__ import annotations

import torch

__all__ = ["transducer_loss_reference", "transducer_joint_reference"]


def _lattice_dp(logp_blank, logp_label, t_len, u_len, reverse):
    """alpha (or, reverse, beta) of one sequence: [t_len, u_len] from per-cell log-probabilities."""
    values = torch.full((t_len, u_len), float("-inf"), dtype=logp_blank.dtype)
    cells = [(t, u) for t in range(t_len) for u in range(u_len)]
    for t, u in (reversed(cells) if reverse else cells):
        if reverse:
            if t == t_len - 1 and u == u_len - 1:
                values[t, u] = logp_blank[t, u]
                continue
            terms = []
            if t + 1 < t_len:
                terms.append(values[t + 1, u] + logp_blank[t, u])
            if u + 1 < u_len:
                terms.append(values[t, u + 1] + logp_label[t, u])
        else:
            if t == 0 and u == 0:
                values[t, u] = 0.0
                continue
            terms = []
            if t > 0:
                terms.append(values[t - 1, u] + logp_blank[t - 1, u])
            if u > 0:
                terms.append(values[t, u - 1] + logp_label[t, u - 1])
        values[t, u] = torch.logsumexp(torch.stack(terms), 0)
    return values


def transducer_loss_reference(x, label, f_len, y_len, blank_idx, loss_grad):
    batch, frames, steps, _ = x.shape
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    x_log = torch.nn.functional.log_softmax(x, dim=-1)
    logp = x_log.detach().to(acc).cpu()
    alpha = torch.zeros(batch, frames, steps, dtype=acc)
    beta = torch.zeros(batch, frames, steps, dtype=acc)
    grad = torch.zeros_like(logp)
    for b in range(batch):
        t_len, u_len = int(f_len[b]), int(y_len[b]) + 1
        labels = label[b, : u_len - 1].long().cpu()
        blank = logp[b, :t_len, :u_len, blank_idx]
        along = torch.zeros(t_len, u_len, dtype=acc)
        along[:, : u_len - 1] = logp[b, :t_len, torch.arange(u_len - 1), labels]
        alpha[b, :t_len, :u_len] = _lattice_dp(blank, along, t_len, u_len, reverse=False)
        beta[b, :t_len, :u_len] = _lattice_dp(blank, along, t_len, u_len, reverse=True)
        # d(-log P)/d logp: minus the probability of the paths through each transition.
        start = alpha[b, :t_len, :u_len] - beta[b, 0, 0] + torch.log(loss_grad[b].to(acc).cpu())
        after_blank = torch.full((t_len, u_len), float("-inf"), dtype=acc)
        after_blank[: t_len - 1] = beta[b, 1:t_len, :u_len]
        after_blank[t_len - 1, u_len - 1] = 0.0
        grad[b, :t_len, :u_len, blank_idx] = -torch.exp(start + blank + after_blank)
        for u in range(u_len - 1):
            grad[b, :t_len, u, labels[u]] = -torch.exp(start[:, u] + along[:, u] + beta[b, :t_len, u + 1])
    x_log.backward(grad.to(x.device, x.dtype))
    loss = (-beta[:, 0, 0]).to(x.device, x.dtype)
    return alpha.to(x.device), beta.to(x.device), x.grad, loss


def transducer_joint_reference(f, g, h_grad, f_len, g_len, pack_output, relu, dropout, dropout_prob=0, mask=None):
    if dropout and mask is None:
        raise NotImplementedError("transducer_joint_reference: dropout needs the mask it used")
    h = f.unsqueeze(2) + g.unsqueeze(1)
    if relu:
        h = torch.relu(h)
    if dropout:
        # In place, as NVIDIA apex's reference: after a ReLU this overwrites the output ReLU saved for
        # its backward, so h.backward raises (NVIDIA apex's relu + dropout tests expect that failure).
        h *= mask
        h *= 1 / (1 - dropout_prob)
    h.backward(h_grad)
    h = h.detach()
    if not pack_output:
        for b in range(h.shape[0]):
            h[b, int(f_len[b]):] = -1
            h[b, :, int(g_len[b]):] = -1
        return h, f.grad, g.grad
    rows = [h[b, : int(f_len[b]), : int(g_len[b])].reshape(-1, h.shape[-1]) for b in range(h.shape[0])]
    return torch.cat(rows), f.grad, g.grad
