"""The layout of an op's backward: shadow memory per storage, and the launches a backward differentiates.

Shadow memory mirrors storage. Every tensor a launch touches is a :class:`View` of a
storage; each storage that gradients flow through gets one zero-filled float buffer
covering the span its views touch, and a view's shadow is that buffer viewed with the
view's sizes, strides and offset (a :class:`Shadow`). So aliasing views share gradients, and a
buffer one launch writes and a later one reads carries the gradient from the later launch's
backward into the earlier one's. Half-precision tensors get float32 shadows, cast once at the end.

A :class:`Plan` is what every call of one kind shares (planning.py makes it once per kind):
the checked launches (:class:`LaunchPlan`), the tensors to save, and the shadow layout; and per
schedule (the inputs needing gradients, the outputs given gradients) the steps a backward runs
(:class:`Step`), newest launch first (backward.py runs them).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.bounded import Bounded
from ..runtime.variants import shadow_dtype
from ..writes.launch_facts import Layout, buffer_facts, overlap, self_overlapping


@dataclass(frozen=True)
class View:
    """Where a tensor lives: storage key (0: no storage), dtype, sizes, strides, offset (in elements).

    Storage keys number the storages of one call in order of appearance (``CallTensors``), so
    views of calls with the same key compare alike.
    """

    key: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    device: torch.device

    @property
    def span(self) -> tuple[int, int]:
        """The elements [lo, hi) of the storage this view can address."""
        if not all(self.size):
            return self.offset, self.offset
        return self.offset, self.offset + 1 + sum((n - 1) * s for n, s in zip(self.size, self.stride, strict=True))

    def overlaps(self, other: View) -> bool:
        """Whether the two views share a byte: exact (launch_facts.overlap), so that interleaved views that share
        no element (the column halves of one buffer) are apart."""
        if self.key != other.key or not self.key:
            return False
        (a, b), (c, d) = self.span, other.span
        sa, sb = self.dtype.itemsize, other.dtype.itemsize
        return a * sa < d * sb and c * sb < b * sa and overlap(Layout.of(self), Layout.of(other))

    @property
    def contiguous(self) -> bool:
        return contiguous(self.size, self.stride)


def contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for n, s in zip(reversed(size), reversed(stride), strict=True):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def launch_name(index: int, info: Any) -> str:
    return f"launch #{index + 1} (`{info.name}`)"


@dataclass(eq=False)
class LaunchPlan:
    """A launch's tensor parameters: where each lives, and its saved-tensor slot (None: written only)."""

    info: Any  # kernel_roles.KernelInfo
    index: int
    views: dict[str, View]
    slots: dict[str, int | None] = field(default_factory=dict)
    kept: frozenset[str] = frozenset()  # outputs saved for the backward to read back what it stored (stored_outputs.py)
    # the backward's parameter for a tensor it updated in place and read back, as it left it -> its saved slot
    as_left: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return launch_name(self.index, self.info)

    @functools.cached_property
    def from_saved(self) -> tuple[tuple[str, int | None, tuple], ...]:
        """Per tensor parameter: its saved slot, or (slot None) the dtype and device of a stand-in; then per tensor it
        updated in place and read back, its backward's parameter for it as it left it, and that saved slot."""
        return (*((p, slot, (self.views[p].dtype, self.views[p].device)) for p, slot in self.slots.items()),
                *((n, slot, None) for n, slot in self.as_left.items()))

    def params(self, role: str) -> list[str]:
        """Tensor parameters in a role ("loads", "stores", "overwrites", "inputs"), in parameter order."""
        roles = self.info.roles
        if roles is None:  # unknown: every tensor may be read and written
            return [p for p in self.views if role != "overwrites"]
        chosen = getattr(roles, role)
        return [p for p in self.views if p in chosen]


# -- plans -----------------------------------------------------------------------------------------


