"""The call varied, not only the kernel: a fuzzed kernel and its mirror run again with their inputs and
outputs bound to memory as users bind it.

A :class:`Binding` makes input parameters views of *leaf* tensors:

- ``same``: one tensor for two inputs of one shape;
- ``overlap`` / ``packed``: two inputs as overlapping or side-by-side contiguous views of one buffer;
- ``row``: a vector input as a row of a matrix input whose rows are as long (a weight that is a row of x); ``column``
  where the vector is read at the strides the launch passes (stride the matrix's row length);
- for an input the kernel reads at the strides the launch passes (generate.py's ``strided`` programs, ``STRIDED``):
  ``expand`` (stride 0 along an axis), ``transpose``, ``slice`` (a larger tensor's interior), ``every_other``
  element; for two such inputs of one shape, ``interleave`` (``t[..., 0]`` and ``t[..., 1]``), ``shifted`` (rows
  ``t[:-1]`` and ``t[1:]``, overlapping) and ``shifted_columns`` (``t[:, :-1]`` and ``t[:, 1:]``);
- ``shift``: two inputs of one size as contiguous views of one buffer an element or a row apart (overlapping);
- where the module lists inputs a ``tl.dot`` reads (``DOTS``), three times in four one binding overlapping one of
  them with another input (``overlap``, ``shift``, ``shifted``: K and V as shifted views of one tensor), labelled
  ``(dot operands)``;
- with any of these, half the time, the outputs as views of one buffer.

Where the module lists inputs read by sibling loops (generate.py's rereads family, ``REREAD``), the bindings are
drawn among those that bind one of them, if any.

An input the kernel updates in place (generate.py's ``INPLACE``) is bound to a copy of its own (the launch changes it)
and returned as an output; the bindings vary the other inputs.

The mirror reads the same views, so autograd's gradients with respect to the leaves are the truth. The derived
gradients must match them through an op (``tritongrad.op``: autograd maps the views' gradients to the leaves; its
tensors passed as variations.py's argument form for the kernel) and
through the raw derived kernel (``backward_launch``: each parameter's gradient buffer, mapped here to its leaf's
memory, an element several positions of an expanded view share counted once). Half the bindings run with
``deterministic=True``. A refusal is acceptable (deterministic refuses to add atomically); a wrong value or a crash
is not.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

BINDINGS = 2  # bindings per kernel in the test suite (campaigns: scripts/fuzz_campaign.py --bindings)


@dataclass
class Binding:
    label: str
    leaves: dict[str, tuple]  # leaf name -> its shape
    views: dict[str, tuple[str, Callable]]  # input parameter -> (its leaf, leaf tensor -> the tensor bound to it)
    packed_outputs: bool = False
    deterministic: bool = False


def candidates(inputs: dict, strided: list[str], in_place: tuple[str, ...] = ()) -> list[Binding]:
    """Every binding that applies to a kernel's inputs (``inputs``: parameter -> its contiguous tensor), but those
    updated in place (``in_place``)."""
    floats = [p for p, t in inputs.items() if t.is_floating_point() and p not in in_place]
    found = []
    for i, p in enumerate(floats):
        for q in floats[i + 1:]:
            a, b = tuple(inputs[p].shape), tuple(inputs[q].shape)
            if a == b:
                found.append(Binding(f"same {p} {q}", {p: a}, {p: (p, _itself), q: (p, _itself)}))
            n, m = math.prod(a), math.prod(b)
            for k in sorted({1, min(n, m)}):
                found.append(Binding(f"overlap {p} {q} by {k}", {"base": (n + m - k,)},
                                     {p: ("base", _flat(0, a)), q: ("base", _flat(n - k, b))}))
            found.append(Binding(f"packed {p} {q}", {"base": (n + m,)}, {p: ("base", _flat(0, a)),
                                                                        q: ("base", _flat(n, b))}))
            for k in sorted({1, a[-1]} - {n} if n == m and n > 1 else ()):  # one storage shifted by an element or a row
                found.append(Binding(f"shift {p} {q} by {k}", {"base": (n + k,)},
                                     {p: ("base", _flat(0, a)), q: ("base", _flat(k, b))}))
    for p in floats:  # a vector as a row (or, read at the launch's strides, a column) of a matrix
        for q in floats:
            a, b = tuple(inputs[p].shape), tuple(inputs[q].shape)
            if len(a) != 1 or len(b) != 2:
                continue
            if b[1] == a[0]:
                found.append(Binding(f"row {p} of {q}", {q: b}, {q: (q, _itself),
                                                               p: (q, lambda t, r=b[0] // 2: t[r])}))
            if b[0] == a[0] and p in strided:
                found.append(Binding(f"column {p} of {q}", {q: b}, {q: (q, _itself),
                                                                  p: (q, lambda t, c=b[1] - 1: t[:, c])}))
    strided = [p for p in strided if p in floats]
    for p in strided:
        shape = tuple(inputs[p].shape)
        for axis in range(len(shape)):
            small = tuple(1 if j == axis else n for j, n in enumerate(shape))
            found.append(Binding(f"expand {p} along {axis}", {p: small},
                                 {p: (p, lambda t, shape=shape: t.expand(shape))}))
        if len(shape) == 2:
            found.append(Binding(f"transpose {p}", {p: shape[::-1]}, {p: (p, lambda t: t.t())}))
            found.append(Binding(f"slice {p}", {p: (shape[0] + 2, shape[1] + 3)},
                                 {p: (p, lambda t, s=shape: t[1:s[0] + 1, 2:s[1] + 2])}))
        else:
            found.append(Binding(f"every_other {p}", {p: (2 * shape[0],)}, {p: (p, lambda t: t[::2])}))
    for i, p in enumerate(strided):
        for q in strided[i + 1:]:
            shape = tuple(inputs[p].shape)
            if shape != tuple(inputs[q].shape):
                continue
            found.append(Binding(f"interleave {p} {q}", {"base": (*shape, 2)},
                                 {p: ("base", lambda t: t[..., 0]), q: ("base", lambda t: t[..., 1])}))
            found.append(Binding(f"shifted {p} {q}", {"base": (shape[0] + 1, *shape[1:])},
                                 {p: ("base", lambda t, n=shape[0]: t[:n]), q: ("base", lambda t: t[1:])}))
            if len(shape) == 2:  # `x[:, :-1]` and `x[:, 1:]`
                found.append(Binding(f"shifted_columns {p} {q}", {"base": (shape[0], shape[1] + 1)},
                                     {p: ("base", lambda t: t[:, :-1]), q: ("base", lambda t: t[:, 1:])}))
    return found


OVERLAPPING = ("overlap", "shift ", "shifted")  # bindings of two inputs to overlapping, shifted memory


def _itself(t):
    return t


def _flat(start: int, shape: tuple) -> Callable:
    n = math.prod(shape)
    return lambda t: t[start:start + n].view(shape)


def choose(mod, count: int) -> list[Binding]:
    """``count`` bindings of a kernel module, picked by its seed; every other one deterministic, half of them with
    the outputs packed into one buffer."""
    rng = random.Random(mod.SEED * 7919 + 1)
    found = candidates(mod.make_inputs(), list(getattr(mod, "STRIDED", ())), tuple(getattr(mod, "INPLACE", ())))
    reread = set(getattr(mod, "REREAD", ()))
    found = [b for b in found if set(b.views) & reread] or found
    dots = set(getattr(mod, "DOTS", ()))  # inputs a tl.dot reads: mostly, one binding overlaps one with another input
    overlapping = [b for b in found if b.label.startswith(OVERLAPPING) and set(b.views) & dots]
    first = [rng.choice(overlapping)] if overlapping and count and rng.random() < 0.75 else []
    for b in first:
        b.label += " (dot operands)"
    picked = first + rng.sample([b for b in found if b not in first], min(count - len(first), len(found) - len(first)))
    for i, b in enumerate(picked):
        b.deterministic = i % 2 == 1
        b.packed_outputs = len(mod.OUTPUTS) > 1 and rng.random() < 0.5
    return picked


def outputs_for(mod, packed: bool) -> dict:
    """Fresh output buffers (zeros where the kernel adds, else NaN), or views of one buffer side by side."""
    import torch

    from tritongrad.tools.testing import poison

    shapes = {k: s for k, s in mod.OUTPUTS.items() if k not in getattr(mod, "INPLACE", ())}  # (not in place)
    if not packed:
        return {k: torch.zeros(s, dtype=torch.float64) if k in mod.ZEROED else
                poison(torch.empty(s, dtype=torch.float64)) for k, s in shapes.items()}
    base = poison(torch.empty(3 + sum(math.prod(s) for s in shapes.values()), dtype=torch.float64))
    found, at = {}, 3  # (not at the buffer's start either)
    for k, s in shapes.items():
        found[k] = base[at:at + math.prod(s)].view(s)
        if k in mod.ZEROED:
            found[k].zero_()
        at += math.prod(s)
    return found


def stride_args(mod, tensors: dict) -> dict:
    """The stride parameters of the inputs read at the strides the launch passes: their tensors' strides."""
    found = {}
    for name in getattr(mod, "STRIDES", {}):
        param, axis = name.rsplit("_s", 1)
        found[name] = tensors[param + "_ptr"].stride(int(axis))
    return found


