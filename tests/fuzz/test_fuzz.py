"""Differential fuzzing of derived backward kernels.

Random kernels with loops and branches (tests/fuzz/generate.py) run forward into NaN-poisoned
outputs against a plain-PyTorch mirror, then their derived gradients against torch
autograd on the mirror, then again under other bindings of memory (tests/fuzz/bindings.py:
aliased, overlapping, expanded, transposed and interleaved views, packed outputs, deterministic).
Each kernel's op also runs under ``torch.func.jvp`` against the mirror's, and the call varies at its edges
(tests/fuzz/variations.py: the op's tensors in a list, a tuple or nested; float64 state declared float32; bindings
overlapping a dot's operands); a share of the slow campaign's kernels is also differentiated twice
(variations.check_double_backward) and called through a host function reshaping around the launch
(tests/fuzz/reshapes.py). A refusal (NotDifferentiableError, OpError) is acceptable; a wrong value, a crash, or a
kernel the generator got wrong is not. On failure hypothesis shrinks the kernel and the message holds its
whole module source.

Long runs: ``python scripts/fuzz_campaign.py --kernels 10000 --seed S --strided --bindings 4``; persistent
loops, swizzled program ids and lane splits made frequent: ``--families persistent,swizzle,lane_split``;
the persistent matmul's grouped walk and tiles stored in halves: ``--families grouped_persistent,halves``; an input
read by sibling loops over a row's column blocks, updated in place and read back: ``--families rereads,in_place``.
"""

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import HealthCheck, event, given, settings

from .bounds import checked
from .generate import FOCUS, KNOWN_BUGS, _poisoned_empties, check, load_module, programs, random_program, render, replay
from .reshapes import check_reshaped, draw
from .variations import FORMS, check_double_backward, form_of, narrow_states, pack, unpack

EXAMPLES = 160  # with BINDINGS bindings each (the campaigns in docs/guarantees.md run thousands): `pytest -m slow`
QUICK = 10  # the default run's share: kernels of its own, a tenth of the time
COPIED = 6  # and of the persistent matmul's walk and halves (generate.FOCUS's grouped_persistent, halves)
PASSES = 3  # and of sibling loops over a row's column blocks (rereads, in_place)
EDGE_SEEDS = [0, 62, 12, 157, 260]  # the call's variations: f32 state (0, 62), dot operands overlapping (12, 157, 260)
SLOW_EDGE_SEEDS = {12}  # (a linear recurrence besides: about 10 s, in the slow run)
TWICE_SEEDS = [5, 17, 35, 48, 36, 753]  # kernels differentiated twice: a dot and logsumexp; rsqrt, a division and leaky
# relu; a scatter and rsqrt; a cumsum spelled tl.associative_scan and log2; a reversed linear recurrence's scan of a
# value with itself; one of two values reading both its results, with log, a division and a dot
RESHAPE_SEEDS = [17, 34, 35, 41, 48, 55]  # between them, every input and output reshape of reshapes.py


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(avoid=KNOWN_BUGS))  # open bugs are pinned by tests/fuzz/regressions
def test_derived_gradients_match_the_mirror(program):
    outcome = check(program)
    event(outcome.status + (f": {outcome.detail}" if outcome.status == "refused" else ""))
    for case in outcome.bindings:
        event(f"binding {case.status}")
    assert outcome.status in ("passed", "refused"), outcome.report()


# marked here, not by a decorator: hypothesis derives the kernels it draws from the test's source, so the campaign
# stays the one it was before it moved behind the marker (~150 s on 2 cores; CI runs it after the default run)
test_derived_gradients_match_the_mirror = pytest.mark.slow(test_derived_gradients_match_the_mirror)


@settings(max_examples=QUICK, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(avoid=KNOWN_BUGS))
def test_a_few_derived_gradients_match_the_mirror(program):
    """The default run's fuzzing: fewer kernels than the campaign above, drawn from another seed."""
    test_derived_gradients_match_the_mirror.hypothesis.inner_test(program)


@settings(max_examples=COPIED, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(avoid=KNOWN_BUGS, focus=("grouped_persistent", "halves")))
def test_a_few_kernels_walking_tiles_as_the_persistent_matmul_does_match_the_mirror(program):
    """The default run's share of the issue-38 families the campaigns focus on (``--families
    grouped_persistent,halves``): the persistent matmul's grouped walk with its epilogue's counter, tiles stored in
    halves; passed or refused (those colliding by construction must be), under other bindings too."""
    test_derived_gradients_match_the_mirror.hypothesis.inner_test(program)


