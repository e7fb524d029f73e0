"""apex.fused_dense (FusedDense; FusedDenseGeluDense with exact and tanh GELU) beside torch eager
(nn.Linear; nn.Linear + nn.GELU + nn.Linear), torch.compile of the same and the torch.matmul
ceiling, at GPT-class shapes: tokens x hidden, intermediate 4 x hidden, bf16 and fp16.

FusedDense is the up-projection hidden -> 4 hidden; FusedDenseGeluDense is hidden -> 4 hidden -> hidden.
"fwd" times forward calls on inputs and parameters that require grad (what training runs);
"fwd+bwd" adds backward of a given output gradient (parameter grads reset to None each call, so no
accumulation). Each timing is the median of batches of back-to-back calls between CUDA events, the
implementations and the ceiling (the same pass's GEMMs as plain torch.matmul calls) timed
interleaved, a batch of each in turn, so that GPU clock drift affects them alike
(gemm_bench.interleaved_ms).

    python benchmarks/dense/bench_fused_dense.py [--dtypes bf16 fp16] [--quick] [--shapes 4096x1024 8192x4096 16384x8192]
"""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.dense.gemm_bench import DTYPES, GemmTable, free_memory, linear_gemms, module_passes, parse_args  # noqa: E402

SHAPES = ["4096x1024", "8192x4096", "16384x8192"]  # tokens x hidden
QUICK_SHAPES = ["8192x4096", "16384x8192"]
CASES = ["dense", "gelu", "gelu-tanh"]


def implementations(case: str, hidden: int, dtype: torch.dtype):
    """(apex module, torch eager module with the same parameters, its GEMMs: (tokens, backward) -> list)."""
    from apex.fused_dense import FusedDense, FusedDenseGeluDense

    wide = 4 * hidden
    if case == "dense":
        apex_module = FusedDense(hidden, wide)
        eager = nn.Linear(hidden, wide)
        eager.load_state_dict(apex_module.state_dict())

        def gemms(tokens, backward):
            return linear_gemms(tokens, hidden, wide, backward)
    else:
        approximate = "tanh" if case == "gelu-tanh" else "none"
        apex_module = FusedDenseGeluDense(hidden, wide, hidden, approximate=approximate)
        eager = nn.Sequential(nn.Linear(hidden, wide), nn.GELU(approximate=approximate), nn.Linear(wide, hidden))
        with torch.no_grad():
            for linear, (w, b) in zip((eager[0], eager[2]), ((apex_module.weight1, apex_module.bias1),
                                                             (apex_module.weight2, apex_module.bias2))):
                linear.weight.copy_(w)
                linear.bias.copy_(b)

        def gemms(tokens, backward):
            return linear_gemms(tokens, hidden, wide, backward) + linear_gemms(tokens, wide, hidden, backward)
    return apex_module.to("cuda", dtype), eager.to("cuda", dtype), gemms


def main() -> None:
    args = parse_args(__doc__, "bench_fused_dense.py", SHAPES, QUICK_SHAPES, "tokens x hidden, e.g. 8192x4096",
                      cases={"nargs": "+", "default": CASES, "choices": CASES})
    started = time.perf_counter()
    table = GemmTable("apex.fused_dense vs torch (GEMM-bound)")
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        for shape in args.shapes:
            tokens, hidden = (int(v) for v in shape.split("x"))
            for case in args.cases:
                torch._dynamo.reset()  # a fresh compile per case (one code object would hit the recompile limit)
                apex_module, eager, gemms = implementations(case, hidden, dtype)
                impls = {"apex": apex_module, "torch eager": eager, "torch.compile": torch.compile(copy.deepcopy(eager))}
                x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, requires_grad=True)
                grad = torch.randn(tokens, hidden if case != "dense" else 4 * hidden, device="cuda", dtype=dtype)
                passes = {impl: module_passes(module, x, grad) for impl, module in impls.items()}
                for pass_name in ("fwd", "fwd+bwd"):
                    table.time(f"{case} {shape} {dtype_name}", pass_name,
                               {impl: calls[pass_name] for impl, calls in passes.items()},
                               gemms(tokens, backward=pass_name == "fwd+bwd"), dtype)
                del impls, passes, apex_module, eager, x, grad
                free_memory()
    table.print(started)


if __name__ == "__main__":
    main()
