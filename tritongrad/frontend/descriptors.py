"""Tensor descriptors' loads and stores rewritten into pointer arithmetic, as block pointers are (blockptr.py).

A descriptor access stands for a masked pointer access: ``desc.load([o0, o1])`` of a descriptor made by
``tl.make_tensor_descriptor(base, [n0, n1], [s0, s1], [B0, B1])`` reads the block::

    desc_index0 = o0 + tl.arange(0, B0)           # and the same for dimension 1
    desc_address = base + (desc_index0[:, None].to(tl.int64) * s0 + desc_index1[None, :].to(tl.int64) * s1)
    tl.load(desc_address, mask=(0 <= desc_index0 < n0) & (0 <= desc_index1 < n1), other=0.0)

(out-of-bounds elements read as zero, or NaN with ``padding_option="nan"``; stores and adds drop them). So
the derivation sees a pointer load, whose addresses the write strategies can reason about (a descriptor's
strides are not a launch's arguments to them: its loads' adjoints were all atomic adds), and the derived
backward reads and writes through ordinary shadow pointers. The forward runs as written, through its
descriptors. A dimension whose offset is 0 and whose block spans the whole, compile-time size needs no mask.

The rewrite happens while the kernel is flattened, where helpers are inlined, so a descriptor made in one
function and used in another is followed. A descriptor whose shape, strides or block shape are not written as
lists, or an access whose offsets are not, keeps its descriptor form (reverse/memory.py differentiates it), and
so does one whose base the normalizer is not asked to rewrite (``Normalizer.pointers``): runtime/derive.py keeps
as descriptors those whose gradient the rewrite would leave atomic, since a tile added through a descriptor
(one reduction) is faster than per-element pointer atomics (the tutorial attention's causal dK/dV).
"""

from __future__ import annotations

import ast
import copy

import triton.language as tl

LANGUAGE = "tritongrad_tl"  # triton.language's name in the rewritten code where the kernel's `tl` is not it
METHOD_PARAMS = {"desc_load": ("offsets",), "desc_store": ("offsets", "value"), "desc_atomic_add": ("offsets", "val")}
POINTER_KIND = {"desc_load": "load", "desc_store": "store", "desc_atomic_add": "atomic_add"}


def as_pointers(flattener, kind: str, parts: dict[str, ast.expr], desc: str, node: ast.Call, stmt: ast.stmt):
    """The pointer access ``desc.<method>(...)`` (``node``) stands for, flattened (its last operation deferred, as
    the flattener returns a call); None where it keeps its descriptor form. ``parts``: the bound arguments of
    the ``make_tensor_descriptor`` the descriptor comes from (atoms)."""
    sizes, strides, block = (_elements(parts.get(k)) for k in ("shape", "strides", "block_shape"))
    bound = _bind(node, METHOD_PARAMS[kind])
    if bound is None:
        return None
    offsets = _elements(flattener.atom(bound["offsets"], stmt))  # (atoms, in the caller's frame)
    value = flattener.atom(bound[METHOD_PARAMS[kind][1]], stmt) if kind != "desc_load" else None
    padding = parts.get("padding_option", ast.Constant("zero"))
    if (None in (sizes, strides, block, offsets) or len({len(sizes), len(strides), len(block), len(offsets)}) != 1
            or not isinstance(padding, ast.Constant)):
        return None
    normalizer = flattener.normalizer
    rank = len(sizes)
    env = {"base": parts["base"], "value": value}
    for d in range(rank):
        env.update({f"size{d}": sizes[d], f"stride{d}": strides[d], f"offset{d}": offsets[d], f"block{d}": block[d]})
    frame = copy.copy(normalizer.frame)
    frame.env = {k: v for k, v in env.items() if v is not None}
    frame.inlined = True  # fresh names for what it assigns
    language = "tl" if frame.fn.scope.get("tl") is tl else LANGUAGE
    frame.fn = copy.copy(frame.fn)
    frame.fn.scope = {**frame.fn.scope, language: tl}
    normalizer.frames.append(frame)
    try:
        for d in range(rank):
            _assign(normalizer, f"{desc}_index{d}", f"offset{d} + {language}.arange(0, block{d})", stmt)
        address = " + ".join(f"{_spread(f'{desc}_index{d}', d, rank)}.to({language}.int64) * stride{d}"
                             for d in range(rank))
        _assign(normalizer, f"{desc}_address", f"base + ({address})", stmt)
        checked = [d for d in range(rank) if not _whole(normalizer, offsets[d], block[d], sizes[d])]
        mask = " & ".join(_spread(f"(({desc}_index{d} >= 0) & ({desc}_index{d} < size{d}))", d, rank)
                          for d in checked)
        if mask:
            _assign(normalizer, f"{desc}_mask", mask, stmt)
        keywords = f", mask={desc}_mask" if mask else ""
        if kind == "desc_load":
            other = "float('nan')" if padding.value == "nan" else "0.0"
            text = f"{language}.load({desc}_address{keywords}" + (f", other={other})" if mask else ")")
        else:
            text = f"{language}.{POINTER_KIND[kind]}({desc}_address, value{keywords})"
        return flattener.expr(ast.copy_location(ast.parse(text, mode="eval").body, stmt), stmt)
    finally:
        normalizer.frames.pop()


def _assign(normalizer, name: str, text: str, stmt: ast.stmt) -> None:
    value = ast.parse(text, mode="eval").body
    for n in ast.walk(value):
        ast.copy_location(n, stmt)
    normalizer.assign(ast.Name(name, ast.Store()), value, stmt)


def _whole(normalizer, offset: ast.expr, block: ast.expr, size: ast.expr) -> bool:
    """Whether a dimension's block is the whole dimension, from offset 0, at compile time."""
    def value(atom):
        known, v = normalizer.known_value(atom)
        return v if known else None
    return value(offset) == 0 and value(block) is not None and value(block) == value(size)


def _spread(vector: str, dim: int, rank: int) -> str:
    """``vector`` (along ``dim``) shaped to broadcast over a block of ``rank`` dimensions: ``i[:, None]``."""
    if rank == 1:
        return vector
    return f"{vector}[{', '.join(':' if d == dim else 'None' for d in range(rank))}]"


def _elements(node: ast.expr | None) -> list[ast.expr] | None:
    return list(node.elts) if isinstance(node, (ast.Tuple, ast.List)) else None


def _bind(node: ast.Call, params: tuple[str, ...]) -> dict[str, ast.expr] | None:
    bound = dict(zip(params, node.args, strict=False))
    bound.update({k.arg: k.value for k in node.keywords})
    return bound if set(bound) == set(params) else None


def unused_descriptors_dropped(body: list[ast.stmt], descriptors: set[str]) -> list[ast.stmt]:
    """``body`` without the statements making or copying a descriptor no statement reads any more (every access
    rewritten): making one in the kernel costs a global write and a fence."""
    def unused(s: ast.stmt, read: set[str]) -> bool:
        return (isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) and s.targets[0].id in descriptors
                and s.targets[0].id not in read)

    while _drop(body, unused, {n.id for s in body for n in ast.walk(s)
                               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}):
        pass
    return body


def _drop(body: list[ast.stmt], unused, read: set[str]) -> bool:
    """Remove, in place, the statements ``unused`` says, in ``body`` and the blocks inside it."""
    found = False
    for s in list(body):
        if unused(s, read) and len(body) > 1:  # (a block keeps a statement)
            body.remove(s)
            found = True
            continue
        for block in (getattr(s, "body", None), getattr(s, "orelse", None)):
            if isinstance(block, list) and block:
                found |= _drop(block, unused, read)
    return found

