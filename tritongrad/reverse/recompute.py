"""The forward recomputed inside the backward: the statements whose values the reverse sweep reads, in front of it."""

from __future__ import annotations

import ast
import copy
import math

from ..analysis.stored_outputs import StoredValue
from ..core.calls import value_reads
from ..core.ir import (
    Op,
    arguments,
    assign,
    child_blocks,
    construct_origin,
    copy_structured,
    free_names,
    header,
    is_none,
    is_structured,
    name_node,
    names_in,
    op_of,
    reads,
    refuse,
    statements,
    tagged,
    target_of,
)
from ..core.operations import LOADS, STORES, instantiate, operation_of

ASSERTS = ("static_assert", "device_assert")



class Recompute:
    """The forward's values the sweep reads, recomputed in front of it (the statements they need, each shadow pointer
    beside its pointer; a stored value read back from its output where that loads less): written for a
    :class:`sweep.BackwardBuilder`."""

    def __init__(self, builder):
        self.builder = builder
        # pointer -> its mirror into the values the launch left (`x_ptr_stored + offs` beside `x_ptr + offs`), for
        # the pointers a reload's address is computed from (analysis/in_place.py)
        self.as_left: dict[str, str] = {}
        for load in statements(builder.program.body):
            if target_of(load) in builder.analysis.reloads:
                self.as_left_name(arguments(load)["pointer"].id)

    def mirrored(self) -> dict[str, str]:
        """Each shadow pointer and each mirror into the values the launch left -> the pointer it mirrors."""
        return {v: k for mirror in (self.builder.shadow, self.as_left) for k, v in mirror.items()}

    def as_left_name(self, pointer: str) -> str:
        """A pointer's mirror into the values the launch left; the pointers it is computed from get theirs too."""
        if pointer not in self.as_left:
            base = self.builder.analysis.pointer_base.get(pointer, pointer)
            as_left = self.builder.analysis.as_left_params
            self.as_left[pointer] = as_left[base] if pointer == base else self.builder.namer.fresh(f"{pointer}_stored")
            for d in self.builder.defs.get(pointer, []):
                if target_of(d) is not None:
                    for n in self.pointer_operands(d, base):
                        self.as_left_name(n)
        return self.as_left[pointer]

    def with_shadow(self, stmt: ast.stmt) -> list[ast.stmt]:
        """A recomputed statement, then its pointer's shadow and mirror (``d_p = d_x_ptr + offs``, ``p_stored =
        x_ptr_stored + offs``); a reload instead loads from the values the launch left."""
        t = target_of(stmt)
        if t in self.builder.analysis.reloads:
            return self.reloaded(stmt)
        out = [stmt]
        if t in self.builder.shadow:
            out.append(self.shadow_statement(stmt, t))
        if t in self.as_left:
            out.append(self.shadow_statement(stmt, t, self.as_left))
        return out

    def reloaded(self, load: ast.stmt) -> list[ast.stmt]:
        """A reload recomputed: the same load from the tensor as the launch left it, which holds what it read (each
        element stored once, before it, and never again: analysis/in_place.py)."""
        param = self.builder.analysis.reloads[target_of(load)]
        note = self.builder.marker(f"`{target_of(load)}`: what the forward stored over `{param}` and read back, "
                                   f"from `{self.builder.analysis.as_left_params[param]}` (`{param}` as the launch "
                                   "left it)")
        mirror = name_node(self.as_left[arguments(load)["pointer"].id])
        call = load.value
        args = [mirror, *call.args[1:]] if call.args else []
        keywords = [ast.keyword(k.arg, mirror) if k.arg == "pointer" else k for k in call.keywords]
        op = op_of(load)
        kwargs = {k: mirror if k == "pointer" else v for k, v in op.kwargs.items()}
        return [note, tagged(assign(target_of(load), ast.Call(call.func, args, keywords)),
                             Op(op.kind, [mirror, *op.args[1:]] if op.args else [], kwargs, op.func), load)]

    def statements(self, also: set[str] = frozenset()) -> list[ast.stmt]:
        """The forward's statements the sweep (and the names ``also``) need, each shadow pointer beside its
        pointer."""
        shadow_of = self.mirrored()
        seeds = {shadow_of.get(n, n) for n in free_names(self.builder.out) | set(also)}
        if self.builder.tile:
            seeds |= {n for r in self.builder.program.returns for n in names_in(r)}
        for s in statements(self.builder.program.body):
            if op_of(s).kind in ASSERTS:
                seeds |= reads(s)
        body = self.builder.program.body
        needed = self.closure(seeds, body)
        moves = {v: self.moved_with(k) for v, k in self.builder.read_back.items()
                 if v in needed and self.builder.same_shape(v, _address(k))}
        kept = {v: self.builder.read_back[v] for v, moved in moves.items() if moved is not None}
        if kept and self.fewer_loads(seeds | set(also), kept):
            instead = self.closure(seeds | {n for k in kept.values() for n in reads(k.store)}, body, leaves=set(kept))
            return self.block(body, instead, asserts=True, read_back={v: (k, moves[v]) for v, k in kept.items()})
        return self.block(body, needed, asserts=True)

    def fewer_loads(self, seeds: set[str], kept: dict[str, StoredValue]) -> bool:
        """Whether reading ``kept`` back leaves no more loads to issue than recomputing them: counted over the
        values read as values (a load the sweep reads only for its shape is compiled away either way)."""
        shadow_of = self.mirrored()
        valued = {shadow_of.get(n, n) for s in statements(self.builder.out) for n in value_reads(s)}
        valued = {n for n in seeds if n in valued or n in self.builder.read_back}  # (seeds: from before the sweep)
        body = self.builder.program.body

        def tiles(names) -> int:  # loads of tiles (a row's statistic, one value, costs next to nothing)
            return sum(self.builder.analysis.shapes.get(n) != () for n in names)

        def loads(names: set[str]) -> int:
            return tiles(n for n in names if any(op_of(d).kind in LOADS for d in self.builder.defs.get(n, ())))

        recomputed = self.closure(valued, body, reader=value_reads)
        instead = self.closure(valued | {n for k in kept.values() for n in reads(k.store)}, body, leaves=set(kept),
                               reader=value_reads)
        return loads(instead) + tiles(kept) <= loads(recomputed)

    def moved_with(self, kept: StoredValue) -> list[ast.stmt] | None:
        """The top-level statements between ``kept``'s definition and its store that compute the store's address
        and mask: recomputed with the read-back, where the value was defined. None where they read the value, or a
        name defined in a nested block or more than once."""
        body = self.builder.program.body
        at = {id(s): i for i, s in enumerate(body)}
        start, end = at.get(id(self.builder.defs[kept.name][0])), at.get(id(kept.store))
        if start is None or end is None or end < start:
            return None
        b = arguments(kept.store)
        work, moved = [*reads(b["pointer"]), *reads(b["mask"])], {}
        while work:
            found = self.builder.defs.get(work.pop(), [])
            if not found:
                continue  # a parameter
            if len(found) != 1 or id(found[0]) not in at or at[id(found[0])] == start:
                return None
            if at[id(found[0])] > start and id(found[0]) not in moved:
                moved[id(found[0])] = found[0]
                work += reads(found[0].value)
        return sorted(moved.values(), key=lambda s: at[id(s)])

    def closure(self, seeds: set[str], block: list[ast.stmt], also=(), leaves=frozenset(), reader=reads) -> set[str]:
        """``seeds`` and every value of ``block`` they are computed from (through the tests and ranges
        around them in ``block`` too; ``reader``: the names an expression reads). Names from outside
        ``block`` (other than ``also``) are taken as they are there; of ``also`` names, only their
        definitions inside ``block`` are followed; of ``leaves``, none (read back: stored_outputs.py)."""
        needed: set[str] = set()
        work = list(seeds)
        while work:
            n = work.pop()
            if n in needed:
                continue
            needed.add(n)
            if n in leaves or not (n in also or self.builder.within(n, block)):
                continue
            for d in self.builder.defs.get(n, []):
                if not self.builder.block_within(self.builder.stmt_block[id(d)], block):
                    continue
                work += reader(d.value) if isinstance(d, ast.Assign) else reader(d.iter)
                for outer in self.builder.enclosing[id(d)]:
                    if self.builder.block_within(self.builder.stmt_block[id(outer)], block):
                        work += [x for e in header(outer) for x in reader(e)]
        return needed

    def block(self, block: list[ast.stmt], needed: set[str], skip: set[int] = frozenset(),
                     asserts: bool = False, read_back: dict[str, tuple[StoredValue, list[ast.stmt]]] | None = None
                     ) -> list[ast.stmt]:
        """The statements of ``block`` assigning ``needed`` names (stores dropped), shadows beside pointers;
        a ``read_back`` value is loaded where it was defined instead of computed, the statements computing its
        store's address (``_moved_with``) moved up with it."""
        out: list[ast.stmt] = []
        moved = {id(m) for _, ms in (read_back or {}).values() for m in ms}  # still to be emitted
        moved_ever = set(moved)
        for s in block:
            t = target_of(s) if not is_structured(s) else None
            if read_back and t in read_back:
                kept, moves = read_back[t]
                out.append(self.builder.marker(f"`{kept.name}` read back from `{kept.param}`, where the forward stored "
                                               "it, instead of recomputed (stored_outputs.py)"))
                for m in moves:
                    if id(m) in moved:  # (once, where the first value that needs it was defined)
                        moved.discard(id(m))
                        out += self.builder.with_shadow(copy.deepcopy(m))
                out.append(_read_back(kept))
                continue
            if id(s) in moved_ever:
                continue
            if is_structured(s):
                inner = [self.block(b, needed, skip, asserts) for b in child_blocks(s)]
                if not any(inner):
                    continue
                if isinstance(s, ast.For):
                    recomputed = copy_structured(s, target=copy.deepcopy(s.target), iter=copy.deepcopy(s.iter),
                                             body=inner[0])
                    if not any(isinstance(e, ast.For) for e in self.builder.enclosing[id(s)]):
                        recomputed.recompute_of = s  # its values after it may be kept by the forward (keep_finals)
                    out.append(recomputed)
                else:
                    out.append(copy_structured(s, test=copy.deepcopy(s.test), body=inner[0] or [ast.Pass()],
                                                orelse=inner[1]))
                continue
            if op_of(s).kind in STORES and t is not None and t in needed:  # (not recomputed: it writes memory)
                raise refuse(construct_origin(s), f"the result of `tl.{op_of(s).kind}` (`{t}`), which the backward "
                             "reads (an address, a mask or a value its adjoints need) and cannot compute again: "
                             "running the "
                             "atomic again would change the memory and give another result",
                             "compute that value without an atomic (from tl.program_id, the loop indices, or a "
                             "tensor loaded for it)")
            if id(s) in skip or op_of(s).kind in STORES:
                continue
            if (t is not None and t in needed) or (asserts and op_of(s).kind in ASSERTS):
                out += self.builder.with_shadow(copy.deepcopy(s))
        return out

    def pointer_operands(self, stmt: ast.stmt, base: str) -> list[str]:
        op = op_of(stmt)
        positions = operation_of(op).pointer_args or (0,)
        return [op.args[i].id for i in positions if i < len(op.args) and isinstance(op.args[i], ast.Name)
                and self.builder.analysis.pointer_base.get(op.args[i].id) == base]

    def shadow_statement(self, stmt: ast.stmt, t: str, mirror: dict[str, str] | None = None) -> ast.stmt:
        """``d_p = d_base + offs`` for ``p = base + offs`` (``mirror``: pointer -> its mirror, else its shadow)."""
        mirror = self.builder.shadow if mirror is None else mirror
        base = self.builder.analysis.pointer_base[t]
        renames = {n: name_node(mirror[n]) for n in self.pointer_operands(stmt, base)}
        value = copy.deepcopy(stmt.value)

        class Sub(ast.NodeTransformer):
            def visit_Name(self, n: ast.Name) -> ast.expr:
                return copy.deepcopy(renames[n.id]) if n.id in renames else n

        value = Sub().visit(value)
        node = ast.Assign(targets=[ast.Name(mirror[t], ast.Store())], value=value)
        node.tg = stmt.tg
        return node


def _address(kept: StoredValue) -> str:
    return arguments(kept.store)["pointer"].id


def _read_back(kept: StoredValue) -> ast.stmt:
    """``v = tg.widened(tl.load(<the store's address>, mask=<its mask>, other=<v there>))``."""
    b = arguments(kept.store)
    keywords = {}
    if not is_none(b["mask"]):
        other = repr(kept.other) if math.isfinite(kept.other) else f"{'-' if kept.other < 0 else ''}float('inf')"
        keywords = {"mask": copy.deepcopy(b["mask"]), "other": ast.parse(other, mode="eval").body}
    load = ast.Call(instantiate("tl.load", {}), [name_node(_address(kept))],
                    [ast.keyword(k, v) for k, v in keywords.items()])
    return tagged(assign(kept.name, instantiate("tg.widened(v)", {"v": load})),
                  Op("load", [name_node(_address(kept))], keywords), kept.store)
