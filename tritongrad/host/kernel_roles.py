"""What an op reads of a kernel (``KernelInfo``: its parameters, defaults, whether it is interpreted, its pointer
parameters by role and whether it has a loop: runtime/summary.py's summary of derivation's front half), worked out
once per kernel (``kernel_info``; a kernel the analysis cannot read gets ``roles=None`` and the error, raised only
where a launch of it needs a backward).
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Any

from ..core.bounded import Bounded
from ..core.errors import NotDifferentiableError
from ..runtime.backward_kernel import defaults_of
from ..runtime.derivation import hashable, specialization
from ..runtime.summary import Roles, read_unchanged_in, summarize

__all__ = ["KernelInfo", "Roles", "kernel_info", "kernel_infos", "read_as_left"]


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[str, ...]
    defaults: dict[str, Any]
    interpreted: bool
    roles: Roles | None  # None: the kernel could not be analysed (``error`` says why)
    error: Exception | None
    keywords: frozenset[str] = frozenset()  # keyword arguments that are parameters (the rest are launch options)
    pointers: frozenset[str] = frozenset()  # pointer parameters, where the roles are known
    loops: bool = True  # whether it has a loop (only then may its forward keep state for the backward: augment.py)

    def named_arguments(self, args: tuple, kwargs: dict) -> tuple[dict[str, Any], dict[str, Any]]:
        """A launch's arguments by parameter name, and its launch options (num_warps, ...)."""
        named = dict(zip(self.params, args, strict=False))
        options = {}
        for k, v in kwargs.items():
            if k in self.keywords:
                named[k] = v
            else:
                options[k] = v
        return named, options

    def launch_arguments(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """A launch's arguments all by keyword, as a derived kernel's launch takes them: every parameter's value (its
        default where not passed) and the launch options."""
        return {**self.defaults, **dict(zip(self.params, args, strict=False)), **kwargs}

    def with_defaults(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """Every parameter's value at a launch: its default, else the argument passed (launch options left out)."""
        return {**self.defaults, **self.named_arguments(args, kwargs)[0]}


kernel_infos: dict[Any, KernelInfo] = {}  # kernel function -> its KernelInfo (kernel_info)
_infos_lock = threading.Lock()


def kernel_info(kernel: Any) -> KernelInfo:
    """Cached per kernel: its parameters and roles (the only AST work, once per kernel)."""
    info = kernel_infos.get(kernel.fn)
    if info is None:
        info = _analyse(kernel)
        with _infos_lock:
            kernel_infos[kernel.fn] = info
    return info


def _analyse(kernel: Any) -> KernelInfo:
    sig = inspect.signature(kernel.fn)
    defaults = defaults_of(kernel)
    roles, error, has_loops = None, None, True
    try:
        summary = summarize(kernel)  # every specialization together
        roles, has_loops = summary.roles, summary.loops
        if summary.error is not None:
            raise summary.error
    except NotDifferentiableError as e:  # a construct the core does not handle yet: raised if the launch needs a
        error = e  # backward (planning.Planner.plan: when a tensor it is passed requires grad)
    except Exception as e:  # the analysis itself failed: said as plainly
        error = NotDifferentiableError(f"kernel `{kernel.fn.__name__}`: tritongrad cannot read what it does with its "
                                       f"arguments ({type(e).__name__}: {e})", file=kernel.fn.__code__.co_filename,
                                       line=kernel.fn.__code__.co_firstlineno)
        error.__cause__ = e
    interpreted = type(kernel).__name__ == "InterpretedFunction"
    params = tuple(sig.parameters)
    return KernelInfo(kernel.fn.__name__, params, defaults, interpreted, roles, error,
                      keywords=frozenset(params) | frozenset(defaults),
                      pointers=roles.pointers if roles is not None else frozenset(), loops=has_loops)


_unchanged: dict[tuple, frozenset[str]] = Bounded()  # (kernel function, decisive constexprs' values) -> pointers


def read_as_left(kernel: Any, named: dict[str, Any]) -> frozenset[str]:
    """The pointers a launch updates in place whose every load reads an element no store of it writes, in the
    specialization it runs (``named``: its arguments by parameter, defaults included; its decisive constexprs decide
    it: a flag such as a cross-entropy's HAS_GRADIENTS decides whether a later pass overwrites what the loads read):
    analysis/in_place.py's ``read_unchanged``. The launch record takes no copy of them; their backward reads the tensor
    as the launch left it. Once per kernel and those values (the kernel normalized again, specialized)."""
    values = specialization(kernel, named)
    key = (kernel.fn, tuple((k, hashable(v)) for k, v in values.items()))
    found = _unchanged.get(key)
    if found is None:
        try:
            found = read_unchanged_in(kernel, values)
        except Exception:  # (not analysable: copied, as any update is; the backward says why where it needs one)
            found = frozenset()
        _unchanged[key] = found
    return found
