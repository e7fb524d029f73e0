"""apex.contrib.index_mul_2d against in1[idx1] * in2 in float64 on CPU and (marker gpu) CUDA: values,
first and second derivatives, odd sizes, repeated and negative indices, the historical module,
tracing, and bad input."""
import pytest
import torch
from torch.library import opcheck

import fused_index_mul_2d
from apex._ops import ops
from apex.contrib.index_mul_2d import index_mul_2d

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# One rounding of a product; in1's gradient sums many rows in float32 then rounds once.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2),
       torch.float64: (1e-12, 1e-12)}
SHAPES = [(1, 1, 1), (5, 17, 3), (40, 300, 64), (7, 129, 13), (1000, 4099, 8)]  # (sources, rows, features)


def make(sources, rows, features, dtype, device, negative=False):
    in1 = torch.randn(sources, features, dtype=torch.float64).to(dtype).to(device)
    in2 = torch.randn(rows, features, dtype=torch.float64).to(dtype).to(device)
    idx = torch.randint(0, sources, (rows,))
    if negative:
        idx = idx - sources * torch.randint(0, 2, (rows,))
    return in1, in2, idx.to(device)


def reference(in1, in2, idx, grad_out):
    """Output and first derivatives in float64 by autograd, plus a second-order term."""
    a, b = in1.double().requires_grad_(), in2.double().requires_grad_()
    out = a[idx] * b
    ga, gb = torch.autograd.grad(out, (a, b), grad_out.double(), create_graph=True)
    second = torch.autograd.grad((ga ** 2).sum() + (gb ** 2).sum(), (a, b))
    return out.detach(), ga.detach(), gb.detach(), second


