"""Kernel object -> one normalized function body.

The reverse sweep needs every intermediate value under a name of its own, so the
frontend rewrites a kernel into flat statements, each one operation on names and
constants (``y = tl.exp(x)``), with:

- ``@triton.jit`` helpers inlined (their locals renamed so nothing clashes);
- nested expressions hoisted into temporaries named after what they compute;
- augmented and tuple assignments expanded;
- every re-assignment given a fresh name (SSA), so the values the adjoints need
  are all still there after the forward recomputation;
- ``if`` and ``for`` kept as structured statements holding flat blocks, with
  copies where control flow joins (see ``ir.py``).

Each statement carries a tag (``.tg``, see ir.py): what it computes (an ``Op``), and
the user's file, line and source text it comes from, for comments and errors.

The work is split along its seams: this module flattens statements and assignments,
expressions.py flattens expressions (and inlines helpers), controlflow.py flattens
``if`` and ``for``; source.py reads a kernel's source.
"""

from __future__ import annotations

import ast
import builtins
import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..core.errors import NotDifferentiableError
from ..core.ir import Namer, Op, Origin, Program, Tag, refuse
from ..core.operations import operation_of
from ..core.source import Source
from .blockptr import rewrite_block_pointers
from .controlflow import ControlFlowFlattener
from .expressions import LOCAL, ExpressionFlattener, Frame, _Deferred, _is_metadata, name_node
from .forwarding import forward_stored_values
from .specialize import constexpr_params, plain_value, specialize


