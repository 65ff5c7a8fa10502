"""Conditions on a launch's arguments: what derivation could not decide, as data the launcher evaluates.

A condition is built at derivation from integer expressions (:class:`Expr`) over the
kernel's parameters, the grid and loop trip counts, and evaluated on each launch's
arguments (no generated source, nothing ``eval``-ed). It prints as it reads, for
``tritongrad show``.

- :class:`Apart`: ``sum(c_i * x_i)`` over ``0 <= x_i < extent_i`` takes each value once
  (lanes, programs and iterations of a store reach distinct elements; see lanes.py).
- :class:`AtLeast`, :class:`AtMost`: one expression is at least another, at most a number.
- :class:`Covers`: a store's addresses are exactly a tensor's elements (writes/strategies.py: an input's
  gradient may then be stored, not added, into a buffer left unfilled).
- :class:`All`: every one of several conditions.
- index_ranges.RangesApart: stores whose addresses come from loaded indices (``dst = tl.load(perm +
  row)``, ``start = tl.load(cu_seqlens + pid)``): each program's range of addresses, read off the
  index tensors the launch passes, is apart from every other program's. It reads tensor contents,
  so it runs on every launch (on the device: a strided view of the indices, a sort, one sync).

Apart, AtLeast and AtMost read only scalars and the grid: the launcher caches their verdict per
launch shape (``cacheable``); Covers (a tensor's layout) and RangesApart (its contents) are not.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.ir import Origin
from ..core.operations import OPERATIONS

UNKNOWN_TRIP = 1 << 40  # a trip count the launch cannot read: taken as huge (apart() accepts it only where harmless)

_INFIX = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//"}


class Unreadable(Exception):
    """A value the launch cannot give (a local of the kernel, a loaded trip count)."""


@dataclass(frozen=True)
class LaunchValues:
    """What a launch gives a condition: the kernel's arguments by name and the grid."""

    arguments: Mapping[str, Any]
    grid: tuple[int, ...] | None  # None: not known (at derivation)
    program: tuple[int, int] | None = None  # (axis, id): the one program an expression is evaluated for

    def program_id(self, axis: int) -> int:
        if self.program is None or self.program[0] != axis:
            raise Unreadable(f"program_id({axis})")
        return self.program[1]

    def value(self, name: str) -> Any:
        if name not in self.arguments:
            raise Unreadable(name)
        return self.arguments[name]

    def programs(self, axis: int) -> int:
        if self.grid is None:
            raise Unreadable(f"num_programs({axis})")
        return (*self.grid, 1, 1, 1)[axis]

    def numel(self, shape: tuple[str, ...]) -> int:
        """How many elements a tile of ``shape`` (its extents as written) has on this launch."""
        n = 1
        for extent in shape:
            n *= int(Expr.of_text(extent).evaluate(self))
        return n


