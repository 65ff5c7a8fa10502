"""The table of operations: every operation kind, declared once, with what the passes know about it.

An entry says how to read a call (its ``signature``), its derivative rule (per
differentiable parameter, a template in ``g``: the result's adjoint, ``out``: the
result, and the parameter names), and the facts other passes ask about it:

| field | who asks | meaning |
| --- | --- | --- |
| ``adjoints`` | reverse/rules.py | the derivative rule (None: none; ``no_gradient``: none needed) |
| ``tangents`` | tangent/rules.py | forward mode's rule where adjoints do not give it (``LINEAR``: same call) |
| ``no_tangent`` | tangent/rules.py | why forward mode does not yet handle an operation that has adjoints |
| ``elementwise`` | analysis, reverse | operands broadcast together to the result's shape (adjoints are summed back) |
| ``results`` | frontend, reverse | several results, unpacked into ``item`` s (``a, b = tl.split(x)``) |
| ``pointer_args`` | analysis, reverse | argument positions a pointer passes through to the result |
| ``lanes`` | addresses.py | ``"same"``: keeps its operand's lane coordinates; ``"moved"``: moves them to other axes |
| ``foldable`` | codegen | cheap and pure: written back into its uses in the printed kernel |
| ``constexpr`` | frontend | a compile-time constant when its operands are |
| ``on_host`` | analysis, reverse | the same operation on Python integers: launch checks; which one (``operator.sub``) |
| ``memory`` | everyone | ``"load"``, ``"store"``, ``"accumulate"`` (atomic add), ``"atomic"`` (other atomics) |
| ``descriptor`` | everyone | ``"method"``: a tensor descriptor's load / store / atomic add; ``"made"``: makes one |
| ``unbounded_in`` | analysis, reverse | the operand where a finite value may give infinity (log 0, 1/0) |
| ``finite_at_minus_inf`` | analysis | finite where its operand is -inf (a softmax's -inf padding is 0 after exp) |
| ``shape_only`` | codegen, reverse | arguments read for their shape and type only (``zeros_like``) |
| ``reshapes`` | analysis | its first operand's values in another shape (``x[:, None]``, ``tl.reshape``) |
| ``coordinate`` | analysis | ``"lane"``: a lane index (arange), ``"program"``: a program id, ``"programs"``: a count |
| ``arithmetic`` | frontend | integer math whose ``on_host`` is Python's: its result on known integers is known |
| ``reduction`` | analysis, codegen | ``"axis"``: reduces its one ``axis`` (codegen may move it); ``"other"``: else |
| ``costly`` | reverse/interchange.py | a reduction or a product: computed once per forward program, not per iteration |
| ``flows`` | codegen/exponentials.py | (positions, keywords) of the arguments whose values reach its result or memory |
| ``converts`` | analysis, reverse | its operand's values in another type (``x.to(dtype)``, ``tl.cast``) |
| ``sign`` | analysis, frontend | its result is its one operand (1: ``a = b``, ``+a``) or the operand negated (-1) |
| ``exponential`` | analysis | the base of an exponential: ``"e"`` (``tl.exp``), ``"2"`` (``tl.exp2``) |

Other tables keyed by kind: a result's shape (analysis/shapes.py's ``SHAPES``), an analysis's function per kind
(core/per_kind.py's registries); what the passes know of a ``tg`` helper (language.py's ``HELPERS``).

Adding an operation is one entry here (and a ``tg`` helper in language.py where its
template needs one), plus a test.
"""

from __future__ import annotations

import ast
import copy
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .rule_templates import (
    cast_adjoint,
    cast_tangent,
    dot_tangent,
    extremum_tangent,
    full_tangent,
    inverse_permutation,
    linear_scan_adjoint,
    linear_scan_tangent,
    where_tangent,
)

LN2 = 0.6931471805599453
TWO_OVER_SQRT_PI = 1.1283791670955126


