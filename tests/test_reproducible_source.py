"""A derived kernel's source is the same in every process: Python salts str hashes per process
(PYTHONHASHSEED), so a pass that orders the statements it emits by iterating a set of names would move them
between runs, and with them Triton's compile cache key."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# `tritongrad show` for each: the backward, its variants, what an op keeps and the augmented forward
KERNELS = ["tests/test_attention.py:_attention_bound_branch", "flash_attention", "cross_entropy", "layernorm",
           "softmax", "rmsnorm"]
SHOW_ALL = f"from tritongrad.tools import cli\nfor spec in {KERNELS!r}:\n    assert cli.main(['show', spec]) == 0, spec"


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
