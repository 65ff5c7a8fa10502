"""Seed 001's matrix product with transpose flags, written as the Triton tutorial writes a matmul:
``C = op(A) @ op(B)`` (``op`` transposes where the flag says), a tile of C per program, a loop over K
moving both pointer tiles, autotuned over the tile sizes. A transposed operand is read through its
strides, as the seed does, so no copy is made. The derived backward gives A and B kernels of their
own (each program owns a tile of the gradient and loops over the other axis: no atomics), launched under
whichever of the autotuner's configs makes them fastest (host/configs.py).

``matmul_fixed``: the same product launched with one config (``FIXED``), as hand-tuned code launches it, by a
kernel that declares ``BACKWARD_CONFIGS`` (``tritongrad.backward_configs``: a product does not depend on its tile
sizes), so that its backward runs under whichever of them, or the forward's, is fastest; ``named_tiles=True``
launches a kernel that names its three block sizes tile sizes instead (``backward_configs(tiles=...)``: its
backward's configs made around the launch's, no list written); ``declared=False`` launches the autotuned kernel's
own jit function, whose backward keeps the forward's config (benchmarks/matmul_fixed.py compares them)."""

import os

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize


def configs(tiles) -> list:
    """``triton.Config``s of (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) tuples."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_stages=s, num_warps=w)
            for bm, bn, bk, s, w in tiles]


if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter would time every config: take one
    CONFIGS = configs([(16, 16, 16, 3, 4)])
    FIXED = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    BACKWARD_CONFIGS = configs([(16, 32, 16, 3, 4), (32, 16, 32, 3, 4)])  # (not timed there: the forward's runs)
else:
    CONFIGS = configs([(128, 128, 64, 3, 8), (128, 256, 64, 3, 8), (128, 128, 128, 3, 8), (64, 128, 32, 4, 4),
                       (128, 64, 32, 4, 4), (64, 64, 32, 4, 4)])
    FIXED = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}
    # the autotuner's, and tiles for the backward's products: dA's programs own BLOCK_M x BLOCK_K tiles and loop
    # over N by BLOCK_N, dB's own BLOCK_K x BLOCK_N tiles and loop over M by BLOCK_M
    BACKWARD_CONFIGS = CONFIGS + configs([(128, 128, 64, 4, 8), (64, 256, 64, 3, 8), (256, 128, 64, 3, 8),
                                          (128, 64, 128, 3, 8), (64, 128, 128, 3, 8), (256, 64, 64, 4, 8)])


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, COMPUTE: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=COMPUTE)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, c,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def matmul_launch(a: torch.Tensor, b: torch.Tensor, transpose_a: bool = False, transpose_b: bool = False,
                  kernel=matmul_kernel, config: dict | None = None) -> Launch:
    """The launch of ``op(a) @ op(b)``: a transposed operand is passed with its strides swapped; ``config``: the
    tile sizes and launch options of a kernel that is not autotuned."""
    (M, K), (stride_am, stride_ak) = (a.shape[::-1], a.stride()[::-1]) if transpose_a else (a.shape, a.stride())
    (K2, N), (stride_bk, stride_bn) = (b.shape[::-1], b.stride()[::-1]) if transpose_b else (b.shape, b.stride())
    assert K == K2, f"inner sizes differ: {K} and {K2}"
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)

    def grid(meta):
        return triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"])

    args = (a, b, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, c.stride(0), c.stride(1))
    return Launch(kernel, grid, args, {"COMPUTE": compute_type(a.dtype), **(config or {})}, "c_ptr", c)


@tritongrad.op("tritongrad_examples::matmul")
def matmul(a: torch.Tensor, b: torch.Tensor, transpose_a: bool = False, transpose_b: bool = False) -> torch.Tensor:
    return matmul_launch(a, b, transpose_a, transpose_b)()


# the same kernel, a jit function of its own (a declaration is per kernel object), for launches with a fixed config
matmul_fixed_kernel = tritongrad.backward_configs(BACKWARD_CONFIGS)(triton.jit(matmul_kernel.fn.fn))
# and again, its block sizes named tile sizes: its backward's configs are made around each launch's (host/configs.py)
matmul_tiles_kernel = tritongrad.backward_configs(tiles=("BLOCK_M", "BLOCK_N", "BLOCK_K"))(
    triton.jit(matmul_kernel.fn.fn))
KERNELS = (matmul_kernel,)  # (what `tritongrad show matmul` prints: the two are one source)


@tritongrad.op("tritongrad_examples::matmul_fixed")
def matmul_fixed(a: torch.Tensor, b: torch.Tensor, transpose_a: bool = False, transpose_b: bool = False,
                 declared: bool = True, named_tiles: bool = False) -> torch.Tensor:
    kernel = matmul_tiles_kernel if named_tiles else matmul_fixed_kernel if declared else matmul_kernel.fn
    return matmul_launch(a, b, transpose_a, transpose_b, kernel, FIXED)()


def reference(a: torch.Tensor, b: torch.Tensor, transpose_a: bool = False, transpose_b: bool = False) -> torch.Tensor:
    return (a.T if transpose_a else a) @ (b.T if transpose_b else b)


def make_inputs(size=(45, 37, 70), device="cpu", dtype=torch.float32) -> tuple:
    """``size`` is (M, N, K), or (M, N, K, transpose_a, transpose_b)."""
    m, n, k, *flags = size
    transpose_a, transpose_b = (bool(f) for f in flags) if flags else (False, False)
    a = torch.randn((k, m) if transpose_a else (m, k), device=device, dtype=dtype)
    b = torch.randn((n, k) if transpose_b else (k, n), device=device, dtype=dtype)
    return a, b, transpose_a, transpose_b


# ragged tiles in every dimension, every transpose combination (a 16 x 16 x 16 tile on CPU)
SIZES = ((45, 37, 70), (45, 37, 70, 1, 0), (33, 20, 50, 0, 1), (20, 33, 45, 1, 1))
BENCH_SIZES = ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    m, n, k = size[:3]
    item = itemsize(dtype)
    return {"fwd": (m * k + k * n + m * n) * item, "bwd": (2 * m * n + 2 * m * k + 2 * k * n) * item}


def flops(size) -> dict[str, int]:
    m, n, k = size[:3]
    return {"fwd": 2 * m * n * k, "bwd": 4 * m * n * k}