def assert_close(actual, expected, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sources,rows,features", SHAPES)
def test_matches_torch_to_second_order(device, dtype, sources, rows, features):
    in1, in2, idx = make(sources, rows, features, dtype, device, negative=True)
    grad_out = torch.randn(rows, features, dtype=torch.float64).to(dtype).to(device)
    out_ref, ga_ref, gb_ref, second_ref = reference(in1, in2, idx, grad_out)
    a, b = in1.clone().requires_grad_(), in2.clone().requires_grad_()
    out = index_mul_2d(a, b, idx)
    assert out.dtype == dtype and out.shape == (rows, features)
    assert_close(out, out_ref, dtype)
    ga, gb = torch.autograd.grad(out, (a, b), grad_out, create_graph=True)
    repeats = float(torch.bincount(idx % sources).max()) if rows else 1.0
    assert_close(ga, ga_ref, dtype, scale=repeats ** 0.5)
    assert_close(gb, gb_ref, dtype)
    second = torch.autograd.grad((ga.double() ** 2).sum() + (gb.double() ** 2).sum(), (a, b))
    assert_close(second[0], second_ref[0], dtype, scale=repeats)
    assert_close(second[1], second_ref[1], dtype, scale=repeats)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    in1, in2, idx = make(4, 0, 6, torch.float32, device)
    assert index_mul_2d(in1, in2, idx).shape == (0, 6)
    in1, in2, idx = make(4, 5, 0, torch.float32, device)
    in1.requires_grad_()
    out = index_mul_2d(in1, in2, idx)
    assert out.shape == (5, 0)
    out.sum().backward()
    assert in1.grad.shape == (4, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_misaligned(device):
    in1, in2, idx = make(30, 50, 33, torch.float32, device)
    for a, b in ((in1[:, 1:], in2[:, 1:]), (in1.t().contiguous().t(), in2[::1]), (in1, in2[:, :32][:, 1:].clone())):
        if b.shape[1] != a.shape[1]:
            a = a[:, : b.shape[1]]
        a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
        out = index_mul_2d(a, b, idx[: b.shape[0]])
        out.sum().backward()
        torch.testing.assert_close(out, a.detach()[idx] * b.detach())
        torch.testing.assert_close(b.grad, a.detach()[idx])


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_index_gives_nan_row(device):
    in1, in2, idx = make(4, 3, 5, torch.float32, device)
    idx = torch.tensor([1, 4, -5], device=device)
    a = in1.clone().requires_grad_()
    out = index_mul_2d(a, in2, idx)
    out.sum().backward()
    assert out[0].isfinite().all() and out[1:].isnan().all()
    torch.testing.assert_close(a.grad[1], in2[0])
    assert (a.grad[[0, 2, 3]] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_historical_module(device, dtype):
    in1, in2, idx = make(6, 20, 8, dtype, device)
    grad_out = torch.randn_like(in2)
    forward = fused_index_mul_2d.float_forward if dtype == torch.float32 else fused_index_mul_2d.half_forward
    backward = fused_index_mul_2d.float_backward if dtype == torch.float32 else fused_index_mul_2d.half_backward
    out = torch.empty_like(in2)
    forward(out, in1, in2, idx)
    torch.testing.assert_close(out, in1[idx] * in2)
    grad_in1, grad_in2 = torch.zeros_like(in1), torch.empty_like(in2)
    backward(grad_in1, grad_in2, grad_out, in1, in2, idx)
    expected_in1 = torch.zeros_like(in1, dtype=torch.float64).index_add_(0, idx, (grad_out * in2).double())
    assert_close(grad_in1, expected_in1, dtype, scale=4)
    torch.testing.assert_close(grad_in2, grad_out * in1[idx])
    gg1, gg2 = torch.randn_like(in1), torch.randn_like(in2)
    ggo, g1, g2 = torch.empty_like(in2), torch.zeros_like(in1), torch.empty_like(in2)
    fused_index_mul_2d.float_backward_backward(ggo, g1, g2, grad_out, gg1, gg2, in1, in2, idx)
    assert_close(ggo, (gg1[idx] * in2 + in1[idx] * gg2).double(), dtype, scale=2)
    assert_close(g2, (gg1[idx] * grad_out).double(), dtype)
    assert_close(g1, torch.zeros_like(in1, dtype=torch.float64).index_add_(0, idx, (gg2 * grad_out).double()),
                 dtype, scale=4)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    in1, in2, idx = make(4, 6, 3, torch.float32, device)
    cases = [
        ((in1.long(), in2.long(), idx), "in1 must be float32"),
        ((in1, in2.double(), idx), "in2 must have in1's dtype"),
        ((in1[0], in2, idx), "must be 2-D"),
        ((in1[:, :2], in2, idx), "as many features"),
        ((in1, in2, idx.int()), "idx1 must be int64"),
        ((in1, in2, idx[:5]), r"idx1 must have shape \[6\]"),
        ((in1, in2.cpu() if device == "cuda" else in2.to("meta"), idx), "in2 is on"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            index_mul_2d(*args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()

    def loss_fn(a, b, i):
        return (index_mul_2d(a, b, i).sin() * 2).sum()

    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=dynamic)
    for rows in (9, 14):
        in1, in2, idx = make(5, rows, 7, torch.float32, device)
        a1, b1 = in1.clone().requires_grad_(), in2.clone().requires_grad_()
        a2, b2 = in1.clone().requires_grad_(), in2.clone().requires_grad_()
        compiled(a1, b1, idx).backward()
        loss_fn(a2, b2, idx).backward()
        torch.testing.assert_close(a1.grad, a2.grad)
        torch.testing.assert_close(b1.grad, b2.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    in1, in2, idx = make(5, 9, 7, torch.float32, device)
    grad_out = torch.randn_like(in2)
    opcheck(torch.ops.apex.index_mul_2d, (in1.requires_grad_(), in2.requires_grad_(), idx))
    opcheck(torch.ops.apex.index_mul_2d_backward, (grad_out, in1.detach(), in2.detach(), idx))
    opcheck(torch.ops.apex.index_mul_2d_backward_backward,
            (torch.randn_like(in1), None, grad_out, in1.detach(), in2.detach(), idx))


# ---- the backward passes' scatter into grad_in1 (on CUDA: a sort by source, then a walk over the
# sorted rows in fixed ranges whose partial sums are joined across range boundaries) -----------------

def index_pattern(pattern, sources, rows):
    """Indices that exercise the sorted walk: sources crossing many ranges, sources with no rows,
    rows already in order, invalid indices among valid ones."""
    generator = torch.Generator().manual_seed(rows + sources)
    if pattern == "random":
        return torch.randint(0, sources, (rows,), generator=generator)
    if pattern == "sorted":
        return torch.randint(0, sources, (rows,), generator=generator).sort().values
    if pattern == "descending":
        return torch.randint(0, sources, (rows,), generator=generator).sort(descending=True).values
    if pattern == "one_source":  # every row into one source: it spans every range of the walk
        return torch.full((rows,), sources // 2)
    if pattern == "hub_and_rest":  # half the rows into source 0, negative indices among the rest
        idx = torch.randint(-sources, sources, (rows,), generator=generator)
        idx[torch.randperm(rows, generator=generator)[: rows // 2]] = 0
        return idx
    if pattern == "few_sources":  # most sources get no row: their grad_in1 rows stay zero
        return torch.tensor([1, sources - 1, 3])[torch.randint(0, 3, (rows,), generator=generator)]
    if pattern == "with_invalid":  # out of range both ways: NaN rows, nothing added
        idx = torch.randint(0, sources, (rows,), generator=generator)
        idx[::7] = sources + 3
        idx[3::11] = -sources - 1
        return idx
    raise ValueError(pattern)


def expected_backward(in1, in2, idx, grad_out, gg1=None, gg2=None):
    """(grad_in1, grad_in2) of the backward, or (grad_grad_out, grad_in1, grad_in2) of the double
    backward when gg1 / gg2 are given (None: zero), in float64; invalid indices give NaN rows."""
    sources = in1.shape[0]
    valid = (idx >= -sources) & (idx < sources)
    source = torch.where(valid, idx % max(sources, 1), 0)
    a, b, g = in1.double(), in2.double(), grad_out.double()
    nan_rows = (~valid).unsqueeze(1)

    def gathered(t):
        return t[source] if sources else torch.zeros_like(b)

    def scattered(t):
        return torch.zeros_like(a).index_add_(0, source[valid], t[valid])

    if gg1 is None and gg2 is None:
        return scattered(g * b), (g * gathered(a)).masked_fill(nan_rows, float("nan"))
    h1 = gg1.double() if gg1 is not None else torch.zeros_like(a)
    h2 = gg2.double() if gg2 is not None else torch.zeros_like(b)
    grad_grad_out = (gathered(h1) * b + gathered(a) * h2).masked_fill(nan_rows, float("nan"))
    return grad_grad_out, scattered(h2 * g), (gathered(h1) * g).masked_fill(nan_rows, float("nan"))


def assert_close_nan(actual, expected, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=atol * scale, equal_nan=True)


def check_backward(grad_out, in1, in2, idx, dtype, in1_scale, reference_in1=None):
    """The backward op against expected_backward (of reference_in1: in1's values when in1 is a
    strided copy); grad_in1's tolerance scaled by in1_scale (it sums that many rows' products)."""
    grad_in1, grad_in2 = ops("fused_index_mul_2d").index_mul_2d_backward(grad_out, in1, in2, idx)
    expected_in1, expected_in2 = expected_backward(in1 if reference_in1 is None else reference_in1, in2, idx, grad_out)
    assert grad_in1.dtype == in1.dtype and grad_in2.dtype == in2.dtype
    assert_close_nan(grad_in1, expected_in1, dtype, scale=in1_scale)
    assert_close_nan(grad_in2, expected_in2, dtype)


PATTERNS = ["random", "sorted", "descending", "one_source", "hub_and_rest", "few_sources", "with_invalid"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("sources,rows,features", [(50, 3000, 64), (700, 2500, 5)])
def test_backward_index_patterns(device, dtype, pattern, sources, rows, features):
    in1, in2, _ = make(sources, rows, features, dtype, device)
    idx = index_pattern(pattern, sources, rows).to(device)
    grad_out = torch.randn(rows, features, dtype=torch.float64).to(dtype).to(device)
    repeats = float(torch.bincount(idx.cpu() % sources, minlength=sources).max())
    check_backward(grad_out, in1, in2, idx, dtype, repeats ** 0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("which", ["both", "gg1", "gg2"])
@pytest.mark.parametrize("pattern", ["random", "one_source", "with_invalid"])
def test_double_backward_index_patterns(device, dtype, which, pattern):
    sources, rows, features = 40, 2000, 24
    in1, in2, _ = make(sources, rows, features, dtype, device)
    idx = index_pattern(pattern, sources, rows).to(device)
    grad_out = torch.randn_like(in2)
    gg1 = torch.randn_like(in1) if which in ("both", "gg1") else None
    gg2 = torch.randn_like(in2) if which in ("both", "gg2") else None
    outputs = torch.ops.apex.index_mul_2d_backward_backward(gg1, gg2, grad_out, in1, in2, idx)
    repeats = float(torch.bincount(idx.cpu() % sources, minlength=sources).max())
    for actual, expected, scale in zip(outputs, expected_backward(in1, in2, idx, grad_out, gg1, gg2),
                                       (2.0, repeats ** 0.5, 1.0)):
        assert_close_nan(actual, expected, dtype, scale=scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,features", [(torch.float32, 600), (torch.bfloat16, 300), (torch.float16, 1),
                                            (torch.bfloat16, 8)])
def test_backward_row_widths(device, dtype, features):
    # Rows of more 16-byte packs than a warp has lanes (each lane walks several), rows that are not
    # a whole number of packs (element-wise path), a row of one element, a row of exactly one pack.
    in1, in2, _ = make(30, 900, features, dtype, device)
    idx = index_pattern("hub_and_rest", 30, 900).to(device)
    check_backward(torch.randn_like(in2), in1, in2, idx, dtype, 30.0)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_many_rows(device):
    # More ranges than the GPU holds warps at once (each block walks several), sources of ~300 rows.
    in1, in2, _ = make(1000, 300_000, 8, torch.float32, device)
    idx = index_pattern("random", 1000, 300_000).to(device)
    check_backward(torch.randn_like(in2), in1, in2, idx, torch.float32, 20.0)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_non_contiguous_inputs(device):
    in1, in2, _ = make(20, 500, 16, torch.bfloat16, device)
    idx = index_pattern("hub_and_rest", 20, 1000).to(device)[::2]
    grad_out = torch.randn(16, 500, dtype=torch.bfloat16, device=device).t()
    wide1 = torch.randn(20, 32, dtype=torch.bfloat16, device=device)[:, ::2].copy_(in1)
    check_backward(grad_out, wide1, in2, idx, torch.bfloat16, 30.0, reference_in1=in1)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_no_rows_or_no_sources(device):
    in1, in2, idx = make(6, 0, 8, torch.bfloat16, device)
    grad_in1, grad_in2 = torch.ops.apex.index_mul_2d_backward(torch.empty_like(in2), in1, in2, idx)
    assert grad_in2.shape == (0, 8) and grad_in1.shape == (6, 8) and (grad_in1 == 0).all()
    # No sources: every index is out of range.
    in1 = torch.empty(0, 8, dtype=torch.float32, device=device)
    in2 = torch.randn(5, 8, device=device)
    idx = torch.tensor([0, 1, -1, 2, 0], device=device)
    grad_in1, grad_in2 = torch.ops.apex.index_mul_2d_backward(torch.randn_like(in2), in1, in2, idx)
    assert grad_in1.shape == (0, 8) and grad_in2.isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_is_deterministic(device, dtype):
    # Many rows per source (each crossing several of the walk's ranges): the sums come out in the
    # same order, so to the same bits, every run.
    in1, in2, _ = make(64, 200_000, 32, dtype, device)
    idx = index_pattern("random", 64, 200_000).to(device)
    grad_out = torch.randn_like(in2)
    first = torch.ops.apex.index_mul_2d_backward(grad_out, in1, in2, idx)
    for _ in range(3):
        again = torch.ops.apex.index_mul_2d_backward(grad_out, in1, in2, idx)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    gg2 = torch.randn_like(in2)
    first = torch.ops.apex.index_mul_2d_backward_backward(None, gg2, grad_out, in1, in2, idx)
    again = torch.ops.apex.index_mul_2d_backward_backward(None, gg2, grad_out, in1, in2, idx)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


# ---- the walk's batches of rows in flight (kRowsInFlight) and the sort's source bits: pieces of every
# length around a batch, source counts whose keys (`sources` included) just fit 16 bits or need 17 ------

def assert_same_bits(actual, expected):
    """Bit for bit, NaN rows included (torch.equal is False on NaN: the invalid rows of grad_in2)."""
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[actual.element_size()]
    assert actual.dtype == expected.dtype and torch.equal(actual.view(as_int), expected.view(as_int))


def counted_index(counts, seed):
    """Shuffled rows, counts[s] of them into source s (0 rows: a source the walk never sees)."""
    generator = torch.Generator().manual_seed(seed)
    idx = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return idx[torch.randperm(len(idx), generator=generator)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,features", [(torch.bfloat16, 64), (torch.float32, 64), (torch.float64, 64),
                                            (torch.bfloat16, 24), (torch.float32, 5)])
def test_backward_piece_lengths(device, dtype, features):
    # Source s gets s % 70 rows (0 to 69: every piece length around 1, 2 and 3 batches of every group
    # of lanes, and sources with none), plus one source over several warps' and blocks' ranges; the
    # double backward too; the same bits twice.
    counts = [s % 70 for s in range(300)] + [3000]
    sources, rows = len(counts), sum(counts)
    in1, in2, _ = make(sources, rows, features, dtype, device)
    idx = counted_index(counts, features).to(device)
    grad_out = torch.randn(rows, features, dtype=torch.float64).to(dtype).to(device)
    check_backward(grad_out, in1, in2, idx, dtype, 3000 ** 0.5)
    first = ops("fused_index_mul_2d").index_mul_2d_backward(grad_out, in1, in2, idx)
    again = ops("fused_index_mul_2d").index_mul_2d_backward(grad_out, in1, in2, idx)
    for a, b in zip(first, again):
        assert_same_bits(a, b)
    gg1, gg2 = torch.randn_like(in1), torch.randn_like(in2)
    outputs = ops("fused_index_mul_2d").index_mul_2d_backward_backward(gg1, gg2, grad_out, in1, in2, idx)
    for actual, expected, scale in zip(outputs, expected_backward(in1, in2, idx, grad_out, gg1, gg2),
                                       (2.0, 3000 ** 0.5, 1.0)):
        assert_close_nan(actual, expected, dtype, scale=scale)
    again = ops("fused_index_mul_2d").index_mul_2d_backward_backward(gg1, gg2, grad_out, in1, in2, idx)
    for a, b in zip(outputs, again):
        assert_same_bits(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sources", [65_534, 65_535, 65_536])  # keys up to `sources`: 16 bits, then 17
def test_backward_sources_at_16_bits(dtype, sources):
    # The highest valid source and the invalid rows' key (`sources`) where the sort's source bits go
    # from 16 (2 radix passes) to 17 (3). Invalid rows of grad_in2 are NaN in the op and the reference.
    rows, features = 150_000, 8
    in1, in2, _ = make(sources, rows, features, dtype, "cuda")
    idx = index_pattern("with_invalid", sources, rows)
    idx[1::13] = sources - 1
    idx[2::17] = -1
    idx = idx.cuda()
    grad_out = torch.randn_like(in2)
    valid = idx[(idx >= -sources) & (idx < sources)].cpu() % sources
    repeats = float(torch.bincount(valid, minlength=sources).max())
    check_backward(grad_out, in1, in2, idx, dtype, repeats ** 0.5)
    first = ops("fused_index_mul_2d").index_mul_2d_backward(grad_out, in1, in2, idx)
    again = ops("fused_index_mul_2d").index_mul_2d_backward(grad_out, in1, in2, idx)
    for a, b in zip(first, again):
        assert_same_bits(a, b)


# ---- the backward's walk over the sorted rows and the forward's several rows a thread: many sources,
# one source across every range of the walk (joined in range order), long inputs ---------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sources", [1000, 70_000])  # below and above 2^16 sources
def test_backward_many_sources(device, dtype, sources):
    rows, features = 400_000, 16
    in1, in2, _ = make(sources, rows, features, dtype, device)
    idx = index_pattern("with_invalid", sources, rows).to(device)
    grad_out = torch.randn_like(in2)
    repeats = float(torch.bincount(idx.cpu().clamp(0, sources - 1), minlength=sources).max())
    check_backward(grad_out, in1, in2, idx, dtype, repeats ** 0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_one_source_long(device, dtype):
    # Every row into one source: it spans every range of the walk, and its sum is the join of all of
    # their partials; the double backward's too. Products of magnitude ~1/64 keep the sum's rounding
    # within the tolerance (the reference sums in float64).
    rows, features = 300_000, 8
    in1, in2, _ = make(3, rows, features, dtype, device)
    in2 = in2 / 8
    idx = torch.full((rows,), -2, device=device)  # source 1, negative
    grad_out = (torch.randn_like(in2.double()) / 8).to(dtype)
    check_backward(grad_out, in1, in2, idx, dtype, rows ** 0.5)
    gg2 = (torch.randn_like(in2.double()) / 8).to(dtype)
    outputs = ops("fused_index_mul_2d").index_mul_2d_backward_backward(None, gg2, grad_out, in1, in2, idx)
    for actual, expected, scale in zip(outputs, expected_backward(in1, in2, idx, grad_out, None, gg2),
                                       (2.0, rows ** 0.5, 1.0)):
        assert_close_nan(actual, expected, dtype, scale=scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_forward_long(device, dtype):
    # More rows than the forward's grid covers at several rows a thread (each thread loops), a row
    # count no multiple of anything, and invalid indices among them.
    sources, rows, features = 5000, 1_000_003, 16
    in1, in2, _ = make(sources, rows, features, dtype, device)
    idx = index_pattern("with_invalid", sources, rows).to(device)
    out = index_mul_2d(in1, in2, idx)
    valid = (idx >= -sources) & (idx < sources)
    expected = (in1.double()[torch.where(valid, idx, 0)] * in2.double()).masked_fill(~valid.unsqueeze(1), float("nan"))
    assert_close_nan(out, expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_deterministic_many_sources(dtype):
    # The bench's shape scaled down: sums in a fixed order, the same bits every run, to both orders
    # of the walk's partials (sources crossing range ends) and grad_in2.
    sources, rows, features = 50_000, 500_000, 64
    in1, in2, _ = make(sources, rows, features, dtype, "cuda")
    idx = index_pattern("random", sources, rows).cuda()
    grad_out = torch.randn_like(in2)
    first = ops("fused_index_mul_2d").index_mul_2d_backward(grad_out, in1, in2, idx)
    again = ops("fused_index_mul_2d").index_mul_2d_backward(grad_out, in1, in2, idx)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    repeats = float(torch.bincount(idx.cpu(), minlength=sources).max())
    expected_in1, expected_in2 = expected_backward(in1, in2, idx, grad_out)
    assert_close_nan(first[0], expected_in1, dtype, scale=repeats ** 0.5)
    assert_close_nan(first[1], expected_in2, dtype)
