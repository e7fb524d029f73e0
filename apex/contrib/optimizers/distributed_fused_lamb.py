"""DistributedFusedLAMB: LAMB with ZeRO-2 sharding on torch.distributed (NVIDIA apex's API)."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from apex._weak_hooks import weak_method
from apex.contrib.optimizers._shards import group_lists
from apex.contrib.optimizers._zero_optimizer import ZeroOptimizer
from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import amp_c, check_hyperparameters


class DistributedFusedLAMB(ZeroOptimizer):
    """LAMB (You et al., arXiv 1904.00962) whose state is sharded over the ranks (ZeRO-2).

    Gradients are reduce-scattered, clipped by their global L2 norm (all ranks' shards
    together) to ``max_grad_norm``, turned into the Adam update and applied with the
    per-parameter trust ratio ``||param|| / ||update||``; a parameter's two norms are summed
    over the ranks holding its fragments before any rank uses them, so the result is
    ``apex.optimizers.FusedLAMB`` over the global batch. The gradient and parameter
    all-gathers work as in ``DistributedFusedAdam``, whose keyword options this takes too
    (``grad_sync_dtype``, ``param_sync_dtype``, ``device``, the process groups,
    ``average_grad_sync``, ``overlap_param_sync``, ``bucket_cap_mb``, ``pipeline_size``,
    ``contiguous_grad_buffer``, ``store_params``, ``store_param_remainders``); the optimizer
    state is float32.

    Args (NVIDIA apex's):
        lr, bias_correction, betas, eps, weight_decay, adam_w_mode, grad_averaging,
        use_nvlamb: as in ``apex.optimizers.FusedLAMB``.
        max_grad_norm: clip the global gradient norm to this; 0 (default) never clips.
        clip_after_ar: True (default): clip the reduced (global) gradient. False: as NVIDIA
            apex, each rank clips its own gradient to ``max_grad_norm`` before the reduction
            (the reductions then wait for the whole backward pass: no overlap).
        overlap_reductions: reduce-scatter during backward (``overlap_grad_sync``).
        set_param_views_to_flat_buffer: parameters become views of one flat buffer
            (``contiguous_param_buffer``).
        step_supports_amp_scaling: must stay True (GradScaler hands itself to ``step``).
        e5m2_allgather, skip_allgather: only their defaults are supported (fp8 gathers and
            skipped gathers are refused).
        dwu_group_size, dwu_num_blocks, dwu_num_chunks, dwu_num_rs_pg, dwu_num_ar_pg,
        dwu_num_ag_pg, fused_norm, fuse_scale, full_ar, param_order, nccl_allgather_channels,
        verbose: tuned apex's own block and communicator layout; buckets here are sized by
            ``bucket_cap_mb`` and reduced in one process group, so they are accepted for
            existing scripts and change nothing.

    NVIDIA apex's controls of a training loop work too: ``set_global_scale`` (the loss scale
    the gradients carry), ``complete_reductions``, ``set_is_accumulation_step``,
    ``set_last_step``, ``L2_grad_norm``, ``_lazy_init_stage1`` / ``_lazy_init_stage2`` (here
    they only fix the bucket layout, which otherwise happens on first use) and ``_lr``: a
    learning rate (float or tensor) assigned to ``optimizer._lr`` is used by every group in
    place of their ``lr``, as apex's step reads it (None, the default, uses the groups').
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        grad_averaging: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_grad_norm: float = 0.0,
        adam_w_mode: bool = True,
        use_nvlamb: bool = False,
        step_supports_amp_scaling: bool = True,
        overlap_reductions: bool = True,
        dwu_group_size: int = 0,
        dwu_num_blocks: int = 4,
        dwu_num_chunks: int = 4,
        dwu_num_rs_pg: int = 1,
        dwu_num_ar_pg: int = 4,
        dwu_num_ag_pg: int = 0,
        fused_norm: bool = False,
        e5m2_allgather: bool = False,
        verbose: bool = False,
        clip_after_ar: bool = True,
        full_ar: bool = False,
        set_param_views_to_flat_buffer: bool = False,
        skip_allgather: bool = False,
        fuse_scale: bool = False,
        param_order: Any = None,
        nccl_allgather_channels: int = 0,
        **zero_options: Any,
    ) -> None:
        name = type(self).__name__
        check_hyperparameters(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        if max_grad_norm < 0:
            raise ValueError(f"Invalid max_grad_norm value: {max_grad_norm}")
        if not step_supports_amp_scaling:
            raise ValueError(f"{name}: step_supports_amp_scaling must be True: the gradients live in the "
                             "optimizer's buckets, so GradScaler has to hand itself to step()")
        for option, value, supported in (("e5m2_allgather", e5m2_allgather, False),
                                         ("skip_allgather", skip_allgather, False)):
            if value != supported:
                raise NotImplementedError(f"{name}: {option}={value} is not supported (only {option}={supported})")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
                        grad_averaging=grad_averaging, max_grad_norm=max_grad_norm)
        self.adam_w_mode = adam_w_mode
        self.use_nvlamb = use_nvlamb
        self.clip_after_ar = clip_after_ar
        self._global_scale: float | torch.Tensor | None = None
        self._lr: float | torch.Tensor | None = None  # apex's override of every group's lr
        self._last_step = False
        self._local_grad_norm: torch.Tensor | None = None  # clip_after_ar=False: this rank's, before the reduction
        refused = set(zero_options) & {"dtype", "with_scaled_states", "capturable", "overlap_grad_sync",
                                       "contiguous_param_buffer"}
        if refused:
            raise TypeError(f"{name} got {sorted(refused)}: its state is float32, it is not capturable, and "
                            "overlap_reductions / set_param_views_to_flat_buffer name the other two")
        # Clipping before the reduction needs every local gradient first: nothing is reduced during backward.
        super().__init__(params, defaults, dtype=torch.float32, overlap_grad_sync=overlap_reductions and clip_after_ar,
                         contiguous_param_buffer=set_param_views_to_flat_buffer, **zero_options)
        self._zero = torch.zeros(1, dtype=torch.float32, device=self.device)
        self._owners: dict[int, torch.Tensor] = {}  # param group -> the parameter of each of its local fragments

    # -- apex's DistributedFusedLAMB controls ---------------------------------------------

    def set_global_scale(self, global_scale: float | torch.Tensor) -> None:
        """The loss scale the gradients carry; the next step divides them by it."""
        self._global_scale = global_scale

    @property
    def global_scale(self) -> float | torch.Tensor | None:
        return self._global_scale

    @property
    def L2_grad_norm(self) -> torch.Tensor:  # noqa: N802 (apex's name)
        """Global L2 norm of the gradients, unscaled by the global scale when one is set."""
        if self._global_scale is not None and not self._unscaled:
            return self.grad_norm() / torch.as_tensor(self._global_scale, dtype=torch.float32, device=self.device)
        return self.grad_norm()

    def complete_reductions(self) -> None:
        """Finish reducing every gradient (``grad_sync``)."""
        self.grad_sync()

    def set_is_accumulation_step(self, is_accumulation_step: bool) -> None:
        """While True, backward passes accumulate gradients without reducing them (``no_sync``)."""
        self._ensure_layout(param_buffer=False)
        self._grads.accumulate_only = is_accumulation_step

    def set_last_step(self, last_step: bool) -> None:
        """apex's hint that the next backward is the last one; gradients a pass does not produce
        count as zeros here in every step, so it changes nothing."""
        self._last_step = last_step

    def _lazy_init_stage1(self) -> None:
        """apex's first initialization phase (after the first forward): fixes the bucket layout."""
        self._ensure_layout()

    def _lazy_init_stage2(self) -> None:
        """apex's second initialization phase (after the first backward): nothing is left to do."""
        self._ensure_layout()

    def _build_layout(self) -> None:
        super()._build_layout()
        if not self.clip_after_ar:  # held weakly: the optimizer owns the GradSync (no reference cycle)
            self._grads.before_reduce = weak_method(self, "_clip_before_reduction")

    @torch.no_grad()
    def _clip_before_reduction(self, buckets: list[torch.Tensor]) -> None:
        """``clip_after_ar=False``: scale this rank's gradients (full-size buckets, not reduced yet)
        so that their norm, unscaled by the global scale, is at most ``max_grad_norm``."""
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for dtype in {bucket.dtype for bucket in buckets}:
            tensors = [bucket for bucket in buckets if bucket.dtype == dtype]
            norm = multi_tensor_applier(amp_c().multi_tensor_l2norm, self._norm_flag, [tensors], False)[0]
            squares = squares + norm.reshape(()).float().square()
        self._local_grad_norm = squares.sqrt()
        max_grad_norm = self.defaults["max_grad_norm"]
        if not max_grad_norm:
            return
        scale = 1.0 if self._global_scale is None else self._global_scale
        scale = torch.as_tensor(scale, dtype=torch.float32, device=self.device)
        coefficient = torch.clamp(max_grad_norm * scale / (self._local_grad_norm + 1e-6), max=1.0)
        torch._foreach_mul_(buckets, coefficient)

    def _group_lr(self, group_index: int) -> torch.Tensor:
        if self._lr is None:
            return super()._group_lr(group_index)
        if isinstance(self._lr, torch.Tensor):
            return self._lr.to(device=self.device, dtype=torch.float32).reshape(1)
        return torch.full((1,), float(self._lr), dtype=torch.float32, device=self.device)

    def _found_inf(self, grad_scaler: torch.amp.GradScaler | None) -> torch.Tensor | None:
        if self._global_scale is None or self._unscaled:
            return super()._found_inf(grad_scaler)
        # apex's protocol: the global scale unscales, a GradScaler only learns whether to skip.
        inv_scale = torch.as_tensor(self._global_scale, dtype=torch.float64, device=self.device).reciprocal()
        per_device = self.unscale_grads(inv_scale=inv_scale.float())
        if grad_scaler is None or not grad_scaler.is_enabled():
            return None
        scaler_state = grad_scaler._per_optimizer_states[id(self)]
        scaler_state["found_inf_per_device"] = per_device
        scaler_state["stage"] = torch.amp.grad_scaler.OptState.UNSCALED
        return per_device[self.device]

    # -- the update -----------------------------------------------------------------------

    def _step_buckets(self) -> None:
        global_norm = self.grad_norm().reshape(1)  # of the unscaled (and clipped) gradients
        works = [self._begin(bucket, grads_dtype=torch.float32) for bucket in range(len(self._buckets))]
        launches = []
        for index, group in enumerate(self.param_groups):
            lists, params = group_lists(works, index)
            if lists[0]:
                if index not in self._owners:  # the layout is fixed: so is which parameter each fragment is of
                    self._owners[index] = torch.tensor(params, dtype=torch.int64, device=self.device)
                launches.append((group, lists, self._owners[index]))
        # Every rank joins both norm reductions, also one whose shards hold no fragment.
        param_norms = self._per_param_norms([(lists[1], params) for _, lists, params in launches])
        for group, lists, _ in launches:
            self._moments(group, lists, global_norm)
        update_norms = self._per_param_norms([(lists[0], params) for _, lists, params in launches])
        for group, lists, params in launches:
            lr = group["lr"] if self._lr is None else self._lr  # a tensor lr costs a host sync (the kernel's is a float)
            multi_tensor_applier(
                amp_c().multi_tensor_lamb_stage2_cuda, self._noop_flag, [lists[1], lists[0]],
                param_norms.index_select(0, params), update_norms.index_select(0, params), float(lr),
                group["weight_decay"], self.use_nvlamb,
            )  # fmt: skip
        # Every shard is updated before the first all-gather: the pipeline only gathers.
        self._gather_pipeline(self._bucket_batches(), lambda batch: [works[b] for b in batch])

    def _moments(self, group: dict[str, Any], lists: list[list[torch.Tensor]], global_norm: torch.Tensor) -> None:
        """LAMB's first stage, one amp_C launch: the moments, and the update direction written over
        the gradients (float32), with every option of LAMB (the gradient scale, clipping by
        ``global_norm``, L2 or decoupled decay, (1 - beta1) averaging, bias correction). The trust
        ratio needs norms of whole parameters, which only exist once the ranks' fragment norms are
        summed: the stage-2 kernel applies it."""
        grads, params, exp_avgs, exp_avg_sqs = lists
        beta1, beta2 = group["betas"]
        # 0: never clip; clip_after_ar=False: each rank clipped its own gradients before the reduction.
        max_grad_norm = (group["max_grad_norm"] or math.inf) if self.clip_after_ar else math.inf
        multi_tensor_applier(
            amp_c().multi_tensor_lamb_direction, self._noop_flag, [grads, params, exp_avgs, exp_avg_sqs, grads], beta1,
            beta2, group["eps"], self._step_tensor, int(group["bias_correction"]), group["weight_decay"],
            int(group["grad_averaging"]), int(self.adam_w_mode), global_norm, max_grad_norm, self._grad_scale,
        )  # fmt: skip

    def _per_param_norms(self, pieces: list[tuple[list[torch.Tensor], torch.Tensor]]) -> torch.Tensor:
        """L2 norm of each whole parameter, from the fragments ``pieces`` = [(tensors, their
        parameters)] this rank holds: squared fragment norms summed per parameter and over ranks."""
        squares = torch.zeros(len(self._all_params), dtype=torch.float32, device=self.device)
        tensors = [t for group_tensors, _ in pieces for t in group_tensors]
        if tensors:
            owners = torch.cat([params for _, params in pieces])
            norms = multi_tensor_applier(amp_c().multi_tensor_l2norm, self._norm_flag, [tensors], True)[1]
            squares.index_add_(0, owners, norms.float().square())
        return self._shard_group.sum(squares).sqrt()
