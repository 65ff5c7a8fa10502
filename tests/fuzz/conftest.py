"""The fuzzer's kernels run in Triton's interpreter only: their inputs, mirrors and gradients are
float64 CPU tensors (seeded CPU generators), and the interpreter accepts some store shapes the
compiler rejects (a [1, 1] tile stored through [1] pointers). The GPU run covers the rest of the suite."""

import os

import torch

if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    collect_ignore_glob = ["*.py"]

