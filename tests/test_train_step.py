"""benchmarks/train_step.py's smoke mode: a Llama-style model from the bundled examples (2 layers, hidden 32, seq
24, vocab 97) trained 3 steps with AdamW in float64 under Triton's interpreter, with PyTorch's ops (eager) and with
the examples' ops, bare and named: the losses of every step and the first step's gradients, per parameter group,
must be eager's to float64 rounding."""

import math

import pytest
import torch

from benchmarks import train_step
from benchmarks.train_report import GROUPS

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the benchmark's smoke mode runs the interpreter on a CPU")


@pytest.mark.slow  # (about 20 s: run by CI's `pytest -m slow`, beside the fuzz campaign)
def test_smoke_training_matches_eager_step_by_step():
    rows = train_step.main(["--smoke"])
    assert [r["variant"] for r in rows] == ["eager", "tritongrad-bare", "tritongrad-named"]
    eager = rows[0]
    assert not eager["notes"], eager["notes"]
    assert len(eager["losses"]) == 3 and all(math.isfinite(x) for x in eager["losses"])
    assert eager["losses"][0] != eager["losses"][-1]  # the optimizer moved the weights: later steps compare too
    for row in rows[1:]:
        assert not row["notes"], row["notes"]  # none failed
        assert row["loss_diff"] <= 1e-12, row["losses"]
        assert set(row["grad_errors"]) == set(GROUPS)
        for group, error in row["grad_errors"].items():
            assert error <= 1e-12, (row["variant"], group, error)


def test_gradient_errors_are_per_group_and_see_a_wrong_gradient():
    g = torch.randn(7, 5, dtype=torch.float64)
    n = torch.randn(5, dtype=torch.float64)
    reference = {"model.layers.0.self_attn.q_proj.weight": g, "model.norm.weight": n, "lm_head.weight": g,
                 "model.embed_tokens.weight": g, "model.layers.0.mlp.down_proj.weight": g}
    grads = {**reference, "model.norm.weight": n * 1.01}
    grads.pop("lm_head.weight")  # a missing gradient: infinitely wrong
    errors = train_step.grad_errors(grads, reference)
    assert errors["norms"] == pytest.approx(0.01)
    assert errors["lm_head"] == math.inf
    assert errors["attention"] == errors["mlp"] == errors["embedding"] == 0.0


def test_memory_peak_replays_the_allocators_trace_to_its_highest_point():
    from benchmarks.memory_peak import peak_allocations, site

    model = [{"filename": "/x/site-packages/torch/nn/modules/linear.py", "line": 1, "name": "forward"},
             {"filename": "/x/transformers/models/llama/modeling_llama.py", "line": 7, "name": "forward"}]
    events = [{"action": "alloc", "addr": 1, "size": 300, "frames": model},
              {"action": "free_completed", "addr": 99},  # a block from before the trace: ignored
              {"action": "alloc", "addr": 2, "size": 500, "frames": []},
              {"action": "free_completed", "addr": 1},
              {"action": "alloc", "addr": 3, "size": 100, "frames": model},  # 600 < 800: not a new peak
              {"action": "free_completed", "addr": 2}]
    peak, alive = peak_allocations(events)
    assert peak == 800 and sorted(alive) == [1, 2]
    assert site(alive[1][1], 2) == "transformers/models/llama/modeling_llama.py:7 forward"
    assert site(alive[2][1], 2) == "<autograd engine>"
