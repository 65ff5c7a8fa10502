"""A derived kernel's source is the same in every process: Python salts str hashes per process
(PYTHONHASHSEED), so a pass that orders the statements it emits by iterating a set of names would move them
between runs, and with them Triton's compile cache key."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tritongrad

ROOT = Path(__file__).resolve().parents[1]

# `tritongrad show` for each: the backward, its variants, what an op keeps and the augmented forward
KERNELS = ["tests/test_attention.py:_attention_bound_branch", "flash_attention", "cross_entropy", "layernorm",
           "softmax", "rmsnorm"]
SHOW_ALL = f"from tritongrad.tools import cli\nfor spec in {KERNELS!r}:\n    assert cli.main(['show', spec]) == 0, spec"


@pytest.mark.slow  # (about 7 s: derives every bundled kernel in two processes)
def test_derived_sources_do_not_depend_on_the_hash_seed():
    # seeds 0 and 1 ordered the bound-branch attention's scaled starts (`l_i = l_i_unscaled * alpha_start`,
    # `acc = ...`) differently while online.py iterated a set of names
    runs = [subprocess.Popen([sys.executable, "-c", SHOW_ALL], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                          "TRITON_INTERPRET": "1", "PYTHONHASHSEED": seed})
            for seed in ("0", "1")]
    (first, err), (second, err_second) = (run.communicate(timeout=600) for run in runs)
    assert runs[0].returncode == 0, err
    assert runs[1].returncode == 0, err_second
    assert first.count("def ") >= len(KERNELS), first
    assert first == second, "\n".join(
        f"{a!r} != {b!r}" for a, b in zip(first.splitlines(), second.splitlines(), strict=False) if a != b)


def test_each_branch_of_a_helper_inlined_twice_comments_its_adjoint():
    """The sweep skips a comment equal to its block's last one; it kept that per id(block), and a branch's block
    freed earlier could hand its id to a later one, whose first `# grad of:` was then dropped."""
    from test_branches import rank_branches

    lines = tritongrad.grad(rank_branches).src.splitlines()
    adjoints = [i for i, line in enumerate(lines) if "tg.sum_grad(" in line]
    assert len(adjoints) == 4, "\n".join(lines)  # two inlined helpers, two `if`s each
    for i in adjoints:
        assert lines[i - 1].strip().startswith("# grad of: t = tl.sum(t, "), "\n".join(lines[i - 2:i + 1])
