"""The backward of an op: shadow memory laid out per storage, derived kernels replayed in reverse order.

Shadow memory mirrors storage. Every tensor a launch touches is a :class:`View` of a
storage; each storage that gradients flow through gets one zero-filled float buffer
covering the span its views touch, and a view's shadow is that buffer viewed with the
view's sizes, strides and offset. So aliasing views share gradients, and a buffer one
launch writes and a later one reads carries the gradient from the later launch's
backward into the earlier one's. Launches are replayed in reverse order, each with
``tritongrad.grad(kernel, wrt, outputs)``; ``wrt`` and ``outputs`` are the parameters
whose storages matter (see ``Plan.steps``). Half-precision tensors get float32 shadows,
cast once at the end. A derived kernel adds each load's gradient at the load's address,
so a launch that read outside the elements of a tensor it was passed would put gradient
where no tensor lies: the first backward of each plan and schedule surrounds the shadows
with zeros and refuses that (``OpBackward._check_strays``).

A :class:`Plan` is what every call of one kind shares (tape.py makes it once per kind):
the checked launches, the tensors to save, and the shadow layout.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..core.errors import NotDifferentiableError, OpError, noted
from ..runtime import tuning
from ..runtime.derive import capturing, decisive_constexprs, grad, hashable, shadow_dtype
from ..runtime.relaunch import Relauncher
from ..writes.launch_facts import Layout, buffer_facts, self_overlapping

GUARD = (1024, 1 << 20)  # zeros on each side of a shadow in a checked backward: its own size, within these bounds


@dataclass(frozen=True)
class View:
    """Where a tensor lives: storage key (0: no storage), dtype, sizes, strides, offset (in elements).

    Storage keys number the storages of one call in order of appearance (``_Tensors``), so
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
        if self.key != other.key or not self.key:
            return False
        (a, b), (c, d) = self.span, other.span
        sa, sb = self.dtype.itemsize, other.dtype.itemsize
        return a * sa < d * sb and c * sb < b * sa

    @property
    def contiguous(self) -> bool:
        expected = 1
        for n, s in zip(reversed(self.size), reversed(self.stride), strict=True):
            if n != 1 and s != expected:
                return False
            expected *= n
        return True


def launch_name(index: int, info: Any) -> str:
    return f"launch #{index + 1} (`{info.name}`)"


