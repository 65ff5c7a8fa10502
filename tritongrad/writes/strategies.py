"""The write strategies: how a load's adjoint reaches its input's gradient buffer, one object each.

Each strategy says:

- when it applies (:meth:`Strategy.choice`): the facts it needs, from what can be shown about the input's loads
  (writes/input_facts.py: conditions on the launch's scalars) and about the launch's gradient buffers
  (launch_facts.py); with no launch, whether a typical one (several programs along every axis) takes it;
- what it emits for a load's adjoint (:meth:`Strategy.emit`, into the reverse sweep, reverse/memory.py);
- the buffer it needs (:meth:`Strategy.unfilled`, :meth:`Strategy.rows_unfilled`, :meth:`Strategy.in_input_dtype`,
  ``adds_in_kernel``), what the sweep writes besides a load's adjoint (:meth:`Strategy.overwrites`,
  :meth:`Strategy.zeros_for`) and what runs after the kernel (``after``: partial rows summed, a kernel of its own's
  sums added, ``later_adds``);
- how ``tritongrad show`` and the derived kernel's docstring describe it (``describes``).

:data:`STRATEGIES` lists them in the order a launch prefers them; :func:`choose` takes, per input, the first that
applies. Adding a strategy is one entry there (and its kernel-side support, where it needs a new kind of kernel).
The other stages ask a choice's strategy (``choice.strategy``) these questions; none tests its :class:`Mode`.

- ``none``: the input's value reaches no output: nothing written, the buffer zero-filled.
- ``store``: each address the input's load reads is reached once in the launch (lanes, programs and loop iterations
  apart): a plain ``tl.store`` in the input's dtype; no zero-fill where the loads cover the tensor. Into a buffer of
  its own (``private``, added after the kernels) where another input's buffer overlaps it. Several loads at addresses
  apart from one another (a row's two halves) each store theirs; else an input loaded by other statements outside
  loops keeps their adjoints per program, added after the kernel (``later``: LaterAdds).
- ``add``: as store, but the buffer already holds gradient: load, add, store, still without atomics.
- ``interchange``: the programs along an axis read the same addresses, moved by a loop (a matmul's ``A[m, k]``): a
  kernel of its own whose programs are the loop's iterations (reverse/interchange.py), storing each tile once.
- ``registers`` / ``row``: the programs along an axis read the same addresses (a weight): the backward runs
  persistently along it (reverse/persistent.py), summing the adjoint in registers (the address does not move) or in
  the program's own float32 row; the rows are summed after the kernel, in a fixed order.
- ``atomic``: anything else (gathers, overlapping windows, stride-0 buffers): ``tl.atomic_add`` into a zero-filled
  buffer, float32 for half types.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..analysis.conditions import Condition
from ..analysis.launch_values import Expr, LaunchValues
from ..core.ir import call_statement, is_none, name_node
from ..core.operations import instantiate
from .launch_facts import LaunchFacts

# The memory order of the adjoints' atomic adds: nothing in a backward kernel reads what they sum (the next
# kernel or the host does), so they need none; Triton's default, acq_rel, fences every add (2.6x slower
# on attention's dQ added from its dK/dV kernel, benchmarks/RESULTS.md).
RELAXED = "relaxed"


class Mode(enum.Enum):
    NONE = "none"
    STORE = "store"
    ADD = "add"
    INTERCHANGE = "interchange"
    REGISTERS = "registers"
    ROW = "row"
    ATOMIC = "atomic"

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Choice:
    """How one launch writes one input's gradient."""

    mode: Mode
    axis: int | None = None  # partials: the persistent axis; interchange: the axis the loop's iterations take
    covers: bool = False  # store, registers: the load reaches every element (buffer, partial rows: no zero-fill)
    later: tuple[str, ...] = ()  # store, add: the input's other loads, added after the kernel (LaterAdds)
    fill: str = ""  # store covering the tensor: the load (by result) whose if's other branch stores zeros
    private: bool = False  # store: into a buffer of its own, added to the input's after the kernels (its
    # buffer overlaps another input's: launch_facts.py)
    rereads: tuple[str, ...] = ()  # store, add, atomic: its loads in sibling loops whose adjoints are added to
    # the first load's and written with it (input_facts.py; reverse/rereads.py)

    @property
    def strategy(self) -> Strategy:
        return STRATEGIES[self.mode]

    @staticmethod
    def atomic(rereads: tuple[str, ...] = ()) -> Choice:
        """Added atomically: what any input's loads can be written with (the backward a derivation names its
        parameters from; a feasibility question's other inputs)."""
        return Choice(Mode.ATOMIC, rereads=rereads)

    @staticmethod
    def interchanged(axis: int) -> Choice:
        """A kernel of its own, its programs the iterations of the loop around the load, along ``axis``."""
        return Choice(Mode.INTERCHANGE, axis)

    def as_code(self) -> Choice:
        """The choice less what changes only the buffers (``covers``, ``private``): a variant's kernels are the
        same for both."""
        return replace(self, covers=False, private=False)

    @property
    def later_loads(self) -> tuple[str, ...]:
        """The input's other loads whose adjoints are added after the kernel (where its strategy keeps them)."""
        return self.later if self.strategy.later_adds else ()


