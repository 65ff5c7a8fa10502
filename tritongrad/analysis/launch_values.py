"""Integer expressions a launch evaluates (``Expr``: over the kernel's parameters, the grid and the program ids) and
what a launch gives them (``LaunchValues``: its arguments and grid; every program of the grid at once for a
value a swizzle computes)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.operations import OPERATIONS

UNKNOWN_TRIP = 1 << 40  # a trip count the launch cannot read: taken as huge (apart() accepts it only where harmless)
_INFIX = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%",
          "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


class Unreadable(Exception):
    """A value the launch cannot give (a local of the kernel, a loaded trip count)."""


@dataclass(frozen=True)
class LaunchValues:
    """What a launch gives a condition: the kernel's arguments by name and the grid."""

    arguments: Mapping[str, Any]
    grid: tuple[int, ...] | None  # None: not known (at derivation)
    program: tuple[int, int] | None = None  # (axis, id): the one program an expression is evaluated for
    every_program: tuple | None = None  # per axis, a tensor of every program's id along it (over_the_grid)
    every_index: Mapping[str, Any] | None = None  # a grid-stride loop's index, per (program, iteration) pair

    def program_id(self, axis: int) -> Any:
        if self.every_program is not None:
            return self.every_program[axis]
        if self.program is None or self.program[0] != axis:
            raise Unreadable(f"program_id({axis})")
        return self.program[1]

    def over_the_grid(self) -> LaunchValues:
        """These values with an expression's program ids standing for every program of the grid at once: it
        evaluates to a tensor, one value per program (at most MAX_PROGRAMS of them)."""
        return LaunchValues(self.arguments, self.grid, every_program=_every_program(self.grid))

    def over_the_iterations(self, loop: Expr) -> LaunchValues:
        """These values over every (program, iteration) pair of a grid-stride loop (``loop``: its ``index``
        expression), each program's ids repeated once per iteration it runs, and the loop's index for each."""
        import torch

        name, start, stop, step = loop.args
        grid = self.over_the_grid()
        first = start.evaluate(grid)
        first = first if isinstance(first, torch.Tensor) else torch.full_like(grid.every_program[0], int(first))
        end, stride = int(stop.evaluate(self)), int(step.evaluate(self))
        if stride < 1:
            raise Unreadable(f"a loop over `{name}` whose step is {stride}")
        runs = max(0, -(-(end - int(first.min())) // stride))
        if len(first) * runs > MAX_PROGRAMS:
            raise Unreadable(f"more than {MAX_PROGRAMS} iterations of the loop over `{name}`")
        index = first[:, None] + stride * torch.arange(runs, dtype=torch.int64)[None, :]
        taken = index < end
        ids = tuple(i[:, None].expand_as(index)[taken] for i in grid.every_program)
        return LaunchValues(self.arguments, self.grid, every_program=ids, every_index={name: index[taken]})

    def over_the_launch(self, e: Expr) -> LaunchValues:
        """Over every program, or every (program, iteration) pair where ``e`` reads a grid-stride loop's index."""
        loops = e.loops()
        if len(loops) > 1:
            raise Unreadable("the indices of two grid-stride loops")
        return self.over_the_iterations(loops[0]) if loops else self.over_the_grid()

    def index(self, name: str) -> Any:
        if self.every_index is None or name not in self.every_index:
            raise Unreadable(f"the index of the loop over `{name}`")
        return self.every_index[name]

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


MAX_PROGRAMS = 1 << 17  # the largest grid whose programs a check evaluates one by one (~1 ms on the host)


@functools.lru_cache(maxsize=64)
def _every_program(grid: tuple[int, ...] | None) -> tuple:
    import torch

    if grid is None:
        raise Unreadable("the grid")
    sizes = (*grid, 1, 1, 1)[:3]
    if sizes[0] * sizes[1] * sizes[2] > MAX_PROGRAMS:
        raise Unreadable(f"a grid of more than {MAX_PROGRAMS} programs")
    ids = torch.meshgrid(*(torch.arange(n, dtype=torch.int64) for n in sizes), indexing="ij")
    return tuple(i.reshape(-1) for i in ids)


@dataclass(frozen=True)
class Expr:
    """An integer expression: ``Expr("name", ("N",))``, ``Expr("const", (3,))``, ``Expr("grid", (0,))``,
    ``Expr("trips", (start, stop, step))``, ``Expr("min" | "max" | "abs", ...)``, ``Expr("most", (e,))`` (one more than
    the largest value ``e`` takes over the grid's programs: a program value's extent), ``Expr("index", (name,
    start, stop, step))`` (a grid-stride loop's index: ``start`` over the program ids; evaluated over every
    iteration a program runs), or an operation kind whose ``on_host`` computes it (``Expr("mul", (a, b))``,
    ``Expr("cdiv", (a, b))``)."""

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
        if op == "most":
            values = args[0].evaluate(launch.over_the_launch(args[0]))
            if hasattr(values, "max"):
                return int(values.max()) + 1 if values.numel() else 0
            return values + 1
        if op == "index":
            return launch.index(args[0])
        values = [a.evaluate(launch) for a in args]
        if op == "trips":
            return _trips(*values)
        if op == "min":
            return _minimum(values)
        if op == "max":
            return -_minimum([-v for v in values])
        if op == "abs":
            return abs(values[0])
        return OPERATIONS[op].on_host(*values)

    def program_axes(self) -> set[int]:
        """The axes whose program id it reads (a count that differs from program to program)."""
        if self.op == "program_id":
            return {self.args[0]}
        return set().union(*[a.program_axes() for a in self.args if isinstance(a, Expr)])

    def loops(self) -> list[Expr]:
        """The grid-stride loops' ``index`` expressions it reads."""
        if self.op == "index":
            return [self]
        return list(dict.fromkeys(loop for a in self.args if isinstance(a, Expr) for loop in a.loops()))

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
        if op == "not_":
            return f"not {_operand(args[0])}"
        if op in _INFIX:
            return f" {_INFIX[op]} ".join(_operand(a) for a in args)
        if op == "trips":
            return f"len(range({', '.join(a._text() for a in args)}))"
        if op == "most":
            return f"1 + max over the programs of {_operand(args[0])}"
        if op == "index":
            return args[0]
        return f"{op}({', '.join(a._text() for a in args)})"


def _trips(start: Any, stop: Any, step: Any = 1) -> Any:
    """``len(range(start, stop, step))``, or elementwise where a bound is a tensor (one value per program: a range
    over a sequence whose bounds each program loads, read by index_ranges.py)."""
    if not any(hasattr(v, "clamp") for v in (start, stop, step)):
        return len(range(start, stop, step))
    if hasattr(step, "clamp") or step == 0:
        raise Unreadable("a loop's step read from the indices")
    return (-((start - stop) // step)).clamp(min=0)


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
        kind = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "floordiv", ast.Mod: "mod"}.get(
            type(node.op))
        if kind is not None:
            return Expr(kind, (_from_ast(node.left), _from_ast(node.right)))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "abs"):
        return Expr(node.func.id, tuple(_from_ast(a) for a in node.args))
    raise ValueError(ast.unparse(node))