class Normalizer:
    """Flattens a kernel, inlining helpers, into a :class:`Program`."""

    def __init__(self, root: Source, constexprs: Mapping[str, Any] | None = None):
        self.root = root
        tree = specialize(root.tree, root.scope, constexprs or {})
        self.specialized = tree is not root.tree  # some branch was decided
        self.tree = rewrite_block_pointers(tree, root.scope, root.origin)
        taken = {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)}
        taken |= {a.arg for a in self.tree.args.args}
        self.namer = Namer(taken | set(dir(builtins)))
        self.scope: dict[str, Any] = dict(root.scope)
        self.out: list[ast.stmt] = []
        self.frames: list[Frame] = []
        self.defined = {a.arg for a in self.tree.args.args}  # SSA names bound so far
        self.temporaries: set[str] = set()
        self.inline_depth = 0
        self.constexprs = set(constexpr_params(self.tree))
        self.compile_time: dict[str, ast.expr] = {}  # a local constexpr (SSA name) -> the expression it names
        self.descriptors: set[str] = set()  # SSA names of tensor descriptors made in the kernel
        self.result_tuples: set[str] = set()  # SSA names of an operation's several results (`scan`, `halves`)
        # values known at derivation: the specialization's constexprs, and copies of them or of globals
        self.known: dict[str, Any] = {k: plain_value(v) for k, v in (constexprs or {}).items()}
        self.expressions = ExpressionFlattener(self)  # expressions flattened into named atoms (expressions.py)
        self.control = ControlFlowFlattener(self)  # if and for kept as blocks (controlflow.py)

    # -- entry points ---------------------------------------------------------------------

    def kernel(self) -> Program:
        return self._program(tile=False)

    def tile_function(self) -> Program:
        return self._program(tile=True)

    def _program(self, tile: bool) -> Program:
        fdef = self.tree
        args = fdef.args
        origin = self.root.origin(fdef)
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
            raise refuse(origin, "a kernel signature with *args, **kwargs or keyword-only parameters",
                         "list every parameter explicitly")
        params = [ast.arg(arg=a.arg, annotation=a.annotation) for a in args.args]
        frame = Frame(self.root, {p.arg: name_node(p.arg) for p in params}, inlined=False)
        self.frames.append(frame)
        body = list(fdef.body)
        returns = None
        body, ret = self.control.lift_returns(body, tile)
        if tile:
            if ret is None or ret.value is None:
                raise refuse(origin, f"tile function `{fdef.name}` without a final `return`",
                             "vjp() differentiates a @triton.jit helper that returns its result")
            self.block(body)
            value = ret.value
            elts = value.elts if isinstance(value, ast.Tuple) else [value]
            returns = [self.expressions.atom(e, ret) for e in elts]
        else:
            self.block(body)
            forward_stored_values(self.out, self._temporary)  # a load of what the lane stored: that value
        self.frames.pop()
        return Program(fdef.name, params, self.out, self.scope, self.root.file, self.namer.taken,
                       returns=returns, origin=origin, temporaries=self.temporaries, constexprs=self.constexprs,
                       specialized=self.specialized)

    def _temporary(self, name: str) -> str:
        fresh = self.namer.fresh(name)
        self.temporaries.add(fresh)
        return fresh

    # -- statements -----------------------------------------------------------------------

    @property
    def frame(self) -> Frame:
        return self.frames[-1]

    def origin(self, node: ast.AST) -> Origin:
        origin = self.frame.fn.origin(node)
        return replace(origin, calls=self.frame.calls) if self.frame.calls else origin

    def refuse(self, node: ast.AST, construct: str, hint: str) -> NotDifferentiableError:
        return refuse(self.origin(node), construct, hint)

    def block(self, stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            self.statement(stmt)

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign):
            if len(stmt.targets) != 1:
                raise self.refuse(stmt, "a chained assignment (`a = b = ...`)", "assign one name at a time")
            self.assign(stmt.targets[0], stmt.value, stmt)
        elif isinstance(stmt, ast.AugAssign):
            if not isinstance(stmt.target, ast.Name):
                raise self.refuse(stmt, "an augmented assignment to a subscript or attribute",
                                  "Triton tensors are immutable; assign to a plain name")
            value = ast.BinOp(left=ast.Name(stmt.target.id, ast.Load()), op=stmt.op, right=stmt.value)
            ast.copy_location(value, stmt)
            self.assign(stmt.target, value, stmt)
        elif isinstance(stmt, ast.AnnAssign):
            if stmt.value is None:
                return
            self.assign(stmt.target, stmt.value, stmt)
        elif isinstance(stmt, ast.Expr):
            if isinstance(stmt.value, ast.Constant):  # docstring
                return
            if isinstance(stmt.value, ast.IfExp):  # `store(a) if c else store(b)`: an `if` statement
                value = stmt.value
                self.control.if_statement(ast.copy_location(ast.If(
                    test=value.test, body=[ast.copy_location(ast.Expr(value.body), stmt)],
                    orelse=[ast.copy_location(ast.Expr(value.orelse), stmt)]), stmt))
                return
            value = self.expressions.expr(stmt.value, stmt, top=True)
            if isinstance(value, _Deferred):
                self.emit_expr(value, stmt)
        elif isinstance(stmt, ast.Pass):
            return
        elif isinstance(stmt, ast.Return):  # (lift_returns leaves none: a helper's made assignments)
            raise self.refuse(stmt, "a `return` here", "return at the end of the function or of an `if` branch")
        elif isinstance(stmt, ast.For):
            self.control.for_loop(stmt)
        elif isinstance(stmt, ast.If):
            self.control.if_statement(stmt)
        elif isinstance(stmt, ast.While):
            # its trip count is decided inside the loop, so the reverse sweep cannot recompute it
            # iteration by iteration without a tape of every iteration's state
            raise self.refuse(stmt, "a `while` loop",
                              "compute the trip count first and loop with `for i in range(n)`")
        elif isinstance(stmt, (ast.Break, ast.Continue)):
            raise self.refuse(stmt, f"`{type(stmt).__name__.lower()}`", "Triton loops run every iteration; "
                              "guard the body with an `if` instead")
        else:
            raise self.refuse(stmt, f"a `{type(stmt).__name__}` statement",
                              "a kernel body is assignments, calls, loops and branches")

    def is_constexpr(self, atom: ast.expr) -> bool:
        """Known at compile time: constants, constexpr parameters, globals, metadata, and math on them."""
        if isinstance(atom, ast.Constant):
            return True
        if isinstance(atom, ast.Name):
            return atom.id in self.constexprs or atom.id not in self.defined
        if isinstance(atom, (ast.Tuple, ast.List)):
            return all(self.is_constexpr(e) for e in atom.elts)
        if isinstance(atom, ast.Call):  # builtins kept inline: min(BLOCK, N)
            return all(self.is_constexpr(a) for a in [*atom.args, *(k.value for k in atom.keywords)])
        if isinstance(atom, (ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp)):  # a test kept inline
            return all(self.is_constexpr(a) for a in ast.iter_child_nodes(atom) if isinstance(a, ast.expr))
        if isinstance(atom, ast.Attribute) and not _is_metadata(atom):  # a global's: `tl.float32`
            return self.is_constexpr(atom.value)
        return _is_metadata(atom)

    def written_out(self, test: ast.expr) -> ast.expr:
        """A test known when Triton compiles with each local constexpr it reads written out as what it names
        (``IS_X: tl.constexpr = MODE == "x"``; ``if IS_X:`` reads ``if MODE == "x":``): a derived kernel's flat
        ``IS_X = MODE == "x"`` is a tensor to compiled Triton, and an ``if`` on it a runtime ``if``, after which a
        value its branch alone assigns is unbound."""
        compile_time = self.compile_time

        class WriteOut(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.expr:
                value = compile_time.get(node.id)
                return node if value is None else self.visit(copy.deepcopy(value))

        return WriteOut().visit(copy.deepcopy(test)) if self.is_constexpr(test) else test

    def assign(self, target: ast.expr, value: ast.expr, stmt: ast.stmt) -> None:
        if isinstance(target, ast.Name) and isinstance(value, ast.IfExp):  # `y = a if c else b`: `if c: y = a ...`
            self.control.conditional(value, stmt, target=target.id)
        elif isinstance(target, ast.Name):
            result = self.expressions.expr(value, stmt, top=True)
            if isinstance(result, _Deferred):
                self.emit_assign(target.id, result, stmt)
            elif isinstance(result, list):
                raise self.refuse(stmt, "assigning a tuple of values to one name",
                                  "unpack the tuple: `a, b = ...`")
            else:
                self.copy_into(target.id, result, stmt)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if any(not isinstance(t, ast.Name) for t in target.elts):
                raise self.refuse(stmt, "a nested or starred tuple assignment", "unpack one level at a time")
            if isinstance(value, (ast.Tuple, ast.List)):
                if len(value.elts) != len(target.elts):
                    raise self.refuse(stmt, "a tuple assignment whose sides differ in length",
                                      "give each name one value")
                values = [self.expressions.atom(v, stmt) for v in value.elts]  # evaluate all before binding
            else:
                result = self.expressions.expr(value, stmt, top=True)
                if isinstance(result, _Deferred):  # an operation with several results: `a, b = tl.split(x)`
                    result = self.unpack(result, len(target.elts), stmt)
                if not isinstance(result, list) or len(result) != len(target.elts):
                    raise self.refuse(stmt, "a tuple assignment that does not match the value's length",
                                      "unpack as many names as the helper returns")
                values = result
            for t, v in zip(target.elts, values, strict=True):
                if isinstance(v, _Deferred):
                    self.emit_assign(t.id, v, stmt)
                else:
                    self.copy_into(t.id, v, stmt)
        else:
            raise self.refuse(stmt, f"assigning to a `{type(target).__name__}`",
                              "Triton tensors are immutable; assign to a plain name")

    def unpack(self, d: _Deferred, count: int, stmt: ast.stmt) -> list[_Deferred]:
        """``a, b = op(...)``: the operation's tuple of results gets a name of its own (``scan = ...``),
        and each result is an ``item`` of it (``a = scan[0]``), so each has its own adjoint."""
        kind, custom = d.op.kind, d.op.kind == "custom"
        if custom or (operation_of(d.op).has_rule and operation_of(d.op).results == 1):
            signature = operation_of(d.op).signature
            hint = ("helpers with a custom rule return one value" if custom
                    else "use tl.max / tl.min and tl.argmax / tl.argmin separately"
                    if signature is not None and "return_indices" in signature.positional
                    else "compute each result with an operation of its own")
            raise self.refuse(stmt, f"unpacking the results of `{kind}`", hint)
        results = self.namer.fresh(RESULT_NAMES.get(d.op.kind, "results"))
        self.defined.add(results)
        self.finish(ast.Assign(targets=[name_node(results, ast.Store())], value=d.node), d.op, stmt)
        atoms = []
        for i in range(count):
            index = ast.Constant(i)
            item = _Deferred(ast.Subscript(value=name_node(results), slice=index, ctx=ast.Load()),
                             Op("item", [name_node(results), index]), f"{results}_{i}")
            atoms.append(item)
        return atoms

    def copy_into(self, name: str, atom: ast.expr, stmt: ast.stmt) -> None:
        """``name = atom`` where atom is already a name or constant: a plain copy."""
        ssa = self.new_version(name)
        node = ast.Assign(targets=[ast.Name(ssa, ast.Store())], value=atom)
        self.finish(node, Op("copy", [atom]), stmt)
        known, value = self.known_value(atom)
        if known:
            self.known[ssa] = value

    def known_value(self, atom: ast.expr) -> tuple[bool, Any]:
        """(True, the value) of an atom known at derivation: a constant, a copy of a specialized constexpr, a
        global (``tl.float16``); else (False, None)."""
        if isinstance(atom, ast.Constant):
            return True, atom.value
        if isinstance(atom, ast.Name) and atom.id in self.known:
            return True, self.known[atom.id]
        if isinstance(atom, (ast.Name, ast.Attribute)) and not (isinstance(atom, ast.Name) and atom.id in self.defined):
            obj = self.expressions.resolve(atom)
            if obj is not LOCAL:
                return True, plain_value(obj)
        return False, None

    def new_version(self, name: str) -> str:
        """The SSA name for a new assignment to ``name``: itself the first time, then ``name_1``..."""
        frame = self.frame
        ssa = name if not frame.inlined and name not in self.defined else self.namer.fresh(name)
        frame.env[name] = name_node(ssa)
        frame.gone.pop(name, None)
        self.defined.add(ssa)
        return ssa

    def emit_assign(self, name: str, d: _Deferred, stmt: ast.stmt) -> str:
        ssa = self.new_version(name)
        node = ast.Assign(targets=[ast.Name(ssa, ast.Store())], value=d.node)
        self.finish(node, d.op, stmt)
        self.learn(ssa, d.op)
        return ssa

    def learn(self, ssa: str, op: Op) -> None:
        """Know ``ssa`` where it is integer arithmetic or a comparison on values known at derivation (a helper's
        stage ``4 - STAGE``), computed as Triton computes constexprs: in Python."""
        if not operation_of(op).arithmetic or op.kwargs:
            return
        values = [self.known_value(a) for a in op.args]
        if all(k and isinstance(v, (int, bool)) for k, v in values):
            self.known[ssa] = operation_of(op).on_host(*(v for _, v in values))

    def emit_expr(self, d: _Deferred, stmt: ast.stmt) -> None:
        self.finish(ast.Expr(value=d.node), d.op, stmt)

    def finish(self, node: ast.stmt, op: Op, stmt: ast.stmt, **tag) -> None:
        """Tag a flattened statement (see ir.Tag) and append it to the block being written."""
        if isinstance(node, ast.Assign) and operation_of(op).constexpr and all(
                self.is_constexpr(a) for a in [*op.args, *op.kwargs.values()]):
            self.constexprs.add(node.targets[0].id)
            self.compile_time[node.targets[0].id] = node.value
        if isinstance(node, ast.Assign) and operation_of(op).results > 1:
            self.result_tuples.add(node.targets[0].id)
        if isinstance(node, ast.Assign) and (operation_of(op).descriptor == "made" or (
                op.kind == "copy" and isinstance(op.args[0], ast.Name) and op.args[0].id in self.descriptors)):
            self.descriptors.add(node.targets[0].id)
        # the kernel's line, for comments; the construct itself (in the helper's file), for errors
        node.tg = Tag(op, self.frame.call_origin or self.origin(stmt), self.origin(stmt), **tag)
        ast.fix_missing_locations(node)
        self.out.append(node)


# names given to the tuple of an operation's results when it is unpacked
RESULT_NAMES = {"linear_scan": "scan", "associative_scan": "scan", "split": "halves"}


def normalize_kernel(jit_fn: Any, constexprs: Mapping[str, Any] | None = None) -> Program:
    """The kernel flattened; with ``constexprs`` (values of constexpr parameters), the branches they rule
    out removed first (specialize.py)."""
    return Normalizer(Source.of(jit_fn), constexprs).kernel()


def normalize_tile_function(jit_fn: Any) -> Program:
    return Normalizer(Source.of(jit_fn)).tile_function()
