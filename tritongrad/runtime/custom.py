"""``tritongrad.custom_vjp``: a hand-written adjoint for a ``@triton.jit`` helper.

    @triton.jit
    def frac_grad(x, out, g):  # the helper's arguments, its result, the result's adjoint
        return g               # -> the adjoint of each differentiated argument

    @tritongrad.custom_vjp(frac_grad)
    @triton.jit
    def frac(x):
        return x % 1.0

A kernel calling ``frac`` is differentiated without looking inside it: the backward
kernel calls ``frac`` where the forward did, and ``frac_grad(x, out, g)`` for its
adjoint. ``wrt`` gives the positions of the arguments that receive gradients (default:
all); with several, the backward returns a tuple of their adjoints in that order. An
adjoint may have the arguments' broadcast shape: it is summed back to the argument's.
Helpers returning several values are not supported.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from ..core.operations import CUSTOM, custom_operation
from ..core.source import unwrap
from .derivation import clear_cache


def custom_vjp(helper_or_backward: Any, backward: Any = None, *, wrt: Sequence[int] | None = None) -> Any:
    """``custom_vjp(backward)`` decorates a helper; ``custom_vjp(helper, backward)`` registers one."""
    if backward is None:
        return lambda helper: _register(helper, helper_or_backward, wrt)
    return _register(helper_or_backward, backward, wrt)


def _register(helper: Any, backward: Any, wrt: Sequence[int] | None) -> Any:
    fn, bwd = unwrap(helper).fn, unwrap(backward)
    params = inspect.signature(fn).parameters
    names = list(params)
    clash = {"g", "out"} & set(names)
    if clash:
        raise ValueError(f"custom_vjp: `{fn.__name__}` has a parameter named {sorted(clash)[0]!r}, which the "
                         "backward's call uses for the result and its adjoint; rename it")
    positions = tuple(range(len(names))) if wrt is None else tuple(wrt)
    if any(not 0 <= i < len(names) for i in positions):
        raise ValueError(f"custom_vjp: wrt={positions}, but `{fn.__name__}` has {len(names)} parameters")
    call = f"{bwd.fn.__name__}({', '.join(names)}, out, g)"
    adjoints = {names[i]: call if len(positions) == 1 else f"{call}[{k}]" for k, i in enumerate(positions)}
    signature = ", ".join(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                          for p in params.values())
    CUSTOM[fn] = (custom_operation(signature, adjoints), bwd.fn.__name__, backward)
    clear_cache()  # backward kernels derived before the rule existed
    return helper
