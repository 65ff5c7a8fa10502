"""Calls made again: an op's later calls of a kind seen before compared with the first one's launches as they run,
past the launch record's recording, and their backward launched from what an earlier backward kept.

A call of an op with a key seen before (launch_record.py) reuses its plan, but still records every launch and builds the
key to find it: microseconds of Python per launch and per call that a hand-written ``autograd.Function`` does
not spend. A :class:`Replay` is a kind of call, learnt from a call that made it (``Replays.learn``): per launch
the kernel object, grid, every non-tensor argument with its type, where each tensor argument lies among the
call's tensors, and the description of each tensor the key reads (storage numbered by first appearance, dtype,
sizes, strides, offset, device, ``requires_grad``: ``CallTensors``), and where the op's outputs and arguments
lie. A later call runs on a :class:`FastRecord`: its first launch picks the op's replay whose first launch it is
(the most recent first), and each launch is compared with the replay's as it comes, before it runs (the key's
every part, and the values besides), then run (directly, as the launch record runs it: relaunch.py); the outputs and
arguments are compared when the host function returns, and the call's autograd node then takes the replay's
plan. Aliasing is read from each tensor's address on every call, as the key reads it: a call passing one tensor
twice where the replay's passed two is not the replay's. At the first difference the call goes on as any
other: a ``LearningRecord`` records the launches so far (the replay's, so their checks passed), without running
them again, then the rest, and teaches the op a replay of this call when it closes.

The backward (replay_backward.py): once the plan's backward for a schedule has kept a ``launcher.Launcher`` per
step (from its second backward on: backward.py), a replay's backward launches them in order.

A launch the first call ran as its augmented forward (augment.py: state tapes for the backward) is run so again on
tapes of the call's own, laid out as at its first replay (``FastRecord._augmented``), which its backward reads.

An in-place launch's copy (launch_record.py's ``_snapshots``) is taken per call before it runs (an empty tensor where no
derived kernel reads it). Not replayed: calls holding other things per call (copies of overwritten reads; host
descriptors and alias views, aliases.py; a non-tensor launch argument not a plain value, relaunch.plain_values; a launch
offering its backward other configs, configs.py, than the replay's, with their grids). A bare op's call is replayed
where it is one segment (ops/segments.py: no PyTorch call read what its launches wrote before it returned), its node as
the replay's (one, or its written buffers marked dirty); a replayed call whose PyTorch call closes a segment goes on as
a first call, its launches recorded with the copies taken before they ran. ``TRITONGRAD_REPLAY=0`` turns replays off.
"""

from __future__ import annotations

import copy
import functools
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.device import capturing, ensure_allocator
from ..runtime import relaunch
from ..runtime.augment import keeping_of
from . import backward as op_backward
from .configs import Tiles
from .launch_record import LaunchRecord, _by_parameter, _relaunchers, copy_of, current_autotuner, current_record
from .replay_backward import StraightLineBackward
from .shadows import kept_empty

ENV = "TRITONGRAD_REPLAY"
MAX_REPLAYS = 16  # per op: kinds of call it is called with in turn (a model's layers of a few sizes)
_Tensor = torch.Tensor
_given = functools.partial(operator.is_not, None)  # (a gradient given: in C, on every backward)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
_ITEMSIZE = {d: d.itemsize for d in vars(torch).values() if isinstance(d, torch.dtype)}
ENABLED = os.environ.get(ENV) != "0"  # (read once: os.environ costs microseconds on every call)


