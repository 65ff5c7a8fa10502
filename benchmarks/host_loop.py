"""One implementation's training step in a loop, for a sampling profiler to watch the host.

    python3 benchmarks/host_loop.py rmsnorm 16384x4096 bfloat16 tritongrad 35 &
    sleep 22; py-spy record --threads -r 1000 -f raw -d 12 -p $! -o spy.txt    # past compiling and tuning
    python3 benchmarks/spy_table.py spy.txt

(py-spy travels to the GPU machine as a wheel, as Liger-Kernel does.) Prints the µs per step of the whole loop,
synchronized every 20 steps.
"""

import sys
import time

import torch
from host_gpu_split import training_step

from tritongrad import examples
from tritongrad.tools.bench.competitors import implementations
from tritongrad.tools.sizes import parse_size


def main() -> None:
    name, size, dtype_name, impl_name, seconds = sys.argv[1:6]
    example = examples.get(name)
    master = example.make_inputs(parse_size(size), device="cuda", dtype=getattr(torch, dtype_name))
    impl = next(i for i in implementations(example, [impl_name], dtype_name))
    step = training_step(impl.make(), master)
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    start, steps = time.time(), 0
    while time.time() - start < float(seconds):
        for _ in range(20):
            step()
        steps += 20
        torch.cuda.synchronize()
    print(f"{impl_name}: {steps} steps, {(time.time() - start) / steps * 1e6:.1f} µs per step", flush=True)


if __name__ == "__main__":
    main()
