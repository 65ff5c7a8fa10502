"""The derivation of a backward kernel: the pipeline run on a kernel for one request (``Request``: ``tritongrad.grad``'s
arguments). Its front half (``front_half``: normalized, online softmax and composites rewritten) is what an op reads a
kernel's pointer roles from too (summary.py); its back half (``Derivation``) analyses it, plans its loops, reads back
what kept outputs hold, plans its writes (asking reverse/feasibility.py which strategies its body can be written
with, before the plans are made) and derives each variant's kernels on first use. A ``BackwardKernel``
(backward_kernel.py) launches them; ``cached`` keeps what is derived per kernel and request."""

from __future__ import annotations

import ast
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..analysis.analyze import analyze
from ..analysis.composites import fuse_composites
from ..analysis.online import online_softmax
from ..analysis.stored_outputs import stored_values
from ..codegen import generate as codegen
from ..core.ir import Program
from ..core.source import Source
from ..frontend.normalize import normalize_kernel
from ..frontend.specialize import decisive, plain_value
from ..reverse.feasibility import Feasibility, for_inputs
from ..reverse.interchange import NotInterchangeable
from ..reverse.loop_plans import classify_loops
from ..reverse.state_tape import StateTape
from ..reverse.sweep import build_backward
from ..writes.input_facts import plan_writes
from ..writes.strategies import Choice
from .variants import Part, Variant

CALLING_CONVENTION = """\
Launch it with the forward's grid and the forward's arguments, followed by one
shadow per output (d_<output>: the gradient of the loss with respect to that output,
read only) and one per wrt input (d_<input>: a buffer with the input's shape and
strides), as tritongrad's BackwardKernel does: it picks, on each launch, how each
input's gradient is written (see writes/strategies.py)."""


LATER = "its other loads' adjoints kept per program and added after the kernel"


AS_LEFT = ("Then {as_left}: `{param}` as the forward launch left it, whose new values the kernel read back\n"
          "after storing them (`{param}` itself: its values before the launch).")


IN_PLACE = ("updated in place, as the forward updates it: the gradient of the values it gets on entry, of the "
            "values it held on exit (zeroed where stored, the loads' gradient added)")
UNCHANGED = ("; no program that loads it stores there (its values there are the same before and after the launch, "
             "which the kernel may take): its loads' adjoints ")


def front_half(jit_fn: Any, constexprs: Mapping[str, Any] | None) -> Program:
    """The kernel normalized (the branches ``constexprs`` rule out removed), its online softmax loops and written-out
    composites rewritten: what derivation analyses, and what an op reads a kernel's roles from (summary.py)."""
    return fuse_composites(online_softmax(normalize_kernel(jit_fn, constexprs)))


@dataclass(frozen=True)
class Request:
    """What a backward kernel is derived for: ``tritongrad.grad``'s arguments, checked (derive.py)."""

    forward: Any  # the @triton.jit function
    wrt: tuple[str, ...] | None  # as asked (None: the default)
    outputs: tuple[str, ...] | None
    deterministic: bool = False
    constexprs: dict[str, Any] = field(default_factory=dict)  # the decisive constexprs' values it is specialized for
    kept_outputs: tuple[str, ...] = ()  # sorted

    @property
    def key(self) -> tuple:
        """Its key in the cache (the kernel function first: ``cached`` compares it by identity)."""
        return (self.forward.fn, self.wrt, self.outputs, self.deterministic,
                tuple(sorted((k, hashable(v)) for k, v in self.constexprs.items())), self.kept_outputs)

    def specialized(self, constexprs: dict[str, Any]) -> Request:
        """The same request for another specialization (a launch's decisive constexprs' values)."""
        return replace(self, constexprs=constexprs)