@dataclass(frozen=True)
class Expr:
    """An integer expression: ``Expr("name", ("N",))``, ``Expr("const", (3,))``, ``Expr("grid", (0,))``,
    ``Expr("trips", (start, stop, step))``, ``Expr("min" | "abs", ...)``, or an operation kind whose
    ``on_host`` computes it (``Expr("mul", (a, b))``, ``Expr("cdiv", (a, b))``)."""

    op: str
    args: tuple = ()

    # -- building --------------------------------------------------------------------------------

    @staticmethod
    def name(id: str) -> Expr:
        return Expr("name", (id,))

    @staticmethod
    def const(value: int) -> Expr:
        return Expr("const", (value,))

    def __add__(self, other: Expr) -> Expr:
        return Expr("add", (self, other))

    def __sub__(self, other: Expr) -> Expr:
        return Expr("sub", (self, other))

    def __mul__(self, other: Expr) -> Expr:
        return Expr("mul", (self, other))

    @staticmethod
    @functools.lru_cache(maxsize=1024)  # read on every launch (tape sizes): parsed once
    def of_text(text: str) -> Expr:
        """An expression written as Python (a tile's dimension: ``BLOCK``, ``2 * BLOCK``, ``min(B, N)``)."""
        try:
            return _from_ast(ast.parse(text, mode="eval").body)
        except (SyntaxError, ValueError):
            return Expr("unknown", (text,))

    # -- reading ---------------------------------------------------------------------------------

    def evaluate(self, launch: LaunchValues) -> int:
        op, args = self.op, self.args
        if op == "const":
            return args[0]
        if op == "name":
            return launch.value(args[0])
        if op == "grid":
            return launch.programs(args[0])
        if op == "program_id":
            return launch.program_id(args[0])
        if op == "unknown":
            raise Unreadable(args[0])
        values = [a.evaluate(launch) for a in args]
        if op == "trips":
            return len(range(*values))
        if op == "min":
            return _minimum(values)
        if op == "abs":
            return abs(values[0])
        return OPERATIONS[op].on_host(*values)

    def program_axes(self) -> set[int]:
        """The axes whose program id it reads (a count that differs from program to program)."""
        if self.op == "program_id":
            return {self.args[0]}
        return set().union(*[a.program_axes() for a in self.args if isinstance(a, Expr)])

    def names(self) -> set[str]:
        if self.op == "name":
            return {self.args[0]}
        return set().union(*[a.names() for a in self.args if isinstance(a, Expr)])

    def substitute(self, replace: Callable[[str], Expr | None]) -> Expr:
        """The expression with names replaced where ``replace`` gives an expression for them."""
        if self.op == "name":
            return replace(self.args[0]) or self
        return Expr(self.op, tuple(a.substitute(replace) if isinstance(a, Expr) else a for a in self.args))

    def simplified(self) -> Expr:
        """The same value, written shorter: ``1 * stride`` is ``stride``, ``abs(1)`` is ``1``."""
        args = tuple(a.simplified() if isinstance(a, Expr) else a for a in self.args)
        if self.op == "mul":
            factors = [a for a in args if a != Expr.const(1)]
            if len(factors) < 2:
                return factors[0] if factors else Expr.const(1)
            return Expr("mul", tuple(factors))
        if self.op == "abs" and args[0].op == "const":
            return Expr.const(abs(args[0].args[0]))
        return Expr(self.op, args)

    def __str__(self) -> str:
        return self.simplified()._text()

    def _text(self) -> str:
        op, args = self.op, self.args
        if op in ("name", "unknown"):
            return args[0]
        if op == "const":
            return str(args[0])
        if op == "grid":
            return f"num_programs({args[0]})"
        if op == "program_id":
            return f"program_id({args[0]})"
        if op == "copy":
            return args[0]._text()
        if op == "neg":
            return f"-{_operand(args[0])}"
        if op in _INFIX:
            return f" {_INFIX[op]} ".join(_operand(a) for a in args)
        if op == "trips":
            return f"len(range({', '.join(a._text() for a in args)}))"
        return f"{op}({', '.join(a._text() for a in args)})"


def _minimum(values: list) -> Any:
    """``min`` of integers, or elementwise of integers and tensors (one value per program)."""
    tensors = [v for v in values if hasattr(v, "clamp")]
    if not tensors:
        return min(values)
    out = tensors[0]
    for v in values:
        out = out.clamp(max=v) if not hasattr(v, "clamp") else out.minimum(v)
    return out


def _operand(e: Expr) -> str:
    return f"({e._text()})" if e.op in _INFIX else e._text()


def _from_ast(node: ast.expr) -> Expr:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return Expr.const(node.value)
    if isinstance(node, ast.Name):
        return Expr.name(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return Expr("neg", (_from_ast(node.operand),))
    if isinstance(node, ast.BinOp):
        kind = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "floordiv"}.get(type(node.op))
        if kind is not None:
            return Expr(kind, (_from_ast(node.left), _from_ast(node.right)))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "abs"):
        return Expr(node.func.id, tuple(_from_ast(a) for a in node.args))
    raise ValueError(ast.unparse(node))


