"""Compiled forward+backward of a named ``@tritongrad.op``: the opaque registration against the triton_op one.

    python benchmarks/compiled_op.py        # on a GPU

"before": ``TRITONGRAD_OPAQUE_OPS=1`` at registration, the previous named op: an opaque
``custom_op`` whose compiled backward re-runs the forward launches. "after": the default, a
``torch.library.triton_op`` (Inductor traces its launches) whose compiled graph saves what the
backward reads. Both are ``torch.compile(fullgraph=True)`` of ``op(...).sum()``-style losses,
timed with ``triton.testing.do_bench`` (median ms of forward + backward); "eager" is the same op
called eagerly (its tape replayed). The two ops (RMSNorm and row softmax, one program per row) are
defined here so that the script does not depend on the examples' interface.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

import tritongrad

OPAQUE_ENV = "TRITONGRAD_OPAQUE_OPS"  # (tritongrad.ops.library.OPAQUE_ENV)


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(y_ptr + row * stride + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, stride, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


def rmsnorm_body(x, w):
    y = torch.empty_like(x)
    rmsnorm_kernel[(x.shape[0],)](x, w, y, x.stride(0), x.shape[1], 1e-6, BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def softmax_body(x):
    y = torch.empty_like(x)
    softmax_kernel[(x.shape[0],)](x, y, x.stride(0), x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def register(name: str, body, opaque_registration: bool):
    """The named op, registered as before (opaque) or as now."""
    old = os.environ.get(OPAQUE_ENV)
    os.environ[OPAQUE_ENV] = "1" if opaque_registration else "0"
    try:
        return tritongrad.op(name)(body)
    finally:
        if old is None:
            del os.environ[OPAQUE_ENV]
        else:
            os.environ[OPAQUE_ENV] = old


CASES = {
    "rmsnorm": (rmsnorm_body, lambda rows, n, dtype: (torch.randn(rows, n, device="cuda", dtype=dtype),
                                                     torch.randn(n, device="cuda", dtype=dtype))),
    "softmax": (softmax_body, lambda rows, n, dtype: (torch.randn(rows, n, device="cuda", dtype=dtype),)),
}
SHAPES = [(4096, 1000), (8192, 4096)]
DTYPES = [torch.float32, torch.bfloat16]


def fwd_bwd(fn, inputs, g):
    def step():
        y = fn(*inputs)
        y.backward(g)

    return step


def main() -> None:
    for limit in ("recompile_limit", "cache_size_limit"):  # one compiled function per case: 16 in all
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    rows_out = []
    for name, (body, make) in CASES.items():
        before = register(f"tgbench::{name}_opaque", body, True)
        after = register(f"tgbench::{name}", body, False)
        assert before.opaque and before.saving_op is None and not after.opaque and after.saving_op is not None
        for (rows, n) in SHAPES:
            for dtype in DTYPES:
                inputs = [t.requires_grad_() for t in make(rows, n, dtype)]
                g = torch.randn(rows, n, device="cuda", dtype=dtype)
                compiled = {k: torch.compile(lambda *a, op=op: op(*a) * 1.0, fullgraph=True, dynamic=False)
                            for k, op in (("before", before), ("after", after))}
                grads = {}
                for k, f in compiled.items():  # warm up and check that both give the same gradients
                    for t in inputs:
                        t.grad = None
                    fwd_bwd(f, inputs, g)()
                    grads[k] = [t.grad.clone() for t in inputs]
                for a, b in zip(grads["before"], grads["after"], strict=True):
                    torch.testing.assert_close(a, b)
                times = {"eager": triton.testing.do_bench(fwd_bwd(after, inputs, g), grad_to_none=inputs)}
                for k, f in compiled.items():
                    times[k] = triton.testing.do_bench(fwd_bwd(f, inputs, g), grad_to_none=inputs)
                rows_out.append((name, f"{rows}x{n}", str(dtype).removeprefix("torch."), times))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("compiled fwd+bwd, median ms (triton.testing.do_bench)")
    header = f"{'op':<8} {'shape':<10} {'dtype':<9} {'eager':>8} {'before':>8} {'after':>8} {'before/after':>12}"
    print(header)
    print("-" * len(header))
    for name, shape, dtype, t in rows_out:
        print(f"{name:<8} {shape:<10} {dtype:<9} {t['eager']:8.3f} {t['before']:8.3f} {t['after']:8.3f} "
              f"{t['before'] / t['after']:12.2f}")


if __name__ == "__main__":
    main()
