"""The training loop of §5: token-budget batches, Adam with the warm-up schedule of eq. (3),
label smoothing, dropout, periodic validation, checkpoints that resume exactly, and checkpoint
averaging. Under torchrun, data-parallel over several processes (DDP or FSDP, see
:mod:`aiayn.training.distributed` and docs/distributed.md).

One loop for every task: what is learnt (the data, the model, the objective, the validation
metrics and the best-checkpoint criterion, what happens at the end) is a
:class:`~aiayn.training.task.Task` the trainer receives: translation
(:mod:`~aiayn.training.translation`, validated by greedy BLEU) or a language model
(:mod:`~aiayn.training.lm`, validated by perplexity), picked from the model family.

Shape legend:  B examples in a micro-batch   (the tensors are the task's: see its module)
"""

from __future__ import annotations

import gc
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.checkpoint import (
    CORRUPT,
    Checkpoint,
    CheckpointError,
    average_checkpoints,
    list_checkpoints,
    load_checkpoint,
    load_optimizer_state,
    prune_checkpoints,
    save_checkpoint,
    set_aside,
    tidy_checkpoints,
)
from aiayn.errors import UserError
from aiayn.evaluation.perplexity import perplexity
from aiayn.kernels import prepare
from aiayn.models import count_parameters
from aiayn.performance import configure_device, keep_freed_memory
from aiayn.training import distributed as dist
from aiayn.training.averaging import (
    WINDOW_DIR,
    AveragingPlan,
    AveragingWindow,
    describe_steps,
    step_budget,
    steps_per_epoch,
)
from aiayn.training.config import RunConfig, TrainConfig
from aiayn.training.plot import plot_curves
from aiayn.training.rng import rng_state, set_rng_state
from aiayn.training.run_folder import (
    TOKENIZER_FILES,
    check_resume,
    claim_fresh,
    hold_run_folder,
    resume_metrics,
)
from aiayn.training.schedule import transformer_lr
from aiayn.training.task import Task, TaskData, make_task
from aiayn.training.translation import PreparedData as PreparedData
from aiayn.training.translation import prepare_data as prepare_data
from aiayn.validation import resolve_device as resolve_device


class StepStats(NamedTuple):
    """One optimizer step: loss/NLL sums stay tensors (no host sync until a log line).

    With several processes the sums are this rank's and ``tokens`` is the global count."""

    loss_sum: torch.Tensor
    nll_sum: torch.Tensor
    tokens: int
    lr: float
    padding: float
    skipped: str | None = None  # why the update was skipped (non-finite...), None = applied


class SkippedStep(NamedTuple):
    """Why a step was skipped; ``counted``: towards ``train.max_bad_steps`` (an fp16 overflow
    the loss scaler handles is not)."""

    reason: str
    counted: bool


class TrainingDiverged(UserError):
    """``train.max_bad_steps`` steps in a row had a non-finite loss or gradient norm: the run
    stopped without saving (``aiayn train`` exits with :data:`DIVERGED_EXIT_STATUS`)."""


DIVERGED_EXIT_STATUS = 3
"""The exit status of ``aiayn train`` after :class:`TrainingDiverged` (2: bad input)."""


@dataclass
class TrainResult:
    """What a finished run reports."""

    run_dir: Path
    steps: int
    epochs_completed: int
    minutes: float
    final_checkpoint: Path
    valid: dict[str, float]
    averaged_checkpoint: Path | None = None
    averaged_valid: dict[str, float] | None = None
    test_checkpoint: Path | None = None
    """The checkpoint whose weights translated the test set: the averaged one, or the final one
    when the average validates worse than the last weights (or nothing was averaged)."""
    test: dict[str, Any] | None = None
    samples: list[tuple[str, str]] = field(default_factory=list)

    @property
    def test_bleu(self) -> float | None:
        """The test set's BLEU (translation with a test set), else None."""
        return None if self.test is None else self.test.get("bleu")


