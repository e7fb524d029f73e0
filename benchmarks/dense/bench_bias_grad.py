"""The dense backward's elementwise pass alone: apex's fused_dense_activation_bias_grad (grad_input =
grad * activation'(saved) and grad_bias = its column sums, one pass; what mlp_backward and
FusedDenseGeluDense's backward run after their data-gradient GEMM) beside torch eager (the
activation's backward op, then grad_input.sum(0): two passes) and torch.compile of the same (one fused
reduction), as % of the measured copy bandwidth: the pass must read grad and saved and write
grad_input ("none": read grad, the bias gradient alone, against grad.sum(0), what a plain linear
layer's bias gradient costs).

Shapes are tokens x features of GPT-class MLPs (the 4 x hidden layer is the large one). Timings are
medians of batches between CUDA events, the implementations interleaved batch by batch
(gemm_bench.interleaved_ms).

    python benchmarks/dense/bench_bias_grad.py [--dtypes bf16 fp16] [--quick] [--shapes 8192x4096 8192x16384]
        [--activations none relu sigmoid gelu gelu_tanh]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import BandwidthTable, copy_bandwidth_gbs  # noqa: E402
from benchmarks.dense.gemm_bench import DTYPES, free_memory, interleaved_ms, parse_args  # noqa: E402

SHAPES = ["8192x4096", "8192x16384", "16384x8192", "16384x32768"]  # tokens x features
QUICK_SHAPES = ["8192x4096", "8192x16384"]
ACTIVATIONS = ["none", "relu", "sigmoid", "gelu", "gelu_tanh"]


def eager_pass(activation: str):
    """torch eager's backward at the activation: its backward op (from what autograd saves), then the sum."""
    def backward(grad, saved):
        if activation == "relu":
            grad_input = torch.ops.aten.threshold_backward(grad, saved, 0)
        elif activation == "sigmoid":
            grad_input = torch.ops.aten.sigmoid_backward(grad, saved)
        else:
            approximate = "tanh" if activation == "gelu_tanh" else "none"
            grad_input = torch.ops.aten.gelu_backward(grad, saved, approximate=approximate)
        return grad_input, grad_input.sum(0)

    return backward if activation != "none" else (lambda grad, saved: grad.sum(0))


def main() -> None:
    args = parse_args(__doc__, "bench_bias_grad.py", SHAPES, QUICK_SHAPES, "tokens x features, e.g. 8192x16384",
                      activations={"nargs": "+", "default": ACTIVATIONS, "choices": ACTIVATIONS})
    from apex._ops import ops

    op = ops("fused_dense").fused_dense_activation_bias_grad
    started = time.perf_counter()
    table = BandwidthTable("activation + bias gradient pass", copy_bandwidth_gbs())
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        for shape in args.shapes:
            tokens, features = (int(v) for v in shape.split("x"))
            grad = torch.randn(tokens, features, device="cuda", dtype=dtype)
            saved = torch.randn(tokens, features, device="cuda", dtype=dtype)
            element = torch.finfo(dtype).bits // 8
            for activation in args.activations:
                torch._dynamo.reset()  # a fresh compile per case (one code object would hit the recompile limit)
                stored = {"relu": torch.relu, "sigmoid": torch.sigmoid}.get(activation, lambda t: t)(saved)
                sum_only = activation == "none"
                apex_saved, mask = (None, [False, True]) if sum_only else (stored, [True, True])
                eager = eager_pass(activation)
                compiled = torch.compile(eager)
                times = interleaved_ms({"apex": lambda: op(grad, apex_saved, activation, mask),
                                        "torch eager": lambda: eager(grad, stored),
                                        "torch.compile": lambda: compiled(grad, stored)})
                # Bytes that must move: grad (and saved, grad_input) once, and the bias gradient.
                moved = (1 if sum_only else 3) * tokens * features * element + features * element
                for impl, ms in times.items():
                    table.add(f"{activation} {shape} {dtype_name}", impl, ms, moved)
                del compiled, stored, apex_saved
            del grad, saved
            free_memory()
    table.print()
    print(f"(ran {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