class Sweep(Protocol):
    """What a strategy's code needs of the reverse sweep it is emitted into (reverse/sweep.py)."""

    def emit(self, stmt: ast.stmt) -> None: ...
    def adjoint_of(self, stmt: ast.stmt) -> str: ...  # the name of a statement's result's adjoint
    def named(self, base: str, value: ast.expr) -> ast.Name: ...  # `<fresh name> = value`, the name
    def partial_sum(self, stmt: ast.stmt, shadow: str, mask: ast.expr) -> str: ...
    def add_later(self, stmt: ast.stmt, param: str, shadow: ast.Name, g: ast.Name) -> None: ...


@dataclass
class Choosing:
    """What one launch's choices share: at most one persistent axis (the first input's that wants one)."""

    facts: LaunchFacts | None  # None: a typical launch (what `tritongrad show` prints)
    deterministic: bool = False
    axis: int | None = None


class Strategy:
    """One way of writing an input's gradient (see the module's docstring)."""

    mode: Mode
    describes: str  # the derived kernel's docstring and `tritongrad show`
    after: str = ""  # what runs after the kernel, if anything
    partial_rows: bool = False  # a persistent kernel along ``axis``, one partial row per program
    own_kernel: bool = False  # a kernel of its own (interchange.py)
    adds_in_kernel: bool = False  # adds into the buffer it is given (tuning's trials restore it)
    writes_gradient: bool = True  # the kernel writes something for the input
    later_adds: bool = False  # the input's other loads' adjoints kept per program, added after the kernel
    atomic: bool = False  # adds with atomics: in an order that differs per run (deterministic=True refuses it)
    stores: bool = False  # a tl.store of the adjoint where it is computed (a descriptor load's too: memory.py)
    merges_rereads: bool = False  # writes a load's adjoint where it is computed: loads in sibling loops can be
    # written once, with the first's (reverse/rereads.py)

    def choice(self, inputs: Any, param: str, choosing: Choosing) -> Choice | None:
        raise NotImplementedError

    def emit(self, sweep: Sweep, stmt: ast.stmt, param: str, shadow: ast.Name, g: ast.Name, mask: ast.expr,
             later: bool = False) -> None:
        """The code writing the adjoint ``g`` of the load ``stmt`` of ``param`` at ``shadow`` (under ``mask``);
        ``later``: the load is one of the input's other loads, whose adjoints are added after the kernel."""
        raise NotImplementedError

    def unfilled(self, choice: Choice) -> bool:
        """Whether the kernel writes every element of the buffer it is given, which may then be left unfilled."""
        return False

    def in_input_dtype(self) -> bool:
        """Whether the buffer may be in the input's dtype (else float32 for half types: it adds there)."""
        return True

    def rows_unfilled(self, choice: Choice) -> bool:
        """Whether each program stores its whole partial row (the rows may be left unfilled)."""
        return False

    def overwrites(self, choice: Choice) -> bool:
        """Whether a load's adjoint is stored over what the input's own buffer holds at its addresses (not added
        there): an input updated in place then needs no zeros where the store overwrote it (reverse/memory.py)."""
        return False

    def zeros_for(self, choice: Choice) -> str:
        """The load (by result) in an ``if`` whose other branch stores zeros at its addresses, or "" (a buffer
        left unfilled that one branch alone writes: reverse/sweep.py's ``reverse_if``)."""
        return ""


def _masked(mask: ast.expr) -> dict:
    return {} if is_none(mask) else {"mask": mask}


