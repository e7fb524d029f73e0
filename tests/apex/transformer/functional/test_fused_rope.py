"""fused_rotary_positional_embedding ops and apex.transformer.functional.fused_rope against the unfused
PyTorch composite (Megatron's reference), on CPU and (marker gpu) CUDA: sbhd/bshd and any strides,
partial rotary dims, interleaved pairs, start positions, float32 or 16-bit tables, thd, 2-D, the
historical module, tracing and bad input; on the GPU also the cases the CUDA kernel tells apart and
angles past 1e5 radians, and on the CPU its work split (rope_plan.h, compiled with g++)."""
import itertools
from pathlib import Path

import pytest
import torch
from torch.library import opcheck

import fused_rotary_positional_embedding
from apex.transformer.functional import (
    fused_apply_rotary_pos_emb,
    fused_apply_rotary_pos_emb_2d,
    fused_apply_rotary_pos_emb_cached,
    fused_apply_rotary_pos_emb_thd,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# 16-bit results are the composite's own roundings (equal but for a last-ulp cos/sin difference
# between libraries); float32 differs by FMA contraction.
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def rotate(x, interleaved):
    if interleaved:
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def reference(t, cos, sin, interleaved=False):
    """Megatron's unfused RoPE in t's dtype: t * cos + rotate(t) * sin on the first d2 dims."""
    d2 = cos.shape[-1]
    rot, rest = t[..., :d2], t[..., d2:]
    return torch.cat((rot * cos.to(t.dtype) + rotate(rot, interleaved) * sin.to(t.dtype), rest), dim=-1)


def check(actual, expected, dtype):
    torch.testing.assert_close(actual.float(), expected.float(), rtol=TOL[dtype], atol=TOL[dtype])


def layouts(t):
    """t [s, b, h, d] as itself, with bshd memory, and with a non-unit d stride."""
    return {"sbhd": t, "bshd_memory": t.transpose(0, 1).contiguous().transpose(0, 1),
            "d_strided": t.transpose(2, 3).contiguous().transpose(2, 3)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cached", [False, True])
def test_sbhd_forward_backward(device, dtype, cached):
    s, b, h = 7, 2, 3
    for d, d2, interleaved, table_dtype in itertools.product([16, 64], [8, 16], [False, True], [torch.float32, dtype]):
        freqs = torch.randn(s + 3, 1, 1, d2, device=device).to(table_dtype)  # a table longer than s is fine
        cos, sin = freqs.float().cos().to(table_dtype), freqs.float().sin().to(table_dtype)
        for name, t in layouts(torch.randn(s, b, h, d, device=device).to(dtype)).items():
            for transpose in (False, True):
                t = t.detach().requires_grad_()
                if cached:
                    out = fused_apply_rotary_pos_emb_cached(t, cos, sin, transpose, interleaved=interleaved)
                else:
                    out = fused_apply_rotary_pos_emb(t, freqs, transpose, interleaved=interleaved)
                expected = reference(t, cos[:s], sin[:s], interleaved)
                check(out, expected, dtype)
                assert out.transpose(0, 1).is_contiguous() is transpose, name
                g = torch.randn_like(out)
                check(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_16bit_cached_tables_match_the_composite_exactly(device, dtype, interleaved):
    """Bit for bit, forward and backward (CUDA: the packed half2/bfloat162 arithmetic, whole rotary dim
    and a partial one with copied dims)."""
    for d, d2 in [(32, 32), (48, 16)]:
        t = torch.randn(9, 2, 4, d, device=device).to(dtype)
        angles = torch.randn(9, 1, 1, d2, device=device)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        out = fused_apply_rotary_pos_emb_cached(t, cos, sin, interleaved=interleaved)
        assert torch.equal(out, reference(t, cos, sin, interleaved))
        g = torch.randn_like(t)
        (grad,) = torch.autograd.grad(fused_apply_rotary_pos_emb_cached(t.requires_grad_(), cos, sin,
                                                                        interleaved=interleaved), t, g)
        assert torch.equal(grad, torch.autograd.grad(reference(t, cos, sin, interleaved), t, g)[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_bshd_format_and_start_positions(device, dtype):
    b, s, h, d = 3, 6, 2, 32
    freqs = torch.randn(20, 1, 1, d, device=device)
    t = torch.randn(b, s, h, d, device=device).to(dtype).requires_grad_()
    start = torch.tensor([0, 5, 14], device=device)
    out = fused_apply_rotary_pos_emb(t, freqs, tensor_format="bshd", start_positions=start)
    assert out.shape == t.shape and out.is_contiguous()
    rows = torch.stack([freqs[p:p + s, 0] for p in start.tolist()])  # [b, s, 1, d]
    expected = reference(t, rows.cos(), rows.sin())
    check(out, expected, dtype)
    g = torch.randn_like(out)
    check(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0], dtype)
    # the same through the cached tables, int32 offsets, and the bshd output laid out sbhd
    out = fused_apply_rotary_pos_emb_cached(t, freqs.cos(), freqs.sin(), True, tensor_format="bshd",
                                            start_positions=start.int())
    assert out.transpose(0, 1).is_contiguous()
    check(out, expected, dtype)


def check_thd(t, cu_seqlens, freqs, interleaved, dtype):
    """fused_apply_rotary_pos_emb_thd of t (tokens past the last sequence copied) against the reference per
    sequence, output and gradient; returns the output."""
    out = fused_apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, interleaved=interleaved)
    pieces = []
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        f = freqs[: end - start, 0]
        pieces.append(reference(t[start:end], f.cos(), f.sin(), interleaved))
    expected = torch.cat(pieces + [t[int(cu_seqlens[-1]):]])
    check(out, expected, dtype)
    g = torch.randn_like(out)
    check(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0], dtype)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_thd(device, dtype, interleaved):
    cu_seqlens = torch.tensor([0, 5, 5, 12, 20], dtype=torch.int32, device=device)  # with an empty sequence
    h, d, d2 = 3, 16, 8
    t = torch.randn(23, h, d, device=device).to(dtype).requires_grad_()  # tokens 20..22: in no sequence
    freqs = torch.randn(10, 1, 1, d2, device=device)
    check_thd(t, cu_seqlens, freqs, interleaved, dtype)


def check_2d(t, img_h, img_w, cos_h, sin_h, cos_w, sin_w, dtype):
    """fused_apply_rotary_pos_emb_2d of t [b, img_h * img_w, h, d] against the reference (rows rotate the
    first half of d, columns the second), output and gradient."""
    b, _, h, d = t.shape
    out = fused_apply_rotary_pos_emb_2d(t, img_h, img_w, cos_h, sin_h, cos_w, sin_w)
    q = t.view(b, img_h, img_w, h, d)
    rows = reference(q[..., : d // 2], cos_h[:, :img_h].unsqueeze(2), sin_h[:, :img_h].unsqueeze(2))
    cols = reference(q[..., d // 2:], cos_w[:, :img_w].unsqueeze(1), sin_w[:, :img_w].unsqueeze(1))
    expected = torch.cat((rows, cols), -1).view(b, img_h * img_w, h, d)
    check(out, expected, dtype)
    g = torch.randn_like(out)
    check(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_2d(device, dtype):
    b, img_h, img_w, h, d = 2, 3, 5, 2, 16
    t = torch.randn(b, img_h * img_w, h, d, device=device).to(dtype)
    t = t.transpose(2, 3).contiguous().transpose(2, 3).requires_grad_()  # non-unit d stride
    emb_h, emb_w = torch.randn(1, img_h + 2, 1, d // 2, device=device), torch.randn(1, img_w, 1, d // 2, device=device)
    cos_h, sin_h, cos_w, sin_w = emb_h.cos().to(dtype), emb_h.sin().to(dtype), emb_w.cos(), emb_w.sin()
    check_2d(t, img_h, img_w, cos_h, sin_h, cos_w, sin_w, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_historical_module(device):
    t = torch.randn(5, 2, 3, 8, device=device)
    freqs = torch.randn(5, 1, 1, 8, device=device)
    g = torch.randn_like(t)
    m = fused_rotary_positional_embedding
    check(m.forward(t, freqs, False), reference(t, freqs.cos(), freqs.sin()), torch.float32)
    expected_grad = torch.autograd.grad(reference(t.requires_grad_(), freqs.cos(), freqs.sin()), t, g)[0]
    check(m.backward(g, freqs, False), expected_grad, torch.float32)
    check(m.backward_cached(g, freqs.cos(), freqs.sin(), True), expected_grad, torch.float32)
    cu = torch.tensor([0, 5], dtype=torch.int32, device=device)
    check(m.backward_thd(g[:, 0], cu, freqs), expected_grad[:, 0], torch.float32)
    image = t.detach().view(1, 5, 2, 3, 8)  # [b=1, ih=5, iw=2, h=3, d=8]
    tables = [freqs.view(1, 5, 1, 8)[..., :4].cos(), freqs.view(1, 5, 1, 8)[..., :4].sin()] * 2
    assert m.forward_2d(image, *tables).shape == (1, 10, 3, 8)
    assert m.backward_2d(image, *tables).shape == (1, 10, 3, 8)
    assert {"forward", "backward", "forward_cached", "backward_cached", "forward_thd", "backward_thd", "forward_2d",
            "backward_2d"} <= set(dir(m))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_pass_through_only(device):
    t = torch.randn(0, 2, 3, 8, device=device)
    assert fused_apply_rotary_pos_emb(t, torch.randn(4, 1, 1, 8, device=device)).shape == t.shape
    t = torch.randn(4, 2, 3, 8, device=device)
    assert torch.equal(fused_apply_rotary_pos_emb(t, torch.randn(4, 1, 1, 0, device=device)), t)  # nothing rotated
    assert fused_apply_rotary_pos_emb_thd(t[:0, 0], torch.zeros(1, dtype=torch.int32, device=device),
                                          torch.randn(4, 1, 1, 8, device=device)).shape == (0, 3, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    t = torch.randn(4, 2, 3, 8, device=device)
    freqs = torch.randn(4, 1, 1, 8, device=device)
    op = torch.ops.apex.fused_rope_forward
    fused_apply_rotary_pos_emb(t, freqs)  # loads the library
    with pytest.raises(RuntimeError, match="must be float32, float16 or bfloat16"):
        op(t.double(), freqs)
    with pytest.raises(RuntimeError, match="must be 4-D"):
        op(t[0], freqs)
    with pytest.raises(RuntimeError, match=r"must have shape \[positions, 1, 1, rotary dims\]"):
        op(t, freqs.view(4, 1, 8, 1))
    with pytest.raises(RuntimeError, match="must be float32 or Float"):
        op(t, freqs.double())
    with pytest.raises(RuntimeError, match="must be even and at most the head dim"):
        op(t, torch.randn(4, 1, 1, 10, device=device))
    with pytest.raises(RuntimeError, match="must be even and at most the head dim"):
        op(t, freqs[..., :5])
    with pytest.raises(RuntimeError, match="has 3 positions but the input has s = 4"):
        op(t, freqs[:3])
    with pytest.raises(RuntimeError, match="freqs is on meta"):
        op(t, freqs.to("meta"))
    with pytest.raises(RuntimeError, match="start_positions must be int32 or int64"):
        op(t, freqs, start_positions=torch.zeros(2, device=device))
    with pytest.raises(RuntimeError, match="sin must match cos"):
        torch.ops.apex.fused_rope_forward_cached(t, freqs, freqs[:2])
    with pytest.raises(RuntimeError, match="cu_seqlens must be int32"):
        torch.ops.apex.fused_rope_forward_thd(t[:, 0], torch.zeros(2, device=device), freqs)
    with pytest.raises(RuntimeError, match="multiple of 4"):
        torch.ops.apex.fused_rope_forward_2d(torch.randn(1, 2, 2, 1, 6, device=device), *[freqs.view(1, 4, 1, 8)[..., :3]] * 4)
    with pytest.raises(RuntimeError, match="cos_w must have shape"):
        torch.ops.apex.fused_rope_forward_2d(torch.randn(1, 2, 5, 1, 8, device=device), *[freqs.view(1, 4, 1, 8)[..., :4]] * 4)
    with pytest.raises(ValueError, match="tensor_format"):
        fused_apply_rotary_pos_emb(t, freqs, tensor_format="hsbd")


def test_position_outside_the_table_raises_on_cpu():
    t = torch.randn(4, 2, 3, 8)
    with pytest.raises(RuntimeError, match="outside the table"):
        fused_apply_rotary_pos_emb(t, torch.randn(6, 1, 1, 8), start_positions=torch.tensor([0, 3]))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    t = torch.randn(5, 2, 3, 8, device=device, requires_grad=True)
    freqs = torch.randn(6, 1, 1, 4, device=device)
    start = torch.tensor([0, 1], device=device)
    opcheck(torch.ops.apex.fused_rope_forward, (t, freqs, True), {"interleaved": True, "start_positions": start})
    opcheck(torch.ops.apex.fused_rope_backward, (t.detach(), freqs, False))
    opcheck(torch.ops.apex.fused_rope_forward_cached, (t, freqs.cos(), freqs.sin(), False))
    opcheck(torch.ops.apex.fused_rope_backward_cached, (t.detach(), freqs.cos(), freqs.sin(), True))
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    opcheck(torch.ops.apex.fused_rope_forward_thd, (t[:, 0], cu, freqs))
    opcheck(torch.ops.apex.fused_rope_backward_thd, (t[:, 0].detach(), cu, freqs))
    image = torch.randn(2, 3, 2, 2, 8, device=device, requires_grad=True)
    tables = [torch.randn(1, 3, 1, 4, device=device)] * 4
    opcheck(torch.ops.apex.fused_rope_forward_2d, (image, *tables))
    opcheck(torch.ops.apex.fused_rope_backward_2d, (image.detach(), *tables))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()

    def loss(q, k, freqs, w):
        return (fused_apply_rotary_pos_emb(q, freqs, tensor_format="bshd") * w).sum() + \
            (fused_apply_rotary_pos_emb(k, freqs, tensor_format="bshd", interleaved=True) * w).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=dynamic)
    for s in (6, 9):
        q = torch.randn(2, s, 3, 16, device=device, requires_grad=True)
        k = torch.randn(2, s, 3, 16, device=device, requires_grad=True)
        freqs, w = torch.randn(s, 1, 1, 16, device=device), torch.randn(2, s, 3, 16, device=device)
        grads = torch.autograd.grad(compiled(q, k, freqs, w), (q, k))
        expected = torch.autograd.grad(loss(q, k, freqs, w), (q, k))
        for g, e in zip(grads, expected):
            torch.testing.assert_close(g, e)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_llama_shapes_on_gpu(dtype):
    """Head dims and head counts of Llama-class models (vector path) and odd ones (scalar path)."""
    for s, b, h, d, d2 in [(128, 2, 32, 128, 128), (64, 1, 8, 128, 64), (33, 3, 5, 6, 4), (16, 2, 4, 96, 96)]:
        freqs = torch.randn(s, 1, 1, d2, device="cuda") * 50  # large angles, as at long positions
        t = torch.randn(b, s, h, d, device="cuda").to(dtype).requires_grad_()
        for interleaved in (False, True):
            out = fused_apply_rotary_pos_emb(t, freqs, tensor_format="bshd", interleaved=interleaved)
            expected = reference(t, freqs.transpose(0, 1).cos(), freqs.transpose(0, 1).sin(), interleaved)
            check(out, expected, dtype)
            g = torch.randn_like(out)
            check(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0], dtype)


@pytest.mark.gpu
def test_int64_offsets_past_two_billion_elements():
    """t [16385, 1, 128, 1024] bf16 has 2^31 + 131072 elements: the last tokens sit past int32 offsets."""
    s, h, d = 16385, 128, 1024
    t = torch.randn(s, 1, h, d, device="cuda", dtype=torch.bfloat16)
    freqs = torch.randn(s, 1, 1, d, device="cuda")
    out = fused_apply_rotary_pos_emb(t, freqs)
    check(out[-2:], reference(t[-2:], freqs[-2:].cos(), freqs[-2:].sin()), torch.bfloat16)


def _memory_variants(t):
    """t [s, b, h, d] as sbhd views over different memory: contiguous, bshd memory, heads apart (h
    outermost of the token dims), a slice of wider heads, and data not 16-byte aligned (the CUDA
    kernel's one-element path); all but the last keep its 16-byte vector path."""
    s, b, h, d = t.shape
    wider = torch.zeros(s, b, h, d + 16, device=t.device, dtype=t.dtype)
    wider[..., :d] = t
    flat = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
    misaligned = flat[1:].view(t.shape)
    misaligned.copy_(t)
    return {"sbhd": t, "bshd_memory": t.transpose(0, 1).contiguous().transpose(0, 1),
            "heads_apart": t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3), "sliced": wider[..., :d],
            "misaligned": misaligned}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_cuda_kernel_cases(dtype, interleaved):
    """What the CUDA kernel tells apart, forward and backward against the composite: head counts around
    its batch of 4 heads in flight (1, 3, 5, 8, 64, 130), a token or two with many heads (the heads then
    split over blocks), partial rotary dims (copied units beside rotated ones in a warp), heads wider
    than a block of units (d = 4096), any memory layout (_memory_variants), angle tables whose rows are
    or are not whole 16-byte vectors, and cached cos/sin in float32 or the data's dtype."""
    torch.manual_seed(0)
    shapes = [(1, 1, 64, 128, 128), (2, 3, 130, 64, 32), (37, 2, 1, 128, 64), (16, 3, 3, 128, 128),
              (64, 2, 8, 96, 32), (5, 1, 5, 256, 256), (33, 2, 5, 128, 96), (3, 1, 2, 4096, 4096)]
    for s, b, h, d, d2 in shapes:
        freqs = torch.randn(s + 5, 1, 1, d2, device="cuda") * 20
        padded = torch.zeros(s + 5, 1, 1, d2 + 2, device="cuda")
        padded[..., :d2] = freqs
        cos, sin = freqs[:s].cos(), freqs[:s].sin()
        for name, t in _memory_variants(torch.randn(s, b, h, d, device="cuda").to(dtype)).items():
            t = t.detach().requires_grad_()
            expected = reference(t, cos, sin, interleaved)
            g = torch.randn_like(expected)
            expected_grad = torch.autograd.grad(expected, t, g)[0]
            calls = {
                "angles": lambda: fused_apply_rotary_pos_emb(t, freqs, interleaved=interleaved),
                "angles, rows not whole vectors": lambda: fused_apply_rotary_pos_emb(t, padded[..., :d2],
                                                                                     interleaved=interleaved),
                "cached float32": lambda: fused_apply_rotary_pos_emb_cached(t, freqs.cos(), freqs.sin(),
                                                                            interleaved=interleaved),
            }
            for call, run in calls.items():
                out = run()
                check(out, expected, dtype)
                check(torch.autograd.grad(out, t, g)[0], expected_grad, dtype)
            # Cached tables in the data's dtype: the composite rounds cos/sin the same way, so equal.
            c16, s16 = freqs.cos().to(dtype), freqs.sin().to(dtype)
            out = fused_apply_rotary_pos_emb_cached(t, c16, s16, interleaved=interleaved)
            check(out, reference(t, c16[:s], s16[:s], interleaved), dtype)
        # The bshd face, with start positions.
        t = torch.randn(b, s, h, d, device="cuda").to(dtype)
        start = torch.arange(b, device="cuda") % 6
        out = fused_apply_rotary_pos_emb(t, freqs, tensor_format="bshd", interleaved=interleaved,
                                         start_positions=start)
        rows = torch.stack([freqs[p:p + s, 0] for p in start.tolist()])  # [b, s, 1, d2]
        check(out, reference(t, rows.cos(), rows.sin(), interleaved), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_large_positions_on_gpu(dtype, interleaved):
    """A 70000-position table of position x inverse frequency (times 3, so that the fastest dims also
    pass sincosf's fast-path limit of ~1e5 radians), through start_positions (bshd) and a 70000-token
    packed sequence (thd): float32 to 1e-5, so cos/sin must be accurate at such angles (an unreduced
    fast sincos is off by O(1) there). 16-bit at 2e-2: among ~18M outputs, a last-bit difference
    between float cos/sin implementations can flip a 16-bit rounding (one 16-bit ulp of cos, times
    |x|) where the output cancels; the CPU kernel's Sleef against torch's cos did once."""
    torch.manual_seed(0)

    def check(actual, expected, dtype):
        tol = TOL[dtype] if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)

    rows, d, h = 70000, 128, 8
    inv_freq = 3.0 / (10000 ** (torch.arange(0, d, 2, device="cuda").float() / d))
    f = torch.outer(torch.arange(rows, device="cuda").float(), inv_freq)
    freqs = (torch.repeat_interleave(f, 2, -1) if interleaved else torch.cat((f, f), -1)).view(rows, 1, 1, d)
    assert freqs.max() > 2e5
    b, s = 4, 16
    start = torch.tensor([0, 35000, 69000, rows - s], device="cuda")
    t = torch.randn(b, s, h, d, device="cuda").to(dtype).requires_grad_()
    out = fused_apply_rotary_pos_emb(t, freqs, tensor_format="bshd", interleaved=interleaved, start_positions=start)
    angles = torch.stack([freqs[p:p + s, 0] for p in start.tolist()])  # [b, s, 1, d]
    expected = reference(t, angles.cos(), angles.sin(), interleaved)
    check(out, expected, dtype)
    g = torch.randn_like(out)
    check(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0], dtype)
    cu_seqlens = torch.tensor([0, rows, rows + 5], dtype=torch.int32, device="cuda")
    x = torch.randn(rows + 5, 2, d, device="cuda").to(dtype)
    out = fused_apply_rotary_pos_emb_thd(x, cu_seqlens, freqs, interleaved=interleaved)
    expected = torch.cat((reference(x[:rows], freqs[:, 0].cos(), freqs[:, 0].sin(), interleaved),
                          reference(x[rows:], freqs[:5, 0].cos(), freqs[:5, 0].sin(), interleaved)))
    check(out, expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_thd_and_2d_vector_path_on_gpu(dtype):
    """thd (tokens in no sequence copied, an empty sequence) and 2-D RoPE (two sections) with head dims
    the CUDA kernel reads as 16-byte vectors."""
    torch.manual_seed(0)
    cu_seqlens = torch.tensor([0, 5, 5, 300, 1000], dtype=torch.int32, device="cuda")
    h, d, d2 = 3, 128, 64
    freqs = torch.randn(700, 1, 1, d2, device="cuda") * 10
    for interleaved in (False, True):
        t = torch.randn(1003, h, d, device="cuda").to(dtype).requires_grad_()
        out = check_thd(t, cu_seqlens, freqs, interleaved, dtype)
        assert torch.equal(out[1000:], t[1000:])
    b, img_h, img_w, h, d = 2, 5, 7, 3, 128
    t = torch.randn(b, img_h * img_w, h, d, device="cuda").to(dtype).requires_grad_()
    emb_h, emb_w = torch.randn(1, img_h + 2, 1, d // 2, device="cuda"), torch.randn(1, img_w, 1, d // 2, device="cuda")
    cos_h, sin_h, cos_w, sin_w = emb_h.cos(), emb_h.sin(), emb_w.cos().to(dtype), emb_w.sin().to(dtype)
    check_2d(t, img_h, img_w, cos_h, sin_h, cos_w, sin_w, dtype)


def _floats_near(x, ulps):
    """Every float32 within `ulps` units in the last place of each of the floats x (a 1-D tensor)."""
    bits = x.float().view(torch.int32).unsqueeze(1) + torch.arange(-ulps, ulps + 1, device=x.device, dtype=torch.int32)
    return bits.flatten().view(torch.float32)


def _trig_sweep(device):
    """Non-negative floats for the kernel's trig: one float in 61 of [0, 2^17] (every binade; sincosf's
    fast path ends at 105615), every float near sincosf's fast-path limit, near multiples of pi/4 (where
    the quadrant rounding flips and where the reduced angle cancels) and near 2^17, and edges
    (denormals, FLT_MAX, inf, NaN)."""
    top = int(torch.tensor(2.0 ** 17).view(torch.int32))
    swept = torch.arange(0, top + 1, 61, device=device, dtype=torch.int32).view(torch.float32)
    marks = torch.tensor([105615.0, 2.0 ** 17, 1.0, 0.5], device=device)
    quarters = torch.cat((torch.arange(1, 65, device=device), torch.tensor([1000, 33333, 67237, 67238], device=device)))
    marks = torch.cat((marks, quarters.double().mul(torch.pi / 4).float()))
    edges = torch.tensor([0.0, 1e-45, 1.17549435e-38, 3.4028235e38, float("inf"), float("nan")], device=device)
    return torch.cat((swept, _floats_near(marks, 2048), edges))


@pytest.mark.gpu
def test_angle_trig_matches_sincosf_bit_for_bit():
    """cos and sin of the kernel's angle tables are CUDA's sincosf's (torch.cos / torch.sin on the GPU
    are), bit for bit over _trig_sweep and its negatives, on both sides of sincosf's fast-path limit:
    float32 data of ones and zeros, so that the outputs are the coefficients themselves (-0 and +0 compare
    equal; NaN equals NaN). Angles paired as a unit holds them: a and b different, and the same (one
    sincos for both)."""
    m = 64  # angles per half of a table row: d = 2m, 8 rotated units of float32 vectors a token
    x = _trig_sweep("cuda")
    x = torch.cat((x, x[: (-x.numel()) % m].flip(0)))  # whole rows
    f = x.view(-1, 1, 1, m)
    ones, zeros = torch.ones_like(f), torch.zeros_like(f)
    for g in (-f, f):  # b's angles: the negatives, and a's own (the shared sincos)
        freqs = torch.cat((f, g), -1)
        exact = dict(rtol=0, atol=0, equal_nan=True)
        # forward: out_a = xa cos(f) - xb sin(f), out_b = xb cos(g) + xa sin(g)
        out = fused_apply_rotary_pos_emb(torch.cat((ones, zeros), -1), freqs)
        torch.testing.assert_close(out[..., :m], f.cos(), **exact)
        torch.testing.assert_close(out[..., m:], g.sin(), **exact)
        out = fused_apply_rotary_pos_emb(torch.cat((zeros, ones), -1), freqs)
        torch.testing.assert_close(out[..., :m], -f.sin(), **exact)
        torch.testing.assert_close(out[..., m:], g.cos(), **exact)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_bench_shapes_match_the_composite_exactly(dtype):
    """benchmarks/transformer/bench_rope.py's cases (random angle tables, as it draws them) forward and
    backward bit for bit against the composite in the data's dtype (which rounds torch's cos/sin, that is
    sincosf's, to 16 bits), and one whose angles pass sincosf's fast-path limit (105615) with probability
    ~3.5% each: about half of the units then hold an angle that takes sincosf's Payne-Hanek reduction,
    beside units whose angles all take its fast path."""
    torch.manual_seed(0)
    cases = [((4096, 2, 32, 128), 128, "sbhd", 1.0), ((1, 8192, 32, 128), 128, "bshd", 1.0),
             ((1, 32768, 8, 128), 128, "bshd", 1.0), ((2, 4096, 64, 128), 128, "bshd", 1.0),
             ((2, 4096, 32, 128), 64, "bshd", 1.0), ((2, 512, 8, 128), 128, "bshd", 5e4)]
    for shape, rotary, tensor_format, scale in cases:
        s = shape[0] if tensor_format == "sbhd" else shape[1]
        t = torch.randn(shape, device="cuda", dtype=dtype).requires_grad_()
        freqs = torch.randn(s, 1, 1, rotary, device="cuda") * scale
        out = fused_apply_rotary_pos_emb(t, freqs, tensor_format=tensor_format)
        angles = freqs.transpose(0, 1) if tensor_format == "bshd" else freqs
        expected = reference(t, angles.cos(), angles.sin())
        assert torch.equal(out, expected), (shape, rotary, scale)
        g = torch.randn_like(out)
        assert torch.equal(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0]), (shape, rotary)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_16bit_head_walk_matches_the_composite_exactly(dtype, interleaved):
    """A thread's walk over a token's heads, forward and backward bit for bit against the composite:
    every head count from 1 to 9 around the 4 heads it keeps in flight (with 64K tokens, ~10 loops of the grid's
    blocks: rope_plan.h's grid_shape then keeps the heads in one group, so a thread walks them all),
    a token with many heads (split over head groups), partial rotary dims (copied units beside rotated
    ones), heads wider than a block of units (d = 4096), and heads apart in memory (x's head stride is
    not d)."""
    torch.manual_seed(0)
    shapes = [(32768, 2, h, 128, 128) for h in range(1, 10)]
    shapes += [(2, 1, 130, 64, 32), (1, 1, 64, 128, 128), (9, 2, 5, 128, 64), (2, 1, 3, 4096, 4096)]
    for s, b, h, d, d2 in shapes:
        freqs = torch.randn(s, 1, 1, d2, device="cuda") * 20
        for t in (torch.randn(s, b, h, d, device="cuda").to(dtype),
                  torch.randn(s, h, b, d, device="cuda").to(dtype).transpose(1, 2)):
            t = t.detach().requires_grad_()
            out = fused_apply_rotary_pos_emb(t, freqs, interleaved=interleaved)
            expected = reference(t, freqs.cos(), freqs.sin(), interleaved)
            assert torch.equal(out, expected), (s, b, h, d, d2)
            g = torch.randn_like(out)
            assert torch.equal(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0]), (s, b, h, d)


def _angle_rows(table, start, s, tensor_format):
    """The angles of every token: table rows start[j] .. start[j] + s for sequence j, as [s, b, 1, d2]
    (sbhd) or [b, s, 1, d2] (bshd), in float32 (the composite's cos / sin in float, rounded to t's dtype
    by reference)."""
    return torch.stack([table[p:p + s, 0].float() for p in start.tolist()], dim=1 if tensor_format == "sbhd" else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_16bit_angle_table_edges_match_the_composite_exactly(dtype, interleaved):
    """The 16-bit angle-table path (the kernel computes each token's cos/sin from the angles and rounds
    them to t's dtype) bit for bit against the composite, forward and backward: sbhd and bshd, start
    positions (up to the table's last row) and none (the first s rows), partial rotary dims (copied
    packs beside rotated ones), odd head counts, heads wider than a block of packs (d = 4096), a token with 130 heads, one
    token, heads apart in memory, the transposed output, and angle tables in float32, in t's dtype, with
    rows that are not whole 16-byte vectors, and of a single row."""
    torch.manual_seed(0)
    shapes = [(7, 3, 1, 128, 128), (33, 2, 3, 128, 64), (16, 5, 7, 48, 16), (9, 2, 5, 4096, 4096),
              (3, 1, 130, 64, 32), (1, 4, 3, 64, 64), (40, 3, 9, 128, 128)]
    for s, b, h, d, d2 in shapes:
        rows = s + 6
        freqs = torch.randn(rows, 1, 1, d2, device="cuda") * 20
        padded = torch.zeros(rows, 1, 1, d2 + 2, device="cuda")
        padded[..., :d2] = freqs
        tables = {"float32": freqs, "16-bit": freqs.to(dtype), "rows not whole vectors": padded[..., :d2]}
        starts = {"none": None, "offsets": torch.tensor([(5 * j) % 7 for j in range(b)], device="cuda")}
        starts["offsets"][-1] = rows - s  # the table's last row
        for (table_name, table), (start_name, start), tensor_format in itertools.product(
                tables.items(), starts.items(), ("sbhd", "bshd")):
            shape = (s, b, h, d) if tensor_format == "sbhd" else (b, s, h, d)
            x = torch.randn(shape, device="cuda").to(dtype)
            heads_apart = x.transpose(-2, 0).contiguous().transpose(-2, 0)  # h outermost in memory
            angles = _angle_rows(table, start if start is not None else torch.zeros(b, dtype=torch.long), s,
                                 tensor_format)
            for t, transpose in ((x, False), (heads_apart, True)):
                t = t.detach().requires_grad_()
                out = fused_apply_rotary_pos_emb(t, table, transpose, tensor_format=tensor_format,
                                                 interleaved=interleaved, start_positions=start)
                expected = reference(t, angles.cos(), angles.sin(), interleaved)
                where = (s, b, h, d, d2, table_name, start_name, tensor_format, transpose)
                assert torch.equal(out, expected), where
                g = torch.randn_like(out)
                assert torch.equal(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0]), where
    # A single-row table (row stride 0) for s = 1.
    t = torch.randn(1, 3, 2, 64, device="cuda").to(dtype)
    freqs = torch.randn(1, 1, 1, 64, device="cuda") * 20
    assert torch.equal(fused_apply_rotary_pos_emb(t, freqs, interleaved=interleaved),
                       reference(t, freqs.cos(), freqs.sin(), interleaved))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_angle_table_empty_input(dtype):
    """No tokens, no sequences or no heads, with and without start positions, forward and backward: the
    16-bit angle-table path launches nothing (no zero-block grid) and returns empty results."""
    freqs = torch.randn(4, 1, 1, 64, device="cuda")
    for shape in [(0, 2, 3, 64), (4, 0, 3, 64), (4, 2, 0, 64)]:
        for tensor_format in ("sbhd", "bshd"):
            t = torch.randn(shape, device="cuda").to(dtype).requires_grad_()
            b = shape[1] if tensor_format == "sbhd" else shape[0]
            for start in (None, torch.zeros(b, dtype=torch.long, device="cuda")):
                out = fused_apply_rotary_pos_emb(t, freqs, tensor_format=tensor_format, start_positions=start)
                assert out.shape == t.shape
                (grad,) = torch.autograd.grad(out, t, torch.ones_like(out))
                assert grad.shape == t.shape
    torch.cuda.synchronize()


def _check_exact(t, freqs, start, tensor_format, interleaved, transpose, where):
    """fused_apply_rotary_pos_emb of t against the composite bit for bit, forward and backward."""
    b = t.shape[1] if tensor_format == "sbhd" else t.shape[0]
    s = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
    angles = _angle_rows(freqs, start if start is not None else torch.zeros(b, dtype=torch.long), s, tensor_format)
    t = t.detach().requires_grad_()
    out = fused_apply_rotary_pos_emb(t, freqs, transpose, tensor_format=tensor_format, interleaved=interleaved,
                                     start_positions=start)
    expected = reference(t, angles.cos(), angles.sin(), interleaved)
    assert torch.equal(out, expected), where
    g = torch.randn_like(out)
    assert torch.equal(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0]), where


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_16bit_head_batch_edges_match_the_composite_exactly(dtype, interleaved):
    """A thread's walk over its tokens' heads in batches of kHeadsInFlight, bit for bit against the
    composite, forward and backward: 1, 2, 3, 5 and 9 heads a token (one batch, a
    partial last batch, several batches); one token a thread (8192 tokens fill the grid's slots once),
    one or two (9000: the last token ends early for part of a warp) and ~4 (32768); full and partial
    rotary dims (copied units beside rotated ones); sbhd and bshd, with start positions; heads apart
    in memory with the transposed output; then several units a thread per token (d = 8192), heads
    split over head groups (2 tokens x 130 heads) and data off 16-byte alignment (one-element path)."""
    torch.manual_seed(0)
    d = 128
    for heads, tokens, d2, tensor_format in itertools.product((1, 2, 3, 5, 9), (8192, 9000, 32768), (128, 64),
                                                              ("sbhd", "bshd")):
        b = 2
        s = tokens // b
        freqs = torch.randn(s + 3, 1, 1, d2, device="cuda") * 20
        start = torch.tensor([3, 1], device="cuda") if tensor_format == "bshd" else None
        shape = (s, b, heads, d) if tensor_format == "sbhd" else (b, s, heads, d)
        x = torch.randn(shape, device="cuda").to(dtype)
        heads_apart = x.transpose(-2, 0).contiguous().transpose(-2, 0)
        for t, transpose in ((x, False), (heads_apart, True)):
            _check_exact(t, freqs, start, tensor_format, interleaved, transpose,
                         (heads, tokens, d2, tensor_format, transpose))
    for s, b, heads, dd, d2 in [(3, 1, 1, 8192, 8192), (5, 2, 3, 8192, 4096), (2, 1, 130, 64, 32),
                                (2, 1, 130, 128, 128), (37, 3, 5, 4096, 4096)]:
        freqs = torch.randn(s, 1, 1, d2, device="cuda") * 20
        _check_exact(torch.randn(s, b, heads, dd, device="cuda").to(dtype), freqs, None, "sbhd", interleaved, False,
                     (s, b, heads, dd, d2))
    for heads, tokens in itertools.product((1, 2, 3, 5, 9), (8192, 32768)):
        flat = torch.randn(tokens * heads * d + 1, device="cuda").to(dtype)
        t = flat[1:].view(tokens // 2, 2, heads, d)  # off 16-byte alignment
        _check_exact(t, torch.randn(tokens // 2, 1, 1, d, device="cuda") * 20, None, "sbhd", interleaved, False,
                     ("misaligned", heads, tokens))


@pytest.mark.gpu
@pytest.mark.parametrize("interleaved", [False, True])
def test_float32_head_batch_edges(interleaved):
    """The float32 kernels (4-wide vectors, and the one-element path for misaligned data) through the same
    head-batch edges as the 16-bit test, against the composite within float32's tolerance (FMA contraction)."""
    torch.manual_seed(0)
    d = 128
    for heads, tokens, d2 in itertools.product((1, 2, 3, 5, 9), (8192, 9000, 32768), (128, 64)):
        b, s = 2, tokens // 2
        freqs = torch.randn(s, 1, 1, d2, device="cuda") * 20
        x = torch.randn(s, b, heads, d, device="cuda")
        flat = torch.empty(x.numel() + 1, device="cuda")
        misaligned = flat[1:].view(x.shape)
        misaligned.copy_(x)
        for t in (x, misaligned):
            t = t.detach().requires_grad_()
            out = fused_apply_rotary_pos_emb(t, freqs, interleaved=interleaved)
            expected = reference(t, freqs.cos(), freqs.sin(), interleaved)
            check(out, expected, torch.float32)
            g = torch.randn_like(out)
            check(torch.autograd.grad(out, t, g)[0], torch.autograd.grad(expected, t, g)[0], torch.float32)


# ---- the CUDA kernel's work split (csrc/fused_rope/rope_plan.h), checked on the CPU ------------------

PLAN_CHECK = r"""
#include <algorithm>
#include <cstdio>
#include <vector>
#include "rope_plan.h"
using namespace apex::fused_rope;

// Runs the CUDA kernel's loops (blocks, threads, tokens, units, heads) on the host for one shape and
// counts the visits of every (token, head, dim); rotated dims must come as RoPE's pairs.
static int check(long tokens, int heads, int dim, int width, int sections, bool interleaved, int vec, long capacity) {
  const UnitMap m = unit_map(vec, dim, width, sections, interleaved);
  LaunchPlan p = block_shape(tokens, m);
  grid_shape(tokens, heads, capacity, p);
  std::vector<int> seen(tokens * heads * dim, 0);
  int bad = 0;
  auto fail = [&](const char* what, long t, int h, int d) {
    if (bad++ < 5) std::printf("FAIL %s: tokens %ld heads %d dim %d width %d sections %d interleaved %d vec %d"
                               " capacity %ld at token %ld head %d dim %d\n", what, tokens, heads, dim, width,
                               sections, interleaved, vec, capacity, t, h, d);
  };
  if (p.cols * p.rows > kMaxThreads || p.cols < 1 || p.rows < 1 || p.blocks < 1 || p.groups < 1 ||
      p.groups > kMaxGroups || (long)p.blocks * p.groups > std::max(capacity, 1L)) fail("launch shape", 0, 0, 0);
  for (int by = 0; by < p.groups; ++by)
    for (unsigned bx = 0; bx < p.blocks; ++bx)
      for (int ty = 0; ty < p.rows; ++ty)
        for (int tx = 0; tx < p.cols; ++tx) {
          const int h_begin = by * p.heads_per_group, h_end = std::min(heads, h_begin + p.heads_per_group);
          for (long t = (long)bx * p.rows + ty; t < tokens; t += (long)p.blocks * p.rows)
            for (int k = tx; k < m.units; k += p.cols) {
              const Unit u = unit_at(m, k);
              for (int h = h_begin; h < h_end; ++h) {
                int* row = &seen[(t * heads + h) * dim];
                for (int q = 0; q < vec; ++q) {
                  if (!u.rotated) {
                    const int e = u.ea + q;
                    if (e < sections * width || e >= dim) fail("copied dim", t, h, e);
                    else ++row[e];
                    continue;
                  }
                  int da, db;
                  pair_dims(m, u, q, da, db);
                  const int base = u.section * width;
                  const bool pair = interleaved ? ((da - base) % 2 == 0 && db == da + 1)
                                                : (da - base < width / 2 && db == da + width / 2);
                  if (da < base || db >= base + width || !pair) fail("pair", t, h, da);
                  else ++row[da], ++row[db];
                  // The unit's vectors: a = [ea, ea + vec), b = [eb, eb + vec) hold exactly its pairs' dims.
                  const bool in_a = da >= u.ea && da < u.ea + vec, in_b = db >= u.eb && db < u.eb + vec;
                  const bool in_ab = interleaved ? (da >= u.ea && db < u.ea + 2 * vec && u.eb == u.ea + vec)
                                                 : (in_a && in_b && da - u.ea == q && db - u.eb == q);
                  if (!in_ab) fail("vector layout", t, h, da);
                }
              }
            }
        }
  for (long i = 0; i < (long)seen.size(); ++i)
    if (seen[i] != 1)
      fail(seen[i] ? "dim visited twice" : "dim never visited", i / dim / heads, i / dim % heads, i % dim);
  return bad;
}

int main() {
  int bad = 0, cases = 0;
  const long capacities[] = {1, 264, 100000};
  const int head_counts[] = {1, 3, 5, 8, 130};
  const long token_counts[] = {1, 7, 300};
  for (long capacity : capacities)
    for (int heads : head_counts)
      for (long tokens : token_counts)
        for (int vec : {1, 4, 8})
          for (bool interleaved : {false, true})
            for (int sections : {1, 2}) {
              if (sections == 2 && interleaved) continue;  // 2-D RoPE is half-split
              for (int dim : {16, 64}) {
                for (int width : {dim / sections, 16 / sections, 0}) {
                  if (width % 2 || width / 2 % vec || (dim - sections * width) % vec) continue;
                  if (width * sections > dim) continue;
                  bad += check(tokens, heads, dim, width, sections, interleaved, vec, capacity);
                  ++cases;
                }
              }
            }
  // Head dims past one block of units (a thread then takes several units of a token).
  bad += check(3, 2, 4096, 4096, 1, false, 1, 264) + check(3, 2, 8192, 4096, 1, true, 8, 264);
  std::printf("%d cases, %d failures\n", cases + 2, bad);
  return bad != 0;
}
"""


def test_cuda_work_split_visits_every_element_once(tmp_path):
    """The CUDA kernel's launch planning and unit layout (rope_plan.h, host code shared with the kernel)
    compiled with the host compiler: for head counts around its batch of heads in flight, partial and
    2-D rotary dims, both pair layouts, vector widths 1/4/8 and grids from one block to more than fit,
    every (token, head, dim) is visited exactly once, rotated dims as RoPE's pairs."""
    import shutil
    import subprocess

    from torch.utils.cpp_extension import include_paths

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    repo = Path(__file__).resolve().parents[4]
    source, binary = tmp_path / "plan_check.cpp", tmp_path / "plan_check"
    source.write_text(PLAN_CHECK)
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{repo / 'csrc' / 'fused_rope'}",
                    *(f"-I{d}" for d in include_paths()), str(source), "-o", str(binary)],
                   check=True, capture_output=True, text=True, timeout=300)
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
