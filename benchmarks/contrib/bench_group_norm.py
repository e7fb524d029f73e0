"""GroupNorm + SiLU on channels_last (NHWC) data: apex.contrib.group_norm beside torch's
F.group_norm (+ F.silu) on the same channels_last tensors, eager and torch.compile, forward and
forward+backward; one NCHW row for comparison.

Bytes that must move: forward reads x and writes y (2 passes of x's bytes); backward reads x and
dy and writes dx (3 more). Parameter traffic is O(C), ignored. Timing: CUDA-graph replays of 10
back-to-back calls (device time). Target (issue 16): >= 85 % of copy bandwidth on NHWC.

    python benchmarks/contrib/bench_group_norm.py [--impls apex,torch,torch.compile]

--impls times only the named implementations (an A/B of apex kernel variants, one process per
variant, needs no torch rows: `--impls apex`).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from _side_by_side import compare, compiled, new_table, require_gpu

from apex.contrib.group_norm import group_norm

# (dtype, layout, N, C, H, W, groups): Stable-Diffusion UNet blocks at 64x64 latents, batch 16, over
# the block sizes, and NCHW once (few cases: each costs a torch.compile; fp16 runs as bf16 does).
CASES = [("bf16", "nhwc", 16, 320, 64, 64, 32), ("bf16", "nhwc", 16, 640, 32, 32, 32),
         ("fp16", "nhwc", 16, 1280, 16, 16, 32), ("bf16", "nchw", 16, 320, 64, 64, 32)]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
LAYOUTS = {"nhwc": torch.channels_last, "nchw": torch.contiguous_format}


def make_impls(groups, names):
    def torch_gn(x, w, b):  # torch's group_norm wants parameters in the input's dtype (an O(C) cast)
        return F.silu(F.group_norm(x, groups, w.to(x.dtype), b.to(x.dtype), 1e-5))

    def apex_gn(x, w, b):
        return group_norm(x, groups, w, b, 1e-5, "silu")

    impls = {"apex": lambda: apex_gn, "torch": lambda: torch_gn, "torch.compile": lambda: compiled(torch_gn)}
    return {name: impls[name]() for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default="apex,torch,torch.compile", help="comma-separated: apex, torch, torch.compile")
    names = parser.parse_args().impls.split(",")
    require_gpu(__file__)
    table = new_table("group norm + SiLU, fp32 weights")
    for name, layout, n, c, h, w, groups in CASES:
        x = torch.randn(n, c, h, w, device="cuda", dtype=DTYPES[name]).to(memory_format=LAYOUTS[layout])
        x.requires_grad_()
        weight = torch.randn(c, device="cuda", requires_grad=True)
        bias = torch.randn(c, device="cuda", requires_grad=True)
        size = x.numel() * x.element_size()
        compare(table, f"{name} {layout} {n}x{c}x{h}x{w}", make_impls(groups, names), (x, weight, bias), 2 * size, 5 * size)
    table.print()


if __name__ == "__main__":
    main()
