"""The tape: what an op's forward launched, checked once per kind of call.

Recording: inside an op, each launch reaches the current tape (``current_tape``) through the
hooks on Triton's launch entry points (hooks.py), which ``Tape.launch`` records and runs: as its
augmented forward where the backward reads the state that keeps (augment.py), else as it is.

Plans: the checks ``Tape.close`` makes and the shadow layout depend only on which
kernels were launched, how their arguments were passed, and each tensor's dtype, sizes,
strides, offset, device, ``requires_grad`` and which others share its storage. Each
call reduces those to a key (storages numbered in order of appearance, not by address);
the first call with a key runs the checks and lays out the backward (a ``shadows.Plan``),
later calls with that key reuse it. The hot path reads tensor metadata only: no AST work
and nothing that waits for the device; on a GPU a launch made before with the same recorded
arguments calls its compiled kernel directly (relaunch.py). The backward itself is backward.py's.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..core.errors import OpError, noted
from ..runtime import relaunch
from ..runtime.augment import SavedStates, keeping
from .backward import OpBackward
from .kernel_roles import KernelInfo, kernel_info, kernel_infos
from .shadows import LaunchPlan, Plan, View, launch_name, whole_storages

# the Tape recording launches (None outside an op; hooks.py's DRY or Launches while a named op's host function
# runs without a tape)
current_tape: contextvars.ContextVar[Any] = contextvars.ContextVar("tritongrad_tape", default=None)
# the autotuner whose chosen config is being launched inside an op, with its arguments (Tiles.of)
current_autotuner: contextvars.ContextVar[Any] = contextvars.ContextVar("tritongrad_autotuned", default=None)

MAX_PLANS = 256  # per op; an op called with ever new shapes keeps the newest ones
_relaunchers: dict[tuple, Any] = {}  # a forward launch's recorded arguments -> its relaunch.Relauncher
_pointers_checked: set[tuple] = set()  # launch patterns (see RecordedLaunch) passing tensors to every pointer


# -- storage views ---------------------------------------------------------------------------------



class _Tensors:
    """The distinct tensors of one call (by identity), each described by what the checks read.

    ``device``: the first tensor's; ``mixed``: whether some other tensor is elsewhere.
    """

    __slots__ = ("tensors", "index", "described", "storages", "device", "on_cpu", "mixed")

    def __init__(self):
        self.tensors: list[torch.Tensor] = []
        self.index: dict[int, int] = {}  # id(tensor) -> position in tensors
        self.described: list[tuple] = []  # per tensor: (storage key, dtype, size, stride, offset, device, grad)
        self.storages: dict[int, int] = {}  # storage address -> key (1, 2, ... in order of appearance)
        self.device, self.on_cpu, self.mixed = None, False, False  # on_cpu: device.type is slow to read

    def take(self, values: tuple) -> tuple[tuple, tuple]:
        """Each value's position among the call's tensors (None for a value that is not a tensor),
        and the values with tensors replaced by None. New tensors are described.

        One loop with everything inlined: this runs on every argument of every launch.
        """
        index, tensors, described, storages = self.index, self.tensors, self.described, self.storages
        positions, kept = [], []
        for v in values:
            if not isinstance(v, _Tensor):
                positions.append(None)
                kept.append(v)
                continue
            i = index.get(id(v))
            if i is None:
                i = index[id(v)] = len(tensors)
                tensors.append(v)
                dtype, size, offset, device, address = v.dtype, v.shape, v.storage_offset(), v.device, v.data_ptr()
                # the storage's address (the view's, less its offset: untyped_storage() makes an object);
                # a tensor without elements aliases nothing; storages are numbered, not named by address,
                # so that the description is the same on every call with the same layout
                key = storages.setdefault(address - offset * (_ITEMSIZE.get(dtype) or dtype.itemsize),
                                          len(storages) + 1) if address and 0 not in size else 0
                described.append((key, dtype, size, v.stride(), offset, device, v.requires_grad))
                if device != self.device:
                    self._another_device(device)
            positions.append(i)
            kept.append(None)
        return tuple(positions), tuple(kept)

    def _another_device(self, device: torch.device) -> None:
        if self.device is None:
            self.device, self.on_cpu = device, device == _CPU
        else:
            self.mixed = True

    def view(self, i: int) -> View:
        key, dtype, size, stride, offset, device, _ = self.described[i]
        return View(key, dtype, tuple(size), stride, offset, device)

    def requires_grad(self, i: int) -> bool:
        return self.described[i][6]


_CPU = torch.device("cpu")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_Tensor = torch.Tensor  # a module global: read on every argument of every launch
_ITEMSIZE = {d: d.itemsize for d in vars(torch).values() if isinstance(d, torch.dtype)}  # dtype.itemsize is slow


# -- launches --------------------------------------------------------------------------------------


def _by_parameter(info: KernelInfo, positions: tuple, names: tuple) -> dict[str, int | None]:
    """A recorded launch's arguments by parameter: the position of each tensor among the call's tensors."""
    n = len(positions) - len(names)
    return info.named_arguments(positions[:n], dict(zip(names, positions[n:], strict=True)))[0]


class RecordedLaunch:
    """One recorded launch: the jit-level kernel, its grid, and its arguments as passed, with
    tensors replaced by None (the tape holds no tensors once closed: outputs would otherwise
    hold themselves alive). Its pattern (``Tape.patterns``): the kernel's function, per
    argument (positional, then keyword) the position of its tensor among the call's tensors
    (None for a non-tensor), and the keywords.
    """

    __slots__ = ("kernel", "info", "index", "grid", "args", "kwargs", "saved", "tiles")

    def __init__(self, kernel: Any, info: KernelInfo, index: int, grid: tuple, args: tuple, kwargs: dict,
                 tiles: Tiles | None = None):
        self.kernel, self.info, self.index, self.grid, self.args, self.kwargs = kernel, info, index, grid, args, kwargs
        self.saved: SavedStates | None = None  # the state tapes its forward kept for its backward (augment.py)
        self.tiles = tiles  # the autotuner's other configs, which its backward may be launched with instead

    def __str__(self) -> str:
        return launch_name(self.index, self.info)


@dataclass(frozen=True)
class Tiles:
    """The configs of the autotuner a launch came from, and its grid function: the backward may run under
    any of them (tuning.py). An autotuner's configs are interchangeable by its contract (it picks one by
    speed alone), so the backward of the forward under another config is the same gradient, summed in
    another order; the backward's best tiles are rarely the forward's (a matmul's input gradients are
    products of other shapes). Only where the autotuner launches the kernel itself (no heuristics between
    them, which could compute constexprs from the config's) and the grid is a function of the config; of
    the configs its ``early_config_prune`` keeps for the launch's arguments (it may drop a tile size the
    kernel cannot run at a shape)."""

    configs: tuple[tuple[tuple[str, Any], ...], ...]  # each config's keyword arguments and launch options
    grid: Callable[[dict], tuple]

    @classmethod
    def of(cls, autotuned: Any, kernel: Any) -> Tiles | None:
        if autotuned is None:
            return None
        tuner, args, kwargs = autotuned
        grid = kwargs.get("grid")
        if tuner.fn is not kernel or not callable(grid) or len(tuner.configs) < 2:
            return None
        configs = tuner.configs
        if getattr(tuner, "early_config_prune", None):
            named = dict(zip(tuner.arg_names, args, strict=False))  # as the autotuner gives it
            configs = tuner.early_config_prune(configs, named, **kwargs)
        configs = _config_items(tuple(configs))
        return cls(configs, grid) if len(configs) > 1 else None


@functools.lru_cache(maxsize=256)
def _config_items(configs: tuple) -> tuple:
    """Autotuner configs as keyword items, but those with a pre_hook (it may fill what the backward reads);
    cached: an op's every call records them."""
    return tuple(tuple(sorted(c.all_kwargs().items())) for c in configs if c.pre_hook is None)


