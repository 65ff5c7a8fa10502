"""``grad`` and ``vjp``: the public entry points of the kernel transform, and the derived kernel's launcher."""

from __future__ import annotations

import ast
import functools
import inspect
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..analysis.analyze import Analysis, analyze
from ..analysis.composites import fuse_composites
from ..analysis.conditions import Expr, LaunchCheck, LaunchValues
from ..analysis.online import online_softmax
from ..analysis.stored_outputs import StoredValue, stored_values
from ..codegen import generate as codegen
from ..core.device import compiled_multiprocessors, multiprocessors
from ..core.errors import NotDifferentiableError
from ..core.ir import Program
from ..core.source import Source, unwrap
from ..frontend.normalize import normalize_kernel, normalize_tile_function
from ..frontend.specialize import decisive, plain_value
from ..reverse.interchange import NotInterchangeable
from ..reverse.loop_plans import LoopPlan, classify_loops
from ..reverse.state_tape import StateTape, tape_budget
from ..reverse.sweep import build_backward
from ..writes.input_facts import WritePlan, plan_writes
from ..writes.launch_facts import FACTS, LaunchFacts, Layout, buffer_facts, overlap
from ..writes.strategies import Choice, LaterAdds, Mode, most_trips, span_of
from . import tuning

CALLING_CONVENTION = """\
Launch it with the forward's grid and the forward's arguments, followed by one
shadow per output (d_<output>: the gradient of the loss with respect to that output,
read only) and one per wrt input (d_<input>: a buffer with the input's shape and
strides), as tritongrad's BackwardKernel does: it picks, on each launch, how each
input's gradient is written (see writes/strategies.py)."""

LATER = "its other loads' adjoints kept per program and added after the kernel"
IN_PLACE = ("updated in place, as the forward updates it: the gradient of the values it gets on entry, of the "
            "values it held on exit (zeroed where stored, the loads' gradient added)")


