"""The normalized body: its types, the accessors every pass reads it with, and the walkers.

A flat statement is ``name = op(atoms)`` or ``op(atoms)``, tagged by the frontend with
a :class:`Tag` (``stmt.tg``): what it computes (an :class:`Op`), and where it comes
from in the user's code. Control flow stays structured:

- ``ast.If``: ``.test`` is an atom; each branch is a block ending with the copies
  that give a variable assigned in the branch its value after the ``if``
  (``tg.merges`` names those merge variables; each is assigned in both branches).
- ``ast.For``: ``.iter`` is ``range(...)``, ``tl.range(...)`` or ``tl.static_range(...)``
  on atoms; ``tg.carried`` lists the loop-carried variables (:class:`Carried`).

Every name is assigned once (SSA), except merge variables and loop-carried
variables, which are assigned by copies where control flow joins: a carried
variable before the loop (its initial value) and at the end of the body (its value
for the next iteration).
"""

from __future__ import annotations

import ast
import copy
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import NotDifferentiableError
from .operations import operation_of


@dataclass(frozen=True)
class Origin:
    """Where a statement came from in the user's code."""

    file: str
    line: int
    text: str
    function: str = ""  # the helper it is in, when inlined
    calls: tuple[Origin, ...] = ()  # inlined: the calls it was reached through, the kernel's first (augment.py)


@dataclass
class Op:
    """What one flat statement computes: ``kind(*args, **kwargs)``.

    ``kind`` is the operation's canonical name (``"add"``, ``"exp"``, ``"load"``,
    ``"subscript"``, ``"call"`` for an unknown function; see operations.py); args are
    atoms (names, constants, literal tuples, metadata such as ``x.shape``).
    """

    kind: str
    args: list[ast.expr]
    kwargs: dict[str, ast.expr] = field(default_factory=dict)
    func: Any = None

    def __deepcopy__(self, memo: dict) -> Op:
        return self  # never changed after the frontend; copies of a statement share it


@dataclass(frozen=True)
class Carried:
    """A loop-carried variable: its value at the start of each iteration, and after the loop."""

    name: str
    init: ast.expr  # atom assigned to it before the loop
    next: ast.expr  # atom assigned to it at the end of the body
    source: str = ""  # the user's name for it


@dataclass
class Tag:
    """What the frontend knows about a statement of the normalized body (``stmt.tg``)."""

    op: Op
    origin: Origin  # the kernel's line (for comments); for an inlined helper, the call's
    where: Origin  # the construct itself, in the helper's file if it is in one (for errors)
    merges: list[str] = field(default_factory=list)  # if: the variables it merges
    carried: list[Carried] = field(default_factory=list)  # for: its loop-carried variables
    static: bool = False  # if: a constexpr condition; for: tl.static_range
    join: bool = False  # a copy where control flow joins (a merge or a carried variable's next value)
    note: str = ""  # for: what a pass before analysis made of it (online.py), said over its reversal

    def __deepcopy__(self, memo: dict) -> Tag:
        return self  # copies of a statement share its tag


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
    constexprs: set[str] = field(default_factory=set)  # names known at compile time
    specialized: bool = False  # derived for given values of constexpr parameters (specialize.py)

    def param_names(self) -> list[str]:
        return [p.arg for p in self.params]


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
    return NotDifferentiableError(construct, file=origin.file, line=origin.line, hint=hint, source_line=origin.text)


# -- reading a statement ------------------------------------------------------------------------------

def op_of(stmt: ast.stmt) -> Op:
    return stmt.tg.op


