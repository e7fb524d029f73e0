"""The capturable optimizers step inside a CUDA graph: replaying the captured step gives
what eager steps give, bit for bit."""
import pytest
import torch
from optimizer_testing import grads_at, make_params, set_grads, train

from apex.optimizers import FusedAdam, FusedMixedPrecisionLamb

CAPTURABLE = {
    "adam": (lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.01, capturable=True), torch.float32),
    "adam_master_weights": (
        lambda ps: FusedAdam(ps, lr=1e-3, capturable=True, master_weights=True),
        torch.bfloat16,
    ),
    "mixed_precision_lamb": (
        lambda ps: FusedMixedPrecisionLamb(ps, lr=1e-2, reduced_precision_dtype=torch.bfloat16),
        torch.bfloat16,
    ),
}
WARMUP_STEPS, STEPS = 3, 20


@pytest.mark.gpu
@pytest.mark.parametrize("name", CAPTURABLE)
def test_captured_step_replays_like_eager_steps(name):
    make_optimizer, dtype = CAPTURABLE[name]
    params, eager_params = make_params(dtype, "cuda"), make_params(dtype, "cuda")
    optimizer = make_optimizer(params)
    static_grads = [torch.zeros_like(p) for p in params]
    set_grads(params, static_grads)

    def feed(step):
        for static, grad in zip(static_grads, grads_at(step, params)):
            static.copy_(grad)

    # Warm up on a side stream (the state gets allocated there), as torch.cuda.graph asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for step in range(WARMUP_STEPS):
            feed(step)
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        optimizer.step()
    for step in range(WARMUP_STEPS, STEPS):
        feed(step)
        graph.replay()

    train(make_optimizer(eager_params), eager_params, range(STEPS))
    torch.cuda.synchronize()
    for index, (param, expected) in enumerate(zip(params, eager_params)):
        assert torch.equal(param, expected), f"param {index} differs"
    assert optimizer.state[params[0]]["step"].item() == STEPS
