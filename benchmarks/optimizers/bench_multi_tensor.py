"""amp_C multi-tensor kernels beside PyTorch's foreach/fused kernels on a GPT-like parameter set
(param_sets.gpt_medium_shapes: 289 fp32 tensors, 354.9M parameters).

Rows: an AdamW step (28 bytes/param: read p, g, m, v; write p, m, v), the global grad L2 norm
(4 bytes/param) and amp's unscale with inf/nan check (8 bytes/param, read and written in
place), each as % of the measured device copy bandwidth. The "1 flat" rows run the same amp_C
kernel, and PyTorch's equivalent, on one tensor of the same size: the gap to the 289-tensor
rows is what the many tensors cost (mostly host time before the kernel starts, which the timed
region includes), and the torch rows show what a single big tensor reaches with the same bytes.

    python benchmarks/optimizers/bench_multi_tensor.py
"""
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parents[1] / "compatibility"), str(HERE)]
from benchmarks.common import BandwidthTable, copy_bandwidth_gbs, require_gpu, time_ms  # noqa: E402
from param_sets import gpt_medium_shapes  # noqa: E402

CHUNK = 2048 * 32
LR, BETAS, EPS, WD = 1e-4, (0.9, 0.999), 1e-8, 0.01


def main():
    require_gpu(__file__)
    import amp_C  # the historical face (compatibility/amp_C.py) over torch.ops.apex

    device = "cuda"
    shapes = gpt_medium_shapes()
    params = [torch.randn(s, device=device) * 0.02 for s in shapes]
    grads = [torch.randn_like(p) * 1e-3 for p in params]
    numel = sum(p.numel() for p in params)
    table = BandwidthTable(f"{len(params)} fp32 tensors, {numel / 1e6:.1f}M params", copy_bandwidth_gbs(device))
    flag = torch.zeros(1, dtype=torch.int32, device=device)

    # ---- AdamW step
    exp_avgs = [torch.zeros_like(p) for p in params]
    exp_avg_sqs = [torch.zeros_like(p) for p in params]
    step = [0]

    def amp_c_adam():
        step[0] += 1
        amp_C.multi_tensor_adam(CHUNK, flag, [grads, params, exp_avgs, exp_avg_sqs], LR, *BETAS, EPS, step[0], 1, 1,
                                WD)

    adam_bytes = 28 * numel
    table.add("AdamW step", "amp_C.multi_tensor_adam", time_ms(amp_c_adam), adam_bytes)
    del exp_avgs, exp_avg_sqs
    flat_grads, flat_params = (torch.cat([t.flatten() for t in ts]) for ts in (grads, params))
    flat = [[flat_grads], [flat_params], [torch.zeros_like(flat_params)], [torch.zeros_like(flat_params)]]

    def amp_c_adam_flat():
        step[0] += 1
        amp_C.multi_tensor_adam(CHUNK, flag, flat, LR, *BETAS, EPS, step[0], 1, 1, WD)

    table.add("AdamW step", "amp_C, 1 flat", time_ms(amp_c_adam_flat), adam_bytes)
    del flat
    leaf = flat_params.requires_grad_()
    leaf.grad = flat_grads
    opt = torch.optim.AdamW([leaf], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    table.add("AdamW step", "torch fused, 1 flat", time_ms(opt.step), adam_bytes)
    del opt, leaf, flat_params
    torch.cuda.empty_cache()

    def torch_adamw(**kind):
        leaves = [p.clone().requires_grad_() for p in params]
        for leaf, g in zip(leaves, grads):
            leaf.grad = g
        return torch.optim.AdamW(leaves, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kind)

    for name, kind in (("torch AdamW foreach", {"foreach": True}), ("torch AdamW fused", {"fused": True})):
        opt = torch_adamw(**kind)
        table.add("AdamW step", name, time_ms(opt.step), adam_bytes)
        del opt
        torch.cuda.empty_cache()
    try:  # apex.optimizers is written beside this benchmark; time it when it is there
        from apex.optimizers import FusedAdam

        leaves = [p.clone().requires_grad_() for p in params]
        for leaf, g in zip(leaves, grads):
            leaf.grad = g
        opt = FusedAdam(leaves, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adam_w_mode=True)
        table.add("AdamW step", "apex FusedAdam", time_ms(opt.step), adam_bytes)
        del opt, leaves
        torch.cuda.empty_cache()
    except ImportError as err:
        print(f"(no apex FusedAdam row: {err})")

    # ---- global grad L2 norm (and per-tensor norms)
    norm_bytes = 4 * numel
    table.add("grad L2 norm", "amp_C.multi_tensor_l2norm",
              time_ms(lambda: amp_C.multi_tensor_l2norm(CHUNK, flag, [grads], True)), norm_bytes)
    table.add("grad L2 norm", "amp_C, 1 flat",
              time_ms(lambda: amp_C.multi_tensor_l2norm(CHUNK, flag, [[flat_grads]], True)), norm_bytes)
    table.add("grad L2 norm", "torch norm, 1 flat", time_ms(lambda: torch.linalg.vector_norm(flat_grads)),
              norm_bytes)
    table.add("grad L2 norm", "torch._foreach_norm",
              time_ms(lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))), norm_bytes)

    # ---- amp unscale with inf/nan check (in place)
    unscale_bytes = 8 * numel
    inv_scale = torch.full((1,), 1.0, device=device)
    found_inf = torch.zeros(1, device=device)
    table.add("unscale + inf check", "amp_C.multi_tensor_scale",
              time_ms(lambda: amp_C.multi_tensor_scale(CHUNK, flag, [grads, grads], 1.0)), unscale_bytes)
    table.add("unscale + inf check", "amp_C, 1 flat",
              time_ms(lambda: amp_C.multi_tensor_scale(CHUNK, flag, [[flat_grads], [flat_grads]], 1.0)),
              unscale_bytes)
    table.add("unscale + inf check", "torch mul_, 1 flat", time_ms(lambda: flat_grads.mul_(1.0)), unscale_bytes)
    table.add("unscale + inf check", "torch._amp_foreach_...",
              time_ms(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)),
              unscale_bytes)
    table.print()


if __name__ == "__main__":
    main()
