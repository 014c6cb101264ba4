"""The training loop of §5: token-budget batches, Adam with the warm-up schedule of eq. (3),
label smoothing, dropout, periodic validation (loss, perplexity, greedy BLEU), checkpoints that
resume exactly, and checkpoint averaging. Under torchrun, data-parallel over several processes
(DDP or FSDP, see :mod:`aiayn.training.distributed` and docs/distributed.md).

Shape legend:  B sentences in a micro-batch   S source length   T target length   V vocabulary
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
from torch import Tensor

from aiayn.data import (
    Batch,
    ParallelDataset,
    TokenBatchSampler,
    Tokenizer,
    demo_corpus_path,
    filter_pairs,
    read_parallel,
)
from aiayn.data.batching import SPECIALS_PER_ROW, batches_padding_fraction
from aiayn.decoding.translate import DecodeOptions, translate_ids, translate_texts
from aiayn.errors import UserError
from aiayn.evaluation import corpus_bleu, corpus_chrf
from aiayn.models import Transformer, count_parameters
from aiayn.training import distributed as dist
from aiayn.training.checkpoint import (
    Checkpoint,
    average_checkpoints,
    list_checkpoints,
    load_checkpoint,
    load_optimizer,
    prune_checkpoints,
    read_optimizer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from aiayn.training.config import RunConfig, TrainConfig
from aiayn.training.objective import TranslationObjective
from aiayn.training.performance import configure_device, keep_freed_memory
from aiayn.training.plot import plot_curves
from aiayn.training.schedule import transformer_lr


@dataclass
class PreparedData:
    """Tokenizer, encoded splits and the raw validation/test text for BLEU."""

    tokenizer: Tokenizer
    tokenizer_file: Path
    train: ParallelDataset
    valid: ParallelDataset
    valid_pairs: list[tuple[str, str]]
    test_pairs: list[tuple[str, str]] = field(default_factory=list)


class StepStats(NamedTuple):
    """One optimizer step: loss/NLL sums stay tensors (no host sync until a log line).

    With several processes the sums are this rank's and ``tokens`` is the global count."""

    loss_sum: torch.Tensor
    nll_sum: torch.Tensor
    tokens: int
    lr: float
    padding: float


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
    test_bleu: float | None = None


def log(message: str) -> None:
    """Print a line of the trainer's report on rank 0 (kept apart so tests can silence it)."""
    if dist.is_main_process():
        print(message, flush=True)


def prepare_data(run: RunConfig, *, reuse_tokenizer: bool) -> PreparedData:
    """Read, clean, split and tokenise the corpus; train (or reload) the joint BPE (§5.1)."""
    d = run.data
    if d.train_src is None:
        train_pairs = read_parallel(demo_corpus_path())
        log(
            f"data: built-in demo corpus {demo_corpus_path().name} "
            "(Tatoeba EN-DE, CC BY 2.0: www.manythings.org/anki and tatoeba.org)"
        )
    else:
        train_pairs = read_parallel(d.train_src, d.train_tgt)
    if d.lowercase:
        train_pairs = [(s.lower(), t.lower()) for s, t in train_pairs]
    train_pairs, report = filter_pairs(train_pairs, max_words=d.max_words, max_ratio=d.max_ratio)
    log(f"data: train {report}")
    if d.valid_src is not None:
        valid_pairs, vreport = filter_pairs(
            read_parallel(d.valid_src, d.valid_tgt), max_words=10**6, max_ratio=1e9
        )
        log(f"data: valid {vreport}")
    else:  # hold out a seeded random slice
        order = np.random.default_rng(run.train.seed).permutation(len(train_pairs))
        held = set(order[: d.valid_size].tolist())
        valid_pairs = [train_pairs[i] for i in sorted(held)]
        train_pairs = [p for i, p in enumerate(train_pairs) if i not in held]
        log(f"data: held out {len(valid_pairs)} training pairs for validation")
    test_pairs: list[tuple[str, str]] = []
    if d.test_src is not None:
        test_pairs, _ = filter_pairs(
            read_parallel(d.test_src, d.test_tgt), max_words=10**6, max_ratio=1e9
        )

    tokenizer_file = Path(run.run_dir) / "tokenizer.json"
    if reuse_tokenizer and tokenizer_file.is_file():
        tokenizer = Tokenizer.load(tokenizer_file)
    else:
        started = time.perf_counter()
        texts = [s for s, _ in train_pairs] + [t for _, t in train_pairs]
        tokenizer = Tokenizer.train(texts, d.vocab_size, min_frequency=d.min_frequency)
        tokenizer_file.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(tokenizer_file)
        log(
            f"data: joint BPE vocabulary of {tokenizer.vocab_size} tokens "
            f"({time.perf_counter() - started:.1f}s)"
        )
    limit = d.max_tokens_per_sentence
    train = ParallelDataset.from_pairs(train_pairs, tokenizer, max_tokens_per_sentence=limit)
    valid = ParallelDataset.from_pairs(valid_pairs, tokenizer)
    if train.num_dropped_too_long:
        log(f"data: dropped {train.num_dropped_too_long} training pairs over {limit} subwords")
    if len(train) == 0:
        raise UserError("no training pairs left after cleaning; check the data files")
    return PreparedData(tokenizer, tokenizer_file, train, valid, valid_pairs, test_pairs)


