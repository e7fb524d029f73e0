"""One bucket's local shard of optimizer state, and the float views a step works on.

The state of a shard is its moments (``exp_avg``, ``exp_avg_sq``) and, depending on the
optimizer's options, a copy of the parameters in the optimizer's dtype:

- ``Storage.MASTER``: a ``dtype`` copy of the shard's parameters (``store_params``);
- ``Storage.SCALED``: that copy and the moments in 16 bits, scaled per fragment (``with_scaled_states``);
- ``Storage.REMAINDERS``: only the low 16 bits that bf16 model parameters drop (``store_param_remainders``);
- ``Storage.MODEL``: nothing; the model parameters themselves are the values stepped on.

A step turns the shard into a ``ShardWork``: flat ``params``/``grads``/``exp_avg``/``exp_avg_sq``
tensors in the dtypes the kernels take, cut per parameter group into the fragment lists one
multi-tensor launch updates. ``finish`` stores the result back and fills the shard the
all-gather sends (``sync``, in ``param_sync_dtype``).
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch

from apex.contrib.optimizers import _bf16_remainders
from apex.contrib.optimizers._casts import cast_into
from apex.contrib.optimizers._layout import Bucket
from apex.contrib.optimizers._scaled_states import SegmentScales


class Storage(enum.Enum):
    MASTER = "master"
    SCALED = "scaled"
    REMAINDERS = "remainders"
    MODEL = "model"


STATE_KEYS = ("exp_avg", "exp_avg_sq")


@dataclass
class ShardWork:
    """Flat shard-sized tensors a step updates; ``lists(group)`` cuts them per parameter group."""

    state: ShardState
    params: torch.Tensor
    grads: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    sync: torch.Tensor

    def lists(self, group: int, *tensors: torch.Tensor) -> list[list[torch.Tensor]]:
        """``[[t's slice of each fragment of param group `group`] for t in tensors]``."""
        positions = self.state.group_segments.get(group, ())
        cut = [t.split(self.state.segment_lengths) for t in tensors]
        return [[pieces[i] for i in positions] for pieces in cut]

    def kernel_lists(self, group: int) -> list[list[torch.Tensor]]:
        """``[grads, params, exp_avg, exp_avg_sq]`` of group ``group``: an Adam/LAMB launch's lists."""
        return self.lists(group, self.grads, self.params, self.exp_avg, self.exp_avg_sq)


class ShardState:
    """Persistent tensors of this rank's shard of ``bucket``.

    ``group_of``: the param group index of each parameter (by parameter index).
    """

    def __init__(self, bucket: Bucket, group_of: list[int], storage: Storage, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.bucket = bucket
        self.storage = storage
        self.dtype = dtype
        size = bucket.shard_size
        # Segments of the shard: the local fragments and the gaps (padding) between them.
        self.segment_lengths: list[int] = []
        self.group_segments: dict[int, list[int]] = {}  # group -> its fragments' segment positions
        self.group_params: dict[int, list[int]] = {}  # group -> its fragments' parameters, in the same order
        position = 0
        for fragment in bucket.local:
            start, end = fragment.shard_range
            if start > position:
                self.segment_lengths.append(start - position)
            group = group_of[fragment.param]
            self.group_segments.setdefault(group, []).append(len(self.segment_lengths))
            self.group_params.setdefault(group, []).append(fragment.param)
            self.segment_lengths.append(end - start)
            position = end
        if position < size:
            self.segment_lengths.append(size - position)
        self.exp_avg = torch.zeros(size, dtype=dtype, device=device)
        self.exp_avg_sq = torch.zeros(size, dtype=dtype, device=device)
        self.master = torch.zeros(size, dtype=dtype, device=device) if storage in (Storage.MASTER, Storage.SCALED) else None
        self.remainders = torch.zeros(size, dtype=torch.int16, device=device) if storage is Storage.REMAINDERS else None
        self.scales: SegmentScales | None = None
        self.scale: dict[str, torch.Tensor] = {}
        if storage is Storage.SCALED:
            self.scales = SegmentScales([f.shard_range for f in bucket.local], size, dtype, device)
            self.scale = {key: self.scales.new_scale() for key in ("param", *STATE_KEYS)}

    # -- values in float32 / dtype, for steps and checkpoints -------------------------------

    def set_params(self, values: torch.Tensor) -> None:
        """Store the shard's parameter values (a float tensor of the shard's size)."""
        if self.storage is Storage.SCALED:
            self.scales.store(values.float(), self.master, self.scale["param"])
        elif self.storage is Storage.MASTER:
            self.master.copy_(values)
        elif self.storage is Storage.REMAINDERS:
            _bf16_remainders.split(values.float(), torch.empty_like(values, dtype=torch.bfloat16), self.remainders)

    def get_state(self, key: str) -> torch.Tensor:
        """Moment ``key`` as values (unscaled, in float32 when scaled)."""
        stored = getattr(self, key)
        if self.storage is not Storage.SCALED:
            return stored
        return self.scales.unscale(stored, self.scale[key], torch.empty_like(stored, dtype=torch.float32))

    def set_state(self, key: str, values: torch.Tensor) -> None:
        if self.storage is Storage.SCALED:
            self.scales.store(values.float(), getattr(self, key), self.scale[key])
        else:
            getattr(self, key).copy_(values)

    def params_from(self, model_values: torch.Tensor) -> torch.Tensor:
        """The shard's parameter values given the model's (bf16 for remainders), as float values."""
        if self.storage is Storage.MASTER:
            return self.master
        if self.storage is Storage.SCALED:
            return self.scales.unscale(self.master, self.scale["param"], torch.empty_like(self.master, dtype=torch.float32))
        if self.storage is Storage.REMAINDERS:
            return _bf16_remainders.pack(model_values, self.remainders, torch.empty_like(self.remainders, dtype=torch.float32))
        return model_values

    # -- a step -------------------------------------------------------------------------

    def reusable_sync_shard(self, param_sync_dtype: torch.dtype) -> torch.Tensor | None:
        """A tensor of this state the all-gather may send directly (the master copy in ``param_sync_dtype``)."""
        if self.storage is Storage.MASTER and self.dtype == param_sync_dtype:
            return self.master
        return None

    def begin(self, grad_shard: torch.Tensor, sync: torch.Tensor, sync_holds_model: bool,
              read_model: Callable[[torch.Tensor], None], grads_dtype: torch.dtype | None = None) -> ShardWork:
        """The views a step updates. ``sync``: the shard the all-gather will send, which already
        holds the model's values when ``sync_holds_model`` (as values when it is floating, as
        their bits when it is an integer type); ``read_model(out)`` copies this rank's fragments
        of the model parameters into the flat tensor ``out``. Grads come in the params' dtype
        unless ``grads_dtype`` says otherwise."""
        size = self.bucket.shard_size
        exp_avg, exp_avg_sq = self.exp_avg, self.exp_avg_sq
        if self.storage is Storage.MASTER:
            params = self.master
        elif self.storage is Storage.SCALED:
            params = self.params_from(model_values=None)
            exp_avg, exp_avg_sq = self.get_state("exp_avg"), self.get_state("exp_avg_sq")
        elif self.storage is Storage.REMAINDERS:  # the bf16 halves are the model's (and sync's) dtype
            if not sync_holds_model:
                read_model(sync)
            params = self.params_from(sync)
        elif sync.dtype == self.dtype:  # MODEL: step in the shard the all-gather sends
            if not sync_holds_model:
                read_model(sync)
            params = sync
        elif sync_holds_model and sync.dtype.is_floating_point:
            params = sync.to(self.dtype)
        else:  # read the model directly in dtype: sync's dtype may be narrower than the model's, or raw bits
            params = torch.empty(size, dtype=self.dtype, device=sync.device)
            read_model(params)
        grads_dtype = grads_dtype or params.dtype
        grads = grad_shard if grad_shard.dtype == grads_dtype else grad_shard.to(grads_dtype)
        return ShardWork(self, params, grads, exp_avg, exp_avg_sq, sync)

    def finish(self, work: ShardWork) -> None:
        """Store the stepped values back and fill ``work.sync``."""
        if self.storage is Storage.REMAINDERS:
            _bf16_remainders.split(work.params, work.sync, self.remainders)
            return
        if work.sync.data_ptr() != work.params.data_ptr():
            cast_into(work.sync, work.params)
        if self.storage is Storage.SCALED:
            self.set_params(work.params)
            for key in STATE_KEYS:
                self.set_state(key, getattr(work, key))


def group_lists(works: list[ShardWork], group: int) -> tuple[list[list[torch.Tensor]], list[int]]:
    """``[grads, params, exp_avg, exp_avg_sq]`` of param group ``group`` over several shards (one
    launch's lists), and the parameter of each fragment in that order."""
    lists: list[list[torch.Tensor]] = [[], [], [], []]
    params: list[int] = []
    for work in works:
        for merged, part in zip(lists, work.kernel_lists(group)):
            merged.extend(part)
        params.extend(work.state.group_params.get(group, ()))
    return lists, params
