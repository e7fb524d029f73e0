"""Small forward calls that reach every kernel APEX_SOFTMAX_VARIANT adds (row kernel keeping its
exponentials; the whole-row kernel with and without keeping), for compute-sanitizer: each dtype at
the smallest width the whole-row kernel takes, a ragged width, its largest, with a mask shared by
the heads, a per-head mask and none, more rows than one block takes at once; checked against float64."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "compatibility")]

import torch  # noqa: E402

from apex._ops import ops  # noqa: E402


def reference(x, scale, mask):
    s = (x.double() * scale).masked_fill(mask, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0)


def main():
    op = ops("fused_softmax")
    torch.manual_seed(0)
    worst = 0.0
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        per_vector = 128 // torch.finfo(dtype).bits
        warp, low, high = 8 * 32 * per_vector, 2 * 1024 * per_vector, 8 * 1024 * per_vector
        for sk in (warp + per_vector, low + per_vector, 40000, high):
            for heads_in_mask in (1, 3, 0):
                x = torch.randn(1, 3, 5, sk, device="cuda").to(dtype) * 3
                if heads_in_mask == 0:
                    mask = torch.zeros(1, 1, 5, sk, dtype=torch.bool, device="cuda")
                    y = op.scaled_softmax_forward(x, 0.5)
                else:
                    mask = torch.rand(1, heads_in_mask, 5, sk, device="cuda") < 0.3
                    mask[0, 0, 1] = True
                    y = op.scaled_masked_softmax_forward(x, mask, 0.5)
                expected = reference(x, 0.5, mask.expand_as(x))
                worst = max(worst, ((y.double() - expected).abs().max() / expected.abs().max()).item())
    torch.cuda.synchronize()
    print(f"memcheck cases done, worst relative error {worst:.2e}")
    sys.exit(0 if worst < 1e-2 else 1)


if __name__ == "__main__":
    main()
