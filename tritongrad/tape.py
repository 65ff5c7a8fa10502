"""The tape: what an op's forward launched, and the backward that replays it reversed.

Recording: Triton's launch entry points are patched once (``install``). Outside an op
the current tape is ``None`` and a launch pays one ContextVar read. Inside an op each
launch of a ``@triton.jit`` kernel (compiled or interpreted) is recorded at the
innermost ``run``, after ``@triton.autotune`` and ``@triton.heuristics`` have added
their constexprs, so the backward replays the forward with the config the autotuner
chose. Autotuner benchmarking runs are not recorded.

Backward: shadow memory mirrors storage. Every tensor a launch touches is a ``View``
of a storage (keyed by the storage's ``data_ptr``); each storage that gradients flow
through gets one zero-filled float buffer covering the span its views touch, and a
view's shadow is that buffer viewed with the view's sizes, strides and offset. So
aliasing views share gradients, and a buffer one launch writes and a later one reads
carries the gradient from the later launch's backward into the earlier one's.
Launches are replayed in reverse order, each with ``tritongrad.grad(kernel, wrt,
outputs)``; ``wrt`` and ``outputs`` are the parameters whose storages matter (see
``Tape.backward``). Half-precision tensors get float32 shadows, cast once at the end.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from .derive import grad

DRY = object()  # current "tape" while shapes are inferred with fake tensors: launches are skipped
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("tritongrad_tape", default=None)


def active() -> bool:
    """Whether launches are being recorded (or skipped) by an enclosing op."""
    return _current.get() is not None


@contextlib.contextmanager
def dry_run():
    """Run a host function without launching anything (fake-tensor shape inference)."""
    token = _current.set(DRY)
    try:
        yield
    finally:
        _current.reset(token)


# -- what a kernel does with its pointer parameters ------------------------------------------------


@dataclass(frozen=True)
class Roles:
    loads: frozenset[str]  # every loaded pointer parameter (index pointers too)
    stores: frozenset[str]  # every stored or atomically updated one
    overwrites: frozenset[str]  # stored with something other than tl.atomic_add
    inputs: frozenset[str]  # differentiable inputs: loaded, never stored, not indices

    @property
    def pointers(self) -> frozenset[str]:
        return self.loads | self.stores


@dataclass(frozen=True)
class KernelInfo:
    name: str
    params: tuple[str, ...]
    defaults: dict[str, Any]
    interpreted: bool
    roles: Roles | None  # None: the kernel could not be analysed (``error`` says why)
    error: Exception | None


_infos: dict[Any, KernelInfo] = {}
_infos_lock = threading.Lock()


def kernel_info(kernel: Any) -> KernelInfo:
    """Cached per kernel: its parameters and roles (the only AST work, once per kernel)."""
    info = _infos.get(kernel.fn)
    if info is None:
        info = _analyse(kernel)
        with _infos_lock:
            _infos[kernel.fn] = info
    return info


def _analyse(kernel: Any) -> KernelInfo:
    from .analysis import analyze, op_of
    from .frontend import normalize_kernel

    sig = inspect.signature(kernel.fn)
    defaults = {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    roles, error = None, None
    try:
        a = analyze(normalize_kernel(kernel), (), None)
        loads, stores = frozenset(a.loads), frozenset(a.stores)
        overwrites = frozenset(p for p, ss in a.stores.items() if any(op_of(s).kind != "atomic_add" for s in ss))
        roles = Roles(loads, stores, overwrites, frozenset(loads - stores - set(a.index_pointers)))
    except Exception as e:  # e.g. a construct the core does not handle yet; raised if the launch needs a backward
        error = e
    interpreted = type(kernel).__name__ == "InterpretedFunction"
    return KernelInfo(kernel.fn.__name__, tuple(sig.parameters), defaults, interpreted, roles, error)


# -- storage views ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """Where a tensor lives: storage key, dtype, sizes, strides, offset (in elements)."""

    key: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> View:
        key = t.untyped_storage().data_ptr() if t.numel() else 0
        return cls(key, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.device)

    @property
    def span(self) -> tuple[int, int]:
        """The elements [lo, hi) of the storage this view can address."""
        if not all(self.size):
            return self.offset, self.offset
        return self.offset, self.offset + 1 + sum((n - 1) * s for n, s in zip(self.size, self.stride, strict=True))

    def overlaps(self, other: View) -> bool:
        if self.key != other.key or not self.key:
            return False
        (a, b), (c, d) = self.span, other.span
        sa, sb = self.dtype.itemsize, other.dtype.itemsize
        return a * sa < d * sb and c * sb < b * sa


def shadow_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass(eq=False)
class Launch:
    """One recorded launch: the jit-level kernel, its grid, arguments by name and launch options.

    After ``Tape.close``, ``args`` holds saved-tensor slots in place of tensors, and ``views``
    where each tensor argument lives.
    """

    kernel: Any
    info: KernelInfo
    grid: Any
    args: dict[str, Any]
    options: dict[str, Any]
    index: int
    views: dict[str, View] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"launch #{self.index + 1} (`{self.info.name}`)"

    def params(self, role: str) -> list[str]:
        """Tensor parameters in a role ("loads", "stores", "overwrites", "inputs"), in parameter order."""
        roles = self.info.roles
        if roles is None:  # unknown: every tensor may be read and written
            return [p for p in self.views if role != "overwrites"]
        chosen = getattr(roles, role)
        return [p for p in self.views if p in chosen]


# -- the tape --------------------------------------------------------------------------------------


class OpError(RuntimeError):
    """A tritongrad.op was used in a way its backward cannot honour."""


class Tape:
    """The launches of one call of an op, and the backward that replays them."""

    def __init__(self, name: str):
        self.name = name
        self.launches: list[Launch] = []
        self.device: torch.device | None = None

    @contextlib.contextmanager
    def recording(self):
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def error(self, message: str) -> OpError:
        return OpError(f"tritongrad.op `{self.name}`: {message}")

    # -- forward ------------------------------------------------------------------------------------

    def record(self, kernel: Any, grid: Any, args: tuple, kwargs: dict) -> None:
        info = kernel_info(kernel)
        named = dict(zip(info.params, args, strict=False))
        options = {}
        for k, v in kwargs.items():
            if k in info.defaults or k in info.params:
                named[k] = v
            else:
                options[k] = v  # num_warps, num_stages, ...
        launch = Launch(kernel, info, None, named, options, len(self.launches))
        for p, v in named.items():
            if isinstance(v, torch.Tensor):
                self._check_device(launch, p, v)
            elif v is not None and info.roles is not None and p in info.roles.pointers:
                raise TypeError(f"tritongrad.op `{self.name}`: {launch} passes {type(v).__name__} {v!r} to `{p}`, "
                                f"which the kernel uses as a pointer; pass a tensor")
        if callable(grid):
            grid = grid({**info.defaults, **named})
        launch.grid = tuple(grid)
        self.launches.append(launch)

    def _check_device(self, launch: Launch, param: str, t: torch.Tensor) -> None:
        if t.device.type == "cpu" and not launch.info.interpreted:
            raise self.error(f"{launch} passes a CPU tensor to `{param}`; move it to the GPU "
                             f"(CPU tensors run only under TRITON_INTERPRET=1)")
        if self.device is None:
            self.device = t.device
        elif t.device != self.device:
            raise self.error(f"{launch} passes a tensor on {t.device} to `{param}`, but the op's tensors are on "
                             f"{self.device}; put them on one device")

    def close(self, outputs: tuple, arguments: dict[str, torch.Tensor], diff_inputs: list | None = None) -> list:
        """Check the finished forward; returns the tensors to differentiate with respect to.

        ``arguments``: the op's tensor arguments by name. ``diff_inputs``: the tensors to
        differentiate (named ops); by default every tensor a launch reads that requires grad.
        Afterwards the tape holds views and saved-tensor slots, and ``self.saved`` lists the
        tensors the backward reads (to go through ``ctx.save_for_backward``).
        """
        read: dict[int, list[tuple[Launch, str, View]]] = {}  # storage key -> reads so far
        written: dict[int, list[tuple[Launch, str, View]]] = {}  # storage key -> writes so far
        slots: dict[int, int] = {}  # id(tensor) -> index in self.saved
        self.saved: list[torch.Tensor] = []
        found: dict[int, torch.Tensor] = {}
        for launch in self.launches:
            tensors = {p: v for p, v in launch.args.items() if isinstance(v, torch.Tensor)}
            launch.views = {p: View.of(t) for p, t in tensors.items()}
            known = launch.info.roles is not None
            if known:
                self._hazards(launch, read, written)
            loads, stores = set(launch.params("loads")), set(launch.params("stores"))
            for p, t in tensors.items():
                if known and p in stores and t.requires_grad:
                    raise self.error(f"{launch} writes to `{p}`, a tensor that requires grad (an input of the op?); "
                                     "kernels of an op may write only to buffers the op allocates")
                if p in loads:
                    if id(t) not in slots:
                        slots[id(t)] = len(self.saved)
                        self.saved.append(t)
                    if diff_inputs is None and t.requires_grad and t.is_floating_point():
                        found.setdefault(id(t), t)
                launch.args[p] = slots.get(id(t))  # saved slot, or None: written only, never read back
            for p in stores:
                written.setdefault(launch.views[p].key, []).append((launch, p, launch.views[p]))
            if known:  # unknown roles: hazards are not checked (the launch fails if it needs a backward)
                for p in loads:
                    read.setdefault(launch.views[p].key, []).append((launch, p, launch.views[p]))
        self._check_outputs(outputs, arguments, written)
        if diff_inputs is None:
            diff_inputs = list(found.values())
        else:
            self._check_origins(arguments, written)
        self.input_views = [View.of(t) for t in diff_inputs]
        self.output_views = [View.of(t) for t in outputs]
        self.storages = self._storages()
        return diff_inputs

    def _hazards(self, launch: Launch, read: dict, written: dict) -> None:
        """Refuse what replaying the launches against final memory would get wrong."""
        for p in launch.params("stores"):
            v = launch.views[p]
            for q in launch.params("loads"):
                if q != p and launch.views[q].overlaps(v):
                    raise self._hazard(launch, q, "reads", launch, p)
            for other, q, u in read.get(v.key, ()):
                if u.overlaps(v):
                    raise self._hazard(other, q, "reads", launch, p)
            if p in launch.info.roles.overwrites:  # tl.atomic_add onto earlier results is fine: it accumulates
                for other, q, u in written.get(v.key, ()):
                    if u.overlaps(v):
                        raise self._hazard(other, q, "writes", launch, p)

    def _hazard(self, first: Launch, p: str, verb: str, second: Launch, q: str) -> OpError:
        why = ("the backward replays each launch against memory as the op left it, so it would read the new values"
               if verb == "reads" else f"the backward of {first} would take the gradient of what {second} wrote")
        return self.error(f"{second} overwrites `{q}`, memory that {first} {verb} through `{p}`: {why}. Write to a "
                          "fresh buffer instead (tritongrad refuses rather than snapshotting memory)")

    def _check_outputs(self, outputs: tuple, arguments: dict, written: dict) -> None:
        for i, out in enumerate(outputs):
            if not isinstance(out, torch.Tensor):
                raise self.error(f"output #{i} is a {type(out).__name__}; an op returns tensors")
            v = View.of(out)
            for name, arg in arguments.items():
                if v.key and v.key == View.of(arg).key:
                    raise self.error(f"output #{i} shares memory with the argument `{name}` (it is that argument "
                                     "or a view of it); an op must return tensors it allocates")
            if v.key and v.key not in written:
                raise self.error(f"output #{i} was not written by any kernel launch of the op (made by a PyTorch "
                                 "operation?); compute it with a kernel, or outside the op")

    def _check_origins(self, arguments: dict, written: dict) -> None:
        """Named ops run below autograd: a tensor made from the inputs by PyTorch inside would be a silent constant."""
        known = {View.of(t).key for t in arguments.values()} | set(written)
        for launch in self.launches:
            for p in launch.params("inputs"):
                v = launch.views[p]
                if v.key and v.key not in known and v.dtype.is_floating_point:
                    raise self.error(
                        f"{launch} reads `{p}`, a tensor that is neither an argument of the op nor written by an "
                        "earlier launch (made by a PyTorch operation, e.g. .contiguous()?). A named op cannot see "
                        "such operations; do them outside the op, or pass the tensor in as an argument")

    def _storages(self) -> dict[int, tuple[torch.dtype, int, int]]:
        """Storage key -> (dtype, lo, hi): the float storages and the element spans their shadows cover."""
        spans: dict[int, tuple[torch.dtype, int, int]] = {}
        views = [v for launch in self.launches for v in launch.views.values()] + self.output_views + self.input_views
        for v in views:
            if not v.key or not v.dtype.is_floating_point:
                continue
            lo, hi = v.span
            if v.key in spans:
                dtype, a, b = spans[v.key]
                if dtype != v.dtype:
                    raise self.error(f"tensors of dtypes {dtype} and {v.dtype} share memory; their gradients "
                                     "cannot share a shadow")
                lo, hi = min(lo, a), max(hi, b)
            spans[v.key] = (v.dtype, lo, hi)
        return spans

    # -- backward -----------------------------------------------------------------------------------

    def backward(self, saved: tuple, grads: tuple, needs: list[bool]) -> list[torch.Tensor | None]:
        """Gradients of the differentiated inputs (None where not needed or not reached).

        ``wrt`` of a launch: its differentiable inputs whose storage depends on a needed
        input at that point of the forward. ``outputs``: the parameters it stores whose
        storage carries gradient (an op output with a gradient, or a buffer a later
        launch's backward accumulated into). A launch with neither is not replayed.
        """
        varied = {v.key for v, need in zip(self.input_views, needs, strict=True) if need}
        wrts = []
        for launch in self.launches:
            wrt = [p for p in launch.params("inputs") if launch.views[p].key in varied and self._float(launch, p)]
            wrts.append(wrt)
            if wrt:
                varied.update(launch.views[p].key for p in launch.params("stores"))

        shadows: dict[int, torch.Tensor] = {}
        for v, g in zip(self.output_views, grads, strict=True):
            if g is not None and v.key in self.storages:
                self._shadow(shadows, v).add_(g)
        token = _current.set(None)  # derived kernels are not recorded, even inside another op's forward
        try:
            for launch, wrt in zip(reversed(self.launches), reversed(wrts), strict=True):
                outputs = [p for p in launch.params("stores") if launch.views[p].key in shadows
                           and self._float(launch, p)]
                if wrt and outputs:
                    self._replay(launch, saved, shadows, tuple(wrt), tuple(outputs))
        finally:
            _current.reset(token)
        return self._input_grads(shadows, needs)

    def _float(self, launch: Launch, p: str) -> bool:
        return launch.views[p].dtype.is_floating_point and launch.views[p].key in self.storages

    def _replay(self, launch: Launch, saved: tuple, shadows: dict, wrt: tuple, outputs: tuple) -> None:
        if launch.info.roles is None:
            error, note = launch.info.error, f"(needed to differentiate {launch} of tritongrad.op `{self.name}`)"
            if note not in getattr(error, "__notes__", ()):
                error.add_note(note)
            raise error
        bwd = grad(launch.kernel, wrt, outputs)
        args = {}
        for p, v in launch.args.items():
            if p not in launch.views:
                args[p] = v
            elif v is not None:
                args[p] = saved[v]
            else:  # written only, not saved: derived kernels drop the forward's stores, a stand-in will do
                args[p] = torch.empty(1, dtype=launch.views[p].dtype, device=launch.views[p].device)
        for primal, shadow in bwd.shadow_params.items():
            args[shadow] = self._shadow(shadows, launch.views[primal])
        bwd[launch.grid](**args, **launch.options)

    def _shadow(self, shadows: dict, v: View) -> torch.Tensor:
        dtype, lo, hi = self.storages[v.key]
        flat = shadows.get(v.key)
        if flat is None:
            flat = shadows[v.key] = torch.zeros(hi - lo, dtype=shadow_dtype(dtype), device=v.device)
        return flat.as_strided(v.size, v.stride, v.offset - lo)

    def _input_grads(self, shadows: dict, needs: list[bool]) -> list[torch.Tensor | None]:
        """Each input's gradient, such that autograd, mapping them back through the inputs' views,
        adds each memory element's gradient exactly once: an element several inputs (or one
        self-overlapping input, such as an expanded one) cover goes to the first covering position."""
        keys = [v.key for v, need in zip(self.input_views, needs, strict=True) if need and v.key in shadows]
        grads = []
        for v, need in zip(self.input_views, needs, strict=True):
            if not need or v.key not in shadows:
                grads.append(None)
                continue
            g = self._shadow(shadows, v)
            if torch._debug_has_internal_overlap(g):
                g = g * _first_cover(v, self.storages[v.key][1])
            elif keys.count(v.key) > 1:
                g = g.clone()
            if keys.count(v.key) > 1:
                self._shadow(shadows, v).zero_()
            grads.append(g if g.dtype == v.dtype else g.to(v.dtype))
        return grads


def _first_cover(v: View, lo: int) -> torch.Tensor:
    """1 where a position of a self-overlapping view is the first to address its element, else 0."""
    dtype, device = torch.int64, v.device
    address = torch.arange(v.span[1] - lo, dtype=dtype, device=device).as_strided(v.size, v.stride, v.offset - lo)
    address = address.reshape(-1)
    position = torch.arange(address.numel(), dtype=dtype, device=device)
    first = torch.full((v.span[1] - lo,), address.numel(), dtype=dtype, device=device)
    first.scatter_reduce_(0, address, position, "amin")
    return (first[address] == position).reshape(v.size).to(shadow_dtype(v.dtype))


# -- the launch hooks ------------------------------------------------------------------------------

_installed = False


def install() -> None:
    """Patch Triton's launch entry points, once per process."""
    global _installed
    if _installed:
        return
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for cls in (JITFunction, InterpretedFunction):
        cls.run = _recorded(cls.run)
    Autotuner.run = _skipped_when_dry(Autotuner.run)
    if hasattr(Autotuner, "_bench"):
        Autotuner._bench = _unrecorded(Autotuner._bench)
    _installed = True


def _recorded(run):
    def recorded_run(self, *args, grid, warmup, **kwargs):
        tape = _current.get()
        if tape is None or warmup:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        if tape is DRY:
            return None
        tape.record(self, grid, args, kwargs)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    recorded_run.__wrapped__ = run
    return recorded_run


def _skipped_when_dry(run):
    def autotuner_run(self, *args, **kwargs):
        if _current.get() is DRY:  # no benchmarking on fake tensors
            return None
        return run(self, *args, **kwargs)

    autotuner_run.__wrapped__ = run
    return autotuner_run


def _unrecorded(bench):
    def bench_unrecorded(self, *args, **kwargs):
        token = _current.set(None)  # the autotuner's timing runs are not part of the op
        try:
            return bench(self, *args, **kwargs)
        finally:
            _current.reset(token)

    bench_unrecorded.__wrapped__ = bench
    return bench_unrecorded
