"""``grad`` and ``vjp``: the public entry points of the kernel transform."""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import codegen
from .analysis import analyze
from .checks import LaunchCheck, LaunchValues
from .errors import NotDifferentiableError
from .frontend import normalize_kernel, normalize_tile_function
from .loops import classify_loops
from .reverse import build_backward
from .source import unwrap

CALLING_CONVENTION = """\
Launch it with the forward's grid and the forward's arguments, followed by one
shadow per output (d_<output>: the gradient of the loss with respect to that output,
read only) and one per wrt input (d_<input>: a zero-filled buffer with the input's
shape and strides, into which the gradient is accumulated atomically; float32 is
recommended for float16/bfloat16 inputs)."""


def shadow_dtype(dtype: Any) -> Any:
    """The dtype of a gradient buffer for a primal of ``dtype``: float32 for half types."""
    import torch

    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def defaults_of(jit_fn: Any) -> dict[str, Any]:
    """A kernel's parameters that have defaults, with them."""
    sig = inspect.signature(jit_fn.fn)
    return {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}


@dataclass(frozen=True, eq=False)
class BackwardKernel:
    """A derived backward kernel.

    ``src`` is its Python source; ``params`` its parameters: the forward's, then
    ``d_<name>`` for each output, then for each ``wrt`` input. Launch it like any
    Triton kernel, ``bwd[grid](*forward_args, *output_grads, *input_grads)``,
    with the forward's grid. Output shadows hold the incoming gradients; input
    shadows must be zero-filled by the caller (gradients are added atomically).
    """

    forward: Any
    kernel: Any
    src: str
    wrt: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...]
    store_axes: dict[str, frozenset[int]]  # output -> program axes its store addresses depend on
    launch_checks: tuple[LaunchCheck, ...] = ()  # conditions on the arguments for stores to stay apart
    _checked: set = field(default_factory=set, repr=False)  # (grid, argument values) the checks passed for

    @property
    def shadow_params(self) -> dict[str, str]:
        """Primal parameter -> its shadow parameter, outputs first."""
        forward = self.params[: len(self.params) - len(self.outputs) - len(self.wrt)]
        shadows = self.params[len(forward):]
        return dict(zip((*self.outputs, *self.wrt), shadows, strict=True))

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    @functools.cached_property
    def _forward_defaults(self) -> dict[str, Any]:
        return defaults_of(self.forward)

    def __getitem__(self, grid: Any):
        launch = self.kernel[grid]
        defaults = self._forward_defaults

        def run(*args: Any, **kwargs: Any) -> Any:
            # positional arguments fill the parameters not given by keyword, in order; when
            # there are too few, the forward's defaulted parameters take their defaults
            free = [p for p in self.params if p not in kwargs]
            if len(args) < len(free):
                free = [p for p in free if p not in defaults]
            if len(args) != len(free):
                raise TypeError(f"{self.name} takes {len(free)} positional arguments here "
                                f"({', '.join(free)}), got {len(args)}")
            named = {**defaults, **dict(zip(free, args, strict=True)), **kwargs}
            sizes = grid(named) if callable(grid) else grid
            self.check_grid(sizes)
            self.check_arguments(named, sizes)
            for name in self.wrt:  # an integer tensor has no gradient: say so, rather than return zeros
                dtype = getattr(named.get(name), "dtype", None)
                if dtype is not None and not dtype.is_floating_point:
                    raise TypeError(f"{self.name}: wrt names `{name}`, but the tensor passed there is {dtype}; "
                                    "only floating-point inputs have gradients")
            return launch(**named)

        return run

    def check_grid(self, grid: Any) -> None:
        """Refuse a grid in which several programs store to one output element.

        If an output's store address does not depend on a program axis, every program
        along that axis writes the same elements and the last one wins: only its values
        would deserve the gradient, which the derived kernel cannot tell apart.
        """
        sizes = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        for output, axes in self.store_axes.items():
            for axis, size in enumerate(sizes):
                if size > 1 and axis not in axes:
                    raise NotDifferentiableError(
                        f"a grid of {size} programs along axis {axis}, all storing to the same elements of "
                        f"`{output}`", file=self.forward.fn.__code__.co_filename,
                        line=self.forward.fn.__code__.co_firstlineno,
                        hint=f"make `{output}`'s store address depend on tl.program_id({axis}), "
                             "or launch one program along that axis")

    def check_arguments(self, named: dict[str, Any], grid: Any = (1,)) -> None:
        """Refuse a launch whose arguments let a store's lanes, programs or iterations reach one element
        (lanes.py: conditions it could not decide before the strides, block sizes and grid were known).
        A condition on values it cannot read (a local of the kernel) is let pass."""
        if not self.launch_checks:
            return
        sizes = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        key = (sizes, *[named.get(n) for n in self._checked_names])
        try:
            cached = key in self._checked  # a launch like an earlier one: ~1 us instead of ~12
        except TypeError:  # an unhashable argument: check every time
            key, cached = None, False
        launch = LaunchValues(named, sizes)
        for check in self.launch_checks:
            if cached and check.condition.cacheable:  # (checks reading tensor contents run every time)
                continue
            construct = check.failure(launch)
            if construct is not None:
                raise NotDifferentiableError(construct, file=check.where.file, line=check.where.line,
                                             hint=check.hint, source_line=check.where.text)
        if key is not None:
            if len(self._checked) > 4096:
                self._checked.clear()
            self._checked.add(key)

    @functools.cached_property
    def _checked_names(self) -> tuple[str, ...]:
        """The arguments the launch checks read."""
        return tuple(sorted({n for c in self.launch_checks if c.condition.cacheable for n in c.condition.names()}
                            & set(self.params)))

    def launch_notes(self) -> str:
        """What is decided on each launch's arguments, as comment lines (``tritongrad show`` prints them)."""
        if not self.launch_checks:
            return ""
        lines = ["# Checked on each launch's arguments (a launch where one fails is refused):"]
        lines += [f"#   {check}" for check in self.launch_checks]
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return f"BackwardKernel({self.name}, wrt={self.wrt}, outputs={self.outputs})"


