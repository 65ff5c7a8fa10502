"""A load of what the same lane stored earlier in the kernel is the stored value (store-to-load forwarding).

``tl.store(p + offs, v, mask=m)`` then, later in the same block, ``x = tl.load(p + offs, mask=m, other=o)``
(the same address and mask, compared through their single definitions): ``x`` is ``v`` as the tensor
holds it, ``tl.where(m, v, o).to(<p's element type>)``. Stores to one output write distinct elements
(checked as for any output: lanes, programs, iterations and several stores apart), so nothing else can
have written that element in between. The load goes; what is left is an ordinary output, differentiated
through ``v``. Run on the flattened kernel, before anything reads its pointers (the launch record's
roles included), so that every pass sees the same program.
"""

from __future__ import annotations

import ast

from ..core.ir import (
    Op,
    arguments,
    assign,
    block_positions,
    canonical_atom,
    definitions,
    is_none,
    op_of,
    statements,
    tagged,
    target_of,
)
from ..core.operations import operation_of


def forward_stored_values(body: list[ast.stmt], fresh) -> None:
    """Replace, in place, each load of a value the same lane stored earlier in its block (``fresh(name)``:
    a new SSA name)."""
    defs = definitions(body)
    place = block_positions(body)
    stores: dict[tuple, list[tuple[list, int, ast.stmt]]] = {}
    for s in statements(body):
        if operation_of(op_of(s)).access == "store":
            b = arguments(s)
            key = (canonical_atom(b["pointer"], defs), canonical_atom(b["mask"], defs))
            stores.setdefault(key, []).append((*place[id(s)], s))
    if not stores:
        return
    for load in list(statements(body)):
        if operation_of(op_of(load)).access != "load":
            continue
        b = arguments(load)
        block, i = place[id(load)]
        earlier = [(j, s) for blk, j, s in stores.get((canonical_atom(b["pointer"], defs),
                                                        canonical_atom(b["mask"], defs)), ()) if blk is block and j < i]
        if earlier:
            block[block.index(load):block.index(load) + 1] = _forwarded(load, max(earlier, key=lambda js: js[0])[1],
                                                                        fresh)


def _forwarded(load: ast.stmt, store: ast.stmt, fresh) -> list[ast.stmt]:
    """``x = tl.load(p, mask=m, other=o)`` as ``x = tl.where(m, v, o).to(p.dtype.element_ty)``."""
    b, value = arguments(load), op_of(store).args[1]
    target, address = target_of(load), b["pointer"]
    element = ast.Attribute(ast.Attribute(ast.Name(address.id, ast.Load()), "dtype", ast.Load()), "element_ty",
                            ast.Load())
    out = []
    if not is_none(b["mask"]):
        other = b.get("other")
        other = ast.Constant(0.0) if other is None or is_none(other) else other
        picked = fresh(f"{target}_stored")
        op = Op("where", [b["mask"], value, other], func=None)
        where = ast.parse(f"tl.where({ast.unparse(b['mask'])}, {ast.unparse(value)}, {ast.unparse(other)})",
                          mode="eval").body
        out.append(tagged(assign(picked, where), op, load))
        value = ast.Name(picked, ast.Load())
    out.append(tagged(assign(target, ast.Call(ast.Attribute(value, "to", ast.Load()), [element], [])),
                      Op("to", [value, element]), load))
    return out
