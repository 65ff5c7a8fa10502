"""How much a faster lowering of input gradients could gain: one elementwise backward
(dx = dy * cos(x), 2**26 float32) written four ways, side by side.

    python3 benchmarks/lowering_headroom.py        (on a GPU)

- zeros + atomic_add: what derived kernels do today (correct for any access pattern);
- zeros + store: owned addresses stored plainly, the buffer still zero-filled;
- zeros + load + store: a non-atomic read-modify-write (owned addresses, accumulating);
- empty + store: owned and covering every element (what a hand-written backward does).
"""

import torch
import triton
import triton.language as tl

ATOMIC, STORE, READ_MODIFY_WRITE = 0, 1, 2


@triton.jit
def sin_backward(x_ptr, dy_ptr, dx_ptr, n, BLOCK: tl.constexpr, MODE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(dy_ptr + offs, mask=mask, other=0.0) * tl.cos(tl.load(x_ptr + offs, mask=mask, other=0.0))
    if MODE == 0:
        tl.atomic_add(dx_ptr + offs, g, mask=mask)
    elif MODE == 1:
        tl.store(dx_ptr + offs, g, mask=mask)
    else:
        tl.store(dx_ptr + offs, tl.load(dx_ptr + offs, mask=mask) + g, mask=mask)


def main() -> None:
    n, block = 1 << 26, 1024
    x, dy = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    grid = (triton.cdiv(n, block),)

    def time(mode: int, zeroed: bool) -> float:
        def step():
            dx = torch.zeros_like(x) if zeroed else torch.empty_like(x)
            sin_backward[grid](x, dy, dx, n, BLOCK=block, MODE=mode)
        return triton.testing.do_bench(step)

    print(torch.cuda.get_device_name(), f"n = {n}, float32, ms (median of do_bench)")
    for name, mode, zeroed in (("zeros + atomic_add", ATOMIC, True), ("zeros + store", STORE, True),
                               ("zeros + load + store", READ_MODIFY_WRITE, True), ("empty + store", STORE, False)):
        print(f"{name:22s} {time(mode, zeroed):.3f}")


if __name__ == "__main__":
    main()
