"""The cast cache: an fp32 param is cast to fp16/bf16 once and reused within a forward, recast
after it changes, not reused for training when it was cast under no_grad, and emptied after
each backward. Training through train / eval / train gives the fp32 gradients."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_testing import CUDA
from apex import amp
from apex.amp._amp_state import _amp_state
from apex.amp.wrap import CastCache

DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def test_a_cast_is_reused_until_the_param_changes():
    cache = CastCache()
    param = nn.Parameter(torch.randn(4, 4))
    first = cache.cast(param, torch.float16)
    assert cache.cast(param, torch.float16) is first and param in cache
    with torch.no_grad():
        param.add_(1.0)  # an in-place update (an optimizer step) bumps the version: stale
    second = cache.cast(param, torch.float16)
    assert second is not first and torch.equal(second, param.detach().half())
    assert cache.cast(param, torch.bfloat16).dtype == torch.bfloat16
    cache.remove(param)
    assert param not in cache and len(cache) == 0


def test_a_no_grad_cast_is_not_reused_for_training():
    cache = CastCache()
    param = nn.Parameter(torch.randn(4, 4))
    with torch.no_grad():
        eval_cast = cache.cast(param, torch.float16)
        assert not eval_cast.requires_grad
    train_cast = cache.cast(param, torch.float16)
    assert train_cast.requires_grad and train_cast is not eval_cast
    with torch.no_grad():  # a cast made with autograd on serves evaluation too
        assert cache.cast(param, torch.float16) is train_cast


def test_a_weight_used_twice_is_cast_once():
    handle = amp.init()
    linear = nn.Linear(8, 8)
    seen = []
    original = linear.forward
    linear.forward = lambda x: seen.append(handle.cache.cast(linear.weight, torch.float16)) or original(x)
    x = torch.randn(2, 8)
    linear(linear(x))
    assert seen[0] is seen[1] and len(handle.cache) == 2  # weight and bias


def test_caching_can_be_switched_off():
    handle = amp.init(enable_caching=False)
    F.linear(torch.randn(2, 8), nn.Parameter(torch.randn(8, 8)))
    assert len(handle.cache) == 0 and not handle.has_cache


class Products(nn.Module):
    """Two matrix products with one weight (fp16/bf16 list)."""

    def __init__(self, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.arange(64, dtype=dtype).view(8, 8) / 64)

    @staticmethod
    def ops(x, weight):
        return x.mm(weight).mm(weight).sum()

    def forward(self, x):
        return self.ops(x, self.weight)


class Powers(Products):
    """fp32-list functions of the weight added to the input."""

    @staticmethod
    def ops(x, weight):
        return (x + torch.pow(weight[:2], 2) + torch.pow(weight[:2], 2)).sum()


class Mixed(Products):
    """Products of fp32 input and the weight: promoted."""

    @staticmethod
    def ops(x, weight):
        return (x * weight[:2] * weight[:2]).sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("module", [Products, Powers, Mixed])
@pytest.mark.parametrize("opt_level,low", [("O1", torch.float16), ("O4", torch.bfloat16)])
@pytest.mark.parametrize("weight_is_low", [False, True], ids=["fp32-weight", "low-weight"])
def test_train_eval_train_gives_fp32_gradients(device, module, opt_level, low, weight_is_low):
    _amp_state.allow_incoming_model_not_fp32 = True
    model = module(low if weight_is_low else torch.float32).to(device)
    model, optimizer = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=1.0), opt_level=opt_level,
                                      verbosity=0)
    x = torch.ones(2, 8, device=device)
    tolerance = {torch.float16: dict(rtol=2e-3, atol=1e-3), torch.bfloat16: dict(rtol=2e-2, atol=1e-2)}[low]

    def training_step():
        model.weight.grad = None
        _amp_state.loss_scalers[0]._loss_scale = 4.0
        with amp.scale_loss(model(x), optimizer) as scaled_loss:
            scaled_loss.backward()
        assert model.weight.grad.dtype == model.weight.dtype
        reference = model.weight.detach().float().requires_grad_()
        model.ops(x.float(), reference).backward()
        torch.testing.assert_close(model.weight.grad.float(), reference.grad, **tolerance)
        assert len(_amp_state.handle.cache) == 0  # emptied after the backward
        with torch.no_grad():
            model.weight -= 0.125

    training_step()
    with torch.no_grad():
        model(x)  # evaluation caches casts without autograd history
    training_step()  # ... which training must not reuse
