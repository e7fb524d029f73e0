"""apex.parallel.DistributedDataParallel and Reducer, on torch.distributed.

Gradients are all-reduced in flat buckets (apex_C.flatten / unflatten) through
torch.distributed's own engine: NCCL for CUDA models, gloo for CPU models.
"""
from __future__ import annotations

import contextlib
import itertools
import warnings
from collections import defaultdict
from typing import Iterable, Sequence

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from apex._ops import ops
from apex._weak_hooks import remove_with, weak_method
from apex.parallel import _process_group


def _apex_C():
    """``torch.ops.apex`` with the apex_C ops (apex_C_flatten / apex_C_unflatten) loaded."""
    return ops("apex_C")


@torch.no_grad()
def flat_dist_call(tensors: Sequence[torch.Tensor], call, extra_args: tuple = (), group=None) -> None:
    """Run ``call(flat, *extra_args, group=group)`` (dist.broadcast, dist.all_reduce, ...)
    once per (dtype, device) on the flattened ``tensors``, then copy the result back into
    them. After ``dist.all_reduce`` the result is divided by the group's size (an average)."""
    apex_C = _apex_C()
    same_kind = defaultdict(list)
    for t in tensors:
        same_kind[(t.dtype, t.device)].append(t)
    for bucket in same_kind.values():
        flat = apex_C.apex_C_flatten(bucket)
        call(flat, *extra_args, group=group)
        if call is dist.all_reduce:
            flat.div_(dist.get_world_size(group))
        torch._foreach_copy_(bucket, apex_C.apex_C_unflatten(flat, bucket))


def _module_device(module: torch.nn.Module, user: str) -> torch.device:
    devices = {t.device for t in itertools.chain(module.parameters(), module.buffers())}
    if not devices:
        raise ValueError(f"{user}: the module has no parameters or buffers to synchronize")
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise ValueError(f"{user} needs the whole module on one device (one process per GPU); its parameters and "
                         f"buffers are on {names}")
    (device,) = devices
    if device.type == "cpu" and dist.get_backend() == "nccl":
        raise ValueError(f"{user}: the module is on the CPU but the process group's backend is NCCL, which reduces "
                         "CUDA tensors only; use the gloo backend for CPU models or move the module to its GPU")
    return device


def _plan_buckets(order: Sequence[int], params: Sequence[torch.Tensor], message_size: int,
                  triggers: set[int] | None) -> list[list[int]]:
    """Group parameter indices, in gradient-arrival ``order``, into all-reduce buckets.

    Each dtype fills its own bucket; a bucket closes once it holds ``message_size``
    elements, or, with ``triggers`` (ids of trigger parameters), all open buckets close
    when a trigger parameter's gradient arrives. Buckets are numbered in closing order,
    the still-open ones last (by first arrival).
    """
    closed: list[list[int]] = []
    open_buckets: dict[torch.dtype, list[int]] = {}
    sizes: dict[torch.dtype, int] = defaultdict(int)
    for i in order:
        p = params[i]
        open_buckets.setdefault(p.dtype, []).append(i)
        sizes[p.dtype] += p.numel()
        if triggers is None and sizes[p.dtype] >= message_size:
            closed.append(open_buckets.pop(p.dtype))
            sizes[p.dtype] = 0
        elif triggers is not None and id(p) in triggers:
            closed.extend(sorted(open_buckets.values(), key=lambda b: order.index(b[0])))
            open_buckets.clear()
            sizes.clear()
    closed.extend(sorted(open_buckets.values(), key=lambda b: order.index(b[0])))
    return closed


def _allreduce_groups(num_allreduce_streams: int, allreduce_communicators) -> list:
    """The process groups buckets rotate through (None = the default group).

    Each extra group is an independent NCCL communicator, so consecutive buckets'
    all-reduces can run concurrently, which is what apex's extra streams were for
    (torch.distributed gives every communicator its own stream)."""
    if allreduce_communicators is not None:
        groups = allreduce_communicators
        # NVIDIA apex's form: (communicators, streams); streams belong to the groups here.
        if isinstance(groups, tuple) and len(groups) == 2 and isinstance(groups[0], (list, tuple)):
            groups = groups[0]
        groups = list(groups)
        if not groups:
            raise ValueError("DistributedDataParallel: allreduce_communicators is empty")
        return groups
    if num_allreduce_streams < 1:
        raise ValueError(f"DistributedDataParallel: num_allreduce_streams must be >= 1, got {num_allreduce_streams}")
    if num_allreduce_streams == 1:
        return [None]
    ranks = list(range(dist.get_world_size()))
    return [dist.new_group(ranks) for _ in range(num_allreduce_streams)]


