"""Triton's launch entry points, patched once (``install``), and where each launch goes.

Outside an op the current launch record is ``None`` and a launch pays one ContextVar read. Inside an op
each launch of a ``@triton.jit`` kernel (compiled or interpreted) is recorded on the current
``launch_record.LaunchRecord`` at the innermost ``run``, after ``@triton.autotune`` and ``@triton.heuristics``
have added their constexprs, so the backward recomputes the forward with the config the autotuner
chose. Autotuner benchmarking runs are not recorded. While a named op's host function runs without
a launch record its launches are gathered (``collecting``: issued through ``wrap_triton``, run, or skipped),
and while fake tensors infer its shapes they are skipped (``dry_run``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from ..codegen.generate import self_contained
from ..core.errors import OpError
from ..runtime.augment import Keeping, keeping_of
from .configs import current_heuristics
from .host_descriptors import has_host_descriptors
from .kernel_roles import kernel_info
from .launch_record import current_autotuner, current_record

DRY = object()  # current "record" while shapes are inferred with fake tensors: launches are skipped


def active() -> bool:
    """Whether launches are being recorded (or skipped) by an enclosing op."""
    return current_record.get() is not None


@contextlib.contextmanager
def dry_run():
    """Run a host function without launching anything (fake-tensor shape inference)."""
    token = current_record.set(DRY)
    try:
        yield
    finally:
        current_record.reset(token)


class Launches:
    """The current "record" while a named op's host function runs under ``collecting``: its launches,
    each ``(kernel, grid, args, kwargs)``, and the tensors they were passed (by identity, in order of
    first appearance). ``mode``: "wrap" issues each launch as ``torch.library.wrap_triton(kernel)[grid]``
    (what torch.compile traces inside a triton_op), "run" launches it, "skip" does not (the launches'
    arguments are all that is wanted). ``tuned``: an autotuner was launched (in "skip" mode the config
    it would choose, which the backward needs, is unknown). ``heuristics``: per launch, the
    ``@triton.heuristics`` that ran it, or None (a launch record recording it is told: configs.py). "inner" runs
    each launch as "run" does, but collects an autotuner's launch where it runs its chosen config (forward mode's
    tangent kernels take the config's constexprs). ``constants``: tensors launches read whose values depend on no
    input (a stand-in, host/remake.py), by id: forward mode gives them zero tangents. ``keep_states``: launches
    whose backward reads state tapes run as their augmented forwards (``keeping``; ``tapes``, the buffers)."""

    def __init__(self, mode: str, name: str = "", keep_states: bool = False):
        self.mode, self.name = mode, name  # name: the op's, for errors
        self.keep_states = keep_states
        self.kept: dict[int, Keeping] = {}  # call index -> how it keeps state tapes (keep_states: ``keeping``)
        self.tapes: list[torch.Tensor] = []  # the kept launches' tape buffers, in order ("run" and "wrap")
        self.calls: list[tuple] = []
        self.tensors: dict[int, torch.Tensor] = {}
        self.constants: set[int] = set()
        self.tuned = False
        self.heuristics: list[Any] = []

    def add(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> None:
        self.calls.append((kernel, grid, args, kwargs))
        self.heuristics.append(current_heuristics.get())
        for v in (*args, *kwargs.values()):
            if isinstance(v, torch.Tensor):
                self.tensors.setdefault(id(v), v)

    def keeping(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> Keeping | None:
        """With ``keep_states`` (a named op's saving forward, and its backward finding what that saved), how the
        latest launch keeps the state tapes its backward reads (runtime/augment.py), as a launch record's launch
        would: else the backward records them itself, another pass over the loop."""
        if not self.keep_states:
            return None
        info = kernel_info(kernel)
        if info.roles is None or not info.loops or info.roles.in_place or has_host_descriptors(args, kwargs):
            return None
        named = info.with_defaults(args, kwargs)
        found = keeping_of(kernel, named, tuple(grid(named) if callable(grid) else grid))
        if found is not None:
            self.kept[len(self.calls) - 1] = found
        return found

    def intermediates(self, args: Sequence, outputs: Sequence) -> list[torch.Tensor]:
        """The tensors launches were passed that are neither the op's arguments nor its outputs."""
        known = {id(v) for v in (*args, *outputs)}
        return [t for i, t in self.tensors.items() if i not in known]


@contextlib.contextmanager
def collecting(mode: str, name: str = "", keep_states: bool = False):
    """``with collecting("wrap" | "run" | "inner" | "skip", op_name) as launches:`` (see ``Launches``)."""
    launches = Launches(mode, name, keep_states)
    token = current_record.set(launches)
    try:
        yield launches
    finally:
        current_record.reset(token)


def wrap_triton_enabled() -> bool:
    """False while a triton_op runs on real tensors (torch disables wrap_triton there)."""
    from torch._library.triton import is_wrap_triton_enabled

    return is_wrap_triton_enabled()


def _wrapped_launch(launches: Launches, kernel: Any, args: tuple, kwargs: dict) -> Any:
    """A launch issued through wrap_triton (the outermost kernel object: an autotuner is traced as
    one, so Inductor tunes it). What wrap_triton refuses (``num_ctas`` at the launch, an autotuner's
    pre_hook, nested autotuners) is named with the way out: an opaque op."""
    from torch.library import wrap_triton

    kwargs = dict(kwargs)
    grid = kwargs.pop("grid")
    kwargs.pop("warmup", None)
    params = getattr(kernel, "params", ())  # (a JITFunction's; an autotuner is Inductor's to launch)
    passed = {**dict(zip([p.name for p in params], args, strict=False)), **kwargs}  # (defaults: not passed)
    floats = tuple(p.name for p in params if not p.is_constexpr and type(passed.get(p.name)) is float)
    kernel = self_contained(kernel, floats)  # (a derived kernel, of a traced backward, as Inductor can copy it)
    token = current_record.set(None)  # wrap_triton's own launch is not intercepted again
    try:
        return wrap_triton(kernel)[grid](*args, **kwargs)
    except (RuntimeError, NotImplementedError) as e:
        name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "?")
        raise OpError(f"tritongrad.op `{launches.name}`: torch.compile cannot trace the launch of `{name}` through "
                      f"torch.library.wrap_triton ({e}); register the op with "
                      f"@tritongrad.op(\"{launches.name}\", opaque=True)") from e
    finally:
        current_record.reset(token)


