"""The type a value of the normalized body has, as Triton promotes it, spelled for the kernel to compute.

A loop's state declared ``acc = tl.zeros((BLOCK,), dtype=tl.float32)`` that sums float64 values is float64 in
Triton's interpreter (and in a ``tl.static_range``, unrolled): a carried value takes the type its updates give
it. What keeps that state (a state tape, the forward's kept finals, an interchange's prologue) must keep that
type, not the declared one, or it rounds the state (and a tape sized for four bytes an element is overrun by
eight). Compiled ``range`` loops keep a carried value's type (Triton refuses a change), so there the type is
the declared one; the expression below says so by itself.

:func:`value_type` spells the type as an expression the kernel evaluates at compile time: Triton's own promotion
applied to samples of the operands' types (``tl.zeros((), x_ptr.dtype.element_ty)`` for a value loaded through
``x_ptr``, a scalar parameter itself, a number as written, ``tl.sum`` / ``tl.max`` / ``tl.dot`` / a division on
samples where those change a type), every operand followed through its definitions (a carried value through
its start and its updates together; a descriptor's load through the pointer its descriptor is made over). The
samples name only the kernel's parameters, ``tl`` and numbers, so any kernel derived from it can say them. None
where an operand's type cannot be said that way (a descriptor made over a computed pointer, an unknown call):
then its keeper takes the widest type (state_tape.py: ``tape_row_wide``).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from ..core.ir import op_of, target_of
from ..core.operations import operation_of
from .addresses import descriptor_base


@dataclass(frozen=True)
class _Wrapped:
    """A sample made by an operation on others (``tl.sum``, ``tl.dot``, a division, ``tl.where``): ``text`` with
    ``{0}``, ``{1}``... standing for the types of ``parts``; where a float32 sample is promoted with it, it is the
    promotion of its parts' samples (each of these operations then gives the promotion of its operands)."""

    text: str
    parts: tuple[frozenset, ...]

    def __str__(self) -> str:
        return self.text.format(*(_spelled(p) for p in self.parts))

# operations whose result has their first operand's type (shapes moved, values kept, or a function that keeps
# its operand's type)
SAME = frozenset(("copy pos neg subscript expand_dims broadcast_to reshape view trans permute multiple_of "
                  "max_contiguous max_constancy stop_gradient exp exp2 log log2 sqrt sqrt_rn rsqrt sin cos erf abs "
                  "tanh log1p expm1 floor ceil zeros_like").split())
JOINED = frozenset(("add", "sub", "mul", "maximum", "minimum", "fma", "clamp"))  # promoted together
DIVIDED = frozenset(("truediv", "fdiv", "div_rn"))  # promoted together, at least float32
COMPARED = frozenset(("lt", "le", "gt", "ge", "eq", "ne"))
REDUCED = {"sum": "tl.sum", "max": "tl.max", "min": "tl.min"}  # (tl.max / tl.min widen types under 32 bits)
INDICES = frozenset(("arange", "program_id", "num_programs"))


def value_type(name: str, defs: dict[str, list[ast.stmt]], pointer_base: dict[str, str], params: set[str],
               constexprs: set[str]) -> str | None:
    """``name``'s type as a kernel expression (``tl.float32``, ``COMPUTE``, or Triton's promotion of samples:
    ``(tl.zeros((), tl.float32) + tl.zeros((), x_ptr.dtype.element_ty)).dtype``); None where it cannot be said."""
    found = _Types(defs, pointer_base, params, constexprs).of_name(name)
    return None if found is None else _spelled(found)


