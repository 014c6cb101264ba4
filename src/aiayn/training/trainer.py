"""The training loop of §5: token-budget batches, Adam with the warm-up schedule of eq. (3),
label smoothing, dropout, periodic validation (loss, perplexity, greedy BLEU), checkpoints that
resume exactly, and checkpoint averaging.

Shape legend:  B sentences in a micro-batch   S source length   T target length   V vocabulary
"""

from __future__ import annotations

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
from aiayn.decoding.translate import DecodeOptions, translate_ids, translate_texts
from aiayn.evaluation import corpus_bleu, corpus_chrf
from aiayn.models import Transformer, count_parameters
from aiayn.training.checkpoint import (
    average_checkpoints,
    list_checkpoints,
    load_checkpoint,
    load_optimizer,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from aiayn.training.config import RunConfig
from aiayn.training.loss import label_smoothed_nll
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
    """One optimizer step: loss/NLL sums stay tensors (no host sync until a log line)."""

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
    """Print a line of the trainer's report (kept apart so tests can silence it)."""
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
        from aiayn.errors import UserError

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
    """Runs one training job described by a :class:`RunConfig` (see :func:`train`)."""

    def __init__(self, run: RunConfig, *, resume: bool = False):
        self.run = run
        self.cfg = run.train
        self.run_dir = Path(run.run_dir)
        if not resume and list_checkpoints(self.run_dir):
            from aiayn.errors import UserError

            raise UserError(
                f"{self.run_dir} already holds checkpoints: pass --resume to continue that run, "
                "or choose another run_dir"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.threads is not None:
            torch.set_num_threads(self.cfg.threads)
        self.device = resolve_device(self.cfg.device)
        self.amp_dtype = autocast_dtype(self.cfg.precision, self.device)
        _seed_everything(self.cfg.seed)
        self.data = prepare_data(run, reuse_tokenizer=resume)
        tok = self.data.tokenizer
        self.model_config = run.model.replace(
            vocab_size=tok.vocab_size, pad_id=tok.pad_id, tgt_vocab_size=None
        )
        self.model = Transformer(self.model_config).to(self.device)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=0.0,
            betas=self.cfg.adam_betas,
            eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay,
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
        self.step, self.epoch, self.batch_index = 0, 0, 0
        self.best_bleu = -math.inf
        self._validated_at = -1
        self.history: list[dict[str, Any]] = []
        if resume:
            self._resume()

    # -- bookkeeping ---------------------------------------------------------------------------
    def _resume(self) -> None:
        checkpoints = list_checkpoints(self.run_dir)
        if not checkpoints:
            log(f"resume: no checkpoint in {self.run_dir}; starting from scratch")
            return
        ckpt = load_checkpoint(checkpoints[-1], map_location=self.device)
        if ckpt.config != self.model_config:
            from aiayn.errors import UserError

            raise UserError(f"{ckpt.path}: its model config differs from this run's config")
        self.model.load_state_dict(ckpt.model.state_dict())
        load_optimizer(ckpt.path, self.optimizer, ckpt.state)
        if "grad_scaler" in ckpt.state:
            self.scaler.load_state_dict(ckpt.state["grad_scaler"])
        s = ckpt.state
        self.step, self.epoch, self.batch_index = s["step"], s["epoch"], s["batch_index"]
        self.best_bleu = s.get("best_bleu", -math.inf)
        set_rng_state(s["rng"])
        log(
            f"resume: from {ckpt.path.name} at step {self.step}, epoch {self.epoch}, "
            f"batch {self.batch_index}"
        )

    def _state(self, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_index": self.batch_index,
            "best_bleu": self.best_bleu,
            "grad_scaler": self.scaler.state_dict(),
            "rng": rng_state(),
            "run_config": self.run.to_dict(),
            "tokenizer": str(self.data.tokenizer_file),
            "metrics": metrics or {},
        }

    def save(self, metrics: dict[str, Any] | None = None) -> Path:
        """Write ``checkpoints/step_XXXXXXXX`` and prune old ones."""
        path = self.run_dir / "checkpoints" / f"step_{self.step:08d}"
        save_checkpoint(
            path, self.model, self._state(metrics), self.data.tokenizer_file, self.optimizer
        )
        prune_checkpoints(self.run_dir, self.cfg.keep_last)
        return path

    def _record(self, entry: dict[str, Any]) -> None:
        self.history.append(entry)
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    # -- the step --------------------------------------------------------------------------------
    def _micro_batches(self) -> list[list[int]] | None:
        """The next ``accum_steps`` batches of the epoch order (None when the epoch is over)."""
        batches = self.sampler.batches(self.epoch)
        if self.batch_index >= len(batches):
            return None
        chunk = batches[self.batch_index : self.batch_index + self.cfg.accum_steps]
        self.batch_index += len(chunk)
        return chunk

    def accumulate_gradients(self, batches: list[Batch]) -> tuple[Tensor, Tensor, int]:
        """Backward over micro-batches, each loss divided by the target tokens of them all.

        So the gradient is that of the whole effective batch's mean loss, however it is split.
        Returns the (loss sum, NLL sum, target tokens) of the effective batch.
        """
        total_tokens = sum(b.num_tgt_tokens for b in batches)  # the whole effective batch
        eps = self.model_config.label_smoothing
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for batch in batches:
            with torch.autocast(
                self.device.type,
                dtype=self.amp_dtype or torch.float32,
                enabled=self.amp_dtype is not None,
            ):
                log_probs = self.model(batch.src, batch.tgt_in)  # (B, T, V)
            sums = label_smoothed_nll(log_probs, batch.tgt_out, eps, self.model_config.pad_id)
            self.scaler.scale(sums.loss / total_tokens).backward()
            loss_sum += sums.loss.detach()
            nll_sum += sums.nll
        return loss_sum, nll_sum, total_tokens

    def train_step(self, micro: list[list[int]]) -> StepStats:
        """One optimizer step over the micro-batches (gradient accumulation), eq. (3) lr."""
        self.model.train()
        batches = [self.data.train.collate(ids).to(self.device, non_blocking=True) for ids in micro]
        loss_sum, nll_sum, total_tokens = self.accumulate_gradients(batches)
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
        padded = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
        real = sum(b.num_src_tokens + b.num_tgt_tokens for b in batches)
        return StepStats(loss_sum, nll_sum, total_tokens, lr, 1 - real / padded)

    # -- evaluation ------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, *, bleu_sentences: int | None = None) -> dict[str, float]:
        """Validation loss, NLL, perplexity and greedy BLEU."""
        self.model.eval()
        valid = self.data.valid
        sampler = TokenBatchSampler(
            valid.src_lengths, valid.tgt_lengths, self.cfg.max_tokens, seed=0, shuffle=False
        )
        loss = nll = tokens = 0.0
        for ids in sampler.batches(0):
            batch = valid.collate(ids).to(self.device)
            sums = label_smoothed_nll(
                self.model(batch.src, batch.tgt_in),
                batch.tgt_out,
                self.model_config.label_smoothing,
                self.model_config.pad_id,
            )
            loss, nll, tokens = (
                loss + sums.loss.item(),
                nll + sums.nll.item(),
                tokens + batch.num_tgt_tokens,
            )
        n = self.run.data.bleu_sentences if bleu_sentences is None else bleu_sentences
        n = len(valid) if n == 0 else min(n, len(valid))
        greedy = DecodeOptions(beam_size=1, max_tokens=self.cfg.max_tokens)
        best = translate_ids(self.model, valid.src[:n], self.data.tokenizer, greedy)
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
        metrics = self.evaluate()
        self._validated_at = self.step
        self._record({"kind": "valid", "step": self.step, **metrics})
        path = self.save(metrics)
        if metrics["bleu"] > self.best_bleu:
            self.best_bleu = metrics["bleu"]
            save_checkpoint(
                self.run_dir / "checkpoints" / "best",
                self.model,
                self._state(metrics),
                self.data.tokenizer_file,
            )
        log(
            f"valid step {self.step}: loss {metrics['loss']:.3f} ppl {metrics['ppl']:.2f} "
            f"BLEU {metrics['bleu']:.2f} ({int(metrics['bleu_sentences'])} sentences) "
            f"-> {path.name}"
        )
        plot_curves(self.history, self.run_dir / "curves.png")
        return metrics

    # -- the loop --------------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Train until max_steps / max_epochs / max_minutes, then validate and save."""
        cfg = self.cfg
        tok, train = self.data.tokenizer, self.data.train
        n_params = count_parameters(self.model)
        log(
            f"model: {n_params / 1e6:.1f}M parameters, vocab {tok.vocab_size}, device "
            f"{self.device}, precision {self.amp_dtype or 'fp32'}, "
            f"threads {torch.get_num_threads()}"
        )
        log(
            f"batches: {len(self.sampler)} per epoch of {len(train)} pairs at max_tokens "
            f"{cfg.max_tokens} (x{cfg.accum_steps} accumulation); padding "
            f"{100 * self.sampler.padding_fraction(self.epoch):.1f}%"
        )
        bar = _progress(cfg.max_steps, self.step, enabled=cfg.progress)
        started = time.perf_counter()
        window_tokens, window_start = 0, time.perf_counter()
        window: list[StepStats] = []
        last_valid: dict[str, float] | None = None
        while self.step < cfg.max_steps:
            if cfg.max_minutes is not None and time.perf_counter() - started > 60 * cfg.max_minutes:
                log(f"stop: time budget of {cfg.max_minutes} minutes reached")
                break
            micro = self._micro_batches()
            if micro is None:
                self.epoch, self.batch_index = self.epoch + 1, 0
                if cfg.max_epochs is not None and self.epoch >= cfg.max_epochs:
                    log(f"stop: {cfg.max_epochs} epochs done")
                    break
                continue
            out = self.train_step(micro)
            window.append(out)
            window_tokens += out.tokens
            if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                tokens = sum(o.tokens for o in window)
                loss = float(sum(o.loss_sum for o in window)) / tokens  # one sync per log line
                nll = float(sum(o.nll_sum for o in window)) / tokens
                rate = window_tokens / (time.perf_counter() - window_start)
                entry = {
                    "kind": "train",
                    "step": self.step,
                    "epoch": self.epoch,
                    "loss": loss,
                    "nll": nll,
                    "ppl": math.exp(min(nll, 50)),
                    "lr": out.lr,
                    "tgt_tokens_per_s": rate,
                    "padding": sum(o.padding for o in window) / len(window),
                }
                self._record(entry)
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{out.lr:.2e}", tok_s=f"{rate:.0f}")
                window, window_tokens, window_start = [], 0, time.perf_counter()
            bar.update(1)
            if cfg.eval_every and self.step % cfg.eval_every == 0:
                last_valid = self._validate_and_save()
            elif cfg.save_every and self.step % cfg.save_every == 0:
                self.save()
        bar.close()
        minutes = (time.perf_counter() - started) / 60
        if last_valid is None or self._validated_at != self.step:
            last_valid = self._validate_and_save()
        result = TrainResult(
            self.run_dir,
            self.step,
            self.epoch,
            minutes,
            list_checkpoints(self.run_dir)[-1],
            last_valid,
        )
        if cfg.average_last > 1 and len(list_checkpoints(self.run_dir)) > 1:
            paths = list_checkpoints(self.run_dir)[-cfg.average_last :]
            result.averaged_checkpoint = average_checkpoints(
                paths, self.run_dir / "checkpoints" / "averaged"
            )
            averaged_model = self.model
            averaged_model.load_state_dict(
                load_checkpoint(
                    result.averaged_checkpoint, map_location=self.device
                ).model.state_dict()
            )
            result.averaged_valid = self.evaluate()
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
                f" (last checkpoint: {last_valid['bleu']:.2f})"
            )
        if self.data.test_pairs:
            result.test_bleu = self.score_test_set()
        plot_curves(self.history, self.run_dir / "curves.png")
        return result

    def score_test_set(self) -> float:
        """Greedy-translate the test set with the current weights; write and score it."""
        sources = [s for s, _ in self.data.test_pairs]
        references = [t for _, t in self.data.test_pairs]
        hyps = translate_texts(self.model, self.data.tokenizer, sources)
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
    """Train the model ``run`` describes; see :class:`Trainer`."""
    return Trainer(run, resume=resume).fit()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _progress(total: int, initial: int, *, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        disable=not enabled,
        unit="step",
        dynamic_ncols=True,
        mininterval=1.0,
    )