@dataclass(eq=False)
class LaunchPlan:
    """A launch's tensor parameters: where each lives, and its saved-tensor slot (None: written only)."""

    info: Any  # tape.KernelInfo
    index: int
    views: dict[str, View]
    slots: dict[str, int | None] = field(default_factory=dict)
    kept: frozenset[str] = frozenset()  # outputs saved for the backward to read back what it stored (stored_outputs.py)

    def __str__(self) -> str:
        return launch_name(self.index, self.info)

    @functools.cached_property
    def replayed(self) -> tuple[tuple[str, int | None, tuple], ...]:
        """Per tensor parameter: its saved slot, or (slot None) the dtype and device of a stand-in."""
        return tuple((p, slot, (self.views[p].dtype, self.views[p].device)) for p, slot in self.slots.items())

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

    Tensors are named by their position among the call's distinct tensors (``_Tensors``).
    """

    launches: tuple[LaunchPlan, ...]
    saved: tuple[int, ...]  # the tensors to save for the backward, by slot
    inputs: tuple[int, ...]  # the tensors to differentiate (bare ops; named ops pass theirs)
    input_views: tuple[View, ...]
    output_views: tuple[View, ...]
    storages: dict[int, tuple[torch.dtype, int, int]]  # storage key -> (dtype, lo, hi) of its shadow
    whole: frozenset[int]  # storages seen through one contiguous view only: the shadow is that view
    constants: tuple[int, ...]  # the outputs that are not floating point (not differentiable)
    unread: tuple[str, ...] = ()  # the op's arguments that require grad but no launch reads (tape.Tape.close)
    # derived from the above:
    buffers: dict[int, tuple] = field(init=False)  # storage key -> (shape, dtype, device) of its shadow
    input_shadows: tuple[Shadow | None, ...] = field(init=False)  # per input; None: no gradient
    plain_inputs: bool = field(init=False)  # whether each input's gradient is its shadow buffer (_input_grads)
    outputs: tuple[tuple | None, ...] = field(init=False)  # per output: (Shadow, reusable, size, dtype, overlapping)
    schedules: dict[tuple, tuple] = field(init=False, default_factory=dict)  # see steps
    checked: set[tuple] = field(init=False, default_factory=set)  # schedules checked for stray gradients

    def __post_init__(self):
        self.buffers = {k: self._buffer(k) for k in self.storages}
        self.input_shadows = tuple(self.shadow(v) if v.key in self.storages else None for v in self.input_views)
        keys = [v.key for v in self.input_views if v.key in self.storages]
        self.plain_inputs = len(set(keys)) == len(keys) and all(
            v.key in self.whole and shadow_dtype(v.dtype) == v.dtype for v in self.input_views if v.key in keys)
        reusable = _reusable_outputs(self.launches, self.output_views, self.input_views, self.whole)
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

    def shadow(self, v: View) -> Shadow:
        """Where a view's gradient lives."""
        return Shadow(v.key, None if v.key in self.whole else (v.size, v.stride, v.offset - self.storages[v.key][1]))

    def steps(self, needs: tuple[bool, ...], present: tuple[bool, ...]) -> tuple[Step, ...]:
        """The launches to replay, newest first; cached per (inputs needing gradients, outputs
        given gradients).

        ``wrt`` of a launch: its differentiable inputs whose storage depends on a needed
        input at that point of the forward. ``outputs``: the parameters it stores whose
        storage carries gradient (an op output with a gradient, or a buffer a later
        launch's backward accumulated into). A launch with neither is not replayed.
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
            wrts.append(wrt)
            if wrt:
                varied.update(launch.views[p].key for p in launch.params("stores"))
        shadowed = {v.key for v, given in zip(self.output_views, present, strict=True)
                    if given and v.key in self.storages}
        steps = []
        for launch, wrt in zip(reversed(self.launches), reversed(wrts), strict=True):
            outputs = tuple(p for p in launch.params("stores") if launch.views[p].key in shadowed
                            and self.carries(launch, p))
            if wrt and outputs:
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
    """A launch to replay in a backward, with the parameters to differentiate with respect to
    and the stored ones whose gradients flow back."""

    launch: LaunchPlan
    wrt: tuple[str, ...]
    outputs: tuple[str, ...]
    shadows: dict[str, Shadow]  # of wrt and outputs
    sole: frozenset[str] = frozenset()  # wrt inputs whose storage's gradient no other step of the schedule writes
    shared: frozenset[str] = frozenset()  # wrt inputs whose views overlap another of this step's (launch_facts.py)
    self_overlapping: frozenset[str] = frozenset()  # wrt inputs whose views reach one element twice (stride 0)
    derived: dict = field(default_factory=dict)  # (grad, values of decisive constexprs) -> the derived kernel
    ready: dict = field(default_factory=dict)  # the launch's non-tensor arguments, ... -> OpBackward._ready's
    # the launch's non-tensor arguments -> the config chosen (OpBackward._tiles)
    tiles: dict = field(default_factory=dict)
    launchers: dict = field(default_factory=dict)  # the launch's non-tensor arguments -> its Launcher; False: none

    def derive(self, kernel: Any, named: dict[str, Any], deterministic: bool = False) -> Any:
        """The derived kernel of the specialization this launch runs. Looked up once per specialization:
        grad caches too, but looking up costs microseconds; again if ``grad`` was replaced (tests spy on it)."""
        key = (grad, deterministic, *[hashable(named.get(k)) for k in decisive_constexprs(kernel)])
        bwd = self.derived.get(key)
        if bwd is None:
            bwd = self.derived[key] = grad(kernel, self.wrt, self.outputs, constexprs=named,
                                           deterministic=deterministic, kept_outputs=tuple(sorted(self.launch.kept)))
        return bwd


def whole_storages(storages: dict, views: list[View]) -> frozenset[int]:
    """The storages whose views are all one contiguous view (the common case: a fresh output)."""
    layouts: dict[int, set] = {}
    for v in views:
        if v.key in storages:
            layouts.setdefault(v.key, set()).add((v.size, v.stride, v.offset))
    return frozenset(k for k, seen in layouts.items()
                     if len(seen) == 1 and next(v for v in views if v.key == k).contiguous)


def _reusable_outputs(plan_launches: tuple[LaunchPlan, ...], output_views: tuple[View, ...],
                      input_views: tuple[View, ...], whole: frozenset[int]) -> tuple[bool, ...]:
    """Per output: whether its incoming gradient can serve as its storage's shadow as it is.

    Derived kernels only read output shadows (a half-precision one widened to float32 as it is
    loaded); a shadow is written only where a launch's backward accumulates into it (a parameter
    in the "inputs" role) or where an input's gradient is taken from it. A storage with neither,
    seen through this output's view only, can take the gradient uncopied.
    """
    written = {launch.views[p].key for launch in plan_launches for p in launch.params("inputs")}
    written.update(v.key for v in input_views)
    keys = [v.key for v in output_views]
    return tuple(v.key in whole and v.key not in written and keys.count(v.key) == 1 for v in output_views)


_stand_ins: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _stand_in(dtype_device: tuple[torch.dtype, torch.device]) -> torch.Tensor:
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


# -- one backward ---------------------------------------------------------------------------------


class OpBackward:
    """One backward of an op: its plan, the recorded launches' non-tensor arguments, the op's name."""

    def __init__(self, name: str, plan: Plan, launches: Sequence[Any], deterministic: bool = False):
        self.name, self.plan, self.launches, self.deterministic = name, plan, launches, deterministic

    def error(self, message: str) -> OpError:
        return OpError(f"tritongrad.op `{self.name}`: {message}")

    def run(self, saved: tuple, grads: tuple, needs: Sequence[bool]) -> list[torch.Tensor | None]:
        """Gradients of the differentiated inputs (None where not needed or not reached).

        Runs with grad mode off: the backward is not itself differentiated (under
        ``create_graph=True`` too).
        """
        if torch.is_grad_enabled():  # torch.no_grad costs microseconds: entered only when needed
            with torch.no_grad():
                return self._backward(saved, grads, needs)
        return self._backward(saved, grads, needs)

    def _backward(self, saved: tuple, grads: tuple, needs: Sequence[bool]) -> list[torch.Tensor | None]:
        plan = self.plan
        schedule = (tuple(needs), tuple([g is not None for g in grads]))
        steps = plan.steps(*schedule)
        # the first backward of a schedule surrounds its shadows with zeros and looks for gradient where no
        # tensor lies (_check_strays); not while a CUDA graph is captured, where it could not wait for the device
        guards = None if schedule in plan.checked or capturing() else {}
        shadows: dict[int, torch.Tensor] = {}
        for output, g in zip(plan.outputs, grads, strict=True):
            if output is None or g is None:
                continue
            shadow, reusable, size, dtype, overlapping = output
            if reusable and g.is_contiguous() and g.shape == size and g.dtype == dtype:
                shadows[shadow.key] = g  # derived kernels only read it: no zero-filled copy
            elif overlapping:  # an expanded output (`y.expand(...)`): each element gets its positions' sum
                _scatter_add(self._shadow(shadows, shadow, guards), g)
            else:
                self._shadow(shadows, shadow, guards).add_(g)
        for step in steps:
            rows = self._run_step(step, saved, shadows, guards)
            if guards is not None:
                self._check_strays(step, guards, rows)
        result = self._input_grads(shadows, needs)
        if guards is None:
            return result
        plan.checked.add(schedule)
        return [None if g is None else g.clone() for g in result]  # not views of the guarded buffers

    def _check_strays(self, step: Step, guards: dict, rows: dict) -> None:
        """Refuse a launch whose backward put gradient on memory outside the tensors it was passed.

        A derived kernel adds each load's gradient at the load's address in the shadow, so this
        means the forward read memory that is not an element of the tensor it was passed (a length,
        stride or count the host function got wrong, a non-contiguous tensor read as contiguous):
        memory whose gradient has nowhere to go. Checked: the zeros around the shadow, and the gaps
        a strided view leaves in it; for an input summed in partial rows (``rows``: input -> the rows,
        their padding), the zeros around and between each row's elements.
        """
        launch = step.launch
        for p in step.wrt:
            v = launch.views[p]
            if p in rows:
                flat, pad = rows[p]
                stray = flat != 0
                stray.as_strided((flat.shape[0], *v.size), (flat.stride(0), *v.stride), pad).fill_(False)
            else:
                key = v.key
                flat, pad, n = guards[key]
                stray = flat != 0  # NaN too
                lo = self.plan.storages[key][1]
                views = ([u for u in self.plan.input_views if u.key == key]
                         or [u for u in self.plan.views() if u.key == key])
                for u in views:  # the elements whose gradients the inputs (or, for a buffer, the launches) take
                    stray.as_strided(u.size, u.stride, pad + u.offset - lo).fill_(False)
            if bool(stray.any()):
                v = launch.views[p]
                raise self.error(f"{launch} reads memory outside the elements of the tensor passed to `{p}` (sizes "
                                 f"{v.size}, strides {v.stride}): their gradient has nowhere to go. Check the sizes, "
                                 "strides and counts the host function passes with that tensor (does it assume "
                                 "contiguous memory?)")

    def _run_step(self, step: Step, saved: tuple, shadows: dict, guards: dict | None) -> dict:
        """Launch one step's derived kernel, under the forward's config or, for an autotuned launch on a GPU,
        the one of its autotuner's configs under which the backward is fastest (tape.Tiles: timed once per
        shape). Returns the partial rows of inputs summed in them (checked backwards)."""
        launch = self.launches[step.launch.index]
        keep = None  # unchecked: launched by the Launcher an earlier backward kept, or keep one
        if guards is None:
            try:
                keep = (grad, self.deterministic, launch.args, tuple(launch.kwargs.items()), launch.grid,
                        launch.saved is not None)
                launcher = step.launchers.get(keep)
            except TypeError:  # an unhashable argument
                keep = launcher = None
            if launcher:
                launcher(saved, shadows, self._shadow)
                return {}
            if launcher is False:  # not to be kept (Launcher.of): not traced again
                keep = None
        if launch.info.roles is None:
            raise noted(launch.info.error, f"(needed to differentiate {launch} of tritongrad.op `{self.name}`)")
        # the forward's arguments and launch options, all passed by keyword
        args = dict(zip(launch.info.params, launch.args, strict=False))
        args.update(launch.kwargs)
        for p, slot, stand_in in step.launch.replayed:
            args[p] = saved[slot] if slot is not None else _stand_in(stand_in)
        grid, config = tuple(launch.grid), ()
        if launch.tiles is not None and launch.saved is None and not self.deterministic:
            config = self._tiles(step, launch, args, shadows)
            if config:
                args.update(config)
                grid = tuple(launch.tiles.grid({**launch.info.defaults, **args}))
        return self._launch(step, launch, args, grid, config, shadows, guards, keep=keep)

    def _tiles(self, step: Step, launch: Any, args: dict, shadows: dict) -> tuple:
        """The autotuner's config (keyword items) under which this step's backward runs fastest; () for the
        forward's own or where nothing is timed (tuning.enabled). Kept per the launch's non-tensor arguments
        (the plan fixes its tensors' layouts), so that a repeated backward neither describes nor looks up."""
        try:
            known = (launch.args, tuple(launch.kwargs.items()))
            found = step.tiles.get(known)
        except TypeError:  # an unhashable argument
            known = found = None
        if found is not None:
            return found
        device = next((v.device for v in args.values() if isinstance(v, torch.Tensor)), None)
        if not tuning.enabled(device):
            return ()

        def trial(config: tuple) -> Callable[[], Any]:
            named = {**args, **dict(config)}
            grid = tuple(launch.tiles.grid({**launch.info.defaults, **named}))
            scratch = {k: v.clone() for k, v in shadows.items()}  # gradients already written stay as they are
            return lambda: self._launch(step, launch, named, grid, config, scratch, None, tuning.DEFAULT)

        key = (id(launch.kernel), launch.tiles.configs, step.wrt, tuning.describe(args))
        found = tuning.best_config(key, launch.tiles.configs, trial)
        if known is not None:
            step.tiles[known] = found
        return found

    def _launch(self, step: Step, launch: Any, args: dict, grid: tuple, config: tuple, shadows: dict,
                guards: dict | None, setting: Any = None, keep: tuple | None = None) -> dict:
        """The derived kernel's launch with the forward's arguments ``args`` (``config``: the autotuner's
        config replacing the recorded one, else ()). The first writer of a storage's gradient stores it (into
        a buffer left unfilled where its loads cover it, in the input's own dtype where nothing else adds to
        it); later ones add to it (lowering.py). ``keep``: the launch's key in ``step.launchers``, where a
        Launcher doing the same with the next backward's tensors is kept."""
        shadow_of = step.shadows
        output_grads = {p: self._shadow(shadows, shadow_of[p], guards) for p in step.outputs}
        written = frozenset(p for p in step.wrt if shadow_of[p].key in shadows)
        bwd, prepared, buffers_of = self._ready(step, launch, args, grid, written, config)
        buffers = {p: self._shadow(shadows, shadow, guards, fill, own) for p, shadow, fill, own in buffers_of}
        pad = GUARD[0] if guards is not None else 0
        trace = [] if keep is not None and not bwd.checks_contents else None
        rows = bwd.launch(grid, args, output_grads, buffers, prepared, written, pad, saved=launch.saved,
                          setting=setting, trace=trace)
        if keep is not None:
            if len(step.launchers) > 256:
                step.launchers.clear()
            step.launchers[keep] = trace is not None and Launcher.of(step, args, output_grads, buffers_of, buffers,
                                                                      trace, self.deterministic) or False
        return rows

    def _ready(self, step: Step, launch: Any, args: dict, grid: tuple, written: frozenset, config: tuple) -> tuple:
        """The derived kernel, its prepared variant and how each input's buffer is made: (input, shadow, zero-filled,
        in the input's own dtype) (the choices of ``_buffers``). Looked up by the launch's non-tensor arguments (the
        plan fixes its tensors' layouts): repeated backwards skip ``derive``'s lookup and ``prepare``'s checks and
        choices (microseconds each), but for checks reading tensor contents (indices), which run every time."""
        try:
            key = (grad, self.deterministic, launch.args, tuple(launch.kwargs.items()), config, grid, written,
                   launch.saved is not None)
            found = step.ready.get(key)
        except TypeError:  # an unhashable argument
            key = found = None
        if found is not None:
            if found[0].checks_contents:
                found[0].check_arguments(args, grid)
            return found
        try:
            bwd = step.derive(launch.kernel, args, self.deterministic)
        except NotDifferentiableError as e:
            raise noted(e, f"(needed to differentiate {launch} of tritongrad.op `{self.name}`)") from None
        prepared = bwd.prepare(args, grid, written, step.shared, step.self_overlapping, launch.saved)
        found = (bwd, prepared, self._buffers(step, prepared))
        if key is not None:
            if len(step.ready) > 256:
                step.ready.clear()
            step.ready[key] = found
        return found

    @staticmethod
    def _buffers(step: Step, prepared: Any) -> tuple[tuple[str, Shadow, bool, bool], ...]:
        """Per input: its shadow; zero-filled unless the kernel writes every element of the view (and no other
        input's gradient is added there: ``shared``); in the input's own dtype where it is the only gradient the
        storage gets (no other step writes it, no atomics)."""
        found = []
        for p in step.wrt:
            c = prepared.choices[p]
            sets_all = c.strategy.unfilled(c) and p not in step.shared
            found.append((p, step.shadows[p], not sets_all, p in step.sole and c.strategy.in_input_dtype()))
        return tuple(found)

    def _shadow(self, shadows: dict, shadow: Shadow, guards: dict | None = None, fill: bool = True,
                own_dtype: bool = False) -> torch.Tensor:
        """A view's shadow, its storage's buffer made on first use: zero-filled unless ``fill`` is false
        and the buffer is the view itself (then its first writer writes all of it); in the primal's dtype
        if ``own_dtype`` and the buffer is the view itself, else float32 for half types. With ``guards``
        (a checked backward) the buffer lies between zeros, ``guards[key] = (all of it, pad, size)``."""
        buffer = shadows.get(shadow.key)
        if buffer is None:
            shape, dtype, device = self.plan.buffers[shadow.key]
            if own_dtype and shadow.view is None:
                dtype = self.plan.storages[shadow.key][0]
            if guards is None and not fill and shadow.view is None:
                buffer = torch.empty(shape, dtype=dtype, device=device)
            elif guards is None:
                buffer = torch.zeros(shape, dtype=dtype, device=device)
            else:
                n = math.prod(shape)
                pad = min(max(n, GUARD[0]), GUARD[1])
                flat = torch.zeros(n + 2 * pad, dtype=dtype, device=device)
                buffer, guards[shadow.key] = flat[pad:pad + n].view(shape), (flat, pad, n)
            shadows[shadow.key] = buffer
        if shadow.view is None:
            return buffer
        size, stride, offset = shadow.view
        return buffer.as_strided(size, stride, buffer.storage_offset() + offset)

    def _input_grads(self, shadows: dict, needs: Sequence[bool]) -> list[torch.Tensor | None]:
        """Each input's gradient, such that autograd, mapping them back through the inputs' views,
        adds each memory element's gradient exactly once: an element several inputs (or one
        self-overlapping input, such as an expanded one) cover goes to the first covering position."""
        plan = self.plan
        if plan.plain_inputs:  # distinct storages, each one contiguous view, no cast: the shadows as they are
            return [shadows.get(v.key) if need else None for v, need in zip(plan.input_views, needs, strict=True)]
        keys = [v.key for v, need in zip(plan.input_views, needs, strict=True) if need and v.key in shadows]
        grads = []
        for v, shadow, need in zip(plan.input_views, plan.input_shadows, needs, strict=True):
            if not need or v.key not in shadows:
                grads.append(None)
                continue
            g = self._shadow(shadows, shadow)
            if shadow.view is not None and torch._debug_has_internal_overlap(g):
                g = g * _first_cover(v, plan.storages[v.key][1])
            elif keys.count(v.key) > 1:
                g = g.clone()
            if keys.count(v.key) > 1:
                self._shadow(shadows, shadow).zero_()
            grads.append(g if g.dtype == v.dtype else g.to(v.dtype))
        return grads


class Launcher:
    """A step's backward as an unchecked backward launched it, to launch again with a later backward's tensors
    (same plan, schedule and non-tensor arguments): saved tensors, output gradients and gradient buffers put
    where that launch had its own. A repeated backward so skips deciding the derived kernel, its variant,
    settings and arguments again (host-bound steps spent microseconds on each)."""

    def __init__(self, replayed: tuple, outputs: tuple, buffers: tuple, launches: tuple, deterministic: bool):
        self.replayed = replayed  # (parameter, saved slot or None, stand-in) as LaunchPlan.replayed
        self.outputs = outputs  # (output, its Shadow)
        self.buffers = buffers  # (input, Shadow, zero-filled, own dtype) as OpBackward._buffers
        self.launches = launches  # (derive.PartLaunch with its non-tensor arguments, (argument, source, name)...)
        self.deterministic = deterministic

    @staticmethod
    def of(step: Step, named: dict, output_grads: dict, buffers_of: tuple, buffers: dict, traced: list,
           deterministic: bool) -> Launcher | None:
        """From the launches ``traced`` (derive.PartLaunch) with these tensors; None where the launch did what is
        not traced (an interchanged kernel, zeroing an unwritten gradient) or passed a tensor from elsewhere
        (the state tapes its forward kept)."""
        sources, alike = {}, {}  # id -> (source, name); id -> what makes the tensor the same one on every call
        found = [(named[p], 0, p, ("saved", slot, stand_in)) for p, slot, stand_in in step.launch.replayed]
        found += [(t, source, p, ("shadow", step.shadows[p])) for source, tensors in ((1, output_grads), (2, buffers))
                  for p, t in tensors.items()]
        for t, source, p, same in found:
            if alike.setdefault(id(t), same) != same:  # one tensor by chance (the upstream gradient passed as an
                return None  # input, or for two outputs): another call's may be two, and go to the wrong place
            sources[id(t)] = (source, p)
        launches = []
        for t in traced:
            if t is None:
                return None
            constant, wired = {}, []
            for k, v in t.args.items():
                if isinstance(v, torch.Tensor):
                    if id(v) not in sources:
                        return None
                    wired.append((k, *sources[id(v)]))
                else:
                    constant[k] = v
            # holding no tensors; launched past Triton's argument binding (relaunch.py)
            launches.append((replace(t, args=constant, relauncher=Relauncher(t.part.kernel, t.grid)), tuple(wired)))
        outputs = tuple((o, step.shadows[o]) for o in output_grads)
        return Launcher(step.launch.replayed, outputs, buffers_of, tuple(launches), deterministic)

    def __call__(self, saved: tuple, shadows: dict, shadow: Callable) -> None:
        """Launch with ``saved`` tensors, making the shadows it writes in ``shadows`` (``shadow``: OpBackward._shadow),
        in the order the traced launch made them."""
        sources = ({p: saved[slot] if slot is not None else _stand_in(stand_in) for p, slot, stand_in in self.replayed},
                   {o: shadow(shadows, s) for o, s in self.outputs},
                   {p: shadow(shadows, s, None, fill, own) for p, s, fill, own in self.buffers})
        for traced, wired in self.launches:
            args = traced.args.copy()
            for k, source, name in wired:
                args[k] = sources[source][name]
            traced.launch(args, sources[2], self.deterministic)


def _scatter_add(view: torch.Tensor, g: torch.Tensor) -> None:
    """``view += g`` where positions of ``view`` share elements: each element gets the sum of its positions'."""
    flat = view.as_strided((view.untyped_storage().nbytes() // view.element_size(),), (1,), 0)
    index = torch.arange(flat.numel(), device=view.device).as_strided(view.shape, view.stride(), view.storage_offset())
    flat.index_add_(0, index.reshape(-1), g.reshape(-1).to(view.dtype))


def _first_cover(v: View, lo: int) -> torch.Tensor:
    """1 where a position of a self-overlapping view is the first to address its element, else 0."""
    dtype, device = torch.int64, v.device
    address = torch.arange(v.span[1] - lo, dtype=dtype, device=device).as_strided(v.size, v.stride, v.offset - lo)
    address = address.reshape(-1)
    position = torch.arange(address.numel(), dtype=dtype, device=device)
    first = torch.full((v.span[1] - lo,), address.numel(), dtype=dtype, device=device)
    first.scatter_reduce_(0, address, position, "amin")
    return (first[address] == position).reshape(v.size).to(shadow_dtype(v.dtype))