def target_of(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def targets_of(stmt: ast.stmt) -> list[str]:
    """The name a flat statement assigns (``x = ...``, ``x += ...``), if any."""
    if isinstance(stmt, ast.AugAssign):
        return [stmt.target.id]
    t = target_of(stmt)
    return [t] if t is not None else []


def assign(name: str, value: ast.expr) -> ast.Assign:
    """``name = value``."""
    return ast.Assign(targets=[ast.Name(name, ast.Store())], value=value)


def tagged(stmt: ast.stmt, op: Op, like: ast.stmt) -> ast.stmt:
    """``stmt``, made by a pass in place of ``like``: tagged with ``op`` and ``like``'s lines, at its location."""
    stmt.tg = Tag(op, like.tg.origin, like.tg.where)
    return ast.fix_missing_locations(ast.copy_location(stmt, like))


def construct_origin(stmt: ast.stmt) -> Origin:
    """Where the statement's construct itself is (``stmt.tg.where``: in an inlined helper's file, not the call's
    line that ``stmt.tg.origin`` comments with), for errors."""
    return stmt.tg.where


def arguments(stmt: ast.stmt) -> dict[str, ast.expr]:
    """The statement's arguments by parameter name, for operations with a known signature."""
    op = op_of(stmt)
    signature = operation_of(op).signature
    if signature is None:
        return {}
    try:
        return signature.bind(op.args, op.kwargs)
    except TypeError as e:
        raise refuse(construct_origin(stmt), f"the call to `{op.kind}`: {e}",
                     "check the arguments against Triton's signature") from e


SCALAR_BUILTINS = ("min", "max", "abs")  # Python's, on scalars: the frontend keeps such a call as an atom


def names_in(atom: ast.expr) -> list[str]:
    """Names whose values an argument uses (not metadata such as ``x.shape``)."""
    if isinstance(atom, ast.Name):
        return [atom.id]
    if isinstance(atom, (ast.Tuple, ast.List)):
        return [n for e in atom.elts for n in names_in(e)]
    if isinstance(atom, ast.Call) and isinstance(atom.func, ast.Name) and atom.func.id in SCALAR_BUILTINS:
        return [n for e in atom.args for n in names_in(e)]  # `min(a, b)` of scalars, kept inline
    return []


def value_args(stmt: ast.stmt) -> list[str]:
    """Names whose values the statement's operation reads."""
    op = op_of(stmt)
    return [n for a in [*op.args, *op.kwargs.values()] for n in names_in(a)]


def address_names(stmt: ast.stmt) -> list[str]:
    """Names a memory operation's addresses are computed from: the pointer (or descriptor) and offsets."""
    b = arguments(stmt)
    return names_in(b["pointer"]) + names_in(b.get("offsets", ast.Constant(None)))


def stored_value(stmt: ast.stmt) -> ast.expr:
    """The value a store or atomic writes."""
    b = arguments(stmt)
    return b["value"] if "value" in b else b["val"]


def name_node(id: str, ctx: ast.expr_context | None = None) -> ast.Name:
    return ast.Name(id, ctx or ast.Load())


def call_statement(function: str, *args: ast.expr, **keywords: ast.expr) -> ast.Expr:
    """``function(*args, **keywords)`` as a statement (copies of the arguments)."""
    return ast.Expr(ast.Call(ast.parse(function, mode="eval").body, [copy.deepcopy(a) for a in args],
                             [ast.keyword(k, copy.deepcopy(v)) for k, v in keywords.items()]))


def tl_call(e: ast.AST, function: str) -> ast.Call | None:
    """``e`` if it is a call ``tl.<function>(...)``, else None."""
    if (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == function
            and isinstance(e.func.value, ast.Name) and e.func.value.id == "tl"):
        return e
    return None


def is_none(atom: ast.expr) -> bool:
    return isinstance(atom, ast.Constant) and atom.value is None


# -- walking a body -----------------------------------------------------------------------------------

def is_structured(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.If, ast.For))


