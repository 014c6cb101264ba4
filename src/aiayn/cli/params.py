"""``aiayn params``: parameter count of a preset, with a per-component breakdown."""

from __future__ import annotations

import argparse
from typing import Any

from aiayn.config import PRESETS, preset
from aiayn.models import (
    GPT2,
    GPT2_PRESETS,
    Transformer,
    count_parameters,
    expected_gpt2_parameters,
    expected_parameter_count,
    gpt2_preset,
    parameter_breakdown,
)

# Table 3 of the paper (37k BPE), and Hugging Face's counts of the published GPT-2 checkpoints
# (50,257 tokens): (count, vocabulary size it holds for, source)
PUBLISHED_COUNTS = {
    "base": (65_000_000, 37000, "paper (Table 3)"),
    "big": (213_000_000, 37000, "paper (Table 3)"),
    "gpt2": (124_439_808, 50257, "published GPT-2"),
    "gpt2-medium": (354_823_168, 50257, "published GPT-2"),
    "gpt2-large": (774_030_080, 50257, "published GPT-2"),
    "gpt2-xl": (1_557_611_200, 50257, "published GPT-2"),
}


def register(subparsers: Any) -> None:
    """Add the ``params`` sub-command."""
    p = subparsers.add_parser(
        "params",
        help="print a preset's parameter count with a per-component breakdown",
        description="Parameter count of a model preset (Table 3, or GPT-2's published sizes), "
        "component by component.",
    )
    p.add_argument(
        "--preset", default="base", choices=[*PRESETS, *GPT2_PRESETS], help="model preset"
    )
    p.add_argument(
        "--vocab-size",
        type=int,
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
