"""The checks a derived backward kernel makes on each launch, before any kernel runs."""

from __future__ import annotations

import functools
from typing import Any

from ..analysis.launch_values import LaunchValues
from ..core.bounded import Bounded
from ..core.device import address, capturing, tracing
from ..core.errors import NotDifferentiableError
from ..writes.launch_facts import Layout, overlap
from ..writes.strategies import Choice


class LaunchChecks:
    """The checks a derived kernel makes on each launch: its grid, the conditions only a launch decides (lanes.py's
    store checks, reading index tensors where they must), a direct launch's buffers and default wrt, and
    deterministic's refusal of atomics; for a :class:`backward_kernel.BackwardKernel`."""

    def __init__(self, kernel):
        self.kernel = kernel  # the backward_kernel.BackwardKernel
        self.passed = Bounded()  # (grid, argument values) the launch checks passed for

    def buffers(self, named: dict[str, Any], output_grads: dict[str, Any],
                      buffers: dict[str, Any] | None = None) -> None:
        """Refuse a direct launch whose gradient buffers the kernel could not address as its calling convention
        says (each with its primal's sizes and strides, on its device: else it writes outside them), that
        writes an input's gradient where it reads an output's, or whose forward read an input where it wrote
        an output (the backward recomputes the forward's loads: they would read what it stored). An op's backward
        makes its buffers itself, and its launch record refuses such forwards."""
        k = self.kernel
        given = [(o, g, "output") for o, g in output_grads.items()] + [
            (p, b, "input") for p, b in (buffers or {}).items() if p not in k.in_place]
        for name, g, role in given:
            x = named.get(name)
            if not hasattr(x, "stride"):
                continue
            shadow = k.shadow_params.get(name, f"d_{name}")
            if not hasattr(g, "stride"):
                raise TypeError(f"{k.name}: `{shadow}` (the gradient of the {role} `{name}`) must be a tensor, "
                                f"got {type(g).__name__}")
            if tuple(g.shape) != tuple(x.shape) or (g.stride() != x.stride() and g.numel() > 1) \
                    or g.device != x.device:
                raise ValueError(f"{k.name}: `{shadow}` must have `{name}`'s sizes {tuple(x.shape)} and strides "
                                 f"{x.stride()} on {x.device} (the kernel addresses it as it addresses `{name}`); got "
                                 f"sizes {tuple(g.shape)}, strides {g.stride()} on {g.device}")
            if not g.dtype.is_floating_point:
                raise TypeError(f"{k.name}: `{shadow}` must be a floating-point tensor, got {g.dtype}")
        for p, n in k.stored_params.items():  # what it read back, from the tensor as the launch left it
            self.as_left(p, n, named.get(p), named.get(n))
        layouts = {("d", name): Layout.of(g) for name, g, _ in given if hasattr(g, "data_ptr")}
        layouts.update({("x", p): Layout.of(named[p]) for p in (*k.wrt, *k.outputs)
                        if hasattr(named.get(p), "data_ptr")})
        for p in (buffers or {}):
            for o in output_grads:
                if p not in k.in_place and ("d", p) in layouts and ("d", o) in layouts \
                        and overlap(layouts[("d", p)], layouts[("d", o)]):
                    raise ValueError(f"{k.name}: the gradient buffer of `{p}` overlaps the gradient of the output "
                                     f"`{o}`: the kernel would write one where it reads the other; pass separate "
                                     "tensors")
        for p in k.wrt:
            for o in k.outputs:
                if p != o and p not in k.in_place and ("x", p) in layouts and ("x", o) in layouts \
                        and overlap(layouts[("x", p)], layouts[("x", o)]):
                    raise NotDifferentiableError(
                        f"`{p}` and the output `{o}` share memory: the forward stored over what it read, and the "
                        "backward, which recomputes the forward's loads, would read what it stored",
                        file=k.forward.fn.__code__.co_filename, line=k.forward.fn.__code__.co_firstlineno,
                        hint="pass an output that does not overlap the inputs (or update the input in place: load "
                             "and store it through one parameter)")

    def as_left(self, p: str, n: str, x: Any, t: Any) -> None:
        """Refuse a direct launch that does not pass ``n`` (``p`` as the forward launch left it) as a tensor laid out as
        ``p``'s, or passes ``p`` itself there (``p`` takes the values the launch was given)."""
        k = self.kernel
        about = (f"`{n}` takes `{p}` as the forward launch left it (the kernel read back what it stored there), and "
                 f"`{p}` its values before the launch, a copy taken before it ran")
        if not hasattr(t, "stride"):
            raise TypeError(f"{k.name}: {about}: pass a tensor to `{n}`, got {type(t).__name__}")
        if not hasattr(x, "stride"):
            return
        if tuple(t.shape) != tuple(x.shape) or (t.stride() != x.stride() and t.numel() > 1) or t.device != x.device \
                or t.dtype != x.dtype:
            raise ValueError(f"{k.name}: {about}: it must have `{p}`'s sizes {tuple(x.shape)}, strides {x.stride()} "
                             f"and dtype {x.dtype} on {x.device}; got {tuple(t.shape)}, {t.stride()}, {t.dtype} on "
                             f"{t.device}")
        if t.numel() and address(t) == address(x):
            raise ValueError(f"{k.name}: {about}: one tensor was passed to both")

    def default_wrt(self, named: dict[str, Any]) -> None:
        """Refuse a direct launch that passes a floating-point tensor to a pointer the default ``wrt`` leaves out
        because its values also make addresses (``j = tl.argmax(x); tl.load(x_ptr + j)``): derivation could not
        tell it from an index tensor, and its gradient would be silently missing. (An op sees the tensor's dtype
        and differentiates it.)"""
        if self.kernel.requested[0] is not None:
            return
        analysis = self.kernel.analysis
        for p in sorted(set(analysis.index_pointers) - set(self.kernel.wrt) - set(analysis.stores)):
            t = named.get(p)
            if getattr(t, "dtype", None) is not None and t.dtype.is_floating_point:
                load = self.kernel.analysis.loads[p][0].tg.where
                raise NotDifferentiableError(
                    f"a {t.dtype} tensor passed to `{p}`, whose loaded values also make addresses: the default wrt "
                    "(derived without the tensors' dtypes) leaves it out as an index tensor",
                    file=load.file, line=load.line, source_line=load.text,
                    hint=f"name it: tritongrad.grad(kernel, wrt={(*self.kernel.wrt, p)!r}) "
                         "gives its gradient (zero where it only makes addresses); a tritongrad.op does so itself")

    def refuse_atomics(self, choices: dict[str, Choice], self_overlapping: frozenset[str] = frozenset(),
                       again: bool = False) -> None:
        """``again``: the backward is recorded to be differentiated again (no later adds, no partial rows)."""
        for p, c in choices.items():
            if c.strategy.atomic:
                load = self.kernel.analysis.loads[p][0]
                where = load.tg.where
                why = ("the tensor passed reaches one element from several positions (expanded, stride 0)"
                       if p in self_overlapping else self.kernel.writes.inputs[p].why
                       or ("a backward to be differentiated again adds atomically what it would otherwise add after "
                           "the kernel or sum in partial rows" if again else "this launch does not keep its "
                           "addresses apart"))
                raise NotDifferentiableError(
                    f"`{p}` with deterministic=True: its gradient can only be added atomically here ({why})",
                    file=where.file, line=where.line, source_line=where.text,
                    hint="atomic additions land in a different order on each run; drop deterministic=True, or "
                         "load each element of the input once per launch")

    def grid(self, grid: tuple[int, ...]) -> None:
        """Refuse a grid in which several programs store to one output element.

        If an output's store address does not depend on a program axis, every program
        along that axis writes the same elements and the last one wins: only its values
        would deserve the gradient, which the derived kernel cannot tell apart.
        """
        for output, axes in self.kernel.store_axes.items():
            for axis, size in enumerate(grid):
                if size > 1 and axis not in axes:
                    store = self.kernel.analysis.stores[output][0].tg.where  # (none of its stores reads that axis)
                    raise NotDifferentiableError(
                        f"a grid of {size} programs along axis {axis}, all storing to the same elements of "
                        f"`{output}`", file=store.file, line=store.line, source_line=store.text,
                        hint=f"make `{output}`'s store address depend on tl.program_id({axis}), "
                             "or launch one program along that axis")

    def arguments(self, named: dict[str, Any], grid: tuple[int, ...] = (1,)) -> None:
        """Refuse a launch whose arguments let a store's lanes, programs or iterations reach one element
        (lanes.py: conditions it could not decide before the strides, block sizes and grid were known).
        A condition on values it cannot read (a local of the kernel) is let pass."""
        if not self.kernel.launch_checks:
            return
        key = (grid, *[named.get(n) for n in self.cached_names])
        try:
            cached = key in self.passed  # a launch like an earlier one: ~1 us instead of ~12
        except TypeError:  # an unhashable argument: check every time
            key, cached = None, False
        launch = LaunchValues(named, grid)
        for check in self.kernel.launch_checks:
            if cached and check.condition.cacheable:  # (checks reading tensor contents run every time)
                continue
            if not check.condition.cacheable and tracing():  # (the op's backward stays opaque: saved_backward.py)
                raise NotDifferentiableError(f"{check.construct}: checked on each launch by reading the index "
                                             "tensors, which fake tensors do not have", file=check.where.file,
                                             line=check.where.line)
            if not check.condition.cacheable and capturing():
                raise NotDifferentiableError(
                    f"{check.construct}: checked on each launch by reading the index tensors, which a CUDA graph "
                    "being captured cannot do (it would wait for the GPU), nor could it check a replay's indices",
                    file=check.where.file, line=check.where.line, source_line=check.where.text,
                    hint="run this op's backward outside CUDA graphs (torch.compile without mode=\"reduce-overhead\")")
            construct = check.failure(launch)
            if construct is not None:
                raise NotDifferentiableError(construct, file=check.where.file, line=check.where.line,
                                             hint=check.hint, source_line=check.where.text)
        if key is not None:
            self.passed.add(key)

    @functools.cached_property
    def reads_contents(self) -> bool:
        """Whether a launch check reads tensor contents (loaded indices): those run on every launch."""
        return any(not c.condition.cacheable for c in self.kernel.launch_checks)

    @functools.cached_property
    def cached_names(self) -> tuple[str, ...]:
        """The arguments the launch checks read."""
        return tuple(sorted({n for c in self.kernel.launch_checks if c.condition.cacheable for n in c.condition.names()}
                            & set(self.kernel.params)))
