"""``aiayn params``: parameter count of a preset, with a per-component breakdown."""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.config import PRESETS, TransformerConfig, preset
from aiayn.models import (
    GPT2,
    GPT2_PRESETS,
    T5,
    T5_PRESETS,
    Transformer,
    count_parameters,
    expected_gpt2_parameters,
    expected_parameter_count,
    expected_t5_parameters,
    gpt2_preset,
    parameter_breakdown,
    t5_preset,
)
from aiayn.models.bert import BERT, BERT_PRESETS, bert_preset, expected_bert_parameters
from aiayn.models.vit import VIT_PRESETS, ViT, expected_vit_parameters
from aiayn.validation import flag

# Table 3 of the paper (37k BPE), and Hugging Face's counts of the published GPT-2 checkpoints
# (50,257 tokens): (count, vocabulary size it holds for, source)
PUBLISHED_COUNTS = {
    "base": (65_000_000, 37000, "paper (Table 3)"),
    "big": (213_000_000, 37000, "paper (Table 3)"),
    "gpt2": (124_439_808, 50257, "published GPT-2"),
    "gpt2-medium": (354_823_168, 50257, "published GPT-2"),
    "gpt2-large": (774_030_080, 50257, "published GPT-2"),
    "gpt2-xl": (1_557_611_200, 50257, "published GPT-2"),
    "t5-small": (60_506_624, 32128, "published T5"),
    "t5-base": (222_903_552, 32128, "published T5"),
    "flan-t5-small": (76_961_152, 32128, "published FLAN-T5"),
    "flan-t5-base": (247_577_856, 32128, "published FLAN-T5"),
    "bert-base-uncased": (109_482_240, 30522, "published BERT (BertModel)"),
    "bert-large-uncased": (335_141_888, 30522, "published BERT (BertModel)"),
    "vit-base-patch16-224": (86_389_248, 0, "published ViT (ViTModel)"),
}


def register(subparsers: Any) -> None:
    """Add the ``params`` sub-command."""
    p = subparsers.add_parser(
        "params",
        help="print a preset's parameter count with a per-component breakdown",
        description="Parameter count of a model preset (Table 3, or the published sizes of "
        "GPT-2, T5, BERT and ViT), component by component.",
    )
    p.add_argument(
        "--preset",
        default="base",
        choices=[*PRESETS, *GPT2_PRESETS, *T5_PRESETS, *BERT_PRESETS, *VIT_PRESETS],
        help="model preset",
    )
    p.add_argument(
        "--vocab-size",
        type=flag(TransformerConfig, "vocab_size"),
        help="vocabulary size (default: the paper's WMT EN-DE BPE, 37000; a GPT-2 preset's own)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the model on the meta device (no memory) and print its counts."""
    import torch

    model, expected, vocab, line = _build(args.preset, args.vocab_size, torch.device("meta"))
    total = count_parameters(model)
    print(line)
    for name, count in parameter_breakdown(model).items():
        print(f"  {name:<26} {count:>13,}  {100 * count / total:5.1f}%")
    print(f"  {'total':<26} {total:>13,}  ({total / 1e6:.1f}M)")
    assert total == expected, "closed-form count disagrees with the model"
    published, published_vocab, source = PUBLISHED_COUNTS.get(args.preset, (0, 0, ""))
    if vocab == published_vocab:
        diff = 100 * (total - published) / published
        print(f"  {source:<26} {published / 1e6:.0f}M; difference {diff:+.1f}%")
    return 0


def _build(name: str, vocab: int | None, device: Any) -> tuple[Any, int, int, str]:
    """(model on ``device``, its closed-form count, its vocabulary size, a description)."""
    if name in T5_PRESETS or name in BERT_PRESETS or name in VIT_PRESETS:
        return _build_descendant(name, vocab, device)
    if name in GPT2_PRESETS:
        g = gpt2_preset(name) if vocab is None else _gpt2_with_vocab(name, vocab)
        with device:
            gpt2 = GPT2(g)
        line = (
            f"preset {name}: GPT-2, N={g.num_layers} d_model={g.d_model} d_ff={g.inner_size} "
            f"h={g.num_heads} context={g.max_len} vocab={g.vocab_size} tied={g.tie_output}"
        )
        return gpt2, expected_gpt2_parameters(g), g.vocab_size, line
    c = preset(name, vocab_size=37000 if vocab is None else vocab)
    with device:
        paper = Transformer(c)
    line = (
        f"preset {name}: N={c.num_encoder_layers}+{c.num_decoder_layers} "
        f"d_model={c.d_model} d_ff={c.d_ff} h={c.num_heads} d_k={c.d_k} "
        f"vocab={c.vocab_size} shared={c.share_embeddings} tied={c.tie_output}"
    )
    return paper, expected_parameter_count(c), c.vocab_size, line


def _gpt2_with_vocab(name: str, vocab: int) -> Any:
    """A GPT-2 preset with another vocabulary size; its special token (GPT-2's last id,
    <|endoftext|>) stays the last id."""
    last = max(vocab - 1, 0)
    base = GPT2_PRESETS[name]
    ids = {k: min(getattr(base, k), last) for k in ("bos_id", "eos_id", "pad_id")}
    return gpt2_preset(name, vocab_size=vocab, **ids)


def _build_descendant(name: str, vocab: int | None, device: Any) -> tuple[Any, int, int, str]:
    """:func:`_build` for the T5, BERT and ViT presets (a vocabulary size only for text)."""
    from aiayn.errors import UserError

    if name in VIT_PRESETS:
        if vocab is not None:
            raise UserError(f"--vocab-size does not apply to {name}: a ViT reads image patches")
        v = VIT_PRESETS[name]
        with device:
            vit = ViT(v)
        line = (
            f"preset {name}: ViT, N={v.num_layers} d_model={v.d_model} d_ff={v.d_ff} "
            f"h={v.num_heads} image={v.image_size} patch={v.patch_size} labels={v.num_labels}"
        )
        return vit, expected_vit_parameters(v), 0, line
    if name in T5_PRESETS:
        t = t5_preset(name) if vocab is None else t5_preset(name, vocab_size=vocab)
        with device:
            t5 = T5(t)
        line = (
            f"preset {name}: T5, N={t.num_encoder_layers}+{t.num_decoder_layers} "
            f"d_model={t.d_model} d_ff={t.d_ff} h={t.num_heads} d_kv={t.d_kv} "
            f"gated={t.gated} vocab={t.vocab_size} tied={t.tie_output}"
        )
        return t5, expected_t5_parameters(t), t.vocab_size, line
    b = bert_preset(name) if vocab is None else bert_preset(name, vocab_size=vocab)
    with device:
        bert = BERT(b)
    line = (
        f"preset {name}: BERT, N={b.num_layers} d_model={b.d_model} d_ff={b.d_ff} "
        f"h={b.num_heads} vocab={b.vocab_size} head={b.head} pooler={b.pooler}"
    )
    return bert, expected_bert_parameters(b), b.vocab_size, line
