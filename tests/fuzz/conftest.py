"""The fuzzer's kernels run in Triton's interpreter only: their inputs, mirrors and gradients are
float64 CPU tensors (seeded CPU generators), and the interpreter accepts some store shapes the
compiler rejects (a [1, 1] tile stored through [1] pointers). The GPU run covers the rest of the suite."""

import os

import pytest
import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    collect_ignore_glob = ["*.py"]



SLOW_SHARE = 0.25  # of the slow campaign's kernels passing their first-order checks: differentiated twice, reshaped


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The slow campaign (tests marked slow) also differentiates a share of its kernels twice and calls them through
    reshaping host functions (generate.DOUBLE, RESHAPE); set here, not in the test: hypothesis derives its kernels from
    the test's source."""
    if item.get_closest_marker("slow") is not None:
        from . import generate

        item.shares = generate.DOUBLE, generate.RESHAPE
        generate.DOUBLE = generate.RESHAPE = SLOW_SHARE


def pytest_runtest_teardown(item):
    if hasattr(item, "shares"):
        from . import generate

        generate.DOUBLE, generate.RESHAPE = item.shares
