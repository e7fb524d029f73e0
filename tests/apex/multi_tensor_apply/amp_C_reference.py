"""Plain-PyTorch float64 references of the amp_C kernels (apex's formulas, element by element)."""
import math

import torch


def f64(tensors):
    return [t.double() for t in tensors]


def adam(g, p, m, v, lr, beta1, beta2, eps, step, mode, bias_correction, wd):
    """One Adam (mode 0, L2) / AdamW (mode 1) step; returns new (p, m, v) in float64."""
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    out = []
    for g_, p_, m_, v_ in zip(f64(g), f64(p), f64(m), f64(v)):
        if mode == 0:
            g_ = g_ + wd * p_
        m_ = beta1 * m_ + (1 - beta1) * g_
        v_ = beta2 * v_ + (1 - beta2) * g_ * g_
        update = (m_ / bc1) / ((v_ / bc2).sqrt() + eps)
        if mode == 1:
            update = update + wd * p_
        out.append((p_ - lr * update, m_, v_))
    return out


def sgd(g, w, mom, wd, momentum, dampening, lr, nesterov, first_run, wd_after, scale):
    out = []
    for g_, w_, m_ in zip(f64(g), f64(w), f64(mom)):
        g_ = g_ * scale
        if wd != 0 and not wd_after:
            g_ = g_ + wd * w_
        if momentum != 0:
            m_ = g_ if first_run else m_ * momentum + (1 - dampening) * g_
            g_ = g_ + momentum * m_ if nesterov else m_
        if wd != 0 and wd_after:
            g_ = g_ + wd * w_
        out.append((w_ - lr * g_, m_))
    return out


def lamb(g, p, m, v, lr, beta1, beta2, eps, step, bias_correction, wd, grad_averaging, mode, global_norm,
         max_norm, use_nvlamb=False, inv_scale=1.0):
    """One LAMB step: returns (new p, m, v, update) per tensor in float64."""
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = 1 - beta2 ** step if bias_correction else 1.0
    beta3 = 1 - beta1 if grad_averaging else 1.0
    clip = global_norm / max_norm if global_norm > max_norm else 1.0
    out = []
    for g_, p_, m_, v_ in zip(f64(g), f64(p), f64(m), f64(v)):
        sg = g_ * inv_scale / clip
        if mode == 0:
            sg = sg + wd * p_
        m_ = m_ * beta1 + beta3 * sg
        v_ = v_ * beta2 + (1 - beta2) * sg * sg
        upd = (m_ / bc1) / ((v_ / bc2).sqrt() + eps)
        if mode == 1:
            upd = upd + wd * p_
        ratio = lr
        if use_nvlamb or wd != 0:
            pn, un = p_.norm().item(), upd.norm().item()
            if pn != 0 and un != 0:
                ratio = lr * pn / un
        out.append((p_ - ratio * upd, m_, v_, upd))
    return out


def novograd(g, p, m, norms, lr, beta1, beta2, eps, step, bias_correction, wd, grad_averaging, mode, norm_type):
    """Returns (new p, m per tensor, new per-tensor norms) in float64."""
    bc1 = 1 - beta1 ** step if bias_correction else 1.0
    bc2 = math.sqrt(1 - beta2 ** step) if bias_correction else 1.0
    beta3 = 1 - beta1 if grad_averaging else 1.0
    new_norms, out = [], []
    for g_, p_, m_, n_old in zip(f64(g), f64(p), f64(m), norms.double().tolist()):
        if norm_type == 2:
            n = math.sqrt(beta2 * n_old ** 2 + (1 - beta2) * float((g_ * g_).sum()))
        else:
            n = beta2 * n_old + (1 - beta2) * (float(g_.abs().max()) if g_.numel() else 0.0)
        new_norms.append(n)
        denom = n / bc2 + eps
        if mode == 0:
            m_ = beta1 * m_ + beta3 * (g_ / denom + wd * p_)
            p_ = p_ - lr * (m_ / bc1)
        else:
            m_ = beta1 * m_ + beta3 * g_
            p_ = p_ - lr * ((m_ / bc1) / denom + wd * p_)
        out.append((p_, m_))
    return out, torch.tensor(new_norms, dtype=torch.float64)


def adagrad(g, p, h, lr, eps, mode, wd):
    out = []
    for g_, p_, h_ in zip(f64(g), f64(p), f64(h)):
        if mode == 0:
            g_ = g_ + wd * p_
        h_ = h_ + g_ * g_
        upd = g_ / (h_.sqrt() + eps)
        if mode == 1:
            upd = upd + wd * p_
        out.append((p_ - lr * upd, h_))
    return out
