"""RNN-T joint and loss: apex.contrib.transducer beside torch composites, eager and torch.compile,
forward and forward+backward. Joint: relu(f[:, :, None] + g[:, None]). Loss: torch has no RNN-T
loss, and a composite's lattice recursion (T + U dependent steps) is slower still, so the loss is
compared with the part every composite needs before it: log_softmax over the logits and the
gathers of the blank and label log-probabilities (a lower bound on any composite's time).

Bytes that must move: joint forward writes h ([B, T, U, H]) and reads f and g; its backward reads
h_grad and writes f_grad and g_grad. Loss forward reads the logits [B, T, U, V] once; its backward
reads them again and writes their gradient. Timing: CUDA-graph replays of 10 back-to-back calls
(device time). Target (issue 16): at least torch's composite.

    python benchmarks/contrib/bench_transducer.py
"""
from __future__ import annotations

import torch

from _side_by_side import compare, compiled, new_table, require_gpu

from apex.contrib.transducer import TransducerJoint, TransducerLoss

B, T, U, H, V = 16, 200, 50, 512, 1024


def torch_joint(f, g):
    return torch.relu(f.unsqueeze(2) + g.unsqueeze(1))


def torch_loss_terms(x, label):
    """What a composite RNN-T loss must compute over the logits before its lattice recursion:
    log_softmax and the blank / label log-probabilities."""
    logp = torch.log_softmax(x.float(), dim=-1)
    blank = logp[..., V - 1]
    labels = logp[:, :, :-1].gather(-1, label[:, None, :, None].expand(-1, T, -1, 1).long()).squeeze(-1)
    return blank.sum() + labels.sum()


def main() -> None:
    require_gpu(__file__)
    table = new_table(f"transducer, B={B} T={T} U={U} H={H} V={V}, fp16")
    f = torch.randn(B, T, H, device="cuda", dtype=torch.float16, requires_grad=True)
    g = torch.randn(B, U, H, device="cuda", dtype=torch.float16, requires_grad=True)
    f_len = torch.full((B,), T, dtype=torch.int32, device="cuda")
    g_len = torch.full((B,), U, dtype=torch.int32, device="cuda")
    joint = TransducerJoint(relu=True)
    h_bytes = B * T * U * H * 2
    compare(table, "joint", {"apex": lambda f, g: joint(f, g, f_len, g_len), "torch": torch_joint,
                             "torch.compile": compiled(torch_joint)},
            (f, g), h_bytes + (B * T + B * U) * H * 2, 2 * h_bytes + 2 * (B * T + B * U) * H * 2)
    del f, g
    x = torch.randn(B, T, U, V, device="cuda", dtype=torch.float16, requires_grad=True)
    label = torch.randint(0, V - 1, (B, U - 1), dtype=torch.int32, device="cuda")
    y_len = torch.full((B,), U - 1, dtype=torch.int32, device="cuda")
    loss = TransducerLoss()
    x_bytes = x.numel() * 2
    compare(table, "loss", {"apex": lambda x, label: loss(x, label, f_len, y_len, V - 1).sum(),
                            "torch lsm+gathers": torch_loss_terms,
                            "torch.compile": compiled(torch_loss_terms)},
            (x, label), x_bytes, 3 * x_bytes)
    table.print()


if __name__ == "__main__":
    main()