@dataclass(eq=False)
class Plan:
    """What every call with one key shares: its checked launches and the layout of its backward.

    Tensors are named by their position among the call's distinct tensors (``CallTensors``).
    """

    launches: tuple[LaunchPlan, ...]
    saved: tuple[int, ...]  # the tensors to save for the backward, by slot
    inputs: tuple[int, ...]  # the tensors to differentiate (bare ops; named ops pass theirs)
    input_views: tuple[View, ...]
    output_views: tuple[View, ...]
    storages: dict[int, tuple[torch.dtype, int, int]]  # storage key -> (dtype, lo, hi) of its shadow
    whole: frozenset[int]  # storages seen through one contiguous view only: the shadow is that view
    constants: tuple[int, ...]  # the outputs that are not floating point (not differentiable)
    unread: tuple[str, ...] = ()  # the op's arguments that require grad but no launch reads (planning.py)
    # derived from the above:
    buffers: dict[int, tuple] = field(init=False)  # storage key -> (shape, dtype, device) of its shadow
    input_shadows: tuple[Shadow | None, ...] = field(init=False)  # per input; None: no gradient
    plain_inputs: bool = field(init=False)  # whether each input's gradient is its shadow buffer (_input_grads)
    # per output: (Shadow, reused_as: the shape its incoming gradient is viewed as to serve as the storage's shadow, or
    # None, size, dtype, overlapping)
    outputs: tuple[tuple | None, ...] = field(init=False)
    schedules: dict[tuple, tuple] = field(init=False, default_factory=dict)  # see steps
    checked: set[tuple] = field(init=False, default_factory=set)  # schedules checked for stray gradients
    ahead: dict | None = field(init=False, default=None)  # specializations derived at the call (backward.derive_ahead)
    decisive: bool = field(init=False, default=False)  # whether a launch's kernel has decisive constexprs
    # saved slots no derived kernel reads (backward.derive_ahead): not kept, an empty stand-in saved in their place
    unused: frozenset[int] = field(init=False, default=frozenset())
    # saved slots whose memory may take an input's gradient (host/donation.candidates; None: not yet worked out)
    donors: frozenset[int] | None = field(init=False, default=None)
    # saved slots holding no argument or output of the call (a buffer the host function made): set by LaunchRecord.close
    inner_saved: frozenset[int] | None = field(init=False, default=None)
    # per input: the earlier inputs reaching its very elements, the later ones of its storage (backward._input_grads)
    input_relations: tuple | None = field(init=False, default=None)
    stand_ins: dict = field(init=False, default_factory=dict, repr=False)  # kept_for_backward's empty tensors

    def kept_for_backward(self, saved: list) -> list:
        """The tensors an autograd node saves: ``saved`` with an empty tensor for each slot no derived kernel reads
        (holding no memory; one per slot, so a kept Launcher still tells the slots apart; made once per slot, dtype
        and device: nothing writes one, and the calls' nodes may share it)."""
        if not self.unused:
            return saved
        return [self._stand_in(j, t) if j in self.unused else t for j, t in enumerate(saved)]

    def _stand_in(self, slot: int, t: torch.Tensor) -> torch.Tensor:
        return kept_empty(self.stand_ins, (slot, t.dtype, t.device), t.dtype, t.device)

    def __post_init__(self):
        self.buffers = {k: self._buffer(k) for k in self.storages}
        self.input_shadows = tuple(self.shadow(v) if v.key in self.storages else None for v in self.input_views)
        keys = [v.key for v in self.input_views if v.key in self.storages]
        self.plain_inputs = len(set(keys)) == len(keys) and all(
            v.key in self.whole and shadow_dtype(v.dtype) == v.dtype for v in self.input_views if v.key in keys)
        reusable = _reusable_outputs(self.launches, self.output_views, self.input_views, self.whole, self.storages)
        self.outputs = tuple((self.shadow(v), r, v.size, v.dtype, self_overlapping(Layout.of(v)))
                             if v.key in self.storages else None
                             for v, r in zip(self.output_views, reusable, strict=True))

    def _buffer(self, key: int) -> tuple:
        dtype, lo, hi = self.storages[key]
        if key in self.whole:
            shape, device = next((v.size, v.device) for v in self.views() if v.key == key)
        else:
            shape, device = (hi - lo,), next(v.device for v in self.views() if v.key == key)
        return shape, shadow_dtype(dtype), device

    def views(self) -> list[View]:
        return [v for launch in self.launches for v in launch.views.values()] + [*self.output_views,
                                                                                   *self.input_views]

    def all_of_buffer(self, shadow: Shadow) -> bool:
        """Whether a shadow is all of its storage's buffer, element by element in order (so that its writer may
        leave it unfilled, in the primal's dtype), however other views see the storage (a transposed view of q
        updated in place through a contiguous one)."""
        if shadow.view is None:
            return True
        size, stride, offset = shadow.view
        return offset == 0 and math.prod(size) == self.buffers[shadow.key][0][0] and contiguous(size, stride)

    def buffer_dtype(self, shadow: Shadow, own_dtype: bool) -> torch.dtype:
        """The dtype of the buffer a shadow's first user makes: the primal's where the writer wants it (``own_dtype``)
        and the shadow is all of the buffer, else the plan's (float32 for half types)."""
        if own_dtype and self.all_of_buffer(shadow):
            return self.storages[shadow.key][0]
        return self.buffers[shadow.key][1]

    def shadow(self, v: View) -> Shadow:
        """Where a view's gradient lives."""
        return Shadow(v.key, None if v.key in self.whole else (v.size, v.stride, v.offset - self.storages[v.key][1]))

    def steps(self, needs: tuple[bool, ...], present: tuple[bool, ...]) -> tuple[Step, ...]:
        """The launches to differentiate, newest first; cached per (inputs needing gradients, outputs
        given gradients).

        ``wrt`` of a launch: its differentiable inputs whose storage depends on a needed
        input at that point of the forward. ``outputs``: the parameters it stores whose
        storage carries gradient (an op output with a gradient, or a buffer a later
        launch's backward accumulated into). A launch with neither is not differentiated.
        """
        steps = self.schedules.get((needs, present))
        if steps is None:
            steps = self.schedules[(needs, present)] = self._steps(needs, present)
        return steps

    def _steps(self, needs: tuple[bool, ...], present: tuple[bool, ...]) -> tuple[Step, ...]:
        varied = {v.key for v, need in zip(self.input_views, needs, strict=True) if need}
        wrts = []
        for launch in self.launches:
            wrt = tuple(p for p in launch.params("inputs") if launch.views[p].key in varied and self.carries(launch, p))
            if wrt and launch.info.roles is not None:  # read back what it stored: its gradient flows through the
                wrt += tuple(p for p in launch.params("reloaded")  # shadow (an input and output of the step)
                             if p not in wrt and self.carries(launch, p))
            wrts.append(wrt)
            if wrt:
                varied.update(launch.views[p].key for p in launch.params("stores"))
        shadowed = {v.key for v, given in zip(self.output_views, present, strict=True)
                    if given and v.key in self.storages}
        steps = []
        for launch, wrt in zip(reversed(self.launches), reversed(wrts), strict=True):
            outputs = tuple(p for p in launch.params("stores") if launch.views[p].key in shadowed
                            and self.carries(launch, p))
            if wrt and outputs:  # an input updated in place is an output too, its new values' gradient zero if none
                outputs += tuple(p for p in wrt if p in launch.params("stores") and p not in outputs)
                steps.append(Step(launch, wrt, outputs, {p: self.shadow(launch.views[p]) for p in (*wrt, *outputs)}))
                shadowed.update(launch.views[p].key for p in (*wrt, *outputs))
        writers = Counter(step.shadows[p].key for step in steps for p in step.wrt)
        for step in steps:
            step.sole = frozenset(p for p in step.wrt if writers[step.shadows[p].key] == 1)
            # the shadows lie as the views do: overlapping views, overlapping gradient buffers
            step.shared, step.self_overlapping = buffer_facts({p: step.launch.views[p] for p in step.wrt})
        return tuple(steps)

    def carries(self, launch: LaunchPlan, p: str) -> bool:
        """Whether gradient can flow through the parameter: a float tensor with a shadow."""
        return launch.views[p].dtype.is_floating_point and launch.views[p].key in self.storages


