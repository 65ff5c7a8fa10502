"""Kernel object -> one normalized function body.

The reverse sweep needs every intermediate value under a name of its own, so the
frontend rewrites a kernel into flat statements, each one operation on names and
constants (``y = tl.exp(x)``), with:

- ``@triton.jit`` helpers inlined (their locals renamed so nothing clashes);
- nested expressions hoisted into temporaries named after what they compute;
- augmented and tuple assignments expanded;
- every re-assignment given a fresh name (SSA), so the values the adjoints need
  are all still there after the forward replay;
- ``if`` and ``for`` kept as structured statements holding flat blocks, with
  copies where control flow joins (see ``ir.py``).

Each statement carries ``.tg_op`` (what it computes, see :class:`Op`) and
``.tg_origin`` (the user's file, line and source text, for comments and errors).
"""

from __future__ import annotations

import ast
import builtins
import copy
import inspect
import itertools
import textwrap
from dataclasses import dataclass, field
from typing import Any

from .blockptr import rewrite_block_pointers
from .errors import NotDifferentiableError
from .ir import Carried
from .rules import CUSTOM, DESCRIPTOR_METHODS, LOADS, MULTI_RESULT, RULES, Signature, reads_result

LOCAL = object()  # resolve(): the expression is a local value, not a global object

BINOPS = {
    ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
    ast.Mod: "mod", ast.Pow: "pow", ast.MatMult: "matmul", ast.BitAnd: "and_", ast.BitOr: "or_",
    ast.BitXor: "xor", ast.LShift: "lshift", ast.RShift: "rshift",
}
UNARYOPS = {ast.USub: "neg", ast.UAdd: "pos", ast.Not: "not_", ast.Invert: "invert"}
CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne",
          ast.Is: "is_", ast.IsNot: "is_not", ast.In: "in_", ast.NotIn: "not_in"}
# words used to name temporaries after what they compute: `x_times_w`
OP_WORDS = {"add": "plus", "sub": "minus", "mul": "times", "truediv": "over", "pow": "pow"}
# attribute reads that describe a value rather than compute from it
METADATA_ATTRS = {"dtype", "shape", "type", "element_ty", "numel", "primitive_bitwidth", "ndim"}
# operations whose result is a compile-time constant when their operands are
CONSTEXPR_KINDS = {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "not_", "invert", "lt",
                   "le", "gt", "ge", "eq", "ne", "is_", "is_not", "in_", "not_in", "boolop", "ifexp", "copy", "and_",
                   "or_", "xor", "lshift", "rshift", "cdiv"}


@dataclass(frozen=True)
class Origin:
    """Where a statement came from in the user's code."""

    file: str
    line: int
    text: str
    function: str = ""  # the helper it is in, when inlined


@dataclass
class Op:
    """What one flat statement computes: ``kind(*args, **kwargs)``.

    ``kind`` is the operation's canonical name (``"add"``, ``"exp"``, ``"load"``,
    ``"subscript"``, ``"call"`` for an unknown function); args are atoms (names,
    constants, literal tuples, metadata such as ``x.shape``).
    """

    kind: str
    args: list[ast.expr]
    kwargs: dict[str, ast.expr] = field(default_factory=dict)
    func: Any = None

    def __deepcopy__(self, memo: dict) -> Op:
        return self  # never changed after the frontend; copies of a statement share it


@dataclass
class Program:
    """A kernel (or tile function) after normalization."""

    name: str
    params: list[ast.arg]
    body: list[ast.stmt]
    scope: dict[str, Any]
    file: str
    names: set[str]
    returns: list[ast.expr] | None = None  # tile functions: the returned atoms
    origin: Origin | None = None
    temporaries: set[str] = field(default_factory=set)  # names the flattening made up

    def param_names(self) -> list[str]:
        return [p.arg for p in self.params]


def unwrap(kernel: Any) -> Any:
    """The jit function under ``@triton.autotune`` / ``@triton.heuristics`` wrappers."""
    seen = 0
    while not _is_jit(kernel) and hasattr(kernel, "fn") and seen < 10:
        kernel, seen = kernel.fn, seen + 1
    if not _is_jit(kernel):
        raise TypeError(f"expected a @triton.jit kernel, got {type(kernel).__name__}")
    return kernel


def _is_jit(obj: Any) -> bool:
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction") and hasattr(obj, "fn")


def triton_language_name(obj: Any, spelled: ast.expr | None = None) -> str | None:
    """``"exp"`` for ``tl.exp`` (or ``tl.math.exp``, libdevice's ``exp``...), else None."""
    fn = getattr(obj, "fn", obj)
    module = getattr(fn, "__module__", "") or ""
    if module.startswith("triton.language"):
        return getattr(fn, "__name__", None)
    if module == "triton.runtime.interpreter" and spelled is not None:
        # Triton 3.2's interpreter leaves tl.* replaced by its own lambdas after a kernel ran
        return spelled.attr if isinstance(spelled, ast.Attribute) else getattr(spelled, "id", None)
    return None


