"""The derivative rules of core/operations.py's table whose template depends on a call's literal arguments (a
permutation's order, a cast's dtype, a product's options): each a function of the bound arguments (and, for a tangent,
the parameters that have one) giving the template; a ValueError refuses the call in forward mode."""

from __future__ import annotations

import ast


def inverse_permutation(bound: dict[str, ast.expr]) -> str:
    dims = bound.get("dims")
    elts = dims.elts if isinstance(dims, (ast.Tuple, ast.List)) else []
    if not elts:  # tl.trans(x) of a 2-D tile
        return "tl.trans(g)"
    if len(elts) == 1 and isinstance(elts[0], (ast.Tuple, ast.List)):
        elts = elts[0].elts
    order = [ast.literal_eval(e) for e in elts]  # ValueError when not literal: refused upstream
    inverse = [order.index(i) for i in range(len(order))]
    return f"tl.permute(g, {tuple(inverse)})"


def cast_adjoint(bound: dict[str, ast.expr]) -> str:
    # a cast to a float type passes the gradient on; the dtype may only be known at compile time
    dtype = ast.unparse(bound["dtype"])
    if dtype.startswith(("tl.float", "tl.bfloat")):
        return "g"
    return f"tg.cast_grad(g, {dtype})"  # the type, not `out`: reading `out` would recompute the cast's operand


def linear_scan_adjoint(bound: dict[str, ast.expr]) -> str:
    a, b = (ast.unparse(e) for e in bound["input"].elts)
    return f"tg.linear_scan_grad(g0, g1, {a}, {b}, out[0], out[1], axis, reverse)"


def cast_tangent(bound: dict[str, ast.expr], active: frozenset[str]) -> str:
    bitcast = bound["bitcast"]
    if not (isinstance(bitcast, ast.Constant) and not bitcast.value):
        raise ValueError("a bitcast (or a cast whose bitcast= is not a literal)")
    dtype = ast.unparse(bound["dtype"])
    rounding = bound["fp_downcast_rounding"]
    keyword = "" if isinstance(rounding, ast.Constant) and rounding.value is None else ", fp_downcast_rounding=rounding"
    if dtype.startswith(("tl.float", "tl.bfloat")):
        return f"tl.cast(t_input, dtype{keyword})"
    return f"tl.cast(tg.cast_grad(t_input, dtype), dtype{keyword})"  # zeros where it turns out an integer type


def dot_tangent(bound: dict[str, ast.expr], active: frozenset[str]) -> str:
    """d(A B + C) = dA B + A dB + dC, each product accumulated into the next (as the forward's precision) where the
    forward accumulates or names its out_dtype; else added (a float64 product is float64, not the default
    out_dtype an accumulator must have)."""
    def given(k: str) -> bool:
        return not (isinstance(bound[k], ast.Constant) and bound[k].value is None)

    options = "".join(f", {k}={k}" for k in ("input_precision", "allow_tf32", "max_num_imprecise_acc", "out_dtype")
                      if given(k))
    chained = given("acc") or given("out_dtype")
    total = "t_acc" if "acc" in active else None
    for a, b in (("t_input", "other"), ("input", "t_other")):
        if a.removeprefix("t_") in active or b.removeprefix("t_") in active:
            product = f"tl.dot({a}, {b}{options})"
            total = (product if total is None else f"tl.dot({a}, {b}, {total}{options})" if chained
                     else f"{total} + {product}")
    return total


def extremum_tangent(bound: dict[str, ast.expr], active: frozenset[str]) -> str:
    if not (isinstance(bound["return_indices"], ast.Constant) and bound["return_indices"].value is False):
        raise ValueError("a max or min returning its indices")
    return "tg.extremum_tangent(t_input, input, out, axis, keep_dims)"  # the ties' mean, as torch.amax's


def where_tangent(bound: dict[str, ast.expr], active: frozenset[str]) -> str:
    return f"tl.where(condition, {'t_x' if 'x' in active else '0.0'}, {'t_y' if 'y' in active else '0.0'})"


def full_tangent(bound: dict[str, ast.expr], active: frozenset[str]) -> str:
    if cast_adjoint(bound) != "g":
        raise ValueError("a dtype that is not a literal float type")
    return "tl.full(shape, t_value, dtype)"


def linear_scan_tangent(bound: dict[str, ast.expr], active: frozenset[str]) -> str:
    a, b = bound["input"].elts
    if "input[0]" in active:
        raise ValueError("a linear recurrence whose factors are differentiated")
    return f"tl.associative_scan(({ast.unparse(a)}, t_input_1), axis, combine_fn, reverse)"  # linear in b
