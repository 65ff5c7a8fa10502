"""The backward of an op: derived kernels launched in reverse order against shadow memory (shadows.py).

Each step of the plan's schedule (``Plan.steps``) launches ``tritongrad.grad(kernel, wrt, outputs)``
of its forward launch; ``wrt`` and ``outputs`` are the parameters whose storages matter. A derived
kernel adds each load's gradient at the load's address, so a launch that read outside the elements
of a tensor it was passed would put gradient where no tensor lies: the first backward of each plan
and schedule (every backward with ``TRITONGRAD_CHECKED=1``) lays guard bands around the shadows and the buffers its
kernels write (runtime/guards.py) and refuses that (``PlannedBackward._check_strays``). Later backwards launch what an
earlier one kept (launcher.py).
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..core.device import capturing, ensure_allocator, tracing
from ..core.errors import NotDifferentiableError, OpError, noted
from ..runtime import guards as guard_bands
from ..runtime import tuning
from ..runtime.derivation import decisive_constexprs, hashable
from ..runtime.derive import grad
from ..runtime.variants import shadow_dtype
from . import donation
from .launcher import Launcher
from .shadows import Plan, Shadow, Step, View, stand_in_tensor

# the launch record recording a backward's launches of derived kernels (None: they are not recorded): a backward run
# with create_graph=True, as a bare op of its own (autograd_function.backward_as_op)
recording_backward: contextvars.ContextVar = contextvars.ContextVar("tritongrad_recording", default=None)


def checks(plan: Plan, needs: Sequence[bool], given: Sequence[bool]) -> bool:
    """Whether a backward of this schedule (the inputs it needs, the output gradients given) looks for strays: the
    first of each plan and schedule, every one with ``TRITONGRAD_CHECKED=1``. A backward recorded as an op does not
    (ops/autograd_function.py rehearses it first)."""
    return (tuple(needs), tuple(given)) not in plan.checked or guard_bands.CHECKED


class PlannedBackward:
    """One backward of an op, each step decided from its plan (the path every other backward path was kept from):
    its plan, the recorded launches' non-tensor arguments, the op's name."""

    def __init__(self, name: str, plan: Plan, launches: Sequence[Any], deterministic: bool = False):
        self.name, self.plan, self.launches, self.deterministic = name, plan, launches, deterministic

    def error(self, message: str) -> OpError:
        return OpError(f"tritongrad.op `{self.name}`: {message}")

    def run(self, saved: tuple, grads: tuple, needs: Sequence[bool]) -> list[torch.Tensor | None]:
        """Gradients of the differentiated inputs (None where not needed or not reached).

        Runs with grad mode off, but where a launch record records its launches (recording_backward: a backward
        differentiated again, run as an op whose segments carry the PyTorch operations' history).
        """
        ensure_allocator()  # (autograd's thread has not seen an allocator the forward's context set)
        if torch.is_grad_enabled() and recording_backward.get() is None:  # (no_grad costs microseconds)
            with torch.no_grad():
                return self._backward(saved, grads, needs)
        return self._backward(saved, grads, needs)

    def _backward(self, saved: tuple, grads: tuple, needs: Sequence[bool]) -> list[torch.Tensor | None]:
        plan = self.plan
        schedule = (tuple(needs), tuple([g is not None for g in grads]))
        steps = plan.steps(*schedule)
        # the first backward of a schedule (each one, TRITONGRAD_CHECKED=1) lays guard bands around its shadows and
        # buffers and looks for gradient where no tensor lies (_check_strays); not while a CUDA graph is captured,
        # where it could not wait for the device, nor while torch.compile traces it (fake tensors:
        # saved_backward.py's rehearsal on real ones checks)
        checked = checks(plan, *schedule)
        guards = {} if checked and not capturing() and not tracing() and recording_backward.get() is None else None
        # (not while recorded as an op for double backward: its outputs would be the banded buffers)
        shadows: dict[int, torch.Tensor] = {}
        for output, g in zip(plan.outputs, grads, strict=True):
            if output is None or g is None:
                continue
            shadow, reused_as, size, dtype, overlapping = output
            if reused_as is not None and g.is_contiguous() and g.shape == size and g.dtype == dtype:
                shadows[shadow.key] = g if reused_as == size else g.view(reused_as)  # derived kernels only read it:
                # no zero-filled copy
            elif overlapping:  # an expanded output (`y.expand(...)`): each element gets its positions' sum
                _scatter_add(self._shadow(shadows, shadow, guards), g)
            elif (guards is None and shadow.key not in shadows
                  and math.prod(size) == math.prod(plan.buffers[shadow.key][0])):  # a fresh buffer the output's
                shadows[shadow.key] = _Given(shadow, g)  # view covers: the gradient copied in when it is made (not
                # added to zeros), in the dtype its first user wants (an input updated in place: its own)
            else:
                self._shadow(shadows, shadow, guards).add_(g)
        # an empty output given a gradient, or a launch of no programs, passes none back: inputs get zeros there
        empty = any(g is not None and 0 in v.size for v, g in zip(plan.output_views, grads, strict=True))
        for step in steps:
            if 0 in self.launches[step.launch.index].grid:  # (it ran no program: its backward adds nothing)
                empty = True
                continue
            rows, variant = self._run_step(step, saved, shadows, guards)
            if guards is not None:
                with torch._C.DisableTorchFunction():  # (its reads are no use of the gradients: a backward recorded
                    self._check_strays(step, guards, rows, variant)  # as an op (ops/segments.py) is not cut there)
        for buffer in list(shadows.values()):  # (an output's gradient no step used: copied in now)
            if type(buffer) is _Given:
                self._shadow(shadows, buffer.shadow)
        result = self._input_grads(shadows, needs)
        if empty or not all(v.key for v in plan.input_views):  # (an input without elements: key 0, no shadow)
            result = [torch.zeros(v.size, dtype=v.dtype, device=v.device) if g is None and need and (empty or not v.key)
                      else g for v, g, need in zip(plan.input_views, result, needs, strict=True)]
        if guards is None:
            return result
        plan.checked.add(schedule)
        return [None if g is None else g.clone() for g in result]  # not views of the guarded buffers

    def _check_strays(self, step: Step, guards: dict, rows: dict, variant: Any) -> None:
        """Refuse a launch whose backward put gradient on memory outside the tensors it was passed.

        A derived kernel adds each load's gradient at the load's address in the shadow, so this
        means the forward read memory that is not an element of the tensor it was passed (a length,
        stride or count the host function got wrong, a non-contiguous tensor read as contiguous):
        memory whose gradient has nowhere to go (or a fault of tritongrad's: the message names the buffer and
        the derived kernel). Checked: the guard bands around the shadow, and the zeros in the gaps a strided
        view leaves in it; for an input summed in partial rows or written into a buffer of its own (``rows``:
        input -> the rows, their bands, what they are), the bands around and the zeros between each row's
        elements.
        """
        launch = step.launch
        for p in step.wrt:
            v = launch.views[p]
            if p in rows:
                flat, pad, what = rows[p]
                outside = guard_bands.written_outside(flat, pad, ((v.size, v.stride, 0),))
            else:
                key = v.key
                flat, pad, n = guards[key]
                lo = self.plan.storages[key][1]
                views = ([u for u in self.plan.input_views if u.key == key]
                         or [u for u in self.plan.views() if u.key == key])
                # the elements whose gradients the inputs (or, for a buffer, the launches) take
                outside = guard_bands.written_outside(flat, pad, tuple((u.size, u.stride, u.offset - lo)
                                                                       for u in views))
                what = f"its shadow, written by `{variant.writer(p)}`"
            if outside:
                raise guard_bands.StrayWriteError(
                    f"tritongrad.op `{self.name}`: {launch} reads memory outside the elements of the tensor passed to "
                    f"`{p}` (sizes {v.size}, strides {v.stride}): their gradient has nowhere to go. Check the sizes, "
                    "strides and counts the host function passes with that tensor (does it assume contiguous "
                    f"memory?). (Found outside {what}; if the host function is right, tritongrad laid that buffer out "
                    "wrongly: please report it.)")

    def _run_step(self, step: Step, saved: tuple, shadows: dict, guards: dict | None) -> tuple[dict, Any]:
        """Launch one step's derived kernel, under the forward's config or, on a GPU, for a launch offered others (an
        autotuner's, or those declared for its kernel: configs.py), the one under which the backward is fastest (timed
        once per shape). Returns the partial rows of inputs summed in them and the buffers of their own of inputs
        written there (checked backwards), and the variant launched."""
        launch = self.launches[step.launch.index]
        states = kept_states(launch)
        keep = None  # unchecked: launched by the Launcher an earlier backward kept, or keep one
        if guards is None and not tracing() and recording_backward.get() is None:  # (traced: each launch is issued
            # through wrap_triton; recorded: through Triton's run, where the hook sees it)
            try:
                keep = (grad, self.deterministic, launch.args, tuple(launch.kwargs.items()), launch.grid,
                        launch.saved is not None, launch.tiles)  # (tiles: another config's grid may differ)
                launcher = step.launchers.get(keep)
            except TypeError:  # an unhashable argument
                keep = launcher = None
            if launcher:
                launcher(saved, shadows, self._shadow, launch.saved.args if launch.saved is not None else None)
                return {}, None
            if launcher is False:  # not to be kept (Launcher.of): not traced again
                keep = None
        if launch.info.roles is None:
            raise noted(launch.info.error, f"(needed to differentiate {launch} of tritongrad.op `{self.name}`)")
        # the forward's arguments (defaults where not passed) and launch options, all passed by keyword
        args = launch.info.launch_arguments(launch.args, launch.kwargs)
        for p, slot, stand_in in step.launch.from_saved:
            args[p] = saved[slot] if slot is not None else stand_in_tensor(stand_in)
        grid, config = tuple(launch.grid), ()
        if launch.tiles is not None and states is None and not self.deterministic:
            config = self._tiles(step, launch, args, shadows)
            if config:
                args.update(config)
                grid = launch.tiles.grid(config)
        return self._launch(step, launch, args, grid, config, shadows, guards, keep=keep, saved=saved)

    def _tiles(self, step: Step, launch: Any, args: dict, shadows: dict) -> tuple:
        """The config offered (keyword items: tiles.Tiles) under which this step's backward runs fastest; () where
        nothing is timed (tuning.enabled) or none could run. Kept per the launch's non-tensor arguments
        (the plan fixes its tensors' layouts), so that a repeated backward neither describes nor looks up."""
        try:
            known = (launch.args, tuple(launch.kwargs.items()))
            found = step.tiles.get(known)
        except TypeError:  # an unhashable argument
            known = found = None
        if found is not None and (not found or found in launch.tiles.configs):  # (a config whose grid this
            return found  # launch's grid function could not give is not among its: chosen again below)
        device = next((v.device for v in args.values() if isinstance(v, torch.Tensor)), None)
        if not tuning.enabled(device):
            return ()

        def trial(config: tuple) -> Callable[[], Any]:
            named = {**args, **dict(config)}
            grid = launch.tiles.grid(config)
            scratch = {k: v.clone() for k, v in shadows.items()}  # gradients already written stay as they are
            return lambda: self._launch(step, launch, named, grid, config, scratch, None, tuning.DEFAULT)

        key = (id(launch.kernel), launch.tiles.configs, step.wrt, tuning.describe(args))
        found = tuning.best_config(key, launch.tiles.configs, trial)
        if known is not None:
            step.tiles[known] = found
        return found

    def _launch(self, step: Step, launch: Any, args: dict, grid: tuple, config: tuple, shadows: dict,
                guards: dict | None, setting: Any = None, keep: tuple | None = None,
                saved: tuple | None = None) -> tuple[dict, Any]:
        """The derived kernel's launch with the forward's arguments ``args`` (``config``: the config replacing the
        recorded one, else ()). The first writer of a storage's gradient stores it (into
        a buffer left unfilled where its loads cover it, in the input's own dtype where nothing else adds to
        it; into a saved input's own memory where this backward was offered it: donation.py); later ones add to it
        (writes/strategies.py). ``keep``: the launch's key in ``step.launchers``, where a
        Launcher doing the same with the next backward's tensors is kept. ``saved``: the node's saved tensors (None:
        a tuning trial, which writes into no saved tensor)."""
        shadow_of = step.shadows
        # the inputs whose buffers hold gradient: made already, or an output's (made below) that is not the input
        # itself (an input updated in place holds its new values' gradient only where it was given one)
        outputs = {shadow_of[p].key for p in step.outputs}
        written = frozenset(p for p in step.wrt if shadow_of[p].key in shadows
                            or (p not in step.outputs and shadow_of[p].key in outputs))
        bwd, prepared, buffers_of = self._ready(step, launch, args, grid, written, config)
        if self.plan.unused:  # a tensor the op did not keep (derive_ahead) must be one this variant does not read
            for p, slot in step.launch.slots.items():
                if slot in self.plan.unused and p in prepared.variant.reads:
                    raise self.error(f"the backward of {step.launch} reads `{p}`, which the op did not keep: the "
                                     "kernels derived at the call did not read it. This is tritongrad's fault: "
                                     "please report it")
        for n in step.launch.as_left:  # (a specialization that reads nothing back takes no such tensor)
            if n not in bwd.stored_params.values():
                args.pop(n, None)
        # the inputs' buffers first, as their write strategies want them (an input updated in place: its own dtype)
        buffers = {p: self._shadow(shadows, shadow, guards, fill, own, (saved, slot) if slot is not None else None)
                   for p, shadow, fill, own, slot in buffers_of}
        output_grads = {p: self._shadow(shadows, shadow_of[p], guards) for p in step.outputs}
        pad = guard_bands.GUARD[0] if guards is not None else 0
        trace = [] if keep is not None and not bwd.checks.reads_contents else None
        rows = bwd.launch(grid, args, output_grads, buffers, prepared, written, pad, saved=kept_states(launch),
                          setting=setting, trace=trace)
        if keep is not None:
            step.launchers[keep] = trace is not None and Launcher.of(
                step, args, output_grads, buffers_of, buffers, trace, self.deterministic,
                launch.saved.args if launch.saved is not None else None) or False
        return rows, prepared.variant

    def _ready(self, step: Step, launch: Any, args: dict, grid: tuple, written: frozenset, config: tuple) -> tuple:
        """The derived kernel, its prepared variant and how each input's buffer is made: (input, shadow, zero-filled,
        in the input's own dtype) (the choices of ``_buffers``). Looked up by the launch's non-tensor arguments (the
        plan fixes its tensors' layouts): repeated backwards skip ``derive``'s lookup and ``prepare``'s checks and
        choices (microseconds each), but for checks reading tensor contents (indices), which run every time."""
        try:
            key = (grad, self.deterministic, launch.args, tuple(launch.kwargs.items()), config, grid, written,
                   launch.saved is not None, recording_backward.get() is not None)  # (recorded: another variant)
            found = step.ready.get(key)
        except TypeError:  # an unhashable argument
            key = found = None
        if found is not None:
            if found[0].checks.reads_contents:  # (the layouts too: a scatter's ranges lie within its output's)
                found[0].checks.arguments({**args, **self._laid(step)}, grid)
            return found
        try:
            bwd = _derived_kernel(step, launch.kernel, args, self.deterministic)
        except NotDifferentiableError as e:
            raise noted(e, f"(needed to differentiate {launch} of tritongrad.op `{self.name}`)") from None
        laid = self._laid(step)
        prepared = bwd.prepare({**args, **laid} if laid else args, grid, written, step.shared, step.self_overlapping,
                               kept_states(launch))
        found = (bwd, prepared, self._buffers(step, prepared, args, written))
        if key is not None:
            step.ready[key] = found
        return found

    def _laid(self, step: Step) -> dict[str, torch.Tensor]:
        """The layout of each tensor not kept (derive_ahead; not saved: a stand-in), which a write strategy's facts
        and a scatter's launch check read (the kernel reads no value through it), as a meta tensor."""
        slots = step.launch.slots
        return {p: torch.empty_strided(v.size, v.stride, dtype=v.dtype, device="meta")
                for p, v in step.launch.views.items() if slots.get(p) is None or slots[p] in self.plan.unused}

    def _buffers(self, step: Step, prepared: Any, args: dict, written: frozenset = frozenset()
                 ) -> tuple[tuple[str, Shadow, bool, bool, Any], ...]:
        """Per input: its shadow; zero-filled unless the kernel writes every element of the view (and no other
        input's gradient is added there: ``shared``); in the input's own dtype where it is the only gradient the
        storage gets (no other step writes it, no atomics); the saved slot whose memory may take it
        (donation.donor_slot), or None."""
        found = []
        for p in step.wrt:
            c = prepared.choices[p]
            sets_all = c.strategy.unfilled(c) and p not in step.shared
            own = p in step.sole and c.strategy.in_input_dtype()
            slot = donation.donor_slot(self.plan, step, prepared, p, args, not sets_all, own, written)
            found.append((p, step.shadows[p], not sets_all, own, slot))
        return tuple(found)

    def _shadow(self, shadows: dict, shadow: Shadow, guards: dict | None = None, fill: bool = True,
                own_dtype: bool = False, donor: tuple | None = None) -> torch.Tensor:
        """A view's shadow, its storage's buffer made on first use: zero-filled unless ``fill`` is false
        and the buffer is the view itself (then its first writer writes all of it; ``donor``: (saved tensors, slot)
        of a saved input whose memory it may be: donation.donated); in the primal's dtype
        if ``own_dtype`` and the buffer is the view itself, else float32 for half types. With ``guards``
        (a checked backward) the buffer lies between guard bands, ``guards[key] = (all of it, pad, size)``."""
        buffer = shadows.get(shadow.key)
        if buffer is None or type(buffer) is _Given:
            given, buffer = buffer, None
            shape, _, device = self.plan.buffers[shadow.key]
            dtype, whole = self.plan.buffer_dtype(shadow, own_dtype), self.plan.all_of_buffer(shadow)
            if given is not None or (guards is None and not fill and whole):
                if donor is not None and given is None:
                    buffer = donation.donated(*donor, shape, dtype, device)
                if buffer is None:
                    buffer = torch.empty(shape, dtype=dtype, device=device)
            elif guards is None:
                buffer = torch.zeros(shape, dtype=dtype, device=device)
            else:
                n = math.prod(shape)
                pad = guard_bands.band(n, dtype.itemsize)
                flat = guard_bands.fill_bands(torch.zeros(n + 2 * pad, dtype=dtype, device=device), pad)
                buffer, guards[shadow.key] = flat[pad:pad + n].view(shape), (flat, pad, n)
            shadows[shadow.key] = buffer
            if given is not None:
                self._shadow(shadows, given.shadow).copy_(given.g)
        if shadow.view is None:
            return buffer
        size, stride, offset = shadow.view
        return buffer.as_strided(size, stride, buffer.storage_offset() + offset)

    def _input_grads(self, shadows: dict, needs: Sequence[bool]) -> list[torch.Tensor | None]:
        """Each input's gradient, such that autograd, mapping them back through the inputs' views,
        adds each memory element's gradient exactly once: an element several inputs (or one
        self-overlapping input, such as an expanded one) cover goes to the first covering position."""
        plan = self.plan
        if plan.plain_inputs:  # distinct storages, each one contiguous view, no cast: the shadows as they are
            return [shadows.get(v.key) if need else None for v, need in zip(plan.input_views, needs, strict=True)]
        views = plan.input_views
        input_relations(plan)
        live = [need and v.key in shadows for v, need in zip(views, needs, strict=True)]
        for i, (earlier, _) in enumerate(plan.input_relations):  # an input whose elements an earlier one has, each
            if live[i] and any(live[j] for j in earlier):  # of them (a view updated in place and its base, a segment's
                live[i] = False  # inputs both): its gradient would be zeros, and None costs nothing
        grads = []
        for i, (v, shadow) in enumerate(zip(views, plan.input_shadows, strict=True)):
            if not live[i]:
                grads.append(None)
                continue
            g = self._shadow(shadows, shadow)
            later = any(live[j] for j in plan.input_relations[i][1])
            if shadow.view is not None and torch._debug_has_internal_overlap(g):
                g = g * _first_cover(v, plan.storages[v.key][1])
            elif later:
                g = g.clone()
            if later:  # (its elements' gradient is taken: a later input covering them gets zeros there)
                self._shadow(shadows, shadow).zero_()
            grads.append(g if g.dtype == v.dtype else g.to(v.dtype))
        return grads


def input_relations(plan: Plan) -> tuple:
    """Per input of a plan (worked out once): the earlier inputs with its elements, the later ones on its storage."""
    if plan.input_relations is None:
        views = plan.input_views
        plan.input_relations = tuple(
            (tuple(j for j in range(i) if _same_elements(views[j], v)),
             tuple(j for j in range(i + 1, len(views)) if views[j].key == v.key)) for i, v in enumerate(views))
    return plan.input_relations


class _Given:
    """An output's incoming gradient, to be copied into its storage's shadow when that buffer is made
    (PlannedBackward._shadow): made first as the input updated in place there wants it, its gradient written once in its
    own dtype, no float32 copy of a half-precision gradient is made, nor cast back after."""

    __slots__ = ("shadow", "g")

    def __init__(self, shadow: Shadow, g: torch.Tensor):
        self.shadow, self.g = shadow, g

    def clone(self) -> _Given:  # (a tuning trial's copy of the shadows: nothing writes this)
        return self


def _same_elements(u: View, v: View) -> bool:
    """Whether two views of a storage reach the same elements, each once: one span, which each fills."""
    n = v.span[1] - v.span[0]
    return u.key == v.key and u.span == v.span and math.prod(u.size) == math.prod(v.size) == n and n > 0


def derive_ahead(name: str, plan: Plan, launches: Sequence[Any], deterministic: bool = False) -> None:
    """At an op's call, derive the backward kernels a backward of every input and every float output launches (the
    steps' own, which it then launches), so that a kernel that cannot be differentiated is refused at the call, as
    at ``.backward()``, rather than after the forward is done with. Once per plan and per value of the kernels'
    decisive constexprs; refusals of a launch's values (strides, index contents) stay with the backward."""
    if plan.ahead is None:
        plan.ahead = {}  # decisive constexprs' values -> None, or the refusal
        plan.decisive = any(decisive_constexprs(launches[launch.index].kernel) for launch in plan.launches)
    key = tuple(tuple(hashable(_argument(launch, k)) for k in decisive_constexprs(launch.kernel))
                for launch in launches) if plan.decisive else ()
    if key in plan.ahead:
        if plan.ahead[key] is not None:  # (refused before: not derived again)
            raise plan.ahead[key].with_traceback(None)
        return
    every = (tuple(True for _ in plan.input_views), tuple(i not in plan.constants for i in range(len(plan.outputs))))
    read: set[int] = set()  # the saved slots a derived kernel reads
    for step in plan.steps(*every):
        launch = launches[step.launch.index]
        read.update(step.launch.as_left.values())  # (read back under a parameter of the derived kernel's own)
        if launch.info.roles is None or 0 in launch.grid:  # (refused when planned; no program: not launched)
            read.update(slot for slot in step.launch.slots.values() if slot is not None)
            continue
        args = launch.info.launch_arguments(launch.args, launch.kwargs)
        try:
            bwd = _derived_kernel(step, launch.kernel, args, deterministic)
        except NotDifferentiableError as e:
            plan.ahead[key] = noted(e, f"(needed to differentiate {launch} of tritongrad.op `{name}`)")
            raise e.with_traceback(None) from None
        reads = bwd.reads()
        read.update(slot for p, slot in step.launch.slots.items() if slot is not None and p in reads)
    unused = frozenset(range(len(plan.saved))) - read  # kept nothing a derived kernel does not read: a tensor
    plan.unused = unused if not plan.ahead else plan.unused & unused  # only copied for an in-place launch, say
    plan.ahead[key] = None


def kept_states(launch: Any) -> Any:
    """The state tapes a launch's augmented forward kept for its backward (augment.py), or None: none kept, or a
    backward recorded to be differentiated again, which replays the loops instead: its derivation cannot follow a
    value read back through a tape's pointer, and autograd does not see the tapes depend on the inputs."""
    return launch.saved if recording_backward.get() is None else None


def _argument(launch: Any, param: str) -> Any:
    """A recorded launch's argument for ``param`` (its default where not passed), as ``_run_step`` reads it."""
    if param in launch.kwargs:
        return launch.kwargs[param]
    i = launch.info.params.index(param)
    return launch.args[i] if i < len(launch.args) else launch.info.defaults.get(param)


def _derived_kernel(step: Step, kernel: Any, named: dict[str, Any], deterministic: bool = False) -> Any:
    """The derived kernel of the specialization a step's launch runs. Looked up once per specialization:
    grad caches too, but looking up costs microseconds; again if ``grad`` was replaced (tests spy on it)."""
    key = (grad, deterministic, *[hashable(named.get(k)) for k in decisive_constexprs(kernel)])
    bwd = step.derived.get(key)
    if bwd is None:
        bwd = step.derived[key] = grad(kernel, step.wrt, step.outputs, constexprs=named,
                                       deterministic=deterministic, kept_outputs=tuple(sorted(step.launch.kept)))
    return bwd


def _scatter_add(view: torch.Tensor, g: torch.Tensor) -> None:
    """``view += g`` where positions of ``view`` share elements: each element gets the sum of its positions'."""
    flat = view.as_strided((view.untyped_storage().nbytes() // view.element_size(),), (1,), 0)
    index = torch.arange(flat.numel(), device=view.device).as_strided(view.shape, view.stride(), view.storage_offset())
    flat.index_add_(0, index.reshape(-1), g.reshape(-1).to(view.dtype))


def _first_cover(v: View, lo: int) -> torch.Tensor:
    """1 where a position of a self-overlapping view is the first to address its element, else 0."""
    dtype, device = torch.int64, v.device
    address = torch.arange(v.span[1] - lo, dtype=dtype, device=device).as_strided(v.size, v.stride, v.offset - lo)
    address = address.reshape(-1)
    position = torch.arange(address.numel(), dtype=dtype, device=device)
    first = torch.full((v.span[1] - lo,), address.numel(), dtype=dtype, device=device)
    first.scatter_reduce_(0, address, position, "amin")
    return (first[address] == position).reshape(v.size).to(shadow_dtype(v.dtype))
