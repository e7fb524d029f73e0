"""apex.fp16_utils' model conversion and master-param helpers against plain PyTorch."""
import pytest
import torch
import torch.nn as nn

from apex.fp16_utils import (BN_convert_float, FP16Model, clip_grad_norm, convert_module, convert_network,
                             master_params_to_model_params, model_grads_to_master_grads, network_to_half,
                             prep_param_lists, to_python_float, tofp16)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4, affine=True)
        self.conv = nn.Conv2d(4, 4, 2)

    def forward(self, x):
        return self.conv(self.bn(x))


class Net(nn.Module):
    """Convs, an affine-free batchnorm (converted) and affine ones (kept fp32)."""

    def __init__(self):
        super().__init__()
        self.bn_in = nn.BatchNorm2d(3, affine=True)
        self.conv = nn.Conv2d(3, 4, 2)
        self.bn_plain = nn.BatchNorm2d(4, affine=False)
        self.blocks = nn.Sequential(Block(), Block())

    def forward(self, x):
        return self.blocks(self.bn_plain(self.conv(self.bn_in(x))))


def affine_batchnorms(model):
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine]


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_model_keeps_affine_batchnorms_fp32(device):
    model = FP16Model(Net().to(device))
    kept = affine_batchnorms(model)
    assert len(kept) == 3
    for module in model.modules():
        expected = torch.float32 if module in kept else torch.float16
        assert all(p.dtype == expected for p in module.parameters(recurse=False))
        assert all(b.dtype in (expected, torch.int64) for b in module.buffers(recurse=False))
    out = model(torch.randn(2, 3, 9, 9, device=device))
    assert out.dtype == torch.float16 and out.shape == (2, 4, 6, 6)


def test_fp16_model_casts_only_floating_inputs():
    class Lookup(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(10, 4)

        def forward(self, ids, scale):
            return self.embedding(ids) * scale

    out = FP16Model(Lookup())(torch.tensor([1, 2]), torch.tensor(2.0))
    assert out.dtype == torch.float16


def test_network_to_half_and_bn_convert_float():
    net = Net()
    half = network_to_half(net)
    assert isinstance(half[0], tofp16) and half[1] is net
    assert all(p.dtype == torch.float32 for m in affine_batchnorms(net) for p in m.parameters())
    assert net.conv.weight.dtype == torch.float16 and net.bn_plain.running_mean.dtype == torch.float16
    assert half(torch.randn(1, 3, 9, 9)).dtype == torch.float16
    assert BN_convert_float(net.half()) is net and net.bn_in.weight.dtype == torch.float32


def test_convert_module_casts_own_params_grads_and_buffers_in_place():
    bn = nn.BatchNorm1d(3)
    weight = bn.weight
    bn.weight.grad = torch.ones(3)
    convert_module(bn, torch.bfloat16)
    assert bn.weight is weight and weight.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    assert bn.running_var.dtype == torch.bfloat16 and bn.num_batches_tracked.dtype == torch.int64
    net = Net()
    assert convert_network(net, torch.float16) is net
    assert net.conv.weight.dtype == torch.float16 and net.bn_in.weight.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flat_master", [False, True])
def test_master_params_round_trip(device, flat_master):
    model = nn.Sequential(nn.Linear(5, 7), nn.Linear(7, 3)).to(device).half()
    model[1].bias.requires_grad_(False)
    model_params, masters = prep_param_lists(model, flat_master=flat_master)
    assert model_params == [p for p in model.parameters() if p.requires_grad]
    if flat_master:
        assert len(masters) == 1 and masters[0].numel() == sum(p.numel() for p in model_params)
    assert all(m.dtype == torch.float32 and m.requires_grad for m in masters)
    expected_values = torch.cat([p.detach().float().view(-1) for p in model_params])
    assert torch.equal(torch.cat([m.detach().view(-1) for m in masters]), expected_values)

    model(torch.randn(4, 5, device=device, dtype=torch.float16)).float().sum().backward()
    model_grads_to_master_grads(model_params, masters, flat_master=flat_master)
    expected_grads = torch.cat([p.grad.float().view(-1) for p in model_params])
    assert torch.equal(torch.cat([m.grad.view(-1) for m in masters]), expected_grads)

    with torch.no_grad():
        for master in masters:
            master.add_(1 / 3)
    master_params_to_model_params(model_params, masters, flat_master=flat_master)
    flat_masters = torch.cat([m.detach().view(-1) for m in masters])
    assert torch.equal(torch.cat([p.detach().view(-1) for p in model_params]), flat_masters.half())


def test_masters_of_params_without_grads_get_none():
    model_params = [nn.Parameter(torch.randn(3).half()), nn.Parameter(torch.randn(2).half())]
    _, masters = prep_param_lists(nn.ParameterList(model_params))
    model_params[0].grad = torch.ones(3, dtype=torch.float16)
    masters[1].grad = torch.ones(2)
    model_grads_to_master_grads(model_params, masters)
    assert torch.equal(masters[0].grad, torch.ones(3)) and masters[1].grad is None


def test_flat_masters_need_one_dtype():
    with pytest.raises(TypeError, match="params of one dtype"):
        prep_param_lists(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).half()), flat_master=True)


def test_small_helpers():
    assert to_python_float(torch.tensor(2.5)) == 2.5 and to_python_float([1.5]) == 1.5
    assert clip_grad_norm is torch.nn.utils.clip_grad_norm_
