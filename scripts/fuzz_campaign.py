"""A long differential-fuzzing campaign: random kernels, derived gradients against PyTorch.

    python scripts/fuzz_campaign.py --kernels 10000 --seed S [--jobs 2] [--shrink DIR] [--avoid-known] \
        [--transpose-every-group] [--strided] [--bindings B] [--families persistent,swizzle,lane_split,...]

Kernel i of seed S is ``tests/fuzz/generate.py``'s ``random_program`` of ``S * 1_000_003 + i``,
so any one can be replayed alone (``--only I``). Prints the counts: generated, passed,
refused with NotDifferentiableError (by construct), mismatched, crashed, and invalid (a
kernel the generator got wrong: it must stay 0). With ``--shrink DIR`` the first failure
of each kind is shrunk and written to DIR as a regression test module. ``--transpose-every-group``
has the derived kernels compute every group of tiles orient.py can transpose transposed, whether or
not it pays. ``--bindings B`` calls each kernel that passes with B bindings of memory besides its own (one tensor for
two inputs, overlapping and packed views, expanded, transposed, sliced and interleaved views, outputs packed into one
buffer, every other one deterministic: tests/fuzz/bindings.py; 2 by default), counted as kernel-and-binding cases;
``--strided`` spells tile loads with the launch's strides, so that the views that change a layout apply.
``--families F,G`` makes the named families of ``generate.FOCUS`` frequent (``persistent``: grid-stride loops over
fewer programs than tiles; ``swizzle``: tile coordinates permuted from the program id, grouped ordering on a flattened
grid; ``lane_split``: stores at flat lane indices split by ``//`` and ``%`` into a permuted layout;
``grouped_persistent``: the persistent matmul tutorial's grid-stride loop over a 2-D frame's tiles in grouped order,
the tile found again by the epilogue's own counter; ``halves``: a tile stored in two halves a constant apart, masks
shifted alike; ``rereads``: an input loaded by 2 to 4 sibling loops over a row's column blocks, at one address or
another; ``in_place``: an input updated in place by one such loop and read back by the later ones, or, to be refused,
at a neighbour's element, stored over again or over another range): they are drawn in most kernels instead of a few
percent, and the kernels differ from the plain campaign's of the same seed (replay and ``--only`` need the same flag).
Each run prints the outcomes of the kernels of each of these families, refusals by message; the coverage counts
``spy:rereads_merged`` (kernels whose backward wrote an input's loads in sibling loops once) and ``spy:rereads_apart``
(written apart: reverse/rereads.py could not), and the rereads family's kernels by how their nodes were drawn (to
merge, or a near miss: ``generate.REREAD_NEAR``), each with how many merged and passed.
The call's variations (tests/fuzz/variations.py) are counted apart, kernels by outcome and their kernel-and-binding
cases: ``variation args_<form>`` (the op's tensors as ``*args``, a list, a tuple or nested), ``f32_state`` (float64
state declared float32), ``dot`` (a kernel whose ``tl.dot`` reads inputs), ``dot_overlap`` (bindings overlapping a
dot's operand with another input, by outcome) and ``jvp`` (every kernel's op under ``torch.func.jvp`` against the
mirror's: passed, refused with the refusals listed, not run where the kernel collides by construction).
``double`` (the op differentiated twice, variations.check_double_backward: a share ``--double`` of the kernels passing
their first-order checks, all by default) and ``reshaped`` (the op's host function reshaping inputs and outputs
around the launch, tests/fuzz/reshapes.py: a share ``--reshape``, all by default; ``reshape <kind>`` counts each
reshape drawn, ``reshaped jvp refused`` the kernels whose forward mode refused one) are counted alike.
"""

from __future__ import annotations

import argparse
import collections
import functools
import multiprocessing
import os
import re
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel is defined
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.fuzz import generate as G  # noqa: E402

FAILING = ("mismatch", "crashed", "invalid")


def kernel_seed(seed: int, i: int) -> int:
    return seed * 1_000_003 + i


AVOID: tuple[str, ...] = ()
STRIDED = False
FOCUS: tuple[str, ...] = ()


SPIED: set[str] = set()  # what the derived kernels of the kernel being checked did (``spy_rereads``)


