"""Forward replay + reverse sweep: the body of the backward kernel.

The backward kernel re-runs the forward (its stores left out), computing each shadow
pointer beside the pointer it mirrors (``d_x_ptrs = d_x_ptr + offs`` beside
``x_ptrs = x_ptr + offs``), then walks the statements backwards emitting each active
statement's adjoint under a ``# grad of: <forward line>`` comment:

- an operation: its rule from ``rules.py``, per differentiated argument;
- a store of an output: the adjoint of the stored value is loaded from the output's shadow;
- a load of a ``wrt`` input: its adjoint is added into the input's shadow with
  ``tl.atomic_add`` (correct whatever the access pattern).

Replayed statements that the sweep does not need are dropped, so the printed kernel
shows only what the backward computes.

Control flow (the strategies are chosen in ``loops.py``):

- an ``if`` is replayed (so its merged values exist), and its adjoint is an ``if`` on
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
from dataclasses import dataclass

from .analysis import Analysis, bind, names_in, op_of, stored_value, target_of, where
from .blockptr import block_addresses, block_mask
from .frontend import Namer, Op, refuse
from .ir import child_blocks, free_names, header, is_structured, reads, statements
from .rules import ACCUMULATES, LOADS, MEMORY, MULTI_RESULT, STORES, rule_of

ASSERTS = ("static_assert", "device_assert")


@dataclass
class Reversed:
    """The backward body, before code generation."""

    body: list[ast.stmt]
    comments: dict[str, str]  # marker name -> comment text
    shadow_params: list[str]  # d_<output>..., d_<wrt>...
    cotangent_params: list[str]  # tile functions: one per returned value
    returns: list[ast.expr] | None  # tile functions: the wrt gradients
    foldable: set[str]  # temporaries with no adjoint: codegen writes them back into their uses
    reassigned: set[str]  # merge and loop-carried variables (and their shadows): never folded into a use


def _name(id: str) -> ast.Name:
    return ast.Name(id, ast.Load())


def _substitute(template: str, env: dict[str, ast.expr]) -> ast.expr:
    class Sub(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            return copy.deepcopy(env[n.id]) if n.id in env else n

    return Sub().visit(ast.parse(template, mode="eval").body)


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


class Reverser:
    def __init__(self, analysis: Analysis, tile: bool):
        self.a = analysis
        self.p = analysis.program
        self.tile = tile
        self.namer = Namer(self.p.names)
        self.adjoint: dict[str, str] = {}  # primal name -> name of its adjoint
        self.shadow: dict[str, str] = {}  # pointer name -> name of its shadow
        self.comments: dict[str, str] = {}
        self.out: list[ast.stmt] = []  # the block of the sweep being written
        self.last_comment: dict[int, str] = {}  # id(block) -> its last comment
        params = self.p.param_names()
        self.namer.taken |= set(params)
        self.defs = analysis.defs
        self.root = id(self.p.body)
        self.home: dict[str, int] = {}  # name -> id of the block it belongs to (where its value is visible)
        self.parent: dict[int, int | None] = {}  # block -> enclosing block
        self.enclosing: dict[int, list[ast.stmt]] = {}  # id(statement) -> the if/for nodes around it
        self.stmt_block: dict[int, int] = {}  # id(statement) -> id of the block it is in
        self._index(self.p.body, None, [])
        self.scopes = [Scope(self.root, [])]
        self.suppressed: set[str] = set()  # partial sums of linear accumulators: they share its adjoint
        self.g_override: dict[int, str] = {}  # id(update of nonlinear loop state) -> the adjoint it receives
        self.items: dict[str, dict[int, str]] = {}  # tuple of an operation's results -> index -> its item's name
        for s in statements(self.p.body):
            if op_of(s).kind == "item":
                results, index = op_of(s).args
                self.items.setdefault(results.id, {})[index.value] = target_of(s)
        mirrored = [*analysis.outputs, *analysis.wrt] if not tile else []
        self.shadow_params = [self.shadow_name(p) for p in mirrored]

    def _index(self, block: list[ast.stmt], parent: int | None, enclosing: list[ast.stmt]) -> None:
        self.parent[id(block)] = parent
        for s in block:
            self.enclosing[id(s)] = enclosing
            self.stmt_block[id(s)] = id(block)
            if isinstance(s, ast.If):
                for m in s.tg_merges:  # assigned in the branches, visible after the if
                    self.home.setdefault(m, id(block))
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
            base = self.a.pointer_base.get(pointer, pointer)
            for d in self.defs.get(pointer, []):
                if target_of(d) is not None:
                    for n in self.pointer_operands(d, base):
                        self.shadow_name(n)
        return self.shadow[pointer]

    def adjoint_name(self, name: str) -> str:
        if name not in self.adjoint:
            self.adjoint[name] = self.namer.fresh(f"d_{name}")
        return self.adjoint[name]

    # -- the sweep ------------------------------------------------------------------------

    def run(self) -> Reversed:
        cotangents: list[str] = []
        returns = None
        if self.tile:
            returned = self.p.returns
            for i, r in enumerate(returned):
                user_named = isinstance(r, ast.Name) and r.id not in self.p.temporaries
                cot = self.namer.fresh(f"d_{r.id}" if user_named else "d_out" if len(returned) == 1 else f"d_out{i}")
                cotangents.append(cot)
                if isinstance(r, ast.Name) and r.id in self.a.active:
                    if r.id in self.adjoint:
                        self.accumulate(r.id, _name(cot))
                    else:
                        self.adjoint[r.id] = cot  # the cotangent parameter is the adjoint
        self.reverse_block(self.p.body)
        if self.tile:
            returns = [_name(self.adjoint[w]) if w in self.adjoint
                       else _substitute("tl.zeros_like(x).to(tl.float32)", {"x": _name(w)}) for w in self.a.wrt]
        body = self.replay() + self.out
        temporaries = self.p.temporaries | {self.shadow[t] for t in self.p.temporaries if t in self.shadow}
        foldable = {t for t in temporaries if t not in self.a.active}
        reassigned = {n for n, ds in self.defs.items() if len(ds) > 1}
        reassigned |= {self.shadow[n] for n in reassigned if n in self.shadow}
        return Reversed(body, self.comments, self.shadow_params, cotangents, returns, foldable, reassigned)

    def describe(self, stmt: ast.stmt) -> str:
        """The forward line a statement comes from; inside an inlined helper, its own line and the call."""
        origin, inner = stmt.tg_origin, stmt.tg_where
        if inner.line == origin.line and inner.file == origin.file:
            return origin.text
        return f"{inner.text}  (in {inner.function}, from: {origin.text})"

    def comment_for(self, stmt: ast.stmt) -> None:
        """``# grad of: <line>``."""
        self.comment(f"grad of: {self.describe(stmt)}")

    def comment(self, text: str) -> None:
        if self.last_comment.get(id(self.out)) == text:
            return  # the adjoints of one forward line share its comment
        self.last_comment[id(self.out)] = text
        marker = f"__tg_comment_{len(self.comments)}__"
        self.comments[marker] = text
        self.out.append(ast.Expr(_name(marker)))

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
                                            value=_substitute("tg.zeros_grad(x)", {"x": _name(name)})))
                node = ast.AugAssign(target=ast.Name(d, ast.Store()), op=ast.Add(), value=contribution)
        self.emit(_drop_none_keywords(node))

    def scope_before(self, name: str) -> Scope | None:
        """The construct being reversed that ``name`` comes from outside of, outermost first (None: local)."""
        home = self.home.get(name, self.root)
        for i in range(len(self.scopes) - 1, -1, -1):
            if self.scopes[i].block == home:
                return self.scopes[i + 1] if i + 1 < len(self.scopes) else None
        raise AssertionError(f"`{name}` is not visible here")

    # -- control flow ---------------------------------------------------------------------

    def reverse_block(self, block: list[ast.stmt]) -> None:
        for stmt in reversed(block):
            if isinstance(stmt, ast.For):
                self.reverse_for(stmt)
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
        self.comment(f"grad of: {self.describe(node)}  (the branch taken recomputes its values, then its adjoints)")
        for p in pre:
            self.emit(p)
        self.emit(_structured_copy(node, test=copy.deepcopy(node.test), body=bodies[0] or [ast.Pass()],
                                   orelse=bodies[1]))

    def reverse_for(self, node: ast.For) -> None:
        plan = self.a.loops[id(node)]
        for name, chain in plan.accumulators.items():  # every partial sum shares the final value's adjoint
            self.ensure_adjoint(node, name)
            for n in chain:
                self.adjoint[n] = self.adjoint[name]
            self.suppressed |= chain
        carried = {c.name: c for c in node.tg_carried}
        updates = [s for s in node.body if target_of(s) in carried]  # the statements that end the body
        incoming = {}
        for name in plan.nonlinear:  # the adjoint of the state after the iteration being reversed
            incoming[name] = self.namer.fresh(f"{self.ensure_adjoint(node, name)}_next")
            for s in updates:
                if target_of(s) == name:
                    self.g_override[id(s)] = incoming[name]
        pre: list[ast.stmt] = []
        sweep = self.reverse_nested(node.body, pre)
        if not sweep:
            return
        # the state's updates are followed only when the reverse loop advances the state itself
        needed = self.needed(node.body, sweep, carried, follow=() if plan.nonlinear else carried)
        self.comment(plan.comment)
        for p in pre:
            self.emit(p)
        if plan.nonlinear:
            self.rebuilding_loop(node, plan, sweep, needed, updates, incoming)
        else:
            self.recomputing_loop(node, plan, sweep, needed, updates)

    def recomputing_loop(self, node: ast.For, plan, sweep, needed, updates) -> None:
        """The same iterations in the same order: recompute, adjoints, then advance the state."""
        carried = {c.name: c for c in node.tg_carried}
        state = [carried[n] for n in carried if n in needed]
        self.check_state(node, plan, state)
        body = self.replay_block(node.body, needed, skip={id(s) for s in updates})
        body += sweep
        for s in updates:
            if target_of(s) in needed:
                body += self.with_shadow(copy.deepcopy(s))
        for s in self.resets(node, state):
            self.emit(s)
        self.emit(_structured_copy(node, target=copy.deepcopy(node.target), iter=copy.deepcopy(node.iter),
                                   body=body))

    def rebuilding_loop(self, node: ast.For, plan, sweep, needed, updates, incoming) -> None:
        """The iterations in reverse order; each first rebuilds the carried state it starts from by
        re-running the iterations before it from the loop's entry (quadratic in the trip count)."""
        carried = {c.name: c for c in node.tg_carried}
        rebuilt = self.closure({n for n in carried if n in needed}, node.body, carried)
        state = [carried[n] for n in carried if n in rebuilt]
        self.check_state(node, plan, state)
        index = node.target.id
        start, stop, step = _bounds(node)
        trips, back, now = (self.namer.fresh(f"{index}_{w}") for w in ("trips", "back", "now"))
        positive = isinstance(step, ast.Constant) and isinstance(step.value, int) and step.value > 0
        count = ("stop - start" if _is_one(step) else "tl.cdiv(stop - start, step)" if positive
                 else "tg.trip_count(start, stop, step)")  # a step whose sign is known at compile time only
        bounds = {"start": start, "stop": stop, "step": step, "trips": _name(trips), "back": _name(back)}
        self.emit(ast.Assign(targets=[ast.Name(trips, ast.Store())], value=_substitute(count, bounds)))
        body: list[ast.stmt] = [ast.Assign(targets=[ast.Name(now, ast.Store())],
                                           value=_substitute("start + (trips - 1 - back) * step", bounds))]
        body += self.resets(node, state)
        replay = self.replay_block(node.body, rebuilt)
        if replay:
            iterator = copy.deepcopy(node.iter)
            args = [copy.deepcopy(start), _name(now), copy.deepcopy(step)]
            if _is_one(step):  # as the forward would write it
                args = args[1:2] if isinstance(start, ast.Constant) and start.value == 0 else args[:2]
            iterator.args = args
            iterator.keywords = [k for k in iterator.keywords if k.arg not in ("arg1", "arg2", "step")]
            body.append(_structured_copy(node, target=copy.deepcopy(node.target), iter=iterator, body=replay))
        body.append(ast.Assign(targets=[ast.Name(index, ast.Store())], value=_name(now)))
        for name, d_next in incoming.items():  # this iteration's update gets the adjoint carried so far;
            d = self.adjoint[name]  # what flows into the state it started from is collected afresh
            body.append(ast.Assign(targets=[ast.Name(d_next, ast.Store())], value=_name(d)))
            body.append(ast.Assign(targets=[ast.Name(d, ast.Store())], value=_substitute("tl.zeros_like(d)", {
                "d": _name(d)})))
        body += self.replay_block(node.body, needed, skip={id(s) for s in updates})
        body += sweep
        func = "tl.static_range" if node.tg_static else "range"
        loop = ast.For(target=ast.Name(back, ast.Store()), iter=_substitute(f"{func}(trips)", bounds), body=body,
                       orelse=[])
        self.emit(ast.copy_location(loop, node))

    def ensure_adjoint(self, node: ast.For, name: str) -> str:
        """The adjoint of a loop's carried variable before its reversal (zero when nothing reached it)."""
        if name not in self.adjoint:
            self.adjoint[name] = self.adjoint_name(name)
            like = _name(name)
            init = next(c.init for c in node.tg_carried if c.name == name)
            if isinstance(init, ast.Name) and init.id != name:  # its type without replaying the loop
                like = copy.deepcopy(init)
            self.emit(ast.Assign(targets=[ast.Name(self.adjoint[name], ast.Store())],
                                 value=_substitute("tg.zeros_grad(x)", {"x": like})))
        return self.adjoint[name]

    def check_state(self, node: ast.For, plan, state) -> None:
        for c in state:
            if c.name in plan.accumulators:  # loops.py promised its value is not needed
                raise refuse(where(node), f"the loop over `{node.target.id}`: `{c.source}`'s value at each "
                             "iteration is needed", "use the accumulator for accumulating only")

    def resets(self, node: ast.For, state) -> list[ast.stmt]:
        """The carried state back to its value at the loop's entry."""
        out = []
        for c in state:
            if isinstance(c.init, ast.Name) and c.init.id == c.name:  # assigned before the loop: again
                reset = copy.deepcopy(next(d for d in self.defs[c.name] if not self.inside(d, node)))
            else:
                reset = ast.Assign(targets=[ast.Name(c.name, ast.Store())], value=copy.deepcopy(c.init))
                reset.tg_op, reset.tg_origin, reset.tg_where = Op("copy", [c.init]), node.tg_origin, node.tg_where
            out += self.with_shadow(reset)
        return out

    def inside(self, stmt: ast.stmt, node: ast.stmt) -> bool:
        return any(e is node for e in self.enclosing[id(stmt)])

    def with_shadow(self, stmt: ast.stmt) -> list[ast.stmt]:
        t = target_of(stmt)
        return [stmt, self.shadow_statement(stmt, t)] if t in self.shadow else [stmt]

    def needed(self, block: list[ast.stmt], sweep: list[ast.stmt], also=(), follow=()) -> set[str]:
        """Values of ``block`` (and names in ``also``) that ``sweep`` reads, directly or through a shadow,
        and what they are computed from in ``block`` (through the definitions of ``follow`` names too)."""
        shadow_of = {v: k for k, v in self.shadow.items()}
        seeds = set()
        for n in free_names(sweep):
            n = shadow_of.get(n, n)
            if n in also or self.within(n, block):
                seeds.add(n)
        return self.closure(seeds, block, follow)

    def recompute(self, block: list[ast.stmt], sweep: list[ast.stmt]) -> list[ast.stmt]:
        """The statements of ``block`` that compute what ``sweep`` reads."""
        return self.replay_block(block, self.needed(block, sweep))

    def reverse_statement(self, stmt: ast.stmt) -> None:
        op = op_of(stmt)
        t = target_of(stmt)
        if op.kind in STORES:
            self.reverse_store(stmt)
        elif op.kind == "item":
            return  # its adjoint is read by the operation whose result it is
        elif op.kind in MULTI_RESULT and t in self.a.active:
            self.reverse_multi(stmt, t)
        elif t is not None and t in self.a.active and self.g_of(stmt) is not None and self.contributes(stmt):
            if not getattr(stmt, "tg_join", False):  # a join's copy goes under its if's or loop's comment
                self.comment_for(stmt)
            if op.kind in LOADS:
                self.reverse_load(stmt, t)
            else:
                self.reverse_operation(stmt, t)

    def g_of(self, stmt: ast.stmt) -> str | None:
        """The adjoint of the statement's result, if any reached it."""
        return self.g_override.get(id(stmt)) or self.adjoint.get(target_of(stmt))

    def contributes(self, stmt: ast.stmt) -> bool:
        """Whether reversing the statement adds to any adjoint (a partial sum adds nothing to the next)."""
        op = op_of(stmt)
        if op.kind in LOADS:
            return True
        rule = rule_of(op)
        return rule is not None and any(p in rule.adjoints and self.a.is_active(arg) and arg.id not in self.suppressed
                   for p, arg in bind(stmt).items())

    def reverse_operation(self, stmt: ast.stmt, t: str) -> None:
        op = op_of(stmt)
        rule = rule_of(op)
        bound = bind(stmt)
        env = {**bound, "g": _name(self.g_of(stmt)), "out": _name(t)}
        for param, arg in bound.items():
            if param not in rule.adjoints or not self.a.is_active(arg):
                continue
            template = rule.adjoints[param]
            if callable(template):
                try:
                    template = template(bound)
                except ValueError as e:
                    raise refuse(where(stmt), f"`{op.kind}` with arguments that are not literal constants",
                                 "pass dimensions as literal integers") from e
            contribution = _substitute(template, env)
            sig = rule.signature  # a one-operand elementwise operation keeps its operand's shape
            unary = len(sig.positional) == 1 and not sig.keyword and sig.vararg is None
            if rule.elementwise and not unary and not self.same_shape(arg.id, t):
                contribution = _substitute("tg.unbroadcast(c, x)", {"c": contribution, "x": arg})
            self.accumulate(arg.id, contribution)

    def reverse_multi(self, stmt: ast.stmt, t: str) -> None:
        """An operation with several results: its rule reads each result's adjoint as ``g0``, ``g1``...
        (zeros for a result that has none); a tuple argument gets a tuple of adjoints."""
        op = op_of(stmt)
        rule = rule_of(op)
        bound = bind(stmt)
        items = self.items.get(t, {})
        if not any(n in self.adjoint for n in items.values()):
            return
        self.comment_for(stmt)
        env = {**bound, "out": _name(t)}
        for i in range(MULTI_RESULT[op.kind]):
            n = items.get(i)
            env[f"g{i}"] = (_name(self.adjoint[n]) if n in self.adjoint
                            else _substitute(f"tl.zeros_like(out[{i}])", {"out": _name(t)}))
        for param, arg in bound.items():
            elements = arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]
            if param not in rule.adjoints or not any(self.a.is_active(e) for e in elements):
                continue
            template = rule.adjoints[param]
            contribution = _substitute(template(bound) if callable(template) else template, env)
            if elements[0] is arg:
                self.accumulate(arg.id, contribution)
                continue
            d = self.namer.fresh(f"d_{t}")
            self.emit(ast.Assign(targets=[ast.Name(d, ast.Store())], value=contribution))
            for i, e in enumerate(elements):
                if self.a.is_active(e):
                    self.accumulate(e.id, _substitute(f"d[{i}]", {"d": _name(d)}))

    def same_shape(self, a: str, b: str) -> bool:
        sa, sb = self.a.shapes.get(a), self.a.shapes.get(b)
        return sa is not None and sa == sb

    def reverse_load(self, stmt: ast.stmt, t: str) -> None:
        b = bind(stmt)
        shadow, g = _name(self.shadow_name(b["pointer"].id)), _name(self.g_of(stmt))
        if op_of(stmt).kind == "desc_load":
            self.emit(self.descriptor_accumulate(stmt, shadow, b["offsets"], g))
            return
        keywords = [ast.keyword("mask", copy.deepcopy(b["mask"]))] if not _is_none(b["mask"]) else []
        self.emit(ast.Expr(ast.Call(_substitute("tl.atomic_add", {}), [shadow, g], keywords)))

    def descriptor_accumulate(self, stmt: ast.stmt, shadow: ast.Name, offsets: ast.expr, g: ast.Name) -> ast.If:
        """``d_desc.atomic_add(offsets, g)``; where descriptors cannot add (float64 shadows, Triton's
        interpreter: decided when the kernel compiles), pointer atomics on the block's addresses, the
        elements outside the tensor masked."""
        make = self.descriptor_definition(stmt, bind(stmt)["pointer"].id)
        b = bind(make)
        sizes, strides, block = (b[k].elts for k in ("shape", "strides", "block_shape"))
        indices = [f"({ast.unparse(o)} + tl.arange(0, {ast.unparse(n)}))" for o, n in zip(offsets.elts, block,
                                                                                          strict=True)]
        base = ast.unparse(_name(self.shadow_name(b["base"].id)))
        text = (f"if tg.DESCRIPTOR_ATOMICS and {shadow.id}.dtype != tl.float64:\n"
                f"    {shadow.id}.atomic_add({ast.unparse(offsets)}, {g.id}.to({shadow.id}.dtype))\n"
                f"else:\n"
                f"    tl.atomic_add({block_addresses(base, indices, [ast.unparse(s) for s in strides])}, {g.id}, "
                f"mask={block_mask(indices, [ast.unparse(s) for s in sizes])})")
        return ast.parse(text).body[0]

    def descriptor_definition(self, stmt: ast.stmt, name: str) -> ast.stmt:
        """The ``tl.make_tensor_descriptor`` statement a descriptor comes from (through copies)."""
        defs = self.defs.get(name, [])
        kinds = {op_of(d).kind for d in defs}
        if kinds == {"make_tensor_descriptor"} and len({ast.dump(d.value) for d in defs}) == 1:
            return defs[0]
        if kinds == {"copy"} and len({ast.unparse(op_of(d).args[0]) for d in defs}) == 1:
            return self.descriptor_definition(stmt, op_of(defs[0]).args[0].id)
        raise refuse(where(stmt), f"a load through the descriptor `{name}`, which has several definitions",
                     "make each tensor descriptor once, with one name")

    def reverse_store(self, stmt: ast.stmt) -> None:
        op = op_of(stmt)
        b = bind(stmt)
        base = self.a.pointer_base[b["pointer"].id]
        if base not in self.a.outputs:
            return
        value = stored_value(stmt)
        if not self.a.is_active(value):
            return
        if op.kind not in ("store", "desc_store", *ACCUMULATES):
            raise refuse(where(stmt), f"`{op.kind}` of a differentiated value",
                         "only tl.store and tl.atomic_add outputs can be differentiated")
        self.comment_for(stmt)
        address = b["pointer"].id
        shadow = _name(self.shadow_name(address))
        if op.kind.startswith("desc_"):  # out-of-bounds elements read as zero, as the forward dropped them
            incoming = _substitute("d.load(offsets)", {"d": shadow, "offsets": b["offsets"]})
        else:
            keywords = []
            if not _is_none(b["mask"]):
                keywords = [ast.keyword("mask", copy.deepcopy(b["mask"])), ast.keyword("other", ast.Constant(0.0))]
            incoming = ast.Call(_substitute("tl.load", {}), [shadow], keywords)
        if not self.same_shape(value.id, address):
            incoming = _substitute("tg.unbroadcast(c, x)", {"c": incoming, "x": value})
        self.accumulate(value.id, incoming)

    # -- the replay -----------------------------------------------------------------------

    def replay(self) -> list[ast.stmt]:
        """The forward's statements the sweep needs, each shadow pointer beside its pointer."""
        shadow_of = {v: k for k, v in self.shadow.items()}
        seeds = {shadow_of.get(n, n) for n in free_names(self.out)}
        if self.tile:
            seeds |= {n for r in self.p.returns for n in names_in(r)}
        for s in statements(self.p.body):
            if op_of(s).kind in ASSERTS:
                seeds |= reads(s)
        return self.replay_block(self.p.body, self.closure(seeds, self.p.body), asserts=True)

    def closure(self, seeds: set[str], block: list[ast.stmt], also=()) -> set[str]:
        """``seeds`` and every value of ``block`` they are computed from (through the tests and ranges
        around them in ``block`` too). Names from outside ``block`` (other than ``also``) are taken as
        they are there; of ``also`` names, only their definitions inside ``block`` are followed."""
        needed: set[str] = set()
        work = list(seeds)
        while work:
            n = work.pop()
            if n in needed:
                continue
            needed.add(n)
            if not (n in also or self.within(n, block)):
                continue
            for d in self.defs.get(n, []):
                if not self.block_within(self.stmt_block[id(d)], block):
                    continue
                work += reads(d.value) if isinstance(d, ast.Assign) else reads(d.iter)
                for outer in self.enclosing[id(d)]:
                    if self.block_within(self.stmt_block[id(outer)], block):
                        work += [x for e in header(outer) for x in reads(e)]
        return needed

    def block_within(self, b: int | None, block: list[ast.stmt]) -> bool:
        while b is not None:
            if b == id(block):
                return True
            b = self.parent[b]
        return False

    def replay_block(self, block: list[ast.stmt], needed: set[str], skip: set[int] = frozenset(),
                     asserts: bool = False) -> list[ast.stmt]:
        """The statements of ``block`` assigning ``needed`` names (stores dropped), shadows beside pointers."""
        out: list[ast.stmt] = []
        for s in block:
            if is_structured(s):
                inner = [self.replay_block(b, needed, skip, asserts) for b in child_blocks(s)]
                if not any(inner):
                    continue
                if isinstance(s, ast.For):
                    out.append(_structured_copy(s, target=copy.deepcopy(s.target), iter=copy.deepcopy(s.iter),
                                                body=inner[0]))
                else:
                    out.append(_structured_copy(s, test=copy.deepcopy(s.test), body=inner[0] or [ast.Pass()],
                                                orelse=inner[1]))
                continue
            t = target_of(s)
            if id(s) in skip or op_of(s).kind in STORES:
                continue
            if (t is not None and t in needed) or (asserts and op_of(s).kind in ASSERTS):
                out += self.with_shadow(copy.deepcopy(s))
        return out

    def pointer_operands(self, stmt: ast.stmt, base: str) -> list[str]:
        op = op_of(stmt)
        positions = {"add": (0, 1), "sub": (0,), "where": (1, 2)}.get(op.kind, (0,))
        return [op.args[i].id for i in positions if i < len(op.args) and isinstance(op.args[i], ast.Name)
                and self.a.pointer_base.get(op.args[i].id) == base]

    def shadow_statement(self, stmt: ast.stmt, t: str) -> ast.stmt:
        """``d_p = d_base + offs`` for ``p = base + offs``."""
        base = self.a.pointer_base[t]
        renames = {n: _name(self.shadow[n]) for n in self.pointer_operands(stmt, base)}
        value = copy.deepcopy(stmt.value)

        class Sub(ast.NodeTransformer):
            def visit_Name(self, n: ast.Name) -> ast.expr:
                return copy.deepcopy(renames[n.id]) if n.id in renames else n

        value = Sub().visit(value)
        node = ast.Assign(targets=[ast.Name(self.shadow[t], ast.Store())], value=value)
        node.tg_op, node.tg_origin, node.tg_where = stmt.tg_op, stmt.tg_origin, stmt.tg_where
        return node


