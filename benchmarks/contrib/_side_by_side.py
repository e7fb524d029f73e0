"""What every contrib benchmark does: time implementations of one op side by side, forward and
forward+backward, as % of the measured copy bandwidth on the bytes each pass must move.

Each implementation is a callable over the case's inputs returning a tensor; forward+backward
differentiates the output with torch.autograd.grad with respect to the inputs that require grad (no
.grad accumulation is timed), given a fixed random gradient of the output's shape as a training
step's downstream layers would (a loss, 0-dim, gets 1). Times are device times of CUDA-graph replays of 10
back-to-back calls (benchmarks.common.graph_time_ms); an implementation whose calls cannot be
captured is timed in eager batches instead and marked "(eager)".
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import BandwidthTable, copy_bandwidth_gbs, graph_time_ms, require_gpu, time_ms  # noqa: E402,F401

# Calls per timed batch where a CUDA graph cannot be captured.
CALLS_PER_BATCH = 10


def device_ms(fn: Callable[[], object]) -> tuple[float, str]:
    """(ms per call, "") from CUDA-graph replays; where capture fails, (ms per call of batches of
    back-to-back eager calls, " (eager)"), host overhead included."""
    try:
        return graph_time_ms(fn), ""
    except RuntimeError:
        torch.cuda.synchronize()
        return time_ms(lambda: [fn() for _ in range(CALLS_PER_BATCH)]) / CALLS_PER_BATCH, " (eager)"


def forward_backward(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor]) -> Callable[[], object]:
    """One training step of fn on inputs: forward, then the gradients of its output."""
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    with torch.no_grad():
        example = fn(*inputs)
    grad_out = torch.randn_like(example) if example.dim() else torch.ones_like(example)

    def step():
        return torch.autograd.grad(fn(*inputs), wrt, grad_out)

    return step


def compare(table: BandwidthTable, case: str, impls: dict[str, Callable[..., torch.Tensor]],
            inputs: Sequence[torch.Tensor], forward_bytes: float, training_bytes: float) -> None:
    """Adds "<case> fwd" and "<case> fwd+bwd" rows for every implementation to `table`."""
    for name, fn in impls.items():
        with torch.no_grad():
            ms, how = device_ms(lambda: fn(*inputs))
        table.add(f"{case} fwd", name + how, ms, forward_bytes)
    for name, fn in impls.items():
        ms, how = device_ms(forward_backward(fn, inputs))
        table.add(f"{case} fwd+bwd", name + how, ms, training_bytes)


def new_table(title: str) -> BandwidthTable:
    return BandwidthTable(title, copy_bandwidth_gbs())


def compiled(fn: Callable) -> Callable:
    """torch.compile(fn) with a fresh dynamo cache (cases reuse code objects, which would otherwise
    exhaust dynamo's recompile limit and fall back to eager silently)."""
    torch._dynamo.reset()
    return torch.compile(fn)