def memory_gradients(binding: Binding, leaves: dict, got: dict) -> dict:
    """Per leaf, the gradient of its memory from the raw kernel's per-parameter buffers: each buffer's elements
    added at the leaf elements its view reaches, each element once (an expanded view's positions share one)."""
    import torch

    found = {k: torch.zeros(v.numel(), dtype=torch.float64) for k, v in leaves.items()}
    for p, (leaf, view) in binding.views.items():
        at = view(torch.arange(leaves[leaf].numel()).view(leaves[leaf].shape)).reshape(-1)
        values = got[p].reshape(-1).to(torch.float64)
        unique, inverse = torch.unique(at, return_inverse=True)
        first = torch.full(unique.shape, at.numel(), dtype=torch.int64).scatter_reduce_(
            0, inverse, torch.arange(at.numel()), "amin")
        found[leaf].index_add_(0, unique, values[first])
    return {k: v.view(leaves[k].shape) for k, v in found.items()}


# -- checking ---------------------------------------------------------------------------------------------------

def check_bindings(mod, src: str, count: int = BINDINGS) -> list:
    """The kernel under ``count`` bindings (:func:`choose`): an Outcome (generate.py) for each."""
    return [check_binding(mod, src, b) for b in choose(mod, count)]


def check_binding(mod, src: str, binding: Binding):
    import torch

    import tritongrad
    from tritongrad import NotDifferentiableError
    from tritongrad.core.errors import OpError
    from tritongrad.tools.testing import backward_launch

    from .generate import Outcome, before_and_after, close, first_line
    from .variations import form_of, pack, unpack

    form = form_of(mod.SEED)  # the op's tensors as *args, a list, a tuple or nested

    where = (f"[binding: {binding.label}{', outputs packed' if binding.packed_outputs else ''}"
             f"{', deterministic' if binding.deterministic else ''}]")
    inputs = mod.make_inputs()
    g = torch.Generator().manual_seed(mod.SEED + 17)
    values = {k: torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2 for k, shape in binding.leaves.items()}
    free = {k: v for k, v in inputs.items() if v.is_floating_point() and k not in binding.views}

    def arguments(leaves: dict, frees: dict) -> dict:
        return {p: binding.views[p][1](leaves[binding.views[p][0]]) if p in binding.views else frees.get(p, t)
                for p, t in inputs.items()}

    def fresh() -> tuple[dict, dict]:
        return ({k: v.clone().requires_grad_() for k, v in values.items()},
                {k: v.clone().requires_grad_() for k, v in free.items()})

    updated = tuple(getattr(mod, "INPLACE", ()))
    tensors = {k: t.clone() if k in updated else t for k, t in arguments(values, free).items()}
    outputs = outputs_for(mod, binding.packed_outputs)
    kwargs = {**tensors, **outputs, **mod.SIZES, **stride_args(mod, tensors), **mod.META}
    try:
        mod.kernel[mod.GRID](**kwargs)
    except Exception as e:
        return Outcome("crashed", f"{where} forward: {first_line(e)}", src)
    outputs.update({k: tensors[k] for k in updated})
    kwargs.update(before_and_after(mod, free, tensors))
    leaves, frees = fresh()
    want = mod.mirror(*arguments(leaves, frees).values())
    for k, w in want.items():
        if not torch.isfinite(w).all():
            return Outcome("passed", f"{where} (not in the mirror's domain: skipped)", src)
        try:
            close(outputs[k], w.detach(), mod.TOL)
        except AssertionError as e:
            return Outcome("mismatch", f"{where} forward {k}: {e}", src)
    d_out = mod.make_output_grads()
    targets = {**leaves, **frees}
    reached = [(w, d_out[k]) for k, w in want.items() if w.requires_grad]
    grads = torch.autograd.grad([w for w, _ in reached], list(targets.values()), [g for _, g in reached],
                                allow_unused=True) if reached else [None] * len(targets)
    wanted = {k: w if w is not None else torch.zeros_like(targets[k]) for k, w in zip(targets, grads, strict=True)}

    # the raw derived kernel: each parameter's gradient buffer, mapped to its leaf's memory
    try:
        got = backward_launch(mod.kernel, mod.GRID, (), kwargs, d_out, deterministic=binding.deterministic)
    except NotDifferentiableError as e:
        return Outcome("refused", f"{where} {e.construct}", src)
    except Exception as e:
        return Outcome("crashed", f"{where} raw: {first_line(e)}", src)
    found = {**memory_gradients(binding, values, got), **{k: got[k] for k in free}}
    for k, w in wanted.items():
        try:
            close(found[k], w, mod.TOL)
        except AssertionError as e:
            return Outcome("mismatch", f"{where} d_{k} (raw): {e}\ngot\n{found[k]}\nwant\n{w}", src)

    # the op: autograd maps the views' gradients to the leaves
    def body(*ts):
        named = dict(zip(inputs, ts, strict=True))
        outs = outputs_for(mod, binding.packed_outputs)
        mod.kernel[mod.GRID](**named, **outs, **mod.SIZES, **stride_args(mod, named), **mod.META)
        return tuple(outs[k] if k in outs else named[k] for k in mod.OUTPUTS)  # (an input updated in place)

    op = tritongrad.op(lambda *args: body(*unpack(form, args)), deterministic=binding.deterministic)
    leaves, frees = fresh()
    try:
        args = {k: t.clone() if k in updated else t for k, t in arguments(leaves, frees).items()}
        outs = dict(zip(mod.OUTPUTS, op(*pack(form, list(args.values()))), strict=True))
        pairs = [(outs[k], d_out[k]) for k in want if outs[k].requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    except (NotDifferentiableError, OpError) as e:
        return Outcome("refused", f"{where} as an op ({form}): {first_line(e)}", src)
    except Exception as e:
        return Outcome("crashed", f"{where} as an op ({form}): {first_line(e)}", src)
    for k, w in wanted.items():
        t = {**leaves, **frees}[k]
        g = t.grad if t.grad is not None else torch.zeros_like(w)
        try:
            close(g, w, mod.TOL)
        except AssertionError as e:
            return Outcome("mismatch", f"{where} d_{k} as an op: {e}\ngot\n{g}\nwant\n{w}", src)
    return Outcome("passed", where, src)