def shadow_dtype(dtype: Any) -> Any:
    """The dtype of a gradient buffer for a primal of ``dtype``: float32 for half types."""
    import torch

    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def defaults_of(jit_fn: Any) -> dict[str, Any]:
    """A kernel's parameters that have defaults, with them."""
    sig = inspect.signature(jit_fn.fn)
    return {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


@dataclass(eq=False)
class Prepared:
    """What launches with the same arguments share: how each input's gradient is written, the compiled
    variant for that, and its kernels' tuned launch settings (one per part) once the first launch has timed them."""

    choices: dict[str, Choice]
    variant: Variant  # reading the state tapes the forward kept (augment.py) where its parts are ``saved``
    shared: frozenset[str] = frozenset()  # inputs whose buffers overlap another's (launch_facts.py): written after
    # the kernels (partial rows, kernels of their own) or into buffers of their own (``private``)
    settings: tuple[tuning.Setting, ...] | None = None

    @functools.cached_property
    def private(self) -> tuple[str, ...]:
        """Inputs stored into buffers of their own, added to theirs after the kernels (in this order)."""
        return tuple(p for p, c in self.choices.items() if c.private)

    @functools.cached_property
    def covered_rows(self) -> frozenset[str]:
        """Inputs summed in registers whose loads cover the tensor: each program stores its whole partial row
        (a launch's choice: the variant's code is the same either way)."""
        return frozenset(p for p, c in self.choices.items() if c.mode == Mode.REGISTERS and c.covers)


@dataclass(frozen=True)
class Part:
    """One kernel of a variant: the gradients of ``wrt``, launched with the forward's grid, except along
    ``axis`` (a persistent kernel: a few programs per multiprocessor; an interchanged one: ``trips``)."""

    wrt: tuple[str, ...]
    src: str
    kernel: Any
    shadows: dict[str, str]  # output or input -> its shadow parameter in this kernel
    programs: str | None  # persistent or interchanged: the parameter holding the forward's program count
    rows: dict[str, str]  # partial inputs -> the parameter holding their partial rows' stride
    axis: int | None
    trips: Expr | None  # interchanged: the programs along ``axis`` (the trip count of the loop it takes)
    written: frozenset[str]  # inputs whose gradient it writes
    tapes: tuple[StateTape, ...] = ()  # nonlinear loops' state tapes, allocated on each launch
    later_adds: tuple[LaterAdds, ...] = ()  # loads whose adjoints are added after the kernel
    saved: bool = False  # its tapes come filled from the forward (augment.py), not allocated
    prologue: Any = None  # interchanged: the kernel computing per forward program values first (on its grid)
    exports: StateTape | None = None  # the prologue's values, allocated on each launch
    loops: bool = False  # its body has a loop (tuning also tries how many of its loads are in flight)
    stages: str | None = None  # persistent: the constexpr parameter of its loop's pipelining (setting.num_stages)
    held: str | None = None  # persistent: the constexpr parameter holding its loads across the loop (setting.held)
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # launch-time lookups, made once

    @property
    def persistent(self) -> bool:
        """A few programs per multiprocessor along ``axis`` (tuning tries several counts)."""
        return self.axis is not None and self.trips is None

    def scratch_args(self, args: dict[str, Any], grid: tuple[int, ...]) -> None:
        """The kernel's scratch buffers for a launch on ``grid`` (state tapes, later adds), added to ``args``."""
        if not self.later_adds and (self.saved or not self.tapes):
            return
        programs, device = math.prod(grid), _device_of(args)
        for tape in self.tapes if not self.saved else ():
            args.update(tape.allocate(LaunchValues(args, grid), programs, device))
        for later in self.later_adds:
            args.update(later.allocate(LaunchValues(args, grid), programs, args[self.shadows[later.param]]))

    def add_later(self, args: dict[str, Any], deterministic: bool) -> None:
        """After the kernel: its later loads' adjoints added into their inputs' gradients."""
        for later in self.later_adds:
            target = args[self.shadows[later.param]]
            later.add(args, target, span_of(target), deterministic)


@dataclass(frozen=True)
class PartialRows:
    """An input a persistent kernel sums in partial rows: one float32 row per program (float64 for float64),
    summed in a fixed order after the kernel into the input's gradient buffer."""

    input: str
    param: str  # the kernel's shadow parameter of the input: the rows, less their padding
    programs: int
    span: int  # the elements of the gradient buffer a row covers
    dtype: Any
    unfilled: bool  # every program stores its whole row (Prepared.covered_rows): no zero-fill
    pad: int  # zeros on each side of a row (a checked backward looks for gradient there)
    how: str  # how the rows reach the buffer: "into" (torch.sum's out=), "add" (to gradient there), "copy"

    @staticmethod
    def of(part: Part, p: str, programs: int, target: Any, covered: bool, written: bool, pad: int) -> PartialRows:
        import torch

        dtype = torch.float64 if target.dtype == torch.float64 else torch.float32
        how = "add" if written else "into" if target.dtype == dtype and target.is_contiguous() else "copy"
        return PartialRows(p, part.shadows[p], programs, span_of(target), dtype, covered and not pad, pad, how)

    @property
    def width(self) -> int:
        return self.span + 2 * self.pad

    def allocate(self, args: dict[str, Any], device: Any) -> Any:
        """The rows (with their padding), their view without it put in ``args``."""
        fill = _empty_strided if self.unfilled else _zeros_strided
        rows = fill((self.programs, self.width), (self.width, 1), dtype=self.dtype, device=device)
        args[self.param] = rows[:, self.pad:] if self.pad else rows  # (slicing a tensor costs microseconds)
        return rows

    def sum(self, rows: Any, target: Any) -> None:
        """The rows summed in order into ``target``: one kernel where the sum can be written straight into it."""
        import torch

        if self.pad:
            rows = rows[:, self.pad:self.pad + self.span]
        if self.how == "into":
            torch.sum(rows, 0, out=target.view(-1))
        elif self.how == "add":
            target.add_(rows.sum(0).as_strided(target.size(), target.stride()))
        else:
            target.copy_(rows.sum(0).as_strided(target.size(), target.stride()))


@dataclass(frozen=True)
class PartLaunch:
    """One kernel of a variant launched (:meth:`BackwardKernel._run_part`), and as a backward keeps it to launch
    again with other tensors of the same layouts (replay.Launcher: ``args`` then holds no tensors)."""

    part: Part
    grid: tuple[int, ...]
    args: dict[str, Any]  # its arguments but its partial rows and scratch (Part.scratch_args)
    partials: tuple[PartialRows, ...]  # the partial rows it sums into its inputs' buffers
    relauncher: Any = field(default=None, compare=False)  # relaunch.Relauncher, where kept by a backward

    def launch(self, args: dict[str, Any], buffers: dict[str, Any], deterministic: bool, reduce: bool = True) -> list:
        """Launch with ``args`` (its arguments but the partial rows and scratch, made here): ``reduce``: then its
        later adds and partial rows summed into ``buffers`` (not in tuning's trials). Returns the partial rows."""
        rows = [r.allocate(args, buffers[r.input].device) for r in self.partials]
        part = self.part
        part.scratch_args(args, self.grid)
        if self.relauncher is not None:
            self.relauncher(args)
        else:
            part.kernel[self.grid](**args)
        if reduce:
            part.add_later(args, deterministic)
            for r, found in zip(self.partials, rows, strict=True):
                r.sum(found, buffers[r.input])
        return rows


@dataclass(frozen=True)
class Variant:
    """The backward kernels compiled for one way of writing each input's gradient: one for all inputs, but
    for those given a kernel of their own (``interchange``)."""

    choices: tuple[tuple[str, Choice], ...]  # wrt input -> how its gradient is written
    parts: tuple[Part, ...]
    unwritten: frozenset[str]  # inputs no kernel writes anything for: their buffers are zero-filled

    @property
    def src(self) -> str:
        return "\n\n".join(part.src for part in self.parts)

    @functools.cached_property
    def reads_saved(self) -> bool:
        """Whether a kernel reads the state tapes the forward kept."""
        return any(part.saved for part in self.parts)

    @property
    def kernel(self) -> Any:
        return self.parts[0].kernel

    @property
    def persistent(self) -> bool:
        """Whether a kernel runs a few programs per multiprocessor (tuning tries several counts)."""
        return any(part.persistent for part in self.parts)


class BackwardKernel:
    """A derived backward kernel.

    ``params``: the forward's parameters, then ``d_<name>`` for each output, then for each
    ``wrt`` input. ``bwd[grid](*forward_args, *output_grads, *input_grads)`` launches it
    with the forward's grid: output shadows hold the incoming gradients; the gradients are
    *added* to the input buffers (zero-fill them first, or pass buffers holding a gradient
    to add to). :meth:`gradients` allocates the input gradients itself and returns them:
    the fast path, where a gradient each element of which is written once is stored in the
    input's dtype without a zero-fill. How each input's gradient is written is decided on
    each launch (writes/strategies.py); ``src`` is the kernel where every condition holds.
    """

    def __init__(self, forward: Any, program: Program, analysis: Analysis, loop_plans: dict[int, LoopPlan],
                 writes: WritePlan, deterministic: bool, read_back: dict[str, StoredValue] | None = None):
        self.forward = forward
        self.read_back = read_back or {}  # values its replay may read from the outputs holding them
        self.program, self.analysis, self.loop_plans = program, analysis, loop_plans
        self.writes = writes
        self.deterministic = deterministic
        self.wrt, self.outputs = analysis.wrt, analysis.outputs
        self.in_place = analysis.in_place  # inputs updated in place: their shadow is the output's too
        self.store_axes = {k: frozenset(v) for k, v in analysis.store_axes.items()}
        self.launch_checks: tuple[LaunchCheck, ...] = tuple(analysis.launch_checks)
        self._variants: dict[tuple, Variant] = {}
        self._parts: dict[tuple, Part] = {}
        self._variants_lock = threading.Lock()
        self._checked: set = set()  # (grid, argument values) the launch checks passed for
        self._chosen: dict[tuple, dict[str, Choice]] = {}  # (grid, arguments, written) -> choices
        self._most_trips: dict[tuple, int] = {}  # (part, grid, arguments) -> the programs of an interchanged kernel
        self.not_interchanged: dict[str, str] = {}  # input -> why it cannot have a kernel of its own
        self.saved_writes = writes  # for a launch whose forward kept its loops' states (augment.py)
        self._keep_feasible_interchanges()
        best = self.variant(self.writes.best())  # derived now, so that what cannot be differentiated says so now
        if not any(part.wrt == self.wrt for part in best.parts):  # the calling convention's shadow names
            self.variant({p: Choice(Mode.ATOMIC) for p in self.wrt})
        self.params = (*program.param_names(), *self.shadow_params.values())
        self.requested: tuple = (None, None)  # the wrt and outputs asked for (grad sets them)
        self.specialization: dict[str, Any] = {}  # values of the constexprs its source was specialized for
        self.kept_outputs: tuple[str, ...] = ()  # as grad was given them
        if deterministic:
            self._refuse_atomics({p: c for p, c in best.choices})

    def _keep_feasible_interchanges(self) -> None:
        """Drop the interchanges whose backward body cannot give its loop to the grid (interchange.py); keep
        in ``saved_writes`` those it can give where it reads the loops' states the forward kept (an attention
        backward's: without them, it replays the forward's loop in every program)."""
        for param, facts in self.writes.inputs.items():
            for axis in list(facts.interchange):
                try:
                    self._part({param: Choice(Mode.INTERCHANGE, axis)})
                except NotInterchangeable as e:
                    self.not_interchanged[param] = str(e)
                    self.writes = self.writes.without_interchange(param)
                    try:
                        self._part({param: Choice(Mode.INTERCHANGE, axis)}, saved=True)
                    except NotInterchangeable:
                        self.saved_writes = self.saved_writes.without_interchange(param)
                    else:
                        self.not_interchanged[param] += " (it has one where an op's forward keeps that loop's state)"
                    break

    # -- the kernel --------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"{self.program.name}_bwd"

    @property
    def src(self) -> str:
        """The kernel where every launch condition holds (what ``tritongrad show`` prints)."""
        return self.variant(self.writes.best()).src

    @property
    def kernel(self) -> Any:
        return self.variant(self.writes.best()).kernel

    @property
    def shadow_params(self) -> dict[str, str]:
        """Primal parameter -> its shadow parameter, outputs first."""
        return self._shadow_params

    def variant(self, choices: dict[str, Choice], saved: bool = False) -> Variant:
        """The kernels for these choices, derived and compiled on first use; ``saved``: the first kernel reads
        the state tapes the forward kept (augment.py) instead of recording them."""
        key = tuple((p, Choice(c.mode, c.axis, later=c.later, fill=c.fill))  # a zero-fill is not code
                    for p, c in choices.items())
        with self._variants_lock:
            found = self._variants.get((key, saved))
            if found is None:
                found = self._variants[(key, saved)] = self._build(dict(key), saved)
        return found

    def saved_tapes(self) -> tuple[StateTape, ...]:
        """The tapes a forward keeps for the variant a typical launch reads them with (augment.py): each of its
        kernels' (state tapes, loops' finals), once; none where a kernel runs other programs than the forward's
        (persistent; an interchanged one reads the forward's finals by the forward's program it loops over)."""
        parts = self.variant(self.saved_writes.best(), saved=True).parts
        if any(part.persistent for part in parts):
            return ()
        kept: dict[tuple, StateTape] = {}
        for tape in (tape for part in parts for tape in part.tapes):
            kept[tape.key] = kept[tape.key].joined(tape) if tape.key in kept else tape
        return tuple(kept.values())

    def _build(self, choices: dict[str, Choice], saved: bool = False) -> Variant:
        own = [p for p, c in choices.items() if c.strategy.own_kernel]
        rest = {p: c for p, c in choices.items() if p not in own}
        parts = [self._part(rest, saved)] if not own or any(c.mode != Mode.NONE for c in rest.values()) else []
        by_loop: dict[tuple, dict[str, Choice]] = {}  # inputs whose iterations are the same: one kernel (dK, dV)
        for p in own:
            by_loop.setdefault((choices[p].axis, self.saved_writes.inputs[p].trips), {})[p] = choices[p]
        for group in by_loop.values():
            try:
                parts.append(self._part(group, saved))
            except NotInterchangeable:  # each alone can (_keep_feasible_interchanges), together not
                parts += [self._part({p: c}, saved) for p, c in group.items()]
        parts = tuple(parts)
        written = set().union(*[part.written for part in parts])
        return Variant(tuple(choices.items()), parts, frozenset(p for p in self.wrt if p not in written))

    def _part(self, choices: dict[str, Choice], saved: bool = False) -> Part:
        """The kernel writing the gradients of the inputs in ``choices`` (all of them, or one interchanged)."""
        key = (tuple(choices.items()), saved)
        if key in self._parts:
            return self._parts[key]
        program, wrt = self.program, tuple(choices)
        analysis, plans = self.analysis, self.loop_plans
        if wrt != self.wrt:  # fewer inputs: their own activity, loop plans, and kernel name
            analysis = analysis.restricted(wrt)
            plans = classify_loops(analysis)
        name = self.name if wrt == self.wrt else f"{self.name}_{'_'.join(wrt)}"
        backward = build_backward(analysis, plans, choices=choices, saved=saved, read_back=self.read_back)
        shadows = dict(zip(dict.fromkeys((*self.outputs, *wrt)), backward.shadow_params, strict=True))
        if wrt == self.wrt:
            self._shadow_params = shadows
        writes = "".join(f"\n  d_{p}: {IN_PLACE if p in analysis.in_place else c.strategy.describes}"
                         + (f"; {LATER} ({', '.join(c.later)})" if c.later and c.mode in (Mode.STORE, Mode.ADD)
                            else "")
                         for p, c in choices.items())
        doc = (f"Backward of `{program.name}`, derived by tritongrad.\n\n"
               f"wrt: {', '.join(wrt) or '(none)'}; outputs: {', '.join(analysis.outputs)}.\n"
               f"{CALLING_CONVENTION}\nIn this variant:{writes or ' (no inputs)'}\n")
        src = codegen.function_source(program, backward, name, doc.replace("\n", "\n    "), tile=False)
        kernel = codegen.compile_kernel(src, name, program)
        prologue = None
        if backward.prologue is not None:  # its source first: what it computes, then what reads it
            first = replace(backward, body=backward.prologue.body, extra_params=[], later_adds=[])
            rounded = backward.prologue.rounded
            values = ", ".join(f"{n} (kept as {rounded[n]}, the type each of its uses rounds it to)"
                               if n in rounded else n for n in backward.prologue.tape.sources)
            about = (f"Prologue of `{name}`: per program of the forward's grid, the values each of its programs "
                     f"would recompute\nfor every forward program it loops over ({values}).")
            prologue_src = codegen.function_source(program, first, f"{name}_prologue", about.replace("\n", "\n    "),
                                                   tile=False)
            prologue = codegen.compile_kernel(prologue_src, f"{name}_prologue", program)
            src = f"{prologue_src}\n\n{src}"
        programs, rows = None, {}
        if backward.extra_params:
            programs, *strides = backward.extra_params
            rows = dict(zip([p for p, c in choices.items() if c.strategy.partial_rows], strides, strict=True))
        axis = next((c.axis for c in choices.values() if c.strategy.partial_rows or c.strategy.own_kernel), None)
        trips = next((self.saved_writes.inputs[p].trips for p, c in choices.items() if c.strategy.own_kernel),
                     None)
        part = self._parts[key] = Part(wrt, src, kernel, shadows, programs, rows, axis, trips,
                                       frozenset(backward.written_inputs), tuple(backward.tapes),
                                       tuple(backward.later_adds), saved, prologue,
                                       backward.prologue.tape if prologue is not None else None,
                                       any(isinstance(n, ast.For) for n in ast.walk(ast.Module(backward.body, []))),
                                       backward.loop_stages, backward.loop_held)
        return part

    # -- launching ---------------------------------------------------------------------------------

    @functools.cached_property
    def _forward_defaults(self) -> dict[str, Any]:
        return defaults_of(self.forward)

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """A launch's arguments by parameter name: positional ones fill the parameters not given by keyword,
        in order; when there are too few, the forward's defaulted parameters take their defaults."""
        defaults = self._forward_defaults
        free = [p for p in self.params if p not in kwargs]
        if len(args) < len(free):
            free = [p for p in free if p not in defaults]
        if len(args) != len(free):
            raise TypeError(f"{self.name} takes {len(free)} positional arguments here ({', '.join(free)}), "
                            f"got {len(args)}")
        return {**defaults, **dict(zip(free, args, strict=True)), **kwargs}

    def for_launch(self, named: Mapping[str, Any]) -> BackwardKernel:
        """The backward kernel of the specialization a launch runs (itself when no constexpr decides a branch)."""
        decisive = decisive_constexprs(self.forward)
        values = {k: plain_value(named[k]) for k in decisive if k in named}
        if values == self.specialization:
            return self
        wrt, outputs = self.requested
        return grad(self.forward, wrt, outputs, deterministic=self.deterministic, constexprs=values,
                    kept_outputs=self.kept_outputs)

    def __getitem__(self, grid: Any):
        def run(*args: Any, **kwargs: Any) -> None:
            named = self.bind(args, kwargs)
            specialized = self.for_launch(named)
            if specialized is not self:
                return specialized[grid](**named)
            sizes = _sizes(grid(named) if callable(grid) else grid)
            output_grads = {p: named.pop(self.shadow_params[p]) for p in self.outputs}
            buffers = {p: output_grads[p] if p in output_grads else named.pop(self.shadow_params[p]) for p in self.wrt}
            self.check_buffers(named, output_grads, buffers)
            self.check_default_wrt(named)
            written = frozenset(self.wrt)
            shared, self_overlapping = buffer_facts({p: buffers[p] for p in self.wrt if p not in self.in_place})
            prepared = self.prepare(named, sizes, written, shared, self_overlapping)
            self.launch(sizes, named, output_grads, buffers, prepared, written)

        return run

    def gradients(self, grid: Any, named: dict[str, Any], output_grads: dict[str, Any], saved: Any = None
                  ) -> dict[str, Any]:
        """The gradients of the ``wrt`` inputs of the forward launch ``named`` (its arguments by parameter
        name) given the gradients of its outputs (tensors with the outputs' shapes and strides): each
        allocated as its write strategy needs (empty where it is stored everywhere) in the input's dtype, or
        float32 for half-precision inputs added atomically. ``saved``: the state tapes the launch's augmented
        forward kept (augment.py)."""
        import torch

        named = {**self._forward_defaults, **named}
        specialized = self.for_launch(named)
        if specialized is not self:
            return specialized.gradients(grid, named, output_grads, saved)
        sizes = _sizes(grid(named) if callable(grid) else grid)
        self.check_buffers(named, output_grads)
        self.check_default_wrt(named)
        prepared = self.prepare(named, sizes, saved=saved)  # a buffer of its own per input: none is shared
        grads = {}
        for p in self.in_place:  # one buffer: the new values' gradient in, the old values' out
            x = named[p]
            grads[p] = torch.empty_strided(x.size(), x.stride(), dtype=shadow_dtype(x.dtype), device=x.device)
            output_grads = {**output_grads, p: grads[p].copy_(output_grads[p])}
        for p in self.wrt:
            if p in self.in_place:
                continue
            x, c = named[p], prepared.choices[p]
            fill = torch.empty_strided if c.strategy.unfilled(c) else _zeros_strided
            dtype = x.dtype if c.strategy.in_input_dtype() else shadow_dtype(x.dtype)
            grads[p] = fill(x.size(), x.stride(), dtype=dtype, device=x.device)
        self.launch(sizes, named, output_grads, grads, prepared, saved=saved)
        return grads

    def check_buffers(self, named: dict[str, Any], output_grads: dict[str, Any],
                      buffers: dict[str, Any] | None = None) -> None:
        """Refuse a direct launch whose gradient buffers the kernel could not address as its calling convention
        says (each with its primal's sizes and strides, on its device: else it writes outside them), that
        writes an input's gradient where it reads an output's, or whose forward read an input where it wrote
        an output (the backward replays the forward's loads: they would read what it stored). An op's backward
        makes its buffers itself, and its tape refuses such forwards."""
        given = [(o, g, "output") for o, g in output_grads.items()] + [
            (p, b, "input") for p, b in (buffers or {}).items() if p not in self.in_place]
        for name, g, role in given:
            x = named.get(name)
            if not hasattr(x, "stride"):
                continue
            shadow = self.shadow_params.get(name, f"d_{name}")
            if not hasattr(g, "stride"):
                raise TypeError(f"{self.name}: `{shadow}` (the gradient of the {role} `{name}`) must be a tensor, "
                                f"got {type(g).__name__}")
            if tuple(g.shape) != tuple(x.shape) or (g.stride() != x.stride() and g.numel() > 1) \
                    or g.device != x.device:
                raise ValueError(f"{self.name}: `{shadow}` must have `{name}`'s sizes {tuple(x.shape)} and strides "
                                 f"{x.stride()} on {x.device} (the kernel addresses it as it addresses `{name}`); got "
                                 f"sizes {tuple(g.shape)}, strides {g.stride()} on {g.device}")
            if not g.dtype.is_floating_point:
                raise TypeError(f"{self.name}: `{shadow}` must be a floating-point tensor, got {g.dtype}")
        layouts = {("d", name): Layout.of(g) for name, g, _ in given if hasattr(g, "data_ptr")}
        layouts.update({("x", p): Layout.of(named[p]) for p in (*self.wrt, *self.outputs)
                        if hasattr(named.get(p), "data_ptr")})
        for p in (buffers or {}):
            for o in output_grads:
                if p not in self.in_place and ("d", p) in layouts and ("d", o) in layouts \
                        and overlap(layouts[("d", p)], layouts[("d", o)]):
                    raise ValueError(f"{self.name}: the gradient buffer of `{p}` overlaps the gradient of the output "
                                     f"`{o}`: the kernel would write one where it reads the other; pass separate "
                                     "tensors")
        for p in self.wrt:
            for o in self.outputs:
                if p != o and p not in self.in_place and ("x", p) in layouts and ("x", o) in layouts \
                        and overlap(layouts[("x", p)], layouts[("x", o)]):
                    raise NotDifferentiableError(
                        f"`{p}` and the output `{o}` share memory: the forward stored over what it read, and the "
                        "backward, which replays the forward's loads, would read what it stored",
                        file=self.forward.fn.__code__.co_filename, line=self.forward.fn.__code__.co_firstlineno,
                        hint="pass an output that does not overlap the inputs (or update the input in place: load "
                             "and store it through one parameter)")

    def check_default_wrt(self, named: dict[str, Any]) -> None:
        """Refuse a direct launch that passes a floating-point tensor to a pointer the default ``wrt`` leaves out
        because its values also make addresses (``j = tl.argmax(x); tl.load(x_ptr + j)``): derivation could not
        tell it from an index tensor, and its gradient would be silently missing. (An op sees the tensor's dtype
        and differentiates it.)"""
        if self.requested[0] is not None:
            return
        for p in sorted(set(self.analysis.index_pointers) - set(self.wrt) - set(self.analysis.stores)):
            t = named.get(p)
            if getattr(t, "dtype", None) is not None and t.dtype.is_floating_point:
                load = self.analysis.loads[p][0].tg.where
                raise NotDifferentiableError(
                    f"a {t.dtype} tensor passed to `{p}`, whose loaded values also make addresses: the default wrt "
                    "(derived without the tensors' dtypes) leaves it out as an index tensor",
                    file=load.file, line=load.line, source_line=load.text,
                    hint=f"name it: tritongrad.grad(kernel, wrt={(*self.wrt, p)!r}) "
                         "gives its gradient (zero where it only makes addresses); a tritongrad.op does so itself")

    def choose(self, named: dict[str, Any], grid: tuple[int, ...], written: frozenset[str] = frozenset(),
               shared: frozenset[str] = frozenset()) -> dict[str, Choice]:
        """How each input's gradient is written for this launch (see :meth:`prepare`)."""
        return self.prepare(named, grid, written, shared).choices

    def prepare(self, named: dict[str, Any], grid: tuple[int, ...], written: frozenset[str] = frozenset(),
                shared: frozenset[str] = frozenset(), self_overlapping: frozenset[str] | None = None,
                saved: Any = None) -> Prepared:
        """Check the launch (grid, store conditions, dtypes), choose how each input's gradient is written
        and get the variant for that; cached per arguments the choice depends on. The gradient buffers'
        facts (launch_facts.py): ``written``: inputs whose buffers already hold gradient to add to; ``shared``:
        inputs whose buffers overlap another input's; ``self_overlapping``: inputs whose buffers reach one
        element from several positions (None: those whose tensors do, the calling convention's buffers having
        their inputs' layouts). ``saved``: the state tapes the forward kept (augment.SavedStates), read by the
        variant where it needs no others."""
        written = written | self.in_place  # its buffer holds the new values' gradient
        self.check_grid(grid)
        self.check_arguments(named, grid)
        for name in self.wrt:  # an integer tensor has no gradient: say so, rather than return zeros
            dtype = getattr(named.get(name), "dtype", None)
            if dtype is not None and not dtype.is_floating_point:
                raise TypeError(f"{self.name}: wrt names `{name}`, but the tensor passed there is {dtype}; "
                                "only floating-point inputs have gradients")
        if self_overlapping is None:
            self_overlapping = buffer_facts({p: named.get(p) for p in self.wrt if p not in self.in_place})[1]
        shared = shared - self.in_place
        key = (grid, written, shared, self_overlapping, saved is not None,
               *[_describe(named.get(n)) for n in self._chosen_names])
        prepared = self._chosen.get(key)
        if prepared is None:
            device = next((t.device for p in self.wrt if hasattr(t := named.get(p), "device")), None)
            writes = self.saved_writes if saved is not None else self.writes
            parallel = multiprocessors(device)
            facts = LaunchFacts(LaunchValues(named, grid), written, shared, self_overlapping, parallel,
                                tape_budget(device), max(tuning.WAVES) * parallel)
            choices = writes.choose(facts, deterministic=self.deterministic)
            if self.deterministic:
                self._refuse_atomics(choices, self_overlapping)
            variant = self.variant(choices, saved=saved is not None)
            if saved is not None and not _reads_only(variant, saved.tapes):
                return self.prepare(named, grid, written, shared, self_overlapping)
            if len(self._chosen) > 4096:
                self._chosen.clear()
            prepared = self._chosen[key] = Prepared(choices, variant, shared)
        return prepared

    @functools.cached_property
    def _chosen_names(self) -> tuple[str, ...]:
        """The arguments the write strategies' conditions read, and the inputs and outputs (their dtypes and layouts
        decide the tuned launch setting)."""
        names = {*self.wrt, *self.outputs}
        for facts in self.writes.inputs.values():
            for c in (facts.owned, facts.covers, *facts.shared.values(), *facts.interchange.values()):
                names |= c.names() if c is not None else set()
        return tuple(sorted(names & set(self.params)))

    def launch(self, grid: tuple[int, ...], named: dict[str, Any], output_grads: dict[str, Any],
               buffers: dict[str, Any], prepared: Prepared, written: frozenset[str] = frozenset(),
               pad: int = 0, saved: Any = None, setting: tuning.Setting | None = None,
               trace: list | None = None) -> dict[str, tuple[Any, int]]:
        """Run the prepared variant (:meth:`prepare`). ``named``: the forward's arguments (and launch options);
        ``output_grads``: output -> its incoming gradient; ``buffers``: wrt input -> its gradient buffer
        (stored into or added to; an input summed in partial rows gets their sum, added if in ``written``).
        ``pad``: zeros around each partial row, to look for gradient outside the tensor (a checked backward).
        Launch settings are tuned on a GPU (tuning.py). ``saved``: the state tapes the forward kept
        (augment.SavedStates), for a variant prepared to read them. ``setting``: launch with this one, untimed
        (a trial of tuning another config). ``trace``: each kernel's launch is appended to it (:class:`PartLaunch`).
        Returns the partial rows: input -> (rows with their padding, pad)."""
        variant = prepared.variant
        tapes = saved if variant.reads_saved else None
        if self.in_place:
            written = written | self.in_place
        if prepared.shared:  # overlapping another input's buffer: added after the kernels (partial rows, own kernels)
            written = written | prepared.shared
        own, guarded = {}, {}
        for p in prepared.private:  # stored into buffers of their own (float32 for half types), added after; in a
            b = buffers[p]  # checked backward with ``pad`` zeros around, returned with the partial rows to look at
            fill = _empty_strided if prepared.choices[p].covers and not pad else _zeros_strided
            flat = fill((1, span_of(b) + 2 * pad), (1, 1), dtype=shadow_dtype(b.dtype), device=b.device)
            own[p] = flat.as_strided(b.size(), b.stride(), flat.storage_offset() + pad)
            if pad:
                guarded[p] = (flat, pad)
        if own:
            real, buffers = buffers, {**buffers, **own}
        # inputs no gradient reaches: zeroed (a stored one would be left unset)
        for p in variant.unwritten - written if variant.unwritten else ():
            buffers[p].zero_()
            if trace is not None:
                trace.append(None)  # not made again by a replay.Launcher
        if setting is not None:
            settings = (setting,) * len(variant.parts)
        else:
            if prepared.settings is None:
                prepared.settings = self._tuned(variant, grid, named, output_grads, buffers, written, tapes)
            settings = prepared.settings
        rows = self._run(variant, grid, named, output_grads, buffers, settings, written, pad, tapes=tapes,
                         covered=prepared.covered_rows, trace=trace)
        for p, b in own.items():  # in a fixed order: deterministic
            real[p].add_(b)
        if own and trace is not None:
            trace.append(None)  # buffers of its own, made on each launch: not kept (replay.Launcher)
        return {**rows, **guarded}

    def _tuned(self, variant: Variant, grid: tuple[int, ...], named: dict[str, Any], output_grads: dict[str, Any],
               buffers: dict[str, Any], written: frozenset[str], tapes: Any = None) -> tuple[tuning.Setting, ...]:
        """The launch setting of each of a prepared launch's kernels: timed on a GPU (tuning.py), each kernel
        alone (a dQ and a dK/dV kernel of attention rarely want the same warps), else the forward's."""
        device = next((t.device for t in buffers.values()), None)
        if self.deterministic or not tuning.enabled(device):
            return (tuning.DEFAULT,) * len(variant.parts)
        key = (id(self), variant.choices, bool(tapes), grid, tuning.describe({**named, **output_grads, **buffers}))
        settings = []
        for i, part in enumerate(variant.parts):
            touched = [buffers[p] for p, c in variant.choices if p in part.wrt and c.strategy.adds_in_kernel]

            def trial(s: tuning.Setting, i: int = i) -> None:  # the trials add into ``touched``: restored after
                rows = self._run(variant, grid, named, output_grads, buffers, (s,) * len(variant.parts), written, 0,
                                 reduce=False, tapes=tapes, only=i)
                for found, _ in rows.values():  # summing the partial rows is part of a setting's cost: more
                    found.sum(0)  # programs, more rows (8 per multiprocessor at 16384 columns: 52 µs against 7)

            settings.append(tuning.best((*key, i), part.persistent, trial, touched, part.loops, part.held is not None))
        return tuple(settings)

    def _run(self, variant: Variant, grid: tuple[int, ...], named: dict[str, Any], output_grads: dict[str, Any],
             buffers: dict[str, Any], settings: tuple[tuning.Setting, ...], written: frozenset[str], pad: int,
             reduce: bool = True, tapes: Any = None, only: int | None = None,
             covered: frozenset[str] = frozenset(), trace: list | None = None) -> dict:
        """One launch of each of the variant's kernels (``only``: of that one) with its setting; partial rows
        allocated (unfilled for ``covered`` inputs: Prepared.covered_rows), and summed into their targets
        (``reduce``: not in tuning's trials). ``tapes``: the state tapes the forward kept (augment.SavedStates),
        for the kernels that read them."""
        rows = {}
        for i, (part, setting) in enumerate(zip(variant.parts, settings, strict=True)):
            if only is not None and i != only:
                continue
            args = {**named, **{part.shadows[o]: g for o, g in output_grads.items()}}
            args.update({part.shadows[p]: buffers[p] for p in part.wrt})
            if part.saved:
                args.update(_tape_args(part, tapes))
            if setting.num_warps is not None:
                args["num_warps"] = setting.num_warps
            if setting.num_stages is not None:
                args["num_stages"] = setting.num_stages
            if part.stages is not None:  # untuned: one stage, the least shared memory
                args[part.stages] = setting.num_stages or 1
            if part.held is not None:
                args[part.held] = setting.held
            if part.trips is not None:
                self._run_interchanged(part, grid, args, buffers, written, reduce)
                if trace is not None:
                    trace.append(None)  # trip counts and exports made on each launch: not kept
            else:
                rows.update(self._run_part(part, grid, args, buffers, setting, written, pad, reduce, covered, trace))
        return rows

    def _run_part(self, part: Part, grid: tuple[int, ...], args: dict[str, Any], buffers: dict[str, Any],
                  setting: tuning.Setting, written: frozenset[str], pad: int, reduce: bool,
                  covered: frozenset[str] = frozenset(), trace: list | None = None) -> dict:
        """``covered``: inputs whose partial rows every program stores whole (left unfilled, but around a checked
        backward's padding)."""
        partials = ()
        if part.axis is not None:  # persistent: a few programs along the axis, each with its partial rows
            axis = part.axis
            programs = _persistent_programs(grid[axis], next(iter(buffers.values())).device, setting.waves)
            args[part.programs] = grid[axis]
            grid = (*grid[:axis], programs, *grid[axis + 1:])
            partials = tuple(PartialRows.of(part, p, programs, buffers[p], p in covered, p in written, pad)
                             for p in part.rows)
            args.update({part.rows[r.input]: r.width for r in partials})
        launch = PartLaunch(part, grid, args, partials)
        if trace is not None and reduce:
            trace.append(replace(launch, args=dict(args)))  # before its partial rows and scratch are made
        rows = launch.launch(args, buffers, self.deterministic, reduce)
        return {r.input: (found, pad) for r, found in zip(partials, rows, strict=True)}

    def _run_interchanged(self, part: Part, grid: tuple[int, ...], args: dict[str, Any], buffers: dict[str, Any],
                          written: frozenset[str], reduce: bool) -> None:
        """Inputs' own kernel: one program per iteration of their loop along the axis, each storing its sums.
        Into buffers of their own where gradient is already there to add to."""
        import torch

        axis = part.axis
        names = part.memo.get("trips")
        if names is None:
            names = part.memo["trips"] = sorted(part.trips.names())
        key = (id(part), grid, *[args.get(n) for n in names])
        trips = self._most_trips.get(key)
        if trips is None:
            if len(self._most_trips) > 4096:
                self._most_trips.clear()
            trips = self._most_trips[key] = int(most_trips(part.trips, LaunchValues(args, grid), axis))
        args[part.programs] = grid[axis]
        forward, grid = grid, (*grid[:axis], trips, *grid[axis + 1:])
        own = {p: torch.zeros_like(buffers[p]) for p in part.wrt if p in written}
        args.update({part.shadows[p]: buffer for p, buffer in own.items()})
        if part.prologue is not None and min(forward) > 0:  # on the forward's grid, before the kernel reading it
            args.update(part.exports.allocate(LaunchValues(args, forward), math.prod(forward), _device_of(args)))
            part.prologue[forward](**{k: v for k, v in args.items() if k in part.prologue.arg_names})
        if min(grid) > 0:
            part.scratch_args(args, grid)
            part.kernel[grid](**args)
        for p, buffer in own.items() if reduce else ():
            buffers[p].add_(buffer)

    def _refuse_atomics(self, choices: dict[str, Choice], self_overlapping: frozenset[str] = frozenset()) -> None:
        for p, c in choices.items():
            if c.mode == Mode.ATOMIC:
                load = self.analysis.loads[p][0]
                where = load.tg.where
                why = ("the tensor passed reaches one element from several positions (expanded, stride 0)"
                       if p in self_overlapping else self.writes.inputs[p].why
                       or "this launch does not keep its addresses apart")
                raise NotDifferentiableError(
                    f"`{p}` with deterministic=True: its gradient can only be added atomically here ({why})",
                    file=where.file, line=where.line, source_line=where.text,
                    hint="atomic additions land in a different order on each run; drop deterministic=True, or "
                         "load each element of the input once per launch")

    def check_grid(self, grid: tuple[int, ...]) -> None:
        """Refuse a grid in which several programs store to one output element.

        If an output's store address does not depend on a program axis, every program
        along that axis writes the same elements and the last one wins: only its values
        would deserve the gradient, which the derived kernel cannot tell apart.
        """
        for output, axes in self.store_axes.items():
            for axis, size in enumerate(grid):
                if size > 1 and axis not in axes:
                    raise NotDifferentiableError(
                        f"a grid of {size} programs along axis {axis}, all storing to the same elements of "
                        f"`{output}`", file=self.forward.fn.__code__.co_filename,
                        line=self.forward.fn.__code__.co_firstlineno,
                        hint=f"make `{output}`'s store address depend on tl.program_id({axis}), "
                             "or launch one program along that axis")

    def check_arguments(self, named: dict[str, Any], grid: tuple[int, ...] = (1,)) -> None:
        """Refuse a launch whose arguments let a store's lanes, programs or iterations reach one element
        (lanes.py: conditions it could not decide before the strides, block sizes and grid were known).
        A condition on values it cannot read (a local of the kernel) is let pass."""
        if not self.launch_checks:
            return
        key = (grid, *[named.get(n) for n in self._checked_names])
        try:
            cached = key in self._checked  # a launch like an earlier one: ~1 us instead of ~12
        except TypeError:  # an unhashable argument: check every time
            key, cached = None, False
        launch = LaunchValues(named, grid)
        for check in self.launch_checks:
            if cached and check.condition.cacheable:  # (checks reading tensor contents run every time)
                continue
            if not check.condition.cacheable and capturing():
                raise NotDifferentiableError(
                    f"{check.construct}: checked on each launch by reading the index tensors, which a CUDA graph "
                    "being captured cannot do (it would wait for the GPU), nor could it check a replay's indices",
                    file=check.where.file, line=check.where.line, source_line=check.where.text,
                    hint="run this op's backward outside CUDA graphs (torch.compile without mode=\"reduce-overhead\")")
            construct = check.failure(launch)
            if construct is not None:
                raise NotDifferentiableError(construct, file=check.where.file, line=check.where.line,
                                             hint=check.hint, source_line=check.where.text)
        if key is not None:
            if len(self._checked) > 4096:
                self._checked.clear()
            self._checked.add(key)

    @functools.cached_property
    def checks_contents(self) -> bool:
        """Whether a launch check reads tensor contents (loaded indices): those run on every launch."""
        return any(not c.condition.cacheable for c in self.launch_checks)

    @functools.cached_property
    def _checked_names(self) -> tuple[str, ...]:
        """The arguments the launch checks read."""
        return tuple(sorted({n for c in self.launch_checks if c.condition.cacheable for n in c.condition.names()}
                            & set(self.params)))

    def launch_notes(self) -> str:
        """What is decided on each launch's arguments, as comment lines (``tritongrad show`` prints them)."""
        lines = []
        if self.writes.inputs:
            lines.append("# How each input's gradient is written, decided on each launch's arguments:")
            lines += [f"#   {facts.describe()}" for facts in self.writes.inputs.values()]
            lines += [f"#   {p}: no kernel of its own: {why}" for p, why in self.not_interchanged.items()]
        if self.writes.inputs:
            lines.append("# Checked on each launch's gradient buffers, from their addresses, sizes and strides "
                         "(launch_facts.py):")
            lines += [f"#   {fact}" for fact in FACTS]
        if self.launch_checks:
            lines.append("# Checked on each launch's arguments (a launch where one fails is refused):")
            lines += [f"#   {check}" for check in self.launch_checks]
        return "\n".join(lines) + "\n" if lines else ""

    def __repr__(self) -> str:
        return f"BackwardKernel({self.name}, wrt={self.wrt}, outputs={self.outputs})"


def capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _device_of(args: dict[str, Any]) -> Any:
    """The device of a launch's first tensor argument."""
    return next((v.device for v in args.values() if hasattr(v, "device") and hasattr(v, "data_ptr")), None)


def _sizes(grid: Any) -> tuple[int, ...]:
    return tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)


