"""CPU AdamW step: amp_C.multi_tensor_adam beside torch.optim.AdamW(fused=True) and foreach.

A small GPT-like set (a few million fp32 parameters) so it runs in seconds on a laptop core.
Reports ms and the effective bandwidth (28 bytes/param: read p, g, m, v; write p, m, v).

    python benchmarks/optimizers/bench_cpu_adam.py
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "compatibility")]
from benchmarks.common import time_ms  # noqa: E402

LR, BETAS, EPS, WD = 1e-4, (0.9, 0.999), 1e-8, 0.01


def main(layers=4, d=256, vocab=4096):
    import amp_C

    per_layer = [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,), (d,), (d,), (d,), (d,)]
    shapes = [(vocab, d)] + per_layer * layers
    params = [torch.randn(s) * 0.02 for s in shapes]
    grads = [torch.randn_like(p) * 1e-3 for p in params]
    numel = sum(p.numel() for p in params)
    flag = torch.zeros(1, dtype=torch.int32)
    m, v = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    step = [0]

    def amp_c_adam():
        step[0] += 1
        amp_C.multi_tensor_adam(2048 * 32, flag, [grads, params, m, v], LR, *BETAS, EPS, step[0], 1, 1, WD)

    rows = [("amp_C.multi_tensor_adam", time_ms(amp_c_adam, warmup=3, iters=20, device="cpu"))]
    for name, kind in (("torch AdamW fused", {"fused": True}), ("torch AdamW foreach", {"foreach": True})):
        leaves = [p.clone().requires_grad_() for p in params]
        for leaf, g in zip(leaves, grads):
            leaf.grad = g
        opt = torch.optim.AdamW(leaves, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kind)
        rows.append((name, time_ms(opt.step, warmup=3, iters=20, device="cpu")))
    print(f"## CPU AdamW step: {len(params)} fp32 tensors, {numel / 1e6:.2f}M params, "
          f"{torch.get_num_threads()} threads")
    print(f"{'impl':<26} {'ms':>9} {'GB/s':>8}")
    for name, ms in rows:
        print(f"{name:<26} {ms:>9.3f} {28 * numel / (ms * 1e-3) / 1e9:>8.1f}")


if __name__ == "__main__":
    main()
