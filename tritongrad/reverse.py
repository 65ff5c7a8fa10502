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
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from .analysis import Analysis, bind, names_in, op_of, target_of, value_args, where
from .frontend import Namer, refuse
from .rules import MEMORY, RULES, STORES


@dataclass
class Reversed:
    """The backward body, before code generation."""

    body: list[ast.stmt]
    comments: dict[str, str]  # marker name -> comment text
    shadow_params: list[str]  # d_<output>..., d_<wrt>...
    cotangent_params: list[str]  # tile functions: one per returned value
    returns: list[ast.expr] | None  # tile functions: the wrt gradients
    foldable: set[str]  # temporaries with no adjoint: codegen writes them back into their uses


def _name(id: str) -> ast.Name:
    return ast.Name(id, ast.Load())


def _substitute(template: str, env: dict[str, ast.expr]) -> ast.expr:
    class Sub(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            return copy.deepcopy(env[n.id]) if n.id in env else n

    return Sub().visit(ast.parse(template, mode="eval").body)


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
        self.sweep: list[ast.stmt] = []
        params = self.p.param_names()
        self.namer.taken |= set(params)
        mirrored = [*analysis.outputs, *analysis.wrt] if not tile else []
        self.shadow_params = [self.shadow_name(p) for p in mirrored]

    def shadow_name(self, pointer: str) -> str:
        if pointer not in self.shadow:
            self.shadow[pointer] = self.namer.fresh(f"d_{pointer}")
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
        for stmt in reversed(self.p.body):
            self.reverse_statement(stmt)
        if self.tile:
            returns = [_name(self.adjoint[w]) if w in self.adjoint
                       else _substitute("tl.zeros_like(x).to(tl.float32)", {"x": _name(w)}) for w in self.a.wrt]
        body = self.replay() + self.sweep
        temporaries = self.p.temporaries | {self.shadow[t] for t in self.p.temporaries if t in self.shadow}
        foldable = {t for t in temporaries if t not in self.a.active}
        return Reversed(body, self.comments, self.shadow_params, cotangents, returns, foldable)

    def comment_for(self, stmt: ast.stmt) -> None:
        """``# grad of: <line>``; inside an inlined helper, its own line and where it was called."""
        origin, inner = stmt.tg_origin, stmt.tg_where
        if inner.line == origin.line and inner.file == origin.file:
            self.comment(f"grad of: {origin.text}")
        else:
            self.comment(f"grad of: {inner.text}  (in {inner.function}, from: {origin.text})")

    def comment(self, text: str) -> None:
        if self.comments and list(self.comments.values())[-1] == text:
            return  # the adjoints of one forward line share its comment
        marker = f"__tg_comment_{len(self.comments)}__"
        self.comments[marker] = text
        self.sweep.append(ast.Expr(_name(marker)))

    def accumulate(self, name: str, contribution: ast.expr) -> None:
        """``d_name = contribution`` the first time, ``d_name += contribution`` after."""
        if name in self.adjoint:
            node = ast.AugAssign(target=ast.Name(self.adjoint[name], ast.Store()), op=ast.Add(), value=contribution)
        else:
            node = ast.Assign(targets=[ast.Name(self.adjoint_name(name), ast.Store())], value=contribution)
        self.sweep.append(_drop_none_keywords(node))

    def reverse_statement(self, stmt: ast.stmt) -> None:
        op = op_of(stmt)
        t = target_of(stmt)
        if op.kind in STORES:
            self.reverse_store(stmt)
        elif t is not None and t in self.a.active:
            self.comment_for(stmt)
            if op.kind == "load":
                self.reverse_load(stmt, t)
            else:
                self.reverse_operation(stmt, t)

    def reverse_operation(self, stmt: ast.stmt, t: str) -> None:
        op = op_of(stmt)
        rule = RULES[op.kind]
        bound = bind(stmt)
        env = {**bound, "g": _name(self.adjoint[t]), "out": _name(t)}
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
            if rule.elementwise and not self.same_shape(arg.id, t):
                contribution = _substitute("tg.unbroadcast(c, x)", {"c": contribution, "x": arg})
            self.accumulate(arg.id, contribution)

    def same_shape(self, a: str, b: str) -> bool:
        sa, sb = self.a.shapes.get(a), self.a.shapes.get(b)
        return sa is not None and sa == sb

    def reverse_load(self, stmt: ast.stmt, t: str) -> None:
        b = bind(stmt)
        address = b["pointer"].id
        args = [_name(self.shadow_name(address)), _name(self.adjoint[t])]
        keywords = [ast.keyword("mask", copy.deepcopy(b["mask"]))] if not _is_none(b["mask"]) else []
        self.sweep.append(ast.Expr(ast.Call(_substitute("tl.atomic_add", {}), args, keywords)))

    def reverse_store(self, stmt: ast.stmt) -> None:
        op = op_of(stmt)
        b = bind(stmt)
        base = self.a.pointer_base[b["pointer"].id]
        if base not in self.a.outputs:
            return
        value = b["value" if op.kind == "store" else "val"]
        if not self.a.is_active(value):
            return
        if op.kind not in ("store", "atomic_add"):
            raise refuse(where(stmt), f"`{op.kind}` of a differentiated value",
                         "only tl.store and tl.atomic_add outputs can be differentiated")
        self.comment_for(stmt)
        address = b["pointer"].id
        keywords = []
        if not _is_none(b["mask"]):
            keywords = [ast.keyword("mask", copy.deepcopy(b["mask"])), ast.keyword("other", ast.Constant(0.0))]
        incoming = ast.Call(_substitute("tl.load", {}), [_name(self.shadow_name(address))], keywords)
        if not self.same_shape(value.id, address):
            incoming = _substitute("tg.unbroadcast(c, x)", {"c": incoming, "x": value})
        self.accumulate(value.id, incoming)

    # -- the replay -----------------------------------------------------------------------

    def replay(self) -> list[ast.stmt]:
        """The forward's statements the sweep needs, each shadow pointer beside its pointer."""
        defs = {target_of(s): s for s in self.p.body if target_of(s)}
        needed: set[str] = set()
        work = [n.id for s in self.sweep for n in ast.walk(s) if isinstance(n, ast.Name)]
        if self.tile:
            work += [n for r in self.p.returns for n in names_in(r)]
        for pointer in list(self.shadow):  # a shadow is computed like its pointer, from its base's shadow
            self.shadow_chain(pointer, defs, work)
        work += list(self.shadow)  # each pointer is replayed beside its shadow
        asserts = [s for s in self.p.body if op_of(s).kind in ("static_assert", "device_assert")]
        for s in asserts:
            work += value_args(s)
        while work:
            n = work.pop()
            if n in needed:
                continue
            needed.add(n)
            if n in defs:
                work += [x.id for x in ast.walk(defs[n].value) if isinstance(x, ast.Name)]
        out: list[ast.stmt] = []
        for s in self.p.body:
            t = target_of(s)
            if op_of(s).kind in STORES:
                continue
            if (t is not None and t in needed) or s in asserts:
                out.append(copy.deepcopy(s))
            if t is not None and t in self.shadow and t not in self.p.param_names():
                out.append(self.shadow_statement(s, t))
        return out

    def shadow_chain(self, pointer: str, defs: dict, work: list[str]) -> None:
        base = self.a.pointer_base[pointer]
        if pointer == base or pointer not in defs:
            return
        for n in self.pointer_operands(defs[pointer], base):
            self.shadow_name(n)
            self.shadow_chain(n, defs, work)

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


def _is_none(atom: ast.expr) -> bool:
    return isinstance(atom, ast.Constant) and atom.value is None


def reverse(analysis: Analysis, tile: bool = False) -> Reversed:
    for s in analysis.program.body:  # memory operations' argument checks, before any output
        if op_of(s).kind in MEMORY:
            bind(s)
    return Reverser(analysis, tile).run()