class Expected:
    """One launch of a replay: the kernel object and grid, the number of positional arguments and the keywords'
    names, the positions of tensor arguments and their slots among the call's tensors, the other values and
    their types, and the recorded launch (launch_record.RecordedLaunch, holding no tensors) the backward reads."""

    __slots__ = ("kernel", "grid", "callable_grid", "count", "names", "tensors", "pick", "plain", "types", "values",
                 "recorded", "key", "relauncher", "same", "tail", "augmented", "keeping", "written", "snapshots",
                 "placeholders")

    def __init__(self, recorded: Any, pattern: tuple, callable_grid: bool, described: tuple, augmented: bool, unread):
        positions, self.names = pattern[1], pattern[2]
        roles, by_parameter = recorded.info.roles, _by_parameter(recorded.info, positions, self.names)
        self.written = tuple(i for p, i in by_parameter.items()  # (what a bare op's segments watch: ops/segments.py)
                             if i is not None and (roles is None or p in roles.stores))
        # an in-place launch's copies, each call's own (LaunchRecord._snapshots): (slot, parameter, the slot of the
        # tensor copied, or None for an empty tensor in place of a copy no derived kernel reads, dtype)
        self.snapshots = tuple(sorted((i, p, None if i in unread else by_parameter[p], described[i][1])
                                      for p, i in pattern[3]))
        self.placeholders: dict[int, torch.Tensor] = {}  # slot -> its empty tensor (shadows.kept_empty)
        self.augmented, self.keeping = augmented, None  # run as its augmented forward: each call's tapes, as that
        self.kernel, self.grid, self.recorded = recorded.kernel, recorded.grid, recorded  # augment.Keeping says
        self.callable_grid = callable_grid
        self.count = len(positions) - len(self.names)  # positional arguments
        self.values = (*recorded.args, *recorded.kwargs.values())  # (None for a tensor)
        self.tensors = tuple((k, slot) for k, slot in enumerate(positions) if slot is not None)
        plain = [k for k, slot in enumerate(positions) if slot is None]
        self.pick = _picker(plain)  # all values -> the non-tensor ones
        self.plain = tuple(self.values[k] for k in plain)
        self.types = tuple(map(type, self.plain))
        # the forward Relauncher's key, as LaunchRecord._relaunch makes it (shared with the launch record's launches)
        self.key = (id(self.kernel), self.grid, positions, self.names, recorded.args, tuple(map(type, recorded.args)),
                    tuple(recorded.kwargs.values()), tuple(map(type, recorded.kwargs.values())),
                    tuple([described[i][1] for i in positions if i is not None]))
        self.relauncher = None
        self.same = (self.kernel, self.grid, callable_grid, self.count, self.names, self.tensors, self.plain,
                     self.types)  # what a launch is compared on
        self.tail = _tail(recorded.info, self.count, recorded.kwargs, any(k >= self.count for k, _ in self.tensors))

    def arguments(self, tensors: list) -> tuple[tuple, dict]:
        """The launch's arguments as passed, its tensors those of a call (by slot)."""
        values = list(self.values)
        for k, slot in self.tensors:
            values[k] = tensors[slot]
        return tuple(values[:self.count]), dict(zip(self.names, values[self.count:], strict=True))


def _tail(info: Any, count: int, kwargs: dict, tensor_keywords: bool) -> tuple | None:
    """The values of the parameters after the positional arguments, in order, as a launch passes them (keywords)
    or leaves them (defaults): with the positional arguments, the values Triton binds (relaunch.Relauncher.launch).
    None where a tensor is passed by keyword or a parameter has no value."""
    missing = object()
    tail = tuple(kwargs.get(p, info.defaults.get(p, missing)) for p in info.params[count:])
    return None if tensor_keywords or any(v is missing for v in tail) else tail


def _picker(positions: list[int]) -> Callable[[tuple], tuple]:
    """A function from a tuple to its items at ``positions``, as a tuple (itemgetter: in C)."""
    if not positions:
        return lambda values: ()
    if len(positions) == 1:
        get = operator.itemgetter(positions[0])
        return lambda values: (get(values),)
    return operator.itemgetter(*positions)


