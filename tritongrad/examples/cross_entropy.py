"""Cross-entropy per row over a vocabulary of several blocks: an online log-sum-exp loop (running
max and sum, in float32: ``COMPUTE``, float64 for float64 inputs), minus the target's logit, loaded
by its index; a row whose target is ``ignore_index`` returns early (no loss, no gradient), as
production kernels write it. The per-row losses are what ``F.cross_entropy(reduction="none")`` gives."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize

IGNORE_INDEX = -100


@triton.jit
def cross_entropy_kernel(logits_ptr, target_ptr, loss_ptr, V, stride, ignore_index, BLOCK: tl.constexpr,
                         COMPUTE: tl.constexpr = tl.float32):
    row = tl.program_id(0)
    target = tl.load(target_ptr + row)
    if target == ignore_index:
        tl.store(loss_ptr + row, 0.0)
        return
    m = tl.full((), float("-inf"), COMPUTE)
    s = tl.zeros((), dtype=COMPUTE)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * stride + cols, mask=cols < V, other=float("-inf")).to(COMPUTE)
        m_new = tl.maximum(m, tl.max(x))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
        m = m_new
    picked = tl.load(logits_ptr + row * stride + target).to(COMPUTE)  # the target's logit
    loss = m + tl.log(s) - picked
    tl.store(loss_ptr + row, loss)


def block_for(vocab: int) -> int:
    """Blocks of 4096 columns on large vocabularies; 32 on small ones, so the loop runs several times."""
    return 4096 if vocab >= 8192 else 32


def cross_entropy_launch(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> Launch:
    assert logits.dim() == 2 and logits.stride(1) == 1 and target.shape == logits.shape[:1]
    rows, vocab = logits.shape
    loss = torch.empty(rows, device=logits.device, dtype=logits.dtype)
    args = (logits, target, loss, vocab, logits.stride(0), ignore_index)
    meta = {"BLOCK": block_for(vocab), "COMPUTE": compute_type(logits.dtype)}
    return Launch(cross_entropy_kernel, (rows,), args, meta, "loss_ptr", loss)


@tritongrad.op("tritongrad_examples::cross_entropy")
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    return cross_entropy_launch(logits.contiguous(), target.contiguous(), ignore_index)()


def reference(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits, target, reduction="none", ignore_index=ignore_index)


def make_inputs(size=(7, 101), device="cpu", dtype=torch.float32) -> tuple:
    rows, vocab = size
    logits = 3 * torch.randn(rows, vocab, device=device, dtype=dtype)
    target = torch.randint(0, vocab, (rows,), device=device)
    target[1::5] = IGNORE_INDEX  # every fifth row from the second is ignored
    return logits, target, IGNORE_INDEX


SIZES = ((7, 101), (6, 250))  # 101 = 3 blocks of 32 and 5 columns
BENCH_SIZES = ((8192, 32768), (8192, 131072))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    rows, vocab = size
    logits, per_row = rows * vocab * itemsize(dtype), rows * (itemsize(dtype) + 8)  # loss and int64 target
    return {"fwd": logits + per_row, "bwd": 2 * logits + per_row}  # logits and dloss read, dlogits written