def _zeros_strided(size, stride, dtype, device):
    import torch

    return torch.empty_strided(size, stride, dtype=dtype, device=device).zero_()


def _empty_strided(size, stride, dtype, device):
    import torch

    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def _reads_only(variant: Variant, tapes: tuple[StateTape, ...]) -> bool:
    """Whether the tapes a variant's kernels read are among those a forward kept, by the forward's programs."""
    kept = {tape.key: tape for tape in tapes}
    if variant.persistent:
        return False  # a persistent kernel's programs are not the forward's (its state tapes' rows)
    return all(tape.key in kept and kept[tape.key].holds(tape)
               for part in variant.parts if part.saved for tape in part.tapes)


def _tape_args(part: Part, saved: Any) -> dict[str, Any]:
    """A kernel's arguments for the tapes it reads: the forward's (augment.SavedStates), by its own parameter
    names (each kernel of a variant names them itself)."""
    key = ("tapes", *[tape.key for tape in saved.tapes])
    names = part.memo.get(key)
    if names is None:
        kept = {tape.key: tape for tape in saved.tapes}
        names = []
        for tape in part.tapes:
            there = kept[tape.key]
            names.append((tape.slots, there.slots))
            held = there.held()
            names += [(param, held[source][0]) for source, (param, _, _) in tape.held().items()]
        names = part.memo[key] = tuple(names)
    return {mine: saved.args[theirs] for mine, theirs in names}