def child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    if isinstance(stmt, ast.If):
        return [stmt.body, stmt.orelse]
    if isinstance(stmt, ast.For):
        return [stmt.body]
    return []


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every flat statement, in program order, those inside branches and loops included."""
    for stmt in body:
        if is_structured(stmt):
            for block in child_blocks(stmt):
                yield from statements(block)
        else:
            yield stmt


def every_statement(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, in program order: loops and branches (their headers) and what they hold."""
    for stmt in body:
        yield stmt
        for block in (getattr(stmt, "body", []), getattr(stmt, "orelse", [])):
            yield from every_statement(block)


def block_positions(body: list[ast.stmt]) -> dict[int, tuple[list, int]]:
    """id(statement) -> (the block holding it, its index there), for every flat statement."""
    found = {}
    for i, stmt in enumerate(body):
        if is_structured(stmt):
            for block in child_blocks(stmt):
                found.update(block_positions(block))
        else:
            found[id(stmt)] = (body, i)
    return found


def canonical_atom(atom: ast.expr, defs: dict, renames: dict[str, str] | None = None) -> str:
    """An atom written out through its single definitions (so two temporaries computing one address compare
    equal); names with several definitions (loop-carried, merged) or none (parameters, loop indices) stay names,
    renamed as ``renames`` says (one loop's index read as another's). Written out as one tree, so the text keeps
    the precedence of what it expands: ``a * (b + c)`` is not ``a * b + c``."""
    if not isinstance(atom, ast.Name):
        return ast.dump(atom)
    return ast.unparse(expanded(atom, defs, renames))


def expanded(atom: ast.Name, defs: dict, renames: dict[str, str] | None = None) -> ast.expr:
    """The tree ``canonical_atom`` writes out: its names are those that stay names (renamed)."""
    return _expanded(atom, defs, renames or {}, 0)


