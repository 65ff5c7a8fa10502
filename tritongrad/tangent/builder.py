"""The tangent (forward-mode) body: the forward's statements, each active one followed by its tangent.

- a float load of a differentiated input: a load of its tangent from ``t_<pointer>`` at the same offsets, under the
  same mask (``other=0``: the tangent of a constant padding), the tangent pointers computed beside the pointers;
- an operation: its tangent from the table of operations (rules.py);
- a store to an output: the value's tangent stored to ``t_<output>`` at the same addresses, under the same mask
  (zeros where the value has none); an atomic add: an atomic add of the tangent;
- ``if``: the same ``if``, each branch with its tangents (a merged value's tangent is assigned in both);
- ``for``: the same loop, the tangents of loop-carried values carried beside them (no tape: forward mode runs
  the iterations once, in order).

Each name's tangent is ``t_<name>``; an active value whose definition gives it no tangent (``acc = tl.zeros(...)``
before a loop adding to it) gets zeros of its shape and type. A stabilizing max (analysis/stabilizers.py) keeps a
zero tangent: the outputs do not depend on it; so does an online softmax's running max where analysis/online.py
proves it only stabilizes (``Analysis.with_maxima``), with the rescalings by it. A statement reading its own target
(``h = h * a``) has its tangent computed before it, from the old values."""

from __future__ import annotations

import ast
import copy

from ..analysis.analyze import Analysis
from ..analysis.flow import load_other
from ..core.ir import (
    Namer,
    arguments,
    assign,
    copy_structured,
    definitions,
    is_none,
    name_node,
    names_in,
    op_of,
    statements,
    target_of,
    value_args,
)
from ..core.operations import LOADS, operation_of
from ..reverse.sweep import BackwardBody, comment_marker
from .rules import OperationTangents, unsupported


