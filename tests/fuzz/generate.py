"""Random Triton kernels (straight-line code, loops, branches) with plain-PyTorch mirrors, for differential testing.

``generate(draw)`` builds a :class:`Program` from a stream of integer choices:

- a *frame*: one or two tile axes (``n``; or ``m`` and ``k``), each with a power-of-two
  block, a ragged size below it, and maybe a grid axis (``pid * BLOCK + tl.arange``);
- *inputs*: tiles over the axes, loaded plain or transposed, shifted (stencils), through
  named, stepwise, ``(p + 1) ... - 1``, ``tl.where(mask, ptrs, base)`` or broadcast
  pointers, and possibly several times; vectors every program loads; scalars (one, or one
  per program); gather tables (or rows of a tile input) read through an index pointer
  whose indices repeat; runtime float and integer arguments; ``tl.constexpr`` globals; stacked
  inputs (a slab of the tile's shape per loop iteration) and wide ones (rows of ``L`` columns);
- *nodes*: one kernel statement each (with helper lines), with its mirror statement
  (PyTorch on the valid elements of the current program's tile), its shape ``kind`` (a
  tuple of axis names and ``"1"``), an interval holding every lane's value, masked lanes
  included, and the axes along which masked lanes hold exactly 0 (loads with
  ``other=0.0``: sums and ``tl.dot`` may then skip the ``tl.where``). The intervals decide
  the adapters that keep values in a domain (``x * x + 0.5`` before ``log``, an exact
  power-of-two scaling before ``exp``), so every lane stays finite and no pole is hit.
  Operations: ``+ - * /``, exp, exp2, log, log2, sqrt, rsqrt, sin, cos, sigmoid, erf, abs,
  maximum, minimum, clamp, fma, ``tl.where`` with comparisons, casts (float32 round trips
  and float32 regions: sin, sigmoid, exp, a product; int), ``tl.sum/max/min`` along an axis or all (``keep_dims``,
  positional and negative axes, method spelling), softmax and logsumexp the tutorial way
  (``-inf`` padding), outer products, trans / ``.T`` / permute, expand_dims / ``[:, None]``,
  reshape, broadcast_to, ``tl.dot`` (with accumulator) on 16-wide or larger tiles, ``tl.cumsum`` / ``tl.cumprod``
  (forward or reversed) and ``tl.associative_scan`` combining by ``a + b`` or as a linear recurrence ``h = a h + b``;
  ``@triton.jit`` helpers (nested, returning pairs, with parameters named like kernel
  variables), reassignments and augmented assignments, names like adjoints (``d_v0``);
- *loops and branches*, each one node whose lines hold the whole statement (the mirror runs
  the same Python ``for``/``if`` per program). ``for`` over ``range``, ``tl.range`` (``step=``,
  ``num_stages``), ``tl.static_range``; trip counts and steps literal, runtime or constexpr, or
  loaded per program, or starting or stopping at ``pid % 2``; from 1, step 2, reversed, none
  visited. ``op_loop`` walks slabs ``z[t]`` of a stacked input (an address from ``t``, a
  moving pointer or a moving offset), ``op_columns`` column blocks of a wide one (LayerNorm-style, ragged last
  block). Carried state: none (each iteration stored at its own output slab or columns, by
  the index, a counter or a moving pointer, or atomically added into one place); linear
  (``h += f``, ``h -= f``, ``tl.dot(x, b, h)``, an ``if`` on the index or a loaded scalar
  choosing how to add, or adding on one side only, a ``(BLOCK, BC)`` tile summed after the
  loop); nonlinear (``h * a + f`` with ``|a| <= 1.25``, ``sigmoid(h) * f``, ``sin(h) * f``,
  ``sin(h + f)``, a running maximum, overwritten, an ``if`` on the state's sum, the state read
  back through ``sigmoid(sum(h))``, online logsumexp and attention-style softmax averages);
  states wider than what is added (its adjoint unbroadcast every iteration); an inner loop
  (summing or folding nonlinearly); the index in the arithmetic; every iteration's value or
  state stored. ``op_branch``: ``if``/``elif``/``else`` on a loaded or computed scalar or the
  program id, or on a constexpr flag or mode; each branch assigns the value (through loads,
  a loop, a store of it in every branch); or an ``if`` alone replaces a value assigned before
  it; sometimes all of it in a ``@triton.jit`` helper. Intervals are iterated over the trip
  count, so recurrences stay bounded;
- *early returns* (``op_early_return``): ``if <test>: return`` in the kernel on a loaded, computed or
  program-id test or a constexpr flag (outputs start at 0, the mirror ``continue`` s to the next
  program); in helpers, ``op_branch`` sometimes spells its ``if``/``elif``/``else`` with returns;
- *several stores to one output* (``op_multistore``): parts side by side (``y + j * slab + offs``,
  the slab literal, runtime or constexpr) or interleaved (``y + offs * P + j``); or overlapping parts
  (``j * (slab - 1)``), which must be refused;
- *stores at loaded addresses* (``op_scatter``): a value's block (or slot) moved to where an index
  loaded per program says (a permutation: ``(rn + (dst - pid) * BN)``; or a start offset per
  program), the output holding whole blocks and zero-filled; or two programs given one
  destination, which must be refused at launch;
- *stores at split lane indices* (``op_lane_split``): a value stored at an address that splits each lane's flat
  index (programs' offsets included) into two or three coordinates with ``//`` and ``%`` (chained, ``hw = f %
  (H * W); h = hw // W``, or the quotients chained, ``w = f % W; q = f // W; h = q % H``, or each at once, ``h =
  (f // W) % H`` as an im2col convolution's output pixel, or ``h = (f % (H * W)) // W``), extents literal, runtime
  or constexpr, multiplying to the flat range or a little less (``f < total`` masking the rest), stored in a layout
  that permutes the coordinates (an im2col convolution storing NCHW); or with the outermost stride one short, or
  the last digit taken ``% (W - 1)`` (the digits no longer determine the flat index), two lanes colliding, which
  must be refused;
- *a tile stored in halves* (``op_halves``, the persistent matmul tutorial's EPILOGUE_SUBTILE): a value split along
  its last axis (or its first) by ``tl.split`` of a reshape and permute, the halves stored at ``h = pid * B +
  tl.arange(0, B // 2)`` and at ``h + SHIFT`` (or a name for it), each masked by ``< SIZE`` at its own indices; the
  shift half the block (literal, runtime, constexpr or ``B // 2``), or, to be refused, into the first half or onto
  it (``0 <= SHIFT < B // 2``) or onto the next tile's first half (``SHIFT = B``);
- *rereads* (``op_rereads``, reverse/rereads.py): a chunked layer norm's passes, 2 to 4 sibling loops over one row
  block's column blocks (``range(0, L, BC)``, ``tl.range``, ``tl.static_range`` or the block numbers counted once;
  one index name for all or one each), each loading a wide input at the first loop's address under its mask (its
  gradient written once; ``other`` may differ), with linear row statistics (means of x, x * x, sin, exp, tanh,
  sigmoid, x centred on or divided by an earlier statistic, x times a weight's or a second input's block, in a tile or
  a row state), the last loop storing a nonlinear function of its block and the statistics (a norm, a sigmoid, a
  division, a tanh), times a weight over the columns, plus a second input's block; the weight and second input read
  by every loop or some; statistics stored per row, a middle loop's block stored. Two draws in three merge; the rest
  are near misses (``REREAD_NEAR``, written apart, still correct): the next column (``cols + 1``, masked by ``cols +
  1 < L``), another mask, a range spelled another way or ``tl.cdiv`` inline in each header, a running product or
  maximum, a factor carried between iterations, a running sum, the input also read outside the loops. Wide inputs and
  weights read at the launch's strides half the time (always in strided programs: expanded, transposed, sliced views,
  a weight bound to a row or column of x); a campaign focused on it draws it in most kernels, and persistent rows
  often;
- *in-place updates read back* (``op_in_place``, analysis/in_place.py): a wide input x updated in place by the first
  of 2 to 4 such loops (``x + r``, ``x * r``, ``sin(x) + r``, ``2 x``), a statistic of what it stored, and later loops
  reading back what the same lane stored (a chunked fused add + RMSNorm); x is an output too (``INPLACE``: the
  check binds it to a copy, compares its new values with the mirror's and its gradient with the old values'; the
  backward takes ``x_ptr_stored``). To be refused: a read-back of the next column, a store to x after the read-back
  (in its loop or a later one), a read-back loop over another range (blocks of ``BC // 2``), or rows that every
  program along another grid axis updates alike;
- *stores* into one or two outputs: disjoint across programs, or ``tl.atomic_add`` into
  shared elements; of the value's shape or of one it broadcasts to (plus an output for each
  loop or branch value nothing else uses, mostly);
- *launches* other than a program per tile (:class:`Launch`, drawn for a few percent of the kernels with a grid):
  a persistent kernel, fewer programs launched than tiles, the whole body in a grid-stride loop over one launch
  axis's tiles (``for pid_0 in range(tl.program_id(0), G, tl.num_programs(0))``, ``tl.range`` with or without
  ``num_stages=2``, the start or step named, or the step an argument ``NPROG`` the host sets to the grid; ``G``
  literal, runtime, constexpr or ``tl.cdiv(N, BN)``; no early returns then); and/or a swizzle computing the tile
  coordinates from the program id: ``(pid * A) % G`` with A coprime with G, ``G - 1 - pid``, or for both grid
  axes of a 2-D frame on one flattened launch axis, row-major, column-major or grouped ordering (the matmul
  tutorial's, with builtin ``min`` or ``tl.minimum``). Expected refusals: a step one below the grid
  (``tl.num_programs(0) - 1``, or ``NPROG`` one less than the grid), ``pid // 2`` on a doubled grid, a multiplier
  sharing a factor with G: two programs reach one tile. The mirror is unchanged (it visits every tile); stores'
  slots and per-program loads index by the tile (``Program.nprog``). The persistent matmul tutorial's walk
  (``Gen.grouped_persistent``, family ``grouped_persistent``): ``NUM_SMS`` programs stepping through the flattened
  tile index of a 2-D frame (``tl.range(start_pid, num_tiles, NUM_SMS, flatten=True)``, the step a constexpr, a
  runtime argument or ``tl.num_programs(0)``), each tile found by grouped ordering along either axis, mostly in a
  helper returning the pair, and found again before the last stores from the epilogue's own counter (``tile_id_c
  += NUM_SMS``); the tutorial's ``min(NUM_SMS, tiles)`` programs, one, or more than the tiles. To be refused: more
  programs than the step, the last group's column divided by ``GROUP`` instead of its height (colliding only where
  that group is short and there are two tile columns: else the same map, a valid kernel), an epilogue counter one
  step short of the loop's (where a program runs two iterations).

Inputs are uniform in [-2, 2] or multiples of 0.5 there (so maxima, ``maximum`` and
comparisons tie). ``draw`` is a :class:`Draw`: :class:`HypothesisDraw` (``programs()``, a
hypothesis strategy that shrinks), :class:`RandomDraw` (seeded, for campaigns; it records
its choices) and :class:`ReplayDraw` (replays recorded choices; ``shrink`` minimizes them).

``render(program)`` writes a module (kernel, helpers, mirror, inputs, launch constants);
``check(program)`` imports it from a file and returns an :class:`Outcome`: forward
against the mirror (NaN-poisoned outputs), then ``backward_launch`` against torch autograd
on the mirror with random upstream gradients, float64, relative tolerance 1e-9 (1e-3 with
float32 casts). A kernel whose stores collide by construction (``EXPECT`` in its module) must be
refused, at derivation or at launch: that is its pass ("refused", the detail saying "colliding by
construction"); accepting it is a mismatch. A kernel passing also runs its op under jvp, and, for the shares ``DOUBLE``
and ``RESHAPE`` (drawn by seed), differentiated twice (variations.py) and through a reshaping host function
(reshapes.py). ``regression_source`` turns a module into a regression test (of the first-order backward).

``focus`` (``Gen``, ``random_program``, ``replay``; campaigns' ``--families``) makes families of ``FOCUS`` frequent.

Extending: add a family to ``FAMILIES`` and a ``Gen.op_*`` method producing nodes; a node's
template may span several lines (``pre_tl``/``pre_th``, indented as needed, their names built
on ``{self}``), as loops and branches do; a store a node's own lines make is a ``Store`` with
``inside`` set (``Gen.loop_output``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import itertools
import math
import os
import random
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    from .reshapes import check_reshaped
    from .variations import check_double_backward, check_jvp, form_of, narrow_states, narrowed, pack, unpack
except ImportError:  # run as a script (python tests/fuzz/generate.py SEED)
    from reshapes import check_reshaped
    from variations import check_double_backward, check_jvp, form_of, narrow_states, narrowed, pack, unpack

CAP = 1000.0  # every lane's magnitude stays below this (a node past it is scaled down)
SMALL = 4.0  # exp / exp2 arguments
POSITIVE = 0.25  # log, sqrt, rsqrt and denominators stay at or above this
INPUT_BOUND = 2.0  # inputs lie in [-2, 2]; `other` values too

# ------------------------------------------------------------------------------------------
# drawing


class Draw:
    """A source of integer choices; everything else is built on ``int``."""

    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def pick(self, options: Sequence[Any]) -> Any:
        """One of ``options``, shrinking toward the first."""
        return options[self.int(0, len(options) - 1)]

    def recent(self, options: Sequence[Any]) -> Any:
        """One of ``options``, shrinking toward the last (the most recent node)."""
        return options[len(options) - 1 - self.int(0, len(options) - 1)]


class HypothesisDraw(Draw):
    def __init__(self, draw: Callable[..., Any]):
        from hypothesis import strategies as st

        self._draw, self._st = draw, st

    def int(self, lo, hi):
        return lo if lo == hi else self._draw(self._st.integers(lo, hi))


class RandomDraw(Draw):
    def __init__(self, rng: random.Random):
        self.rng, self.choices = rng, []

    def int(self, lo, hi):
        v = self.rng.randint(lo, hi)
        self.choices.append(v - lo)
        return v


class ReplayDraw(Draw):
    """Replays recorded choices, clamped into range; past their end, the smallest."""

    def __init__(self, choices: Sequence[int]):
        self.choices, self.i = list(choices), 0

    def int(self, lo, hi):
        v = self.choices[self.i] if self.i < len(self.choices) else 0
        self.i += 1
        return lo + min(max(v, 0), hi - lo)


# ------------------------------------------------------------------------------------------
# the program


@dataclass
class Dim:
    name: str  # "n", or "m" and "k"
    block: int
    size: int
    axis: int | None  # grid axis tiling it; None: one block covers it

    @property
    def programs(self) -> int:
        return -(-self.size // self.block) if self.axis is not None else 1

    BLOCK = property(lambda self: "B" + self.name.upper())
    SIZE = property(lambda self: self.name.upper())
    idx = property(lambda self: "r" + self.name)  # kernel: indices of the tile along this axis
    mask = property(lambda self: "m" + self.name)  # kernel: those < SIZE
    lo = property(lambda self: self.name + "0")  # mirror: this program's valid slice lo:hi
    hi = property(lambda self: self.name + "1")
    valid = property(lambda self: "s" + self.name)  # mirror: hi - lo


@dataclass
class Input:
    name: str  # kernel parameter f"{name}_ptr", mirror argument `name`
    role: str  # "tile" | "scalar" | "table" | "index" | "stack" | "wide" | "count" (a loop's trip count per program)
    #          | "perm" (a destination per program along a grid axis: a permutation, or with a collision)
    #          | "cols" (a vector over a wide input's columns: a weight every row reads)
    dims: tuple[str, ...] = ()  # tile, stack: its axes; table: its second axis (if any); index, wide: its axis
    dist: str = "uniform"  # "uniform" in [-2, 2] | "ties" (multiples of 0.5 in [-2, 2]) | "index"
    #          | "perm" (a permutation of vocab, times `steps`) | "collide:A:B:D" (program B's entry is A's plus D)
    vocab: int = 0  # table rows = index range (count: the counts' range)
    per_program: bool = False  # scalar: one per program
    steps: int = 0  # stack: slabs (each of the tile's shape) before the axes; wide: columns after its axis; cols: its
    #          length
    strided: bool = False  # wide, cols: read at the strides the launch passes (`c0_s0`, `c0_s1`), as tiles are in
    #          strided programs (bindings.py may bind views)

    @property
    def ptr(self) -> str:
        return f"{self.name}_ptr"


@dataclass
class Node:
    kind: tuple[str, ...]
    lo: float
    hi: float
    tl: str  # kernel expression; `{0}`.. operands, `{self}` this node's name
    th: str  # mirror expression (PyTorch, on the valid elements)
    args: tuple[int, ...] = ()
    label: str = ""
    pure: bool = False  # mentions only its operands: may move into a @triton.jit helper
    helper: int = 0  # 0 inline; 1 in a helper; 2 in a helper called by a helper; 3 in a helper returning a pair
    early: bool = False  # a branch in a helper spelled with early returns (`if c: return a` ... `return b`)
    aug: str = ""  # `a op= b` spelling when reassigned
    reassign: bool = False  # reuse the first operand's name when it dies here
    inline: bool = False  # written into its only user's expression instead of a statement of its own
    pre_tl: tuple[str, ...] = ()
    pre_th: tuple[str, ...] = ()
    zero: tuple[bool, ...] = ()  # per axis: the value is exactly 0 wherever that axis's index is invalid
    tied: bool = False  # lanes may hold equal values (from inputs on a grid of multiples of 0.5, or indices)
    fragile: bool = False  # tied, and computed in a way torch may round differently lane by lane


@dataclass
class Store:
    node: int
    name: str  # output parameter f"{name}_ptr"
    kind: tuple[str, ...] = ()  # the pointer's kind: the value's, or one it broadcasts to
    atomic: bool = False  # tl.atomic_add: programs that do not tile an axis of `kind` add into one element
    inside: bool = False  # stored inside a loop, by the node's own lines
    lead: int = 0  # slabs before the layout: one per iteration (or per part of several stores)
    tail: int = 0  # columns after the layout (a loop over column blocks; parts interleaved)
    zeroed: bool = False  # starts at 0 (the host zero-fills it): programs may leave elements unwritten
    shape: tuple[int, ...] = ()  # the output's shape when not the layout's (a scatter's padded blocks)
    in_place: bool = False  # into the input `name` itself (updated in place: an output too, ``INPLACE``)


@dataclass
class Range:
    """A loop's iteration space."""

    tl: str  # the kernel's iterator
    th: str  # the mirror's
    visits: list[int]  # the indices visited, in order (dynamic: the ones it may visit)
    start: str  # spelled, and the step: for pointers moving along
    step: int
    dynamic: bool = False  # the indices depend on loaded data or on the program id
    pre_tl: tuple[str, ...] = ()  # lines before the loop
    pre_th: tuple[str, ...] = ()


@dataclass
class Launch:
    """Programs that do not map one to one onto the tiles of the grid axes: a persistent kernel's
    grid-stride loop over the tiles of one launch axis (fewer programs launched than tiles), and/or a swizzle
    computing the tile coordinates from the program id (a permutation; ``flat``: the two tile axes of a 2-D
    frame on one launch axis, ordered row-major, column-major or in groups). Its lines are written when drawn;
    the mirror is unchanged (it visits every tile)."""

    axis: int  # the launch axis (flat: 0)
    flat: bool  # the frame's two grid axes on one launch axis
    counts: dict[int, str]  # grid axis -> its tile count spelled in the kernel (what tl.num_programs would be)
    head: list[str]  # lines before the loop, after the other grid axes' program ids
    loop: str  # the grid-stride loop's header ("for ... :") or ""
    body: list[str]  # the swizzle: lines computing pid_<axis> (each iteration's, in a loop)
    programs: int  # programs launched along the launch axis
    collide: bool = False  # two programs (or iterations) reach one tile: the backward must refuse
    label: str = ""
    helpers: list[str] = field(default_factory=list)  # @triton.jit functions the lines call (a tile's coordinates)
    epilogue: list[str] = field(default_factory=list)  # lines before the last stores finding the tile again (then
    # its indices and masks are computed again from the pid_<axis> they assign)


@dataclass
class Program:
    dims: list[Dim]
    inputs: list[Input] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    seed: int = 0
    lowp: bool = False  # a float32 round trip: torch rounds that gradient to float32
    scalars: dict[str, float] = field(default_factory=dict)  # runtime float parameters, and their values
    constexprs: dict[str, float] = field(default_factory=dict)  # module-level tl.constexpr globals
    ints: dict[str, int] = field(default_factory=dict)  # runtime integer parameters (trip counts, widths)
    meta: dict[str, int | bool] = field(default_factory=dict)  # constexpr parameters beyond the blocks
    names: str = "v"  # "v": v0, v1, ...; "shadowy": odd nodes are named d_v<i-1>, like adjoints
    returns: bool = False  # an early return: programs may leave outputs unwritten (all start at 0)
    expect: str = ""  # stores that collide (by construction): the backward must refuse, naming this
    stopped: bool = False  # a constexpr `if F: return` with F true: stores after it never run
    helper_params: str = "a"  # "a": a0, a1, ...; "clash": names the kernel and the derivative rules use
    strided: bool = False  # tile inputs are loaded at strides the launch passes (`x0_s0`, `x0_s1`): bindings.py
    # may then bind them to expanded, transposed, sliced or interleaved views
    contiguous: set[str] = field(default_factory=set)  # inputs also addressed as contiguous (a table's rows)
    reread: list[str] = field(default_factory=list)  # inputs the rereads family reads in sibling loops (bindings.py
    # prefers bindings of them)
    launch: Launch | None = None  # persistent loops and swizzles over the grid (None: one program per tile)

    def __repr__(self) -> str:  # hypothesis prints this; the source comes with the failure
        return f"Program({len(self.dims)}-D, {len(self.nodes)} nodes, seed={self.seed})"

    @property
    def tol(self) -> float:
        return 1e-3 if self.lowp else 1e-9  # torch rounds float32 regions' gradients (sums cancel)

    @property
    def grid_dims(self) -> list[Dim]:
        return sorted((d for d in self.dims if d.axis is not None), key=lambda d: d.axis)

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(d.programs for d in self.grid_dims) or (1,)

    @property
    def launch_grid(self) -> tuple[int, ...]:
        """The grid launched: ``grid`` (the tiles) unless a Launch maps programs onto tiles otherwise."""
        if self.launch is None:
            return self.grid
        if self.launch.flat:
            return (self.launch.programs,)
        return tuple(self.launch.programs if g.axis == self.launch.axis else g.programs for g in self.grid_dims)

    def nprog(self, axis: int) -> str:
        """Grid axis ``axis``'s tile count, spelled in the kernel: ``tl.num_programs`` unless a Launch changes it."""
        if self.launch is not None and axis in self.launch.counts:
            return self.launch.counts[axis]
        return f"tl.num_programs({axis})"

    def dim(self, name: str) -> Dim:
        return next(d for d in self.dims if d.name == name)

    def labels(self) -> list[str]:
        return [n.label for n in self.nodes] + ([self.launch.label] if self.launch else [])


# ------------------------------------------------------------------------------------------
# kinds (shapes): tuples of axis names and "1", right-aligned broadcasting


def real(kind) -> list[str]:
    return [d for d in kind if d != "1"]


def broadcast(a, b):
    if len(a) < len(b):
        a, b = b, a
    b = ("1",) * (len(a) - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b, strict=True):
        if x == y or y == "1":
            out.append(x)
        elif x == "1":
            out.append(y)
        else:
            return None
    return tuple(out)


def align(zero, kind, to) -> tuple[bool, ...]:
    """``zero`` of a value of ``kind`` after broadcasting to ``to`` (a stretched unit axis is not zero)."""
    pad = len(to) - len(kind)
    return tuple(p >= pad and kind[p - pad] == to[p] and kind[p - pad] != "1" and bool(zero[p - pad])
                 for p in range(len(to)))


def storable(kind) -> bool:
    r = real(kind)
    return (not kind or bool(r)) and len(set(r)) == len(r)


def mask_for(p: Program, kind, positions=None) -> str | None:
    """Kernel mask of the valid lanes of a value of ``kind`` (along ``positions`` only)."""
    positions = range(len(kind)) if positions is None else positions
    parts = [(pos, kind[pos]) for pos in positions if kind[pos] != "1"]
    if not parts:
        return None
    if tuple(kind) == ("m", "k") and len(parts) == 2:
        return "mask"
    return " & ".join(p.dim(d).mask + sub(len(kind), pos) for pos, d in parts)


def sub(rank: int, pos: int) -> str:
    return "" if rank == 1 else ("[:, None]" if pos == 0 else "[None, :]")


def fmt(c: float) -> str:
    return repr(float(c))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x > -700 else 0.0


def hull(*vals: float) -> tuple[float, float]:
    return min(vals), max(vals)


def mul_iv(a, b):
    return hull(a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])


def square_iv(lo, hi):
    return (0.0 if lo <= 0 <= hi else min(lo * lo, hi * hi)), max(lo * lo, hi * hi)


def abs_iv(lo, hi):
    return (0.0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))


# unary families: label, kernel, mirror, domain ("any" | "small" | "pos"), interval
UNARY = [
    ("exp", "tl.exp({0})", "torch.exp({0})", "small", lambda lo, hi: (math.exp(lo), math.exp(hi))),
    ("sin", "tl.sin({0})", "torch.sin({0})", "any", lambda lo, hi: (-1.0, 1.0)),
    ("log", "tl.log({0})", "torch.log({0})", "pos", lambda lo, hi: (math.log(lo), math.log(hi))),
    ("sqrt", "tl.sqrt({0})", "torch.sqrt({0})", "pos", lambda lo, hi: (math.sqrt(lo), math.sqrt(hi))),
    ("sigmoid", "tl.sigmoid({0})", "torch.sigmoid({0})", "any", lambda lo, hi: (sigmoid(lo), sigmoid(hi))),
    ("cos", "tl.cos({0})", "torch.cos({0})", "any", lambda lo, hi: (-1.0, 1.0)),
    ("abs", "tl.abs({0})", "torch.abs({0})", "any", abs_iv),
    ("erf", "tl.erf({0})", "torch.erf({0})", "any", lambda lo, hi: (math.erf(lo), math.erf(hi))),
    ("exp2", "tl.exp2({0})", "torch.exp2({0})", "small", lambda lo, hi: (2.0 ** lo, 2.0 ** hi)),
    ("log2", "tl.log2({0})", "torch.log2({0})", "pos", lambda lo, hi: (math.log2(lo), math.log2(hi))),
    ("rsqrt", "tl.rsqrt({0})", "torch.rsqrt({0})", "pos", lambda lo, hi: (1 / math.sqrt(hi), 1 / math.sqrt(lo))),
    ("neg", "-{0}", "-{0}", "any", lambda lo, hi: (-hi, -lo)),
    ("square", "{0} * {0}", "{0} * {0}", "any", square_iv),
    ("exp_method", "{0}.exp()", "{0}.exp()", "small", lambda lo, hi: (math.exp(lo), math.exp(hi))),
    ("relu_where", "tl.where({0} > 0.0, {0}, 0.0)", "torch.where({0} > 0.0, {0}, 0.0)", "any",
     lambda lo, hi: (max(lo, 0.0), max(hi, 0.0))),
    ("leaky_where", "tl.where({0} > 0.0, {0}, 0.01 * {0})", "torch.where({0} > 0.0, {0}, 0.01 * {0})", "any",
     lambda lo, hi: (min(lo, 0.01 * lo), max(hi, 0.01 * hi))),
]
CONSTANTS = [2.0, 0.5, -1.5, 3.0, 0.0, -0.5]
# constant families: label, kernel, mirror, domain of the operand, interval(lo, hi, c)
CONST_OPS = [
    ("mul_c", "{0} * {c}", "{0} * {c}", "any", lambda lo, hi, c: hull(lo * c, hi * c)),
    ("add_c", "{0} + {c}", "{0} + {c}", "any", lambda lo, hi, c: (lo + c, hi + c)),
    ("rsub_c", "{c} - {0}", "{c} - {0}", "any", lambda lo, hi, c: (c - hi, c - lo)),
    ("div_c", "{0} / {c}", "{0} / {c}", "any", lambda lo, hi, c: hull(lo / c, hi / c)),
    ("rdiv_c", "{c} / {0}", "{c} / {0}", "pos", lambda lo, hi, c: hull(c / lo, c / hi)),
    ("rmul_c", "{c} * {0}", "{c} * {0}", "any", lambda lo, hi, c: hull(lo * c, hi * c)),
    ("maximum_c", "tl.maximum({0}, {c})", "torch.maximum({0}, {0}.new_tensor({c}))", "any",
     lambda lo, hi, c: (max(lo, c), max(hi, c))),
    ("minimum_c", "tl.minimum({0}, {c})", "torch.minimum({0}, {0}.new_tensor({c}))", "any",
     lambda lo, hi, c: (min(lo, c), min(hi, c))),
    ("clamp", "tl.clamp({0}, {c}, {c2})", "torch.clamp({0}, {c}, {c2})", "any",
     lambda lo, hi, c: (min(max(lo, c), c + 1.0), min(max(hi, c), c + 1.0))),
]
# binary families: label, kernel, mirror, aug operator, domain of the second operand
BINARY = [
    ("add", "{0} + {1}", "{0} + {1}", "+", "any"),
    ("mul", "{0} * {1}", "{0} * {1}", "*", "any"),
    ("sub", "{0} - {1}", "{0} - {1}", "-", "any"),
    ("div", "{0} / {1}", "{0} / {1}", "/", "pos"),
    ("maximum", "tl.maximum({0}, {1})", "torch.maximum({0}, {1})", "", "any"),
    ("minimum", "tl.minimum({0}, {1})", "torch.minimum({0}, {1})", "", "any"),
]
CASTS = [  # label, kernel, mirror, computes in float32, interval
    ("to_f64", "{0}.to(tl.float64)", "{0}", False, lambda lo, hi: (lo, hi)),
    ("f32_round_trip", "{0}.to(tl.float32).to(tl.float64)", "{0}.float().double()", True, lambda lo, hi: (lo, hi)),
    ("to_int", "{0}.to(tl.int32).to(tl.float64)", "{0}.to(torch.int32).to(torch.float64)", False,
     lambda lo, hi: (min(lo, 0.0), max(hi, 0.0))),
    ("cast_f64", "tl.cast({0}, tl.float64)", "{0}", False, lambda lo, hi: (lo, hi)),
    ("f32_sin", "tl.sin({0}.to(tl.float32)).to(tl.float64)", "torch.sin({0}.float()).double()", True,
     lambda lo, hi: (-1.0, 1.0)),
    ("f32_mul", "({0}.to(tl.float32) * 1.5).to(tl.float64)", "({0}.float() * 1.5).double()", True,
     lambda lo, hi: (1.5 * lo, 1.5 * hi)),
    ("f32_sigmoid", "tl.sigmoid(tl.cast({0}, tl.float32)).to(tl.float64)", "torch.sigmoid({0}.float()).double()",
     True, lambda lo, hi: (sigmoid(lo), sigmoid(hi))),
    # a float32 exp (derived kernels compute it in base two where only arithmetic reads it: exponentials.py);
    # its argument scaled by 2^-8, exactly, to stay within exp's range from any lane below CAP
    ("f32_exp", "tl.exp({0}.to(tl.float32) * 0.00390625).to(tl.float64)",
     "torch.exp({0}.float() * 0.00390625).double()", True, lambda lo, hi: (math.exp(lo / 256), math.exp(hi / 256))),
]
HELPER_CLASH = ["mask", "g", "out", "rm"]  # helper parameters named like kernel variables and rule operands
COMPARE = [">", "<", ">=", "<="]
ZERO_AT_ZERO = {"sin", "abs", "erf", "neg", "square", "relu_where", "leaky_where"}  # f(0) == 0
# Results torch and the interpreter (numpy) may round differently, and differently lane by lane
# (torch's vectorized loops and their scalar tails): exp2(-0.5) is ...475 in one lane, ...476 in
# another. Ties through these are not ties in the mirror, so tie-sensitive operations (below)
# are not applied to tied values that went through them.
INEXACT = {"exp", "exp2", "log", "log2", "sin", "cos", "sigmoid", "erf", "rsqrt", "exp_method", "f32_sin",
           "f32_sigmoid", "f32_exp", "fma", "dot", "dot_acc", "dot_bare", "dot_acc_bare", "softmax", "logsumexp",
           "cumsum", "cumsum_reverse", "cumprod", "cumprod_reverse", "scan_sum", "scan_sum_reverse", "recurrence",
           "recurrence_reverse"}
