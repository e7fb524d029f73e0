"""Training-step time and memory per rank of a ~1B-parameter GPT on 2 GPUs, four ways:

    DDP + torch.optim.AdamW(fused=True)            (replicated state, all-reduced gradients)
    ZeroRedundancyOptimizer(AdamW fused) + DDP     (ZeRO-1: sharded state, all-reduced gradients)
    FSDP2 fully_shard(reshard_after_forward=False) (sharded parameters, gradients and state)
    apex DistributedFusedAdam                      (ZeRO-2: sharded state and gradients)

    python benchmarks/contrib/optimizers/bench_distributed_adam.py              # spawns 2 ranks on 2 GPUs
    torchrun --nproc_per_node=2 benchmarks/contrib/optimizers/bench_distributed_adam.py
    python benchmarks/contrib/optimizers/bench_distributed_adam.py --device cpu --tiny   # logic check, gloo
    python benchmarks/contrib/optimizers/bench_distributed_adam.py --quick --phases   # DDP + apex rows, phase memory
    python benchmarks/contrib/optimizers/bench_distributed_adam.py --only overlap --snapshot   # live at the peak

Every setup trains the same model (fp32 parameters, bf16 autocast, same initial values)
on the same batches and reports the median step time of batches of back-to-back steps,
peak memory per rank, optimizer-state bytes per rank and the loss after the timed steps
(equal losses say the four setups compute the same training). Rank 0 prints the table.

Memory: each setup starts from an empty allocator (garbage collected first); "left GiB" is
what stays allocated once the setup's objects are dropped (a leak shows there, and would
otherwise inflate every later row's peak). ``--phases`` adds, per setup, the allocated /
peak / reserved memory after zero_grad, forward, backward and step of one more step;
``--snapshot`` records the allocator's history (python stacks) and prints the allocations
live at the peak, grouped by the first frame in this repository (timings are then slower).
torch.compile is left out: compiling a 1B model four times would not fit the time budget,
and it changes the forward/backward, not the optimizer and communication compared here.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path[:0] = [_REPO, os.path.join(_REPO, "compatibility"), os.path.join(_REPO, "examples")]
from benchmarks.parallel.launch import run_on_ranks  # noqa: E402
from gpt_model import GPT  # noqa: E402

# ~1.04e9 parameters: 18 x 12 dim^2 in the blocks + two 32000 x 2048 embeddings (input and head).
MODEL_1B = dict(vocab=32000, context=1024, dim=2048, heads=16, layers=18)
MODEL_TINY = dict(vocab=128, context=32, dim=64, heads=4, layers=2)
LR = 1e-4
GIB = 2**30


def make_model(config: dict, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        return GPT(config["vocab"], config["context"], config["dim"], config["heads"], config["layers"])


def batch(config: dict, batch_size: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, config["vocab"], (batch_size, config["context"] + 1), generator=g).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def tensor_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() > 0:  # step counters are scalars
            local = t.to_local() if hasattr(t, "to_local") else t  # DTensor (FSDP2): this rank's shard
            total += local.numel() * local.element_size()
    return total


def torch_optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return tensor_bytes(v for state in optimizer.state.values() for v in state.values())


# -- the four setups: each returns (model to call, optimizer, optimizer-state bytes function) ------

def ddp_adamw(model, rank, device):
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None,
                                                    gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    return ddp, optimizer, lambda: torch_optimizer_state_bytes(optimizer)


def zero1_adamw(model, rank, device):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None,
                                                    gradient_as_bucket_view=True)
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LR, fused=True)
    return ddp, optimizer, lambda: torch_optimizer_state_bytes(optimizer.optim)


def fsdp2_adamw(model, rank, device):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
    return model, optimizer, lambda: torch_optimizer_state_bytes(optimizer)


def apex_distributed_adam(contiguous_grad_buffer: bool = True, overlap_param_sync: bool = False,
                          contiguous_param_buffer: bool = True, set_to_none: bool = True):
    """fp32 parameters and state: the parameters are the master copy (no second copy is kept)
    and (``contiguous_param_buffer``) views of one flat buffer the all-gather writes into. With
    ``contiguous_grad_buffer`` gradients go to one persistent full-size buffer (with
    ``zero_grad(set_to_none=True)`` copied in once, the buffer never zeroed; with False
    accumulated in place into ``param.grad`` views of it, zeroed after each reduction); without
    it they are moved into buckets that are freed once reduce-scattered (ZeRO-2's gradient memory)."""

    def setup(model, rank, device):
        from apex.contrib.optimizers import DistributedFusedAdam

        optimizer = DistributedFusedAdam(model.parameters(), lr=LR, contiguous_param_buffer=contiguous_param_buffer,
                                         contiguous_grad_buffer=contiguous_grad_buffer,
                                         overlap_param_sync=overlap_param_sync)
        if contiguous_param_buffer:
            optimizer.init_param_buffer()

        def state_bytes() -> int:
            # The shards' tensors (moments; a parameter copy where one is kept), this rank's only.
            return tensor_bytes(t for s in optimizer._states for t in (s.exp_avg, s.exp_avg_sq, s.master, s.remainders))

        return model, optimizer, state_bytes, dict(set_to_none=set_to_none)

    return setup


SETUPS: dict[str, Callable] = {
    "DDP + AdamW(fused)": ddp_adamw,
    "ZeRO-1 ZeroRedundancyOptimizer": zero1_adamw,
    "FSDP2 (no reshard after fwd)": fsdp2_adamw,
    "apex DistributedFusedAdam": apex_distributed_adam(),
    "apex DFA, freed grad buckets": apex_distributed_adam(contiguous_grad_buffer=False),
    "apex DFA, overlap_param_sync": apex_distributed_adam(overlap_param_sync=True),
    "apex DFA, zero_grad to views": apex_distributed_adam(set_to_none=False),
    "apex DFA, overlap, own params": apex_distributed_adam(overlap_param_sync=True, contiguous_param_buffer=False),
}
# --quick: DDP and the main apex rows.
QUICK = ("DDP + AdamW(fused)", "apex DistributedFusedAdam", "apex DFA, freed grad buckets",
         "apex DFA, overlap_param_sync", "apex DFA, zero_grad to views")


def run_setup(name: str, rank: int, device: torch.device, args) -> dict:
    config = MODEL_TINY if args.tiny else MODEL_1B
    cuda = device.type == "cuda"
    gc.collect()  # what earlier setups left in reference cycles must not count here
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    recording = cuda and args.snapshot
    if recording:
        torch.cuda.memory._record_memory_history(max_entries=args.snapshot_entries, stacks="python")
    model = make_model(config, device)
    parameters = sum(p.numel() for p in model.parameters())  # before FSDP2 shards them
    wrapped, optimizer, state_bytes, *options = SETUPS[name](model, rank, device)
    set_to_none = options[0].get("set_to_none", True) if options else True
    x, y = batch(config, args.batch, rank, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def step(phase: Callable[[str], None] = lambda _: None) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=set_to_none)
        phase("zero_grad")
        with autocast:
            logits = wrapped(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        phase("forward")
        loss.backward()
        phase("backward")
        optimizer.step()
        phase("step")
        return loss

    for _ in range(args.warmup):
        step()
    samples = []
    for _ in range(args.repeats):  # batches of back-to-back steps, one device sync each
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
        else:
            t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        if cuda:
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) / args.steps)
        else:
            samples.append((time.perf_counter() - t0) * 1e3 / args.steps)
    peak = torch.cuda.max_memory_allocated() if cuda else float("nan")
    phases = measure_phases(step) if cuda and args.phases else None
    if hasattr(optimizer, "param_sync"):
        optimizer.param_sync()
    result = {
        "ms": statistics.median(samples),
        "peak_gib": (peak - before) / GIB if cuda else float("nan"),
        "held_before_gib": before / GIB,
        "state_gib": state_bytes() / GIB,
        "loss": float(loss.detach()),
        "params": parameters,
        "phases": phases,
    }
    if recording:
        result["snapshot"] = live_at_peak(torch.cuda.memory._snapshot(), before, device, args.snapshot_entries)
        torch.cuda.memory._record_memory_history(enabled=None)
    return result