def _expanded(atom: ast.Name, defs: dict, renames: dict[str, str], depth: int) -> ast.expr:
    found = defs.get(atom.id, [])
    if len(found) != 1 or depth > 64 or target_of(found[0]) != atom.id:
        return ast.Name(renames.get(atom.id, atom.id), ast.Load())

    class Expand(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            return _expanded(node, defs, renames, depth + 1)

    return Expand().visit(copy.deepcopy(found[0].value))


def literal_value(atom: ast.expr | None, defs: dict | None = None) -> float | None:
    """A numeric literal's value (``float("inf")``, ``-1.5`` included; with ``defs``, through the names the
    frontend gave such literals: ``neg_x = -float("inf")``), else None."""
    if isinstance(atom, ast.Name) and defs is not None:
        found = defs.get(atom.id, ())
        if len(found) == 1 and isinstance(found[0], ast.Assign) and operation_of(op_of(found[0])).sign:
            value = literal_value(op_of(found[0]).args[0], defs)  # `-x`, `+x`, `x`
            return -value if value is not None and operation_of(op_of(found[0])).sign < 0 else value
        return None
    if isinstance(atom, ast.UnaryOp) and isinstance(atom.op, (ast.USub, ast.UAdd)):
        value = literal_value(atom.operand, defs)
        return -value if value is not None and isinstance(atom.op, ast.USub) else value
    if isinstance(atom, ast.Constant) and isinstance(atom.value, (int, float)) and not isinstance(atom.value, bool):
        return float(atom.value)
    if (isinstance(atom, ast.Call) and isinstance(atom.func, ast.Name) and atom.func.id == "float"
            and len(atom.args) == 1 and isinstance(atom.args[0], ast.Constant) and isinstance(atom.args[0].value, str)):
        try:
            return float(atom.args[0].value)
        except ValueError:
            return None
    return None


def structured(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every ``if`` and ``for`` node, outer before inner."""
    for stmt in body:
        if is_structured(stmt):
            yield stmt
            for block in child_blocks(stmt):
                yield from structured(block)


def loops(body: list[ast.stmt]) -> list[ast.For]:
    """Every ``for`` node, outer before inner."""
    return [n for n in structured(body) if isinstance(n, ast.For)]


def range_bounds(node: ast.For) -> tuple[ast.expr, ast.expr, ast.expr]:
    """A loop's start, stop and step, as ``range`` and ``tl.range`` read their arguments (positional or
    ``arg1=``, ``arg2=``, ``step=``)."""
    args = list(node.iter.args)
    named = {k.arg: k.value for k in node.iter.keywords}
    args += [named[k] for k in ("arg1", "arg2") if k in named]
    step = args[2] if len(args) > 2 else named.get("step", ast.Constant(1))
    if len(args) == 1:
        return ast.Constant(0), args[0], step
    return args[0], args[1], step


def header(stmt: ast.stmt) -> list[ast.expr]:
    """The expressions a structured node evaluates itself: an if's test, a loop's range."""
    if isinstance(stmt, ast.If):
        return [stmt.test]
    if isinstance(stmt, ast.For):
        return [stmt.iter]
    return []


def reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def needed_by(body: list[ast.stmt], names: set[str]) -> list[ast.stmt]:
    """The statements of ``body`` that ``names`` are computed from, in order."""
    needed, found = set(names), []
    for s in reversed(body):
        assigned = {n.id for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        if assigned & needed:
            found.append(s)
            needed |= reads(s)
    return found[::-1]


def definitions(body: list[ast.stmt]) -> dict[str, list[ast.stmt]]:
    """Name -> the statements assigning it (a loop's index: the loop)."""
    defs: dict[str, list[ast.stmt]] = {}
    for s in statements(body):
        t = target_of(s)
        if t is not None:
            defs.setdefault(t, []).append(s)
    for node in loops(body):
        defs.setdefault(node.target.id, []).append(node)
    return defs


def computed_from(names: Iterable[str], defs: dict[str, list[ast.stmt]]) -> set[str]:
    """``names`` and every name they are computed from through ``defs`` (a loop's index: through its range)."""
    found: set[str] = set()
    work = list(names)
    while work:
        n = work.pop()
        if n not in found:
            found.add(n)
            for d in defs.get(n, []):
                work += reads(d.iter if isinstance(d, ast.For) else d.value)
    return found


def free_names(block: list[ast.stmt]) -> set[str]:
    """Names a block reads before (or without) assigning them: what must exist when it starts."""
    free: set[str] = set()

    def visit(stmts: list[ast.stmt], bound: set[str]) -> set[str]:
        for s in stmts:
            if is_structured(s):
                for e in header(s):
                    free.update(reads(e) - bound)
                inner = bound | ({s.target.id} if isinstance(s, ast.For) else set())
                after = [visit(b, set(inner)) for b in child_blocks(s)]
                if isinstance(s, ast.If):  # assigned in both branches: defined after the if
                    bound |= set.intersection(*after)
                continue
            free.update(reads(s) - bound)
            bound |= {n.id for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        return bound

    visit(block, set())
    return free


def copy_structured(node: ast.stmt, **fields: Any) -> ast.stmt:
    """A new if/for node like ``node`` (its tag kept) with the given fields."""
    new = type(node)(**{f: getattr(node, f, None) for f in node._fields})
    for k, v in fields.items():
        setattr(new, k, v)
    new.tg = node.tg
    return ast.copy_location(new, node)


def axis_of(op: Op) -> int | None:
    """The grid axis a ``tl.program_id`` / ``tl.num_programs`` operation names (None: not a literal)."""
    axis = op.args[0] if op.args else op.kwargs.get("axis")
    return axis.value if isinstance(axis, ast.Constant) and isinstance(axis.value, int) else None


def program_axis(stmt: ast.stmt) -> int | None:
    """The axis of a ``tl.program_id`` statement (-1: an unknown axis, or ``tg.program_index()``: all of them)."""
    tag = getattr(stmt, "tg", None)
    if tag is None or not isinstance(stmt, ast.Assign):
        return None
    if tag.op.kind == "program_index":
        return -1
    if operation_of(tag.op).coordinate != "program":
        return None
    axis = axis_of(tag.op)
    return -1 if axis is None else axis