TIE_SENSITIVE = {"abs", "relu_where", "leaky_where", "maximum_c", "minimum_c", "clamp", "maximum", "minimum",
                 "to_int"}
OTHERS = [0.0, 1.0, -1.5]
# the rereads family's near misses (Gen.op_rereads): loads reverse/rereads.py must write apart, or not merge at all
REREAD_NEAR = ("shift", "cut", "respelled", "cdiv", "nonlinear", "carried", "running", "outside")

# Loops and branches. Per-iteration functions of a loaded value: label, kernel, mirror, interval, f(0) == 0
STEP_FNS = [
    ("id", "{0}", "{0}", lambda lo, hi: (lo, hi), True),
    ("sin", "tl.sin({0})", "torch.sin({0})", lambda lo, hi: (-1.0, 1.0), True),
    ("square", "{0} * {0}", "{0} * {0}", square_iv, True),
    ("exp_half", "tl.exp({0} * 0.5)", "torch.exp({0} * 0.5)", lambda lo, hi: (math.exp(lo / 2), math.exp(hi / 2)),
     False),
    ("sigmoid", "tl.sigmoid({0})", "torch.sigmoid({0})", lambda lo, hi: (sigmoid(lo), sigmoid(hi)), False),
]
LINEAR = {"add", "sub", "branch"}  # carried updates that add to the state (the others use it nonlinearly)

# operation families, by weight; shrinking moves toward the front
FAMILIES = (["binary"] * 5 + ["unary"] * 4 + ["load"] * 3 + ["const"] * 3 + ["reduce"] * 3 + ["shape"] * 2
            + ["where", "fma", "cast", "dot", "dot", "outer", "gather", "scalar", "iota", "softmax", "scan", "scan",
               "join", "loop", "loop", "columns", "branch", "early_return", "multistore", "scatter", "softmax_out",
               "lane_split", "halves"])
# families drawn only in campaigns focused on them (their kernels cost the interpreter several plain kernels' time: the
# default run's unfocused draws stay as they were; tests/fuzz/test_fuzz.py draws a few focused kernels of them)
FOCUSED_ONLY = ["rereads", "in_place"]
# families a campaign may make frequent (Gen's focus): launches (persistent, swizzle, grouped_persistent) or nodes
FOCUS = ("persistent", "swizzle", "lane_split", "grouped_persistent", "halves", "rereads", "in_place")
# the share of scans spelled tl.associative_scan with a combine function (a cumprod's becoming a linear recurrence),
# chosen by the kernel's seed, not drawn: the kernels without one are the kernels they were
SCAN_COMBINED = 0.5
MAX_OPS = 12
MAX_CONTROL = 2  # loops and branches per kernel (each costs the interpreter several plain nodes' time)
CONTROL = ("loop", "columns", "branch", "rereads", "in_place")
CONTROL_LABELS = ("loop_", "cols_", "branch_", "rereads_", "in_place_")

# Constructs with an open bug, each pinned by a regression test (name -> test file), which the
# generator steers around when given `avoid=KNOWN_BUGS` (the CI run; campaigns with
# --avoid-known) so that new bugs still show: check `"<name>" in self.avoid` where the construct
# is drawn. None open now: the fuzzer's findings so far are fixed (tests/fuzz/regressions).
KNOWN_BUGS: dict[str, str] = {}


