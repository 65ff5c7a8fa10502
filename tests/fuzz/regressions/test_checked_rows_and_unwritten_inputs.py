"""Fuzzer findings (seed 5051's campaign of the call's edges, `--strided --bindings 5`), kernels 451, 504, 555, 829 and
1135.

451: a direct launch (``bwd[grid]``) of a kernel summing a weight in partial rows, its gradient buffer every other
element of a tensor: the launch looked for stray writes in the rows without having filled them (rows every program
stores whole are left unfilled where nothing checks them), so their gaps' leftovers read as writes outside the
tensor (StrayWriteError). 555: the first (checked) backward named the kernel writing an input no kernel writes
(``Variant.writer``: StopIteration) before knowing anything was found outside. 1135: a store at `(tl.program_id(0) * 2)
% 2` (0 for both programs: a value programs compute, forms.ProgramValue, as the address's one coordinate) was
accepted, each program's adjoint added (a silent wrong gradient): one such coordinate is now checked apart at launch
too (lanes.launch_check, input_facts' owned loads), and the campaign expects the refusal. 829: a loop carrying a
value started from constexpr arithmetic (`R0 + -1 + 1`): its state tape's type was spelled `(R0 + -1 + 1).dtype`, a
Python number's (AttributeError in the derived kernel); numbers and scalar parameters alone are now promoted with a
bool tensor (value_types.py). 504 (forward mode): the tangent of `tl.reduce(x, None, max, keep_dims=True)` had
tl.sum's kept dims (1, 1), the value tl.reduce's (1,) (it flattens first, interpreted): the tangent is now shaped as
the value (tg.extremum_tangent). Each case is replayed whole."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow  # (three campaign kernels replayed in processes of their own: CI's `pytest -m slow`)
@pytest.mark.parametrize("kernel", [451, 504, 555, 829, 1135])
def test_the_campaign_kernel_passes(kernel):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "fuzz_campaign.py"), "--seed", "5051", "--strided",
                             "--bindings", "5", "--only", str(kernel)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
