"""A derived backward kernel: its variants (a kernel per way of writing each input's gradient), the checks and
choices made on each launch, and the raw launch interface (``bwd[grid](...)``, ``gradients``)."""

from __future__ import annotations

import ast
import functools
import inspect
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..analysis.analyze import Analysis
from ..analysis.conditions import LaunchCheck
from ..analysis.launch_values import LaunchValues
from ..analysis.stored_outputs import StoredValue
from ..codegen import generate as codegen
from ..core.bounded import Bounded
from ..core.device import multiprocessors, recorded
from ..core.ir import Program
from ..core.source import Source
from ..frontend.specialize import decisive, plain_value
from ..reverse.interchange import NotInterchangeable
from ..reverse.loop_plans import LoopPlan, classify_loops
from ..reverse.rereads import NotMergeable
from ..reverse.state_tape import StateTape, tape_budget
from ..reverse.sweep import build_backward
from ..writes.input_facts import WritePlan
from ..writes.launch_facts import FACTS, LaunchFacts, buffer_facts
from ..writes.strategies import Choice, Mode
from . import guards, tuning
from .launch_checks import LaunchChecks
from .launching import Launches
from .variants import Part, Prepared, Variant, reads_only, shadow_dtype, zeros_strided

CALLING_CONVENTION = """\
Launch it with the forward's grid and the forward's arguments, followed by one
shadow per output (d_<output>: the gradient of the loss with respect to that output,
read only) and one per wrt input (d_<input>: a buffer with the input's shape and
strides), as tritongrad's BackwardKernel does: it picks, on each launch, how each
input's gradient is written (see writes/strategies.py)."""


LATER = "its other loads' adjoints kept per program and added after the kernel"


STORED = ("Then {stored}: `{param}` as the forward launch left it, whose new values the kernel read back\n"
          "after storing them (`{param}` itself: its values before the launch).")


IN_PLACE = ("updated in place, as the forward updates it: the gradient of the values it gets on entry, of the "
            "values it held on exit (zeroed where stored, the loads' gradient added)")
UNCHANGED = ("; no program that loads it stores there (its values there are the same before and after the launch, "
             "which the kernel may take): its loads' adjoints ")


def bind_arguments(name: str, params: tuple, defaults: dict[str, Any], args: tuple, kwargs: dict) -> dict[str, Any]:
    """A derived kernel's launch arguments by parameter name: positional ones fill the parameters not given by
    keyword, in order; when there are too few, the forward's defaulted parameters take their defaults."""
    free = [p for p in params if p not in kwargs]
    if len(args) < len(free):
        free = [p for p in free if p not in defaults]
    if len(args) != len(free):
        raise TypeError(f"{name} takes {len(free)} positional arguments here ({', '.join(free)}), got {len(args)}")
    return {**defaults, **dict(zip(free, args, strict=True)), **kwargs}