def _bounds(node: ast.For) -> tuple[ast.expr, ast.expr, ast.expr]:
    """A loop's start, stop and step, as range() reads its arguments."""
    args = list(node.iter.args)
    named = {k.arg: k.value for k in node.iter.keywords}
    args += [named[k] for k in ("arg1", "arg2") if k in named]
    if len(args) == 1:
        return ast.Constant(0), args[0], named.get("step", ast.Constant(1))
    step = args[2] if len(args) > 2 else named.get("step", ast.Constant(1))
    return args[0], args[1], step


def _is_one(step: ast.expr) -> bool:
    return isinstance(step, ast.Constant) and step.value == 1 and type(step.value) is int


def _structured_copy(node: ast.stmt, **fields) -> ast.stmt:
    """A new if/for node like ``node`` (its tags kept) with the given fields."""
    new = type(node)(**{f: getattr(node, f, None) for f in node._fields})
    for k, v in fields.items():
        setattr(new, k, v)
    for k in ("tg_op", "tg_origin", "tg_where", "tg_merges", "tg_carried", "tg_static"):
        if hasattr(node, k):
            setattr(new, k, getattr(node, k))
    return ast.copy_location(new, node)


def _is_none(atom: ast.expr) -> bool:
    return isinstance(atom, ast.Constant) and atom.value is None


def reverse(analysis: Analysis, tile: bool = False) -> Reversed:
    for s in statements(analysis.program.body):  # memory operations' argument checks, before any output
        if op_of(s).kind in MEMORY:
            bind(s)
    return Reverser(analysis, tile).run()
