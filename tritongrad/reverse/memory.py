"""Adjoints of memory operations: a load's adjoint reaches the input's shadow, a store's reads the output's.

- a store of an output: the adjoint of the stored value is loaded from the output's
  shadow with the store's mask (masked-off lanes read zero); for a tensor updated in place
  (analysis.in_place_pointers; or named in wrt and outputs and stored without a load by this
  specialization: ``Analysis.in_place``) the shadow is then zeroed there, the loads' adjoints adding
  the gradient of the values the store overwrote (none where nothing loads them); where the load the
  store overwrites is stored (the store strategy), no zeros: that store replaces the gradient, after a
  barrier;
- a load of a ``wrt`` input: its adjoint is written by the strategy chosen for the input (the kernel
  variant being built: writes/strategies.py emits it, calling back into the sweep for the names and
  partial sums it needs); where the load's ``other`` has a gradient, the adjoint of the lanes its mask
  leaves out goes to ``other``. A reload (what the kernel stored over a tensor it updates in place, read
  back in a later loop: analysis/in_place.py) adds its adjoint into the shadow, to the new values' gradient
  there, without atomics (that lane of that program alone wrote the element), then a barrier: the store's
  adjoint, reversed after it, reads the sum from other threads' lanes;
- tensor descriptors: a ``desc.store``'s adjoint reads ``d_desc.load(offsets)``; a ``desc.load``'s adds
  ``d_desc.atomic_add(offsets, g)`` where descriptors can add, or, where each element is reached once (the store
  strategy), is stored as a pointer load's at the block's addresses in the shadow, those outside the tensor masked.
"""

from __future__ import annotations

import ast
import copy

from ..analysis.addresses import descriptor_made
from ..core.ir import (
    arguments,
    call_statement,
    construct_origin,
    copy_structured,
    is_none,
    name_node,
    names_in,
    op_of,
    refuse,
    statements,
    stored_value,
    target_of,
)
from ..core.operations import instantiate, operation_of
from ..frontend.blockptr import block_addresses, block_mask
from ..writes.strategies import RELAXED, LaterAdds, add_without_atomics
from .persistent import PartialSum
from .rereads import Deferred, MergePoint, NotMergeable


