"""Fuzzed kernels captured in a CUDA graph: kernels tests/fuzz/generate.py draws from a fixed seed, those
with a ``tl.dot`` and those with a loop, each made an op (bare, its tensors in the kernel's own pytree form, and
named), warmed up, one training step (forward + backward into the grads) captured, and replayed on fresh values
copied into the captured inputs and upstream gradients: each replay's gradients those of the eager op on copies of
the same values (test_graphs_gpu.py does this for the bundled examples).

The fuzzer's kernels are written for its float64 interpreter runs (tests/fuzz/conftest.py keeps them off compiled
runs); here the GPU test runs them compiled in float32, skipping a kernel the compiler refuses as written (the
interpreter accepts some store shapes the compiler does not), as it skips one tritongrad refuses. Everything but the
capture also runs on the CPU, under the interpreter in float64: the same code with the capture replaced by a plain
call (``test_..._without_capture``), so the drawing, the ops and the comparison are checked without a GPU.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator

import pytest
import torch
from fuzz.generate import KNOWN_BUGS, close, host_function, in_place, load_module, random_program, render
from fuzz.variations import form_of, pack
from triton.compiler.errors import CompilationError

import tritongrad
from tritongrad import NotDifferentiableError, OpError
from tritongrad.host import backward, replay, shadows
from tritongrad.runtime import launch_checks

SEED = 50  # kernel i is random_program(SEED * 1_000_003 + i), as scripts/fuzz_campaign.py numbers a campaign's
DRAWS = 2000  # kernels looked at per kind (a dot is drawn in about one kernel of 12, a loop in one of 4)
KINDS: dict[str, Callable] = {  # what a kernel must have to be drawn for a kind: by its source, or its nodes' labels
    "dot": lambda program, src: "tl.dot(" in src,
    "loop": lambda program, src: any(label.startswith(("loop_", "cols_")) for label in program.labels()),
}
WARM = 3  # eager steps before the capture: the first backward checked, the second keeping its launches, the third
# launching what it kept (what a replay launches)
REPLAYS = 3


def _kernels(kind: str) -> Iterator[tuple[int, object]]:
    """The fixed seed's kernels of ``kind`` (their seeds, for ``python tests/fuzz/generate.py SEED``, and modules), in
    order; not those whose stores collide by construction (the backward must refuse them) nor those updating an input
    in place (a named op may not)."""
    for i in range(DRAWS):
        program, _ = random_program(SEED * 1_000_003 + i, KNOWN_BUGS)
        src = render(program)
        if KINDS[kind](program, src) and "\nEXPECT = " not in src:
            mod = load_module(src)
            if not in_place(mod):
                yield SEED * 1_000_003 + i, mod


def _values(mod, seed: int, device, dtype) -> tuple[dict, dict]:
    """The kernel's inputs and output gradients as its module makes them (its domain: values in [-2, 2], ties,
    index tables), drawn from another seed for ``seed`` > 0, on ``device``, floats in ``dtype``."""
    kernel_seed = mod.SEED
    mod.SEED = kernel_seed + 7919 * seed  # (make_inputs and make_output_grads draw from the module's SEED)
    try:
        with torch.device("cpu"):  # (their generators are CPU generators)
            inputs, grads = mod.make_inputs(), mod.make_output_grads()
    finally:
        mod.SEED = kernel_seed

    def moved(t):
        return t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    return {k: moved(v) for k, v in inputs.items()}, {k: moved(v) for k, v in grads.items()}


OPS: dict = {}


def _op(seed: int, mod, names: list[str], form: str, dtype) -> tuple[Callable, str]:
    """The kernel's op (its inputs ``names``) and the form it takes its tensors in: bare, in the kernel's own pytree
    form (variations.py), or named (one tensor per parameter), made once per kernel."""
    key = (seed, form, dtype)
    if key not in OPS:
        if form == "bare":
            OPS[key] = tritongrad.op(host_function(mod, names, form_of(mod.SEED), dtype)), form_of(mod.SEED)
        else:
            launch = host_function(mod, names, "args", dtype)

            def fn(*args):
                return launch(*args)

            fn.__name__ = fn.__qualname__ = f"fuzzed_{seed}"
            fn.__signature__ = inspect.Signature(
                [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=torch.Tensor) for n in names],
                return_annotation=tuple[(torch.Tensor,) * len(mod.OUTPUTS)])
            OPS[key] = tritongrad.op(f"fuzzgraphs::k{seed}_{str(dtype).removeprefix('torch.')}")(fn), "args"
    return OPS[key]


def _leaves(inputs: dict) -> list:
    return [t for t in inputs.values() if t.requires_grad]


def _clear(leaves) -> None:
    for t in leaves:
        t.grad = None


def _grads(leaves) -> list:
    return [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]


def _step(op, form: str, inputs: dict, upstream: dict) -> Callable:
    """One training step of the op on ``inputs``: forward, backward of the outputs reached from a float input."""

    def step():
        outs = op(*pack(form, list(inputs.values())))
        pairs = [(o, upstream[k]) for k, o in zip(upstream, outs, strict=True) if o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])

    return step


def captured(step: Callable, leaves: list) -> Callable:
    """The step warmed up on a side stream, captured in a CUDA graph; its replay (as test_graphs_gpu.py does)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm: compiled, derived, tuned, the first (checked) backward
        for _ in range(WARM):
            _clear(leaves)
            step()
    torch.cuda.current_stream().wait_stream(side)
    _clear(leaves)
    shadows._stand_ins.clear()  # made again while capturing: they must hold none of the graph's memory
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def replayed():
        graph.replay()
        torch.cuda.synchronize()

    return replayed


