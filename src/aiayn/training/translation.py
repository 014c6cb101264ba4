"""The translation task of §5: sentence pairs and a joint BPE, the encoder–decoder Transformer,
label-smoothed teacher forcing, and validation by loss, perplexity and greedy BLEU (the best
checkpoint has the highest BLEU); at the end, the test set's BLEU and chrF.

With ``model.init_from`` the run fine-tunes a checkpoint instead: one aiayn trained, or a
converted Marian (OPUS-MT) or T5 model, with that checkpoint's own tokenizer and, for T5, a task
prefix before every source sentence (``data.source_prefix``); see
:mod:`aiayn.training.translation_start`.

Shape legend:  B sentences in a batch   S source length   T target length
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.data import (
    Batch,
    FilterReport,
    ParallelDataset,
    TokenBatchSampler,
    demo_corpus_path,
    filter_pairs,
    read_parallel,
)
from aiayn.data.batching import batches_padding_fraction
from aiayn.data.hf_datasets import HFCorpus, hf_pairs, read_eval_source
from aiayn.data.pretrained_tokenizer import MarianTokenizer, T5Tokenizer, TranslationTokenizer
from aiayn.decoding.translate import (
    DecodeOptions,
    options_for_checkpoint,
    translate_ids,
    translate_texts,
    with_prefix,
)
from aiayn.errors import UserError
from aiayn.evaluation import corpus_bleu, corpus_chrf
from aiayn.evaluation.perplexity import EvalTally
from aiayn.models.transformer import EncoderDecoder
from aiayn.training.config import DataConfig, RunConfig
from aiayn.training.objective import TranslationObjective
from aiayn.training.task import (
    Criterion,
    FinalOutputs,
    Log,
    TaskData,
    data_as,
    print_main,
    refuse_options,
)
from aiayn.training.translation_start import (
    StartingModel,
    carried_state,
    run_tokenizer,
    start_config,
)

DEMO_SENTENCES = (
    "I love you.",
    "Where is the train station?",
    "Tom doesn't like cheese.",
    "We have to go home now.",
    "The weather is nice today.",
    "Can you help me, please?",
)
"""What ``aiayn train`` translates after training on the built-in demo corpus."""


@dataclass
class PreparedData:
    """Tokenizer, encoded splits and the raw validation/test text for BLEU.

    Attributes:
        tokenizer: codes both sides (aiayn's joint BPE, or a converted model's).
        tokenizer_file: what checkpoints save of it: the BPE's ``tokenizer.json``, or the
            pretrained tokenizer itself (which saves its files).
        train, valid: the encoded splits (sources after the run's ``data.source_prefix``).
        valid_pairs, test_pairs: the raw pairs (without the prefix), for BLEU.
    """

    tokenizer: TranslationTokenizer
    tokenizer_file: Path | T5Tokenizer | MarianTokenizer
    train: ParallelDataset
    valid: ParallelDataset
    valid_pairs: list[tuple[str, str]]
    test_pairs: list[tuple[str, str]] = field(default_factory=list)


def prepare_data(run: RunConfig, *, reuse_tokenizer: bool, log: Log = print_main) -> PreparedData:
    """Read, clean, split and tokenise the corpus; train (or reload) the joint BPE (§5.1), or
    take the ``init_from`` checkpoint's tokenizer."""
    d = run.data
    assert isinstance(d, DataConfig)
    train_pairs, valid_pairs = _read_pairs(d, run.train.seed, log)
    test = _eval_pairs(d, d.test, d.test_src, d.test_tgt)
    test_pairs = test[0] if test is not None else []

    tokenizer, saved = run_tokenizer(
        run,
        Path(run.run_dir),
        lambda: [s for s, _ in train_pairs] + [t for _, t in train_pairs],
        reuse=reuse_tokenizer,
        log=log,
    )
    limit = d.max_tokens_per_sentence
    train = ParallelDataset.from_pairs(
        _prefixed(d, train_pairs), tokenizer, max_tokens_per_sentence=limit
    )
    valid = ParallelDataset.from_pairs(_prefixed(d, valid_pairs), tokenizer)
    if train.num_dropped_too_long:
        log(f"data: dropped {train.num_dropped_too_long} training pairs over {limit} subwords")
    if len(train) == 0:
        raise UserError("no training pairs left after cleaning; check the data files")
    return PreparedData(tokenizer, saved, train, valid, valid_pairs, test_pairs)


def _prefixed(d: DataConfig, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``pairs`` with ``data.source_prefix`` before each source sentence (none: as they are)."""
    if not d.source_prefix:
        return pairs
    return [(with_prefix(d.source_prefix, s), t) for s, t in pairs]


def _read_pairs(
    d: DataConfig, seed: int, log: Log
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The cleaned training pairs and the validation pairs (a file, a sacreBLEU test set, a split
    of the Hugging Face corpus, or a seeded held-out slice)."""
    train_pairs: Iterable[tuple[str, str]]
    if d.hf_dataset is not None:
        train_pairs = hf_pairs(_hf_corpus(d), d.hf_split)
        config = f" ({d.hf_config})" if d.hf_config else ""
        log(f"data: {d.hf_dataset}{config} [{d.hf_split}], {d.src_lang} -> {d.tgt_lang}")
    elif d.train_src is None:
        train_pairs = read_parallel(demo_corpus_path())
        log(
            f"data: built-in demo corpus {demo_corpus_path().name} "
            "(Tatoeba EN-DE, CC BY 2.0: www.manythings.org/anki and tatoeba.org)"
        )
    else:
        train_pairs = read_parallel(d.train_src, d.train_tgt)
    if d.lowercase:
        train_pairs = ((s.lower(), t.lower()) for s, t in train_pairs)
    kept, report = filter_pairs(train_pairs, max_words=d.max_words, max_ratio=d.max_ratio)
    log(f"data: train {report}")
    valid = _eval_pairs(d, d.valid, d.valid_src, d.valid_tgt)
    if valid is not None:
        log(f"data: valid {valid[1]}")
        return kept, valid[0]
    # hold out a seeded random slice
    order = np.random.default_rng(seed).permutation(len(kept))
    held = set(order[: d.valid_size].tolist())
    valid_pairs = [kept[i] for i in sorted(held)]
    kept = [p for i, p in enumerate(kept) if i not in held]
    log(f"data: held out {len(valid_pairs)} training pairs for validation")
    return kept, valid_pairs


def _hf_corpus(d: DataConfig) -> HFCorpus:
    """The run's Hugging Face corpus (the config checked that it has both languages)."""
    assert d.hf_dataset is not None and d.src_lang is not None and d.tgt_lang is not None
    return HFCorpus(d.hf_dataset, d.hf_config, d.src_lang, d.tgt_lang)


def _eval_pairs(
    d: DataConfig, source: str | None, src_file: str | None, tgt_file: str | None
) -> tuple[list[tuple[str, str]], FilterReport] | None:
    """Validation or test pairs, whitespace-normalised (none dropped for length): from
    ``source`` (``sacrebleu:NAME`` or ``split:NAME``), else from files; None = neither given."""
    if source is not None:
        assert d.src_lang is not None and d.tgt_lang is not None
        corpus = _hf_corpus(d) if d.hf_dataset is not None else None
        pairs = read_eval_source(source, corpus, d.src_lang, d.tgt_lang)
    elif src_file is not None:
        pairs = read_parallel(src_file, tgt_file)
    else:
        return None
    return filter_pairs(pairs, max_words=10**6, max_ratio=1e9)


TRANSLATION_LABEL_SMOOTHING = 0.1
"""ε_ls of §5.4, the translation task's default ``train.label_smoothing``."""


class TranslationTask:
    """Translation with an encoder–decoder (see :mod:`aiayn.training.task`): the paper's,
    trained from scratch or fine-tuned, or a converted Marian or T5 model, fine-tuned.

    Args:
        run: the run config (an encoder–decoder family, a :class:`DataConfig` data section).
        log: prints the data reports and the test scores.
    """

    criterion = Criterion(
        "bleu", "BLEU", higher_is_better=True, plot_title="validation BLEU (greedy)"
    )

    def __init__(self, run: RunConfig, log: Log = print_main):
        assert isinstance(run.data, DataConfig)
        self.run, self.model_cfg, self.data_cfg, self.log = run, run.model, run.data, log
        smoothing = run.train.label_smoothing
        self.label_smoothing = TRANSLATION_LABEL_SMOOTHING if smoothing is None else smoothing
        self._new_model = StartingModel(run, log)
        self._carried = carried_state(run)

    def prepare_data(self, run_dir: Path, *, reuse_tokenizer: bool) -> PreparedData:
        """See :func:`prepare_data` (``run_dir`` is the run config's)."""
        return prepare_data(self.run, reuse_tokenizer=reuse_tokenizer, log=self.log)

    def model_config(self, data: TaskData) -> ModelConfig:
        """The run's model with the joint vocabulary's size and padding id; with
        ``init_from``, the checkpoint's (checked against its tokenizer)."""
        tok = data_as(data, PreparedData).tokenizer
        if self.run.init_from is not None:
            return start_config(self.run, tok)
        return self.model_cfg.replace(
            vocab_size=tok.vocab_size, pad_id=tok.pad_id, tgt_vocab_size=None
        )

    def new_model(self, config: ModelConfig) -> EncoderDecoder:
        """A freshly initialised model of the run's family, or one holding the ``init_from``
        checkpoint's weights."""
        model = self._new_model(config)
        assert isinstance(model, EncoderDecoder)
        return model

    def objective(self, model: nn.Module) -> TranslationObjective:
        """Teacher forcing + the fused label-smoothed loss."""
        assert isinstance(model, EncoderDecoder)
        return TranslationObjective(model, self.label_smoothing)

    def checkpoint_state(self) -> dict[str, Any]:
        """What a converted ``init_from`` checkpoint recorded about its model (its Hugging Face
        config and generation settings), for every checkpoint of the run."""
        return dict(self._carried)

    def sampler(self, data: TaskData, max_tokens: int, seed: int) -> TokenBatchSampler:
        """Length-bucketed token-budget batches (§5.1)."""
        train = data_as(data, PreparedData).train
        return TokenBatchSampler(train.src_lengths, train.tgt_lengths, max_tokens, seed=seed)

    def step_inputs(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor, int]:
        """(src, tgt_in, tgt_out, non-pad target count) for :class:`TranslationObjective`."""
        return batch.src, batch.tgt_in, batch.tgt_out, batch.num_tgt_tokens

    def padding(self, batches: Sequence[Batch]) -> float:
        """Padding over the batches' source and target tensors."""
        return batches_padding_fraction(batches)

    def describe(self, data: TaskData) -> str:
        """The training pairs."""
        return f"{len(data_as(data, PreparedData).train)} pairs"

    def evaluate(
        self,
        model: nn.Module,
        data: TaskData,
        *,
        max_tokens: int,
        bleu_sentences: int | None = None,
        **options: Any,
    ) -> dict[str, float]:
        """Validation loss, NLL, perplexity and greedy BLEU on ``bleu_sentences`` sentences
        (default: ``data.bleu_sentences``; 0 = all)."""
        refuse_options(options)
        assert isinstance(model, EncoderDecoder)
        prepared = data_as(data, PreparedData)
        tally, tokens = self._valid_loss(model, prepared, max_tokens)
        valid = prepared.valid
        n = self.data_cfg.bleu_sentences if bleu_sentences is None else bleu_sentences
        n = len(valid) if n == 0 else min(n, len(valid))
        best = translate_ids(model, valid.src[:n], prepared.tokenizer, self.greedy(max_tokens))
        hyps = prepared.tokenizer.decode_batch([h[0].tokens for h in best])
        refs = [prepared.valid_pairs[int(i)][1] for i in valid.source_indices[:n]]
        bleu = corpus_bleu(hyps, refs).score
        return tally.metrics(tokens, "tokens") | {"bleu": bleu, "bleu_sentences": n}

    def _valid_loss(
        self, model: EncoderDecoder, data: PreparedData, max_tokens: int
    ) -> tuple[EvalTally, int]:
        """(Σ loss and Σ NLL, target tokens) over the validation pairs."""
        objective = TranslationObjective(model, self.label_smoothing)
        valid, device = data.valid, model.output_proj.weight.device
        sampler = TokenBatchSampler(
            valid.src_lengths, valid.tgt_lengths, max_tokens, seed=0, shuffle=False
        )
        tally, tokens = EvalTally(), 0
        for ids in sampler.batches(0):
            batch = valid.collate(ids).to(device)
            tally.add(objective(batch.src, batch.tgt_in, batch.tgt_out, batch.num_tgt_tokens))
            tokens += batch.num_tgt_tokens
        return tally, tokens

    def greedy(self, max_tokens: int) -> DecodeOptions:
        """Greedy decoding for validation and test, as ``aiayn translate --beam 1`` decodes the
        run's checkpoints: with a converted ``init_from`` checkpoint's generation settings (its
        length cap, banned ids, forced EOS), else the paper's rules."""
        generation = self._carried.get("generation")
        return options_for_checkpoint(generation, beam_size=1, max_tokens=max_tokens)

    def metrics_line(self, metrics: dict[str, float]) -> str:
        """Loss, perplexity and BLEU."""
        return (
            f"loss {metrics['loss']:.3f} ppl {metrics['ppl']:.2f} "
            f"BLEU {metrics['bleu']:.2f} ({int(metrics['bleu_sentences'])} sentences)"
        )

    def finish(self, model: nn.Module, data: TaskData, run_dir: Path) -> FinalOutputs:
        """Greedy-translate the test set (if any) with ``model``; write and score it."""
        prepared = data_as(data, PreparedData)
        if not prepared.test_pairs:
            return FinalOutputs()
        assert isinstance(model, EncoderDecoder)
        sources = [s for s, _ in prepared.test_pairs]
        references = [t for _, t in prepared.test_pairs]
        greedy = self.greedy(DecodeOptions.max_tokens)  # the default batch of translate_texts
        prefix = self.data_cfg.source_prefix
        hyps = translate_texts(model, prepared.tokenizer, sources, greedy, prefix=prefix)
        (run_dir / "test.hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        bleu, chrf = corpus_bleu(hyps, references), corpus_chrf(hyps, references)
        self.log(f"test: {bleu}\ntest: {chrf}")
        return FinalOutputs(
            test={"bleu": bleu.score, "chrf": chrf.score, "signature": bleu.signature}
        )

    def report(self, result: Any) -> None:
        """Validation BLEU and perplexity; after the built-in demo, a few translations."""
        print(
            f"validation: BLEU {result.valid['bleu']:.2f}, perplexity {result.valid['ppl']:.2f} "
            f"({result.final_checkpoint.name})"
        )
        best = result.averaged_valid or result.valid
        if result.averaged_valid is not None and result.averaged_checkpoint is not None:
            print(
                f"averaged checkpoint: BLEU {result.averaged_valid['bleu']:.2f} "
                f"({result.averaged_checkpoint})"
            )
        if self.data_cfg.train_src is None and self.data_cfg.hf_dataset is None:  # the demo
            self._demo_translations(result.averaged_checkpoint or result.final_checkpoint)
            print(
                f"\nBLEU on {int(best['bleu_sentences'])} held-out pairs: {best['bleu']:.2f} "
                "(sacreBLEU, detokenized, cased)"
            )

    def _demo_translations(self, checkpoint: Path) -> None:
        from aiayn.checkpoint import load_checkpoint, load_translation_tokenizer

        ckpt = load_checkpoint(checkpoint)
        tokenizer = load_translation_tokenizer(ckpt.path)
        print("\ndemo translations (English -> German, greedy):")
        prefix = self.data_cfg.source_prefix
        hyps = translate_texts(ckpt.model, tokenizer, DEMO_SENTENCES, prefix=prefix)
        for src, hyp in zip(DEMO_SENTENCES, hyps, strict=True):
            print(f"  {src:<32} -> {hyp}")


# The built-in demo (`aiayn train`): a small pre-norm model on the shipped Tatoeba EN→DE subset
# for a few minutes; pre-norm because it tolerates the high peak learning rate that a few hundred
# steps need (the comparison with post-norm, and the time it takes: docs/benchmarks.md). Keep
# configs/demo.yaml identical (a test checks).
DEMO_CONFIG: dict[str, Any] = {
    "run_dir": "runs/demo",
    "model": {
        "preset": "small",
        "d_model": 256,
        "d_ff": 1024,
        "num_heads": 4,
        "num_encoder_layers": 3,
        "num_decoder_layers": 3,
        "dropout": 0.1,
        "norm_first": True,
    },
    "data": {"vocab_size": 4000, "valid_size": 500, "bleu_sentences": 200},
    "train": {
        "max_tokens": 1500,
        "warmup_steps": 400,
        "lr_scale": 1.0,
        "max_minutes": 7.0,
        "eval_every": 500,
        "save_every": 250,
        "log_every": 50,
        "keep_last": 3,
        "average_last": 3,
    },
}
