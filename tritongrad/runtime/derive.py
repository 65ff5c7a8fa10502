"""``grad`` and ``vjp``: the public entry points of the kernel transform. ``grad`` checks its arguments (``wrt``/
``outputs`` choice, determinism, decisive constexprs, kept outputs) into a derivation.py ``Request``, whose backward
kernel backward_kernel.py's ``derived`` gives, derived once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.analyze import analyze
from ..codegen import generate as codegen
from ..core.source import unwrap
from ..frontend.normalize import normalize_tile_function
from ..reverse.loop_plans import classify_loops
from ..reverse.sweep import build_backward
from .backward_kernel import BackwardKernel, derived
from .derivation import Request, cached, clear_cache, specialization

__all__ = ["BackwardKernel", "clear_cache", "grad", "vjp"]


def grad(kernel: Any, wrt: Sequence[str] | None = None, outputs: Sequence[str] | None = None, *,
         deterministic: bool = False, constexprs: Mapping[str, Any] | None = None,
         kept_outputs: Sequence[str] = ()) -> BackwardKernel:
    """Derive the backward kernel of a ``@triton.jit`` kernel.

    ``wrt``: the pointer parameters to differentiate with respect to (default: every
    pointer parameter that is only loaded and does not hold indices).
    ``outputs``: the pointer parameters whose stores are differentiated (default: every
    stored one). ``deterministic``: gradients bitwise identical from run to run (no atomic
    additions); a load whose gradient can only be added atomically is refused, naming it.
    ``constexprs``: values of constexpr parameters: the ``if`` branches they rule out are
    removed before anything is derived, as Triton compiles one kernel per value (a launch
    through the kernel's ``bwd[grid]``, ``gradients`` or ``tritongrad.op`` specializes by itself).
    ``kept_outputs``: output parameters that hold, whenever the backward runs, what the forward launch stored
    there (an op's launch record saves them): values it stored after a reduction are read back rather than recomputed
    (stored_outputs.py).
    A pointer the kernel updates in place (loaded, then stored at the same address) that ``wrt`` names is among
    the ``outputs`` too: its shadow takes the new values' gradient in and gives the old values'. Where the kernel
    reads back, in a later loop, what it stored there (analysis/in_place.py), the pointer is in both, and the
    backward also takes the tensor as the forward launch left it, ``<pointer>_stored`` after the shadows
    (``BackwardKernel.stored_params``; the pointer itself takes its values from before the launch).
    One name may be given as a string (``wrt="x_ptr"``).
    Raises :class:`NotDifferentiableError` for what cannot be handled, ValueError for ``wrt`` or ``outputs``
    naming something twice or naming no pointer the kernel loads (stores) through.
    """
    jit_fn = unwrap(kernel)
    values = specialization(jit_fn, constexprs or {})
    return derived(Request(jit_fn, _names("wrt", wrt), _names("outputs", outputs), deterministic, values,
                           tuple(sorted(kept_outputs))))


def _names(what: str, names: Sequence[str] | str | None) -> tuple[str, ...] | None:
    """``wrt`` or ``outputs`` as a tuple of distinct names (a string is one name, not its characters)."""
    if names is None:
        return None
    names = (names,) if isinstance(names, str) else tuple(names)
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise TypeError(f"{what} names parameters by their names (strings), not {type(name).__name__} {name!r}")
        if name in names[:i]:
            raise ValueError(f"{what} names `{name}` twice")
    return names


def vjp(fn: Any, wrt: Sequence[int] = (0,)) -> Any:
    """The vector-Jacobian product of a tile-level ``@triton.jit`` helper.

    Returns a ``@triton.jit`` function taking ``fn``'s arguments followed by one
    cotangent per returned value, and returning the gradients of the arguments at
    positions ``wrt`` (a tuple when there are several). Its source is ``.src``
    of the returned function's ``tg_src`` attribute.
    """
    jit_fn = unwrap(fn)
    key = (jit_fn.fn, ("vjp", tuple(wrt)), None)
    return cached(key, lambda: _derive_vjp(jit_fn, tuple(wrt)))


def _derive_vjp(jit_fn: Any, positions: tuple[int, ...]) -> Any:
    program = normalize_tile_function(jit_fn)
    params = program.param_names()
    try:
        wrt = tuple(params[i] for i in positions)
    except IndexError:
        raise ValueError(f"wrt={positions}: `{program.name}` has {len(params)} parameters") from None
    analysis = analyze(program, wrt, None, tile=True)
    backward = build_backward(analysis, classify_loops(analysis), tile=True)
    name = f"{program.name}_vjp"
    src = codegen.function_source(program, backward, name, "", tile=True)
    kernel = codegen.compile_kernel(src, name, program)
    kernel.tg_src = src
    return kernel

