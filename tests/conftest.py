"""Test setup: without a GPU, kernels run on CPU tensors through Triton's interpreter;
with one, the same tests run compiled, on CUDA tensors (the default device).

TRITON_INTERPRET must be set before any kernel is defined, so this runs first.
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
elif os.environ.get("TRITON_INTERPRET") != "1":
    torch.set_default_device("cuda")
    import triton

    if hasattr(triton, "set_allocator"):  # tensor descriptors made in a kernel need global scratch memory
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))

import pytest  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":  # interpreted kernels also compiled where asked (compile_check.py)
    import compile_check  # noqa: E402

    try:
        compile_check.install()
    except (AttributeError, ImportError) as e:  # a Triton whose internals it reads moved: the suite runs unchecked
        import warnings

        warnings.warn(f"the compile check cannot run with this Triton ({e}): kernels are only interpreted",
                      stacklevel=1)
        del compile_check

DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_gpu2 = pytest.mark.skip(reason="needs two CUDA GPUs")
    for item in items:
        if "interpreter" in item.keywords and os.environ.get("TRITON_INTERPRET") != "1":
            item.add_marker(pytest.mark.skip(reason="a kernel compiled Triton refuses (the interpreter's meaning)"))
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "gpu2" in item.keywords and (not HAS_CUDA or torch.cuda.device_count() < 2):
            item.add_marker(skip_gpu2)


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _compile_check(request):
    """The compile check on for a test marked `compiled` (a fault only a compiled run shows), off for one marked
    `interpreter` (of the interpreter's meaning alone); else as TRITONGRAD_COMPILE_CHECK says."""
    if "compile_check" not in globals():
        yield
        return
    compile_check.active = ("compiled" in request.keywords or compile_check.ENABLED) and \
        "interpreter" not in request.keywords
    yield
    compile_check.active = compile_check.ENABLED


@pytest.fixture
def poisoned_empty(monkeypatch):
    """Buffers tritongrad leaves unfilled (every element stored) come back NaN: a missed element fails. Both of
    torch's unfilled allocations are poisoned (the op's gradient buffers are made by either)."""
    def poisoned(empty):
        def nan_filled(*args, **kwargs):
            t = empty(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return nan_filled

    monkeypatch.setattr(torch, "empty_strided", poisoned(torch.empty_strided))
    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
