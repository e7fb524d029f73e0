"""Every fused optimizer's step() traces whole under torch.compile, as torch.optim's do: no graph
break, and the compiled step computes what the eager one does."""
import pytest
import torch
from all_optimizers import FACTORIES
from optimizer_testing import grads_at, make_params, set_grads

SHAPES = [(33, 17), (7,), (64, 64)]


def dtype_of(name):
    return torch.bfloat16 if name in ("adam_master", "mixed_precision_lamb") else torch.float32


def make(name, seed=0):
    params = make_params(dtype_of(name), "cpu", seed=seed, shapes=SHAPES)
    optimizer = FACTORIES[name](params)
    if name == "mixed_precision_lamb":
        optimizer.reduced_precision_dtype = torch.bfloat16
    return params, optimizer


@pytest.mark.parametrize("name", FACTORIES)
def test_step_has_no_graph_break(name):
    torch._dynamo.reset()
    params, optimizer = make(name)
    set_grads(params, grads_at(0, params))
    explanation = torch._dynamo.explain(optimizer.step)()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("name", FACTORIES)
def test_compiled_step_matches_eager(name):
    torch._dynamo.reset()
    params, optimizer = make(name)
    eager_params, eager_optimizer = make(name)
    compiled_step = torch.compile(optimizer.step, backend="aot_eager", fullgraph=True)
    for step in range(3):
        set_grads(params, grads_at(step, params))
        set_grads(eager_params, grads_at(step, eager_params))
        compiled_step()
        eager_optimizer.step()
    for param, expected in zip(params, eager_params):
        torch.testing.assert_close(param.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
    # The state the compiled steps kept is what an eager step continues from.
    for step in range(3, 5):
        set_grads(params, grads_at(step, params))
        set_grads(eager_params, grads_at(step, eager_params))
        optimizer.step()
        eager_optimizer.step()
    for param, expected in zip(params, eager_params):
        torch.testing.assert_close(param.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
