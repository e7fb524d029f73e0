"""clip_grad_norm_ over a GPT-sized set of gradients: apex.contrib.clip_grad (one multi-tensor L2-norm
launch per dtype, then one scaling pass) beside torch.nn.utils.clip_grad_norm_ (foreach) and
torch.compile of it.

Bytes that must move: the norm reads every gradient once; the scaling reads and writes them
(3x the gradients' bytes in all). max_norm is large, so gradients keep their values call to call.
Timing: CUDA-graph replays of 10 back-to-back calls (device time).

    python benchmarks/contrib/bench_clip_grad.py
"""
from __future__ import annotations

import torch

from _side_by_side import device_ms, new_table, require_gpu

from apex.contrib.clip_grad import clip_grad_norm_

# A 24-layer, 1024-wide transformer's parameter shapes (~350M parameters, 294 tensors).
LAYERS, WIDTH, VOCAB = 24, 1024, 50304
MAX_NORM = 1e9
# float32 (main gradients); each dtype costs a torch.compile of the 294-tensor loop.
DTYPES = {"fp32": torch.float32}


def gpt_grads(dtype):
    shapes = [(VOCAB, WIDTH), (2048, WIDTH)]
    for _ in range(LAYERS):
        shapes += [(3 * WIDTH, WIDTH), (3 * WIDTH,), (WIDTH, WIDTH), (WIDTH,), (4 * WIDTH, WIDTH), (4 * WIDTH,),
                   (WIDTH, 4 * WIDTH), (WIDTH,), (WIDTH,), (WIDTH,), (WIDTH,), (WIDTH,)]
    params = [torch.nn.Parameter(torch.empty(s, device="cuda", dtype=dtype)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def main() -> None:
    require_gpu(__file__)
    table = new_table("clip_grad_norm_, GPT-350M gradients")
    for name, dtype in DTYPES.items():
        params = gpt_grads(dtype)
        size = sum(p.numel() * p.element_size() for p in params)
        torch._dynamo.reset()
        compiled = torch.compile(torch.nn.utils.clip_grad_norm_)
        impls = {"apex": lambda: clip_grad_norm_(params, MAX_NORM),
                 "torch": lambda: torch.nn.utils.clip_grad_norm_(params, MAX_NORM),
                 "torch.compile": lambda: compiled(params, MAX_NORM)}
        for impl, fn in impls.items():
            ms, how = device_ms(fn)
            table.add(f"{name} {len(params)} tensors", impl + how, ms, 3 * size)
        del params
    table.print()


if __name__ == "__main__":
    main()
