"""Operations written out in several steps, read as the one operation they are, so that their rule reads only
their result: a softmax, ``e = tl.exp(z); s = tl.sum(e, axis); y = e / s``, and a reciprocal square root,
``r = 1.0 / tl.sqrt(v)`` (a normalization's ``rstd``: its rule ``-0.5 * r ** 3`` needs neither the square root
nor ``v``, the variance, a reduction the backward would recompute).

Softmax.
Differentiated statement by statement, its backward needs ``e`` and ``s`` as well as ``y``: the exponential
and the sum are recomputed and each adjoint divides by ``s``. Read as ``y = tg.softmax(z, axis)``, its rule is
``dz = y * (dy - sum(dy * y))`` (operations.py), which reads ``y`` alone: what a hand-written backward does,
and what lets an op's backward read ``y`` back from where the forward stored it (stored_outputs.py) instead of
recomputing the row's max, exponentials and sum.

Matched in one block, where ``e`` is read only by the sum and the division and the sum only by the division
(directly, or through ``[:, None]`` / ``tl.expand_dims`` putting back the reduced axis, or kept by
``keep_dims=True``): then nothing else needs them, and the three statements become one. Only where ``y`` is
stored and read by nothing else (what may be read back): a softmax feeding a product (attention) keeps its
elementwise form, which orient.py computes transposed. Run on the derivation's program only; the forward
that runs is the user's.
"""

from __future__ import annotations

import ast
import copy
from collections import Counter

from ..core.ir import (
    Op,
    Program,
    arguments,
    assign,
    child_blocks,
    header,
    is_none,
    is_structured,
    literal_value,
    op_of,
    reads,
    statements,
    structured,
    tagged,
    target_of,
)
from ..core.operations import operation_of


def fuse_composites(program: Program) -> Program:
    """The program with each written-out softmax (in any block) rewritten, in place, as ``tg.softmax``, and each
    reciprocal square root differentiated as ``tl.rsqrt``."""
    uses = Counter(n for s in statements(program.body) for n in _reads(s))
    uses.update(n for node in structured(program.body) for e in header(node) for n in reads(e))
    uses.update(n for r in program.returns or () for n in reads(r))
    stored = {v.id for s in statements(program.body) if operation_of(op_of(s)).access == "store"
              and isinstance(v := arguments(s)["value"], ast.Name) and uses[v.id] == 1}
    _fuse_block(program.body, uses, stored)
    return program


def _fuse_block(block: list[ast.stmt], uses: Counter, stored: set[str]) -> None:
    for s in block:
        for inner in child_blocks(s) if is_structured(s) else ():
            _fuse_block(inner, uses, stored)
    here = {target_of(s): s for s in block if not is_structured(s) and target_of(s) is not None}
    for div in list(block):
        root = _reciprocal_root(div, here, uses)
        if root is not None:  # `r = 1.0 / tl.sqrt(v)`, computed as written, differentiated as tl.rsqrt(v)
            sqrt = here[op_of(div).args[1].id]
            block.remove(sqrt)
            value = ast.BinOp(copy.deepcopy(op_of(div).args[0]), ast.Div(), copy.deepcopy(sqrt.value))
            block[block.index(div)] = tagged(assign(target_of(div), value), Op("rsqrt", [root]), div)
            continue
        found = _match(div, here, uses, stored)
        if found is None:
            continue
        z, axis, gone = found
        for s in gone:
            block.remove(s)
        value = ast.parse(f"tg.softmax({z.id}, {axis})", mode="eval").body
        block[block.index(div)] = tagged(assign(target_of(div), value), Op("softmax", [z, ast.Constant(axis)]), div)


def _reciprocal_root(div: ast.stmt, here: dict[str, ast.stmt], uses: Counter) -> ast.Name | None:
    """``v`` where ``div`` is ``1.0 / s`` of an ``s = tl.sqrt(v)`` nothing else reads, else None."""
    if is_structured(div) or op_of(div).kind != "truediv":
        return None
    one, s = op_of(div).args
    sqrt = here.get(s.id) if isinstance(s, ast.Name) and uses[s.id] == 1 else None
    if literal_value(one) != 1.0 or sqrt is None or op_of(sqrt).kind not in ("sqrt", "sqrt_rn"):
        return None
    root = op_of(sqrt).args[0]
    return root if isinstance(root, ast.Name) else None


def _match(div: ast.stmt, here: dict[str, ast.stmt], uses: Counter, stored: set[str]):
    """(z, the axis, the statements that go) where ``div`` is ``e / s`` of a written-out softmax, else None."""
    if is_structured(div) or op_of(div).kind != "truediv":
        return None
    e, s = op_of(div).args
    if not (isinstance(e, ast.Name) and isinstance(s, ast.Name)) or e.id == s.id:
        return None
    exp, spread = here.get(e.id), here.get(s.id)
    if exp is None or spread is None or operation_of(op_of(exp)).exponential != "e" or uses[e.id] != 2 or (
            uses[s.id] != 1):
        return None
    if target_of(div) not in stored:
        return None
    gone = [spread]
    total, index = spread, None
    if op_of(spread).kind in ("subscript", "expand_dims"):  # the reduced axis put back
        index = spread
        operand = op_of(spread).args[0]
        total = here.get(operand.id) if isinstance(operand, ast.Name) and uses[operand.id] == 1 else None
        if total is None:
            return None
        gone.append(total)
    if op_of(total).kind != "sum":
        return None
    b = arguments(total)
    axis, keep = _literal(b["axis"]), _literal(b["keep_dims"])
    if not isinstance(axis, int) or isinstance(axis, bool) or b["input"].id != e.id or not is_none(b["dtype"]):
        return None
    # the sum must broadcast back along the axis it reduced: kept, put back, or the first (broadcasting aligns
    # the trailing axes)
    if not (_puts_back(index, axis) and not keep if index is not None else keep or axis == 0):
        return None
    z = op_of(exp).args[0]
    if not isinstance(z, ast.Name) or axis < 0:
        return None
    return z, axis, [exp, *gone]


def _puts_back(stmt: ast.stmt, axis: int) -> bool:
    """``t[:, None]`` (None at ``axis``, every other entry ``:``) or ``tl.expand_dims(t, axis)``."""
    op = op_of(stmt)
    if op.kind == "expand_dims":
        return _literal(arguments(stmt)["axis"]) == axis
    index = op.kwargs.get("index")
    entries = index.elts if isinstance(index, ast.Tuple) else [index]
    if axis >= len(entries):
        return False
    for i, entry in enumerate(entries):
        full = isinstance(entry, ast.Slice) and entry.lower is entry.upper is entry.step is None
        if not (is_none(entry) if i == axis else full):
            return False
    return True


def _literal(atom: ast.expr | None):
    return atom.value if isinstance(atom, ast.Constant) else None


def _reads(stmt: ast.stmt) -> list[str]:
    """Names a statement reads, once per occurrence (``e * e`` reads ``e`` twice)."""
    return [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]