@dataclass
class _Function:
    """A Python function's source, parsed, with where it lives."""

    name: str
    tree: ast.FunctionDef
    file: str
    first_line: int
    lines: list[str]
    scope: dict[str, Any]

    @classmethod
    def of(cls, jit_fn: Any) -> _Function:
        fn = jit_fn.fn
        try:
            lines, first_line = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise NotDifferentiableError(
                f"kernel `{fn.__name__}`: its source cannot be found",
                file=getattr(fn.__code__, "co_filename", "<unknown>"),
                line=getattr(fn.__code__, "co_firstlineno", 0),
                hint="define the kernel in a file (not with exec or in a REPL) so its source can be read",
            ) from e
        tree = ast.parse(textwrap.dedent("".join(lines)))
        fdef = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        scope = dict(fn.__globals__)
        if fn.__closure__:
            scope.update(inspect.getclosurevars(fn).nonlocals)
        function = cls(fn.__name__, fdef, fn.__code__.co_filename, first_line, lines, scope)
        function.tree = rewrite_block_pointers(fdef, scope, function.origin)
        return function

    def origin(self, node: ast.AST) -> Origin:
        lineno = getattr(node, "lineno", 1)
        text = self.lines[lineno - 1].strip() if 0 < lineno <= len(self.lines) else ""
        return Origin(self.file, self.first_line + lineno - 1, text, self.name)


