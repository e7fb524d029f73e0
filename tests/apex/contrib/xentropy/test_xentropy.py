"""apex.contrib.xentropy against a float64 PyTorch reference on CPU and (marker gpu) CUDA: losses and
gradients over dtypes and odd sizes, label smoothing, ignored / out-of-range labels, strided logits,
NVIDIA apex's module face, tracing, and bad input."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import xentropy_cuda
from apex.contrib.xentropy import SoftmaxCrossEntropyLoss, softmax_cross_entropy

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Losses are accumulated in float32 (float64) from exactly representable inputs: only summation
# order differs from the reference. Gradients are rounded once to the logits' dtype.
LOSS_TOL = {torch.float32: 2e-5, torch.float16: 2e-5, torch.bfloat16: 2e-5, torch.float64: 1e-10}
# The 16-bit kernels compute p = 2^(x log2(e) - lse log2(e)) with ex2.approx: the exponent carries the
# roundings of lse and of lse log2(e) (~1e-6 each at the tests' |lse| < 16) and ex2.approx ~2^-22, so
# p is off by up to ~2e-6 relative (measured: 1.07e-6 at p ~ 1). Where the exact gradient g (p - 1)
# is 0 (one class, or a label with p ~ 1) that shows as |grad| ~1e-6 at |g| <= 1: float16's atol is
# 4e-6 (~4 x 2^-20, twice that bound), not float16's resolution near 0. bfloat16's 1e-5 covers it.
GRAD_TOL = {torch.float32: (1e-5, 1e-7), torch.float16: (1e-3, 4e-6), torch.bfloat16: (8e-3, 1e-5),
            torch.float64: (1e-10, 1e-14)}


def reference_losses(logits, labels, smoothing, ignore_index):
    """Per-row losses in float64: -(1 - s) log p[label] - s mean log p, 0 where ignored."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    keep = labels != ignore_index
    picked = logp.gather(1, torch.where(keep, labels, 0).unsqueeze(1)).squeeze(1)
    losses = -(1 - smoothing) * picked - smoothing * logp.mean(dim=-1)
    return torch.where(keep, losses, 0.0)


def reference_grad(logits, labels, smoothing, ignore_index, grad_loss):
    x = logits.detach().double().requires_grad_()
    reference_losses(x, labels, smoothing, ignore_index).backward(grad_loss.double())
    return x.grad


def make_inputs(rows, classes, dtype, device, ignore_index=-100, ignored=0):
    logits = (3 * torch.randn(rows, classes, dtype=torch.float64)).to(dtype).to(device)
    labels = torch.randint(0, classes, (rows,))
    labels[:ignored] = ignore_index
    return logits, labels[torch.randperm(rows)].to(device)