def add_without_atomics(sweep: Sweep, shadow: ast.Name, g: ast.Name, mask: ast.expr) -> None:
    """``tl.store(p, tl.load(p) + g)``: no other program or lane touches these addresses, so no atomics (the add
    strategy's code; reverse/memory.py's for a reload's adjoint)."""
    masked = _masked(mask)
    loaded = call_statement("tl.load", shadow, **masked).value
    sweep.emit(call_statement("tl.store", shadow, ast.BinOp(loaded, ast.Add(), g), **masked))


def holds(condition: Condition | None, choosing: Choosing) -> bool:
    """A condition on the launch (a typical launch: one that can be shown at all). One that cannot be evaluated
    (a value the launch does not give) counts as false: the safe way."""
    if condition is None:
        return False
    if choosing.facts is None:
        return True
    try:
        return condition.holds(choosing.facts.values)
    except Exception:
        return False


class NoGradient(Strategy):
    mode = Mode.NONE
    describes = "zero: its value reaches no output (the buffer is zero-filled, nothing written)"
    writes_gradient = False

    def choice(self, inputs, param, choosing):
        return Choice(Mode.NONE) if inputs.inactive else None

    def emit(self, sweep, stmt, param, shadow, g, mask, later=False):
        pass


class Store(Strategy):
    mode = Mode.STORE
    describes = "written once: each element by one store (the buffer needs no zero-fill where the loads cover it)"
    after = "a buffer of its own (private) added to the input's; its other loads' adjoints added (later)"
    stores = True
    later_adds = True
    merges_rereads = True

    def choice(self, inputs, param, choosing):
        facts = choosing.facts
        if facts is None:  # typical: several programs along every axis, so an address that some axis ignores
            if inputs.owned is None or inputs.shared or inputs.interchange:  # is not owned
                return None
        elif not holds(inputs.owned, choosing) or (param in facts.written and param not in facts.shared) \
                or (inputs.hidden_axes and not facts.stores_through_ranges):
            return None
        covers = holds(inputs.covers, choosing)
        private = facts is not None and param in facts.shared  # another input's gradient lands here too
        return Choice(Mode.STORE, covers=covers, later=inputs.later, fill=inputs.fill if covers else "",
                      private=private)

    def emit(self, sweep, stmt, param, shadow, g, mask, later=False):
        if later:  # kept with its addresses in this program's slots: added after the kernel (LaterAdds)
            sweep.add_later(stmt, param, shadow, g)
        else:
            sweep.emit(call_statement("tl.store", shadow, g, **_masked(mask)))

    def unfilled(self, choice):
        return choice.covers and not choice.private

    def overwrites(self, choice):
        return not choice.private

    def zeros_for(self, choice):
        return choice.fill


class Add(Strategy):
    mode = Mode.ADD
    describes = "added without atomics: each element is read and written by one lane of one program"
    after = "its other loads' adjoints added (later)"
    adds_in_kernel = True
    later_adds = True
    merges_rereads = True

    def choice(self, inputs, param, choosing):
        facts = choosing.facts
        if facts is None or param not in facts.written or not holds(inputs.owned, choosing) \
                or (inputs.hidden_axes and not facts.stores_through_ranges):
            return None
        return Choice(Mode.ADD, later=inputs.later)

    def emit(self, sweep, stmt, param, shadow, g, mask, later=False):
        if later:
            sweep.add_later(stmt, param, shadow, g)
        else:
            add_without_atomics(sweep, shadow, g, mask)


class Interchange(Strategy):
    mode = Mode.INTERCHANGE
    describes = ("summed in registers by a kernel of its own, one program per iteration of the loop around its "
                 "load, each looping over the forward's programs along an axis; stored once")
    after = "added to the input's buffer where gradient is already there (a buffer of its own first)"
    own_kernel = True

    def choice(self, inputs, param, choosing):
        facts = choosing.facts
        if facts is None:
            return Choice(Mode.INTERCHANGE, min(inputs.interchange), inputs.covers is not None) \
                if inputs.interchange else None
        launch = facts.values
        axes = [a for a, c in inputs.interchange.items() if holds(c, choosing) and launch.programs(a) > 1
                and (choosing.deterministic or own_programs(launch, a, inputs.trips) >= facts.parallel)]
        return Choice(Mode.INTERCHANGE, axes[0], holds(inputs.covers, choosing)) if axes else None

    def emit(self, sweep, stmt, param, shadow, g, mask, later=False):  # summed; stored at after the loop, at
        at = sweep.named(f"{sweep.adjoint_of(stmt)}_to", shadow)  # the addresses and mask named here
        if not is_none(mask):
            mask = sweep.named(f"{at.id}_mask", mask)  # d_a_to, d_a_to_mask
        total = sweep.partial_sum(stmt, at.id, mask)
        sweep.emit(ast.AugAssign(target=ast.Name(total, ast.Store()), op=ast.Add(),
                                 value=instantiate("g.to(s.dtype)", {"g": g, "s": name_node(total)})))

    def unfilled(self, choice):
        return choice.covers


