"""index_mul_2d (in1[idx] * in2: per-edge features times gathered per-node features, as in
message-passing force fields): apex.contrib.index_mul_2d beside torch eager and torch.compile,
forward and forward+backward.

Bytes that must move, for in1 [nodes, F], in2 [edges, F], idx [edges]: forward reads in2, idx and
in1 (each gathered row once) and writes out; backward also reads grad_out, in2, in1 and idx and
writes grad_in2 and grad_in1. Timing: CUDA-graph replays of 10 back-to-back calls (device time).
Target (issue 16): >= 85 % of copy bandwidth.

Not counted, as no implementation must move them: apex's backward sorts the edges by node before
reducing them (csrc/index_mul_2d/index_mul_2d_cuda.cu), ~56 more bytes an edge (8-byte keys written,
a histogram read and two radix passes for up to 65536 nodes, the keys re-read), 14 % on top of the
392 bytes an edge of the bf16 backward at F = 64 (7 % at fp32).

    python benchmarks/contrib/bench_index_mul_2d.py [--impls apex torch torch.compile] [--dtypes bf16 fp32]
"""
from __future__ import annotations

import argparse

import torch

from _side_by_side import compare, compiled, new_table, require_gpu

from apex.contrib.index_mul_2d import index_mul_2d

NODES, EDGES, FEATURES = 50_000, 2_000_000, 64
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def torch_index_mul(in1, in2, idx):
    return in1[idx] * in2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impls", nargs="+", default=["apex", "torch", "torch.compile"],
                        choices=["apex", "torch", "torch.compile"])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    args = parser.parse_args()
    require_gpu(__file__)
    table = new_table(f"index_mul_2d, {NODES} nodes, {EDGES} edges, {FEATURES} features")
    for name in args.dtypes:
        dtype = DTYPES[name]
        in1 = torch.randn(NODES, FEATURES, device="cuda", dtype=dtype, requires_grad=True)
        in2 = torch.randn(EDGES, FEATURES, device="cuda", dtype=dtype, requires_grad=True)
        idx = torch.randint(0, NODES, (EDGES,), device="cuda")
        edge_bytes, node_bytes = in2.numel() * in2.element_size(), in1.numel() * in1.element_size()
        index_bytes = idx.numel() * idx.element_size()
        forward = 2 * edge_bytes + node_bytes + index_bytes
        backward = 3 * edge_bytes + 2 * node_bytes + index_bytes
        makers = {"apex": lambda: index_mul_2d, "torch": lambda: torch_index_mul,
                  "torch.compile": lambda: compiled(torch_index_mul)}
        impls = {impl: makers[impl]() for impl in args.impls}
        compare(table, name, impls, (in1, in2, idx), forward, forward + backward)
    table.print()


if __name__ == "__main__":
    main()
