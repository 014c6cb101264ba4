"""Data-parallel training on PyTorch's own engine: torchrun, DistributedDataParallel, FSDP.

``torchrun`` starts one process per GPU (or per CPU worker) and gives each the environment
variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``.
:func:`init_distributed` reads them and joins the process group: gloo on CPU, nccl on CUDA
(each process on GPU ``LOCAL_RANK``). Without them (plain ``aiayn train``) the world has one
process and no process group is created, so single-process training is unchanged.

The trainer (:mod:`aiayn.training.trainer`) uses the helpers here: :func:`wrap_model` (DDP or
FSDP2's ``fully_shard``), :func:`gradient_sync` (skip the gradient reduction on all but the last
micro-batch of a step), small collectives that are no-ops in a one-process world, and the full
(unsharded) state dicts FSDP needs for checkpoints. See docs/distributed.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from aiayn.errors import UserError
from aiayn.layers import CrossAttentionBlock, SelfAttentionBlock

T = TypeVar("T")

STRATEGIES = ("ddp", "fsdp")
# Rank 0 validates (greedy BLEU) and writes checkpoints while the other ranks wait in a
# collective; the default nccl timeout (10 minutes) could be too short for that.
TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in the job.

    Attributes:
        rank: global rank, 0 .. world_size - 1 (torchrun's ``RANK``).
        world_size: number of processes in the job, over all machines (``WORLD_SIZE``).
        local_rank: rank on this machine (``LOCAL_RANK``): the GPU index on CUDA.
        backend: "gloo" (CPU) or "nccl" (CUDA); None for a one-process world (no group).
        device: the device this process trains on.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {name} must be an integer, got {raw!r}") from None


def init_distributed(device_pref: str) -> DistEnv:
    """Join torchrun's process group (if any) and pick this process's device.

    Args:
        device_pref: ``train.device``: "auto", "cpu", "cuda" or "cuda:i". Under torchrun with
            more than one process a CUDA device is always ``cuda:LOCAL_RANK``.
    """
    world = _env_int("WORLD_SIZE", 1)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if world <= 1:
        if device_pref == "auto":
            return DistEnv(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        return DistEnv(device=torch.device(device_pref))
    wants_cuda = device_pref.startswith("cuda") or (
        device_pref == "auto" and torch.cuda.is_available()
    )
    if wants_cuda:
        if device_pref.startswith("cuda:"):
            raise UserError(
                f"train.device={device_pref}: under torchrun each process uses GPU LOCAL_RANK; "
                "set train.device to cuda or auto (and CUDA_VISIBLE_DEVICES to choose GPUs)"
            )
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) visible: "
                "start at most one process per GPU (torchrun --nproc-per-node)"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world,
            timeout=TIMEOUT,
            device_id=device if backend == "nccl" else None,
        )
    elif dist.get_world_size() != world or dist.get_rank() != rank:
        raise UserError(
            f"a process group of {dist.get_world_size()} exists, but WORLD_SIZE is {world}"
        )
    return DistEnv(rank, world, local_rank, backend, device)


def is_main_process() -> bool:
    """True on rank 0 (and in a one-process world), also before/after the process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return _env_int("RANK", 0) == 0


