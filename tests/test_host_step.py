"""benchmarks/host_step.py runs (not timed here): each implementation's step checked against the eager reference,
then a couple of steps timed. Under the interpreter its --smoke mode (tiny sizes, CPU); on a GPU two steps."""

import os

import pytest
import torch

from benchmarks import host_step

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the benchmark's smoke mode runs the interpreter on a CPU")

EXAMPLES = ["softmax", "rmsnorm", "layernorm", "swiglu", "sin"]


def test_host_step_runs_every_implementation_it_can():
    if os.environ.get("TRITON_INTERPRET") == "1":
        args = ["--smoke"]
    else:
        args = ["--steps", "2", "--runs", "1", "--dtypes", "float32", "--impls", "tritongrad", "floor", "eager"]
    rows = host_step.main([*args, "--examples", *EXAMPLES])
    assert [r["example"] for r in rows] == EXAMPLES
    for row in rows:
        assert not row["notes"], row["notes"]  # none wrong, none failing
        assert "tritongrad" in row and "eager" in row
        assert ("floor" in row) == (row["example"] != "sin")
        assert all(row[k][0] > 0 for k in host_step.IMPLS if k in row)
    assert "| softmax |" in host_step.markdown(rows, host_step.IMPLS)
