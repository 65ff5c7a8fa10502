"""Checked backwards (runtime/guards.py): every buffer a checked backward's kernels write lies between guard bands
of a sentinel byte, and a write into a band is refused, naming the buffer and the derived kernel. The first backward
of each kind of call is checked; TRITONGRAD_CHECKED=1 (``guards.CHECKED``) checks every backward and direct launches.
Each test breaks a buffer on purpose (sized or laid out wrongly, as K/V buffers once were): without the bands
the kernel would write past the buffer's end (memory corruption); here it is a message."""

import pytest
import torch
import triton
import triton.language as tl
from test_overlapping_operands import ATTENTION, _gradients, _reference

from tritongrad.reverse.state_tape import StateTape
from tritongrad.runtime import guards, launching
from tritongrad.runtime.guards import StrayWriteError
from tritongrad.tools.testing import backward_launch

D = torch.float64


def packed_own_buffer(buffer, dtype, pad=0, fill=launching.zeros_strided):
    """launching.own_buffer as it once was: a view with gaps laid out packed (``zeros_like``), which the
    kernel indexes with the view's strides, past the end."""
    flat = fill((1, buffer.numel() + 2 * pad), (1, 1), dtype=dtype, device=buffer.device)
    if pad:
        guards.fill_bands(flat, pad)
    return flat, flat[0, pad:pad + buffer.numel()].view(buffer.shape)


@pytest.mark.slow  # (a long case; the default run stays near 5 minutes)
def test_a_kernel_of_its_own_writing_past_its_buffer_is_named(monkeypatch):
    """K and V shifted views of one tensor: dK and dV go to buffers of their own (they overlap), written by the
    interchanged kernel. Checked mode checks the second backward too, and names the buffer and the kernel."""
    monkeypatch.setattr(guards, "CHECKED", True)
    leaves = [torch.randn(2, 21, 16, dtype=D), torch.randn(2, 22, 16, dtype=D)]
    build = lambda q, x: (q, x[:, :-1], x[:, 1:])  # noqa: E731
    want = _gradients(lambda q, k, v: _reference(q, k, v, True), leaves, build)
    for _ in range(2):  # the first backward of its kind, then one checked only by checked mode
        for g, w in zip(_gradients(ATTENTION[True], leaves, build), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
    monkeypatch.setattr(launching, "own_buffer", packed_own_buffer)
    with pytest.raises(StrayWriteError, match=r"tensor passed to `k_ptr` \(sizes \(2, 21, 16\), strides \(352, 16, 1\)"
                                              r"\).*Found outside its buffer of its own, written by "
                                              r"`_attention_bwd_k_ptr_v_ptr`"):
        _gradients(ATTENTION[True], leaves, build)


@triton.jit
def _recurrence(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    # h = sin(h) / 2 + x[t], a nonlinear loop: the backward keeps h on a state tape
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    h = tl.zeros([BLOCK], dtype=tl.float64)
    for t in range(0, T):
        h = tl.sin(h) * 0.5 + tl.load(x_ptr + (row * T + t) * BLOCK + cols)
    tl.store(y_ptr + row * BLOCK + cols, h)


def _recurrence_reference(x):
    h = torch.zeros_like(x[:, 0])
    for t in range(x.shape[1]):
        h = torch.sin(h) * 0.5 + x[:, t]
    return h


def test_a_state_tape_too_small_is_named(monkeypatch):
    monkeypatch.setattr(guards, "CHECKED", True)
    x = torch.randn(3, 7, 16, dtype=D)
    args, meta = (x, torch.empty(3, 16, dtype=D), 7), {"BLOCK": 16}
    _recurrence[(3,)](*args, **meta)
    leaf = x.clone().requires_grad_()
    want = _recurrence_reference(leaf)
    torch.testing.assert_close(args[1], want.detach())
    d_y = torch.randn(3, 16, dtype=D)
    got = backward_launch(_recurrence, (3,), args, meta, {"y_ptr": d_y})  # checked, and right
    torch.testing.assert_close(got["x_ptr"], torch.autograd.grad(want, leaf, d_y)[0], rtol=1e-10, atol=1e-10)
    real = StateTape.allocate

    def short(self, launch, programs, device):  # a slot short for the last program
        made = real(self, launch, programs, device)
        return {k: v[:v.numel() - v.numel() // (programs * made[self.slots])] if isinstance(v, torch.Tensor) else v
                for k, v in made.items()}

    monkeypatch.setattr(StateTape, "allocate", short)
    with pytest.raises(StrayWriteError, match=r"the derived kernel `_recurrence_bwd` wrote outside its state tape "
                                              r"`h_tape`"):
        backward_launch(_recurrence, (3,), args, meta, {"y_ptr": d_y})


def test_bands_are_laid_and_read_by_the_byte():
    flat = torch.zeros(2, 40, dtype=torch.float32)
    guards.fill_bands(flat, 8)
    assert not guards.written_outside(flat, 8, (((24,), (1,), 0),))
    flat[1, 39] = 0.0  # a zero written into a band: zero is no sentinel
    assert guards.written_outside(flat, 8)
    flat = guards.fill_bands(torch.zeros(2, 40, dtype=torch.float32), 8)
    flat[0, 8 + 5] = 1.0  # between the bands, in a gap the view leaves (every other element)
    assert guards.written_outside(flat, 8, (((12,), (2,), 0),)) and not guards.written_outside(flat, 8)
    assert guards.band(10, 1) * 1 % guards.ALIGN == 0 and guards.band(10, 8) * 8 % guards.ALIGN == 0
