"""Training-step time and memory per rank of a ~1B-parameter GPT on 2 GPUs, four ways:

    DDP + torch.optim.AdamW(fused=True)            (replicated state, all-reduced gradients)
    ZeroRedundancyOptimizer(AdamW fused) + DDP     (ZeRO-1: sharded state, all-reduced gradients)
    FSDP2 fully_shard(reshard_after_forward=False) (sharded parameters, gradients and state)
    apex DistributedFusedAdam                      (ZeRO-2: sharded state and gradients)

    python benchmarks/contrib/optimizers/bench_distributed_adam.py              # spawns 2 ranks on 2 GPUs
    torchrun --nproc_per_node=2 benchmarks/contrib/optimizers/bench_distributed_adam.py
    python benchmarks/contrib/optimizers/bench_distributed_adam.py --device cpu --tiny   # logic check, gloo

Every setup trains the same model (fp32 parameters, bf16 autocast, same initial values)
on the same batches and reports the median step time of batches of back-to-back steps,
peak memory per rank, optimizer-state bytes per rank and the loss after the timed steps
(equal losses say the four setups compute the same training). Rank 0 prints the table.
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


def apex_distributed_adam(contiguous_grad_buffer: bool = True, overlap_param_sync: bool = False):
    """fp32 parameters and state: the parameters are the master copy (no second copy is kept)
    and are views of one flat buffer the all-gather writes into. With ``contiguous_grad_buffer``
    gradients accumulate in one persistent full-size buffer (nothing copied); without it they
    are moved into buckets that are freed once reduce-scattered (ZeRO-2's gradient memory)."""

    def setup(model, rank, device):
        from apex.contrib.optimizers import DistributedFusedAdam

        optimizer = DistributedFusedAdam(model.parameters(), lr=LR, contiguous_param_buffer=True,
                                         contiguous_grad_buffer=contiguous_grad_buffer,
                                         overlap_param_sync=overlap_param_sync)
        optimizer.init_param_buffer()

        def state_bytes() -> int:
            # The shards' tensors (moments; a parameter copy where one is kept), this rank's only.
            return tensor_bytes(t for s in optimizer._states for t in (s.exp_avg, s.exp_avg_sq, s.master, s.remainders))

        return model, optimizer, state_bytes

    return setup


SETUPS: dict[str, Callable] = {
    "DDP + AdamW(fused)": ddp_adamw,
    "ZeRO-1 ZeroRedundancyOptimizer": zero1_adamw,
    "FSDP2 (no reshard after fwd)": fsdp2_adamw,
    "apex DistributedFusedAdam": apex_distributed_adam(),
    "apex DFA, freed grad buckets": apex_distributed_adam(contiguous_grad_buffer=False),
    "apex DFA, overlap_param_sync": apex_distributed_adam(overlap_param_sync=True),
}


def run_setup(name: str, rank: int, device: torch.device, args) -> dict:
    config = MODEL_TINY if args.tiny else MODEL_1B
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = make_model(config, device)
    parameters = sum(p.numel() for p in model.parameters())  # before FSDP2 shards them
    wrapped, optimizer, state_bytes = SETUPS[name](model, rank, device)
    x, y = batch(config, args.batch, rank, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = wrapped(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        optimizer.step()
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
    if hasattr(optimizer, "param_sync"):
        optimizer.param_sync()
    result = {
        "ms": statistics.median(samples),
        "peak_gib": torch.cuda.max_memory_allocated() / GIB if cuda else float("nan"),
        "state_gib": state_bytes() / GIB,
        "loss": float(loss.detach()),
        "params": parameters,
    }
    del wrapped, optimizer, model, state_bytes
    gc.collect()
    dist.barrier()
    return result


def benchmark(rank: int, world_size: int, args) -> None:
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    rows = {}
    for name in SETUPS:
        if args.only and not any(part.lower() in name.lower() for part in args.only.split(",")):
            continue
        try:
            rows[name] = run_setup(name, rank, device, args)
        except Exception:  # one broken setup must not hide the others
            rows[name] = {"error": traceback.format_exc().strip().splitlines()[-1]}
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if rank == 0:
        print_table(rows, world_size, device, args)


def print_table(rows: dict, world_size: int, device: torch.device, args) -> None:
    config = MODEL_TINY if args.tiny else MODEL_1B
    params = next((r["params"] for r in rows.values() if "params" in r), 0)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (gloo)"
    print(f"## {params / 1e6:.1f}M-parameter GPT, {world_size} x {where}, torch {torch.__version__}, "
          f"{args.batch} x {config['context']} tokens per rank, fp32 params, bf16 autocast on GPU")
    header = f"{'setup':<32} {'step ms':>9} {'vs DDP':>7} {'peak GiB/rank':>14} {'opt state GiB/rank':>19} {'loss':>8}"
    print(header + "\n" + "-" * len(header))
    ddp = rows.get("DDP + AdamW(fused)", {})
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<32} failed: {row['error']}")
            continue
        ratio = row["ms"] / ddp["ms"] if "ms" in ddp else float("nan")
        peak = f"{row['peak_gib']:.2f}" if device.type == "cuda" else "n/a"
        print(f"{name:<32} {row['ms']:>9.2f} {ratio:>6.2f}x {peak:>14} {row['state_gib']:>19.3f} {row['loss']:>8.4f}")
    print(f"\nstep = zero_grad + forward + backward (+ gradient sync) + optimizer step; median of {args.repeats} "
          f"batches of {args.steps} steps after {args.warmup} warm-up steps. Read the scaling caveats in "
          "benchmarks/contrib/optimizers/NOTES.md: 2 GPUs show the 1/N state and the overlap, not the "
          "communication cost at larger N.", flush=True)


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
