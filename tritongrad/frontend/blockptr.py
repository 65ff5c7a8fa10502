"""Block pointers (``tl.make_block_ptr``, ``tl.advance``) rewritten into pointer arithmetic.

An input's adjoint is an atomic add, and a block pointer cannot take one; newer Tritons
dropped block pointers altogether. So before a function is flattened, each block pointer
``p`` becomes what it stands for: its base, the tensor's size and stride and the block's
element indices along each dimension, and the address tile built from them::

    p = tl.make_block_ptr(x_ptr, (M, N), (sm, sn), (r, 0), (BM, BN), (1, 0))
    # becomes
    p_base = x_ptr
    p_size0 = M
    p_stride0 = sm
    p_index0 = r + tl.arange(0, BM)      # and the same for dimension 1
    p = p_base + (p_index0[:, None].to(tl.int64) * p_stride0 + p_index1[None, :].to(tl.int64) * p_stride1)

``tl.advance(p, (a, b))`` shifts the indices and rebuilds the addresses; ``tl.load`` /
``tl.store`` with ``boundary_check`` become masked ones (``0 <= index < size`` along each
checked dimension; ``padding_option="nan"`` pads with NaN, otherwise with zero). The
addresses are 64-bit, as block pointers' offsets are. The derived backward then reads
and writes through ordinary (shadow) pointers, on any Triton version.

A block pointer may be assigned, advanced, loaded from and stored to; any other use
(passing it to a helper, building one inside an expression) is refused.
"""

from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass
from typing import Any

from ..core.errors import NotDifferentiableError
from ..core.operations import OPERATIONS
from ..core.source import triton_language_name

MAKE = "make_block_ptr"
MAKE_PARAMS = ("base", "shape", "strides", "offsets", "block_shape", "order")
LOAD_PARAMS = ("pointer", "mask", "other", "boundary_check", "padding_option")
STORE_PARAMS = ("pointer", "value", "mask", "boundary_check")


@dataclass
class _BlockPointer:
    """Names holding one block pointer's parts (each name with its own set)."""

    name: str
    block_shape: list[ast.expr]  # constexpr sizes, as written

    def part(self, what: str, dim: int | None = None) -> str:
        return f"{self.name}_{what}" if dim is None else f"{self.name}_{what}{dim}"

    @property
    def rank(self) -> int:
        return len(self.block_shape)


def rewrite_block_pointers(fdef: ast.FunctionDef, scope: dict[str, Any], origin) -> ast.FunctionDef:
    """``fdef`` with its block pointers rewritten into pointer arithmetic (``fdef`` itself if it has none).

    ``origin(node)`` gives the :class:`Origin` of a node, for refusals.
    """
    names = _language_names(fdef, scope)
    if MAKE not in names.values():
        return fdef
    copies: dict[int, Any] = {}
    fdef = copy.deepcopy(fdef, copies)  # the rewrite changes the tree: the caller's stays as it was
    names = {id(copies[k]): name for k, name in names.items()}  # the same calls, in the copy
    return _Rewriter(names, origin, {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name)}).rewrite(fdef)


def _language_names(fdef: ast.FunctionDef, scope: dict[str, Any]) -> dict[int, str]:
    """id(call node) -> ``"make_block_ptr"``, ``"advance"``, ``"load"`` or ``"store"`` for calls of those."""
    found = {}
    for node in ast.walk(fdef):
        if isinstance(node, ast.Call):
            name = triton_language_name(_resolve(node.func, scope), node.func)
            if name is None and _spelled_in_triton_language(node.func, scope):  # tl.advance is gone in 3.9
                name = node.func.attr
            if name in (MAKE, "advance", "load", "store"):
                found[id(node)] = name
    return found


def _resolve(node: ast.expr, scope: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return scope.get(node.id, getattr(builtins, node.id, None))
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scope)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def _spelled_in_triton_language(func: ast.expr, scope: dict[str, Any]) -> bool:
    module = _resolve(func.value, scope) if isinstance(func, ast.Attribute) else None
    return getattr(module, "__name__", "") == "triton.language" and func.attr in (MAKE, "advance")


def block_addresses(base: str, indices: list[str], strides: list[str]) -> str:
    """The addresses of a block: ``base + i0[:, None] * s0 + i1[None, :] * s1`` for the element indices
    ``i0``, ``i1`` along each dimension, in 64-bit arithmetic."""
    terms = [f"{_spread(i, d, len(indices))}.to(tl.int64) * {s}" for d, (i, s) in enumerate(zip(indices, strides,
                                                                                                 strict=True))]
    return f"{base} + ({' + '.join(terms)})"