class PartialRows(Strategy):
    """The registers and row strategies: a persistent kernel along the axis the programs share the addresses on."""

    partial_rows = True
    after = "the partial rows summed in a fixed order into the input's buffer (added where gradient is there)"

    def choice(self, inputs, param, choosing):
        facts = choosing.facts
        if facts is None:
            axes = [a for a in sorted(inputs.shared) if choosing.axis in (None, a)]
        else:
            launch = facts.values
            axes = [a for a, c in inputs.shared.items() if choosing.axis in (None, a) and holds(c, choosing)
                    and launch.programs(a) > 1 and rows_fit(launch, param, a, facts)]
        if not axes:
            return None
        axis = choosing.axis if choosing.axis is not None else axes[0]
        registers = axis in inputs.in_registers
        if (self.mode == Mode.REGISTERS) != registers:
            return None
        choosing.axis = axis
        covers = registers and holds(inputs.covers, choosing)
        return Choice(self.mode, axis, covers=covers)



class Registers(PartialRows):
    mode = Mode.REGISTERS
    describes = ("summed over each program's rows in registers; one partial row per program (not zero-filled "
                 "where the loads cover the tensor), summed after")

    def rows_unfilled(self, choice):
        return choice.covers

    def emit(self, sweep, stmt, param, shadow, g, mask, later=False):  # summed over this program's rows; stored
        total = sweep.partial_sum(stmt, shadow.id, mask)  # once after them, in its rows' dtype: one type across
        sweep.emit(ast.AugAssign(target=ast.Name(total, ast.Store()), op=ast.Add(),  # the loop
                                 value=instantiate("g.to(s.dtype)", {"g": g, "s": name_node(total)})))

    def unfilled(self, choice):
        return True  # the rows' sum is written into it


class Row(PartialRows):
    mode = Mode.ROW
    describes = "summed into one float32 partial row per program, the rows summed after the kernel"

    def emit(self, sweep, stmt, param, shadow, g, mask, later=False):  # its own row: no other program touches it
        add_without_atomics(sweep, shadow, g, mask)

    def unfilled(self, choice):
        return True  # the rows' sum is written into it


class Atomic(Strategy):
    mode = Mode.ATOMIC
    describes = "added atomically into a zero-filled buffer (float32 for half-precision inputs)"
    adds_in_kernel = True
    atomic = True
    merges_rereads = True

    def choice(self, inputs, param, choosing):
        return Choice(Mode.ATOMIC)

    def emit(self, sweep, stmt, param, shadow, g, mask, later=False):
        sweep.emit(call_statement("tl.atomic_add", shadow, g, **_masked(mask), sem=ast.Constant(RELAXED)))

    def in_input_dtype(self):
        return False


STRATEGIES: dict[Mode, Strategy] = {s.mode: s for s in (NoGradient(), Store(), Add(), Interchange(), Registers(),
                                                         Row(), Atomic())}  # in the order a launch prefers them


def choose(inputs: dict[str, Any], facts: LaunchFacts | None, deterministic: bool = False) -> dict[str, Choice]:
    """Per input (its facts: writes/input_facts.py), the first strategy that applies on the launch (``facts``;
    None: a typical launch). A buffer reaching one element from several positions (stride 0) is added atomically.
    A persistent kernel runs other programs than the forward's, whose slots later adds keep: with partial rows in
    the launch, an input with later adds is added atomically; so is it where the launch takes none
    (``facts.later_adds``: a backward to be differentiated again)."""
    choosing = Choosing(facts, deterministic)
    choices = {}
    for param, facts_of in inputs.items():
        facts_of = facts_of.at_launch(lambda c: holds(c, choosing))  # (loads that meet at this launch: their fallback)
        if facts is not None and param in facts.self_overlapping and not facts_of.inactive:
            choices[param] = Choice.atomic()
            continue
        choices[param] = next(c for s in STRATEGIES.values() if (c := s.choice(facts_of, param, choosing)))
    if choosing.axis is not None or (facts is not None and not facts.later_adds):
        choices = {p: Choice.atomic() if c.later_loads else c for p, c in choices.items()}
    return {p: replace(c, rereads=inputs[p].rereads) if inputs[p].rereads and c.strategy.merges_rereads else c
            for p, c in choices.items()}


