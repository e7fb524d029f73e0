"""fused_softmax ops and apex.transformer.functional.fused_softmax against a float64 PyTorch reference,
on CPU and (marker gpu) CUDA: every kernel path (warp, block, cluster, unstaged), masks, causal rows,
fully masked rows, backward, the module's fallbacks, tracing and bad input."""
import pytest
import torch
from torch.library import opcheck

from apex.transformer import AttnMaskType
from apex.transformer.functional import (
    FusedScaleMaskSoftmax,
    GenericFusedScaleMaskSoftmax,
    GenericScaledMaskedSoftmax,
    ScaledMaskedSoftmax,
    ScaledSoftmax,
    ScaledUpperTriangMaskedSoftmax,
)
from apex.transformer.functional.fused_softmax import generic_scaled_masked_softmax, scaled_masked_softmax

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# One rounding of the output (computed in float32) plus float32 exp: a few ulps of each dtype.
TOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
# The backward subtracts sum(g * y) from g: cancellation costs a few more ulps (of |g|).
GRAD_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def ops():
    from apex._ops import ops as load

    return load("fused_softmax")


def reference(x, scale, mask=None, causal=False):
    """softmax(scale * x) in float64 with masked positions left out; fully masked rows are zeros."""
    s = x.double() * scale
    drop = torch.zeros(s.shape, dtype=torch.bool, device=x.device)
    if mask is not None:
        drop = drop | mask.bool()
    if causal:
        sq, sk = s.shape[-2:]
        drop = drop | torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(1)
    s = s.masked_fill(drop, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0)


def reference_grad(g, y, scale):
    g, y = g.double(), y.double()
    return scale * y * (g - (g * y).sum(-1, keepdim=True))


def check(actual, expected, tol):
    """Elementwise within tol relative, or tol of the largest |expected| (wide rows hold tiny values)."""
    expected = expected.double()
    atol = tol * max(expected.abs().max().item(), 1e-30) if expected.numel() else tol
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=atol)


# Columns that reach each CUDA path: the warp kernel (1 to 8 vectors per row per lane, sub-warp
# groups, several rows per lane), the row kernel in one block (bf16: forward past 2048, backward
# past 1024 columns) and in clusters (bf16 forward past 32768, backward past 16384), and odd widths
# (the scalar path: warp kernel, then the block kernel). The CPU runs the small ones.
CPU_COLS = [1, 7, 24, 33, 214, 1000, 2049]
GPU_COLS = CPU_COLS + [256, 1024, 1032, 2048, 3001, 4096, 8200, 16384, 20000, 32768, 40001, 65536]


