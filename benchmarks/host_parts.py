"""Where a host-bound step's time goes: each piece of an op's forward and backward timed alone on the host.

    python3 benchmarks/host_parts.py rmsnorm [64x4096] [bfloat16]

A small size, so that the GPU never holds the host back: every number is the host's time to queue the
piece (µs, the best of several loops of 500, synchronized only at their ends). Rows: the op's forward, the host
function alone (no op), its forward+backward, and the backward's layers (the
launch record's backward, the derived kernel's launch alone); Liger-Kernel's and a triton launch of the forward
kernel beside them.
"""

import os
import sys
import time

import torch
from host_gpu_split import training_step

import tritongrad
from tritongrad import examples
from tritongrad.runtime import relaunch
from tritongrad.tools.bench.competitors import implementations
from tritongrad.tools.sizes import parse_size

LOOPS, CALLS = 9, 500


def host_us(fn) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(LOOPS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        best = min(best, (time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    return best


def impl_rows(name: str, fn, master: list) -> tuple[list, list, list]:
    """An implementation's forward, forward+backward and backward rows, and the leaves and output gradients used."""
    step = training_step(fn, master)
    leaves = step.leaves
    fwd = host_us(lambda: fn(*leaves))
    both = host_us(step)
    return [(f"{name}: forward", fwd), (f"{name}: forward+backward", both),
            (f"{name}: backward (difference)", both - fwd)], leaves, step.grads


def tritongrad_rows(example, fn, leaves: list, grads: list) -> list:
    """The pieces of tritongrad's step: the host function without the op, the launch record's backward, the derived
    kernel's launch and the partial rows' sum alone."""
    rows = []
    launch = getattr(example.module, f"{example.name}_launch", None)
    if launch is not None:  # the example's host function without the op: its launch alone
        plain = [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves]
        rows.append(("tritongrad: the host function alone (no op, no launch record)",
                     host_us(lambda: launch(*plain)())))
    out = fn(*leaves)  # kept: its graph holds the saved tensors
    node = out.grad_fn
    record, saved, needs = node.record, node.saved_tensors, node.needs_input_grad[2:]
    rows.append(("tritongrad: LaunchRecord.backward alone",
                 host_us(lambda: record.backward(saved, tuple(grads), needs))))
    step = record.plan.steps(tuple(needs), tuple(True for _ in grads))[0]
    launcher = next((v for v in step.launchers.values() if v), None)
    if launcher is None:
        return rows
    part_launch, wired = launcher.launches[0]
    args = dict(part_launch.args)
    buffers = {p: torch.zeros(record.plan.buffers[shadow.key][0], device="cuda")
               for p, shadow, _, _ in launcher.buffers}
    sources = ({p: saved[slot] for p, slot, _ in launcher.from_saved if slot is not None},
               {o: grads[0] for o, _ in launcher.outputs}, buffers)
    for k, source, p in wired:
        args[k] = sources[source].get(p)
    for r in part_launch.partials:
        r.allocate(args, buffers[r.input].device)
    part_launch.part.scratch_args(args, part_launch.grid)
    kernel, grid = part_launch.part.kernel, part_launch.grid
    rows.append((f"tritongrad: derived kernel launch alone ({len(args)} arguments)",
                 host_us(lambda: kernel[grid](**args))))
    try:  # the floor under Triton's launch: its compiled kernel's launcher called with the bound arguments
        from triton.runtime import driver
        compiled = kernel[grid](**args)
        device = driver.active.get_current_device()
        stream = driver.active.get_current_stream(device)
        binder = kernel.device_caches[device][4]
        values = list(binder(**args)[0].values())
        g3 = (*grid, 1, 1)[:3]

        def direct():
            compiled.run(*g3, stream, compiled.function, compiled.packed_metadata,
                         compiled.launch_metadata(grid, stream, *values), None, None, *values)
        rows.append(("tritongrad: derived kernel, compiled launcher called directly", host_us(direct)))
        rows.append(("tritongrad: derived kernel, Triton's binder alone", host_us(lambda: binder(**args))))
    except Exception as e:  # another Triton's internals
        print("direct launch not timed:", type(e).__name__, e)
    rows.append(("tritongrad: partial rows allocated + summed",
                 host_us(lambda: [r.sum(r.allocate(dict(args), buffers[r.input].device), buffers[r.input])
                                  for r in part_launch.partials])))
    return rows


def _floor(leaves: list):
    """An autograd.Function that launches nothing: what autograd itself costs a step."""
    found = [torch.randn_like(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else None for t in leaves]

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            return torch.empty_like(args[0])

        @staticmethod
        def backward(ctx, grad):
            return tuple(found)

    return Floor.apply


def through_triton_rows(op, master: list) -> list:
    """The op's host function as a bare op with its launches made again directly (relaunch.py) and, in the same
    process, as another bare op with every launch through Triton's ``kernel[grid]``."""
    host_function = op.__wrapped__
    rows = impl_rows("bare op, launches made again directly", tritongrad.op(host_function), master)[0]
    os.environ[relaunch.ENV] = "0"
    relaunch.supported.cache_clear()
    try:
        rows += impl_rows("bare op, every launch through Triton", tritongrad.op(host_function), master)[0]
    finally:
        del os.environ[relaunch.ENV]
        relaunch.supported.cache_clear()
    return rows


def main() -> None:
    name = sys.argv[1]
    size = parse_size(sys.argv[2] if len(sys.argv) > 2 else "64x4096")
    dtype_name = sys.argv[3] if len(sys.argv) > 3 else "bfloat16"
    example = examples.get(name)
    master = example.make_inputs(size, device="cuda", dtype=getattr(torch, dtype_name))
    rows = []
    for impl in implementations(example, ["tritongrad", "liger-fwd", "liger", "compile"], dtype_name):
        if impl.make is None:
            continue
        fn = impl.make()
        found, leaves, grads = impl_rows(impl.name, fn, master)
        rows += found
        if impl.name == "tritongrad":
            rows += tritongrad_rows(example, fn, leaves, grads)
            rows += through_triton_rows(fn, master)
    floor = _floor(master)
    rows += impl_rows("autograd floor (a Function: empty_like forward, precomputed gradients)", floor, master)[0]
    rows.append(("torch.empty_like (one allocation)", host_us(lambda: torch.empty_like(master[0]))))
    print(f"{name} {'x'.join(map(str, size))} {dtype_name}: host µs per call ({torch.cuda.get_device_name()}; "
          f"kept backward launches {'direct' if relaunch.supported() else 'through Triton'}: relaunch.py)")
    for label, us in rows:
        print(f"  {label:58} {us:8.1f}")


if __name__ == "__main__":
    main()
