"""A training step makes no host sync: every bundled example's op, bare and named, called again after a warm-up,
forward and backward under ``torch.cuda.set_sync_debug_mode("error")`` (any synchronizing copy, ``.item()``,
``.tolist()`` or nonzero on the op's path raises). Also the gradients of that step are PyTorch's."""

import inspect

import pytest
import torch

import tritongrad
from tritongrad.examples import get

pytestmark = pytest.mark.gpu

# the examples a Llama step uses, and the others whose backwards read state tapes or partial rows
NAMES = ("rmsnorm", "layernorm", "add_rmsnorm", "swiglu", "geglu", "softmax", "log_softmax", "cross_entropy",
         "rotary", "flash_attention", "matmul")
BARE: dict[str, object] = {}


def _op(name: str, form: str):
    example = get(name)
    if form == "named":
        return example.op
    if name not in BARE:  # the example's host function as a bare op
        BARE[name] = tritongrad.op(inspect.unwrap(example.op))
    return BARE[name]


def _step(op, inputs):
    for t in inputs:
        if isinstance(t, torch.Tensor):
            t.grad = None
    outputs = op(*inputs)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    outputs = [o for o in outputs if o.requires_grad]
    torch.autograd.backward(outputs, [torch.ones_like(o) for o in outputs])
    return outputs


@pytest.mark.parametrize("form", ["named", "bare"])
@pytest.mark.parametrize("name", NAMES)
def test_a_repeated_step_makes_no_host_sync(name, form):
    example = get(name)
    dtype = torch.bfloat16 if torch.bfloat16 in example.dtypes else torch.float32
    inputs = [t.requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in example.make_inputs(example.sizes[0], "cuda", dtype)]
    op = _op(name, form)
    for _ in range(3):  # warm: kernels compiled and derived, launch settings timed, replays learnt
        _step(op, inputs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            _step(op, inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    floats = [isinstance(t, torch.Tensor) and t.is_floating_point() for t in inputs]
    got = [t.grad for t, f in zip(inputs, floats, strict=True) if f]
    twins = [t.detach().clone().requires_grad_() if f else t for t, f in zip(inputs, floats, strict=True)]
    _step(example.reference, twins)
    want = [t.grad for t, f in zip(twins, floats, strict=True) if f]
    for g, w in zip(got, want, strict=True):
        scale = w.abs().max().item() or 1.0
        assert (g.float() - w.float()).abs().max().item() / scale < 3e-2
