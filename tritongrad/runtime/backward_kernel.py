"""A derived backward kernel as it is launched: the checks and choices made on each launch, the variant its
derivation (derivation.py) gives for them, and the raw launch interface (``bwd[grid](...)``, ``gradients``);
``derived``: the backward kernel of a request, derived once."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from ..analysis.conditions import LaunchCheck
from ..analysis.launch_values import LaunchValues
from ..core.bounded import Bounded
from ..core.device import multiprocessors, recorded
from ..core.errors import NotDifferentiableError
from ..reverse.state_tape import StateTape, scratch_budget
from ..writes.launch_facts import FACTS, LaunchFacts, buffer_facts
from ..writes.strategies import Choice
from . import guards, tuning
from .derivation import Derivation, Request, cached, decisive_constexprs, specialization
from .launch_checks import LaunchChecks
from .launching import Launches
from .variants import Prepared, Variant, reads_only, shadow_dtype, zeros_strided


def derived(request: Request) -> BackwardKernel:
    """The backward kernel of ``request``, derived once per kernel and request."""
    try:
        return cached(request.key, lambda: BackwardKernel(Derivation(request)))
    except NotDifferentiableError as e:
        missing = [k for k in decisive_constexprs(request.forward) if k not in request.constexprs]
        if missing:
            e.add_note(f"(derived for every value of its constexpr parameter(s) {', '.join(missing)}: the "
                       "backward of one specialization may differentiate: pass constexprs={...})")
        raise


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

    def __init__(self, derivation: Derivation):
        self.derivation = d = derivation
        self.forward, self.deterministic = d.request.forward, d.request.deterministic
        self.requested = (d.request.wrt, d.request.outputs)  # the wrt and outputs asked for
        self.specialization = d.request.constexprs  # values of the constexprs its source was specialized for
        self.kept_outputs = d.request.kept_outputs
        self.program, self.analysis, self.name, self.params = d.program, d.analysis, d.name, d.params
        self.writes, self.saved_writes = d.writes, d.saved_writes  # (saved: where the forward keeps loops' states)
        self.not_merged, self.not_interchanged = d.not_merged, d.not_interchanged
        self.wrt, self.outputs = d.wrt, d.outputs
        analysis = d.analysis
        self.in_place = analysis.in_place  # inputs updated in place: their shadow is the output's too
        self.unchanged = analysis.unchanged  # of those, the ones whose loads read what no store of the launch changes
        # pointers whose values after the launch the recomputation reads (reloads) -> the parameter taking them
        self.stored_params: dict[str, str] = dict(analysis.as_left_params)
        self.store_axes = {k: frozenset(v) for k, v in analysis.store_axes.items()}
        self.launch_checks: tuple[LaunchCheck, ...] = tuple(analysis.launch_checks)
        self.launches = Launches(self)  # its variants' kernels launched (launching.py)
        self.checks = LaunchChecks(self)  # what each launch is checked for (launch_checks.py)
        self._chosen: dict[tuple, Prepared] = Bounded()  # (grid, arguments, written) -> choices
        # (part, grid, arguments) -> the programs of an interchanged kernel
        self._most_trips: dict[tuple, int] = Bounded()
        if self.deterministic:
            self.checks.refuse_atomics({p: c for p, c in d.best.choices})

    # -- the kernel: its derivation's ------------------------------------------------------------

    def variant(self, choices: dict[str, Choice], saved: bool = False, again: bool = False) -> Variant:
        """The kernels for these choices (Derivation.variant)."""
        return self.derivation.variant(choices, saved, again)

    def reads(self) -> frozenset[str]:
        """The parameters whose memory a kernel of the variants derived so far reads (variants.Variant.reads)."""
        return self.derivation.reads()

    def saved_tapes(self) -> tuple[StateTape, ...]:
        """The tapes a forward keeps for this backward (Derivation.saved_tapes)."""
        return self.derivation.saved_tapes()

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
        return self.derivation.shadow_params

    # -- launching ---------------------------------------------------------------------------------

    @functools.cached_property
    def _forward_defaults(self) -> dict[str, Any]:
        return defaults_of(self.forward)

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """A launch's arguments by parameter name (``bind_arguments``)."""
        return bind_arguments(self.name, self.params, self._forward_defaults, args, kwargs)

    def for_launch(self, named: Mapping[str, Any]) -> BackwardKernel:
        """The backward kernel of the specialization a launch runs (itself when no constexpr decides a branch)."""
        values = specialization(self.forward, named)
        if values == self.specialization:
            return self
        return derived(self.derivation.request.specialized(values))

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
        allocated as its write strategy needs (empty where it is written everywhere) in the input's dtype, or
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
        # loop's sums the derivation of a derived kernel does not take, nor later adds, nor stores at addresses
        # following a program id through a loop's range: added atomically; no loop split at its masks, whose binary
        # search is a `while` loop)
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
                                parallel, 0 if again else scratch_budget(device), max(tuning.WAVES) * parallel,
                                later_adds=not again, stores_through_ranges=not again)
            choices = writes.choose(facts, deterministic=self.deterministic)
            if self.deterministic:
                self.checks.refuse_atomics(choices, self_overlapping, again)
            variant = self.variant(choices, saved=saved is not None, again=again)
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
