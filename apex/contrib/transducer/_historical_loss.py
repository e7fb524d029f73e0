"""The functions of NVIDIA apex's ``transducer_loss_cuda`` module, which take log-probabilities
(NVIDIA apex applied log_softmax before calling them):

    alpha, beta, loss = forward(x, label, f_len, y_len, batch_offset, max_f_len, blank_idx, opt, packed_input)
    x_grad = backward(x, loss_grad, alpha, beta, f_len, y_len, label, batch_offset, max_f_len, blank_idx, opt,
                      fuse_softmax_backward, packed_input)

The ops take logits; log-probabilities are logits too (their softmax is the same), so the results
agree. backward recomputes the per-row statistics these functions never passed along."""
from __future__ import annotations

from apex._ops import ops

__all__ = ["forward", "backward"]


def forward(x, label, f_len, y_len, batch_offset, max_f_len, blank_idx, opt=1, packed_input=False):
    loss, alpha, beta, _ = ops("transducer").transducer_loss_forward(
        x, label, f_len, y_len, batch_offset if packed_input else None, int(max_f_len), blank_idx)
    return [alpha, beta, loss]


def backward(x, loss_grad, alpha, beta, f_len, y_len, label, batch_offset, max_f_len, blank_idx, opt=1,
             fuse_softmax_backward=True, packed_input=False):
    library = ops("transducer")
    offset = batch_offset if packed_input else None
    _, _, _, stats = library.transducer_loss_forward(x, label, f_len, y_len, offset, int(max_f_len), blank_idx)
    return library.transducer_loss_backward(loss_grad, x, label, f_len, y_len, offset, int(max_f_len), blank_idx,
                                            alpha, beta, stats, fuse_softmax_backward)
