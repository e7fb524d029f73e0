"""Sigmoid focal loss (RetinaNet head, 91 real of 96 classes): apex.contrib.focal_loss beside the
same loss written in torch ops, eager and torch.compile, forward and forward+backward.

Bytes that must move: forward reads the logits and labels once; forward+backward reads them again
and writes the logits' gradient (3x logits, 2x labels). Timing: CUDA-graph replays of 10
back-to-back calls (device time). Target (issue 16): >= 85 % of copy bandwidth.

    python benchmarks/contrib/bench_focal_loss.py [--impls apex torch torch.compile] [--dtypes bf16 fp32]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from _side_by_side import compare, compiled, new_table, require_gpu

from apex.contrib.focal_loss import focal_loss

ANCHORS = 1_000_000
CLASSES, REAL_CLASSES = 96, 91
ALPHA, GAMMA = 0.25, 2.0
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # fp16 runs as bf16 does


def torch_focal_loss(logits, labels, num_positives):
    x = logits[:, :REAL_CLASSES].float()
    positive = labels.unsqueeze(1) == torch.arange(REAL_CLASSES, device=x.device)
    p = torch.sigmoid(x)
    bce = F.binary_cross_entropy_with_logits(x, positive.float(), reduction="none")
    factor = torch.where(positive, ALPHA * (1 - p) ** GAMMA, (1 - ALPHA) * p ** GAMMA)
    return (factor * bce).masked_fill((labels == -2).unsqueeze(1), 0).sum() / num_positives


def apex_focal_loss(logits, labels, num_positives):
    return focal_loss.focal_loss(logits, labels, num_positives, REAL_CLASSES, ALPHA, GAMMA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", nargs="+", default=["apex", "torch", "torch.compile"],
                        choices=["apex", "torch", "torch.compile"])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    args = parser.parse_args()
    require_gpu(__file__)
    table = new_table(f"focal loss, {ANCHORS} anchors x {CLASSES} classes")
    for name in args.dtypes:
        dtype = DTYPES[name]
        logits = torch.randn(ANCHORS, CLASSES, device="cuda", dtype=dtype, requires_grad=True)
        labels = torch.randint(-2, REAL_CLASSES, (ANCHORS,), device="cuda")
        num_positives = (labels >= 0).sum().float().reshape(1)
        makers = {"apex": lambda: apex_focal_loss, "torch": lambda: torch_focal_loss,
                  "torch.compile": lambda: compiled(torch_focal_loss)}
        impls = {impl: makers[impl]() for impl in args.impls}
        size = logits.numel() * logits.element_size() + labels.numel() * labels.element_size()
        compare(table, name, impls, (logits, labels, num_positives), size,
                3 * logits.numel() * logits.element_size() + 2 * labels.numel() * labels.element_size())
    table.print()


if __name__ == "__main__":
    main()
