"""Timing and reporting shared by every apex benchmark.

Memory-bound ops are judged against the GPU's *measured* copy bandwidth
(a large device-to-device copy, counting bytes read plus bytes written), so
every row of a benchmark table reads "this op moved its bytes at X % of what the
card can move at all". PyTorch's own implementation is timed in the same run.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

# A copy this large spills every cache level of current GPUs (H100/H200 L2 is
# 50-60 MB), so it measures HBM, not cache.
_COPY_BYTES = 1 << 30


def time_ms(fn: Callable[[], object], *, warmup: int = 10, iters: int = 50, device: str = "cuda") -> float:
    """Median wall time of ``fn()`` in milliseconds.

    On CUDA each call is bracketed by CUDA events (device time, no host
    overhead from synchronising); on CPU a host clock is used.
    """
    for _ in range(warmup):
        fn()
    samples = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(iters):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def copy_bandwidth_gbs(device: str = "cuda") -> float:
    """Measured device-to-device copy bandwidth in GB/s (read + write bytes)."""
    src = torch.empty(_COPY_BYTES // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup=5, iters=30, device=device)
    return 2 * _COPY_BYTES / (ms * 1e-3) / 1e9


@dataclass
class BandwidthTable:
    """Collects (case, implementation, ms, bytes moved) rows and prints them
    as ms, GB/s and % of the measured copy bandwidth."""

    title: str
    copy_gbs: float
    rows: list[tuple[str, str, float, float]] = field(default_factory=list)

    def add(self, case: str, impl: str, ms: float, bytes_moved: float) -> None:
        self.rows.append((case, impl, ms, bytes_moved))

    def render(self) -> str:
        header = f"{'case':<34} {'impl':<22} {'ms':>9} {'GB/s':>8} {'% copy':>7}"
        lines = [f"## {self.title} (copy bandwidth {self.copy_gbs:.0f} GB/s)", header, "-" * len(header)]
        for case, impl, ms, nbytes in self.rows:
            gbs = nbytes / (ms * 1e-3) / 1e9
            lines.append(f"{case:<34} {impl:<22} {ms:>9.3f} {gbs:>8.0f} {100 * gbs / self.copy_gbs:>6.1f}%")
        return "\n".join(lines)

    def print(self) -> None:
        print(self.render(), flush=True)


def graph_time_ms(fn: Callable[[], object], *, calls: int = 10, warmup: int = 3, iters: int = 20) -> float:
    """Device time of one ``fn()`` call: ``calls`` back-to-back calls captured in one CUDA graph,
    replayed; host overhead (Python, dispatcher, autograd bookkeeping) is left out for every
    implementation alike. fn is warmed up (and any torch.compile compiled) on a side stream first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    ms = time_ms(graph.replay, warmup=warmup, iters=iters) / calls
    del graph
    return ms


# Exit status of a benchmark that needs GPUs this machine lacks: `make bench` lists it as
# "needs a GPU (skipped here)" instead of failing (77: automake's "skipped" test status).
SKIPPED_EXIT = 77


def require_gpu(script: str, count: int = 1) -> None:
    """Call first in a benchmark that times CUDA: without ``count`` visible GPUs it says so in one
    line and exits with SKIPPED_EXIT (no traceback), so `make bench` on a CPU runs the rest."""
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < count:
        print(f"{script}: needs {count} CUDA GPU{'s' if count > 1 else ''} ({found} visible): skipped", flush=True)
        raise SystemExit(SKIPPED_EXIT)