class MemoryAdjoints:
    """Loads' and stores' adjoints, written into a :class:`sweep.BackwardBuilder`'s sweep; what a strategy's code
    needs of the sweep (strategies.Sweep)."""

    def __init__(self, builder):
        self.builder = builder  # the sweep this writes memory adjoints into (sweep.BackwardBuilder)
        self.barrier_due = False  # an in-place shadow read where a load's adjoint will store: a barrier before
        # the next write to an in-place shadow (zero_in_place)

    def emit(self, stmt: ast.stmt) -> None:  # (strategies.Sweep: what a strategy's code is emitted through)
        self.builder.emit(stmt)

    def reverse_load(self, stmt: ast.stmt, t: str) -> None:
        self.reverse_load_other(stmt)
        b = arguments(stmt)
        analysis = self.builder.analysis
        if analysis.pointer_base[b["pointer"].id] not in analysis.wrt:  # active through `other` only
            return
        shadow, g = name_node(self.builder.shadow_name(b["pointer"].id)), name_node(self.builder.g_of(stmt))
        param = self.builder.analysis.pointer_base[b["pointer"].id]
        choice = self.builder.choices[param]
        later = target_of(stmt) in choice.later
        if not later:  # (where only later adds write, the written load's adjoint is zero: the buffer is zero-filled)
            self.builder.written_inputs.add(param)
        self.barrier_before_writing(param)
        if operation_of(op_of(stmt)).descriptor:
            if not choice.strategy.stores:  # a tile's add through the descriptor
                self.builder.emit(self.descriptor_accumulate(stmt, shadow, b["offsets"], g))
                return
            # written once: as a pointer load's, at the block's addresses and mask in the shadow
            addresses, mask = (ast.parse(t, mode="eval").body for t in self.descriptor_block(stmt, b["offsets"]))
            shadow, b = self.named(f"{g.id}_at", addresses), {"mask": self.named(f"{g.id}_at_mask", mask)}
        if target_of(stmt) in analysis.reloads:  # what it read back: added to the stored value's gradient there,
            add_without_atomics(self, shadow, g, b["mask"])  # which the store's adjoint
            self.builder.emit(call_statement("tl.debug_barrier"))  # reads after every thread added
            return
        if choice.rereads:
            g = self.merged(stmt, param, choice.rereads, shadow, g)
            if g is None:
                return
        choice.strategy.emit(self, stmt, param, shadow, g, b["mask"], later)

    def merged(self, stmt: ast.stmt, param: str, rereads: tuple[str, ...], shadow: ast.Name,
               g: ast.Name) -> ast.Name | None:
        """A load of an input read again at its address in sibling loops (rereads.py): a later one's adjoint is
        not written here (None); the first's is named as the total the others' are added to."""
        plan = next((p for p in self.builder.loop_plans.values() if any(t is stmt for t in p.node.body)), None)
        if plan is None or plan.nonlinear:
            raise NotMergeable(param, "a loop around its loads carries nonlinear state")
        if target_of(stmt) in rereads:
            names = frozenset({g.id, shadow.id, *names_in(arguments(stmt)["mask"])})
            self.builder.deferred.append(Deferred(param, g.id, names))
            return None
        total = self.named(f"{g.id}_all", g)
        deferred = [d for d in self.builder.deferred if d.param == param]
        self.builder.deferred = [d for d in self.builder.deferred if d.param != param]
        self.builder.merge_points.append(MergePoint(param, total.id, deferred))
        return total

    def adjoint_of(self, stmt: ast.stmt) -> str:
        return self.builder.adjoint[target_of(stmt)]

    def named(self, base: str, value: ast.expr) -> ast.Name:
        """``<fresh name from base> = value``, emitted; the name."""
        name = self.builder.namer.fresh(base)
        self.builder.emit(ast.Assign(targets=[ast.Name(name, ast.Store())], value=copy.deepcopy(value)))
        return name_node(name)

    def add_later(self, stmt: ast.stmt, param: str, shadow: ast.Name, g: ast.Name) -> None:
        """Keep the load's adjoint and addresses in this program's slots: added after the kernel, when the
        input's written-once load has written its gradient (strategies.LaterAdds)."""
        adjoint = self.builder.adjoint[target_of(stmt)]
        fresh = self.builder.namer.fresh
        later = LaterAdds(param, fresh(f"{adjoint}_later"), fresh(f"{adjoint}_later_at"),
                          self.builder.analysis.shapes[target_of(stmt)])
        self.builder.later_adds.append(later)
        mask = arguments(stmt)["mask"]
        self.builder.emit(ast.Expr(instantiate("tg.add_later(values, offsets, base, at, g, mask)", {
            "values": name_node(later.values), "offsets": name_node(later.offsets),
            "base": name_node(self.builder.shadow_name(param)), "at": shadow, "g": g,
            "mask": ast.Constant(True) if is_none(mask) else mask})))

    def partial_sum(self, stmt: ast.stmt, shadow: str, mask: ast.expr) -> str:
        """The register accumulator of a load's adjoint over the rows of a persistent program."""
        total = self.builder.namer.fresh(f"{self.builder.adjoint[target_of(stmt)]}_sum")
        self.builder.partial_sums.append(PartialSum(total, shadow, copy.deepcopy(mask)))
        return total

    def reverse_load_other(self, stmt: ast.stmt) -> None:
        """``tl.load(p, mask=m, other=v)`` is ``v`` in the lanes ``m`` leaves out: when ``v`` has a gradient,
        those lanes' adjoints are its (``tl.where(m, 0.0, g)``, summed back to ``v``'s shape)."""
        b = arguments(stmt)
        other, mask = b.get("other"), b.get("mask")
        if other is None or mask is None or is_none(mask) or not self.builder.analysis.is_active(other):
            return
        g = name_node(self.builder.g_of(stmt))
        contribution = instantiate("tl.where(m, 0.0, g)", {"m": copy.deepcopy(mask), "g": g})
        if not self.builder.same_shape(other.id, target_of(stmt)):
            contribution = instantiate("tg.unbroadcast(c, x)", {"c": contribution, "x": other})
        self.builder.accumulate(other.id, contribution)

    def descriptor_accumulate(self, stmt: ast.stmt, shadow: ast.Name, offsets: ast.expr, g: ast.Name) -> ast.If:
        """``d_desc.atomic_add(offsets, g)``; where descriptors cannot add (float64 shadows, Triton's
        interpreter: decided when the kernel compiles), pointer atomics on the block's addresses, the
        elements outside the tensor masked."""
        addresses, mask = self.descriptor_block(stmt, offsets)
        text = (f"if tg.DESCRIPTOR_ATOMICS and {shadow.id}.dtype != tl.float64:\n"
                f"    {shadow.id}.atomic_add({ast.unparse(offsets)}, {g.id}.to({shadow.id}.dtype))\n"
                f"else:\n"
                f"    tl.atomic_add({addresses}, {g.id}, mask={mask}, sem='{RELAXED}')")
        return ast.parse(text).body[0]

    def descriptor_block(self, stmt: ast.stmt, offsets: ast.expr) -> tuple[str, str]:
        """The addresses in the shadow of a descriptor load's block, and the mask of those inside the tensor."""
        b = arguments(self.descriptor_definition(stmt, arguments(stmt)["pointer"].id))
        sizes, strides, block = (b[k].elts for k in ("shape", "strides", "block_shape"))
        indices = [f"({ast.unparse(o)} + tl.arange(0, {ast.unparse(n)}))" for o, n in zip(offsets.elts, block,
                                                                                          strict=True)]
        base = ast.unparse(name_node(self.builder.shadow_name(b["base"].id)))
        return (block_addresses(base, indices, [ast.unparse(s) for s in strides]),
                block_mask(indices, [ast.unparse(s) for s in sizes]))

    def descriptor_definition(self, stmt: ast.stmt, name: str) -> ast.stmt:
        """The ``tl.make_tensor_descriptor`` statement a descriptor comes from (analysis/addresses.py)."""
        made = descriptor_made(name, self.builder.defs)
        if made is None:
            raise refuse(construct_origin(stmt), f"a load through the descriptor `{name}`, which has several "
                         "definitions", "make each tensor descriptor once, with one name")
        return made

    def reverse_store(self, stmt: ast.stmt) -> None:
        op = op_of(stmt)
        b = arguments(stmt)
        base = self.builder.analysis.pointer_base[b["pointer"].id]
        if base not in self.builder.analysis.outputs:
            return
        value = stored_value(stmt)
        if not self.builder.analysis.is_active(value):
            if base in self.builder.analysis.in_place:  # what it overwrote has no gradient from the new values
                self.builder.comment_for(stmt)
                self.zero_in_place(stmt)
            return
        if operation_of(op).memory not in ("store", "accumulate"):
            raise refuse(construct_origin(stmt), f"`{op.kind}` of a differentiated value",
                         "only tl.store and tl.atomic_add outputs can be differentiated")
        self.builder.comment_for(stmt)
        address = b["pointer"].id
        shadow = name_node(self.builder.shadow_name(address))
        if op.kind.startswith("desc_"):  # out-of-bounds elements read as zero, as the forward dropped them
            incoming = instantiate("d.load(offsets)", {"d": shadow, "offsets": b["offsets"]})
        else:
            keywords = []
            if not is_none(b["mask"]):
                keywords = [ast.keyword("mask", copy.deepcopy(b["mask"])), ast.keyword("other", ast.Constant(0.0))]
            incoming = ast.Call(instantiate("tl.load", {}), [shadow], keywords)
        incoming = instantiate("tg.widened(g)", {"g": incoming})  # adjoints in float32 or wider
        if not self.builder.same_shape(value.id, address):
            incoming = instantiate("tg.unbroadcast(c, x)", {"c": incoming, "x": value})
        self.builder.accumulate(value.id, incoming)
        if base in self.builder.analysis.in_place:  # the values it overwrote get their gradient here from the loads
            self.zero_in_place(stmt)  # only

    def zero_in_place(self, stmt: ast.stmt) -> None:
        """Zeros where a store overwrote an input updated in place: its shadow held the new values' gradient (read by
        now), and the loads' adjoints add the gradient of the values it held before. Where the load it overwrote
        (same address and mask) has its adjoint stored (``stores_over``), that store sets these elements: no zeros,
        but a barrier before the next write to an in-place shadow (``barrier_before_writing``), so that every thread
        has read the new values' gradient before it is replaced."""
        b = arguments(stmt)
        if any(self.stores_over(t) for t in self.builder.analysis.updates.get(id(stmt), ())):
            self.barrier_due = True  # (one barrier for the reads since the last: before the next write)
            return
        masked = {} if is_none(b["mask"]) else {"mask": b["mask"]}
        self.builder.emit(call_statement("tl.store", name_node(self.builder.shadow_name(b["pointer"].id)),
                                         ast.Constant(0.0), **masked))
        self.builder.emit(call_statement("tl.debug_barrier"))  # read and zeroed by every thread before the loads'
        # adjoints add
        self.barrier_due = False

    def barrier_before_writing(self, param: str) -> None:
        """Before a write to an input updated in place: the barrier its reads since the last one are due (each
        element's new values' gradient is read by its store's adjoint, in the same block before its load's)."""
        if self.barrier_due and param in self.builder.analysis.in_place:
            self.builder.emit(call_statement("tl.debug_barrier"))
            self.barrier_due = False

    def stores_over(self, load: str) -> bool:
        """Whether the adjoint of the load with result ``load``, of an input updated in place, is stored at its
        addresses (the store strategy: each element reached once), setting the gradient there whole: the zeros of
        the store that overwrites it are left to it. (A load no adjoint reaches then stores zeros:
        ``store_zero_adjoint``.)"""
        analysis = self.builder.analysis
        param = next((p for p, loads in analysis.loads.items() if any(target_of(s) == load for s in loads)), None)
        choice = self.builder.choices.get(param)
        return (param in analysis.in_place and choice is not None and choice.strategy.overwrites(choice)
                and load not in choice.later and load in analysis.active and load not in analysis.reloads)

    def zero_stores(self, block: list[ast.stmt], load: ast.stmt) -> list[ast.stmt]:
        """Zeros stored at the addresses ``load`` reads in ``block`` (the store strategy's ``fill``: the branch it is in
        computes them, for the programs that take the other branch; the loops around it repeated: sweep.py's
        ``reverse_if``)."""
        b = arguments(load)
        masked = {} if is_none(b["mask"]) else {"mask": copy.deepcopy(b["mask"])}
        inner: list[ast.stmt] = [ast.Expr(ast.Call(instantiate("tl.store", {}), [
            name_node(self.builder.shadow_name(b["pointer"].id)), ast.Constant(0.0)],
            [ast.keyword(k, v) for k, v in masked.items()]))]
        for s in block:
            if s is load:
                return self.builder.recompute(block, inner) + inner
            if isinstance(s, ast.For) and any(x is load for x in statements(s.body)):
                loop = copy_structured(s, target=copy.deepcopy(s.target), iter=copy.deepcopy(s.iter),
                                       body=self.zero_stores(s.body, load))
                return self.builder.recompute(block, [loop]) + [loop]
        raise AssertionError("the load is not in the block")

    def store_zero_adjoint(self, stmt: ast.stmt) -> None:
        """A load ``stores_over`` says is stored, that no adjoint reached (its value reaches the outputs only
        through a stabilizer, say): zeros at its addresses, in place of its store's."""
        self.builder.comment_for(stmt)
        b = arguments(stmt)
        masked = {} if is_none(b["mask"]) else {"mask": b["mask"]}
        self.builder.written_inputs.add(self.builder.analysis.pointer_base[b["pointer"].id])
        self.barrier_before_writing(self.builder.analysis.pointer_base[b["pointer"].id])
        self.builder.emit(call_statement("tl.store", name_node(self.builder.shadow_name(b["pointer"].id)),
                                         ast.Constant(0.0), **masked))