class Tape:
    """The launches of one call of an op, and the backward that replays them.

    ``plans``: the op's plans by key, shared by its calls (a fresh dict: nothing is reused).
    """

    plan: Plan | None = None  # set by close
    boundary: Any = None  # a bare op's segments.Segments, told of each launch
    saved: list[torch.Tensor] | None = None  # set by close, taken by the autograd node

    def __init__(self, name: str, plans: dict | None = None, deterministic: bool = False):
        self.name = name
        self.deterministic = deterministic  # derived kernels without atomic additions
        self.plans = {} if plans is None else plans
        self.launches: list[RecordedLaunch] = []
        self.patterns: list[tuple] = []  # per launch: what the plan's key takes from it (see RecordedLaunch)
        self.tensors: _Tensors | None = _Tensors()  # until closed: the tensors launches were passed

    def recording(self) -> Tape:
        """``with tape.recording():`` records the launches in the block."""
        return self

    def __enter__(self) -> Tape:  # methods, not a generator-based context manager: on every call's path
        self._token = current_tape.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        current_tape.reset(self._token)

    def error(self, message: str) -> OpError:
        return OpError(f"tritongrad.op `{self.name}`: {message}")

    # -- forward ------------------------------------------------------------------------------------

    def record(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> None:
        info = kernel_infos.get(kernel.fn) or kernel_info(kernel)
        tensors, index = self.tensors, len(self.launches)
        positions, kept = tensors.take((*args, *kwargs.values()) if kwargs else args)
        snapshots = self._snapshots(info, args, kwargs) if info.roles is not None and info.roles.in_place else ()
        earlier = self._save_overwritten(info, positions, tuple(kwargs)) if self.launches and info.roles else ()
        pattern = (kernel.fn, positions, tuple(kwargs), snapshots, earlier)  # fn: JITFunction.__hash__ is Python
        if tensors.mixed or (tensors.on_cpu and not info.interpreted):
            self._check_devices(index, info, args, kwargs)
        if pattern not in _pointers_checked and self._check_pointers(index, info, args, kwargs, positions):
            if len(_pointers_checked) > 4096:  # bounded: patterns are few per call site
                _pointers_checked.clear()
            _pointers_checked.add(pattern)
        if callable(grid):
            grid = grid({**info.defaults, **info.named_arguments(args, kwargs)[0]})
        n = len(args)
        if kwargs:
            if positions[n:].count(None) != len(kwargs):  # kwargs is a dict of our own (**kwargs): kept
                kwargs = dict(zip(kwargs, kept[n:], strict=True))  # unless it holds tensors
            kept = kept[:n]
        tiles = Tiles.of(current_autotuner.get(), kernel)
        self.launches.append(RecordedLaunch(kernel, info, index, tuple(grid), kept, kwargs, tiles))
        self.patterns.append(pattern)

    def launch(self, run: Callable, kernel: Any, grid: Any, args: tuple, kwargs: dict, warmup: bool) -> Any:
        """Record a launch and run it: as its augmented forward where the backward can read the state tapes
        that keeps (augment.py; the tapes stay with the recorded launch), else as it is."""
        self.record(kernel, grid, args, kwargs)
        launch = self.launches[-1]
        if launch.info.roles is not None and launch.info.loops:
            named = {**launch.info.defaults, **launch.info.named_arguments(args, kwargs)[0]}
            found = keeping(kernel, named, launch.grid)
            if found is not None:
                augmented_kernel, extra, launch.saved = found
                return run(augmented_kernel, *args, grid=grid, warmup=warmup, **kwargs, **extra)
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
            if len(_relaunchers) > 4096:  # bounded: a call site has few kinds of launch
                _relaunchers.clear()
            relauncher = _relaunchers[key] = relaunch.Relauncher(kernel, grid)
        named = {**launch.info.defaults, **dict(zip(launch.info.params, args, strict=False)), **kwargs}
        return relauncher(named, through_triton)

    def _snapshots(self, info: KernelInfo, args: tuple, kwargs: dict) -> tuple[tuple[str, int], ...]:
        """Copies of the tensors a launch updates in place, taken before it runs: its backward replays against
        the values it read. Each copies the memory its view spans, so strides and offsets stay as passed.
        Returns (parameter, the copy's position among the call's tensors) pairs."""
        named, _ = info.named_arguments(args, kwargs)
        return tuple(sorted((p, self._copy(v)) for p in info.roles.in_place if isinstance(v := named.get(p),
                                                                                            torch.Tensor)))

    def _save_overwritten(self, info: KernelInfo, positions: tuple, names: tuple) -> tuple[tuple[int, str, int], ...]:
        """Copies of what earlier launches read from memory this launch overwrites, taken before it runs: their
        backwards replay against the values they read. Returns (launch index, parameter, the copy's position)
        triples."""
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
                if (i is not None and p in roles.loads and p not in own and (launch.index, p) not in copied
                        and described[i][0] in written):
                    found.append((launch.index, p, self._copy(tensors[i])))
        return tuple(found)

    def _copy(self, v: torch.Tensor) -> int:
        """A copy of the memory a view spans, as a view with its strides (so a replay indexes it as the launch
        indexed the original); its position among the call's tensors."""
        span = 1 + sum((n - 1) * st for n, st in zip(v.shape, v.stride(), strict=True)) if v.numel() else 0
        with torch.no_grad():
            memory = v.as_strided((span,), (1,), v.storage_offset()).clone()
        return self.tensors.take((memory.as_strided(v.shape, v.stride(), 0),))[0][0]

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
        requires grad. Afterwards the tape holds its plan and the launches' non-tensor
        arguments, and ``self.saved`` lists the tensors the backward reads (to go through
        ``ctx.save_for_backward``).
        """
        tensors, self.tensors = self.tensors, None
        # the key: what the checks and the plan depend on, equal for calls that launch the same
        # kernels, passing tensors the same way, laid out the same way (as ``tensors`` describes
        # them). The op's arguments are in it as passed: the tensors ``tensor_arguments`` names follow.
        positions = tensors.take((*outputs, *args, *kwargs.values()))[0]
        diff = None if diff_inputs is None else tensors.take(tuple(diff_inputs))[0]
        key = (tuple(self.patterns), len(outputs), positions, tuple(kwargs), diff, tuple(tensors.described))
        plan = self.plans.get(key)
        if plan is None:  # a new kind of call: check it (raises) and lay out its backward
            arguments = {name: tensors.index[id(t)] for name, t in tensor_arguments(args, kwargs).items()}
            plan = self._plan(key, tensors, outputs, arguments)
            if len(self.plans) >= MAX_PLANS:
                self.plans.pop(next(iter(self.plans), None), None)
            self.plans[key] = plan
        self.plan, found = plan, tensors.tensors
        self.saved = [found[i] for i in plan.saved]
        return [found[i] for i in plan.inputs] if diff_inputs is None else diff_inputs

    def _plan(self, key: tuple, tensors: _Tensors, outputs: tuple, arguments: dict[str, int]) -> Plan:
        """Check a call whose key is new, and lay out its backward. ``arguments``: the op's
        tensor arguments by name, as positions among the call's tensors."""
        patterns, n_outputs, passed, _, diff, _ = key
        outs = passed[:n_outputs]
        read: dict[int, list[tuple[LaunchPlan, str, View]]] = {}  # storage key -> reads so far
        written: dict[int, list[tuple[LaunchPlan, str, View]]] = {}  # storage key -> writes so far
        slots: dict[int, int] = {}  # tensor position -> index in the saved tensors
        found: dict[int, None] = {}  # positions of the differentiable inputs, in order
        launches = []
        params_of: dict[LaunchPlan, dict[str, int]] = {}  # per launch: tensor parameter -> position
        later = {(k, p): i for *_, earlier in patterns for k, p, i in earlier}  # reads a later launch overwrote
        for launch, (_, positions, names, snapshots, _) in zip(self.launches, patterns, strict=True):
            n = len(positions) - len(names)
            named, _ = launch.info.named_arguments(positions[:n], dict(zip(names, positions[n:], strict=True)))
            params = {p: i for p, i in named.items() if i is not None}  # tensor parameter -> position
            checked = LaunchPlan(launch.info, launch.index, {p: tensors.view(i) for p, i in params.items()})
            launches.append(checked)
            params_of[checked] = params
            known = checked.info.roles is not None
            if known:
                self._hazards(checked, read, written)
            elif any(tensors.requires_grad(i) for i in params.values()):  # (what it reads and writes is unknown)
                raise noted(launch.info.error, f"(needed to differentiate {checked} of tritongrad.op "
                             f"`{self.name}`: a tensor it is passed requires grad)")
            loads, stores = set(checked.params("loads")), set(checked.params("stores"))
            copies = dict(snapshots)  # in place: the launch read the copy taken before it ran
            copies.update({p: i for (k, p), i in later.items() if k == launch.index})  # before a later one did
            for p, i in params.items():
                if known and p in stores and tensors.requires_grad(i) and not (p in copies and self.boundary):
                    raise self.error(f"{checked} writes to `{p}`, a tensor that requires grad (an input of the op?); "
                                     "kernels of an op may write only to buffers the op allocates"
                                     + (" (a bare @tritongrad.op may update such a tensor in place)" if p in copies
                                        else ""))
                if p in copies:
                    checked.slots[p] = slots.setdefault(copies[p], len(slots))
                    if diff is None and tensors.requires_grad(i) and checked.views[p].dtype.is_floating_point:
                        found.setdefault(i)
                    continue
                if p in loads:
                    slots.setdefault(i, len(slots))
                    if diff is None and tensors.requires_grad(i) and checked.views[p].dtype.is_floating_point:
                        found.setdefault(i)
                checked.slots[p] = slots.get(i)  # saved slot, or None: written only, never read back
            for p in stores:
                written.setdefault(checked.views[p].key, []).append((checked, p, checked.views[p]))
            if known:  # unknown roles: hazards are not checked (the launch fails if it needs a backward)
                for p in loads - set(copies):  # (what an in-place launch read is in its copy)
                    read.setdefault(checked.views[p].key, []).append((checked, p, checked.views[p]))
        for checked in launches:  # outputs whose values the backward reads back: saved, unless written again
            roles = checked.info.roles
            # a statistic only from an output at least as wide as float32 and as the floats the launch reads (the
            # type it computes in, as far as the tape can tell: a float64 input's statistic in float32 is rounded)
            widest = max([4, *(v.dtype.itemsize for p, v in checked.views.items()
                               if p in roles.loads and v.dtype.is_floating_point)]) if roles is not None else 8
            for p in (roles.read_back | roles.read_back_exact) & set(checked.views) if roles is not None else ():
                key, dtype = checked.views[p].key, checked.views[p].dtype
                exact = dtype in (torch.float32, torch.float64) and dtype.itemsize >= widest
                if (written[key][-1][0] is checked and checked.slots.get(p) is None
                        and (exact if p in roles.read_back_exact else dtype in _FLOATS)):
                    checked.slots[p] = slots.setdefault(params_of[checked][p], len(slots))
                    checked.kept = checked.kept | {p}
        self._check_outputs(outputs, outs, arguments, tensors, written)
        if diff is None:
            diff = tuple(found)
        else:
            self._check_origins(launches, tuple(arguments.values()), tensors, written)
        input_views = [tensors.view(i) for i in diff]
        output_views = [tensors.view(i) for i in outs]
        views = [v for launch in launches for v in launch.views.values()] + output_views + input_views
        storages = self._storages(views)
        constants = tuple(i for i, v in enumerate(output_views) if not v.dtype.is_floating_point)
        loaded = [launch.views[p] for launch in launches for p in launch.params("loads")]
        unread = tuple(name for name, i in arguments.items() if tensors.requires_grad(i)
                       and not any(tensors.view(i).overlaps(v) for v in loaded))
        return Plan(tuple(launches), tuple(slots), diff, tuple(input_views), tuple(output_views), storages,
                    whole_storages(storages, views), constants, unread)

    def _hazards(self, launch: LaunchPlan, read: dict, written: dict) -> None:
        """Refuse what replaying the launches against final memory would get wrong."""
        for p in launch.params("stores"):
            v = launch.views[p]
            for q in launch.params("loads"):
                if q != p and launch.views[q].overlaps(v):
                    raise self._hazard(launch, q, "reads", launch, p)
            for other, q, u in read.get(v.key, ()):
                if u.overlaps(v):
                    raise self._hazard(other, q, "reads", launch, p)
            if p in launch.info.roles.overwrites and p not in launch.info.roles.in_place:  # (tl.atomic_add onto
                # earlier results accumulates; an in-place update reads them, and its backward passes their gradient)
                for other, q, u in written.get(v.key, ()):
                    if u.overlaps(v):
                        raise self._hazard(other, q, "writes", launch, p)

    def _hazard(self, first: LaunchPlan, p: str, verb: str, second: LaunchPlan, q: str) -> OpError:
        why = ("the backward replays each launch against memory as the op left it, so it would read the new values"
               if verb == "reads" else f"the backward of {first} would take the gradient of what {second} wrote")
        return self.error(f"{second} overwrites `{q}`, memory that {first} {verb} through `{p}`: {why}. Write to a "
                          "fresh buffer instead")

    def _check_outputs(self, outputs: tuple, outs: tuple, arguments: dict[str, int], tensors: _Tensors,
                       written: dict) -> None:
        for i, (out, position) in enumerate(zip(outputs, outs, strict=True)):
            if position is None:
                raise self.error(f"output #{i} is a {type(out).__name__}; an op returns tensors")
            v = tensors.view(position)
            for name, arg in arguments.items():  # (a bare op's segments may update an argument in place: dirty)
                if v.key and v.key == tensors.view(arg).key and self.boundary is None:
                    raise self.error(f"output #{i} shares memory with the argument `{name}` (it is that argument "
                                     "or a view of it); an op must return tensors it allocates")
            if v.key and v.key not in written:
                raise self.error(f"output #{i} was not written by any kernel launch of the op (made by a PyTorch "
                                 "operation?); a named op's autograd formula covers its kernels only: compute it "
                                 "with a kernel, or outside the op (a bare @tritongrad.op takes PyTorch operations "
                                 "on its launches' results)")

    def _check_origins(self, launches: list[LaunchPlan], args: tuple, tensors: _Tensors, written: dict) -> None:
        """Named ops run below autograd: a tensor made from the inputs by PyTorch inside would be a silent constant."""
        known = {tensors.view(i).key for i in args} | set(written)
        for launch in launches:
            for p in launch.params("inputs"):
                v = launch.views[p]
                if v.key and v.key not in known and v.dtype.is_floating_point:
                    raise self.error(
                        f"{launch} reads `{p}`, a tensor that is neither an argument of the op nor written by an "
                        "earlier launch (made by a PyTorch operation, e.g. .contiguous()?). A named op cannot see "
                        "such operations; do them outside the op, or pass the tensor in as an argument")

    def _storages(self, views: list[View]) -> dict[int, tuple[torch.dtype, int, int]]:
        """Storage key -> (dtype, lo, hi): the float storages and the element spans their shadows cover."""
        spans: dict[int, tuple[torch.dtype, int, int]] = {}
        for v in views:
            if not v.key or not v.dtype.is_floating_point:
                continue
            lo, hi = v.span
            if v.key in spans:
                dtype, a, b = spans[v.key]
                if dtype != v.dtype:
                    raise self.error(f"tensors of dtypes {dtype} and {v.dtype} share memory; their gradients "
                                     "cannot share a shadow")
                lo, hi = min(lo, a), max(hi, b)
            spans[v.key] = (v.dtype, lo, hi)
        return spans

    # -- backward -----------------------------------------------------------------------------------

    def backward(self, saved: tuple, grads: tuple, needs: Sequence[bool]) -> list[torch.Tensor | None]:
        """Gradients of the differentiated inputs (None where not needed or not reached): backward.py."""
        token = current_tape.set(None)  # derived kernels are not recorded, even inside another op's forward
        try:
            return OpBackward(self.name, self.plan, self.launches, self.deterministic).run(saved, grads, needs)
        finally:
            current_tape.reset(token)
