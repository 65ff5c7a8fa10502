"""Forward recomputation + reverse sweep: the body of the backward kernel.

The backward kernel re-runs the forward (its stores left out), computing each shadow
pointer beside the pointer it mirrors (``d_x_ptrs = d_x_ptr + offs`` beside
``x_ptrs = x_ptr + offs``), then walks the statements backwards emitting each active
statement's adjoint under a ``# grad of: <forward line>`` comment:

- an operation: its rule from the table in ``core/operations.py``, per differentiated argument (``rules.py``);
- a load or a store: ``memory.py`` (through the shadows).

Recomputed statements that the sweep does not need are dropped, so the printed kernel
shows only what the backward computes.

Control flow (loops are reversed as ``loops.py`` plans them):

- an ``if`` is recomputed (so its merged values exist), and its adjoint is an ``if`` on
  the same condition: the branch the forward took recomputes its own values (they
  are not visible after a Triton ``if``), then runs its adjoints. Adjoints of values
  from before the ``if`` start at zero before it, so both branches leave them with
  one type;
- a ``for`` is reversed by a loop over the same iterations: each iteration recomputes
  its values, resets and advances its index and pointer state as the forward did, and
  runs its adjoints; a linear accumulator's partial sums all share the adjoint of its
  final value. Adjoints of values from before the loop start at zero before it and
  are carried through it.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from typing import Any

from ..analysis.analyze import Analysis
from ..analysis.stored_outputs import StoredValue
from ..core.ir import (
    Namer,
    arguments,
    child_blocks,
    copy_structured,
    free_names,
    is_structured,
    name_node,
    names_in,
    op_of,
    reads,
    statements,
    target_of,
)
from ..core.operations import LOADS, STORES, instantiate, operation_of
from ..writes.strategies import Choice
from .interchange import group_programs, loop_to_grid, without_unused
from .loop_plans import LoopPlan
from .loops import LoopReversal, merge_records
from .memory import MemoryAdjoints
from .persistent import persistent
from .recompute import Recompute
from .rereads import Deferred, MergePoint, merge_rereads
from .rules import OperationAdjoints


@dataclass
class BackwardBody:
    """The backward body, before code generation."""

    body: list[ast.stmt]
    comments: dict[str, str]  # marker name -> comment text
    shadow_params: list[str]  # d_<output>..., d_<wrt>... (a tensor updated in place: one, with its outputs)
    cotangent_params: list[str]  # tile functions: one per returned value
    returns: list[ast.expr] | None  # tile functions: the wrt gradients
    foldable: set[str]  # temporaries with no adjoint: codegen writes them back into their uses
    reassigned: set[str]  # merge and loop-carried variables (and their shadows): never folded into a use
    extra_params: list[str] = field(default_factory=list)  # after the shadows: a persistent variant's counts
    written_inputs: set[str] = field(default_factory=set)  # wrt inputs whose loads' adjoints it writes
    tapes: list = field(default_factory=list)  # state_tape.StateTape: parameters after the extra ones, sized at launch
    later_adds: list = field(default_factory=list)  # strategies.LaterAdds: parameters after the tapes'
    prologue: Any = None  # interchange.Prologue: per forward program values a kernel of their own computes first
    loop_stages: str | None = None  # a persistent variant's constexpr: its loop over the programs' stages in flight
    loop_held: str | None = None  # and whether the loads before that loop are held across it (persistent.py)
    as_left_params: list[str] = field(default_factory=list)  # after the shadows: tensors as the launch left them


@dataclass
class Scope:
    """A block of the forward being reversed; ``pre`` collects what must run before its reversal."""

    block: int  # id() of the forward block
    pre: list[ast.stmt]


def _drop_none_keywords(node: ast.AST) -> ast.AST:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            n.keywords = [k for k in n.keywords if not (isinstance(k.value, ast.Constant) and k.value.value is None)]
    return node


MARKER = "__tg_comment_"  # a comment's placeholder statement is this name, numbered


def comment_marker(comments: dict[str, str], text: str) -> ast.Expr:
    """A statement codegen replaces by the comment ``text`` (kept in ``comments`` under its marker)."""
    marker = f"{MARKER}{len(comments)}__"
    comments[marker] = text
    return ast.Expr(name_node(marker))


def is_comment_marker(stmt: ast.stmt) -> bool:
    """Whether ``stmt`` is a statement ``comment_marker`` made."""
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Name) and stmt.value.id.startswith(MARKER)


class BackwardBuilder:
    """Writes the backward body: the sweep first (adjoints, statement by statement, backwards), then the
    recomputation of the forward values it reads in front of it."""

    def __init__(self, analysis: Analysis, loop_plans: dict[int, LoopPlan], tile: bool,
                 choices: dict[str, Choice] | None = None, saved: bool = False,
                 read_back: dict[str, StoredValue] | None = None):
        self.analysis = analysis
        self.saved = saved  # the forward kept the nonlinear loops' state tapes (augment.py)
        self.read_back = read_back or {}  # values recomputing may read from the outputs holding them: stored_outputs.py
        self.program = analysis.program
        self.loop_plans = loop_plans
        self.tile = tile
        self.choices = choices or {p: Choice.atomic() for p in analysis.wrt}  # how each input's gradient is written
        self.tapes: list = []  # state_tape.StateTape: the state tapes of nonlinear loops (written by loops.py)
        self.partial_sums: list = []  # persistent.PartialSum: inputs summed in registers (written by memory.py)
        self.later_adds: list = []  # strategies.LaterAdds: loads' adjoints added after the kernel (memory.py)
        self.written_inputs: set[str] = set()  # wrt inputs whose loads' adjoints were written (memory.py)
        self.deferred: list[Deferred] = []  # later loads' adjoints to write with their first load's (rereads.py)
        self.merge_points: list[MergePoint] = []  # first loads' writes, where those are added (rereads.py)
        self.namer = Namer(self.program.names)
        self.adjoint: dict[str, str] = {}  # primal name -> name of its adjoint
        self.shadow: dict[str, str] = {}  # pointer name -> name of its shadow
        self.comments: dict[str, str] = {}
        self.out: list[ast.stmt] = []  # the block of the sweep being written
        # id(block) -> the block and its last comment: the block kept, so that a later block cannot take its id
        # and lose its first comment (where the garbage collector freed one varied from run to run)
        self.last_comment: dict[int, tuple[list[ast.stmt], str]] = {}
        params = self.program.param_names()
        self.namer.taken |= set(params) | set(analysis.as_left_params.values())
        self.defs = analysis.defs
        self.root = id(self.program.body)
        self.home: dict[str, int] = {}  # name -> id of the block it belongs to (where its value is visible)
        # a value bound only inside constexpr ifs -> their (test, branch) pairs; id(such a branch's block) -> its pair
        self.bound_only_in: dict[str, set[tuple[str, bool]]] = {}
        self.branch_key: dict[int, tuple[str, bool]] = {}
        self.parent: dict[int, int | None] = {}  # block -> enclosing block
        self.enclosing: dict[int, list[ast.stmt]] = {}  # id(statement) -> the if/for nodes around it
        self.stmt_block: dict[int, int] = {}  # id(statement) -> id of the block it is in
        self._index(self.program.body, None, [])
        self.scopes = [Scope(self.root, [])]
        self.suppressed: set[str] = set()  # partial sums of linear accumulators: they share its adjoint
        self.g_override: dict[int, str] = {}  # id(update of nonlinear loop state) -> the adjoint it receives
        self.items: dict[str, dict[int, list[str]]] = {}  # an operation's tuple of results -> index -> its items
        for s in statements(self.program.body):
            if op_of(s).kind == "item":
                results, index = op_of(s).args
                self.items.setdefault(results.id, {}).setdefault(index.value, []).append(target_of(s))
        self.forward = Recompute(self)  # the forward's values the sweep reads, recomputed (recompute.py)
        self.loops = LoopReversal(self)  # loops reversed as their plans say (loops.py)
        self.memory = MemoryAdjoints(self)  # loads' and stores' adjoints (memory.py)
        self.rules = OperationAdjoints(self)  # the other operations' adjoints, from their rules (rules.py)
        mirrored = list(dict.fromkeys([*analysis.outputs, *analysis.wrt])) if not tile else []  # in place: once
        self.shadow_params = [self.shadow_name(p) for p in mirrored]

    def _index(self, block: list[ast.stmt], parent: int | None, enclosing: list[ast.stmt]) -> None:
        self.parent[id(block)] = parent
        for s in block:
            self.enclosing[id(s)] = enclosing
            self.stmt_block[id(s)] = id(block)
            if isinstance(s, ast.If):
                if s.tg.static:
                    self.branch_key.update({id(b): (ast.dump(s.test), b is s.body) for b in (s.body, s.orelse)})
                for m in s.tg.merges:  # assigned in the branches, visible after the if
                    self.home.setdefault(m, id(block))
                    sides = [b is s.body for b in (s.body, s.orelse) if any(target_of(x) == m for x in statements(b))]
                    if s.tg.static and len(sides) == 1:  # it exists only where Triton compiles that branch
                        self.bound_only_in.setdefault(m, set()).add((ast.dump(s.test), sides[0]))
            if isinstance(s, ast.For):
                self.home[s.target.id] = id(s.body)
            t = target_of(s)
            if t is not None:
                self.home.setdefault(t, id(block))
            for b in child_blocks(s):
                self._index(b, id(block), [*enclosing, s])

    def within(self, name: str, block: list[ast.stmt]) -> bool:
        """Whether ``name`` is a value of ``block`` (or of a block nested in it)."""
        return self.block_within(self.home.get(name, self.root), block)

    def shadow_name(self, pointer: str) -> str:
        """The shadow of a pointer; the pointers it is computed from get theirs too."""
        if pointer not in self.shadow:
            self.shadow[pointer] = self.namer.fresh(f"d_{pointer}")
            base = self.analysis.pointer_base.get(pointer, pointer)
            for d in self.defs.get(pointer, []):
                if target_of(d) is not None:
                    for n in self.forward.pointer_operands(d, base):
                        self.shadow_name(n)
        return self.shadow[pointer]

    def adjoint_name(self, name: str) -> str:
        if name not in self.adjoint:
            self.adjoint[name] = self.namer.fresh(f"d_{name}")
        return self.adjoint[name]

    # -- the sweep ------------------------------------------------------------------------

    def run(self) -> BackwardBody:
        cotangents: list[str] = []
        returns = None
        if self.tile:
            returned = self.program.returns
            for i, r in enumerate(returned):
                user_named = isinstance(r, ast.Name) and r.id not in self.program.temporaries
                cot = self.namer.fresh(f"d_{r.id}" if user_named else "d_out" if len(returned) == 1 else f"d_out{i}")
                cotangents.append(cot)
                if isinstance(r, ast.Name) and r.id in self.analysis.active:
                    if r.id in self.adjoint:
                        self.accumulate(r.id, name_node(cot))
                    else:
                        self.adjoint[r.id] = cot  # the cotangent parameter is the adjoint
        self.reverse_block(self.program.body)
        copies = merge_rereads(self.out, self.deferred, self.merge_points, self.namer.fresh, self.marker,
                               is_comment_marker, {n for s in self.partial_sums for n in (s.accumulator, s.shadow,
                                                                                          *names_in(s.mask))})
        if self.tile:
            zeros = "tl.zeros_like(x).to(tl.float32)"
            returns = [name_node(self.adjoint[w]) if w in self.adjoint else instantiate(zeros, {"x": name_node(w)})
                       for w in self.analysis.wrt]
        reassigned = {n for n, ds in self.defs.items() if len(ds) > 1}
        reassigned |= {self.shadow[n] for n in reassigned if n in self.shadow}
        own = any(c.strategy.own_kernel for c in self.choices.values())  # (its sums are stored at sweep values)
        epilogue = {n for s in self.partial_sums for n in (s.shadow, *names_in(s.mask))} if not own else set()
        recomputed = self.forward.statements(epilogue)
        merge_records(recomputed, self.out)
        self.loops.keep_finals(recomputed, self.out)
        body, extra = recomputed + self.out, []
        axis = next((c.axis for c in self.choices.values() if c.strategy.partial_rows), None)
        prologue = stages = held = None
        if own:  # a kernel of its own for these inputs: the loop's iterations are programs (interchange.py)
            axis = self.choices[self.analysis.wrt[0]].axis
            self.out, guard, prologue = loop_to_grid(
                recomputed, self.out, [s.accumulator for s in self.partial_sums], axis, self.comments, self.namer,
                {n for s in self.partial_sums for n in (s.shadow, *names_in(s.mask))},
                {k.index for k in self.analysis.program_trips}, self.adjoint_likes(), self.loaded_from())
            recomputed = without_unused(recomputed, set().union(*[reads(s) for s in self.out], reads(guard.count)
                                                                if guard else set()))  # the prologue's needs dropped
            body, extra, _ = self.persistent(recomputed, axis, reassigned, every=True, guard=guard)
            if group_programs(body):  # (programs running at once read the same tiles)
                body.insert(0, self.marker("programs taken in groups of 8 along axis 0 (tg.grouped_program_id)"))
        elif axis is not None:
            stages, held = self.namer.fresh("STAGES"), self.namer.fresh("HELD")
            body, extra, held = self.persistent(recomputed, axis, reassigned, stages=stages, held=held)
        temporaries = self.program.temporaries | {mirror[t] for mirror in (self.shadow, self.forward.as_left)
                                                  for t in self.program.temporaries if t in mirror}
        temporaries |= {copies[t] for t in temporaries if t in copies}  # (rereads.py's copies fold as they do)
        foldable = {t for t in temporaries if t not in self.analysis.active}
        return BackwardBody(body, self.comments, self.shadow_params, cotangents, returns, foldable, reassigned, extra,
                            self.written_inputs, self.tapes, self.later_adds, prologue, stages, held,
                            list(self.analysis.as_left_params.values()))

    def adjoint_likes(self) -> dict[str, tuple[ast.expr, tuple[str, ...]]]:
        """Adjoints whose primal's shape the source says, and its type: -> (zeros of the adjoint's shape and type,
        the shape as written), for an interchange's prologue (interchange.Prologue)."""
        likes = {}
        for primal, adjoint in self.adjoint.items():
            shape, dtype = self.analysis.shapes.get(primal), self.loops.state_type(primal)
            if shape is not None and dtype is not None:
                extents = "".join(f"{e}, " for e in shape)
                likes[adjoint] = (ast.parse(f"tg.zeros_grad(tl.zeros(({extents}), {dtype}))", mode="eval").body,
                                  tuple(shape))
        return likes

    def loaded_from(self) -> dict[str, str]:
        """Names the kernel loads once, from one pointer parameter -> that parameter (their type is its element
        type: an interchange's prologue spells a type with it)."""
        return {target_of(s): param for param, loads in self.analysis.loads.items() for s in loads
                if target_of(s) and len(self.defs.get(target_of(s), ())) == 1}

    def persistent(self, recomputed: list[ast.stmt], axis: int, reassigned: set[str], every: bool = False,
                   guard: Any = None, stages: str | None = None, held: str | None = None
                   ) -> tuple[list[ast.stmt], list[str], str | None]:
        """The body as a loop over the forward's programs along ``axis`` (persistent.py), the parameters
        that adds: the forward's program count, and each partial row's stride (``stages``: the constexpr parameter
        of the loop's pipelining), and ``held`` where the body reads it (the constexpr holding its once-loaded
        values across the loop), else None."""
        programs = self.namer.fresh("programs")
        partial = [p for p, c in self.choices.items() if c.strategy.partial_rows]
        rows = {self.shadow[p]: self.namer.fresh(f"{self.shadow[p]}_rows") for p in partial}
        names = ", ".join(p for p, c in self.choices.items() if c.strategy.partial_rows or c.strategy.own_kernel)
        if every:
            note = self.marker(f"each program takes one iteration of the loop (tl.program_id({axis})) and loops over "
                               f"all of the forward's programs along axis {axis},\nsumming the gradient of {names} "
                               "in registers: the loop interchange of a hand-written backward")
        else:
            note = (f"one program per group of the forward's programs along axis {axis}: each sums the gradient of "
                    f"{names} over its programs\n(in its own partial row, reduced in order after the kernel), and the "
                    "rest as the forward's program would")
        params = {*self.program.param_names(), *self.shadow_params, *self.analysis.as_left_params.values(), programs,
                  *rows.values()}
        body = persistent(recomputed, self.out, axis, programs, rows, self.partial_sums, reassigned, params, self.namer,
                          every, guard, stages, held)
        if held is not None and held not in reads(ast.Module(body, [])):  # nothing loaded before the loop
            held = None
        if not every:
            if held is not None:
                note += (f";\nwhat it loads once is held in registers across the loop under `{held}`, else loaded "
                         "again for each row (tuning picks)")
            note = self.marker(note)
        loop = next(i for i, s in enumerate(body) if isinstance(s, ast.For))
        return [*body[:loop], note, *body[loop:]], [programs, *rows.values()], held

    def describe(self, stmt: ast.stmt) -> str:
        """The forward line a statement comes from; inside an inlined helper, its own line and the call."""
        origin, inner = stmt.tg.origin, stmt.tg.where
        if inner.line == origin.line and inner.file == origin.file:
            return origin.text
        return f"{inner.text}  (in {inner.function}, from: {origin.text})"

    def comment_for(self, stmt: ast.stmt) -> None:
        """``# grad of: <line>``."""
        self.comment(f"grad of: {self.describe(stmt)}")

    def comment(self, text: str) -> None:
        if self.last_comment.get(id(self.out), (None, None))[1] == text:
            return  # the adjoints of one forward line share its comment
        self.last_comment[id(self.out)] = (self.out, text)
        self.out.append(self.marker(text))

    def marker(self, text: str) -> ast.Expr:
        return comment_marker(self.comments, text)

    def emit(self, stmt: ast.stmt) -> None:
        self.out.append(stmt)
        if is_structured(stmt):  # what follows a loop or branch gets its own comment
            self.last_comment.pop(id(self.out), None)

    def written(self, block: list[ast.stmt], write) -> list[ast.stmt]:
        """Run ``write`` with the sweep going into ``block``."""
        saved, self.out = self.out, block
        try:
            write()
        finally:
            self.out = saved
        return block

    def accumulate(self, name: str, contribution: ast.expr) -> None:
        """``d_name = contribution`` the first time, ``d_name += contribution`` after.

        Inside a branch or loop, the adjoint of a value from outside it starts at zero
        before the outermost such construct, so it is carried through with one type.
        """
        if name in self.suppressed:
            return
        if name in self.adjoint:
            node = ast.AugAssign(target=ast.Name(self.adjoint[name], ast.Store()), op=ast.Add(), value=contribution)
        else:
            scope = self.scope_before(name)
            d = self.adjoint_name(name)
            if scope is None:
                node = ast.Assign(targets=[ast.Name(d, ast.Store())], value=contribution)
            else:
                scope.pre.append(ast.Assign(targets=[ast.Name(d, ast.Store())],
                                            value=instantiate("tg.zeros_grad(x)", {"x": name_node(name)})))
                node = ast.AugAssign(target=ast.Name(d, ast.Store()), op=ast.Add(), value=contribution)
        self.emit(_drop_none_keywords(node))

    def scope_before(self, name: str) -> Scope | None:
        """The construct being reversed that ``name`` comes from outside of, outermost first (None: local)."""
        home = self.home.get(name, self.root)
        bound, held = self.bound_only_in.get(name), set()
        for s in self.scopes if bound else ():  # bound only inside constexpr ifs: its adjoint starts in the first
            held.add(self.branch_key.get(s.block))  # branch where it exists (its own, or a later if's on the same
            if bound <= held:  # test), not before the if: zeros_grad of a name unbound where Triton compiles
                home = s.block  # the other branch
                break
        for i in range(len(self.scopes) - 1, -1, -1):
            if self.scopes[i].block == home:
                return self.scopes[i + 1] if i + 1 < len(self.scopes) else None
        raise AssertionError(f"`{name}` is not visible here")

    # -- control flow ---------------------------------------------------------------------

    def reverse_block(self, block: list[ast.stmt]) -> None:
        for stmt in reversed(block):
            if isinstance(stmt, ast.For):
                self.loops.reverse_for(stmt)
            elif isinstance(stmt, ast.If):
                self.reverse_if(stmt)
            else:
                self.reverse_statement(stmt)

    def reverse_nested(self, block: list[ast.stmt], pre: list[ast.stmt]) -> list[ast.stmt]:
        self.scopes.append(Scope(id(block), pre))
        try:
            return self.written([], lambda: self.reverse_block(block))
        finally:
            self.scopes.pop()

    def reverse_if(self, node: ast.If) -> None:
        pre: list[ast.stmt] = []
        blocks = (node.body, node.orelse)
        sweeps = [self.reverse_nested(block, pre) for block in blocks]
        if not any(sweeps):
            return
        bodies = [self.recompute(block, sweep) + sweep for block, sweep in zip(blocks, sweeps, strict=True)]
        for c in self.choices.values():
            if fill := c.strategy.zeros_for(c):
                for i, block in enumerate(blocks):
                    load = next((s for s in statements(block) if target_of(s) == fill
                                 and op_of(s).kind in LOADS), None)
                    if load is not None:
                        bodies[1 - i] += self.memory.zero_stores(block, load)
        self.comment(f"grad of: {self.describe(node)}  (the branch taken recomputes its values, then its adjoints)")
        for p in pre:
            self.emit(p)
        self.emit(copy_structured(node, test=copy.deepcopy(node.test), body=bodies[0] or [ast.Pass()],
                                   orelse=bodies[1]))

    def with_shadow(self, stmt: ast.stmt) -> list[ast.stmt]:
        return self.forward.with_shadow(stmt)

    def needed(self, block: list[ast.stmt], sweep: list[ast.stmt], also=(), follow=()) -> set[str]:
        """Values of ``block`` (and names in ``also``) that ``sweep`` reads, directly or through a shadow,
        and what they are computed from in ``block`` (through the definitions of ``follow`` names too)."""
        shadow_of = self.forward.mirrored()
        seeds = set()
        for n in free_names(sweep):
            n = shadow_of.get(n, n)
            if n in also or self.within(n, block):
                seeds.add(n)
        return self.forward.closure(seeds, block, follow)

    def recompute(self, block: list[ast.stmt], sweep: list[ast.stmt]) -> list[ast.stmt]:
        """The statements of ``block`` that compute what ``sweep`` reads."""
        return self.forward.block(block, self.needed(block, sweep))

    def reverse_statement(self, stmt: ast.stmt) -> None:
        op = op_of(stmt)
        t = target_of(stmt)
        if op.kind in STORES:
            self.memory.reverse_store(stmt)
        elif t in self.analysis.stabilizers and operation_of(op).reduction != "axis":  # (a stabilizer is a tl.max)
            return  # a stabilizer in another shape: the max's comment says why it has no adjoint
        elif t in self.analysis.stabilizers:
            self.comment(f"grad of: {self.describe(stmt)}\n{t} is subtracted before exp and normalized away: "
                         "nothing depends on it, so its gradient is zero (stabilizers.py)")
        elif op.kind == "item":
            return  # its adjoint is read by the operation whose result it is
        elif operation_of(op).results > 1 and t in self.analysis.active:
            self.rules.reverse_multi(stmt, t)
        elif t is not None and t in self.analysis.active and self.g_of(stmt) is not None and self.contributes(stmt):
            if not stmt.tg.join:  # a join's copy goes under its if's or loop's comment
                self.comment_for(stmt)
            if op.kind in LOADS:
                self.memory.reverse_load(stmt, t)
            else:
                self.rules.reverse(stmt, t)
        elif op.kind in LOADS and self.memory.stores_over(t):  # no adjoint reached it, its store's zeros left to it
            self.memory.store_zero_adjoint(stmt)

    def g_of(self, stmt: ast.stmt) -> str | None:
        """The adjoint of the statement's result, if any reached it."""
        return self.g_override.get(id(stmt)) or self.adjoint.get(target_of(stmt))

    def contributes(self, stmt: ast.stmt) -> bool:
        """Whether reversing the statement adds to any adjoint (a partial sum adds nothing to the next)."""
        op = op_of(stmt)
        if op.kind in LOADS:
            return True
        rule, active = operation_of(op), self.analysis.is_active
        return rule.has_rule and any(p in rule.adjoints and active(arg) and arg.id not in self.suppressed
                                     for p, arg in arguments(stmt).items())

    def same_shape(self, a: str, b: str) -> bool:
        sa, sb = self.analysis.shapes.get(a), self.analysis.shapes.get(b)
        return sa is not None and sa == sb

    def block_within(self, b: int | None, block: list[ast.stmt]) -> bool:
        while b is not None:
            if b == id(block):
                return True
            b = self.parent[b]
        return False


def build_backward(analysis: Analysis, loop_plans: dict[int, LoopPlan], tile: bool = False,
                   choices: dict[str, Choice] | None = None, saved: bool = False,
                   read_back: dict[str, StoredValue] | None = None) -> BackwardBody:
    """The backward body; ``choices``: how each input's gradient is written (writes/strategies.py; default: atomically);
    ``saved``: the nonlinear loops' state tapes come filled from the forward (augment.py); ``read_back``: values
    the recomputation reads from the outputs holding them (stored_outputs.py)."""
    for s in statements(analysis.program.body):  # memory operations' argument checks, before any output
        if operation_of(op_of(s)).memory is not None:
            arguments(s)
    return BackwardBuilder(analysis, loop_plans, tile, choices, saved, read_back).run()
