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
    (dict(param_sync_dtype=torch.float64), ValueError, "param_sync_dtype must be float32, float16, bfloat16 or an"),
    (dict(nccl_ub=True), RuntimeError, "contiguous_grad_buffer=True"),
    (dict(nccl_ub=True, contiguous_grad_buffer=True), RuntimeError, "NCCL user buffers.*unavailable.*cpu"),
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
    (dict(contiguous_param_buffer=True, param_sync_dtype=torch.int16), ValueError, "of its size"),
])
def test_bad_options(one_rank_group, kwargs, error, match):
    with pytest.raises(error, match=match):
        DistributedFusedAdam(_params(), **kwargs)


def test_bad_parameters(one_rank_group):
    with pytest.raises(TypeError, match="float32, float16, bfloat16 and float64"):
        DistributedFusedAdam([torch.zeros(3, dtype=torch.int32)])
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
    with pytest.raises(ValueError, match="grad_sync_dtype must be"):
        optimizer.init_params(params[:1], grad_sync_dtype=torch.int32)
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


def _trained_pair(overlap_param_sync):
    nets = [zt.make_net() for _ in range(2)]
    optimizers = [DistributedFusedAdam(net.parameters(), bucket_cap_mb=zt.BUCKET_MB,
                                       overlap_param_sync=overlap) for net, overlap in zip(nets, (overlap_param_sync, False))]
    x, y = zt.local_batch(0, 0, 0, 1)
    for net, optimizer in zip(nets, optimizers):
        zt.loss_of(net, x, y).backward()
        optimizer.step()
    return nets, optimizers, x


def test_overlapped_parameter_gathers_finish_when_a_parameter_is_first_touched(one_rank_group):
    (net, plain_net), (optimizer, _), x = _trained_pair(True)
    assert optimizer._param_sync.pending  # left running after the step
    params, plain = list(net.parameters()), list(plain_net.parameters())
    assert all(type(p) is not torch.nn.Parameter and isinstance(p, torch.nn.Parameter) for p in params)
    optimizer.zero_grad()  # needs no parameter values: waits for nothing
    assert optimizer._param_sync.pending and type(params[0]) is not torch.nn.Parameter
    torch.testing.assert_close(params[0], plain[0], rtol=0, atol=0)  # touching it finishes its gathers
    assert type(params[0]) is torch.nn.Parameter
    torch.testing.assert_close(net(x), plain_net(x), rtol=0, atol=0)  # a forward touches the rest
    assert not optimizer._param_sync.pending and all(type(p) is torch.nn.Parameter for p in params)
    for a, b in zip(params, plain):
        assert torch.equal(a, b)


def test_a_pending_parameter_finishes_on_any_access(one_rank_group):
    (net, plain_net), (optimizer, _), _ = _trained_pair(True)
    first, plain = next(net.parameters()), next(plain_net.parameters())
    assert torch.equal(first.data, plain.data)  # .data is an access too
    state = net.state_dict()  # so is detach(), which state_dict uses
    for key, value in plain_net.state_dict().items():
        assert torch.equal(state[key], value)
    assert not optimizer._param_sync.pending


def test_low_bucket_utilization_warns(one_rank_group):
    with pytest.warns(UserWarning, match="Consider decreasing the bucket_cap_mb argument"):
        DistributedFusedAdam(_params(), bucket_cap_mb=100.0).zero_grad()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DistributedFusedAdam(_params(), bucket_cap_mb=1344 * 4 / 2**20).zero_grad()  # one nearly full bucket


def test_integer_param_sync_dtypes_carry_the_most_significant_bytes():
    from apex.contrib.optimizers._casts import cast_into

    values = torch.randn(1000)
    for dtype in (torch.int32, torch.int64):
        carried, back = torch.empty(1000, dtype=dtype), torch.empty(1000)
        cast_into(carried, values)
        cast_into(back, carried)
        assert torch.equal(back, values)
    half = values.half()
    top, back = torch.empty(1000, dtype=torch.uint8), torch.empty(1000, dtype=torch.float16)
    cast_into(top, half)
    cast_into(back, top)
    assert torch.equal(back.view(torch.int16), half.view(torch.int16) & ~0xFF)  # the low byte is dropped
    bits, bf16 = torch.empty(1000, dtype=torch.int32), torch.empty(1000, dtype=torch.bfloat16)
    cast_into(bits, values)
    cast_into(bf16, bits)  # fp32 bits into bf16: truncated, not rounded
    assert torch.equal(bf16.view(torch.int16), (values.view(torch.int32) >> 16).to(torch.int16))


def test_per_parameter_sync_dtypes_get_buckets_of_their_own(one_rank_group):
    params = _params()
    optimizer = DistributedFusedAdam(params, bucket_cap_mb=100.0, store_params=False)
    optimizer.init_params(params[:2], grad_sync_dtype=torch.bfloat16)
    optimizer.init_params(params[2:4], param_sync_dtype=torch.int32)
    optimizer.init_params(params[:1], param_sync_dtype=torch.float16)  # placed already: left as it is
    optimizer.init_params()
    keys = {b.key: b.params for b in optimizer._buckets}
    assert keys == {(torch.bfloat16, torch.float32): (0, 1), (torch.float32, torch.int32): (2, 3),
                    (torch.float32, torch.float32): tuple(reversed(range(4, len(params))))}
    storage = {b.key: s.storage.value for b, s in zip(optimizer._buckets, optimizer._states)}
    assert storage[(torch.float32, torch.int32)] == "master"  # its own gather dtype keeps a master copy
    assert storage[(torch.float32, torch.float32)] == "model"


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