@dataclass(frozen=True)
class Signature:
    """Parameter names of an operation, to bind a call's positional and keyword arguments."""

    positional: tuple[str, ...]  # may be passed by position
    keyword: tuple[str, ...] = ()  # keyword-only (after `*shape`)
    defaults: dict[str, Any] = field(default_factory=dict)
    vararg: str | None = None

    @classmethod
    def parse(cls, text: str) -> Signature:
        args = ast.parse(f"def f({text}): pass").body[0].args
        positional = tuple(a.arg for a in args.args)
        with_defaults = args.args[len(positional) - len(args.defaults):]
        defaults = {a.arg: ast.literal_eval(d) for a, d in zip(with_defaults, args.defaults, strict=True)}
        defaults.update({a.arg: ast.literal_eval(d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)})
        keyword = tuple(a.arg for a in args.kwonlyargs)
        return cls(positional, keyword, defaults, args.vararg.arg if args.vararg else None)

    def bind(self, args: list[ast.expr], kwargs: dict[str, ast.expr]) -> dict[str, ast.expr]:
        """Map parameter names to argument atoms (defaults as constants). Raises TypeError."""
        bound = dict(zip(self.positional, args, strict=False))
        rest = args[len(self.positional):]
        if self.vararg is not None:  # `reshape(x, (a, b))` and `reshape(x, a, b)` alike
            one_tuple = len(rest) == 1 and isinstance(rest[0], (ast.Tuple, ast.List))
            bound[self.vararg] = rest[0] if one_tuple else ast.Tuple(elts=list(rest), ctx=ast.Load())
        elif rest:
            raise TypeError(f"too many arguments ({len(args)} for {len(self.positional)})")
        for k, v in kwargs.items():
            if k not in self.positional and k not in self.keyword:
                raise TypeError(f"unexpected keyword argument `{k}`")
            bound[k] = v
        for p in self.positional + self.keyword:
            if p not in bound:
                if p not in self.defaults:
                    raise TypeError(f"missing argument `{p}`")
                bound[p] = ast.Constant(self.defaults[p])
        return bound


