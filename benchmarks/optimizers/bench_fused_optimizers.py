"""One step of every apex optimizer beside torch.optim (foreach, and fused where torch has one) on
the 289-tensor, 354.9M-parameter GPT set (param_sets.gpt_medium_shapes), in ms and as % of the
GPU's measured copy bandwidth on the bytes a step must move.

Bytes a step must move: grads read once, params and every state tensor shaped like the param read
and written once (fp32 AdamW: 4 + 2*4 + 2*2*4 = 28 bytes per param). Each implementation is charged
for its own state (torch.optim keeps 16-bit moments of 16-bit params where apex keeps float32
ones). Optimizers whose algorithm needs more passes (LAMB, LARS, AdamP, NovoGrad: norms,
projections) are charged the same bytes, so their % shows the extra passes; "x Adam" is their time
over FusedAdam's (target: <= 1.5). Targets: >= 90% of copy bandwidth for the elementwise ones.

Timing: CUDA events around batches of 10 back-to-back step() calls (host time is inside, hidden
behind the GPU at this size), the median of 5 batches after 3 warm-up steps.

    python benchmarks/optimizers/bench_fused_optimizers.py [--dtype float32|bfloat16|float16]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parents[1] / "compatibility"), str(HERE)]

from apex import optimizers as apex_optim  # noqa: E402
from benchmarks.common import BandwidthTable, copy_bandwidth_gbs, require_gpu  # noqa: E402
from param_sets import gpt_medium_shapes  # noqa: E402

BATCH, BATCHES, WARMUP = 10, 5, 3
ADAM = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
RMS = dict(lr=1e-4, alpha=0.9, momentum=0.9)


def torch_variant(cls, kind, **hyper):
    return lambda ps: cls(ps, **{kind: True}, **hyper)


# (algorithm, implementation, factory, elementwise): elementwise ones are judged by % copy, the
# others by their time over FusedAdam's.
CASES = [
    ("AdamW", "apex FusedAdam", lambda ps: apex_optim.FusedAdam(ps, **ADAM), True),
    ("AdamW", "torch foreach", torch_variant(torch.optim.AdamW, "foreach", **ADAM), True),
    ("AdamW", "torch fused", torch_variant(torch.optim.AdamW, "fused", **ADAM), True),
    ("SGD momentum", "apex FusedSGD", lambda ps: apex_optim.FusedSGD(ps, lr=1e-2, momentum=0.9), True),
    ("SGD momentum", "torch foreach", torch_variant(torch.optim.SGD, "foreach", lr=1e-2, momentum=0.9), True),
    ("SGD momentum", "torch fused", torch_variant(torch.optim.SGD, "fused", lr=1e-2, momentum=0.9), True),
    ("Adagrad", "apex FusedAdagrad", lambda ps: apex_optim.FusedAdagrad(ps, lr=1e-2), True),
    ("Adagrad", "torch foreach", torch_variant(torch.optim.Adagrad, "foreach", lr=1e-2), True),
    ("RMSprop momentum", "apex FusedRMSprop", lambda ps: apex_optim.FusedRMSprop(ps, **RMS), True),
    ("RMSprop momentum", "torch foreach", torch_variant(torch.optim.RMSprop, "foreach", **RMS), True),
    ("RMSpropTF momentum", "apex FusedRMSpropTF", lambda ps: apex_optim.FusedRMSpropTF(ps, **RMS), True),
    ("Adadelta", "apex FusedAdadelta", lambda ps: apex_optim.FusedAdadelta(ps), True),
    ("Adadelta", "torch foreach", torch_variant(torch.optim.Adadelta, "foreach"), True),
    ("BertAdam", "apex FusedBertAdam", lambda ps: apex_optim.FusedBertAdam(ps, lr=1e-4, warmup=0.1, t_total=1000),
     True),
    ("AdamP", "apex FusedAdamP", lambda ps: apex_optim.FusedAdamP(ps, lr=1e-4, weight_decay=0.1), False),
    ("LAMB", "apex FusedLAMB", lambda ps: apex_optim.FusedLAMB(ps, **ADAM), False),
    ("Lamb", "apex NpuFusedLamb", lambda ps: apex_optim.NpuFusedLamb(ps, lr=1e-4, weight_decay=0.1), False),
    ("LARS", "apex FusedLARS", lambda ps: apex_optim.FusedLARS(ps, lr=1e-2, momentum=0.9, weight_decay=1e-4), False),
    ("NovoGrad", "apex FusedNovoGrad", lambda ps: apex_optim.FusedNovoGrad(ps, lr=1e-4), False),
]


def step_ms(optimizer: torch.optim.Optimizer) -> float:
    for _ in range(WARMUP):
        optimizer.step()
    samples = []
    for _ in range(BATCHES):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BATCH):
            optimizer.step()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / BATCH)
    return statistics.median(samples)


def min_bytes_per_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> int:
    """Grads read once; params and every state tensor of param size read and written once."""
    total = 0
    for param in params:
        state_bytes = sum(t.numel() * t.element_size() for t in optimizer.state[param].values()
                          if isinstance(t, torch.Tensor) and t.shape == param.shape)
        total += param.grad.numel() * param.grad.element_size() + 2 * param.numel() * param.element_size()
        total += 2 * state_bytes
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    args = parser.parse_args()
    require_gpu(__file__)
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator(device="cuda").manual_seed(0)
    shapes = gpt_medium_shapes()
    params = [torch.randn(s, device="cuda", generator=generator).mul_(0.02).to(dtype).requires_grad_() for s in shapes]
    for param in params:
        param.grad = torch.randn(param.shape, device="cuda", generator=generator).mul_(1e-3).to(dtype)
    numel = sum(p.numel() for p in params)
    table = BandwidthTable(f"optimizer step, {len(params)} {args.dtype} tensors ({numel / 1e6:.1f}M params)",
                           copy_bandwidth_gbs())
    adam_ms, judged = None, []
    originals = [p.detach().clone() for p in params]
    for algorithm, impl, make, elementwise in CASES:
        try:
            optimizer = make(params)
            optimizer.step()  # allocates the state
        except (RuntimeError, ValueError) as why:  # a torch variant this torch lacks
            print(f"({algorithm}, {impl}: not available: {str(why).splitlines()[0]})")
            continue
        ms = step_ms(optimizer)
        table.add(algorithm, impl, ms, min_bytes_per_step(optimizer, params))
        if impl.startswith("apex"):
            adam_ms = ms if impl == "apex FusedAdam" else adam_ms
            judged.append((algorithm, impl, ms, elementwise, table.rows[-1]))
        del optimizer
        with torch.no_grad():  # the next optimizer starts from the same params
            for param, original in zip(params, originals):
                param.copy_(original)
        torch.cuda.empty_cache()
    table.print()
    print("\n## apex against the targets (elementwise: >= 90% of copy bandwidth; others: <= 1.5x FusedAdam's time)")
    for algorithm, impl, ms, elementwise, (_, _, _, nbytes) in judged:
        pct = 100 * nbytes / (ms * 1e-3) / 1e9 / table.copy_gbs
        verdict = f"{pct:5.1f}% copy" if elementwise else f"{ms / adam_ms:4.2f}x FusedAdam"
        print(f"{algorithm:<20} {impl:<22} {ms:8.3f} ms  {verdict}")


if __name__ == "__main__":
    main()
