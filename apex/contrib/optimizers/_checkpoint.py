"""State dicts of a ZeroOptimizer: gathered (any world size, torch.optim-compatible) or sharded.

Gathered (``format`` 2, NVIDIA apex's v2): ``state[i]`` = ``{"step", "exp_avg", "exp_avg_sq",
"param"}`` of parameter ``i`` (its index over all groups, as torch.optim numbers them), each
tensor shaped like the parameter, on the CPU. Any ZeroOptimizer, whatever its world size or
bucket layout, takes its own fragments from it, and FusedAdam / torch.optim.AdamW load it
as their own (``param``, the optimizer's high-precision copy, is an extra entry for them).
Loading a FusedAdam or AdamW state dict works too: their ``master_param`` counts as ``param``.

Sharded (``format`` "sharded"): this rank's shard tensors as stored, with the layout they
belong to; it loads only where the layout and rank are the same.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from apex.contrib.optimizers._flat import flat_view
from apex.contrib.optimizers._layout import signature
from apex.contrib.optimizers._shards import STATE_KEYS, Storage

if TYPE_CHECKING:
    from apex.contrib.optimizers._zero_optimizer import ZeroOptimizer

GATHERED_FORMAT = 2
SHARDED_FORMAT = "sharded"
_PARAM_KEYS = ("param", "master_param")  # ours / FusedAdam's (master_weights) high-precision copy


def _step(optimizer: ZeroOptimizer) -> int:
    step = optimizer.state["step"]
    return int(step.item()) if isinstance(step, torch.Tensor) else int(step)


def _param_groups(optimizer: ZeroOptimizer) -> list[dict[str, Any]]:
    groups, first = [], 0
    for group in optimizer.param_groups:
        saved = {k: (v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v)
                 for k, v in group.items() if k != "params"}
        saved["params"] = list(range(first, first + len(group["params"])))
        first += len(group["params"])
        groups.append(saved)
    return groups


def _trainable(optimizer: ZeroOptimizer) -> list[int]:
    return [i for i, p in enumerate(optimizer._all_params) if p.requires_grad]


@torch.no_grad()
def _shard_params(optimizer: ZeroOptimizer, bucket: int) -> torch.Tensor:
    """This rank's shard of the parameters as the optimizer holds them (float32 when split or scaled)."""
    state = optimizer._states[bucket]
    if state.storage in (Storage.MASTER, Storage.SCALED):
        return state.params_from(model_values=None)
    dtype = torch.bfloat16 if state.storage is Storage.REMAINDERS else optimizer.dtype
    model = torch.zeros(state.bucket.shard_size, dtype=dtype, device=optimizer.device)
    optimizer._param_sync.read_local(bucket, model)
    return state.params_from(model)


@torch.no_grad()
def gathered_state_dict(optimizer: ZeroOptimizer, root_only: bool) -> dict | None:
    keep = not root_only or torch.distributed.get_rank() == optimizer.process_group_root
    step = _step(optimizer)
    params = optimizer._all_params
    state: dict[int, dict[str, torch.Tensor]] = {}
    for bucket in optimizer._buckets:
        shard_state = optimizer._states[bucket.index]
        values = {"param": _shard_params(optimizer, bucket.index),
                  **{key: shard_state.get_state(key) for key in STATE_KEYS}}
        for key, shard in values.items():
            gathered = torch.empty(bucket.size, dtype=shard.dtype, device=optimizer.device)
            optimizer._shard_group.finish(optimizer._shard_group.all_gather(gathered, shard))
            if not keep:
                continue
            for fragment in bucket.fragments:
                entry = state.setdefault(fragment.param, {})
                if key not in entry:
                    entry[key] = torch.empty_like(params[fragment.param], dtype=shard.dtype, device="cpu")
                flat_view(entry[key])[slice(*fragment.param_range)].copy_(gathered[slice(*fragment.bucket_range)])
    if not keep:
        return None
    for index in _trainable(optimizer):
        entry = state.setdefault(index, {})
        for key in ("param", *STATE_KEYS):  # parameters without elements
            entry.setdefault(key, torch.empty_like(params[index], dtype=optimizer.dtype, device="cpu"))
        entry["step"] = torch.tensor(float(step))
    state = {index: state[index] for index in sorted(state)}
    return {"state": state, "param_groups": _param_groups(optimizer), "format": GATHERED_FORMAT}


def sharded_state_dict(optimizer: ZeroOptimizer) -> dict:
    shards = []
    for shard_state in optimizer._states:
        tensors = {key: getattr(shard_state, key) for key in ("exp_avg", "exp_avg_sq", "master", "remainders")}
        shard = {key: t.detach().to("cpu", copy=True) for key, t in tensors.items() if t is not None}
        shard.update({f"scale_{key}": t.to("cpu", copy=True) for key, t in shard_state.scale.items()})
        shards.append(shard)
    return {
        "format": SHARDED_FORMAT,
        "layout": signature(optimizer._buckets, optimizer.distributed_size),
        "distributed_rank": optimizer.distributed_rank,
        "storage": [state.storage.value for state in optimizer._states],
        "dtype": str(optimizer.dtype),
        "step": _step(optimizer),
        "param_groups": _param_groups(optimizer),
        "shards": shards,
    }


