"""Softmax cross entropy (mean loss) of bf16 logits: apex.contrib.xentropy beside torch's
F.cross_entropy, eager and torch.compile, forward and forward+backward.

Bytes that must move: forward reads the logits once (rows x classes x 2 bytes; the per-row outputs
are negligible); forward+backward also reads them again and writes their gradient (3x). Timing:
CUDA-graph replays of 10 back-to-back calls (device time). Targets (issue 16): >= 90 % of copy
bandwidth both ways at 8192x128256 and 16384x32000.

    python benchmarks/contrib/bench_xentropy.py [--impls apex,torch,torch.compile]

--impls times only the named implementations (`--impls apex` to compare apex builds, without the
torch rows).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from _side_by_side import compare, compiled, new_table, require_gpu

from apex.contrib.xentropy import softmax_cross_entropy

SHAPES = [(8192, 128256), (16384, 32000), (4096, 256000)]
SMOOTHING = 0.1


def torch_loss(logits, labels):
    return F.cross_entropy(logits, labels, label_smoothing=SMOOTHING)


def apex_loss(logits, labels):
    return softmax_cross_entropy(logits, labels, smoothing=SMOOTHING, reduction="mean")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default="apex,torch,torch.compile", help="comma-separated: apex, torch, torch.compile")
    names = parser.parse_args().impls.split(",")
    require_gpu(__file__)
    table = new_table("softmax cross entropy, mean, bf16 logits, label smoothing 0.1")
    for rows, classes in SHAPES:
        logits = torch.randn(rows, classes, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, classes, (rows,), device="cuda")
        makers = {"apex": lambda: apex_loss, "torch": lambda: torch_loss, "torch.compile": lambda: compiled(torch_loss)}
        impls = {name: makers[name]() for name in names}
        size = rows * classes * logits.element_size()
        compare(table, f"{rows}x{classes}", impls, (logits, labels), size, 3 * size)
        del logits
        torch.cuda.empty_cache()
    table.print()


if __name__ == "__main__":
    main()
