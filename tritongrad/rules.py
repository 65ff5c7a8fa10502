"""Derivative rules: one small template per differentiable operation.

A rule names the operation's parameters (its signature) and, for each parameter that
carries a gradient, the adjoint contribution as a Triton expression in

- ``g``: the adjoint (cotangent) of the operation's result,
- ``out``: the result itself,
- the parameter names, bound to the call's arguments.

``elementwise`` rules broadcast their operands; their contributions are summed back
to each operand's shape (``tg.unbroadcast``) where the shapes may differ.
Memory operations (load, store, atomics) are not here: they are the business of
``reverse.py``, because their adjoints go through shadow pointers.

Adding an operation: one line here and one test.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


# A rule's adjoint for one parameter: a template string, or a function building the
# expression (for adjoints that depend on literal arguments, such as permutations).
Adjoint = str | Callable[[dict[str, ast.expr]], str]


@dataclass(frozen=True)
class Rule:
    signature: Signature
    adjoints: dict[str, Adjoint]
    elementwise: bool = True


def rule(signature: str, elementwise: bool = True, **adjoints: Adjoint) -> Rule:
    return Rule(Signature.parse(signature), adjoints, elementwise)


def _inverse_permutation(bound: dict[str, ast.expr]) -> str:
    dims = bound.get("dims")
    elts = dims.elts if isinstance(dims, (ast.Tuple, ast.List)) else []
    if not elts:  # tl.trans(x) of a 2-D tile
        return "tl.trans(g)"
    if len(elts) == 1 and isinstance(elts[0], (ast.Tuple, ast.List)):
        elts = elts[0].elts
    order = [ast.literal_eval(e) for e in elts]  # ValueError when not literal: refused upstream
    inverse = [order.index(i) for i in range(len(order))]
    return f"tl.permute(g, {tuple(inverse)})"


def _cast(bound: dict[str, ast.expr]) -> str:
    # a cast to a float type passes the gradient on; the dtype may only be known at compile time
    dtype = ast.unparse(bound["dtype"])
    if dtype.startswith(("tl.float", "tl.bfloat")):
        return "g"
    return "tg.cast_grad(g, out)"


MAX_GRAD = "tl.where({a} > {b}, g, tl.where({a} == {b}, 0.5 * g, 0.0))"  # ties split, as torch does
MIN_GRAD = "tl.where({a} < {b}, g, tl.where({a} == {b}, 0.5 * g, 0.0))"
DOT = "input, other, acc=None, input_precision=None, allow_tf32=None, max_num_imprecise_acc=None, out_dtype=None"
REDUCE = "input, axis=None, return_indices=False, return_indices_tie_break_left=True, keep_dims=False"

RULES: dict[str, Rule] = {
    # Python operators
    "copy": rule("a", a="g"),
    "add": rule("a, b", a="g", b="g"),
    "sub": rule("a, b", a="g", b="-g"),
    "mul": rule("a, b", a="g * b", b="g * a"),
    "truediv": rule("a, b", a="g / b", b="-g * out / b"),
    "neg": rule("a", a="-g"),
    "pos": rule("a", a="g"),
    "pow": rule("a, b", a="g * b * a ** (b - 1)"),  # constant exponent only (checked in analysis)
    # elementwise math
    "exp": rule("x", x="g * out"),
    "exp2": rule("x", x=f"g * out * {LN2}"),
    "log": rule("x", x="g / x"),
    "log2": rule("x", x=f"g / (x * {LN2})"),
    "sqrt": rule("x", x="g * 0.5 / out"),
    "sqrt_rn": rule("x", x="g * 0.5 / out"),
    "rsqrt": rule("x", x="g * -0.5 * out / x"),
    "sin": rule("x", x="g * tl.cos(x)"),
    "cos": rule("x", x="-g * tl.sin(x)"),
    "sigmoid": rule("x", x="g * out * (1.0 - out)"),
    "erf": rule("x", x=f"g * {TWO_OVER_SQRT_PI} * tl.exp(-x * x)"),
    "abs": rule("x", x="tl.where(x > 0, g, tl.where(x < 0, -g, 0.0))"),
    # libdevice (triton.language.extra.libdevice); its pow is "fpow", apart from the `**` operator
    "tanh": rule("x", x="g * (1.0 - out * out)"),
    "log1p": rule("x", x="g / (1.0 + x)"),
    "expm1": rule("x", x="g * (out + 1.0)"),
    "fpow": rule("x, y", x="tg.pow_grad(g, x, y)", y="tl.where((x == 0.0) & (y >= 0.0), 0.0, g * out * tl.log(x))"),
    "fma": rule("x, y, z", x="g * y", y="g * x", z="g"),
    "div_rn": rule("x, y", x="g / y", y="-g * out / y"),
    "fdiv": rule("x, y, ieee_rounding=False", x="g / y", y="-g * out / y"),
    "maximum": rule("x, y, propagate_nan=None", x=MAX_GRAD.format(a="x", b="y"), y=MAX_GRAD.format(a="y", b="x")),
    "minimum": rule("x, y, propagate_nan=None", x=MIN_GRAD.format(a="x", b="y"), y=MIN_GRAD.format(a="y", b="x")),
    "where": rule("condition, x, y", x="tl.where(condition, g, 0.0)", y="tl.where(condition, 0.0, g)"),
    "clamp": rule("x, min, max, propagate_nan=None", x="tl.where((x >= min) & (x <= max), g, 0.0)",
                  min="tl.where(x < min, g, 0.0)", max="tl.where(x > max, g, 0.0)"),
    "broadcast_to": rule("input, *shape", input="g"),
    # casts: float to float passes the gradient (accumulated in float32 or wider)
    "to": rule("input, dtype, fp_downcast_rounding=None, bitcast=False", elementwise=False, input=_cast),
    "cast": rule("input, dtype, fp_downcast_rounding=None, bitcast=False", elementwise=False, input=_cast),
    # reductions: spread the gradient back; max/min share it evenly among ties, like torch.amax
    "sum": rule("input, axis=None, keep_dims=False, dtype=None", elementwise=False,
                input="tg.sum_grad(g, input, axis, keep_dims)"),
    "max": rule(REDUCE, elementwise=False, input="tg.extremum_grad(g, input, out, axis, keep_dims)"),
    "min": rule(REDUCE, elementwise=False, input="tg.extremum_grad(g, input, out, axis, keep_dims)"),
    # scans: a prefix sum's adjoint is the suffix sum of g; cumprod's is exact where x has zeros too
    "cumsum": rule("input, axis=0, reverse=False, dtype=None", elementwise=False,
                   input="tg.cumsum_grad(g, axis, reverse)"),
    "cumprod": rule("input, axis=0, reverse=False, dtype=None", elementwise=False,
                    input="tg.cumprod_grad(g, input, out, axis, reverse)"),
    # matrix product; the gradient is cast to the other operand's type, as hand-written kernels do
    "dot": rule(DOT, elementwise=False,
                input="tl.dot(g.to(other.dtype), tl.trans(other), input_precision=input_precision, "
                      "allow_tf32=allow_tf32)",
                other="tl.dot(tl.trans(input), g.to(input.dtype), input_precision=input_precision, "
                      "allow_tf32=allow_tf32)",
                acc="g"),
    # shape operations
    "subscript": rule("input, index", elementwise=False, input="tl.reshape(g, input.shape)"),
    "expand_dims": rule("input, axis", elementwise=False, input="tl.reshape(g, input.shape)"),
    "reshape": rule("input, *shape, can_reorder=False", elementwise=False, input="tl.reshape(g, input.shape)"),
    "view": rule("input, *shape", elementwise=False, input="tl.reshape(g, input.shape)"),
    "trans": rule("input, *dims", elementwise=False, input=_inverse_permutation),
    "permute": rule("input, *dims", elementwise=False, input=_inverse_permutation),
}



def _linear_scan(bound: dict[str, ast.expr]) -> str:
    a, b = (ast.unparse(e) for e in bound["input"].elts)
    return f"tg.linear_scan_grad(g0, g1, {a}, {b}, out[0], out[1], axis, reverse)"


# Operations with several results, unpacked (`a, b = tl.split(x)`): the tuple of results is `out`, and
# each result `out[i]` is an `item` of it, with its own adjoint `gi` (zeros when it has none). A tuple
# argument (the scan's `(a, b)`) gets a tuple of adjoints, one per element.
MULTI_RESULT = {
    "linear_scan": 2,
    "split": 2,
}
RULES.update({
    "item": rule("input, index", elementwise=False, input="g"),  # read by its operation's adjoint (reverse.py)
    # h_t = a_t h_{t-1} + b_t and the products of the a's: the adjoint is a scan the other way
    "linear_scan": rule("input, axis, combine_fn, reverse=False", elementwise=False, input=_linear_scan),
    "split": rule("a", elementwise=False, a="tl.join(g0, g1)"),
    "join": rule("a, b", elementwise=False, a="tg.split_grad(g, a, 0)", b="tg.split_grad(g, b, 1)"),
})

# Operations whose result carries no gradient: comparisons, integer and index math,
# constants, random numbers, hints. Their inputs never receive one through them.
NONDIFFERENTIABLE = {
    "lt", "le", "gt", "ge", "eq", "ne", "is_", "is_not", "in_", "not_in", "boolop", "ifexp",
    "and_", "or_", "xor", "lshift", "rshift", "invert", "not_", "floordiv",
    "program_id", "num_programs", "arange", "zeros", "zeros_like", "full", "cdiv", "floor", "ceil",
    "argmax", "argmin", "umulhi", "multiple_of", "max_contiguous", "max_constancy",
    "rand", "randn", "randint", "rand4x", "randn4x", "randint4x",
    "static_assert", "device_assert", "static_print", "device_print", "debug_barrier", "print",
}

# Statements with effects the forward replay must not repeat.
STORES = {"store", "atomic_add", "atomic_max", "atomic_min", "atomic_and", "atomic_or", "atomic_xor",
          "atomic_xchg", "atomic_cas", "desc_store", "desc_atomic_add"}
LOADS = {"load", "desc_load"}
ACCUMULATES = {"atomic_add", "desc_atomic_add"}

# Signatures of the memory operations, for binding their arguments.
MEMORY = {
    "load": Signature.parse("pointer, mask=None, other=None, boundary_check=(), padding_option='', "
                            "cache_modifier='', eviction_policy='', volatile=False"),
    "store": Signature.parse("pointer, value, mask=None, boundary_check=(), cache_modifier='', "
                             "eviction_policy=''"),
    **{k: Signature.parse("pointer, val, mask=None, sem=None, scope=None") for k in STORES if k.startswith("atomic")},
    # a tensor descriptor's methods (`desc.load(offsets)`): the descriptor stands where the pointer does
    "desc_load": Signature.parse("pointer, offsets"),
    "desc_store": Signature.parse("pointer, offsets, value"),
    "desc_atomic_add": Signature.parse("pointer, offsets, val"),
}
DESCRIPTOR_METHODS = {"load": "desc_load", "store": "desc_store", "atomic_add": "desc_atomic_add"}
MAKE_DESCRIPTOR = Signature.parse("base, shape, strides, block_shape, padding_option='zero'")

# Operations that keep their first argument a pointer when it is one: `ptrs[:, None]`.
POINTER_PRESERVING = {"copy", "subscript", "expand_dims", "broadcast_to", "reshape", "view", "trans",
                      "permute", "multiple_of", "max_contiguous", "max_constancy", "make_tensor_descriptor"}


# Hand-written rules for @triton.jit helpers (tritongrad.custom_vjp): the helper's Python function ->
# (its rule, the name its backward has in derived kernels, the backward).
CUSTOM: dict[Any, tuple[Rule, str, Any]] = {}


def rule_of(op: Any) -> Rule | None:
    """The rule of an operation (an ``Op``), a custom one included."""
    if op.kind == "custom":
        entry = CUSTOM.get(getattr(op.func, "fn", op.func))
        return entry[0] if entry else None
    return RULES.get(op.kind)


def reads_result(kind: str) -> bool:
    """Whether an operation's adjoint reads its own result (``exp``: ``g * out``)."""
    rule = RULES.get(kind)
    if kind == "custom":
        return True
    if rule is None:
        return False
    return any(callable(t) or "out" in {n.id for n in ast.walk(ast.parse(t)) if isinstance(n, ast.Name)}
               for t in rule.adjoints.values())
