"""The functions of NVIDIA apex's ``transducer_joint_cuda`` module:

    h, mask = forward(f, g, f_len, g_len, batch_offset, packed_batch, opt, pack_output, relu, dropout,
                      dropout_prob, tile_size)
    f_grad, g_grad = backward([h_grad] or [h_grad, mask], f_len, g_len, batch_offset, max_f_len, max_g_len,
                              pack_output, scale)

``opt`` and ``tile_size`` chose among NVIDIA apex's kernels; one kernel serves them all here."""
from __future__ import annotations

from apex._ops import ops

__all__ = ["forward", "backward"]


def forward(f, g, f_len, g_len, batch_offset, packed_batch, opt, pack_output, relu, dropout, dropout_prob,
            tile_size=4):
    return list(ops("transducer").transducer_joint_forward(
        f, g, f_len, g_len, batch_offset if pack_output else None, int(packed_batch) if pack_output else 0, relu,
        dropout_prob if dropout else 0.0))


def backward(inputs, f_len, g_len, batch_offset, max_f_len, max_g_len, pack_output, scale=1.0):
    mask = inputs[1] if len(inputs) > 1 else None
    return list(ops("transducer").transducer_joint_backward(
        inputs[0], mask, f_len, g_len, batch_offset if pack_output else None, max_f_len, max_g_len, scale))
