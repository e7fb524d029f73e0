"""apex._weak_hooks: parameter hooks that hold their owner weakly, so an owner dropped by the user
(a DDP wrapper, a gradient reducer, a ZeRO optimizer) is freed with everything it holds."""
import gc
import weakref

import torch

from apex._weak_hooks import remove_with, weak_method


class Owner:
    def __init__(self, param):
        self.param = param  # owner -> parameter: a strong hook would close the cycle
        self.calls = []
        self.hooks = [param.register_post_accumulate_grad_hook(weak_method(self, "ready", 7))]
        remove_with(self, self.hooks)

    def ready(self, tag, param):
        self.calls.append((tag, param))


def test_hook_calls_the_owner_method_with_bound_arguments():
    param = torch.nn.Parameter(torch.ones(3))
    owner = Owner(param)
    param.sum().backward()
    assert owner.calls == [(7, param)]


def test_dropped_owner_is_freed_without_gc_and_its_hooks_removed():
    param = torch.nn.Parameter(torch.ones(3))
    owner = Owner(param)
    ref = weakref.ref(owner)
    del owner
    assert ref() is None  # no cycle: freed by reference counting alone
    gc.collect()
    param.sum().backward()  # the removed hook is never called (it would find no owner anyway)
    assert param.grad is not None


def test_ddp_wrapper_is_freed_when_dropped(tmp_path):
    import torch.distributed as dist

    from apex.parallel import DistributedDataParallel

    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(torch.nn.Linear(4, 2))
        ddp(torch.randn(3, 4)).sum().backward()
        ref = weakref.ref(ddp)
        del ddp
        gc.collect()
        assert ref() is None
    finally:
        if owns_group:
            dist.destroy_process_group()
