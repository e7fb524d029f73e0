"""What the transformer benchmarks share: each case timed for apex, torch eager and torch.compile of
the eager code, forward and forward+backward, as % of the measured copy bandwidth.

Times are device times: graph_time_ms captures 10 back-to-back calls in one CUDA graph and replays
it, so host overhead is left out for every implementation alike. forward+backward is
``torch.autograd.grad`` of one call (no accumulation into .grad).
"""
from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "compatibility")]

from benchmarks.common import BandwidthTable, copy_bandwidth_gbs, graph_time_ms, require_gpu  # noqa: E402

IMPLS = ["apex", "torch", "torch.compile"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Case:
    """One shape: ``inputs()`` builds the arguments, the first ``differentiable`` of which get
    gradients; ``apex`` and ``torch`` compute the same output from them. Bytes are the least each
    pass must move (read + written)."""

    name: str
    inputs: Callable[[], tuple]
    apex: Callable[..., torch.Tensor]
    torch: Callable[..., torch.Tensor]
    forward_bytes: float
    backward_bytes: float
    differentiable: int = 1
    implementations: dict = field(init=False)

    def __post_init__(self):
        self.implementations = {"apex": self.apex, "torch": self.torch}


def check_outputs(case: Case, args: tuple) -> None:
    """One line per case: apex's output against torch's (a GPU bug shows here before any timing)."""
    with torch.no_grad():
        ours, theirs = case.apex(*args).float(), case.torch(*args).float()
    error = ((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-30)).item()
    verdict = "ok" if error <= 2e-2 else "MISMATCH"
    print(f"{case.name}: max |apex - torch| / max |torch| = {error:.1e} {verdict}", flush=True)


def run(script: str, title: str, cases: list[Case], only: list[str]) -> None:
    require_gpu(script)
    table = BandwidthTable(f"{title}; device time, CUDA graph replays of 10 calls", copy_bandwidth_gbs())
    for case in cases:
        torch._dynamo.reset()  # a fresh recompile budget per case
        args = case.inputs()
        leaves = [a.detach().requires_grad_() for a in args[: case.differentiable]]
        rest = args[case.differentiable:]
        check_outputs(case, args)
        for name in only:
            fn = torch.compile(case.torch) if name == "torch.compile" else case.implementations[name]
            with torch.no_grad():
                grad = torch.randn_like(fn(*args))

            def forward():
                with torch.no_grad():
                    fn(*args)

            def forward_backward():
                torch.autograd.grad(fn(*leaves, *rest), leaves, grad)

            table.add(f"{case.name} fwd", name, graph_time_ms(forward), case.forward_bytes)
            table.add(f"{case.name} fwd+bwd", name, graph_time_ms(forward_backward),
                      case.forward_bytes + case.backward_bytes)
            del grad
        del args, leaves, rest
        gc.collect()
        torch.cuda.empty_cache()
    table.print()


def main(script: str, title: str, cases: Callable[[torch.dtype], list[Case]], doc: str) -> None:
    """A benchmark's command line: --dtypes (default bf16, the targets' dtype) and --impls."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], choices=list(DTYPES))
    parser.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS)
    args = parser.parse_args()
    for name in args.dtypes:
        run(script, f"{title}, {name}", cases(DTYPES[name]), args.impls)