def instantiate(template: str, env: dict[str, ast.expr]) -> ast.expr:
    """A template (``"g * out"``) with its names replaced by the atoms ``env`` gives for them."""
    class Substitute(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            return copy.deepcopy(env[n.id]) if n.id in env else n

    return Substitute().visit(ast.parse(template, mode="eval").body)


# A rule's adjoint for one parameter: a template string, or a function building the
# expression (for adjoints that depend on literal arguments, such as permutations).
Adjoint = str | Callable[[dict[str, ast.expr]], str]

# Forward mode (tangent/rules.py). An elementwise operation's Jacobian is diagonal: its adjoint template with ``g``
# put as an argument's tangent is that argument's contribution to the result's tangent, so its adjoints are its
# tangent rule too. Any other operation says its result's tangent: a template in its parameters, ``out`` and
# ``t_<param>`` (a differentiated parameter's tangent; zeros where it has none), or a function of the bound
# arguments and the set of parameters with tangents giving one (ValueError: refused); LINEAR: the same call with
# each differentiated argument replaced by its tangent (sums, scans, shape operations, casts to float types).
Tangent = str | Callable[[dict[str, ast.expr], frozenset[str]], str]
LINEAR = "linear"


@dataclass(frozen=True)
class Operation:
    """One operation kind and what the passes know about it (see the module's table)."""

    kind: str
    signature: Signature | None = None
    adjoints: dict[str, Adjoint] | None = None
    no_gradient: bool = False
    elementwise: bool = False
    results: int = 1
    pointer_args: tuple[int, ...] = ()
    lanes: str | None = None
    foldable: bool = False
    constexpr: bool = False
    on_host: Callable | None = None
    memory: str | None = None
    descriptor: str | None = None  # "method": a tensor descriptor's load, store or atomic add; "made": makes one
    unbounded_in: str | None = None
    finite_at_minus_inf: bool = False
    shape_only: tuple[int, ...] = ()  # arguments read for their shape and type only (`tl.zeros_like(x)`)
    reshapes: bool = False  # its result is its first operand's values in order, in another shape (`x[:, None]`)
    tangents: Tangent | None = None  # forward mode, where the adjoints do not give it (see Tangent)
    no_tangent: str = ""  # what forward mode does not yet handle of it (a rule with adjoints but no tangent)
    coordinate: str | None = None  # "lane" (tl.arange), "program" (tl.program_id), "programs" (tl.num_programs)
    arithmetic: bool = False  # frontend/normalize.py computes it on known integers (on_host is Python's there)
    reduction: str | None = None  # "axis": reduces its `axis` argument (sum, max, min); "other": combines lanes so
    costly: bool = False  # worth computing once per forward program (reverse/interchange.py)
    flows: tuple[tuple[int, ...], tuple[str, ...]] | None = None  # arguments whose values flow on (exponentials.py)
    converts: bool = False  # its operand's values in another type
    sign: int = 0  # its result is its one operand (1) or the operand negated (-1)
    exponential: str | None = None  # "e": tl.exp, "2": tl.exp2

    @property
    def has_rule(self) -> bool:
        return self.adjoints is not None

    @property
    def stores(self) -> bool:
        """An effect the forward recomputation must not repeat: a store or an atomic."""
        return self.memory in ("store", "accumulate", "atomic")

    @property
    def access(self) -> str | None:
        """``memory`` through a pointer (``tl.load``, ``tl.store``, the atomics); None through a tensor descriptor."""
        return None if self.descriptor else self.memory

    @property
    def reads_result(self) -> bool:
        """Whether its adjoint reads its own result (``exp``: ``g * out``)."""
        return any(callable(t) or "out" in {n.id for n in ast.walk(ast.parse(t)) if isinstance(n, ast.Name)}
                   for t in (self.adjoints or {}).values())


MAX_GRAD = "tl.where({a} > {b}, g, tl.where({a} == {b}, 0.5 * g, 0.0))"  # ties split, as torch does
MIN_GRAD = "tl.where({a} < {b}, g, tl.where({a} == {b}, 0.5 * g, 0.0))"
DOT = "input, other, acc=None, input_precision=None, allow_tf32=None, max_num_imprecise_acc=None, out_dtype=None"
REDUCE = "input, axis=None, return_indices=False, return_indices_tie_break_left=True, keep_dims=False"
CAST = "input, dtype, fp_downcast_rounding=None, bitcast=False"
ATOMIC = "pointer, val, mask=None, sem=None, scope=None"

OPERATIONS: dict[str, Operation] = {}


def _declare(kind: str, signature: str | None = None, **facts: Any) -> None:
    OPERATIONS[kind] = Operation(kind, Signature.parse(signature) if signature is not None else None, **facts)


def rule(kind: str, signature: str, elementwise: bool = True, **adjoints: Adjoint) -> None:
    """A differentiable operation: ``rule("exp", "x", x="g * out")``."""
    _declare(kind, signature, adjoints=adjoints, elementwise=elementwise)


def no_gradient(*kinds: str, **facts: Any) -> None:
    """Operations whose result carries no gradient: comparisons, integer and index math, constants."""
    for kind in kinds:
        _declare(kind, no_gradient=True, **facts)


def _also(kinds: str, **facts: Any) -> None:
    """Facts beyond the rule of already-declared operations."""
    for kind in kinds.split():
        OPERATIONS[kind] = replace(OPERATIONS[kind], **facts)


# -- derivative rules ----------------------------------------------------------------------------------

# Python operators
rule("copy", "a", a="g")
rule("add", "a, b", a="g", b="g")
rule("sub", "a, b", a="g", b="-g")
rule("mul", "a, b", a="g * b", b="g * a")
rule("truediv", "a, b", a="g / b", b="-g * out / b")
rule("neg", "a", a="-g")
rule("pos", "a", a="g")
rule("pow", "a, b", a="g * b * a ** (b - 1)")  # constant exponent only (checked in analysis)
# elementwise math
rule("exp", "x", x="g * out")
rule("exp2", "x", x=f"g * out * {LN2}")
rule("log", "x", x="g / x")
rule("log2", "x", x=f"g / (x * {LN2})")
rule("sqrt", "x", x="g * 0.5 / out")
rule("sqrt_rn", "x", x="g * 0.5 / out")
rule("rsqrt", "x", x="g * -0.5 * out * out * out")  # from the result alone (a normalization's rstd, read back)
rule("sin", "x", x="g * tl.cos(x)")
rule("cos", "x", x="-g * tl.sin(x)")
rule("sigmoid", "x", x="g * out * (1.0 - out)")
rule("erf", "x", x=f"g * {TWO_OVER_SQRT_PI} * tl.exp(-x * x)")
rule("abs", "x", x="tl.where(x > 0, g, tl.where(x < 0, -g, 0.0))")
# libdevice (triton.language.extra.libdevice); its pow is "fpow", apart from the `**` operator
rule("tanh", "x", x="g * (1.0 - out * out)")
rule("log1p", "x", x="g / (1.0 + x)")
rule("expm1", "x", x="g * (out + 1.0)")
rule("fpow", "x, y", x="tg.pow_grad(g, x, y)", y="tl.where((x == 0.0) & (y >= 0.0), 0.0, g * out * tl.log(x))")
rule("fma", "x, y, z", x="g * y", y="g * x", z="g")
rule("div_rn", "x, y", x="g / y", y="-g * out / y")
rule("fdiv", "x, y, ieee_rounding=False", x="g / y", y="-g * out / y")
rule("maximum", "x, y, propagate_nan=None", x=MAX_GRAD.format(a="x", b="y"), y=MAX_GRAD.format(a="y", b="x"))
rule("minimum", "x, y, propagate_nan=None", x=MIN_GRAD.format(a="x", b="y"), y=MIN_GRAD.format(a="y", b="x"))
rule("where", "condition, x, y", x="tl.where(condition, g, 0.0)", y="tl.where(condition, 0.0, g)")
rule("clamp", "x, min, max, propagate_nan=None", x="tl.where((x >= min) & (x <= max), g, 0.0)",
     min="tl.where(x < min, g, 0.0)", max="tl.where(x > max, g, 0.0)")
rule("broadcast_to", "input, *shape", input="g")
# casts: float to float passes the gradient (accumulated in float32 or wider)
rule("to", CAST, elementwise=False, input=cast_adjoint)
rule("cast", CAST, elementwise=False, input=cast_adjoint)
# reductions: spread the gradient back; max/min share it evenly among ties, like torch.amax
rule("sum", "input, axis=None, keep_dims=False, dtype=None", elementwise=False,
     input="tg.sum_grad(g, input, axis, keep_dims)")
# tl.softmax, and a softmax written out (composites.py): the gradient from the output alone
rule("softmax", "x, dim=None, *, keep_dims=None, ieee_rounding=False", elementwise=False,
     x="tg.softmax_grad(g, out, dim)")
rule("max", REDUCE, elementwise=False, input="tg.extremum_grad(g, input, out, axis, keep_dims)")
rule("min", REDUCE, elementwise=False, input="tg.extremum_grad(g, input, out, axis, keep_dims)")
# scans: a prefix sum's adjoint is the suffix sum of g; cumprod's is exact where x has zeros too
rule("cumsum", "input, axis=0, reverse=False, dtype=None", elementwise=False, input="tg.cumsum_grad(g, axis, reverse)")
rule("cumprod", "input, axis=0, reverse=False, dtype=None", elementwise=False,
     input="tg.cumprod_grad(g, input, axis, reverse)")
# matrix product; the gradient is cast to the other operand's type, as hand-written kernels do
rule("dot", DOT, elementwise=False,
     input="tl.dot(g.to(other.dtype), tl.trans(other), input_precision=input_precision, allow_tf32=allow_tf32)",
     other="tl.dot(tl.trans(input), g.to(input.dtype), input_precision=input_precision, allow_tf32=allow_tf32)",
     acc="g")
# shape operations
rule("subscript", "input, index", elementwise=False, input="tl.reshape(g, input.shape)")
rule("expand_dims", "input, axis", elementwise=False, input="tl.reshape(g, input.shape)")
# a 0-d result (an expand_dims' adjoint of a scalar, derived again) has a scalar adjoint, which tl.reshape refuses
rule("reshape", "input, *shape, can_reorder=False", elementwise=False,
     input="tl.reshape(g, input.shape) if len(out.shape) > 0 else tl.broadcast_to(g, input.shape)")
rule("view", "input, *shape", elementwise=False, input="tl.reshape(g, input.shape)")
rule("trans", "input, *dims", elementwise=False, input=inverse_permutation)
rule("permute", "input, *dims", elementwise=False, input=inverse_permutation)
# Operations with several results, unpacked (`a, b = tl.split(x)`): the tuple of results is `out`, and
# each result `out[i]` is an `item` of it, with its own adjoint `gi` (zeros when it has none). A tuple
# argument (the scan's `(a, b)`) gets a tuple of adjoints, one per element.
rule("item", "input, index", elementwise=False, input="g")  # read by its operation's adjoint (reverse/rules.py)
# h_t = a_t h_{t-1} + b_t and the products of the a's: the adjoint is a scan the other way
rule("linear_scan", "input, axis, combine_fn, reverse=False", elementwise=False, input=linear_scan_adjoint)
rule("split", "a", elementwise=False, a="tl.join(g0, g1)")
rule("join", "a, b", elementwise=False, a="tg.split_grad(g, a, 0)", b="tg.split_grad(g, b, 1)")
_also("linear_scan split", results=2)
# a tile of one value (a scalar tensor, or a constant: no gradient); compiler hints that return their operand
rule("full", "shape, value, dtype", elementwise=False, value="tg.unbroadcast(tg.cast_grad(g, dtype), value)")
for _kind in ("multiple_of", "max_contiguous", "max_constancy"):
    rule(_kind, "input, values", elementwise=False, input="g")


# -- forward mode: tangents where the adjoints do not give them -----------------------------------------------------

_also("to cast", tangents=cast_tangent)
_also("dot", tangents=dot_tangent)
_also("max min", tangents=extremum_tangent)
_also("where", tangents=where_tangent)
_also("softmax", tangents="tg.softmax_grad(t_x, out, dim)")  # the Jacobian diag(y) - y y^T is symmetric
_also("linear_scan", tangents=linear_scan_tangent)
_also("sum cumsum subscript expand_dims reshape view trans permute item split join multiple_of max_contiguous "
      "max_constancy", tangents=LINEAR)
_also("full", tangents=full_tangent)
_also("cumprod", no_tangent="`tl.cumprod`")

# -- operations whose result carries no gradient ---------------------------------------------------------

no_gradient("lt", "le", "gt", "ge", "eq", "ne", "and_", "or_", "xor", "lshift", "rshift", "invert", "not_",
            "floordiv", elementwise=True)
no_gradient("is_", "is_not", "in_", "not_in")
no_gradient("program_id", "num_programs", "arange", "zeros", "zeros_like", "cdiv", "floor", "ceil",
            "argmax", "argmin", "umulhi",
            "rand", "randn", "randint", "rand4x", "randn4x", "randint4x",
            "static_assert", "device_assert", "static_print", "device_print", "debug_barrier", "print")
no_gradient("stop_gradient", elementwise=True)  # online.py's final max: the outputs do not depend on it
_declare("mod", elementwise=True)  # no rule: `%` of differentiated values is refused
# no rule either, so refused where a differentiated value goes through them: `a and b` is one of its operands in
# the interpreter, a boolean compiled; a conditional expression is left whole only where a test reads it (the
# frontend makes an `if` statement of any other)
_declare("boolop")
_declare("ifexp")

# -- memory ----------------------------------------------------------------------------------------------

_declare("load", "pointer, mask=None, other=None, boundary_check=(), padding_option='', cache_modifier='', "
         "eviction_policy='', volatile=False", memory="load")
_declare("store", "pointer, value, mask=None, boundary_check=(), cache_modifier='', eviction_policy=''",
         memory="store")
_declare("atomic_add", ATOMIC, memory="accumulate")
for _kind in ("atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas"):
    _declare(_kind, ATOMIC, memory="atomic")
# a tensor descriptor's methods (`desc.load(offsets)`): the descriptor stands where the pointer does
_declare("desc_load", "pointer, offsets", memory="load", descriptor="method")
_declare("desc_store", "pointer, offsets, value", memory="store", descriptor="method")
_declare("desc_atomic_add", "pointer, offsets, val", memory="accumulate", descriptor="method")
_declare("make_tensor_descriptor", "base, shape, strides, block_shape, padding_option='zero'", descriptor="made")
DESCRIPTOR_METHODS = {"load": "desc_load", "store": "desc_store", "atomic_add": "desc_atomic_add"}

# -- facts beyond the rules --------------------------------------------------------------------------------

# a pointer flows through these arguments to the result: `ptrs[:, None]`, `x_ptr + offs`
_also("copy subscript expand_dims broadcast_to reshape view trans permute multiple_of max_contiguous "
      "max_constancy make_tensor_descriptor sub", pointer_args=(0,))
_also("add", pointer_args=(0, 1))
_also("where", pointer_args=(1, 2))
# lane coordinates (addresses.py): kept as they are, or moved to other axes
_also("copy to cast multiple_of max_contiguous max_constancy pos", lanes="same")
_also("subscript expand_dims broadcast_to trans permute", lanes="moved")
# cheap and pure: the printed kernel writes them back into their uses
_also("add sub mul truediv floordiv mod neg pos not_ invert lt le gt ge eq ne and_ or_ xor lshift rshift boolop "
      "ifexp subscript program_id num_programs arange cdiv copy expand_dims broadcast_to reshape trans to cast "
      "multiple_of max_contiguous", foldable=True)
# compile-time constants when their operands are
_also("add sub mul truediv floordiv mod pow neg pos not_ invert lt le gt ge eq ne is_ is_not in_ not_in boolop "
      "ifexp copy and_ or_ xor lshift rshift cdiv", constexpr=True)
# infinite at finite operands (in value or slope): a lane a mask left out may hold such a value (analysis.padding)
_also("truediv", unbounded_in="b")
_also("log log2 sqrt sqrt_rn rsqrt fpow", unbounded_in="x")
_also("pow", unbounded_in="a")
_also("div_rn fdiv", unbounded_in="y")
_also("exp exp2 sigmoid softmax", finite_at_minus_inf=True)
_also("zeros_like", shape_only=(0,))
_also("subscript expand_dims broadcast_to reshape view", reshapes=True)
_also("arange", coordinate="lane")
_also("program_id", coordinate="program")
_also("num_programs", coordinate="programs")
_also("add sub mul neg eq ne lt le gt ge not_", arithmetic=True)  # (not // and %: a constexpr rounds as Python)
_declare("xor_sum")  # no rule
_declare("reduce")  # tl.reduce of a combine function that is no sum, max or min: no rule
_also("sum max min", reduction="axis")
_also("softmax dot cumsum cumprod linear_scan argmax argmin xor_sum reduce", reduction="other")
_also("sum max min reduce dot", costly=True)
_also("to cast", converts=True)
_also("copy pos", sign=1)
_also("neg", sign=-1)
_also("exp", exponential="e")
_also("exp2", exponential="2")
# a value flows on through these arguments (positions, keywords): arithmetic, shape moves, smooth functions
_also("exp exp2 log log2 sqrt sqrt_rn rsqrt sin cos sigmoid erf trans reshape view broadcast_to expand_dims permute "
      "sum cumsum", flows=((0,), ()))
_also("dot", flows=((0, 1), ("acc",)))
_also("fma", flows=((0, 1, 2), ()))
_also("where", flows=((1, 2), ("x", "y")))
_also("store", flows=((1,), ("value",)))
_also("atomic_add", flows=((1,), ("val",)))


def _divided(a: int, b: int) -> int:
    """``a // b`` as a kernel computes it on integers: the quotient truncated toward zero (C's), not floored."""
    q = abs(a) // abs(b)
    return (2 * ((a < 0) == (b < 0)) - 1) * q  # (integers, or tensors of one value per program)


# integer scalar math a launch check can redo on the launch's arguments (runtime integers: C's division)
_also("add", on_host=operator.add)
_also("sub", on_host=operator.sub)
_also("mul", on_host=operator.mul)
_also("floordiv", on_host=_divided)
_also("neg", on_host=operator.neg)
_also("copy", on_host=lambda a: a)
_also("cdiv", on_host=lambda a, b: _divided(a + b - 1, b))  # tl.cdiv is (a + b - 1) // b
_also("mod", on_host=lambda a, b: a - b * _divided(a, b))  # the dividend's sign
# comparisons of launch scalars: which branches a launch takes (analysis/stores.py: stores in exclusive modes)
_also("eq", on_host=operator.eq)
_also("ne", on_host=operator.ne)
_also("lt", on_host=operator.lt)
_also("le", on_host=operator.le)
_also("gt", on_host=operator.gt)
_also("ge", on_host=operator.ge)
_also("not_", on_host=operator.not_)


# Hand-written rules for @triton.jit helpers (tritongrad.custom_vjp): the helper's Python function ->
# (its operation, the name its backward has in derived kernels, the backward).
CUSTOM: dict[Any, tuple[Operation, str, Any]] = {}

UNKNOWN = Operation("?")


def operation_of(op: Any) -> Operation:
    """What is known about an ``ir.Op``'s operation (a custom rule's included; unknown kinds know nothing)."""
    if op.kind == "custom":
        entry = CUSTOM.get(getattr(op.func, "fn", op.func))
        return entry[0] if entry else UNKNOWN
    return OPERATIONS.get(op.kind, UNKNOWN)


def custom_operation(signature: str, adjoints: dict[str, Adjoint], results: int = 1) -> Operation:
    # elementwise: an adjoint with the broadcast shape of the arguments is summed back to each one's shape;
    # results: several (a tuple whose items the adjoints read as g0, g1, ...)
    return Operation("custom", Signature.parse(signature), adjoints=adjoints, elementwise=True, results=results)


def kinds(**facts: Any) -> frozenset[str]:
    """The operation kinds with the given facts: ``kinds(memory="load")``."""
    return frozenset(k for k, o in OPERATIONS.items() if all(getattr(o, f) == v for f, v in facts.items()))


LOADS = kinds(memory="load")
STORES = frozenset(k for k, o in OPERATIONS.items() if o.stores)
