"""`tritongrad check`: forward and gradients of an op against its reference, as a table with pass/fail
and an exit status (0: all ok, 1: a check failed, 2: a mistake in what to check)."""

import re
from pathlib import Path

import pytest
import torch

from tritongrad.tools import cli
from tritongrad.tools.check import Row, Subject, check
from tritongrad.tools.subjects import UsageError

WRONG = str(Path(__file__).parent / "data" / "wrong_op.py")


def test_an_example_passes(capsys):
    assert cli.main(["check", "softmax", "rmsnorm", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"all 10 ok", out), out  # 2 sizes x (out, d_x) + 2 sizes x (out, d_x, d_w)
    assert "d_w" in out and "float64" in out


def test_a_wrong_op_fails_with_status_1(capsys):
    assert cli.main(["check", f"{WRONG}:my_sin", "--dtype", "float64"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "2 of 2 failed" in out, out


def test_an_unknown_example_is_a_usage_error_listing_the_examples(capsys):
    assert cli.main(["check", "rms_norm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no example `rms_norm` (there are: sin, softplus") and "\n" not in err


def test_a_file_without_the_op_says_what_check_needs(capsys):
    assert cli.main(["check", f"{WRONG}:not_there"]) == 2
    err = capsys.readouterr().err
    assert "defines no `not_there`" in err and "make_inputs(size, device, dtype)" in err


def test_sizes_and_dtypes_from_the_command_line(capsys):
    assert cli.main(["check", "swiglu", "--sizes", "3x5", "--dtype", "float32", "float64"]) == 0
    out = capsys.readouterr().out
    assert "3x5" in out and "float32" in out and "all 6 ok" in out, out


def test_an_exception_is_a_failing_row():
    def broken(x):
        raise RuntimeError("the launcher broke")

    def inputs(size, device, dtype):
        return (torch.randn(size, dtype=dtype),)

    subject = Subject("broken", broken, lambda x: torch.sin(x), inputs, (5,))
    (row,) = check(subject, "cpu", (torch.float64,))
    assert not row.ok and row.error == "RuntimeError: the launcher broke"


def test_errors_are_relative_to_the_expected_magnitude():
    assert Row("x", 1, torch.float32, "out", 1e-3, 1e-4).ok
    assert not Row("x", 1, torch.float32, "out", 1e-1, 1e-2).ok
    assert not Row("x", 1, torch.float64, "out", error="boom").ok


# -- mistakes are named as mistakes: exit status 2, one line, the file and line where there is one -------------------

USER = Path(__file__).parent / "data" / "user_ops"
MY_OPS = str(USER / "my_ops.py")


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, captured
    return err


def test_a_users_op_passes_and_imports_its_sibling(capsys):
    """my_ops.py imports its kernels from softplus_kernels.py beside it: the file's folder is on the import path."""
    assert cli.main(["check", f"{MY_OPS}:my_softplus"]) == 0
    assert "all 4 ok" in capsys.readouterr().out


def test_a_file_without_an_op_name_says_the_form(capsys):
    assert cli.main(["check", MY_OPS, "--sizes", "10"]) == 2
    assert _one_line_error(capsys) == f"error: expected FILE.py:OP (or a bundled example's name), got {MY_OPS!r}"


def test_a_kernel_instead_of_the_op_is_a_mistake(capsys):
    assert cli.main(["check", f"{MY_OPS}:softplus_kernel"]) == 2
    err = _one_line_error(capsys)
    assert re.match(r"error: \S*softplus_kernels\.py:7: `softplus_kernel` is a Triton kernel; name the op that "
                    r"launches it \(a @tritongrad\.op function; `tritongrad show \S*my_ops\.py:softplus_kernel` prints",
                    err), err


def test_make_inputs_without_device_and_dtype_is_a_mistake(capsys):
    assert cli.main(["check", f"{USER / 'no_device.py'}:op"]) == 2
    err = _one_line_error(capsys)
    assert re.match(r"error: \S*no_device\.py:11: make_inputs must take `device` and `dtype`", err), err


def test_sizes_of_another_rank_are_a_mistake(capsys):
    assert cli.main(["check", "rmsnorm", "--sizes", "7"]) == 2
    assert _one_line_error(capsys) == "error: rmsnorm takes sizes of 2 numbers (such as 7x45, 5x200, 16384x1024), not 7"
    assert cli.main(["check", "softmax", "--sizes", "3x4x5"]) == 2  # (was an AssertionError in the launcher)
    assert _one_line_error(capsys).endswith("not 3x4x5")
    assert cli.main(["check", f"{MY_OPS}:my_softplus", "--sizes", "3x4"]) == 2
    assert _one_line_error(capsys) == "error: my_softplus takes sizes of 1 number (such as 45, 130, 1048576), not 3x4"


def test_a_failing_make_inputs_is_a_mistake_located_in_it():
    def make_inputs(size, device, dtype):
        rows, cols = size  # a size of one number
        return (torch.randn(rows, cols, dtype=dtype),)

    subject = Subject("two_d", torch.sin, torch.sin, make_inputs, (5,), file=__file__)
    with pytest.raises(UsageError, match=r"^two_d: make_inputs failed at size 5 \(\S*test_check\.py:\d+\): TypeError: "
                                         r"cannot unpack non-iterable int object$"):
        check(subject, "cpu", (torch.float64,))


def test_an_op_failing_is_a_row_located_in_its_file():
    def op(x):
        assert x.dim() == 2
        return x

    (row,) = check(Subject("flat", op, lambda x: x, lambda size, device, dtype: (torch.randn(size, dtype=dtype),),
                           (5,), file=__file__), "cpu", (torch.float64,))
    assert re.fullmatch(r"AssertionError(: .*)? \(\S*test_check\.py:\d+\)", row.error), row.error


def test_a_refusal_keeps_its_source_line_and_hint(capsys):
    assert cli.main(["check", f"{USER / 'refused.py'}:my_max"]) == 1
    out = capsys.readouterr().out
    assert "softplus_kernels.py:19: cannot differentiate `atomic_max` of a differentiated value\n" in out, out
    assert "    tl.atomic_max(y_ptr + offs * 0, tl.load(x_ptr + offs, mask=mask, other=0.0), mask=mask)\n" in out
    assert "  hint: only tl.store and tl.atomic_add outputs can be differentiated" in out
