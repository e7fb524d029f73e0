"""What every apex fused optimizer shares.

A step buckets each param group's params by dtype (a group lives on one device) so
that each bucket is one ``multi_tensor_applier`` launch, keeps an int32 noop flag per
device, counts steps in ``state['step']`` the way ``torch.optim`` does, and loads state
dicts without rounding fp32 state kept for fp16/bf16 params.

The buckets, the lists of state tensors and the step counters are kept between steps
(see ``_GroupPlan``): a step then costs a pass over the grads and one op per launch on
the host, instead of a dict lookup and a CPU op per param.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from itertools import chain
from types import ModuleType
from typing import Any, TypeVar

import torch
from op_builder import load_op

_Kept = TypeVar("_Kept")

REDUCED_PRECISION = (torch.float16, torch.bfloat16)
SUPPORTED_DTYPES = (torch.float32, *REDUCED_PRECISION)


def amp_c() -> ModuleType:
    """The compiled amp_C module (NVIDIA apex's multi-tensor kernels), built on first use."""
    return load_op("amp_C")


def check_hyperparameters(
    lr: float | torch.Tensor = 0.0,
    eps: float = 0.0,
    betas: tuple[float, float] = (0.0, 0.0),
    weight_decay: float = 0.0,
) -> None:
    """Raise ValueError, with torch.optim's wording, for values no optimizer accepts."""
    if not 0.0 <= float(lr):
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _capturing(tensor: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream: work queued for ``tensor``'s
    device now only runs when the graph replays (a counter stacked now would start empty)."""
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


class _StepCounter:
    """The ``state['step']`` of params that share a step count, as views of one float32 tensor,
    so that advancing them all is one op (a tensor per param, as torch.optim keeps them, costs
    a CPU op per param and step: 1.1 ms for 289 params). ``step`` is the host-side count of
    CPU counters (None on the device: reading it would synchronize)."""

    def __init__(self, state: dict, params: list[torch.Tensor], steps: torch.Tensor, step: int | None) -> None:
        self.params = params
        self.steps = steps
        self.step = step
        views = steps.unbind()
        for param, view in zip(params, views):
            state[param]["step"] = view
        self.first = views[0]  # what a launch of these params passes as its step

    def advance(self, by: torch.Tensor | None = None) -> None:
        """Add one (or ``by``, a device scalar) to every count."""
        if by is None:
            self.steps.add_(1)
            self.step = None if self.step is None else self.step + 1
        else:
            self.steps.add_(by)


class _GroupPlan:
    """A param group's launch lists and what derives from them, kept between steps.

    Valid while the group holds the same params, the same params have grads and the
    optimizer's state dict is the same object with the same number of entries; grads
    themselves may be new tensors every step (``zero_grad(set_to_none=True)``): each step
    reads them once, in ``grads``. ``load_state_dict`` drops every plan. Replacing a single
    state tensor by hand is not noticed.
    """

    def __init__(self, group: dict[str, Any], by_dtype: dict[torch.dtype, list[torch.Tensor]], state: dict) -> None:
        self.group = group
        self.params = list(group["params"])
        self.has_grad = [p.grad is not None for p in self.params]
        self.grads: list[torch.Tensor | None] = []  # this step's grads of self.params
        self.by_dtype = by_dtype
        self.state = state
        self.state_size = -1  # set after the step that built the plan has created the state
        # id(list) -> (list, positions of its params in self.params or None for all of them in
        # order, values derived from it): the lists handed to the subclasses' _update.
        self._lists: dict[int, tuple[list[torch.Tensor], list[int] | None, dict[Any, Any]]] = {}
        for params in by_dtype.values():
            self.register(params)

    def valid_for(self, state: dict, grads: list[torch.Tensor | None]) -> bool:
        params = self.group["params"]
        return (
            state is self.state
            and len(state) == self.state_size
            and len(params) == len(self.params)
            and all(map(operator.is_, params, self.params))
            and [g is not None for g in grads] == self.has_grad
        )

    def register(self, params: list[torch.Tensor]) -> None:
        """Make ``params`` (some of the group's params) a list whose derived values are kept."""
        if len(params) == len(self.params) and all(map(operator.is_, params, self.params)):
            positions = None
        else:
            index = {id(p): i for i, p in enumerate(self.params)}
            positions = [index[id(p)] for p in params]
        self._lists[id(params)] = (params, positions, {})

    def _entry(self, params: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int] | None, dict[Any, Any]] | None:
        entry = self._lists.get(id(params))
        return entry if entry is not None and entry[0] is params else None

    def memo(self, params: list[torch.Tensor]) -> dict[Any, Any] | None:
        """The kept values of a registered list, else None."""
        entry = self._entry(params)
        return None if entry is None else entry[2]

    def grads_of(self, params: list[torch.Tensor]) -> list[torch.Tensor | None] | None:
        """This step's grads of a registered list, else None."""
        entry = self._entry(params)
        if entry is None:
            return None
        positions = entry[1]
        return self.grads if positions is None else [self.grads[i] for i in positions]


class FusedOptimizer(torch.optim.Optimizer):
    """Base class of the apex fused optimizers; subclasses implement ``_update``."""

    # Capturable optimizers keep state['step'] on the params' device, so a step needs no
    # host sync and can be recorded in a CUDA graph.
    steps_on_device: bool = False

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], set_grad_none: bool) -> None:
        self.set_grad_none = set_grad_none
        self._noop_flags: dict[torch.device, torch.Tensor] = {}
        self._zero_one: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._plans: dict[int, _GroupPlan] = {}  # by id(group)
        self._active_plan: _GroupPlan | None = None  # the plan of the group being updated
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group_params = self.param_groups[-1]["params"]
        devices = {p.device for p in group_params}
        if len(devices) > 1:
            self.param_groups.pop()  # leave the optimizer as it was before the bad group
            raise ValueError(
                f"{type(self).__name__}: a param group must keep all its params on one device, "
                f"got {sorted(map(str, devices))}; put params of each device in their own group"
            )
        if self.steps_on_device and devices:
            self._lr_tensor(self.param_groups[-1], devices.pop())

    # Private attributes that are settings, not caches: pickled with the public ones.
    _pickled_private_attributes = ("_step_supports_amp_scaling", "_initial_step")

    def __getstate__(self) -> dict[str, Any]:
        # torch.optim.Optimizer pickles only defaults, state and param_groups; the settings kept
        # as attributes (adam_w_mode, capturable, set_grad_none, ...) must survive too, or a
        # deepcopy'd or unpickled optimizer would silently run another algorithm.
        state = dict(super().__getstate__())
        for key, value in self.__dict__.items():
            if key not in state and (not key.startswith("_") or key in self._pickled_private_attributes):
                state[key] = value
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # Unpickled optimizers start with no cached flags or plans.
        self.__dict__.setdefault("_noop_flags", {})
        self.__dict__.setdefault("_zero_one", {})
        self._plans = {}
        self._active_plan = None
        # Groups loaded from a torch.optim state dict lack apex's keys (bias_correction, ...).
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Zero the grads, or drop them (``None``) when ``set_grad_none`` (or ``set_to_none``) says so."""
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One optimization step over every param that has a grad; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._step_groups()
        return loss

    def _step_groups(self) -> None:
        plans = [self._plan(group) for group in self.param_groups]
        self._prepare_step([(plan.group, plan.by_dtype) for plan in plans])
        for plan in plans:
            self._active_plan = plan
            try:
                for params in plan.by_dtype.values():
                    self._update(plan.group, params)
            finally:
                self._active_plan = None
        for plan in plans:
            plan.state_size = len(self.state)

    def _plan(self, group: dict[str, Any]) -> _GroupPlan:
        """The group's plan, holding this step's grads: the cached one while it is valid, else a new one."""
        grads = [p.grad for p in group["params"]]
        plan = self._plans.get(id(group))
        if plan is None or plan.group is not group or not plan.valid_for(self.state, grads):
            plan = _GroupPlan(group, self._params_by_dtype(group), self.state)
            live = {id(g): g for g in self.param_groups}
            self._plans = {key: p for key, p in self._plans.items() if live.get(key) is p.group}
            self._plans[id(group)] = plan
        plan.grads = grads
        return plan

    def _memo(self, params: list[torch.Tensor]) -> dict[Any, Any] | None:
        """Values derived from the launch list ``params`` kept for the next steps, or None
        when ``params`` is not a list of the plan of the group being updated."""
        return None if self._active_plan is None else self._active_plan.memo(params)

    def _kept(self, params: list[torch.Tensor], key: Any, compute: Callable[[], _Kept]) -> _Kept:
        """``compute()``, run once and kept under ``key`` while ``params`` is a launch list of the
        group being updated (see ``_memo``); run every time otherwise."""
        memo = self._memo(params)
        if memo is None:
            return compute()
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    def _prepare_step(self, buckets: list[tuple[dict[str, Any], dict[torch.dtype, list[torch.Tensor]]]]) -> None:
        """Work a step needs across all groups before any update (LAMB's global grad norm)."""

    def _update(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        """Update ``params`` (one group, one dtype, all with grads) in one kernel launch or a few."""
        raise NotImplementedError

    def _init_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        """Fill the empty ``state`` of ``param`` before its first update."""
        raise NotImplementedError

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        """The dtype ``state[key]`` of ``param`` is kept in (float32 moments of fp16 params, say)."""
        return param.dtype

    def _zeros_state(self, param: torch.Tensor, key: str) -> torch.Tensor:
        return torch.zeros_like(param, dtype=self._state_dtype(param, key), memory_format=torch.preserve_format)

    def _params_by_dtype(self, group: dict[str, Any]) -> dict[torch.dtype, list[torch.Tensor]]:
        """The group's params that have a grad, by dtype: each list becomes one launch."""
        name = type(self).__name__
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        device = None
        for param in group["params"]:
            grad = param.grad
            if grad is None:
                continue
            if grad.layout != torch.strided:
                raise RuntimeError(f"{name} does not support sparse gradients (got layout {grad.layout})")
            if param.dtype not in SUPPORTED_DTYPES:
                raise TypeError(f"{name} supports float32, float16 and bfloat16 params, got {param.dtype}")
            device = device or param.device
            if param.device != device:
                raise ValueError(
                    f"{name}: a param group must keep all its params on one device, "
                    f"got {device} and {param.device}; put params of each device in their own group"
                )
            by_dtype.setdefault(param.dtype, []).append(param)
        return by_dtype

    def _ensure_state(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        def init_missing() -> bool:
            for param in params:
                state = self.state[param]
                if not state:
                    self._init_state(group, param, state)
            return True

        self._kept(params, "state_ready", init_missing)

    def _tensor_lists(self, params: list[torch.Tensor], *state_keys: str) -> list[list[torch.Tensor]]:
        """``[grads, params, state[key] for each key]``: the tensor lists of one launch."""
        state_lists = self._kept(params, state_keys,
                                 lambda: [[self.state[p][key] for p in params] for key in state_keys])
        return [self._grads(params), params, *state_lists]

    def _grads(self, params: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The grads of ``params``; those of the group being updated were read once this step."""
        grads = None if self._active_plan is None else self._active_plan.grads_of(params)
        return [p.grad for p in params] if grads is None else grads

    def _new_step(self, param: torch.Tensor, value: float = 0.0) -> torch.Tensor:
        """A ``state['step']`` counter: a float32 scalar like torch.optim's, on the param's device
        when the optimizer is capturable, else on the CPU."""
        device = param.device if self.steps_on_device else "cpu"
        return torch.tensor(float(value), dtype=torch.float32, device=device)

    def _advance_steps(self, params: list[torch.Tensor]) -> dict[int, list[torch.Tensor]]:
        """Add one to each param's host-side step; return the params by their new step.

        Kernels take one step count per launch; params that started later (a frozen layer
        unfrozen) form their own launch.
        """
        counters = self._kept(params, "steps", lambda: self._host_step_counters(params))
        for counter in counters:
            counter.advance()
        return {counter.step: counter.params for counter in counters}

    def _host_step_counters(self, params: list[torch.Tensor]) -> list[_StepCounter]:
        """One counter per distinct current step of ``params``."""
        by_step: dict[int, list[torch.Tensor]] = {}
        for param, step in zip(params, torch.stack([self.state[p]["step"] for p in params]).tolist()):
            by_step.setdefault(int(step), []).append(param)
        counters = [
            _StepCounter(self.state, same, torch.full((len(same),), float(step), dtype=torch.float32), step)
            for step, same in by_step.items()
        ]
        if self._memo(params) is not None:  # kept: each counter's params are a launch list of their own
            for counter in counters:
                self._active_plan.register(counter.params)
        return counters

    def _advance_device_steps(self, params: list[torch.Tensor], found_inf: torch.Tensor) -> torch.Tensor:
        """Add one to each param's on-device step unless ``found_inf``; return the step as the
        kernel takes it.

        Without a host sync the steps cannot be compared, so a launch uses its first
        param's step: params updated together must have started together (apex keeps
        one step per group for the same reason).
        """
        advance = 1 - found_inf.reshape(())
        memo = self._memo(params)
        counter = None if memo is None else memo.get("steps")
        if counter is None and memo is not None and not _capturing(params[0]):
            steps = torch.stack([self.state[p]["step"] for p in params])
            counter = memo["steps"] = _StepCounter(self.state, params, steps, None)
        if counter is not None:
            counter.advance(advance)
            return counter.first
        steps = [self.state[p]["step"] for p in params]
        # The tensor-list overload, as torch's fused Adam does: the single-tensor overload
        # was refused inside a CUDA graph capture (torch 2.11, H100).
        torch._foreach_add_(steps, [advance] * len(steps))
        return steps[0]

    def _noop_flag(self, device: torch.device) -> torch.Tensor:
        """The int32 ``[1]`` flag kernels read (skip) or set (overflow), one per device."""
        flag = self._noop_flags.get(device)
        if flag is None:
            flag = self._noop_flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return flag

    def _amp_scaling(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(found_inf, scale, inv_scale)``, float32 ``[1]`` on ``device``.

        ``torch.amp.GradScaler`` sets ``grad_scale`` and ``found_inf`` on optimizers with
        ``_step_supports_amp_scaling`` instead of unscaling the grads itself; without a
        scaler the grads are taken as they are.
        """
        if device not in self._zero_one:
            self._zero_one[device] = tuple(torch.full((1,), v, dtype=torch.float32, device=device) for v in (0.0, 1.0))
        zeros, ones = self._zero_one[device]
        found_inf = getattr(self, "found_inf", None)
        found_inf = zeros if found_inf is None else found_inf.to(device=device, dtype=torch.float32).reshape(1)
        scale = getattr(self, "grad_scale", None)
        if scale is None:
            return found_inf, ones, ones
        scale = scale.to(device=device, dtype=torch.float32).reshape(1)
        return found_inf, scale, scale.double().reciprocal().float()

    def _lr_tensor(self, group: dict[str, Any], device: torch.device) -> torch.Tensor:
        """The group's lr as a float32 tensor on ``device``, stored back so that a captured
        graph reads the live value (change it with ``group['lr'].fill_(new_lr)``)."""
        lr = group["lr"]
        if not isinstance(lr, torch.Tensor) or lr.device != device or lr.dtype != torch.float32:
            lr = group["lr"] = torch.as_tensor(lr, dtype=torch.float32, device=device)
        return lr

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._plans = {}
        super().load_state_dict(state_dict)
        # torch.optim cast every floating state tensor to its param's dtype, which rounds
        # float32 state kept for fp16/bf16 params: cast again from the saved values, and
        # place step counters where this optimizer counts them.
        saved_ids = chain.from_iterable(group["params"] for group in state_dict["param_groups"])
        params = chain.from_iterable(group["params"] for group in self.param_groups)
        for param_id, param in zip(saved_ids, params):
            state = self.state[param]
            for key, value in state_dict["state"].get(param_id, {}).items():
                if key == "step":
                    state[key] = self._new_step(param, float(value))
                elif isinstance(value, torch.Tensor) and value.is_floating_point():
                    state[key] = value.to(device=param.device, dtype=self._state_dtype(param, key))
