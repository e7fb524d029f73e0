"""What the GEMM-bound benchmarks (bench_fused_dense.py, bench_mlp.py, bench_wgrad.py) share.

Timing: batches of back-to-back calls between two CUDA events (host launch overhead overlaps the
previous calls' GPU work, as in training), the implementations of one case and its ceiling
*interleaved*: a batch of each in turn, round after round (each round starting one implementation
later), and each one's median batch. The GPU's clock drifts (heat, power) by more than the
elementwise work that separates the implementations (GEMM time moved 3-7 % between back-to-back
measurements on an H200); timed one after another, each would be measured at another clock, while
interleaved batches see the same drift. GEMM-bound work is judged in TFLOP/s against the *ceiling*:
the same pass's GEMMs (same shapes and operand layouts) done by plain ``torch.matmul`` calls back to
back, with no bias, activation or reduction. "% ceiling" is ceiling time / measured time; "x eager"
is torch eager time / measured time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import nn

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Run-to-run spread of a timing here (median of batches): differences within it are not misses.
_NOISE = 0.01
# The passes the issue sets targets for (forward alone is reported, not judged).
_JUDGED = ("fwd+bwd", "wgrad")


def parse_args(doc: str, script: str, shapes: list[str], quick_shapes: list[str], shape_help: str,
               **extra) -> argparse.Namespace:
    """--dtypes, --shapes, --quick (``quick_shapes`` unless --shapes names some) and ``extra`` (name ->
    add_argument keywords); exits cleanly, with one line, where no GPU is visible (nothing to time)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--shapes", nargs="+", help=f"{shape_help} (default: {' '.join(shapes)})")
    parser.add_argument("--quick", action="store_true",
                        help=f"only the shapes the targets are judged at: {' '.join(quick_shapes)}")
    for name, keywords in extra.items():
        parser.add_argument(f"--{name}", **keywords)
    args = parser.parse_args()
    if args.shapes is None:
        args.shapes = quick_shapes if args.quick else shapes
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA GPU visible; nothing to benchmark")
        sys.exit(0)
    return args


def _batch_ms(fn: Callable[[], object], calls: int, start: torch.cuda.Event, stop: torch.cuda.Event) -> float:
    """Milliseconds per call of ``calls`` back-to-back calls of ``fn`` between two events."""
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / calls


def interleaved_ms(fns: dict[str, Callable[[], object]], *, seconds: float = 0.05, rounds: int = 7) -> dict[str, float]:
    """Milliseconds per call of each of ``fns``: the median over ``rounds`` rounds, each timing one batch of
    every function in turn (about ``seconds`` each, at least one call), round r starting with the r-th
    function so that none always follows the same one. The first call of each (compilation, cuBLASLt's
    heuristics, allocator growth) is not timed; a second, timed alone, sizes its batches."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    calls = {name: max(1, int(seconds * 1e3 / max(_batch_ms(fn, 1, start, stop), 1e-3))) for name, fn in fns.items()}
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(_batch_ms(fns[name], calls[name], start, stop))
    return {name: statistics.median(times) for name, times in samples.items()}


@dataclass(frozen=True)
class Gemm:
    """out[m, n] = a[m, k] @ b[k, n] with a and b laid out as the pass has them (transposed views or not)."""

    m: int
    n: int
    k: int
    a_transposed: bool = False
    b_transposed: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    def operands(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        def make(rows, cols, transposed):
            t = torch.randn((cols, rows) if transposed else (rows, cols), device="cuda", dtype=dtype)
            return t.t() if transposed else t

        return make(self.m, self.k, self.a_transposed), make(self.k, self.n, self.b_transposed)


def linear_gemms(tokens: int, in_features: int, out_features: int, backward: bool) -> list[Gemm]:
    """A linear layer's GEMMs: forward x @ W^T; backward dY @ W (input grad) and dY^T @ x (weight grad)."""
    gemms = [Gemm(tokens, out_features, in_features, b_transposed=True)]
    if backward:
        gemms += [Gemm(tokens, in_features, out_features), Gemm(out_features, in_features, tokens, a_transposed=True)]
    return gemms


def ceiling_call(gemms: Sequence[Gemm], dtype: torch.dtype) -> Callable[[], None]:
    """The GEMMs as plain torch.matmul calls, back to back (the call keeps its operands alive)."""
    operands = [g.operands(dtype) for g in gemms]

    def run():
        for a, b in operands:
            torch.matmul(a, b)

    return run


