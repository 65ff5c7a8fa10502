"""Calls varied at the edges: how an op's tensors arrive, accumulators declared float32, and forward mode.

- *pytree arguments* (:func:`form_of`, :func:`pack`, :func:`unpack`): the op built around a fuzzed kernel takes its
  tensors as ``*args`` (as before), one list, a first tensor and a tuple of the rest, or a dict holding a list and a
  tuple; its host function takes them apart again. Every tensor leaf is an input of the op (ops read arguments as
  pytrees), so each form must give the gradients ``*args`` gives.
- *float32-declared state* (:func:`narrow_states`, :func:`narrowed`): a kernel's ``tl.zeros(..., dtype=tl.float64)``
  and ``tl.full(..., c, tl.float64)`` assignments (loop state, accumulators; ``c`` 0, 1 or ``-inf``) declared
  float32, the mirror unchanged: the first float64 value added promotes the state, as Triton does, so the forward
  computes what it computed before and its backward must keep the state in float64.
- *forward mode* (:func:`check_jvp`): ``torch.func.jvp`` of the op against ``torch.func.jvp`` of the mirror, with
  random float64 tangents for every float input; a clear refusal (NotDifferentiableError, OpError) counts apart.
- *double backward* (:func:`check_double_backward`): the op's gradients taken with ``create_graph=True``,
  then the gradient of their dot product with random vectors with respect to the inputs and the output gradients
  (the double-backward trick ``torch.autograd.functional.hvp`` plays), against the same on the mirror; the one
  acceptable refusal is an error saying double backward is not supported.

The choices are drawn from the kernel's ``SEED`` (no draws of the generator's: a seed's kernel is the kernel it was).
"""

from __future__ import annotations

import random
import re

FORMS = ("args", "args", "list", "tuple", "nested")  # the op's arguments: *args (as before, most often) or pytrees
F32_STATE = 0.5  # the share of kernels whose float64 state and accumulator declarations are written float32


def form_of(seed: int) -> str:
    return random.Random(seed * 7901 + 11).choice(FORMS)


def pack(form: str, tensors: list) -> tuple:
    """The op's positional arguments holding ``tensors`` in ``form``."""
    if form == "list":
        return (list(tensors),)
    if form == "tuple":
        return (tensors[0], tuple(tensors[1:]))
    if form == "nested":
        half = len(tensors) // 2
        return ({"head": list(tensors[:half]), "tail": tuple(tensors[half:])},)
    return tuple(tensors)


def unpack(form: str, args: tuple) -> list:
    """The tensors in order, from the op's positional arguments in ``form`` (the host function's side)."""
    if form == "list":
        return list(args[0])
    if form == "tuple":
        return [args[0], *args[1]]
    if form == "nested":
        return [*args[0]["head"], *args[0]["tail"]]
    return list(args)


def narrowed(seed: int) -> bool:
    return random.Random(seed * 6007 + 13).random() < F32_STATE


# starts whose first use promotes exactly: 0 (also sin, sigmoid, exp, ... of it), -inf (a running maximum's), 1 (a
# running product's); a state started at another constant and read nonlinearly (sin(h)) would round in float32 first
_DECLARED = re.compile(r"^(\s*\w+ = tl\.(?:zeros\(.*, dtype=|full\(.*, (?:-float\('inf'\)|1\.0|0\.0), ))tl\.float64\)$")


def narrow_states(lines: list[str]) -> tuple[list[str], int]:
    """Kernel lines with each float64 zeros or full assignment declared float32, and how many were."""
    out, count = [], 0
    for line in lines:
        m = _DECLARED.match(line)
        if m:
            line, count = m.group(1) + "tl.float32)", count + 1
        out.append(line)
    return out, count


def check_jvp(mod, src: str, inputs: dict, form: str):
    """The kernel's op under ``torch.func.jvp`` against the mirror's, float64: the outputs and their tangents."""
    import torch

    import tritongrad
    from tritongrad import NotDifferentiableError, OpError

    from .generate import Outcome, close, first_line, host_function, in_place

    where = f"[jvp, arguments as {form}]"
    names = list(inputs)
    floats = [k for k in names if inputs[k].is_floating_point()]
    g = torch.Generator().manual_seed(mod.SEED + 29)
    tangents = tuple(torch.randn(inputs[k].shape, generator=g, dtype=torch.float64) for k in floats)
    primals = tuple(inputs[k].clone() for k in floats)

    def merged(fl) -> list:
        given = dict(zip(floats, fl, strict=True))
        return [given.get(k, inputs[k]) for k in names]

    def reference(*fl):
        found = mod.mirror(*merged(fl))
        return tuple(found[k] for k in mod.OUTPUTS)

    op = tritongrad.op(host_function(mod, names, form))

    def through_op(*fl):
        tensors = [t.clone() if k in in_place(mod) else t for k, t in zip(names, merged(fl), strict=True)]
        return op(*pack(form, tensors))

    try:
        want, want_t = torch.func.jvp(reference, primals, tangents)
    except Exception as e:  # noqa: BLE001 - the mirror's fault: the generator's
        return Outcome("invalid", f"{where} the mirror under jvp: {first_line(e)}", src)
    if not all(torch.isfinite(w).all() and torch.isfinite(t).all() for w, t in zip(want, want_t, strict=True)):
        return Outcome("passed", f"{where} (not in the mirror's domain: skipped)", src)
    try:
        got, got_t = torch.func.jvp(through_op, primals, tangents)
    except NotDifferentiableError as e:
        return Outcome("refused", f"{where} {e.construct}", src)
    except OpError as e:
        return Outcome("refused", f"{where} {first_line(e)}", src)
    except Exception as e:  # noqa: BLE001 - a crash is a finding
        return Outcome("crashed", f"{where} {first_line(e)}", src)
    for k, w, wt, o, ot in zip(mod.OUTPUTS, want, want_t, got, got_t, strict=True):
        for what, a, b in (("output", o, w), ("tangent", ot, wt)):
            try:
                close(a, b.detach(), mod.TOL)
            except AssertionError as e:
                return Outcome("mismatch", f"{where} {k}'s {what}: {e}\ngot\n{a}\nwant\n{b}", src)
    return Outcome("passed", where, src)


