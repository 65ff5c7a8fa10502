"""Launching a derived backward kernel's prepared variant (backward_kernel.py prepares it)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..analysis.launch_values import LaunchValues
from ..writes.strategies import most_trips, span_of
from . import tuning
from .guards import banded, check_bands, fill_bands, kernel_name
from .variants import (
    Part,
    PartialRows,
    PartLaunch,
    Prepared,
    Variant,
    device_of,
    empty_strided,
    persistent_programs,
    shadow_dtype,
    tape_args,
    zeros_strided,
)


class Launches:
    """How a prepared variant's kernels are launched: each with its tuned setting, a persistent one with its partial
    rows, an interchanged one with buffers of its own where gradient is already there, private buffers added
    after; for a :class:`derive.BackwardKernel`."""

    def __init__(self, kernel):
        self.kernel = kernel  # the derive.BackwardKernel

    def launch(self, grid: tuple[int, ...], named: dict[str, Any], output_grads: dict[str, Any],
               buffers: dict[str, Any], prepared: Prepared, written: frozenset[str] = frozenset(),
               pad: int = 0, saved: Any = None, setting: tuning.Setting | None = None,
               trace: list | None = None) -> dict[str, tuple[Any, int, str]]:
        """Run the prepared variant (:meth:`prepare`). ``named``: the forward's arguments (and launch options);
        ``output_grads``: output -> its incoming gradient; ``buffers``: wrt input -> its gradient buffer
        (stored into or added to; an input summed in partial rows gets their sum, added if in ``written``).
        ``pad``: a checked backward's guard bands (guards.py) around each partial row and buffer of an input's own,
        to look for gradient outside the tensor; scratch (tapes, a prologue's values, later adds) gets bands too,
        checked after its kernel.
        Launch settings are tuned on a GPU (tuning.py). ``saved``: the state tapes the forward kept
        (augment.SavedStates), for a variant prepared to read them. ``setting``: launch with this one, untimed
        (a trial of tuning another config). ``trace``: each kernel's launch is appended to it (:class:`PartLaunch`).
        Returns the partial rows and buffers of inputs' own: input -> (rows with their bands, pad, what they are)."""
        variant = prepared.variant
        tapes = saved if variant.reads_saved else None
        if self.kernel.in_place:
            written = written | self.kernel.in_place
        if prepared.shared:  # overlapping another input's buffer: added after the kernels (partial rows, own kernels)
            written = written | prepared.shared
        own, guarded = {}, {}
        for p in prepared.private:  # stored into buffers of their own (float32 for half types), added after; in a
            fill = empty_strided if prepared.choices[p].covers and not pad else zeros_strided
            flat, own[p] = own_buffer(buffers[p], shadow_dtype(buffers[p].dtype), pad, fill)  # checked backward
            if pad:  # between bands, returned with the partial rows to look at
                guarded[p] = (flat, pad, f"its buffer of its own, written by `{variant.writer(p)}`")
        if own:
            real, buffers = buffers, {**buffers, **own}
        # inputs no gradient reaches: zeroed (a stored one would be left unset)
        for p in variant.unwritten - written if variant.unwritten else ():
            buffers[p].zero_()
            if trace is not None:
                trace.append(None)  # not made again by a host/launcher.Launcher
        if setting is not None:
            settings = (setting,) * len(variant.parts)
        else:
            if prepared.settings is None:
                prepared.settings = self.tuned(variant, grid, named, output_grads, buffers, written, tapes)
            settings = prepared.settings
        rows = self.run(variant, grid, named, output_grads, buffers, settings, written, pad, tapes=tapes,
                         covered=prepared.covered_rows, trace=trace)
        for p, b in own.items():  # in a fixed order: deterministic
            real[p].add_(b)
        if own and trace is not None:
            trace.append(None)  # buffers of its own, made on each launch: not kept (host/launcher.Launcher)
        return {**rows, **guarded}

    def tuned(self, variant: Variant, grid: tuple[int, ...], named: dict[str, Any], output_grads: dict[str, Any],
               buffers: dict[str, Any], written: frozenset[str], tapes: Any = None) -> tuple[tuning.Setting, ...]:
        """The launch setting of each of a prepared launch's kernels: timed on a GPU (tuning.py), each kernel
        alone (a dQ and a dK/dV kernel of attention rarely want the same warps), else the forward's."""
        device = next((t.device for t in buffers.values()), None)
        if self.kernel.deterministic or not tuning.enabled(device):
            return (tuning.DEFAULT,) * len(variant.parts)
        key = (id(self), variant.choices, bool(tapes), grid, tuning.describe({**named, **output_grads, **buffers}))
        settings = []
        for i, part in enumerate(variant.parts):
            touched = [buffers[p] for p, c in variant.choices if p in part.wrt and (
                c.strategy.adds_in_kernel or p in self.kernel.in_place)]  # (in place: its gradient read, replaced)

            def trial(s: tuning.Setting, i: int = i) -> None:  # the trials write ``touched``: restored after
                rows = self.run(variant, grid, named, output_grads, buffers, (s,) * len(variant.parts), written, 0,
                                 reduce=False, tapes=tapes, only=i)
                for found, *_ in rows.values():  # summing the partial rows is part of a setting's cost: more
                    found.sum(0)  # programs, more rows (8 per multiprocessor at 16384 columns: 52 µs against 7)

            settings.append(tuning.best((*key, i), part.persistent, trial, touched, part.loops, part.held is not None,
                                        bool(part.tapes)))
        return tuple(settings)

    def run(self, variant: Variant, grid: tuple[int, ...], named: dict[str, Any], output_grads: dict[str, Any],
             buffers: dict[str, Any], settings: tuple[tuning.Setting, ...], written: frozenset[str], pad: int,
             reduce: bool = True, tapes: Any = None, only: int | None = None,
             covered: frozenset[str] = frozenset(), trace: list | None = None) -> dict:
        """One launch of each of the variant's kernels (``only``: of that one) with its setting; partial rows
        allocated (unfilled for ``covered`` inputs: Prepared.covered_rows), and summed into their targets
        (``reduce``: not in tuning's trials). ``tapes``: the state tapes the forward kept (augment.SavedStates),
        for the kernels that read them."""
        rows = {}
        for i, (part, setting) in enumerate(zip(variant.parts, settings, strict=True)):
            if only is not None and i != only:
                continue
            args = {**named, **{part.shadows[o]: g for o, g in output_grads.items()}}
            args.update({part.shadows[p]: buffers[p] for p in part.wrt})
            if part.saved:
                args.update(tape_args(part, tapes))
            if setting.num_warps is not None:
                args["num_warps"] = setting.num_warps
            if setting.num_stages is not None:
                args["num_stages"] = setting.num_stages
            if part.stages is not None:  # untuned: one stage, the least shared memory
                args[part.stages] = setting.num_stages or 1
            if part.held is not None:
                args[part.held] = setting.held
            if part.trips is not None:
                rows.update(self.run_interchanged(part, grid, args, buffers, written, reduce, pad))
                if trace is not None:
                    trace.append(None)  # trip counts and exports made on each launch: not kept
            else:
                rows.update(self.run_part(part, grid, args, buffers, setting, written, pad, reduce, covered, trace))
        return rows

    def run_part(self, part: Part, grid: tuple[int, ...], args: dict[str, Any], buffers: dict[str, Any],
                  setting: tuning.Setting, written: frozenset[str], pad: int, reduce: bool,
                  covered: frozenset[str] = frozenset(), trace: list | None = None) -> dict:
        """``covered``: inputs whose partial rows every program stores whole (left unfilled, but around a checked
        backward's padding)."""
        partials = ()
        if part.axis is not None:  # persistent: a few programs along the axis, each with its partial rows
            axis = part.axis
            programs = persistent_programs(grid[axis], next(iter(buffers.values())).device, setting.waves)
            args[part.programs] = grid[axis]
            grid = (*grid[:axis], programs, *grid[axis + 1:])
            partials = tuple(PartialRows.of(part, p, programs, buffers[p], p in covered, p in written, pad)
                             for p in part.rows)
            args.update({part.rows[r.input]: r.width for r in partials})
        launch = PartLaunch(part, grid, args, partials)
        if trace is not None and reduce:
            trace.append(replace(launch, args=dict(args)))  # before its partial rows and scratch are made
        rows = launch.launch(args, buffers, self.kernel.deterministic, reduce, pad > 0)
        what = f"its partial rows, written by `{kernel_name(part.kernel)}`"
        return {r.input: (found, pad, what) for r, found in zip(partials, rows, strict=True)}

    def run_interchanged(self, part: Part, grid: tuple[int, ...], args: dict[str, Any], buffers: dict[str, Any],
                          written: frozenset[str], reduce: bool, pad: int = 0) -> dict[str, tuple[Any, int, str]]:
        """Inputs' own kernel: one program per iteration of their loop along the axis, each storing its sums.
        Into buffers of their own where gradient is already there to add to. ``pad``: those buffers and the scratch
        between guard bands (a checked backward); returns those buffers, as :meth:`launch` returns partial rows."""
        axis = part.axis
        names = part.memo.get("trips")
        if names is None:
            names = part.memo["trips"] = sorted(part.trips.names())
        key = (id(part), grid, *[args.get(n) for n in names])
        trips = self.kernel._most_trips.get(key)
        if trips is None:
            trips = self.kernel._most_trips[key] = int(most_trips(part.trips, LaunchValues(args, grid), axis))
        args[part.programs] = grid[axis]
        forward, grid = grid, (*grid[:axis], trips, *grid[axis + 1:])
        flats = {p: own_buffer(buffers[p], buffers[p].dtype, pad) for p in part.wrt if p in written}
        own = {p: buffer for p, (_, buffer) in flats.items()}
        args.update({part.shadows[p]: buffer for p, buffer in own.items()})
        if part.prologue is not None and min(forward) > 0:  # on the forward's grid, before the kernel reading it
            exports = part.exports.allocate(LaunchValues(args, forward), math.prod(forward), device_of(args))
            if pad:
                exports, bands = banded(exports, "values kept for the kernel that follows it", keep=False)
            args.update(exports)
            part.prologue[forward](**{k: v for k, v in args.items() if k in part.prologue.arg_names})
            if pad:
                check_bands(bands, part.prologue)
        if min(grid) > 0:
            bands = part.scratch_args(args, grid, pad > 0)
            part.kernel[grid](**args)
            check_bands(bands, part.kernel)
        for p, buffer in own.items() if reduce else ():
            buffers[p].add_(buffer)
        what = f"its buffer of its own, written by `{kernel_name(part.kernel)}`"
        return {p: (flat, pad, what) for p, (flat, _) in flats.items()} if pad else {}


def own_buffer(buffer: Any, dtype: Any, pad: int = 0, fill: Any = zeros_strided) -> tuple[Any, Any]:
    """A buffer of its own for ``buffer``'s gradient, in its layout (its sizes and strides, which the derived kernel
    indexes as the input's): the elements it spans, ``pad`` more on each side. Not ``zeros_like``, which lays out
    a view with gaps (``x[:, 1:]``, K and V shifted in one tensor) contiguously: the kernel, indexing it with the
    input's strides, wrote past its end. ``pad``: guard bands (guards.py). Returns the elements (one row, with its
    bands) and the view of them in the layout."""
    flat = fill((1, span_of(buffer) + 2 * pad), (1, 1), dtype=dtype, device=buffer.device)
    if pad:
        fill_bands(flat, pad)
    return flat, flat.as_strided(buffer.size(), buffer.stride(), flat.storage_offset() + pad)