def check(logits, labels, smoothing, ignore_index, grad_loss=None):
    dtype = logits.dtype
    x = logits.detach().requires_grad_()
    losses = softmax_cross_entropy(x, labels, smoothing=smoothing, ignore_index=ignore_index)
    assert losses.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    expected = reference_losses(logits, labels, smoothing, ignore_index)
    tol = LOSS_TOL[dtype]
    torch.testing.assert_close(losses.double(), expected, rtol=tol, atol=tol)
    grad_loss = torch.rand(len(labels), device=logits.device) if grad_loss is None else grad_loss
    losses.backward(grad_loss.to(losses.dtype))
    rtol, atol = GRAD_TOL[dtype]
    assert x.grad.dtype == dtype and x.grad.shape == logits.shape
    torch.testing.assert_close(x.grad.double(), reference_grad(logits, labels, smoothing, ignore_index, grad_loss),
                               rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,classes", [(1, 1), (3, 7), (17, 1000), (5, 4099), (4, 32003)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_losses_and_gradients_match_torch(device, dtype, rows, classes, smoothing):
    logits, labels = make_inputs(rows, classes, dtype, device, ignored=rows // 4)
    check(logits, labels, smoothing, -100)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    logits = torch.randn(0, 10, device=device, requires_grad=True)
    losses = softmax_cross_entropy(logits, torch.zeros(0, dtype=torch.long, device=device))
    assert losses.shape == (0,)
    losses.sum().backward()
    assert logits.grad.shape == (0, 10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_and_misaligned_logits(device, dtype):
    wide = (3 * torch.randn(9, 1031, device=device)).to(dtype)
    labels = torch.randint(0, 1000, (9,), device=device)
    for view in (wide[:, :1000], wide[:, 3:1003], wide[::2, :1000], wide.t().contiguous().t()[:, :1000]):
        check(view, labels[: view.shape[0]], 0.1, -100)
    check(wide[:, :1000].t().contiguous().t(), labels, 0.0, -100)  # column-major: copied to unit stride


@pytest.mark.parametrize("device", DEVICES)
def test_mean_reduction_reads_the_expanded_gradient(device):
    logits, labels = make_inputs(33, 517, torch.float32, device, ignored=5)
    x = logits.clone().requires_grad_()
    softmax_cross_entropy(x, labels, smoothing=0.2, reduction="mean").backward()
    y = logits.clone().requires_grad_()
    F.cross_entropy(y, labels, label_smoothing=0.2).backward()
    torch.testing.assert_close(x.grad, y.grad)
    torch.testing.assert_close(softmax_cross_entropy(logits, labels, smoothing=0.2, reduction="sum"),
                               F.cross_entropy(logits, labels, label_smoothing=0.2, reduction="sum"))


@pytest.mark.parametrize("device", DEVICES)
def test_padding_idx_default_zeroes_class_zero_rows(device):
    logits, _ = make_inputs(6, 13, torch.float32, device)
    labels = torch.tensor([0, 1, 0, 5, 12, 3], device=device)
    x = logits.clone().requires_grad_()
    losses = SoftmaxCrossEntropyLoss.apply(x, labels, 0.1)  # padding_idx=0, as NVIDIA apex
    losses.sum().backward()
    tol = LOSS_TOL[torch.float32]
    torch.testing.assert_close(losses.double(), reference_losses(logits, labels, 0.1, 0), rtol=tol, atol=tol)
    assert (losses[labels == 0] == 0).all() and (x.grad[labels == 0] == 0).all()
    kept = SoftmaxCrossEntropyLoss.apply(logits, labels, 0.1, -100)  # torch's ignore_index instead
    torch.testing.assert_close(kept.double(), reference_losses(logits, labels, 0.1, -100), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_label_gives_nan_row(device):
    logits = torch.randn(3, 5, device=device, requires_grad=True)
    labels = torch.tensor([1, 5, -1], device=device)
    losses = softmax_cross_entropy(logits, labels)
    losses.sum().backward()
    assert losses[0].isfinite() and losses[1:].isnan().all()
    assert logits.grad[0].isfinite().all() and logits.grad[1:].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_infinite_logits(device, smoothing):
    # -inf logits are masked classes: p = 0 there. Unsmoothed, the loss stays finite (the CUDA kernel
    # sums every logit for smoothing's mean, and once multiplied that -inf sum by s = 0: NaN);
    # smoothed, mean(log p) is -inf and the loss +inf, as torch has it, with finite gradients.
    logits = torch.randn(4, 9, device=device)
    logits[:, 2] = float("-inf")        # masked classes
    logits[3, :] = float("-inf")        # an all-masked row is undefined, as in torch: NaN
    labels = torch.tensor([0, 1, 3, 4], device=device)
    x = logits.clone().requires_grad_()
    losses = softmax_cross_entropy(x, labels, smoothing=smoothing)
    losses[:3].sum().backward()
    y = logits[:3].clone().requires_grad_()
    expected = F.cross_entropy(y, labels[:3], reduction="none", label_smoothing=smoothing)
    expected.sum().backward()
    torch.testing.assert_close(losses[:3], expected)
    assert bool(losses[:3].isfinite().all()) == (smoothing == 0.0)
    assert losses[3].isnan()
    torch.testing.assert_close(x.grad[:3], y.grad)
    torch.testing.assert_close(x.grad[:3, 2], torch.full((3,), -smoothing / 9, device=device))  # g * (0 - s / V)


@pytest.mark.parametrize("device", DEVICES)
def test_historical_face(device):
    logits, labels = make_inputs(8, 100, torch.float16, device)
    losses, max_log_sum_exp = xentropy_cuda.forward(logits, labels, 0.1, True)
    torch.testing.assert_close(losses.double(), reference_losses(logits, labels, 0.1, -100), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(max_log_sum_exp, torch.logsumexp(logits.float(), dim=-1))
    grad_loss = torch.rand(8, device=device)
    grad = xentropy_cuda.backward(grad_loss, logits, max_log_sum_exp, labels, 0.1)
    rtol, atol = GRAD_TOL[torch.float16]
    torch.testing.assert_close(grad.double(), reference_grad(logits, labels, 0.1, -100, grad_loss),
                               rtol=rtol, atol=atol)
    assert {"forward", "backward"} <= set(dir(xentropy_cuda))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    logits = torch.randn(4, 10, device=device)
    labels = torch.randint(0, 10, (4,), device=device)
    cases = [
        ((logits.long(), labels), "logits must be float32"),
        ((logits[0], labels), "logits must be 2-D"),
        ((logits[:, :0], labels), "at least one class"),
        ((logits, labels.int()), "labels must be int64"),
        ((logits, labels[:3]), r"labels must have shape \[4\]"),
        ((logits, labels.cpu() if device == "cuda" else labels.to("meta")), "labels is on"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            softmax_cross_entropy(*args)
    with pytest.raises(RuntimeError, match="smoothing must be in"):
        softmax_cross_entropy(logits, labels, smoothing=1.5)
    with pytest.raises(ValueError, match="reduction"):
        softmax_cross_entropy(logits, labels, reduction="avg")
    losses, lse = xentropy_cuda.forward(logits, labels)
    with pytest.raises(RuntimeError, match="grad_loss must have shape"):
        xentropy_cuda.backward(losses[:2], logits, lse, labels)
    with pytest.raises(RuntimeError, match="max_log_sum_exp must be"):
        xentropy_cuda.backward(losses, logits, lse.half(), labels)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()

    def loss_fn(x, y):
        return softmax_cross_entropy(x, y, smoothing=0.1, reduction="mean")

    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=dynamic)
    for rows, classes in ((6, 50), (9, 77)):
        logits, labels = make_inputs(rows, classes, torch.float32, device, ignored=2)
        x, y = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        compiled(x, labels).backward()
        loss_fn(y, labels).backward()
        torch.testing.assert_close(x.grad, y.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits, labels = make_inputs(5, 33, torch.float32, device, ignored=1)
    logits.requires_grad_()
    opcheck(torch.ops.apex.xentropy_forward, (logits, labels, 0.1, False, -100))
    losses, lse = torch.ops.apex.xentropy_forward(logits.detach(), labels, 0.1, False, -100)
    opcheck(torch.ops.apex.xentropy_backward, (torch.rand_like(losses), logits.detach(), lse, labels, 0.1, -100))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("classes", [128256, 256000, 262147])
def test_large_vocabularies_on_gpu(dtype, classes):
    logits, labels = make_inputs(6, classes, dtype, "cuda", ignored=1)
    check(logits, labels, 0.1, -100)


@pytest.mark.gpu
def test_many_rows_on_gpu():
    logits, labels = make_inputs(70000, 50, torch.bfloat16, "cuda", ignored=100)
    check(logits, labels, 0.0, -100)


@pytest.mark.gpu
def test_more_than_2_31_elements_on_gpu():
    # 16385 x 131072 bf16 logits (4.3 GB, and as much gradient): 2^31 + 2^17 elements, so the last
    # rows start past every 32-bit offset. Rows at both ends are checked against the reference.
    rows, classes = 16385, 131072
    logits = torch.randn(rows, classes, device="cuda", dtype=torch.bfloat16)
    labels = torch.randint(0, classes, (rows,), device="cuda")
    x = logits.clone().requires_grad_()
    losses = softmax_cross_entropy(x, labels, smoothing=0.1)
    grad_loss = torch.rand(rows, device="cuda")
    losses.backward(grad_loss)
    rtol, atol = GRAD_TOL[torch.bfloat16]
    for row in (0, rows - 2, rows - 1):
        at = slice(row, row + 1)
        torch.testing.assert_close(losses[at].double(), reference_losses(logits[at], labels[at], 0.1, -100),
                                   rtol=LOSS_TOL[torch.bfloat16], atol=LOSS_TOL[torch.bfloat16])
        expected = reference_grad(logits[at], labels[at], 0.1, -100, grad_loss[at])
        torch.testing.assert_close(x.grad[at].double(), expected, rtol=rtol, atol=atol)


# --- the 16-bit kernels' boundaries (csrc/xentropy/xentropy_16bit.cuh) -------------------------------
# Block shape: 64 / 128 / 256 threads switch at 4096 / 8192 classes (512 / 1024 packs of 8), a
# batch is 8 packs a thread. "many" rows: 16 per SM + 3, several waves of blocks (4 resident an SM)
# with a ragged last one.


def many_rows():
    return 16 * torch.cuda.get_device_properties(0).multi_processor_count + 3


BOUNDARY_CLASSES = [2, 8, 9, 15, 17, 255, 257, 4095, 4097, 8191, 8193, 32001]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("classes", BOUNDARY_CLASSES)
def test_16_bit_block_shape_boundaries_on_gpu(dtype, classes):
    logits, labels = make_inputs(5, classes, dtype, "cuda", ignored=1)
    check(logits, labels, 0.1, -100)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("classes", [1, 7, 8, 9, 257, 1000, 4097, 32001])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_16_bit_many_rows_on_gpu(dtype, classes, smoothing):
    # classes=1: p = 1 and a zero gradient, up to ex2.approx's error (GRAD_TOL's note).
    logits, labels = make_inputs(many_rows(), classes, dtype, "cuda", ignored=40)
    check(logits, labels, smoothing, -100)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [5, "many"])
def test_16_bit_misaligned_rows_on_gpu(rows):
    # Rows starting 1..7 elements past a 16-byte boundary: scalar heads and tails around the packs.
    rows = many_rows() if rows == "many" else rows
    wide = (3 * torch.randn(rows, 4121, device="cuda")).bfloat16()
    labels = torch.randint(0, 4000, (rows,), device="cuda")
    for view in (wide[:, 3:4003], wide[:, 1:4116], wide[:, :4113], wide[:, 7:10]):
        check(view, labels.clamp(max=view.shape[1] - 1), 0.1, -100)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [5, "many"])
def test_equal_logits_on_gpu(dtype, rows):
    # Every logit of a row equal (0, 5, -3 by row): loss log(V), gradient g * (1 - s) * (1/V - [j == y]).
    rows = many_rows() if rows == "many" else rows
    values = torch.tensor([0.0, 5.0, -3.0], device="cuda").repeat(rows)[:rows]
    logits = values[:, None].expand(rows, 32001).to(dtype).contiguous()
    labels = torch.randint(0, 32001, (rows,), device="cuda")
    check(logits, labels, 0.1, -100)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("rows", [4, "many"])
def test_16_bit_infinite_logits_on_gpu(dtype, smoothing, rows):
    # test_infinite_logits on 16-bit rows long enough for packs: -inf logits inside packs and in the
    # scalar tail, a row whose first packs are all -inf, and an all -inf row (NaN, as in torch).
    rows = many_rows() if rows == "many" else rows
    classes = 4099
    logits = (3 * torch.randn(rows, classes, device="cuda")).to(dtype)
    logits[:, 2] = float("-inf")
    logits[:, classes - 1] = float("-inf")
    logits[1, :2048] = float("-inf")
    logits[rows - 1, :] = float("-inf")
    labels = torch.randint(2048, classes - 1, (rows,), device="cuda")
    x = logits.clone().requires_grad_()
    losses = softmax_cross_entropy(x, labels, smoothing=smoothing)
    losses[: rows - 1].sum().backward()
    y = logits[: rows - 1].float().requires_grad_()
    expected = F.cross_entropy(y, labels[: rows - 1], reduction="none", label_smoothing=smoothing)
    expected.sum().backward()
    torch.testing.assert_close(losses[: rows - 1], expected, rtol=2e-5, atol=2e-5)
    assert bool(losses[: rows - 1].isfinite().all()) == (smoothing == 0.0)
    assert losses[rows - 1].isnan()
    rtol, atol = GRAD_TOL[dtype]
    torch.testing.assert_close(x.grad[: rows - 1].float(), y.grad, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [5, "many"])
def test_large_logits_on_gpu(dtype, rows):
    # Logits around 1e4: exp(x) overflows float without the max subtracted. A float lse of ~1e4
    # holds ~5e-4 of it, so the loss (a difference of such terms) is checked to 1e4 * 2^-20, and the
    # probabilities exp(x - lse) of the gradient to a relative 4e-3. bf16 (rtol 8e-3): its kernel's
    # exponent x log2(e) - lse log2(e) also carries lse log2(e)'s rounding (2^-11 at ~1.4e4), p to
    # 3.4e-4; a label that is its row's only max (p = 1) has gradient g s (1 - 1/V) ~ 0.1 g, so that
    # is 3.4e-3 of it, plus bf16's rounding (<= 3.9e-3).
    rows = many_rows() if rows == "many" else rows
    logits = (1e4 + 30 * torch.randn(rows, 4099, device="cuda", dtype=torch.float64)).to(dtype)
    labels = torch.randint(0, 4099, (rows,), device="cuda")
    x = logits.clone().requires_grad_()
    losses = softmax_cross_entropy(x, labels, smoothing=0.1)
    grad_loss = torch.rand(rows, device="cuda")
    losses.backward(grad_loss)
    assert losses.isfinite().all()
    torch.testing.assert_close(losses.double(), reference_losses(logits, labels, 0.1, -100), rtol=0, atol=1e4 * 2**-20)
    rtol, atol = GRAD_TOL[dtype]
    torch.testing.assert_close(x.grad.double(), reference_grad(logits, labels, 0.1, -100, grad_loss),
                               rtol=max(rtol, 4e-3), atol=max(atol, 1e-5))
