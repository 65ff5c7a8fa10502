"""benchmarks/matmul_fixed.py runs (not timed here): its --smoke mode, on a CPU through Triton's interpreter, checks
each implementation's gradients and times them on the wall clock; a GPU runs the real thing."""

import pytest
import torch

from benchmarks import matmul_fixed

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the benchmark's smoke mode runs the interpreter on a CPU")


@pytest.mark.slow  # (seconds: with the slow tests, CI's second command)
def test_the_fixed_config_matmul_benchmark_runs_its_smoke_mode(tmp_path):
    rows = matmul_fixed.main(["--smoke", "--out", str(tmp_path / "table.md")])
    assert [r["size"] for r in rows] == [matmul_fixed.SMOKE_SIZE]
    for name in ("fixed", "declared", "tiles", "cuBLAS"):
        assert rows[0][name]["error"] < 1e-12, name
        assert rows[0][name]["eager"][0] > 0
    table = (tmp_path / "table.md").read_text()
    assert "| 45x37x70 | float64 | declared | eager |" in table and "| 45x37x70 | float64 | tiles | eager |" in table


def test_the_benchmark_takes_sizes_as_the_command_line_writes_them():
    args = matmul_fixed.parse(["--sizes", "4096", "8192x8192x1024"])
    assert args.sizes == [(4096, 4096, 4096), (8192, 8192, 1024)] and args.dtype == "bfloat16"
    assert args.impls == list(matmul_fixed.IMPLS)
    with pytest.raises(SystemExit):
        matmul_fixed.parse(["--sizes", "12x3"])
