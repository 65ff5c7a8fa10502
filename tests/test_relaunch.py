"""relaunch.Relauncher's decisions, on a stand-in for a compiled Triton kernel (the interpreter has none; the GPU
tests in test_launcher.py and test_op_gpu.py run the real thing): the first launch of each tensor alignment goes
through Triton and keeps its compiled kernel, later ones call that kernel's launcher with the values in Triton's
bound order; a kernel whose binder binds other values, or that reads global values, is always Triton's."""

import pytest
import torch

from tritongrad.runtime import relaunch


class Compiled:
    """A compiled kernel: records what its launcher was called with."""

    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *values):
        return None

    def run(self, *args):
        self.runs.append(args)


class Kernel:
    """A JITFunction: its parameters, a binder, and ``kernel[grid](**args)`` returning a fresh Compiled."""

    arg_names = ("x_ptr", "y_ptr", "n", "BLOCK")

    def __init__(self, binds=None, used_global_vals=None):
        self.pre_run_hooks = []
        self.used_global_vals = used_global_vals or {}
        self.launched = []  # (grid, args, the Compiled it returned) per launch through Triton
        binds = binds or (lambda args: {n: args[n] for n in self.arg_names})
        self.device_caches = {0: (None, None, None, None, lambda **args: (binds(args), [], {}))}

    def __getitem__(self, grid):
        def launch(**args):
            compiled = Compiled()
            self.launched.append((grid, args, compiled))
            return compiled
        return launch


@pytest.fixture
def direct(monkeypatch):
    """Relaunch as on a GPU whose Triton launches as relaunch.py expects."""
    monkeypatch.setattr(relaunch, "supported", lambda: True)
    monkeypatch.setattr(relaunch, "_jit_function", lambda kernel: True)
    monkeypatch.setattr(relaunch, "current_device", lambda: 0)
    monkeypatch.setattr(relaunch, "current_stream", lambda device: "stream")


def arguments(offset: int = 0) -> dict:
    x = torch.randn(40)[offset:offset + 32]
    return {"x_ptr": x, "y_ptr": torch.empty(32), "n": 32, "BLOCK": 32, "num_warps": 4}


def test_each_alignment_is_launched_by_triton_once_then_directly(direct):
    kernel = Kernel()
    relauncher = relaunch.Relauncher(kernel, (3,))
    calls = [arguments(), arguments(), arguments(offset=1), arguments(offset=1), arguments()]
    returned = [relauncher(args) for args in calls]
    assert [args for _, args, _ in kernel.launched] == [calls[0], calls[2]]  # a new alignment: Triton's launch
    aligned, misaligned = (compiled for _, _, compiled in kernel.launched)
    assert returned == [aligned, aligned, misaligned, misaligned, aligned]  # each launch returns its kernel
    for compiled, args in ((aligned, calls[1]), (misaligned, calls[3]), (aligned, calls[4])):
        run = compiled.runs.pop(0)
        assert run[:7] == (3, 1, 1, "stream", "function", "metadata", None)  # grid, stream, kernel, no metadata
        values = run[9:]  # after the launch hooks: every parameter in order, constexprs too, no launch options
        assert len(values) == 4 and values[0] is args["x_ptr"] and values[1] is args["y_ptr"] and values[2:] == (32, 32)
    assert not aligned.runs and not misaligned.runs


def test_a_launch_given_its_triton_launch_uses_it(direct):
    kernel, made = Kernel(), []
    relauncher = relaunch.Relauncher(kernel, (3,))

    def through_triton():
        made.append(Compiled())
        return made[-1]

    args = arguments()
    assert relauncher(args, through_triton) is made[0]
    assert relauncher(arguments(), through_triton) is made[0] and len(made) == 1 and made[0].runs
    assert not kernel.launched


@pytest.mark.parametrize("kernel", [
    Kernel(binds=lambda args: {"x_ptr": args["x_ptr"], "y_ptr": args["y_ptr"], "n": args["n"]}),  # drops BLOCK
    Kernel(binds=lambda args: {**{n: args[n] for n in Kernel.arg_names}, "n": 33}),  # as many, one another
    Kernel(used_global_vals={("SCALE", None): (2.0, {})}),  # Triton checks its globals on every launch
], ids=["fewer values", "another value", "global values"])
def test_a_kernel_it_cannot_repeat_is_always_launched_by_triton(direct, kernel):
    relauncher = relaunch.Relauncher(kernel, (3,))
    for _ in range(3):
        relauncher(arguments())
    assert len(kernel.launched) == 3 and not relauncher.direct
    assert not any(compiled.runs for _, _, compiled in kernel.launched)


@pytest.fixture
def turned_off(monkeypatch):
    monkeypatch.setenv(relaunch.ENV, "0")
    relaunch.supported.cache_clear()
    yield
    monkeypatch.undo()
    relaunch.supported.cache_clear()


def test_turned_off_every_launch_is_tritons(turned_off):
    assert not relaunch.supported()
    kernel = Kernel()
    relauncher = relaunch.Relauncher(kernel, (3,))
    relauncher(arguments())
    relauncher(arguments())
    assert len(kernel.launched) == 2 and not relauncher.direct


def test_only_values_a_key_can_compare_are_kept():
    import triton.language as tl

    assert relaunch.plain_values((1, 2.5, True, None, "x", tl.float32, tl.constexpr(4)))
    assert not relaunch.plain_values((1, object()))


def test_an_ops_forward_launches_go_through_their_relaunchers(monkeypatch, device):
    """The recorded path on a GPU (LaunchRecord._relaunch), taken on a CPU too with the interpreter's kernels (which
    Relaunchers launch through Triton): each forward launch keyed on its recorded arguments, outputs and gradients
    exact."""
    from tritongrad import examples
    from tritongrad.host import launch_record

    monkeypatch.setattr(relaunch, "supported", lambda: True)
    example = examples.get("rmsnorm")
    before = set(launch_record._relaunchers)
    for rows in (7, 7, 5):  # 37 columns: no other test launches rmsnorm so (its keys are new here)
        x, w = (t.double().requires_grad_() for t in example.make_inputs((rows, 37), device=device))
        xr, wr = (t.detach().clone().requires_grad_() for t in (x, w))
        y, want = example.op(x, w), example.reference(xr, wr)
        torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
        upstream = torch.randn_like(want)
        y.backward(upstream)
        want.backward(upstream)
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(w.grad, wr.grad, rtol=1e-12, atol=1e-12)
    made = [r for k, r in launch_record._relaunchers.items() if k not in before]
    compiled = device == "cuda"  # a JITFunction, launched directly from its second call
    assert len(made) == 2 and all(r.kernel is example.module.rmsnorm_fwd and r.direct == compiled for r in made)
