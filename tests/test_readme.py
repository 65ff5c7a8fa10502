"""README.md and the docs/ pages run as pasted: each of their python blocks in a fresh interpreter, as a user's
script (no GPU visible, no TRITON_INTERPRET in the environment: a block that defines kernels sets it itself, as the
README says a script on a CPU must), and the README's `check` command line on the module it shows (`my_ops.py`)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON = re.findall(r"^```python\n(.*?)^```$", README, re.S | re.M)
BASH = re.findall(r"^```bash\n(.*?)^```$", README, re.S | re.M)
PAGES = {p.name: re.findall(r"^```python\n(.*?)^```$", p.read_text(), re.S | re.M)  # (architecture.md's blocks
         for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "architecture.md"}  # are lines of the package)
MODULE = "# my_ops.py"  # the first line of the block that is a module for `tritongrad check`


def _user(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT), COLUMNS="160")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _name(block: str) -> str:
    return re.search(r"^(?:def|# )\s*(\w+)", block, re.M).group(1)


def test_the_readme_has_its_python_blocks():
    assert len(PYTHON) >= 3 and sum(b.startswith(MODULE) for b in PYTHON) == 1


# blocks of 4-14 s each (second derivatives, forward mode, a matmul): CI's `pytest -m slow` runs them
SLOW = {"second_order", "calling-convention.md:double_backward", "calling-convention.md:forward_mode",
        "performance.md:matmul_kernel"}
BLOCKS = [(_name(b), b) for b in PYTHON] + [(f"{page}:{_name(b)}", b) for page, blocks in PAGES.items() for b in blocks]


@pytest.mark.parametrize("block", [pytest.param(b, id=i, marks=[pytest.mark.slow] if i in SLOW else [])
                                   for i, b in BLOCKS])
def test_a_python_block_runs_as_pasted(block, tmp_path):
    (tmp_path / "block.py").write_text(block)
    result = _user("block.py", cwd=tmp_path)
    assert result.returncode == 0, f"{block}\n{result.stdout}\n{result.stderr}"
    if "print(bwd.src)" in block:  # the derived kernel, and every parameter the README says the launcher fills in
        assert "def rmsnorm_fwd_bwd(" in result.stdout
        for name, documented in {"programs": "programs", "d_w_ptr_rows": "d_<input>_rows", "STAGES": "STAGES",
                                 "HELD": "HELD"}.items():
            assert re.search(rf"\b{name}\b", result.stdout) and f"`{documented}`" in README, name


@pytest.mark.slow  # (about 8 s: two `tritongrad check` processes)
def test_the_check_line_checks_the_module_it_shows(tmp_path):
    module = next(b for b in PYTHON if b.startswith(MODULE))
    (tmp_path / "my_ops.py").write_text(module)
    line = next(line for b in BASH for line in b.splitlines() if "my_ops.py:" in line)
    command = line.split("#")[0].split()
    assert command[:2] == ["tritongrad", "check"], line
    for args in (command[2:], command[2:3]):  # as written, then with the module's SIZES
        result = _user("-m", "tritongrad", "check", *args, cwd=tmp_path)
        assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
        assert re.search(r"all \d+ ok", result.stdout), result.stdout