class Namer:
    """Hands out names no one else uses."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        base = base if base.isidentifier() else "tmp"
        if base not in self.taken:
            self.taken.add(base)
            return base
        for i in itertools.count(1):
            name = f"{base}_{i}"
            if name not in self.taken:
                self.taken.add(name)
                return name
        raise AssertionError


def refuse(origin: Origin, construct: str, hint: str) -> NotDifferentiableError:
    return NotDifferentiableError(construct, file=origin.file, line=origin.line, hint=hint,
                                  source_line=origin.text)


@dataclass
class _Frame:
    """One function being flattened: the kernel itself or an inlined helper."""

    fn: _Function
    env: dict[str, ast.expr]  # source name -> the atom it stands for now (its SSA name, or a constant)
    inlined: bool
    call_origin: Origin | None = None  # for helpers: the call site in the kernel
    gone: dict[str, str] = field(default_factory=dict)  # source name -> why it has no value here any more


class Normalizer:
    """Flattens a kernel, inlining helpers, into a :class:`Program`."""

    def __init__(self, root: _Function):
        self.root = root
        taken = {n.id for n in ast.walk(root.tree) if isinstance(n, ast.Name)}
        taken |= {a.arg for a in root.tree.args.args}
        self.namer = Namer(taken | set(dir(builtins)))
        self.scope: dict[str, Any] = dict(root.scope)
        self.out: list[ast.stmt] = []
        self.frames: list[_Frame] = []
        self.defined = {a.arg for a in root.tree.args.args}  # SSA names bound so far
        self.temporaries: set[str] = set()
        self.inline_depth = 0
        self.constexprs = {a.arg for a in root.tree.args.args if _is_constexpr_annotation(a.annotation)}
        self.descriptors: set[str] = set()  # SSA names of tensor descriptors made in the kernel

    # -- entry points ---------------------------------------------------------------------

    def kernel(self) -> Program:
        return self._program(tile=False)

    def tile_function(self) -> Program:
        return self._program(tile=True)

    def _program(self, tile: bool) -> Program:
        fdef = self.root.tree
        args = fdef.args
        origin = self.root.origin(fdef)
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
            raise refuse(origin, "a kernel signature with *args, **kwargs or keyword-only parameters",
                         "list every parameter explicitly")
        params = [ast.arg(arg=a.arg, annotation=a.annotation) for a in args.args]
        frame = _Frame(self.root, {p.arg: _name(p.arg) for p in params}, inlined=False)
        self.frames.append(frame)
        body = list(fdef.body)
        returns = None
        if tile:
            if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
                raise refuse(origin, f"tile function `{fdef.name}` without a final `return`",
                             "vjp() differentiates a @triton.jit helper that returns its result")
            ret = body.pop()
            self.block(body)
            value = ret.value
            elts = value.elts if isinstance(value, ast.Tuple) else [value]
            returns = [self.atom(e, ret) for e in elts]
        else:
            if body and isinstance(body[-1], ast.Return) and body[-1].value is None:
                body.pop()
            self.block(body)
        self.frames.pop()
        return Program(fdef.name, params, self.out, self.scope, self.root.file, self.namer.taken,
                       returns=returns, origin=origin, temporaries=self.temporaries)

    # -- statements -----------------------------------------------------------------------

    @property
    def frame(self) -> _Frame:
        return self.frames[-1]

    def origin(self, node: ast.AST) -> Origin:
        return self.frame.fn.origin(node)

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
            value = self.expr(stmt.value, stmt, top=True)
            if isinstance(value, _Deferred):
                self.emit_expr(value, stmt)
        elif isinstance(stmt, ast.Pass):
            return
        elif isinstance(stmt, ast.Return):
            raise self.refuse(stmt, "an early `return`",
                              "structure the kernel so it ends at its last statement")
        elif isinstance(stmt, ast.For):
            self.for_loop(stmt)
        elif isinstance(stmt, ast.If):
            self.if_statement(stmt)
        elif isinstance(stmt, ast.While):
            # its trip count is decided inside the loop, so the reverse sweep cannot replay it
            # iteration by iteration without a tape of every iteration's state
            raise self.refuse(stmt, "a `while` loop",
                              "compute the trip count first and loop with `for i in range(n)`")
        elif isinstance(stmt, (ast.Break, ast.Continue)):
            raise self.refuse(stmt, f"`{type(stmt).__name__.lower()}`", "Triton loops run every iteration; "
                              "guard the body with an `if` instead")
        else:
            raise self.refuse(stmt, f"a `{type(stmt).__name__}` statement",
                              "a kernel body is assignments, calls, loops and branches")

    # -- control flow ---------------------------------------------------------------------

    def nested_block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """Flatten ``stmts`` into a block of their own (a branch or a loop body)."""
        saved, self.out = self.out, []
        try:
            self.block(stmts)
            return self.out
        finally:
            self.out = saved

    def if_statement(self, stmt: ast.If) -> None:
        """``if`` / ``elif`` / ``else``: each branch a block; a variable either assigns gets a merge name,
        assigned at the end of both branches (Triton's rule for a runtime ``if``)."""
        test = self.atom(stmt.test, stmt)
        static = self.is_constexpr(test)
        frame = self.frame
        env, gone = dict(frame.env), dict(frame.gone)
        branches = []
        for body in (stmt.body, stmt.orelse):
            frame.env, frame.gone = dict(env), dict(gone)
            branches.append((self.nested_block(body), frame.env, frame.gone))
        frame.env, frame.gone = dict(env), {**branches[0][2], **branches[1][2]}
        merges = []
        names = [n for n in {**branches[0][1], **branches[1][1]} if any(
            n not in env or _differs(b[1].get(n), env[n]) for b in branches)]
        for name in names:
            values = [b[1].get(name) for b in branches]
            if None not in values and not _differs(*values):
                frame.env[name] = values[0]
                continue
            if None in values and not static:
                line = self.origin(stmt).line
                frame.gone[name] = (f"it is assigned in only one branch of the `if` on line {line}, and Triton "
                                    "keeps a value after a runtime `if` only when both branches assign it")
                continue
            # a version first assigned in a branch becomes the merge variable itself there (no copy)
            blocks = [b[0] for b in branches]
            own = [v is not None and _assigned_at_top(block, v) for block, v in zip(blocks, values, strict=True)]
            merged = next((v.id for v, ok in zip(values, own, strict=True) if ok), None)
            if merged is None:
                merged = self.new_version(name)
            frame.env[name] = _name(merged)
            for block, value, ok in zip(blocks, values, own, strict=True):
                if ok:
                    _rename(block, value.id, merged)
                elif value is not None:
                    self.out, saved = block, self.out
                    self._finish(ast.Assign(targets=[_name(merged, ast.Store())], value=value), Op("copy", [value]),
                                 stmt)
                    block[-1].tg_join = True
                    self.out = saved
            if all(self.is_constexpr(v) for v in values if v is not None):
                self.constexprs.add(merged)
            merges.append(merged)
        for name in frame.env:
            frame.gone.pop(name, None)
        node = ast.If(test=test, body=branches[0][0], orelse=branches[1][0])
        node.tg_merges, node.tg_static = merges, static
        self._finish(node, Op("if", [test]), stmt)

    def for_loop(self, stmt: ast.For) -> None:
        """``for`` over ``range`` / ``tl.range`` / ``tl.static_range``. A variable the body assigns that has
        a value before the loop is carried: a copy gives it its initial value before the loop, another its
        next value at the end of the body; names first assigned in the body do not outlive the loop."""
        if stmt.orelse:
            raise self.refuse(stmt, "a `for ... else`", "Triton loops have no `else`; put it after the loop")
        if not isinstance(stmt.target, ast.Name):
            raise self.refuse(stmt, "a `for` loop with a tuple target", "loop over one index: `for i in range(n)`")
        iterator = stmt.iter
        obj = self.resolve(iterator.func) if isinstance(iterator, ast.Call) else None
        if obj is not builtins.range and triton_language_name(obj) not in ("range", "static_range"):
            raise self.refuse(stmt, f"a `for` loop over `{ast.unparse(iterator)}`",
                              "loop over range(...), tl.range(...) or tl.static_range(...)")
        if any(isinstance(a, ast.Starred) for a in iterator.args) or any(k.arg is None for k in iterator.keywords):
            raise self.refuse(stmt, "a loop range with *args or **kwargs", "pass the bounds explicitly")
        args = [self.atom(a, stmt) for a in iterator.args]
        kwargs = {k.arg: self.atom(k.value, stmt) for k in iterator.keywords}
        if obj is not builtins.range:
            self._import_globals(iterator.func)
        callee = _rename_globals(iterator.func, self.frame, self)
        static = triton_language_name(obj) == "static_range"
        frame = self.frame
        target = stmt.target.id
        assigned = _assigned_names(stmt.body)
        carried = []
        for name in assigned:
            if name in frame.env and name != target:
                init = frame.env[name]
                phi = self._reusable_init(init)  # `acc = tl.zeros(...)` is the carried variable itself
                if phi is None:
                    phi = self.new_version(name)
                    self._finish(ast.Assign(targets=[_name(phi, ast.Store())], value=init), Op("copy", [init]), stmt)
                carried.append((name, phi, init))
        outside = dict(frame.env)
        index = self.new_version(target)
        if static:
            self.constexprs.add(index)
        self.out, saved = [], self.out
        self.block(stmt.body)
        records = []
        for name, phi, init in carried:
            nxt = frame.env[name]
            if not _differs(nxt, _name(phi)):
                continue
            last = _last_assignment(self.out, nxt)
            if last is not None and not reads_result(last.tg_op.kind) and not _reads(
                    self.out[self.out.index(last) + 1:], {nxt.id, phi}):
                last.targets[0].id = phi  # `acc = acc + x` updates it in place: no copy
            else:
                self._finish(ast.Assign(targets=[_name(phi, ast.Store())], value=nxt), Op("copy", [nxt]), stmt)
                self.out[-1].tg_join = True
            records.append(Carried(phi, init, _name(phi) if last is not None and last.targets[0].id == phi else nxt,
                                   name))
        body, self.out = self.out, saved
        line = self.origin(stmt).line
        for name in set(frame.env) - set(outside) | {target}:
            frame.gone[name] = (f"it is assigned inside the loop on line {line}, and Triton keeps after a loop "
                                "only the variables that had a value before it")
        frame.env = {**outside, **{name: _name(phi) for name, phi, _ in carried}}
        frame.env.pop(target, None)
        loop = ast.For(target=_name(index, ast.Store()), iter=ast.Call(func=callee, args=args, keywords=[
            ast.keyword(arg=k, value=v) for k, v in kwargs.items()]), body=body, orelse=[])
        loop.tg_carried, loop.tg_static = records, static
        self._finish(loop, Op("for", args, kwargs, obj), stmt)

    def _reusable_init(self, init: ast.expr) -> str | None:
        """The name of a loop's initial value, when the loop can carry that variable itself: assigned at
        the top of the current block, read by nothing else, by an operation whose adjoint does not read
        its result (which the loop overwrites), not a load."""
        if not isinstance(init, ast.Name):
            return None
        stmt = _last_assignment(self.out, init)
        if stmt is None or reads_result(stmt.tg_op.kind) or stmt.tg_op.kind in LOADS or _reads(
                self.out[self.out.index(stmt) + 1:], {init.id}):
            return None  # (a load stays apart: its value types the adjoint without replaying the loop)
        return init.id

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
        return _is_metadata(atom)

    def assign(self, target: ast.expr, value: ast.expr, stmt: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            result = self.expr(value, stmt, top=True)
            if isinstance(result, _Deferred):
                self.emit_assign(target.id, result, stmt)
            elif isinstance(result, list):
                raise self.refuse(stmt, "assigning a tuple of values to one name",
                                  "unpack the tuple: `a, b = ...`")
            else:
                self.bind(target.id, result, stmt)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if any(not isinstance(t, ast.Name) for t in target.elts):
                raise self.refuse(stmt, "a nested or starred tuple assignment", "unpack one level at a time")
            if isinstance(value, (ast.Tuple, ast.List)):
                if len(value.elts) != len(target.elts):
                    raise self.refuse(stmt, "a tuple assignment whose sides differ in length",
                                      "give each name one value")
                values = [self.atom(v, stmt) for v in value.elts]  # evaluate all before binding
            else:
                result = self.expr(value, stmt, top=True)
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
                    self.bind(t.id, v, stmt)
        else:
            raise self.refuse(stmt, f"assigning to a `{type(target).__name__}`",
                              "Triton tensors are immutable; assign to a plain name")

    def unpack(self, d: _Deferred, count: int, stmt: ast.stmt) -> list[_Deferred]:
        """``a, b = op(...)``: the operation's tuple of results gets a name of its own (``scan = ...``),
        and each result is an ``item`` of it (``a = scan[0]``), so each has its own adjoint."""
        kind = d.op.kind
        if kind == "custom" or (kind in RULES and kind not in MULTI_RESULT):
            hint = ("use tl.max / tl.min and tl.argmax / tl.argmin separately" if kind in ("max", "min")
                    else "helpers with a custom rule return one value" if kind == "custom"
                    else "compute each result with an operation of its own")
            raise self.refuse(stmt, f"unpacking the results of `{kind}`", hint)
        results = self.namer.fresh(_MULTI_NAMES.get(d.op.kind, "results"))
        self.defined.add(results)
        self._finish(ast.Assign(targets=[_name(results, ast.Store())], value=d.node), d.op, stmt)
        atoms = []
        for i in range(count):
            index = ast.Constant(i)
            item = _Deferred(ast.Subscript(value=_name(results), slice=index, ctx=ast.Load()),
                             Op("item", [_name(results), index]), f"{results}_{i}")
            atoms.append(item)
        return atoms

    def bind(self, name: str, atom: ast.expr, stmt: ast.stmt) -> None:
        """``name = atom`` where atom is already a name or constant: a plain copy."""
        ssa = self.new_version(name)
        node = ast.Assign(targets=[ast.Name(ssa, ast.Store())], value=atom)
        self._finish(node, Op("copy", [atom]), stmt)

    def new_version(self, name: str) -> str:
        """The SSA name for a new assignment to ``name``: itself the first time, then ``name_1``..."""
        frame = self.frame
        ssa = name if not frame.inlined and name not in self.defined else self.namer.fresh(name)
        frame.env[name] = _name(ssa)
        frame.gone.pop(name, None)
        self.defined.add(ssa)
        return ssa

    def emit_assign(self, name: str, d: _Deferred, stmt: ast.stmt) -> str:
        ssa = self.new_version(name)
        node = ast.Assign(targets=[ast.Name(ssa, ast.Store())], value=d.node)
        self._finish(node, d.op, stmt)
        return ssa

    def emit_expr(self, d: _Deferred, stmt: ast.stmt) -> None:
        self._finish(ast.Expr(value=d.node), d.op, stmt)

    def _finish(self, node: ast.stmt, op: Op, stmt: ast.stmt) -> None:
        if isinstance(node, ast.Assign) and op.kind in CONSTEXPR_KINDS and all(
                self.is_constexpr(a) for a in [*op.args, *op.kwargs.values()]):
            self.constexprs.add(node.targets[0].id)
        if isinstance(node, ast.Assign) and (op.kind == "make_tensor_descriptor" or (
                op.kind == "copy" and isinstance(op.args[0], ast.Name) and op.args[0].id in self.descriptors)):
            self.descriptors.add(node.targets[0].id)
        node.tg_op = op
        node.tg_origin = self.frame.call_origin or self.origin(stmt)  # the kernel line, for comments
        node.tg_where = self.origin(stmt)  # the construct itself (in the helper's file), for errors
        ast.fix_missing_locations(node)
        self.out.append(node)

    # -- expressions ----------------------------------------------------------------------

    def atom(self, node: ast.expr, stmt: ast.stmt) -> ast.expr:
        """Flatten ``node`` and return a name, constant or metadata expression for it."""
        result = self.expr(node, stmt)
        if isinstance(result, _Deferred):
            ssa = self.namer.fresh(result.hint)
            self.temporaries.add(ssa)
            self.defined.add(ssa)
            new = ast.Assign(targets=[ast.Name(ssa, ast.Store())], value=result.node)
            self._finish(new, result.op, stmt)
            return ast.Name(ssa, ast.Load())
        if isinstance(result, list):
            return ast.Tuple(elts=result, ctx=ast.Load())
        return result

    def expr(self, node: ast.expr, stmt: ast.stmt, top: bool = False) -> Any:
        """Flatten an expression: an atom, a list of atoms (tuples), or a _Deferred op."""
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, ast.Name):
            if node.id in self.frame.env:
                return copy.deepcopy(self.frame.env[node.id])
            if node.id in self.frame.gone:
                raise self.refuse(stmt, f"using `{node.id}` here: {self.frame.gone[node.id]}",
                                  f"give `{node.id}` a value before the `if` or loop that assigns it")
            return self.global_name(node)
        if isinstance(node, (ast.Tuple, ast.List)):
            elts = [self.atom(e, stmt) for e in node.elts]
            return elts if top else type(node)(elts=elts, ctx=ast.Load())
        if isinstance(node, ast.Attribute):
            return self.attribute(node, stmt)
        if isinstance(node, ast.BinOp):
            kind = BINOPS[type(node.op)]
            a, b = self.atom(node.left, stmt), self.atom(node.right, stmt)
            hint = "_".join(x for x in (_label(a), OP_WORDS.get(kind, kind), _label(b)) if x)
            return _Deferred(ast.BinOp(left=a, op=node.op, right=b), Op(kind, [a, b]), hint)
        if isinstance(node, ast.UnaryOp):
            kind = UNARYOPS[type(node.op)]
            a = self.atom(node.operand, stmt)
            if kind == "neg" and isinstance(a, ast.Constant):
                return ast.Constant(-a.value)
            return _Deferred(ast.UnaryOp(op=node.op, operand=a), Op(kind, [a]), f"{kind}_{_label(a) or 'x'}")
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise self.refuse(stmt, "a chained comparison", "split it: `(a < b) & (b < c)`")
            kind = CMPOPS[type(node.ops[0])]
            a, b = self.atom(node.left, stmt), self.atom(node.comparators[0], stmt)
            hint = "_".join(x for x in (_label(a), kind, _label(b)) if x)
            return _Deferred(ast.Compare(left=a, ops=node.ops, comparators=[b]), Op(kind, [a, b]), hint)
        if isinstance(node, ast.BoolOp):
            values = [self.atom(v, stmt) for v in node.values]
            return _Deferred(ast.BoolOp(op=node.op, values=values), Op("boolop", values), "cond")
        if isinstance(node, ast.IfExp):
            # only constexpr conditions are legal in Triton: keep it whole, it is not differentiated
            parts = [self.atom(x, stmt) for x in (node.test, node.body, node.orelse)]
            node = ast.IfExp(test=parts[0], body=parts[1], orelse=parts[2])
            return _Deferred(node, Op("ifexp", parts), "choice")
        if isinstance(node, ast.Subscript):
            return self.subscript(node, stmt)
        if isinstance(node, ast.Call):
            return self.call(node, stmt)
        if isinstance(node, ast.JoinedStr):
            return node
        raise self.refuse(stmt, f"the expression `{ast.unparse(node)}`",
                          "use Triton operations on names and constants")

    def global_name(self, node: ast.Name) -> ast.expr:
        """A name not bound locally: look it up where the function was defined."""
        frame = self.frame
        if not frame.inlined:
            return ast.Name(node.id, ast.Load())
        scope = frame.fn.scope
        if node.id in scope:
            obj = scope[node.id]
            if node.id in self.scope and self.scope[node.id] is not obj:
                alias = self.namer.fresh(node.id)
                self.scope[alias] = obj
                frame.env[node.id] = _name(alias)  # later uses in this helper use the alias too
                return _name(alias)
            self.scope[node.id] = obj
        return ast.Name(node.id, ast.Load())

    def resolve(self, node: ast.expr) -> Any:
        """The Python object an expression names (``tl.exp``, a helper), or LOCAL."""
        if isinstance(node, ast.Name):
            if node.id in self.frame.env:
                return LOCAL
            scope = self.frame.fn.scope
            if node.id in scope:
                return scope[node.id]
            return getattr(builtins, node.id, LOCAL)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is LOCAL:
                return LOCAL
            return getattr(base, node.attr, LOCAL)
        return LOCAL

    def attribute(self, node: ast.Attribute, stmt: ast.stmt) -> Any:
        obj = self.resolve(node)
        if obj is not LOCAL:  # `tl.float32`, a module-level constexpr...
            self._import_globals(node)
            return _rename_globals(node, self.frame, self)
        if node.attr == "T":
            x = self.atom(node.value, stmt)
            return _Deferred(ast.Attribute(value=x, attr="T", ctx=ast.Load()), Op("trans", [x]), f"{_label(x)}_T")
        if node.attr in METADATA_ATTRS or _is_metadata(node.value):
            value = self.atom(node.value, stmt)
            return ast.Attribute(value=value, attr=node.attr, ctx=ast.Load())
        raise self.refuse(stmt, f"the attribute `{ast.unparse(node)}`",
                          "only metadata (`.dtype`, `.shape`) and `.T` of a tensor are known")

    def _import_globals(self, node: ast.expr) -> None:
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name):
            self.global_name(root)

    def subscript(self, node: ast.Subscript, stmt: ast.stmt) -> Any:
        if _is_metadata(node.value):  # x.shape[0]
            return ast.Subscript(value=self.atom(node.value, stmt), slice=node.slice, ctx=ast.Load())
        x = self.atom(node.value, stmt)
        index = node.slice
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        for p in parts:
            ok = (isinstance(p, ast.Constant) and p.value is None) or (
                isinstance(p, ast.Slice) and p.lower is None and p.upper is None and p.step is None)
            if not ok:
                raise self.refuse(stmt, f"the subscript `{ast.unparse(node)}`",
                                  "only `None` and `:` are valid tensor subscripts in Triton")
        new = ast.Subscript(value=x, slice=index, ctx=ast.Load())
        return _Deferred(new, Op("subscript", [x], {"index": index}), f"{_label(x) or 'x'}_b")

    def call(self, node: ast.Call, stmt: ast.stmt) -> Any:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise self.refuse(stmt, "a call with *args or **kwargs", "pass arguments explicitly")
        func = node.func
        obj = self.resolve(func)
        if obj is LOCAL:
            if isinstance(func, ast.Attribute):  # a tensor method: x.to(...), x.sum(0)
                receiver = self.atom(func.value, stmt)
                if isinstance(receiver, ast.Name) and receiver.id in self.descriptors:
                    return self.descriptor_method(func, receiver, node, stmt)
                if func.attr in ("load", "store", "atomic_add", "gather", "scatter"):
                    raise self.refuse(stmt, f"`{ast.unparse(func)}(...)`, a tensor descriptor's {func.attr} through "
                                      "a descriptor made outside the kernel",
                                      "pass the tensor and build its descriptor in the kernel with "
                                      "`tl.make_tensor_descriptor(x_ptr, shape, strides, block_shape)`")
                return self.build_call(func.attr, ast.Attribute(value=receiver, attr=func.attr, ctx=ast.Load()),
                                       [receiver], node, stmt, method=True)
            raise self.refuse(stmt, f"a call to the local value `{ast.unparse(func)}`",
                              "call @triton.jit helpers and Triton functions by their global name")
        if _is_jit(obj) and obj.fn in CUSTOM:  # a helper with a hand-written rule: called, not inlined
            _, alias, backward = CUSTOM[obj.fn]
            if self.scope.setdefault(alias, backward) is not backward:
                raise self.refuse(stmt, f"the call to `{ast.unparse(func)}`: its custom rule's backward "
                                  f"`{alias}` is another object in this kernel's module",
                                  "give the backward a name the kernel's module does not use otherwise")
            self._import_globals(func)
            callee = _rename_globals(func, self.frame, self)
            return self.build_call("custom", callee, [], node, stmt, func_obj=obj)
        name = triton_language_name(obj, func)
        if name == "reduce":
            return self.reduce(node, stmt, obj)
        if name == "associative_scan":
            return self.scan(node, stmt, obj)
        if name in ("make_block_ptr", "advance"):  # left over by blockptr.py only when it could not run
            raise self.refuse(stmt, f"`tl.{name}` here", "assign block pointers to names, then load, store and "
                              "advance them")
        if name == "pow":  # libdevice's pow(x, y), apart from the `**` operator
            name = "fpow"
        if name is None and _is_jit(obj):
            return self.inline(obj, node, stmt)
        if name is None and getattr(obj, "__module__", None) == "builtins":
            # float("inf"), min(BLOCK, N): compile-time values, kept inline
            args = [self.atom(a, stmt) for a in node.args]
            keywords = [ast.keyword(arg=k.arg, value=self.atom(k.value, stmt)) for k in node.keywords]
            return ast.Call(func=node.func, args=args, keywords=keywords)
        self._import_globals(func)
        callee = _rename_globals(func, self.frame, self)
        if name is None:
            name = "call"
        return self.build_call(name, callee, [], node, stmt, func_obj=obj)

    def descriptor_method(self, func: ast.Attribute, desc: ast.Name, node: ast.Call, stmt: ast.stmt) -> _Deferred:
        """``desc.load(offsets)``, ``desc.store(offsets, value)``, ``desc.atomic_add(offsets, value)`` of a
        descriptor made in the kernel: memory operations whose shadow goes through a descriptor too."""
        kind = DESCRIPTOR_METHODS.get(func.attr)
        if kind is None:
            raise self.refuse(stmt, f"a tensor descriptor's `{func.attr}`",
                              "differentiable descriptor accesses are load, store and atomic_add")
        method = ast.Attribute(value=desc, attr=func.attr, ctx=ast.Load())
        return self.build_call(kind, method, [desc], node, stmt, method=True)

    def reduce(self, node: ast.Call, stmt: ast.stmt, obj: Any) -> _Deferred:
        """``tl.reduce(x, axis, combine)``: differentiated as tl.sum / tl.max / tl.min when ``combine``
        is one of those (``a + b``, ``tl.maximum(a, b)``, ``tl.minimum(a, b)``); else left without a rule."""
        self._import_globals(node.func)
        d = self.build_call("reduce", _rename_globals(node.func, self.frame, self), [], node, stmt, func_obj=obj)
        try:
            bound = REDUCE_SIGNATURE.bind(d.op.args, d.op.kwargs)
        except TypeError as e:
            raise self.refuse(stmt, f"the call to `tl.reduce`: {e}", "check the arguments against Triton's") from e
        combine = bound["combine_fn"]
        kind = _combine_kind(self.resolve(combine) if isinstance(combine, ast.Name) else None)
        if kind is not None:  # op.func stays tl.reduce: with axis=None it flattens first (shapes differ)
            d.op = Op(kind, [bound["input"], bound["axis"]], {"keep_dims": bound["keep_dims"]}, obj)
        return d

    def scan(self, node: ast.Call, stmt: ast.stmt, obj: Any) -> _Deferred:
        """``tl.associative_scan``: of a pair ``(a, b)`` with the combine function of a first-order linear
        recurrence, ``(a1, b1), (a2, b2) -> (a1 * a2, b1 * a2 + b2)``, it is a ``linear_scan`` (h_t = a_t h_{t-1}
        + b_t, with the products of the a's); of one tensor combined by ``a + b``, a ``cumsum``. Any other
        combine function has no rule."""
        self._import_globals(node.func)
        d = self.build_call("associative_scan", _rename_globals(node.func, self.frame, self), [], node, stmt,
                            func_obj=obj)
        args, kwargs = d.op.args, d.op.kwargs
        combine = args[2] if len(args) > 2 else kwargs.get("combine_fn")
        fn = self.resolve(combine) if isinstance(combine, ast.Name) else None
        pair = len(args) >= 1 and isinstance(args[0], (ast.Tuple, ast.List)) and len(args[0].elts) == 2
        if pair and _is_linear_recurrence(fn):
            d.op = Op("linear_scan", args, kwargs, obj)
        elif len(args) >= 2 and isinstance(args[0], ast.Name) and _combine_kind(fn) == "sum":
            reverse = args[3] if len(args) > 3 else kwargs.get("reverse")
            d.op = Op("cumsum", args[:2], {"reverse": reverse} if reverse is not None else {}, obj)
        return d

    def build_call(self, kind: str, callee: ast.expr, lead: list[ast.expr], node: ast.Call, stmt: ast.stmt,
                   func_obj: Any = None, method: bool = False) -> _Deferred:
        args = lead + [self.atom(a, stmt) for a in node.args]
        kwargs = {k.arg: self.atom(k.value, stmt) for k in node.keywords}
        call_args = args[1:] if method else args
        new = ast.Call(func=callee, args=call_args, keywords=[ast.keyword(arg=k, value=v) for k, v in kwargs.items()])
        first = _label(args[0]) if args else ""
        hint = kind if kind in ("load", "call", "custom") or not first else f"{kind}_{first}"
        if kind == "desc_load":
            hint = "load"
        if kind == "custom":
            hint = getattr(func_obj, "__name__", "custom")
        return _Deferred(new, Op(kind, args, kwargs, func_obj), hint)

    def inline(self, helper: Any, node: ast.Call, stmt: ast.stmt) -> Any:
        """Inline a call to a @triton.jit helper; returns its result atom(s)."""
        if self.inline_depth > 32:
            raise self.refuse(stmt, "recursion through @triton.jit helpers",
                              "helpers are inlined, so they cannot recurse")
        fn = _Function.of(helper)
        fdef = fn.tree
        sig_params = [a.arg for a in fdef.args.args]
        args = [self.atom(a, stmt) for a in node.args]
        kwargs = {k.arg: self.atom(k.value, stmt) for k in node.keywords}
        try:
            bound = inspect.signature(helper.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise self.refuse(stmt, f"the call to `{fn.name}`: {e}", "match the helper's signature") from e
        bound.apply_defaults()
        frame = _Frame(fn, {}, inlined=True, call_origin=self.frame.call_origin or self.origin(stmt))
        assigned = {t.id for n in ast.walk(fdef) for t in ast.walk(n)
                    if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        self.frames.append(frame)
        self.inline_depth += 1
        try:
            for p in sig_params:
                v = bound.arguments[p]
                v = v if isinstance(v, ast.AST) else ast.Constant(v)
                if p in assigned:  # the helper rebinds it: start from a copy
                    ssa = self.new_version(p)
                    self._finish(ast.Assign(targets=[_name(ssa, ast.Store())], value=v), Op("copy", [v]), fdef)
                else:  # substitute the argument itself
                    frame.env[p] = v
            body = list(fdef.body)
            while body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body.pop(0)
            ret = None
            if body and isinstance(body[-1], ast.Return):
                ret = body.pop()
            for s in body:
                if isinstance(s, ast.Return):
                    raise self.refuse(s, f"an early `return` in helper `{fn.name}`",
                                      "return once, at the end of the helper")
                self.statement(s)
            if ret is None or ret.value is None:
                return ast.Constant(None)
            value = ret.value
            if isinstance(value, ast.Tuple):
                return [self.atom(e, ret) for e in value.elts]
            return self.atom(value, ret)
        finally:
            self.inline_depth -= 1
            self.frames.pop()


REDUCE_SIGNATURE = Signature.parse("input, axis, combine_fn, keep_dims=False")


@dataclass
class _Deferred:
    """An operation not yet assigned: the caller decides its name."""

    node: ast.expr
    op: Op
    hint: str


def _name(id: str, ctx: ast.expr_context | None = None) -> ast.Name:
    return ast.Name(id, ctx or ast.Load())


def _label(node: ast.expr) -> str:
    if isinstance(node, ast.Name) and len(node.id) <= 12:
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and 0 <= node.value < 100:
        return str(node.value)
    return ""


def _differs(a: ast.expr | None, b: ast.expr | None) -> bool:
    return a is None or b is None or ast.dump(a) != ast.dump(b)


def _assigned_at_top(block: list[ast.stmt], atom: ast.expr) -> bool:
    """Whether the block itself assigns ``atom`` (a statement at its top, or the merge of an if there)."""
    if not isinstance(atom, ast.Name):
        return False
    if any(isinstance(s, ast.For) and atom.id in {c.name for c in s.tg_carried} for s in block):
        return False
    return _last_assignment(block, atom) is not None or any(
        isinstance(s, ast.If) and atom.id in s.tg_merges for s in block)


def _last_assignment(block: list[ast.stmt], atom: ast.expr) -> ast.Assign | None:
    """The statement at the top of ``block`` that assigns the name ``atom``, if any."""
    if not isinstance(atom, ast.Name):
        return None
    for s in reversed(block):
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) and s.targets[0].id == atom.id:
            return s
    return None


def _reads(stmts: list[ast.stmt], names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names
               for s in stmts for n in ast.walk(s))


def _rename(block: list[ast.stmt], old: str, new: str) -> None:
    """Rename a name everywhere in a block (the operations' atoms are the same nodes)."""
    for s in block:
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and n.id == old:
                n.id = new
            if isinstance(n, ast.If):
                n.tg_merges = [new if m == old else m for m in n.tg_merges]


def _assigned_names(stmts: list[ast.stmt]) -> list[str]:
    """Source names a block assigns (loop targets and nested blocks included), in order."""
    names: dict[str, None] = {}
    for stmt in stmts:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names[n.id] = None
    return list(names)


def _is_constexpr_annotation(annotation: ast.expr | None) -> bool:
    return annotation is not None and ast.unparse(annotation).split(".")[-1] == "constexpr"


def _is_metadata(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in METADATA_ATTRS) or (
        isinstance(node, ast.Subscript) and _is_metadata(node.value))


def _rename_globals(node: ast.expr, frame: _Frame, norm: Normalizer) -> ast.expr:
    """Copy of ``node`` with local names mapped to their SSA names, globals to their aliases."""

    class Rename(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            return copy.deepcopy(frame.env[n.id]) if n.id in frame.env else n

    return Rename().visit(ast.parse(ast.unparse(node), mode="eval").body)


def _single_return(fn: Any, arity: int) -> tuple[_Function, list[str], ast.expr] | None:
    """A @triton.jit combine function of ``arity`` parameters whose body is one ``return``:
    (the parsed function, its parameter names, the returned expression), else None."""
    if not _is_jit(fn):
        return None
    helper = _Function.of(fn)
    params = [a.arg for a in helper.tree.args.args]
    body = [s for s in helper.tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(params) != arity or len(body) != 1 or not isinstance(body[0], ast.Return):
        return None
    return helper, params, body[0].value


def _combine_kind(fn: Any) -> str | None:
    """``"sum"``, ``"max"`` or ``"min"`` when a combine function's body is ``return a + b`` or
    ``return tl.maximum(a, b)`` / ``tl.minimum(a, b)`` (either order), else None."""
    parsed = _single_return(fn, 2)
    if parsed is None:
        return None
    helper, params, value = parsed
    operands = None
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        kind, operands = "sum", [value.left, value.right]
    elif isinstance(value, ast.Call) and not value.keywords:
        target = helper.scope.get(value.func.id) if isinstance(value.func, ast.Name) else None
        if isinstance(value.func, ast.Attribute):
            base = value.func.value
            module = helper.scope.get(base.id) if isinstance(base, ast.Name) else None
            target = getattr(module, value.func.attr, None)
        kind = {"maximum": "max", "minimum": "min"}.get(triton_language_name(target) or "")
        operands = value.args
    if operands is None or kind is None:
        return None
    names = sorted(o.id for o in operands if isinstance(o, ast.Name))
    return kind if names == sorted(params) else None


# names given to the tuple of an operation's results when it is unpacked
_MULTI_NAMES = {"linear_scan": "scan", "associative_scan": "scan", "split": "halves"}


def _is_linear_recurrence(fn: Any) -> bool:
    """Whether a combine function is ``(a1, b1, a2, b2) -> (a1 * a2, b1 * a2 + b2)`` (either order of
    each product and of the sum), the composition of two steps of ``h = a * h + b``."""
    parsed = _single_return(fn, 4)
    if parsed is None:
        return False
    _, params, value = parsed
    if not isinstance(value, ast.Tuple) or len(value.elts) != 2:
        return False
    a1, b1, a2, b2 = params

    def product(e: ast.expr, x: str, y: str) -> bool:
        return (isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult) and all(isinstance(o, ast.Name)
                for o in (e.left, e.right)) and sorted((e.left.id, e.right.id)) == sorted((x, y)))

    first, second = value.elts
    if not product(first, a1, a2) or not (isinstance(second, ast.BinOp) and isinstance(second.op, ast.Add)):
        return False
    terms = [second.left, second.right]
    return any(product(t, b1, a2) and isinstance(o, ast.Name) and o.id == b2 for t, o in (terms, terms[::-1]))


def normalize_kernel(jit_fn: Any) -> Program:
    return Normalizer(_Function.of(jit_fn)).kernel()


def normalize_tile_function(jit_fn: Any) -> Program:
    return Normalizer(_Function.of(jit_fn)).tile_function()
