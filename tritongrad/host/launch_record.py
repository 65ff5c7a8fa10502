"""The launch record: what an op's forward launched, checked once per kind of call.

Recording: inside an op, each launch reaches the current launch record (``current_record``) through the
hooks on Triton's launch entry points (hooks.py), which ``LaunchRecord.launch`` records and runs: as its
augmented forward where the backward reads the state that keeps (augment.py), else as it is.

Plans: the checks ``LaunchRecord.close`` makes and the shadow layout depend only on which
kernels were launched, how their arguments were passed, and each tensor's dtype, sizes,
strides, offset, device, ``requires_grad`` and which others share its storage. Each
call reduces those to a key (storages numbered in order of appearance, not by address:
``CallTensors``); the first call with a key runs the checks and lays out the backward
(planning.py: a ``shadows.Plan``), later calls with that key reuse it. The hot path reads
tensor metadata only: no AST work and nothing that waits for the device; on a GPU a launch
made before with the same recorded arguments calls its compiled kernel directly (relaunch.py).
The backward itself is backward.py's. A named op's later calls of a kind seen before skip the launch record:
replay.py compares their launches with the first call's as they run.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..analysis.in_place import as_left_param
from ..core.bounded import Bounded
from ..core.device import ensure_allocator, tracing
from ..core.errors import OpError
from ..runtime import relaunch
from ..runtime.augment import SavedStates, keeping
from ..runtime.derivation import decisive_constexprs, hashable
from .aliases import alias_view
from .backward import PlannedBackward, derive_ahead, recording_backward
from .call_tensors import CallTensors, nested_tensors
from .configs import Tiles
from .host_descriptors import descriptor_view, has_host_descriptors
from .kernel_roles import KernelInfo, kernel_info, kernel_infos, read_as_left
from .planning import Planner
from .shadows import Plan, launch_name

# the LaunchRecord recording launches (None outside an op; hooks.py's DRY or Launches while a named op's host function
# runs without a launch record)
current_record: contextvars.ContextVar[Any] = contextvars.ContextVar("tritongrad_launch_record", default=None)
# the autotuner whose chosen config is being launched inside an op, with its arguments (Tiles.of)
current_autotuner: contextvars.ContextVar[Any] = contextvars.ContextVar("tritongrad_autotuned", default=None)

MAX_PLANS = 256  # per op; an op called with ever new shapes keeps the newest ones
_UNREAD_COPIES = ("copies no derived kernel reads",)  # the op's plans' entry: kind of launch -> such parameters
# a forward launch's recorded arguments -> its relaunch.Relauncher (a call site has few kinds of launch)
_relaunchers: dict[tuple, Any] = Bounded()
# launch patterns (see RecordedLaunch) passing tensors to every pointer (few per call site)
_pointers_checked = Bounded()


# Triton's refusal of a float-only operation's integer operand, and the torch dtypes of its type names
_EXPECTED_DTYPE = re.compile(r"Expected dtype (\[[^\]]*\]) but got (u?int\d+)")
_TRITON_NAMES = {"int1": (torch.bool,), "int8": (torch.int8,), "int16": (torch.int16,), "int32": (torch.int32,),
                 "int64": (torch.int64,), "uint8": (torch.uint8,)}


# -- launches --------------------------------------------------------------------------------------


def _by_parameter(info: KernelInfo, positions: tuple, names: tuple) -> dict[str, int | None]:
    """A recorded launch's arguments by parameter: the position of each tensor among the call's tensors."""
    n = len(positions) - len(names)
    return info.named_arguments(positions[:n], dict(zip(names, positions[n:], strict=True)))[0]


def copy_of(v: torch.Tensor) -> torch.Tensor:
    """A copy of the memory a view spans, as a view with its strides (so a backward indexes it as the launch indexed the
    original)."""
    span = 1 + sum((n - 1) * st for n, st in zip(v.shape, v.stride(), strict=True)) if v.numel() else 0
    with torch.no_grad():
        memory = v.as_strided((span,), (1,), v.storage_offset()).clone()
    return memory.as_strided(v.shape, v.stride(), 0)


class RecordedLaunch:
    """One recorded launch: the jit-level kernel, its grid, and its arguments as passed, with
    tensors replaced by None (the record holds no tensors once closed: outputs would otherwise
    hold themselves alive). Its pattern (``LaunchRecord.patterns``): the kernel's function, per
    argument (positional, then keyword) the position of its tensor among the call's tensors
    (None for a non-tensor), and the keywords.
    """

    __slots__ = ("kernel", "info", "index", "grid", "args", "kwargs", "saved", "tiles")

    def __init__(self, kernel: Any, info: KernelInfo, index: int, grid: tuple, args: tuple, kwargs: dict,
                 tiles: Tiles | None = None):
        self.kernel, self.info, self.index, self.grid, self.args, self.kwargs = kernel, info, index, grid, args, kwargs
        self.saved: SavedStates | None = None  # the state tapes its forward kept for its backward (augment.py)
        self.tiles = tiles  # the configs its backward may be launched with instead of its own (configs.py)

    def __str__(self) -> str:
        return launch_name(self.index, self.info)


class LaunchRecord:
    """The launches of one call of an op, and the backward that differentiates them.

    ``plans``: the op's plans by key, shared by its calls (a fresh dict: nothing is reused).
    """

    plan: Plan | None = None  # set by close
    key: tuple | None = None  # set by close: the call's key (replay.py learns a replay from it)
    boundary: Any = None  # a bare op's segments.Segments, told of each launch
    saved: list[torch.Tensor] | None = None  # set by close, taken by the autograd node
    taken: dict | None = None  # (launch index, parameter) -> its copy, taken before a replay ran it (replay.py)

    def __init__(self, name: str, plans: dict | None = None, deterministic: bool = False):
        self.name = name
        self.deterministic = deterministic  # derived kernels without atomic additions
        self.plans = {} if plans is None else plans
        self.launches: list[RecordedLaunch] = []
        self.patterns: list[tuple] = []  # per launch: what the plan's key takes from it (see RecordedLaunch)
        self.tensors: CallTensors | None = CallTensors()  # until closed: the tensors launches were passed
        self.copy_keys: dict[int, tuple] = {}  # launch index -> what decides which copies an in-place launch needs
        self.placeholders: set[int] = set()  # positions of the empty tensors standing for copies not needed

    def recording(self) -> LaunchRecord:
        """``with record.recording():`` records the launches in the block."""
        return self

    def __enter__(self) -> LaunchRecord:  # methods, not a generator-based context manager: on every call's path
        self._token = current_record.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        current_record.reset(self._token)

    def error(self, message: str) -> OpError:
        return OpError(f"tritongrad.op `{self.name}`: {message}")

    # -- forward ------------------------------------------------------------------------------------

    def record(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> None:
        info = kernel_infos.get(kernel.fn) or kernel_info(kernel)
        tensors, index = self.tensors, len(self.launches)
        positions, kept = tensors.take((*args, *kwargs.values()) if kwargs else args)
        snapshots = self._snapshots(kernel, info, args, kwargs, positions) if info.roles is not None and \
            info.roles.in_place else ()
        earlier = self._save_overwritten(info, positions, tuple(kwargs)) if self.launches and info.roles else ()
        pattern = (kernel.fn, positions, tuple(kwargs), snapshots, earlier)  # fn: JITFunction.__hash__ is Python
        if tensors.mixed or (tensors.on_cpu and not info.interpreted and not tracing()):  # (traced: not run here)
            self._check_devices(index, info, args, kwargs)
        if pattern not in _pointers_checked and self._check_pointers(index, info, args, kwargs, positions):
            _pointers_checked.add(pattern)
        tiles = Tiles.of(kernel, grid, info, args, kwargs, current_autotuner.get())
        if callable(grid):
            grid = grid(info.with_defaults(args, kwargs))
        n = len(args)
        if kwargs:
            if positions[n:].count(None) != len(kwargs):  # kwargs is a dict of our own (**kwargs): kept
                kwargs = dict(zip(kwargs, kept[n:], strict=True))  # unless it holds tensors
            kept = kept[:n]
        self.launches.append(RecordedLaunch(kernel, info, index, tuple(grid), kept, kwargs, tiles))
        self.patterns.append(pattern)

    def written_by_last(self) -> list[torch.Tensor]:
        """The tensors the latest launch was passed to pointers it stores through (every one, where what it does
        with them is unknown): a bare op's segments (ops/segments.py) watch their memory."""
        launch, (_, positions, names, *_) = self.launches[-1], self.patterns[-1]
        roles, tensors = launch.info.roles, self.tensors.tensors
        return [tensors[i] for p, i in _by_parameter(launch.info, positions, names).items()
                if i is not None and (roles is None or p in roles.stores)]

    def launch(self, run: Callable, kernel: Any, grid: Any, args: tuple, kwargs: dict, warmup: bool) -> Any:
        """Record a launch and run it: as its augmented forward where the backward can read the state tapes
        that keeps (augment.py; the state tapes stay with the recorded launch), else as it is. A launch with host
        tensor descriptors is recorded as its kernel's descriptor view's (host_descriptors.py), one passing a buffer
        to a pointer it loads and to one it stores as its alias view's (aliases.py). Triton's refusal
        of an integer tensor where the kernel computes in floating point is raised again naming the argument."""
        try:
            return self._launch(run, kernel, grid, args, kwargs, warmup)
        except Exception as e:
            found = self._not_float(e, kernel, args, kwargs)
            if found is None:
                raise
            raise found from e

    def _not_float(self, e: Exception, kernel: Any, args: tuple, kwargs: dict) -> OpError | None:
        """Triton's "Expected dtype [fp32, fp64] but got int64" (a float-only operation, ``tl.sin``, on values
        loaded from an integer tensor), which names no argument, as an error naming the arguments of that dtype."""
        got = _EXPECTED_DTYPE.search(str(e))
        info = kernel_infos.get(getattr(kernel, "fn", None))
        if got is None or info is None:
            return None
        named, _ = info.named_arguments(args, kwargs)
        params = [p for p, v in named.items() if isinstance(v, torch.Tensor) and v.dtype in _TRITON_NAMES.get(
            got.group(2), ())]
        if not params:
            return None
        passed = ", ".join(f"`{p}` ({named[p].dtype})" for p in params)
        return self.error(f"{launch_name(len(self.launches) - 1, info)} computes in floating point where it was "
                          f"passed {got.group(2)} values: {passed}. Pass a floating-point tensor there "
                          f"(`.to(torch.float32)`), or convert in the kernel (`.to(tl.float32)`). Triton: expected "
                          f"{got.group(1)}, got {got.group(2)}")

    def _launch(self, run: Callable, kernel: Any, grid: Any, args: tuple, kwargs: dict, warmup: bool) -> Any:
        as_launched = None
        if has_host_descriptors(args, kwargs):
            as_launched = (kernel, args, kwargs)
            kernel, args, kwargs = descriptor_view(kernel, args, kwargs)
        else:
            info = kernel_infos.get(kernel.fn) or kernel_info(kernel)
            view = alias_view(kernel, info, args, kwargs) if info.roles is not None else None
            if view is not None:  # one buffer loaded and stored through two names: an update in place
                as_launched, kernel = (kernel, args, kwargs), view
        self.record(kernel, grid, args, kwargs)
        launch = self.launches[-1]
        if launch.info.roles is not None and launch.info.loops:
            named = launch.info.with_defaults(args, kwargs)
            found = keeping(kernel, named, launch.grid)
            if found is not None:
                augmented_kernel, extra, launch.saved = found
                if as_launched is not None:  # (the view makes its descriptors in the kernel)
                    ensure_allocator()
                return run(augmented_kernel, *args, grid=grid, warmup=warmup, **kwargs, **extra)
        if as_launched is not None:
            kernel, args, kwargs = as_launched
            return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)
        if relaunch.supported():
            return self._relaunch(run, kernel, launch, args, kwargs)
        return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)

    def _relaunch(self, run: Callable, kernel: Any, launch: RecordedLaunch, args: tuple, kwargs: dict) -> Any:
        """The launch through the kernel's ``relaunch.Relauncher`` for its recorded arguments: the non-tensor
        values (and their types), the tensors' positions and dtypes and the grid, all of what Triton specializes
        on but the tensors' alignment, which the Relauncher keys its compiled kernels on."""
        pattern, described = self.patterns[-1], self.tensors.described
        grid = launch.grid

        def through_triton() -> Any:
            return run(kernel, *args, grid=grid, warmup=False, **kwargs)

        try:
            key = (id(kernel), grid, pattern[1], pattern[2], launch.args, tuple(map(type, launch.args)),
                   tuple(launch.kwargs.values()), tuple(map(type, launch.kwargs.values())),
                   tuple([described[i][1] for i in pattern[1] if i is not None]))
            relauncher = _relaunchers.get(key)
        except TypeError:  # an unhashable argument
            return through_triton()
        if relauncher is None or relauncher.kernel is not kernel:
            if not relaunch.plain_values((*launch.args, *launch.kwargs.values())):  # compared by identity: another
                return through_triton()  # object on each call, never seen again
            relauncher = _relaunchers[key] = relaunch.Relauncher(kernel, grid)
        named = launch.info.launch_arguments(args, kwargs)
        return relauncher(named, through_triton)

    def _snapshots(self, kernel: Any, info: KernelInfo, args: tuple, kwargs: dict,
                   positions: tuple) -> tuple[tuple[str, int], ...]:
        """Copies of the tensors a launch updates in place, taken before it runs: its backward recomputes against
        the values it read. Each copies the memory its view spans, so strides and offsets stay as passed; where
        an earlier call of this kind showed that no derived kernel reads a copy (a rotation's backward reads only
        its angles), an empty placeholder stands in for it (``_learn_unread_copies``). None of a tensor whose loads
        read only elements the launch does not store (``kernel_roles.read_as_left``: an early return's stores):
        its backward reads it as the launch left it (planning.py saves it).
        Returns (parameter, the copy's position among the call's tensors) pairs."""
        named = info.with_defaults(args, kwargs)
        tensors = self.tensors
        key = (kernel.fn, len(self.launches), positions,
               tuple(tensors.requires_grad(i) for i in positions if i is not None),
               tuple(hashable(named.get(k)) for k in decisive_constexprs(kernel)))
        unread = self.plans.get(_UNREAD_COPIES, {}).get(key, ())
        self.copy_keys[len(self.launches)] = key
        as_left = read_as_left(kernel, named)
        found = []
        for p in info.roles.in_place - as_left:
            if isinstance(v := named.get(p), torch.Tensor):
                if p in unread:
                    found.append((p, tensors.take((torch.empty(0, dtype=v.dtype, device=v.device),))[0][0]))
                    self.placeholders.add(found[-1][1])
                elif self.taken and (copied := self.taken.get((len(self.launches), p))) is not None:
                    found.append((p, tensors.take((copied,))[0][0]))
                else:
                    found.append((p, self._copy(v)))
        return tuple(sorted(found))

    def _learn_unread_copies(self, plan: Plan) -> None:
        """After ``derive_ahead``: the copies no derived kernel read, kept per kind of launch for the op's later
        calls (``_snapshots``); a placeholder a derived kernel reads is refused (it would read no values)."""
        read = {plan.saved[slot] for slot in range(len(plan.saved)) if slot not in plan.unused}
        if read & self.placeholders:
            raise self.error("a derived kernel reads the values a launch updated in place had before it ran, which "
                             "an earlier call of this kind showed it did not: tritongrad kept no copy of them. This "
                             "is tritongrad's fault: please report it")
        memo = self.plans.setdefault(_UNREAD_COPIES, {})
        for index, key in self.copy_keys.items():
            unread = frozenset(p for p, position in self.patterns[index][3] if position not in read)
            if unread and len(memo) < MAX_PLANS:
                memo[key] = unread

    def _save_overwritten(self, info: KernelInfo, positions: tuple, names: tuple) -> tuple[tuple[int, str, int], ...]:
        """Copies of what earlier launches read from memory this launch overwrites, taken before it runs: their
        backwards recompute against the values they read (an in-place launch that read back what it stored: the
        tensor as it left it, under its backward's parameter for that, analysis/in_place.py's ``as_left_param``).
        Returns (launch index, parameter, the copy's position) triples."""
        described, tensors = self.tensors.described, self.tensors.tensors
        written = {described[i][0] for p, i in _by_parameter(info, positions, names).items()
                   if i is not None and p in info.roles.overwrites}
        written.discard(0)
        if not written:
            return ()
        copied = {(k, p) for pattern in self.patterns for k, p, _ in pattern[4]}
        found = []
        for launch, pattern in zip(self.launches, self.patterns, strict=True):
            roles, own = launch.info.roles, dict(pattern[3])
            if roles is None:
                continue
            for p, i in _by_parameter(launch.info, pattern[1], pattern[2]).items():
                if i is None or described[i][0] not in written:
                    continue
                if p in roles.loads and p not in own and (launch.index, p) not in copied:
                    found.append((launch.index, p, self._copy(tensors[i])))
                if p in roles.reloaded and (launch.index, q := as_left_param(p, launch.info.params)) not in copied:
                    found.append((launch.index, q, self._copy(tensors[i])))
        return tuple(found)

    def _copy(self, v: torch.Tensor) -> int:
        """``copy_of(v)``, its position among the call's tensors."""
        return self.tensors.take((copy_of(v),))[0][0]

    def _check_devices(self, index: int, info: KernelInfo, args: tuple, kwargs: dict) -> None:
        """Refuse, before the kernel runs, tensors on another device than the op's first, or on the
        CPU for a compiled kernel."""
        for p, v in (*zip(info.params, args, strict=False), *kwargs.items()):
            if isinstance(v, torch.Tensor):
                self._check_device(launch_name(index, info), info, p, v)

    def _check_pointers(self, index: int, info: KernelInfo, args: tuple, kwargs: dict, positions: tuple) -> bool:
        """Refuse, before the kernel runs, non-tensors passed as pointers (None is allowed).
        Returns whether every pointer is a tensor: then any launch with this pattern passes."""
        names = (*info.params, *[None] * len(args))[:len(args)] + tuple(kwargs)  # None: past the parameters
        all_tensors = True
        for p, v, i in zip(names, (*args, *kwargs.values()), positions, strict=True):
            if i is None and p in info.pointers:
                if v is not None:
                    raise self._not_a_pointer(launch_name(index, info), p, v)
                all_tensors = False
        return all_tensors

    def _not_a_pointer(self, launch: str, p: str, v: Any) -> TypeError:
        return TypeError(f"tritongrad.op `{self.name}`: {launch} passes {type(v).__name__} {v!r} to `{p}`, which the "
                         "kernel uses as a pointer; pass a tensor")

    def _check_device(self, launch: str, info: KernelInfo, param: str, t: torch.Tensor) -> None:
        if t.device.type == "cpu" and not info.interpreted:
            raise self.error(f"{launch} passes a CPU tensor to `{param}`; move it to the GPU "
                             f"(CPU tensors run only under TRITON_INTERPRET=1)")
        if t.device != self.tensors.device:
            raise self.error(f"{launch} passes a tensor on {t.device} to `{param}`, but the op's tensors are on "
                             f"{self.tensors.device}; put them on one device")

    def close(self, outputs: tuple, args: tuple, kwargs: dict, tensor_arguments: Callable[[tuple, dict], dict],
              diff_inputs: list | None = None) -> list:
        """Check the finished forward; returns the tensors to differentiate with respect to.

        ``args``, ``kwargs``: the op's arguments as passed; ``tensor_arguments(args, kwargs)`` names its
        tensor arguments (called only to check a new kind of call). ``diff_inputs``: the
        tensors to differentiate (named ops); by default every tensor a launch reads that
        requires grad. Afterwards the record holds its plan and the launches' non-tensor
        arguments, and ``self.saved`` lists the tensors the backward reads (to go through
        ``ctx.save_for_backward``).
        """
        tensors, self.tensors, self.taken = self.tensors, None, None
        # the key: what the checks and the plan depend on, equal for calls that launch the same
        # kernels, passing tensors the same way, laid out the same way (as ``tensors`` describes
        # them). The op's arguments are in it as passed, then the tensors inside their containers (lists, tuples,
        # dicts: a bare op's), their paths after the keywords: the tensors ``tensor_arguments`` names follow.
        values = (*args, *kwargs.values())
        paths, inner = nested_tensors(values)
        positions = tensors.take((*outputs, *values, *inner))[0]
        diff = None if diff_inputs is None else tensors.take(tuple(diff_inputs))[0]
        key = (tuple(self.patterns), len(outputs), positions, (*kwargs, *paths), diff, tuple(tensors.described))
        plan = self.plans.get(key)
        if plan is None:  # a new kind of call: check it (raises) and lay out its backward
            arguments = {name: tensors.index[id(t)] for name, t in tensor_arguments(args, kwargs).items()}
            plan = Planner(self.name, self.launches, self.boundary is not None).plan(key, tensors, outputs, arguments)
            plan.inner_saved = frozenset(j for j, slot in enumerate(plan.saved) if slot not in set(positions))
            if len(self.plans) >= MAX_PLANS:
                self.plans.pop(next(iter(self.plans), None), None)
            self.plans[key] = plan
        self.plan, self.key, found = plan, key, tensors.tensors
        self.saved = [found[i] for i in plan.saved]
        inputs = [found[i] for i in plan.inputs] if diff_inputs is None else diff_inputs
        if inputs:  # a kernel that cannot be differentiated is refused here, at the op's call
            derive_ahead(self.name, plan, self.launches, self.deterministic)
            if self.copy_keys:
                self._learn_unread_copies(plan)
        return inputs

    # -- backward -----------------------------------------------------------------------------------

    def backward(self, saved: tuple, grads: tuple, needs: Sequence[bool], launches: Any = None
                 ) -> list[torch.Tensor | None]:
        """Gradients of the differentiated inputs (None where not needed or not reached): backward.py.
        ``launches``: a hooks.Launches gathering (or wrapping) the derived kernels' launches."""
        # derived kernels are not recorded, even inside another op's forward (but by a backward run as an op)
        token = current_record.set(launches if launches is not None else recording_backward.get())
        try:
            return PlannedBackward(self.name, self.plan, self.launches, self.deterministic).run(saved, grads, needs)
        finally:
            current_record.reset(token)
