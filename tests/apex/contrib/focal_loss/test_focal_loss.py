"""apex.contrib.focal_loss against a float64 PyTorch reference on CPU and (marker gpu) CUDA: loss and
gradient over dtypes, odd and padded class counts, background / ignored anchors, label smoothing,
NVIDIA apex's module face, tracing, and bad input."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import focal_loss_cuda
from apex.contrib.focal_loss import focal_loss

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
LOSS_TOL = {torch.float32: 2e-5, torch.float16: 2e-5, torch.bfloat16: 2e-5, torch.float64: 1e-10}
GRAD_TOL = {torch.float32: (2e-5, 1e-7), torch.float16: (2e-3, 1e-6), torch.bfloat16: (1.6e-2, 1e-5),
            torch.float64: (1e-10, 1e-14)}


def reference(logits, targets, num_positives, real_classes, alpha, gamma, smoothing):
    """The loss in float64 by plain autograd-able torch ops."""
    x = logits[..., :real_classes].double()
    positive = (targets.unsqueeze(-1) == torch.arange(real_classes, device=x.device))
    target = positive.double() * (1 - smoothing) + smoothing / 2  # 1 - s/2 for the positive class, s/2 else
    p = torch.sigmoid(x)
    bce = F.binary_cross_entropy_with_logits(x, target, reduction="none")
    factor = torch.where(positive, alpha * (1 - p) ** gamma, (1 - alpha) * p ** gamma)
    loss = (factor * bce).masked_fill((targets == -2).unsqueeze(-1), 0.0)
    return loss.sum() / num_positives.double().reshape(())


def make(shape, classes, dtype, device):
    logits = (2 * torch.randn(*shape, classes, dtype=torch.float64)).to(dtype).to(device)
    targets = torch.randint(-2, classes - 1 if classes > 1 else 1, shape).to(device)
    num_positives = (targets >= 0).sum().float().clamp(min=1).reshape(1)
    return logits, targets, num_positives


def check(logits, targets, num_positives, real_classes, alpha=0.25, gamma=2.0, smoothing=0.0, loss_atol=None):
    dtype = logits.dtype
    loss_atol = LOSS_TOL[dtype] if loss_atol is None else loss_atol
    x = logits.detach().requires_grad_()
    loss = focal_loss.focal_loss(x, targets, num_positives, real_classes, alpha, gamma, smoothing)
    assert loss.dim() == 0 and loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    expected_x = logits.detach().double().requires_grad_()
    expected = reference(expected_x, targets, num_positives, real_classes, alpha, gamma, smoothing)
    torch.testing.assert_close(loss.double(), expected.detach(), rtol=LOSS_TOL[dtype], atol=loss_atol)
    grad = torch.rand((), dtype=torch.float64) + 0.5
    loss.backward(grad.to(loss))
    expected.backward(grad)
    rtol, atol = GRAD_TOL[dtype]
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.double(), expected_x.grad, rtol=rtol, atol=atol)


RANGE_VALUES = {
    # |logits| where exp underflows in float and f16, past f16's largest value (65504) and far past it.
    "large": [-1e30, -1e5, -88.0, -30.0, -20.0, 20.0, 30.0, 88.0, 1e5, 1e30],
    # Around the f16 limits of the packed backward: sigmoid(y)^2 leaves f16's range from |y| ~ 8.3 and
    # exp(-|y|) goes subnormal from ~10.4 and to zero from ~17, while the gradient still counts.
    "f16_edges": [-17.5, -12.0, -10.5, -9.7, -8.5, -8.0, -6.0, -3.0, 3.0, 6.0, 8.5, 10.5, 12.0, 17.5],
    # Near 0 (sigmoid ~ 1/2, bce ~ ln 2), bf16 values below f16's normal range, and exact zeros.
    "near_zero": [0.0, -0.0, 1e-10, -1e-10, 3e-6, -3e-6, 1e-3, -1e-3, 0.125, -0.125],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("values", list(RANGE_VALUES))
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("num_positives,grad_scale", [(1.0, 1e3), (1.0, 1e-3), (1e6, 1e3), (1e6, 1e-3), (3.0, 0.0)])
def test_bf16_gradient_ranges(device, values, smoothing, num_positives, grad_scale):
    # The bf16 backward at the ranges its packed-f16 kernel must survive (rows_backward_half2_kernel:
    # its bracket in f16x2, the factor sigmoid(y)^2 and grad_loss / num_positives in float): the logits
    # above, positives (every class of some rows), background, ignored rows and padding classes
    # holding NaN / inf; gradients scaled from 1e-9 to 1e3, and by 0 (every gradient exactly 0).
    # Label smoothing up to 1 (the largest u the f16 bounds allow). Gradient against float64.
    anchors, classes, real = 1037, 96, 91
    pool = torch.tensor(RANGE_VALUES[values], dtype=torch.float64)
    logits = pool[torch.randint(0, len(pool), (anchors, classes))].to(torch.bfloat16).to(device)
    targets = torch.randint(-1, real, (anchors,))
    targets[::5] = torch.arange(0, anchors, 5) % real  # positives in every real class
    targets[1::9] = -2
    targets = targets.to(device)
    bad = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.bfloat16, device=device)
    dirty = logits.clone()
    dirty[:, real:] = bad[torch.arange(classes - real, device=device) % 3]
    dirty[targets == -2] = bad[torch.arange(classes, device=device) % 3]
    clean = logits.clone()
    clean[:, real:] = 0
    clean[targets == -2] = 0
    npos = torch.tensor([num_positives], device=device)
    x = dirty.detach().requires_grad_()
    focal_loss.focal_loss(x, targets, npos, real, 0.25, 2.0, smoothing).backward(
        torch.tensor(grad_scale, device=device))
    expected_x = clean.detach().double().requires_grad_()
    reference(expected_x, targets, npos, real, 0.25, 2.0, smoothing).backward(
        torch.tensor(grad_scale, dtype=torch.float64, device=device))
    assert torch.all(x.grad[:, real:] == 0) and torch.all(x.grad[targets == -2] == 0)
    if grad_scale == 0.0:
        assert torch.all(x.grad == 0)
    rtol, atol = GRAD_TOL[torch.bfloat16]
    torch.testing.assert_close(x.grad.double(), expected_x.grad, rtol=rtol, atol=atol)


LOOP_CLASSES = [(1, 1), (7, 7), (8, 8), (9, 9), (96, 91), (96, 96), (97, 97), (256, 256)]
# Rows a thread of the rows kernels walks (anchors over the grid's row step, ~8.4k-10.6k at 96 classes
# on an H200, ~3.2k at 256): 4-5, 6-7, 8-9 and 11-12, around its walk by pairs of rows with the next
# pair in flight. Classes 1, 7, 9 and 97 take the general kernels.
LOOP_ROWS = [40000, 55001, 70001, 100003]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("classes,real", LOOP_CLASSES)
@pytest.mark.parametrize("anchors", [1, 2, 3, 31, 33])
def test_bf16_row_walk_few_rows(device, classes, real, anchors):
    # One to three rows (a thread's first pair partial or whole), and a block's rows (16 at 96
    # classes) odd and even past one block.
    torch.manual_seed(anchors * 1000 + classes)
    logits, targets, num_positives = make((anchors,), classes, torch.bfloat16, device)
    check(logits, targets, num_positives, real, smoothing=0.1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("classes,real", [(96, 91), (96, 96), (256, 256)])
@pytest.mark.parametrize("anchors", LOOP_ROWS)
def test_bf16_row_walk_many_rows(device, classes, real, anchors):
    torch.manual_seed(anchors + classes)
    logits, targets, num_positives = make((anchors,), classes, torch.bfloat16, device)
    targets[-5:] = torch.tensor([-2, real - 1, 0, -1, real - 1], device=device)  # the last rows' tail
    num_positives = (targets >= 0).sum().float().clamp(min=1).reshape(1)
    check(logits, targets, num_positives, real, smoothing=0.1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("classes,real", [(96, 91), (64, 64), (72, 65)])
@pytest.mark.parametrize("anchors", [5, 1037, 40000])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_16_bit_positive_in_every_place(device, dtype, classes, real, anchors, smoothing):
    # The 16-bit rows kernels pick each element's positive term by comparing its class with the
    # row's label: positives in the first real class, the last (in the padded pack where there is
    # one) and anywhere else, padding labels (>= real: no positive), ignored and background rows;
    # fewer rows than one block's step, a partial last step, and many steps a block.
    # 64 classes: no padded pack; 72: 9 packs a row, the last with one class.
    logits, _, _ = make((anchors,), classes, dtype, device)
    targets = torch.randint(0, real, (anchors,))
    targets[0::6] = 0
    targets[1::6] = real - 1
    targets[2::6] = -2
    targets[3::6] = real if real < classes else -1
    targets[4::6] = -1
    targets = targets.to(device)
    num_positives = ((targets >= 0) & (targets < real)).sum().float().clamp(min=1).reshape(1)
    check(logits, targets, num_positives, real, smoothing=smoothing)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,classes,real", [((1,), 1, 1), ((7,), 5, 5), ((3, 40), 96, 91), ((513,), 8, 8),
                                                 ((2, 3, 17), 33, 30)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_matches_torch(device, dtype, shape, classes, real, smoothing):
    logits, targets, num_positives = make(shape, classes, dtype, device)
    check(logits, targets, num_positives, real, smoothing=smoothing)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("anchors,classes,real", [(40000, 96, 91), (64, 3000, 2999)])
def test_many_rows_and_classes(device, dtype, anchors, classes, real):
    # More rows than the CUDA kernels' blocks hold at once (each thread walks several), and more
    # packs of classes per row than a block has threads along a row.
    logits, targets, num_positives = make((anchors,), classes, dtype, device)
    check(logits, targets, num_positives, real)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alpha,gamma", [(0.25, 0.0), (0.5, 1.0), (0.9, 3.5)])
def test_alpha_gamma(device, alpha, gamma):
    logits, targets, num_positives = make((64,), 16, torch.float32, device)
    check(logits, targets, num_positives, 16, alpha=alpha, gamma=gamma)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("classes,real", [(96, 91), (16, 16), (24, 17), (32, 8), (40, 33), (37, 30), (8, 0)])
@pytest.mark.parametrize("labels", ["mixed", "background", "last_real"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_pack_boundaries(device, dtype, classes, real, labels, smoothing):
    # 16-byte packs of classes (8 16-bit or 4 float32 logits): a padded last pack whose real part is
    # 1..7 classes, rows with no padding, packs wholly past the real classes, class counts that are
    # no multiple of a pack (element-wise kernels); rows with no positive class, and positives in
    # the last real class (the padded pack), beside background and ignored rows. Rows past the
    # kernels' blocks (each thread walks several groups of rows, the last one partial).
    anchors = 1037
    logits, targets, num_positives = make((anchors,), classes, dtype, device)
    if labels == "background":
        targets = torch.where(targets == -2, targets, torch.full_like(targets, -1))
    elif labels == "last_real" and real > 0:
        targets = torch.where(targets >= 0, torch.full_like(targets, real - 1), targets)
    else:
        targets = torch.where(targets >= max(real, 1), torch.full_like(targets, -1), targets)
    check(logits, targets, num_positives, real, smoothing=smoothing)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gamma", [0.0, 1.0, 2.0, 2.5])
def test_16_bit_gammas(device, dtype, gamma):
    # gamma == 2 takes its own kernels (a square, not an exponential).
    logits, targets, num_positives = make((300,), 96, dtype, device)
    check(logits, targets, num_positives, 91, gamma=gamma, smoothing=0.1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_extreme_logits(device, dtype):
    # Logits far below -20 and far above 20 for negative and positive classes alike (where exp
    # underflows or a kernel might clamp), and a NaN in a padding class, which must not leak.
    big = 60.0 if dtype == torch.float16 else 300.0
    values = torch.tensor([-big, -40.0, -21.0, -20.0, -19.5, -3.0, 0.0, 3.0, 19.5, 21.0, 40.0, big], dtype=torch.float64)
    logits = values[torch.randint(0, len(values), (64, 16))].to(dtype).to(device)
    logits[:, 12:] = float("nan")
    targets = torch.randint(-2, 12, (64,)).to(device)
    num_positives = (targets >= 0).sum().float().clamp(min=1).reshape(1)
    check(logits, targets, num_positives, 12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["uniform", "detector"])
def test_16_bit_loss_of_small_negatives(device, dtype, case):
    # A loss made almost wholly of negative classes with logits in [-10, -3] ("uniform": no positive
    # anchor) or [-8, -4] ("detector": a well-trained detector's background, 1% positive anchors with
    # logits in [0, 4]). There softplus(x) ~ exp(x) is small beside |x|, which a kernel computing it
    # as log(1 + exp(-x)) + x must get by cancellation. The loss is held to its tolerance relative
    # only (the detector's, ~7e-3, would pass the absolute one with any error). ~1.4M terms: a kernel
    # adding them one by one in float is ~3e-5 off, so the sums must go in short runs and trees.
    anchors, classes, real = 16384, 96, 91
    low, high = (-10.0, -3.0) if case == "uniform" else (-8.0, -4.0)
    logits = torch.empty(anchors, classes, dtype=torch.float64).uniform_(low, high)
    targets = torch.where(torch.rand(anchors) < 0.05, -2, -1)
    if case == "detector":
        positive = torch.randperm(anchors)[: anchors // 100]
        targets[positive] = torch.randint(0, real, (len(positive),))
        logits[positive, targets[positive]] = 4 * torch.rand(len(positive), dtype=torch.float64)
    num_positives = (targets >= 0).sum().float().clamp(min=1).reshape(1)
    check(logits.to(dtype).to(device), targets.to(device), num_positives.to(device), real, loss_atol=0.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("classes,real", [(96, 91), (16, 12), (40, 33)])
def test_nonfinite_logits_in_padding_and_ignored_rows(device, dtype, classes, real):
    # Padding classes and ignored rows hold NaN and inf: they add nothing to the loss and get a zero
    # gradient (kernels that compute a whole pack and mask its padding or an ignored row afterwards,
    # or that replace the padding's bits, must not let them leak). Positives in the last real
    # class (the padded pack) and in the first. Compared with the reference on the same logits with
    # those entries zeroed (the reference's own gradient through NaN would be NaN).
    anchors = 517
    logits, targets, num_positives = make((anchors,), classes, dtype, device)
    targets[::7] = real - 1
    targets[1::7] = 0
    targets[2::7] = -2
    bad = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype, device=device)
    dirty = logits.clone()
    dirty[:, real:] = bad[torch.arange(classes - real, device=device) % 3]
    ignored = targets == -2
    dirty[ignored] = bad[torch.arange(classes, device=device) % 3]
    clean = logits.clone()
    clean[:, real:] = 0
    clean[ignored] = 0
    x = dirty.detach().requires_grad_()
    loss = focal_loss.focal_loss(x, targets, num_positives, real, 0.25, 2.0, 0.1)
    expected_x = clean.detach().double().requires_grad_()
    expected = reference(expected_x, targets, num_positives, real, 0.25, 2.0, 0.1)
    torch.testing.assert_close(loss.double(), expected.detach(), rtol=LOSS_TOL[dtype], atol=LOSS_TOL[dtype])
    loss.backward()
    expected.backward()
    rtol, atol = GRAD_TOL[dtype]
    torch.testing.assert_close(x.grad.double(), expected_x.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
def test_large_logits_stay_finite(device):
    logits = torch.tensor([[80.0, -80.0, 0.0, 30.0], [-100.0, 100.0, 5.0, -5.0]], device=device)
    targets = torch.tensor([0, -1], device=device)
    check(logits, targets, torch.ones(1, device=device), 4)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    logits = torch.randn(0, 8, device=device, requires_grad=True)
    loss = focal_loss.focal_loss(logits, torch.zeros(0, dtype=torch.long, device=device), torch.ones(1, device=device),
                                 8, 0.25, 2.0)
    assert loss.item() == 0.0
    loss.backward()
    assert logits.grad.shape == (0, 8)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_logits(device):
    wide, targets, num_positives = make((40,), 24, torch.float32, device)
    check(wide[:, 3:19], targets.clamp(max=15), num_positives, 16)
    check(wide.t().contiguous().t(), targets, num_positives, 24)


@pytest.mark.parametrize("device", DEVICES)
def test_historical_module_and_apply(device):
    logits, targets, num_positives = make((10,), 8, torch.float32, device)
    loss, partial_grad = focal_loss_cuda.forward(logits, targets, num_positives, 8, 0.25, 2.0, 0.0)
    x = logits.double().requires_grad_()
    expected = reference(x, targets, num_positives, 8, 0.25, 2.0, 0.0)
    expected.backward()
    torch.testing.assert_close(loss.double(), expected.detach(), rtol=2e-5, atol=2e-5)
    grad = focal_loss_cuda.backward(torch.tensor(1.0, device=device), partial_grad, num_positives)
    assert grad.data_ptr() == partial_grad.data_ptr()  # in place, as in NVIDIA apex
    torch.testing.assert_close(grad.double(), x.grad, rtol=2e-5, atol=1e-7)
    torch.testing.assert_close(
        focal_loss.FocalLoss.apply(logits, targets, num_positives, 8, 0.25, 2.0, 0.0), loss)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    logits, targets, num_positives = make((6,), 4, torch.float32, device)
    cases = [
        ((logits.long(), targets, num_positives, 4), "cls_output must be float32"),
        ((logits, targets[:5], num_positives, 4), "cls_targets_at_level must have cls_output's shape"),
        ((logits, targets.int(), num_positives, 4), "cls_targets_at_level must be int64"),
        ((logits, targets, num_positives.double(), 4), "num_positives_sum must be a float32 tensor of one element"),
        ((logits, targets, torch.ones(2, device=device), 4), "num_positives_sum must be a float32"),
        ((logits, targets, num_positives, 5), r"num_real_classes must be in \[0, 4\]"),
        ((logits, targets.cpu() if device == "cuda" else targets.to("meta"), num_positives, 4),
         "cls_targets_at_level is on"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            focal_loss.focal_loss(*args, 0.25, 2.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()

    def loss_fn(x, t, n):
        return focal_loss.focal_loss(x * 1.5, t, n, 6, 0.25, 2.0, 0.05)

    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=dynamic)
    for anchors in (10, 13):
        logits, targets, num_positives = make((anchors,), 8, torch.float32, device)
        x1, x2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        compiled(x1, targets, num_positives).backward()
        loss_fn(x2, targets, num_positives).backward()
        torch.testing.assert_close(x1.grad, x2.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits, targets, num_positives = make((9,), 8, torch.float32, device)
    opcheck(torch.ops.apex.focal_loss_forward, (logits.requires_grad_(), targets, num_positives, 7, 0.25, 2.0, 0.1))
    opcheck(torch.ops.apex.focal_loss_backward,
            (torch.tensor(0.5, device=device), logits.detach(), targets, num_positives, 7, 0.25, 2.0, 0.1))
