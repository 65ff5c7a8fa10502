"""Launching a kernel again without Triton's per-call argument binding.

``kernel[grid](**args)`` binds and specializes every argument on each call: on an H200's host 19-37 µs for an
18-argument backward kernel, of which its compiled launcher takes 6-11 (benchmarks/host_parts.py). A launch
made again with the same non-tensor arguments and grid (a backward's kernels, which ``host/launcher.Launcher`` keeps;
an op's forward launches, which the launch record keys on their recorded arguments) changes only its tensors, and of a
tensor whose dtype is fixed Triton specializes on one property: whether its address is a multiple of 16. So a
:class:`Relauncher` keeps the compiled kernel per those properties (and the current device) and calls its
launcher directly, as Triton's own ``run`` ends; ``Relauncher.launch`` takes the values Triton binds as they are
(host/replay.py passes them without naming each). The first launch of each key, and every launch where Triton's
internals are not the ones this was written against (another version, the interpreter's kernels), go through
Triton. ``TRITONGRAD_DIRECT_LAUNCH=0`` turns it off.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import triton.language as tl
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from ..core.bounded import Bounded
from ..core.device import recorded

try:
    from triton import knobs
except ImportError:  # an older Triton, whose run launches otherwise: nothing is launched directly
    knobs = None

ENV = "TRITONGRAD_DIRECT_LAUNCH"

# the end of Triton's JITFunction.run that a direct launch repeats (whitespace removed)
_LAUNCH = ("launch_metadata=kernel.launch_metadata(grid,stream,*bound_args.values())",
           "kernel.run(grid_0,grid_1,grid_2,stream,kernel.function,kernel.packed_metadata,launch_metadata,"
           "knobs.runtime.launch_enter_hook,knobs.runtime.launch_exit_hook,*bound_args.values())")


@functools.cache
def supported() -> bool:
    """Whether this Triton launches a compiled kernel as a direct launch does."""
    if os.environ.get(ENV) == "0" or os.environ.get("TRITON_INTERPRET") == "1" or knobs is None:
        return False
    try:
        run = inspect.getsource(getattr(JITFunction.run, "__wrapped__", JITFunction.run))
    except (OSError, TypeError):
        return False
    run = "".join(run.split())
    return all(line in run for line in _LAUNCH)


class Relauncher:
    """One kernel launched on one grid with the same non-tensor arguments: its compiled kernels by the
    launch's device and the 16-byte alignment of each tensor argument."""

    __slots__ = ("kernel", "grid", "names", "tensors", "compiled", "direct")

    def __init__(self, kernel: Any, grid: tuple[int, ...]):
        self.kernel, self.grid = kernel, grid
        self.names: tuple[str, ...] = tuple(getattr(kernel, "arg_names", ()))  # Triton's bound order
        self.tensors: tuple[int, ...] | None = None  # positions of tensor arguments, once seen
        self.compiled: dict[tuple, Any] = Bounded(16)  # alignments are few; a bound on what a kernel keeps
        self.direct = supported() and _jit_function(kernel) and not kernel.pre_run_hooks

    def __call__(self, args: dict[str, Any], triton_launch: Callable[[], Any] | None = None) -> Any:
        """Launch with ``args`` (every parameter by name, and launch options); ``triton_launch``: the same launch
        through Triton, returning its compiled kernel (by default ``kernel[grid](**args)``). Returns the compiled
        kernel, as Triton's launch does."""
        if not self.direct or recorded():  # (a recorded backward: through Triton's run, where the hook sees it)
            return self._triton(args, triton_launch)
        values = [args[n] for n in self.names]
        compiled = self.launch(values)
        if compiled is None:
            return self._first(args, values, triton_launch)
        return compiled

    def launch(self, values: list | tuple) -> Any:
        """The direct launch of ``values`` (every parameter's, in Triton's bound order: ``names``), returning the
        compiled kernel; None where it cannot be (not ``direct``, or the first launch of its alignments: then
        ``__call__`` launches it through Triton)."""
        if not self.direct or recorded():  # (a recorded backward: through Triton's run, where the hook sees it)
            return None
        device = current_device()
        tensors = self.tensors
        if tensors is None:
            tensors = self.tensors = tuple(i for i, v in enumerate(values) if hasattr(v, "data_ptr"))
        compiled = self.compiled.get((device, *[values[i].data_ptr() % 16 == 0 for i in tensors]))
        if compiled is None:
            return None
        stream = current_stream(device)
        grid = self.grid
        runtime = knobs.runtime
        compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                     compiled.function, compiled.packed_metadata, compiled.launch_metadata(grid, stream, *values),
                     runtime.launch_enter_hook, runtime.launch_exit_hook, *values)
        return compiled

    def _triton(self, args: dict[str, Any], triton_launch: Callable[[], Any] | None) -> Any:
        return triton_launch() if triton_launch is not None else self.kernel[self.grid](**args)

    def _first(self, args: dict[str, Any], values: list, triton_launch: Callable[[], Any] | None) -> Any:
        """Triton's launch; its compiled kernel kept for the device and the alignments of ``values`` where Triton
        binds exactly ``values`` and the kernel reads no global values (Triton checks on each launch that they have
        not changed)."""
        device = current_device()
        if self.tensors is None:
            self.tensors = tuple(i for i, v in enumerate(values) if hasattr(v, "data_ptr"))
        key = (device, *[values[i].data_ptr() % 16 == 0 for i in self.tensors])
        compiled = self._triton(args, triton_launch)
        if not hasattr(compiled, "run"):  # not launched (a dry run)
            return compiled
        if getattr(self.kernel, "used_global_vals", None):
            self.direct = False
            return compiled
        try:
            bound = list(self.kernel.device_caches[device][4](**args)[0].values())
        except Exception:  # not the binder this was written against: Triton's launch from now on
            self.direct = False
            return compiled
        if len(bound) != len(values) or not all(map(_same, bound, values)):
            self.direct = False
            return compiled
        self.compiled[key] = compiled
        return compiled


def _jit_function(kernel: Any) -> bool:
    """Whether the kernel is compiled by the ``JITFunction.run`` checked in ``supported`` (not interpreted)."""
    return isinstance(kernel, JITFunction)


def plain_values(values: tuple) -> bool:
    """Whether non-tensor launch arguments are values a key can compare (numbers, strings, None, Triton's dtypes and
    constexprs), not objects compared by identity."""
    return all(v is None or isinstance(v, (int, float, str, tl.dtype, tl.constexpr)) for v in values)


def current_device() -> int:
    """The device Triton launches on (its current one)."""
    return driver.active.get_current_device()


def current_stream(device: int) -> Any:
    return driver.active.get_current_stream(device)


def _same(a: Any, b: Any) -> bool:
    return a is b or not hasattr(a, "data_ptr") and not hasattr(b, "data_ptr") and a == b
