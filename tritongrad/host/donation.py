"""Storage donation: an input's gradient written over the input's own memory where nothing but the op's autograd node
still holds it (a cross-entropy's ``logits.float()``, made inside a loss function: after the forward, the node's saved
tensor is its only holder), so that the input and its gradient are never alive together.

Where it may happen is decided once per plan (``candidates``: an input read by one launch through one parameter, all
of its storage, no output's but its own as the launch updated it in place) and per launch's backward variant
(``donor_slot``: the buffer holding no gradient yet (an input updated in place: its new values have none, as Liger's
loss-only cross-entropy's logits, whose ignored rows it zeroes), the input's gradient stored once per
element by one derived kernel, in the input's own dtype, no other step writing it, and that kernel updating the input
in place as analysis/in_place.py accepts an update: every load of the input followed, in its block, by the store of
its gradient to the same address under the same mask, so that each element is read before it is written, by the
lane that writes it, and by no other program). Whether it happens is decided per backward (``offered``): the node
saved its tensors through this module's hooks (each a detached alias of its own, so that the storage's use count
tells whether anyone else holds the memory: the caller, a view of it, another node), the storage's only holders are
the node's (``SOLE``), autograd frees the graph after this backward (``retain_graph`` false) and no graph of the
backward is built (``create_graph``). The buffer is then the saved tensor's memory (``donated``, asked where
host/backward.py and host/replay_backward.py make a gradient buffer). A second backward through the node is
autograd's error: it freed the saved tensors. Not in a checked backward (guard bands), a tuning trial, a CUDA graph
capture or a named op called through the dispatcher (its node saves without these hooks).
"""

from __future__ import annotations

import ast
import contextvars
import copy
import math
from typing import Any

import torch

from ..analysis.in_place import in_place_pointers
from ..analysis.pointers import pointers
from ..core.bounded import Bounded
from ..core.device import capturing
from ..core.ir import target_of
from ..core.source import Source
from ..frontend.normalize import normalize_kernel
from ..frontend.specialize import plain_value
from ..runtime.derivation import decisive_constexprs, hashable
from .shadows import in_order

# holders of a saved input's storage when the node alone holds it: the alias the pack hook kept, the tensor autograd
# unpacked from it for this backward, and the UntypedStorage object asking
SOLE = 3

# the saved slots whose memory this backward may write gradients into (set around a node's backward: offered)
donating: contextvars.ContextVar = contextvars.ContextVar("tritongrad_donating", default=frozenset())
taken = 0  # gradient buffers donated so far in this process (what tests and benchmarks see of it)

_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
_hooks = torch._C._autograd
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def candidates(plan: Any) -> frozenset[int]:
    """The saved slots whose memory may take an input's gradient (once per plan): a float input of at least
    ``DONATE_AT_LEAST`` bytes (a smaller call's node saves without the hooks) one launch alone reads,
    through one parameter, all of its storage's shadow as every view of that storage is (``_all_of_it``), not read
    back as a launch left it, kept for the backward."""
    if plan.donors is None:
        uses: dict[int, list] = {}
        for launch in plan.launches:
            for p, v in launch.views.items():
                uses.setdefault(v.key, []).append((launch, p))
        reread = {slot for launch in plan.launches for slot in launch.as_left.values()}
        found = set()
        for launch in plan.launches:
            for p in launch.params("inputs"):
                v, slot = launch.views[p], launch.slots.get(p)
                if (slot is None or slot in plan.unused or slot in reread or not v.dtype.is_floating_point
                        or math.prod(v.size) * v.dtype.itemsize < DONATE_AT_LEAST  # (donor_slot's, known here)
                        or len(uses[v.key]) != 1 or not _all_of_it(plan, v)):
                    continue
                found.add(slot)
        plan.donors = frozenset(found) if _keep_graph is not None and _use_count is not None else frozenset()
    return plan.donors