class TangentBuilder:
    """Writes the tangent body of an analysed kernel (its ``wrt`` inputs' tangents in, its outputs' out)."""

    def __init__(self, analysis: Analysis):
        self.analysis = analysis
        self.program = analysis.program
        params = self.program.param_names()
        self.namer = Namer(self.program.names | set(params))
        self.tangent: dict[str, str] = {}  # active name -> its tangent's name
        self.pointer: dict[str, str] = {}  # pointer name -> its tangent pointer's name
        self.comments: dict[str, str] = {}
        mirrored = list(dict.fromkeys([*analysis.wrt, *analysis.outputs]))  # in place: one parameter
        for p in mirrored:
            if f"t_{p}" in self.namer.taken:
                raise ValueError(f"kernel `{self.program.name}` has a name `t_{p}` already, which its tangent "
                                 f"kernel gives `{p}`'s tangent: rename it")
            self.pointer[p] = self.namer.fresh(f"t_{p}")
        self.params = [self.pointer[p] for p in mirrored]
        self.defs = definitions(self.program.body)
        self.needed = self.needed_pointers()
        self.rules = OperationTangents(self)

    # -- what rules.py asks ---------------------------------------------------------------------------------

    def tangent_of(self, atom: ast.expr) -> ast.expr | None:
        """An argument's tangent (None: it has none, a constant or a value that is not active)."""
        if isinstance(atom, ast.Name) and atom.id in self.analysis.active:
            return name_node(self.tangent_name(atom.id))
        return None

    def tangent_name(self, name: str) -> str:
        if name not in self.tangent:
            self.tangent[name] = self.namer.fresh(f"t_{name}")
        return self.tangent[name]

    def shape_of(self, name: str):
        return self.analysis.shapes.get(name)

    def same_shape(self, a: str, b: str) -> bool:
        sa, sb = self.shape_of(a), self.shape_of(b)
        return sa is not None and sa == sb

    # -- pointers ---------------------------------------------------------------------------------------------

    def needed_pointers(self) -> set[str]:
        """Pointers whose tangent pointers the body computes: the addresses of active loads of differentiated
        inputs and of stores to outputs, and the pointers those are computed from."""
        base = self.analysis.pointer_base
        work = []
        for s in statements(self.program.body):
            kind = op_of(s).kind
            if kind in LOADS and target_of(s) in self.analysis.active or operation_of(op_of(s)).stores:
                for n in names_in(arguments(s)["pointer"]):
                    if base.get(n) in self.pointer:
                        work.append(n)
        needed: set[str] = set()
        while work:
            n = work.pop()
            if n in needed:
                continue
            needed.add(n)
            for d in self.defs.get(n, []):
                if isinstance(d, ast.Assign):
                    work += [o for o in self.pointer_operands(d, base[n])]
        return needed

    def pointer_operands(self, stmt: ast.stmt, base: str) -> list[str]:
        op = op_of(stmt)
        positions = operation_of(op).pointer_args or (0,)
        return [op.args[i].id for i in positions if i < len(op.args) and isinstance(op.args[i], ast.Name)
                and self.analysis.pointer_base.get(op.args[i].id) == base]

    def pointer_name(self, pointer: str) -> str:
        if pointer not in self.pointer:
            self.pointer[pointer] = self.namer.fresh(f"t_{pointer}")
        return self.pointer[pointer]

    def renamed(self, value: ast.expr, renames: dict[int, ast.expr]) -> ast.expr:
        """A copy of ``value`` with the given argument nodes (by identity) replaced."""
        memo = {k: copy.deepcopy(v) for k, v in renames.items()}
        return copy.deepcopy(value, memo)

    # -- the body ---------------------------------------------------------------------------------------------

    def run(self) -> BackwardBody:
        body = self.block(self.program.body)
        reassigned = {n for n, ds in self.defs.items() if len(ds) > 1}
        reassigned |= {m[n] for m in (self.tangent, self.pointer) for n in list(reassigned) if n in m}
        temporaries = self.program.temporaries | {self.pointer[t] for t in self.program.temporaries
                                                  if t in self.pointer}
        foldable = {t for t in temporaries if t not in self.analysis.active}
        return BackwardBody(body, self.comments, self.params, [], None, foldable, reassigned)

    def block(self, block: list[ast.stmt]) -> list[ast.stmt]:
        """A forward line's statements, then its tangents under one comment; a statement reassigning a name (a
        loop-carried or merged one) waits for the tangents before it, which may read the old value, and one
        reading its own target (``h = h * a``) has its tangent computed first."""
        out: list[ast.stmt] = []
        pending: list[ast.stmt] = []
        line = None

        def flush() -> None:
            if pending:
                out.append(comment_marker(self.comments, f"tangent of: {line}"))
                out.extend(pending)
                pending.clear()

        for stmt in block:
            if isinstance(stmt, (ast.If, ast.For)):
                flush()
                fields = ({"test": copy.deepcopy(stmt.test), "body": self.block(stmt.body),
                           "orelse": self.block(stmt.orelse)} if isinstance(stmt, ast.If)
                          else {"iter": copy.deepcopy(stmt.iter), "body": self.block(stmt.body)})
                out.append(copy_structured(stmt, **fields))
                continue
            t = target_of(stmt)
            if self.describe(stmt) != line or (t is not None and len(self.defs.get(t, ())) > 1):
                flush()
            line = self.describe(stmt)
            tangents = self.statement(stmt)
            if t is not None and t in value_args(stmt):  # `h = h * a`
                pending += tangents
                flush()
                out.append(copy.deepcopy(stmt))
            else:
                out.append(copy.deepcopy(stmt))
                pending += tangents
        flush()
        return out

    def describe(self, stmt: ast.stmt) -> str:
        """The forward line a statement comes from; inside an inlined helper, its own line and the call."""
        origin, inner = stmt.tg.origin, stmt.tg.where
        if inner.line == origin.line and inner.file == origin.file:
            return origin.text
        return f"{inner.text}  (in {inner.function}, from: {origin.text})"

    def statement(self, stmt: ast.stmt) -> list[ast.stmt]:
        """The tangent statements of one flat forward statement."""
        t = target_of(stmt)
        op = op_of(stmt)
        rule = operation_of(op)
        if t is not None and t in self.needed:
            return [self.tangent_pointer(stmt, t)]
        if rule.descriptor:
            if (t in self.analysis.active or rule.stores and
                    self.analysis.pointer_base.get(names_in(arguments(stmt)["pointer"])[0]) in self.analysis.outputs):
                raise unsupported(stmt, "tensor descriptors")
            return []
        if op.kind in LOADS:
            return [self.tangent_load(stmt, t)] if t in self.analysis.active else []
        if rule.stores:
            return self.tangent_store(stmt)
        if t is None or t not in self.analysis.active:
            return []
        tangent = self.rules.tangent(stmt, t)
        if tangent is None:
            literal = not any(isinstance(n, ast.Name) for a in [*op.args, *op.kwargs.values()] for n in ast.walk(a))
            tangent = ast.Constant(0.0) if literal else instantiate_zeros(t)
        return [self.tagged(assign(self.tangent_name(t), tangent), stmt)]

    def tagged(self, new: ast.stmt, like: ast.stmt) -> ast.stmt:
        new.tg = like.tg
        return ast.fix_missing_locations(ast.copy_location(new, like))

    def tangent_pointer(self, stmt: ast.stmt, t: str) -> ast.stmt:
        """``t_p = t_base + offs`` beside ``p = base + offs``."""
        base = self.analysis.pointer_base[t]
        op = op_of(stmt)
        renames = {id(a): name_node(self.pointer_name(a.id)) for a in op.args
                   if isinstance(a, ast.Name) and a.id in self.pointer_operands(stmt, base)}
        return self.tagged(assign(self.pointer_name(t), self.renamed(stmt.value, renames)), stmt)

    def tangent_load(self, stmt: ast.stmt, t: str) -> ast.stmt:
        """``t_x = tl.load(t_ptrs, mask=mask, other=<other's tangent, or 0>)``."""
        b = arguments(stmt)
        pointer, other = b["pointer"], load_other(stmt)
        other_tangent = self.tangent_of(other) or ast.Constant(0.0)
        if self.analysis.pointer_base.get(pointer.id) not in self.analysis.wrt:  # varied through `other` only
            value = ast.Call(ast.parse("tl.where", mode="eval").body,
                             [copy.deepcopy(b["mask"]), ast.Constant(0.0), other_tangent], [])
            return self.tagged(assign(self.tangent_name(t), value), stmt)
        renames = {id(pointer): name_node(self.pointer_name(pointer.id))}
        if not is_none(other):
            renames[id(b["other"])] = other_tangent
        value = self.renamed(stmt.value, renames)
        if is_none(other) and not is_none(b["mask"]):
            value.keywords.append(ast.keyword("other", ast.Constant(0.0)))
        return self.tagged(assign(self.tangent_name(t), value), stmt)

    def tangent_store(self, stmt: ast.stmt) -> list[ast.stmt]:
        """The stored value's tangent stored to the output's tangent (an atomic add: added)."""
        b = arguments(stmt)
        pointer = b["pointer"]
        if self.analysis.pointer_base.get(pointer.id) not in self.analysis.outputs:
            return []
        access = operation_of(op_of(stmt)).access
        if access not in ("store", "accumulate"):  # tl.store, tl.atomic_add
            raise unsupported(stmt, f"`tl.{op_of(stmt).kind}` on an output")
        value = b["value"] if access == "store" else b["val"]
        tangent = self.tangent_of(value)
        if tangent is None:
            tangent = instantiate_zeros(value.id) if isinstance(value, ast.Name) else ast.Constant(0.0)
        call = self.renamed(stmt.value, {id(pointer): name_node(self.pointer_name(pointer.id)), id(value): tangent})
        return [self.tagged(ast.Expr(call), stmt)]


def instantiate_zeros(name: str) -> ast.expr:
    return ast.Call(ast.parse("tl.zeros_like", mode="eval").body, [name_node(name)], [])


def build_tangent(analysis: Analysis) -> BackwardBody:
    """The tangent body of an analysed kernel, for codegen (its tangent parameters as the shadow parameters)."""
    return TangentBuilder(analysis).run()
