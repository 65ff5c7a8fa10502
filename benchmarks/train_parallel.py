"""benchmarks/train_step.py across GPUs: DistributedDataParallel or FSDP2 (``fully_shard`` per decoder layer, then
the root), NCCL, one process per GPU under torchrun. Without --ddp / --fsdp every function here is a no-op."""

from __future__ import annotations

import os


def setup(cfg) -> tuple[int, int]:
    """(rank, world size); under --ddp / --fsdp the process group (NCCL, NVLink multicast off) and this rank's GPU."""
    if not cfg.parallel:
        return 0, 1
    if "WORLD_SIZE" not in os.environ:
        raise SystemExit(f"--{cfg.parallel} runs under torchrun (the launcher starts it when not run under torchrun)")
    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if not dist.is_initialized():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return dist.get_rank(), dist.get_world_size()


def layers_of(model):
    """The decoder layers: form A's ``model.layers``, HF's ``model.model.layers``."""
    return model.layers if hasattr(model, "layers") else model.model.layers


def wrap(cfg, model):
    """The model as trained: DDP around it, or each layer and then the root sharded (in place) for FSDP2."""
    if cfg.parallel == "ddp":
        import torch
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    if cfg.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in layers_of(model):
            fully_shard(layer)
        fully_shard(model)
    return model


def full_grads(cfg, model) -> dict:
    """The parameters' gradients on the CPU by name, whole (FSDP2's shards gathered: every rank takes part)."""
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name] = g.detach().to("cpu", copy=True)
    return grads


def max_over_ranks(value: float) -> float:
    import torch.distributed as dist

    if not dist.is_initialized():
        return value
    import torch

    t = torch.tensor([float(value)], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def rank_spread(model) -> float:
    """DDP: the largest difference between two ranks' parameter sums after the run (0: the ranks stayed identical)."""
    import torch
    import torch.distributed as dist

    mine = torch.stack([p.detach().double().sum() for p in model.parameters()])
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return float(max((e - every[0]).abs().max() for e in every))


def teardown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