DOUBLE_REFUSAL = "double backward is not supported"  # the one refusal a second differentiation may raise
# constructs whose double backward is known wrong (tests/fuzz/regressions pins each): kernels with one are not run
DOUBLE_KNOWN_BUGS: dict[str, str] = {}  # (none open: cumprod's, between two zeros, is fixed and pinned)


def check_double_backward(mod, src: str, inputs: dict, form: str):
    """The kernel's op differentiated twice against the mirror, float64: the gradients with ``create_graph=True``,
    then the gradients of ``sum(grad * v)`` (``v`` random per input) with respect to the inputs and to the output
    gradients, which require grad too (a Hessian-vector product, and the double-backward trick's Jacobian-vector
    product)."""
    import torch

    import tritongrad
    from tritongrad import NotDifferentiableError, OpError

    from .generate import Outcome, close, first_line, host_function, in_place

    where = f"[double backward, arguments as {form}]"
    known = [f"{k}: {why}" for k, why in DOUBLE_KNOWN_BUGS.items() if k in src]
    if known:
        return Outcome("not run", f"{where} (known bug, {known[0]})", src)
    names = list(inputs)
    floats = [k for k in names if inputs[k].is_floating_point()]
    g = torch.Generator().manual_seed(mod.SEED + 31)
    vectors = {k: torch.randn(inputs[k].shape, generator=g, dtype=torch.float64) for k in floats}
    d_out = mod.make_output_grads()

    def twice(call) -> tuple[list, list]:
        """The first gradients (wrt the float inputs) and the second (wrt the inputs, then the output gradients),
        zeros where unreached."""
        leaves = {k: inputs[k].clone().requires_grad_() for k in floats}
        cotangents = {k: v.clone().requires_grad_() for k, v in d_out.items()}
        outs = call([leaves.get(k, inputs[k]) for k in names])
        pairs = [(o, cotangents[k]) for k, o in zip(mod.OUTPUTS, outs, strict=True) if o.requires_grad]
        first = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), [c for _, c in pairs],
                                    create_graph=True, allow_unused=True) if pairs else [None] * len(leaves)
        dot = [(f * vectors[k]).sum() for k, f in zip(leaves, first, strict=True) if f is not None and f.requires_grad]
        targets = [*leaves.values(), *cotangents.values()]
        second = torch.autograd.grad(sum(dot), targets, allow_unused=True) if dot else [None] * len(targets)
        return ([torch.zeros_like(t) if f is None else f.detach() for f, t in zip(first, leaves.values(), strict=True)],
                [torch.zeros_like(t) if s is None else s for s, t in zip(second, targets, strict=True)])

    def reference(tensors):
        found = mod.mirror(*tensors)
        return tuple(found[k] for k in mod.OUTPUTS)

    op = tritongrad.op(host_function(mod, names, form))

    def through_op(tensors):
        return op(*pack(form, [t.clone() if k in in_place(mod) else t for k, t in zip(names, tensors, strict=True)]))

    try:
        want_first, want_second = twice(reference)
    except Exception as e:  # noqa: BLE001 - the mirror's fault: the generator's
        return Outcome("invalid", f"{where} the mirror differentiated twice: {first_line(e)}", src)
    if not all(torch.isfinite(w).all() for w in want_second):
        return Outcome("passed", f"{where} (not in the mirror's domain: skipped)", src)
    try:
        got_first, got_second = twice(through_op)
    except (NotDifferentiableError, OpError) as e:
        if DOUBLE_REFUSAL in str(e):
            return Outcome("refused", f"{where} {first_line(e)}", src)
        return Outcome("crashed", f"{where} refused without saying why: {first_line(e)}", src)
    except Exception as e:  # noqa: BLE001 - a crash is a finding
        return Outcome("crashed", f"{where} {first_line(e)}", src)
    firsts = [f"d_{k} (create_graph)" for k in floats]
    seconds = [f"second d_{k}" for k in floats] + [f"second d_d_{k} (of the output gradient)" for k in d_out]
    for labels, got, want in ((firsts, got_first, want_first), (seconds, got_second, want_second)):
        for k, a, b in zip(labels, got, want, strict=True):
            try:
                close(a, b.detach(), mod.TOL)
            except AssertionError as e:
                return Outcome("mismatch", f"{where} {k}: {e}\ngot\n{a}\nwant\n{b}", src)
    return Outcome("passed", where, src)