class Derivation:
    """The back half of the pipeline on one request: its analysis, loop plans, write plans (``writes``; ``saved_writes``
    where the forward keeps its loops' states, augment.py: interchanges possible only then) with why an input's
    strategies were left out (``not_merged``, ``not_interchanged``), and its variants, derived on first use
    (``variant``). The variant a typical launch gets is derived at once (``best``), so that what cannot be
    differentiated says so now; with it, every kernel's parameters (``params``)."""

    def __init__(self, request: Request):
        self.request = request
        self.program = program = front_half(request.forward, request.constexprs)
        self.analysis = analysis = analyze(program, request.wrt, request.outputs)
        self.wrt, self.outputs = analysis.wrt, analysis.outputs
        # values its recomputation may read from the outputs holding them
        self.read_back = {v: k for v, k in stored_values(program, analysis.stores).items()
                          if k.param in request.kept_outputs}
        self.loop_plans = classify_loops(analysis)
        plans = plan_writes(analysis, Feasibility(analysis, self.loop_plans, self.read_back))
        self.writes, self.saved_writes = plans.plain, plans.saved
        self.not_merged = plans.not_merged  # input -> why its loads in sibling loops are written apart
        self.not_interchanged = plans.not_interchanged  # input -> why it cannot have a kernel of its own
        self._variants: dict[tuple, Variant] = {}
        self._parts: dict[tuple, Part] = {}
        self._variants_lock = threading.Lock()
        self.best = self.variant(self.writes.best())
        if not any(part.wrt == self.wrt for part in self.best.parts):  # the calling convention's shadow names
            self.variant({p: Choice.atomic() for p in self.wrt})
        self.params = (*program.param_names(), *self.shadow_params.values(), *analysis.as_left_params.values())

    @property
    def name(self) -> str:
        return f"{self.program.name}_bwd"

    @property
    def shadow_params(self) -> dict[str, str]:
        """Primal parameter -> its shadow parameter, outputs first."""
        return self._shadow_params

    def reads(self) -> frozenset[str]:
        """The parameters whose memory a kernel of the variants derived so far reads (variants.Variant.reads)."""
        with self._variants_lock:
            variants = list(self._variants.values())
        return frozenset().union(*(v.reads for v in variants))

    def variant(self, choices: dict[str, Choice], saved: bool = False, again: bool = False) -> Variant:
        """The kernels for these choices, derived and compiled on first use; ``saved``: the first kernel reads
        the state tapes the forward kept (augment.py) instead of recording them; ``again``: kernels of a backward
        to be differentiated in turn (double backward), their loops not split at their masks (codegen/peel.py)."""
        key = tuple((p, c.as_code()) for p, c in choices.items())  # (a zero-fill, a private buffer: not code)
        with self._variants_lock:
            found = self._variants.get((key, saved, again))
            if found is None:
                found = self._variants[(key, saved, again)] = self._build(dict(key), saved, again)
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

    def _build(self, choices: dict[str, Choice], saved: bool = False, again: bool = False) -> Variant:
        own = [p for p, c in choices.items() if c.strategy.own_kernel]
        rest = {p: c for p, c in choices.items() if p not in own}
        whole = not own or any(c.strategy.writes_gradient for c in rest.values())
        parts = [self._part(rest, saved, again)] if whole else []
        by_loop: dict[tuple, dict[str, Choice]] = {}  # inputs whose iterations are the same: one kernel (dK, dV)
        for p in own:
            by_loop.setdefault((choices[p].axis, self.saved_writes.inputs[p].trips), {})[p] = choices[p]
        for group in by_loop.values():
            try:
                parts.append(self._part(group, saved, again))
            except NotInterchangeable:  # each alone can (plan_writes asked), together not
                parts += [self._part({p: c}, saved, again) for p, c in group.items()]
        parts = tuple(parts)
        written = set().union(*[part.written for part in parts])
        return Variant(tuple(choices.items()), parts, frozenset(p for p in self.wrt if p not in written))

    def _part(self, choices: dict[str, Choice], saved: bool = False, again: bool = False) -> Part:
        """The kernel writing the gradients of the inputs in ``choices`` (all of them, or one interchanged)."""
        key = (tuple(choices.items()), saved, again)
        if key in self._parts:
            return self._parts[key]
        program, wrt = self.program, tuple(choices)
        analysis, plans = for_inputs(self.analysis, self.loop_plans, wrt)
        name = self.name if wrt == self.wrt else f"{self.name}_{'_'.join(wrt)}"
        backward = build_backward(analysis, plans, choices=choices, saved=saved, read_back=self.read_back)
        shadows = dict(zip(dict.fromkeys((*self.outputs, *wrt)), backward.shadow_params, strict=True))
        if wrt == self.wrt:
            self._shadow_params = shadows
        writes = "".join(f"\n  d_{p}: {IN_PLACE if p in analysis.in_place else c.strategy.describes}"
                         + (f"{UNCHANGED}{c.strategy.describes}" if p in analysis.unchanged else "")
                         + (f"; {LATER} ({', '.join(c.later_loads)})" if c.later_loads else "")
                         for p, c in choices.items())
        as_left = "".join("\n" + AS_LEFT.format(as_left=f"`{n}`", param=p) for p, n in analysis.as_left_params.items())
        doc = (f"Backward of `{program.name}`, derived by tritongrad.\n\n"
               f"wrt: {', '.join(wrt) or '(none)'}; outputs: {', '.join(analysis.outputs)}.\n"
               f"{CALLING_CONVENTION}{as_left}\nIn this variant:{writes or ' (no inputs)'}\n")
        src = codegen.function_source(program, backward, name, doc.replace("\n", "\n    "), tile=False,
                                      peel=not again)
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
                                                   tile=False, peel=not again)
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


_cache: dict[tuple, tuple[Any, Any]] = {}
_lock = threading.Lock()


def cached(key: tuple, build):
    """What ``build`` derives for ``key`` (its first item a kernel function, compared by identity), once."""
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


def decisive_constexprs(jit_fn: Any) -> tuple[str, ...]:
    """The constexpr parameters whose values decide an ``if`` of the kernel (specialize.py)."""
    found = _decisive.get(jit_fn.fn)
    if found is None:
        source = Source.of(jit_fn)
        found = _decisive[jit_fn.fn] = decisive(source.tree, source.scope)
    return found


_decisive: dict[Any, tuple[str, ...]] = {}


def specialization(jit_fn: Any, named: Mapping[str, Any]) -> dict[str, Any]:
    """The values ``named`` (constexprs, or a launch's arguments by parameter) gives the decisive constexprs: the
    specialization it derives or runs."""
    return {k: plain_value(named[k]) for k in decisive_constexprs(jit_fn) if k in named}


def hashable(value: Any) -> Any:
    """``value``, or its repr where it cannot be a dictionary key."""
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)
