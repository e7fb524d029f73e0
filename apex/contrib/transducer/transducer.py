"""The RNN-T joint network's sum and the RNN-T loss (torch.ops.apex.transducer_*), as NVIDIA apex's
modules. Both handle packed lattices (rows of each sequence stored back to back, without padding)
and padded ones; both run on CUDA and CPU and trace under torch.compile."""
from __future__ import annotations

from typing import Optional

import torch

from apex._ops import ops

__all__ = ["TransducerJoint", "TransducerLoss"]


def _as_int(value) -> int:
    """A count given as an int or a 0-dim tensor (as NVIDIA apex's callers pass it; reading a CUDA
    tensor synchronises)."""
    return int(value.item()) if isinstance(value, torch.Tensor) else int(value)


class TransducerJoint(torch.nn.Module):
    """h[b, t, u] = f[b, t] + g[b, u], optionally ReLU'd and dropped out, over the lattice t < f_len[b],
    u < g_len[b].

    Args:
        pack_output: return ``[packed_batch, H]`` (the rows of each sequence back to back) instead of
            ``[B, T, U, H]`` with -1 in the rows past the lengths.
        relu: apply ReLU. dropout: apply dropout with ``dropout_prob`` (training only).
        opt, fwd_tile_size: NVIDIA apex's kernel choices; accepted and unused (one kernel here).
        probe_mask: keep the ReLU/dropout mask (uint8, h's shape) of each call in ``self.mask_probe``.

    With ReLU, no dropout and no probe, the forward writes only h: the backward recomputes the ReLU
    mask from f and g (kept for it instead of the mask), with the same result.
    """

    def __init__(self, pack_output: bool = False, relu: bool = False, dropout: bool = False, opt: int = 1,
                 fwd_tile_size: int = 4, dropout_prob: float = 0, probe_mask: bool = False):
        super().__init__()
        self.pack_output = pack_output
        self.relu = relu
        self.dropout = dropout
        self.dropout_prob = dropout_prob
        self.opt = opt
        self.fwd_tile_size = fwd_tile_size
        masked = relu or dropout
        self.mask_probe = [] if masked and probe_mask else None

    def forward(self, f: torch.Tensor, g: torch.Tensor, f_len: torch.Tensor, g_len: torch.Tensor,
                batch_offset: Optional[torch.Tensor] = None, packed_batch=0) -> torch.Tensor:
        """f [B, T, H], g [B, U, H] (same float dtype); f_len, g_len [B] int lengths (g_len counts
        the prediction steps, label length + 1). Packed: batch_offset = cumsum(f_len * g_len) and
        packed_batch = its last value."""
        if self.pack_output and (batch_offset is None or _as_int(packed_batch) == 0):
            raise ValueError("TransducerJoint: pack_output needs batch_offset and packed_batch")
        offset = batch_offset if self.pack_output else None
        dropout_prob = self.dropout_prob if self.dropout and self.training else 0.0
        h, mask = ops("transducer").transducer_joint_forward(
            f, g, f_len, g_len, offset, _as_int(packed_batch) if self.pack_output else 0, self.relu, dropout_prob,
            self.mask_probe is not None)
        if self.mask_probe is not None:
            self.mask_probe.append(mask)
        return h


class TransducerLoss(torch.nn.Module):
    """RNN-T loss: -log P(label | x) per sequence, from logits x over the lattice t < f_len[b],
    u <= y_len[b].

    Args:
        fuse_softmax_backward: NVIDIA apex's choice between its fused and unfused backward; the
            gradient is the same, always computed fused here.
        opt: accepted and unused (one kernel here).
        packed_input: x is ``[packed rows, V]`` (each sequence's f_len * (y_len + 1) rows back to
            back); forward then needs batch_offset = cumsum(f_len * (y_len + 1)) and max_f_len.
    """

    def __init__(self, fuse_softmax_backward: bool = True, opt: int = 1, packed_input: bool = False):
        super().__init__()
        self.fuse_softmax_backward = fuse_softmax_backward
        self.opt = opt
        self.packed_input = packed_input

    def forward(self, x: torch.Tensor, label: torch.Tensor, f_len: torch.Tensor, y_len: torch.Tensor, blank_idx: int,
                batch_offset: Optional[torch.Tensor] = None, max_f_len=None,
                debug_list: Optional[list] = None) -> torch.Tensor:
        """x [B, T, U, V] logits (softmax is part of the loss); label [B, U - 1] int; f_len, y_len [B]
        int (y_len: label lengths). Returns [B] losses in x's dtype, differentiable in x. An empty
        ``debug_list`` receives alpha and beta ([B, T, U] float32)."""
        if self.packed_input:
            if batch_offset is None or max_f_len is None:
                raise ValueError("TransducerLoss: packed_input needs batch_offset and max_f_len")
            offset, frames = batch_offset, _as_int(max_f_len)
        else:
            offset, frames = None, x.size(1)
        loss, alpha, beta, _ = ops("transducer").transducer_loss_forward(x, label, f_len, y_len, offset, frames,
                                                                         blank_idx)
        if debug_list == []:
            debug_list += [alpha, beta]
        return loss