class Replay:
    """A kind of call learnt from a closed launch record (see the module docstring): its launches (``Expected``), the
    descriptions of its tensors, where the op's outputs and arguments lie among them, and its plan; its backwards
    per schedule."""

    def __init__(self, record: LearningRecord, named: bool):
        patterns, n_outputs, passed, kwnames, diff, described = record.key
        self.name, self.deterministic, self.plan = record.name, record.deterministic, record.plan
        augmented = [r.saved is not None for r in record.launches]
        # shared by the replay's calls: holding no call's tensors (an augmented launch's tapes are each call's own)
        self.recorded = [_with_tapes(r, None) if k else r for r, k in zip(record.launches, augmented, strict=True)]
        unread = {*record.placeholders, *(self.plan.saved[j] for j in self.plan.unused)}  # copies: none taken
        self.expected = tuple(Expected(r, p, c, described, a, unread) for r, p, c, a in zip(
            self.recorded, patterns, record.callable_grids, augmented, strict=True))
        self.described = described
        # per slot: what a new tensor there must have, read in one tuple (dtype, sizes, strides, offset, device,
        # requires_grad), and its storage's number
        self.tails = tuple((d[1], d[2], d[3], d[4], d[5], d[6]) for d in described)
        self.keys = tuple(d[0] for d in described)
        self.n_outputs, self.passed, self.kwnames = n_outputs, passed, kwnames
        self.dirty = record.dirty  # a bare op's segment whose written buffers came out marked dirty (ops/segments.py)
        self.closing = (len(self.expected), n_outputs, len(passed))
        inputs = diff if named else self.plan.inputs  # the tensors to differentiate, by slot
        self.pick_inputs, self.pick_saved = _picker(list(inputs)), _picker(list(self.plan.saved))
        self.backwards: dict[tuple, Any] = {}  # schedule -> StraightLineBackward, or False: never (its steps keep none)

    @staticmethod
    def of(record: LearningRecord, named: bool) -> Replay | None:
        """The replay of a closed record's call, or None where a call of its kind holds something per call (but state
        tapes an augmented forward keeps: each replayed call allocates its own, ``FastRecord``)."""
        if not record.learnable or record.plan.unread or not record.launches:
            return None
        for launch, pattern in zip(record.launches, record.key[0], strict=True):
            if pattern[4] or hasattr(launch.kernel, "tg_source"):  # (an alias or
                return None  # descriptor view: launched as another kernel, aliases.py, host_descriptors.py)
            if not relaunch.plain_values((*launch.args, *launch.kwargs.values())):
                return None
        return Replay(record, named)

    def backward(self, saved: tuple, grads: tuple, needs: Sequence[bool], kept: dict | None = None) -> list:
        """The gradients, as LaunchRecord.backward gives them: by the schedule's StraightLineBackward once it has one.
        ``kept``: per launch run as its augmented forward, the state tapes the call kept (FastRecord.kept)."""
        schedule = (tuple(needs), tuple(map(_given, grads)))
        fast = self.backwards.get(schedule) if op_backward.recording_backward.get() is None else False
        if fast and fast.grad is op_backward.grad:  # (tests spy on grad: a new one is a new backward)
            if current_record.get() is None and not torch.is_grad_enabled():  # (fast's __call__, inlined)
                ensure_allocator()
                return fast.run(saved, grads, needs, kept)
            return fast(saved, grads, needs, kept)
        recorded = self.recorded if kept is None else [  # (the replay's launches, with this call's tapes)
            _with_tapes(r, kept[i]) if i in kept else r for i, r in enumerate(self.recorded)]
        result = self.planned(saved, grads, needs, recorded)
        if fast is not False:
            self.backwards[schedule] = StraightLineBackward.of(self, schedule)
        return result

    def planned(self, saved: tuple, grads: tuple, needs: Sequence[bool], recorded: list) -> list:
        """The gradients by PlannedBackward over ``recorded`` (the replay's launches, or copies with a call's tapes)."""
        token = current_record.set(op_backward.recording_backward.get())  # (derived kernels are not recorded)
        try:
            backward = op_backward.PlannedBackward(self.name, self.plan, recorded, self.deterministic)
            return backward.run(saved, grads, needs)
        finally:
            current_record.reset(token)


class Replays:
    """An op's replays, the most recently used first."""

    def __init__(self, name: str, plans: dict, deterministic: bool, function: Any, named: bool = True):
        self.name, self.plans, self.deterministic, self.named = name, plans, deterministic, named
        self.function = function  # the op's autograd.Function (autograd_function._LaunchRecordFunction)
        self.apply = super(torch.autograd.Function, function).apply  # its apply, past Function.apply's Python
        self.found: list[Replay] = []

    def call(self, fn: Callable, args: tuple, kwargs: dict) -> tuple[LaunchRecord | None, Any]:
        """Run the host function ``fn`` on a call's arguments: (None, the outputs of the op's autograd node) where
        a replay ran it to the end; else (the record its launches were recorded on, unclosed, and the host function's
        result), for the caller to close and make the node of (the record learns a replay then)."""
        if not self.found or not ENABLED or capturing():  # (captured in a CUDA graph: the record's path, which the
            record = LearningRecord(self)               # graph tests cover; replays under capture are not yet)
            with record:
                return record, fn(*args, **kwargs)
        fast = FastRecord(self)
        token = current_record.set(fast)
        try:
            result = fn(*args, **kwargs)
        finally:
            current_record.reset(token)
        if fast.fallen is None:
            several = isinstance(result, (tuple, list))
            outputs = tuple(result) if several else (result,)
            inputs = fast.close(outputs, args, kwargs)
            if inputs is not None:
                if not inputs:  # nothing to differentiate (the record's caller returns it as it is)
                    return None, result
                if torch._C._are_functorch_transforms_active():
                    outputs = self.function.apply(fast, outputs, *inputs)
                else:  # what Function.apply does then (the Function defines no setup_context; saving: donation.py)
                    outputs = op_backward.donation.apply(self.apply, fast, outputs, *map(_unwrap_if_dead, inputs))
                return None, outputs if several else outputs[0]
        return fast.fallen, result

    def segment_record(self) -> FastRecord | LearningRecord:
        """A bare op's first segment's record (segments.py): a replay's where the op has one, else one that learns."""
        return FastRecord(self) if self.found and ENABLED and not capturing() else LearningRecord(self)

    def learn(self, record: LearningRecord) -> None:
        replay = Replay.of(record, self.named) if record.key is not None and ENABLED else None
        if replay is not None:
            self.found = [replay, *self.found[:MAX_REPLAYS - 1]]  # (a new list: other threads may be reading it)

    def used(self, replay: Replay) -> None:
        """The replay first from now on (another thread may have dropped it meanwhile)."""
        found = [r for r in self.found if r is not replay]
        self.found = [replay, *found[:MAX_REPLAYS - 1]]