@contextlib.contextmanager
def _as_if_capturing():
    """tritongrad told a CUDA graph is being captured (core/device.py's ``capturing``, where it is read): the paths a
    capture takes (a call recorded on its launch record, not replayed; no guard bands; index tensors not read)."""
    modules = (launch_checks, replay, backward)
    kept = [m.capturing for m in modules]
    for m in modules:
        m.capturing = lambda: True
    try:
        yield
    finally:
        for m, was in zip(modules, kept, strict=True):
            m.capturing = was


def called(step: Callable, leaves: list) -> Callable:
    """``captured`` without the capture: the step warmed up the same, then called as if captured for each replay."""
    for _ in range(WARM):
        _clear(leaves)
        step()

    def again():
        _clear(leaves)
        with _as_if_capturing():
            step()

    again()  # (the capture's call: where it refuses, it refuses here)
    return again


def check_kernel(seed: int, mod, form: str, device, dtype, capture: Callable) -> str:
    """One fuzzed kernel's step through ``capture``, replayed on fresh values against the eager op: "captured", or
    why the kernel was skipped ("refused": tritongrad refuses it clearly, eagerly; "refused captured": its launch
    checks read index tensors, which a capture cannot; "not compiled": Triton's compiler refuses the fuzzer's forward
    kernel as written; "no gradient": no output is reached from a float input)."""
    inputs, upstream = _values(mod, 0, device, dtype)
    try:
        host_function(mod, list(inputs), "args", dtype)(*inputs.values())  # the forward alone (compiled on a GPU)
    except CompilationError:
        return "not compiled"
    inputs = {k: v.requires_grad_() if v.is_floating_point() else v for k, v in inputs.items()}
    leaves = _leaves(inputs)
    op, pytree = _op(seed, mod, list(inputs), form, dtype)
    step = _step(op, pytree, inputs, upstream)
    try:  # refused or not, eagerly: under the capture any error fails
        if not any(o.requires_grad for o in op(*pack(pytree, list(inputs.values())))):
            return "no gradient"
        step()
    except (NotDifferentiableError, OpError):
        return "refused"
    _clear(leaves)
    try:
        replayed = capture(step, leaves)
    except NotDifferentiableError as e:  # docs/errors.md: a store at loaded indices is checked on the indices,
        if "CUDA graph being captured" not in str(e):  # which a capture cannot read
            raise
        return "refused captured"
    tol = mod.TOL if dtype == torch.float64 else max(mod.TOL, 1e-4)
    for again in range(1, REPLAYS + 1):
        fresh, fresh_upstream = _values(mod, again, device, dtype)
        with torch.no_grad():  # (index tables keep theirs: a replay launches what the capture's indices chose)
            for k, t in inputs.items():
                if t.requires_grad:
                    t.copy_(fresh[k])
            for k, t in upstream.items():
                t.copy_(fresh_upstream[k])
        replayed()
        got = _grads(leaves)
        copies = {k: v.detach().clone().requires_grad_() if v.requires_grad else v for k, v in inputs.items()}
        _step(op, pytree, copies, upstream)()
        for k, g, w in zip([k for k, v in inputs.items() if v.requires_grad], got, _grads(_leaves(copies)),
                           strict=True):
            try:
                close(g, w, tol)
            except AssertionError as e:
                raise AssertionError(f"replay {again}: d_{k}: {e}") from None
    return "captured"


def check_kind(kind: str, form: str, count: int, least: int, device, dtype, capture: Callable) -> dict:
    """The first ``count`` kernels of ``kind`` that are not skipped, each through ``check_kernel``; at least ``least``
    must be found (else the test would test nothing), and none fail (each failure listed: its kernel printed by
    ``python tests/fuzz/generate.py SEED``). The kernels' seeds by what became of them."""
    found: dict[str, list[int]] = {}
    failures = []
    for seed, mod in _kernels(kind):
        try:
            found.setdefault(check_kernel(seed, mod, form, device, dtype, capture), []).append(seed)
        except Exception as e:  # noqa: BLE001 - listed with the others below
            lines = str(e).strip().splitlines() or [""]  # (a compiler's error: where, then what)
            failures.append(f"kernel {seed} ({form}): {type(e).__name__}: {lines[0]} {lines[-1] * (len(lines) > 1)}")
            found.setdefault("failed", []).append(seed)
        if len(found.get("captured", ())) + len(failures) == count:
            break
    assert not failures and len(found.get("captured", ())) >= least, f"{kind} kernels: {found}\n" + "\n\n".join(
        failures)
    return found


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["bare", "named"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_fuzzed_kernels_captured_in_a_cuda_graph_replay_as_eager(kind, form):
    """6 kernels of each kind, compiled, float32: each replay's gradients the eager op's."""
    check_kind(kind, form, 6, 4, "cuda", torch.float32, captured)


@pytest.mark.slow  # (~20 s: the harness itself, checked in CI's slow run)
@pytest.mark.interpreter  # the fuzzer's kernels as the interpreter runs them (the GPU test above: compiled)
@pytest.mark.parametrize("form", ["bare", "named"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_fuzzed_kernels_replay_as_eager_without_capture(kind, form):
    """The GPU test's harness on the CPU, float64, the capture a plain call: 2 kernels of each kind."""
    check_kind(kind, form, 2, 2, "cpu", torch.float64, called)