def resolve_device(name: str) -> torch.device:
    """ "auto" -> CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``precision`` (None = plain fp32)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class Trainer:
    """Runs one training job described by a :class:`RunConfig` (see :func:`train`).

    Under torchrun every process builds its own Trainer. ``self.model`` is the plain
    :class:`Transformer`; ``self.objective`` is the loss module around it
    (:class:`TranslationObjective`), and ``self.train_model`` is what the training steps run:
    the objective itself with one process, DDP around it, or (FSDP) it with its parameters
    sharded. Rank 0 logs, validates and writes files; the others wait for it in the next collective.
    """

    def __init__(self, run: RunConfig, *, resume: bool = False):
        self.run = run
        self.cfg = run.train
        self.run_dir = Path(run.run_dir)
        if not resume and list_checkpoints(self.run_dir):
            raise UserError(
                f"{self.run_dir} already holds checkpoints: pass --resume to continue that run, "
                "or choose another run_dir"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
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
        _seed_everything(self.cfg.seed)
        self.data = self._prepare_data(resume)
        tok = self.data.tokenizer
        self.model_config = run.model.replace(
            vocab_size=tok.vocab_size, pad_id=tok.pad_id, tgt_vocab_size=None
        )
        self.model = Transformer(self.model_config).to(self.device)
        if self.dist.rank > 0:  # a dropout stream of its own; rank 0 keeps the 1-process one
            _seed_everything(_rank_seed(self.cfg.seed, self.dist.rank))
        checkpoint = self._latest_checkpoint() if resume else None
        if checkpoint is not None:  # before sharding: FSDP shards the loaded weights
            self.model.load_state_dict(checkpoint.model.state_dict())
        self.objective = TranslationObjective(self.model)
        self.train_model = dist.wrap_model(self.objective, self.dist, self.cfg.distributed)
        if self.cfg.compile:
            self.train_model.compile()  # in place: the module's forward runs compiled
        self.optimizer = torch.optim.Adam(
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
        self.sampler = TokenBatchSampler(
            self.data.train.src_lengths,
            self.data.train.tgt_lengths,
            self.cfg.max_tokens,
            seed=self.cfg.seed,
        )
        per_step = self.dist.world_size * self.cfg.accum_steps
        if self.dist.distributed and len(self.sampler) < per_step:
            raise UserError(
                f"the training data make {len(self.sampler)} batches per epoch, fewer than the "
                f"{per_step} ({self.dist.world_size} processes x {self.cfg.accum_steps}) one step "
                "takes: lower train.max_tokens or use fewer processes"
            )
        self.step, self.epoch, self.batch_index = 0, 0, 0
        self.best_bleu = -math.inf
        self._validated_at = -1
        self._last_saved: Path | None = None
        self._batches: list[list[int]] = []
        self._batches_epoch = -1
        self.history: list[dict[str, Any]] = []
        if checkpoint is not None:
            self._restore(checkpoint)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _prepare_data(self, resume: bool) -> PreparedData:
        """Rank 0 trains (or reloads) the tokenizer; then the other ranks load its file."""
        if not self.dist.distributed:
            return prepare_data(self.run, reuse_tokenizer=resume)
        data = prepare_data(self.run, reuse_tokenizer=resume) if self.dist.is_main else None
        dist.barrier()
        if data is not None:
            return data
        if not (self.run_dir / "tokenizer.json").is_file():
            raise UserError(
                f"rank {self.dist.rank} cannot see {self.run_dir / 'tokenizer.json'}, which "
                "rank 0 wrote: with several machines, run_dir must be on a shared file system"
            )
        return prepare_data(self.run, reuse_tokenizer=True)

    def _latest_checkpoint(self) -> Checkpoint | None:
        """The checkpoint to resume from: the same one on every rank, of the same world size."""
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
        ckpt = load_checkpoint(checkpoints[-1], map_location=self.device)
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

    def _restore(self, ckpt: Checkpoint) -> None:
        """Optimizer, loss scaler, data position and RNG state from ``ckpt`` (weights: done)."""
        if self.sharded:
            full = read_optimizer_state(ckpt.path, ckpt.state)
            dist.load_full_optimizer_state_dict(self.model, self.optimizer, full)
        else:
            load_optimizer(ckpt.path, self.optimizer, ckpt.state)
        s = ckpt.state
        if "grad_scaler" in s:
            self.scaler.load_state_dict(s["grad_scaler"])
        self.step, self.epoch, self.batch_index = s["step"], s["epoch"], s["batch_index"]
        self.best_bleu = s.get("best_bleu", -math.inf)
        set_rng_state(s["rng_per_rank"][self.dist.rank] if self.dist.distributed else s["rng"])
        log(
            f"resume: from {ckpt.path.name} at step {self.step}, epoch {self.epoch}, "
            f"batch {self.batch_index}"
        )

    def _state(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        """A checkpoint's JSON state; collective with several processes (every rank's RNG)."""
        rngs = dist.all_gather_object(rng_state())
        state = {
            "step": self.step,
            "epoch": self.epoch,
            "batch_index": self.batch_index,
            "world_size": self.dist.world_size,
            "best_bleu": self.best_bleu,
            "grad_scaler": self.scaler.state_dict(),
            "rng": rngs[0],
            "run_config": self.run.to_dict(),
            "tokenizer": str(self.data.tokenizer_file),
            "metrics": metrics or {},
        }
        if self.dist.distributed:
            state["rng_per_rank"] = rngs
        return state

    def _full_model(self) -> Transformer:
        """The model with all its weights: ``self.model``, or under FSDP an unsharded copy.

        Collective under FSDP: every rank calls it; ranks > 0 get ``self.model`` back.
        """
        if not self.sharded:
            return self.model
        weights = dist.full_model_state_dict(self.model)
        if not self.dist.is_main:
            return self.model
        with torch.random.fork_rng(devices=[]):  # building a model draws initial weights
            full = Transformer(self.model_config)
        full.load_state_dict(weights)
        return full.to(self.device)

    def save(self, metrics: dict[str, Any] | None = None, model: Transformer | None = None) -> Path:
        """Write ``checkpoints/step_XXXXXXXX`` and prune old ones (every rank calls; rank 0
        writes, the others wait until it is written)."""
        path = self.run_dir / "checkpoints" / f"step_{self.step:08d}"
        model = self._full_model() if model is None else model
        optimizer_state = (
            dist.full_optimizer_state_dict(self.model, self.optimizer) if self.sharded else None
        )
        state = self._state(metrics)
        if self.dist.is_main:
            save_checkpoint(
                path,
                model,
                state,
                self.data.tokenizer_file,
                self.optimizer,
                optimizer_state=optimizer_state,
            )
            prune_checkpoints(self.run_dir, self.cfg.keep_last)
        dist.barrier()
        self._last_saved = path
        return path

    def _record(self, entry: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
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
        ids = np.concatenate(step)
        tokens = int(self.data.train.tgt_lengths[ids].sum()) + SPECIALS_PER_ROW * ids.size
        return step[start : start + accum], tokens

    def _epoch_batches(self) -> list[list[int]]:
        """The current epoch's batch order, built once per epoch (not once per step)."""
        if self._batches_epoch != self.epoch:
            self._batches = self.sampler.batches(self.epoch)
            self._batches_epoch = self.epoch
        return self._batches

    def accumulate_gradients(
        self, batches: list[Batch], total_tokens: int
    ) -> tuple[Tensor, Tensor]:
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
                    sums = self.train_model(
                        batch.src, batch.tgt_in, batch.tgt_out, batch.num_tgt_tokens
                    )
                self.scaler.scale(sums.loss * world / total_tokens).backward()
            loss_sum += sums.loss.detach()
            nll_sum += sums.nll
        return loss_sum, nll_sum

    def _to_device(self, batch: Batch) -> Batch:
        """Host batch -> device; on a GPU through pinned memory, without waiting for the copy."""
        if self.device.type != "cuda":
            return batch
        return batch.pin_memory().to(self.device, non_blocking=True)

    def train_step(self, micro: list[list[int]], total_tokens: int | None = None) -> StepStats:
        """One optimizer step over the micro-batches (gradient accumulation), eq. (3) lr.

        ``total_tokens``: target tokens of the step over all ranks (from :meth:`_micro_batches`);
        None = the micro-batches are the whole step (one process).
        """
        batches = [self._to_device(self.data.train.collate(ids)) for ids in micro]
        if total_tokens is None:
            total_tokens = sum(b.num_tgt_tokens for b in batches)
        loss_sum, nll_sum = self.accumulate_gradients(batches, total_tokens)
        if self.cfg.clip_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.step += 1
        lr = transformer_lr(
            self.step, self.model_config.d_model, self.cfg.warmup_steps, self.cfg.lr_scale
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.step(self.optimizer)  # = optimizer.step() unless fp16
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(loss_sum, nll_sum, total_tokens, lr, batches_padding_fraction(batches))

    # -- evaluation ------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(
        self, *, bleu_sentences: int | None = None, model: Transformer | None = None
    ) -> dict[str, float]:
        """Validation loss, NLL, perplexity and greedy BLEU of ``model`` (default: self.model)."""
        model = self.model if model is None else model
        was_training = model.training
        model.eval()
        try:
            return self._evaluate(model, bleu_sentences)
        finally:
            model.train(was_training)

    def _evaluate(self, model: Transformer, bleu_sentences: int | None) -> dict[str, float]:
        objective = TranslationObjective(model)
        valid = self.data.valid
        sampler = TokenBatchSampler(
            valid.src_lengths, valid.tgt_lengths, self.cfg.max_tokens, seed=0, shuffle=False
        )
        loss = nll = tokens = 0.0
        for ids in sampler.batches(0):
            batch = valid.collate(ids).to(self.device)
            sums = objective(batch.src, batch.tgt_in, batch.tgt_out, batch.num_tgt_tokens)
            loss, nll, tokens = (
                loss + sums.loss.item(),
                nll + sums.nll.item(),
                tokens + batch.num_tgt_tokens,
            )
        n = self.run.data.bleu_sentences if bleu_sentences is None else bleu_sentences
        n = len(valid) if n == 0 else min(n, len(valid))
        greedy = DecodeOptions(beam_size=1, max_tokens=self.cfg.max_tokens)
        best = translate_ids(model, valid.src[:n], self.data.tokenizer, greedy)
        hyps = self.data.tokenizer.decode_batch([h[0].tokens for h in best])
        refs = [self.data.valid_pairs[int(i)][1] for i in valid.source_indices[:n]]
        bleu = corpus_bleu(hyps, refs).score
        return {
            "loss": loss / tokens,
            "nll": nll / tokens,
            "ppl": math.exp(nll / tokens),
            "bleu": bleu,
            "bleu_sentences": n,
        }

    def _validate_and_save(self) -> dict[str, float]:
        """Validate (rank 0; the others wait for its metrics) and save (every rank calls)."""
        model = self._full_model()
        metrics: dict[str, float] = dist.broadcast_object(
            self.evaluate(model=model) if self.dist.is_main else None
        )
        self._validated_at = self.step
        self._record({"kind": "valid", "step": self.step, **metrics})
        path = self.save(metrics, model)
        if metrics["bleu"] > self.best_bleu:
            self.best_bleu = metrics["bleu"]
            state = self._state(metrics)
            if self.dist.is_main:
                best = self.run_dir / "checkpoints" / "best"
                save_checkpoint(best, model, state, self.data.tokenizer_file)
        log(
            f"valid step {self.step}: loss {metrics['loss']:.3f} ppl {metrics['ppl']:.2f} "
            f"BLEU {metrics['bleu']:.2f} ({int(metrics['bleu_sentences'])} sentences) "
            f"-> {path.name}"
        )
        if self.dist.is_main:
            plot_curves(self.history, self.run_dir / "curves.png")
        return metrics

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train until max_steps / max_epochs / max_minutes, then validate and save."""
        cfg = self.cfg
        self._log_setup()
        progress = _Progress(cfg, self.step, enabled=cfg.progress and self.dist.is_main)
        bar = progress.bar
        started = window_start = time.perf_counter()
        window: list[StepStats] = []
        last_valid: dict[str, float] | None = None
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
            window.append(self.train_step(*step))
            if self.step % cfg.log_every == 0:
                self._log_window(window, time.perf_counter() - window_start, bar)
                window, window_start = [], time.perf_counter()
            progress.advance(self.step)
            if cfg.eval_every and self.step % cfg.eval_every == 0:
                last_valid = self._validate_and_save()
            elif cfg.save_every and self.step % cfg.save_every == 0:
                self.save()
        if window:  # the steps since the last line, however the loop stopped
            self._log_window(window, time.perf_counter() - window_start, bar)
        progress.close()
        minutes = (time.perf_counter() - started) / 60
        if last_valid is None or self._validated_at != self.step:
            last_valid = self._validate_and_save()
        assert self._last_saved is not None
        result = TrainResult(
            self.run_dir, self.step, self.epoch, minutes, self._last_saved, last_valid
        )
        self._finish(result)
        return dist.broadcast_object(result)  # rank 0's, with the averaged/test scores

    def _log_setup(self) -> None:
        cfg, tok, train = self.cfg, self.data.tokenizer, self.data.train
        n_params = count_parameters(self.model)
        log(
            f"model: {n_params / 1e6:.1f}M parameters, vocab {tok.vocab_size}, device "
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
            f"batches: {len(self.sampler)} per epoch of {len(train)} pairs at max_tokens "
            f"{cfg.max_tokens} (x{cfg.accum_steps} accumulation); padding "
            f"{100 * self.sampler.padding_fraction(self.epoch):.1f}%"
        )

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
            "ppl": math.exp(min(nll, 50)),
            "lr": window[-1].lr,
            "tgt_tokens_per_s": rate,
            "padding": sum(o.padding for o in window) / len(window),
        }
        self._record(entry)
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{window[-1].lr:.2e}", tok_s=f"{rate:.0f}")

    def _finish(self, result: TrainResult) -> None:
        """Average the last checkpoints (§6.1) and score the test set, on rank 0."""
        cfg = self.cfg
        wanted = cfg.average_last > 1 or bool(self.data.test_pairs)
        model = self._full_model() if wanted else self.model  # collective under FSDP
        if not self.dist.is_main:
            return
        if cfg.average_last > 1 and len(list_checkpoints(self.run_dir)) > 1:
            paths = list_checkpoints(self.run_dir)[-cfg.average_last :]
            result.averaged_checkpoint = average_checkpoints(
                paths, self.run_dir / "checkpoints" / "averaged"
            )
            model = load_checkpoint(result.averaged_checkpoint, map_location=self.device).model
            result.averaged_valid = self.evaluate(model=model)
            self._record(
                {
                    "kind": "valid_averaged",
                    "step": self.step,
                    "checkpoints": len(paths),
                    **result.averaged_valid,
                }
            )
            log(
                f"averaged last {len(paths)} checkpoints -> "
                f"BLEU {result.averaged_valid['bleu']:.2f}"
                f" (last checkpoint: {result.valid['bleu']:.2f})"
            )
        if self.data.test_pairs:
            result.test_bleu = self.score_test_set(model)

    def score_test_set(self, model: Transformer | None = None) -> float:
        """Greedy-translate the test set with ``model`` (default: self.model); write and score."""
        model = self.model if model is None else model
        sources = [s for s, _ in self.data.test_pairs]
        references = [t for _, t in self.data.test_pairs]
        hyps = translate_texts(model, self.data.tokenizer, sources)
        (self.run_dir / "test.hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        bleu, chrf = corpus_bleu(hyps, references), corpus_chrf(hyps, references)
        self._record(
            {
                "kind": "test",
                "step": self.step,
                "bleu": bleu.score,
                "chrf": chrf.score,
                "signature": bleu.signature,
            }
        )
        log(f"test: {bleu}\ntest: {chrf}")
        return bleu.score


def train(run: RunConfig, *, resume: bool = False) -> TrainResult:
    """Train the model ``run`` describes (under torchrun: this process's part); see
    :class:`Trainer`. Every rank returns rank 0's result."""
    trainer = Trainer(run, resume=resume)
    result = trainer.fit()
    if trainer.dist.distributed:
        del trainer  # DDP/FSDP hold the process group: free them before leaving it
        gc.collect()
        dist.cleanup()
    return result


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
