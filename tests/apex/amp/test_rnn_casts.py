"""RNN casting: with amp's casts installed, nn.RNN/GRU/LSTM and their cells run in fp16/bf16 for
fp32 and low-precision inputs alike, gradients come back in each input's dtype, and cuDNN's flat
weight layout survives the cast."""
import warnings

import pytest
import torch
import torch.nn as nn

from amp_testing import CUDA
from apex import amp
from apex.amp._amp_state import _amp_state
from apex.amp.rnn_compat import VariableFunctionsShim, low_precision_weights

DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
HIDDEN, BATCH, STEPS = 8, 3, 4


@pytest.fixture(params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def low(request):
    amp.init(patch_type=request.param)
    return request.param


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cell_type", [nn.RNNCell, nn.GRUCell, nn.LSTMCell])
def test_cells_run_in_low_precision(low, device, cell_type):
    cell = cell_type(HIDDEN, HIDDEN).to(device)
    for input_type in (torch.float32, low):
        xs = [torch.randn(BATCH, HIDDEN, dtype=input_type, device=device, requires_grad=True) for _ in range(STEPS)]
        hidden = None
        for x in xs:
            hidden = cell(x, hidden)
            output = hidden[0] if isinstance(hidden, tuple) else hidden
            assert output.dtype == low
        output.float().sum().backward()
        assert all(x.grad.dtype == input_type for x in xs)
        assert all(p.grad.dtype == torch.float32 for p in cell.parameters())
        # Unrolled over STEPS time steps, each weight was cast once.
        assert len(_amp_state.handle.cache) == len(list(cell.parameters()))
        cell.zero_grad()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rnn_type", [nn.RNN, nn.GRU, nn.LSTM])
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, False), (2, True)])
def test_recurrent_layers_run_in_low_precision(low, device, rnn_type, layers, bidirectional):
    rnn = rnn_type(HIDDEN, HIDDEN, num_layers=layers, bidirectional=bidirectional).to(device)
    states = layers * (2 if bidirectional else 1)
    for input_type in (torch.float32, low):
        x = torch.randn(STEPS, BATCH, HIDDEN, dtype=input_type, device=device, requires_grad=True)
        hidden = torch.zeros(states, BATCH, HIDDEN, dtype=input_type, device=device)
        output, _ = rnn(x, (hidden, hidden) if rnn_type is nn.LSTM else hidden)
        assert output.dtype == low
        output[-1].float().sum().backward()
        assert x.grad.dtype == input_type
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in rnn.parameters())
        rnn.zero_grad()


@pytest.mark.parametrize("device", DEVICES)
def test_packed_sequences(low, device):
    rnn = nn.RNN(HIDDEN, HIDDEN, num_layers=2).to(device)
    for input_type in (torch.float32, low):
        x = torch.randn(STEPS, BATCH, HIDDEN, dtype=input_type, device=device, requires_grad=True)
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([STEPS, STEPS - 1, 2]))
        output, _ = rnn(packed, torch.zeros(2, BATCH, HIDDEN, dtype=input_type, device=device))
        assert output.data.dtype == low
        output.data.float().sum().backward()
        assert x.grad.dtype == input_type


def test_without_casts_mixed_input_is_refused_as_torch_does():
    rnn = nn.GRU(HIDDEN, HIDDEN)
    half_input = torch.randn(STEPS, BATCH, HIDDEN, dtype=torch.float16)
    handle = amp.init()
    assert isinstance(torch.nn.modules.rnn._VF, VariableFunctionsShim)
    rnn(half_input)
    handle._deactivate()
    assert torch.nn.modules.rnn._VF is torch._VF
    with pytest.raises(ValueError, match="does not match weight dtype"):
        rnn(half_input)


def test_flat_weights_keep_their_layout():
    """Weights that are views into one buffer (cuDNN's flat layout) are cast into one low-precision
    buffer at the same offsets; gradients reach the fp32 weights."""
    flat = torch.randn(64)
    base = flat.detach().requires_grad_()
    weights = [base[0:24].view(4, 6), base[24:40].view(4, 4).t(), base[48:52]]
    cast = low_precision_weights(weights, torch.float16)
    storage = cast[0].untyped_storage().data_ptr()
    for original, low_weight in zip(weights, cast):
        assert low_weight.dtype == torch.float16 and low_weight.untyped_storage().data_ptr() == storage
        assert (low_weight.storage_offset(), low_weight.size(), low_weight.stride()) == \
            (original.storage_offset(), original.size(), original.stride())
        assert torch.equal(low_weight, original.detach().half())
    sum(w.float().sum() * (i + 1) for i, w in enumerate(cast)).backward()
    expected = torch.zeros(64)
    expected[0:24], expected[24:40], expected[48:52] = 1, 2, 3
    assert torch.equal(base.grad, expected)


def test_separate_weights_are_cast_one_by_one():
    weights = [torch.randn(4, 4), torch.randn(4)]
    cast = low_precision_weights(weights, torch.bfloat16)
    assert [w.dtype for w in cast] == [torch.bfloat16] * 2
    assert cast[0].untyped_storage().data_ptr() != cast[1].untyped_storage().data_ptr()
    assert low_precision_weights(cast, torch.bfloat16) is cast


@CUDA
def test_cudnn_gets_contiguous_low_precision_weights():
    amp.init()
    lstm = nn.LSTM(HIDDEN, HIDDEN, num_layers=2, bidirectional=True).cuda()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "RNN module weights are not part of single contiguous chunk"
        output, _ = lstm(torch.randn(STEPS, BATCH, HIDDEN, device="cuda"))
    assert output.dtype == torch.float16
    output.float().sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in lstm.parameters())
