"""The command line and the testing helpers at their edges: a mistake is one line and exit status 2,
long lines wrap; ``backward_launch``'s default ``wrt`` is the launch's floating-point tensors."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from rich.console import Console

import tritongrad
from tritongrad.tools.testing import assert_gradients_match, backward_launch, poison

ROOT = Path(__file__).resolve().parents[1]
RMSNORM = "tritongrad/examples/rmsnorm.py"


def tritongrad_cli(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)}
    if not torch.cuda.is_available():  # on a GPU the CLI runs there, as a user's would
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "tritongrad", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize(("args", "message"), [
    ([f"{RMSNORM}:rmsnorm_fwd", "--wrt", "x_ptr,w_pt"],
     "error: `w_pt` is not a parameter of kernel `rmsnorm_fwd` (its parameters: x_ptr, w_ptr, y_ptr, rstd_ptr, stride, "
     "N, eps, BLOCK, COMPUTE)"),
    ([f"{RMSNORM}:rmsnorm_fwd", "--outputs", "x_ptr"],
     "error: outputs names `x_ptr`, but kernel `rmsnorm_fwd` never stores through it"),
    ([f"{RMSNORM}:reference"],
     f"error: `reference` in {RMSNORM} is not a Triton kernel (it is a function); its kernels: rmsnorm_fwd"),
    ([f"{RMSNORM}:torch"], f"error: `torch` in {RMSNORM} is not a Triton kernel (it is a module); its kernels: "
                           "rmsnorm_fwd"),
    ([f"{RMSNORM}:rmsnorm_bwd"], f"error: {RMSNORM} defines no `rmsnorm_bwd`; its kernels: rmsnorm_fwd"),
    (["tritongrad/examples/nothere.py:k"], "error: no such file: tritongrad/examples/nothere.py"),
    (["rmsnorm_fwd"], "error: no example `rmsnorm_fwd` (there are: sin, softplus, gelu, swiglu, geglu, rmsnorm, "
                      "layernorm, add_rmsnorm, softmax, log_softmax, cross_entropy, rotary, matmul, flash_attention, "
                      "fn1, linear, matvec, gather, transpose; or name FILE.py:KERNEL)"),
    ([RMSNORM], f"error: expected FILE.py:KERNEL (or a bundled example's name), got '{RMSNORM}'"),
    ([f"{RMSNORM}:rmsnorm_fwd", "--wrt", "x_ptr,x_ptr"], "error: wrt names `x_ptr` twice"),
    ([f"{RMSNORM}:rmsnorm_fwd", "--wrt", "N"], "error: wrt names `N`, which kernel `rmsnorm_fwd` does not use as a "
                                               "pointer (its pointer parameters: x_ptr, w_ptr, y_ptr, rstd_ptr)"),
], ids=["wrt-typo", "outputs-not-stored", "a-function", "a-module", "wrong-name", "no-file", "no-example", "no-colon",
        "wrt-twice", "wrt-not-a-pointer"])
def test_show_mistakes_are_one_line_and_exit_status_2(args, message, capsys, monkeypatch):
    from tritongrad.tools import cli

    monkeypatch.chdir(ROOT)  # (in this process; test_a_mistake_exits_2_from_the_command_line runs the command)
    assert cli.main(["show", *args]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == message, err
    assert out == ""


def test_a_mistake_exits_2_from_the_command_line():
    result = tritongrad_cli("show", f"{RMSNORM}:rmsnorm_bwd")
    assert result.returncode == 2, result
    want = f"error: {RMSNORM} defines no `rmsnorm_bwd`; its kernels: rmsnorm_fwd"
    assert result.stderr.strip() == want, result.stderr
    assert result.stdout == ""


def test_show_takes_a_bundled_examples_name(capsys):
    from tritongrad.tools import cli

    assert cli.main(["show", "rmsnorm"]) == 0
    by_name = capsys.readouterr().out
    assert cli.main(["show", f"{RMSNORM}:rmsnorm_fwd"]) == 0
    assert capsys.readouterr().out == by_name and _derived_rmsnorm() in by_name


def test_show_prints_a_refusal_whole_with_exit_status_1(capsys):
    from tritongrad.tools import cli

    assert cli.main(["show", "tests/data/user_ops/softplus_kernels.py:atomic_max_kernel"]) == 1
    err = capsys.readouterr().err
    assert re.match(r"error: \S*softplus_kernels\.py:19: cannot differentiate `atomic_max` of a differentiated value\n"
                    r"    tl\.atomic_max\(y_ptr \+ offs \* 0, .*\n  hint: only tl\.store and tl\.atomic_add outputs",
                    err), err


def test_a_users_module_imports_its_sibling_without_pythonpath():
    """The file's own folder is on the import path (tritongrad_cli's PYTHONPATH holds the repository only)."""
    result = tritongrad_cli("check", "tests/data/user_ops/my_ops.py:my_softplus")
    assert result.returncode == 0 and "all 4 ok" in result.stdout, result.stdout + result.stderr


def _derived_rmsnorm() -> str:
    from tritongrad.examples import rmsnorm

    return tritongrad.grad(rmsnorm.rmsnorm_fwd).src


@pytest.mark.slow  # (seconds: with the slow tests, CI's second command)
def test_demo_piped_keeps_source_lines_whole_and_table_cells_unbroken():
    """`tritongrad demo | cat`: the kernels can be pasted, the table read; COLUMNS=70 is a narrow terminal's."""
    result = tritongrad_cli("demo", columns=70)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout
    derived = _derived_rmsnorm().splitlines()
    assert max(map(len, derived)) > 160  # its signature: longer than any width it could be wrapped at
    assert all(line in lines for line in derived if line.strip()), "a line of the derived kernel was wrapped"
    from tritongrad.examples import NAMES

    cells = {cell.strip() for line in lines if line.startswith("│") for cell in line.split("│")}
    assert set(NAMES) <= cells, f"names broken across lines in the table: {set(NAMES) - cells}"
    steps = [line.split(".")[0] for line in lines if re.match(r"\d+\. ", line)]
    assert steps == ["1", "2", "3"], steps  # two kernels, then the check table (no GPU: no bench)
    assert re.search(r"all \d+ ok", result.stdout)


