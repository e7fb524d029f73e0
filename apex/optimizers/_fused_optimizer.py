"""What every apex fused optimizer shares.

A step updates each param group's params of one dtype (a group lives on one device) in one
``torch.ops.apex`` kernel call (a "launch"), keeps an int32 noop flag per device, counts steps in
``state['step']`` the way ``torch.optim`` does, and loads state dicts without rounding fp32 state
kept for fp16/bf16 params.

Eager steps keep each launch's lists between steps (``_Launch``): a step then costs one pass over
the grads, an identity check of the state it uses and one op call, instead of a state lookup and
a CPU op per param. Step counts live on the params' device, as views of one float32 tensor per
launch (one ``add_`` advances them all) that the kernels read per tensor, so a launch needs no
host sync and a param that started later keeps its own count. Whatever a script does to the
state between steps is honoured: replaced or reset state (``opt.state[p] = {}``,
``opt.state[p]['exp_avg'] = t``) is what the next step updates and what ``state_dict()`` saves.

Under ``torch.compile`` the step is traced instead (no graph break, as for torch.optim): dynamo
runs ``_init_group`` eagerly, as it does for torch.optim's optimizers, and the graph holds the
step-count updates and the kernel calls.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from itertools import chain
from types import ModuleType
from typing import Any, ClassVar

import torch
from torch.optim.optimizer import required

from apex._ops import ops

REDUCED_PRECISION = (torch.float16, torch.bfloat16)
SUPPORTED_DTYPES = (torch.float32, *REDUCED_PRECISION)

# Elements per CPU task of the multi-tensor kernels (NVIDIA apex's chunk; CUDA kernels tile on their own).
CHUNK_SIZE = 2048 * 32

# State lists a kernel call takes at most besides grads and params (RMSprop: square_avg,
# momentum_buffer, grad_avg; Adam: exp_avg, exp_avg_sq, master_param).
_MAX_STATES = 3


def amp_c() -> ModuleType:
    """The amp_C module (NVIDIA apex's multi-tensor functions), loaded on first use."""
    import amp_C

    return amp_C


def check_hyperparameters(
    lr: float | torch.Tensor = 0.0,
    eps: float = 0.0,
    betas: tuple[float, float] = (0.0, 0.0),
    weight_decay: float = 0.0,
    **named: float,
) -> None:
    """Raise ValueError, with torch.optim's wording, for values no optimizer accepts. NaN fails
    every check. ``lr`` may be torch.optim's ``required`` (each param group then gives its own).
    ``named`` are further non-negative values (momentum=..., alpha=...)."""
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if lr is not required and not 0.0 <= float(lr):
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for index, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {index}: {beta}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    for name, value in named.items():
        if not 0.0 <= value:
            raise ValueError(f"Invalid {name} value: {value}")


def momentum_defaults(lr: float, momentum: float, dampening: float, weight_decay: float, nesterov: bool,
                      **named: float) -> dict[str, Any]:
    """The param-group defaults of an SGD-style optimizer (FusedSGD, FusedLARS), checked as
    torch.optim.SGD checks them; ``named`` (eps=..., trust_coefficient=...) are checked as
    check_hyperparameters checks them and kept too."""
    check_hyperparameters(lr=lr, weight_decay=weight_decay, momentum=momentum, **named)
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    return dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov, **named)


