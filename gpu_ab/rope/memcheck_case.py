"""Small RoPE cases for compute-sanitizer memcheck (APEX_ROPE_VARIANT=fast_path runs the fast-path trig):
angle tables in every dtype and layout the kernel tells apart, angles on both sides of sincosf's
fast-path limit, a few heads and tokens, partial rotary dims, thd and 2-D."""
import torch

from apex.transformer.functional import fused_apply_rotary_pos_emb, fused_apply_rotary_pos_emb_thd

for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for s, b, h, d, d2 in ((7, 2, 5, 128, 128), (3, 1, 2, 64, 32), (5, 3, 1, 6, 4)):
        for scale in (1.0, 3e5):
            for interleaved in (False, True):
                t = torch.randn(s, b, h, d, device="cuda", dtype=dtype, requires_grad=True)
                freqs = torch.randn(s, 1, 1, d2, device="cuda") * scale
                out = fused_apply_rotary_pos_emb(t, freqs, interleaved=interleaved)
                out.backward(torch.randn_like(out))
    x = torch.randn(11, 3, 128, device="cuda", dtype=dtype)
    fused_apply_rotary_pos_emb_thd(x, torch.tensor([0, 4, 9], dtype=torch.int32, device="cuda"),
                                   torch.randn(6, 1, 1, 64, device="cuda") * 1e5)
torch.cuda.synchronize()
print("memcheck case done")