def module_passes(module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> dict[str, Callable[[], object]]:
    """{"fwd": forward on x, "fwd+bwd": forward and backward of ``grad``} for one module; parameter
    (and x) grads are reset to None each call, so nothing accumulates."""
    params = list(module.parameters())

    def forward_backward():
        for p in params:
            p.grad = None
        x.grad = None
        module(x).backward(grad)

    return {"fwd": lambda: module(x), "fwd+bwd": forward_backward}


@dataclass
class GemmTable:
    """Rows of (case, pass, impl, ms, flops, ceiling ms, torch eager ms), printed as TFLOP/s, % of the
    ceiling and speed-up over torch eager."""

    title: str
    rows: list[tuple[str, str, str, float, float, float, float]] = field(default_factory=list)

    def add(self, case: str, pass_: str, impl: str, ms: float, flops: float, ceiling: float, eager: float) -> None:
        self.rows.append((case, pass_, impl, ms, flops, ceiling, eager))

    def render(self) -> str:
        header = f"{'case':<34} {'pass':<8} {'impl':<16} {'ms':>9} {'TFLOP/s':>8} {'% ceiling':>9} {'x eager':>8}"
        lines = [f"## {self.title} ({torch.cuda.get_device_name()})", header, "-" * len(header)]
        for case, pass_, impl, ms, flops, ceiling, eager in self.rows:
            lines.append(f"{case:<34} {pass_:<8} {impl:<16} {ms:>9.3f} {flops / ms / 1e9:>8.1f} "
                         f"{100 * ceiling / ms:>8.1f}% {eager / ms:>7.2f}x")
        return "\n".join(lines)

    def time(self, case: str, pass_: str, calls: dict[str, Callable[[], object]], gemms: Sequence[Gemm],
             dtype: torch.dtype) -> None:
        """Times every implementation in ``calls`` (one of them "torch eager") and the ceiling of ``gemms``,
        interleaved (interleaved_ms)."""
        times = interleaved_ms({**calls, "torch.matmul": ceiling_call(gemms, dtype)})
        flops = sum(g.flops for g in gemms)
        for impl, ms in times.items():
            self.add(case, pass_, impl, ms, flops, times["torch.matmul"], times["torch eager"])

    def verdicts(self, speedup_target: Optional[float] = 1.10, ceiling_target: Optional[float] = None) -> str:
        """One line per judged case and pass against the issue's targets: apex >= ``speedup_target`` x torch
        eager or, where that is beyond the ceiling-bound limit (eager time / ceiling time: apex's speed-up
        at 100 % of the ceiling), >= eager; apex >= torch.compile; apex >= ``ceiling_target`` % of
        the ceiling (each where given)."""
        ms = {(case, pass_, impl): t for case, pass_, impl, t, *_ in self.rows}
        wanted = [f">= {speedup_target:.2f}x eager or its ceiling-bound limit, >= torch.compile"] if speedup_target else []
        wanted += [f">= {ceiling_target:.0f}% of the ceiling"] if ceiling_target else []
        lines = [f"## targets: {'; '.join(wanted)}"]
        for case, pass_ in dict.fromkeys((case, pass_) for case, pass_, *_ in self.rows if pass_ in _JUDGED):
            apex, eager = ms[(case, pass_, "apex")], ms[(case, pass_, "torch eager")]
            ceiling, compiled = ms[(case, pass_, "torch.matmul")], ms[(case, pass_, "torch.compile")]
            limit, percent = eager / ceiling, 100 * ceiling / apex
            line = f"{case:<34} {pass_:<8} {eager / apex:5.2f}x eager (limit {limit:4.2f}x) {compiled / apex:5.2f}x compile"
            met = True
            if speedup_target:
                target = speedup_target if limit >= speedup_target else 1.0  # beyond the limit: >= eager
                met &= eager / apex >= target * (1 - _NOISE) and apex <= compiled * (1 + _NOISE)
                line += f" (target {target:4.2f}x)"
            if ceiling_target:
                met &= percent >= ceiling_target * (1 - _NOISE)
            lines.append(f"{line} {percent:5.1f}% ceiling  {'ok' if met else 'MISSED'}")
        return "\n".join(lines)

    def print(self, started: float, **targets) -> None:
        """The table, the verdicts (``targets``: verdicts' keywords) and the run time."""
        print(self.render(), flush=True)
        print(self.verdicts(**targets), flush=True)
        print(f"(ran {time.perf_counter() - started:.0f} s)")


def free_memory() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