def log(message: str) -> None:
    """Print a line of the trainer's report on rank 0 (kept apart so tests can silence it)."""
    if dist.is_main_process():
        print(message, flush=True)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``precision`` (None = plain fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class Trainer:
    """Runs one training job described by a :class:`RunConfig` (see :func:`train`).

    ``task``: what is learnt (default: the task of the run's model family, see
    :func:`~aiayn.training.task.make_task`). Under torchrun every process builds its own
    Trainer. ``self.model`` is the plain model (:class:`~aiayn.models.Transformer`,
    :class:`~aiayn.models.GPT2`); ``self.objective`` is the task's loss module around it, and
    ``self.train_model`` is what the training steps run: the objective itself with one process,
    DDP around it, or (FSDP) it with its parameters sharded. Rank 0 logs, validates and writes
    files; the others wait for it in the next collective.
    """

    def __init__(
        self,
        run: RunConfig,
        *,
        resume: bool = False,
        force: bool = False,
        task: Task | None = None,
    ):
        """Set up the run folder, the device, the data, the model (and the checkpoint to resume
        from), the optimizer, the sampler and the bookkeeping, then restore a resumed run's state.

        The order is part of the result: seeding, the model's initialisation, the per-rank
        reseeding and a resumed run's RNG state follow one another as here, so that a run is
        reproducible from its seed and a resumed run continues exactly."""
        if resume and force:
            raise UserError(
                "give --resume (continue the run in run_dir) or --force (delete it and start "
                "over), not both"
            )
        self.run = run
        self.task = make_task(run, log) if task is None else task
        self.cfg = run.train
        resolve_device(self.cfg.device)  # a device this machine lacks: refused before any work
        self._setup_run_dir(resume=resume, force=force)
        self._setup_device()
        _seed_everything(self.cfg.seed)
        self.data = self._prepare_data(resume)
        self._setup_model()
        checkpoint = self._latest_checkpoint() if resume else None
        self._setup_train_model(checkpoint)
        self._setup_optimizer()
        self._setup_sampler()
        self._setup_bookkeeping()
        if checkpoint is not None:
            self._restore(checkpoint)
        if resume:
            self._setup_resumed_history()
        self.window = self._averaging_window(resume)

    # -- set-up steps, in the order __init__ runs them -------------------------------------------
    def _setup_run_dir(self, *, resume: bool, force: bool) -> None:
        """Check the run folder for a resume, or claim it for a fresh run; then create it."""
        self.run_dir = Path(self.run.run_dir)
        if resume:  # every rank checks, before any of them writes (they meet in _setup_device)
            check_resume(self.run_dir, self.run)
        else:
            claim_fresh(self.run_dir, force=force, is_main=dist.is_main_process(), log=log)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def _setup_device(self) -> None:
        """Threads, the process group (torchrun) and device, the autocast dtype, sharding."""
        if self.cfg.threads is not None:
            torch.set_num_threads(self.cfg.threads)
        self.dist = dist.init_distributed(self.cfg.device)
        self.device = self.dist.device
        if self.cfg.keep_freed_memory and self.device.type == "cpu":
            keep_freed_memory()
        configure_device(self.device)
        self.amp_dtype = autocast_dtype(self.cfg.precision, self.device)
        self.sharded = self.dist.distributed and self.cfg.distributed == "fsdp"
        if self.sharded and self.amp_dtype == torch.float16:
            raise UserError("train.distributed=fsdp does not support precision fp16; use bf16")

    def _setup_model(self) -> None:
        """The task's model for the prepared data, freshly initialised (consumes the RNG); then
        ranks above 0 reseed, for a dropout stream of their own."""
        self.model_config = self.task.model_config(self.data)
        self.model = self.task.new_model(self.model_config).to(self.device)
        if self.dist.rank > 0:  # a dropout stream of its own; rank 0 keeps the 1-process one
            _seed_everything(_rank_seed(self.cfg.seed, self.dist.rank))

    def _setup_train_model(self, checkpoint: Checkpoint | None) -> None:
        """The checkpoint's weights (if resuming), the task's objective around the model, and
        what the training steps run: it, DDP around it or FSDP shards of it, maybe compiled."""
        if checkpoint is not None:  # before sharding: FSDP shards the loaded weights
            self.model.load_state_dict(checkpoint.model.state_dict())
        self.objective = self.task.objective(self.model)
        self.train_model = dist.wrap_model(self.objective, self.dist, self.cfg.distributed)
        if self.cfg.compile:
            self.train_model.compile()  # in place: the module's forward runs compiled

    def _setup_optimizer(self) -> None:
        """Adam (§5.3) and, for fp16, the loss scaler; the learning rate is set at every step."""
        self.optimizer = torch.optim.AdamW(  # Adam (§5.3) with decoupled weight decay (0: Adam)
            self.model.parameters(),
            lr=0.0,
            betas=self.cfg.adam_betas,
            eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay,
            fused=self.device.type == "cuda" or None,  # one kernel for all parameters on GPUs
        )
        # fp16 needs loss scaling against gradient underflow; bf16 and fp32 do not
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.amp_dtype == torch.float16
        )

    def _setup_sampler(self) -> None:
        """The task's token-budget batch sampler; with several processes, enough batches for
        one step of every rank."""
        self.sampler = self.task.sampler(self.data, self.cfg.max_tokens, self.cfg.seed)
        per_step = self.dist.world_size * self.cfg.accum_steps
        if self.dist.distributed and len(self.sampler) < per_step:
            raise UserError(
                f"the training data make {len(self.sampler)} batches per epoch, fewer than the "
                f"{per_step} ({self.dist.world_size} processes x {self.cfg.accum_steps}) one step "
                "takes: lower train.max_tokens or use fewer processes"
            )

    def _setup_bookkeeping(self) -> None:
        """The position in the data, the best score, the last validation and save: a fresh run's
        (a resumed one's come from its checkpoint, :meth:`_restore`)."""
        self.step, self.epoch, self.batch_index = 0, 0, 0
        self.best = self.task.criterion.worst  # the best validation score so far
        self._validated_at = -1
        self._last_valid: dict[str, float] | None = None  # the metrics of that validation
        self._last_saved: Path | None = None
        self._batches: list[list[int]] = []
        self._batches_epoch = -1
        self.bad_steps = 0  # steps skipped in a row for a non-finite loss or gradient
        self.history: list[dict[str, Any]] = []

    def _setup_resumed_history(self) -> None:
        """metrics.jsonl as of the checkpoint (none: empty); rank 0 keeps it."""
        validated = self._last_valid is not None
        history = dist.on_main(lambda: resume_metrics(self.run_dir, self.step, validated=validated))
        self.history = history or []

    # -- bookkeeping ---------------------------------------------------------------------------
    def _prepare_data(self, resume: bool) -> TaskData:
        """Rank 0 trains the tokenizer (or, resuming from a checkpoint, reloads it); then the
        other ranks load its file."""
        prepare = self.task.prepare_data
        # a tokenizer without a checkpoint is no run to resume: it may have been learnt from
        # data since fixed (a run that failed), so it is learnt again
        reuse = resume and bool(list_checkpoints(self.run_dir))
        if not self.dist.distributed:
            return prepare(self.run_dir, reuse_tokenizer=reuse)
        data = dist.on_main(lambda: prepare(self.run_dir, reuse_tokenizer=reuse))
        if data is not None:
            return data
        if not any((self.run_dir / name).exists() for name in TOKENIZER_FILES):
            raise UserError(
                f"rank {self.dist.rank} cannot see the tokenizer in {self.run_dir} "
                f"({' or '.join(TOKENIZER_FILES)}), which rank 0 wrote: with several machines, "
                "run_dir must be on a shared file system"
            )
        return prepare(self.run_dir, reuse_tokenizer=True)

    def _latest_checkpoint(self) -> Checkpoint | None:
        """The checkpoint to resume from: the newest intact one, the same on every rank, of the
        same world size. What a crash left mid-save is tidied up first; a newer checkpoint that
        is unusable (a file missing, corrupt or cut short) is skipped with a warning naming the
        file and set aside as ``NAME.corrupt``, so that pruning never counts it."""
        dist.on_main(lambda: tidy_checkpoints(self.run_dir / "checkpoints"))
        checkpoints = list_checkpoints(self.run_dir)
        seen = dist.all_gather_object(checkpoints[-1].name if checkpoints else None)
        if len(set(seen)) > 1:
            raise UserError(
                f"the ranks see different latest checkpoints in {self.run_dir} ({seen}): with "
                "several machines, run_dir must be on a shared file system"
            )
        if not checkpoints:
            log(f"resume: no checkpoint in {self.run_dir}; starting from scratch")
            return None
        ckpt = self._newest_intact(checkpoints)
        if ckpt.config != self.model_config:
            raise UserError(f"{ckpt.path}: its model config differs from this run's config")
        saved, world = int(ckpt.state.get("world_size", 1)), self.dist.world_size
        if saved != world:
            raise UserError(
                f"{ckpt.path} was written by a run of {saved} process(es) but this run has "
                f"{world}: resuming with another world size is not supported (the data shards "
                f"and the per-rank dropout streams depend on it); resume with {saved} "
                f"process(es) in all (torchrun: nnodes x nproc-per-node = {saved})"
            )
        return ckpt

    def _newest_intact(self, checkpoints: list[Path]) -> Checkpoint:
        """The newest of ``checkpoints`` whose files all check out (weights, state, tokenizer
        and optimizer), the same on every rank; the newer unusable ones are reported and (rank
        0) set aside. Raises a :class:`UserError` listing every problem when none is intact."""
        found: Checkpoint | None = None
        unusable: list[tuple[Path, CheckpointError]] = []
        for path in reversed(checkpoints):
            try:
                found = load_checkpoint(
                    path, map_location=self.device, expect=nn.Module, fp32_for="resuming training"
                )
                _ = found.optimizer_state  # read and checked now: a corrupt one falls back too
                break
            except CheckpointError as error:
                found = None
                unusable.append((path, error))
        chosen = dist.all_gather_object(None if found is None else found.path.name)
        if len(set(chosen)) > 1:
            raise UserError(
                f"the ranks find different intact checkpoints in {self.run_dir} ({chosen}): "
                "with several machines, run_dir must be on a shared file system"
            )
        if found is None:
            problems = "; ".join(str(error) for _, error in unusable)
            raise UserError(f"no intact checkpoint to resume from in {self.run_dir}: {problems}")
        for path, problem in unusable:
            log(
                f"resume: warning: {path.name} is unusable ({problem}); resuming from "
                f"{found.path.name} instead, and {path.name} is kept as {path.name}{CORRUPT}"
            )
        dist.on_main(lambda: [set_aside(path) for path, _ in unusable])
        return found

    def _restore(self, ckpt: Checkpoint) -> None:
        """Optimizer, loss scaler, data position and RNG state from ``ckpt`` (weights: done)."""
        if self.sharded:
            dist.load_full_optimizer_state_dict(self.model, self.optimizer, ckpt.optimizer_state)
        else:
            load_optimizer_state(ckpt.path, self.optimizer, ckpt.optimizer_state)
        s = ckpt.state
        if s.get("grad_scaler"):  # {}: written without fp16 loss scaling
            self.scaler.load_state_dict(s["grad_scaler"])
        self.step, self.epoch, self.batch_index = s["step"], s["epoch"], s["batch_index"]
        self.best = s.get(self.task.criterion.state_key, self.task.criterion.worst)
        self._last_saved = ckpt.path
        if s.get("metrics"):  # validated at this step: the end need not validate it again
            self._validated_at, self._last_valid = self.step, dict(s["metrics"])
        set_rng_state(s["rng_per_rank"][self.dist.rank] if self.dist.distributed else s["rng"])
        log(
            f"resume: from {ckpt.path.name} at step {self.step}, epoch {self.epoch}, "
            f"batch {self.batch_index}"
        )

    def _state(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """A checkpoint's JSON state; collective with several processes (every rank's RNG)."""
        rngs = dist.all_gather_object(rng_state())
        state = {
            **self.task.checkpoint_state(),
            "step": self.step,
            "epoch": self.epoch,
            "batch_index": self.batch_index,
            "world_size": self.dist.world_size,
            self.task.criterion.state_key: self.best,
            "grad_scaler": self.scaler.state_dict(),
            "rng": rngs[0],
            "run_config": self.run.to_dict(),
            "tokenizer": str(self.data.tokenizer_file),
            "metrics": metrics or {},
        }
        if self.dist.distributed:
            state["rng_per_rank"] = rngs
        return state

    def _full_model(self) -> nn.Module:
        """The model with all its weights: ``self.model``, or under FSDP an unsharded copy.

        Collective under FSDP: every rank calls it; ranks > 0 get ``self.model`` back.
        """
        if not self.sharded:
            return self.model
        weights = dist.full_model_state_dict(self.model)
        if not self.dist.is_main:
            return self.model
        with torch.random.fork_rng(devices=[]):  # building a model draws initial weights
            full = self.task.new_model(self.model_config)
        full.load_state_dict(weights)
        return full.to(self.device)

    def save(self, metrics: dict[str, Any] | None = None, model: nn.Module | None = None) -> Path:
        """Write ``checkpoints/step_XXXXXXXX`` and prune old ones (every rank calls; rank 0
        writes, the others wait until it is written)."""
        path = self.run_dir / "checkpoints" / f"step_{self.step:08d}"
        model = self._full_model() if model is None else model
        optimizer_state = (
            dist.full_optimizer_state_dict(self.model, self.optimizer) if self.sharded else None
        )
        state = self._state(metrics)

        def write() -> None:
            save_checkpoint(
                path,
                model,
                state,
                self.data.tokenizer_file,
                self.optimizer,
                optimizer_state=optimizer_state,
            )
            prune_checkpoints(self.run_dir, self.cfg.keep_last)

        dist.on_main(write)
        self._last_saved = path
        return path

    def _record(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` to the history and metrics.jsonl (every rank calls; rank 0 writes)."""
        dist.on_main(lambda: self._append(entry))

    def _append(self, entry: dict[str, Any]) -> None:
        """:meth:`_record` on rank 0 alone (in its rank-0-only work)."""
        self.history.append(entry)
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    # -- the step --------------------------------------------------------------------------------
    def _micro_batches(self) -> tuple[list[list[int]], int] | None:
        """This rank's batches for the next step and the step's target tokens over all ranks
        (None when the epoch is over).

        A step takes the next ``world_size × accum_steps`` batches of the epoch order; rank r
        gets the r-th run of ``accum_steps`` of them. ``batch_index`` counts globally (the same
        on every rank). With one process a short last step takes what is left; with several a
        short tail is skipped, so that all ranks take the same steps. Every rank knows the whole
        epoch order, so the global token count needs no communication.
        """
        batches = self._epoch_batches()
        world, accum = self.dist.world_size, self.cfg.accum_steps
        if self.batch_index >= len(batches) or (
            world > 1 and self.batch_index + world * accum > len(batches)
        ):
            return None
        step = batches[self.batch_index : self.batch_index + world * accum]
        start = self.dist.rank * accum
        self.batch_index = min(self.batch_index + world * accum, len(batches))
        tokens = self.data.train.target_tokens(np.concatenate(step))
        return step[start : start + accum], tokens

    def _epoch_batches(self) -> list[list[int]]:
        """The current epoch's batch order, built once per epoch (not once per step)."""
        if self._batches_epoch != self.epoch:
            self._batches = self.sampler.batches(self.epoch)
            self._batches_epoch = self.epoch
        return self._batches

    def accumulate_gradients(self, batches: list[Any], total_tokens: int) -> tuple[Tensor, Tensor]:
        """Backward over micro-batches, each loss divided by ``total_tokens``, the non-pad
        target tokens of the whole effective batch (of every rank's micro-batches).

        So the gradient is that of the whole effective batch's mean loss, however it is split.
        With several processes only the last micro-batch reduces the gradients (``no_sync``),
        and the loss is multiplied by the world size because DDP/FSDP average over ranks: the
        result is a one-process step over the global batch. Returns this rank's (loss sum,
        NLL sum).
        """
        world = self.dist.world_size
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, batch in enumerate(batches):
            with dist.gradient_sync(self.train_model, enabled=i == len(batches) - 1):
                with torch.autocast(
                    self.device.type,
                    dtype=self.amp_dtype or torch.float32,
                    enabled=self.amp_dtype is not None,
                ):
                    sums = self.train_model(*self.task.step_inputs(batch))
                self.scaler.scale(sums.loss * world / total_tokens).backward()
            loss_sum += sums.loss.detach()
            nll_sum += sums.nll
        return loss_sum, nll_sum

    def _to_device(self, batch: Any) -> Any:
        """Host batch -> device; on a GPU through pinned memory, without waiting for the copy."""
        if self.device.type != "cuda":
            return batch
        return batch.pin_memory().to(self.device, non_blocking=True)

    def train_step(self, micro: list[list[int]], total_tokens: int | None = None) -> StepStats:
        """One optimizer step over the micro-batches (gradient accumulation), eq. (3) lr.

        ``total_tokens``: target tokens of the step over all ranks (from :meth:`_micro_batches`);
        None = the micro-batches are the whole step (one process). A step whose loss or
        gradient norm is not finite (on any rank: all ranks agree) is skipped: no weight, Adam
        moment, step count or schedule position changes, and its batches stay passed over; see
        :meth:`_skip`. The returned stats say so (``skipped``).
        """
        batches = [self._to_device(self.data.train.collate(ids)) for ids in micro]
        if total_tokens is None:
            total_tokens = sum(b.num_tgt_tokens for b in batches)
        loss_sum, nll_sum = self.accumulate_gradients(batches, total_tokens)
        self.scaler.unscale_(self.optimizer)  # fp16: the true gradients, for the norm and clip
        skip = self._nonfinite(loss_sum)
        lr = transformer_lr(
            self.step + 1, self.model_config.d_model, self.cfg.warmup_steps, self.cfg.lr_scale
        )
        if skip is None:
            self.step += 1
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.scaler.step(self.optimizer)  # = optimizer.step() unless fp16
        self.scaler.update()  # fp16: after a non-finite gradient, a lower loss scale
        self.optimizer.zero_grad(set_to_none=True)
        if skip is None:
            self.bad_steps = 0
        else:
            self._skip(skip)
        padding = self.task.padding(batches)
        reason = None if skip is None else skip.reason
        return StepStats(loss_sum, nll_sum, total_tokens, lr, padding, reason)

    def _grad_norm(self) -> Tensor:
        """The global norm of the (unscaled) gradients, which are clipped to ``train.clip_norm``
        when set; under FSDP gathered over the shards (collective). After DDP's reduction the
        gradients, and so their norm, are the same on every rank."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.cfg.clip_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if self.sharded:
            from torch.distributed.tensor import DTensor

            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
        return norm

    def _nonfinite(self, loss_sum: Tensor) -> SkippedStep | None:
        """Why this step must be skipped (its loss summed over the ranks, or its gradient norm,
        is not finite), else None: one all-reduce and one host sync per step.

        With fp16 loss scaling, a non-finite gradient under a finite loss is an overflow of the
        scaled gradient while the scale is above 1: the scaler's business (it lowers the scale),
        not counted as a bad step.
        """
        norm = self._grad_norm()
        loss = dist.all_reduce_sum(loss_sum.detach().float().clone())
        loss_value, norm_value = torch.stack([loss, norm.float().to(loss.device)]).tolist()
        reasons = [f"the loss was {loss_value}"] if not math.isfinite(loss_value) else []
        if not math.isfinite(norm_value):
            reasons.append(f"the gradient norm was {norm_value}")
        if not reasons:
            return None
        # a finite loss here means a non-finite gradient norm
        overflow = self.scaler.is_enabled() and math.isfinite(loss_value)
        overflow = overflow and self.scaler.get_scale() > 1.0
        return SkippedStep(" and ".join(reasons), counted=not overflow)

    def _skip(self, skip: SkippedStep) -> None:
        """Report a skipped step; stop the run (:class:`TrainingDiverged`) after
        ``train.max_bad_steps`` counted ones in a row. Nothing is saved after them, so the
        newest checkpoint is from before them."""
        step, limit = self.step + 1, self.cfg.max_bad_steps
        if not skip.counted:
            scale = self.scaler.get_scale()
            log(f"step {step}: fp16 gradient overflow, update skipped; loss scale now {scale:g}")
            return
        self.bad_steps += 1
        log(
            f"warning: step {step} skipped ({self.bad_steps} of train.max_bad_steps={limit} in a "
            f"row): {skip.reason}; no weight changed, and its batches are passed over"
        )
        if self.bad_steps < limit:
            return
        if self._last_saved is None:
            where = "no checkpoint was saved before them; start again"
        else:
            where = f"the newest checkpoint, {self._last_saved.name}, is from before them: resume"
        raise TrainingDiverged(
            f"training stopped: {limit} steps in a row had a non-finite loss or gradient norm, "
            f"the last at step {step} ({skip.reason}); {where} with a lower train.lr_scale or "
            "a train.clip_norm, or check the data"
        )

    # -- evaluation ------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, *, model: nn.Module | None = None, **options: Any) -> dict[str, float]:
        """The task's validation metrics of ``model`` (default: self.model), in eval mode and
        without gradients; ``options`` are the task's (translation: ``bleu_sentences``)."""
        model = self.model if model is None else model
        was_training = model.training
        model.eval()
        try:
            return self.task.evaluate(model, self.data, max_tokens=self.cfg.max_tokens, **options)
        finally:
            model.train(was_training)

    def _validate_and_save(self) -> dict[str, float]:
        """Validate (rank 0; the others wait for its metrics) and save (every rank calls)."""
        model = self._full_model()
        metrics: dict[str, float] = dist.broadcast_object(
            dist.on_main(lambda: self.evaluate(model=model))
        )
        self._validated_at = self.step
        self._record({"kind": "valid", "step": self.step, **metrics})
        criterion = self.task.criterion
        if criterion.better(metrics[criterion.metric], self.best):
            # best first, and the step's checkpoint records the new best: a run resumed from an
            # older checkpoint replays this validation and writes the same best again
            self.best = metrics[criterion.metric]
            state = self._state(metrics)
            best = self.run_dir / "checkpoints" / "best"
            dist.on_main(lambda: save_checkpoint(best, model, state, self.data.tokenizer_file))
        path = self.save(metrics, model)
        log(f"valid step {self.step}: {self.task.metrics_line(metrics)} -> {path.name}")
        curves = self.run_dir / "curves.png"
        dist.on_main(
            lambda: plot_curves(
                self.history, curves, criterion.metric, criterion.label, criterion.plot_title
            )
        )
        return metrics

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train until max_steps / max_epochs / max_minutes, then validate and save.

        Raises :class:`TrainingDiverged` after ``train.max_bad_steps`` skipped steps in a row,
        with nothing saved after them (no final, ``best`` or averaged checkpoint)."""
        cfg = self.cfg
        self._log_setup()
        if self.device.type == "cpu":  # kernels built before the clock starts, never inside it
            log("; ".join(prepare()))
        progress = _Progress(cfg, self.step, enabled=cfg.progress and self.dist.is_main)
        started = time.perf_counter()
        try:
            last_valid = self._train_loop(progress, started)
        finally:
            progress.close()
        minutes = (time.perf_counter() - started) / 60
        if self.window is not None and self.window.saved_at != self.step:  # the window's last
            self._save_for_averaging()
        if last_valid is None or self._validated_at != self.step:
            last_valid = self._validate_and_save()
        assert self._last_saved is not None
        result = TrainResult(
            self.run_dir, self.step, self.epoch, minutes, self._last_saved, last_valid
        )
        self._finish(result)
        return dist.broadcast_object(result)  # rank 0's, with the averaged/test scores

    def _train_loop(self, progress: _Progress, started: float) -> dict[str, float] | None:
        """The steps, with their logs, validations and checkpoints; returns the last
        validation's metrics (None: none since the start or the resumed checkpoint)."""
        cfg, bar = self.cfg, progress.bar
        window_start = time.perf_counter()
        window: list[StepStats] = []
        last_valid = self._last_valid
        while self.step < cfg.max_steps:
            if cfg.max_minutes is not None and dist.any_rank(
                time.perf_counter() - started > 60 * cfg.max_minutes, self.device
            ):
                log(f"stop: time budget of {cfg.max_minutes} minutes reached")
                break
            step = self._micro_batches()
            if step is None:
                self.epoch, self.batch_index = self.epoch + 1, 0
                if cfg.max_epochs is not None and self.epoch >= cfg.max_epochs:
                    log(f"stop: {cfg.max_epochs} epochs done")
                    break
                continue
            stats = self.train_step(*step)
            if stats.skipped is not None:  # no new step: nothing to log, validate or save
                continue
            window.append(stats)
            if self.step % cfg.log_every == 0:
                self._log_window(window, time.perf_counter() - window_start, bar)
                window, window_start = [], time.perf_counter()
            progress.advance(self.step)
            if self._averaging_due(started):
                self._save_for_averaging()
            if cfg.eval_every and self.step % cfg.eval_every == 0:
                last_valid = self._validate_and_save()
            elif cfg.save_every and self.step % cfg.save_every == 0:
                self.save()
        if window:  # the steps since the last line, however the loop stopped
            self._log_window(window, time.perf_counter() - window_start, bar)
        return last_valid

    def _log_setup(self) -> None:
        cfg = self.cfg
        n_params = count_parameters(self.model)
        vocab = getattr(self.model_config, "vocab_size", None)  # None: an image model
        log(
            f"model: {n_params / 1e6:.1f}M parameters, "
            + ("" if vocab is None else f"vocab {vocab}, ")
            + f"device "
            f"{self.device}, precision {self.amp_dtype or 'fp32'}, "
            f"threads {torch.get_num_threads()}"
        )
        if self.dist.distributed:
            log(
                f"distributed: {self.dist.world_size} processes, {cfg.distributed.upper()} over "
                f"{self.dist.backend}; a step takes {self.dist.world_size} x {cfg.accum_steps} "
                "batches; rank 0 logs and saves"
            )
        log(
            f"batches: {len(self.sampler)} per epoch of {self.task.describe(self.data)} at "
            f"max_tokens {cfg.max_tokens} (x{cfg.accum_steps} accumulation); padding "
            f"{100 * self.sampler.padding_fraction(self.epoch):.1f}%"
        )
        if self.window is not None:
            log(self.window.plan.describe())

    def _log_window(self, window: list[StepStats], seconds: float, bar: Any) -> None:
        """Record the mean training loss since the last line: one host sync, one all-reduce."""
        tokens = sum(o.tokens for o in window)  # global already
        zero = torch.zeros((), device=self.device)
        sums = torch.stack(
            [sum((o.loss_sum for o in window), zero), sum((o.nll_sum for o in window), zero)]
        )
        loss_sum, nll_sum = dist.all_reduce_sum(sums).tolist()
        loss, nll, rate = loss_sum / tokens, nll_sum / tokens, tokens / seconds
        entry = {
            "kind": "train",
            "step": self.step,
            "epoch": self.epoch,
            "loss": loss,
            "nll": nll,
            "ppl": perplexity(nll),
            "lr": window[-1].lr,
            "tgt_tokens_per_s": rate,
            "padding": sum(o.padding for o in window) / len(window),
        }
        self._record(entry)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{window[-1].lr:.2e}", tok_s=f"{rate:.0f}")

    # -- averaging (§6.1) -----------------------------------------------------------------------
    def _averaging_window(self, resume: bool) -> AveragingWindow | None:
        """The run's averaging checkpoints (:mod:`~aiayn.training.averaging`; None when
        ``average_last`` < 2). A resumed run deletes those written after its checkpoint: it
        writes them again."""
        cfg = self.cfg
        if cfg.average_last < 2:
            return None
        epoch = steps_per_epoch(len(self.sampler), self.dist.world_size, cfg.accum_steps)
        budget = step_budget(cfg.max_steps, cfg.max_epochs, epoch)
        plan = AveragingPlan.of(cfg.average_last, cfg.average_window, budget, cfg.max_minutes)
        window = AveragingWindow(self.run_dir / "checkpoints" / WINDOW_DIR, plan)
        if resume:
            gone = dist.on_main(lambda: window.forget_after(self.step))
            if gone:
                log(
                    f"resume: deleted the averaging checkpoints of steps {describe_steps(gone)} "
                    f"(after step {self.step}); they are written again"
                )
        return window

    def _averaging_due(self, started: float) -> bool:
        """Whether this step's averaging checkpoint is due (the same answer on every rank)."""
        if self.window is None:
            return False
        elapsed = time.perf_counter() - started
        time_due = self.window.time_due(elapsed)
        if self.window.plan.seconds:  # elapsed time differs between ranks: rank-wide answer
            time_due = dist.any_rank(time_due, self.device)
        return self.window.due(self.step, elapsed, time_due)

    def _save_for_averaging(self) -> None:
        """Write this step's averaging checkpoint, weights only (every rank calls; rank 0
        writes). Before the step's regular checkpoint: a run resumed from that one never lacks
        the averaging checkpoints of its steps."""
        assert self.window is not None
        model = self._full_model()
        state = self._state()
        path = self.window.path(self.step)
        dist.on_main(lambda: save_checkpoint(path, model, state, self.data.tokenizer_file))
        self.window.saved_at = self.step

    def _average(self, result: TrainResult) -> nn.Module | None:
        """Average the checkpoints of the window (rank 0) into ``checkpoints/averaged``,
        validate it against the last checkpoint, and make it ``best`` when it beats the best
        validation so far; records it all. Returns the averaged model if it validates at least
        as well as the last checkpoint, else None."""
        assert self.window is not None
        chosen = self.window.selection(self.step)
        if len(chosen) < 2:
            log(
                f"averaging: only {len(chosen)} checkpoint in the last "
                f"{self.cfg.average_window:.0%} of the run, nothing averaged (raise "
                "train.average_window or lower train.average_last)"
            )
            return None
        steps = [s for s, _ in chosen]
        out = self.run_dir / "checkpoints" / "averaged"
        result.averaged_checkpoint = average_checkpoints([p for _, p in chosen], out)
        averaged = load_checkpoint(out, map_location=self.device, expect=nn.Module)
        result.averaged_valid = valid = self.evaluate(model=averaged.model)
        criterion = self.task.criterion
        value, last = valid[criterion.metric], result.valid[criterion.metric]
        new_best = criterion.better(value, self.best)
        if new_best:
            self.best = value
            state = {**averaged.state, "metrics": valid, criterion.state_key: value}
            best = self.run_dir / "checkpoints" / "best"
            save_checkpoint(best, averaged.model, state, self.data.tokenizer_file)
        use = not criterion.better(last, value)
        self._append(
            {
                "kind": "valid_averaged",
                "step": self.step,
                "checkpoints": len(chosen),
                "averaged_steps": steps,
                **valid,
                f"last_{criterion.metric}": last,
                "best": "averaged" if new_best else "kept",
            }
        )
        log(
            f"averaged {len(chosen)} checkpoints (steps {describe_steps(steps)}): "
            f"{criterion.label} {value:.2f} against {last:.2f} for the last checkpoint; "
            + ("the averaged one is now best" if new_best else "best stays as it was")
            + ("" if use else "; the last checkpoint is used for the test set")
        )
        return averaged.model if use else None

    def _finish(self, result: TrainResult) -> None:
        """Average the window's checkpoints (§6.1), then the task's end (test set, samples),
        on rank 0 with the averaged model if it validates at least as well as the last
        checkpoint, else the last one."""
        model = self._full_model()  # collective under FSDP
        dist.on_main(lambda: self._finish_on_main(result, model))

    def _finish_on_main(self, result: TrainResult, model: nn.Module) -> None:
        """:meth:`_finish`'s work on rank 0, with the full ``model``."""
        averaged = None if self.window is None else self._average(result)
        model = model if averaged is None else averaged
        result.test_checkpoint = (
            result.final_checkpoint if averaged is None else result.averaged_checkpoint
        )
        was_training = model.training
        model.eval()
        try:
            final = self.task.finish(model, self.data, self.run_dir)
        finally:
            model.train(was_training)
        if final.test is not None:
            self._append({"kind": "test", "step": self.step, **final.test})
        result.test, result.samples = final.test, final.samples


def train(run: RunConfig, *, resume: bool = False, force: bool = False) -> TrainResult:
    """Train the model ``run`` describes (under torchrun: this process's part); see
    :class:`Trainer` (``force``: delete the run already in ``run_dir`` first). Every rank
    returns rank 0's result, or raises with the others: :class:`TrainingDiverged`, or the
    :class:`~aiayn.training.distributed.RankZeroFailed` of what rank 0 failed at (a file it
    could not write…), having left the process group together.

    Rank 0 holds the run folder's lock throughout (:func:`hold_run_folder`: another run there
    is refused naming its pid), and a run that fails before its first checkpoint leaves the
    folder as it found it."""
    with hold_run_folder(Path(run.run_dir), is_main=dist.is_main_process()):
        return _train(run, resume=resume, force=force)


def _train(run: RunConfig, *, resume: bool, force: bool) -> TrainResult:
    """:func:`train` once the run folder is held."""
    failed: UserError
    try:
        trainer = Trainer(run, resume=resume, force=force)
    except dist.RankZeroFailed as error:
        failed = error.with_traceback(None)  # its frames hold the half-built trainer
    else:
        outcome = _fit(trainer)
        distributed = trainer.dist.distributed
        del trainer  # DDP/FSDP hold the process group: free them before leaving it
        if not isinstance(outcome, UserError):
            if distributed:
                gc.collect()
                dist.cleanup()
            return outcome
        failed = outcome
    gc.collect()
    dist.cleanup()
    raise failed


def _fit(trainer: Trainer) -> TrainResult | UserError:
    """``trainer.fit()``, or the error every rank raised at the same step
    (:class:`TrainingDiverged`, :class:`~aiayn.training.distributed.RankZeroFailed`), without
    its traceback, which would keep the trainer and its process group alive."""
    try:
        return trainer.fit()
    except (TrainingDiverged, dist.RankZeroFailed) as error:
        return error.with_traceback(None)


def _rank_seed(seed: int, rank: int) -> int:
    """A seed for rank ``rank`` > 0, independent of ``seed`` + k for other runs."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _Progress:
    """The progress bar: over steps, or over the time budget when ``max_minutes`` is set (so
    that its ETA is the real one); the step number, loss, lr and tokens/s show beside it."""

    def __init__(self, cfg: TrainConfig, initial_step: int, *, enabled: bool):
        from tqdm import tqdm

        self.budget = None if cfg.max_minutes is None else int(60 * cfg.max_minutes)
        self.started = time.perf_counter()
        self.bar = tqdm(
            total=cfg.max_steps if self.budget is None else self.budget,
            initial=initial_step if self.budget is None else 0,
            disable=not enabled,
            unit="step" if self.budget is None else "s",
            bar_format=None
            if self.budget is None
            else "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}",
            dynamic_ncols=True,
            mininterval=1.0,
        )

    def advance(self, step: int) -> None:
        """Record that optimizer step ``step`` is done."""
        if self.budget is None:
            self.bar.update(1)
            return
        self.bar.set_description(f"step {step}", refresh=False)
        elapsed = min(int(time.perf_counter() - self.started), self.budget)
        self.bar.update(elapsed - self.bar.n)

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()