def spy_rereads() -> None:
    """Count the kernels whose derived backward wrote an input's loads in sibling loops once (reverse/rereads.py:
    ``spy:rereads_merged``) and those whose backward wrote them apart (``spy:rereads_apart``), as coverage labels."""
    from tritongrad.runtime import derivation

    plan = derivation.plan_writes

    def spied(analysis, feasible):
        plans = plan(analysis, feasible)
        if any(facts.rereads for facts in plans.plain.inputs.values()):
            SPIED.add("spy:rereads_merged")
        if plans.not_merged:
            SPIED.add("spy:rereads_apart")
        return plans

    derivation.plan_writes = spied


def spy_grouped() -> None:
    """Count the kernels whose derived backward has a kernel taking its grid in groups (reverse/interchange.py
    ``group_programs``: ``spy:grouped``), as a coverage label."""
    from tritongrad.runtime import derivation

    variant = derivation.Derivation.variant

    def spied(self, *args, **kwargs):
        made = variant(self, *args, **kwargs)
        if any("tg.grouped_program_id" in part.src for part in made.parts):
            SPIED.add("spy:grouped")
        return made

    derivation.Derivation.variant = spied


def run_one(args: tuple[int, int]) -> tuple[int, str, str, list[str], list[tuple[str, str]], dict]:
    seed, i = args
    program, _ = G.random_program(kernel_seed(seed, i), AVOID, STRIDED, FOCUS)
    SPIED.clear()
    outcome = G.check(program)
    checks = {name: (found.status, found.detail) if (found := getattr(outcome, name)) is not None else ("not run", "")
              for name in ("jvp", "double", "reshaped")}
    return (i, outcome.status, outcome.detail, program.labels() + sorted(SPIED) + [
        "var:" + v for v in outcome.variations], [(o.status, o.detail) for o in outcome.bindings], checks)


def families_of(labels: list[str]) -> list[str]:
    """The families of generate.FOCUS a kernel has (by its labels), colliding variants apart."""
    found = set()
    for label in labels:
        for part in label.split("+"):
            family = next((f for f in G.FOCUS if part.startswith(f)), None)
            if family:
                found.add(family + ("_collide" if "collide" in label or label.endswith("_fold") else ""))
    return sorted(found)


def blurred(detail: str) -> str:
    """A refusal's first line with its names (outputs, values), line numbers and other numbers blurred, so that
    refusals of one kind count together."""
    line = detail.splitlines()[0] if detail else ""
    line = re.sub(r"\b(d_)?[a-z]\d+(_[a-z0-9]+)*\b", "<name>", line)
    line = re.sub(r"\(`[^`]*(`[^`]*`[^`]*)*` without the other digit\)", "(`<digit>` without the other digit)", line)
    return re.sub(r"\d+", "#", line)[:240]


def signature(status: str, detail: str) -> str:
    """Failures of one kind: the status and the first line of the detail, numbers and names blurred."""
    line = detail.splitlines()[0] if detail else ""
    line = re.sub(r"0x[0-9a-f]+", "0x#", line)  # addresses (the bounds checker's): they differ run to run
    line = re.sub(r"\b[vuxwstiyzc]\d+(_\w+)?\b", "<name>", line)
    return f"{status}: {re.sub(r'[0-9.e+-]{2,}', '#', line)[:160]}"