_cache: dict[tuple, tuple[Any, Any]] = {}
_lock = threading.Lock()


def _cached(key: tuple, build):
    with _lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] is key[0]:
        return hit[1]
    value = build()
    with _lock:
        _cache[key] = (key[0], value)
    return value


def clear_cache() -> None:
    """Forget every derived kernel (a custom rule registered later changes what derivation gives)."""
    with _lock:
        _cache.clear()


def grad(kernel: Any, wrt: Sequence[str] | None = None, outputs: Sequence[str] | None = None) -> BackwardKernel:
    """Derive the backward kernel of a ``@triton.jit`` kernel.

    ``wrt``: the pointer parameters to differentiate with respect to (default: every
    pointer parameter that is only loaded and does not hold indices).
    ``outputs``: the pointer parameters whose stores are differentiated (default: every
    stored one). Raises :class:`NotDifferentiableError` for what cannot be handled.
    """
    jit_fn = unwrap(kernel)
    key = (jit_fn.fn, tuple(wrt) if wrt is not None else None, tuple(outputs) if outputs is not None else None)
    return _cached(key, lambda: _derive(jit_fn, key[1], key[2]))


def _derive(jit_fn: Any, wrt, outputs) -> BackwardKernel:
    program = normalize_kernel(jit_fn)
    analysis = analyze(program, wrt, outputs)
    backward = build_backward(analysis, classify_loops(analysis))
    name = f"{program.name}_bwd"
    doc = (f"Backward of `{program.name}`, derived by tritongrad.\n\n"
           f"wrt: {', '.join(analysis.wrt) or '(none)'}; outputs: {', '.join(analysis.outputs)}.\n"
           f"{CALLING_CONVENTION}\n")
    src = codegen.function_source(program, backward, name, _indent(doc), tile=False)
    kernel = codegen.compile_kernel(src, name, program)
    params = (*program.param_names(), *backward.shadow_params)
    axes = {k: frozenset(v) for k, v in analysis.store_axes.items()}
    return BackwardKernel(jit_fn, kernel, src, analysis.wrt, analysis.outputs, params, axes,
                          tuple(analysis.launch_checks))


def vjp(fn: Any, wrt: Sequence[int] = (0,)) -> Any:
    """The vector-Jacobian product of a tile-level ``@triton.jit`` helper.

    Returns a ``@triton.jit`` function taking ``fn``'s arguments followed by one
    cotangent per returned value, and returning the gradients of the arguments at
    positions ``wrt`` (a tuple when there are several). Its source is ``.src``
    of the returned function's ``tg_src`` attribute.
    """
    jit_fn = unwrap(fn)
    key = (jit_fn.fn, ("vjp", tuple(wrt)), None)
    return _cached(key, lambda: _derive_vjp(jit_fn, tuple(wrt)))


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


def _indent(text: str) -> str:
    return text.replace("\n", "\n    ")