def _all_of_it(plan: Any, v: Any) -> bool:
    """Whether ``v`` is all of its storage's shadow in order and every other view the call has of that storage the
    same elements alike (the base of a view updated in place, which the op marks dirty: the input again, and the
    output), at most one of them an output (the input as the launch left it)."""
    if v.key not in plan.storages:  # (no memory: an empty tensor)
        return False
    seen = [u for u in (*plan.input_views, *plan.output_views) if u.key == v.key]  # (v among them)
    return (v in plan.input_views and [u.key for u in plan.output_views].count(v.key) <= 1
            and all(in_order(u, plan.storages) for u in seen))


# Buffers smaller than this are never donated: the check a donation needs (updates_in_place: the derived kernel
# normalized again) costs seconds of CPU once per kind of call, and saves nothing worth it on a small buffer.
DONATE_AT_LEAST = 1 << 20  # bytes


def donor_slot(plan: Any, step: Any, prepared: Any, p: str, args: dict, fill: bool, own: bool,
               written: frozenset = frozenset()) -> int | None:
    """The saved slot whose memory may take input ``p``'s gradient buffer in this step's backward (see the module's
    docstring), or None."""
    slot = step.launch.slots.get(p)
    if fill or not own or slot not in candidates(plan) or p not in step.sole:
        return None
    if p in written:  # (its buffer holds gradient already: an input updated in place whose new values have one)
        return None
    shadow, view = step.shadows[p], step.launch.views[p]
    if not plan.all_of_buffer(shadow) or plan.buffer_dtype(shadow, own) != view.dtype:
        return None
    if math.prod(view.size) * view.dtype.itemsize < DONATE_AT_LEAST:
        return None
    c = prepared.choices.get(p)
    parts = prepared.variant.parts
    if (c is None or not c.strategy.overwrites(c) or c.rereads or len(parts) != 1
            or parts[0].prologue is not None or p not in parts[0].written):
        return None
    return slot if updates_in_place(parts[0], p, args) else None


_safe: dict[tuple, bool] = Bounded()  # (derived kernel, input, decisive values) -> updates_in_place


def updates_in_place(part: Any, p: str, args: dict) -> bool:
    """Whether the derived kernel ``part``, its gradient parameter for ``p`` passed ``p``'s memory, is an update of
    ``p`` in place as analysis/in_place.py accepts one, each load of ``p`` an update (no reload, no load apart from
    the stores): analysed as the kernel whose first statement reads the gradient pointer as ``p`` (aliases.py's alias
    view), without the statements that touch only the backward's own scratch (state tapes; the slots of adjoints
    added after the kernel, which hold the gradient pointer's addresses, not its memory)."""
    kernel, shadow = part.kernel, part.shadows.get(p)
    values = {k: plain_value(args[k]) for k in decisive_constexprs(kernel) if k in args}
    key = (kernel.fn, p, tuple(sorted((k, hashable(v)) for k, v in values.items())))
    found = _safe.get(key)
    if found is None:
        found = _safe[key] = shadow is not None and _analysed(kernel, p, shadow, values)
    return found


def _analysed(kernel: Any, p: str, shadow: str, values: dict) -> bool:
    source = Source.of(kernel)
    tree = _WithoutScratch().visit(copy.deepcopy(source.tree))
    preamble = ast.parse(f"{shadow} = {p}").body[0]
    for node in ast.walk(preamble):
        node.lineno, node.col_offset = tree.lineno, tree.col_offset
    tree.body[:0] = [preamble]
    ast.fix_missing_locations(tree)
    view = copy.copy(kernel)
    view.tg_source = Source(source.name, tree, source.file, source.first_line, source.lines, source.scope)
    try:
        program = normalize_kernel(view, values)
        found = pointers(program)
        if p not in found.overwrites:  # (its gradient stored over it)
            return False
        place = in_place_pointers(program, found)
    except Exception:  # noqa: BLE001 (not shown to be an update: the buffer is allocated)
        return False
    updated = {name for names in place.updates.values() for name in names}
    return not place.reloads and all(target_of(s) in updated for s in found.loads.get(p, ()))