class _Types:
    def __init__(self, defs, pointer_base, params, constexprs):
        self.defs, self.pointer_base, self.params, self.constexprs = defs, pointer_base, params, constexprs
        self.busy: list[str] = []  # names being typed (a carried value's own update: its fixpoint adds nothing)
        self.cycles = 0  # how many times a name being typed was met (what was typed then is not memoized)
        self.memo: dict[str, frozenset[str] | None] = {}

    def of_name(self, name: str) -> frozenset[str] | None:
        """The samples whose promotion is the name's type (a set: promotion is a join, its order aside)."""
        if name in self.memo:
            return self.memo[name]
        if name in self.busy:
            self.cycles += 1
            return frozenset()
        if name not in self.defs:
            # a parameter or a compile-time global: itself (a number, a scalar tensor, a constexpr)
            return frozenset((name,)) if name in self.params or name in self.constexprs else None
        self.busy.append(name)
        cycles, found = self.cycles, frozenset()
        for stmt in self.defs[name]:
            one = self.of_stmt(stmt)
            found = None if one is None or found is None else found | one
        self.busy.pop()
        if self.cycles == cycles or not self.busy:  # (complete: it met no name still being typed)
            self.memo[name] = found
        return found

    def of_stmt(self, stmt: ast.stmt) -> frozenset[str] | None:
        if isinstance(stmt, ast.For):  # a loop's index
            return frozenset(("tl.zeros((), tl.int32)",))
        if not isinstance(stmt, (ast.Assign, ast.AugAssign)) or target_of(stmt) is None:
            return None
        try:
            op = op_of(stmt)
        except Exception:
            return None
        args = op.args
        if op.kind in SAME and args:
            return self.of_atom(args[0])
        if op.kind in JOINED:
            return self.joined(args)
        if op.kind in DIVIDED:
            found = self.joined(args[:2])
            return frozenset((_Wrapped("tl.zeros((), {0}) / 1.0", (found,)),)) if found else None
        if op.kind in COMPARED:
            return frozenset(("tl.zeros((), tl.int1)",))
        if op.kind in INDICES:
            return frozenset(("tl.zeros((), tl.int32)",))
        if op.kind == "where" and len(args) == 3:
            x, y = (self.of_atom(a, weak=False) for a in args[1:])
            if x is None or y is None or not x and not y:
                return None
            if not x or not y:  # one side the value being typed (its fixpoint): the other side's type
                return x or y
            return frozenset((_Wrapped("tl.where(tl.zeros((), tl.int1), tl.zeros((), {0}), tl.zeros((), {1}))",
                                       (x, y)),))
        if operation_of(op).converts and len(args) >= 2 and not _bitcast(op):
            return self.of_dtype(args[1])
        if op.kind in ("zeros", "full"):
            at = 1 if op.kind == "zeros" else 2
            dtype = op.kwargs.get("dtype", args[at] if len(args) > at else None)
            return self.of_dtype(dtype) if dtype is not None else None
        if op.kind in REDUCED and args:
            found = self.of_atom(args[0], weak=False)
            dtype = op.kwargs.get("dtype") if "dtype" in operation_of(op).signature.positional else None  # tl.sum's
            dtype = None if dtype is None or _is_none(dtype) else self.of_dtype(dtype)
            if not found or (op.kwargs.get("dtype") is not None and not _is_none(op.kwargs["dtype"]) and not dtype):
                return None
            extra = ", dtype={1}" if dtype else ""
            return frozenset((_Wrapped(f"{REDUCED[op.kind]}(tl.zeros((1,), {{0}}), 0{extra})",
                                       (found, dtype) if dtype else (found,)),))
        if op.kind == "dot":
            return self.dot(op)
        described = operation_of(op).descriptor == "method" and operation_of(op).memory == "load"
        if (operation_of(op).access == "load" or described) and args and isinstance(args[0], ast.Name):
            param = self.pointer_base.get(args[0].id, args[0].id)
            plain = descriptor_base(args[0].id, self.defs) == param if described else self._plain_pointer(
                args[0].id, param)
            if param in self.params and plain:
                return frozenset((f"tl.zeros((), {param}.dtype.element_ty)",))
        return None

    def _plain_pointer(self, name: str, param: str) -> bool:
        """Whether the pointer ``name`` is ``param`` moved by offsets only (not cast to another type)."""
        seen = set()
        while name not in seen:
            seen.add(name)
            stmts = self.defs.get(name)
            if not stmts:
                return name == param
            if len(stmts) != 1:
                return False
            try:
                op = op_of(stmts[0])
            except Exception:
                return False
            names = [a.id for a in op.args if isinstance(a, ast.Name) and (a.id in self.pointer_base or a.id == param)]
            pointer_arithmetic = operation_of(op).pointer_args[:1] == (0,) and not operation_of(op).descriptor
            if not pointer_arithmetic or len(names) != 1:  # `p + offs`, `p[:, None]`: its first operand's pointer
                return False
            name = names[0]
        return False

    def dot(self, op) -> frozenset[str] | None:
        names = ("input", "other", "acc")
        args = dict(zip(names, op.args, strict=False))
        args.update({k: v for k, v in op.kwargs.items() if k in names})
        if "input" not in args or "other" not in args:
            return None
        samples, parts = [], []
        for key in names:
            if key in args and not _is_none(args[key]):
                found = self.of_atom(args[key], weak=False)
                if found is not None and not found and key == "acc":  # the carried value itself: its start's type
                    continue
                if not found:
                    return None
                samples.append(f"tl.zeros((16, 16), {{{len(parts)}}})")
                parts.append(found)
        out = op.kwargs.get("out_dtype")
        if out is not None and not _is_none(out):
            found = self.of_dtype(out)
            if not found:
                return None
            samples.append(f"out_dtype={{{len(parts)}}}")
            parts.append(found)
        return frozenset((_Wrapped(f"tl.dot({', '.join(samples)})", tuple(parts)),))

    def joined(self, atoms) -> frozenset[str] | None:
        found = frozenset()
        for a in atoms:
            one = self.of_atom(a)
            if one is None:
                return None
            found |= one
        return found

    def of_atom(self, atom: ast.expr, weak: bool = True) -> frozenset[str] | None:
        """An operand's samples; a number is itself (Triton promotes it as a weak type), or, where ``weak`` is
        False (an operand Triton makes a tensor of first), the tensor it becomes."""
        if isinstance(atom, ast.Name):
            return self.of_name(atom.id)
        number = _number(atom)
        if number is None:
            return None
        return frozenset((number,) if weak else (f"tl.full((), {number}, {_tensor_of(number)})",))

    def of_dtype(self, dtype: ast.expr) -> frozenset[str] | None:
        """The samples of a type as written: ``tl.float32``, a constexpr, ``y.dtype``, ``p.dtype.element_ty``."""
        if isinstance(dtype, ast.Attribute) and isinstance(dtype.value, ast.Name) and dtype.value.id == "tl":
            return frozenset((f"tl.zeros((), {ast.unparse(dtype)})",))
        if isinstance(dtype, ast.Name) and dtype.id not in self.defs and (
                dtype.id in self.constexprs or dtype.id in self.params):
            return frozenset((f"tl.zeros((), {dtype.id})",))
        if isinstance(dtype, ast.Name) and len(self.defs.get(dtype.id, ())) == 1:  # a type assigned once
            stmt = self.defs[dtype.id][0]
            try:
                op = op_of(stmt)
            except Exception:
                return None
            return self.of_dtype(op.args[0]) if op.kind == "copy" and op.args else None
        if isinstance(dtype, ast.Attribute) and dtype.attr == "dtype" and isinstance(dtype.value, ast.Name):
            return self.of_name(dtype.value.id)
        if (isinstance(dtype, ast.Attribute) and dtype.attr == "element_ty" and isinstance(dtype.value, ast.Attribute)
                and dtype.value.attr == "dtype" and isinstance(dtype.value.value, ast.Name)
                and dtype.value.value.id in self.params):
            return frozenset((f"tl.zeros((), {ast.unparse(dtype)})",))
        return None