def measure_phases(step: Callable) -> list[tuple[str, float, float, float]]:
    """One more step: (phase, allocated, peak since the previous phase, reserved) in GiB after
    zero_grad, forward, backward and step. Allocator counters are host-side: no synchronization."""
    rows = []
    torch.cuda.reset_peak_memory_stats()

    def phase(name: str) -> None:
        rows.append((name, torch.cuda.memory_allocated() / GIB, torch.cuda.max_memory_allocated() / GIB,
                     torch.cuda.memory_reserved() / GIB))
        torch.cuda.reset_peak_memory_stats()

    step(phase)
    return rows


_REPO_DIRS = ("/apex/", "/examples/", "/benchmarks/")


def _site(frames: list[dict]) -> str:
    """Where an allocation came from: its innermost frame in this repository (apex, the model,
    the benchmark), with the innermost torch frame above it when that is not the same. The
    handler that finishes a pending all-gather (overlap_param_sync) only passes the op on: the
    op's output belongs to its caller."""
    frames = [f for f in frames if not (f["name"] == "__torch_function__" and f["filename"].endswith("_param_sync.py"))]
    inner = next((f for f in frames if "site-packages" not in f["filename"] and f["filename"].endswith(".py")), None)
    torch_frame = next((f for f in frames if "/torch/" in f["filename"]), None)
    own = next((f for f in frames if any(d in f["filename"] for d in _REPO_DIRS)), None)
    chosen = own or inner
    if chosen is None:  # autograd's backward runs in C++ threads: no python stack
        return "(no python frame: backward)" if torch_frame is None else _frame(torch_frame)
    where = _frame(chosen, line=True)
    if torch_frame is not None and frames.index(torch_frame) < frames.index(chosen):
        where += f" <- {_frame(torch_frame)}"
    return where