def block_mask(indices, sizes, rank: int | None = None) -> str:
    """Which elements of a block lie inside the tensor (``0 <= index < size`` along each dimension given).

    ``indices`` and ``sizes``: lists over all dimensions, or dicts over the checked ones (with ``rank``)."""
    if isinstance(indices, list):
        indices, sizes, rank = dict(enumerate(indices)), dict(enumerate(sizes)), len(indices)
    return " & ".join(_spread(f"(({i} >= 0) & ({i} < {sizes[d]}))", d, rank) for d, i in indices.items())


def _spread(vector: str, dim: int, rank: int) -> str:
    """``vector`` (along ``dim``) shaped to broadcast over a block of ``rank`` dimensions: ``i[:, None]``."""
    if rank == 1:
        return vector
    return f"{vector}[{', '.join(':' if d == dim else 'None' for d in range(rank))}]"


def _arguments_of(call: ast.Call, params: tuple[str, ...]) -> dict[str, ast.expr]:
    bound = dict(zip(params, call.args, strict=False))
    bound.update({k.arg: k.value for k in call.keywords if k.arg in params})
    return bound


def _elements(node: ast.expr | None) -> list[ast.expr] | None:
    return list(node.elts) if isinstance(node, (ast.Tuple, ast.List)) else None


def _expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