WIDE = ("tl.zeros((), tl.float32)", "tl.zeros((), tl.float64)")  # samples no operation narrows


@functools.lru_cache(maxsize=4096)  # (samples share parts: spelled once each, not once per path to them)
def _spelled(samples: frozenset) -> str | None:
    """The type the samples promote to: one written-out type as it is (``COMPUTE``), else ``(...).dtype``."""
    samples = _simplified(samples)
    single = _written(str(next(iter(samples)))) if len(samples) == 1 else None
    if single is not None:
        return single
    if not samples:
        return None
    sample = _sample(samples)
    if "tl." not in sample:  # numbers and scalar parameters only: a constexpr's sum is a Python number, with no type
        sample += " + tl.zeros((), tl.int1)"  # (a bool tensor: Triton's promotion with it is the others' own)
    return f"({sample}).dtype"


def _simplified(samples: frozenset) -> frozenset:
    """Where the samples hold a float type of 32 bits or more written out, or a type a constexpr gives (a state
    declared ``COMPUTE``: float32 or wider, as compiled Triton keeps it in a loop where a sum widens halves),
    their promotion is the widest float type among the samples' own, every operation above then giving the
    promotion of its operands (sub-32-bit types widen to float32 anyway): the operations' parts stand for them,
    and what such a type absorbs (numbers, a scalar parameter, an integer or half type written out) is left out.
    Else as they are (Triton's promotion of them is exact, only longer to read)."""
    def anchor(s) -> bool:
        return str(s) in WIDE or (isinstance(s, str) and _written(s) is not None and _written(s).isidentifier())
    if not any(anchor(s) for s in samples):
        return samples
    flat, todo = set(), list(samples)
    while todo:
        s = todo.pop()
        if isinstance(s, _Wrapped):
            todo += [p for part in s.parts for p in part]
        else:
            flat.add(s)
    if WIDE[1] in flat:  # float64 absorbs every type
        return frozenset((WIDE[1],))
    kept = {s for s in flat if _written(s) is not None and not _written(s).startswith("tl.")}  # a launch's types
    return frozenset(kept | {s for s in samples if str(s) in WIDE})