def shrink_failure(seed: int, i: int, status: str, detail: str, out_dir: str) -> str:
    _, choices = G.random_program(kernel_seed(seed, i), AVOID, STRIDED, FOCUS)
    sig = signature(status, detail)

    def failing(cand: list[int]) -> bool:
        try:
            outcome = G.check(G.replay(cand, AVOID, STRIDED, FOCUS))
        except Exception:  # noqa: BLE001 - a generator error is not the failure we shrink
            return False
        return outcome.status == status and (status == "mismatch"
                                             or signature(outcome.status, outcome.detail) == sig)

    small = G.shrink(choices, failing)
    outcome = G.check(G.replay(small, AVOID, STRIDED, FOCUS))
    name = f"{status}_{seed}_{i}"
    path = os.path.join(out_dir, f"test_{name}.py")
    with open(path, "w") as f:
        f.write(G.regression_source(outcome.source, name, f"{status}: {outcome.detail.splitlines()[0]}"))
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", type=int, default=None, help="run kernel I alone and print its module")
    ap.add_argument("--shrink", metavar="DIR", default=None, help="shrink one failure per kind into DIR")
    ap.add_argument("--show", type=int, default=5, help="failures listed per kind")
    ap.add_argument("--avoid-known", action="store_true",
                    help="steer around the constructs with open bugs (generate.KNOWN_BUGS)")
    ap.add_argument("--transpose-every-group", action="store_true",
                    help="derived kernels compute every group of tiles orient.py can transpose transposed (the "
                         "rewrite tested on every kernel, not only where it pays)")
    ap.add_argument("--reload-once-loaded", action="store_true",
                    help="untuned launches of persistent kernels load their once-loaded values (a weight) again for "
                         "each row (HELD False; held by default, as tuning's untuned setting)")
    ap.add_argument("--bindings", type=int, default=G.BINDINGS,
                    help="bindings of memory each passing kernel is also called with (tests/fuzz/bindings.py)")
    ap.add_argument("--strided", action="store_true", help="tile loads at the strides the launch passes")
    ap.add_argument("--double", type=float, default=1.0,
                    help="share of the kernels passing their first-order checks also differentiated twice")
    ap.add_argument("--reshape", type=float, default=1.0, help="share of the kernels passing their first-order "
                    "checks also called through a host function reshaping around the launch (tests/fuzz/reshapes.py)")
    ap.add_argument("--families", default="", help="comma-separated families of generate.FOCUS made frequent "
                    f"({', '.join(G.FOCUS)})")
    args = ap.parse_args(argv)
    global AVOID, STRIDED, FOCUS
    AVOID = tuple(G.KNOWN_BUGS) if args.avoid_known else ()
    STRIDED = args.strided
    FOCUS = tuple(f for f in args.families.split(",") if f)
    unknown = set(FOCUS) - set(G.FOCUS)
    if unknown:
        ap.error(f"unknown families {sorted(unknown)} (known: {', '.join(G.FOCUS)})")
    G.BINDINGS = args.bindings
    G.DOUBLE, G.RESHAPE = args.double, args.reshape
    if args.transpose_every_group:  # before the workers fork
        from tritongrad.codegen import generate as codegen
        from tritongrad.codegen import orient
        codegen.orient_tiles = functools.partial(orient.orient_tiles, every=True)
    spy_rereads()
    spy_grouped()
    if args.reload_once_loaded:
        from tritongrad.runtime import tuning
        tuning.DEFAULT = tuning.Setting(held=False)

    if args.only is not None:
        program, _ = G.random_program(kernel_seed(args.seed, args.only), AVOID, STRIDED, FOCUS)
        outcome = G.check(program)
        print(outcome.report())
        return 0 if outcome.status in ("passed", "refused") else 1

    counts: collections.Counter[str] = collections.Counter()
    cases: collections.Counter[str] = collections.Counter()  # kernel-and-binding cases (a kernel's own call too)
    bound: collections.Counter[str] = collections.Counter()  # the bindings tried, by kind
    refused: collections.Counter[str] = collections.Counter()
    refused_bound: collections.Counter[str] = collections.Counter()  # why bindings were refused
    coverage: collections.Counter[str] = collections.Counter()
    by_family: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)  # FOCUS families
    rereads: collections.Counter[str] = collections.Counter()  # rereads nodes by how they were drawn, and merged
    failures: dict[str, list[tuple[int, str, str]]] = collections.defaultdict(list)
    # the call's variations (tests/fuzz/variations.py): kernels (and their cases) by the op's argument form, with
    # float32-declared state, with a dot (and bindings overlapping two dot operands); forward mode's outcomes
    variations: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    refused_by: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)  # jvp, double
    start = time.time()
    jobs = [(args.seed, i) for i in range(args.kernels)]
    if args.jobs > 1:
        pool = multiprocessing.get_context("fork").Pool(args.jobs)
        results = pool.imap_unordered(run_one, jobs, chunksize=8)
    else:
        pool, results = None, map(run_one, jobs)
    for n, (i, status, detail, labels, bindings, checks) in enumerate(results, 1):
        counts[status] += 1
        for v in (label[4:] for label in labels if label.startswith("var:")):
            variations[v][status] += 1
            variations[v]["cases"] += 1 + len(bindings)
        for name, (c_status, c_detail) in checks.items():
            variations[name][c_status] += 1
            if c_status == "refused":
                refused_by[name][blurred(re.sub(r"^\[[^]]*\] ", "", c_detail))] += 1
        if checks["reshaped"][0] != "not run":
            drawn = re.match(r"\[reshaped: ([^;]*);", checks["reshaped"][1])
            for kind in {part.split(" ")[-1] for part in drawn.group(1).split(", ")} if drawn else ():
                variations[f"reshape {kind}"][checks["reshaped"][0]] += 1
            if "(jvp refused: " in checks["reshaped"][1]:
                refused_by["reshaped jvp"][blurred(checks["reshaped"][1].split("(jvp refused: ", 1)[1])] += 1
        cases[status if not bindings or status in FAILING else "passed"] += 1
        for b_status, b_detail in bindings:
            cases[b_status] += 1
            if b_status == "refused":
                refused_bound[re.sub(r"\[binding: [^]]*\] ", "", b_detail).splitlines()[0][:160]] += 1
            elif b_status in FAILING:
                failures[signature(b_status, b_detail)].append((i, b_status, b_detail))
            bound[b_detail.split("[binding: ", 1)[-1].split(" ", 1)[0] + (" det" if "deterministic" in b_detail
                                                                          else "")] += 1
            if "(dot operands)" in b_detail:
                variations["dot_overlap"][b_status] += 1
                variations["dot_overlap"]["cases"] += 1
        coverage.update(set(labels))
        merged = "spy:rereads_merged" in labels
        for how in {label.split("_")[2] for label in labels if label.startswith("rereads_")}:
            rereads[how] += 1
            rereads[how + " merged"] += merged
            rereads[how + " " + status] += 1
        for family in families_of(labels):
            by_family[family][status] += 1
            if status == "refused":
                by_family[family]["refused: " + blurred(detail)] += 1
        if status == "refused":
            refused[detail] += 1
        elif status in FAILING:
            failures[signature(status, detail)].append((i, status, detail))
        if n % 500 == 0 or n % 100 == 0 and args.kernels >= 2000:
            print(f"[{n}/{args.kernels}, {time.time() - start:.0f}s] {dict(counts)} cases {dict(cases)} "
                  f"jvp {dict(variations['jvp'])} double {dict(variations['double'])} "
                  f"reshaped {dict(variations['reshaped'])}", flush=True)
    if pool is not None:
        pool.close()

    print(f"\nseed {args.seed}: {args.kernels} kernels in {time.time() - start:.0f}s")
    print(f"  generated   {args.kernels}")
    for status in ("passed", "refused", "mismatch", "crashed", "invalid"):
        print(f"  {status:11s} {counts[status]}")
    print(f"  kernel-and-binding cases {sum(cases.values())}: " + ", ".join(f"{k} {v}" for k, v in cases.items()))
    print("  bindings tried: " + ", ".join(f"{k} {v}" for k, v in sorted(bound.items())))
    for construct, k in refused.most_common():
        print(f"    refused {k:5d}  {construct}")
    for construct, k in refused_bound.most_common():
        print(f"    binding refused {k:5d}  {construct}")
    for sig, items in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(items):5d}  {sig}")
        for i, _, detail in items[: args.show]:
            print(f"         kernel {i}: {detail.splitlines()[0][:200] if detail else ''}")
    for v in sorted(variations):
        found = variations[v]
        print(f"  variation {v}: " + ", ".join(f"{k} {found[k]}" for k in ("cases", "passed", "refused", "not run",
                                                                           *FAILING) if found[k]))
    for name, found in refused_by.items():
        for why, k in found.most_common():
            print(f"    {name} refused {k:5d}  {why}")
    for family in sorted(by_family):
        found = by_family[family]
        print(f"  family {family}: {sum(found[k] for k in ('passed', 'refused', 'mismatch', 'crashed', 'invalid'))} "
              "kernels, " + ", ".join(f"{k} {found[k]}" for k in ("passed", "refused", "mismatch", "crashed",
                                                                    "invalid") if found[k]))
        for why, k in sorted(((w, k) for w, k in found.items() if w.startswith("refused: ")), key=lambda wk: -wk[1]):
            print(f"    {k:5d}  {why}")
    if rereads:
        print("  rereads (kernels with a node drawn so: merge or a near miss; whether the backward merged an input's "
              "loads: spy:rereads_merged): " + ", ".join(
                  f"{how} {rereads[how]} (merged {rereads[how + ' merged']}, passed {rereads[how + ' passed']})"
                  for how in ("merge", *G.REREAD_NEAR) if rereads[how]))
        print(f"  merge taken in {coverage['spy:rereads_merged']} kernels, loads written apart in "
              f"{coverage['spy:rereads_apart']}")
    print("  coverage (kernels using each construct): " +
          ", ".join(f"{k} {v}" for k, v in sorted(coverage.items(), key=lambda kv: -kv[1])))
    if args.shrink and failures:
        os.makedirs(args.shrink, exist_ok=True)
        for sig, items in failures.items():
            i, status, detail = min(items)
            print(f"shrinking kernel {i} ({sig}) ...", flush=True)
            print("  ->", shrink_failure(args.seed, i, status, detail, args.shrink), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
