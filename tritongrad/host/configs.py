"""Configs a launch's backward may run under instead of the forward's (``Tiles``), and the declaration that offers
them for a kernel launched with a fixed config (``backward_configs``: configs, or the constexprs that are tile sizes,
whose configs are made around each launch's: ``around``).

A matmul's input gradients are products of other shapes than its output, so the backward's best tiles are rarely
the forward's. Running the backward of a launch under another config is sound only where the forward's result does
not depend on the config: an autotuner's configs are interchangeable by its contract (it picks one by speed alone);
for any other kernel only its author can say so (a block-wise scaled or quantized kernel's result depends on its
block size), which ``backward_configs`` declares. runtime/tuning.py times the backward under each and keeps the
fastest (host/backward.py).
"""

from __future__ import annotations

import contextvars
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import OpError
from ..core.source import Source, unwrap
from ..frontend.specialize import constexpr_params

# id(jit kernel) -> (the kernel, its declared configs as keyword items, its constexprs named tile sizes):
# backward_configs
DECLARED: dict[int, tuple[Any, tuple, tuple[str, ...]]] = {}
# the @triton.heuristics running a kernel inside an op (hooks.py): its values may be computed from the tile sizes
current_heuristics: contextvars.ContextVar[Any] = contextvars.ContextVar("tritongrad_heuristics", default=None)


def backward_configs(configs: Sequence[Any] = (), *, tiles: Sequence[str] = ()) -> Callable[[Any], Any]:
    """Declare configs a kernel's result does not depend on: the backward of its launches may run under any of them.

        @tritongrad.backward_configs([triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64},
                                                    num_warps=8, num_stages=4), ...])
        @triton.jit
        def matmul_kernel(..., BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):

        matmul_kernel[grid](..., BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)

    ``configs``: ``triton.Config`` objects, as ``@triton.autotune`` takes them (constexprs and launch options; no
    ``pre_hook``). ``tiles``: the names of the constexprs that are tile sizes, instead of (or beside) configs
    (``@tritongrad.backward_configs(tiles=("BLOCK_M", "BLOCK_N", "BLOCK_K"))``): each launch then offers the
    configs ``around`` makes from its own, each tile halved, kept or doubled (within 16 to 256), the tiles'
    product at most twice or half the launch's (its warps and stages as launched: the backward's own tuning times
    those). Inside a ``tritongrad.op``, the backward of each launch of the kernel runs under whichever of them, or
    the launch's own config, is fastest at its shape (timed once per shape on a GPU, as an autotuned launch's
    backward is: runtime/tuning.py), with the grid the launch's grid function gives for it. A matmul launched with
    the tiles best for its forward gets a backward with the tiles best for its gradients' products.

    The declaration is a promise: the kernel computes the same result (up to rounding) under each config, the
    launch's other arguments as passed; its grid function gives each config's grid from the config's tile sizes.
    A tile size changes only how the work is blocked: a sum over a tiled axis (a product's K) then adds the same
    terms in another order, so its bits may differ, as under an autotuner. A kernel whose result depends on its
    block sizes (block-wise scaling or quantization), or that is passed a constexpr computed from one
    (``EVEN_K=K % BLOCK_K == 0``), must not declare them: its gradient would be that of another computation.

    A declaration, not an argument of ``tritongrad.op``: it is a fact of the kernel, true wherever it is launched,
    so it sits with the kernel, as ``@triton.autotune``'s configs do, and every op launching it gets it.

    The launch keeps its own config (no other is tried) where its grid is a tuple (only a grid function,
    ``lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), ...)``, gives the grid of another config), where a
    ``@triton.heuristics`` runs the kernel (its values may be computed from the tile sizes), under
    ``deterministic=True`` (another config sums in another order), for a launch whose forward keeps state for the
    backward, and wherever nothing is timed (Triton's interpreter, CUDA graph capture, ``TRITONGRAD_TUNE=0``).
    On an autotuned kernel the declared configs are those its launches' backwards choose from, instead of the
    autotuner's.

    Returns the kernel as given; a config setting, or a tile naming, a name that is not a constexpr parameter of
    the kernel raises ValueError, naming it; a launch passing a named tile a value that is not a power of two (a
    dtype, a flag) raises OpError, naming it.
    """
    configs, tiles = tuple(configs), (tiles,) if isinstance(tiles, str) else tuple(tiles)
    if not configs and not tiles:
        raise ValueError("tritongrad.backward_configs: no configs given, and no tile sizes named (tiles=...)")
    for c in configs:
        if not hasattr(c, "all_kwargs"):
            raise TypeError(f"tritongrad.backward_configs: expected triton.Config objects, got {type(c).__name__} "
                            f"{c!r}")
        if c.pre_hook is not None:
            raise ValueError(f"tritongrad.backward_configs: config {c} has a pre_hook, which the backward would not "
                             "run; declare configs without one")

    def declare(kernel: Any) -> Any:
        jit = unwrap(kernel)
        tree = Source.of(jit).tree
        params, constexprs = [a.arg for a in tree.args.args], constexpr_params(tree)
        named = [(f"config {c} sets", name) for c in configs for name in c.kwargs]
        for what_names, name in [*named, *(("tiles= names", t) for t in tiles)]:
            if name not in constexprs:
                what = "a parameter but not a constexpr" if name in params else "not a parameter"
                raise ValueError(f"tritongrad.backward_configs: {what_names} `{name}`, which is {what} of kernel "
                                 f"`{jit.fn.__name__}` (its constexprs: {', '.join(constexprs) or 'none'})")
        DECLARED[id(jit)] = (jit, _config_items(configs), tiles)
        return kernel

    return declare