def _describe(value: Any) -> Any:
    """What the write strategies' conditions and tuning read of an argument: its value, or a tensor's layout and
    dtype."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "stride"):
        return (tuple(shape), value.stride(), value.dtype)
    return value


def _persistent_programs(programs: int, device: Any, waves: int = 1) -> int:
    """How many programs a persistent backward runs along its axis: ``waves`` per multiprocessor on a GPU
    (each keeps a partial row); a few in Triton's interpreter, so that each program loops over several."""
    count = compiled_multiprocessors(device)
    return max(1, min(programs, waves * count if count else 3))


_cache: dict[tuple, tuple[Any, Any]] = {}
_lock = threading.Lock()


def _cached(key: tuple, build):
    with _lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] is key[0]:
        return hit[1]
    value = build()
    with _lock:
        _cache[key] = (key[0], value)
    return value


def clear_cache() -> None:
    """Forget every derived kernel (a custom rule registered later changes what derivation gives)."""
    with _lock:
        _cache.clear()


def grad(kernel: Any, wrt: Sequence[str] | None = None, outputs: Sequence[str] | None = None, *,
         deterministic: bool = False, constexprs: Mapping[str, Any] | None = None,
         kept_outputs: Sequence[str] = ()) -> BackwardKernel:
    """Derive the backward kernel of a ``@triton.jit`` kernel.

    ``wrt``: the pointer parameters to differentiate with respect to (default: every
    pointer parameter that is only loaded and does not hold indices).
    ``outputs``: the pointer parameters whose stores are differentiated (default: every
    stored one). ``deterministic``: gradients bitwise identical from run to run (no atomic
    additions); a load whose gradient can only be added atomically is refused, naming it.
    ``constexprs``: values of constexpr parameters: the ``if`` branches they rule out are
    removed before anything is derived, as Triton compiles one kernel per value (a launch
    through the kernel's ``bwd[grid]``, ``gradients`` or ``tritongrad.op`` specializes by itself).
    ``kept_outputs``: output parameters that hold, whenever the backward runs, what the forward launch stored
    there (an op's tape saves them): values it stored after a reduction are read back rather than replayed
    (stored_outputs.py).
    Raises :class:`NotDifferentiableError` for what cannot be handled.
    """
    jit_fn = unwrap(kernel)
    decisive = decisive_constexprs(jit_fn)
    values = {k: plain_value(constexprs[k]) for k in decisive if constexprs is not None and k in constexprs}
    key = (jit_fn.fn, tuple(wrt) if wrt is not None else None, tuple(outputs) if outputs is not None else None,
           deterministic, tuple(sorted((k, hashable(v)) for k, v in values.items())), tuple(sorted(kept_outputs)))
    try:
        return _cached(key, lambda: _derive(jit_fn, key[1], key[2], deterministic, values, key[5]))
    except NotDifferentiableError as e:
        missing = [k for k in decisive if k not in values]
        if missing:
            e.add_note(f"(derived for every value of its constexpr parameter(s) {', '.join(missing)}: the "
                       "backward of one specialization may differentiate: pass constexprs={...})")
        raise