class LearningRecord(LaunchRecord):
    """A plain launch record that, when it closes, teaches its op a replay of the call (``Replays.learn``)."""

    def __init__(self, replays: Replays):
        super().__init__(replays.name, replays.plans, replays.deterministic)
        self.replays = replays
        self.callable_grids: list[bool] = []  # per launch: whether its grid was a function
        self.dirty = False  # (ops/segments.py: a bare op's segment whose written buffers come out marked dirty)
        self.learnable = True  # (ops/segments.py: not a segment a PyTorch call closed, of a call of several)

    def record(self, kernel: Any, grid: Any, args: tuple, kwargs: dict, callable_grid: bool | None = None) -> None:
        self.callable_grids.append(callable(grid) if callable_grid is None else callable_grid)
        super().record(kernel, grid, args, kwargs)

    def close(self, outputs: tuple, args: tuple, kwargs: dict, tensor_arguments: Callable[[tuple, dict], dict],
              diff_inputs: list | None = None) -> list:
        inputs = super().close(outputs, args, kwargs, tensor_arguments, diff_inputs)
        self.replays.learn(self)
        return inputs


class FastRecord:
    """The current record of a call that may be a replay's (see the module docstring): each launch compared with the
    replay's and run; at the first difference a LearningRecord (``fallen``) takes over. Then what the call's autograd
    node keeps: the plan, the saved tensors (until the node takes them), the backward."""

    __slots__ = ("replays", "replay", "count", "tensors", "index", "storages", "fallen", "saved", "plan", "name",
                 "kept", "boundary")

    def __init__(self, replays: Replays):
        self.replays, self.replay, self.count, self.fallen, self.saved = replays, None, 0, None, None
        self.boundary = None  # a bare op's segments.Segments (hooks.py tells it of each launch)
        self.kept: dict[int, Any] | None = None  # launch index -> the state tapes this call's augmented launch kept
        self.tensors: list[torch.Tensor] = []  # the call's distinct tensors, in order of first appearance
        self.index: dict[int, int] = {}  # id(tensor) -> position in tensors
        self.storages: dict[int, int] = {}  # storage address -> number, as CallTensors numbers them

    def launch(self, run: Callable, kernel: Any, grid: Any, args: tuple, kwargs: dict, warmup: bool) -> Any:
        replay, i = self.replay, self.count
        if replay is None:  # the first launch: the replay whose first launch it is
            expected = self._choose(kernel, grid, args, kwargs)
        else:
            expected = replay.expected[i] if i < len(replay.expected) else None
            if expected is None or expected.kernel is not kernel \
                    or not self._matches(replay, expected, grid, args, kwargs):
                expected = self._switch(kernel, grid, args, kwargs)
        if expected is not None and expected.snapshots:
            expected = self._snapshots(expected)
        if expected is None:
            return self._fall_back().launch(run, kernel, grid, args, kwargs, warmup)
        if expected.augmented:
            return self._augmented(run, kernel, expected, args, kwargs, warmup)
        self.count = i + 1
        if relaunch.supported():
            relauncher = expected.relauncher or _relauncher(expected)
            if expected.tail is not None:
                compiled = relauncher.launch((*args, *expected.tail))
                if compiled is not None:
                    return compiled
            info = expected.recorded.info
            named = info.launch_arguments(args, kwargs)
            return relauncher(named, lambda: run(kernel, *args, grid=expected.grid, warmup=False, **kwargs))
        return run(kernel, *args, grid=grid, warmup=False, **kwargs)

    def written_by_last(self) -> list[torch.Tensor]:
        """As LaunchRecord.written_by_last: the tensors the latest launch stores through."""
        tensors = self.tensors
        return [tensors[i] for i in self.replay.expected[self.count - 1].written]

    def _snapshots(self, expected: Expected) -> Expected | None:
        """An in-place launch's copies (LaunchRecord._snapshots), taken before it runs, where the replay's call had them
        among its tensors; None where they do not lie there."""
        tensors = self.tensors
        for slot, _, copied, dtype in expected.snapshots:
            if len(tensors) != slot:
                return None
            tensors.append(copy_of(tensors[copied]) if copied is not None else kept_empty(
                expected.placeholders, slot, dtype, self.replay.described[slot][5]))
            self.index[id(tensors[-1])] = slot
        return expected

    def _augmented(self, run: Callable, kernel: Any, expected: Expected, args: tuple, kwargs: dict,
                   warmup: bool) -> Any:
        """The launch as its augmented forward (LaunchRecord.launch's) on the call's own state tapes, which its backward
        reads (``backward``), made as ``expected.keeping`` says (a match fixes what it reads); else a first call's."""
        found = expected.keeping = expected.keeping or keeping_of(
            kernel, expected.recorded.info.with_defaults(args, kwargs), expected.grid)
        if found is None:
            return self._fall_back().launch(run, kernel, expected.grid, args, kwargs, warmup)
        augmented_kernel, extra, saved = found.fresh()
        if self.kept is None:
            self.kept = {}
        self.kept[self.count] = saved
        self.count += 1
        return run(augmented_kernel, *args, grid=expected.grid, warmup=warmup, **kwargs, **extra)

    def _choose(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> Expected | None:
        for replay in self.replays.found:
            expected = replay.expected[0]
            if expected.kernel is kernel and self._matches(replay, expected, grid, args, kwargs):
                self.replay = replay
                if self.replays.found[0] is not replay:
                    self.replays.used(replay)
                return expected
            self.tensors.clear()
            self.index.clear()
            self.storages.clear()
        return None

    def _switch(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> Expected | None:
        """Another of the op's replays whose launches so far are this one's (so are the call's tensors so far) and
        whose next launch this is: an op whose kinds of call differ only in a later launch is not learnt anew on
        each call."""
        i, current, seen = self.count, self.replay, len(self.tensors)
        for replay in self.replays.found:
            if replay is current or len(replay.expected) <= i or replay.expected[i].kernel is not kernel \
                    or replay.described[:seen] != current.described[:seen] \
                    or any(a.same != b.same for a, b in zip(replay.expected[:i], current.expected[:i], strict=True)):
                continue
            index, storages = dict(self.index), dict(self.storages)
            if self._matches(replay, replay.expected[i], grid, args, kwargs):
                self.replay = replay
                self.replays.used(replay)
                return replay.expected[i]
            del self.tensors[seen:]
            self.index, self.storages = index, storages
        return None

    def _matches(self, replay: Replay, expected: Expected, grid: Any, args: tuple, kwargs: dict) -> bool:
        """Whether a launch is the replay's: the same values of the same types but for its tensors, which lie as the
        replay's did (their slots among the call's tensors, the new ones' descriptions), on the same grid."""
        if len(args) != expected.count:
            return False
        if kwargs:
            if tuple(kwargs) != expected.names:
                return False
            values = (*args, *kwargs.values())
        elif expected.names:
            return False
        else:
            values = args
        plain = expected.pick(values)
        if tuple(map(type, plain)) != expected.types or plain != expected.plain:  # (types first: no tensor compared)
            return False
        shape = grid
        if expected.callable_grid:  # (the grid before the tensors: kinds of call often differ in it alone)
            if not callable(grid):
                return False
            shape = grid(expected.recorded.info.with_defaults(args, kwargs))
        elif callable(grid):
            return False
        if (shape if type(shape) is tuple else tuple(shape)) != expected.grid:
            return False
        index = self.index
        for k, slot in expected.tensors:
            v = values[k]
            i = index.get(id(v))
            if i != slot and (i is not None or not self._new_tensor(replay, v, slot)):
                return False
        # the configs its backward may take, with their grids, are the replay's (its Launchers keep the one chosen)
        return not expected.callable_grid or Tiles.of(expected.kernel, grid, expected.recorded.info, args, kwargs,
                                                      current_autotuner.get()) == expected.recorded.tiles

    def _new_tensor(self, replay: Replay, v: Any, slot: int) -> bool:
        """Whether ``v``, a value not seen before in the call, is a tensor the replay's call had at ``slot``: the
        next one, described as its was (its storage numbered by first appearance, as CallTensors.take numbers it)."""
        tensors = self.tensors
        if len(tensors) != slot or not isinstance(v, _Tensor):
            return False
        dtype, offset = v.dtype, v.storage_offset()
        size = v.shape
        if (dtype, size, v.stride(), offset, v.device, v.requires_grad) != replay.tails[slot]:
            return False
        address = v.data_ptr()
        if address and 0 not in size:
            storages = self.storages
            if storages.setdefault(address - offset * _ITEMSIZE[dtype], len(storages) + 1) != replay.keys[slot]:
                return False
        elif replay.keys[slot]:
            return False
        self.index[id(v)] = slot
        tensors.append(v)
        return True

    def _fall_back(self, running: bool = True) -> LearningRecord:
        """A LearningRecord in this one's place (``running``: the current record from here on), with the launches so far
        (the replay's, so their checks pass) recorded as a launch record records them, without running them again."""
        record = self.fallen = LearningRecord(self.replays)
        if self.boundary is not None:  # a bare op's segment: its watch goes on with the record taking over
            record.boundary = self.boundary
            self.boundary.record = record if running else self.boundary.record
        if running:
            current_record.set(record)  # (the call's token restores the record before this one)
        if self.count:
            record.taken = {(k, p): self.tensors[slot] for k, expected in enumerate(self.replay.expected[:self.count])
                          for slot, p, copied, _ in expected.snapshots if copied is not None}  # (not copied again:
            token = current_autotuner.set(None)  # the launches ran) (none of them had an autotuner's configs)
            try:
                for expected in self.replay.expected[:self.count]:
                    args, kwargs = expected.arguments(self.tensors)
                    record.record(expected.kernel, expected.grid, args, kwargs, expected.callable_grid)
            finally:
                current_autotuner.reset(token)
            for index, saved in (self.kept or {}).items():  # (run as augmented forwards: their tapes are filled)
                record.launches[index].saved = saved
        self.tensors = self.index = self.storages = None
        return record

    def close(self, outputs: tuple, args: tuple, kwargs: dict, dirty: bool = False) -> list | None:
        """The tensors to differentiate, once the op's outputs and arguments are found where the replay's were among
        the call's tensors (``saved``: those the backward reads); else None, having fallen back. ``dirty``: a bare
        op's segment, its outputs the buffers its launches wrote (ops/segments.py), as the replay's must be."""
        replay = self.replay
        if replay is None or replay.dirty is not dirty \
                or (self.count, len(outputs), len(outputs) + len(args) + len(kwargs)) != replay.closing \
                or (tuple(kwargs) != replay.kwnames if kwargs else replay.kwnames) \
                or not self._passed(replay, (*outputs, *args, *kwargs.values()) if kwargs else (*outputs, *args)):
            self._fall_back(running=False)
            return None
        tensors = self.tensors
        self.plan, self.name = replay.plan, replay.name
        self.saved = replay.pick_saved(tensors)
        self.tensors = self.index = self.storages = None  # the node keeps only what it saves
        return replay.pick_inputs(tensors)

    def _passed(self, replay: Replay, values: tuple) -> bool:
        index = self.index
        for v, slot in zip(values, replay.passed, strict=True):
            if slot is None:
                if isinstance(v, _Tensor):
                    return False
            else:
                i = index.get(id(v))
                if i != slot and (i is not None or not self._new_tensor(replay, v, slot)):
                    return False
        return True

    def backward(self, saved: tuple, grads: tuple, needs: Sequence[bool]) -> list[torch.Tensor | None]:
        return self.replay.backward(saved, grads, needs, self.kept)


def _with_tapes(recorded: Any, saved: Any) -> Any:
    """A copy of a recorded launch (launch_record.RecordedLaunch) keeping these state tapes (None: none)."""
    made = copy.copy(recorded)
    made.saved = saved
    return made


def _relauncher(expected: Expected) -> relaunch.Relauncher:
    """The launch's Relauncher: LaunchRecord._relaunch's, found by the same key."""
    relauncher = _relaunchers.get(expected.key)
    if relauncher is None or relauncher.kernel is not expected.kernel:
        relauncher = _relaunchers[expected.key] = relaunch.Relauncher(expected.kernel, expected.grid)
    expected.relauncher = relauncher
    return relauncher