def around(launched: dict[str, Any], tiles: tuple[str, ...], kernel: Any) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """The configs (keyword items of the named tiles only) offered beside a launch's own (``launched``: its
    constexprs and options): each tile halved, kept or doubled (none below 16, a product's least, nor above 256,
    past which a product's tile spills its registers and compiles for long, but where the launch's is), the
    product of the tiles at most twice or half the launch's, so that a config holds about the launch's registers
    and shared memory; the launch's own left out. A named tile whose value is not a power of two is no tile size."""
    values = {}
    for name in tiles:
        v = launched.get(name)
        if type(v) is not int or v < 1 or v & (v - 1):
            raise OpError(f"tritongrad.backward_configs: kernel `{kernel.fn.__name__}` names `{name}` a tile size "
                          f"(tiles=...), but its launch passes {name}={v!r}, which is not a power of two: a tile "
                          f"size is one (tl.arange's extent); leave `{name}` out of tiles=")
        values[name] = v
    return _around(tuple(values.items()))


@functools.lru_cache(maxsize=256)
def _around(values: tuple[tuple[str, int], ...]) -> tuple:
    """``around``'s configs of tiles at ``values``; cached: every call of an op records its launches' configs."""
    found = []
    for steps in itertools.product((-1, 0, 1), repeat=len(values)):
        if not any(steps) or abs(sum(steps)) > 1:
            continue
        config = {n: v << 1 if s > 0 else v >> 1 if s < 0 else v for (n, v), s in zip(values, steps, strict=True)}
        if all(min(16, v) <= config[n] <= max(256, v) for n, v in values):
            found.append(tuple(sorted(config.items())))
    return tuple(found)


@dataclass(frozen=True)
class Tiles:
    """The configs a launch's backward may run under (each as keyword items: constexprs and launch options), and the
    grid of each, as the launch's grid function gave it at the launch: an autotuner's configs, or those declared for
    the kernel (``backward_configs``: its configs, those ``around`` the launch's tiles) with the launch's own.
    Grids, not the grid function: the function may close over the call's tensors, which a record or replay
    (replay.py) that keeps the launch must not hold; two launches offering the same are equal."""

    configs: tuple[tuple[tuple[str, Any], ...], ...]
    grids: tuple[tuple[int, ...], ...]  # per config

    def grid(self, config: tuple) -> tuple[int, ...]:
        return self.grids[self.configs.index(config)]

    @classmethod
    def of(cls, kernel: Any, grid: Any, info: Any, args: tuple, kwargs: dict, autotuned: Any) -> Tiles | None:
        """A launch's (``kernel[grid](*args, **kwargs)``, ``info`` its kernel_roles.KernelInfo; ``autotuned``: the
        autotuner that launched it, with its arguments), or None: where the grid is not a function of the config,
        or nothing but the launch's own config is offered."""
        if not callable(grid):
            return None
        declared = DECLARED.get(id(kernel))
        named, options = info.named_arguments(args, kwargs)
        launched = {**info.defaults, **named, **options}
        if declared is None:
            configs = cls._autotuned(autotuned, kernel) if autotuned is not None else None
        else:
            heuristics = current_heuristics.get()
            if heuristics is not None and heuristics.fn is kernel:
                return None
            configs = declared[1] + (around(launched, declared[2], kernel) if declared[2] else ())
            own = tuple(sorted((k, launched[k]) for k in {k for c in configs for k, _ in c} if k in launched))
            configs = configs if own in configs else (own, *configs)
        if configs is None:
            return None
        grids = {}
        for c in configs:
            try:
                grids[c] = tuple(grid({**launched, **dict(c)}))
            except Exception:  # noqa: BLE001 (a config the grid function cannot take is no candidate, as in tuning)
                continue
        return cls(tuple(grids), tuple(grids.values())) if len(grids) > 1 else None

    @staticmethod
    def _autotuned(autotuned: Any, kernel: Any) -> tuple | None:
        """The autotuner's configs, where it launches the kernel itself (no heuristics between them, which could
        compute constexprs from the config's), of those its ``early_config_prune`` keeps for the launch's arguments
        (it may drop a tile size the kernel cannot run at a shape)."""
        tuner, args, kwargs = autotuned
        if tuner.fn is not kernel or len(tuner.configs) < 2:
            return None
        configs = tuner.configs
        if getattr(tuner, "early_config_prune", None):
            named = dict(zip(tuner.arg_names, args, strict=False))  # as the autotuner gives it
            configs = tuner.early_config_prune(configs, named, **kwargs)
        configs = _config_items(tuple(configs))
        return configs if len(configs) > 1 else None


@functools.lru_cache(maxsize=256)
def _config_items(configs: tuple) -> tuple:
    """Configs as keyword items, but those with a pre_hook (it may fill what the backward reads); cached: an op's
    every call records an autotuner's."""
    return tuple(tuple(sorted(c.all_kwargs().items())) for c in configs if c.pre_hook is None)