# -- what the strategies need of a launch -------------------------------------------------------------------

def rows_fit(launch: LaunchValues, param: str, axis: int, facts: LaunchFacts) -> bool:
    """Whether ``param``'s partial rows along ``axis`` take at most ``facts.row_budget`` bytes, and at most twice the
    launch's tensors together: a row as long as the tensor's span per persistent program (at most
    ``facts.persistent_programs``). A weight's rows are small beside the activations (a few rows' worth of a
    float32 copy at most); an attention's keys, read by every query block, would take that many copies of all heads'
    keys, whose writes and sum move many times the kernel's memory (the tutorial's attention on an H200, d=64:
    7.5 ms with partial rows against 2.7 with atomics)."""
    tensor = launch.arguments.get(param)
    if facts.row_budget is None or not hasattr(tensor, "stride"):
        return True
    programs = min(launch.programs(axis), facts.persistent_programs)
    moved = sum(t.numel() * t.element_size() for t in launch.arguments.values() if hasattr(t, "element_size"))
    return programs * span_of(tensor) * (8 if tensor.element_size() == 8 else 4) <= min(facts.row_budget, 2 * moved)


def span_of(t: Any) -> int:
    """How many elements from a tensor's first one its last one lies (its shadow's partial row length)."""
    if t.numel() == 0:
        return 1
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))


def most_trips(trips: Expr, launch: LaunchValues, axis: int) -> int:
    """The most iterations any of the forward's programs along ``axis`` runs: the programs an input's own kernel
    runs along it (a count that reads the program id, a causal attention's, is evaluated for each)."""
    if not trips.program_axes():
        return trips.evaluate(launch)
    return max((trips.evaluate(replace(launch, program=(axis, p))) for p in range(launch.programs(axis))), default=0)


def own_programs(launch: LaunchValues, axis: int, trips: Expr) -> int:
    """How many programs an input's own kernel runs: the grid with the loop's iterations along ``axis``."""
    try:
        count = most_trips(trips, launch, axis)
    except Exception:
        return 0
    for a, n in enumerate(launch.grid or ()):
        count *= n if a != axis else 1
    return count


@dataclass(frozen=True)
class LaterAdds:
    """A load whose adjoint is added after the kernel (an input's other loads, beside the one written once): each
    program keeps the adjoint of its lanes with their addresses' offsets from the gradient's first element
    (tg.add_later), zero where it did not run the load; the BackwardKernel then adds them in."""

    param: str  # the wrt input
    values: str  # the kernel's parameter: a slot per program and lane, in the gradient's type (index_add_ adds
    # in it: the kernel's store rounds as a cast before it would)
    offsets: str  # the kernel's parameter: the lanes' element offsets (int64)
    shape: tuple[str, ...]  # the load's tile, as written

    def allocate(self, launch: LaunchValues, programs: int, target) -> dict[str, object]:
        import torch

        n = max(1, programs * launch.numel(self.shape))
        size = n * target.element_size()
        both = torch.zeros(8 * n + size, dtype=torch.uint8, device=target.device)  # one fill
        offsets, values = both.split_with_sizes((8 * n, size))  # (one call, not two slicings)
        return {self.offsets: offsets.view(torch.int64), self.values: values.view(target.dtype)}

    def add(self, args: dict, target, span: int, deterministic: bool) -> None:
        """Add the kept adjoints into ``target`` (``span`` elements from its first one to its last)."""
        import torch

        flat = target.as_strided((span,), (1,))
        values, offsets = args[self.values], args[self.offsets]
        if deterministic and target.is_cuda and not torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(True)  # index_add_ on CUDA adds in a fixed order then
            try:
                flat.index_add_(0, offsets, values)
            finally:
                torch.use_deterministic_algorithms(False)
        else:
            flat.index_add_(0, offsets, values)