def _frame(frame: dict, line: bool = False) -> str:
    name = os.path.basename(frame["filename"]).removesuffix(".py")
    return f"{name}.py:{frame['line']} {frame['name']}" if line else f"{name}.{frame['name']}"


def live_at_peak(snapshot: dict, before: int, device: torch.device, max_entries: int, top: int = 15) -> dict:
    """Replay the recorded allocations to their peak and describe what was live there (a trace
    that filled ``max_entries`` lost its oldest events: the replay is then incomplete)."""
    events = [e for e in snapshot["device_traces"][device.index or 0] if e["action"] in ("alloc", "free_requested")]
    live: dict[int, tuple[int, list]] = {}
    total = peak = before
    peak_at = -1
    for i, event in enumerate(events):  # pass 1: where the peak is
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], event.get("frames", []))
            total += event["size"]
        else:
            size, _ = live.pop(event["addr"], (event["size"], None))
            total -= size
        if total > peak:
            peak, peak_at = total, i
    live.clear()
    freed_earlier = 0  # blocks allocated before recording and freed before the peak
    for event in events[:peak_at + 1]:  # pass 2: what is live there
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], event.get("frames", []))
        elif event["addr"] in live:
            del live[event["addr"]]
        else:
            freed_earlier += event["size"]
    sites: dict[str, list[int]] = {}
    for size, frames in live.values():
        entry = sites.setdefault(_site(frames), [0, 0, 0])
        entry[0] += size
        entry[1] += 1
        entry[2] = max(entry[2], size)
    if before - freed_earlier > 0:
        sites["(allocated before this setup)"] = [before - freed_earlier, 0, 0]
    groups = sorted(sites.items(), key=lambda item: -item[1][0])[:top]
    blocks = sorted(((size, _site(frames)) for size, frames in live.values()), key=lambda b: -b[0])[:top]
    return {"peak_gib": peak / GIB, "events": len(events), "groups": groups, "blocks": blocks,
            "trace_full": len(snapshot["device_traces"][device.index or 0]) >= max_entries}


def selected(args) -> list[str]:
    names = list(QUICK if args.quick else SETUPS)
    if args.only:
        names = [n for n in SETUPS if any(part.strip().lower() in n.lower() for part in args.only.split(","))]
    return names


def benchmark(rank: int, world_size: int, args) -> None:
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    cuda = device.type == "cuda"
    rows = {}
    for name in selected(args):
        try:
            rows[name] = run_setup(name, rank, device, args)
            # Everything of the setup is out of scope now: what is still allocated is held by
            # something else (a reference cycle until the collector runs, or a leak). NCCL
            # holds the tensors of collectives never waited for (DDP's buckets) until its
            # watchdog has seen them done and the next call on the group: let it.
            if cuda:
                torch.cuda.synchronize()
                time.sleep(0.5)
            dist.barrier()
            if cuda:
                rows[name]["left_gib"] = torch.cuda.memory_allocated() / GIB - rows[name]["held_before_gib"]
                gc.collect()
                rows[name]["left_gc_gib"] = torch.cuda.memory_allocated() / GIB - rows[name]["held_before_gib"]
        except Exception:  # one broken setup must not hide the others
            rows[name] = {"error": traceback.format_exc().strip().splitlines()[-1]}
            if cuda:
                torch.cuda.memory._record_memory_history(enabled=None)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        dist.barrier()
    if rank == 0:
        print_table(rows, world_size, device, args)


