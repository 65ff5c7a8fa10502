"""Host functions that reshape around the launch: the op built around a fuzzed kernel takes its
inputs in other shapes and returns its outputs in other shapes, as users' host functions do (Liger's forwards take
``x.view(-1, n)`` of a 3-D activation and return ``y.view(*shape)``), and is checked against the mirror wrapped in
the same reshapes.

Per input (float, not updated in place), drawn by the kernel's ``SEED`` (:func:`draw`):

- ``flat``: the user passes it flat, the host function calls ``x.view(shape)``;
- ``split``: with its first axis split in two (``(a, b, ...)``), the host function calls ``x.reshape(-1, ...)``;
- ``unsqueezed``: with a trailing axis of one, the host function calls ``x.squeeze(-1)``;
- ``copied``: a non-contiguous view (a transposed tensor's ``.t()``, or every other element), which the host
  function copies (``x.contiguous().view(shape)``): the launch reads a tensor PyTorch made inside the op (a segment;
  forward mode refuses it).

Per output (not an input updated in place):

- ``flat_alloc``: allocated flat, returned ``y.view(shape)`` (tritongrad's ``Plan.reshaped`` / ``reused_as``: the
  view is the whole storage in order);
- ``launched_flat``: allocated in its shape, launched as ``y.view(-1)``, returned as allocated;
- ``returned_flat``, ``returned_split``, ``returned_unsqueezed``: returned as ``y.view(-1)``, ``y.view(a, b, ...)``,
  ``y.unsqueeze(0)``;
- ``returned_transposed``: returned as ``y.transpose(0, -1)`` (rank 2 and above);
- ``sliced_alloc``: a slice of a larger allocation (in order, not the whole storage), returned ``.view(shape)``.

The check (:func:`check_reshaped`): the op's outputs against the reference, its gradients against autograd's on the
reference (``OP_CALLS`` calls, inputs and cotangents scaled differently, so later calls replay the first's plan and
launch what it kept; some cotangents non-contiguous: transposed or expanded), then ``torch.func.jvp`` of the op
against the reference's. A clear refusal (NotDifferentiableError, OpError) is acceptable; a wrong value or a crash is
not.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

INPUTS = ("flat", "flat", "split", "unsqueezed", "copied", None, None, None)  # None: passed as the kernel reads it
OUTPUTS = ("flat_alloc", "launched_flat", "returned_flat", "returned_split", "returned_unsqueezed",
           "returned_transposed", "sliced_alloc", None)
OP_CALLS = 3  # the first backward checked, the second keeping its launches, the third launching what it kept


def _split(shape: tuple) -> tuple | None:
    """``shape`` with its first axis split in two (its smallest factor above one first), or None (prime or 1)."""
    n = shape[0]
    a = next((d for d in range(2, n) if n % d == 0), None)
    return (a, n // a, *shape[1:]) if a else None


def draw(mod) -> tuple[dict[str, str], dict[str, str]]:
    """The reshape of each input and output (parameter -> label; those left as they are absent)."""
    rng = random.Random(mod.SEED * 5501 + 23)
    inputs = mod.make_inputs()
    updated = set(getattr(mod, "INPLACE", ()))
    ins, outs = {}, {}
    for k, t in inputs.items():
        if not t.is_floating_point() or k in updated:
            continue
        choice = rng.choice(INPUTS)
        if choice == "split" and _split(tuple(t.shape)) is None:
            choice = "flat"
        if choice:
            ins[k] = choice
    for k, shape in mod.OUTPUTS.items():
        if k in updated:
            continue
        choice = rng.choice(OUTPUTS)
        if choice == "returned_split" and _split(tuple(shape)) is None or (
                choice == "returned_transposed" and len(shape) < 2):
            choice = "returned_flat"
        if choice:
            outs[k] = choice
    if not ins and not outs:  # (a kernel without float inputs or outputs to reshape stays as it is)
        outs.update({k: "flat_alloc" for k in list(mod.OUTPUTS)[:1] if k not in updated})
    return ins, outs


def user_input(how: str, value):
    """The leaf the user holds for an input of the kernel's shape (``value``) reshaped ``how``, and the argument
    made of it (the leaf itself, or a view of it)."""
    shape = tuple(value.shape)
    if how == "flat":
        return value.reshape(-1).clone(), lambda leaf: leaf
    if how == "split":
        return value.reshape(_split(shape)).clone(), lambda leaf: leaf
    if how == "unsqueezed":
        return value.unsqueeze(-1).clone(), lambda leaf: leaf
    if how == "copied":
        if len(shape) == 2:
            return value.t().contiguous(), lambda leaf: leaf.t()
        wide = value.new_zeros((2 * value.numel(),))
        wide[::2] = value.reshape(-1)
        return wide, lambda leaf: leaf[::2]
    return value.clone(), lambda leaf: leaf


def host_input(how: str | None, shape: tuple) -> Callable:
    """What the host function does with the argument to get the tensor it launches the kernel with."""
    if how == "flat":
        return lambda x: x.view(shape)
    if how == "split":
        return lambda x: x.reshape(-1, *shape[1:])
    if how == "unsqueezed":
        return lambda x: x.squeeze(-1)
    if how == "copied":
        return lambda x: x.contiguous().view(shape)
    return lambda x: x


RETURNED = {"returned_flat": lambda y, shape: y.view(-1), "returned_split": lambda y, shape: y.view(_split(shape)),
            "returned_unsqueezed": lambda y, shape: y.unsqueeze(0),
            "returned_transposed": lambda y, shape: y.transpose(0, -1)}


def returned(how: str | None, shape: tuple) -> Callable:
    """What the host function returns of an output buffer of the kernel's shape (the reference returns the same)."""
    if how in RETURNED:
        return lambda y: RETURNED[how](y, shape)
    return lambda y: y.view(shape)  # (an allocation launched flat: viewed back; else as allocated)


