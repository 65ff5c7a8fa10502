"""Cross-entropy per row over a vocabulary of several blocks: an online log-sum-exp loop (running
max and sum), minus the target's logit, loaded by its index; rows whose target is ``ignore_index``
contribute no loss."""

import torch
import triton
import triton.language as tl

from .launch import Launch

IGNORE_INDEX = -100


@triton.jit
def cross_entropy_kernel(logits_ptr, target_ptr, loss_ptr, V, stride, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    target = tl.load(target_ptr + row)
    m = tl.full((), float("-inf"), logits_ptr.dtype.element_ty)
    s = tl.zeros((), dtype=logits_ptr.dtype.element_ty)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * stride + cols, mask=cols < V, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new))
        m = m_new
    keep = target != ignore_index
    picked = tl.load(logits_ptr + row * stride + target, mask=keep, other=0.0)  # the target's logit
    loss = m + tl.log(s) - picked
    tl.store(loss_ptr + row, tl.where(keep, loss, 0.0))


BLOCK = 32


def cross_entropy_launch(logits: torch.Tensor, target: torch.Tensor) -> Launch:
    assert logits.dim() == 2 and logits.stride(1) == 1
    rows, vocab = logits.shape
    loss = torch.empty(rows, device=logits.device, dtype=logits.dtype)
    args = (logits, target, loss, vocab, logits.stride(0), IGNORE_INDEX)
    return Launch(cross_entropy_kernel, (rows,), args, {"BLOCK": BLOCK}, "loss_ptr", loss)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return cross_entropy_launch(logits, target)()


def reference(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits, target, reduction="none", ignore_index=IGNORE_INDEX)


def make_inputs(device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = 7, 3 * BLOCK + 5
    logits = 3 * torch.randn(rows, vocab, device=device, dtype=dtype)
    target = torch.randint(0, vocab, (rows,), device=device)
    target[1] = target[4] = IGNORE_INDEX
    return logits, target