def _written(sample: str) -> str | None:
    """``T`` of a sample ``tl.zeros((), T)``."""
    if sample.startswith("tl.zeros((), ") and sample.endswith(")"):
        return sample[len("tl.zeros((), "):-1]
    return None


def _sample(samples: frozenset) -> str:
    """One expression promoting the samples: tensors first (a number then takes their kind), in a fixed order."""
    tensors = sorted(str(s) for s in samples if _number_text(str(s)) is None)
    numbers = sorted(str(s) for s in samples if _number_text(str(s)) is not None)
    if not tensors:  # numbers only: the type of the tensor Triton would make of them
        return f"tl.full((), {numbers[0]}, {_tensor_of(numbers[0])})" if numbers else "tl.zeros((), tl.int1)"
    return " + ".join(tensors + numbers)


def _number(atom: ast.expr) -> str | None:
    """A number as written (``1.0``, ``-float('inf')``, ``2``), else None."""
    if isinstance(atom, ast.Constant) and type(atom.value) in (int, float):
        return repr(atom.value) if not isinstance(atom.value, float) or atom.value == atom.value and abs(
            atom.value) != float("inf") else "0.0"
    if isinstance(atom, ast.UnaryOp) and isinstance(atom.op, (ast.USub, ast.UAdd)):
        return _number(atom.operand)
    if isinstance(atom, ast.Call) and isinstance(atom.func, ast.Name) and atom.func.id == "float":
        return "0.0"  # float('inf'), float('nan'): a Python float
    return None


def _number_text(sample: str) -> str | None:
    try:
        value = ast.literal_eval(sample)
    except (ValueError, SyntaxError):
        return None
    return sample if type(value) in (int, float) else None


def _tensor_of(number: str) -> str:
    """The type Triton gives a tensor made of a Python number (``tl.where(c, 0, -1e6)``: float32, int32)."""
    return "tl.float32" if isinstance(ast.literal_eval(number), float) else "tl.int32"


def _is_none(atom: ast.expr) -> bool:
    return isinstance(atom, ast.Constant) and atom.value is None


def _bitcast(op) -> bool:
    flag = op.kwargs.get("bitcast")
    return isinstance(flag, ast.Constant) and bool(flag.value)
