"""O2/O5: low-precision model, fp32 batchnorm, fp32 master weights the optimizer updates."""
import pytest
import torch

from amp_testing import CUDA, initialized, make_batches, make_net, train
from apex import amp

LEVELS = [("O2", torch.float16), ("O5", torch.bfloat16)]
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def conv_and_batchnorm_params(model):
    convs = [m.weight for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    batchnorms = [m.weight for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    return convs, batchnorms


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_level,low_precision", LEVELS)
def test_masters_stay_fp32_and_model_gets_their_updates(device, opt_level, low_precision):
    model = make_net("convnet", device)
    fp32_weights = [p.detach().clone() for p in model.parameters()]
    model, optimizer = amp.initialize(model, torch.optim.Adam(model.parameters(), lr=1e-2),
                                      opt_level=opt_level, verbosity=0)
    convs, batchnorms = conv_and_batchnorm_params(model)
    assert all(w.dtype == low_precision for w in convs)
    assert all(w.dtype == torch.float32 for w in batchnorms)
    masters = list(amp.master_params(optimizer))
    assert all(m.dtype == torch.float32 for m in masters)
    # The masters start from the exact fp32 weights, not from their low-precision copies.
    for master, original in zip(masters, fp32_weights):
        assert torch.equal(master, original)

    before = [p.detach().clone() for p in model.parameters()]
    train("convnet", model, optimizer, make_batches("convnet", device), steps=3)
    masters = list(amp.master_params(optimizer))
    assert all(m.dtype == torch.float32 for m in masters)
    for param, master, old in zip(model.parameters(), masters, before):
        assert param.dtype in (low_precision, torch.float32)
        assert torch.equal(param, master.to(param.dtype)), "the model holds its master, rounded"
        assert not torch.equal(param, old)


@pytest.mark.parametrize("opt_level,low_precision", LEVELS)
def test_state_dict_is_fp32_masters(opt_level, low_precision):
    model, optimizer = initialized("convnet", opt_level)
    train("convnet", model, optimizer, make_batches("convnet"), steps=2)
    state = model.state_dict()
    assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())
    params = dict(model.named_parameters())
    for master, (name, param) in zip(amp.master_params(optimizer), params.items()):
        assert torch.equal(state[name], master)
    # The model's inference path still takes fp32 inputs and gives fp32 outputs.
    x, _ = make_batches("convnet", count=1)[0]
    assert model(x).dtype == torch.float32


def test_keep_batchnorm_fp32_false_casts_batchnorm_too():
    model, _ = initialized("convnet", "O2", keep_batchnorm_fp32=False)
    _, batchnorms = conv_and_batchnorm_params(model)
    assert all(w.dtype == torch.float16 for w in batchnorms)


def test_existing_optimizer_state_is_recast_to_fp32():
    model = make_net("mlp")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    train("mlp", model, optimizer, make_batches("mlp"), steps=1, use_amp=False)
    exp_avg = optimizer.state[next(model.parameters())]["exp_avg"].clone()
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    master = next(amp.master_params(optimizer))
    assert torch.equal(optimizer.state[master]["exp_avg"], exp_avg)
