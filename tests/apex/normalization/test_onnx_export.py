"""torch.onnx.export of the fused norms: LayerNormalization, or RMSNorm's ReduceMean decomposition.

Both exporters: the default (dynamo, torch.export-based) and the TorchScript one (dynamo=False).
"""
import io

import pytest
import torch

from apex.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")

CASES = [(FusedLayerNorm, "LayerNormalization"), (MixedFusedLayerNorm, "LayerNormalization"),
         (FusedRMSNorm, "ReduceMean"), (MixedFusedRMSNorm, "ReduceMean")]


def exported_ops(module, x, dynamo):
    buffer = io.BytesIO()
    torch.onnx.export(module, (x,), buffer, input_names=["x_in"], opset_version=18, dynamo=dynamo)
    model = onnx.load_from_string(buffer.getvalue())
    return model, {node.op_type for node in model.graph.node}


@pytest.mark.parametrize("cls, expected", CASES, ids=lambda c: getattr(c, "__name__", c))
@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_export(cls, expected, dynamo):
    torch.manual_seed(0)
    module = cls([4, 8])
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    x = torch.randn(3, 4, 8)
    model, op_types = exported_ops(module, x, dynamo)
    assert expected in op_types, sorted(op_types)
    assert not any("apex" in op for op in op_types)
    assert "x_in" in onnx.helper.printable_graph(model.graph)
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), module(x).detach(), rtol=1e-5, atol=1e-5)


def test_export_does_not_change_eager_calls():
    """Outside an export the custom op runs (one C++ autograd node), not torch's composite."""
    y = FusedLayerNorm(8)(torch.randn(2, 8, requires_grad=True))
    assert type(y.grad_fn).__name__ == "CppFunction"
