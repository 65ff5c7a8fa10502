"""Affine forms of integer and pointer tiles: coordinates (a lane axis, a program id or its digits, a value each
program computes from its ids, a loop's iterations, the digits of a split index) with coefficients that are
integers times scalar names."""

from __future__ import annotations

from dataclasses import dataclass

from .launch_values import Expr

Coefficient = tuple[int, tuple[str, ...]]


@dataclass(frozen=True)
class Lane:
    """The lane's index along axis ``axis`` of the tile (what ``tl.arange`` gives, spread by ``[:, None]``)."""

    axis: int

    @property
    def sort_key(self) -> tuple:
        return ("lane", self.axis)

    def __str__(self) -> str:
        return f"lane axis {self.axis}"


@dataclass(frozen=True)
class ProgramId:
    """``tl.program_id(axis)``."""

    axis: int

    @property
    def sort_key(self) -> tuple:
        return ("pid", self.axis)

    def __str__(self) -> str:
        return f"tl.program_id({self.axis})"


@dataclass(frozen=True)
class ProgramDigit:
    """A digit of a program id: ``tl.program_id(axis) // divisor`` (the quotient) or ``% divisor``."""

    axis: int
    divisor: str
    quotient: bool

    @property
    def sort_key(self) -> tuple:
        return (f"pid{'//' if self.quotient else '%'}{self.divisor}", self.axis)

    def __str__(self) -> str:
        return f"tl.program_id({self.axis}) {'//' if self.quotient else '%'} {self.divisor}"


@dataclass(frozen=True)
class ProgramValue:
    """A scalar each program computes from its ids by integer math that is no sum of coordinates: a swizzle
    (``pid_m = first + (pid % in_group) % group_size``, ``min``, ``%`` of a sum). ``value``: it over the program
    ids, the grid and the kernel's parameters, evaluated over the whole grid at launch (conditions.ProgramsApart:
    distinct programs keep distinct coordinates, none negative)."""

    name: str  # the kernel's name for it
    value: Expr

    @property
    def sort_key(self) -> tuple:
        return (f"program value:{self.name}", 0)

    @property
    def axes(self) -> set[int]:
        return self.value.program_axes()

    @property
    def loops(self) -> set[str]:
        """The grid-stride loops whose index it reads (a persistent kernel's tile: a coordinate of the loop)."""
        return {e.args[0] for e in self.value.loops()}

    def __str__(self) -> str:
        return f"`{self.name}` (from the program ids)"


@dataclass(frozen=True)
class LoopIndex:
    """The iteration of the loop over ``index`` (its index, or carried state advanced by it)."""

    index: str

    @property
    def sort_key(self) -> tuple:
        return (f"loop:{self.index}", 0)

    def __str__(self) -> str:
        return f"the loop over `{self.index}`"


@dataclass(frozen=True)
class Digit:
    """A digit of a tile of indices: ``x // divisor`` (the quotient) or ``x % divisor``, where ``x`` (the
    dividend, a form in lane and other coordinates, starting at 0) counts up from zero. Together the two
    digits stand for ``x`` itself (``n = offs // HW`` and ``hw = offs % HW`` split a flat index into an
    NCHW tensor's batch and pixel); alone, one folds lanes together."""

    dividend: Form
    divisor: str
    quotient: bool

    @property
    def sort_key(self) -> tuple:
        # the dividend's own terms, not its hash: a str's hash changes from process to process (PYTHONHASHSEED)
        return (f"digit{'//' if self.quotient else '%'}{self.divisor}",
                tuple((k.sort_key, c) for k, c in self.dividend.terms))

    @property
    def partner(self) -> Digit:
        return Digit(self.dividend, self.divisor, not self.quotient)

    def __str__(self) -> str:
        x = " + ".join(f"{_coefficient_text(c)}{k}" for k, c in self.dividend.terms)
        divisor = self.divisor if self.divisor.isidentifier() or self.divisor.isdigit() else f"({self.divisor})"
        return f"({x}) {'//' if self.quotient else '%'} {divisor}"


def coefficient_expr(c: Coefficient) -> Expr:
    """``n * s1 * s2``: an integer times scalar names."""
    n, symbols = c
    e = Expr.const(n)
    for symbol in symbols:
        e = e * Expr.name(symbol)
    return e


def moves_with(form: Form, loop: LoopIndex) -> bool:
    """Whether the form takes the loop's iterations apart: the loop's coordinate, or a program value read from its
    index (a persistent kernel's tile, ProgramsApart checks its values per iteration)."""
    return loop in form.coefficients or any(isinstance(k, ProgramValue) and loop.index in k.loops
                                            for k in form.coefficients)


def _coefficient_text(c: Coefficient) -> str:
    n, symbols = c
    factors = ([str(n)] if n != 1 or not symbols else []) + list(symbols)
    return "" if factors == ["1"] else " * ".join(factors) + " * "


Coordinate = Lane | ProgramId | ProgramDigit | ProgramValue | LoopIndex | Digit


@dataclass(frozen=True)
class Form:
    """An integer tile's value as coefficients of coordinates (lane axes, program ids and their digits,
    loop iterations); ``rank`` is the tile's. ``affine=False``: a lane index went through an operation
    that may fold lanes together."""

    terms: tuple[tuple[Coordinate, Coefficient], ...]
    rank: int
    affine: bool = True

    @property
    def coefficients(self) -> dict[Coordinate, Coefficient]:
        return dict(self.terms)


SCALAR = Form((), 0)


def form_of_terms(terms: dict, rank: int, affine: bool = True) -> Form:
    kept = {k: c for k, c in terms.items() if c[0] != 0}
    return Form(tuple(sorted(kept.items(), key=lambda kc: kc[0].sort_key)), rank, affine)


def form_program_axes(form: Form | None) -> set[int]:
    """The program axes whose ids a form keeps as coordinates (themselves, their digits, or in a digit's index)."""
    axes: set[int] = set()
    for key, _ in form.terms if form is not None else ():
        if isinstance(key, (ProgramId, ProgramDigit)):
            axes.add(key.axis)
        elif isinstance(key, ProgramValue):
            axes |= key.axes
        elif isinstance(key, Digit):
            axes |= form_program_axes(key.dividend)
    return axes


def varies(name: str, forms: dict) -> bool:
    """Whether a name's value depends on coordinates (a scalar computed from program ids by an operation
    that loses their coordinate, or loaded, counts as a scalar: a name of its own)."""
    return name in forms and (bool(forms[name].terms) or not forms[name].affine)


def lane_axes(form: Form) -> set[int]:
    """The tile axes a form's coordinates move along, through digits of digits."""
    return {k.axis for k, _ in form.terms if isinstance(k, Lane)} | {
        a for k, _ in form.terms if isinstance(k, Digit) for a in lane_axes(k.dividend)}