class DistributedDataParallel(torch.nn.Module):
    r"""Data parallelism over torch.distributed with apex's bucketed, overlapped all-reduce.

    At construction the module's parameters and buffers are broadcast from rank 0.
    During ``backward()`` each gradient, once accumulated, marks its bucket; full
    buckets are flattened and all-reduced asynchronously (in the same bucket order on
    every rank) while backward continues; at the end of backward the outstanding
    reductions are waited on and the averaged gradients written back into
    ``param.grad``. The first backward discovers the order gradients arrive in (rank 0's
    order is used everywhere) and fixes the buckets; it reduces everything at its end.

    Launch one process per GPU, e.g. ``torchrun --nproc_per_node=2 train.py``, and in
    the script: ``torch.distributed.init_process_group("nccl")``,
    ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``, build the model on that GPU,
    then wrap it. CPU models use the gloo backend.

    Args:
        module: the model, entirely on one device.
        message_size: minimum number of elements per bucket.
        delay_allreduce: reduce all gradients at the end of backward instead of overlapping.
        shared_param: removed in NVIDIA apex; passing it raises (use delay_allreduce).
        allreduce_trigger_params: parameters whose gradient's arrival closes the open
            buckets (instead of message_size).
        retain_allreduce_buffers: keep the reduced flat buckets in ``self.allreduce_buffers``
            (in bucket order) and leave ``param.grad`` as computed locally.
        allreduce_always_fp32: reduce fp16/bf16 gradients in float32.
        num_allreduce_streams: number of process groups (communicators) buckets rotate over.
        allreduce_communicators: explicit process groups to rotate over (or apex's
            ``(groups, streams)`` tuple; the streams are not needed).
        gradient_average: divide the summed gradients by the world size.
        gradient_predivide_factor: divide by this before the all-reduce and by
            world_size / factor after it (protects fp16 sums from overflow).
        gradient_average_split_factor: old name of gradient_predivide_factor.
        prof: label bucket reductions for the profiler (torch.profiler / NVTX).

    Gradients of parameters that received none on a rank are reduced as zeros (and
    parameters that no rank has used stay ``None``). Every backward pass through the
    module's outputs ends with the reductions on every rank, also on a rank where no
    parameter got a gradient, so ranks taking different branches never wait on each
    other forever. Call :meth:`disable_allreduce` for backward passes that must not
    reduce: gradient accumulation, or ``torch.autograd.grad`` through the model (e.g. a
    gradient penalty), which would otherwise reduce (and zero-fill) ``param.grad``.
    """

    def __init__(self, module: torch.nn.Module, message_size: int = 10_000_000, delay_allreduce: bool = False,
                 shared_param=None, allreduce_trigger_params: Iterable[torch.nn.Parameter] | None = None,
                 retain_allreduce_buffers: bool = False, allreduce_always_fp32: bool = False,
                 num_allreduce_streams: int = 1, allreduce_communicators=None, gradient_average: bool = True,
                 gradient_predivide_factor: float = 1.0, gradient_average_split_factor: float | None = None,
                 prof: bool = False):
        super().__init__()
        user = "apex.parallel.DistributedDataParallel"
        _process_group.require_initialized(user)
        if shared_param is not None:
            raise ValueError("shared_param is no longer supported (as in NVIDIA apex): overlapping communication "
                             "works with shared parameters; use delay_allreduce=True to reduce at the end of backward")
        if gradient_average_split_factor is not None:
            warnings.warn("gradient_average_split_factor has been renamed gradient_predivide_factor", FutureWarning,
                          stacklevel=2)
            gradient_predivide_factor = gradient_average_split_factor
        if message_size <= 0:
            raise ValueError(f"{user}: message_size must be positive, got {message_size}")
        if gradient_predivide_factor <= 0:
            raise ValueError(f"{user}: gradient_predivide_factor must be positive, got {gradient_predivide_factor}")

        self.module = module
        self.device = _module_device(module, user)
        self.world_size = dist.get_world_size()
        self.message_size = int(message_size)
        self.delay_allreduce = delay_allreduce
        self.retain_allreduce_buffers = retain_allreduce_buffers
        self.allreduce_always_fp32 = allreduce_always_fp32
        self.gradient_average = gradient_average
        self.gradient_predivide_factor = gradient_predivide_factor
        self.prof = prof
        self._groups = _allreduce_groups(num_allreduce_streams, allreduce_communicators)
        self._triggers = None
        if allreduce_trigger_params is not None:
            self._triggers = {id(p) for p in allreduce_trigger_params}
            if not self._triggers <= {id(p) for p in module.parameters()}:
                raise ValueError(f"{user}: allreduce_trigger_params must be parameters of the module")
        self._allreduce_enabled = True
        self.allreduce_buffers: list[torch.Tensor] = []
        self._hooks: list = []

        flat_dist_call([t.detach() for t in itertools.chain(module.parameters(), module.buffers())], dist.broadcast,
                       (0,))
        self._watch_parameters()

    # ---- user controls ----------------------------------------------------------------
    @property
    def bucket_parameters(self) -> list[list[torch.nn.Parameter]] | None:
        """The parameters of each bucket, in bucket order (the order of
        ``allreduce_buffers``); None until the first backward has fixed the buckets."""
        return None if self._plan is None else [self._bucket_params(b) for b in range(len(self._plan))]

    def enable_allreduce(self) -> None:
        self._allreduce_enabled = True

    def disable_allreduce(self) -> None:
        """Skip the all-reduce in following backward passes (gradient accumulation)."""
        self._allreduce_enabled = False

    def forward(self, *inputs, **kwargs):
        if self._trainable_key() != self._param_key:  # requires_grad changed: new hooks and buckets
            self._watch_parameters()
        output = self.module(*inputs, **kwargs)
        if torch.is_grad_enabled():
            self._watch_outputs(output)
        return output

    # ---- hooks --------------------------------------------------------------------------
    def _trainable_key(self) -> tuple[int, ...]:
        return tuple(id(p) for p in self.module.parameters() if p.requires_grad)

    def _watch_parameters(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._params = [p for p in self.module.parameters() if p.requires_grad]
        self._param_key = self._trainable_key()
        # Weak hooks (apex._weak_hooks): a hook holding this wrapper would keep it and its module
        # alive for good.
        self._hooks = [p.register_post_accumulate_grad_hook(weak_method(self, "_gradient_ready", i))
                       for i, p in enumerate(self._params)]
        remove_with(self, self._hooks)
        self._plan: list[list[int]] | None = None
        self._reset_iteration()

    def _watch_outputs(self, output) -> None:
        """Backward through any output tensor starts this rank's end-of-backward reductions.

        Parameter hooks alone miss a backward in which none of this rank's parameters gets
        a gradient (a branch that skips them); the other ranks would then wait forever in
        all-reduces this rank never joins. Leaves are skipped: they are parameters (whose
        own hooks fire) or inputs, and hooking them would pile up hooks across iterations.
        """
        for t in pytree.tree_leaves(output):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                t.register_hook(self._output_gradient_ready)

    def _output_gradient_ready(self, grad: torch.Tensor) -> None:
        self._begin_backward()

    def _begin_backward(self) -> None:
        """Queue the end-of-backward reductions, once per backward pass."""
        if self._allreduce_enabled and not self._in_backward:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _set_plan(self, plan: list[list[int]]) -> None:
        self._plan = plan
        self._bucket_of = {i: b for b, bucket in enumerate(plan) for i in bucket}

    def _reset_iteration(self) -> None:
        self._in_backward = False
        self._arrived: list[int] = []
        self._seen: set[int] = set()
        self._missing = [len(bucket) for bucket in self._plan] if self._plan else []
        self._next_bucket = 0
        self._in_flight: list[tuple[int, object, torch.Tensor]] = []

    def _gradient_ready(self, index: int, param: torch.Tensor) -> None:
        if not self._allreduce_enabled:
            return
        self._begin_backward()
        if index in self._seen:
            raise RuntimeError("apex.parallel.DistributedDataParallel: a parameter received its gradient twice in one "
                               "backward pass (e.g. reentrant checkpointing); use delay_allreduce=True")
        self._seen.add(index)
        if self._plan is None:
            self._arrived.append(index)
        elif not self.delay_allreduce and index in self._bucket_of:
            self._missing[self._bucket_of[index]] -= 1
            # Buckets go out strictly in plan order, so every rank issues the same collectives.
            while self._next_bucket < len(self._plan) and self._missing[self._next_bucket] == 0:
                self._launch(self._next_bucket)
                self._next_bucket += 1

    def _finish_backward(self) -> None:
        try:
            if self._plan is None:
                plan = self._agree_on_plan()
                if plan is None:  # no rank saw a gradient: nothing to reduce, nothing learned
                    return
                self._set_plan(plan)
            for b in range(self._next_bucket, len(self._plan)):
                self._launch(b)
            self._complete_reductions()
        finally:
            self._reset_iteration()

    # ---- buckets ------------------------------------------------------------------------
    def _agree_on_plan(self) -> list[list[int]] | None:
        """Buckets every rank agrees on: the parameters that got a gradient on any rank,
        in rank 0's arrival order (then by index for those rank 0 did not see). None (on
        every rank alike) when no rank's parameters got a gradient, so that such a backward
        does not fix an empty plan."""
        n = len(self._params)
        order = torch.full((n,), n, dtype=torch.long, device=self.device)  # n: no gradient on this rank
        order[self._arrived] = torch.arange(len(self._arrived), device=self.device)
        used = (order < n).long()
        dist.all_reduce(used, op=dist.ReduceOp.MAX)
        dist.broadcast(order, src=0)
        used_list, order_list = used.tolist(), order.tolist()
        if n and not any(used_list):
            return None
        ranked = sorted((i for i in range(n) if used_list[i]), key=lambda i: (order_list[i], i))
        return _plan_buckets(ranked, self._params, self.message_size, self._triggers)

    def _bucket_params(self, b: int) -> list[torch.Tensor]:
        return [self._params[i] for i in self._plan[b]]

    @contextlib.contextmanager
    def _profiled(self, name: str):
        if not self.prof:
            yield
            return
        with torch.profiler.record_function(name):
            yield

    def _launch(self, b: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._bucket_params(b)]
        with self._profiled(f"apex.ddp.allreduce_bucket_{b}"):
            flat = _apex_C().apex_C_flatten(grads)
            if self.allreduce_always_fp32 and flat.dtype != torch.float32:
                flat = flat.float()
            if self.gradient_predivide_factor != 1.0:
                flat.mul_(1.0 / self.gradient_predivide_factor)
            work = dist.all_reduce(flat, group=self._groups[b % len(self._groups)], async_op=True)
        self._in_flight.append((b, work, flat))

    @torch.no_grad()
    def _complete_reductions(self) -> None:
        apex_C = _apex_C()
        self.allreduce_buffers = []
        for b, work, flat in self._in_flight:
            with self._profiled(f"apex.ddp.wait_bucket_{b}"):
                work.wait()
            if self.gradient_average:
                flat.mul_(self.gradient_predivide_factor / self.world_size)
            params = self._bucket_params(b)
            if self.retain_allreduce_buffers:
                self.allreduce_buffers.append(flat.to(params[0].dtype))
                continue
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            grads = [p.grad for p in params]
            torch._foreach_copy_(grads, apex_C.apex_C_unflatten(flat, grads))


class Reducer:
    """All-reduces (averages) gradients when :meth:`reduce` is called, not during backward.

    Pass a module (its parameters are broadcast from rank 0 now, and ``reduce()``
    averages the gradients its parameters hold) or a (nested) list of gradient tensors
    (``reduce()`` averages those tensors in place; syncing the parameters is then the
    caller's job). Useful to reduce only every few iterations.
    """

    def __init__(self, module_or_grads_list):
        _process_group.require_initialized("apex.parallel.Reducer")
        if isinstance(module_or_grads_list, torch.nn.Module):
            self.module = module_or_grads_list
            _module_device(self.module, "apex.parallel.Reducer")
            flat_dist_call([p.detach() for p in self.module.parameters()], dist.broadcast, (0,))
        else:
            self.module = None
            self.grads = list(_tensors_in(module_or_grads_list))
            if not self.grads:
                raise ValueError("apex.parallel.Reducer: the gradient list holds no tensors")

    def reduce(self) -> None:
        if self.module is not None:
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        else:
            grads = self.grads
        if grads:
            flat_dist_call(grads, dist.all_reduce)


def _tensors_in(nested) -> Iterable[torch.Tensor]:
    if isinstance(nested, torch.Tensor):
        yield nested
        return
    if not isinstance(nested, Iterable):
        raise TypeError(f"apex.parallel.Reducer: expected a module or (nested) tensors, got {type(nested).__name__}")
    for item in nested:
        yield from _tensors_in(item)