def allocation(how: str | None, shape: tuple, zeroed: bool) -> Callable:
    """The buffer the host function allocates for an output of the kernel's shape and launches with: zeros where the
    kernel adds, else NaN."""
    import torch

    from tritongrad.tools.testing import poison

    n = math.prod(shape)

    def fill(t):
        return t.zero_() if zeroed else poison(t)

    if how == "flat_alloc":
        return lambda: fill(torch.empty(n, dtype=torch.float64))
    if how == "sliced_alloc":  # in order, not the whole storage
        return lambda: fill(torch.empty(n + 5, dtype=torch.float64))[2:n + 2]
    if how == "launched_flat":
        return lambda: fill(torch.empty(shape, dtype=torch.float64)).view(-1)
    return lambda: fill(torch.empty(shape, dtype=torch.float64))


def cotangent(shape: tuple, g, kind: int):
    """A random cotangent of ``shape``: contiguous (``kind`` 0, 1), transposed (2, for rank 2 and above) or expanded
    (3: stride 0 along the first axis)."""
    import torch

    if kind == 2 and len(shape) >= 2:
        flipped = (shape[-1], *shape[1:-1], shape[0])
        return torch.randn(flipped, generator=g, dtype=torch.float64).transpose(0, -1)
    if kind == 3:
        return torch.randn((1, *shape[1:]), generator=g, dtype=torch.float64).expand(shape)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def check_reshaped(mod, src: str, inputs: dict, form: str):
    """The kernel's op with reshaping host function (:func:`draw`) against the mirror wrapped alike: outputs and
    gradients over ``OP_CALLS`` calls, then forward mode. An Outcome (generate.py) whose detail names the reshapes."""
    import torch

    import tritongrad
    from tritongrad import NotDifferentiableError, OpError

    from .generate import Outcome, close, first_line, in_place
    from .variations import pack, unpack

    ins, outs = draw(mod)
    where = "[reshaped: " + ", ".join([f"{k} {v}" for k, v in ins.items()] + [f"{k} {v}" for k, v in outs.items()])
    where += f"; arguments as {form}]"
    names = list(inputs)
    shapes = {k: tuple(t.shape) for k, t in inputs.items()}
    into = {k: host_input(ins.get(k), shapes[k]) for k in names}
    allocs = {k: allocation(outs.get(k), s, k in mod.ZEROED) for k, s in mod.OUTPUTS.items()
              if k not in in_place(mod)}
    shown = {k: returned(outs.get(k), s) for k, s in mod.OUTPUTS.items() if k not in in_place(mod)}

    def host(*args):
        named = {k: into[k](x) for k, x in zip(names, unpack(form, args), strict=True)}
        buffers = {k: alloc() for k, alloc in allocs.items()}
        mod.kernel[mod.GRID](**named, **buffers, **mod.SIZES, **getattr(mod, "STRIDES", {}), **mod.META)
        return tuple(shown[k](buffers[k]) if k in buffers else named[k] for k in mod.OUTPUTS)

    def reference(*args):
        found = mod.mirror(*(into[k](x) for k, x in zip(names, args, strict=True)))
        return tuple(shown[k](found[k]) if k in shown else found[k] for k in mod.OUTPUTS)

    op = tritongrad.op(host)
    floats = [k for k in names if inputs[k].is_floating_point()]
    made = {k: user_input(ins.get(k), inputs[k]) for k in floats}  # leaf values and the views made of them
    g = torch.Generator().manual_seed(mod.SEED + 43)

    def arguments(leaves: dict, copy: bool) -> list:
        """The op's tensors made of the leaves (``copy``: those it updates in place copied first)."""
        found = []
        for k in names:
            t = made[k][1](leaves[k]) if k in leaves else inputs[k]
            found.append(t.clone() if copy and k in in_place(mod) else t)
        return found

    for call in range(OP_CALLS):
        values = {k: made[k][0] * (1.0 + 0.01 * call) for k in floats}
        mirrored = {k: v.clone().requires_grad_() for k, v in values.items()}
        try:
            want = reference(*arguments(mirrored, False))
        except Exception as e:  # noqa: BLE001 - the generator's fault
            return Outcome("invalid", f"{where} the reference: {first_line(e)}", src)
        if not all(torch.isfinite(w).all() for w in want):
            continue  # the mirror's domain: not this scale
        d_out = [cotangent(tuple(w.shape), g, (call + i) % 4) * (call + 1) for i, w in enumerate(want)]
        reached = [(w, d) for w, d in zip(want, d_out, strict=True) if w.requires_grad]
        wanted = dict.fromkeys(mirrored)
        if reached:
            grads = torch.autograd.grad([w for w, _ in reached], list(mirrored.values()), [d for _, d in reached],
                                        allow_unused=True)
            wanted = dict(zip(mirrored, grads, strict=True))
        leaves = {k: v.clone().requires_grad_() for k, v in values.items()}
        try:
            got = op(*pack(form, arguments(leaves, True)))
            for k, o, w in zip(mod.OUTPUTS, got, want, strict=True):
                if tuple(o.shape) != tuple(w.shape):
                    return Outcome("mismatch", f"{where} {k}'s shape {tuple(o.shape)}, want {tuple(w.shape)}", src)
                close(o.detach(), w.detach(), mod.TOL)
            pairs = [(o, d) for o, d in zip(got, d_out, strict=True) if o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [d for _, d in pairs])
        except (NotDifferentiableError, OpError) as e:
            return Outcome("refused", f"{where} {first_line(e)}", src)
        except AssertionError as e:
            return Outcome("mismatch", f"{where} output, call {call + 1}: {e}", src)
        except Exception as e:  # noqa: BLE001 - a crash is a finding
            return Outcome("crashed", f"{where} call {call + 1}: {first_line(e)}", src)
        for k, w in wanted.items():
            a = leaves[k].grad if leaves[k].grad is not None else torch.zeros_like(leaves[k])
            w = w if w is not None else torch.zeros_like(leaves[k])
            try:
                close(a, w, mod.TOL)
            except AssertionError as e:
                return Outcome("mismatch", f"{where} d_{k}, call {call + 1}: {e}\ngot\n{a}\nwant\n{w}", src)
    return _check_jvp(mod, src, op, reference, arguments, made, floats, form, where)