def decisive_constexprs(jit_fn: Any) -> tuple[str, ...]:
    """The constexpr parameters whose values decide an ``if`` of the kernel (specialize.py)."""
    found = _decisive.get(jit_fn.fn)
    if found is None:
        found = _decisive[jit_fn.fn] = decisive(Source.of(jit_fn).tree)
    return found


_decisive: dict[Any, tuple[str, ...]] = {}


def hashable(value: Any) -> Any:
    """``value``, or its repr where it cannot be a dictionary key."""
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _derive(jit_fn: Any, wrt, outputs, deterministic: bool, constexprs: dict[str, Any],
            kept_outputs: tuple[str, ...] = ()) -> BackwardKernel:
    program = fuse_composites(online_softmax(normalize_kernel(jit_fn, constexprs)))
    analysis = analyze(program, wrt, outputs)
    read_back = {v: k for v, k in stored_values(program, analysis.stores).items() if k.param in kept_outputs}
    bwd = BackwardKernel(jit_fn, program, analysis, classify_loops(analysis), plan_writes(analysis),
                         deterministic, read_back)
    bwd.requested, bwd.specialization, bwd.kept_outputs = (wrt, outputs), constexprs, kept_outputs
    return bwd


def vjp(fn: Any, wrt: Sequence[int] = (0,)) -> Any:
    """The vector-Jacobian product of a tile-level ``@triton.jit`` helper.

    Returns a ``@triton.jit`` function taking ``fn``'s arguments followed by one
    cotangent per returned value, and returning the gradients of the arguments at
    positions ``wrt`` (a tuple when there are several). Its source is ``.src``
    of the returned function's ``tg_src`` attribute.
    """
    jit_fn = unwrap(fn)
    key = (jit_fn.fn, ("vjp", tuple(wrt)), None)
    return _cached(key, lambda: _derive_vjp(jit_fn, tuple(wrt)))


def _derive_vjp(jit_fn: Any, positions: tuple[int, ...]) -> Any:
    program = normalize_tile_function(jit_fn)
    params = program.param_names()
    try:
        wrt = tuple(params[i] for i in positions)
    except IndexError:
        raise ValueError(f"wrt={positions}: `{program.name}` has {len(params)} parameters") from None
    analysis = analyze(program, wrt, None, tile=True)
    backward = build_backward(analysis, classify_loops(analysis), tile=True)
    name = f"{program.name}_vjp"
    src = codegen.function_source(program, backward, name, "", tile=True)
    kernel = codegen.compile_kernel(src, name, program)
    kernel.tg_src = src
    return kernel

