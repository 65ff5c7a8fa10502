"""The augmented forward: the user's kernel as written, also keeping its nonlinear loops' states for the backward.

A derived backward reverses a loop with nonlinear carried state (an online log-sum-exp's running max and sum)
from a tape of that state at the start of each iteration (loops.py). Recorded by the backward, the tape costs a
pass over the loop before the reverse one: a cross-entropy's backward reads its logits twice. So where an op's
forward launches such a kernel, it launches this one instead: the user's function (its own source, recompiled),
with, around each loop the backward tapes,

    tritongrad_row_0 = tg.tape_row(tritongrad_tape_0, m, tritongrad_slots_0, tg.program_index())  # before
    tritongrad_slot_0 = tl.full((), 0, tl.int32)
    for ...:
        tg.tape_put(tritongrad_row_0, tritongrad_slot_0, m, True)              # the state each iteration starts from
        tritongrad_slot_0 += 1
        <the body as written>
    tg.tape_put(tritongrad_row_0, tritongrad_slot_0, m, True)                  # and the state after the loop

and the backward's variant that reads those tapes (``BackwardKernel.prepare(saved=...)``; ``loops.SAVED``)
recomputes neither the loop nor its recording pass. The tapes live from the forward to the backward: they are kept
only where they take at most ``SHARE`` of the bytes of the launch's tensors (a running max and sum per row, not an
attention accumulator per iteration; a loop's final state, one slot per program, at most ``FINALS_SHARE``: an
attention accumulator after the loop is as big as the output), for loops outside any other loop, and where the
launch gives the loops' trip counts. A loop in an inlined ``@triton.jit`` helper is kept through copies of the
helpers on its way (``Origin.calls``: one per call, so each of two calls of a helper keeps its own tapes) taking
the tape parameters after their own, each call on the way made outside any loop. Anything else launches the
user's kernel unchanged, and the backward records its tapes itself (``TRITONGRAD_SAVE_STATE=0`` does that always).
The augmented kernel is a plain ``triton.jit`` of the function: the user's jit options (``do_not_specialize``,
``debug``) are not carried.
"""

from __future__ import annotations

import ast
import copy
import functools
import itertools
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from ..analysis.launch_values import Expr, LaunchValues
from ..codegen.generate import jit_source
from ..core import language as tg
from ..core.ir import Origin
from ..core.source import Source, append_parameters, is_jit
from ..reverse.state_tape import StateTape, tape_row

SHARE = 0.25  # the state tapes a forward keeps may take this share of the bytes of the launch's tensors
FINALS_SHARE = 1.0  # and its loops' final states (one slot per program, not per iteration) this share
ENABLED = os.environ.get("TRITONGRAD_SAVE_STATE", "1") != "0"


@dataclass(frozen=True)
class SavedStates:
    """The state tapes one forward launch kept: for which tapes (the backward checks it reads the same ones), and
    the backward kernel's arguments for them (tape buffers and slot counts, by the backward's parameter names)."""

    tapes: tuple[StateTape, ...]
    args: dict[str, Any]