def print_table(rows: dict, world_size: int, device: torch.device, args) -> None:
    config = MODEL_TINY if args.tiny else MODEL_1B
    params = next((r["params"] for r in rows.values() if "params" in r), 0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (gloo)"
    print(f"## {params / 1e6:.1f}M-parameter GPT, {world_size} x {where}, torch {torch.__version__}, "
          f"{args.batch} x {config['context']} tokens per rank, fp32 params, bf16 autocast on GPU")
    cuda = device.type == "cuda"
    header = (f"{'setup':<32} {'step ms':>9} {'vs DDP':>7} {'peak GiB/rank':>14} {'opt state GiB/rank':>19} "
              f"{'loss':>8} {'left GiB del/gc':>16}")
    print(header + "\n" + "-" * len(header))
    ddp = rows.get("DDP + AdamW(fused)", {})
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<32} failed: {row['error']}")
            continue
        ratio = row["ms"] / ddp["ms"] if "ms" in ddp else float("nan")
        peak = f"{row['peak_gib']:.2f}" if cuda else "n/a"
        left = f"{row['left_gib']:.2f}/{row['left_gc_gib']:.2f}" if cuda else "n/a"
        print(f"{name:<32} {row['ms']:>9.2f} {ratio:>6.2f}x {peak:>14} {row['state_gib']:>19.3f} "
              f"{row['loss']:>8.4f} {left:>16}")
    held = {name: row["held_before_gib"] for name, row in rows.items() if row.get("held_before_gib", 0) > 0.01}
    if held:
        print(f"allocated before the setup started (GiB, not counted in its peak): {held}")
    print(f"\nstep = zero_grad + forward + backward (+ gradient sync) + optimizer step; median of {args.repeats} "
          f"batches of {args.steps} steps after {args.warmup} warm-up steps. Peak = max_memory_allocated during "
          "the setup, less what was allocated before it. Left = still allocated after the setup's objects were dropped "
          "(and a barrier), before / after gc.collect(). "
          "Read the scaling caveats in benchmarks/contrib/optimizers/NOTES.md: 2 GPUs show the 1/N state and the "
          "overlap, not the communication cost at larger N.", flush=True)
    for name, row in rows.items():
        if row.get("phases"):
            print(f"\n{name}: memory after each phase of one more step (GiB, rank 0)")
            print(f"  {'phase':<10} {'allocated':>10} {'peak in phase':>14} {'reserved':>9}")
            for phase, allocated, peak, reserved in row["phases"]:
                print(f"  {phase:<10} {allocated:>10.2f} {peak:>14.2f} {reserved:>9.2f}")
        if row.get("snapshot"):
            snap = row["snapshot"]
            print(f"\n{name}: live at the recorded peak, {snap['peak_gib']:.2f} GiB ({snap['events']} alloc/free "
                  "events; rank 0). By site (innermost frame in this repository <- torch op):")
            if snap["trace_full"]:
                print("  (the trace filled --snapshot-entries: its oldest events are lost, raise it)")
            for site, (size, count, largest) in snap["groups"]:
                print(f"  {size / GIB:>7.3f} GiB  {count:>5} blocks  largest {largest / 2**20:>8.1f} MiB  {site}")
            print("  largest blocks:")
            for size, site in snap["blocks"]:
                print(f"  {size / 2**20:>9.1f} MiB  {site}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny GPT (checks the logic, e.g. on CPU)")
    parser.add_argument("--gpus", type=int, default=2, help="ranks to spawn (GPUs, or CPU processes)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per rank (default 8, tiny 4)")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed batches")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--only", default="", help="comma-separated parts of the setup names to run (default: all)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--phases", action="store_true",
                        help="memory after zero_grad / forward / backward / step of one more step, per setup")
    parser.add_argument("--snapshot", action="store_true",
                        help="record the allocator's history and print what is live at the peak (slows the steps)")
    parser.add_argument("--snapshot-entries", type=int, default=2_000_000, help="allocator trace entries kept")
    args = parser.parse_args()
    args.batch = args.batch or (4 if args.tiny else 8)
    if "RANK" in os.environ:  # under torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        try:
            benchmark(rank, world, args)
        finally:
            dist.destroy_process_group()
        return
    if args.device == "cuda" and torch.cuda.device_count() < args.gpus:
        sys.exit(f"bench_distributed_adam needs {args.gpus} GPUs, found {torch.cuda.device_count()}")
    run_on_ranks(benchmark, args.gpus, args.device, args)


if __name__ == "__main__":
    main()