def _load_param_groups(optimizer: ZeroOptimizer, saved_groups: list[dict[str, Any]]) -> None:
    groups = optimizer.param_groups
    if len(saved_groups) != len(groups) or any(
            len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, groups)):
        raise ValueError("loaded state dict contains a parameter group that doesn't match the size of optimizer's "
                         f"group ({[len(s['params']) for s in saved_groups]} saved, "
                         f"{[len(g['params']) for g in groups]} here)")
    for group, saved in zip(groups, saved_groups):
        for key, value in saved.items():
            if key == "params":
                continue
            if key == "lr" and isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(float(value))  # a capturable step reads this tensor
            else:
                group[key] = value


def _set_step(optimizer: ZeroOptimizer, step: int) -> None:
    if isinstance(optimizer.state["step"], torch.Tensor):
        optimizer.state["step"].fill_(step)
    else:
        optimizer.state["step"] = step


def _saved_step(state: dict) -> int:
    """The one step count of a gathered / torch.optim state (apex v2 keeps it at ``state["step"]``)."""
    if "step" in state and not isinstance(state["step"], dict):
        return int(state["step"])
    steps = {int(float(entry["step"])) for key, entry in state.items() if isinstance(entry, dict) and "step" in entry}
    if len(steps) > 1:
        raise ValueError(f"the saved parameters are at different steps {sorted(steps)}; a distributed optimizer "
                         "keeps one step count for all of them")
    return steps.pop() if steps else 0


@torch.no_grad()
def load_state_dict(optimizer: ZeroOptimizer, state_dict: dict) -> None:
    if state_dict.get("format") == SHARDED_FORMAT:
        _load_sharded(optimizer, state_dict)
    else:
        _load_gathered(optimizer, state_dict)


def _load_sharded(optimizer: ZeroOptimizer, state_dict: dict) -> None:
    name = type(optimizer).__name__
    if state_dict["layout"] != signature(optimizer._buckets, optimizer.distributed_size):
        raise ValueError(f"{name}: this sharded state dict was saved with another bucket layout or number of "
                         "ranks; save with state_dict() (gathered) to load it elsewhere")
    if state_dict["distributed_rank"] != optimizer.distributed_rank:
        raise ValueError(f"{name}: this sharded state dict holds rank {state_dict['distributed_rank']}'s shards, "
                         f"this is rank {optimizer.distributed_rank}")
    storage = [state.storage.value for state in optimizer._states]
    if state_dict["storage"] != storage or state_dict["dtype"] != str(optimizer.dtype):
        def kinds(values: list[str]) -> str:
            return "/".join(dict.fromkeys(values))
        raise ValueError(f"{name}: this sharded state dict stores {kinds(state_dict['storage'])} state in "
                         f"{state_dict['dtype']}, this optimizer {kinds(storage)} state in {optimizer.dtype}")
    _load_param_groups(optimizer, state_dict["param_groups"])
    for shard_state, saved in zip(optimizer._states, state_dict["shards"]):
        for key in ("exp_avg", "exp_avg_sq", "master", "remainders"):
            if getattr(shard_state, key) is not None:
                getattr(shard_state, key).copy_(saved[key])
        for key, scale in shard_state.scale.items():
            scale.copy_(saved[f"scale_{key}"])
    _set_step(optimizer, state_dict["step"])
    optimizer._params_from_model = False


def _load_gathered(optimizer: ZeroOptimizer, state_dict: dict) -> None:
    _load_param_groups(optimizer, state_dict["param_groups"])
    saved = state_dict["state"]
    params = optimizer._all_params
    for bucket in optimizer._buckets:
        shard_state = optimizer._states[bucket.index]
        keeps_params = shard_state.storage is not Storage.MODEL

        def shard_of(key: str, base: torch.Tensor) -> torch.Tensor:
            values = base.to(torch.float32, copy=True)
            for fragment in bucket.local:
                entry = saved.get(fragment.param, {})
                tensor = next((entry[k] for k in ((key,) if key != "param" else _PARAM_KEYS) if k in entry), None)
                if tensor is not None:
                    source = flat_view(tensor, like=params[fragment.param])[slice(*fragment.param_range)]
                    values[slice(*fragment.shard_range)].copy_(source)
            return values

        zeros = torch.zeros(bucket.shard_size, dtype=torch.float32, device=optimizer.device)
        for key in STATE_KEYS:
            shard_state.set_state(key, shard_of(key, zeros))
        if keeps_params:  # the model's values where the state dict has none
            model = torch.zeros(bucket.shard_size, dtype=torch.float32, device=optimizer.device)
            optimizer._param_sync.read_local(bucket.index, model)
            shard_state.set_params(shard_of("param", model))
    _set_step(optimizer, _saved_step(saved))
    optimizer._params_from_model = False
