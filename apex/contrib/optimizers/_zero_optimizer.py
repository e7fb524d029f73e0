"""ZeroOptimizer: what DistributedFusedAdam and DistributedFusedLAMB share (ZeRO-2).

Parameters are laid into flat buckets (``_layout``); each rank keeps the optimizer state of
one shard of every bucket (``_shards``), receives that shard's gradients by reduce-scatter
during backward (``_grad_sync``), updates it with the fused multi-tensor kernels (the
subclass's ``_step_buckets``) and all-gathers the new parameters (``_param_sync``).
Everything runs on torch.distributed: NCCL for CUDA parameters, gloo for CPU ones.

The layout is fixed the first time it is needed (first backward hook, ``zero_grad``,
``step``, a state dict, or ``init_params``/``init_param_buffer``): parameters named in earlier
``init_params``/``init_params_bucket`` calls come first, the rest follow in reverse order of
registration, roughly the order backward produces their gradients. Parameters that do not
require grad then are left out; every other one takes part in every step (a parameter
without a gradient is stepped with a zero gradient, as in apex). ``init_params`` may give
parameters their own ``grad_sync_dtype`` / ``param_sync_dtype``: they go to buckets of their own.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from apex._weak_hooks import remove_with, weak_method
from apex.contrib.optimizers import _checkpoint, _nccl_ub
from apex.contrib.optimizers._casts import reinterprets
from apex.contrib.optimizers._collectives import GroupCollectives
from apex.contrib.optimizers._grad_sync import GradSync
from apex.contrib.optimizers._layout import Bucket, plan_buckets, shard_capacity, utilization
from apex.contrib.optimizers._param_sync import ParamSync
from apex.contrib.optimizers._shards import ShardState, ShardWork, Storage
from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import SUPPORTED_DTYPES, amp_c
from apex.parallel import _process_group

_MB = 1024 * 1024
# Parameters may be float64 too (stepped in ``dtype``, like NVIDIA apex's); the state may not.
PARAM_DTYPES = (*SUPPORTED_DTYPES, torch.float64)
# A non-floating param_sync_dtype gathers the parameters' most significant bytes (``_casts``).
INTEGER_SYNC_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
# Below this share of the buckets' capacity in use, construction warns (NVIDIA apex's threshold).
LOW_BUCKET_UTILIZATION = 0.7


class ZeroOptimizer(torch.optim.Optimizer):
    """Base class: sharded state, gradient reduce-scatter, parameter all-gather. Its keyword
    options are documented on DistributedFusedAdam. Subclasses implement ``_step_buckets``
    (the update of the local shards, then ``_emit``)."""

    # torch.amp.GradScaler hands itself to step(grad_scaler=...) instead of unscaling param.grad,
    # which this optimizer has moved into its buckets.
    _step_supports_amp_scaling = True
    _custom_amp_unscale_grads = True

    def __init__(
        self,
        params: Iterable[Any],
        defaults: dict[str, Any],
        *,
        dtype: torch.dtype = torch.float32,
        grad_sync_dtype: torch.dtype | None = None,
        param_sync_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        process_group: dist.ProcessGroup | None = None,
        distributed_process_group: dist.ProcessGroup | None = None,
        redundant_process_group: dist.ProcessGroup | None = None,
        average_grad_sync: bool = True,
        overlap_grad_sync: bool = True,
        overlap_param_sync: bool = False,
        bucket_cap_mb: float = 100.0,
        pipeline_size: int = 2,
        contiguous_param_buffer: bool = False,
        contiguous_grad_buffer: bool = False,
        store_params: bool = True,
        store_param_remainders: bool = False,
        with_scaled_states: bool = False,
        nccl_ub: bool = False,
        capturable: bool = False,
    ) -> None:
        name = type(self).__name__
        _process_group.require_initialized(name)
        self._buckets: list[Bucket] | None = None
        self._init_order: list[int] = []
        self._bucket_starts: set[int] = set()
        self._sync_dtypes: dict[int, tuple[torch.dtype, torch.dtype]] = {}  # per-parameter (grad, param) sync dtypes
        super().__init__(params, defaults)
        self._all_params = [p for group in self.param_groups for p in group["params"]]
        self._group_of = [i for i, group in enumerate(self.param_groups) for _ in group["params"]]
        self._index_of = {id(p): i for i, p in enumerate(self._all_params)}

        grad_sync_dtype = grad_sync_dtype or dtype
        param_sync_dtype = param_sync_dtype or dtype
        self._check_dtypes(dtype=dtype, grad_sync_dtype=grad_sync_dtype, param_sync_dtype=param_sync_dtype)
        self.dtype, self.grad_sync_dtype, self.param_sync_dtype = dtype, grad_sync_dtype, param_sync_dtype
        self.device = self._check_params(device)
        if bucket_cap_mb <= 0:
            raise ValueError(f"{name}: bucket_cap_mb must be positive, got {bucket_cap_mb}")
        if pipeline_size < 1:
            raise ValueError(f"{name}: pipeline_size must be at least 1, got {pipeline_size}")
        self._check_storage_options(store_params, store_param_remainders, with_scaled_states, capturable,
                                    contiguous_param_buffer)
        self.store_params, self.store_param_remainders = store_params, store_param_remainders
        self.with_scaled_states, self.capturable, self.nccl_ub = with_scaled_states, capturable, nccl_ub
        self.average_grad_sync = average_grad_sync
        self.overlap_grad_sync, self.overlap_param_sync = overlap_grad_sync, overlap_param_sync
        self.bucket_cap_mb, self.pipeline_size = bucket_cap_mb, pipeline_size
        self.contiguous_param_buffer, self.contiguous_grad_buffer = contiguous_param_buffer, contiguous_grad_buffer

        self.process_group = process_group
        self.distributed_process_group = distributed_process_group or process_group
        self.redundant_process_group = redundant_process_group
        if nccl_ub:
            if not contiguous_grad_buffer:
                raise RuntimeError(f"{name}: NCCL user buffers (nccl_ub=True) require contiguous_grad_buffer=True")
            reason = _nccl_ub.unavailable_reason(self.distributed_process_group, self.device)
            if reason is not None:
                raise RuntimeError(f"{name}: nccl_ub=True needs NCCL user buffers, which are unavailable: {reason}")
        self._shard_group = GroupCollectives(self.distributed_process_group, average_grad_sync, prescale=nccl_ub)
        self._replica_group = (GroupCollectives(redundant_process_group, average_grad_sync, prescale=nccl_ub)
                               if redundant_process_group is not None else None)
        self.process_group_size = _process_group.group_size(process_group, name)
        self.distributed_rank, self.distributed_size = self._shard_group.rank, self._shard_group.size
        self.redundant_size = 1 if self._replica_group is None else self._replica_group.size
        if self.process_group_size != self.distributed_size * self.redundant_size:
            raise RuntimeError(
                f"{name}: the process group ({self.process_group_size} ranks) must be the distributed group "
                f"({self.distributed_size}) times the redundant group ({self.redundant_size})")
        if self.device.type == "cpu" and dist.get_backend(self.distributed_process_group) == dist.Backend.NCCL:
            raise ValueError(f"{name}: the parameters are on the CPU but the process group's backend is NCCL, "
                             "which reduces CUDA tensors only; use gloo for CPU parameters")
        self.process_group_root = dist.get_global_rank(process_group or dist.group.WORLD, 0)

        self.state["step"] = torch.zeros(1, dtype=torch.int32, device=self.device) if capturable else 0
        self._step_tensor = torch.zeros(1, dtype=torch.float32, device=self.device)  # the kernels' step
        self._noop_flag = torch.zeros(1, dtype=torch.int32, device=self.device)  # set: the update kernels skip
        self._norm_flag = torch.zeros(1, dtype=torch.int32, device=self.device)  # the norm kernels' (set by inf/NaN)
        # Gradients are multiplied by this in the step: 1 / loss scale times the clipping coefficient.
        self._grad_scale = torch.ones(1, dtype=torch.float32, device=self.device)
        self._grad_norm: torch.Tensor | None = None  # of the reduced grads, before _grad_scale
        self._grad_norm_at = -1
        self._unscaled = False
        self._lr_tensors: dict[int, torch.Tensor] = {}
        self._states: list[ShardState] = []
        self._grads: GradSync | None = None
        self._param_sync: ParamSync | None = None
        self._params_from_model = False  # read the stored parameter copies from the model before the next step

        if capturable:
            for group in self.param_groups:
                group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32, device=self.device)
        self._broadcast_params()
        # The hooks hold the optimizer weakly (apex._weak_hooks): a bound-method hook would keep
        # the optimizer, its state, buffers and parameters alive for good.
        hook = weak_method(self, "_grad_hook")
        self._hooks = [p.register_post_accumulate_grad_hook(hook) for p in self._all_params if p.requires_grad]
        remove_with(self, self._hooks)

    # -- construction checks --------------------------------------------------------------

    def _check_dtypes(self, **dtypes: torch.dtype) -> None:
        """The optimizer's (or a parameter's) ``dtype`` and ``grad_sync_dtype`` must be float32,
        float16 or bfloat16; ``param_sync_dtype`` may also be an integer type (raw bits)."""
        for what, value in dtypes.items():
            allowed = SUPPORTED_DTYPES + (INTEGER_SYNC_DTYPES if what == "param_sync_dtype" else ())
            if value not in allowed:
                kinds = "float32, float16, bfloat16" + (" or an integer type" if what == "param_sync_dtype" else "")
                raise ValueError(f"{type(self).__name__}: {what} must be {kinds}, got {value}")

    def _check_params(self, device: torch.device | str | None) -> torch.device:
        name = type(self).__name__
        devices = {p.device for p in self._all_params}
        if len(devices) > 1:
            raise ValueError(f"{name} needs every parameter on one device (one process per GPU), got "
                             f"{sorted(map(str, devices))}")
        if not devices:
            raise ValueError(f"{name} got no parameters")
        (found,) = devices
        if device is not None:
            wanted = torch.device(device)
            if wanted.type == "cuda" and wanted.index is None and found.type == "cuda":
                wanted = torch.device("cuda", torch.cuda.current_device())
            if wanted != found:
                raise ValueError(f"{name}: device={wanted} but the parameters are on {found}")
        for param in self._all_params:
            if param.dtype not in PARAM_DTYPES:
                raise TypeError(f"{name} supports float32, float16, bfloat16 and float64 parameters, got {param.dtype}")
            if not (param.is_contiguous() or param.dim() in (4, 5) and any(
                    param.is_contiguous(memory_format=f) for f in (torch.channels_last, torch.channels_last_3d))):
                raise ValueError(f"{name} needs contiguous (or channels-last) parameters, got strides "
                                 f"{param.stride()} for shape {tuple(param.shape)}")
        return found

    def _check_storage_options(self, store_params: bool, store_param_remainders: bool, with_scaled_states: bool,
                               capturable: bool, contiguous_param_buffer: bool) -> None:
        name = type(self).__name__
        if store_param_remainders:
            if store_params:
                raise RuntimeError(f"{name}: store_params and store_param_remainders exclude each other")
            if self.dtype != torch.float32 or self.param_sync_dtype != torch.bfloat16:
                raise RuntimeError(f"{name}: store_param_remainders needs dtype=torch.float32 and "
                                   f"param_sync_dtype=torch.bfloat16, got {self.dtype} and {self.param_sync_dtype}")
            if any(p.dtype != torch.bfloat16 for p in self._all_params):
                raise RuntimeError(f"{name}: store_param_remainders needs bfloat16 parameters")
        if with_scaled_states:
            if not store_params or store_param_remainders:
                raise RuntimeError(f"{name}: with_scaled_states needs store_params=True and "
                                   "store_param_remainders=False")
            if self.dtype not in (torch.float16, torch.bfloat16):
                raise RuntimeError(f"{name}: with_scaled_states needs dtype float16 or bfloat16, got {self.dtype}")
        if capturable and (with_scaled_states or store_param_remainders):
            raise RuntimeError(f"{name}: capturable does not support with_scaled_states or store_param_remainders")
        if contiguous_param_buffer and not all(reinterprets(self.param_sync_dtype, p.dtype) for p in self._all_params):
            raise ValueError(f"{name}: contiguous_param_buffer makes the parameters views of a "
                             f"{self.param_sync_dtype} buffer, so every parameter must be {self.param_sync_dtype} "
                             "(or, for an integer param_sync_dtype, of its size)")

    @torch.no_grad()
    def _broadcast_params(self) -> None:
        """Start every replica from the root's values."""
        works = [dist.broadcast(p.detach(), src=self.process_group_root, group=self.process_group, async_op=True)
                 for p in self._all_params]
        for work in works:
            work.wait()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if hasattr(self, "_all_params"):
            raise RuntimeError(f"{type(self).__name__} takes its parameter groups at construction only")
        super().add_param_group(param_group)

    # -- layout ---------------------------------------------------------------------------

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """Every parameter of every group, in group order."""
        return iter(self._all_params)

    def parameter(self, param_group_id: int, param_id: int) -> torch.nn.Parameter:
        return self.param_groups[param_group_id]["params"][param_id]

    def _indices(self, params: Iterable[torch.Tensor] | torch.Tensor | None) -> list[int]:
        if params is None:
            return list(range(len(self._all_params)))
        if isinstance(params, torch.Tensor):
            params = [params]
        indices = []
        for param in params:
            if id(param) not in self._index_of:
                raise ValueError(f"{type(self).__name__}: a parameter of shape {tuple(param.shape)} is not in "
                                 "this optimizer")
            indices.append(self._index_of[id(param)])
        return indices

    def _sync_dtypes_of(self, dtype: torch.dtype | None, grad_sync_dtype: torch.dtype | None,
                        param_sync_dtype: torch.dtype | None) -> tuple[torch.dtype, torch.dtype]:
        """The (grad, param) sync dtypes ``init_params`` gives its parameters (checked)."""
        if dtype is not None and dtype != self.dtype:
            raise ValueError(f"{type(self).__name__}: per-parameter dtype is not supported (as in NVIDIA apex): the "
                             f"optimizer state of every parameter is dtype={self.dtype}")
        dtypes = (grad_sync_dtype or self.grad_sync_dtype, param_sync_dtype or self.param_sync_dtype)
        self._check_dtypes(grad_sync_dtype=dtypes[0], param_sync_dtype=dtypes[1])
        return dtypes

    def _place(self, indices: list[int], dtypes: tuple[torch.dtype, torch.dtype]) -> list[int]:
        """Append the parameters not placed yet to the bucket order, with their sync dtypes; returns them."""
        known = set(self._init_order)
        new = [i for i in dict.fromkeys(indices) if i not in known]
        self._init_order.extend(new)
        if dtypes != (self.grad_sync_dtype, self.param_sync_dtype):
            self._sync_dtypes.update((i, dtypes) for i in new)
        return new

    def init_params(self, params: Iterable[torch.Tensor] | torch.Tensor | None = None,
                    dtype: torch.dtype | None = None, grad_sync_dtype: torch.dtype | None = None,
                    param_sync_dtype: torch.dtype | None = None) -> None:
        """Place ``params`` (default: all) next in the bucket order; with all of them, fix the layout.

        ``grad_sync_dtype`` / ``param_sync_dtype`` (default: the optimizer's) apply to these
        parameters only: they share buckets with parameters of the same sync dtypes only. A
        ``param_sync_dtype`` other than the optimizer's keeps a master copy of them (as
        ``store_params``). Parameters placed already (or once the layout is fixed) are left as
        they are; ``dtype`` must be the optimizer's."""
        dtypes = self._sync_dtypes_of(dtype, grad_sync_dtype, param_sync_dtype)
        if params is None:
            if self._buckets is None:
                self._place(list(reversed(range(len(self._all_params)))), dtypes)
            self._ensure_layout()
            return
        indices = self._indices(params)
        if self._buckets is None:
            self._place(indices, dtypes)

    def init_params_bucket(self, params: Iterable[torch.Tensor] | torch.Tensor,
                           dtype: torch.dtype | None = None, grad_sync_dtype: torch.dtype | None = None,
                           param_sync_dtype: torch.dtype | None = None) -> None:
        """Place ``params`` next, in bucket(s) of their own (reduced and gathered together)."""
        dtypes = self._sync_dtypes_of(dtype, grad_sync_dtype, param_sync_dtype)
        indices = self._indices(params)
        if self._buckets is not None:
            return
        start = len(self._init_order)
        if self._place(indices, dtypes):
            self._bucket_starts.add(start)
            self._bucket_starts.add(len(self._init_order))

    @torch.no_grad()
    def _ensure_layout(self, param_buffer: bool = True) -> None:
        """Fix the layout and allocate the shards (and, unless told not to, the contiguous parameter buffer)."""
        if self._buckets is None:
            self._build_layout()
        if param_buffer and self.contiguous_param_buffer:
            self.init_param_buffer()

    def _build_layout(self) -> None:
        trainable = [i for i, p in enumerate(self._all_params) if p.requires_grad]
        trainable_set = set(trainable)
        order, starts = [], set()
        for position, index in enumerate(self._init_order):
            if position in self._bucket_starts:
                starts.add(len(order))
            if index in trainable_set:
                order.append(index)
        if len(self._init_order) in self._bucket_starts:  # the parameters placed by default start anew
            starts.add(len(order))
        placed = set(order)
        order += [i for i in reversed(trainable) if i not in placed]
        # Bucket capacity in elements of the optimizer's grad_sync_dtype, whatever a bucket's own (as apex).
        capacity = shard_capacity(self.bucket_cap_mb * _MB, self.grad_sync_dtype.itemsize, self.distributed_size)
        sizes = [p.numel() for p in self._all_params]
        default = (self.grad_sync_dtype, self.param_sync_dtype)
        keys = [self._sync_dtypes.get(i, default) for i in range(len(self._all_params))]
        self._buckets = plan_buckets(sizes, order, starts, capacity, self.distributed_size, self.distributed_rank, keys)
        used = utilization(self._buckets, capacity, self.distributed_size)
        if used < LOW_BUCKET_UTILIZATION:
            warnings.warn(f"Only {used:.1%} of buckets are used. Consider decreasing the bucket_cap_mb argument. "
                          f"({type(self).__name__}: bucket_cap_mb={self.bucket_cap_mb} is large for "
                          f"{sum(sizes[i] for i in order)} elements over {self.distributed_size} ranks: larger "
                          "buckets overlap less of their communication with backward)", stacklevel=4)
        self._states = [ShardState(b, self._group_of, self._choose_storage(b), self.dtype, self.device)
                        for b in self._buckets]
        self._params_from_model = any(state.storage in (Storage.MASTER, Storage.SCALED) for state in self._states)
        memory = _nccl_ub.RegisteredMemory(self.distributed_process_group, self.device) if self.nccl_ub else None
        self._grads = GradSync(self._buckets, self._all_params, [b.key[0] for b in self._buckets], self.device,
                               self._shard_group, self._replica_group, self.pipeline_size,
                               self.contiguous_grad_buffer, self.overlap_grad_sync, memory)
        self._param_sync = ParamSync(self._buckets, self._all_params, [b.key[1] for b in self._buckets], self.device,
                                     self._shard_group, self.overlap_param_sync)

    def _choose_storage(self, bucket: Bucket) -> Storage:
        """What a bucket's shard keeps of its parameters (``_shards.Storage``)."""
        param_sync_dtype = bucket.key[1]
        if self.with_scaled_states:
            return Storage.SCALED
        if self.store_param_remainders and param_sync_dtype == self.param_sync_dtype:
            return Storage.REMAINDERS
        # Parameters gathered in a dtype of their own keep a master copy (as NVIDIA apex).
        store = self.store_params or param_sync_dtype != self.param_sync_dtype
        # A copy of parameters already in `dtype`, and gathered in it, would only repeat them.
        params_differ = any(self._all_params[i].dtype != self.dtype for i in bucket.params)
        if store and (params_differ or param_sync_dtype != self.dtype):
            return Storage.MASTER
        return Storage.MODEL

    def init_param_buffer(self) -> None:
        """Make the parameters views of one buffer laid out like the buckets (``contiguous_param_buffer``)."""
        self.contiguous_param_buffer = True
        self._ensure_layout(param_buffer=False)
        self._param_sync.make_contiguous()

    def grad_buffer_view(self, param: torch.Tensor) -> torch.Tensor:
        """``param``'s gradient as a view of the contiguous gradient buffer (``contiguous_grad_buffer``)."""
        if not self.contiguous_grad_buffer:
            raise RuntimeError(f"{type(self).__name__}: grad_buffer_view needs contiguous_grad_buffer=True")
        self._ensure_layout()
        (index,) = self._indices(param)
        self._grads.external_writer()  # the caller may write gradients there: keep the buffer zeroed
        view = self._grads.grad_view(index)
        if view is None:
            raise RuntimeError(f"{type(self).__name__}: a {param.dtype} parameter has no view in its "
                               f"{self._grads.dtypes[self._grads.fragments[index][0].bucket]} gradient buffer")
        return view

    @torch.no_grad()
    def _load_params_from_model(self) -> None:
        """Set the stored parameter copies (master / scaled) from the model's current values."""
        for state in self._states:
            values = torch.empty(state.bucket.shard_size, dtype=torch.float32, device=self.device)
            values.zero_()
            self._param_sync.read_local(state.bucket.index, values)
            state.set_params(values)
        self._params_from_model = False

    # -- gradients ------------------------------------------------------------------------

    def _grad_hook(self, param: torch.Tensor) -> None:
        self._ensure_layout(param_buffer=False)
        self._grads.on_grad(self._index_of[id(param)], in_backward=True)

    def _try_start_bucket_grad_sync(self, params: Iterable[torch.Tensor] | None = None,
                                    ignore_last_bucket: bool = False) -> None:
        """Move the gradients of ``params`` into their buckets and reduce the buckets now complete
        (apex's entry point for frameworks that run their own gradient hooks)."""
        self._ensure_layout(param_buffer=False)
        for index in self._indices(params or []):
            self._grads.on_grad(index, in_backward=False)

    @torch.no_grad()
    def grad_sync(self) -> None:
        """Finish reducing every gradient into this rank's shards."""
        self._ensure_layout(param_buffer=False)
        self._grads.sync()

    @contextlib.contextmanager
    def no_sync(self, greedy_grad_copy: bool = False) -> Iterator[None]:
        """Accumulate gradients without reducing them (DDP's ``no_sync``); the first backward
        after the context, or ``grad_sync``/``step``, reduces everything accumulated.
        ``greedy_grad_copy`` moves each gradient into its bucket at once (freeing ``param.grad``)."""
        self._ensure_layout(param_buffer=False)
        previous = self._grads.accumulate_only, self._grads.copy_in_no_sync
        self._grads.accumulate_only, self._grads.copy_in_no_sync = True, greedy_grad_copy
        try:
            yield
        finally:
            self._grads.accumulate_only, self._grads.copy_in_no_sync = previous

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = False) -> None:
        """Drop every gradient. The parameters' ``.grad`` become None, except with
        ``contiguous_grad_buffer`` and ``set_to_none=False`` (the default, as in NVIDIA apex):
        then they are zeroed views of the buffer, into which autograd accumulates in place.
        ``set_to_none=True`` is the faster: the buffer is not zeroed, each gradient is copied
        into it once by the backward hook (see ``_grad_sync``)."""
        self._ensure_layout()
        self._grads.zero(set_to_none)
        self._reset_scaling()

    def _reset_scaling(self) -> None:
        self._grad_scale.fill_(1.0)
        self._grad_norm = None
        self._unscaled = False

    # -- parameters -----------------------------------------------------------------------

    @torch.no_grad()
    def param_sync(self) -> None:
        """Finish every pending all-gather: the parameters hold the values of the last step."""
        if self._param_sync is not None:
            self._param_sync.finish_all()

    # -- norms and scaling ----------------------------------------------------------------

    @torch.no_grad()
    def _local_grad_norm_sq(self, params: Iterable[torch.Tensor] | None) -> torch.Tensor:
        """Squared L2 norm of this rank's shard of the reduced gradients of ``params`` (default: all)."""
        if params is None:
            tensors = [shard for shard, filled in zip(self._grads.shards, self._grads.filled) if filled]
        else:
            wanted = set(self._indices(params))
            tensors = [self._grads.shards[state.bucket.index][slice(*f.shard_range)]
                       for state in self._states for f in state.bucket.local
                       if f.param in wanted and self._grads.filled[state.bucket.index]]
        if not tensors:
            return torch.zeros((), dtype=torch.float32, device=self.device)
        norm = multi_tensor_applier(amp_c().multi_tensor_l2norm, self._norm_flag, [tensors], False)[0]
        return norm.reshape(()).float().square()

    def grad_norm(self, parameters: Iterable[torch.Tensor] | None = None, norm_type: float = 2.0,
                  force: bool = False) -> torch.Tensor:
        """L2 norm of the reduced gradients of ``parameters`` (default: all) as one vector, after
        the unscaling and clipping applied so far. The norm of all of them is cached until
        more gradients are reduced or ``zero_grad``, so after ``step()`` it is the norm that
        step used. All ranks must call it."""
        if float(norm_type) != 2.0:
            raise ValueError(f"{type(self).__name__}.grad_norm supports the 2-norm only, got norm_type={norm_type}")
        cached = (self._grad_norm is not None and self._grad_norm_at == self._grads.reductions
                  and not self._grads.has_unreduced())
        if parameters is None and cached and not force:  # also after step(), which consumed the gradients
            return (self._grad_norm * self._grad_scale.reshape(())).detach()
        self.grad_sync()
        if parameters is not None:
            norm = self._shard_group.sum(self._local_grad_norm_sq(parameters)).sqrt()
            return (norm * self._grad_scale.reshape(())).detach()
        self._grad_norm = self._shard_group.sum(self._local_grad_norm_sq(None)).sqrt()
        self._grad_norm_at = self._grads.reductions
        return (self._grad_norm * self._grad_scale.reshape(())).detach()

    def clip_grad_norm(self, max_norm: float, parameters: Iterable[torch.Tensor] | None = None,
                       norm_type: float = 2.0) -> torch.Tensor:
        """Scale the gradients so that their norm is at most ``max_norm`` (applied in the next
        step); returns the norm before clipping, like ``torch.nn.utils.clip_grad_norm_``."""
        if not max_norm > 0:
            raise ValueError(f"{type(self).__name__}.clip_grad_norm: max_norm must be positive, got {max_norm}")
        total = self.grad_norm(parameters, norm_type)
        self._grad_scale.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        return total

    @torch.no_grad()
    def unscale_grads(self, *args: Any, inv_scale: torch.Tensor | None = None,
                      grad_scaler: torch.amp.GradScaler | None = None) -> dict[torch.device, torch.Tensor]:
        """Divide the gradients by the loss scale (of ``grad_scaler``, or multiply by ``inv_scale``)
        and report whether they hold inf/NaN: use it instead of ``grad_scaler.unscale_(optimizer)``,
        which only sees ``param.grad``. Returns ``{device: found_inf}``."""
        if inv_scale is None and args:
            inv_scale = args[0]
        found_inf = (~torch.isfinite(self.grad_norm())).float().reshape(1)
        per_device = {self.device: found_inf}
        if grad_scaler is not None and grad_scaler.is_enabled():
            if inv_scale is not None:
                raise ValueError("unscale_grads takes inv_scale or grad_scaler, not both")
            scaler_state = grad_scaler._per_optimizer_states[id(self)]
            stage = scaler_state["stage"]
            if stage is torch.amp.grad_scaler.OptState.UNSCALED:
                raise RuntimeError("unscale_grads has already been called since the last GradScaler update")
            if stage is torch.amp.grad_scaler.OptState.STEPPED:
                raise RuntimeError("unscale_grads is being called after the optimizer step")
            inv_scale = grad_scaler._scale.double().reciprocal().float()
            scaler_state["found_inf_per_device"] = per_device
            scaler_state["stage"] = torch.amp.grad_scaler.OptState.UNSCALED
        if inv_scale is None:
            raise ValueError("unscale_grads needs inv_scale or grad_scaler")
        self._grad_scale.mul_(torch.as_tensor(inv_scale, dtype=torch.float32, device=self.device).reshape(1))
        self._unscaled = True
        return per_device

    def _found_inf(self, grad_scaler: torch.amp.GradScaler | None) -> torch.Tensor | None:
        if grad_scaler is None or not grad_scaler.is_enabled():
            return None
        scaler_state = grad_scaler._per_optimizer_states[id(self)]
        if scaler_state["stage"] is torch.amp.grad_scaler.OptState.READY:
            self.unscale_grads(grad_scaler=grad_scaler)
        elif not self._unscaled:
            raise RuntimeError(
                f"GradScaler.unscale_ cannot see {type(self).__name__}'s gradients (they live in its buckets, not "
                "in param.grad): call optimizer.unscale_grads(grad_scaler=scaler) instead")
        return scaler_state["found_inf_per_device"][self.device].to(self.device).reshape(1)

    # -- the step -------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None, *,
             grad_scaler: torch.amp.GradScaler | None = None) -> torch.Tensor | None:
        """Reduce the gradients, update this rank's shards, gather the parameters.

        With ``grad_scaler`` (``GradScaler.step(optimizer)`` passes itself) the gradients are
        unscaled in the kernels and a step whose gradients hold inf/NaN is skipped.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._ensure_layout()
        self.param_sync()
        self.grad_sync()
        found_inf = self._found_inf(grad_scaler)
        self._noop_flag.zero_()
        if found_inf is not None:
            if self.capturable:
                self._noop_flag.copy_(found_inf)
            elif found_inf.item():  # skip; the overflowing gradients are not worth accumulating into
                self._grads.consumed()
                self._reset_scaling()
                return loss
        if self._params_from_model:
            self._load_params_from_model()
        self._advance_step(found_inf)
        self._step_buckets()
        self._grads.consumed()
        if self._grad_norm is not None:  # grad_norm() after the step reports what the step used
            self._grad_norm = self._grad_norm * self._grad_scale.reshape(())
        self._grad_scale.fill_(1.0)
        self._unscaled = False
        self._noop_flag.zero_()
        return loss

    def _advance_step(self, found_inf: torch.Tensor | None) -> None:
        if self.capturable:
            self.state["step"] += 1 if found_inf is None else (1 - found_inf).to(torch.int32)
            self._step_tensor.copy_(self.state["step"])
        else:
            self.state["step"] += 1
            self._step_tensor.fill_(self.state["step"])

    def _group_lr(self, group_index: int) -> torch.Tensor:
        """The group's lr as a float32 device tensor (the kernels read it there)."""
        lr = self.param_groups[group_index]["lr"]
        if isinstance(lr, torch.Tensor) and lr.device == self.device and lr.dtype == torch.float32:
            return lr.reshape(1) if lr.dim() == 0 else lr
        cached = self._lr_tensors.get(group_index)
        if cached is None:
            cached = self._lr_tensors[group_index] = torch.empty(1, dtype=torch.float32, device=self.device)
        return cached.copy_(lr) if isinstance(lr, torch.Tensor) else cached.fill_(lr)

    def _step_buckets(self) -> None:
        """Update every local shard (through ``_begin`` and ``_emit``)."""
        raise NotImplementedError

    def _bucket_batches(self) -> list[list[int]]:
        """Buckets in the order to update and gather them: the last laid out (the first parameters
        of the forward pass) first, ``pipeline_size`` at a time."""
        order = list(reversed(range(len(self._buckets))))
        return [order[i:i + self.pipeline_size] for i in range(0, len(order), self.pipeline_size)]

    def _begin(self, bucket: int, grads_dtype: torch.dtype | None = None) -> ShardWork:
        """The views a step of ``bucket``'s shard updates."""
        state = self._states[bucket]
        sync = self._param_sync.shard_of(bucket)
        holds_model = sync is not None
        param_sync_dtype = self._param_sync.dtypes[bucket]
        if sync is None:
            sync = state.reusable_sync_shard(param_sync_dtype)
        if sync is None:
            sync = torch.empty(state.bucket.shard_size, dtype=param_sync_dtype, device=self.device)
        return state.begin(self._grads.shards[bucket], sync, holds_model,
                           lambda out: self._param_sync.read_local(bucket, out), grads_dtype)

    def _emit(self, works: list[ShardWork]) -> None:
        """Store the stepped shards and start their all-gathers."""
        for work in works:
            work.state.finish(work)
            self._param_sync.launch(work.state.bucket.index, work.sync)

    def _gather_pipeline(self, batches: list[list[int]], works_of: Callable[[list[int]], list[ShardWork]],
                         update: Callable[[list[ShardWork]], None] | None = None) -> None:
        """For each batch: ``update`` its works, start their all-gathers, and (without
        ``overlap_param_sync``) finish the previous batch's, so one batch gathers while the next updates.
        With ``overlap_param_sync`` the gathers are left running: each parameter finishes its own
        the first time it is touched (``ParamSync.mark_pending``)."""
        previous: list[int] = []
        for batch in batches:
            works = works_of(batch)
            if update is not None:
                update(works)
            self._emit(works)
            if not self.overlap_param_sync:
                for bucket in previous:
                    self._param_sync.finish(bucket)
            previous = batch
        if self.overlap_param_sync:
            self._param_sync.mark_pending()
        else:
            self.param_sync()

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self, *, gather_on_root: bool | None = None, state_dict_format: int | None = None) -> dict | None:
        """The optimizer state. Every rank of the process group must call it.

        - default: gathered, on every rank: a ``torch.optim``-style dict whose ``state[i]``
          holds full-size ``exp_avg``, ``exp_avg_sq``, ``param`` (the optimizer's copy of the
          parameter, float32 when kept that way) and ``step`` of parameter ``i``. It loads on
          any number of ranks, and into ``apex.optimizers.FusedAdam`` / ``torch.optim.AdamW``.
        - ``gather_on_root=True``: the same on the process group's root, None elsewhere.
        - ``gather_on_root=False``: this rank's shards only; loads on the same ranks and layout.
        """
        if state_dict_format not in (None, 2):
            raise ValueError(f"{type(self).__name__}: unknown state_dict_format {state_dict_format} "
                             "(2: gathered or sharded by gather_on_root)")
        self._ensure_layout()
        self._grads.finish_all()
        self.param_sync()
        if self._params_from_model:
            self._load_params_from_model()
        if gather_on_root is False:
            return _checkpoint.sharded_state_dict(self)
        return _checkpoint.gathered_state_dict(self, root_only=bool(gather_on_root))

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state dict of either kind (or one of FusedAdam / torch.optim.AdamW)."""
        self._ensure_layout()
        self.param_sync()
        _checkpoint.load_state_dict(self, state_dict)

    def __repr__(self) -> str:
        options = ", ".join(f"{key}={getattr(self, key)}" for key in (
            "dtype", "grad_sync_dtype", "param_sync_dtype", "distributed_size", "redundant_size", "bucket_cap_mb",
            "overlap_grad_sync", "overlap_param_sync", "store_params", "store_param_remainders",
            "with_scaled_states", "contiguous_param_buffer", "contiguous_grad_buffer", "nccl_ub", "capturable"))
        return f"{super().__repr__()[:-1]}{options}\n)"