class _WithoutScratch(ast.NodeTransformer):
    """A derived kernel without its state tapes and later adds' slots: ``tg.tape_put``/``tg.add_later`` statements
    dropped, ``tg.tape_row`` assignments dropped, ``tg.tape_get(row, slot, like)`` read as ``like`` (of its shape and
    type; the analysis compares addresses and masks by their definitions, whatever a value is)."""

    def visit_Expr(self, node: ast.Expr) -> Any:
        if _helper(node.value) in ("add_later", "tape_put"):
            return None
        return self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> Any:
        if (_helper(node.value) or "").startswith("tape_row"):
            return None
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        if (_helper(node) or "").startswith("tape_get") and len(node.args) == 3:
            return node.args[2]
        return node


def _helper(e: ast.AST) -> str | None:
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and isinstance(e.func.value, ast.Name) \
            and e.func.value.id == "tg":
        return e.func.attr
    return None


# -- saving and offering ---------------------------------------------------------------------------


def _pack(t: torch.Tensor) -> tuple:
    return t.detach(), t._version  # (an alias of its own, sharing the version counter)


def _unpack(packed: tuple) -> torch.Tensor:
    alias, version = packed
    if alias._version != version:  # (autograd checks no version for tensors saved through hooks: this does)
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[{alias.dtype} {list(alias.shape)}] is at version {alias._version}; expected version {version} instead "
            "(a tensor a tritongrad.op keeps for its backward)")
    return alias


def apply(function_apply: Any, record: Any, *args: Any) -> Any:
    """``function_apply(record, *args)`` (an op's autograd.Function), its node saving through this module's hooks where
    the record's plan has candidates and no hooks of anyone else's are active (save_on_cpu, checkpointing: theirs stay
    theirs)."""
    if not candidates(record.plan) or not _hooks._saved_tensors_hooks_is_enabled() or capturing() \
            or _hooks._top_saved_tensors_default_hooks(True) is not None:
        return function_apply(record, *args)
    _hooks._push_saved_tensors_default_hooks(_pack, _unpack)
    try:
        return function_apply(record, *args)
    finally:
        _hooks._pop_saved_tensors_default_hooks()


def saving(plan: Any) -> bool:
    """Whether a node being made now saves through this module's hooks (asked in its forward)."""
    if not plan.donors:
        return False
    top = _hooks._top_saved_tensors_default_hooks(True)
    return top is not None and top[0] is _pack


def offered(plan: Any, saved: tuple) -> frozenset[int]:
    """The slots of a node's saved tensors (saved through this module's hooks) whose memory this backward may write
    gradients into: held by the node alone, the graph freed after this backward, no graph of it built."""
    if torch.is_grad_enabled() or _keep_graph() or capturing():
        return frozenset()
    # (an input requiring grad unpacks as a tensor of its own, not the alias: SOLE counts both)
    return frozenset(j for j in plan.donors
                     if saved[j].requires_grad and _use_count(saved[j].untyped_storage()._cdata) == SOLE)


def donated(saved: tuple | None, slot: int | None, shape: Any, dtype: torch.dtype, device: Any
            ) -> torch.Tensor | None:
    """The saved tensor of ``slot`` as a gradient buffer of this shape, dtype and device (contiguous), where this
    backward was offered its memory; else None (the buffer is allocated)."""
    if slot is None or saved is None or slot not in donating.get():
        return None
    t = saved[slot]
    if t.numel() != math.prod(shape) or t.dtype != dtype or t.device != torch.device(device) or not t.is_contiguous():
        return None
    global taken
    taken += 1
    return t.detach().view(shape)  # (the buffer's shape: the view's own, or flat where the call sees it reshaped)
