"""Small calls of every 16-bit RoPE path for compute-sanitizer memcheck, under whatever APEX_ROPE_VARIANT
the process has: half-split and interleaved, partial rotary dims with a lone copied vector, odd head
counts, bshd memory with a batch > 1, start positions, thd (tokens in no sequence), 2-D, cached tables,
angles past the fast-trig range, forward and backward."""
import torch

from apex.transformer.functional import (
    fused_apply_rotary_pos_emb,
    fused_apply_rotary_pos_emb_2d,
    fused_apply_rotary_pos_emb_cached,
    fused_apply_rotary_pos_emb_thd,
)

for dtype in (torch.bfloat16, torch.float16):
    for interleaved in (False, True):
        for s, b, h, d, d2 in [(5, 3, 7, 136, 128), (3, 2, 1, 40, 16), (4, 2, 5, 128, 64)]:
            t = torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True)
            freqs = torch.randn(s + 2, 1, 1, d2, device="cuda") * 3e6  # some units past 2^21 radians
            out = fused_apply_rotary_pos_emb(t, freqs, tensor_format="bshd", interleaved=interleaved,
                                             start_positions=torch.tensor([0, 2] + [1] * (b - 2), device="cuda"))
            out.backward(torch.randn_like(out))
            fused_apply_rotary_pos_emb_cached(t.detach().transpose(0, 1), freqs.cos(), freqs.sin(), True,
                                              interleaved=interleaved)
        cu = torch.tensor([0, 3, 3, 9], dtype=torch.int32, device="cuda")
        fused_apply_rotary_pos_emb_thd(torch.randn(11, 3, 128, device="cuda", dtype=dtype), cu,
                                       torch.randn(8, 1, 1, 64, device="cuda"), interleaved=interleaved)
    tables = [torch.randn(1, 4, 1, 64, device="cuda").cos(), torch.randn(1, 4, 1, 64, device="cuda").sin()] * 2
    fused_apply_rotary_pos_emb_2d(torch.randn(2, 12, 3, 128, device="cuda", dtype=dtype), 3, 4, *tables)
torch.cuda.synchronize()
print("memcheck case done")