def _check_jvp(mod, src: str, op, reference, arguments, made: dict, floats: list, form: str, where: str):
    """``torch.func.jvp`` of the reshaping op against the reference's, random float64 tangents of the leaves."""
    import torch

    from tritongrad import NotDifferentiableError, OpError

    from .generate import Outcome, close, first_line
    from .variations import pack

    g = torch.Generator().manual_seed(mod.SEED + 47)
    primals = tuple(made[k][0].clone() for k in floats)
    tangents = tuple(torch.randn(p.shape, generator=g, dtype=torch.float64) for p in primals)
    def through(*leaves):
        return op(*pack(form, arguments(dict(zip(floats, leaves, strict=True)), True)))

    try:
        want, want_t = torch.func.jvp(lambda *leaves: reference(*arguments(dict(zip(floats, leaves, strict=True)),
                                                                           False)), primals, tangents)
    except Exception as e:  # noqa: BLE001 - the generator's fault
        return Outcome("invalid", f"{where} the reference under jvp: {first_line(e)}", src)
    if not all(torch.isfinite(w).all() and torch.isfinite(t).all() for w, t in zip(want, want_t, strict=True)):
        return Outcome("passed", f"{where} (jvp: not in the mirror's domain, skipped)", src)
    try:
        got, got_t = torch.func.jvp(through, primals, tangents)
    except (NotDifferentiableError, OpError) as e:
        return Outcome("passed", f"{where} (jvp refused: {first_line(e)})", src)
    except Exception as e:  # noqa: BLE001 - a crash is a finding
        return Outcome("crashed", f"{where} jvp: {first_line(e)}", src)
    for k, w, wt, o, ot in zip(mod.OUTPUTS, want, want_t, got, got_t, strict=True):
        for what, a, b in (("output", o, w), ("tangent", ot, wt)):
            try:
                close(a, b.detach(), mod.TOL)
            except AssertionError as e:
                return Outcome("mismatch", f"{where} jvp: {k}'s {what}: {e}\ngot\n{a}\nwant\n{b}", src)
    return Outcome("passed", where, src)
