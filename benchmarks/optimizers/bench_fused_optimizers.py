"""One optimizer step of apex.optimizers beside torch.optim on the tensors of a GPT-like
model, in ms and as % of the GPU's measured copy bandwidth.

    python benchmarks/optimizers/bench_fused_optimizers.py [--layers 12] [--hidden 1024] [--dtype float32]

Bytes counted per step are the least a step must move: every grad read once, every param
and state tensor read and written once (fp32 AdamW: 4 + 2*4 + 2*2*4 = 28 bytes per param;
SGD with momentum: 4 + 2*4 + 2*4 = 20). LAMB counts the same as AdamW; its extra passes
(global grad norm, per-tensor param and update norms, the update written and read back)
show as a lower percentage. Each implementation is charged for its own state: with bf16
params FusedAdam keeps float32 moments where torch.optim keeps bf16 ones, so compare ms
across implementations and % copy within one.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "compatibility")]

from apex.optimizers import FusedAdam, FusedLAMB, FusedSGD  # noqa: E402
from benchmarks.common import BandwidthTable, copy_bandwidth_gbs, time_ms  # noqa: E402

VOCAB, CONTEXT = 50304, 2048


def gpt_shapes(layers: int, hidden: int) -> list[tuple[int, ...]]:
    """Param shapes of a GPT-2-style decoder: embeddings, then per layer two LayerNorms,
    the fused QKV and output projections and the 4x MLP, with biases."""
    per_layer = [
        (hidden,), (hidden,),                          # ln_1
        (3 * hidden, hidden), (3 * hidden,),           # attention qkv
        (hidden, hidden), (hidden,),                   # attention output
        (hidden,), (hidden,),                          # ln_2
        (4 * hidden, hidden), (4 * hidden,),           # mlp up
        (hidden, 4 * hidden), (hidden,),               # mlp down
    ]  # fmt: skip
    return [(VOCAB, hidden), (CONTEXT, hidden), *per_layer * layers, (hidden,), (hidden,)]


def min_bytes_per_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> int:
    """Grads read once; params and every state tensor of param size read and written once."""
    total = 0
    for param in params:
        state_bytes = sum(
            t.numel() * t.element_size()
            for t in optimizer.state[param].values()
            if isinstance(t, torch.Tensor) and t.shape == param.shape
        )
        total += param.grad.numel() * param.grad.element_size() + 2 * param.numel() * param.element_size()
        total += 2 * state_bytes
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_fused_optimizers needs a CUDA GPU")
    dtype = getattr(torch, args.dtype)

    generator = torch.Generator(device="cuda").manual_seed(0)
    shapes = gpt_shapes(args.layers, args.hidden)
    params = [torch.randn(s, device="cuda", generator=generator).mul_(0.02).to(dtype).requires_grad_() for s in shapes]
    for param in params:
        param.grad = torch.randn(param.shape, device="cuda", generator=generator).mul_(1e-3).to(dtype)
    numel = sum(p.numel() for p in params)

    adam = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    sgd = dict(lr=1e-2, momentum=0.9)
    candidates = {
        "AdamW": [
            ("apex FusedAdam", lambda: FusedAdam(params, **adam)),
            ("torch AdamW foreach", lambda: torch.optim.AdamW(params, foreach=True, **adam)),
            ("torch AdamW fused", lambda: torch.optim.AdamW(params, fused=True, **adam)),
        ],
        "SGD momentum": [
            ("apex FusedSGD", lambda: FusedSGD(params, **sgd)),
            ("torch SGD foreach", lambda: torch.optim.SGD(params, foreach=True, **sgd)),
            ("torch SGD fused", lambda: torch.optim.SGD(params, fused=True, **sgd)),
        ],
        "LAMB": [("apex FusedLAMB", lambda: FusedLAMB(params, **adam))],
    }

    table = BandwidthTable(
        f"optimizer step, GPT {args.layers} layers x {args.hidden} ({numel / 1e6:.0f}M {args.dtype} params, "
        f"{len(params)} tensors)",
        copy_bandwidth_gbs(),
    )
    for algorithm, impls in candidates.items():
        for name, make in impls:
            optimizer = make()
            optimizer.step()  # allocates the state
            table.add(algorithm, name, time_ms(optimizer.step), min_bytes_per_step(optimizer, params))
            del optimizer
            torch.cuda.empty_cache()
    table.print()


if __name__ == "__main__":
    main()