def evaluate_closure(closure: Callable[[], torch.Tensor] | None) -> torch.Tensor | None:
    """The loss a step's closure returns (grad enabled inside, as torch.optim does), or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _identical(values: Iterable[Any], expected: list[Any]) -> bool:
    return all(map(operator.is_, values, expected))


class _Launch:
    """One kernel call of a step: the params of one group and dtype that have grads (each at most
    once: a param listed twice goes to a later launch), with their state.

    Per-param state the kernel takes as one float32 vector (``_STACKED``: the step counts, NovoGrad's
    grad norms) is kept as views of one tensor, so that a step advances or blends it in one op.
    Valid while the state it holds is the optimizer's: ``current()`` compares, by identity, every
    state value it took (a C-level pass) with what the per-param state dicts hold now."""

    def __init__(self, optimizer: FusedOptimizer, group: dict[str, Any], params: list[torch.Tensor],
                 positions: list[int], owns_state: bool) -> None:
        self.params = params
        self.positions = positions  # of the params in group['params'], to pick their grads
        self.owns_state = owns_state  # False for repeated params: an earlier launch holds their views
        self.grads: list[torch.Tensor] = []
        self.dtype = params[0].dtype
        self.device = params[0].device
        self.keys = optimizer._state_keys(group, self.dtype)
        self.load_state(optimizer, group)

    def load_state(self, optimizer: FusedOptimizer, group: dict[str, Any]) -> None:
        """Take the params' state, initialising empty state (those params are ``fresh``: this step
        is their first), and make the ``_STACKED`` entries views of one tensor each."""
        dicts = [optimizer.state[p] for p in self.params]
        self.fresh = tuple(i for i, state in enumerate(dicts) if optimizer._needs_init(state, self.keys))
        for i in self.fresh:
            optimizer._init_state(group, self.params[i], dicts[i])
        stacked = optimizer._stacked_keys()
        try:
            self.stacked = {key: self._stack(dicts, key) for key in stacked if self.owns_state}
            self.lists = {key: [state[key] for state in dicts] for key in self.keys if key not in stacked}
        except KeyError as missing:
            raise KeyError(f"{type(optimizer).__name__}: a param's state lacks {missing}; "
                           "reset it with `optimizer.state[p] = {}`") from None
        watched = (*self.keys, *(key for key in stacked if key not in self.keys))
        self._dicts = dicts
        self._getter = operator.itemgetter(*watched)
        self._single = len(watched) == 1
        self._watched = list(self._values())

    def _stack(self, dicts: list[dict[str, Any]], key: str) -> torch.Tensor:
        values = torch.stack([FusedOptimizer._as_scalar(state[key], self.device) for state in dicts])
        for state, view in zip(dicts, values.unbind()):
            state[key] = view
        return values

    def _values(self):
        values = map(self._getter, self._dicts)
        return values if self._single else chain.from_iterable(values)

    def current(self) -> bool:
        try:
            return _identical(self._values(), self._watched)
        except KeyError:
            return False

    def run(self, optimizer: FusedOptimizer, group: dict[str, Any]) -> None:
        """Advance the step counts and call the kernel."""
        stacked = self.stacked if self.owns_state else {
            key: torch.stack([state[key] for state in self._dicts]) for key in optimizer._stacked_keys()}
        steps = stacked.get("step")
        if steps is not None:
            by = optimizer._step_increment(self.device)
            steps.add_(1 if by is None else by)
        states = [stacked[key] if key in stacked else self.lists[key] for key in self.keys]
        optimizer._launch(group, self.params, self.grads, states, steps, self.fresh)
        self.fresh = ()
        if not self.owns_state:  # repeated params: the counts and norms of an earlier launch's views
            for key, values in stacked.items():
                torch._foreach_copy_([state[key] for state in self._dicts], list(values.unbind()))


class _GroupPlan:
    """A param group's launches, kept between eager steps while the group holds the same params
    and the same of them have grads."""

    def __init__(self, optimizer: FusedOptimizer, group: dict[str, Any], has_grad: list[bool]) -> None:
        self.group = group
        self.params = list(group["params"])
        self.has_grad = has_grad
        self.launches = [
            _Launch(optimizer, group, params, positions, owns_state=round_ == 0)
            for round_, params, positions in optimizer._split_launches(group, has_grad)
        ]

    def valid_for(self, group: dict[str, Any], has_grad: list[bool]) -> bool:
        params = group["params"]
        return (group is self.group and len(params) == len(self.params) and _identical(params, self.params)
                and has_grad == self.has_grad)


class FusedOptimizer(torch.optim.Optimizer):
    """Base class of the apex fused optimizers.

    Subclasses set ``_STATE`` (the per-param state lists their kernel takes, in order) and
    implement ``_launch`` (one kernel call); ``_init_state`` / ``_state_dtype`` / ``_state_keys``
    when the defaults (zeros of the param's dtype, ``_STATE``) do not fit.
    """

    _STATE: ClassVar[tuple[str, ...]] = ()
    _COUNTS_STEPS: ClassVar[bool] = True  # keeps state['step'], as torch.optim's counterpart does
    # Per-param scalar state the kernel takes as one float32 vector (besides the step counts).
    _STACKED: ClassVar[tuple[str, ...]] = ()
    # A step that found an overflow (GradScaler's found_inf) leaves the step counts alone.
    _steps_skip_on_overflow: bool = False
    # Capturable optimizers keep a float lr as a tensor on the params' device, so that a captured
    # CUDA graph reads its live value (change it in place: group['lr'].fill_(new_lr)).
    _lr_on_device: bool = False

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], set_grad_none: bool) -> None:
        self.set_grad_none = set_grad_none
        self._noop_flags: dict[torch.device, torch.Tensor] = {}
        self._constants: dict[tuple, torch.Tensor] = {}
        self._lr_tensors: dict[int, list] = {}  # id(group) -> [value, CPU tensor of it]
        self._plans: dict[int, _GroupPlan] = {}  # by id(group)
        self._state_seen: tuple[Any, list[Any]] | None = None
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        # A group mixing devices is accepted here and refused by step(), as NVIDIA apex does (its
        # tests build such an optimizer and expect the step to raise).
        group = self.param_groups[-1]
        if self._lr_on_device and group["params"] and not isinstance(group["lr"], torch.Tensor):
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=group["params"][0].device)

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
        self.__dict__.setdefault("_constants", {})
        self.__dict__.setdefault("_lr_tensors", {})
        self._plans = {}
        self._state_seen = None
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
        loss = evaluate_closure(closure)
        if torch.compiler.is_compiling():
            self._traced_step()
        else:
            self._eager_step()
        return loss

    # ---- what subclasses provide ---------------------------------------------------------------

    def _state_keys(self, group: dict[str, Any], dtype: torch.dtype) -> tuple[str, ...]:
        """The state lists a launch of ``dtype`` params takes, in the kernel's order."""
        return self._STATE

    def _init_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        """Fill what ``state`` lacks before ``param``'s first update (all of it for a new param)."""
        if self._COUNTS_STEPS and state.get("step") is None:
            state["step"] = self._new_step(param)
        for key in self._state_keys(group, param.dtype):
            if state.get(key) is None:
                state[key] = self._initial_state(group, param, key)

    def _initial_state(self, group: dict[str, Any], param: torch.Tensor, key: str) -> torch.Tensor:
        """The value ``state[key]`` of a new param starts from: zeros by default."""
        return self._zeros_state(param, key)

    def _prime_state(self, group: dict[str, Any], param: torch.Tensor, state: dict[str, Any]) -> None:
        """Under torch.compile: make new ``state`` give the first step's result through the
        kernel's every-step formula (a compiled graph has no first-step branch of its own);
        ``param.grad`` is that step's grad."""

    @staticmethod
    def _needs_init(state: dict[str, Any], keys: tuple[str, ...]) -> bool:
        """Empty state (new, or reset with ``optimizer.state[p] = {}``), or a state list entry left
        None (torch.optim.SGD's momentum_buffer without momentum)."""
        return not state or any(state.get(key) is None for key in keys)

    def _state_dtype(self, param: torch.Tensor, key: str) -> torch.dtype:
        """The dtype ``state[key]`` of ``param`` is kept in (float32 moments of fp16 params, say)."""
        return param.dtype

    def _launch(self, group: dict[str, Any], params: list[torch.Tensor], grads: list[torch.Tensor],
                states: list[Any], steps: torch.Tensor | None, fresh: tuple[int, ...]) -> None:
        """Update ``params`` (one group, one dtype, all with grads) in one kernel call. ``states``
        follow ``_state_keys`` (lists of tensors; ``_STACKED`` keys: a float32 vector, or under
        torch.compile the list of scalars); ``steps`` (float32 [n], already advanced) are the
        step counts; ``fresh`` the positions of params whose state this step initialised."""
        raise NotImplementedError

    def _stacked_keys(self) -> tuple[str, ...]:
        return (("step",) if self._COUNTS_STEPS else ()) + self._STACKED

    def _prepare_step(self, launches: list[tuple[dict[str, Any], list[torch.Tensor]]]) -> None:
        """Work a step needs across all groups before any update (LAMB's global grad norm);
        ``launches`` are (group, grads) of every launch of this step."""

    # ---- the eager step ------------------------------------------------------------------------

    def _eager_step(self) -> None:
        self._forget_plans_if_state_changed()
        work = []
        for group in self.param_groups:
            grads = [p.grad for p in group["params"]]
            plan = self._plan(group, grads)
            for launch in plan.launches:
                launch.grads = [grads[i] for i in launch.positions]
                keys = self._state_keys(group, launch.dtype)
                if keys != launch.keys or not launch.current():  # state replaced, or settings changed
                    launch.keys = keys
                    launch.load_state(self, group)
                work.append((group, launch))
        self._prepare_step([(group, launch.grads) for group, launch in work])
        for group, launch in work:
            launch.run(self, group)
        self._state_seen = (self.state, list(self.state.values()))

    def _forget_plans_if_state_changed(self) -> None:
        """Drop every launch list when the state mapping changed since the last step (a param's
        state dict replaced or removed, the state cleared or loaded)."""
        seen = self._state_seen
        if seen is not None and (seen[0] is not self.state or len(seen[1]) != len(self.state)
                                 or not _identical(self.state.values(), seen[1])):
            self._plans = {}

    def _plan(self, group: dict[str, Any], grads: list[torch.Tensor | None]) -> _GroupPlan:
        has_grad = [g is not None for g in grads]
        plan = self._plans.get(id(group))
        if plan is None or not plan.valid_for(group, has_grad):
            plan = _GroupPlan(self, group, has_grad)
            live = {id(g): g for g in self.param_groups}
            self._plans = {key: p for key, p in self._plans.items() if live.get(key) is p.group}
            self._plans[id(group)] = plan
        return plan

    def _split_launches(self, group: dict[str, Any], has_grad: list[bool]):
        """(round, params, positions) of each launch of a group: one per dtype, and a param listed
        n times is in n successive rounds (updated n times per step, as torch.optim's for-loop does)."""
        name = type(self).__name__
        launches: dict[tuple[int, torch.dtype], tuple[list[torch.Tensor], list[int]]] = {}
        seen: dict[int, int] = {}
        device = None
        for position, (param, present) in enumerate(zip(group["params"], has_grad)):
            if not present:
                continue
            grad = param.grad
            if grad.layout != torch.strided:
                raise RuntimeError(f"{name} does not support sparse gradients (got layout {grad.layout})")
            if param.dtype not in SUPPORTED_DTYPES:
                raise TypeError(f"{name} supports float32, float16 and bfloat16 params, got {param.dtype}")
            device = device or param.device
            if param.device != device:
                raise RuntimeError(
                    f"{name}: a param group's params are not on the same device ({device} and "
                    f"{param.device}): a group must keep all its params on one device; put params of "
                    "each device in their own group"
                )
            round_ = seen.get(id(param), 0)
            seen[id(param)] = round_ + 1
            params, positions = launches.setdefault((round_, param.dtype), ([], []))
            params.append(param)
            positions.append(position)
        return [(round_, params, positions) for (round_, _), (params, positions) in sorted(
            launches.items(), key=lambda item: item[0][0])]

    # ---- the traced step (torch.compile) -------------------------------------------------------

    def _traced_step(self) -> None:
        """The step as dynamo traces it: _init_group runs eagerly (dynamo intercepts it, as for
        torch.optim's optimizers) and returns the launches as constants; the graph advances the
        step counts and calls the kernels."""
        work = []
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            steps: list[torch.Tensor] = []
            first: list[torch.Tensor] = []
            second: list[torch.Tensor] = []
            third: list[torch.Tensor] = []
            launches = self._init_group(group, params, grads, steps, first, second, third)
            states = (first, second, third)
            for indices, state_count in launches:
                work.append((group, [params[i] for i in indices], [grads[i] for i in indices],
                             [[state[i] for i in indices] for state in states[:state_count]],
                             [steps[i] for i in indices] if steps else None))
        self._prepare_step([(group, grads) for group, _, grads, _, _ in work])
        for group, params, grads, states, counts in work:
            step_tensor = None
            if counts is not None:
                by = self._step_increment(params[0].device)
                torch._foreach_add_(counts, [1 if by is None else by] * len(counts))
                step_tensor = torch.stack(counts)
            # The graph serves every later step too: state it initialised was primed instead.
            self._launch(group, params, grads, states, step_tensor, ())

    def _init_group(self, group: dict[str, Any], params: list, grads: list, steps: list, *states: list):
        """Fill the lists with one group's params that have grads, their grads, step counts and
        state lists (initialising and priming state); return ((indices, number of state lists),
        ...) per launch. Under torch.compile dynamo runs this eagerly, once per compiled graph;
        what it returns depends only on what dynamo guards (which params have grads, their dtypes)."""
        launches = []
        stacked = self._stacked_keys()
        for _, launch_params, _ in self._split_launches(group, [p.grad is not None for p in group["params"]]):
            device = launch_params[0].device
            # Created now, so that the traced step only reads them.
            self._noop_flag(device)
            self._constant(0.0, device), self._constant(1.0, device), self._constant(1.0)
            keys = self._state_keys(group, launch_params[0].dtype)
            start = len(params)
            for param in launch_params:
                state = self.state[param]
                if self._needs_init(state, keys):
                    self._init_state(group, param, state)
                    self._prime_state(group, param, state)
                for key in stacked:
                    value = state[key]
                    if not isinstance(value, torch.Tensor) or value._base is not None or value.device != device:
                        # Stand-alone scalars: views of an eager launch's tensor would alias graph inputs.
                        state[key] = self._as_scalar(value, device).clone()
                params.append(param)
                grads.append(param.grad)
                if self._COUNTS_STEPS:
                    steps.append(state["step"])
                for key, out in zip(keys, states):
                    out.append(state[key])
            launches.append((tuple(range(start, len(params))), len(keys)))
        return tuple(launches)

    # ---- shared pieces ---------------------------------------------------------------------------

    def _step_increment(self, device: torch.device) -> torch.Tensor | None:
        """What the step counts advance by: 1 (None), or 0 on a step GradScaler found an overflow in."""
        if not self._steps_skip_on_overflow:
            return None
        return (1 - self._amp_scaling(device)[0]).reshape(())

    def _zeros_state(self, param: torch.Tensor, key: str) -> torch.Tensor:
        return torch.zeros_like(param, dtype=self._state_dtype(param, key), memory_format=torch.preserve_format)

    def _new_step(self, param: torch.Tensor, value: float = 0.0) -> torch.Tensor:
        """A ``state['step']`` count: a float32 scalar like torch.optim's, on the param's device."""
        return torch.tensor(float(value), dtype=torch.float32, device=param.device)

    @staticmethod
    def _as_scalar(value: Any, device: torch.device) -> torch.Tensor:
        return torch.as_tensor(value, dtype=torch.float32, device=device).reshape(())

    def _noop_flag(self, device: torch.device) -> torch.Tensor:
        """The int32 ``[1]`` flag kernels read (skip) or set (overflow), one per device."""
        flag = self._noop_flags.get(device)
        if flag is None:
            flag = self._noop_flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return flag

    def _constant(self, value: float, device: torch.device | str = "cpu") -> torch.Tensor:
        """A float32 ``[1]`` tensor of ``value`` (kept: a step creates none)."""
        key = (value, str(device))
        tensor = self._constants.get(key)
        if tensor is None:
            tensor = self._constants[key] = torch.full((1,), value, dtype=torch.float32, device=device)
        return tensor

    def _lr(self, group: dict[str, Any]) -> torch.Tensor:
        """The group's lr as kernels take it: the tensor itself if it is one, else a CPU scalar
        the op reads when called (one per group, refilled when a scheduler changes the value)."""
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            return lr
        if torch.compiler.is_compiling():
            return torch.tensor([lr], dtype=torch.float32)
        kept = self._lr_tensors.get(id(group))
        if kept is None:
            kept = self._lr_tensors[id(group)] = [None, torch.empty(1, dtype=torch.float32)]
        if kept[0] != lr:
            kept[1].fill_(lr)
            kept[0] = lr
        return kept[1]

    def _amp_scaling(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(found_inf, scale, inv_scale)``, float32 ``[1]`` on ``device``.

        ``torch.amp.GradScaler`` sets ``grad_scale`` and ``found_inf`` on optimizers with
        ``_step_supports_amp_scaling`` instead of unscaling the grads itself; without a
        scaler the grads are taken as they are.
        """
        zeros, ones = self._constant(0.0, device), self._constant(1.0, device)
        found_inf = getattr(self, "found_inf", None)
        found_inf = zeros if found_inf is None else found_inf.to(device=device, dtype=torch.float32).reshape(1)
        scale = getattr(self, "grad_scale", None)
        if scale is None:
            return found_inf, ones, ones
        scale = scale.to(device=device, dtype=torch.float32).reshape(1)
        return found_inf, scale, scale.double().reciprocal().float()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._plans = {}
        super().load_state_dict(state_dict)
        # torch.optim cast every floating state tensor to its param's dtype, which rounds
        # float32 state kept for fp16/bf16 params: cast again from the saved values, and
        # place step counts where this optimizer counts them.
        saved_ids = chain.from_iterable(group["params"] for group in state_dict["param_groups"])
        params = chain.from_iterable(group["params"] for group in self.param_groups)
        for param_id, param in zip(saved_ids, params):
            state = self.state[param]
            for key, value in state_dict["state"].get(param_id, {}).items():
                if key == "step":
                    state[key] = self._new_step(param, float(value))
                elif isinstance(value, torch.Tensor) and value.is_floating_point():
                    state[key] = value.to(device=param.device, dtype=self._state_dtype(param, key))