@dataclass(frozen=True)
class Apart:
    """``sum(c_i * x_i)`` over ``0 <= x_i < extent_i`` takes each value once (see :func:`apart`).

    ``coordinates``: ``(c_i, extent_i)``; ``bounds``: from a mask, ``(members, limit, mask coefficients)``:
    over the lanes that store, the members' part of the sum stays within ``limit``."""

    coordinates: tuple[tuple[Expr, Expr], ...]
    bounds: tuple[tuple[tuple[int, ...], Expr, tuple[Expr, ...]], ...] = ()
    names_of: tuple[str, ...] = ()  # each coordinate's name, for printing

    def holds(self, launch: LaunchValues) -> bool:
        coordinates = [(c.evaluate(launch), e.evaluate(launch)) for c, e in self.coordinates]
        bounds = [(members, limit.evaluate(launch), [c.evaluate(launch) for c in coefficients])
                  for members, limit, coefficients in self.bounds]
        return apart(coordinates, bounds)

    cacheable = True  # reads scalars and the grid only

    def violation(self, launch: LaunchValues) -> str | None:
        return None if self.holds(launch) else ""

    def names(self) -> set[str]:
        exprs = [e for pair in self.coordinates for e in pair]
        exprs += [e for _, limit, coefficients in self.bounds for e in (limit, *coefficients)]
        return set().union(*[e.names() for e in exprs])

    def substitute(self, replace: Callable[[str], Expr | None]) -> Apart:
        return Apart(tuple((c.substitute(replace), e.substitute(replace)) for c, e in self.coordinates),
                     tuple((m, limit.substitute(replace), tuple(c.substitute(replace) for c in coefficients))
                           for m, limit, coefficients in self.bounds), self.names_of)

    def __str__(self) -> str:
        names = self.names_of or tuple(f"x{i}" for i in range(len(self.coordinates)))
        terms = ", ".join(f"{name} (stride {c}, {e} values)" for name, (c, e) in zip(names, self.coordinates,
                                                                                      strict=True))
        masks = "; ".join(f"the mask keeps {' + '.join(names[i] for i in members)} within {limit}"
                          for members, limit, _ in self.bounds)
        return f"distinct elements for {terms}" + (f"; {masks}" if masks else "")


@dataclass(frozen=True)
class AtLeast:
    """``larger >= smaller``."""

    larger: Expr
    smaller: Expr

    cacheable = True

    def holds(self, launch: LaunchValues) -> bool:
        return self.larger.evaluate(launch) >= self.smaller.evaluate(launch)

    def violation(self, launch: LaunchValues) -> str | None:
        return None if self.holds(launch) else ""

    def names(self) -> set[str]:
        return self.larger.names() | self.smaller.names()

    def substitute(self, replace: Callable[[str], Expr | None]) -> AtLeast:
        return AtLeast(self.larger.substitute(replace), self.smaller.substitute(replace))

    def __str__(self) -> str:
        return f"{self.larger} >= {self.smaller}"


@dataclass(frozen=True)
class AtMost:
    """``value <= limit``."""

    value: Expr
    limit: int

    cacheable = True  # reads scalars and the grid only

    def holds(self, launch: LaunchValues) -> bool:
        return self.value.evaluate(launch) <= self.limit

    def violation(self, launch: LaunchValues) -> str | None:
        return None if self.holds(launch) else ""

    def names(self) -> set[str]:
        return self.value.names()

    def substitute(self, replace: Callable[[str], Expr | None]) -> AtMost:
        return AtMost(self.value.substitute(replace), self.limit)

    def __str__(self) -> str:
        return f"{self.value} <= {self.limit}"