def defaults_of(jit_fn: Any) -> dict[str, Any]:
    """A kernel's parameters that have defaults, with them."""
    sig = inspect.signature(jit_fn.fn)
    return {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


class BackwardKernel:
    """A derived backward kernel.

    ``params``: the forward's parameters, then ``d_<name>`` for each output, then for each
    ``wrt`` input, then ``<name>_stored`` for each pointer whose stored values the kernel reads back
    (``stored_params``: the tensor as the forward launch left it, the pointer itself bound to its values
    before). ``bwd[grid](*forward_args, *output_grads, *input_grads)`` launches it
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
        self.unchanged = analysis.unchanged  # of those, the ones whose loads read what no store of the launch changes
        # pointers whose values after the launch the replay reads (reloads) -> the parameter taking them
        self.stored_params: dict[str, str] = dict(analysis.stored_params)
        self.store_axes = {k: frozenset(v) for k, v in analysis.store_axes.items()}
        self.launch_checks: tuple[LaunchCheck, ...] = tuple(analysis.launch_checks)
        self._variants: dict[tuple, Variant] = {}
        self._parts: dict[tuple, Part] = {}
        self._variants_lock = threading.Lock()
        self.launches = Launches(self)  # its variants' kernels launched (launching.py)
        self.checks = LaunchChecks(self)  # what each launch is checked for (launch_checks.py)
        self._chosen: dict[tuple, Prepared] = Bounded()  # (grid, arguments, written) -> choices
        # (part, grid, arguments) -> the programs of an interchanged kernel
        self._most_trips: dict[tuple, int] = Bounded()
        self.not_interchanged: dict[str, str] = {}  # input -> why it cannot have a kernel of its own
        self.saved_writes = writes  # for a launch whose forward kept its loops' states (augment.py)
        self.not_merged: dict[str, str] = {}  # input -> why its loads in sibling loops are written apart
        self._keep_feasible_rereads()
        self._keep_feasible_interchanges()
        best = self.variant(self.writes.best())  # derived now, so that what cannot be differentiated says so now
        if not any(part.wrt == self.wrt for part in best.parts):  # the calling convention's shadow names
            self.variant({p: Choice(Mode.ATOMIC) for p in self.wrt})
        self.params = (*program.param_names(), *self.shadow_params.values(), *self.stored_params.values())
        self.requested: tuple = (None, None)  # the wrt and outputs asked for (grad sets them)
        self.specialization: dict[str, Any] = {}  # values of the constexprs its source was specialized for
        self.kept_outputs: tuple[str, ...] = ()  # as grad was given them
        self.respecialize: Any = None  # constexpr values -> the backward kernel of that specialization (grad sets it)
        if deterministic:
            self.checks.refuse_atomics({p: c for p, c in best.choices})

    def _keep_feasible_rereads(self) -> None:
        """Write apart (atomically) the loads in sibling loops of an input whose backward cannot recompute their
        adjoints in one loop (reverse/rereads.py): tried once with every input added atomically, as the
        merge does not depend on how the others are written."""
        for param, facts in self.writes.inputs.items():
            if not facts.rereads:
                continue
            choices = {p: Choice(Mode.ATOMIC) for p in self.wrt}
            try:
                self._part({**choices, param: Choice(Mode.ATOMIC, rereads=facts.rereads)})
            except NotMergeable as e:
                self.not_merged[param] = e.why
                self.writes = self.writes.without_rereads(param, e.why)
                self.saved_writes = self.saved_writes.without_rereads(param, e.why)

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

    def reads(self) -> frozenset[str]:
        """The parameters whose memory a kernel of the variants derived so far reads (variants.Variant.reads)."""
        with self._variants_lock:
            variants = list(self._variants.values())
        return frozenset().union(*(v.reads for v in variants))

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
        key = tuple((p, Choice(c.mode, c.axis, later=c.later, fill=c.fill, rereads=c.rereads))  # a zero-fill is
                    # not code
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
                         + (f"{UNCHANGED}{c.strategy.describes}" if p in analysis.unchanged else "")
                         + (f"; {LATER} ({', '.join(c.later)})" if c.later and c.mode in (Mode.STORE, Mode.ADD)
                            else "")
                         for p, c in choices.items())
        stored = "".join("\n" + STORED.format(stored=f"`{n}`", param=p) for p, n in analysis.stored_params.items())
        doc = (f"Backward of `{program.name}`, derived by tritongrad.\n\n"
               f"wrt: {', '.join(wrt) or '(none)'}; outputs: {', '.join(analysis.outputs)}.\n"
               f"{CALLING_CONVENTION}{stored}\nIn this variant:{writes or ' (no inputs)'}\n")
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
        """A launch's arguments by parameter name (``bind_arguments``)."""
        return bind_arguments(self.name, self.params, self._forward_defaults, args, kwargs)

    def for_launch(self, named: Mapping[str, Any]) -> BackwardKernel:
        """The backward kernel of the specialization a launch runs (itself when no constexpr decides a branch)."""
        decisive = decisive_constexprs(self.forward)
        values = {k: plain_value(named[k]) for k in decisive if k in named}
        if values == self.specialization:
            return self
        return self.respecialize(values)

    def __getitem__(self, grid: Any):
        def run(*args: Any, **kwargs: Any) -> None:
            named = self.bind(args, kwargs)
            specialized = self.for_launch(named)
            if specialized is not self:
                return specialized[grid](**named)
            sizes = _sizes(grid(named) if callable(grid) else grid)
            output_grads = {p: named.pop(self.shadow_params[p]) for p in self.outputs}
            buffers = {p: output_grads[p] if p in output_grads else named.pop(self.shadow_params[p]) for p in self.wrt}
            self.checks.buffers(named, output_grads, buffers)
            self.checks.default_wrt(named)
            written = frozenset(self.wrt)
            shared, self_overlapping = buffer_facts({p: buffers[p] for p in self.wrt if p not in self.in_place})
            prepared = self.prepare(named, sizes, written, shared, self_overlapping)
            self._launch_direct(sizes, named, output_grads, buffers, prepared, written)

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
        self.checks.buffers(named, output_grads)
        self.checks.default_wrt(named)
        # a buffer of its own per input: none is shared; an input updated in place's holds its new values' gradient
        prepared = self.prepare(named, sizes, self.in_place, saved=saved)
        grads = {}
        for p in self.in_place:  # one buffer: the new values' gradient in, the old values' out
            x = named[p]
            grads[p] = torch.empty_strided(x.size(), x.stride(), dtype=shadow_dtype(x.dtype), device=x.device)
            output_grads = {**output_grads, p: grads[p].copy_(output_grads[p])}
        for p in self.wrt:
            if p in self.in_place:
                continue
            x, c = named[p], prepared.choices[p]
            fill = torch.empty_strided if c.strategy.unfilled(c) else zeros_strided
            dtype = x.dtype if c.strategy.in_input_dtype() else shadow_dtype(x.dtype)
            grads[p] = fill(x.size(), x.stride(), dtype=dtype, device=x.device)
        self._launch_direct(sizes, named, output_grads, grads, prepared, saved=saved)
        for p in set(self.wrt) & set(self.outputs) - set(self.in_place):  # named both, never stored by this
            grads[p] += output_grads[p]  # specialization (a flag off): its values pass through the launch unchanged
        return grads

    def choose(self, named: dict[str, Any], grid: tuple[int, ...], written: frozenset[str] = frozenset(),
               shared: frozenset[str] = frozenset()) -> dict[str, Choice]:
        """How each input's gradient is written for this launch (see :meth:`prepare`)."""
        return self.prepare(named, grid, written, shared).choices

    def prepare(self, named: dict[str, Any], grid: tuple[int, ...], written: frozenset[str] = frozenset(),
                shared: frozenset[str] = frozenset(), self_overlapping: frozenset[str] | None = None,
                saved: Any = None) -> Prepared:
        """Check the launch (grid, store conditions, dtypes), choose how each input's gradient is written
        and get the variant for that; cached per arguments the choice depends on. The gradient buffers'
        facts (launch_facts.py): ``written``: inputs whose buffers already hold gradient to add to (an input
        updated in place: whether its new values have a gradient, read where no store reaches its loads); ``shared``:
        inputs whose buffers overlap another input's; ``self_overlapping``: inputs whose buffers reach one
        element from several positions (None: those whose tensors do, the calling convention's buffers having
        their inputs' layouts). ``saved``: the state tapes the forward kept (augment.SavedStates), read by the
        variant where it needs no others."""
        # an input updated in place: its buffer holds the new values' gradient; one whose loads no store reaches
        # (``unchanged``) has its loads' adjoints added there only where ``written`` says it holds any
        held = written & self.unchanged
        written = written | self.in_place
        self.checks.grid(grid)
        self.checks.arguments(named, grid)
        for name in self.wrt:  # an integer tensor has no gradient: say so, rather than return zeros
            dtype = getattr(named.get(name), "dtype", None)
            if dtype is not None and not dtype.is_floating_point:
                raise TypeError(f"{self.name}: wrt names `{name}`, but the tensor passed there is {dtype}; "
                                "only floating-point inputs have gradients")
        if self_overlapping is None:
            self_overlapping = buffer_facts({p: named.get(p) for p in self.wrt if p not in self.in_place})[1]
        shared = shared - self.in_place
        again = recorded()  # (a backward recorded to be differentiated again: no partial rows, whose persistent
        # loop's sums the derivation of a derived kernel does not take: their gradients added atomically)
        key = (grid, written, held, shared, self_overlapping, saved is not None, again,
               *[_describe(named.get(n)) for n in self._chosen_names])
        prepared = self._chosen.get(key)
        if prepared is None:
            device = next((t.device for p in self.wrt if hasattr(t := named.get(p), "device")), None)
            writes = self.saved_writes if saved is not None else self.writes
            parallel = multiprocessors(device)
            # (an input updated in place: its buffer holds the new values' gradient, which the kernel reads where it
            # stores, before its loads' adjoints write there: to be written, not added to; but where no program that
            # loads stores, the new values' gradient there is the old values' too: added to where there is any)
            facts = LaunchFacts(LaunchValues(named, grid), (written - self.in_place) | held, shared, self_overlapping,
                                parallel, 0 if again else tape_budget(device), max(tuning.WAVES) * parallel)
            choices = writes.choose(facts, deterministic=self.deterministic)
            if self.deterministic:
                self.checks.refuse_atomics(choices, self_overlapping)
            variant = self.variant(choices, saved=saved is not None)
            if saved is not None and not reads_only(variant, saved.tapes):
                return self.prepare(named, grid, written, shared, self_overlapping)
            prepared = self._chosen[key] = Prepared(choices, variant, shared)
        return prepared

    def launch(self, grid: tuple[int, ...], named: dict[str, Any], output_grads: dict[str, Any],
               buffers: dict[str, Any], prepared: Prepared, written: frozenset[str] = frozenset(),
               pad: int = 0, saved: Any = None, setting: Any = None, trace: list | None = None
               ) -> dict[str, tuple[Any, int]]:
        """Run a prepared variant (:meth:`prepare`): launching.Launches.launch says how."""
        return self.launches.launch(grid, named, output_grads, buffers, prepared, written, pad, saved, setting, trace)

    def _launch_direct(self, grid: tuple[int, ...], named: dict[str, Any], output_grads: dict[str, Any],
                       buffers: dict[str, Any], prepared: Prepared, written: frozenset[str] = frozenset(),
                       saved: Any = None) -> None:
        """A launch into the caller's buffers (``bwd[grid](...)``, :meth:`gradients`); with ``TRITONGRAD_CHECKED=1``
        the buffers it makes between guard bands (guards.py), a write outside them refused."""
        pad = guards.GUARD[0] if guards.CHECKED else 0
        rows = self.launch(grid, named, output_grads, buffers, prepared, written, pad, saved=saved)
        if not pad:  # (unchecked, rows every program stores whole are left unfilled: their gaps hold anything)
            return
        for p, (flat, pad, what) in rows.items():
            b = buffers[p]
            if guards.written_outside(flat, pad, ((b.size(), b.stride(), 0),)):
                raise guards.StrayWriteError(f"the derived kernel of `{self.name}` wrote outside the gradient of "
                                             f"`{p}` (sizes {tuple(b.size())}, strides {b.stride()}; found outside "
                                             f"{what}): the launch reads memory outside the tensor passed to `{p}`")

    @functools.cached_property
    def _chosen_names(self) -> tuple[str, ...]:
        """The arguments the write strategies' conditions read, and the inputs and outputs (their dtypes and layouts
        decide the tuned launch setting)."""
        names = {*self.wrt, *self.outputs}
        for facts in self.writes.inputs.values():
            for c in facts.conditions():
                names |= c.names()
        return tuple(sorted(names & set(self.params)))

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


def _sizes(grid: Any) -> tuple[int, ...]:
    return tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)


def _describe(value: Any) -> Any:
    """What the write strategies' conditions and tuning read of an argument: its value, or a tensor's layout and
    dtype."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "stride"):
        return (tuple(shape), value.stride(), value.dtype)
    return value


def decisive_constexprs(jit_fn: Any) -> tuple[str, ...]:
    """The constexpr parameters whose values decide an ``if`` of the kernel (specialize.py)."""
    found = _decisive.get(jit_fn.fn)
    if found is None:
        source = Source.of(jit_fn)
        found = _decisive[jit_fn.fn] = decisive(source.tree, source.scope)
    return found


_decisive: dict[Any, tuple[str, ...]] = {}


def hashable(value: Any) -> Any:
    """``value``, or its repr where it cannot be a dictionary key."""
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)
