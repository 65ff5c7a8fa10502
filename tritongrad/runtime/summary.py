"""What an op reads of a kernel before any backward is derived: its pointer parameters by role (``Roles``) and
whether it has a loop (``Summary``), from derivation's front half (derivation.py's ``front_half``, every
specialization together: ``summarize``); and two questions about one specialization, asked of the kernel normalized
for it: which pointers updated in place its loads read unchanged (``read_unchanged_in``), which parameters its stores
are computed from (``stored_from_in``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..analysis.dependence import stored_from
from ..analysis.in_place import read_unchanged, reloaded
from ..analysis.pointers import pointers
from ..analysis.stored_outputs import stored_values
from ..core.ir import loops
from ..frontend.normalize import normalize_kernel
from .derivation import front_half


@dataclass(frozen=True)
class Roles:
    """A kernel's pointer parameters by role, as analysis/pointers.py's ``Pointers`` defines them (the one
    definition derivation uses too), with what an op may read back from its outputs."""

    loads: frozenset[str]  # every loaded pointer parameter (index pointers too)
    stores: frozenset[str]  # every stored or atomically updated one
    overwrites: frozenset[str]  # stored with something other than tl.atomic_add
    inputs: frozenset[str]  # differentiable inputs: loaded, never stored unless in place (floats among them)
    in_place: frozenset[str] = frozenset()  # loaded and overwritten with tl.store (analysis/pointers.py)
    # updated in place, and what it stored read back (analysis/in_place.py): its backward reads the tensor as the
    # launch left it too (``as_left_param``), and passes gradient through its shadow
    reloaded: frozenset[str] = frozenset()
    # stored with a value the backward may read back (stored_outputs.py): from any float output (a softmax's),
    # or only where the output is float32 or float64 (a statistic, exact there)
    read_back: frozenset[str] = frozenset()
    read_back_exact: frozenset[str] = frozenset()

    @property
    def pointers(self) -> frozenset[str]:
        return self.loads | self.stores


@dataclass(frozen=True)
class Summary:
    loops: bool  # whether it has a loop (only then may its forward keep state for the backward: augment.py)
    roles: Roles | None  # None: its pointers' roles could not be read (``error`` says why)
    error: Exception | None = None


def summarize(jit_fn: Any) -> Summary:
    """A kernel's summary, every specialization together; raises what its front half raises."""
    program = front_half(jit_fn, None)
    has_loops = bool(loops(program.body))
    try:
        found = pointers(program)
        loads = frozenset(found.loads)
        kept = stored_values(program, found.stores).values()
        # (an index pointer is an input where a float tensor is passed there; an integer one has no gradient:
        # Plan.carries)
        roles = Roles(loads, frozenset(found.stores), found.overwrites, found.inputs, found.in_place,
                      reloaded(program, found), frozenset(k.param for k in kept if k.rounds) - loads,
                      frozenset(k.param for k in kept if not k.rounds) - loads)
    except Exception as e:
        return Summary(has_loops, None, e)
    return Summary(has_loops, roles)


def read_unchanged_in(jit_fn: Any, constexprs: Mapping[str, Any]) -> frozenset[str]:
    """analysis/in_place.py's ``read_unchanged`` of the specialization ``constexprs`` decide."""
    program = normalize_kernel(jit_fn, constexprs)
    return read_unchanged(program, pointers(program))


def stored_from_in(jit_fn: Any, constexprs: Mapping[str, Any], sinks: frozenset[str]) -> frozenset[str]:
    """analysis/dependence.py's ``stored_from`` of the specialization ``constexprs`` decide."""
    return stored_from(normalize_kernel(jit_fn, constexprs), sinks)