@dataclass(frozen=True)
class Covers:
    """The addresses ``sum(c_i * x_i)`` (``0 <= x_i < extent_i``, within the mask's bounds) are exactly the
    elements of the tensor passed as ``tensor`` (offsets from its first element, in its sizes and strides)."""

    coordinates: tuple[tuple[Expr, Expr], ...]
    bounds: tuple[tuple[tuple[int, ...], Expr, tuple[Expr, ...]], ...]
    tensor: str

    cacheable = False  # reads a tensor's layout

    def violation(self, launch: LaunchValues) -> str | None:
        return None if self.holds(launch) else ""

    def holds(self, launch: LaunchValues) -> bool:
        t = launch.value(self.tensor)
        coordinates = [(c.evaluate(launch), e.evaluate(launch)) for c, e in self.coordinates]
        if any(m.evaluate(launch) <= 0 for _, _, mask in self.bounds for m in mask):
            return False  # a bound in address units needs the mask's coefficients positive
        bounds = [(members, limit.evaluate(launch)) for members, limit, _ in self.bounds]
        return covers(coordinates, bounds, list(zip(t.stride(), t.shape, strict=True)))

    def names(self) -> set[str]:
        exprs = [e for pair in self.coordinates for e in pair] + [limit for _, limit, _ in self.bounds]
        return {self.tensor}.union(*[e.names() for e in exprs])

    def substitute(self, replace: Callable[[str], Expr | None]) -> Covers:
        return Covers(tuple((c.substitute(replace), e.substitute(replace)) for c, e in self.coordinates),
                      tuple((m, limit.substitute(replace), cs) for m, limit, cs in self.bounds), self.tensor)

    def __str__(self) -> str:
        return f"the addresses cover every element of `{self.tensor}`"


@dataclass(frozen=True)
class All:
    """Every one of ``conditions`` (none: always)."""

    conditions: tuple = ()

    @property
    def cacheable(self) -> bool:
        return all(c.cacheable for c in self.conditions)

    def holds(self, launch: LaunchValues) -> bool:
        return all(c.holds(launch) for c in self.conditions)

    def violation(self, launch: LaunchValues) -> str | None:
        for c in self.conditions:
            why = c.violation(launch)
            if why is not None:
                return why
        return None

    def names(self) -> set[str]:
        return set().union(*[c.names() for c in self.conditions])

    def substitute(self, replace: Callable[[str], Expr | None]) -> All:
        return All(tuple(c.substitute(replace) for c in self.conditions))

    def __str__(self) -> str:
        return " and ".join(f"({c})" for c in self.conditions) if self.conditions else "always"




class Condition(Protocol):
    """What a launch check is made of (the classes here; index_ranges.RangesApart)."""

    cacheable: bool  # reads scalars and the grid only: its verdict cached per launch shape

    def holds(self, launch: LaunchValues) -> bool: ...
    def violation(self, launch: LaunchValues) -> str | None: ...  # None: it holds; else what is wrong ("": no more)
    def names(self) -> set[str]: ...
    def substitute(self, replace: Callable[[str], Expr | None]) -> Condition: ...


@dataclass(frozen=True)
class LaunchCheck:
    """A condition on the launch's arguments under which the derived kernel is right; a launch where it is
    false is refused with ``construct`` and ``hint``. Where it cannot be evaluated (a value the launch does
    not give), ``fallback`` is refused if set, else the launch passes."""

    condition: Condition
    construct: str
    hint: str
    where: Origin | None
    fallback: str | None = None

    def failure(self, launch: LaunchValues) -> str | None:
        """What to refuse this launch for (None: it may run)."""
        try:
            why = self.condition.violation(launch)
        except Exception:  # a value it cannot read: what could be said without the launch
            return self.fallback
        return None if why is None else f"{self.construct}: {why}" if why else self.construct

    def __str__(self) -> str:
        at = f"line {self.where.line}: " if self.where is not None else ""
        return f"{at}{self.condition}"


