"""apex.transformer's layout (enums, functional) and the four historical softmax modules that face
the one fused_softmax library."""
import importlib

import pytest
import torch

import apex
from apex.transformer import AttnMaskType, AttnType, LayerType, ModelType

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_enums_and_attributes():
    assert [m.name for m in AttnMaskType] == ["padding", "causal"]
    assert [m.name for m in AttnType] == ["self_attn", "cross_attn"]
    assert [m.name for m in LayerType] == ["encoder", "decoder"]
    assert [m.name for m in ModelType] == ["encoder_or_decoder", "encoder_and_decoder"]
    assert apex.transformer.functional.FusedScaleMaskSoftmax is not None
    assert apex.transformer.enums.AttnMaskType is AttnMaskType


@pytest.mark.parametrize("device", DEVICES)
def test_historical_softmax_modules(device):
    x = torch.randn(2, 3, 4, 4, device=device)
    mask = torch.rand(2, 1, 4, 4, device=device) < 0.3
    g = torch.randn_like(x)
    expected = torch.softmax((x * 0.5).masked_fill(mask, float("-inf")), -1).nan_to_num(0.0)
    for name, args in [("scaled_masked_softmax_cuda", (x, mask)), ("generic_scaled_masked_softmax_cuda", (x, mask)),
                       ("scaled_softmax_cuda", (x,)), ("scaled_upper_triang_masked_softmax_cuda", (x.view(6, 4, 4),))]:
        module = importlib.import_module(name)
        assert {"forward", "backward"} <= set(dir(module)), name
        y = module.forward(*args, torch.tensor([0.5])[0])  # Megatron passes the scale as a 0-d tensor
        assert y.shape == args[0].shape
        if name.startswith(("scaled_masked", "generic")):
            torch.testing.assert_close(y, expected)
        dx = module.backward(g.view_as(y), y, 0.5)
        expected_dx = 0.5 * y * (g.view_as(y) - (g.view_as(y) * y).sum(-1, keepdim=True))
        torch.testing.assert_close(dx, expected_dx)
    import scaled_masked_softmax_cuda

    assert "get_batch_per_block" in dir(scaled_masked_softmax_cuda)
    assert scaled_masked_softmax_cuda.get_batch_per_block(128, 128, 4, 16) == 1
    with pytest.raises(AttributeError, match="no attribute 'get_batch_per_block'"):
        importlib.import_module("scaled_softmax_cuda").get_batch_per_block
