"""When a derived backward waits for its loads (development probe for early_loads.py and the persistent loop's
pipelining): the examples' forward+backward, kernel by kernel (profile_kernels.py), with the derived kernels'
sources changed first:

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/loads_probe.py VARIANT rmsnorm layernorm softmax swiglu \
        --size 16384x4096 --dtype bfloat16 --impl tritongrad

VARIANT: ``derived`` (as built), ``late`` (loads where the reverse sweep puts them: early_loads.py off),
``stagesN`` (the persistent loop over the forward's programs pipelined with N stages, whatever tuning picks:
Triton reads the next rows while this one is computed), ``held`` / ``reloaded`` (a partial-rows loop's weight
only held in registers across the loop, or only loaded for each row: tuning's ``held``, lowering.persistent).
Prints the settings tuning chose.
"""

from __future__ import annotations

import re
import sys

from tritongrad.codegen import generate as codegen

PERSISTENT = re.compile(r"num_stages=STAGES\)")


def main() -> None:
    variant = sys.argv.pop(1)
    if variant == "late":
        codegen.issue_loads_early = lambda body, comment: body
    elif variant.startswith("stages"):
        stages = int(variant.removeprefix("stages"))
        jit_source = codegen.jit_source

        def staged(src, name, scope):
            src = PERSISTENT.sub(f"num_stages={stages})", src)
            return jit_source(src, name, scope)

        codegen.jit_source = staged
    elif variant in ("held", "reloaded"):
        from tritongrad.runtime import tuning

        candidates = tuning.candidates
        tuning.candidates = lambda *a: [s for s in candidates(*a) if s.held == (variant == "held")]
    elif variant != "derived":
        raise SystemExit(f"unknown variant {variant!r}: derived, late, stagesN, held, reloaded")
    print(f"variant: {variant}")
    from benchmarks import profile_kernels

    profile_kernels.main()
    from tritongrad.runtime import tuning

    for key, setting in tuning._best.items():  # the tuned settings, per derived kernel and shape
        print(f"tuned: {setting}  grid {key[3]}")


if __name__ == "__main__":
    main()
