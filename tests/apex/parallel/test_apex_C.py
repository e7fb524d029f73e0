"""apex_C flatten/unflatten (DDP's buckets) against torch's own reference, tracing, plus bad input."""
import pytest
import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

import apex_C
from apex._ops import ops

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _tensors(device, dtype):
    shapes = [(3, 4), (5,), (), (2, 0, 3), (7, 1, 2)]  # includes a 0-d and an empty tensor
    return [torch.randn(s, device=device).to(dtype) for s in shapes]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_flatten_unflatten_match_torch(device, dtype):
    tensors = _tensors(device, dtype)
    flat = apex_C.flatten(tensors)
    assert torch.equal(flat, _flatten_dense_tensors(tensors))
    for ours, ref in zip(apex_C.unflatten(flat, tensors), _unflatten_dense_tensors(flat, tensors)):
        assert ours.shape == ref.shape and torch.equal(ours, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_unflatten_returns_views_of_the_buffer(device):
    tensors = _tensors(device, torch.float32)
    flat = apex_C.flatten(tensors)
    views = apex_C.unflatten(flat, tensors)
    flat.fill_(3.0)
    assert all(bool((v == 3.0).all()) for v in views)


def test_dispatcher_ops_and_autograd():
    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(4, requires_grad=True)
    ops("apex_C").apex_C_flatten([a, b]).sum().backward()
    assert torch.equal(a.grad, torch.ones_like(a)) and torch.equal(b.grad, torch.ones_like(b))


@pytest.mark.parametrize("dynamic", [False, True])
def test_traces_under_torch_compile(dynamic):
    torch._dynamo.reset()

    def roundtrip(ts):
        flat = ops("apex_C").apex_C_flatten(ts) * 2
        return flat, ops("apex_C").apex_C_unflatten(flat, ts)

    compiled = torch.compile(roundtrip, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for n in (3, 5):
        tensors = [torch.randn(n), torch.randn(2, n)]
        flat, views = compiled(tensors)
        assert torch.equal(flat, _flatten_dense_tensors(tensors) * 2)
        assert all(torch.equal(v, 2 * t) for v, t in zip(views, tensors))


def test_opcheck():
    tensors = [torch.randn(3, requires_grad=True), torch.randn(2, 2, requires_grad=True)]
    torch.library.opcheck(torch.ops.apex.apex_C_flatten.default, (tensors,))
    torch.library.opcheck(torch.ops.apex.apex_C_unflatten.default, (torch.randn(7), tensors))


def test_non_contiguous_inputs_are_flattened_in_logical_order():
    t = torch.arange(12.0).reshape(3, 4).t()
    assert torch.equal(apex_C.flatten([t]), t.reshape(-1))


@pytest.mark.parametrize("bad, message", [
    ([], "non-empty list"),
    ([torch.ones(2), torch.ones(2, dtype=torch.float16)], "one dtype"),
    ([torch.ones(2), torch.ones(2, device="meta")], "one device"),
    ([torch.ones(2).to_sparse()], "not dense"),
])
def test_flatten_rejects_bad_input(bad, message):
    with pytest.raises(RuntimeError, match=message):
        apex_C.flatten(bad)


def test_unflatten_rejects_bad_input():
    like = [torch.ones(2), torch.ones(3)]
    with pytest.raises(RuntimeError, match="flat has 4 elements but the tensors to match hold 5"):
        apex_C.unflatten(torch.ones(4), like)
    with pytest.raises(RuntimeError, match="flat must be 1-D"):
        apex_C.unflatten(torch.ones(5, 1), like)
    with pytest.raises(RuntimeError, match="non-empty list"):
        apex_C.unflatten(torch.ones(0), [])
    with pytest.raises((TypeError, RuntimeError)):
        apex_C.flatten("not a list")
