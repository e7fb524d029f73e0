"""What the distributed optimizers keep alive, checked on their internals (one gloo rank, no timing).

- An optimizer dropped with its model is freed: its gradient hooks hold it weakly (a hook that
  held it would make a cycle through the parameters that Python's collector cannot see, and
  every optimizer ever built would keep its state, buffers and parameters: 14 bytes per
  parameter with fp32 state on 2 ranks, which is how the benchmark's later rows grew by 10-20 GiB).
- Freed gradient buckets (no contiguous buffer) leave no full-size bucket alive after a
  backward pass, and only a few during it.
- Overlapped parameter gathers into the contiguous parameter buffer hold no other buffer.
- zero_grad(set_to_none=True) leaves the contiguous gradient buffer stale instead of zeroing
  it; no param.grad is ever a view of a stale region (autograd would add to stale values).
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import zero_testing as zt

from apex.contrib.optimizers import DistributedFusedAdam, DistributedFusedLAMB

OPTIONS = [
    pytest.param(DistributedFusedAdam, {}, id="adam"),
    pytest.param(DistributedFusedAdam, dict(contiguous_param_buffer=True, contiguous_grad_buffer=True),
                 id="adam-contiguous"),
    pytest.param(DistributedFusedAdam, dict(contiguous_param_buffer=True, contiguous_grad_buffer=True,
                                            overlap_param_sync=True), id="adam-contiguous-overlap-params"),
    pytest.param(DistributedFusedAdam, dict(overlap_param_sync=True), id="adam-overlap-params"),
    pytest.param(DistributedFusedLAMB, dict(max_grad_norm=1.0, clip_after_ar=False), id="lamb-clip-before-reduction"),
]


def _train(optimizer_class, options, steps=2, set_to_none=False):
    net = zt.make_net()
    optimizer = optimizer_class(net.parameters(), bucket_cap_mb=zt.BUCKET_MB, **options)
    for step in range(steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        x, y = zt.local_batch(step, 0, 0, 1)
        zt.loss_of(net, x, y).backward()
        optimizer.step()
    return net, optimizer


@pytest.mark.parametrize("optimizer_class, options", OPTIONS)
def test_a_dropped_optimizer_is_freed_with_its_model(one_rank_group, optimizer_class, options):
    net, optimizer = _train(optimizer_class, options)  # overlap_param_sync: gathers still pending
    refs = [weakref.ref(optimizer), weakref.ref(next(net.parameters()))]
    del net, optimizer
    if optimizer_class is DistributedFusedAdam:  # no reference cycle at all: freed at once
        assert all(ref() is None for ref in refs)
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_parameters_outlive_their_optimizer(one_rank_group):
    """A parameter keeps working (and its hook does nothing) once its optimizer is gone."""
    net, optimizer = _train(DistributedFusedAdam, dict(overlap_param_sync=True))
    plain_net, _ = _train(DistributedFusedAdam, {})
    assert optimizer._param_sync.pending
    ref = weakref.ref(optimizer)
    del optimizer
    assert ref() is None
    for p, e in zip(net.parameters(), plain_net.parameters()):
        assert type(p) is torch.nn.Parameter  # the pending gathers were finished when it went
        assert torch.equal(p, e)
    x, y = zt.local_batch(0, 0, 0, 1)
    zt.loss_of(net, x, y).backward()
    assert all(p.grad is not None for p in net.parameters())  # plain autograd again


def test_freed_buckets_leave_no_full_size_bucket_alive(one_rank_group):
    net = zt.make_net()
    # Buckets of 64 float32 elements: about 30 of them, most parameters spanning several.
    optimizer = DistributedFusedAdam(net.parameters(), bucket_cap_mb=64 * 4 / 2**20, pipeline_size=2)
    optimizer.zero_grad()
    grads = optimizer._grads
    assert len(optimizer._buckets) > 20
    most = [0]

    def launch(bucket, original=grads._launch):
        original(bucket)
        alive = {id(b) for b in grads._buffers.values()} | {id(p[2]) for p in grads._pending}
        most[0] = max(most[0], len(alive))

    grads._launch = launch
    x, y = zt.local_batch(0, 0, 0, 1)
    zt.loss_of(net, x, y).backward()
    assert grads.regions is None and not grads._buffers and not grads._pending  # after backward: none
    # During it: the reductions in flight (pipeline_size, then the oldest is waited for), the
    # buckets one gradient is copied into (a parameter spans several) and one being filled.
    spans = max(len(fragments) for fragments in grads.fragments.values())
    assert most[0] <= optimizer.pipeline_size + spans + 1 < len(optimizer._buckets)
    assert all(p.grad is None for p in net.parameters())


def test_overlapped_gathers_into_the_parameter_buffer_hold_no_other_buffer(one_rank_group):
    net, optimizer = _train(DistributedFusedAdam, dict(contiguous_param_buffer=True, contiguous_grad_buffer=True,
                                                       overlap_param_sync=True))
    sync = optimizer._param_sync
    assert len(sync._pending) == len(optimizer._buckets)  # every gather left running
    for bucket, (_, gathered) in sync._pending.items():
        region = sync.region(bucket)
        assert gathered.data_ptr() == region.data_ptr() and gathered.numel() == region.numel()


@pytest.mark.parametrize("overlap_grad_sync", [True, False])
def test_set_to_none_copies_into_a_stale_buffer_instead_of_zeroing_it(one_rank_group, overlap_grad_sync):
    net = zt.make_net()
    optimizer = DistributedFusedAdam(net.parameters(), bucket_cap_mb=zt.BUCKET_MB, contiguous_grad_buffer=True,
                                     overlap_grad_sync=overlap_grad_sync)
    optimizer.init_params()  # fixes the layout
    grads = optimizer._grads
    params = list(net.parameters())
    zeroed = []
    for region in grads.regions:  # a zeroing pass over a whole region would show here
        region.zero_ = (lambda r: lambda: zeroed.append(r) or torch.Tensor.zero_(r))(region)

    def no_stale_views():
        for bucket, stale in enumerate(grads.stale):
            for index in stale:
                assert not grads._holds_view(index), f"param {index} views its stale region in bucket {bucket}"

    for step in range(3):
        optimizer.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in params)
        assert all(stale == set(b.params) for stale, b in zip(grads.stale, optimizer._buckets))
        x, y = zt.local_batch(step, 0, 0, 1)
        zt.loss_of(net, x, y).backward()
        no_stale_views()
        optimizer.step()
        no_stale_views()
        assert all(stale == set(b.params) for stale, b in zip(grads.stale, optimizer._buckets))  # reduced: stale
    assert not zeroed and not grads.eager
    optimizer.zero_grad()  # set_to_none=False: zeroed views again, and zeroed after each reduction
    assert grads.eager and not any(grads.stale)
    for p in params:
        view = optimizer.grad_buffer_view(p)
        assert p.grad.data_ptr() == view.data_ptr() and not p.grad.any()


def test_grad_buffer_view_keeps_the_buffer_zeroed(one_rank_group):
    """Whoever holds a view (grad_buffer_view, e.g. Megatron's main_grad) may accumulate into it:
    the buffer is then zeroed wherever it holds no gradient, whatever set_to_none says."""
    net, optimizer = _train(DistributedFusedAdam, dict(contiguous_grad_buffer=True), set_to_none=True)
    assert any(optimizer._grads.stale)
    views = [optimizer.grad_buffer_view(p) for p in net.parameters()]
    assert not any(optimizer._grads.stale) and all(not v.any() for v in views)
    optimizer.zero_grad(set_to_none=True)
    assert all(not v.any() for v in views) and optimizer._grads.eager
