"""Host cost of one SyncBatchNorm training step (forward + backward) and eval forward, beside torch.

    python benchmarks/parallel/host_overhead_syncbn.py                 # CPU, one process
    python benchmarks/parallel/host_overhead_syncbn.py --world 2       # CPU, 2 gloo ranks (distributed path)
    python benchmarks/parallel/host_overhead_syncbn.py --device cuda   # 1 GPU (--world 2: 2 GPUs, NCCL)

The input is tiny (N=2, C=8, 4x4), so kernel time is negligible and a step costs what
the host spends between launches: Python, the dispatcher, autograd. Rows: a training step
(forward + backward) and an eval forward (running statistics, no grad) per layout. Per row it prints
the µs per step, apex's µs beside torch's for the same layout ("vs torch": apex / torch),
the ops one step dispatches from Python and autograd (torch.profiler events whose parent
is not an op; ops that C++ kernels call inside are not counted) and the autograd nodes
between the output and the leaves.

Timing: runs of back-to-back steps, the rows taking turns so that a busy neighbour slows
all of them alike, and the fastest run of each row is kept. On CPU the clock is the
thread's CPU time; on CUDA it is wall time with the queue drained once per run (a
host-bound step lasts as long as the host takes to issue it).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from benchmarks.parallel.launch import run_on_ranks  # noqa: E402

SHAPE = (2, 8, 4, 4)  # small enough that kernels cost (next to) nothing
LAYOUTS = ("NCHW", "channels_last", "NHWC channel_last=True")
MODES = ("train", "eval")  # a training step (forward + backward); an eval forward without grad
WARMUP_STEPS = 20


def _is_op(event) -> bool:
    return event is not None and event.name.startswith(("aten::", "apex::"))


def count_ops(fn) -> collections.Counter:
    """The ops ``fn()`` dispatches from Python and autograd (not those ops call inside C++)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return collections.Counter(e.name for e in prof.events() if _is_op(e) and not _is_op(e.cpu_parent))


def autograd_nodes(t: torch.Tensor) -> int:
    """Nodes reachable from ``t.grad_fn``, leaves' AccumulateGrad excluded."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return sum(type(node).__name__ != "AccumulateGrad" for node in seen)


def make_step(layout: str, implementation: str, device: str, mode: str = "train"):
    """A function running one step of one row (a training step, or an eval forward); returns the output."""
    from apex.parallel import SyncBatchNorm

    x = torch.randn(SHAPE, device=device)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout.startswith("NHWC"):
        x = x.permute(0, 2, 3, 1).contiguous()
    x.requires_grad_(True)
    dy = torch.randn_like(x)
    if implementation == "apex":
        module = SyncBatchNorm(SHAPE[1], channel_last=layout.startswith("NHWC"))
    elif dist.is_initialized():
        module = torch.nn.SyncBatchNorm(SHAPE[1])
    else:
        module = torch.nn.BatchNorm2d(SHAPE[1])
    module.to(device)
    if mode == "eval":
        module.eval()

        def forward():
            with torch.no_grad():
                return module(x)

        return forward

    def step():
        x.grad = None
        module.zero_grad(set_to_none=True)
        y = module(x)
        y.backward(dy)
        return y

    return step


def time_steps(step, device: str, steps: int) -> float:
    """µs per step over ``steps`` back-to-back steps."""
    clock = time.thread_time if device == "cpu" else time.perf_counter
    if device == "cuda":
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
    start = clock()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (clock() - start) / steps * 1e6


def run_table(device: str, steps: int, repeats: int, verbose: bool, rank: int = 0) -> None:
    torch_name = "torch SyncBatchNorm" if dist.is_initialized() else "torch BatchNorm2d"
    rows = {}
    for mode in MODES:
        for layout in LAYOUTS:
            for implementation in ("apex", "torch"):
                if implementation == "torch" and (layout.startswith("NHWC") or (dist.is_initialized() and device == "cpu")):
                    continue  # torch has no (N, H, W, C) batch norm, and its SyncBatchNorm no CPU kernels
                step = make_step(layout, implementation, device, mode)
                for _ in range(WARMUP_STEPS):  # op loading, caches, allocator
                    step()
                name = "apex SyncBatchNorm" if implementation == "apex" else torch_name
                rows[f"{layout} {mode}", name] = step, count_ops(step), autograd_nodes(step())
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(repeats):
        for key, (step, _, _) in rows.items():
            best[key] = min(best[key], time_steps(step, device, steps))
    if rank != 0:
        return
    world = dist.get_world_size() if dist.is_initialized() else 1
    print(f"SyncBatchNorm host cost per step, {device}, {world} process(es), shape {SHAPE}, torch {torch.__version__}")
    print(f"{'layout, mode':<30} {'implementation':<20} {'us/step':>9} {'vs torch':>9} {'ops/step':>9} "
          f"{'autograd nodes':>15}")
    for (layout, name), (_, ops, nodes) in rows.items():
        theirs = best.get((layout, torch_name))
        ratio = f"{best[layout, name] / theirs:>9.2f}" if theirs and name != torch_name else f"{'':>9}"
        print(f"{layout:<30} {name:<20} {best[layout, name]:>9.1f} {ratio} {sum(ops.values()):>9} {nodes:>15}")
        if verbose:
            print("    " + ", ".join(f"{op} x{n}" for op, n in sorted(ops.items())))


def _rank_table(rank, world_size, device, steps, repeats, verbose):
    run_table(device, steps, repeats, verbose, rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--world", type=int, default=1, help="processes (gloo on CPU, NCCL on CUDA, one GPU each)")
    parser.add_argument("--steps", type=int, default=200, help="back-to-back steps per timed run")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per row (the fastest is printed)")
    parser.add_argument("--verbose", action="store_true", help="list the ops of one step")
    args = parser.parse_args()
    from apex._ops import ops

    ops("syncbn")  # compile (or find) once, before any rank starts
    if args.world == 1:
        torch.set_num_threads(1)
        run_table(args.device, args.steps, args.repeats, args.verbose)
    else:
        run_on_ranks(_rank_table, args.world, args.device, args.device, args.steps, args.repeats, args.verbose)


if __name__ == "__main__":
    main()