# -- the launch hooks ------------------------------------------------------------------------------

_installed = False


def install() -> None:
    """Patch Triton's launch entry points, once per process."""
    global _installed
    if _installed:
        return
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for cls in (JITFunction, InterpretedFunction):
        cls.run = _recorded(cls.run)
    Autotuner.run = _autotuner_hooked(Autotuner.run)
    Heuristics.run = _heuristics_hooked(Heuristics.run)
    if hasattr(Autotuner, "_bench"):
        Autotuner._bench = _unrecorded(Autotuner._bench)
    _installed = True


def _recorded(run):
    def recorded_run(self, *args, grid, warmup, **kwargs):
        record = current_record.get()
        if record is None or warmup:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        if record is DRY:
            return None
        if type(record) is Launches:
            record.add(self, grid, args, kwargs)
            kept = record.keeping(self, grid, args, kwargs)
            if record.mode == "skip":
                return None
            kernel, extra = self, {}
            if kept is not None:
                record.tapes.append(kept.buffer())
                kernel, extra, _ = kept.kept_in(record.tapes[-1])
            if record.mode == "wrap":
                return _wrapped_launch(record, kernel, args, {**kwargs, **extra, "grid": grid})
            return run(kernel, *args, grid=grid, warmup=warmup, **kwargs, **extra)
        boundary = record.boundary
        if boundary is None:
            return record.launch(run, self, grid, args, kwargs, warmup)
        with torch._C.DisableTorchFunction():  # a bare op's watch (ops/segments.py) is not for the launch itself
            result = record.launch(run, self, grid, args, kwargs, warmup)
            boundary.launched()
        return result

    recorded_run.__wrapped__ = run
    return recorded_run


def _autotuner_hooked(run):
    def autotuner_run(self, *args, **kwargs):
        current = current_record.get()
        if current is DRY:  # no benchmarking on fake tensors
            return None
        if type(current) is Launches and not kwargs.get("warmup") and current.mode != "inner":
            current.tuned = True
            passed = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
            current.add(self, kwargs.get("grid"), args, passed)
            if current.mode == "wrap":
                return _wrapped_launch(current, self, args, kwargs)
            if current.mode == "skip":
                return None
            token = current_record.set(None)  # "run": its inner launch is not collected again
            try:
                return run(self, *args, **kwargs)
            finally:
                current_record.reset(token)
        if current is None or type(current) is Launches or kwargs.get("warmup"):  # (LaunchRecord, replay.FastRecord)
            return run(self, *args, **kwargs)
        token = current_autotuner.set((self, args, kwargs))  # the recorded launch keeps its other configs
        try:
            if current.boundary is not None:  # a bare op's watch: not for the tuning runs
                with torch._C.DisableTorchFunction():
                    return run(self, *args, **kwargs)
            return run(self, *args, **kwargs)
        finally:
            current_autotuner.reset(token)

    autotuner_run.__wrapped__ = run
    return autotuner_run


def _heuristics_hooked(run):
    def heuristics_run(self, *args, **kwargs):
        if current_record.get() is None:
            return run(self, *args, **kwargs)
        token = current_heuristics.set(self)  # its launch keeps its config: the values may be the tiles' (configs.py)
        try:
            return run(self, *args, **kwargs)
        finally:
            current_heuristics.reset(token)

    heuristics_run.__wrapped__ = run
    return heuristics_run


def _unrecorded(bench):
    def bench_unrecorded(self, *args, **kwargs):
        token = current_record.set(None)  # the autotuner's timing runs are not part of the op
        try:
            return bench(self, *args, **kwargs)
        finally:
            current_record.reset(token)

    bench_unrecorded.__wrapped__ = bench
    return bench_unrecorded
