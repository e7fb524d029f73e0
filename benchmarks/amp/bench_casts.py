"""What amp's O1 casts cost: a small GPT-style stack trained in fp32, under torch.autocast, and
under apex.amp's cast lists (`amp.init()`, what O1/O4 install), eager and torch.compile'd,
forward and forward+backward, wall time per iteration over batches of back-to-back calls.

    python benchmarks/amp/bench_casts.py                 # GPU if visible, else CPU (smaller shapes)
    python benchmarks/amp/bench_casts.py --dtype bf16

The small shape is launch-bound (host overhead shows: amp's casts are Python wrappers around
~10 torch calls per layer); the large one is compute-bound (the casts' cost disappears).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from apex import amp  # noqa: E402

VOCAB = 1024


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (dim // self.heads) ** 0.5
        attention = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2).reshape(batch, seq, dim)
        x = x + self.proj(attention)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, dim, layers, heads=4):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens):
        return self.head(self.blocks(self.embedding(tokens)))


def per_call_ms(fn, device, calls, repeats=5):
    """Median over `repeats` of (wall time of `calls` back-to-back calls, synchronized) / calls."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(samples)


def run_case(name, model, tokens, region, compiled, device, calls):
    step = torch.compile(model) if compiled else model

    def forward():
        with region():
            return F.cross_entropy(step(tokens).float().flatten(0, 1), tokens.flatten())

    def forward_backward():
        forward().backward()

    with torch.no_grad():
        forward_ms = per_call_ms(forward, device, calls)
    return name, forward_ms, per_call_ms(forward_backward, device, calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    # (batch, seq, dim, layers): launch-bound, compute-bound
    shapes = ([(8, 64, 256, 4), (16, 512, 1024, 8)] if device == "cuda" else [(4, 32, 128, 2), (8, 128, 256, 4)])
    name_of = {torch.float16: "fp16", torch.bfloat16: "bf16"}[low]
    print(f"## amp O1 casts vs torch.autocast ({device}, {name_of}); ms per iteration, {args.calls} back-to-back calls")
    header = f"{'shape (b,s,d,layers)':<22} {'implementation':<28} {'fwd ms':>9} {'fwd+bwd ms':>11} {'vs fp32':>8}"
    print(header + "\n" + "-" * len(header))
    for batch, seq, dim, layers in shapes:
        torch.manual_seed(0)
        model = Model(dim, layers).to(device)
        tokens = torch.randint(0, VOCAB, (batch, seq), device=device)
        autocast = lambda: torch.autocast(device, dtype=low)  # noqa: E731
        cases = [("fp32 eager", contextlib.nullcontext, False), ("torch.autocast eager", autocast, False),
                 ("amp casts eager", contextlib.nullcontext, False)]
        if not args.no_compile:
            cases += [("torch.autocast compiled", autocast, True), ("amp casts compiled", contextlib.nullcontext, True)]
        rows = []
        for name, region, compiled in cases:
            handle = amp.init(patch_type=low) if name.startswith("amp") else None
            torch._dynamo.reset()
            rows.append(run_case(name, model, tokens, region, compiled, device, args.calls))
            if handle is not None:
                handle._deactivate()
        baseline = rows[0][2]
        for name, forward_ms, step_ms in rows:
            print(f"{str((batch, seq, dim, layers)):<22} {name:<28} {forward_ms:>9.3f} {step_ms:>11.3f} "
                  f"{baseline / step_ms:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
