"""apex.contrib.transducer against plain PyTorch references on CPU and (marker gpu) CUDA: the joint
(padded and packed, ReLU, dropout) with its gradients, the RNN-T loss (padded and packed) with its
gradient, NVIDIA apex's module faces, tracing, and bad input."""
import pytest
import torch
from torch.library import opcheck

import transducer_joint_cuda
import transducer_loss_cuda
from apex.contrib.transducer import TransducerJoint, TransducerLoss
from apex.contrib.transducer import _transducer_ref as reference

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def joint_inputs(dtype, device, hidden=24, batch=3, frames=7, steps=5, seed=0):
    torch.manual_seed(seed)
    f = torch.randn(batch, frames, hidden, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(batch, steps, hidden, dtype=dtype, device=device, requires_grad=True)
    f_len = torch.randint(1, frames + 1, (batch,), dtype=torch.int32, device=device)
    g_len = torch.randint(1, steps + 1, (batch,), dtype=torch.int32, device=device)
    f_len[0], g_len[-1] = frames, steps
    h_grad = torch.randn(batch, frames, steps, hidden, dtype=dtype, device=device)
    for b in range(batch):  # gradients past the lengths are zero, as the loss guarantees
        h_grad[b, int(f_len[b]):] = 0
        h_grad[b, :, int(g_len[b]):] = 0
    return f, g, f_len, g_len, h_grad


def pack(x, f_len, u_len):
    return torch.cat([x[b, : int(f_len[b]), : int(u_len[b])].reshape(-1, x.shape[-1]) for b in range(x.shape[0])])


def joint_reference(f, g, f_len, g_len, h_grad, pack_output, relu, dtype):
    """(h, f_grad, g_grad) of the plain-torch reference in ``dtype``, without dropout."""
    f_ref, g_ref = f.detach().to(dtype).requires_grad_(), g.detach().to(dtype).requires_grad_()
    return reference.transducer_joint_reference(f_ref, g_ref, h_grad.to(dtype), f_len, g_len, pack_output, relu, False)


def run_joint(joint, f, g, f_len, g_len, h_grad):
    """``joint``'s h of (f, g), after its backward of h_grad (packed as h is when the joint packs)."""
    offset = torch.cumsum(f_len * g_len, 0)
    h = joint(f, g, f_len, g_len, offset, offset[-1]) if joint.pack_output else joint(f, g, f_len, g_len)
    h.backward(pack(h_grad, f_len, g_len) if joint.pack_output else h_grad)
    return h


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pack_output", [False, True])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("hidden", [24, 13])
def test_joint_matches_reference(device, dtype, pack_output, relu, hidden):
    f, g, f_len, g_len, h_grad = joint_inputs(dtype, device, hidden)
    h_ref, f_grad_ref, g_grad_ref = joint_reference(f, g, f_len, g_len, h_grad, pack_output, relu, torch.float32)
    joint = TransducerJoint(pack_output=pack_output, relu=relu, probe_mask=True)
    h = run_joint(joint, f, g, f_len, g_len, h_grad)
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(h.float(), h_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(f.grad.float(), f_grad_ref, rtol=tol, atol=tol * 8)
    torch.testing.assert_close(g.grad.float(), g_grad_ref, rtol=tol, atol=tol * 8)
    if relu:
        assert joint.mask_probe[0].dtype == torch.uint8 and joint.mask_probe[0].shape == h.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pack_output", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_joint_long_sequences(device, pack_output, relu):
    # More frames than one CUDA block sums g_grad over: the backward splits them and adds the
    # splits' partial sums in a second kernel.
    f, g, f_len, g_len, h_grad = joint_inputs(torch.float32, device, hidden=64, batch=2, frames=300, steps=3)
    h_ref, f_grad_ref, g_grad_ref = joint_reference(f, g, f_len, g_len, h_grad, pack_output, relu, torch.float64)
    h = run_joint(TransducerJoint(pack_output=pack_output, relu=relu), f, g, f_len, g_len, h_grad)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f.grad.double(), f_grad_ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g.grad.double(), g_grad_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_joint_dropout_uses_its_mask(device, seed):
    f, g, f_len, g_len, h_grad = joint_inputs(torch.float32, device, seed=seed)
    joint = TransducerJoint(relu=True, dropout=True, dropout_prob=0.3, probe_mask=True)
    h = joint(f, g, f_len, g_len)
    h.backward(h_grad)
    mask = joint.mask_probe[0].bool()
    full = f.detach().unsqueeze(2) + g.detach().unsqueeze(1)
    expected = torch.where(mask, full / 0.7, 0.0)
    valid = torch.zeros_like(mask)
    for b in range(3):
        valid[b, : int(f_len[b]), : int(g_len[b])] = True
    torch.testing.assert_close(h[valid], expected[valid])
    assert ((full <= 0) & valid <= ~mask).all()  # ReLU'd values never pass
    # Dropout keeps about 1 - 0.3 of what passed ReLU. Counted over the lattice's valid positive
    # values only: the lengths (so the share of padding) are random and differ between devices.
    positive = valid & (full > 0)
    kept = (mask & positive).sum().item() / positive.sum().item()
    assert 0.55 < kept < 0.85
    torch.testing.assert_close(f.grad, (h_grad * mask / 0.7).sum(2))
    joint.eval()  # no dropout outside training
    torch.testing.assert_close(joint(f, g, f_len, g_len)[valid], torch.relu(full)[valid])


def discrete_joint_inputs(dtype, device, hidden, seed=0):
    """joint_inputs with f and g on a grid of quarters, so that f + g is often exactly 0: the ReLU
    boundary that a recomputed mask must place as the forward did."""
    f, g, f_len, g_len, h_grad = joint_inputs(dtype, device, hidden, seed=seed)
    f = (f.detach() * 4).round().clamp(-3, 3).div(4).requires_grad_()
    g = (g.detach() * 4).round().clamp(-3, 3).div(4).requires_grad_()
    return f, g, f_len, g_len, h_grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("pack_output", [False, True])
@pytest.mark.parametrize("hidden", [24, 13])
def test_joint_relu_mask_recomputed_matches_probed(device, dtype, pack_output, hidden):
    # Without probe_mask (and dropout) the forward writes no mask and the backward recomputes ReLU
    # from f and g: gradients identical, bit for bit, to those of the stored mask.
    f, g, f_len, g_len, h_grad = discrete_joint_inputs(dtype, device, hidden)
    assert ((f.unsqueeze(2) + g.unsqueeze(1)) == 0).any()
    results = []
    for probe in (True, False):
        fp, gp = f.detach().clone().requires_grad_(), g.detach().clone().requires_grad_()
        joint = TransducerJoint(pack_output=pack_output, relu=True, probe_mask=probe)
        h = run_joint(joint, fp, gp, f_len, g_len, h_grad)
        results.append((h.detach(), fp.grad, gp.grad))
    for probed, recomputed in zip(*results):
        torch.testing.assert_close(recomputed, probed, rtol=0, atol=0)
    _, f_grad_ref, g_grad_ref = joint_reference(f, g, f_len, g_len, h_grad, pack_output, True, torch.float64)
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float64: 1e-5}[dtype]
    torch.testing.assert_close(results[1][1].double(), f_grad_ref, rtol=tol, atol=tol * 8)
    torch.testing.assert_close(results[1][2].double(), g_grad_ref, rtol=tol, atol=tol * 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pack_output", [False, True])
@pytest.mark.parametrize("probe_mask", [False, True])
def test_joint_many_steps(device, pack_output, probe_mask):
    # More steps of u than one CUDA forward item covers (spans of up to 16): 37 as 13, 13, 11.
    f, g, f_len, g_len, h_grad = joint_inputs(torch.float32, device, hidden=32, batch=3, frames=5, steps=37)
    g_len[1] = 20
    for b in range(3):
        h_grad[b, :, int(g_len[b]):] = 0
    h_ref, f_grad_ref, g_grad_ref = joint_reference(f, g, f_len, g_len, h_grad, pack_output, True, torch.float64)
    h = run_joint(TransducerJoint(pack_output=pack_output, relu=True, probe_mask=probe_mask), f, g, f_len, g_len, h_grad)
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(f.grad.double(), f_grad_ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g.grad.double(), g_grad_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_joint_forward_writes_mask_only_when_needed(device):
    f, g, f_len, g_len, h_grad = discrete_joint_inputs(torch.float32, device, 16)
    forward = torch.ops.apex.transducer_joint_forward
    h, mask = forward(f, g, f_len, g_len, None, 0, True, 0.0)  # default: as NVIDIA apex, the mask
    assert mask.shape == h.shape and mask.dtype == torch.uint8
    h2, none = forward(f, g, f_len, g_len, None, 0, True, 0.0, False)
    assert none.numel() == 0
    torch.testing.assert_close(h2, h, rtol=0, atol=0)
    _, kept = forward(f, g, f_len, g_len, None, 0, True, 0.5, False)  # dropout's mask is always written
    assert kept.shape == h.shape
    # The backward op recomputing ReLU from f and g gives the stored mask's gradients.
    backward = torch.ops.apex.transducer_joint_backward
    stored = backward(h_grad, mask, f_len, g_len, None, 7, 5, 1.0)
    recomputed = backward(h_grad, None, f_len, g_len, None, 7, 5, 1.0, f.detach(), g.detach())
    for x, y in zip(stored, recomputed):
        torch.testing.assert_close(y, x, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="relu_f and relu_g come together"):
        backward(h_grad, None, f_len, g_len, None, 7, 5, 1.0, f.detach(), None)
    with pytest.raises(RuntimeError, match="either mask or relu_f"):
        backward(h_grad, mask, f_len, g_len, None, 7, 5, 1.0, f.detach(), g.detach())
    with pytest.raises(RuntimeError, match=r"relu_g must have shape"):
        backward(h_grad, None, f_len, g_len, None, 7, 5, 1.0, f.detach(), g.detach()[:, :4])
    with pytest.raises(RuntimeError, match="relu_f must have h_grad's dtype"):
        backward(h_grad, None, f_len, g_len, None, 7, 5, 1.0, f.detach().double(), g.detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("probe_mask", [False, True])
def test_joint_relu_dropout_without_probe(device, probe_mask):
    # Dropout keeps writing (and the backward reading) its mask whether or not it is probed.
    f, g, f_len, g_len, h_grad = joint_inputs(torch.float32, device, seed=3)
    joint = TransducerJoint(relu=True, dropout=True, dropout_prob=0.3, probe_mask=probe_mask)
    h = joint(f, g, f_len, g_len)
    h.backward(h_grad)
    passed = h.detach() != 0  # nonzero exactly where ReLU and dropout passed (h_grad is 0 past the lengths)
    torch.testing.assert_close(f.grad, (h_grad * passed / 0.7).sum(2))
    torch.testing.assert_close(g.grad, (h_grad * passed / 0.7).sum(1))
    if probe_mask:
        valid = h_grad != 0
        assert torch.equal(joint.mask_probe[0].bool()[valid], passed[valid])


def loss_inputs(dtype, device, batch=3, frames=6, steps=5, classes=7, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(batch, frames, steps, classes, dtype=dtype, device=device, requires_grad=True)
    blank = classes - 1
    label = torch.randint(0, blank, (batch, steps - 1), dtype=torch.int32, device=device)
    f_len = torch.randint(1, frames + 1, (batch,), dtype=torch.int32, device=device)
    y_len = torch.randint(0, steps, (batch,), dtype=torch.int32, device=device)
    f_len[0], y_len[-1] = frames, steps - 1
    return x, label, f_len, y_len, blank


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("classes", [7, 16, 1025])
def test_loss_matches_reference(device, dtype, packed, classes):
    x, label, f_len, y_len, blank = loss_inputs(dtype, device, classes=classes)
    loss_grad = torch.rand(3, dtype=dtype, device=device) + 0.5
    x_ref = x.detach().clone().requires_grad_()
    alpha_ref, beta_ref, grad_ref, loss_ref = reference.transducer_loss_reference(x_ref, label, f_len, y_len, blank,
                                                                                  loss_grad)
    module = TransducerLoss(packed_input=packed)
    debug = []
    if packed:
        offset = torch.cumsum(f_len * (y_len + 1), 0)
        x_packed = pack(x.detach(), f_len, y_len + 1).requires_grad_()
        loss = module(x_packed, label, f_len, y_len, blank, offset, int(f_len.max()), debug_list=debug)
        loss.backward(loss_grad)
        grad = torch.zeros_like(x)
        for b in range(3):
            start = int(offset[b - 1]) if b else 0
            rows = int(f_len[b]) * (int(y_len[b]) + 1)
            grad[b, : int(f_len[b]), : int(y_len[b]) + 1] = x_packed.grad[start:start + rows].view(
                int(f_len[b]), int(y_len[b]) + 1, -1)
    else:
        loss = module(x, label, f_len, y_len, blank, debug_list=debug)
        loss.backward(loss_grad)
        grad = x.grad
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.float64: 1e-5}[dtype]
    assert loss.dtype == dtype
    torch.testing.assert_close(loss, loss_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(grad, grad_ref, rtol=tol * 10, atol=tol)
    alpha, beta = debug
    # 16-bit log-probabilities may round the other way where the two log-sum-exps differ in a last bit.
    dp_tol = 2e-3 if dtype == torch.float16 else 1e-4
    for b in range(3):
        t, u = int(f_len[b]), int(y_len[b]) + 1
        torch.testing.assert_close(alpha[b, :t, :u].double(), alpha_ref[b, :t, :u].double(), rtol=dp_tol, atol=dp_tol)
        torch.testing.assert_close(beta[b, :t, :u].double(), beta_ref[b, :t, :u].double(), rtol=dp_tol, atol=dp_tol)


def check_loss(x, label, f_len, y_len, blank, tol, grad_tol, dp_tol=1e-4, packed=False):
    """TransducerLoss on x (padded, or packed from it) against the reference: loss, gradient, alpha, beta."""
    batch = x.shape[0]
    loss_grad = torch.rand(batch, dtype=x.dtype, device=x.device) + 0.5
    x_ref = x.detach().clone().requires_grad_()
    alpha_ref, beta_ref, grad_ref, loss_ref = reference.transducer_loss_reference(x_ref, label, f_len, y_len, blank,
                                                                                  loss_grad)
    debug = []
    if packed:
        offset = torch.cumsum(f_len * (y_len + 1), 0)
        x_packed = pack(x.detach(), f_len, y_len + 1).requires_grad_()
        loss = TransducerLoss(packed_input=True)(x_packed, label, f_len, y_len, blank, offset, int(f_len.max()),
                                                 debug_list=debug)
        loss.backward(loss_grad)
        grad = torch.zeros_like(x)
        for b in range(batch):
            start = int(offset[b - 1]) if b else 0
            t, u = int(f_len[b]), int(y_len[b]) + 1
            grad[b, :t, :u] = x_packed.grad[start:start + t * u].view(t, u, -1)
    else:
        loss = TransducerLoss()(x, label, f_len, y_len, blank, debug_list=debug)
        loss.backward(loss_grad)
        grad = x.grad
    torch.testing.assert_close(loss, loss_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(grad, grad_ref, rtol=grad_tol, atol=grad_tol)
    alpha, beta = debug
    for b in range(batch):
        t, u = int(f_len[b]), int(y_len[b]) + 1
        torch.testing.assert_close(alpha[b, :t, :u].double(), alpha_ref[b, :t, :u].double(), rtol=dp_tol, atol=dp_tol)
        torch.testing.assert_close(beta[b, :t, :u].double(), beta_ref[b, :t, :u].double(), rtol=dp_tol, atol=dp_tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,classes", [
    # Rows of up to 16 KiB take groups of lanes (several rows a warp for short rows), longer ones a
    # block each: around that threshold in float32 (4096) and float16 (8192); 2, 3, 33, 257 and 1000
    # classes for groups of 1 to 32 lanes; odd counts for rows' scalar heads and tails.
    (torch.float32, 2), (torch.float32, 3), (torch.float32, 33), (torch.float32, 257), (torch.float32, 1000),
    (torch.float32, 4096), (torch.float32, 4097), (torch.float16, 8192), (torch.float16, 8193),
    (torch.float16, 1000), (torch.float64, 129)])
@pytest.mark.parametrize("packed", [False, True])
def test_loss_row_sizes(device, dtype, classes, packed):
    x, label, f_len, y_len, blank = loss_inputs(dtype, device, batch=2, frames=3, steps=4, classes=classes)
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.float64: 1e-5}[dtype]
    check_loss(x, label, f_len, y_len, blank, tol, tol * 10, dp_tol=2e-3 if dtype == torch.float16 else 1e-4,
               packed=packed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [1, 3])
def test_loss_misaligned_rows(device, offset):
    # A contiguous x whose data starts off a 16-byte boundary: every row's vectors shift, with scalars
    # at both ends.
    x, label, f_len, y_len, blank = loss_inputs(torch.float16, device, classes=64)
    storage = torch.empty(x.numel() + offset, dtype=x.dtype, device=device)
    shifted = storage[offset:].view(x.shape).copy_(x.detach()).requires_grad_()
    assert shifted.is_contiguous() and shifted.data_ptr() % 16 != 0
    check_loss(shifted, label, f_len, y_len, blank, 1e-3, 1e-2, dp_tol=2e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [False, True])
def test_loss_bfloat16(device, packed):
    # bfloat16 log-probabilities (8 bits) round the other way more often where two log-sum-exps differ
    # in a last bit: loose tolerances, against the reference in bfloat16.
    x, label, f_len, y_len, blank = loss_inputs(torch.bfloat16, device, classes=300)
    check_loss(x, label, f_len, y_len, blank, 5e-2, 2e-2, dp_tol=5e-2, packed=packed)


@pytest.mark.parametrize("device", DEVICES)
def test_historical_modules(device):
    x, label, f_len, y_len, blank = loss_inputs(torch.float32, device)
    x_log = torch.log_softmax(x.detach(), -1)
    alpha, beta, loss = transducer_loss_cuda.forward(x_log, label, f_len, y_len, torch.empty(0), 6, blank, 1, False)
    expected = TransducerLoss()(x.detach(), label, f_len, y_len, blank)
    torch.testing.assert_close(loss, expected)
    grad = transducer_loss_cuda.backward(x_log, torch.ones(3, device=device), alpha, beta, f_len, y_len, label,
                                         torch.empty(0), 6, blank, 1, True, False)
    x_ref = x.detach().clone().requires_grad_()
    TransducerLoss()(x_ref, label, f_len, y_len, blank).sum().backward()
    torch.testing.assert_close(grad, x_ref.grad, rtol=1e-4, atol=1e-5)
    unfused = transducer_loss_cuda.backward(x_log, torch.ones(3, device=device), alpha, beta, f_len, y_len, label,
                                            torch.empty(0), 6, blank, 1, False, False)
    x_log_leaf = x_log.clone().requires_grad_()
    torch.log_softmax(x_log_leaf, -1).backward(unfused)  # the unfused gradient is in the log-probabilities
    torch.testing.assert_close(x_log_leaf.grad, x_ref.grad, rtol=1e-4, atol=1e-5)

    f, g, f_len, g_len, h_grad = joint_inputs(torch.float32, device)
    h, mask = transducer_joint_cuda.forward(f, g, f_len, g_len, torch.empty(0), 0, 1, False, False, False, 0.0, 4)
    torch.testing.assert_close(h, TransducerJoint()(f, g, f_len, g_len))
    f_grad, g_grad = transducer_joint_cuda.backward([h_grad], f_len, g_len, torch.empty(0), 7, 5, False, 1.0)
    torch.testing.assert_close(f_grad, h_grad.sum(2))
    torch.testing.assert_close(g_grad, h_grad.sum(1))


@pytest.mark.parametrize("device", DEVICES)
def test_reference_relu_dropout_fails_as_nvidia_apex_tests_expect(device):
    # NVIDIA apex's relu + dropout joint tests are expectedFailure: its reference drops out in place
    # after the ReLU, and backward refuses. Ours does the same, so those tests still fail as marked.
    f, g, f_len, g_len, h_grad = joint_inputs(torch.float32, device)
    mask = torch.ones(h_grad.shape, dtype=torch.uint8, device=device)
    with pytest.raises(RuntimeError, match="inplace"):
        reference.transducer_joint_reference(f, g, h_grad, f_len, g_len, False, True, True, 0.5, mask)
    h, f_grad, _ = reference.transducer_joint_reference(f.detach().clone().requires_grad_(),
                                                        g.detach().clone().requires_grad_(), h_grad, f_len, g_len,
                                                        False, False, True, 0.5, mask)
    torch.testing.assert_close(f_grad, 2 * h_grad.sum(2))  # without ReLU, dropout's scale reaches the grads


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    f = torch.randn(0, 4, 8, device=device, requires_grad=True)
    g = torch.randn(0, 3, 8, device=device, requires_grad=True)
    lengths = torch.zeros(0, dtype=torch.int32, device=device)
    h = TransducerJoint(relu=True)(f, g, lengths, lengths)
    assert h.shape == (0, 4, 3, 8)
    h.sum().backward()
    assert f.grad.shape == f.shape and g.grad.shape == g.shape
    x = torch.randn(0, 4, 3, 5, device=device, requires_grad=True)
    label = torch.zeros(0, 2, dtype=torch.int32, device=device)
    loss = TransducerLoss()(x, label, lengths, lengths, 4)
    assert loss.shape == (0,)
    loss.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    f, g, f_len, g_len, h_grad = joint_inputs(torch.float32, device)
    # f and g as strided views (batch-minor storage), h_grad transposed in memory.
    f_view = f.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    g_view = torch.stack([g.detach(), g.detach()], -1).flatten(-2)[..., ::2].requires_grad_()
    assert not f_view.is_contiguous() and not g_view.is_contiguous()
    h = TransducerJoint()(f_view, g_view, f_len, g_len)
    h.backward(h_grad.transpose(0, 1).contiguous().transpose(0, 1))
    h_ref, f_grad_ref, g_grad_ref = reference.transducer_joint_reference(f, g, h_grad, f_len, g_len, False, False,
                                                                         False)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(f_view.grad, f_grad_ref)
    torch.testing.assert_close(g_view.grad, g_grad_ref)

    x, label, f_len, y_len, blank = loss_inputs(torch.float32, device)
    wide = torch.randn(*x.shape[:-1], 2 * x.shape[-1], device=device)
    wide[..., ::2] = x.detach()
    x_view = wide[..., ::2].requires_grad_()  # a class stride of 2
    label_view = torch.stack([label, label], -1).flatten(1)[:, ::2]
    assert not x_view.is_contiguous() and not label_view.is_contiguous()
    loss = TransducerLoss()(x_view, label_view, f_len, y_len, blank)
    loss.sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    _, _, grad_ref, loss_ref = reference.transducer_loss_reference(x_ref, label, f_len, y_len, blank,
                                                                   torch.ones(3, device=device))
    torch.testing.assert_close(loss, loss_ref)
    torch.testing.assert_close(x_view.grad, grad_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    f, g, f_len, g_len, _ = joint_inputs(torch.float32, device)
    joint = TransducerJoint()
    with pytest.raises(RuntimeError, match="g must have f's dtype"):
        joint(f, g.double(), f_len, g_len)
    with pytest.raises(RuntimeError, match="f_len must be int32 or int64"):
        joint(f, g, f_len.float(), g_len)
    with pytest.raises(RuntimeError, match=r"g_len must have shape \[3\]"):
        joint(f, g, f_len, g_len[:2])
    with pytest.raises(ValueError, match="pack_output needs"):
        TransducerJoint(pack_output=True)(f, g, f_len, g_len)
    x, label, f_len, y_len, blank = loss_inputs(torch.float32, device)
    with pytest.raises(RuntimeError, match="blank_idx must be a class"):
        TransducerLoss()(x, label, f_len, y_len, 7)
    with pytest.raises(RuntimeError, match="x must be"):
        TransducerLoss()(x[0], label, f_len, y_len, blank)
    with pytest.raises(RuntimeError, match="label must be int32 or int64"):
        TransducerLoss()(x, label.float(), f_len, y_len, blank)


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_with_fullgraph(device):
    torch._dynamo.reset()
    joint, criterion = TransducerJoint(relu=True), TransducerLoss()

    def step(f, g, f_len, g_len, label, y_len):
        h = joint(f, g, f_len, g_len)
        return criterion(h[..., :7], label, f_len, y_len, 6).sum()

    compiled = torch.compile(step, fullgraph=True)
    f, g, f_len, g_len, _ = joint_inputs(torch.float32, device, hidden=8)
    _, label, _, y_len, _ = loss_inputs(torch.float32, device)
    y_len = torch.minimum(y_len, g_len - 1)
    f2, g2 = f.detach().clone().requires_grad_(), g.detach().clone().requires_grad_()
    compiled(f, g, f_len, g_len, label, y_len).backward()
    step(f2, g2, f_len, g_len, label, y_len).backward()
    torch.testing.assert_close(f.grad, f2.grad)
    torch.testing.assert_close(g.grad, g2.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    f, g, f_len, g_len, h_grad = joint_inputs(torch.float32, device)
    opcheck(torch.ops.apex.transducer_joint_forward, (f, g, f_len, g_len, None, 0, True, 0.0))
    opcheck(torch.ops.apex.transducer_joint_backward, (h_grad, None, f_len, g_len, None, 7, 5, 1.0))
    opcheck(torch.ops.apex.transducer_joint_forward, (f, g, f_len, g_len, None, 0, True, 0.0, False))
    opcheck(torch.ops.apex.transducer_joint_backward,
            (h_grad, None, f_len, g_len, None, 7, 5, 1.0, f.detach(), g.detach()))
    x, label, f_len, y_len, blank = loss_inputs(torch.float32, device)
    opcheck(torch.ops.apex.transducer_loss_forward, (x, label, f_len, y_len, None, 6, blank))
    loss, alpha, beta, stats = torch.ops.apex.transducer_loss_forward(x.detach(), label, f_len, y_len, None, 6, blank)
    opcheck(torch.ops.apex.transducer_loss_backward,
            (torch.ones_like(loss), x.detach(), label, f_len, y_len, None, 6, blank, alpha, beta, stats, True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_loss_long_lattices_on_gpu(dtype):
    # Diagonals longer than a block (U > 1024) and rows of a large vocabulary.
    x, label, f_len, y_len, blank = loss_inputs(dtype, "cuda", batch=2, frames=3, steps=1100, classes=40)
    reference_loss = reference.transducer_loss_reference(x.detach().clone().requires_grad_(), label, f_len, y_len,
                                                         blank, torch.ones(2, dtype=dtype, device="cuda"))[3]
    torch.testing.assert_close(TransducerLoss()(x, label, f_len, y_len, blank), reference_loss, rtol=1e-3, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("steps", [64, 1024])
def test_loss_wavefront_lengths_on_gpu(steps):
    # Diagonals of exactly one block (1024: a thread per u) and lattices whose lengths differ per
    # batch element, in both layouts, over more frames than the look-ahead of log-probabilities.
    x, label, f_len, y_len, blank = loss_inputs(torch.float32, "cuda", batch=3, frames=9, steps=steps, classes=5)
    y_len[1] = steps // 2
    # The float32 reference and the kernel each chain ~steps log-add-exps in their own order: the
    # gradients' rounding grows with the chain (1024 steps: 1.9e-4 measured on an H200).
    grad_tol = 1e-4 if steps <= 64 else 5e-4
    for packed in (False, True):
        check_loss(x.detach().clone().requires_grad_(), label, f_len, y_len, blank, 1e-4, grad_tol, packed=packed)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_joint_relu_recomputed_on_gpu_many_frames(dtype):
    # Frames split over several blocks of the backward (partial g_grad sums) with the recomputed mask.
    f, g, f_len, g_len, h_grad = joint_inputs(dtype, "cuda", hidden=64, batch=2, frames=300, steps=3)
    results = []
    for probe in (True, False):
        fp, gp = f.detach().clone().requires_grad_(), g.detach().clone().requires_grad_()
        h = TransducerJoint(relu=True, probe_mask=probe)(fp, gp, f_len, g_len)
        h.backward(h_grad)
        results.append((fp.grad, gp.grad))
    for probed, recomputed in zip(*results):
        torch.testing.assert_close(recomputed, probed, rtol=0, atol=0)
