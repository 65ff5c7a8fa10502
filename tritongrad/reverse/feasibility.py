"""Whether a write strategy's backward body can be written: asked by writes/input_facts.py's ``plan_writes`` (through
runtime/derivation.py) before the write plans are made, as only writing the body tells: rereads.py's merge of an
input's loads in sibling loops (``NotMergeable``), interchange.py's loop given to the grid (``NotInterchangeable``).
Each question writes the body once (not its source) and answers why it cannot be, or None."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.analyze import Analysis
from ..writes.strategies import Choice
from .interchange import NotInterchangeable
from .loop_plans import LoopPlan, classify_loops
from .rereads import NotMergeable
from .sweep import build_backward


def for_inputs(analysis: Analysis, loop_plans: dict[int, LoopPlan], wrt: tuple[str, ...]
               ) -> tuple[Analysis, dict[int, LoopPlan]]:
    """The analysis and loop plans of a kernel writing the gradients of ``wrt`` only (a kernel of their own): their
    own activity and loop plans; the same where ``wrt`` is every input."""
    if wrt == analysis.wrt:
        return analysis, loop_plans
    restricted = analysis.restricted(wrt)
    return restricted, classify_loops(restricted)


@dataclass(frozen=True)
class Feasibility:
    """writes/input_facts.py's ``Feasibility``, answered by writing the backward body of a kernel's derivation."""

    analysis: Analysis
    loop_plans: dict[int, LoopPlan]
    read_back: dict[str, Any]  # values the recomputation reads from the outputs holding them (stored_outputs.py)

    def merge(self, param: str, rereads: tuple[str, ...]) -> str | None:
        """Tried with every input added atomically: the merge does not depend on how the others are written."""
        choices = {p: Choice.atomic() for p in self.analysis.wrt}
        choices[param] = Choice.atomic(rereads)
        try:
            build_backward(self.analysis, self.loop_plans, choices=choices, read_back=self.read_back)
        except NotMergeable as e:
            return e.why
        return None

    def interchange(self, param: str, axis: int, saved: bool) -> str | None:
        analysis, plans = for_inputs(self.analysis, self.loop_plans, (param,))
        try:
            build_backward(analysis, plans, choices={param: Choice.interchanged(axis)}, saved=saved,
                           read_back=self.read_back)
        except NotInterchangeable as e:
            return str(e)
        return None