@pytest.mark.slow  # (a long case; the default run stays near 5 minutes)
def test_check_piped_keeps_table_cells_unbroken():
    result = tritongrad_cli("check", "cross_entropy", "--sizes", "3x45", columns=70)
    assert result.returncode == 0, result.stdout + result.stderr
    cells = {cell.strip() for line in result.stdout.splitlines() if line.startswith("│") for cell in line.split("│")}
    assert "cross_entropy" in cells, result.stdout


def test_demo_on_a_terminal_wraps_long_source_lines_rather_than_cutting_them():
    import io

    from tritongrad.tools.demo import print_source

    line = "def kernel(" + ", ".join(f"argument_{i}" for i in range(12)) + "):"
    screen = io.StringIO()
    print_source(Console(file=screen, force_terminal=True, width=70, color_system=None), line)
    shown = screen.getvalue()
    assert "…" not in shown and len(shown.splitlines()) > 1
    assert "".join(shown.split()) == "".join(line.split())
    piped = io.StringIO()
    print_source(Console(file=piped, width=70), line)
    assert piped.getvalue() == line + "\n"


# -- backward_launch: the default wrt is the launch's float tensors ---------------------------------


@triton.jit
def keep_scale(x_ptr, keep_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = x * keep * 1.5 where keep is a 0/1 mask passed as a bool or int8 tensor."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    keep = tl.load(keep_ptr + offs, mask=mask, other=0)
    tl.store(y_ptr + offs, x * keep.to(x.dtype) * 1.5, mask=mask)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int8])
def test_backward_launch_leaves_bool_and_integer_masks_out_of_the_default_wrt(mask_dtype, device):
    n, block = 300, 128
    x = torch.randn(n, dtype=torch.float64, device=device)
    keep = (torch.rand(n, device=device) > 0.3).to(mask_dtype)
    y = poison(torch.empty_like(x))
    grid = (triton.cdiv(n, block),)
    args = (x, keep, y, n)
    keep_scale[grid](*args, BLOCK=block)
    leaf = x.clone().requires_grad_()
    want = leaf * keep.to(x.dtype) * 1.5
    torch.testing.assert_close(y, want.detach())
    got = backward_launch(keep_scale, grid, args, {"BLOCK": block}, {"y_ptr": torch.ones_like(y)})
    assert set(got) == {"x_ptr"}
    assert_gradients_match(keep_scale, grid, args, {"BLOCK": block}, y, want, [leaf], ["x_ptr"])


def test_backward_launch_still_names_an_integer_tensor_named_in_wrt(device):
    x = torch.randn(40, dtype=torch.float64, device=device)
    keep = torch.ones(40, dtype=torch.int8, device=device)
    y = torch.empty_like(x)
    with pytest.raises(TypeError, match="wrt names `keep_ptr`, but the tensor passed there is torch.int8"):
        backward_launch(keep_scale, (1,), (x, keep, y, 40), {"BLOCK": 64}, {"y_ptr": torch.ones_like(y)},
                        wrt=("x_ptr", "keep_ptr"))