class Gen:
    def __init__(self, draw: Draw, avoid: Sequence[str] = (), strided: bool = False, focus: Sequence[str] = ()):
        self.d = draw
        self.avoid = frozenset(avoid)
        self.focus = frozenset(focus)
        unknown = self.focus - set(FOCUS)
        assert not unknown, f"unknown families {sorted(unknown)} (known: {', '.join(FOCUS)})"
        self.families = (FAMILIES + [f for f in FOCUSED_ONLY if f in self.focus]
                         + [f for f in ("lane_split", "halves", "rereads", "in_place") if f in self.focus] * 8
                         + ["rereads"] * 8 * ("rereads" in self.focus))  # (most kernels of a campaign on it)
        self.p = Program(dims=[], strided=strided)
        self.frame()

    # -- frame and inputs ------------------------------------------------------------------

    def frame(self) -> None:
        d = self.d
        # persistent loops and swizzles: rare, unless focused on
        # (the rereads family's sibling loops inside a grid-stride loop over the rows: a persistent layer norm)
        persistent = d.pick([False, True, True] if "persistent" in self.focus else [False] * 3 + [True]
                            if "rereads" in self.focus else [False] * 11 + [True])
        swizzle = d.pick([False] * 11 + [True] if "swizzle" not in self.focus else [False, True, True])
        # the persistent matmul tutorial's walk (grouped ordering of a grid-stride loop's tile index): 2-D, both
        # axes on the grid
        grouped = d.pick([False] * 15 + [True] if "grouped_persistent" not in self.focus else [False, True, True])
        persistent, swizzle = (False, False) if grouped else (persistent, swizzle)
        dims = []
        if grouped or d.pick([False, True]):  # 2-D: rows m, columns k
            specs = [("m", [8, 16, 4, 2]), ("k", [16, 8, 4, 32])]
        else:
            specs = [("n", [16, 8, 4, 32])]
        axis = 0
        for name, blocks in specs:
            block = d.pick(blocks)
            # 0: one block covers the axis, no program id (more tiles for a persistent loop or a swizzle)
            programs = d.pick([3, 4, 2, 1, 5] if grouped else [2, 3, 2, 1, 0] if not (persistent or swizzle)
                              else [3, 4, 2, 1, 0])
            full = block * max(programs, 1)
            lo = full - block + 1
            size = d.pick(list(range(full - 1, lo - 1, -1)) + [full]) if full > 1 else 1
            dims.append(Dim(name, block, size, axis if programs else None))
            axis += bool(programs)
        self.p.dims = dims
        if self.p.grid_dims and (persistent or swizzle):
            self.p.launch = self.launch(persistent, swizzle)
        if grouped:
            self.p.launch = self.grouped_persistent()

    def tiles(self, g: Dim) -> str:
        """Grid axis ``g``'s tile count spelled: a literal, a runtime or constexpr argument, or tl.cdiv."""
        if self.d.pick([False, False, True]):
            return f"tl.cdiv({g.SIZE}, {g.BLOCK})"
        return self.count(g.programs)[0]

    def launch(self, persistent: bool, swizzle: bool) -> Launch:
        """A Launch: a grid-stride loop over one launch axis's tiles (``for pid_0 in range(tl.program_id(0), G,
        tl.num_programs(0))``, ``tl.range`` with ``num_stages``, or the step an argument the host sets to the grid),
        and/or a swizzle: ``(pid * A) % G`` (A coprime with G), ``G - 1 - pid``; for two grid axes on one launch
        axis, row-major, column-major or grouped ordering (Triton's matmul tutorial, builtin ``min`` or
        ``tl.minimum``). Sometimes two programs reach one tile, which the backward must refuse: a step below the
        grid (``tl.num_programs(0) - 1``, an argument one less than the grid), ``pid // 2`` on a doubled grid, a
        multiplier sharing a factor with G."""
        d = self.d
        gd = self.p.grid_dims
        flat = swizzle and len(gd) == 2 and d.pick([False, True])
        axes = gd if flat else [d.pick(gd)]
        axis = axes[0].axis
        counts: dict[int, str] = {}
        head: list[str] = []
        for g in axes:
            spelled = self.tiles(g)
            if flat or d.pick([False, True]):  # named, as the tutorials do
                head.append(f"num_pid_{g.name} = {spelled}")
                spelled = f"num_pid_{g.name}"
            counts[g.axis] = spelled
        tiles = math.prod(g.programs for g in axes)
        order = ""
        if swizzle:
            order = d.pick(["rows", "columns", "grouped", "grouped"] if flat else ["mul", "reverse", "mul"])
        collisions = ["step"] * persistent + ["half"] * swizzle + ["shared"] * (swizzle and order == "mul"
                                                                                and tiles >= 2)
        collide = d.pick([False] * 5 + [True]) and bool(collisions)
        how = d.pick(collisions) if collide else ""
        if how == "step" and tiles < 2:
            how, collide = "", False
        ids = tiles * (2 if how == "half" else 1)  # the program ids the tiles are computed from
        total = " * ".join(counts[g.axis] for g in axes)
        total = f"2 * {total}" if how == "half" else total
        label = []
        body: list[str] = []
        loop = ""
        programs = ids
        if persistent:
            if how == "step":  # programs one more than the step: program `step` starts on program 0's second tile
                programs = d.pick(list(range(2, ids + 1)))
            else:
                programs = d.pick(list(range(1, ids)) + [ids, ids + 1]) if ids > 1 else d.pick([1, 2])
            start = f"tl.program_id({axis})"
            if d.pick([False, True]):
                head.append(f"start_pid = {start}")
                start = "start_pid"
            spelling = d.pick(["num_programs", "named", "argument"])
            if spelling == "argument":  # a launch argument the host sets to the grid
                self.p.ints["NPROG"] = programs - (how == "step")
                step = "NPROG"
            else:
                step = f"tl.num_programs({axis})" + (" - 1" if how == "step" else "")
                if spelling == "named":
                    head.append(f"step = {step}")
                    step = "step"
            var = "tile_id" if order else f"pid_{axis}"
            fn = d.pick(["range", "tl.range", "tl.range_stages"])
            stages = ", num_stages=2" if fn == "tl.range_stages" else ""
            loop = f"for {var} in {fn.replace('_stages', '')}({start}, {total}, {step}{stages}):"
            label.append(f"persistent_{fn.replace('.', '_')}_{spelling}")
            src = var
        else:
            src = f"tl.program_id({axis})"
            if flat or d.pick([False, True]):
                head.append(f"pid = {src}")
                src = "pid"
        if swizzle:
            lines = head if not persistent else body
            if flat:
                if how == "half":
                    lines.append(f"pid_pair = {src} // 2")
                    src = "pid_pair"
                (m, k) = axes
                gm, gk = counts[m.axis], counts[k.axis]
                if order == "rows":
                    lines += [f"pid_{m.axis} = {src} // {gk}", f"pid_{k.axis} = {src} % {gk}"]
                elif order == "columns":
                    lines += [f"pid_{m.axis} = {src} % {gm}", f"pid_{k.axis} = {src} // {gm}"]
                else:
                    group, _ = self.count(d.pick([2, 1, 3, 4]))
                    fn = d.pick(["min", "tl.minimum"])
                    lines += [f"num_pid_in_group = {group} * {gk}",
                              f"group_id = {src} // num_pid_in_group",
                              f"first_pid_m = group_id * {group}",
                              f"group_size_m = {fn}({gm} - first_pid_m, {group})",
                              f"pid_{m.axis} = first_pid_m + (({src} % num_pid_in_group) % group_size_m)",
                              f"pid_{k.axis} = ({src} % num_pid_in_group) // group_size_m"]
                    order = f"grouped_{fn.replace('tl.', '')}"
            elif how == "half":
                lines.append(f"pid_{axis} = {src} // 2")
                order = "half"
            elif order == "mul":
                g = counts[axis]
                coprime = [a for a in (3, 5, 7, 2, 4) if math.gcd(a, tiles) == 1]
                shared = [a for a in (2, 3, 4, 6) if math.gcd(a, tiles) > 1] + [tiles]
                factor = d.pick(shared if how == "shared" else coprime)
                lines.append(f"pid_{axis} = ({src} * {factor}) % {g}")
            else:
                lines.append(f"pid_{axis} = {counts[axis]} - 1 - {src}")
            label.append(f"swizzle_{'flat_' if flat else ''}{order}")
        elif not persistent:
            raise AssertionError("a Launch persists or swizzles")
        if persistent and not swizzle and src != f"pid_{axis}":
            raise AssertionError(src)
        if collide:
            label.append(f"collide_{how}")
        return Launch(axis, flat, counts, head, loop, body, programs, collide, "+".join(label))

    def grouped_persistent(self) -> Launch:
        """The persistent matmul tutorial's walk over the tiles of both grid axes: ``NUM_SMS`` programs (a
        constexpr; or a runtime argument, or ``tl.num_programs(0)``) step through the flattened tile index in a
        grid-stride loop (``tl.range(start_pid, num_tiles, NUM_SMS, flatten=True)``, or ``range``, or with
        ``num_stages``), each iteration's tile found by grouped ordering (``//``, ``%``, builtin ``min`` or
        ``tl.minimum``; mostly in a helper returning the pair, as the tutorial's ``_compute_pid``; the row ``tile %
        group_size_m`` as the tutorial spells it, or ``(tile % num_pid_in_group) % group_size_m``), along either
        axis; and mostly, before the last stores, found again from a counter of the epilogue's own (``tile_id_c +=
        NUM_SMS``). Programs: the tutorial's ``min(NUM_SMS, tiles)``, one, or more than the tiles (the rest run no
        iteration). Sometimes two (program, iteration) pairs reach one tile, which the backward must refuse: more
        programs than the step (``step``); the last group's column divided by ``GROUP`` rather than its own height
        (``divisor``: only where the last group is short and there are two tile columns; else the map is the same
        and the kernel valid); the epilogue's counter stepping by one less than the loop (``counter``: where a
        program runs two iterations)."""
        d = self.d
        m, k = self.p.grid_dims
        if d.pick([False, True]):  # the axis grouped (the tutorial's rows)
            m, k = k, m
        head = ["start_pid = tl.program_id(0)"]
        counts: dict[int, str] = {}
        for g in (m, k):
            head.append(f"num_pid_{g.name} = {self.tiles(g)}")
            counts[g.axis] = f"num_pid_{g.name}"
        head.append(f"num_tiles = num_pid_{m.name} * num_pid_{k.name}")
        tiles = m.programs * k.programs
        group_size = d.pick([2, 3, 1, 4])
        group, _ = self.count(group_size)
        head.append(f"num_pid_in_group = {group} * num_pid_{k.name}")
        how = d.pick([""] * 5 + ["step", "divisor", "counter"])
        if how == "step" and tiles < 2:
            how = ""
        if how == "step":  # more programs than the step: program `step` starts on program 0's second tile
            step = d.pick(list(range(1, tiles)))
            programs = d.pick(list(range(step + 1, tiles + 2)))
        else:  # the tutorial's min(NUM_SMS, tiles); or more programs than tiles (the rest run no iteration)
            step = d.pick(list(range(1, tiles + 1)) + [tiles + 1, tiles + 3])
            programs = step if step <= tiles or d.pick([False, True]) else tiles
        collide = {"step": True, "divisor": m.programs % group_size != 0 and k.programs >= 2,
                   "counter": step < tiles, "": False}[how]
        spelling = d.pick(["constexpr", "constexpr", "runtime", "num_programs"])
        if spelling == "constexpr":
            self.p.meta["NUM_SMS"] = step
            stride = "NUM_SMS"
        elif spelling == "runtime":
            self.p.ints["NPROG"] = step
            stride = "NPROG"
        else:
            stride = "tl.num_programs(0)" + (f" - {programs - step}" if programs > step else
                                             f" + {step - programs}" if programs < step else "")
            stride = f"({stride})" if programs != step else stride
        fn = d.pick(["tl.range_flatten", "tl.range", "range", "tl.range_stages"])
        options = {"tl.range_flatten": ", flatten=True", "tl.range_stages": ", num_stages=2"}.get(fn, "")
        loop = f"for tile_id in {fn.split('_')[0]}(start_pid, num_tiles, {stride}{options}):"
        least = d.pick(["min", "tl.minimum"])
        row = d.pick(["tile % group_size_m", "(tile % num_pid_in_group) % group_size_m"])
        column = f"(tile % num_pid_in_group) // {'GROUP' if how == 'divisor' else 'group_size_m'}"
        lines = ["group_id = tile // num_pid_in_group", "first_pid_m = group_id * GROUP",
                 f"group_size_m = {least}(num_pid_m - first_pid_m, GROUP)",
                 f"pid_m = first_pid_m + ({row})", f"pid_n = {column}"]
        helpers: list[str] = []
        in_helper = d.pick([True, True, False])
        if in_helper:
            helpers = ["@triton.jit", "def tile_of(tile, num_pid_in_group, num_pid_m, GROUP):",
                       *[f"    {line}" for line in lines], "    return pid_m, pid_n", "", ""]

        def find(tile: str) -> list[str]:  # pid_<m.axis>, pid_<k.axis> of a tile index
            if in_helper:
                return [f"pid_{m.axis}, pid_{k.axis} = tile_of({tile}, num_pid_in_group, num_pid_{m.name}, {group})"]
            renamed = [re.sub(r"\btile\b", tile, line).replace("GROUP", group)
                       .replace("num_pid_m", f"num_pid_{m.name}") for line in lines]
            return renamed[:3] + [renamed[3].replace("pid_m =", f"pid_{m.axis} ="),
                                  renamed[4].replace("pid_n =", f"pid_{k.axis} =")]

        body = find("tile_id")
        epilogue: list[str] = []
        if how == "counter" or d.pick([True, True, False]):  # the tutorial's epilogue: a counter of its own
            moved = f"({stride} - 1)" if how == "counter" else stride
            head.append(f"tile_id_c = start_pid - {moved}")
            epilogue = [f"tile_id_c += {moved}", *find("tile_id_c")]
        label = (f"grouped_persistent_{fn.replace('.', '_')}_{spelling}" + "_helper" * in_helper
                 + "_epilogue" * bool(epilogue) + ("+collide_" + how if collide else ""))
        return Launch(0, True, counts, head, loop, body, programs, collide, label, helpers, epilogue)

    def new_input(self, role, dims=(), dist="uniform", **kw) -> Input:
        prefix = {"tile": "x" if len(dims) == 2 else "w", "scalar": "s", "table": "t", "index": "i", "stack": "z",
                  "wide": "c", "count": "q", "perm": "p", "cols": "w"}[role]
        inp = Input(f"{prefix}{len(self.p.inputs)}", role, tuple(dims), dist, **kw)
        self.p.inputs.append(inp)
        return inp

    def dist(self) -> str:
        return self.d.pick(["uniform", "uniform", "ties"])

    # -- nodes -----------------------------------------------------------------------------

    def push(self, node: Node, adapt=True) -> int:
        if node.pure:
            node.helper = self.d.pick([0, 0, 0, 1, 2, 3])
        if node.args:
            node.reassign = self.d.pick([False, False, True])
        node.inline = self.d.pick([False, False, False, True])
        node.lo, node.hi = float(node.lo), float(node.hi)
        if len(node.zero) != len(node.kind):
            node.zero = (False,) * len(node.kind)
        args = [self.p.nodes[a] for a in node.args]
        node.tied = node.tied or any(a.tied for a in args)
        inexact = node.label in INEXACT or node.label.startswith(("sum_", "reduce_sum_") + CONTROL_LABELS)
        node.fragile = node.tied and (inexact or any(a.fragile for a in args))
        assert math.isfinite(node.lo) and math.isfinite(node.hi) and node.lo <= node.hi, node
        self.p.nodes.append(node)
        i = len(self.p.nodes) - 1
        if adapt and max(abs(node.lo), abs(node.hi)) > CAP:
            i = self.scale(i, CAP)
        return i

    def scale(self, i: int, limit: float, label: str = "adapt_scale") -> int:
        n = self.p.nodes[i]
        b = max(abs(n.lo), abs(n.hi))
        c = 2.0 ** -math.ceil(math.log2(b / limit))  # a power of two: exact, in the mirror too
        return self.push(Node(n.kind, n.lo * c, n.hi * c, f"{{0}} * {fmt(c)}", f"{{0}} * {fmt(c)}", (i,),
                              label, pure=True, zero=n.zero), adapt=False)

    def domain(self, i: int, domain: str) -> int:
        """Operand ``i`` made fit for ``domain`` (adapter nodes appended where needed)."""
        n = self.p.nodes[i]
        limit = {"any": CAP, "small": SMALL, "pos": 8.0, "unit": 1.25}[domain]
        if max(abs(n.lo), abs(n.hi)) > limit:
            i = self.scale(i, limit)
            n = self.p.nodes[i]
        if domain == "pos" and n.lo < POSITIVE:
            lo, hi = square_iv(n.lo, n.hi)
            i = self.push(Node(n.kind, lo + 0.5, hi + 0.5, "{0} * {0} + 0.5", "{0} * {0} + 0.5", (i,),
                               "adapt_positive", pure=True), adapt=False)
        return i

    def operand(self, ok: Callable[[tuple], bool] = lambda k: True) -> int | None:
        """An earlier node whose kind is ``ok``: mostly one nothing uses yet, mostly a recent one."""
        cands = [i for i, n in enumerate(self.p.nodes) if ok(n.kind)]
        if not cands:
            return None
        used = {a for n in self.p.nodes for a in n.args}
        unused = [i for i in cands if i not in used]
        if unused and self.d.pick([True, True, False]):
            return self.d.recent(unused)
        return self.d.recent(cands)

    def fragile(self, *nodes: int) -> bool:
        return any(self.p.nodes[i].fragile for i in nodes)

    def kind_of(self, i: int) -> tuple:
        return self.p.nodes[i].kind

    def zero(self, i: int, to=None) -> tuple[bool, ...]:
        n = self.p.nodes[i]
        return align(n.zero, n.kind, n.kind if to is None else to)

    def zero_all(self, kind, *args) -> tuple[bool, ...]:
        return tuple(all(z) for z in zip(*(self.zero(a, kind) for a in args), strict=True)) if kind else ()

    def zero_any(self, kind, *args) -> tuple[bool, ...]:
        return tuple(any(z) for z in zip(*(self.zero(a, kind) for a in args), strict=True)) if kind else ()

    def mask_for(self, kind, positions=None) -> str | None:
        return mask_for(self.p, kind, positions)

    def real_dims(self) -> list[str]:
        return [d.name for d in self.p.dims]

    # -- generation ------------------------------------------------------------------------

    def run(self) -> Program:
        d = self.d
        self.p.seed = d.int(0, 2 ** 16)
        self.p.names = d.pick(["v", "v", "shadowy"])
        self.p.helper_params = d.pick(["a", "a", "clash"])
        self.op_load(first=True)
        if "rereads" in self.focus and d.pick([False, True, True, True]):  # (nearly every kernel of a campaign on it)
            self.op_rereads()
        for _ in range(d.int(1, MAX_OPS)):
            family = d.pick(self.families)
            if family in CONTROL and sum(n.pre_tl != () and n.label.startswith(CONTROL_LABELS)
                                         for n in self.p.nodes) >= MAX_CONTROL:
                family = "binary"
            getattr(self, "op_" + family)()
        if d.pick([True, True, False]):  # fold dangling values into the last one, so they reach an output
            used = {a for n in self.p.nodes for a in n.args}
            last = len(self.p.nodes) - 1
            for i in range(last - 1, -1, -1):
                n, acc = self.p.nodes[i], self.p.nodes[-1]
                if i not in used and broadcast(acc.kind, n.kind) == acc.kind:
                    j = len(self.p.nodes) - 1
                    self.push(Node(acc.kind, acc.lo + n.lo, acc.hi + n.hi, "{0} + {1}", "{0} + {1}", (j, i), "add",
                                   pure=True, aug="+", zero=self.zero_all(acc.kind, j, i)))
        last = len(self.p.nodes) - 1
        if not storable(self.kind_of(last)):  # (n, n) or (1, 1): sum it down to something storable
            kind = self.kind_of(last)
            n = self.p.nodes[last]
            count = math.prod(self.p.dim(k).block for k in real(kind))
            mask = self.mask_for(kind)
            tl = f"tl.sum(tl.where({mask}, {{0}}, 0.0))" if mask else "tl.sum({0})"
            self.push(Node((), -count * max(abs(n.lo), abs(n.hi)), count * max(abs(n.lo), abs(n.hi)), tl,
                           f"{{0}}.sum(dim={tuple(range(len(kind)))}, keepdim=False)", (last,), "sum_all"))
        used = {a for n in self.p.nodes for a in n.args} | {s.node for s in self.p.stores}
        for i, n in enumerate(self.p.nodes):  # a loop's or branch's value nothing uses: an output of its own
            control = n.label.startswith(CONTROL_LABELS) and "_none" not in n.label or (
                n.label == "adapt_scale" and self.p.nodes[n.args[0]].pre_tl)
            if control and i not in used and storable(n.kind) and d.pick([True, True, False]):
                self.p.stores.append(self.store(i, f"y{len(self.p.stores)}"))
        for _ in range(d.pick([1, 1, 2])):
            name = f"y{len(self.p.stores)}"  # after the outputs loops store into
            stored = {s.node for s in self.p.stores}
            used = {a for n in self.p.nodes for a in n.args} | stored
            cands = [i for i, n in enumerate(self.p.nodes) if storable(n.kind)
                     and (i not in stored or d.pick([False, False, True]))]
            unused = [i for i in cands if i not in used]
            pool = unused if unused and d.pick([True, True, True, False]) else cands or [len(self.p.nodes) - 1]
            node = d.recent(pool)
            self.p.stores.append(self.store(node, name))
        if self.p.launch is not None and self.p.launch.collide:  # two programs compute one tile: a plain store
            if all(s.atomic for s in self.p.stores if not s.inside):  # of it collides (atomic adds would not)
                self.p.stores[-1].atomic = False
            self.p.expect = self.p.expect or "two programs reach one tile"
        return self.p

    def store(self, node: int, name: str) -> Store:
        """A store of ``node``: into a pointer of its kind or of a kind it broadcasts to; or an atomic add."""
        d = self.d
        kind = self.kind_of(node)
        targets = [kind] if storable(kind) else []
        if len(kind) == 2:
            targets += [t for t in ([tuple(x if k == "1" else k for k in kind) for x in self.real_dims()])
                        if t != kind and storable(t)]
        elif len(kind) == 1:
            targets += [(x, kind[0]) for x in self.real_dims() if x != kind[0]]
        else:
            targets += [(x,) for x in self.real_dims()] + ([("m", "k")] if len(self.p.dims) == 2 else [])
        target = targets[0] if d.pick([True, True, False]) or len(targets) == 1 else d.pick(targets[1:])
        return Store(node, name, target, d.pick([False, False, True]))

    def op_load(self, first=False):
        d = self.d
        tiles = [x for x in self.p.inputs if x.role == "tile"]
        if not first and tiles and d.pick([False, True]):
            inp = d.pick(tiles)  # the same pointer loaded again
        else:
            options = [tuple(self.real_dims())] + ([("k",), ("m",)] if len(self.p.dims) == 2 and not first else [])
            inp = self.new_input("tile", d.pick(options), self.dist())
        other = d.pick(OTHERS)
        dims = [self.p.dim(n) for n in inp.dims]
        s0, s1 = self.strides(inp)
        if len(dims) == 2:
            a, b = dims
            if d.pick([False, True]):  # transposed: a tile of kind (b, a)
                kind = (b.name, a.name)
                terms = [inp.ptr, f"{a.idx}[None, :]{s0}", f"{b.idx}[:, None]{s1}"]
                th = f"{inp.name}[{a.lo}:{a.hi}, {b.lo}:{b.hi}].T"
            else:
                kind = (a.name, b.name)
                terms = [inp.ptr, f"{a.idx}[:, None]{s0}", f"{b.idx}[None, :]{s1}"]
                th = f"{inp.name}[{a.lo}:{a.hi}, {b.lo}:{b.hi}]"
        else:
            (a,) = dims
            layout = d.pick(["", "[:, None]", "[None, :]"])
            kind = {"": (a.name,), "[:, None]": (a.name, "1"), "[None, :]": ("1", a.name)}[layout]
            terms = [inp.ptr, f"{a.idx}{layout}{s0}"]
            th = f"{inp.name}[{a.lo}:{a.hi}]{layout}"
        mask = self.mask_for(kind)
        lo, hi = hull(-INPUT_BOUND, INPUT_BOUND, other)
        zero = tuple(other == 0.0 and k != "1" for k in kind)
        shift = d.pick([0, 0, 0, 1, -1, 2])
        if shift:  # a stencil: x[i + shift], out-of-range lanes masked (so they load `other`)
            t = d.pick(dims)
            moved = f"({t.idx} {'+' if shift > 0 else '-'} {abs(shift)})"
            terms = [x.replace(t.idx, moved) for x in terms]
            parts = [(f"(({moved} >= 0) & ({moved} < {k.upper()}))" if k == t.name else self.p.dim(k).mask)
                     + sub(len(kind), pos) for pos, k in enumerate(kind) if k != "1"]
            mask = " & ".join(parts)
            axis = inp.dims.index(t.name)
            pad = (2, 2) if axis == len(inp.dims) - 1 else (0, 0, 2, 2)
            slices = ", ".join(f"{x.lo} + {shift + 2}:{x.hi} + {shift + 2}" if x.name == t.name else f"{x.lo}:{x.hi}"
                               for x in dims)
            th = th.replace(f"{inp.name}[", f"torch.nn.functional.pad({inp.name}, {pad}, value={fmt(other)})[", 1)
            th = th.replace(th[th.index(")[") + 2: th.index("]")], slices, 1)
            zero = tuple(z and (k != t.name or shift > 0) for z, k in zip(zero, kind, strict=True))
        spelling = d.pick(["inline", "named", "stepwise", "safe", "minus", "broadcast"])
        if spelling == "broadcast" and not (len(kind) == 2 and "1" in kind and len(self.p.dims) == 2 and not shift):
            spelling = "inline"
        if spelling == "safe" and shift:  # its masked lanes would read the base, not `other`
            spelling = "inline"
        addr = " + ".join(terms)
        pre: tuple[str, ...] = ()
        if spelling == "named":  # ptrs = x_ptr + offsets; tl.load(ptrs, ...)
            pre, addr = (f"{{self}}_ptrs = {addr}",), "{self}_ptrs"
        elif spelling == "stepwise":  # the address in two steps: base + offset, then + offset
            pre, addr = (f"{{self}}_base = {' + '.join(terms[:-1])}",), f"{{self}}_base + {terms[-1]}"
        elif spelling == "minus":  # through a pointer past the base: (x_ptr + 1) + offsets - 1
            pre = ((f"{{self}}_base = {terms[0]} + 1",) if d.pick([False, True]) else
                   (f"{{self}}_base = {terms[0]}", "{self}_base += 1"))
            addr = f"{{self}}_base + {' + '.join(terms[1:])} - 1"
        elif spelling == "broadcast":  # a row (or column) of pointers broadcast over the tile: lanes share addresses
            kind = tuple(k if k != "1" else next(x for x in self.real_dims() if x not in kind) for k in kind)
            blocks = ", ".join(self.p.dim(k).BLOCK for k in kind)
            addr = f"tl.broadcast_to({addr}, ({blocks}))"
            th = f"{th}.expand({', '.join(self.p.dim(k).valid for k in kind)})"
            mask = self.mask_for(kind)
            zero = tuple(other == 0.0 for _ in kind)
        if spelling == "safe":  # masked lanes point at the base instead: no mask, no other
            tl = f"tl.load(tl.where({mask}, {addr}, {inp.ptr}))"
            lo, hi, zero = -INPUT_BOUND, INPUT_BOUND, ()
        else:
            tl = f"tl.load({addr}, mask={mask}, other={fmt(other)})"
        label = "load" + ("" if spelling == "inline" else f"_{spelling}") + ("_shifted" if shift else "")
        self.push(Node(kind, lo, hi, tl, th, (), label, pre_tl=pre, zero=zero, tied=inp.dist == "ties"))

    def op_scalar(self):
        d = self.d
        scalars = [x for x in self.p.inputs if x.role == "scalar"]
        if scalars and d.pick([False, True]):
            inp = d.pick(scalars)
        else:
            inp = self.new_input("scalar", (), self.dist(), per_program=d.pick([False, True]))
        if inp.per_program:
            gd = self.p.grid_dims
            tl_pid = " + ".join([f"pid_{g.axis} * {self.p.nprog(h.axis)}" for g in gd[:-1] for h in gd[1:]]
                                + [f"pid_{gd[-1].axis}"]) if gd else "0"
            th_pid = " + ".join([f"pid_{g.axis} * {h.programs}" for g in gd[:-1] for h in gd[1:]]
                                + [f"pid_{gd[-1].axis}"]) if gd else "0"
            tl, th = f"tl.load({inp.ptr} + {tl_pid})", f"{inp.name}[{th_pid}]"
        else:
            tl, th = f"tl.load({inp.ptr})", f"{inp.name}[0]"
        self.push(Node((), -INPUT_BOUND, INPUT_BOUND, tl, th, (), "scalar_load", tied=inp.dist == "ties"))

    def op_gather(self):
        d = self.d
        a = d.pick(self.p.dims)
        others = [e for e in self.p.dims if e.name != a.name]
        indices = [x for x in self.p.inputs if x.role == "index" and x.dims == (a.name,)]
        if indices and d.pick([False, True]):
            idx = d.pick(indices)  # the same index pointer loaded again
        else:
            idx = self.new_input("index", (a.name,), "index", vocab=d.int(1, 6))
        e_dims = ((), *[(e.name,) for e in others])
        rows_of = [x for x in self.p.inputs if x.role == "tile" and len(x.dims) == 2 and x.dims[1] != a.name]
        if rows_of and d.pick([False, False, True]):  # rows of a tile input the kernel also loads directly
            x = d.pick(rows_of)
            self.p.contiguous.add(x.name)  # its rows read at a contiguous layout's strides
            vocab = self.p.dim(x.dims[0]).size
            idx = next((i for i in indices if i.vocab == vocab), None) or \
                self.new_input("index", (a.name,), "index", vocab=vocab)
            table = Input(x.name, "table", x.dims[1:], x.dist, vocab)
        else:
            tables = [x for x in self.p.inputs if x.role == "table" and x.vocab == idx.vocab and x.dims in e_dims]
            if tables and d.pick([False, True]):
                table = d.pick(tables)
            else:
                table = self.new_input("table", d.pick(e_dims), self.dist(), vocab=idx.vocab)
        other = d.pick(OTHERS)
        pre = f"{{self}}_idx = tl.load({idx.ptr} + {a.idx}, mask={a.mask}, other=0)"
        if table.dims:
            e = self.p.dim(table.dims[0])
            kind = (a.name, e.name)
            tl = (f"tl.load({table.ptr} + {{self}}_idx[:, None] * {e.SIZE} + {e.idx}[None, :], "
                  f"mask={self.mask_for(kind)}, other={fmt(other)})")
            th = f"{table.name}[{idx.name}[{a.lo}:{a.hi}], {e.lo}:{e.hi}]"
        else:
            kind = (a.name,)
            tl = f"tl.load({table.ptr} + {{self}}_idx, mask={a.mask}, other={fmt(other)})"
            th = f"{table.name}[{idx.name}[{a.lo}:{a.hi}]]"
        lo, hi = hull(-INPUT_BOUND, INPUT_BOUND, other)
        self.push(Node(kind, lo, hi, tl, th, (), "gather", pre_tl=(pre,), zero=(other == 0.0,) * len(kind),
                       tied=True))  # indices repeat

    def op_iota(self):
        a = self.d.pick(self.p.dims)
        self.push(Node((a.name,), 0, a.programs * a.block, f"{a.idx}.to(tl.float64)",
                       f"torch.arange({a.lo}, {a.hi}, dtype=torch.float64)", (), "iota", tied=True))

    def op_unary(self):
        label, tl, th, dom, iv = self.d.pick(UNARY)
        i = self.domain(self.operand(), dom)
        if label in TIE_SENSITIVE and self.fragile(i):
            label, tl, th, dom, iv = next(u for u in UNARY if u[0] == "neg")
        n = self.p.nodes[i]
        zero = n.zero if label in ZERO_AT_ZERO else ()
        self.push(Node(n.kind, *iv(n.lo, n.hi), tl, th, (i,), label, pure=True, zero=zero))

    def op_const(self):
        label, tl, th, dom, iv = self.d.pick(CONST_OPS)
        c = self.d.pick(CONSTANTS)
        spelling = self.d.pick(["literal", "literal", "param", "global", "size"])
        pure = True
        if spelling == "size" and label in ("mul_c", "div_c", "rmul_c", "add_c", "rsub_c"):
            size = self.d.pick(self.p.dims)  # an integer kernel argument, like the `/ N` of a mean
            c, tl_c, pure = float(size.size), size.SIZE, False
        elif spelling == "size":
            spelling = "literal"
        if label in ("div_c",) and c == 0.0:
            c = 2.0
        i = self.domain(self.operand(), dom)
        if label in TIE_SENSITIVE and self.fragile(i):
            label, tl, th, dom, iv = next(u for u in CONST_OPS if u[0] == "mul_c")
        n = self.p.nodes[i]
        c2 = fmt(c + 1.0)
        if spelling != "size":
            tl_c = fmt(c)
        if spelling == "param":  # a float kernel argument, like eps
            tl_c, pure = f"alpha{len(self.p.scalars)}", False
            self.p.scalars[tl_c] = c
        elif spelling == "global" and tl.startswith("{c}"):
            spelling = "literal"  # Triton's interpreter makes `constexpr / tensor` a constexpr-wrapped tensor
        elif spelling == "global":  # a module-level tl.constexpr
            tl_c = f"C{len(self.p.constexprs)}"
            self.p.constexprs[tl_c] = c
        keeps_zero = {"mul_c": True, "rmul_c": True, "div_c": True, "add_c": c == 0, "rsub_c": c == 0,
                      "maximum_c": c <= 0, "minimum_c": c >= 0, "clamp": c <= 0 <= c + 1}.get(label, False)
        self.push(Node(n.kind, *iv(n.lo, n.hi, c), tl.format("{0}", c=tl_c, c2=c2),
                       th.format("{0}", c=fmt(c), c2=c2), (i,),
                       label + ("" if spelling == "literal" else "_" + spelling),
                       pure=pure, zero=n.zero if keeps_zero else ()))

    def op_binary(self):
        label, tl, th, aug, dom = self.d.pick(BINARY)
        a = self.operand()
        b = self.operand(lambda k: broadcast(self.kind_of(a), k) is not None)
        b = self.domain(b, dom)
        if label in TIE_SENSITIVE and self.fragile(a, b):
            label, tl, th, aug, dom = BINARY[0]
        na, nb = self.p.nodes[a], self.p.nodes[b]
        ia, ib = (na.lo, na.hi), (nb.lo, nb.hi)
        iv = {"add": lambda: (ia[0] + ib[0], ia[1] + ib[1]), "sub": lambda: (ia[0] - ib[1], ia[1] - ib[0]),
              "mul": lambda: mul_iv(ia, ib), "div": lambda: mul_iv(ia, (1 / ib[1], 1 / ib[0])),
              "maximum": lambda: (max(ia[0], ib[0]), max(ia[1], ib[1])),
              "minimum": lambda: (min(ia[0], ib[0]), min(ia[1], ib[1]))}[label]()
        kind = broadcast(na.kind, nb.kind)
        zero = (self.zero_any(kind, a, b) if label == "mul" else self.zero(a, kind) if label == "div"
                else self.zero_all(kind, a, b))
        self.push(Node(kind, *iv, tl, th, (a, b), label, pure=True, aug=aug, zero=zero))

    def op_fma(self):
        a = self.operand()
        b = self.operand(lambda k: broadcast(self.kind_of(a), k) is not None)
        ab = broadcast(self.kind_of(a), self.kind_of(b))
        c = self.operand(lambda k: broadcast(ab, k) is not None)
        na, nb, nc = (self.p.nodes[i] for i in (a, b, c))
        lo, hi = mul_iv((na.lo, na.hi), (nb.lo, nb.hi))
        kind = broadcast(ab, nc.kind)
        zero = tuple(x and y for x, y in zip(self.zero_any(kind, a, b), self.zero(c, kind), strict=True))
        self.push(Node(kind, lo + nc.lo, hi + nc.hi, "tl.fma({0}, {1}, {2})", "{0} * {1} + {2}", (a, b, c),
                       "fma", pure=True, zero=zero))

    def op_where(self):
        d = self.d
        a = self.operand()
        kind = self.kind_of(a)
        cmp = d.pick(COMPARE)
        if d.pick([False, True]):  # compared with a constant
            cond_tl, cond_args = f"{{0}} {cmp} {fmt(d.pick(CONSTANTS))}", (a,)
        else:
            b = self.operand(lambda k: broadcast(kind, k) is not None)
            kind = broadcast(kind, self.kind_of(b))
            cond_tl, cond_args = f"{{0}} {cmp} {{1}}", (a, b)
        if self.fragile(*cond_args):  # a comparison of values that tie here but maybe not in torch
            return self.op_binary()
        x = self.operand(lambda k: broadcast(kind, k) is not None)
        kind = broadcast(kind, self.kind_of(x))
        y = self.operand(lambda k: broadcast(kind, k) is not None)
        kind = broadcast(kind, self.kind_of(y))
        nx, ny = self.p.nodes[x], self.p.nodes[y]
        k = len(cond_args)
        tl = f"tl.where({cond_tl}, {{{k}}}, {{{k + 1}}})"
        th = f"torch.where({cond_tl}, {{{k}}}, {{{k + 1}}})"
        self.push(Node(kind, min(nx.lo, ny.lo), max(nx.hi, ny.hi), tl, th, (*cond_args, x, y), "where",
                       pure=True, zero=self.zero_all(kind, x, y)))

    def op_cast(self):
        label, tl, th, lowp, iv = self.d.pick(CASTS)
        i = self.operand()
        if label in TIE_SENSITIVE and self.fragile(i):
            label, tl, th, lowp, iv = CASTS[0]
        n = self.p.nodes[i]
        self.p.lowp |= lowp
        zero = n.zero if label not in ("f32_sigmoid", "f32_exp") else ()  # sigmoid(0), exp(0) are not 0
        self.push(Node(n.kind, *iv(n.lo, n.hi), tl, th, (i,), label, pure=True, zero=zero))

    def op_reduce(self):
        d = self.d
        i = self.operand(lambda k: len(k) >= 1)
        if i is None:
            return self.op_load()
        n = self.p.nodes[i]
        kind, rank = n.kind, len(n.kind)
        fn = d.pick(["sum", "max", "min"])
        if self.fragile(i):  # maxima of values that tie here but maybe not in torch
            fn = "sum"
        axis = d.pick([None, *range(rank)])
        keep = d.pick([False, True])
        method = fn == "sum" and d.pick([False, True])
        combine = d.pick([False, False, True])  # tl.reduce(x, axis, _fuzz_sum)
        positional = axis is not None and d.pick([False, True])  # tl.sum(x, 1) / tl.sum(x, 1, True)
        negative = axis is not None and d.pick([False, False, True])  # axis=-1
        if combine:  # Triton 3.9's tl.reduce mishandles axis=-1: keep_dims gives (4, 8) -> (4, 4, 8, 1)
            negative = False
        full = d.pick([False, True])  # mask every axis, or only the reduced ones
        finite = d.pick([False, True])  # max / min: a finite neutral value below / above every lane
        bare = d.pick([False, True])  # sum: no tl.where when the masked lanes hold 0 already (other=0.0)
        reduced = list(range(rank)) if axis is None else [axis]
        if axis is None:
            full = True
        masked_dims = [p for p in range(rank) if kind[p] != "1"]
        reduced_real = [p for p in reduced if kind[p] != "1"]
        count = math.prod(self.p.dim(kind[p]).block for p in reduced_real)
        mask = self.mask_for(kind, None if full else reduced)
        leaves_masked = full and set(masked_dims) != set(reduced_real)  # result lanes that only saw neutrals
        if fn != "sum" and leaves_masked:
            finite = True  # an infinite neutral would leave infinite lanes behind
        if fn == "sum":
            neutral = "0.0"
            lo, hi = (n.lo, count * n.hi) if n.lo > 0 else (count * n.lo, n.hi) if n.hi < 0 else (count * n.lo,
                                                                                                  count * n.hi)
            if leaves_masked:
                lo, hi = min(lo, 0.0), max(hi, 0.0)
        elif fn == "max":
            neutral = fmt(math.floor(n.lo) - 1.0) if finite else "-float('inf')"
            lo, hi = (math.floor(n.lo) - 1.0 if leaves_masked else n.lo), n.hi
        else:
            neutral = fmt(math.ceil(n.hi) + 1.0) if finite else "float('inf')"
            lo, hi = n.lo, (math.ceil(n.hi) + 1.0 if leaves_masked else n.hi)
        zero = list(n.zero)
        if fn == "sum" and bare and all(zero[p] for p in reduced_real):
            mask, leaves_masked = None, False
        operand = "{0}" if not reduced_real or mask is None else f"tl.where({mask}, {{0}}, {neutral})"
        if operand != "{0}":  # lanes the tl.where replaced hold the neutral value now
            where = [p for p in (masked_dims if full else reduced_real)]
            zero = [(z or p in where) if fn == "sum" else (z and p not in where) for p, z in enumerate(zero)]
        kw = []
        if axis is not None:
            spelled = axis - rank if negative else axis
            kw.append(f"{spelled}" if positional and not method else f"axis={spelled}")
        if keep:
            kw.append("True" if positional and not method and fn == "sum" else "keep_dims=True")
        if combine:  # positional or keyword arguments: tl.reduce(x, 1, f, True), tl.reduce(x, axis=1, ...)
            spelled = "None" if axis is None else f"{axis - rank if negative else axis}"
            keep_kw = d.pick([False, True])
            if positional or axis is None:
                tl = f"tl.reduce({operand}, {spelled}, _fuzz_{fn}" + (
                    (", keep_dims=True)" if keep_kw else ", True)") if keep else ")")
            else:
                tl = f"tl.reduce({operand}, axis={spelled}, combine_fn=_fuzz_{fn}" + (", keep_dims=True)" if keep
                                                                                       else ")")
        elif method:
            tl = f"{operand}.sum({', '.join(kw)})"
        else:
            tl = f"tl.{fn}({', '.join([operand, *kw])})"
        torch_fn = {"sum": "sum", "max": "amax", "min": "amin"}[fn]
        dims = tuple(range(rank)) if axis is None else (axis,)
        th = f"{{0}}.{torch_fn}(dim={dims}, keepdim={keep})"
        if axis is None and combine and keep:  # tl.reduce(x, None, f, True) is 1-D, unlike tl.sum's
            out = ("1",)
            th += ".reshape(1)"
        elif axis is None:
            out = ("1",) * rank if keep else ()
        else:
            out = tuple("1" if p == axis else k for p, k in enumerate(kind)) if keep else \
                tuple(k for p, k in enumerate(kind) if p != axis)
        if axis is None:
            zero = [False] * len(out)
        elif keep:
            zero[axis] = False
        else:
            del zero[axis]
        label = f"{'reduce_' if combine else ''}{fn}_{'all' if axis is None else 'axis'}{'_keep' if keep else ''}"
        if operand == "{0}" and reduced_real and fn == "sum":
            label += "_bare"
        self.push(Node(out, lo, hi, tl, th, (i,), label, pure=operand == "{0}", zero=tuple(zero)))

    def op_shape(self):
        d = self.d
        i = self.operand()
        n = self.p.nodes[i]
        kind = n.kind
        options = []
        if len(kind) == 2:
            options += ["trans", "trans_T", "permute"]
            if len(real(kind)) == 1:
                options += ["squeeze", "broadcast_to"]
            if len(real(kind)) == 2:
                options += ["flatten"]
        elif len(kind) == 1:
            options += ["expand_dims", "subscript"]
        else:
            options += ["broadcast_to"]
        op = d.pick(options)
        lo, hi, pure, zero = n.lo, n.hi, True, ()
        if op in ("trans", "trans_T", "permute"):
            new, zero = (kind[1], kind[0]), n.zero[::-1]
            tl = {"trans": "tl.trans({0})", "trans_T": "{0}.T", "permute": "tl.permute({0}, (1, 0))"}[op]
            th = "{0}.T"
        elif op == "squeeze":
            (r,) = real(kind)
            new, pos = (r,), kind.index("1")
            zero = tuple(z for p, z in enumerate(n.zero) if p != pos)
            tl, th, pure = f"tl.reshape({{0}}, ({self.p.dim(r).BLOCK},))", f"{{0}}.squeeze({pos})", False
        elif op == "flatten":
            a, b = (self.p.dim(x) for x in kind)
            c = d.pick([2.0, -0.5])
            new, lo, hi, pure, zero = kind, *hull(n.lo * c, n.hi * c), False, n.zero
            tl = f"tl.reshape(tl.reshape({{0}}, ({a.BLOCK} * {b.BLOCK},)) * {fmt(c)}, ({a.BLOCK}, {b.BLOCK}))"
            th = f"{{0}} * {fmt(c)}"
        elif op in ("expand_dims", "subscript"):
            axis = d.pick([0, 1])
            new = ("1", kind[0]) if axis == 0 else (kind[0], "1")
            zero = (False, n.zero[0]) if axis == 0 else (n.zero[0], False)
            tl = f"tl.expand_dims({{0}}, {axis})" if op == "expand_dims" else "{0}" + ("[None, :]" if axis == 0
                                                                                       else "[:, None]")
            th = f"{{0}}.unsqueeze({axis})"
        else:  # broadcast_to: fill the unit (or missing) axes with tile axes
            fill = d.pick(self.real_dims())
            if len(kind) == 2:
                new = tuple(fill if k == "1" else k for k in kind)
            else:
                new = (fill,) if d.pick([False, True]) else (fill, d.pick(self.real_dims()))
            dims = [self.p.dim(k) for k in new]
            tl = f"tl.broadcast_to({{0}}, ({', '.join(x.BLOCK for x in dims)}{',' if len(dims) == 1 else ''}))"
            th = f"{{0}}.expand({', '.join(x.valid for x in dims)})"
            pure = False
        self.push(Node(new, lo, hi, tl, th, (i,), op, pure=pure, zero=zero))

    def op_outer(self):
        a = self.operand(lambda k: len(k) == 1)
        if a is None:
            return self.op_binary()
        b = self.operand(lambda k: len(k) == 1)
        na, nb = self.p.nodes[a], self.p.nodes[b]
        self.push(Node((na.kind[0], nb.kind[0]), *mul_iv((na.lo, na.hi), (nb.lo, nb.hi)),
                       "{0}[:, None] * {1}[None, :]", "{0}[:, None] * {1}[None, :]", (a, b), "outer", pure=True,
                       zero=(na.zero[0], nb.zero[0])))

    def op_dot(self):
        d = self.d
        big = {x.name for x in self.p.dims if x.block >= 16}

        def square(k):
            return len(k) == 2 and k[0] in big and k[1] in big

        a = self.operand(square)
        if a is None:  # make a square tile: an outer product of vectors along 16-wide axes
            vec = self.operand(lambda k: len(k) == 1 and k[0] in big)
            if vec is None:
                return self.op_load()
            other = self.operand(lambda k: len(k) == 1 and k[0] in big)
            nv, no = self.p.nodes[vec], self.p.nodes[other]
            a = self.push(Node((nv.kind[0], no.kind[0]), *mul_iv((nv.lo, nv.hi), (no.lo, no.hi)),
                               "{0}[:, None] * {1}[None, :]", "{0}[:, None] * {1}[None, :]", (vec, other), "outer",
                               pure=True, zero=(nv.zero[0], no.zero[0])))
        p, q = self.kind_of(a)
        b = self.operand(lambda k: square(k) and k[0] == q)
        if b is None:  # a @ a^T
            n = self.p.nodes[a]
            b = self.push(Node((q, p), n.lo, n.hi, "tl.trans({0})", "{0}.T", (a,), "trans", pure=True,
                               zero=n.zero[::-1]))
        r = self.kind_of(b)[1]
        acc = self.operand(lambda k: k == (p, r)) if d.pick([False, True]) else None
        # the contraction axis needs zeros in its masked lanes, in one operand at least
        clean = self.zero(a)[1] or self.zero(b)[0]
        masked = d.pick(["both", "a", "b"] + ["none", "none"] * clean)
        qm = self.p.dim(q).mask
        ta = f"tl.where({qm}[None, :], {{0}}, 0.0)" if masked in ("both", "a") else "{0}"
        tb = f"tl.where({qm}[:, None], {{1}}, 0.0)" if masked in ("both", "b") else "{1}"
        na, nb = self.p.nodes[a], self.p.nodes[b]
        bound = self.p.dim(q).block * max(abs(na.lo), abs(na.hi)) * max(abs(nb.lo), abs(nb.hi))
        zero = (self.zero(a)[0], self.zero(b)[1])
        precision = d.pick(["", ", input_precision=\"ieee\""])
        if acc is None:
            tl, th, args, lo, hi = f"tl.dot({ta}, {tb}{precision})", "{0} @ {1}", (a, b), -bound, bound
        else:
            nc = self.p.nodes[acc]
            tl, th, args = f"tl.dot({ta}, {tb}, {{2}}{precision})", "{2} + {0} @ {1}", (a, b, acc)
            lo, hi = nc.lo - bound, nc.hi + bound
            zero = tuple(x and y for x, y in zip(zero, self.zero(acc), strict=True))
        label = ("dot_acc" if acc is not None else "dot") + ("_bare" if masked == "none" else "")
        self.push(Node((p, r), lo, hi, tl, th, args, label, zero=zero))

    def op_scan(self):
        """tl.cumsum / tl.cumprod along an axis, forward or reversed; masked lanes made neutral. A share of them
        (``SCAN_COMBINED``) spelled ``tl.associative_scan`` with a combine function: the cumsum's ``a + b``, the
        cumprod becoming a linear recurrence (``recurrence``)."""
        d = self.d
        fn = d.pick(["cumsum", "cumprod"])
        # by the kernel's seed and the node's place, not drawn: the draws are the plain scan's, so every other kernel
        # (and a hypothesis campaign's sequence of kernels) stays as it was
        seeded = random.Random(self.p.seed * 7907 + len(self.p.nodes))
        combined = seeded.random() < SCAN_COMBINED
        i = self.operand(lambda k: bool(real(k)))
        if i is None:
            return self.op_load()
        i = self.domain(i, "unit" if fn == "cumprod" else "any")
        n = self.p.nodes[i]
        kind = n.kind
        axis = d.pick([p for p, k in enumerate(kind) if k != "1"])
        reverse = d.pick([False, True])
        # a forward scan never reads past the valid lanes; a reversed one must see neutral values there
        masked = reverse or d.pick([False, True])
        neutral = "0.0" if fn == "cumsum" else "1.0"
        operand = f"tl.where({self.mask_for(kind, [axis])}, {{0}}, {neutral})" if masked else "{0}"
        spelled = d.pick([f"{axis}", f"axis={axis}"])
        count = self.p.dim(kind[axis]).block
        b = max(abs(n.lo), abs(n.hi))
        bound = count * b if fn == "cumsum" else max(1.0, b) ** count
        zero = tuple(z and p != axis for p, z in enumerate(n.zero))
        if fn == "cumprod" and combined:
            k = self.push(self.recurrence(i, axis, reverse, masked, "=" in spelled, seeded, bound, zero), adapt=False)
            if bound > CAP:  # (not "adapt_scale": one of a node with lines of its own is stored as a loop's value is)
                self.scale(k, CAP, "scale_recurrence")
            return
        if combined:  # (a cumsum: tritongrad reads a scan combining by `a + b` as one)
            spelled += ", combine_fn=_fuzz_sum" if "=" in spelled else ", _fuzz_sum"
        call = "tl.associative_scan" if combined else f"tl.{fn}"
        tl = f"{call}({operand}, {spelled}" + (", reverse=True)" if reverse else ")")
        th = f"torch.{fn}({{0}}, dim={axis})"
        if reverse:
            th = f"torch.{fn}({{0}}.flip({axis}), dim={axis}).flip({axis})"
        label = ("scan_sum" if combined else fn) + ("_reverse" if reverse else "")
        self.push(Node(kind, -bound, bound, tl, th, (i,), label, zero=zero))

    def recurrence(self, i: int, axis: int, reverse: bool, masked: bool, keyword: bool, seeded: random.Random,
                   bound: float, zero: tuple) -> Node:
        """In place of ``tl.cumprod`` of ``a`` (node ``i``, its draws made), ``tl.associative_scan`` of ``(a, b)``
        combined as the first-order linear recurrence ``h = a h + b`` (``_fuzz_recurrence``, which tritongrad reads
        as a ``linear_scan``): its state, or the mean of its products of ``a`` and its state, the result spelled in
        one of three ways; masked lanes neutral (``a`` 1, ``b`` 0) where the scan reads them. ``b`` is ``a``, its
        square or sine, or another value of its kind some node already reads, masked-off lanes 0 along an axis
        wherever ``a``'s are and tied only where ``a`` is (so neither what later draws see nor which values are
        unused changes), scaled by a power of two to at most ``1 / count``: every lane stays within the cumprod's
        ``bound``. The mirror runs the recurrence step by step."""
        kind = self.kind_of(i)
        used = {a for n in self.p.nodes for a in n.args}
        others = [j for j, n in enumerate(self.p.nodes) if j != i and j in used and n.kind == kind
                  and all(zb or not za for za, zb in zip(self.zero(i), self.zero(j), strict=True))
                  and (self.p.nodes[i].tied or not n.tied)]
        na = self.p.nodes[i]
        j = seeded.choice([i, i, i, *others[-2:]])
        if j == i:
            f, f_th, size = seeded.choice([("{0}", "{0}", max(abs(na.lo), abs(na.hi))),
                                           ("{0} * {0}", "{0} * {0}", max(na.lo ** 2, na.hi ** 2)),
                                           ("tl.sin({0})", "torch.sin({0})", min(1.0, max(abs(na.lo), abs(na.hi))))])
            f, f_th = f.replace("{0}", "{1}"), f_th.replace("{0}", "{1}")
        else:
            f, f_th, size = "{1}", "{1}", max(abs(self.p.nodes[j].lo), abs(self.p.nodes[j].hi))
        count = self.p.dim(kind[axis]).block
        c = 2.0 ** -max(0, math.ceil(math.log2(max(count * size, 1e-300))))  # |h| <= max(1, |a|) ** count
        mask = self.mask_for(kind, [axis])
        b = f"({f}) * {fmt(c)}" if c != 1.0 else f
        a, b = (f"tl.where({mask}, {{0}}, 1.0)", f"tl.where({mask}, {b}, 0.0)") if masked else ("{0}", b)
        spelled = f"axis={axis}, combine_fn=_fuzz_recurrence" if keyword else f"{axis}, _fuzz_recurrence"
        scan = f"tl.associative_scan(({a}, {b}), {spelled}" + (", reverse=True)" if reverse else ")")
        results = seeded.choice(["state", "pair", "index", "both"])  # what is read of the scan, and how
        if results == "index":
            pre_tl, tl = (), f"{scan}[1]"
        else:
            pre_tl = (("_" if results == "state" else "{self}_p") + f", {{self}}_h = {scan}",)
            tl = "({self}_p + {self}_h) * 0.5" if results == "both" else "{self}_h"
        steps = f"range({{0}}.shape[{axis}] - 1, -1, -1)" if reverse else f"range({{0}}.shape[{axis}])"
        b_th = f"({f_th}).select({axis}, {{self}}_t)" + (f" * {fmt(c)}" if c != 1.0 else "")
        pre_th = ("{self}_p, {self}_h, {self}_ps, {self}_hs = 1.0, 0.0, [], []",
                  f"for {{self}}_t in {steps}:",
                  f"    {{self}}_p = {{0}}.select({axis}, {{self}}_t) * {{self}}_p",
                  f"    {{self}}_h = {{0}}.select({axis}, {{self}}_t) * {{self}}_h + {b_th}",
                  "    {self}_ps.append({self}_p)",
                  "    {self}_hs.append({self}_h)")
        order = "[::-1]" if reverse else ""
        th = f"torch.stack({{self}}_hs{order}, {axis})"
        if results == "both":
            th = f"(torch.stack({{self}}_ps{order}, {axis}) + {th}) * 0.5"
        return Node(kind, -bound, bound, tl, th, (i, j), "recurrence" + ("_reverse" if reverse else ""),
                    pre_tl=pre_tl, pre_th=pre_th, zero=zero)

    def op_join(self):
        """tl.join of two values of one kind, then tl.split (`a, b = ...`) or a sum over the new axis."""
        d = self.d
        a = self.operand()
        b = self.operand(lambda k: k == self.kind_of(a))
        na, nb = self.p.nodes[a], self.p.nodes[b]
        how = d.pick(["first", "second", "sum"])
        pre = ("{self}_j = tl.join({0}, {1})",)
        if how == "sum":
            self.push(Node(na.kind, na.lo + nb.lo, na.hi + nb.hi, f"tl.sum({{self}}_j, axis={len(na.kind)})",
                           "{0} + {1}", (a, b), "join_sum", pre_tl=pre, zero=self.zero_all(na.kind, a, b)))
            return
        pre += ("{self}_a, {self}_b = tl.split({self}_j * 2.0)",)
        src, n = ("{self}_a", na) if how == "first" else ("{self}_b", nb)
        self.push(Node(na.kind, 2 * n.lo, 2 * n.hi, src, ("{0}" if how == "first" else "{1}") + " * 2.0", (a, b),
                       "join_split", pre_tl=pre, zero=n.zero))

    def op_softmax(self):
        """Softmax or logsumexp along an axis, the tutorial way: masked lanes -inf, then max, exp, sum."""
        d = self.d
        i = self.operand(lambda k: bool(real(k)))
        if i is None:
            return self.op_load()
        n = self.p.nodes[i]
        kind = n.kind
        axis = d.pick([p for p, k in enumerate(kind) if k != "1"])
        fn = d.pick(["softmax", "logsumexp"])
        mask = self.mask_for(kind, [axis])
        kw = f"axis={axis}, keep_dims=True"
        pre = (f"{{self}}_x = tl.where({mask}, {{0}}, -float('inf'))",
               f"{{self}}_m = tl.max({{self}}_x, {kw})",
               "{self}_z = {self}_x - {self}_m",
               "{self}_e = tl.exp({self}_z)",
               f"{{self}}_s = tl.sum({{self}}_e, {kw})")
        if fn == "softmax":
            zero = tuple(p == axis for p in range(len(kind)))
            self.push(Node(kind, 0.0, 1.0, "{self}_e / {self}_s", f"torch.softmax({{0}}, dim={axis})", (i,),
                           "softmax", pre_tl=pre, zero=zero))
        else:
            out = tuple("1" if p == axis else k for p, k in enumerate(kind))
            hi = n.hi + math.log(self.p.dim(kind[axis]).block)
            self.push(Node(out, n.lo, hi, "{self}_m + tl.log({self}_s)",
                           f"torch.logsumexp({{0}}, dim={axis}, keepdim=True)", (i,), "logsumexp", pre_tl=pre))

    def op_softmax_out(self):
        """A softmax of a value, stored as an output under the value's own mask and read by nothing else (an op's
        backward reads it back instead of recomputing it: stored_outputs.py); the value goes on as it was."""
        d = self.d
        ok = lambda k: bool(real(k)) and storable(k)  # noqa: E731
        a = None
        if d.pick([True, True, False]):  # mostly of a value loaded for it: the backward need not load it then
            self.op_load()
            a = len(self.p.nodes) - 1 if ok(self.kind_of(len(self.p.nodes) - 1)) else None
        a = self.operand(ok) if a is None else a
        if a is None:
            return self.op_softmax()
        kind = self.kind_of(a)
        axis = d.pick([p for p, k in enumerate(kind) if k != "1"])
        store, _, offset, mask, index = self.loop_output(kind)
        kw = f"axis={axis}, keep_dims=True"
        address = f"{store.name}_ptr" + (f" + {offset}" if offset else "")
        pre_tl = (f"{{self}}_x = tl.where({mask}, {{0}}, -float('inf'))" if mask else "{self}_x = {0}",
                  f"{{self}}_m = tl.max({{self}}_x, {kw})",
                  "{self}_z = {self}_x - {self}_m",
                  "{self}_e = tl.exp({self}_z)",
                  f"{{self}}_s = tl.sum({{self}}_e, {kw})",
                  "{self}_y = {self}_e / {self}_s",
                  f"tl.store({address}, {{self}}_y" + (f", mask={mask})" if mask else ")"))
        pre_th = (f"{store.name}[{index}] = torch.softmax({{0}}, dim={axis})",)
        n = self.p.nodes[a]
        self.push(Node(kind, n.lo, n.hi, "{0}", "{0}", (a,), "softmax_out", pre_tl=pre_tl, pre_th=pre_th,
                       zero=n.zero, tied=n.tied))

    # -- loops and branches: nodes whose lines hold a whole `for` or `if` ------------------

    def shape_tl(self, kind) -> str:
        blocks = [self.p.dim(k).BLOCK if k != "1" else "1" for k in kind]
        return f"({', '.join(blocks)}{',' if len(blocks) == 1 else ''})"

    def shape_th(self, kind) -> str:
        sizes = [self.p.dim(k).valid if k != "1" else "1" for k in kind]
        return f"({', '.join(sizes)}{',' if len(sizes) == 1 else ''})"

    def count(self, value: int) -> tuple[str, bool]:
        """``value`` spelled as a literal, a runtime integer argument or a constexpr parameter; and whether
        it is a compile-time constant."""
        how = self.d.pick(["literal", "runtime", "constexpr"])
        if how == "runtime":
            name = f"T{len(self.p.ints)}"
            self.p.ints[name] = value
            return name, False
        if how == "constexpr":
            name = f"R{len(self.p.meta)}"
            self.p.meta[name] = value
            return name, True
        return str(value), True

    def loop_range(self, slabs: int, visit: bool) -> Range:
        """A loop over indices below ``slabs``, at least one visited if ``visit``; or, sometimes if not, as many
        as a loaded count says, or starting or stopping by the program id."""
        d = self.d
        dynamic = not visit and d.pick([False, False, False, True])
        if dynamic and self.p.grid_dims and d.pick([False, True]):  # programs visit different indices
            g = d.pick(self.p.grid_dims)
            n, _ = self.count(slabs)
            start = f"pid_{g.axis} % 2"
            forms = {"from_pid": ([start, n], [start, slabs]), "to_pid": (["0", f"{n} - {start}"],
                                                                           ["0", f"{slabs} - {start}"])}
            pre: tuple[tuple[str, ...], ...] = ((), ())
        elif dynamic:  # a trip count from loaded data (0 to slabs)
            counts = self.new_input("count", (), "index", vocab=slabs + 1)
            tl_pid, th_pid = self.program_index()
            n, th_n = f"tl.load({counts.ptr} + {tl_pid})", f"int({counts.name}[{th_pid}])"
            pre = ((), ())
            if d.pick([False, True]):
                pre, n, th_n = (("{self}_n = " + n,), ("{self}_n = " + th_n,)), "{self}_n", "{self}_n"
            forms = {"stop": ([n], [th_n]), "zero_stop": (["0", n], ["0", th_n]),
                     "reversed": ([f"{n} - 1", "-1", "-1"], [f"{th_n} - 1", "-1", "-1"])}
        else:
            n, constexpr = self.count(slabs)
            two, two_constexpr = self.count(2) if d.pick([False, True]) else ("2", True)  # a step from an argument
            constexpr &= two_constexpr
            forms = {"stop": ([n], [slabs]), "zero_stop": (["0", n], [0, slabs]), "from_one": (["1", n], [1, slabs]),
                     "step_two": (["0", n, two], [0, slabs, 2]),
                     "reversed": ([f"{n} - 1", "-1", "-1"], [slabs - 1, -1, -1])}
            pre = ((), ())
        form = d.pick(list(forms))
        if form == "from_one" and visit and slabs == 1:
            form = "stop"
        fn = d.pick(["range", "tl.range", "tl.static_range"])
        if fn == "tl.static_range" and (dynamic or not constexpr):
            fn = "range"
        tl_args, th_args = forms[form]
        if fn == "tl.range" and len(tl_args) == 3 and d.pick([False, True]):
            tl_args = [*tl_args[:2], f"step={tl_args[2]}"]
        stages = ", num_stages=2" if fn == "tl.range" and d.pick([False, False, True]) else ""
        return Range(f"{fn}({', '.join(tl_args)}{stages})", f"range({', '.join(map(str, th_args))})",
                     list(range(slabs)) if dynamic else list(range(*th_args)), tl_args[0] if len(tl_args) > 1 else "0",
                     -1 if form == "reversed" else 2 if form == "step_two" else 1, dynamic, *pre)

    def slab_address(self, inp: Input, index: str) -> str:
        """The addresses of slab ``index`` of a stacked input (``index`` spelled, parenthesized if compound)."""
        dims = [self.p.dim(k) for k in inp.dims]
        size = " * ".join(x.SIZE for x in dims)
        offs = (f" + {dims[0].idx}[:, None] * {dims[1].SIZE} + {dims[1].idx}[None, :]" if len(dims) == 2
                else "".join(f" + {x.idx}" for x in dims))
        return f"{inp.ptr} + {index}" + (f" * {size}" if size else "") + offs

    def slab_load(self, inp: Input, address: str, th_index: str, other: float) -> tuple[str, str]:
        mask = self.mask_for(inp.dims)
        tl = f"tl.load({address}, mask={mask}, other={fmt(other)})" if mask else f"tl.load({address})"
        return tl, f"{inp.name}[{', '.join([th_index] + [f'{self.p.dim(k).lo}:{self.p.dim(k).hi}' for k in inp.dims])}]"

    def strides(self, inp: Input) -> tuple[str, str]:
        """A tile input's strides in an address (`` * x0_s0``): the tensor's own where the launch passes them
        (Program.strided), else a contiguous layout's."""
        if self.p.strided:
            return f" * {inp.name}_s0", f" * {inp.name}_s1"
        return (f" * {self.p.dim(inp.dims[-1]).SIZE}" if len(inp.dims) == 2 else ""), ""

    def plain_load(self, kind) -> tuple[str, str, float, float, tuple] | None:
        """A load of a tile input of ``kind`` (one of the frame's), or None."""
        if list(kind) not in [self.real_dims()] + [[x] for x in self.real_dims()]:
            return None
        tiles = [x for x in self.p.inputs if x.role == "tile" and x.dims == tuple(kind)]
        inp = self.d.pick(tiles) if tiles and self.d.pick([False, True]) else self.new_input("tile", kind, self.dist())
        dims = [self.p.dim(k) for k in kind]
        s0, s1 = self.strides(inp)
        offs = f"{dims[0].idx}[:, None]{s0} + {dims[1].idx}[None, :]{s1}" if len(dims) == 2 else f"{dims[0].idx}{s0}"
        other = self.d.pick(OTHERS)
        th = f"{inp.name}[{', '.join(f'{x.lo}:{x.hi}' for x in dims)}]"
        return (f"tl.load({inp.ptr} + {offs}, mask={self.mask_for(kind)}, other={fmt(other)})", th,
                *hull(-INPUT_BOUND, INPUT_BOUND, other), (other == 0.0,) * len(kind))

    def loop_output(self, kind, lead=0, tail=0, atomic=False) -> tuple[Store, list[str], str, str | None, str]:
        """An output stored inside a loop: the Store, and its layout (shape, kernel offset, mask, mirror index)."""
        store = Store(len(self.p.nodes), f"y{len(self.p.stores)}", kind, atomic, True, lead, tail)
        self.p.stores.append(store)
        shape, offset, mask, index = output_layout(self.p, kind, atomic)
        return store, shape, offset, mask, index

    def carried(self, form: str, kind, f_zero, args: list[int], test: tuple[str, str], names: tuple[str, str]):
        """A state ``h`` updated by each iteration's value ``f`` of ``kind`` (named ``names``): its initial
        value (kernel, mirror, interval, zero), its update (kernel and mirror lines), the update of its
        interval for one iteration (taking whether the test holds, None if unknown), zero, and its kind:
        ``kind``, or sometimes one ``f`` broadcasts to (the adjoint of ``f`` is then summed every iteration)."""
        d = self.d
        h, x = names
        f_kind = kind = tuple(kind)
        wider = [w for w in {n.kind for n in self.p.nodes} | {tuple(self.real_dims())}
                 if w != kind and broadcast(w, kind) == w and storable(w)]
        if wider and form != "overwrite" and d.pick([False, False, True]):
            kind = d.pick(sorted(wider))
            f_zero = align(f_zero, f_kind, kind)
        same = [i for i, n in enumerate(self.p.nodes) if n.kind == kind and not (form == "gate" and n.tied)]
        init = d.pick(["zeros", "full", "operand", "zeros_like"])
        if init in ("operand", "zeros_like") and same:
            k = self.domain(d.recent(same), "small")
            if k not in args:
                args.append(k)
            n = self.p.nodes[k]
            start = (f"{{{args.index(k)}}}", f"{{{args.index(k)}}}", (n.lo, n.hi), self.zero(k))
            if init == "zeros_like":
                start = (f"tl.zeros_like({{{args.index(k)}}})", f"torch.zeros_like({{{args.index(k)}}})", (0.0, 0.0),
                         (True,) * len(kind))
        elif init == "full":
            c = d.pick([0.5, -1.0, 2.0])
            start = (f"tl.full({self.shape_tl(kind)}, {fmt(c)}, tl.float64)",
                     f"torch.full({self.shape_th(kind)}, {fmt(c)}, dtype=torch.float64)", (c, c), ())
        else:
            start = (f"tl.zeros({self.shape_tl(kind)}, dtype=tl.float64)",
                     f"torch.zeros({self.shape_th(kind)}, dtype=torch.float64)", (0.0, 0.0), (True,) * len(kind))
        add = (lambda hv, fv: (hv[0] + fv[0], hv[1] + fv[1]))
        sub2 = (lambda hv, fv: (hv[0] - 2 * fv[1], hv[1] - 2 * fv[0]))
        if form == "add":
            tl = [d.pick([f"{h} += {x}", f"{h} = {h} + {x}", f"{h} = {x} + {h}"])]
            th, step = [f"{h} = {h} + {x}"], lambda hv, fv, _: add(hv, fv)
        elif form == "sub":
            tl = [d.pick([f"{h} -= {x}", f"{h} = {h} - {x}"])]
            th, step = [f"{h} = {h} - {x}"], lambda hv, fv, _: (hv[0] - fv[1], hv[1] - fv[0])
        elif form == "branch":  # both branches add to it (or one adds, the other keeps it): still linear
            tl = [f"if {test[0]}:", f"    {h} += {x}", "else:", f"    {h} = {h} - 2.0 * {x}"]
            th = [f"if {test[1]}:", f"    {h} = {h} + {x}", "else:", f"    {h} = {h} - 2.0 * {x}"]
            if d.pick([False, False, True]):
                tl, th, sub2 = tl[:2], th[:2], (lambda hv, fv: hv)

            def step(hv, fv, taken):
                return add(hv, fv) if taken else sub2(hv, fv) if taken is False else hull(*add(hv, fv),
                                                                                            *sub2(hv, fv))
        elif form == "gate":  # a branch on the state itself: which way it goes has no gradient
            mask = self.mask_for(kind)
            total = f"tl.sum(tl.where({mask}, {h}, 0.0))" if mask else f"tl.sum({h})" if kind else h
            tl = [f"if {total} > 0.0:", f"    {h} = {h} * 0.5 + {x}", "else:", f"    {h} = {h} - {x}"]
            th = [f"if {h}.sum() > 0.0:", f"    {h} = {h} * 0.5 + {x}", "else:", f"    {h} = {h} - {x}"]
            step = (lambda hv, fv, _: hull(hv[0] * 0.5 + fv[0], hv[1] * 0.5 + fv[1], hv[0] - fv[1], hv[1] - fv[0]))
        elif form == "affine":  # h * a + f, |a| <= 1.25
            how = d.pick(["sigmoid", "const", "operand"])
            a = self.operand(lambda k: broadcast(kind, k) == tuple(kind)) if how == "operand" else None
            if a is not None:
                a = self.domain(a, "unit")
                if a not in args:
                    args.append(a)
                na = self.p.nodes[a]
                tl_a = th_a = f"{{{args.index(a)}}}"
                a_iv = (na.lo, na.hi)
            elif how == "sigmoid":
                tl_a, th_a, a_iv = f"tl.sigmoid({x})", f"torch.sigmoid({x})", (0.0, 1.0)
            else:
                c = d.pick([0.5, -0.75, 1.0])
                tl_a = th_a = fmt(c)
                a_iv = (c, c)
            tl, th = [f"{h} = {h} * {tl_a} + {x}"], [f"{h} = {h} * {th_a} + {x}"]
            step = (lambda hv, fv, _: add(mul_iv(hv, a_iv), fv))
        elif form == "squash":
            how = d.pick(["sigmoid", "sin", "sin_sum"])
            if how == "sigmoid":
                tl, th = [f"{h} = tl.sigmoid({h}) * {x}"], [f"{h} = torch.sigmoid({h}) * {x}"]
                step = (lambda hv, fv, _: mul_iv((sigmoid(hv[0]), sigmoid(hv[1])), fv))
            elif how == "sin":
                tl, th = [f"{h} = tl.sin({h}) * {x}"], [f"{h} = torch.sin({h}) * {x}"]
                step = (lambda hv, fv, _: mul_iv((-1.0, 1.0), fv))
            else:
                tl, th = [f"{h} = tl.sin({h} + {x})"], [f"{h} = torch.sin({h} + {x})"]
                step = (lambda hv, fv, _: (-1.0, 1.0))
        elif form == "feedback":  # the state read back through a reduction of itself
            mask = self.mask_for(kind)
            total = f"tl.sum(tl.where({mask}, {h}, 0.0))" if mask else f"tl.sum({h})" if kind else h
            tl = [f"{h} = {h} * 0.5 + tl.sigmoid({total}) * {x}"]
            th = [f"{h} = {h} * 0.5 + torch.sigmoid({h}.sum()) * {x}"]
            step = (lambda hv, fv, _: add((hv[0] * 0.5, hv[1] * 0.5), mul_iv((0.0, 1.0), fv)))
        elif form == "max":
            tl, th = [f"{h} = tl.maximum({h}, {x})"], [f"{h} = torch.maximum({h}, {x})"]
            step = (lambda hv, fv, _: (max(hv[0], fv[0]), max(hv[1], fv[1])))
        else:  # overwrite: only the last iteration's value reaches what follows
            tl, th, step = [f"{h} = {x}"], [f"{h} = {x}"], lambda hv, fv, _: fv
        zero = tuple(a and b for a, b in zip(start[3] or (False,) * len(kind), f_zero, strict=True)) \
            if form in LINEAR else ()
        return start, tl, th, step, zero, kind

    def op_loop(self):
        """A `for` loop over the slabs z[t] of a stacked input (each of the tile's shape, or of one of its axes,
        or one scalar), carrying a state h: none (each iteration's value stored at its own slab of an output),
        linear (``carried``: h += f, h -= f, a branch choosing how to add), or nonlinear (``carried``, or an
        online logsumexp along an axis). Each iteration's value f may come from an inner loop over slabs
        (nesting) or a tl.dot with the slab."""
        d = self.d
        form = d.pick(["add", "none", "affine", "sub", "branch", "squash", "online", "max", "overwrite", "gate",
                       "feedback"])
        big = [x.name for x in self.p.dims if x.block >= 16]
        source = d.pick(["slab", "slab", "nested", "dot"])
        if source == "dot" and (len(big) < 2 or form in ("online", "none")):  # (x @ x^T is not storable)
            source = "slab"
        if source == "dot":
            dims = tuple(self.real_dims())
        else:
            dims = d.pick([tuple(self.real_dims()), *[(x,) for x in self.real_dims()], ()])
        if form == "online":
            source, dims = "slab", dims or tuple(self.real_dims())
        slabs, inner = d.int(1, 3), (d.int(1, 2) if source == "nested" else 1)  # (the interpreter is slow)
        it = self.loop_range(slabs, visit=form in ("none", "online"))
        visits = it.visits
        uniform = form in ("max", "online", "gate")  # (no ties for maxima and tests)
        inp = self.new_input("stack", dims, "uniform" if uniform else self.dist(), steps=slabs * inner)
        other = 0.0 if source == "dot" else d.pick(OTHERS)
        t = "{self}_t"
        args: list[int] = []
        pre_tl, pre_th, body_tl, body_th = list(it.pre_tl), list(it.pre_th), [], []
        x_lo, x_hi = hull(-INPUT_BOUND, INPUT_BOUND, other)
        x_zero = tuple(other == 0.0 for _ in dims)
        walk = source == "slab" and d.pick([False, False, True])  # a pointer moving along instead of t's address,
        moving_offset = walk and d.pick([False, True])  # or an offset (the tutorial attention's `offsetk_y += BLOCK_N`)
        if source == "nested":  # x: `inner` slabs summed (or folded nonlinearly) by an inner loop
            u, _ = self.count(inner)
            inner_fn = d.pick(["range", "tl.range"] + ["tl.static_range"] * (not u.startswith("T")))
            tl_x, th_x = self.slab_load(inp, self.slab_address(inp, f"({t} * {u} + {{self}}_u)"),
                                        f"{t} * {inner} + {{self}}_u", other)
            affine = d.pick([False, True])
            body_tl += [f"{{self}}_x = tl.zeros({self.shape_tl(dims)}, dtype=tl.float64)",
                        f"for {{self}}_u in {inner_fn}({u}):",
                        f"    {{self}}_x = {{self}}_x * 0.5 + {tl_x}" if affine else f"    {{self}}_x += {tl_x}"]
            body_th += [f"{{self}}_x = torch.zeros({self.shape_th(dims)}, dtype=torch.float64)",
                        f"for {{self}}_u in range({inner}):",
                        f"    {{self}}_x = {{self}}_x{' * 0.5' if affine else ''} + {th_x}"]
            x_lo, x_hi = inner * x_lo, inner * x_hi  # (a bound for both)
        else:
            if moving_offset:
                pre_tl.append(f"{{self}}_o = {it.start}")
            elif walk:
                pre_tl.append(f"{{self}}_p = {self.slab_address(inp, f'({it.start})')}")
            address = self.slab_address(inp, "{self}_o") if moving_offset else "{self}_p" if walk else \
                self.slab_address(inp, t)
            tl_x, th_x = self.slab_load(inp, address, t, other)
            body_tl.append(f"{{self}}_x = {tl_x}")
            body_th.append(f"{{self}}_x = {th_x}")
        fn = d.pick(STEP_FNS) if source != "dot" and form != "online" else STEP_FNS[0]
        f_tl, f_th = fn[1].format("{self}_x"), fn[2].format("{self}_x")
        f_iv, f_zero = fn[3](x_lo, x_hi), tuple(z and fn[4] for z in x_zero)
        kind = dims
        if source == "dot":  # x @ b: b from before the loop, or x^T
            p_, q = dims
            b = self.operand(lambda k: len(k) == 2 and k[0] == q and k[1] in big)
            if b is not None:
                args.append(self.domain(b, "small"))
                nb = self.p.nodes[args[-1]]
                b_tl, b_bound, r = f"{{{len(args) - 1}}}", max(abs(nb.lo), abs(nb.hi)), nb.kind[1]
            else:
                b_tl, b_bound, r = "tl.trans({self}_x)", max(abs(x_lo), abs(x_hi)), p_
            b_th = b_tl.replace("tl.trans({self}_x)", "{self}_x.T")
            bound = self.p.dim(q).block * max(abs(x_lo), abs(x_hi)) * b_bound
            f_tl, f_th, f_iv, kind = f"tl.dot({{self}}_x, {b_tl})", f"{{self}}_x @ {b_th}", (-bound, bound), (p_, r)
            f_zero = (x_zero[0], False)
        elif form not in ("online", "max") and d.pick([False, True]):  # combined with a value from before the loop
            c = self.operand(lambda k: broadcast(dims, k) == dims)
            if c is not None and not (form == "gate" and self.p.nodes[c].tied):
                c = self.domain(c, "small")
                args.append(c)
                nc = self.p.nodes[c]
                op = d.pick(["*", "+"])
                f_tl, f_th = f"{f_tl} {op} {{{len(args) - 1}}}", f"{f_th} {op} {{{len(args) - 1}}}"
                f_iv = mul_iv(f_iv, (nc.lo, nc.hi)) if op == "*" else (f_iv[0] + nc.lo, f_iv[1] + nc.hi)
                cz = self.zero(c, dims)
                f_zero = tuple((a or b) if op == "*" else (a and b) for a, b in zip(f_zero, cz, strict=True))
        if form not in ("online", "dot") and source != "dot" and d.pick([False, False, False, True]):
            f_tl, f_th = f"({f_tl}) * ({t} + 1)", f"({f_th}) * ({t} + 1)"  # the loop index in the arithmetic
            f_iv = mul_iv(f_iv, (1.0, float(slabs)))
        if form not in ("online", "none") and source != "dot" and real(dims) and d.pick([False, False, True]):
            axis = d.pick([None, *range(len(dims))])  # each iteration's value summed (along an axis)
            keep = axis is not None and d.pick([False, True])
            reduced = list(range(len(dims))) if axis is None else [axis]
            mask = None if all(f_zero[p] for p in reduced) else self.mask_for(dims, reduced)
            operand = f"tl.where({mask}, {f_tl}, 0.0)" if mask else f_tl
            spelled = "" if axis is None else f", axis={axis}" + (", keep_dims=True" if keep else "")
            f_tl = f"tl.sum({operand}{spelled})"
            f_th = f"({f_th}).sum(dim={tuple(reduced)}, keepdim={keep})"
            count = math.prod(self.p.dim(dims[p]).block for p in reduced)
            b = max(abs(f_iv[0]), abs(f_iv[1])) * count
            f_iv = (-b, b)
            kind = tuple("1" if p in reduced else k for p, k in enumerate(dims)) if keep else \
                tuple(k for p, k in enumerate(dims) if p not in reduced)
            f_zero = tuple(False if p in reduced else z for p, z in enumerate(f_zero))
            f_zero = f_zero if keep else tuple(z for p, z in enumerate(f_zero) if p not in reduced)
        if form != "online":
            body_tl.append(f"{{self}}_f = {f_tl}")
            body_th.append(f"{{self}}_f = {f_th}")
        test = (f"{t} % 2 == 0", f"{t} % 2 == 0")
        if form == "branch" and d.pick([False, True]):  # on a scalar loaded each iteration
            flags = self.new_input("stack", (), self.dist(), steps=slabs)
            test = (f"tl.load({flags.ptr} + {t}) > 0.0", f"{flags.name}[{t}] > 0.0")
        value_kind, stored = kind, "{self}_f"
        if form == "none":  # no state: each iteration's value is stored; the node passes an operand on
            a = self.operand()
            args.append(a)
            na = self.p.nodes[a]
            tl_value, th_value, lo, hi, zero = f"{{{len(args) - 1}}}", f"{{{len(args) - 1}}}", na.lo, na.hi, na.zero
            value_kind = na.kind
        elif form == "online":  # m, l: the running maximum and the sum of exp(x - m), along `axis`
            axis = d.pick([p for p, k in enumerate(dims) if k != "1"])
            keep = d.pick([False, True])
            out = tuple("1" if p == axis else k for p, k in enumerate(dims)) if keep else \
                tuple(k for p, k in enumerate(dims) if p != axis)
            kw = f"axis={axis}" + (", keep_dims=True" if keep else "")
            again = "" if keep or len(dims) == 1 else ("[:, None]" if axis == 1 else "[None, :]")
            m0 = d.pick(["-float('inf')", fmt(-INPUT_BOUND - 1.0)])  # (inputs lie above the finite one)
            pre_tl += [f"{{self}}_m = tl.full({self.shape_tl(out)}, {m0}, tl.float64)",
                       f"{{self}}_l = tl.zeros({self.shape_tl(out)}, dtype=tl.float64)"]
            pre_th += [f"{{self}}_m = torch.full({self.shape_th(out)}, {m0}, dtype=torch.float64)",
                       f"{{self}}_l = torch.zeros({self.shape_th(out)}, dtype=torch.float64)"]
            body_tl += [f"{{self}}_xm = tl.where({self.mask_for(dims, [axis])}, {{self}}_x, -float('inf'))",
                        f"{{self}}_mn = tl.maximum({{self}}_m, tl.max({{self}}_xm, {kw}))",
                        f"{{self}}_l = {{self}}_l * tl.exp({{self}}_m - {{self}}_mn) + "
                        f"tl.sum(tl.exp({{self}}_xm - {{self}}_mn{again}), {kw})",
                        "{self}_m = {self}_mn"]
            th_again = "" if keep or len(dims) == 1 else f".unsqueeze({axis})"
            body_th += [f"{{self}}_mn = torch.maximum({{self}}_m, {{self}}_x.amax(dim={axis}, keepdim={keep}))",
                        f"{{self}}_l = {{self}}_l * torch.exp({{self}}_m - {{self}}_mn) + "
                        f"torch.exp({{self}}_x - {{self}}_mn{th_again}).sum(dim={axis}, keepdim={keep})",
                        "{self}_m = {self}_mn"]
            tl_value, th_value = "{self}_m + tl.log({self}_l)", "{self}_m + torch.log({self}_l)"
            lo, hi = x_lo, x_hi + math.log(self.p.dim(dims[axis]).block * len(visits))
            zero, value_kind, stored = (), out, "{self}_m"
        else:
            (init_tl, init_th, h_iv, _), up_tl, up_th, update, zero, value_kind = self.carried(
                form, kind, f_zero, args, test, ("{self}_h", "{self}_f"))
            acc = source == "dot" and form == "add" and value_kind == kind and d.pick([False, True])
            if acc:  # tl.dot(x, b, h)
                body_tl.pop()
                up_tl = [f"{{self}}_h = {f_tl[:-1]}, {{self}}_h)"]
            pre_tl.append(f"{{self}}_h = {init_tl}")
            pre_th.append(f"{{self}}_h = {init_th}")
            body_tl += up_tl
            body_th += up_th
            states = [h_iv]
            for v in visits:
                states.append(update(states[-1], f_iv, v % 2 == 0 if "%" in test[1] and not it.dynamic else None))
            lo, hi = hull(*(sum(states, ()) if it.dynamic else states[-1]))  # (dynamic: any of them)
            tl_value, th_value = "{self}_h", "{self}_h"
            if acc or d.pick([False, True]):
                stored = "{self}_h"
        if form == "none" or (visits and d.pick([False, False, True])):  # each iteration's value (or state) stored
            skind = kind if stored == "{self}_f" else value_kind
            if stored == "{self}_m":
                skind = out
            covers = sorted(visits) == list(range(slabs))  # the index names the slab; else count iterations
            spelling = "index" if covers else d.pick(["counter", "pointer"])
            if it.dynamic or d.pick([False, False, False, True]):  # added into one place every iteration
                spelling = "atomic"
            if storable(skind) and spelling == "atomic":
                store, _, offset, mask, index = self.loop_output(skind, atomic=True)
                body_tl.append(f"tl.atomic_add({store.name}_ptr" + (f" + {offset}" if offset else "") +
                               f", {stored}" + (f", mask={mask})" if mask else ")"))
                body_th.append(f"{store.name}[{index}] = {store.name}[{index}] + {stored}")
            elif storable(skind) and visits:
                store, shape, offset, mask, index = self.loop_output(skind, lead=slabs if covers else len(visits))
                slab = math.prod(shape)
                if spelling == "pointer":
                    pre_tl.append(f"{{self}}_q = {store.name}_ptr" + (f" + {offset}" if offset else ""))
                    address = "{self}_q"
                else:
                    if spelling == "counter":
                        pre_tl.append("{self}_i = tl.zeros((), dtype=tl.int32)")
                    address = f"{store.name}_ptr + {t if covers else '{self}_i'} * {slab}" + (
                        f" + {offset}" if offset else "")
                body_tl.append(f"tl.store({address}, {stored}" + (f", mask={mask})" if mask else ")"))
                body_th.append(f"{store.name}[{t if covers else '{self}_i'}, {index}] = {stored}")
                if spelling == "pointer":
                    body_tl.append(f"{{self}}_q += {slab}")
                elif spelling == "counter":
                    body_tl.append("{self}_i += 1")
        if moving_offset:
            body_tl.append(f"{{self}}_o += {it.step}")
        elif walk:
            size = " * ".join(self.p.dim(k).SIZE for k in dims)
            body_tl.append(f"{{self}}_p += {it.step}" + (f" * {size}" if size else ""))
        pre_tl += [f"for {t} in {it.tl}:"] + ["    " + line for line in body_tl]
        pre_th += [f"for {{self}}_i, {t} in enumerate({it.th}):"] + ["    " + line for line in body_th]
        label = f"loop_{form}" + ("" if source == "slab" else f"_{source}")
        self.push(Node(value_kind, lo, hi, tl_value, th_value, tuple(args), label, pre_tl=tuple(pre_tl),
                       pre_th=tuple(pre_th), zero=zero, tied=inp.dist == "ties"))

    def op_columns(self):
        """A loop over column blocks of a wide input c[rows, :L], rows along a tile axis, LayerNorm-style:
        each block's row sums (or maxima) carried into a state (linearly or not, as in ``op_loop``), summed
        in a tile reduced after the loop, or folded into an online logsumexp; or only stored (no state)."""
        d = self.d
        a = d.pick(self.p.dims)
        bc = d.pick([8, 4, 16])
        width = d.pick([2 * bc - 1, bc, 2 * bc + 3, 1, bc - 1])
        form = d.pick(["sum", "tile", "online", "none", "max"])
        update = d.pick(["add", "affine", "branch", "squash", "sub", "max", "overwrite", "gate", "feedback"])
        uniform = form in ("online", "max") or update in ("gate", "max")  # (a running maximum of tied sums: torch
        # may round a sum that ties here to one that does not, and send its gradient the other way)
        inp = self.new_input("wide", (a.name,), "uniform" if uniform else self.dist(), steps=width)
        L, constexpr = self.count(width)
        BC = f"BC{len(self.p.meta)}" if d.pick([False, True]) else str(bc)  # a constexpr parameter, or literal
        if BC != str(bc):
            self.p.meta[BC] = bc
        blocks = list(range(0, width, bc))
        header = d.pick(["offsets", "blocks", "moving"])
        pre_tl, pre_th, body_tl, body_th, args = [], [], [], [], []
        if header == "blocks":  # the block number, and its columns
            pre_tl.append(f"for {{self}}_b in tl.range(0, tl.cdiv({L}, {BC})):")
            body_tl.append(f"{{self}}_cols = {{self}}_b * {BC} + tl.arange(0, {BC})")
        else:
            fn = d.pick(["range", "tl.range"] + ["tl.static_range"] * constexpr)
            pre_tl.append(f"for {{self}}_c in {fn}(0, {L}, {BC}):")
            if header == "moving":  # the columns carried from one iteration to the next
                pre_tl.insert(0, f"{{self}}_cols = tl.arange(0, {BC})")
            else:
                body_tl.append(f"{{self}}_cols = {{self}}_c + tl.arange(0, {BC})")
        pre_th.append(f"for {{self}}_i, {{self}}_c in enumerate(range(0, {width}, {bc})):")
        cols = f"{{self}}_cols[None, :] < {L}"
        other = d.pick(OTHERS)
        body_tl.append(f"{{self}}_x = tl.load({inp.ptr} + {a.idx}[:, None] * {L} + {{self}}_cols[None, :], "
                       f"mask={a.mask}[:, None] & ({cols}), other={fmt(other)})")
        body_th.append(f"{{self}}_x = {inp.name}[{a.lo}:{a.hi}, {{self}}_c:min({{self}}_c + {bc}, {width})]")
        x_iv = hull(-INPUT_BOUND, INPUT_BOUND, other)
        fn = d.pick(STEP_FNS) if form != "online" else STEP_FNS[0]
        f_tl, f_th, f_iv, zero_ok = fn[1].format("{self}_x"), fn[2].format("{self}_x"), fn[3](*x_iv), fn[4]
        c = self.operand(lambda k: k in ((a.name,), ())) if form != "online" and d.pick([False, True]) else None
        if c is not None and not (update == "gate" and self.p.nodes[c].tied):  # times a row vector (or scalar)
            c = self.domain(c, "small")
            args.append(c)
            nc = self.p.nodes[c]
            sub_ = "[:, None]" if nc.kind else ""
            f_tl, f_th = f"{f_tl} * {{0}}{sub_}", f"{f_th} * {{0}}{sub_}"
            f_iv = mul_iv(f_iv, (nc.lo, nc.hi))
        bare = other == 0.0 and zero_ok and d.pick([False, True])  # masked columns hold 0 already
        summed = f_tl if bare else f"tl.where({cols}, {f_tl}, 0.0)"
        b = max(abs(f_iv[0]), abs(f_iv[1])) * bc
        lo, hi, zero, kind = -b * len(blocks), b * len(blocks), (), (a.name,)
        if form == "none":  # each block stored at its columns of an output
            na = self.p.nodes[self.operand()]
            args.append(self.p.nodes.index(na))
            store, _, offset, mask, index = self.loop_output((a.name,), tail=width)
            body_tl.append(f"tl.store({store.name}_ptr + ({offset})[:, None] * {L} + {{self}}_cols[None, :], "
                           f"{f_tl}, mask={mask}[:, None] & ({cols}))")
            body_th.append(f"{store.name}[{index}, {{self}}_c:min({{self}}_c + {bc}, {width})] = {f_th}")
            value, th_value, lo, hi, zero, kind = (f"{{{len(args) - 1}}}", f"{{{len(args) - 1}}}", na.lo, na.hi,
                                                   na.zero, na.kind)
        elif form == "tile":  # a (rows, BC) accumulator, summed along the columns after the loop
            pre_tl.insert(0, f"{{self}}_acc = tl.zeros(({a.BLOCK}, {BC}), dtype=tl.float64)")
            pre_th.insert(0, f"{{self}}_acc = torch.zeros(({a.valid},), dtype=torch.float64)")
            body_tl.append(d.pick([f"{{self}}_acc += {summed}", f"{{self}}_acc = {{self}}_acc + {summed}"]))
            body_th.append(f"{{self}}_acc = {{self}}_acc + ({f_th}).sum(1)")
            value, th_value = "tl.sum({self}_acc, axis=1)", "{self}_acc"
        elif form == "online":  # m, l: the running maximum and the sum of exp(x - m) along the rows
            m0 = d.pick(["-float('inf')", fmt(-INPUT_BOUND - 1.0)])
            pre_tl[:0] = [f"{{self}}_m = tl.full(({a.BLOCK},), {m0}, tl.float64)",
                          f"{{self}}_l = tl.zeros(({a.BLOCK},), dtype=tl.float64)"]
            pre_th[:0] = [f"{{self}}_m = torch.full(({a.valid},), {m0}, dtype=torch.float64)",
                          f"{{self}}_l = torch.zeros(({a.valid},), dtype=torch.float64)"]
            body_tl += [f"{{self}}_xm = tl.where({cols}, {{self}}_x, -float('inf'))",
                        "{self}_mn = tl.maximum({self}_m, tl.max({self}_xm, axis=1))",
                        "{self}_alpha = tl.exp({self}_m - {self}_mn)",
                        "{self}_e = tl.exp({self}_xm - {self}_mn[:, None])",
                        "{self}_l = {self}_l * {self}_alpha + tl.sum({self}_e, axis=1)"]
            body_th += ["{self}_mn = torch.maximum({self}_m, {self}_x.amax(1))",
                        "{self}_alpha = torch.exp({self}_m - {self}_mn)",
                        "{self}_e = torch.exp({self}_x - {self}_mn[:, None])",
                        "{self}_l = {self}_l * {self}_alpha + {self}_e.sum(1)"]
            value, th_value = "{self}_m + tl.log({self}_l)", "{self}_m + torch.log({self}_l)"
            lo, hi = x_iv[0], x_iv[1] + math.log(width)
            if d.pick([False, True]):  # attention's: the average of a second input weighted by softmax(x)
                v = self.new_input("wide", (a.name,), self.dist(), steps=width)
                pre_tl.insert(0, f"{{self}}_acc = tl.zeros(({a.BLOCK},), dtype=tl.float64)")
                pre_th.insert(0, f"{{self}}_acc = torch.zeros(({a.valid},), dtype=torch.float64)")
                body_tl += [f"{{self}}_v = tl.load({v.ptr} + {a.idx}[:, None] * {L} + {{self}}_cols[None, :], "
                            f"mask={a.mask}[:, None] & ({cols}), other=0.0)",
                            "{self}_acc = {self}_acc * {self}_alpha + tl.sum({self}_e * {self}_v, axis=1)"]
                body_th += [f"{{self}}_v = {v.name}[{a.lo}:{a.hi}, {{self}}_c:min({{self}}_c + {bc}, {width})]",
                            "{self}_acc = {self}_acc * {self}_alpha + ({self}_e * {self}_v).sum(1)"]
                value, th_value, lo, hi = "{self}_acc / {self}_l", "{self}_acc / {self}_l", -INPUT_BOUND, INPUT_BOUND
                form = "attention"
            body_tl.append("{self}_m = {self}_mn")
            body_th.append("{self}_m = {self}_mn")
        else:  # each block's row sums (or maxima) update a state
            if form == "max":
                neutral = d.pick(["-float('inf')", fmt(math.floor(f_iv[0]) - 1.0)])
                f_tl, f_th = f"tl.max(tl.where({cols}, {f_tl}, {neutral}), axis=1)", f"({f_th}).amax(1)"
            else:
                f_tl, f_th, f_iv = f"tl.sum({summed}, axis=1)", f"({f_th}).sum(1)", (-b, b)
            body_tl.append(f"{{self}}_f = {f_tl}")
            body_th.append(f"{{self}}_f = {f_th}")
            test = (f"{{self}}_c % (2 * {BC}) == 0", f"{{self}}_c % {2 * bc} == 0")
            if header == "blocks":
                test = ("{self}_b % 2 == 0", f"{{self}}_c % {2 * bc} == 0")
            (init_tl, init_th, h_iv, _), up_tl, up_th, step, zero, kind = self.carried(
                update, kind, (False,), args, test, ("{self}_h", "{self}_f"))
            pre_tl.insert(0, f"{{self}}_h = {init_tl}")
            pre_th.insert(0, f"{{self}}_h = {init_th}")
            body_tl += up_tl
            body_th += up_th
            for i in range(len(blocks)):
                h_iv = step(h_iv, f_iv, i % 2 == 0)
            value, th_value, (lo, hi) = "{self}_h", "{self}_h", h_iv
        if header == "moving":
            body_tl.append(f"{{self}}_cols += {BC}")
        n = len(pre_tl) - 1  # the `for` line is the last of pre_tl
        pre_tl = pre_tl[:n + 1] + ["    " + line for line in body_tl]
        pre_th = pre_th + ["    " + line for line in body_th]
        self.push(Node(kind, lo, hi, value, th_value, tuple(args), f"cols_{form}" + (
            f"_{update}" if form in ("sum", "max") else ""), pre_tl=tuple(pre_tl), pre_th=tuple(pre_th), zero=zero,
            tied=inp.dist == "ties"))

    def branch_tests(self, how: str, count: int) -> tuple[list[str], list[str], list[str], list[str], list[int]]:
        """``count`` tests of an if/elif chain: kernel, mirror, lines before the `if` (kernel, mirror), and
        the node the tests read as ``{c}``, if any."""
        d = self.d
        if how == "pid" and self.p.grid_dims:  # programs take different branches
            g = d.pick(self.p.grid_dims)
            tests = [f"pid_{g.axis} % {count + 1} == {j}" for j in range(count)]
            return tests, tests, [], [], []
        if how == "constexpr":  # a constexpr parameter: a flag, or a mode
            flag = f"F{len(self.p.meta)}"
            if count == 1:
                self.p.meta[flag] = d.pick([True, False])
                return [flag], [str(self.p.meta[flag])], [], [], []
            self.p.meta[flag] = d.int(0, count)
            return ([f"{flag} == {j}" for j in range(count)], [f"{self.p.meta[flag]} == {j}" for j in range(count)],
                    [], [], [])
        cuts = sorted({d.pick([0.0, 0.5, -0.5, 1.0, -1.0]) for _ in range(count)}, reverse=True)
        cuts += [cuts[-1] - 1.0 - j for j in range(count - len(cuts))]
        scalar = self.operand(lambda k: k == ())
        if how == "computed" and scalar is not None and not self.fragile(scalar):  # a value the kernel computed
            n = self.p.nodes[scalar]
            mid = round((n.lo + n.hi) / 2, 1)
            tests = [f"{{c}} > {fmt(mid + c)}" for c in cuts]
            return tests, tests, [], [], [scalar]
        scalars = [x for x in self.p.inputs if x.role == "scalar" and x.per_program]
        inp = d.pick(scalars) if scalars and d.pick([False, True]) else \
            self.new_input("scalar", (), self.dist(), per_program=True)
        tl_pid, th_pid = self.program_index()
        load, th_load = f"tl.load({inp.ptr} + {tl_pid})", f"{inp.name}[{th_pid}]"
        if count == 1 and d.pick([False, True]):  # the load in the test itself
            return [f"{load} > {fmt(cuts[0])}"], [f"{th_load} > {fmt(cuts[0])}"], [], [], []
        tests = [f"{{self}}_s > {fmt(c)}" for c in cuts]
        return tests, tests, [f"{{self}}_s = {load}"], [f"{{self}}_s = {th_load}"], []

    def program_index(self) -> tuple[str, str]:
        """The program's number, flattened over the grid (kernel, mirror)."""
        gd = self.p.grid_dims
        if not gd:
            return "0", "0"
        tl = " + ".join([f"pid_{g.axis} * {self.p.nprog(h.axis)}" for g in gd[:-1] for h in gd[1:]]
                        + [f"pid_{gd[-1].axis}"])
        th = " + ".join([f"pid_{g.axis} * {h.programs}" for g in gd[:-1] for h in gd[1:]] + [f"pid_{gd[-1].axis}"])
        return tl, th

    def alternative(self, kind, args: list[int]) -> tuple[list[str], list[str], float, float, tuple]:
        """One branch's lines assigning ``{self}_r``, a value of ``kind`` from ``{x}`` (the branch's operand)
        and maybe a load, a loop or another value: kernel, mirror, interval, zero."""
        d = self.d
        x = self.p.nodes[args[0]]
        how = d.pick(["unary", "binary", "load", "const", "loop"])
        if how == "loop" and list(kind) in [self.real_dims(), []] + [[k] for k in self.real_dims()]:
            slabs = d.int(1, 3)  # a loop over slabs, added (or folded nonlinearly) into the operand
            inp = self.new_input("stack", kind, self.dist(), steps=slabs)
            other = d.pick(OTHERS)
            tl, th = self.slab_load(inp, self.slab_address(inp, "{self}_t"), "{self}_t", other)
            n, _ = self.count(slabs)
            affine = d.pick([False, True])
            lo, hi = x.lo, x.hi
            load = hull(-INPUT_BOUND, INPUT_BOUND, other)
            for _ in range(slabs):
                lo, hi = (lo * 0.5 + load[0], hi * 0.5 + load[1]) if affine else (lo + load[0], hi + load[1])
            step = "{self}_r = {self}_r * 0.5 + " if affine else "{self}_r += "
            return (["{self}_r = {x}", f"for {{self}}_t in range({n}):", f"    {step}{tl}"],
                    ["{self}_r = {x}", f"for {{self}}_t in range({slabs}):",
                     f"    {{self}}_r = {{self}}_r{' * 0.5' if affine else ''} + {th}"], lo, hi, ())
        tl, th, lo, hi, zero = self.expression(kind, args, "unary" if how == "loop" else how)
        return [f"{{self}}_r = {tl}"], [f"{{self}}_r = {th}"], lo, hi, zero

    def expression(self, kind, args: list[int], how: str) -> tuple[str, str, float, float, tuple]:
        """A value of ``kind`` from ``{x}``, the node ``args[0]`` (unary, binary, a load, a constant)."""
        d = self.d
        x = self.p.nodes[args[0]]
        if how == "load":
            load = self.plain_load(kind)
            if load is not None:
                tl, th, lo, hi, zero = load
                if d.pick([False, True]):
                    return f"{tl} * {{x}}", f"{th} * {{x}}", *mul_iv((lo, hi), (x.lo, x.hi)), \
                        tuple(a or b for a, b in zip(zero, x.zero, strict=True))
                return tl, th, lo, hi, zero
            how = "unary"
        if how == "binary":
            b = self.operand(lambda k: broadcast(kind, k) == tuple(kind))
            b = self.domain(b, "small")
            if b not in args:
                args.append(b)
            nb = self.p.nodes[b]
            op = d.pick(["+", "*", "-"])
            iv = {"+": (x.lo + nb.lo, x.hi + nb.hi), "-": (x.lo - nb.hi, x.hi - nb.lo),
                  "*": mul_iv((x.lo, x.hi), (nb.lo, nb.hi))}[op]
            return f"{{x}} {op} {{{args.index(b)}}}", f"{{x}} {op} {{{args.index(b)}}}", *iv, ()
        if how == "const":
            c = d.pick(CONSTANTS)
            return f"{{x}} * {fmt(c)} + 1.0", f"{{x}} * {fmt(c)} + 1.0", *hull(x.lo * c + 1, x.hi * c + 1), ()
        label, tl, th, _, iv = d.pick([u for u in UNARY if u[3] == "any" and u[0] not in TIE_SENSITIVE])
        return tl.replace("{0}", "{x}"), th.replace("{0}", "{x}"), *iv(x.lo, x.hi), \
            (x.zero if label in ZERO_AT_ZERO else ())

    def op_branch(self):
        """A runtime `if` / `elif` / `else` on a loaded scalar, a computed one or the program id, or a
        constexpr `if` on a constexpr parameter: each branch assigns the value (some through loads), used
        after; or an `if` alone replaces the value assigned before it."""
        d = self.d
        a = self.domain(self.operand(), "small")
        kind = self.kind_of(a)
        args = [a]
        how = d.pick(["loaded", "pid", "computed", "constexpr"])
        branches = d.pick([2, 3, 1])
        tests, th_tests, pre_tl, pre_th, reads = self.branch_tests(how, max(branches - 1, 1))
        for i in reads:
            args.append(i)
            tests = [t.replace("{c}", f"{{{len(args) - 1}}}") for t in tests]
            th_tests = [t.replace("{c}", f"{{{len(args) - 1}}}") for t in th_tests]
        values = [self.alternative(kind, args) for _ in range(branches)]
        na = self.p.nodes[a]
        x = "{0}"
        if branches == 1:  # the `if` replaces the value assigned before it
            pre_tl.append("{self}_r = {0}")
            pre_th.append("{self}_r = {0}")
            values.append(([], [], na.lo, na.hi, na.zero))
            x = "{self}_r"
        store = None
        if branches > 1 and storable(kind) and d.pick([False, False, False, True]):  # stored in every branch
            store, _, offset, mask, index = self.loop_output(kind)
            address = f"{store.name}_ptr" + (f" + {offset}" if offset else "")
        for j, (tl, th, *_) in enumerate(values[:len(tests) + 1] if branches > 1 else values[:1]):
            head = f"if {tests[0]}:" if j == 0 else f"elif {tests[j]}:" if j < len(tests) else "else:"
            th_head = f"if {th_tests[0]}:" if j == 0 else f"elif {th_tests[j]}:" if j < len(tests) else "else:"
            if store is not None:
                tl = tl + [f"tl.store({address}, {{self}}_r" + (f", mask={mask})" if mask else ")")]
            pre_tl += [head] + [f"    {line.replace('{x}', x)}" for line in tl]
            pre_th += [th_head] + [f"    {line.replace('{x}', x)}" for line in th]
        if store is not None:
            pre_th.append(f"{store.name}[{index}] = {{self}}_r")
        lo, hi = hull(*[v[2] for v in values], *[v[3] for v in values])
        zero = tuple(all(z) for z in zip(*[v[4] or (False,) * len(kind) for v in values], strict=True)) if kind else ()
        how = ("pid" if "pid_" in tests[0] else "constexpr" if tests[0].startswith("F") else
               "computed" if reads else "loaded")
        text = "\n".join(pre_tl)
        helper = "tl.load" not in text and "tl.store" not in text and d.pick([False, False, True])  # in a helper
        early = helper and d.pick([False, True])  # spelled with early returns: `if c: return a` ... `return b`
        self.push(Node(kind, lo, hi, "{self}_r", "{self}_r", tuple(args), f"branch_{how}_{branches}" + (
            "_helper" if helper else "") + ("_return" if early else ""), helper=int(helper), early=early,
            pre_tl=tuple(pre_tl), pre_th=tuple(pre_th), zero=zero))

    def op_early_return(self):
        """``if <test>: return`` in the kernel: the programs it holds for stop there, skipping what follows,
        stores included (outputs start at 0, as a host zero-fills them); a loaded, computed or program-id
        test, or a constexpr flag. The mirror ``continue`` s to the next program."""
        d = self.d
        if sum(n.label.startswith("return_") for n in self.p.nodes) >= 2:
            return self.op_binary()
        if self.p.launch is not None and (self.p.launch.loop or self.p.launch.collide):
            return self.op_binary()  # a return would end the program's loop over its tiles (or a collision)
        a = self.operand()
        args = [a]
        how = d.pick(["loaded", "pid", "computed", "constexpr"])
        tests, th_tests, pre_tl, pre_th, reads = self.branch_tests(how, 1)
        for i in reads:
            args.append(i)
            tests = [t.replace("{c}", f"{{{len(args) - 1}}}") for t in tests]
            th_tests = [t.replace("{c}", f"{{{len(args) - 1}}}") for t in th_tests]
        how = ("pid" if "pid_" in tests[0] else "constexpr" if tests[0].startswith("F") else
               "computed" if reads else "loaded")
        self.p.returns = True
        self.p.stopped |= how == "constexpr" and self.p.meta.get(tests[0]) is True
        n = self.p.nodes[a]
        self.push(Node(n.kind, n.lo, n.hi, "{0}", "{0}", tuple(args), f"return_{how}",
                       pre_tl=(*pre_tl, f"if {tests[0]}:", "    return"),
                       pre_th=(*pre_th, f"if {th_tests[0]}:", "    continue"), zero=n.zero, tied=n.tied))

    def op_multistore(self):
        """A value stored in parts into one output at disjoint addresses: side by side (the halves of a rotary
        embedding: ``y + j * slab + offs``) or interleaved (statistics of a row: ``y + offs * P + j``), each
        part a value of the same kind; or, sometimes, parts that overlap (``y + j * (slab - 1) + offs``),
        which the backward must refuse."""
        d = self.d
        a = self.operand(storable)
        if a is None:
            return self.op_binary()
        kind = self.kind_of(a)
        parts = d.int(2, 3)
        args = [a]
        values = []
        for j in range(parts):
            b = self.operand(lambda k, kind=kind: k == kind) if j and d.pick([False, True]) else a
            if b not in args:
                args.append(b)
            c = d.pick([None, 2.0, -0.5])
            x = f"{{{args.index(b)}}}"
            values.append(x if c is None else f"{x} * {fmt(c)}")
        how = d.pick(["lead", "lead", "tail", "tail", "overlap"])
        store, shape, offset, mask, index = self.loop_output(kind, **{"tail" if how == "tail" else "lead": parts})
        y = f"{store.name}_ptr"
        pre_tl, pre_th = [], []
        if how == "tail":
            spelled, _ = self.count(parts)
            addresses = [f"{y} + ({offset}) * {spelled}" + (f" + {j}" if j else "") if offset else f"{y} + {j}"
                         for j in range(parts)]
            targets = [f"{store.name}[{index}, {j}]" for j in range(parts)]
        else:
            slab = math.prod(shape) - (how == "overlap")
            spelled, _ = self.count(slab)
            addresses = [y + (f" + {j} * {spelled}" if j else "") + (f" + {offset}" if offset else "")
                         for j in range(parts)]
            targets = [f"{store.name}[{j}, {index}]" for j in range(parts)]
        if how == "overlap" and not self.p.stopped:  # (after a taken constexpr return they are never run)
            self.p.expect = "tl.store"
        for address, value, target in zip(addresses, values, targets, strict=True):
            pre_tl.append(f"tl.store({address}, {value}" + (f", mask={mask})" if mask else ")"))
            pre_th.append(f"{target} = {value}")
        n = self.p.nodes[a]
        self.push(Node(kind, n.lo, n.hi, "{0}", "{0}", tuple(args), f"multistore_{how}_{parts}",
                       pre_tl=tuple(pre_tl), pre_th=tuple(pre_th), zero=n.zero, tied=n.tied))

    def op_scatter(self):
        """A value stored where an index loaded per program says (a mixture of experts' permutation: the block
        of program ``pid`` goes to block ``perm[pid]``; or a start offset per program); sometimes two programs
        are given one destination, which the backward must refuse at launch."""
        d = self.d
        a = self.operand(storable)
        if a is None or not self.p.grid_dims:
            return self.op_binary()
        g = d.pick(self.p.grid_dims)
        kind = self.kind_of(a)
        outermost = not [h for h in self.p.grid_dims if h.name not in kind] and real(kind)[:1] == [g.name]
        how = d.pick(["perm", "perm", "start"]) if outermost else "perm"  # (start offsets of blocks that
        # interleave with other programs' are refused: their ranges meet, and an offset is not a block index)
        collide = g.programs >= 2 and d.pick([False] * 5 + [True])
        scale = g.block if how == "start" else 1
        pair = sorted(d.pick([(0, 1), (1, 0), (0, g.programs - 1)]) if collide else (0, 0))
        dist = f"collide:{pair[0]}:{pair[1]}" if collide and pair[0] != pair[1] else "perm"
        idx = self.new_input("perm", (g.name,), dist, vocab=g.programs, steps=scale)
        if dist != "perm" and not self.p.stopped:  # (after a taken constexpr return they are never run)
            self.p.expect = "computed from loaded data"
        shape, offset, mask, index = scatter_layout(self.p, kind, g, how)
        store = Store(len(self.p.nodes), f"y{len(self.p.stores)}", kind, inside=True, zeroed=True, shape=tuple(shape))
        self.p.stores.append(store)
        pre_tl = [f"{{self}}_dst = tl.load({idx.ptr} + pid_{g.axis})",
                  f"tl.store({store.name}_ptr + {offset}, {{0}}" + (f", mask={mask})" if mask else ")")]
        pre_th = [f"{{self}}_dst = int({idx.name}[pid_{g.axis}])", f"{store.name}[{index}] = {{0}}"]
        n = self.p.nodes[a]
        self.push(Node(kind, n.lo, n.hi, "{0}", "{0}", (a,), f"scatter_{how}" + ("_collide" if collide else ""),
                       pre_tl=tuple(pre_tl), pre_th=tuple(pre_th), zero=n.zero, tied=n.tied))


    def op_lane_split(self):
        """A value stored at an address that splits each lane's flat index (over the whole tensor, the programs'
        offsets included) into several coordinates with ``//`` and ``%``, each scaled by its stride in a layout
        that permutes them (an im2col convolution storing NCHW from a flat index: ``n = offs // (H * W);
        hw = offs % (H * W); h = hw // W; w = hw % W``, or ``h = (offs // W) % H``, four spellings); the extents
        multiply to the flat range (mostly, where small ones divide it) or a little less (its last lanes then masked
        off: ``offs < total``). Sometimes the outermost stride is one short, or the last digit is taken by one less
        than its extent, so two lanes collide, which the backward must refuse."""
        d = self.d
        a = self.operand(lambda k: bool(k) and "1" not in k and storable(k))
        if a is None:
            return self.op_multistore()
        kind = self.kind_of(a)
        dims = [self.p.dim(k) for k in kind]
        total = math.prod(x.size for x in dims)
        inner: list[int] = []
        exact = d.pick([True, True, False])  # extents that divide the flat range where they can (no tail masked)
        for _ in range(d.pick([1, 1, 2])):  # the coordinates after the first
            fits = [e for e in (3, 2, 4, 5) if math.prod(inner) * e * 2 <= total]
            divide = [e for e in fits if (total // math.prod(inner)) % e == 0]
            e = d.pick((divide if exact else []) or fits or [2])
            if e in fits:
                inner.append(e)
        if not inner:
            return self.op_multistore()
        extents = [total // math.prod(inner), *inner]
        covered = math.prod(extents)  # <= total: the flat indices stored
        spelled = [self.count(e)[0] for e in extents]
        rank = len(extents)
        # the flat index of each lane, row-major over the value's axes
        if len(dims) == 1:
            flat_tl, flat_th = dims[0].idx, f"torch.arange({dims[0].lo}, {dims[0].hi})"
        else:
            flat_tl = f"{dims[0].idx}[:, None] * {dims[1].SIZE} + {dims[1].idx}[None, :]"
            flat_th = (f"torch.arange({dims[0].lo}, {dims[0].hi})[:, None] * {dims[1].size} + "
                       f"torch.arange({dims[1].lo}, {dims[1].hi})[None, :]")

        def product(names):
            return " * ".join(names) if names else "1"

        pre_tl = [f"{{self}}_f = {flat_tl}"]
        pre_th = [f"{{self}}_f = {flat_th}"]
        if d.pick([False, True]):
            if d.pick([True, False]):  # chained: c0 = f // (e1 * e2); r0 = f % (e1 * e2); c1 = r0 // e2; c2 = r0 % e2
                rest = "{self}_f"
                for j in range(rank - 1):
                    after = product(spelled[j + 1:])
                    after = f"({after})" if j < rank - 2 else after
                    pre_tl.append(f"{{self}}_c{j} = {rest} // {after}")
                    if j < rank - 2:
                        pre_tl.append(f"{{self}}_r{j} = {rest} % {after}")
                        rest = f"{{self}}_r{j}"
                    else:
                        pre_tl.append(f"{{self}}_c{j + 1} = {rest} % {after}")
            else:  # the quotients chained: c2 = f % e2; q2 = f // e2; c1 = q2 % e1; c0 = q2 // e1
                rest = "{self}_f"
                for j in range(rank - 1, 0, -1):
                    pre_tl.append(f"{{self}}_c{j} = {rest} % {spelled[j]}")
                    last = j == 1
                    pre_tl.append(f"{{self}}_{'c0' if last else f'q{j}'} = {rest} // {spelled[j]}")
                    rest = f"{{self}}_q{j}"
        elif d.pick([True, False]):  # each coordinate at once: (f // stride) % extent (an im2col output pixel)
            for j in range(rank):
                c = f"{{self}}_f // ({product(spelled[j + 1:])})" if j < rank - 1 else "{self}_f"
                pre_tl.append(f"{{self}}_c{j} = " + (f"({c}) % {spelled[j]}" if j else c))
        else:  # each at once, the remainder first: (f % (extent * stride)) // stride
            for j in range(rank):
                below = f"{{self}}_f % ({product(spelled[j:])})" if j else "{self}_f"
                pre_tl.append(f"{{self}}_c{j} = " + (f"({below}) // ({product(spelled[j + 1:])})"
                                                     if j < rank - 1 else f"{{self}}_f % {spelled[j]}"))
        coords_tl = [f"{{self}}_c{j}" for j in range(rank)]
        for j in range(rank):
            after = math.prod(extents[j + 1:])
            pre_th.append(f"{{self}}_c{j} = {{self}}_f // {after}" + (f" % {extents[j]}" if j else ""))
        orders = [o for o in itertools.permutations(range(rank)) if list(o) != list(range(rank))]
        order = d.pick(orders + [tuple(range(rank))] * (d.pick([False] * 5 + [True])))
        collide = (extents[order[0]] >= 2 and math.prod(extents[o] for o in order[1:]) >= 2 and not self.p.returns
                   and d.pick([False] * 5 + [True]))
        fold = not collide and not self.p.returns and d.pick([False] * 7 + [True])
        if fold:
            # the last digit taken by one less than its extent: lanes 0 and e - 1 share every digit (refused:
            # the digits no longer determine the flat index)
            last = next(i for i, line in enumerate(pre_tl) if line.startswith(f"{{self}}_c{rank - 1} = "))
            pre_tl[last] = f"{{self}}_c{rank - 1} = {{self}}_f % ({spelled[-1]} - 1)"
        # the output: a slot per program along the grid axes the value does not tile, then the permuted layout
        uncovered = [g for g in self.p.grid_dims if g.name not in kind]
        layout = [extents[o] for o in order]
        shape = [g.programs for g in uncovered] + layout
        terms, index = [], []
        for pos, g in enumerate(uncovered):
            stride = " * ".join([self.p.nprog(h.axis) for h in uncovered[pos + 1:]] + spelled)
            terms.append(f"pid_{g.axis} * {stride}")
            index.append(f"pid_{g.axis}")
        for pos, o in enumerate(order):
            after = [spelled[q] for q in order[pos + 1:]]
            stride = product(after)
            if pos == 0 and collide:
                stride = f"({stride} - 1)"
            terms.append(coords_tl[o] + (f" * {stride}" if after else ""))
            index.append(f"{{self}}_c{o}[{{self}}_k]")
        mask = self.mask_for(kind)
        if covered < total:
            mask = f"({mask}) & ({{self}}_f < {product(spelled)})" if mask else f"{{self}}_f < {product(spelled)}"
        store = Store(len(self.p.nodes), f"y{len(self.p.stores)}", kind, inside=True, shape=tuple(shape))
        self.p.stores.append(store)
        if (collide or fold) and not self.p.stopped:
            self.p.expect = "tl.store"
        pre_tl.append(f"tl.store({store.name}_ptr + {' + '.join(terms)}, {{0}}" + (f", mask={mask})" if mask else ")"))
        pre_th += [f"{{self}}_k = {{self}}_f < {covered}", f"{store.name}[{', '.join(index)}] = {{0}}[{{self}}_k]"]
        n = self.p.nodes[a]
        name = f"lane_split_{rank}" + ("_collide" if collide else "_fold" if fold else "")
        self.push(Node(kind, n.lo, n.hi, "{0}", "{0}", (a,), name,
                       pre_tl=tuple(pre_tl), pre_th=tuple(pre_th), zero=n.zero, tied=n.tied))


    def op_halves(self):
        """A tile stored in two halves, as the persistent matmul tutorial's EPILOGUE_SUBTILE stores its
        accumulator: the value split along its last axis (or, in 2-D, its first) by ``tl.split`` of a reshape and
        permute, the first half stored at the half-tile's indices ``h = pid * B + tl.arange(0, B // 2)`` under
        ``h < SIZE``, the second at the same address shifted by a constant (``h + SHIFT``, or a name for it), its
        mask shifted alike. ``SHIFT`` half the block (literal, runtime, constexpr or ``B // 2``): the halves side by
        side, the mirror's full store. Sometimes a shift into the first half or onto it (``overlap``: ``0 <= SHIFT <
        B // 2``, element ``pid * B + SHIFT`` in range), or onto the next tile's first half (``next``: ``SHIFT = B``
        with two tiles or more along the axis), which the backward must refuse."""
        d = self.d
        a = self.operand(lambda k: len(k) in (1, 2) and "1" not in k and storable(k))
        if a is None:
            return self.op_multistore()
        kind = self.kind_of(a)
        pos = len(kind) - 1 if len(kind) == 1 or d.pick([True, True, False]) else 0  # the axis split
        x = self.p.dim(kind[pos])
        half = x.block // 2
        how = d.pick(["apart"] * 4 + ["overlap", "next"])
        if how == "next" and (x.axis is None or x.programs < 2):
            how = "overlap"
        if self.p.returns:  # (programs that return store nothing: a collision is not certain)
            how = "apart"
        if how == "apart":
            shift = d.pick([f"{x.BLOCK} // 2", None])
            shift = shift or self.count(half)[0]
        else:
            shift, _ = self.count(x.block if how == "next" else d.pick(list(range(min(half, x.size)))))
        store, _, offset, _, index = self.loop_output(kind)
        start = f"pid_{x.axis} * {x.BLOCK} + " if x.axis is not None else ""
        pre_tl = [f"{{self}}_h = {start}tl.arange(0, {x.BLOCK} // 2)"]
        named = d.pick([False, True])  # the second half's indices named (the tutorial's `offs_cn + BLOCK_N // 2`)
        second = "{self}_h2" if named else f"({{self}}_h + {shift})"
        if named:
            pre_tl.append(f"{{self}}_h2 = {{self}}_h + {shift}")
        blocks = [self.p.dim(k).BLOCK for k in kind]
        if len(kind) == 1:
            halves = f"tl.reshape({{0}}, (2, {x.BLOCK} // 2))"
            halves = d.pick([f"tl.permute({halves}, (1, 0))", f"tl.trans({halves})"])
        elif pos == 1:
            halves = f"tl.permute(tl.reshape({{0}}, ({blocks[0]}, 2, {x.BLOCK} // 2)), (0, 2, 1))"
        else:
            halves = f"tl.permute(tl.reshape({{0}}, (2, {x.BLOCK} // 2, {blocks[1]})), (1, 2, 0))"
        pre_tl.append(f"{{self}}_left, {{self}}_right = tl.split({halves})")
        for part, at in (("left", "{self}_h"), ("right", second)):
            address = re.sub(rf"\b{x.idx}\b", at, offset)
            masks = [(f"({at} < {x.SIZE})" if q == pos else self.p.dim(k).mask) + sub(len(kind), q)
                     for q, k in enumerate(kind)]
            pre_tl.append(f"tl.store({store.name}_ptr + {address}, {{self}}_{part}, mask={' & '.join(masks)})")
        if how != "apart" and not self.p.stopped:  # (after a taken constexpr return they are never run)
            self.p.expect = "tl.store"
        n = self.p.nodes[a]
        label = f"halves_{'rows' if pos == 0 and len(kind) == 2 else 'last'}" + ("" if how == "apart" else
                                                                                f"_collide_{how}")
        self.push(Node(kind, n.lo, n.hi, "{0}", "{0}", (a,), label, pre_tl=tuple(pre_tl),
                       pre_th=(f"{store.name}[{index}] = {{0}}",), zero=n.zero, tied=n.tied))

    # -- rereads and read-back of in-place stores (sibling loops over one row's column blocks) ---------------------

    def wide_address(self, inp: Input, a: Dim, L: str, cols: str, shift: int, row: str | None) -> str:
        """The addresses of a block of columns ``cols`` of a wide input's rows (``a``'s tile), shifted by ``shift``
        columns: from the row base ``row`` (a name assigned before the loops) or spelled inline; at the strides the
        launch passes where the input is read so (``Input.strided``)."""
        c = f"{cols}[None, :]" + (f" + {shift}" if shift else "")
        if inp.strided:
            base = row or f"{inp.ptr} + {a.idx}[:, None] * {inp.name}_s0"
            return f"{base} + ({c}) * {inp.name}_s1"
        return f"{row or f'{inp.ptr} + {a.idx}[:, None] * {L}'} + {c}"

    def wide_row(self, inp: Input, a: Dim, L: str) -> str:
        return f"{inp.ptr} + {a.idx}[:, None] * " + (f"{inp.name}_s0" if inp.strided else L)

    def block_stat(self, kind: str, j: int, x: str, x_th: str, a: Dim, L: str, BC: str, width: int, bc: int,
                   blocks: int, cm: str, stats: list, extra: tuple[str, str] | None, more: bool = False,
                   weight: tuple[str, str] | None = None):
        """A row statistic ``{self}_s{j}`` of a loop over column blocks, each block's value ``x`` (mirror ``x_th``):
        its lines before the loop, in the loop and after it (kernel, mirror), and its interval. ``mean``: a sum of
        f(x) in a (rows, BC) tile or in a row state, over L (f: x, x * x, sin(x), x centred on an earlier statistic
        and squared, or x times ``extra``, another input's block; with ``more``, also exp(x / 2), tanh(x) as kernels
        spell it, sigmoid(x), x divided by an earlier statistic's square plus 0.5, x times ``weight``, the weight's
        block); ``prod``: a running product of block means of sigmoid(x) (nonlinear state); ``max``: a running
        maximum (nonlinear state)."""
        d = self.d
        s, acc = f"{{self}}_s{j}", f"{{self}}_a{j}"
        if kind == "max":
            return ([f"{acc} = tl.full(({a.BLOCK},), -float('inf'), tl.float64)"],
                    [f"{acc} = tl.maximum({acc}, tl.max(tl.where({cm}, {x}, -float('inf')), axis=1))"],
                    [f"{s} = {acc}"],
                    [f"{acc} = torch.full(({a.valid},), float('-inf'), dtype=torch.float64)"],
                    [f"{acc} = torch.maximum({acc}, ({x_th}).amax(1))"], [f"{s} = {acc}"], (-INPUT_BOUND, INPUT_BOUND))
        if kind == "prod":
            return ([f"{acc} = tl.full(({a.BLOCK},), 1.0, tl.float64)"],
                    [f"{acc} = {acc} * (0.5 + tl.sum(tl.where({cm}, tl.sigmoid({x}), 0.0), axis=1) / {BC})"],
                    [f"{s} = {acc}"],
                    [f"{acc} = torch.ones(({a.valid},), dtype=torch.float64)"],
                    [f"{acc} = {acc} * (0.5 + torch.sigmoid({x_th}).sum(1) / {bc})"], [f"{s} = {acc}"],
                    (0.5 ** blocks, 1.5 ** blocks))
        fs = ["id", "square", "sin"] + ["centred"] * bool(stats) + ["times"] * (extra is not None)
        if more:
            fs += ["exp", "tanh", "sigmoid"] + ["divided"] * bool(stats) + ["weighted"] * (weight is not None)
        f = d.pick(fs)
        if f == "divided":
            p = d.pick(range(len(stats)))
            sp = f"{{self}}_s{p}[:, None]"
            ftl, fth, iv = f"{x} / ({sp} * {sp} + 0.5)", f"{x_th} / ({sp} * {sp} + 0.5)", (-4.0, 4.0)
        elif f == "weighted":
            ftl, fth, iv = f"{x} * {weight[0]}[None, :]", f"{x_th} * {weight[1]}[None, :]", (-4.0, 4.0)
        elif f == "exp":
            ftl, fth, iv = f"tl.exp({x} * 0.5)", f"torch.exp({x_th} * 0.5)", (0.0, math.exp(1.0))
        elif f == "tanh":
            ftl, fth, iv = f"(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)", f"torch.tanh({x_th})", (-1.0, 1.0)
        elif f == "centred":
            p = d.pick(range(len(stats)))
            plo, phi = stats[p][1]
            dev = max(abs(INPUT_BOUND - plo), abs(-INPUT_BOUND - phi), abs(INPUT_BOUND - phi), abs(-INPUT_BOUND - plo))
            ftl = f"({x} - {{self}}_s{p}[:, None]) * ({x} - {{self}}_s{p}[:, None])"
            fth = f"({x_th} - {{self}}_s{p}[:, None]) * ({x_th} - {{self}}_s{p}[:, None])"
            iv = (0.0, dev * dev)
        elif f == "times":
            ftl, fth, iv = f"{x} * {extra[0]}", f"{x_th} * {extra[1]}", (-INPUT_BOUND ** 2, INPUT_BOUND ** 2)
        else:
            ftl, fth, _, iv, _ = next((t[1].format(x), t[2].format(x_th), 0, t[3](-INPUT_BOUND, INPUT_BOUND), 0)
                                      for t in STEP_FNS if t[0] == f)
        if d.pick([True, False]):  # a (rows, BC) tile summed after the loop
            return ([f"{acc} = tl.zeros(({a.BLOCK}, {BC}), dtype=tl.float64)"],
                    [d.pick([f"{acc} += tl.where({cm}, {ftl}, 0.0)", f"{acc} = {acc} + tl.where({cm}, {ftl}, 0.0)"])],
                    [f"{s} = tl.sum({acc}, axis=1) / {L}"],
                    [f"{acc} = torch.zeros(({a.valid},), dtype=torch.float64)"],
                    [f"{acc} = {acc} + ({fth}).sum(1)"], [f"{s} = {acc} / {width}"], iv)
        return ([f"{acc} = tl.zeros(({a.BLOCK},), dtype=tl.float64)"],
                [f"{acc} += tl.sum(tl.where({cm}, {ftl}, 0.0), axis=1)"],
                [f"{s} = {acc} / {L}"],
                [f"{acc} = torch.zeros(({a.valid},), dtype=torch.float64)"],
                [f"{acc} = {acc} + ({fth}).sum(1)"], [f"{s} = {acc} / {width}"], iv)

    def row_loops(self, a: Dim, inp: Input):
        """What sibling loops over one row's column blocks share: the width (literal, runtime or constexpr),
        the block, each loop's header and its columns (kernel), the mirror's header and block of a view."""
        d = self.d
        bc = d.pick([8, 4, 16])
        width = d.pick([2 * bc - 1, bc, 2 * bc + 3, 1, bc - 1, 3 * bc - 2])
        L, constexpr = self.count(width)
        BC = f"BC{len(self.p.meta)}" if d.pick([False, True]) else str(bc)
        if BC != str(bc):
            self.p.meta[BC] = bc
        header = d.pick(["offsets", "offsets", "blocks"])
        fn = d.pick(["range", "tl.range"] + ["tl.static_range"] * constexpr)
        shared = d.pick([True, False])  # one index and columns name for every loop (SSA renames them), or each its own

        def loop(j: int, spelling: str | None = None) -> tuple[str, str, str]:
            idx = "{self}_c" if shared else f"{{self}}_c{j}"
            cols = "{self}_cols" if shared else f"{{self}}_cols{j}"
            f = spelling or fn
            if header == "blocks":
                f = "tl.range" if f == "tl.static_range" else f
                return (f"for {idx} in {f}(0, tl.cdiv({L}, {BC})):", f"{cols} = {idx} * {BC} + tl.arange(0, {BC})",
                        cols)
            return f"for {idx} in {f}(0, {L}, {BC}):", f"{cols} = {idx} + tl.arange(0, {BC})", cols

        inp.steps = width
        return bc, width, L, BC, fn, loop, len(range(0, width, bc))

    def op_rereads(self):
        """An input read at one address by several sibling loops over one row's column blocks (a chunked layer
        norm: a mean pass, a variance pass, a normalize pass; reverse/rereads.py writes its gradient once): 2 to 4
        loops over ``range(0, L, BC)`` (or the block numbers, counted once before the loops), each but the last
        carrying a linear row statistic (``block_stat`` with ``more``: means of x, x * x, sin, exp, tanh, sigmoid,
        x centred on or divided by an earlier statistic, x times the weight or a second input's block), the last
        storing a nonlinear function of the block and the statistics (``(x - P) * rsqrt(Q * Q + 0.5)``,
        ``sigmoid(x - P) * Q``, ``(x - P) / (Q * Q + 0.5)``, ``tanh(x) * rsqrt(Q * Q + 0.5) - P``), times a weight
        over the columns, plus a second input's block, at each block's columns of an output; sometimes the
        statistics stored per row and a centred block stored by a middle loop too. The weight and the second input
        are read by every loop (merged too) or by some. Loads differ in ``other`` (merged: masked-off lanes have no
        adjoint). Most draws merge (label ``rereads_<loops>_merge``); the rest are near misses written apart
        (``rereads_<loops>_<how>``): a later load of the next column (``shift``) or under another mask (``cut``), a
        loop spelled with another range function (``respelled``) or its block count spelled inline in each header
        (``cdiv``: a temporary per loop), a statistic carried nonlinearly (``nonlinear``: a running product or
        maximum), a later loop scaling its block by a factor carried between iterations (``carried``) or adding a
        running sum of its blocks (``running``), the input also read once outside the loops (``outside``: its first
        column). The wide inputs and the weight are read at the strides the launch passes half the time (always
        in strided programs: bindings.py's expanded, transposed, sliced and row-of views apply). The node's value:
        the statistics' sum (a row value)."""
        d = self.d
        a = d.pick(self.p.dims)
        near = d.pick([""] * 14 + list(REREAD_NEAR))
        nloops = d.int(2, 4)
        kinds = ["mean"] * (nloops - 1)
        if near == "nonlinear":
            kinds[d.int(0, nloops - 2)] = d.pick(["prod", "max"])
        inp = self.new_input("wide", (a.name,), "uniform" if "max" in kinds else self.dist())
        inp.strided = self.p.strided or d.pick([False, True])
        bc, width, L, BC, fn, loop, blocks = self.row_loops(a, inp)
        second = self.new_input("wide", (a.name,), self.dist(), steps=width) if d.pick([False, True]) else None
        if second is not None:
            second.strided = self.p.strided or d.pick([False, True])
        weight = self.new_input("cols", (), self.dist(), steps=width) if d.pick([False, True]) else None
        if weight is not None:
            weight.strided = self.p.strided or d.pick([False, True])
        everywhere = {x.name: d.pick([True, True, False]) for x in (second, weight) if x is not None}
        self.p.reread += [x.ptr for x in (inp, second, weight) if x is not None]
        pre_tl, pre_th, labels = [], [], []
        rows = {}
        for x in (inp, second):
            if x is not None and d.pick([False, True]):  # a row base named before the loops
                rows[x.name] = f"{{self}}_{x.name}_row"
                pre_tl.append(f"{rows[x.name]} = {self.wide_row(x, a, L)}")
        exts: dict[tuple, str] = {}

        def block(x: Input, j: int, cols: str, how: str, other: float) -> tuple[list[str], list[str], str, str]:
            """Loop j's load of ``x``'s block (kernel lines, mirror lines, kernel value, mirror value)."""
            shift, cut = {"same": (0, 0), "shift": (1, 0), "cut": (0, 1)}[how]
            cmask = f"{cols}[None, :]" + (f" + {shift + cut}" if shift + cut else "") + f" < {L}"
            mask = f"{a.mask}[:, None] & ({cmask})"
            address = self.wide_address(x, a, L, cols, shift, rows.get(x.name) if d.pick([True, True, False])
                                        else None)
            name = f"{{self}}_{x.name}_{j}"
            kernel = []
            if d.pick([False, False, True]):  # the mask named
                kernel.append(f"{{self}}_m{x.name}_{j} = {mask}")
                mask = f"{{self}}_m{x.name}_{j}"
            kernel.append(f"{name} = tl.load({address}, mask={mask}, other={fmt(other)})")
            key = (x.name, shift, cut, other)
            if key not in exts:  # the row as this load reads it: masked-off columns hold `other`
                exts[key] = f"{{self}}_{x.name}_e{len(exts)}"
                pad = f"torch.full(({a.valid}, {shift + cut}), {fmt(other)}, dtype=torch.float64)"
                pre_th.append(f"{exts[key]} = torch.cat([{x.name}[{a.lo}:{a.hi}, {shift}:{width - cut}], {pad}], 1)"
                              if shift + cut else f"{exts[key]} = {x.name}[{a.lo}:{a.hi}, :]")
            mirror = [f"{name} = {exts[key]}[:, {{self}}_c:min({{self}}_c + {bc}, {width})]"]
            return kernel, mirror, name, name

        def load_weight(j: int, cols: str) -> tuple[list[str], list[str], tuple[str, str]]:
            at = f"{cols} * {weight.name}_s0" if weight.strided else cols
            w = f"{{self}}_w{j}"
            return ([f"{w} = tl.load({weight.ptr} + {at}, mask={cols} < {L}, other={fmt(d.pick(OTHERS))})"],
                    [f"{w} = {weight.name}[{{self}}_c:min({{self}}_c + {bc}, {width})]"], (w, w))

        if near == "cdiv" and "tl.cdiv(" not in loop(0)[0]:
            near = "respelled"
        odd = d.int(1, nloops - 1)  # the later loop a near miss changes
        if near == "outside":  # the input's first column, read once before the loops
            at = f"{a.idx} * {inp.name}_s0" if inp.strided else f"{a.idx} * {L}"
            pre_tl.append(f"{{self}}_x0 = tl.load({inp.ptr} + {at}, mask={a.mask}, other=0.0)")
            pre_th.append(f"{{self}}_x0 = {inp.name}[{a.lo}:{a.hi}, 0]")
        if near in ("carried", "running"):
            pre_tl.append(f"{{self}}_t = tl.full(({a.BLOCK},), {'1.0' if near == 'carried' else '0.0'}, tl.float64)")
            pre_th.append(f"{{self}}_t = torch.{'ones' if near == 'carried' else 'zeros'}(({a.valid},), "
                          "dtype=torch.float64)")
        count = "{self}_nb"
        if "tl.cdiv(" in loop(0)[0] and near != "cdiv":  # the block count computed once (else a temporary each)
            pre_tl.append(f"{count} = tl.cdiv({L}, {BC})")
        first_other = d.pick(OTHERS)
        stats: list = []
        outs = d.pick([False, False, True])  # the statistics stored per row, and a middle loop's centred block
        th_head = f"for {{self}}_i, {{self}}_c in enumerate(range(0, {width}, {bc})):"
        for j in range(nloops):
            spelling = None
            if near == "respelled" and j == odd:  # another spelling of the range: not merged
                spelling = "tl.range" if fn == "range" else "range"
            head, cols_line, cols = loop(j, spelling)
            if near != "cdiv":
                head = head.replace(f"tl.cdiv({L}, {BC})", count)
            how = near if near in ("shift", "cut") and j == odd else "same"
            other = first_other if d.pick([True, True, True, False]) else d.pick(OTHERS)
            k_tl, k_th, x, x_th = block(inp, j, cols, how, other)
            body_tl, body_th = [cols_line, *k_tl], list(k_th)
            if near == "carried" and j == odd:  # the block scaled by a factor carried between iterations
                body_tl.append(f"{x}_t = {x} * {{self}}_t[:, None]")
                body_th.append(f"{x_th}_t = {x_th} * {{self}}_t[:, None]")
                x, x_th = f"{x}_t", f"{x_th}_t"
            extra = None
            cm = f"{cols}[None, :] < {L}"
            if second is not None and (j == nloops - 1 or everywhere[second.name] or d.pick([False, True])):
                e_tl, e_th, e, e_th_v = block(second, j, cols, "same", d.pick(OTHERS))
                body_tl += e_tl
                body_th += e_th
                extra = (e, e_th_v)
            w = None
            if weight is not None and (j == nloops - 1 or everywhere[weight.name]):
                w_tl, w_th, w = load_weight(j, cols)
                body_tl += w_tl
                body_th += w_th
            if j < nloops - 1:
                b_tl, in_tl, after_tl, b_th, in_th, after_th, iv = self.block_stat(
                    kinds[j], j, x, x_th, a, L, BC, width, bc, blocks, cm, stats, extra, more=True, weight=w)
                if outs and j and stats:  # a middle loop's block, centred on an earlier statistic, stored too
                    store, _, offset, smask, index = self.loop_output((a.name,), tail=width)
                    p = d.pick(range(len(stats)))
                    body_tl.append(f"tl.store({store.name}_ptr + ({offset})[:, None] * {L} + {cols}[None, :], "
                                   f"{x} - {{self}}_s{p}[:, None], mask={smask}[:, None] & ({cm}))")
                    body_th.append(f"{store.name}[{index}, {{self}}_c:min({{self}}_c + {bc}, {width})] = "
                                   f"{x_th} - {{self}}_s{p}[:, None]")
                if near == "carried" and j == odd:
                    in_tl = [*in_tl, "{self}_t = {self}_t * 0.5"]
                    in_th = [*in_th, "{self}_t = {self}_t * 0.5"]
                pre_tl += b_tl
                pre_th += b_th
                body_tl += in_tl
                body_th += in_th
                stats.append((f"{{self}}_s{j}", iv))
                pre_tl += [head] + ["    " + line for line in body_tl] + after_tl
                pre_th += [th_head] + ["    " + line for line in body_th] + after_th
                if outs:  # the statistic stored per row (the tutorial's mean and rstd)
                    store, _, offset, smask, index = self.loop_output((a.name,))
                    pre_tl.append(f"tl.store({store.name}_ptr + {offset}, {{self}}_s{j}, mask={smask})")
                    pre_th.append(f"{store.name}[{index}] = {{self}}_s{j}")
                continue
            # the last pass: the output, block by block
            sp, sq = (f"{{self}}_s{d.pick(range(len(stats)))}" for _ in range(2))
            form = d.pick(["norm", "norm", "sigmoid", "divide", "tanh"])
            value, value_th = {
                "norm": (f"({x} - {sp}[:, None]) * tl.rsqrt({sq} * {sq} + 0.5)[:, None]",
                         f"({x_th} - {sp}[:, None]) * torch.rsqrt({sq} * {sq} + 0.5)[:, None]"),
                "sigmoid": (f"tl.sigmoid({x} - {sp}[:, None]) * {sq}[:, None]",
                            f"torch.sigmoid({x_th} - {sp}[:, None]) * {sq}[:, None]"),
                "divide": (f"({x} - {sp}[:, None]) / ({sq} * {sq} + 0.5)[:, None]",
                           f"({x_th} - {sp}[:, None]) / ({sq} * {sq} + 0.5)[:, None]"),
                "tanh": (f"(2.0 * tl.sigmoid(2.0 * {x}) - 1.0) * tl.rsqrt({sq} * {sq} + 0.5)[:, None] - {sp}[:, None]",
                         f"torch.tanh({x_th}) * torch.rsqrt({sq} * {sq} + 0.5)[:, None] - {sp}[:, None]")}[form]
            if w is not None:
                value, value_th = f"{value} * {w[0]}[None, :]", f"{value_th} * {w[1]}[None, :]"
            if extra is not None:
                value, value_th = f"{value} + {extra[0]}", f"{value_th} + {extra[1]}"
            if near == "running" and j == odd:  # a running sum of the blocks so far, added
                body_tl.append(f"{{self}}_t += tl.sum(tl.where({cm}, {x}, 0.0), axis=1)")
                body_th.append(f"{{self}}_t = {{self}}_t + ({x_th}).sum(1)")
                value, value_th = f"{value} + {{self}}_t[:, None] * 0.25", f"{value_th} + {{self}}_t[:, None] * 0.25"
            if near == "carried" and j == odd:
                body_tl.append("{self}_t = {self}_t * 0.5")
                body_th.append("{self}_t = {self}_t * 0.5")
            if near == "outside":
                value, value_th = f"{value} + {{self}}_x0[:, None] * 0.5", f"{value_th} + {{self}}_x0[:, None] * 0.5"
            store, _, offset, smask, index = self.loop_output((a.name,), tail=width)
            body_tl.append(f"tl.store({store.name}_ptr + ({offset})[:, None] * {L} + {cols}[None, :], {value}, "
                           f"mask={smask}[:, None] & ({cm}))")
            body_th.append(f"{store.name}[{index}, {{self}}_c:min({{self}}_c + {bc}, {width})] = {value_th}")
            pre_tl += [head] + ["    " + line for line in body_tl]
            pre_th += [th_head] + ["    " + line for line in body_th]
            labels.append(form)
        lo = sum(iv[0] for _, iv in stats)
        hi = sum(iv[1] for _, iv in stats)
        labels += ["2nd" + "_all" * everywhere[second.name]] if second is not None else []
        labels += ["w" + "_all" * everywhere[weight.name]] if weight is not None else []
        labels += ["outs"] * outs
        label = f"rereads_{nloops}_{near or 'merge'}" + "".join(f"_{x}" for x in labels)
        self.push(Node((a.name,), lo, hi, " + ".join(s for s, _ in stats), " + ".join(s for s, _ in stats), (),
                       label, pre_tl=tuple(pre_tl), pre_th=tuple(pre_th),
                       tied=inp.dist == "ties" or (second is not None and second.dist == "ties")))

    def op_in_place(self):
        """A wide input x updated in place by a loop over one row's column blocks (load x, store g(x) at the same
        address under the same mask: ``x + r``, ``x * r`` with a second input, ``sin(x) + r``, ``2 x``), with a
        row statistic of what it stores (``block_stat``), and 1 to 3 later sibling loops over the same range reading
        back what the first stored (a chunked fused add + RMSNorm: analysis/in_place.py), the last storing ``b *
        rsqrt(S * S + 0.5)`` (times a weight) at each block's columns of an output. x is then an output too (its
        new values; the mirror's ``x_new``), and the backward takes x as the launch left it (``x_ptr_stored``).
        Sometimes what must be refused: a read-back of the next column (``neighbour``), a store to x after the
        read-back in its loop or in a later loop (``store_after``, ``later_store``), a read-back loop over another
        range (blocks of ``BC // 2``: ``range``); rows every program along another grid axis updates alike
        (``programs``)."""
        d = self.d

        def sharing(x: Dim) -> bool:  # programs along another grid axis update the same rows
            return any(g.name != x.name and g.programs > 1 for g in self.p.grid_dims)

        fits = [x for x in self.p.dims if not sharing(x)]
        if self.p.returns and not fits:  # (programs that return store nothing: a collision is not certain)
            return self.op_rereads()
        a = d.pick(fits) if fits and d.pick([True] * 5 + [False]) else d.pick(self.p.dims)
        inp = self.new_input("wide", (a.name,), self.dist())
        inp.strided = self.p.strided
        bc, width, L, BC, fn, loop, blocks = self.row_loops(a, inp)
        kinds = [d.pick(["mean", "mean", "prod", "max"]) for _ in range(3)]
        if "max" in kinds:
            inp.dist = "uniform"
        r = self.new_input("wide", (a.name,), "uniform" if "max" in kinds else self.dist(), steps=width) \
            if d.pick([True, True, False]) else None
        if r is not None:
            r.strided = self.p.strided
        weight = self.new_input("cols", (), self.dist(), steps=width) if d.pick([False, True]) else None
        if weight is not None:
            weight.strided = self.p.strided
        nloops = d.int(2, 4)
        how = d.pick(["valid"] * 8 + ["neighbour", "store_after", "later_store", "range"])
        if self.p.returns:
            how = "valid"
        pre_tl, pre_th = [], []
        row = "{self}_row"
        named_row = d.pick([False, True])
        if named_row:
            pre_tl.append(f"{row} = {self.wide_row(inp, a, L)}")
        x_new = f"{inp.name}_new"
        th_head = f"for {{self}}_i, {{self}}_c in enumerate(range(0, {width}, {bc})):"
        th_block = f"{{self}}_c:min({{self}}_c + {bc}, {width})"
        pre_th.append("{self}_saved = []")
        store = Store(len(self.p.nodes), inp.name, (a.name,), inside=True, shape=(a.size, width), in_place=True)
        self.p.stores.append(store)
        stats: list = []
        other = d.pick(OTHERS)

        def address(cols: str, shift: int = 0) -> str:
            return self.wide_address(inp, a, L, cols, shift, row if named_row and d.pick([True, True, False])
                                     else None)

        for j in range(nloops):
            head, cols_line, cols = loop(j)
            cm = f"{cols}[None, :] < {L}"
            mask = f"{a.mask}[:, None] & ({cm})"
            body_tl, body_th = [cols_line], []
            named_mask = d.pick([False, True])
            if named_mask:
                body_tl.append(f"{{self}}_m{j} = {mask}")
                mask = f"{{self}}_m{j}"
            if j == 0:  # the update
                at = address(cols)
                body_tl.append(f"{{self}}_x = tl.load({at}, mask={mask}, other={fmt(other)})")
                body_th.append(f"{{self}}_x = {inp.name}[{a.lo}:{a.hi}, {th_block}]")
                forms = [("2.0 * {x}", "2.0 * {x}")]
                if r is not None:
                    ra = self.wide_address(r, a, L, cols, 0, None)
                    body_tl.append(f"{{self}}_r = tl.load({ra}, mask={mask}, other=0.0)")
                    body_th.append(f"{{self}}_r = {r.name}[{a.lo}:{a.hi}, {th_block}]")
                    forms += [("{x} + {r}", "{x} + {r}")] * 2 + [("{x} * {r}", "{x} * {r}"),
                                                                 ("tl.sin({x}) + {r}", "torch.sin({x}) + {r}")]
                g_tl, g_th = d.pick(forms)
                body_tl.append("{self}_v = " + g_tl.format(x="{self}_x", r="{self}_r"))
                body_th.append("{self}_v = " + g_th.format(x="{self}_x", r="{self}_r"))
                body_tl.append(f"tl.store({address(cols)}, {{self}}_v, mask={mask})")
                body_th += [f"{x_new}[{a.lo}:{a.hi}, {th_block}] = {{self}}_v", "{self}_saved.append({self}_v)"]
                v_tl, v_th = "{self}_v", "{self}_v"
            else:  # a read-back
                shift = 1 if how == "neighbour" and j == nloops - 1 else 0
                rmask = mask if not shift else f"{a.mask}[:, None] & ({cols}[None, :] + 1 < {L})"
                if how == "range" and j == nloops - 1:  # blocks of half the width: not the store's iterations
                    half = f"{BC} // 2"
                    head = f"for {{self}}_h in range(0, {L}, {half}):"
                    cols = "{self}_hcols"
                    body_tl = [f"{cols} = {{self}}_h + tl.arange(0, {half})"]
                    cm = f"{cols}[None, :] < {L}"
                    rmask = f"{a.mask}[:, None] & ({cm})"
                body_tl.append(f"{{self}}_b{j} = tl.load({address(cols, shift)}, mask={rmask}, other={fmt(other)})"
                               "  # read back")
                body_th.append(f"{{self}}_b{j} = {{self}}_saved[{{self}}_i]")
                v_tl, v_th = f"{{self}}_b{j}", f"{{self}}_b{j}"
            if j < nloops - 1:  # a statistic of the stored values (or, later, of those read back)
                b_tl, in_tl, after_tl, b_th, in_th, after_th, iv = self.block_stat(
                    kinds[j], j, v_tl, v_th, a, L, BC, width, bc, blocks, cm, stats, None)
                pre_tl += b_tl
                pre_th += b_th
                body_tl += in_tl
                body_th += in_th
                stats.append((f"{{self}}_s{j}", iv))
                pre_tl += [head] + ["    " + line for line in body_tl] + after_tl
                pre_th += [th_head] + ["    " + line for line in body_th] + after_th
                continue
            q = d.pick(range(len(stats)))
            value = f"{v_tl} * tl.rsqrt({{self}}_s{q} * {{self}}_s{q} + 0.5)[:, None]"
            value_th = f"{v_th} * torch.rsqrt({{self}}_s{q} * {{self}}_s{q} + 0.5)[:, None]"
            if weight is not None:
                at = f"{cols} * {weight.name}_s0" if weight.strided else cols
                body_tl.append(f"{{self}}_w = tl.load({weight.ptr} + {at}, mask={cols} < {L}, other=0.0)")
                body_th.append(f"{{self}}_w = {weight.name}[{th_block}]")
                value, value_th = f"{value} * {{self}}_w[None, :]", f"{value_th} * {{self}}_w[None, :]"
            out, _, offset, smask, index = self.loop_output((a.name,), tail=width)
            body_tl.append(f"tl.store({out.name}_ptr + ({offset})[:, None] * {L} + {cols}[None, :], {value}, "
                           f"mask={smask}[:, None] & ({cm}))")
            body_th.append(f"{out.name}[{index}, {th_block}] = {value_th}")
            if how == "store_after":
                body_tl.append(f"tl.store({address(cols)}, {v_tl} * 0.5, mask={rmask})")
            pre_tl += [head] + ["    " + line for line in body_tl]
            pre_th += [th_head] + ["    " + line for line in body_th]
        if how == "later_store":
            head, cols_line, cols = loop(nloops)
            pre_tl += [head, "    " + cols_line, f"    tl.store({address(cols)}, tl.zeros(({a.BLOCK}, {BC}), "
                       f"dtype=tl.float64), mask={a.mask}[:, None] & ({cols}[None, :] < {L}))"]
        if sharing(a) and how == "valid":
            how = "programs"
        if how != "valid" and not self.p.stopped:  # (after a taken constexpr return they are never run)
            self.p.expect = "tl.load" if how in ("neighbour", "range") else "tl.store"
        lo = sum(iv[0] for _, iv in stats)
        hi = sum(iv[1] for _, iv in stats)
        label = f"in_place_{nloops}_{'_'.join(kinds[:nloops - 1])}" + ("" if how == "valid" else
                                                                              f"_collide_{how}")
        self.push(Node((a.name,), lo, hi, " + ".join(s for s, _ in stats), " + ".join(s for s, _ in stats), (),
                       label, pre_tl=tuple(pre_tl), pre_th=tuple(pre_th),
                       tied=inp.dist == "ties" or (r is not None and r.dist == "ties")))


def generate(draw: Draw, avoid: Sequence[str] = (), strided: bool = False, focus: Sequence[str] = ()) -> Program:
    return Gen(draw, avoid, strided, focus).run()


def programs(avoid: Sequence[str] = (), strided: bool | None = None, focus: Sequence[str] = ()):
    """The hypothesis strategy of programs (steering around the constructs in ``avoid``; ``strided``: tile inputs
    loaded at strides the launch passes, so that bindings.py can bind them to views; None: either, drawn;
    ``focus``: families of FOCUS made frequent)."""
    from hypothesis import strategies as st

    def program(draw):
        return generate(HypothesisDraw(draw), avoid, draw(st.booleans()) if strided is None else strided, focus)

    return st.composite(program)()


def random_program(seed: int, avoid: Sequence[str] = (), strided: bool = False,
                   focus: Sequence[str] = ()) -> tuple[Program, list[int]]:
    """A program from a seed, and the choices that built it (for ``ReplayDraw``). ``strided`` makes no choices:
    a seed gives the same kernel either way, its tile loads spelled with the launch's strides or a layout's.
    ``focus`` (families of FOCUS made frequent) changes the choices' meaning: replay with the same."""
    draw = RandomDraw(random.Random(seed))
    return generate(draw, avoid, strided, focus), draw.choices


# ------------------------------------------------------------------------------------------
# rendering


def output_layout(p: Program, kind, atomic=False) -> tuple[list[int], str, str | None, str]:
    """Output shape, kernel address offset, kernel mask, mirror index of one store of ``kind``.

    A store gets one slot per program along the grid axes ``kind`` does not tile; an atomic
    add has the programs add into one."""
    uncovered = [g for g in p.grid_dims if g.name not in kind and not atomic]
    shape: list[int] = [g.programs for g in uncovered] + [p.dim(k).size if k != "1" else 1 for k in kind]
    sym: list[str | None] = [p.nprog(g.axis) for g in uncovered] + \
        [p.dim(k).SIZE if k != "1" else None for k in kind]
    terms, index = [], []
    for pos, g in enumerate(uncovered):
        stride = " * ".join(s for s in sym[pos + 1:] if s)
        terms.append(f"pid_{g.axis}" + (f" * {stride}" if stride else ""))
        index.append(f"pid_{g.axis}")
    for pos, k in enumerate(kind):
        if k == "1":
            index.append("0:1")
            continue
        dim = p.dim(k)
        stride = " * ".join(s for s in sym[len(uncovered) + pos + 1:] if s)
        terms.append(dim.idx + sub(len(kind), pos) + (f" * {stride}" if stride else ""))
        index.append(f"{dim.lo}:{dim.hi}")
    return shape or [1], " + ".join(terms), mask_for(p, kind), ", ".join(index) or "0"


def scatter_layout(p: Program, kind, g: Dim, how: str) -> tuple[list[int], str, str | None, str]:
    """Like ``output_layout``, with grid axis ``g`` moved where ``{self}_dst`` (an index the program loads) says:
    its slot (``g`` not in ``kind``) or its block (``g`` in ``kind``: ``perm``, block ``dst``; ``start``, the
    block starting at element ``dst``). The axis holds whole blocks, so the last program's ragged block fits
    wherever it goes."""
    uncovered = [h for h in p.grid_dims if h.name not in kind]
    shape = [h.programs for h in uncovered] + [
        1 if k == "1" else g.programs * g.block if k == g.name else p.dim(k).size for k in kind]
    sym = [p.nprog(h.axis) for h in uncovered] + [
        None if k == "1" else f"({p.nprog(g.axis)} * {g.BLOCK})" if k == g.name else p.dim(k).SIZE
        for k in kind]
    terms, index = [], []
    for pos, h in enumerate(uncovered):
        stride = " * ".join(x for x in sym[pos + 1:] if x)
        coordinate = "{self}_dst" if h is g else f"pid_{h.axis}"
        terms.append(coordinate + (f" * {stride}" if stride else ""))
        index.append(coordinate)
    for pos, k in enumerate(kind):
        if k == "1":
            index.append("0:1")
            continue
        dim = p.dim(k)
        stride = " * ".join(x for x in sym[len(uncovered) + pos + 1:] if x)
        if k == g.name and how == "perm":
            moved, lo = f"({dim.idx} + ({{self}}_dst - pid_{g.axis}) * {g.BLOCK})", f"{{self}}_dst * {g.block}"
        elif k == g.name:
            moved, lo = f"({{self}}_dst + {dim.idx} - pid_{g.axis} * {g.BLOCK})", "{self}_dst"
        else:
            moved, lo = dim.idx, None
        terms.append(moved + sub(len(kind), pos) + (f" * {stride}" if stride else ""))
        index.append(f"{lo}:{lo} + {dim.valid}" if lo else f"{dim.lo}:{dim.hi}")
    return shape or [1], " + ".join(terms) or "0", mask_for(p, kind), ", ".join(index) or "0"


def early_returns(lines: Sequence[str]) -> list[str]:
    """A helper's ``if``/``elif``/``else`` assigning ``{self}_r`` in each branch, spelled with early returns:
    ``if a: return x`` / ``if b: return y`` / ``return z``."""
    out, dedent = [], False
    for i, line in enumerate(lines):
        if line.startswith(("if ", "elif ")):
            out.append("if " + line.split(" ", 1)[1])
            dedent = False
        elif line == "else:":
            dedent = True
        elif line.startswith("    "):
            body = line[4:]
            last = i + 1 == len(lines) or not lines[i + 1].startswith("    ")
            if last and body.startswith("{self}_r = "):
                body = "return " + body[len("{self}_r = "):]
            out.append(body if dedent else "    " + body)
        else:
            out.append(line)
    return out


def render(p: Program) -> str:
    """The module: launch constants, helpers, the kernel, its mirror, inputs."""
    nodes = p.nodes
    out = ['"""A fuzzed kernel (tests/fuzz/generate.py) and its PyTorch mirror."""', "",
           "import torch", "import triton", "import triton.language as tl", ""]
    layouts = {s.name: output_layout(p, s.kind, s.atomic) for s in p.stores}
    shapes = {s.name: list(s.shape) if s.shape else [s.lead] * bool(s.lead) + layouts[s.name][0] +
              [s.tail] * bool(s.tail) for s in p.stores}
    sizes = {d.SIZE: d.size for d in p.dims}
    args = {**sizes, **p.ints, **p.scalars}
    blocks = {**{d.BLOCK: d.block for d in p.dims}, **p.meta}
    def literal(d):
        return "{" + ", ".join(f'"{k}": {v}' for k, v in d.items()) + "}"

    outputs = {f"{s.name}_ptr": tuple(shapes[s.name]) for s in p.stores}
    zeroed = ", ".join(f'"{s.name}_ptr"' for s in p.stores if (s.atomic or s.zeroed or p.returns) and not s.in_place)
    out += [f"GRID = {p.launch_grid}", f"SIZES = {literal(args)}", f"META = {literal(blocks)}",
            f"OUTPUTS = {literal(outputs)}", f"ZEROED = {{{zeroed}}}  # atomic outputs start at 0, others at NaN",
            f"TOL = {p.tol}", f"SEED = {p.seed}"]
    if strides_of(p):
        out += [f"STRIDES = {literal(strides_of(p))}  # contiguous strides (bindings.py passes its views)",
                f"STRIDED = {strided_inputs(p)!r}"
                "  # inputs read only at the strides passed"]
    if any(s.in_place for s in p.stores):
        out += [f"INPLACE = {[f'{s.name}_ptr' for s in p.stores if s.in_place]!r}  # inputs updated in place: outputs "
                "too (OUTPUTS), their gradients the values' before the launch"]
    if p.reread:
        out += [f"REREAD = {p.reread!r}  # inputs read by sibling loops (bindings.py binds them first)"]
    if p.expect:
        out += [f"EXPECT = {p.expect!r}  # stores that collide: the backward must refuse"]
    if dot_inputs(p):
        out += [f"DOTS = {dot_inputs(p)!r}  # inputs reaching a tl.dot operand (bindings.py binds them overlapping)"]
    out += [f"{k} = tl.constexpr({fmt(v)})" for k, v in p.constexprs.items()] + ["", ""]

    # kernel names: v{i}, or the first operand's name when reassigned where it dies
    last_use = {}
    for i, n in enumerate(nodes):
        for a in n.args:
            last_use[a] = i
    for s in p.stores:
        last_use[s.node] = len(nodes)
    kname: list[str] = []
    reused: list[bool] = []

    def fresh(i: int) -> str:
        return f"d_v{i - 1}" if p.names == "shadowy" and i % 2 else f"v{i}"

    users: dict[int, set] = {}
    for i, n in enumerate(nodes):
        for a in n.args:
            users.setdefault(a, set()).add(i)
    for s in p.stores:
        users.setdefault(s.node, set()).add(("store", s.name))
    for i, n in enumerate(nodes):
        ok = n.reassign and n.args and last_use.get(n.args[0]) == i and not n.pre_tl
        kname.append(kname[n.args[0]] if ok else fresh(i))
        reused.append(bool(ok))
    inlined = set()
    for j, n in enumerate(nodes):  # nested expressions: a value used once goes into its user's expression
        c = next(iter(users[j])) if len(users.get(j, ())) == 1 else None
        if (n.inline and isinstance(c, int) and n.helper != 3 and not (reused[c] and nodes[c].args[0] == j)
                and not any(reused[k] for k in range(j + 1, c))):  # no name it reads is reassigned before use
            inlined.add(j)

    helpers, body = [], []
    for i, n in enumerate(nodes):
        argn = [kname[a] for a in n.args]
        params = [f"a{j}" if p.helper_params == "a" or len(n.args) > len(HELPER_CLASH) else HELPER_CLASH[j]
                  for j in range(len(n.args))]
        if n.helper and n.pre_tl:  # a helper holding the node's lines; what they read of the kernel's, passed
            extra = sorted(set(re.findall(r"\b(?:pid_\d|F\d+)\b", "\n".join(n.pre_tl))))
            signature = params + [f"{e}: tl.constexpr" if e.startswith("F") else e for e in extra]
            helpers += ["@triton.jit", f"def h{i}({', '.join(signature)}):"]
            lines = early_returns(n.pre_tl) if n.early else n.pre_tl
            helpers += [f"    {line.format(*params, self='t')}" for line in lines]
            if not (n.early and "else:" in n.pre_tl):  # (else every path has returned)
                helpers += [f"    return {n.tl.format(*params, self='t')}"]
            helpers += ["", ""]
            expr = f"h{i}({', '.join(argn + extra)})"
        else:
            body += [line.format(*argn, self=fresh(i)) for line in n.pre_tl]
            expr = n.tl.format(*argn, self=fresh(i))
        if n.helper and not n.pre_tl:
            inner = n.tl.format(*params, self="t")
            if n.helper == 2:
                helpers += ["@triton.jit", f"def h{i}_inner({', '.join(params)}):", f"    return {inner}", "", ""]
                inner = f"h{i}_inner({', '.join(params)})"
                helpers += ["@triton.jit", f"def h{i}({', '.join(params)}):", f"    t = {inner}", "    return t",
                            "", ""]
            elif n.helper == 3:  # `v, v_1 = h(...)`: a second result, named as the frontend names SSA copies
                helpers += ["@triton.jit", f"def h{i}({', '.join(params)}):", f"    return {inner}, {params[0]}", "",
                            ""]
            else:
                helpers += ["@triton.jit", f"def h{i}({', '.join(params)}):", f"    return {inner}", "", ""]
            expr = f"h{i}({', '.join(argn)})"
        if i in inlined:
            kname[i] = f"({expr})"
        elif n.helper == 3:
            body.append(f"{kname[i]}, {kname[i]}_1 = {expr}")
        elif reused[i] and n.aug and not n.helper and n.tl == f"{{0}} {n.aug} {{1}}":
            body.append(f"{kname[i]} {n.aug}= {argn[1]}")
        else:
            body.append(f"{kname[i]} = {expr}")
    launch = p.launch
    indices = []  # each axis's indices and mask (in a persistent kernel, each iteration's)
    for d in p.dims:
        start = f"pid_{d.axis} * {d.BLOCK} + " if d.axis is not None else ""
        indices += [f"{d.idx} = {start}tl.arange(0, {d.BLOCK})", f"{d.mask} = {d.idx} < {d.SIZE}"]
    if len(p.dims) == 2:
        indices.append("mask = mm[:, None] & mk[None, :]")
    if launch is not None and launch.epilogue:  # the tile found again for the last stores
        body += launch.epilogue + indices
    for s in [s for s in p.stores if not s.inside]:  # (a loop's own lines store the others)
        _, offset, mask, _ = layouts[s.name]
        ptr = f"{s.name}_ptr" + (f" + {offset}" if offset else "")
        fn = "tl.atomic_add" if s.atomic else "tl.store"
        body.append(f"{fn}({ptr}, {kname[s.node]}" + (f", mask={mask})" if mask else ")"))

    prologue = [f"pid_{g.axis} = tl.program_id({g.axis})" for g in p.grid_dims
                if launch is None or not (launch.flat or g.axis == launch.axis)]
    tiles = []  # the tile's lines: in a persistent kernel, each iteration's
    if launch is not None:
        prologue += launch.head
        if launch.loop:
            prologue.append(launch.loop)
        tiles += launch.body
        helpers += launch.helpers
    tiles += indices
    strides = strides_of(p)
    params = [x.ptr for x in p.inputs] + [f"{s.name}_ptr" for s in p.stores if not s.in_place] + list(args) + \
        list(strides) + \
        [f"{b}: tl.constexpr" for b in blocks]
    for fn, combine in (("sum", "a + b"), ("max", "tl.maximum(a, b)"), ("min", "tl.minimum(a, b)")):
        if any(f"_fuzz_{fn}" in line for line in body + helpers):
            helpers += ["@triton.jit", f"def _fuzz_{fn}(a, b):", f"    return {combine}", "", ""]
    if any("_fuzz_recurrence" in line for line in body + helpers):  # (op_recurrence's h = a h + b)
        helpers += ["@triton.jit", "def _fuzz_recurrence(a1, b1, a2, b2):", "    return a1 * a2, b1 * a2 + b2", "", ""]
    inner = "        " if launch is not None and launch.loop else "    "
    kernel = ["@triton.jit", f"def kernel({', '.join(params)}):"] + [f"    {line}" for line in prologue] + \
        [f"{inner}{line}" for line in tiles + body]
    if narrowed(p.seed):  # float64 state and accumulators declared float32 (variations.py; the mirror unchanged)
        helpers, _ = narrow_states(helpers)
        kernel, _ = narrow_states(kernel)
    out += helpers + kernel

    # mirror
    mir = [f"{s.name}_new = {s.name}.clone()" if s.in_place else  # (what no program overwrites keeps its value)
           f"{s.name} = torch.zeros({tuple(shapes[s.name])}, dtype=torch.float64)" for s in p.stores]
    loop, indent = ([], "") if p.grid_dims or not p.returns else (["for _program in range(1):"], "    ")
    for g in p.grid_dims:  # (an early return `continue` s to the next program)
        loop.append(f"{indent}for pid_{g.axis} in range({g.programs}):")
        indent += "    "
    inner = []
    for d in p.dims:
        if d.axis is not None:
            inner += [f"{d.lo} = pid_{d.axis} * {d.block}", f"{d.hi} = min({d.lo} + {d.block}, {d.size})"]
        else:
            inner += [f"{d.lo}, {d.hi} = 0, {d.size}"]
        inner.append(f"{d.valid} = {d.hi} - {d.lo}")
    body_th = []
    for i, n in enumerate(nodes):
        argn = [f"u{a}" for a in n.args]
        body_th += [line.format(*argn, self=f"u{i}") for line in n.pre_th]
        body_th.append(f"u{i} = " + n.th.format(*argn, self=f"u{i}"))
    for s in [s for s in p.stores if not s.inside]:
        index = layouts[s.name][3]
        value = f"u{s.node}"
        if s.kind != nodes[s.node].kind:
            value += f".expand({', '.join(p.dim(k).valid if k != '1' else '1' for k in s.kind)})"
        body_th.append(f"{s.name}[{index}] = {s.name}[{index}] + {value}" if s.atomic
                       else f"{s.name}[{index}] = {value}")
    used = "\n".join(body_th)
    inner = [line for line in inner
             if not line.startswith("s") or re.search(rf"\b{line.split(' = ')[0]}\b", used)] + body_th
    mir += loop + [indent + line for line in inner]
    ret = ", ".join(f'"{s.name}_ptr": {s.name}' + "_new" * s.in_place for s in p.stores)
    out += ["", "", f"def mirror({', '.join(x.name for x in p.inputs)}):",
            '    """The kernel in PyTorch, program by program, on the valid elements."""']
    out += [f"    {line}" for line in mir] + [f"    return {{{ret}}}"]

    # inputs
    out += ["", "", "def make_inputs():", "    g = torch.Generator().manual_seed(SEED)", "    return {"]
    for x in p.inputs:
        shape = input_shape(p, x)
        if x.dist == "index":
            make = f"torch.randint(0, {x.vocab}, {shape}, generator=g)"
        elif x.dist == "perm":
            make = f"torch.randperm({x.vocab}, generator=g) * {x.steps}"
        elif x.dist.startswith("collide:"):  # program b's entry made program a's
            a, b = x.dist.split(":")[1:]
            make = (f"(lambda t: t.index_fill_(0, torch.tensor([{b}]), int(t[{a}])))"
                    f"(torch.randperm({x.vocab}, generator=g) * {x.steps})")
        elif x.dist == "ties":
            make = f"torch.randint(-4, 5, {shape}, generator=g).to(torch.float64) / 2"
        else:
            make = f"torch.rand({shape}, generator=g, dtype=torch.float64) * 4 - 2"
        out.append(f'        "{x.ptr}": {make},')
    out += ["    }", "", "", "def make_output_grads():", "    g = torch.Generator().manual_seed(SEED + 1)",
            "    return {name: torch.randn(shape, generator=g, dtype=torch.float64) "
            "for name, shape in OUTPUTS.items()}", ""]
    return "\n".join(out)


def dot_inputs(p: Program) -> list[str]:
    """The float inputs a ``tl.dot`` reads, through the values its operands are computed from or its own lines."""
    seen, todo = set(), [i for i, n in enumerate(p.nodes) if "tl.dot" in "\n".join((n.tl, *n.pre_tl))]
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo += p.nodes[i].args
    text = "\n".join(line for i in seen for line in (p.nodes[i].tl, *p.nodes[i].pre_tl))
    return [x.ptr for x in p.inputs if x.dist not in ("index", "perm") and not x.dist.startswith("collide:")
            and re.search(rf"\b{x.ptr}\b", text)]


def strided_inputs(p: Program) -> list[str]:
    """The inputs read only at the strides the launch passes (bindings.py may bind views to them)."""
    return sorted(x.ptr for x in p.inputs if (x.role == "tile" and p.strided or x.strided)
                  and x.name not in p.contiguous)


def strides_of(p: Program) -> dict[str, int]:
    """Per input loaded at the launch's strides (tiles in strided programs, Program.strided; wide and cols inputs
    where ``Input.strided``), its parameters with a contiguous layout's."""
    found = {}
    for x in p.inputs:
        if x.role == "tile" and p.strided or x.strided:
            shape = input_shape(p, x)
            found[f"{x.name}_s0"] = shape[1] if len(shape) == 2 else 1
            if len(shape) == 2:
                found[f"{x.name}_s1"] = 1
    return found


def input_shape(p: Program, x: Input) -> tuple[int, ...]:
    if x.role == "tile":
        return tuple(p.dim(k).size for k in x.dims)
    if x.role == "scalar":
        return (math.prod(p.grid),) if x.per_program else (1,)
    if x.role == "count":
        return (math.prod(p.grid),)
    if x.role == "perm":
        return (x.vocab,)
    if x.role == "table":
        return (x.vocab, *(p.dim(k).size for k in x.dims))
    if x.role == "stack":
        return (x.steps, *(p.dim(k).size for k in x.dims))
    if x.role == "wide":
        return (p.dim(x.dims[0]).size, x.steps)
    if x.role == "cols":
        return (x.steps,)
    return (p.dim(x.dims[0]).size,)


# ------------------------------------------------------------------------------------------
# checking


@dataclass
class Outcome:
    status: str  # "passed" | "refused" | "mismatch" | "crashed" | "invalid" (the generator's fault)
    detail: str = ""
    source: str = ""
    bindings: list = field(default_factory=list)  # the kernel under other bindings of memory (bindings.py)
    variations: list = field(default_factory=list)  # the call's variations the kernel has (variations_of)
    jvp: Outcome | None = None  # the kernel's op under torch.func.jvp (variations.check_jvp)
    double: Outcome | None = None  # the op differentiated twice (variations.check_double_backward), where drawn
    reshaped: Outcome | None = None  # the op's host function reshaping around the launch (reshapes.py), where drawn

    def report(self) -> str:
        return f"{self.status}: {self.detail}\n\n----- kernel module -----\n{self.source}"


_WORKDIR: str | None = None


def load_module(src: str):
    """Import ``src`` from a file of its own (kernels need readable source)."""
    global _WORKDIR
    if _WORKDIR is None:
        _WORKDIR = tempfile.mkdtemp(prefix="tritongrad_fuzz_")
    name = "fuzz_" + hashlib.sha1(src.encode()).hexdigest()[:16]
    path = os.path.join(_WORKDIR, name + ".py")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def close(got, want, tol: float) -> None:
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    import torch

    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def check(p: Program) -> Outcome:
    src = render(p)
    return check_source(src)


def check_source(src: str) -> Outcome:
    """Run a kernel module's forward and derived backward against its mirror, every memory access checked
    to lie inside the launch's tensors (bounds.py)."""
    from .bounds import checked

    with checked(), _poisoned_empties():
        outcome = _check_source(src)
        outcome.variations = variations_of(src)
        if "\nEXPECT = " in src:
            return outcome
        seed = int(re.search(r"^SEED = (\d+)$", src, re.M).group(1))
        if JVP and outcome.status in ("passed", "refused"):
            outcome = _with(src, outcome, "jvp", check_jvp)
        if outcome.status == "passed" and drawn(seed, 4099, DOUBLE):
            outcome = _with(src, outcome, "double", check_double_backward)
        if outcome.status == "passed" and drawn(seed, 4111, RESHAPE):
            outcome = _with(src, outcome, "reshaped", check_reshaped)
        _record_events(outcome)
        return outcome


def _record_events(outcome: Outcome) -> None:
    """Inside a hypothesis test, the outcomes of forward mode, double backward and a reshaping host function as its
    events (here, not in the tests: hypothesis derives a test's kernels from its source)."""
    from hypothesis import event
    from hypothesis.control import currently_in_test_context

    if currently_in_test_context():
        for name in ("jvp", "double", "reshaped"):
            found = getattr(outcome, name)
            event(f"{name} {found.status if found is not None else 'not run'}")


JVP = True  # every kernel that passes or is refused also runs under torch.func.jvp as an op (variations.py)
# the shares of the kernels passing their first-order checks whose op is also differentiated twice
# (variations.check_double_backward) and called through a host function reshaping around the launch (reshapes.py),
# drawn by seed: none by default (the default run checks a few seeds in tests of their own), a quarter in the slow
# campaign (tests/fuzz/conftest.py), all in scripts/fuzz_campaign.py's (--double, --reshape)
DOUBLE = 0.0
RESHAPE = 0.0


def drawn(seed: int, salt: int, share: float) -> bool:
    return random.Random(seed * salt + 7).random() < share


def variations_of(src: str) -> list[str]:
    """The call's variations a kernel module has (variations.py), as labels for the campaign's counts."""
    seed = int(re.search(r"^SEED = (\d+)$", src, re.M).group(1))
    found = [f"args_{form_of(seed)}"]
    if re.search(r"= tl\.(zeros|full)\(.*tl\.float32\)$", src, re.M):
        found.append("f32_state")
    if "\nDOTS = " in src:
        found.append("dot")
    return found


def _with(src: str, outcome: Outcome, field_name: str, check_call: Callable) -> Outcome:
    """``outcome`` with the result of a check of the kernel's op (forward mode, double backward, reshaping host
    function) as its ``field_name``; a wrong value or a crash there fails the kernel."""
    mod = load_module(src)
    found = check_call(mod, src, mod.make_inputs(), form_of(mod.SEED))
    setattr(outcome, field_name, found)
    if found.status in ("passed", "refused", "not run"):  # (not run: a known bug, variations.DOUBLE_KNOWN_BUGS)
        return outcome
    return dataclasses.replace(outcome, status=found.status, detail=found.detail)


@contextlib.contextmanager
def _poisoned_empties():
    """Buffers tritongrad leaves unfilled (gradients its loads cover, partial rows every program stores whole)
    come back NaN: an element the backward was to write and did not fails the comparison."""
    import torch

    empty = torch.empty_strided

    def nan_filled(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty_strided = nan_filled
    try:
        yield
    finally:
        torch.empty_strided = empty


def _fresh_outputs(mod, dtype=None) -> dict:
    """The kernel's output buffers (float64 unless ``dtype`` says): zeros where it adds (atomics, early returns), else
    NaN-poisoned; not the inputs it updates in place (``INPLACE``: the launch's copy of the input is that output)."""
    import torch

    from tritongrad.tools.testing import poison

    dtype = dtype or torch.float64
    return {k: torch.zeros(s, dtype=dtype) if k in mod.ZEROED else poison(torch.empty(s, dtype=dtype))
            for k, s in mod.OUTPUTS.items() if k not in in_place(mod)}


def host_function(mod, names: Sequence[str], form: str = "args", dtype=None) -> Callable:
    """The host function an op around a kernel module's kernel wraps: it takes the inputs (``names``, in order) packed
    in ``form`` (variations.py), launches the kernel into fresh outputs (of ``dtype``: float64 unless given) and
    returns them in OUTPUTS' order (an input updated in place as itself)."""

    def launch(*args):
        outs = _fresh_outputs(mod, dtype)
        named = dict(zip(names, unpack(form, args), strict=True))
        mod.kernel[mod.GRID](**named, **outs, **mod.SIZES, **getattr(mod, "STRIDES", {}), **mod.META)
        return tuple(outs[k] if k in outs else named[k] for k in mod.OUTPUTS)  # (an input updated in place)

    return launch


def in_place(mod) -> tuple[str, ...]:
    """The parameters a kernel module's kernel updates in place (inputs and outputs both)."""
    return tuple(getattr(mod, "INPLACE", ()))


def before_and_after(mod, before: dict, after: dict) -> dict:
    """What a backward launch takes for the inputs updated in place: the values before the launch (a copy), and,
    for a kernel that reads back what it stored, the tensor as the launch left it (``<param>_stored``)."""
    found = {}
    for k in in_place(mod):
        found[k] = before[k].detach().clone()
        found[f"{k}_stored"] = after[k]
    return found


def _check_source(src: str) -> Outcome:
    import torch

    from tritongrad import NotDifferentiableError
    from tritongrad.tools.testing import backward_launch

    try:
        mod = load_module(src)
        inputs = mod.make_inputs()
        outputs = _fresh_outputs(mod)
        kwargs = {**inputs, **{k: inputs[k].clone() for k in in_place(mod)}, **outputs, **mod.SIZES,
                  **getattr(mod, "STRIDES", {}), **mod.META}
        mod.kernel[mod.GRID](**kwargs)
        outputs.update({k: kwargs[k] for k in in_place(mod)})  # updated in place
    except Exception as e:  # the generator wrote a kernel Triton does not run
        return Outcome("invalid", "forward: " + first_line(e), src)
    expect = getattr(mod, "EXPECT", "")
    if expect:  # stores collide: whatever the forward wrote, the backward must refuse (at derivation or launch)
        try:
            backward_launch(mod.kernel, mod.GRID, (), {**kwargs, **before_and_after(mod, inputs, kwargs)},
                            mod.make_output_grads())
        except NotDifferentiableError as e:
            return Outcome("refused", f"(colliding by construction) {e.construct}", src)
        except Exception as e:
            return Outcome("crashed", first_line(e), src)
        return Outcome("mismatch", f"colliding stores (expected: a refusal naming {expect!r}) were accepted", src)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v.is_floating_point()}
    want = mod.mirror(*(leaves.get(k, v) for k, v in inputs.items()))
    for k, w in want.items():
        if not torch.isfinite(w).all():
            return Outcome("invalid", f"mirror: non-finite {k}", src)
        try:
            close(outputs[k], w.detach(), mod.TOL)
        except AssertionError as e:
            return Outcome("invalid", f"forward mismatch {k}: {e}", src)
    d_out = mod.make_output_grads()
    outs = [w for w in want.values() if w.requires_grad]
    wanted = dict.fromkeys(leaves)
    if outs:
        grads = torch.autograd.grad(outs, list(leaves.values()), [d_out[k] for k, w in want.items()
                                                                   if w.requires_grad], allow_unused=True)
        wanted = dict(zip(leaves, grads, strict=True))
    try:
        got = backward_launch(mod.kernel, mod.GRID, (), {**kwargs, **before_and_after(mod, inputs, kwargs)}, d_out)
    except NotDifferentiableError as e:
        return Outcome("refused", e.construct, src)
    except Exception as e:
        return Outcome("crashed", first_line(e), src)
    if set(got) != set(leaves):
        return Outcome("mismatch", f"wrt {sorted(got)} != float inputs {sorted(leaves)}", src)
    for k, g in got.items():
        w = wanted[k] if wanted[k] is not None else torch.zeros_like(inputs[k])
        if not torch.isfinite(g).all():
            return Outcome("mismatch", f"d_{k}: non-finite gradient\n{g}\nwant\n{w}", src)
        try:
            close(g, w, mod.TOL)
        except AssertionError as e:
            return Outcome("mismatch", f"d_{k}: {e}\ngot\n{g}\nwant\n{w}", src)
    outcome = _check_saved_state(mod, src, kwargs, outputs, d_out, wanted, inputs)
    if outcome.status == "passed":
        outcome = _check_op(mod, src, inputs)
    if outcome.status == "passed" and BINDINGS:  # the same kernel called with other bindings of memory
        from .bindings import check_bindings

        cases = check_bindings(mod, src, BINDINGS)
        failed = [o for o in cases if o.status not in ("passed", "refused")]
        outcome = failed[0] if failed else outcome
        outcome.bindings = cases
    return outcome


BINDINGS = 2  # bindings of memory each kernel passing its own check is also called with (bindings.py)
OP_CALLS = 3  # the first backward checked, the second keeping its launches, the third launching what it kept


def _check_op(mod, src: str, inputs: dict) -> Outcome:
    """The kernel as a tritongrad.op (host/launch_record.py, backward.py), called OP_CALLS times with inputs and output
    gradients scaled differently each time: each backward must give the mirror's gradients, the later ones made by
    the launches an earlier one kept (host/launcher.Launcher)."""
    import torch

    import tritongrad
    from tritongrad import NotDifferentiableError
    from tritongrad.core.errors import OpError

    form = form_of(mod.SEED)  # the tensors as *args, a list, a tuple or nested (variations.py)

    op = tritongrad.op(host_function(mod, list(inputs), form))
    for call in range(OP_CALLS):
        scaled = {k: v * (1.0 + 0.01 * call) if v.is_floating_point() else v for k, v in inputs.items()}
        d_out = {k: g * (call + 1) for k, g in mod.make_output_grads().items()}
        mirrored = {k: v.clone().requires_grad_() for k, v in scaled.items() if v.is_floating_point()}
        want = mod.mirror(*(mirrored.get(k, v) for k, v in scaled.items()))
        if not all(torch.isfinite(w).all() for w in want.values()):
            continue  # the mirror's domain: not this scale
        reached = [(w, d_out[k]) for k, w in want.items() if w.requires_grad]
        wanted = dict.fromkeys(mirrored)
        if reached:
            grads = torch.autograd.grad([w for w, _ in reached], list(mirrored.values()), [g for _, g in reached],
                                        allow_unused=True)
            wanted = dict(zip(mirrored, grads, strict=True))
        leaves = {k: v.clone().requires_grad_() if v.is_floating_point() else v for k, v in scaled.items()}
        try:
            tensors = [v.clone() if k in in_place(mod) else v for k, v in leaves.items()]
            outs = dict(zip(mod.OUTPUTS, op(*pack(form, tensors)), strict=True))
            reached = [(outs[k], d_out[k]) for k in want if outs[k].requires_grad]
            if reached:
                torch.autograd.backward([o for o, _ in reached], [g for _, g in reached])
        except (NotDifferentiableError, OpError) as e:
            return Outcome("refused", f"as an op ({form}): {first_line(e)}", src)
        except Exception as e:
            return Outcome("crashed", f"as an op ({form}), call {call + 1}: {first_line(e)}", src)
        for k, w in wanted.items():
            g = leaves[k].grad
            g = g if g is not None else torch.zeros_like(scaled[k])
            w = w if w is not None else torch.zeros_like(scaled[k])
            try:
                close(g, w, mod.TOL)
            except AssertionError as e:
                return Outcome("mismatch", f"d_{k} as an op ({form}), call {call + 1}: {e}\ngot\n{g}\nwant\n{w}",
                               src)
    return Outcome("passed", "", src)


def _check_saved_state(mod, src: str, kwargs: dict, outputs: dict, d_out: dict, wanted: dict,
                       inputs: dict) -> Outcome:
    """Where the kernel has an augmented forward (tritongrad/augment.py: it keeps its nonlinear loops' states for
    the backward), it must write what the kernel writes, and the backward reading its tapes the same gradients."""
    import torch

    from tritongrad.runtime import augment
    from tritongrad.tools.testing import backward_launch, forward_keeping_state, poison

    again = {k: inputs[k].clone() if k in in_place(mod) else torch.zeros_like(v) if k in mod.ZEROED else
             poison(torch.empty_like(v)) for k, v in outputs.items()}
    share, augment.SHARE = augment.SHARE, float("inf")  # small tensors: keep the tapes whatever their size
    try:
        saved = forward_keeping_state(mod.kernel, mod.GRID, (), {**kwargs, **again})
    except Exception as e:
        return Outcome("crashed", "augmented forward: " + first_line(e), src)
    finally:
        augment.SHARE = share
    if saved is None:
        return Outcome("passed", "", src)
    for k, v in outputs.items():
        if not torch.equal(again[k].nan_to_num(7.0), v.nan_to_num(7.0)):
            return Outcome("mismatch", f"augmented forward: {k} differs from the kernel's\n{again[k]}\nwant\n{v}", src)
    try:
        got = backward_launch(mod.kernel, mod.GRID, (), {**kwargs, **again, **before_and_after(mod, inputs, again)},
                              d_out, saved=saved)
    except Exception as e:
        return Outcome("crashed", "backward from the saved states: " + first_line(e), src)
    for k, g in got.items():
        w = wanted[k] if wanted[k] is not None else torch.zeros_like(g)
        try:
            close(g, w, mod.TOL)
        except AssertionError as e:
            return Outcome("mismatch", f"d_{k} (from the saved states): {e}\ngot\n{g}\nwant\n{w}", src)
    return Outcome("passed", "", src)


# ------------------------------------------------------------------------------------------
# shrinking recorded choices (campaign failures; hypothesis shrinks its own)


def shrink(choices: list[int], failing: Callable[[list[int]], bool], budget: int = 400) -> list[int]:
    """Greedy: delete blocks of choices, then lower single choices, while ``failing`` holds."""
    best = list(choices)
    tries = 0

    def attempt(cand):
        nonlocal best, tries
        tries += 1
        if cand != best and failing(cand):
            best = cand
            return True
        return False

    improved = True
    while improved and tries < budget:
        improved = False
        for size in (8, 4, 2, 1):
            i = 0
            while i + size <= len(best) and tries < budget:
                if not attempt(best[:i] + best[i + size:]):
                    i += 1
                else:
                    improved = True
        for i in range(len(best)):
            if tries >= budget:
                break
            for v in (0, best[i] // 2, best[i] - 1):
                if 0 <= v < best[i] and attempt(best[:i] + [v] + best[i + 1:]):
                    improved = True
                    break
    return best


def replay(choices: Sequence[int], avoid: Sequence[str] = (), strided: bool = False,
           focus: Sequence[str] = ()) -> Program:
    return generate(ReplayDraw(choices), avoid, strided, focus)


def regression_source(src: str, name: str, reason: str) -> str:
    """A regression test module: the shrunk kernel and a plain test against PyTorch."""
    head, _, rest = src.partition("import torch\n")
    test = f'''

@pytest.mark.xfail(strict=True, reason={reason!r})
def test_{name}():
    inputs = make_inputs()
    outputs = {{k: torch.zeros(s, dtype=torch.float64) if k in ZEROED else poison(torch.empty(s, dtype=torch.float64))
               for k, s in OUTPUTS.items()}}
    kwargs = {{**inputs, **outputs, **SIZES, **globals().get("STRIDES", {{}}), **META}}
    kernel[GRID](**kwargs)
    leaves = {{k: v.clone().requires_grad_() for k, v in inputs.items() if v.is_floating_point()}}
    want = mirror(*(leaves.get(k, v) for k, v in inputs.items()))
    for k, w in want.items():
        torch.testing.assert_close(outputs[k], w.detach(), rtol=TOL, atol=TOL)
    d_out = make_output_grads()
    got = backward_launch(kernel, GRID, (), kwargs, d_out)
    grads = torch.autograd.grad(list(want.values()), list(leaves.values()), [d_out[k] for k in want],
                                allow_unused=True)
    for k, w in zip(leaves, grads, strict=True):
        w = torch.zeros_like(inputs[k]) if w is None else w
        torch.testing.assert_close(got[k], w, rtol=TOL, atol=TOL * max(1.0, w.abs().max().item()))
'''
    return (head + "# ruff: noqa: E501\n\nimport pytest\nimport torch\n" + rest.replace(
        "import triton.language as tl\n", "import triton.language as tl\n\nfrom tritongrad.tools.testing import "
        "backward_launch, poison\n", 1) + test)


if __name__ == "__main__":  # print one program: python tests/fuzz/generate.py SEED
    print(render(random_program(int(sys.argv[1]) if len(sys.argv) > 1 else 0)[0]))