def cols_for(device):
    return CPU_COLS if device == "cpu" else GPU_COLS


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scaled_softmax_every_width(device, dtype):
    for sk in cols_for(device):
        x = torch.randn(1, 2, 3, sk, device=device).to(dtype) * 4
        g = torch.randn_like(x)
        y = ops().scaled_softmax_forward(x, 0.7)
        check(y, reference(x, 0.7), TOL[dtype])
        dx = ops().scaled_softmax_backward(g, y, 0.7)
        check(dx, reference_grad(g, y, 0.7), GRAD_TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_shape", ["b1qk", "11qk", "bhqk", "b11k"])
def test_masked_softmax_broadcast_masks(device, dtype, mask_shape):
    b, h = 2, 3
    for sk in cols_for(device)[::2]:
        sq = 5
        x = torch.randn(b, h, sq, sk, device=device).to(dtype)
        shape = {"b1qk": (b, 1, sq, sk), "11qk": (1, 1, sq, sk), "bhqk": (b, h, sq, sk), "b11k": (b, 1, 1, sk)}
        mask = torch.rand(shape[mask_shape], device=device) < 0.3
        for module in ("scaled_masked_softmax", "generic_scaled_masked_softmax"):
            y = getattr(ops(), f"{module}_forward")(x, mask, 1.3)
            check(y, reference(x, 1.3, mask.expand(b, h, sq, sk)), TOL[dtype])
            g = torch.randn_like(x)
            check(getattr(ops(), f"{module}_backward")(g, y, 1.3), reference_grad(g, y, 1.3), GRAD_TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_softmax(device, dtype):
    for sq in [1, 5, 33, 300] + ([1100, 2048, 3000] if device == "cuda" else []):
        x = torch.randn(3, sq, sq, device=device).to(dtype)
        y = ops().scaled_upper_triang_masked_softmax_forward(x, 0.5)
        check(y, reference(x, 0.5, causal=True), TOL[dtype])
        assert (y.triu(1) == 0).all()
        g = torch.randn_like(x)
        dx = ops().scaled_upper_triang_masked_softmax_backward(g, y, 0.5)
        check(dx, reference_grad(g, y, 0.5), GRAD_TOL[dtype])
        assert (dx.triu(1) == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_are_zeros(device, dtype):
    for sk in cols_for(device)[1::3] + ([4096, 32776] if device == "cuda" else []):
        x = torch.randn(2, 2, 4, sk, device=device).to(dtype)
        mask = torch.rand(2, 1, 4, sk, device=device) < 0.5
        mask[0, :, 1] = True  # a fully masked row
        mask[1, :, 3] = True
        y = ops().scaled_masked_softmax_forward(x, mask, 1.0)
        assert (y[0, :, 1] == 0).all() and (y[1, :, 3] == 0).all()
        check(y, reference(x, 1.0, mask.expand_as(x)), TOL[dtype])
        # -inf scores (an additive mask folded in) count as masked too.
        z = ops().scaled_softmax_forward(torch.full_like(x, float("-inf")), 1.0)
        assert (z == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scattered_inf_scores_beside_a_mask(device, dtype):
    """-inf scores among finite ones and masked columns, and rows of -inf scores beside finite rows
    (the CUDA warp kernel reduces several rows per warp): -inf scores take no part, as masked ones."""
    for sk in cols_for(device)[::2]:
        x = torch.randn(2, 3, 5, sk, device=device).to(dtype) * 3
        x[torch.rand(x.shape, device=device) < 0.2] = float("-inf")
        x[0, 1, 2] = float("-inf")
        mask = torch.rand(2, 1, 5, sk, device=device) < 0.3
        y = ops().scaled_masked_softmax_forward(x, mask, 0.8)
        check(y, reference(x, 0.8, mask.expand_as(x)), TOL[dtype])
        assert (y[0, 1, 2] == 0).all()
        check(ops().scaled_softmax_forward(x, 0.8), reference(x, 0.8), TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [-0.6, 0.0])
def test_non_positive_scales(device, dtype, scale):
    """A negative or zero scale (the CUDA warp and row kernels take positive ones: these take the
    block kernel) still gives softmax(scale * x) over the kept columns, and zeros where none is kept."""
    for sk in cols_for(device)[::3]:
        x = torch.randn(2, 2, 3, sk, device=device).to(dtype) * 3
        mask = torch.rand(2, 1, 3, sk, device=device) < 0.3
        mask[1, :, 2] = True
        y = ops().scaled_masked_softmax_forward(x, mask, scale)
        check(y, reference(x, scale, mask.expand_as(x)), TOL[dtype])
        assert (y[1, :, 2] == 0).all()
    for sq in [5, 33] + ([1100] if device == "cuda" else []):
        x = torch.randn(2, sq, sq, device=device).to(dtype)
        check(ops().scaled_upper_triang_masked_softmax_forward(x, scale), reference(x, scale, causal=True), TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_scores(device, dtype):
    """Scaled scores in the hundreds, alone and beside rows of small ones: the CUDA kernels fold 1/sum
    into the exponent only while the max and log2(sum) are small (16-bit outputs), and multiply
    elsewhere; a warp holding both kinds of rows multiplies for all of them."""
    for sk in cols_for(device)[::2]:
        x = torch.randn(2, 4, 3, sk, device=device)
        x[:, 1::2] *= 120  # every other head: scaled scores past the fold's limit
        x = x.to(dtype)
        mask = torch.rand(2, 1, 3, sk, device=device) < 0.3
        y = ops().scaled_masked_softmax_forward(x, mask, 1.1)
        # float32 rounds scale * x once: an error of 2^-24 of |scale * x| in each exponent, past
        # float32's usual few ulps where scores are in the hundreds.
        tol = max(TOL[dtype], 4 * 2.0**-24 * 1.1 * x.float().abs().max().item())
        check(y, reference(x, 1.1, mask.expand_as(x)), tol)


# The CUDA kernels' size boundaries, per dtype: (forward, backward) columns at which the kernel changes
# (softmax_cuda.cuh: the warp kernel holds 8 / 4 16-byte vectors per lane, the row kernel 4 / 2 per
# thread of up to 1024 threads, clusters of up to 8 blocks; past them the block kernel). Each list
# has both sides of every boundary; all are multiples of 8 (the vector path).
def kernel_boundaries(dtype, backward):
    per_vector = 128 // torch.finfo(dtype).bits  # elements per 16-byte vector
    warp = (4 if backward else 8) * 32 * per_vector
    block = (2 if backward else 4) * 1024 * per_vector
    edges = [warp, block, 2 * block, 8 * block]
    return sorted({c + d for c in edges for d in (0, 8)})


def padding_mask(b, sq, sk, device, fully_masked=True):
    """[b, 1, sq, sk], ~30% masked, with fully masked and fully kept rows."""
    mask = torch.rand(b, 1, sq, sk, device=device) < 0.3
    if fully_masked:
        mask[0, :, 0] = True
        mask[-1, :, -1] = True
        mask[0, :, -1] = False
    return mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [1, 3, 5, 16])
def test_mask_shared_by_heads(device, dtype, heads):
    """[b, 1, sq, sk] masks: the kernels visit the heads of one (b, q) back to back and reuse its
    mask row (a warp-kernel lane takes up to 4 rows at once, which straddle two (b, q) when np is not
    a multiple of 4; a row-kernel block reloads the mask where its (b, q) changes). Odd sq."""
    widths = [24, 200, 512, 1000] + ([2048, 2056, 4096, 16392] if device == "cuda" else [])
    for sk in widths:
        b, sq = 2, 7
        x = torch.randn(b, heads, sq, sk, device=device).to(dtype) * 3
        mask = padding_mask(b, sq, sk, device)
        y = ops().scaled_masked_softmax_forward(x, mask, 0.9)
        check(y, reference(x, 0.9, mask.expand_as(x)), TOL[dtype])
        assert (y[0, :, 0] == 0).all() and (y[-1, :, -1] == 0).all()
        g = torch.randn_like(x)
        check(ops().scaled_masked_softmax_backward(g, y, 0.9), reference_grad(g, y, 0.9), GRAD_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_boundaries_many_rows_per_block(dtype):
    """Both sides of every forward and backward kernel boundary (warp kernel / row kernel / cluster
    of 2 / cluster of 8 / block kernel), with more rows than the grid has blocks, so that each block
    (cluster) takes several rows: the row kernel's next-row loads, its alternating reduction slots
    and cluster barriers, and the mask reloaded where (b, q) changes. Checked on sample rows."""
    element_budget = 12_000_000
    for backward in (False, True):
        for sk in kernel_boundaries(dtype, backward):
            heads = 3
            rows = max(4, element_budget // sk)
            sq = max(1, rows // (2 * heads)) | 1  # odd
            x = torch.randn(2, heads, sq, sk, device="cuda").to(dtype) * 3
            mask = padding_mask(2, sq, sk, "cuda")
            picks = [(0, 0, 0), (0, 1, 0), (0, 2, sq - 1), (1, 0, sq // 2), (1, 2, sq - 1), (1, 1, 0)]
            if not backward:
                y = ops().scaled_masked_softmax_forward(x, mask, 0.7)
                for b, h, q in picks:
                    check(y[b, h, q], reference(x[b, h, q], 0.7, mask[b, 0, q]), TOL[dtype])
                z = ops().scaled_softmax_forward(x, 0.7)
                for b, h, q in picks:
                    check(z[b, h, q], reference(x[b, h, q], 0.7), TOL[dtype])
            else:
                y = torch.softmax(x.float() * 0.7, -1).to(dtype)
                g = torch.randn_like(x)
                dx = ops().scaled_masked_softmax_backward(g, y, 0.7)
                for b, h, q in picks:
                    check(dx[b, h, q], reference_grad(g[b, h, q], y[b, h, q], 0.7), GRAD_TOL[dtype])
            del x, mask
            torch.cuda.empty_cache()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_far_negative_scores_beside_masked_stretches(device, dtype):
    """Scaled scores near -400 (exp2 of them underflows), with columns masked in a pattern that leaves
    whole CUDA threads (the row kernels' strided vectors, warp-kernel lanes) nothing to keep, beside
    random masking and fully masked rows. A kernel rescaling per-thread sums by exp2(own max - row max)
    must not turn a thread with nothing kept into inf * 0."""
    per_vector = 128 // torch.finfo(dtype).bits
    widths = [64, 520] + ([2048, 4096, 16392, 32768, 40008, 65536] if device == "cuda" else [])
    for sk in widths:
        b, heads, sq = 2, 3, 5
        x = (torch.randn(b, heads, sq, sk, device=device) * 3 - 300).to(dtype)
        columns = torch.arange(sk, device=device)
        stretch = ((columns // per_vector) % 64) < 20  # threads t with t % 64 < 20 keep nothing
        mask = (torch.rand(b, 1, sq, sk, device=device) < 0.1) | stretch
        mask[1, :, 2] = True
        y = ops().scaled_masked_softmax_forward(x, mask, 1.0)
        assert torch.isfinite(y).all()
        assert (y[1, :, 2] == 0).all()
        check(y, reference(x, 1.0, mask.expand_as(x)), TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_rows_ragged_chunks_and_many_mask_rows(dtype):
    """Rows past the warp kernel whose width leaves the last threads (or the last block of a
    cluster) part of a chunk, many rows per block with the mask row changing every few rows (np 3)
    and across blocks, a uint8 mask, fully masked rows; forward and backward, every row checked."""
    per_vector = 128 // torch.finfo(dtype).bits
    for sk in (2048 + per_vector, 4096 + 3 * per_vector, 32768 + per_vector, 65536 - per_vector, 70000):
        sk -= sk % per_vector
        heads = 3
        sq = max(3, 3_000_000 // (2 * heads * sk)) | 1
        x = torch.randn(2, heads, sq, sk, device="cuda").to(dtype) * 4
        mask = padding_mask(2, sq, sk, "cuda").to(torch.uint8) * 0x80
        y = ops().scaled_masked_softmax_forward(x, mask, 0.6)
        check(y, reference(x, 0.6, (mask != 0).expand_as(x)), TOL[dtype])
        assert (y[0, :, 0] == 0).all() and (y[-1, :, -1] == 0).all()
        z = ops().scaled_softmax_forward(x, 0.6)
        check(z, reference(x, 0.6), TOL[dtype])
        g = torch.randn_like(x)
        g_before = g.clone()
        dx = ops().scaled_masked_softmax_backward(g, y, 0.6)
        check(dx, reference_grad(g, y, 0.6), GRAD_TOL[dtype])
        assert torch.equal(g, g_before)
        del x, mask, y, z, g, g_before, dx
        torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["shared", "per_head", "none"])
def test_long_rows_at_row_kernel_thresholds(dtype, mask_kind):
    """Long rows without a causal bound (the row kernel keeping its exponentials as half pairs) at its
    thresholds: half a block's row (bf16 16384, float32 8192 columns), one block's whole row and one
    vector past it (the first 2-block cluster), 40000 columns, a 2-block cluster's whole row and the
    vectors around it (one past: a 4-block cluster, ragged chunks), ragged last threads; more rows than
    the grid has blocks (the next row loaded while the current one is reduced, the mask row loaded only
    where it changes: [1, 1, sq, sk] every 7 rows, [1, 7, sq, sk] every row), 7 heads, fully masked
    rows and scattered -inf scores. Every row checked."""
    per_vector = 128 // torch.finfo(dtype).bits
    low, block, high = 2 * 1024 * per_vector, 4 * 1024 * per_vector, 8 * 1024 * per_vector
    widths = (low, low + per_vector, block, block + per_vector, 40000, high - 2 * per_vector, high - per_vector, high,
              high + per_vector)
    for sk in widths:
        heads = 7
        sq = max(3, 24_000_000 // (heads * sk)) | 1
        x = torch.randn(1, heads, sq, sk, device="cuda").to(dtype) * 4
        x[0, 1, 1, ::7] = float("-inf")
        x[0, 3, 2, :] = float("-inf")  # nothing but -inf: zeros
        if mask_kind == "none":
            y = ops().scaled_softmax_forward(x, 0.6)
            check(y, reference(x, 0.6), TOL[dtype])
        else:
            mask = padding_mask(1, sq, sk, "cuda")
            if mask_kind == "per_head":
                mask = torch.rand(1, heads, sq, sk, device="cuda") < 0.3
                mask[0, 2, 1] = True
                mask[0, 5, sq - 1] = True
            y = ops().scaled_masked_softmax_forward(x, mask, 0.6)
            check(y, reference(x, 0.6, mask.expand_as(x)), TOL[dtype])
            if mask_kind == "per_head":
                assert (y[0, 2, 1] == 0).all() and (y[0, 5, sq - 1] == 0).all()
            else:
                assert (y[0, :, 0] == 0).all()
            del mask
        assert (y[0, 3, 2] == 0).all()
        del x, y
        torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["shared", "per_head", "none"])
def test_long_rows_one_kept_column(dtype, mask_kind):
    """Long rows with one column kept each, at a sixteenth of the row apart (every vector index of a
    thread's row in the row kernel's 1024 threads x 4 vectors, the second block of a cluster) and at
    the first / last elements of those vectors; one fully masked row (zeros). Masks shared by the
    heads ([1, 1, sq, sk]), per head, or none (the other scores -inf).
    Widths: half a block's row plus a vector, a block's row, one vector past it, a 2-block cluster's row."""
    per_vector = 128 // torch.finfo(dtype).bits
    block = 4 * 1024 * per_vector
    for sk in (block // 2 + per_vector, block, block + per_vector, 2 * block):
        spots = sorted({min(j * (sk // 16) + e, sk - 1) for j in range(16) for e in (0, per_vector - 1)} | {sk - 1})
        sq, heads = len(spots) + 1, 3  # the last row keeps nothing
        x = torch.randn(1, heads, sq, sk, device="cuda").to(dtype) * 4
        keep = torch.zeros(1, heads, sq, sk, dtype=torch.bool, device="cuda")
        for q in range(len(spots)):
            for h in range(heads):
                keep[0, h, q, spots[(q + (h if mask_kind == "per_head" else 0)) % len(spots)]] = True
        if mask_kind == "none":
            x = x.masked_fill(~keep, float("-inf"))
            y = ops().scaled_softmax_forward(x, 0.6)
        else:
            mask = ~keep if mask_kind == "per_head" else ~keep[:, :1]
            y = ops().scaled_masked_softmax_forward(x, mask, 0.6)
        assert torch.equal(y != 0, keep)
        check(y, keep.to(y.dtype), TOL[dtype])
        del x, keep, y
        torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["shared", "per_batch", "none"])
def test_long_rows_few_rows_per_block_two_heads(dtype, mask_kind):
    """Long rows without a causal bound in the row kernel with few rows per block: 1, 2 and 3 rows in
    all (blocks with one row or none), and ~2.5 and ~5 rows per block (odd and even counts, blocks
    starting at either head); 2 heads (a shared mask row changes every other row), [1, 1, sq, sk] and
    [2, 1, 1, sk] masks and none; widths at half a block, a block and a 2-block cluster, and one
    vector past them. Every row checked."""
    per_vector = 128 // torch.finfo(dtype).bits
    half, block = 2 * 1024 * per_vector, 4 * 1024 * per_vector  # half a block's row, a (1024-thread) block's row
    for sk in (half + per_vector, block, block + per_vector, 2 * block):
        for b, heads, sq in ((1, 1, 1), (1, 2, 1), (1, 3, 1), (1, 2, 165), (2, 2, 165)):
            x = torch.randn(b, heads, sq, sk, device="cuda").to(dtype) * 4
            x[0, -1, sq // 2, ::5] = float("-inf")
            if mask_kind == "none":
                y = ops().scaled_softmax_forward(x, 0.6)
                check(y, reference(x, 0.6), TOL[dtype])
            else:
                mask = padding_mask(b, 1 if mask_kind == "per_batch" else sq, sk, "cuda", fully_masked=False)
                mask[-1, 0, -1] = True  # a fully masked row (every query's, for a [b, 1, 1, sk] mask)
                y = ops().scaled_masked_softmax_forward(x, mask, 0.6)
                check(y, reference(x, 0.6, mask.expand_as(x)), TOL[dtype])
                assert (y[-1, :, -1] == 0).all()
                del mask
            del x, y
            torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_row_kernel_many_rows_per_block(dtype):
    """Causal rows long enough for the row kernel (strided over the blocks, each block taking many
    rows of growing length; a cluster where the row exceeds one block)."""
    per_vector = 128 // torch.finfo(dtype).bits  # elements per 16-byte vector
    for sq in (8 * 32 * per_vector + per_vector, 2 * 1024 * per_vector + per_vector):
        x = torch.randn(2, sq, sq, device="cuda").to(dtype)
        y = ops().scaled_upper_triang_masked_softmax_forward(x, 0.4)
        g = torch.randn_like(x)
        dx = ops().scaled_upper_triang_masked_softmax_backward(g, y, 0.4)
        for b, q in [(0, 0), (0, 1), (0, sq // 3), (1, sq - 2), (1, sq - 1)]:
            expected = torch.zeros(sq, dtype=torch.float64, device="cuda")
            expected[: q + 1] = torch.softmax(x[b, q, : q + 1].double() * 0.4, -1)
            check(y[b, q], expected, TOL[dtype])
            check(dx[b, q], reference_grad(g[b, q], y[b, q], 0.4), GRAD_TOL[dtype])
        del x, g, y, dx
        torch.cuda.empty_cache()


@pytest.mark.parametrize("device", DEVICES)
def test_uint8_mask_any_nonzero_byte_masks(device):
    """A uint8 mask masks wherever a byte is nonzero, whatever its bits (the kernels turn 4 bytes at a
    time into bits)."""
    widths = [8, 64, 520] + ([4096, 32776] if device == "cuda" else [])
    values = torch.tensor([0, 1, 2, 0x7F, 0x80, 0x81, 0xFE, 0xFF], dtype=torch.uint8, device=device)
    for sk in widths:
        x = torch.randn(2, 3, 5, sk, device=device, dtype=torch.bfloat16)
        pick = torch.randint(0, len(values), (2, 1, 5, sk), device=device)
        pick[torch.rand(2, 1, 5, sk, device=device) < 0.5] = 0
        mask = values[pick]
        y = ops().scaled_masked_softmax_forward(x, mask, 1.1)
        check(y, reference(x, 1.1, (mask != 0).expand_as(x)), TOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
def test_uint8_mask_and_non_contiguous_inputs(device):
    x = torch.randn(2, 3, 40, 6, device=device).transpose(-1, -2)  # [2, 3, 6, 40], sk not contiguous
    mask = (torch.rand(2, 1, 40, 6, device=device) < 0.3).transpose(-1, -2)
    y = ops().scaled_masked_softmax_forward(x, mask.to(torch.uint8), 2.0)
    check(y, reference(x, 2.0, mask.expand(2, 3, 6, 40)), TOL[torch.float32])
    g = torch.randn(2, 3, 40, 6, device=device).transpose(-1, -2)
    check(ops().scaled_masked_softmax_backward(g, y, 2.0), reference_grad(g, y, 2.0), GRAD_TOL[torch.float32])


@pytest.mark.parametrize("device", DEVICES)
def test_backward_never_writes_its_incoming_gradient(device):
    x = torch.randn(2, 2, 8, 64, device=device, dtype=torch.float16)
    y = ops().scaled_softmax_forward(x, 1.0)
    g = torch.randn_like(x)
    kept = g.clone()
    dx = ops().scaled_softmax_backward(g, y, 1.0)
    assert dx.data_ptr() != g.data_ptr()
    assert torch.equal(g, kept)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 2, 3, 8), (2, 0, 3, 8), (2, 2, 0, 0), (2, 2, 3, 0)])
def test_empty_input(device, shape):
    x = torch.randn(shape, device=device)
    y = ops().scaled_softmax_forward(x, 1.0)
    assert y.shape == x.shape
    mask = torch.zeros(shape[0], 1, shape[2], shape[3], dtype=torch.bool, device=device)
    assert ops().scaled_masked_softmax_forward(x, mask, 1.0).shape == x.shape
    assert ops().scaled_softmax_backward(torch.randn_like(x), y, 1.0).shape == x.shape


@pytest.mark.parametrize("device", DEVICES)
def test_differentiable_ops_and_autograd_functions(device):
    x = torch.randn(2, 3, 6, 10, device=device, requires_grad=True)
    mask = torch.rand(2, 1, 6, 10, device=device) < 0.3
    g = torch.randn(2, 3, 6, 10, device=device)
    expected = reference(x.detach(), 0.8, mask.expand(2, 3, 6, 10))
    expected_grad = reference_grad(g, expected, 0.8)
    for fn in (lambda t: ops().scaled_masked_softmax_forward(t, mask, 0.8),
               lambda t: ScaledMaskedSoftmax.apply(t, mask, 0.8),
               lambda t: GenericScaledMaskedSoftmax.apply(t, mask, 0.8),
               lambda t: scaled_masked_softmax(t, mask, 0.8),
               lambda t: generic_scaled_masked_softmax(t, mask, 0.8)):
        y = fn(x)
        (grad,) = torch.autograd.grad(y, x, g)
        check(y, expected, 1e-6)
        check(grad, expected_grad, 1e-5)
    for fn in (lambda t: ScaledSoftmax.apply(t, 0.8), lambda t: ops().scaled_softmax_forward(t, 0.8)):
        (grad,) = torch.autograd.grad(fn(x), x, g)
        check(grad, reference_grad(g, reference(x.detach(), 0.8), 0.8), 1e-5)
    causal = torch.randn(4, 7, 7, device=device, requires_grad=True)
    gc = torch.randn(4, 7, 7, device=device)
    expected = reference(causal.detach(), 0.8, causal=True)
    for fn in (ScaledUpperTriangMaskedSoftmax.apply, ops().scaled_upper_triang_masked_softmax_forward):
        (grad,) = torch.autograd.grad(fn(causal, 0.8), causal, gc)
        check(grad, reference_grad(gc, expected, 0.8), 1e-5)


# ---- FusedScaleMaskSoftmax ------------------------------------------------------------------------

def attention_mask_func(scores, mask):
    return scores.masked_fill(mask, -10000.0)


def modules(dtype, mask_type, scale=None, softmax_in_fp32=True, generic=False):
    flags = dict(input_in_fp16=dtype == torch.float16, input_in_bf16=dtype == torch.bfloat16)
    common = dict(mask_func=attention_mask_func, softmax_in_fp32=softmax_in_fp32, scale=scale)
    if generic:
        return (GenericFusedScaleMaskSoftmax(**flags, scaled_masked_softmax_fusion=True, **common),
                GenericFusedScaleMaskSoftmax(**flags, scaled_masked_softmax_fusion=False, **common))
    return (FusedScaleMaskSoftmax(**flags, attn_mask_type=mask_type, scaled_masked_softmax_fusion=True, **common),
            FusedScaleMaskSoftmax(**flags, attn_mask_type=mask_type, scaled_masked_softmax_fusion=False, **common))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("generic", [False, True])
def test_module_matches_unfused_path(device, dtype, generic):
    fused, unfused = modules(dtype, AttnMaskType.padding, scale=2.0, generic=generic)
    for shape in [(4, 12, 24, 24), (3, 4, 4, 214), (1, 2, 5, 3000)]:
        x = torch.randn(shape, device=device).to(dtype).requires_grad_()
        mask = torch.rand(shape[0], 1, *shape[2:], device=device) < 0.4
        mask[..., 0] = False  # the unfused path gives a fully masked row a uniform distribution
        assert fused.is_kernel_available(mask, *shape)
        y, expected = fused(x, mask), unfused(x, mask)
        check(y, expected, 2 * TOL[dtype])
        g = torch.randn_like(y)
        check(torch.autograd.grad(y, x, g)[0], torch.autograd.grad(expected, x, g)[0], 2 * GRAD_TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_module_causal_and_autocast(device, dtype):
    fused, unfused = modules(dtype, AttnMaskType.causal)
    x = torch.randn(2, 3, 24, 24, device=device)
    causal_mask = torch.ones(24, 24, dtype=torch.bool, device=device).triu(1)[None, None]
    with torch.autocast(device, dtype=dtype):
        y = fused(x, causal_mask)  # float32 scores, cast to the autocast dtype first
    assert y.dtype == dtype
    check(y, unfused(x.to(dtype), causal_mask), 2 * TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_module_fallbacks(device):
    fused, unfused = modules(torch.float16, AttnMaskType.padding)
    x = torch.randn(2, 2, 4, 8, device=device)
    additive = torch.zeros(2, 1, 4, 8, device=device)
    assert not fused.is_kernel_available(additive, 2, 2, 4, 8)  # float mask: only mask_func knows it
    assert not fused.is_kernel_available(torch.zeros(2, 2, 8, dtype=torch.bool), 2, 2, 4, 8)
    assert fused.is_kernel_available(None, 2, 2, 4, 8)
    causal, _ = modules(torch.float16, AttnMaskType.causal)
    assert not causal.is_kernel_available(None, 2, 2, 4, 8)  # not square
    assert causal.is_kernel_available(None, 2, 2, 8, 8)
    # float64 scores take the unfused path (and give its answer).
    mask = torch.rand(2, 1, 4, 8, device=device) < 0.3
    f32, u32 = modules(torch.float32, AttnMaskType.padding)
    torch.testing.assert_close(f32(x.double(), mask), u32(x.double(), mask))
    assert f32(x, mask).dtype == torch.float32
    with pytest.raises(RuntimeError, match="fp32 when scaled"):
        modules(torch.float16, AttnMaskType.padding, scale=2.0, softmax_in_fp32=False)
    with pytest.raises(RuntimeError, match="both fp16 and bf16"):
        FusedScaleMaskSoftmax(True, True, AttnMaskType.padding, True, attention_mask_func, True, None)
    assert FusedScaleMaskSoftmax.get_batch_per_block(4, 4, 2, 2) == 1


# ---- bad input, tracing ----------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    x = torch.randn(2, 2, 4, 8, device=device)
    mask = torch.zeros(2, 1, 4, 8, dtype=torch.bool, device=device)
    with pytest.raises(RuntimeError, match="must be float32, float16 or bfloat16"):
        ops().scaled_softmax_forward(x.double(), 1.0)
    with pytest.raises(RuntimeError, match="must be float32, float16 or bfloat16"):
        ops().scaled_softmax_forward(x.long(), 1.0)
    with pytest.raises(RuntimeError, match="must be 4-D"):
        ops().scaled_softmax_forward(x[0], 1.0)
    with pytest.raises(RuntimeError, match="must be 3-D"):
        ops().scaled_upper_triang_masked_softmax_forward(x, 1.0)
    with pytest.raises(RuntimeError, match="square scores"):
        ops().scaled_upper_triang_masked_softmax_forward(x[0], 1.0)
    with pytest.raises(RuntimeError, match="mask must be bool"):
        ops().scaled_masked_softmax_forward(x, mask.float(), 1.0)
    with pytest.raises(RuntimeError, match="does not broadcast"):
        ops().scaled_masked_softmax_forward(x, torch.zeros(3, 1, 4, 8, dtype=torch.bool, device=device), 1.0)
    with pytest.raises(RuntimeError, match="with sk = 8"):
        ops().scaled_masked_softmax_forward(x, mask[..., :4], 1.0)
    with pytest.raises(RuntimeError, match="mask is on meta"):
        ops().scaled_masked_softmax_forward(x, mask.to("meta"), 1.0)
    with pytest.raises(RuntimeError, match="output_grads must match"):
        ops().scaled_softmax_backward(x.half(), x, 1.0)
    with pytest.raises(RuntimeError, match="output_grads must match"):
        ops().scaled_softmax_backward(x[:1], x, 1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(2, 3, 5, 12, device=device, requires_grad=True)
    mask = torch.rand(2, 1, 5, 12, device=device) < 0.3
    y = ops().scaled_softmax_forward(x.detach(), 0.5)
    for module in ("scaled_masked_softmax", "generic_scaled_masked_softmax"):
        opcheck(getattr(torch.ops.apex, f"{module}_forward"), (x, mask, 0.5))
        opcheck(getattr(torch.ops.apex, f"{module}_backward"), (torch.randn_like(y), y, 0.5))
    opcheck(torch.ops.apex.scaled_softmax_forward, (x, 0.5))
    opcheck(torch.ops.apex.scaled_softmax_backward, (torch.randn_like(y), y, 0.5))
    c = torch.randn(3, 6, 6, device=device, requires_grad=True)
    opcheck(torch.ops.apex.scaled_upper_triang_masked_softmax_forward, (c, 0.5))
    yc = ops().scaled_upper_triang_masked_softmax_forward(c.detach(), 0.5)
    opcheck(torch.ops.apex.scaled_upper_triang_masked_softmax_backward, (torch.randn_like(yc), yc, 0.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()
    fused, _ = modules(torch.float32, AttnMaskType.padding, scale=0.5)
    causal, _ = modules(torch.float32, AttnMaskType.causal)

    def loss(x, mask, w):
        square = x[..., : x.shape[-2]]
        return (fused(x, mask) * w).sum() + (causal(square, None) * w[..., : x.shape[-2]]).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=dynamic)
    for sk in (9, 13):
        x = torch.randn(2, 3, 6, sk, device=device, requires_grad=True)
        mask = torch.rand(2, 1, 6, sk, device=device) < 0.3
        w = torch.randn(2, 3, 6, sk, device=device)
        (grad,) = torch.autograd.grad(compiled(x, mask, w), x)
        (expected,) = torch.autograd.grad(loss(x, mask, w), x)
        check(grad, expected, 1e-5)


# ---- CUDA-only: the paths only long rows reach, and int64 offsets ------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_beyond_shared_memory(dtype):
    """Rows too long for a cluster's shared memory (bf16 forward > ~850K, float32 backward > ~220K
    columns on an H100) re-read the input in the second pass; a causal row of such a width too."""
    for sk in (300_000, 1_000_000):
        x = torch.randn(2, 1, 1, sk, device="cuda").to(dtype) * 3
        y = ops().scaled_softmax_forward(x, 1.0)
        check(y, reference(x, 1.0), TOL[dtype])
        g = torch.randn_like(x)
        check(ops().scaled_softmax_backward(g, y, 1.0), reference_grad(g, y, 1.0), GRAD_TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_long_rows(dtype):
    """Causal rows of 16384 columns (the row kernel; float32 backward: a 2-block cluster per row),
    checked on sample rows."""
    sq = 16384
    x = torch.randn(1, sq, sq, device="cuda").to(dtype)
    g = torch.randn_like(x)
    y = ops().scaled_upper_triang_masked_softmax_forward(x, 0.3)
    dx = ops().scaled_upper_triang_masked_softmax_backward(g, y, 0.3)
    for q in (0, 1, 4095, 8191, 12000, sq - 1):
        expected = torch.zeros(sq, dtype=torch.float64, device="cuda")
        expected[: q + 1] = torch.softmax(x[0, q, : q + 1].double() * 0.3, -1)
        check(y[0, q], expected, TOL[dtype])
        check(dx[0, q], reference_grad(g[0, q], y[0, q], 0.3), GRAD_TOL[dtype])


@pytest.mark.gpu
def test_int64_offsets_past_two_billion_elements():
    """[1, 1, 32769, 65536] bf16 has 2^31 + 65536 elements: the last rows sit past int32 offsets."""
    sq, sk = 32769, 65536
    x = torch.randn(1, 1, sq, sk, device="cuda", dtype=torch.bfloat16)
    mask = torch.zeros(1, 1, sq, sk, dtype=torch.bool, device="cuda")
    mask[..., -1, : sk // 2] = True
    y = ops().scaled_masked_softmax_forward(x, mask, 1.0)
    check(y[..., -3:, :], reference(x[..., -3:, :], 1.0, mask[..., -3:, :]), TOL[torch.bfloat16])
    g = torch.randn_like(x)
    dx = ops().scaled_masked_softmax_backward(g, y, 1.0)
    check(dx[..., -3:, :], reference_grad(g[..., -3:, :], y[..., -3:, :], 1.0), GRAD_TOL[torch.bfloat16])
