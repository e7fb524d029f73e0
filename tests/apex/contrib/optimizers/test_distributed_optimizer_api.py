"""Construction checks, bad input and the smaller parts of the API, on a one-rank process group:
every mistake raises a clear exception before any collective or kernel runs."""
from __future__ import annotations

import pytest
import torch
import zero_testing as zt

from apex.contrib.optimizers import DistributedFusedAdam, DistributedFusedLAMB


def _params(dtype=torch.float32):
    return [p.detach().requires_grad_() for p in zt.manual_params(dtype)]


def test_needs_an_initialized_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedFusedAdam(_params())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(amsgrad=True), RuntimeError, "AMSGrad"),
    (dict(lr=-1.0), ValueError, "learning rate"),
    (dict(betas=(0.9, 1.0)), ValueError, "beta"),
    (dict(dtype=torch.float64), ValueError, "dtype must be"),
    (dict(grad_sync_dtype=torch.int32), ValueError, "grad_sync_dtype"),
    (dict(bucket_cap_mb=0), ValueError, "bucket_cap_mb"),
    (dict(pipeline_size=0), ValueError, "pipeline_size"),
    (dict(device="cuda"), ValueError, "device=cuda"),
    (dict(store_param_remainders=True), RuntimeError, "exclude each other"),
    (dict(store_params=False, store_param_remainders=True), RuntimeError, "param_sync_dtype=torch.bfloat16"),
    (dict(store_params=False, store_param_remainders=True, param_sync_dtype=torch.bfloat16), RuntimeError,
     "bfloat16 parameters"),
    (dict(with_scaled_states=True), RuntimeError, "float16 or bfloat16"),
    (dict(with_scaled_states=True, store_params=False, dtype=torch.bfloat16), RuntimeError, "store_params=True"),
    (dict(with_scaled_states=True, dtype=torch.bfloat16, capturable=True), RuntimeError, "capturable"),
    (dict(contiguous_param_buffer=True, param_sync_dtype=torch.bfloat16), ValueError, "every parameter"),
])
def test_bad_options(one_rank_group, kwargs, error, match):
    with pytest.raises(error, match=match):
        DistributedFusedAdam(_params(), **kwargs)


def test_bad_parameters(one_rank_group):
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        DistributedFusedAdam([torch.zeros(3, dtype=torch.float64, requires_grad=True)])
    with pytest.raises(ValueError, match="contiguous"):
        DistributedFusedAdam([torch.zeros(4, 5).t().requires_grad_()])
    with pytest.raises(ValueError, match="one device"):
        DistributedFusedAdam([torch.zeros(3, requires_grad=True), torch.zeros(3, device="meta", requires_grad=True)])
    with pytest.raises(ValueError, match="empty parameter list|no parameters"):
        DistributedFusedAdam([])


def test_api_misuse(one_rank_group):
    params = _params()
    optimizer = DistributedFusedAdam(params)
    with pytest.raises(RuntimeError, match="construction"):
        optimizer.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})
    with pytest.raises(ValueError, match="not in this optimizer"):
        optimizer.init_params([torch.zeros(2, requires_grad=True)])
    with pytest.raises(ValueError, match="per-parameter dtype"):
        optimizer.init_params(params[:1], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="2-norm"):
        optimizer.grad_norm(norm_type=1.0)
    with pytest.raises(ValueError, match="max_norm"):
        optimizer.clip_grad_norm(0.0)
    with pytest.raises(RuntimeError, match="contiguous_grad_buffer"):
        optimizer.grad_buffer_view(params[0])
    with pytest.raises(ValueError, match="state_dict_format"):
        optimizer.state_dict(state_dict_format=1)
    params[0].grad = torch.zeros_like(params[0]).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer.step()


def test_grad_scaler_unscale_must_go_through_the_optimizer(one_rank_group):
    params = _params()
    optimizer = DistributedFusedAdam(params)
    scaler = torch.amp.GradScaler("cpu")
    for p in params:
        p.grad = scaler.scale(torch.ones_like(p))
    scaler.unscale_(optimizer)  # sees no param.grad once the optimizer holds them
    with pytest.raises(RuntimeError, match="unscale_grads"):
        scaler.step(optimizer)