@settings(max_examples=PASSES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(avoid=KNOWN_BUGS, focus=("rereads", "in_place")))
def test_a_few_kernels_rereading_a_row_or_reading_back_in_place_updates_match_the_mirror(program):
    """The default run's share of the families of sibling loops over a row's column blocks (``--families
    rereads,in_place``): one input loaded by several passes (written once, or apart), an input updated in place and
    read back by later passes; passed or refused (a read-back of another element, a store after it, another range
    must be), under other bindings too."""
    test_derived_gradients_match_the_mirror.hypothesis.inner_test(program)


def test_seeded_programs_replay_from_their_choices():
    """The campaign's entry point: a seed's recorded choices rebuild its kernel (what `shrink` edits)."""
    for seed in range(20):
        program, choices = random_program(seed)
        assert render(replay(choices)) == render(program)
        program, choices = random_program(seed, focus=FOCUS)  # campaigns' --families
        assert render(replay(choices, focus=FOCUS)) == render(program)


@triton.jit
def _copy_block(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))


def test_an_access_past_a_tensor_is_caught():
    """The bounds check every fuzzed kernel runs under: a block one element longer than its tensors."""
    x, y = torch.randn(7), torch.empty(8)
    with checked():
        _copy_block[(1,)](x, y, BLOCK=4)
        with pytest.raises(Exception, match="a load outside every tensor of the launch"):
            _copy_block[(1,)](x, y, BLOCK=8)


def test_an_ops_tensors_arrive_in_each_pytree_form():
    """variations.py's argument forms: each packs the tensors so that the host function gets them back in order."""
    tensors = [torch.randn(3), torch.randn(2), torch.randn(4)]
    for form in set(FORMS):
        args = pack(form, tensors)
        assert all(a is b for a, b in zip(unpack(form, args), tensors, strict=True)), form
        assert form == "args" or any(isinstance(a, (list, tuple, dict)) for a in args), form


def test_float64_starts_are_declared_float32_where_promotion_keeps_the_forward():
    lines = ["    v2_h = tl.full((), 2.0, tl.float64)",  # sin(h) would round in float32 first: kept
             "    v3_m = tl.full((BN,), -float('inf'), tl.float64)", "    v3_l = tl.zeros((BN, BC), dtype=tl.float64)",
             "    tl.store(y_ptr + rn, tl.zeros((BN,), dtype=tl.float64))"]  # not a state
    got, count = narrow_states(lines)
    assert count == 2 and got[0] == lines[0] and got[3] == lines[3]
    assert got[1].endswith("-float('inf'), tl.float32)") and got[2].endswith("dtype=tl.float32)")


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_EDGE_SEEDS else s
                                  for s in EDGE_SEEDS])
def test_kernels_at_the_edges_match_the_mirror_backward_and_forward(seed):
    """Seeded kernels with each variation of the call drawn (variations.py, bindings.py): float32-declared loop state
    with float64 inputs, an op taking its tensors in a list, a tuple or nested, overlapping shifted views bound to a
    dot's operands; each passes or is refused clearly, under torch.func.jvp too (against the mirror's jvp)."""
    program, _ = random_program(seed, strided=True)
    outcome = check(program)
    assert outcome.status in ("passed", "refused"), outcome.report()
    assert outcome.jvp is not None and outcome.jvp.status in ("passed", "refused"), outcome.report()


def _checked_alone(seed: int, check_call):
    """One check of a seeded kernel's op (not the whole of ``check``), under the bounds check and poisoned empties."""
    program, _ = random_program(seed)
    src = render(program)
    mod = load_module(src)
    with checked(), _poisoned_empties():
        return check_call(mod, src, mod.make_inputs(), form_of(mod.SEED))


@pytest.mark.parametrize("seed", TWICE_SEEDS)
def test_kernels_differentiated_twice_match_the_mirror(seed):
    """The op's gradients with create_graph=True, then the gradient of their dot product with random
    vectors with respect to the inputs and the output gradients, against the mirror's (float64)."""
    outcome = _checked_alone(seed, check_double_backward)
    assert outcome.status == "passed", outcome.report()


@pytest.mark.parametrize("seed", RESHAPE_SEEDS)
def test_reshaping_host_functions_match_the_mirror(seed):
    """The op's host function viewing its inputs into the kernel's shapes and its outputs out of them
    (allocated flat, launched flat, returned flat, split, unsqueezed or transposed, a slice of a larger buffer),
    three calls and forward mode, against the mirror wrapped alike."""
    outcome = _checked_alone(seed, check_reshaped)
    assert outcome.status == "passed", outcome.report()
    assert "(jvp refused" not in outcome.detail or "copied" in outcome.detail, outcome.report()  # (a copy: refused)


def test_the_reshape_seeds_cover_every_reshape():
    from . import reshapes

    seen = set()
    for seed in RESHAPE_SEEDS:
        ins, outs = draw(load_module(render(random_program(seed)[0])))
        seen.update(ins.values(), outs.values())
    assert seen == {k for k in (*reshapes.INPUTS, *reshapes.OUTPUTS) if k}