@dataclass(frozen=True)
class Shadow:
    """Where a view's gradient lives: the shadow buffer of storage ``key`` seen through ``view``
    ((sizes, strides, offset) into the buffer; None where the buffer is the view itself)."""

    key: int
    view: tuple | None


@dataclass(eq=False)
class Step:
    """A launch to differentiate in a backward, with the parameters to differentiate with respect to
    and the stored ones whose gradients flow back."""

    launch: LaunchPlan
    wrt: tuple[str, ...]
    outputs: tuple[str, ...]
    shadows: dict[str, Shadow]  # of wrt and outputs
    sole: frozenset[str] = frozenset()  # wrt inputs whose storage's gradient no other step of the schedule writes
    shared: frozenset[str] = frozenset()  # wrt inputs whose views overlap another of this step's (launch_facts.py)
    self_overlapping: frozenset[str] = frozenset()  # wrt inputs whose views reach one element twice (stride 0)
    # (grad, values of decisive constexprs) -> the derived kernel (backward._derived_kernel)
    derived: dict = field(default_factory=dict)
    # the launch's non-tensor arguments, ... -> PlannedBackward._ready's
    ready: dict = field(default_factory=lambda: Bounded(256))
    # the launch's non-tensor arguments -> the config chosen (PlannedBackward._tiles)
    tiles: dict = field(default_factory=dict)
    # the launch's non-tensor arguments -> its Launcher; False: none
    launchers: dict = field(default_factory=lambda: Bounded(256))