@dataclass(frozen=True)
class Augmented:
    """A kernel's augmented forward: ``kernel`` takes the forward's parameters, then ``params``: per backward
    tape parameter (tape buffers, slot counts), the augmented kernel's own name for it."""

    kernel: Any
    tapes: tuple[StateTape, ...]
    params: dict[str, str]
    src: str
    layouts: dict[tuple, tuple | None] = field(default_factory=dict)  # launch scalars -> the tapes' layout

    def keeping(self, named: dict[str, Any], grid: tuple[int, ...]) -> Keeping | None:
        """How a launch's fresh tapes are made, or None where its trip counts are not known or the tapes would be
        too big."""
        key = (grid, *[named.get(n) for n in self._reads])
        try:
            layout = self.layouts.get(key, False)
        except TypeError:  # an unhashable argument: sized afresh
            layout = key = None
        if layout is False or key is None:
            layout = self._layout(named, grid)
            if key is not None and len(self.layouts) < 256:
                self.layouts[key] = layout
        if layout is None:
            return None
        (states, finals), views, slots = layout
        tensors = [v for v in named.values() if isinstance(v, torch.Tensor)]
        size = sum(t.numel() * t.element_size() for t in tensors)
        if not tensors or states > SHARE * size or finals > FINALS_SHARE * size:
            return None
        return Keeping(self.kernel, self.tapes, tuple(p for p, _, _ in views), tuple(b - a for _, a, b in views),
                       slots, tensors[0].device, self.params)

    @functools.cached_property
    def _reads(self) -> tuple[str, ...]:
        """The launch's arguments the tapes' sizes depend on (trip counts, tile shapes)."""
        names = set()
        for tape in self.tapes:
            names |= tape.trips.names() if tape.trips is not None else set()
            names |= {n for _, shape in tape.states for extent in shape for n in Expr.of_text(extent).names()}
            names |= tape.type_names()
        return tuple(sorted(names))

    def _layout(self, named: dict[str, Any], grid: tuple[int, ...]) -> tuple | None:
        """((bytes of state tapes, of finals), (parameter, first byte, end) per tape buffer, slot count per tape)
        for a launch; None where a trip count is not known. Buffers are 8-byte aligned slices of one allocation."""
        launch, programs = LaunchValues(named, grid), math.prod(grid)
        views, slots, at, finals = [], {}, 0, 0
        for tape in self.tapes:
            trips = 0 if tape.final else tape.known_trips(launch)
            if trips is None:
                return None
            slots[tape.slots] = trips + 1
            for param, size in tape.state_bytes(launch).items():
                n = max(8, -(-programs * (trips + 1) * size // 8) * 8)
                views.append((param, at, at + n))
                at += n
                finals += n if tape.final else 0
        return (at - finals, finals), tuple(views), slots



@dataclass(frozen=True)
class Keeping:
    """What ``keeping`` decides for a launch: the augmented kernel and how its tapes are laid out in one allocation
    (8-byte aligned slices of it one after another: per tape buffer its parameter and bytes; the slot count per
    tape). Launches of the same kernel, grid and non-tensor values, their tensors of the same dtypes and sizes on the
    same device, decide alike (the layout reads the values and the tensors' sizes and dtypes): a replay keeps it per
    launch (replay.py) and makes each call's tapes afresh (``fresh``)."""

    kernel: Any
    tapes: tuple[StateTape, ...]
    names: tuple[str, ...]
    sizes: tuple[int, ...]
    slots: dict[str, int]
    device: torch.device
    params: dict[str, str]  # per backward tape parameter, the augmented kernel's own name for it

    def fresh(self) -> tuple[Any, dict[str, Any], SavedStates]:
        """The augmented kernel, its extra arguments (by its own parameter names) and the fresh tapes they are."""
        return self.kept_in(self.buffer())

    @property
    def buffer_size(self) -> int:
        return sum(self.sizes)

    def buffer(self) -> torch.Tensor:
        """A fresh allocation for the tapes (uninitialized: the augmented kernel writes every slot it reads)."""
        return torch.empty(self.buffer_size, dtype=torch.uint8, device=self.device)

    def kept_in(self, buffer: torch.Tensor) -> tuple[Any, dict[str, Any], SavedStates]:
        """``fresh``'s answer for tapes in ``buffer`` (a compiled graph saves it between its forward and backward:
        host/saved_backward.py)."""
        saved = SavedStates(self.tapes, {**dict(zip(self.names, buffer.split_with_sizes(self.sizes), strict=True)),
                                         **self.slots})  # (one call, not a slicing per tape)
        return self.kernel, {self.params[k]: v for k, v in saved.args.items() if k in self.params}, saved


def keeping(jit_fn: Any, named: dict[str, Any], grid: tuple[int, ...]
            ) -> tuple[Any, dict[str, Any], SavedStates] | None:
    """For a launch (its arguments by parameter name, its grid): the augmented kernel, its extra arguments and
    the tapes they are, where its backward can read state tapes the forward keeps; else None."""
    found = keeping_of(jit_fn, named, grid)
    return None if found is None else found.fresh()


def keeping_of(jit_fn: Any, named: dict[str, Any], grid: tuple[int, ...]) -> Keeping | None:
    """``keeping``'s decision for a launch, before any tape is made (None: the launch keeps none)."""
    found = augmented(jit_fn, named)
    return found.keeping(named, grid) if found is not None else None


_augmented: dict[tuple, Augmented | None] = {}
_lock = threading.Lock()


def augmented(jit_fn: Any, named: dict[str, Any]) -> Augmented | None:
    """The augmented forward of the kernel specialization a launch runs (cached), or None where its backward
    keeps no state tape the forward could keep instead."""
    from .derivation import decisive_constexprs, hashable

    if not ENABLED:
        return None
    key = (jit_fn.fn, type(jit_fn), *[hashable(named.get(k)) for k in decisive_constexprs(jit_fn)])
    if key in _augmented:
        return _augmented[key]
    try:
        found = _build(jit_fn, named)
    except Exception:  # what cannot be differentiated says so in the backward, where it is needed
        found = None
    with _lock:
        _augmented[key] = found
    return found


def _build(jit_fn: Any, named: dict[str, Any]) -> Augmented | None:
    from .derive import grad

    bwd = grad(jit_fn, constexprs=named)
    tapes = bwd.saved_tapes()
    if not any(tape.states for tape in tapes):
        return None
    kernel = _Copy(Source.of(jit_fn))
    copies = {(): kernel}  # call path -> its function's copy (the kernel's, and its helpers' on a tape's way)
    params: dict[str, str] = {}
    for k, tape in enumerate(tapes):
        if not tape.states:  # nothing the backward reads from it: its slot count only
            continue
        found = _reach(copies, tape.loop)
        loop = _loop_of(found, tape) if found is not None else None
        if loop is None:
            return None
        row = {s: f"tritongrad_row_{k}_{j}" for j, s in enumerate(tape.sources)}
        slot = f"tritongrad_slot_{k}"
        mine = {tape.slots: f"tritongrad_slots_{k}",
                **{param: f"tritongrad_tape_{k}_{j}" for j, (param, _) in enumerate(tape.states)}}
        params.update(mine)
        found.params += mine.values()
        dtypes = tape.dtypes or (None,) * len(tape.states)
        # each typed state's tape as a pointer of its type, made where the kernel's parameters spell it (its type
        # as the backward spells it: the same rule), passed on to the helpers on the way
        kernel.tree.body[:0] = [_typed_tape(params[p], dtype) for (p, _), dtype in zip(tape.states, dtypes, strict=True)
                                if dtype is not None]
        before = [f"{row[s]} = " + ast.unparse(_tg(tape_row(dtype and f"{params[p]}.dtype.element_ty", *(
            ast.Name(n, ast.Load()) for n in (params[p], s, params[tape.slots])), ast.parse(
            "tg.program_index()", mode="eval").body)))
                  for (p, _), s, dtype in zip(tape.states, tape.sources, dtypes, strict=True)]
        before.append(f"{slot} = tritongrad_tl.full((), 0, tritongrad_tl.int32)")  # a constexpr 0 cannot be carried
        puts = [f"tritongrad_tg.tape_put({row[s]}, {slot}, {s}, True)" for s in tape.sources]
        block = _block_of(found.parents[id(loop)], loop)
        at = block.index(loop)
        block[at:at + 1] = [*_parse(before), loop, *_parse(puts)]
        if not tape.final:  # a state tape: also the state each iteration starts from
            loop.body[:0] = _parse([*puts, f"{slot} += 1"])
    kernel.params = list(params.values())  # (the order the launch passes them in)
    jitted, src = kernel.compile(f"{kernel.source.name}_augmented", itertools.count())
    return Augmented(jitted, tapes, params, src)


@dataclass
class _Copy:
    """A function on the way to a taped loop, copied for the augmented forward: the tape parameters it takes (its
    own loops' and its callees'), and the copies its calls on the way to the others call instead."""

    source: Source
    tree: ast.FunctionDef = field(init=False)
    params: list[str] = field(default_factory=list)
    callees: list[tuple[ast.Call, _Copy]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tree = copy.deepcopy(self.source.tree)

    @functools.cached_property
    def parents(self) -> dict[int, ast.AST]:
        return {id(c): p for p in ast.walk(self.tree) for c in ast.iter_child_nodes(p)}

    @functools.cached_property
    def locals(self) -> set[str]:
        """Its parameters and the names it assigns (a call through one of them is not the global helper's)."""
        return {a.arg for a in self.tree.args.args} | {
            n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    def at(self, origin: Origin) -> list[ast.AST]:
        """Its nodes on the line of ``origin`` (in its own file and function), else none."""
        if origin.file != self.source.file or origin.function != self.source.name:
            return []
        line = origin.line - self.source.first_line + 1
        return [n for n in ast.walk(self.tree) if getattr(n, "lineno", None) == line]

    def outside_loops(self, node: ast.AST) -> bool:
        """Whether ``node`` runs once per call: in no loop (nor nested function) of its function."""
        node = self.parents.get(id(node))
        while node is not None and node is not self.tree:
            if isinstance(node, (ast.For, ast.While, ast.FunctionDef, ast.Lambda, ast.comprehension)):
                return False
            node = self.parents.get(id(node))
        return True

    def compile(self, name: str, numbers: itertools.count) -> tuple[Any, str]:
        """Its copy as ``name`` (a plain ``triton.jit``: the user's jit options are not carried), calling its
        callees' copies (compiled first) with their tape parameters; and the source of all of them."""
        scope = {**self.source.scope, "triton": triton, "tritongrad_tg": tg, "tritongrad_tl": tl}
        sources = []
        for call, callee in self.callees:
            callee_name = f"{callee.source.name}_augmented_{next(numbers)}"
            scope[callee_name], text = callee.compile(callee_name, numbers)
            sources.append(text)
            call.func = ast.Name(callee_name, ast.Load())
            call.keywords += [ast.keyword(p, ast.Name(p, ast.Load())) for p in callee.params]
            self.params += [p for p in callee.params if p not in self.params]
        self.tree.name = name
        self.tree.decorator_list = []
        append_parameters(self.tree, self.params)
        src = f"@triton.jit\n{ast.unparse(ast.fix_missing_locations(self.tree))}\n"
        return jit_source(src, name, scope), "\n".join([*sources, src])


def _reach(copies: dict[tuple, _Copy], loop: Origin | None) -> _Copy | None:
    """The copy of the function holding a taped loop: the kernel's, or a helper's reached through the calls the
    loop's origin lists (``Origin.calls``), each such call made once per program (outside loops) and, for a
    helper called more than once, its own copy per call. None where a call cannot be found as the origin says."""
    if loop is None:
        return None
    path = loop.calls
    for i, site in enumerate(path):
        if path[:i + 1] in copies:
            continue
        caller = copies[path[:i]]
        callee = path[i + 1].function if i + 1 < len(path) else loop.function
        calls = [n for stmt in caller.at(site) if isinstance(stmt, ast.stmt) for n in _expressions(stmt)
                 if isinstance(n, ast.Call) and _helper(caller, n, callee) is not None]
        if len(calls) != 1 or not caller.outside_loops(calls[0]):
            return None
        copies[path[:i + 1]] = found = _Copy(Source.of(_helper(caller, calls[0], callee)))
        caller.callees.append((calls[0], found))
    return copies[path]


def _expressions(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of a statement's own expressions (not of the statements nested in it)."""
    found, todo = [], [c for c in ast.iter_child_nodes(stmt) if not isinstance(c, ast.stmt)]
    while todo:
        node = todo.pop()
        found.append(node)
        todo += [c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.stmt)]
    return found


def _helper(caller: _Copy, call: ast.Call, name: str) -> Any:
    """The ``@triton.jit`` function named ``name`` a call calls (by a name or a module's attribute), else None."""
    parts, func = [], call.func
    while isinstance(func, ast.Attribute):
        parts.insert(0, func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or func.id not in caller.source.scope or func.id in caller.locals:
        return None
    obj = caller.source.scope[func.id]
    for part in parts:
        obj = getattr(obj, part, None)
    return obj if is_jit(obj) and obj.fn.__name__ == name else None


def _loop_of(found: _Copy, tape: StateTape) -> ast.For | None:
    """The user's ``for`` a tape is for, in the function ``found`` copies: outside any other loop, its states the
    user's names assigned in its body."""
    loops = [n for n in found.at(tape.loop) if isinstance(n, ast.For)]
    if len(loops) != 1 or not found.outside_loops(loops[0]):
        return None
    loop = loops[0]
    assigned = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if not all(s.isidentifier() and s in assigned for s in tape.sources):
        return None
    return loop


def _block_of(parent: ast.AST, node: ast.stmt) -> list[ast.stmt]:
    for name in ("body", "orelse"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and any(s is node for s in block):
            return block
    raise ValueError("statement not found in its parent")


def _typed_tape(param: str, dtype: str) -> ast.stmt:
    """``param = param.to(tl.pointer_type(dtype))``, in the augmented kernel's own names for ``tl`` and ``tg``."""
    text = f"{param} = {param}.to(tl.pointer_type({dtype}))"
    return _tg(ast.parse(text).body[0])


def _tg(node: ast.AST) -> ast.AST:
    """``node`` with ``tl`` and ``tg`` named as the augmented kernel imports them (the user's scope may not)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in ("tl", "tg"):
            n.id = f"tritongrad_{n.id}"
    return node


def _parse(lines: list[str]) -> list[ast.stmt]:
    return ast.parse("\n".join(lines)).body


def clear_cache() -> None:
    with _lock:
        _augmented.clear()