def covers(coordinates: list[tuple[int, int]], bounds: list[tuple[tuple[int, ...], int]],
           dims: list[tuple[int, int]]) -> bool:
    """Whether ``sum(c_i * x_i)`` over ``0 <= x_i < extent_i``, where each bound's members' part stays within its
    limit, is exactly ``{sum(stride_j * y_j) : 0 <= y_j < size_j}`` for ``dims`` = ``(stride_j, size_j)`` (a sufficient
    test: both sides are brought to a canonical mixed-radix form and compared).

    A bound's members must chain as the digits of one number (each coefficient the last one times its extent),
    so that the bound cuts that number's range: ``pid * BLOCK + lane < n`` is the range ``[0, n)``."""
    if any(c <= 0 for c, e in coordinates if e > 1):
        return False
    coordinates = list(coordinates)
    bounded: set[int] = set()
    for members, limit in bounds:
        if limit < 0:  # no lane is left
            coordinates.append((1, 0))
            continue
        if bounded & set(members):
            return False
        bounded |= set(members)
        chain = sorted((i for i in members if coordinates[i][1] > 1), key=lambda i: coordinates[i][0])
        if not chain:
            continue
        c0, extent = coordinates[chain[0]][0], coordinates[chain[0]][1]
        for i in chain[1:]:
            if coordinates[i][0] != c0 * extent:
                return False
            extent *= coordinates[i][1]
        for i in chain:
            coordinates[i] = (0, 1)
        coordinates.append((c0, max(0, min(extent, limit // c0 + 1))))
    nothing, empty = any(e == 0 for _, e in coordinates), any(n == 0 for _, n in dims)
    if nothing or empty:
        return nothing and empty
    return _canonical(coordinates) == _canonical(dims)


def _canonical(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(step, count)`` pairs in order of step, those of count 1 dropped, each pair whose step continues the
    previous one's span merged into it."""
    out: list[tuple[int, int]] = []
    for step, count in sorted((s, n) for s, n in dims if n > 1):
        if out and out[-1][0] * out[-1][1] == step:
            out[-1] = (out[-1][0], out[-1][1] * count)
        else:
            out.append((step, count))
    return out


def decided_now(condition: Condition) -> bool | None:
    """A condition's value where it reads no launch value (literal sizes), else None."""
    try:
        return condition.holds(LaunchValues({}, None))
    except Exception:  # a value only the launch gives
        return None


def apart(coordinates: list[tuple[int, int]], bounds: list[tuple[tuple[int, ...], int, list[int]]]) -> bool:
    """Whether ``sum(c_i * x_i)`` over ``0 <= x_i < extent_i`` takes each value once (a sufficient test).

    ``coordinates``: ``(c_i, extent_i)``; ``bounds``: ``(members, limit, coefficients)`` from the mask, saying
    that over the lanes that store, the members' part of the sum stays within ``limit`` (valid when the
    mask's own coefficients are positive). Taken in order of ``|c_i|``, each coordinate must step over
    everything the smaller ones can span."""
    coordinates = list(coordinates)
    for members, limit, mask_coefficients in bounds:  # each term of a bounded sum of positive terms is bounded
        if all(c > 0 for c in mask_coefficients):
            for j in members:
                c, e = coordinates[j]
                if c != 0:
                    coordinates[j] = (c, max(0, min(e, limit // abs(c) + 1)))
    order = sorted((i for i, (_, e) in enumerate(coordinates) if e > 1), key=lambda i: abs(coordinates[i][0]))
    below = [i for i, (_, e) in enumerate(coordinates) if e <= 1]  # one value each: they span nothing
    for i in order:
        grouped: set[int] = set()
        span = 0
        for members, limit, mask_coefficients in bounds:
            if set(members) <= set(below) and not grouped & set(members) and all(c > 0 for c in mask_coefficients):
                span += min(sum(abs(coordinates[j][0]) * (coordinates[j][1] - 1) for j in members), limit)
                grouped |= set(members)
        span += sum(abs(coordinates[j][0]) * (coordinates[j][1] - 1) for j in below if j not in grouped)
        if abs(coordinates[i][0]) <= span:
            return False
        below.append(i)
    return True
