"""`tritongrad check`: forward and gradients of an op against its reference, as a table with pass/fail
and an exit status (0: all ok, 1: a check failed, 2: a mistake in what to check)."""

import re
from pathlib import Path

import torch

from tritongrad.tools import cli
from tritongrad.tools.check import Row, Subject, check

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
