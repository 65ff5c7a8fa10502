"""benchmarks/forward_mode.py runs (not timed here): its --smoke mode, on a CPU through Triton's interpreter, runs
every path (attention's JVP five ways, the Hessian-vector products of rmsnorm and softmax) at tiny sizes in float64
and checks each against PyTorch's; a GPU runs the real thing."""

import pytest
import torch

from benchmarks import forward_mode


@pytest.mark.slow  # (about 4 s)
@pytest.mark.interpreter  # (its --smoke sets TRITON_INTERPRET for the process: not on a GPU run)
def test_the_forward_mode_benchmark_runs_its_smoke_mode(tmp_path):
    rows = forward_mode.main(["--smoke", "--out", str(tmp_path / "table.md")])
    attention = {(r["mask"], r["impl"]): r for r in rows if r["part"] == "attention"}
    assert set(attention) == {(m, i) for m in ("causal", "full") for i in forward_mode.ATTENTION_IMPLS}
    for (mask, impl), row in attention.items():
        if impl != "func.jvp(sdpa)":  # (no forward AD of SDPA on a CPU: a note)
            assert row["ok"] and row["ms"] > 0, (mask, impl, row)
    assert attention[("causal", "func.jvp(sdpa)")].get("ok") or attention[("causal", "func.jvp(sdpa)")]["note"]
    hvps = {(r["op"], r["impl"]): r for r in rows if r["part"] == "hvp"}
    assert set(hvps) == {(op, i) for op in forward_mode.HVP_OPS for i in ("tritongrad", "reference")}
    for key, row in hvps.items():
        assert row["ok"] and row["hvp ms"] > 0 and row["fwd+bwd ms"] > 0, (key, row)
    table = (tmp_path / "table.md").read_text()
    assert "| causal | 1x2x20x12 | jvp kernel | float64 |" in table
    assert "| rmsnorm | 7x45 | float64 | tritongrad |" in table


def test_a_wrong_tangent_is_reported_as_failing(monkeypatch):
    """The correctness column is a check: a tangent 1% off fails it (float64's tolerance), the right one passes."""
    def impls(causal):
        def attention(q, k, v):
            return forward_mode.math_attention(q, k, v, causal)

        def jvp(scale):
            def make(q, k, v, tq, tk, tv):
                def call():
                    out, tangent = torch.func.jvp(attention, (q, k, v), (tq, tk, tv))
                    return out, tangent * scale
                return call
            return make
        return {"right": jvp(1.0), "wrong": jvp(1.01)}

    monkeypatch.setattr(forward_mode, "attention_impls", impls)
    args = forward_mode.parse(["--smoke"])
    rows = forward_mode.attention_shape(args, (2, 2, 9, 5), True, "cpu", forward_mode.wall_once)
    assert [(r["impl"], r["ok"]) for r in rows] == [("right", True), ("wrong", False)]


def test_the_benchmark_defaults_are_the_issues_shapes():
    args = forward_mode.parse([])
    assert (args.batch, args.heads, args.seqs, args.dims, args.dtype) == (4, 16, [1024, 4096], [64, 128], "bfloat16")
    assert args.hvp_sizes == [(4096, 4096), (16384, 4096)] and args.parts == list(forward_mode.PARTS)


@pytest.mark.gpu
def test_the_forward_mode_benchmark_runs_compiled_on_small_shapes(tmp_path):
    """The benchmark's GPU path at small shapes: tritongrad's tangent kernel, forward mode through the op and its
    Hessian-vector products, compiled, in bfloat16 and float32, within the dtype's tolerance of float64 PyTorch."""
    rows = forward_mode.main(["--batch", "1", "--heads", "3", "--seqs", "600", "--dims", "64", "--hvp-sizes",
                              "37x1000", "--out", str(tmp_path / "table.md")])
    ours = [r for r in rows if r.get("impl") in ("fwd kernel", "fwd op", "jvp kernel", "func.jvp(op)", "tritongrad")]
    assert len(ours) == 2 * 4 + 2 * 2
    for row in ours:
        assert row.get("ok") and row.get("ms", row.get("hvp ms")) > 0, row