def whole_storages(storages: dict, views: list[View]) -> frozenset[int]:
    """The storages whose views are all one contiguous view (the common case: a fresh output)."""
    layouts: dict[int, set] = {}
    for v in views:
        if v.key in storages:
            layouts.setdefault(v.key, set()).add((v.size, v.stride, v.offset))
    return frozenset(k for k, seen in layouts.items()
                     if len(seen) == 1 and next(v for v in views if v.key == k).contiguous)


def _reusable_outputs(plan_launches: tuple[LaunchPlan, ...], output_views: tuple[View, ...],
                      input_views: tuple[View, ...], whole: frozenset[int], storages: dict) -> tuple[tuple | None, ...]:
    """Per output: the shape its incoming gradient is viewed as to serve as its storage's shadow as it is, or None.

    Derived kernels only read output shadows (a half-precision one widened to float32 as it is
    loaded); a shadow is written only where a launch's backward accumulates into it (a parameter
    in the "inputs" role) or where an input's gradient is taken from it. A storage with neither,
    seen through this output's view only, can take the gradient uncopied: as the view itself where the storage is
    seen whole, else flat where the view is the whole storage in order (an output the host function reshaped:
    `c.view(*shape)` of the buffer its launches wrote as rows).
    """
    written = {launch.views[p].key for launch in plan_launches for p in launch.params("inputs")}
    written.update(v.key for v in input_views)
    keys = [v.key for v in output_views]
    found = []
    for v in output_views:
        if v.key in written or keys.count(v.key) != 1 or v.key not in storages:
            found.append(None)
        elif v.key in whole:
            found.append(v.size)
        else:
            _, lo, hi = storages[v.key]
            found.append((hi - lo,) if in_order(v, storages) else None)
    return tuple(found)


def in_order(v: View, storages: dict) -> bool:
    """Whether a view is all of its storage's shadow, element by element in order (a reshape of it)."""
    return v.contiguous and v.span == storages[v.key][1:]


_stand_ins: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def kept_empty(memo: dict, key: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An empty tensor of ``memo``'s for ``key``, made on first use and kept: holding no memory (nothing writes it),
    one object per key. Not kept where it is not a plain tensor (made while torch.compile's fake tensors trace)."""
    found = memo.get(key)
    if found is None:
        found = torch.empty(0, dtype=dtype, device=device)
        if type(found) is torch.Tensor:
            memo[key] = found
    return found


def stand_in_tensor(dtype_device: tuple[torch.dtype, torch.device]) -> torch.Tensor:
    """A tensor for a parameter a launch only writes: derived kernels drop the forward's stores, so
    nothing reads or writes it. Empty (Triton passes its null address) and kept, one per dtype and
    device: holding no memory, it holds none of a CUDA graph's either when first made during a
    capture or torch.compile's cudagraph warm-up (whose allocations are the graph's, and which
    refuses a graph whose memory something else keeps)."""
    t = _stand_ins.get(dtype_device)
    if t is None:
        dtype, device = dtype_device
        t = _stand_ins[dtype_device] = torch.empty(0, dtype=dtype, device=device)
    return t
