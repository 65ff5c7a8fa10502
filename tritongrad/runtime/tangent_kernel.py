"""``jvp``: the tangent (forward-mode) kernel of a ``@triton.jit`` kernel, derived (tangent/builder.py), printed
and jitted (codegen/generate.py), cached per kernel, ``wrt``/``outputs`` and decisive constexprs as ``grad`` is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.analyze import analyze
from ..analysis.online import online_maxima
from ..codegen import generate as codegen
from ..core.errors import NotDifferentiableError
from ..core.source import unwrap
from ..frontend.normalize import normalize_kernel
from ..frontend.specialize import plain_value
from ..tangent.builder import build_tangent
from .backward_kernel import bind_arguments, defaults_of
from .derivation import cached, decisive_constexprs, hashable
from .derive import _names


class TangentKernel:
    """A derived tangent kernel: ``src``, ``kernel`` (jitted), ``params``: the forward's parameters, then
    ``t_<input>`` per ``wrt`` input, then ``t_<output>`` per output (a pointer updated in place: one).

    ``jvp_kernel[grid](*forward_args, *input_tangents, *output_tangents, **constexprs)`` launches it with the
    forward's grid: it computes what the forward computes, stores the forward's outputs, and stores each output's
    tangent (the derivative along the input tangents) where it stores the output, under the same masks."""

    def __init__(self, forward: Any, program, analysis, specialization: dict[str, Any]):
        self.forward, self.program, self.analysis = forward, program, analysis
        self.specialization = specialization
        self.wrt, self.outputs = analysis.wrt, analysis.outputs
        self.name = f"{program.name}_jvp"
        body = build_tangent(analysis)
        self.tangent_params = dict(zip(dict.fromkeys([*self.wrt, *self.outputs]), body.shadow_params, strict=True))
        self.params = (*program.param_names(), *body.shadow_params)
        doc = (f"Tangent kernel of `{program.name}`: forward mode along the tangents of "
               f"{', '.join(self.wrt) or 'no input'}, stored beside {', '.join(self.outputs)}.")
        self.src = codegen.function_source(program, body, self.name, doc, tile=False)
        self.kernel = codegen.compile_kernel(self.src, self.name, program)

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        """A launch's arguments by name; the forward's defaulted parameters take their defaults when not given."""
        return bind_arguments(self.name, self.params, defaults_of(self.forward), args, kwargs)

    def for_launch(self, named: Mapping[str, Any]) -> TangentKernel:
        values = {k: plain_value(named[k]) for k in decisive_constexprs(self.forward) if k in named}
        if values == self.specialization:
            return self
        return jvp(self.forward, self.wrt, self.outputs, constexprs=values)

    def launch(self, grid: Any, arguments: Mapping[str, Any], options: Mapping[str, Any]) -> None:
        """The jitted kernel on ``grid`` under the forward launch's options (warps, stages); where its tiles (the
        forward's and their tangents) do not fit in shared memory at the forward's pipeline stages, with fewer: an
        autotuned matmul's config fits its forward's two tiles a stage, not its tangent kernel's four. Stages
        decide speed, not values."""
        from triton.runtime.errors import OutOfResources

        while True:
            try:
                return self.kernel[grid](**arguments, **options)
            except OutOfResources:  # (raised where the kernel is loaded, before it runs)
                stages = options.get("num_stages") or 3  # (3: Triton's default on a GPU)
                if stages <= 1:
                    raise
                options = {**options, "num_stages": stages // 2}

    def __getitem__(self, grid: Any):
        def run(*args: Any, **kwargs: Any) -> Any:
            named = self.bind(args, kwargs)
            return self.for_launch(named).kernel[grid](**named)
        return run

    def __repr__(self) -> str:
        return f"<TangentKernel {self.name} wrt={self.wrt} outputs={self.outputs}>"


def jvp(kernel: Any, wrt: Sequence[str] | None = None, outputs: Sequence[str] | None = None, *,
        constexprs: Mapping[str, Any] | None = None) -> TangentKernel:
    """Derive the tangent (forward-mode) kernel of a ``@triton.jit`` kernel: its statements, and beside each
    float load of a ``wrt`` input a load of its tangent from ``t_<pointer>``, each operation's tangent, each store
    to an output also storing its tangent to ``t_<output>``. ``wrt``, ``outputs`` and ``constexprs`` as
    :func:`tritongrad.grad` takes them. Raises :class:`NotDifferentiableError` for what forward mode does not yet
    handle, naming it."""
    jit_fn = unwrap(kernel)
    decisive = decisive_constexprs(jit_fn)
    values = {k: plain_value(constexprs[k]) for k in decisive if constexprs is not None and k in constexprs}
    key = (jit_fn.fn, ("jvp", _names("wrt", wrt), _names("outputs", outputs)),
           tuple(sorted((k, hashable(v)) for k, v in values.items())))
    try:
        return cached(key, lambda: _derive(jit_fn, key[1][1], key[1][2], values))
    except NotDifferentiableError as e:
        missing = [k for k in decisive if k not in values]
        if missing and not any("constexpr" in n for n in getattr(e, "__notes__", ())):
            e.add_note(f"(derived for every value of its constexpr parameter(s) {', '.join(missing)}: the tangent "
                       "kernel of one specialization may be derived: pass constexprs={...})")
        raise


def _derive(jit_fn: Any, wrt, outputs, constexprs: dict[str, Any]) -> TangentKernel:
    program = normalize_kernel(jit_fn, constexprs)  # (not online.py's rewrite: forward mode runs an online softmax
    # as written, in one pass, its running max without a tangent where that rewrite's proof holds)
    return TangentKernel(jit_fn, program, analyze(program, wrt, outputs).with_maxima(online_maxima(program)),
                         constexprs)