def cleanup() -> None:
    """Leave the process group (if this process is in one), all ranks together.

    Drop the DDP/FSDP modules first: they hold the group, and a group freed only at interpreter
    exit can abort the process ("terminate called without an active exception").
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    """Wait for every rank (no-op with one process)."""
    if _active():
        dist.barrier()


class RankZeroFailed(UserError):
    """What rank 0 failed at in :func:`on_main`, raised on every rank with the same message
    (rank 0's :class:`~aiayn.errors.UserError`, e.g. a checkpoint it cannot write)."""


def on_main(work: Callable[[], T]) -> T | None:
    """Run ``work`` on rank 0 only, while the other ranks wait; then every rank learns how it
    went. Returns ``work``'s value on rank 0 and None on the others (one process: its value).

    If ``work`` raises on rank 0, every rank raises together, instead of the others finding out
    in their next collective (a peer-lost error there, or a wait for the group's timeout): a
    :class:`~aiayn.errors.UserError` becomes :class:`RankZeroFailed` with its message on every
    rank; any other exception keeps its traceback on rank 0, and the others raise a
    ``RuntimeError`` naming it.
    """
    if not _active():
        return work()
    value: T | None = None
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            value = work()
        except BaseException as caught:  # re-raised below, once the others know
            error = caught
    user = isinstance(error, UserError)
    failure = broadcast_object(None if error is None else (user, str(error)))
    if failure is None:
        return value
    user, message = failure
    if user:
        raise RankZeroFailed(message if error is not None else f"rank 0 stopped: {message}")
    if error is not None:
        raise error
    raise RuntimeError(f"rank 0 failed ({message}); see its error above")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks, in place; returns it (unchanged with one process)."""
    if _active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_rank(flag: bool, device: torch.device) -> bool:
    """True if ``flag`` is true on any rank: every rank gets the same answer."""
    if not _active():
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable objects)."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# -- the model ---------------------------------------------------------------------------------
def wrap_model(model: nn.Module, env: DistEnv, strategy: str) -> nn.Module:
    """The module to train with: ``model`` itself (one process), DDP around it, or it sharded.

    ``fsdp`` uses FSDP2 (``torch.distributed.fsdp.fully_shard``): each encoder, decoder or GPT-2
    layer is a unit, the rest (embeddings, tied output projection, final norms) the root unit
    (``model`` is the task's objective, e.g.
    :class:`~aiayn.training.objective.TranslationObjective`, or a bare model). The
    parameters of ``model`` become DTensor shards in place, so ``model`` is returned; gather them
    with :func:`full_model_state_dict`. ``ddp`` keeps ``model`` intact and returns the wrapper.
    """
    if strategy not in STRATEGIES:
        raise UserError(f"distributed strategy must be one of {STRATEGIES}, got {strategy!r}")
    if not env.distributed:
        return model
    if strategy == "ddp":
        import inspect

        from torch.nn.parallel import DistributedDataParallel

        # the only buffers (sinusoid tables) never change: no broadcast before each forward
        no_buffer_sync: dict[str, Any] = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
            else {"broadcast_buffers": False}  # torch < 2.13
        )
        return DistributedDataParallel(
            model,
            device_ids=[env.device.index] if env.device.type == "cuda" else None,
            **no_buffer_sync,
        )
    import warnings

    from torch.distributed.fsdp import fully_shard

    # a decoder layer's output carries its key/value cache (views); training never writes to them
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module", category=UserWarning)
    for layer in [
        m for m in model.modules() if isinstance(m, (SelfAttentionBlock, CrossAttentionBlock))
    ]:
        fully_shard(layer)
    fully_shard(model)
    return model


def is_sharded(model: nn.Module) -> bool:
    """True for a module sharded by FSDP2's ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Forward + backward of one micro-batch; ``enabled=False`` keeps its gradient local.

    DDP: ``no_sync()`` (the all-reduce happens with the last micro-batch, over the accumulated
    gradients). FSDP2: ``set_requires_gradient_sync(False)`` (no reduce-scatter).
    """
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        with model.no_sync() if not enabled else nullcontext():
            yield
    elif is_sharded(model):
        model.set_requires_gradient_sync(enabled)  # type: ignore[operator]
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)  # type: ignore[operator]
    else:
        yield


def _full_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights of an FSDP model, on rank 0's CPU (empty elsewhere). Collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    weights: dict[str, Any] = get_model_state_dict(model, options=_full_options())
    return weights


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state of an FSDP model as ``optimizer.state_dict()`` of the unsharded model
    would give it (parameter indices as keys), on rank 0 (empty elsewhere). Collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=_full_options())
    if not by_name:
        return {}
    index: dict[str, int] = {}
    groups = []
    for group in by_name["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": ids})
    state = {index[name]: values for name, values in by_name["state"].items()}
    return {"state": state, "param_groups": groups}


def load_full_optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> None:
    """Load an index-keyed full optimizer state (every rank passes the same) into the shards."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    names = [name for name, _ in model.named_parameters()]  # the optimizer's parameter order
    groups = [
        {**group, "params": [names[i] for i in group["params"]]}
        for group in state_dict["param_groups"]
    ]
    state = {names[i]: values for i, values in state_dict["state"].items()}
    set_optimizer_state_dict(
        model,
        optimizer,
        {"state": state, "param_groups": groups},
        options=StateDictOptions(full_state_dict=True),
    )
