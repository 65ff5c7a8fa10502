"""A launch passing one view of a tensor both to a pointer the kernel only loads and to one it only stores: an update
in place written through two names (a fused add + RMSNorm writing the sum ``x + r`` back into the residual: its
``S_ptr`` and ``R_ptr`` are one buffer; Liger-Kernel's, vLLM's).

Through two parameters, the kernel's loads and stores look unrelated, and the launch record would see a launch
overwriting memory it reads (a hazard). For this launch the kernel computes what its *alias view* computes: the same
kernel whose first statements read the stored pointer as the loaded one (``S_ptr = R_ptr``) and each integer parameter
as the first one the launch passes the same value (``S_row_stride = R_row_stride``: the strides of one view agree).
The view loads and stores one pointer, which analysis/in_place.py checks as any update in place (each load followed
by a store of its address and mask, or a reload of what the lane stored) or refuses naming the lines; the launch record
records the launch as the view's (its snapshot of the memory, its backward), and the forward runs as launched. The
view keeps the kernel's signature: the launch's arguments are the view's.
"""

from __future__ import annotations

import ast
import copy
import inspect
import types
from typing import Any

import torch

from ..core.bounded import Bounded
from ..core.source import Source
from .kernel_roles import KernelInfo

_views: dict[tuple, Any] = Bounded()  # (kernel function, aliases, integer groups) -> its alias view
_pairs: dict[Any, tuple] = Bounded()  # per Roles: the pointers it only overwrites, and those it only loads


def alias_view(kernel: Any, info: KernelInfo, args: tuple, kwargs: dict) -> Any | None:
    """The kernel's alias view for this launch (see the module's docstring), or None where no stored-only pointer
    is passed the view a loaded-only pointer is."""
    roles = info.roles
    pairs = _pairs.get(roles)
    if pairs is None:
        pairs = _pairs[roles] = (tuple(sorted(roles.overwrites - roles.loads)),
                                 tuple(sorted(roles.loads - roles.stores)))
    stored, loaded = pairs
    if not stored or not loaded:
        return None
    named, _ = info.named_arguments(args, kwargs)
    aliases = []
    for q in stored:
        t = named.get(q)
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        for p in loaded:
            u = named.get(p)
            if isinstance(u, torch.Tensor) and (u is t or _same_view(u, t)):
                aliases.append((q, p))
                break
    if not aliases:
        return None
    groups: dict[int, list[str]] = {}
    for p in info.params:
        v = named.get(p)
        if type(v) is int and p not in info.pointers:
            groups.setdefault(v, []).append(p)
    spec = (tuple(sorted(aliases)), tuple(tuple(g) for g in groups.values() if len(g) > 1))
    view = _views.get((kernel.fn, spec))
    if view is None:
        view = _views[(kernel.fn, spec)] = _view(kernel, *spec)
    return view


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride())


def _view(kernel: Any, aliases: tuple, groups: tuple) -> Any:
    """The kernel object whose source (``tg_source``, read by ``Source.of``) is the alias view's."""
    source = Source.of(kernel)
    tree = copy.deepcopy(source.tree)
    constexprs = {a.arg for a in tree.args.args
                  if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)}
    renames = [(q, p) for q, p in aliases]
    renames += [(b, g[0]) for g in groups for b in g[1:] if b not in constexprs and g[0] not in constexprs]
    preamble = [ast.parse(f"{b} = {a}").body[0] for b, a in renames]
    for statement in preamble:
        for node in ast.walk(statement):  # errors name the kernel's `def` line
            node.lineno, node.col_offset = tree.lineno, tree.col_offset
    tree.body[:0] = preamble
    view = copy.copy(kernel)
    fn = kernel.fn
    view.fn = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    view.fn.__signature__ = inspect.signature(fn)
    view.tg_source = Source(source.name, tree, source.file, source.first_line, source.lines, source.scope)
    view.tg_aliases = aliases
    return view