class _Rewriter(ast.NodeTransformer):
    def __init__(self, names: dict[int, str], origin, taken: set[str]):
        self.names = names
        self.origin = origin
        self.taken = taken
        self.pointers: dict[str, _BlockPointer] = {}
        self.allowed: set[int] = set()  # ids of Name nodes that are legal uses of block pointers

    def refuse(self, node: ast.AST, construct: str, hint: str) -> NotDifferentiableError:
        o = self.origin(node)
        return NotDifferentiableError(construct, file=o.file, line=o.line, hint=hint, source_line=o.text)

    def rewrite(self, fdef: ast.FunctionDef) -> ast.FunctionDef:
        self.collect(fdef)
        fdef = self.visit(fdef)
        for node in ast.walk(fdef):
            if (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.pointers
                    and id(node) not in self.allowed):
                raise self.refuse(node, f"using the block pointer `{node.id}` other than to load, store or advance",
                                  "load the block and pass the tile instead")
        return ast.fix_missing_locations(fdef)

    # -- which names are block pointers ---------------------------------------------------

    def collect(self, fdef: ast.FunctionDef) -> None:
        for node in ast.walk(fdef):
            if isinstance(node, ast.Call) and self.names.get(id(node)) in (MAKE, "advance"):
                self.collect_one(node, fdef)

    def collect_one(self, call: ast.Call, fdef: ast.FunctionDef) -> None:
        kind = self.names[id(call)]
        assign = next((s for s in ast.walk(fdef) if isinstance(s, ast.Assign) and s.value is call), None)
        if assign is None or len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name):
            raise self.refuse(call, f"`tl.{kind}` inside an expression",
                              "assign the block pointer to a name first (`p = tl.make_block_ptr(...)`)")
        target = assign.targets[0].id
        if kind == MAKE:
            bound = _arguments_of(call, MAKE_PARAMS)
            parts = {k: _elements(bound.get(k)) for k in ("shape", "strides", "offsets", "block_shape")}
            bad = [k for k, v in parts.items() if v is None]
            if "base" not in bound or bad or len({len(v) for v in parts.values()}) != 1:
                raise self.refuse(call, "`tl.make_block_ptr` without base and literal shape, strides, offsets "
                                  "and block_shape tuples of one length",
                                  "write them as tuples: `shape=(M, N), strides=(sm, sn), ...`")
            block = _BlockPointer(target, parts["block_shape"])
        else:
            source = call.args[0] if call.args else None
            if not isinstance(source, ast.Name):
                raise self.refuse(call, "`tl.advance` of an expression", "advance a block pointer held in a name")
            block = None
        known = self.pointers.get(target)
        if block is not None and known is not None and ast.dump(ast.Tuple(block.block_shape)) != ast.dump(
                ast.Tuple(known.block_shape)):
            raise self.refuse(call, f"`{target}` holding block pointers of different block shapes",
                              "give each block pointer a name of its own")
        if block is not None:
            self.pointers[target] = block
            for part in ("base", "size", "stride", "index"):
                for dim in (None,) if part == "base" else range(block.rank):
                    if block.part(part, dim) in self.taken:
                        raise self.refuse(call, f"the block pointer `{target}`: the name `{block.part(part, dim)}` "
                                          "is taken", "rename the block pointer or that variable")

    # -- statements -----------------------------------------------------------------------

    def visit_Assign(self, node: ast.Assign) -> Any:
        call = node.value
        kind = self.names.get(id(call)) if isinstance(call, ast.Call) else None
        if kind == MAKE:
            return self.make(node, call)
        if kind == "advance":
            return self.advance(node, call)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and node.targets[0].id in self.pointers:
            raise self.refuse(node, f"assigning `{node.targets[0].id}` something other than a block pointer",
                              "give each block pointer a name of its own")
        return self.generic_visit(node)

    def make(self, node: ast.Assign, call: ast.Call) -> list[ast.stmt]:
        p = self.pointers[node.targets[0].id]
        bound = _arguments_of(call, MAKE_PARAMS)
        lines = [(p.part("base"), self.visit(bound["base"]))]
        for dim in range(p.rank):
            lines.append((p.part("size", dim), self.visit(_elements(bound["shape"])[dim])))
            lines.append((p.part("stride", dim), self.visit(_elements(bound["strides"])[dim])))
            offset = self.visit(_elements(bound["offsets"])[dim])
            block = p.block_shape[dim]
            lines.append((p.part("index", dim), _expr(f"{ast.unparse(offset)} + tl.arange(0, {ast.unparse(block)})")))
        return self.statements(node, lines + [(p.name, self.address(p))])

    def advance(self, node: ast.Assign, call: ast.Call) -> list[ast.stmt]:
        source_name = call.args[0].id
        if source_name not in self.pointers:
            raise self.refuse(call, f"`tl.advance` of `{source_name}`, which is not a block pointer",
                              "advance a name assigned from `tl.make_block_ptr`")
        source = self.pointers[source_name]
        target = node.targets[0].id
        p = self.pointers.setdefault(target, _BlockPointer(target, source.block_shape))
        bound = _arguments_of(call, ("base", "offsets"))
        shifts = _elements(bound.get("offsets"))
        if shifts is None or len(shifts) != source.rank or p.rank != source.rank:
            raise self.refuse(call, "`tl.advance` without a literal tuple of one offset per dimension",
                              "write the offsets as a tuple: `tl.advance(p, (0, BLOCK_K))`")
        lines = []
        if p is not source:
            lines.append((p.part("base"), _expr(source.part("base"))))
            for dim in range(p.rank):
                lines += [(p.part("size", dim), _expr(source.part("size", dim))),
                          (p.part("stride", dim), _expr(source.part("stride", dim)))]
        for dim, shift in enumerate(shifts):
            shift = ast.unparse(self.visit(shift))
            lines.append((p.part("index", dim), _expr(f"{source.part('index', dim)} + {shift}")))
        return self.statements(node, lines + [(p.name, self.address(p))])

    def statements(self, like: ast.stmt, lines: list[tuple[str, ast.expr]]) -> list[ast.stmt]:
        out = []
        for name, value in lines:
            stmt = ast.Assign(targets=[ast.Name(name, ast.Store())], value=value)
            for n in ast.walk(stmt):
                ast.copy_location(n, like)
            out.append(stmt)
        return out

    def address(self, p: _BlockPointer) -> ast.expr:
        dims = range(p.rank)
        return _expr(block_addresses(p.part("base"), [p.part("index", d) for d in dims],
                                     [p.part("stride", d) for d in dims]))

    # -- loads and stores -----------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> Any:
        operation = OPERATIONS.get(self.names.get(id(node)))
        access = operation.access if operation is not None else None
        pointer = node.args[0] if node.args else None
        if access in ("load", "store") and isinstance(pointer, ast.Name) and pointer.id in self.pointers:
            return self.memory(node, access, self.pointers[pointer.id])
        return self.generic_visit(node)

    def memory(self, node: ast.Call, access: str, p: _BlockPointer) -> ast.Call:
        """``tl.load`` / ``tl.store`` (``access``) of a block pointer: at its addresses, masked by its bounds."""
        params = LOAD_PARAMS if access == "load" else STORE_PARAMS
        bound = _arguments_of(node, params)
        if "mask" in bound or "other" in bound:
            raise self.refuse(node, f"`tl.{access}` of a block pointer with a mask",
                              "block pointers are bounded by `boundary_check`")
        checked = _elements(bound.get("boundary_check", ast.Tuple([])))
        padding = bound.get("padding_option", ast.Constant(""))
        if checked is None or not all(isinstance(c, ast.Constant) for c in checked) or not isinstance(
                padding, ast.Constant):
            raise self.refuse(node, f"`tl.{access}` of a block pointer with a computed boundary_check or padding",
                              "write them as literals: `boundary_check=(0, 1), padding_option=\"zero\"`")
        dims = sorted({c.value % p.rank for c in checked})
        keywords = [k for k in node.keywords if k.arg not in params]  # cache and eviction hints
        args = [node.args[0]]
        self.allowed.add(id(node.args[0]))
        if access == "store":
            args.append(self.visit(bound["value"]))
        if dims:
            indices = {d: p.part("index", d) for d in dims}
            keywords.append(ast.keyword("mask", _expr(block_mask(indices, {d: p.part("size", d) for d in dims},
                                                                 p.rank))))
            if access == "load":
                other = "float('nan')" if padding.value == "nan" else "0.0"
                keywords.append(ast.keyword("other", _expr(other)))
        new = ast.Call(func=node.func, args=args, keywords=keywords)
        for n in ast.walk(new):
            ast.copy_location(n, node)
        return new