def test_contiguous_grad_buffer_views_and_zero_grad(one_rank_group):
    params = _params()
    optimizer = DistributedFusedAdam(params, contiguous_grad_buffer=True, contiguous_param_buffer=True)
    optimizer.zero_grad()
    for p in params:
        view = optimizer.grad_buffer_view(p)
        assert p.grad is not None and p.grad.data_ptr() == view.data_ptr() and not p.grad.any()
    buffer_ptrs = {p.untyped_storage().data_ptr() for p in params}
    assert len(buffer_ptrs) == 1  # the parameters are views of one buffer


def test_bucket_order_follows_init_params(one_rank_group):
    params = _params()
    optimizer = DistributedFusedAdam(params, bucket_cap_mb=100.0)
    optimizer.init_params_bucket([params[3], params[1]])
    optimizer.init_params([params[0]])
    optimizer.init_params()
    buckets = [b.params for b in optimizer._buckets]
    assert buckets[0] == (3, 1) and buckets[1][0] == 0
    assert sorted(i for b in buckets for i in b) == list(range(len(params)))


def test_frozen_parameters_are_left_alone(one_rank_group):
    params = _params()
    params[2].requires_grad_(False)
    frozen = params[2].detach().clone()
    optimizer = DistributedFusedAdam(params, weight_decay=0.5)
    for p in params:
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    optimizer.step()
    assert torch.equal(params[2], frozen) and 2 not in optimizer.state_dict()["state"]


def test_lamb_is_a_distributed_optimizer_too(one_rank_group):
    optimizer = DistributedFusedLAMB(_params(), lr=0.1, max_grad_norm=1.0, overlap_reductions=False,
                                     set_param_views_to_flat_buffer=True)
    assert not optimizer.overlap_grad_sync and optimizer.contiguous_param_buffer and optimizer.dtype == torch.float32


def _logged_reductions(optimizer, events):
    launch = optimizer._shard_group.reduce_scatter

    def logged(out, tensor):
        events.append("reduce-scatter")
        return launch(out, tensor)

    optimizer._shard_group.reduce_scatter = logged


@pytest.mark.parametrize("overlap", [True, False])
def test_gradients_are_reduced_while_backward_runs(one_rank_group, overlap):
    """With overlap_grad_sync the first bucket is reduced before backward reaches the first
    layers; without it nothing is reduced before step (grads wait in their buckets)."""
    net = zt.make_net()
    optimizer = DistributedFusedAdam(net.parameters(), bucket_cap_mb=zt.BUCKET_MB, overlap_grad_sync=overlap)
    events = []
    _logged_reductions(optimizer, events)
    net.embed.weight.register_post_accumulate_grad_hook(lambda p: events.append("first layer's grad"))
    optimizer.zero_grad()
    x, y = zt.local_batch(0, 0, 0, 1)
    zt.loss_of(net, x, y).backward()
    if overlap:
        assert events.index("reduce-scatter") < events.index("first layer's grad")
        assert events.count("reduce-scatter") == len(optimizer._buckets)  # all reduced by the end of backward
    else:
        assert events == ["first layer's grad"]
    assert all(p.grad is None for p in net.parameters())  # moved into the buckets
    optimizer.step()
    assert events.count("reduce-scatter") == len(optimizer._buckets)


def test_overlapped_parameter_gathers_finish_before_their_module_runs(one_rank_group):
    net = zt.make_net()
    optimizer = DistributedFusedAdam(net.parameters(), bucket_cap_mb=zt.BUCKET_MB, overlap_param_sync=True)
    x, y = zt.local_batch(0, 0, 0, 1)
    zt.loss_of(net, x, y).backward()
    optimizer.step()
    assert optimizer._param_sync.pending  # left running after the step
    seen = []
    net.out.register_forward_pre_hook(lambda module, args: seen.append(optimizer._param_sync.pending))
    net(x)
    assert seen == [False]  # every bucket was gathered (and copied) before the last layer ran


def test_grad_norm_is_of_this_steps_gradients_and_kept_after_the_step(one_rank_group):
    params = _params()
    optimizer = DistributedFusedAdam(params)
    for step in range(3):  # no zero_grad: new gradients replace param.grad, as in torch
        grads = zt.manual_grads(step, 0, params)
        for p, g in zip(params, grads):
            p.grad = g
        expected = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))
        torch.testing.assert_close(optimizer.clip_grad_norm(1.0), expected)
        optimizer.step()
        torch.testing.assert_close(optimizer.grad_norm(), torch.tensor(1.0), rtol=1e-5, atol=1e-5)
