"""Attention maps of a trained model for one sentence pair (``aiayn attention``).

:func:`collect_attention` runs the model once, teacher-forced, on a source sentence and a target
sentence (by default the model's own greedy translation) and keeps the attention weights the
model *returns* (``Transformer.encode`` / ``Transformer.decode`` with ``need_weights=True``;
nothing is stashed on the modules). Three kinds of attention (§3.2.3):

- ``encoder_self``: encoder self-attention, queries and keys = the source tokens;
- ``decoder_self``: masked decoder self-attention, queries and keys = the decoder inputs (BOS,
  then the target tokens: the outputs "shifted right", §3.1); the causal mask of §3.2.3 leaves
  every weight above the diagonal exactly zero;
- ``cross``: encoder–decoder attention, queries = the decoder inputs, keys = the source tokens.

Row ``i`` of a map is the query at position ``i`` and sums to 1 (a softmax, eq. 1). In the
decoder, the query at input token ``y_i`` is the one that predicts ``y_{i+1}``.

:func:`write_attention_pngs` draws one heatmap per (kind, layer, head) with matplotlib (Agg,
no display), named like ``encoder_self_L1_H2.png`` (layers and heads count from 1), plus one
overview per kind (``encoder_self_all.png``: every layer × head).

A sentence must fit the model (with learned positions at most ``max_len`` tokens with its EOS
or BOS; what is drawn is what the model saw, never a truncation of it) and, when given,
``max_tokens`` a side: beyond a few
hundred tokens labelled maps are unreadable and take minutes and gigabytes to draw (a map's
figure grows with the square of its tokens; ``aiayn attention --max-tokens``).

Token labels are the subword tokens decoded one by one; a leading space (the start of a word) is
shown as ``▁``, special tokens by name (``<s>``, ``</s>``).

Shape legend:
    B  batch size (1 here)     H  heads          N  layers
    S  source length (with EOS) T  decoder input length (BOS + target tokens)
    R, C  rows (queries) and columns (keys) of one map
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from aiayn.data.tokenizer import SPECIAL_TOKENS, Tokenizer
from aiayn.decoding.translate import DecodeOptions, translate_ids
from aiayn.errors import UserError
from aiayn.models import Transformer

__all__ = [
    "KINDS",
    "KIND_TITLES",
    "AttentionMaps",
    "attention_filename",
    "check_length",
    "collect_attention",
    "draw_heatmap",
    "greedy_translation",
    "token_label",
    "write_attention_pngs",
]

KINDS: tuple[str, ...] = ("encoder_self", "decoder_self", "cross")
"""The three uses of attention (§3.2.3), as named in file names and the HTML page."""

KIND_TITLES: dict[str, str] = {
    "encoder_self": "encoder self-attention",
    "decoder_self": "decoder masked self-attention",
    "cross": "encoder–decoder attention",
}
"""Human-readable names of :data:`KINDS`."""

_AXIS_NAMES: dict[str, tuple[str, str]] = {
    "encoder_self": ("query: source token", "key: source token"),
    "decoder_self": ("query: decoder input", "key: decoder input"),
    "cross": ("query: decoder input", "key: source token"),
}


@dataclass(frozen=True, eq=False)
class AttentionMaps:
    """The attention weights of every layer and head for one sentence pair.

    Attributes:
        source: the source sentence (whitespace-normalised).
        target: the target sentence (given, or the model's translation).
        target_from_model: True when ``target`` is the model's own greedy translation.
        source_labels: S token labels of the encoder input (ending with ``</s>``).
        target_labels: T token labels of the decoder input (starting with ``<s>``).
        encoder_self: per layer, (H, S, S) encoder self-attention weights.
        decoder_self: per layer, (H, T, T) masked decoder self-attention weights.
        cross: per layer, (H, T, S) encoder–decoder attention weights.
    """

    source: str
    target: str
    target_from_model: bool
    source_labels: list[str]
    target_labels: list[str]
    encoder_self: list[Tensor]
    decoder_self: list[Tensor]
    cross: list[Tensor]

    def maps(self, kind: str) -> list[Tensor]:
        """The per-layer (H, R, C) weights of ``kind`` (one of :data:`KINDS`)."""
        if kind not in KINDS:
            raise ValueError(f"unknown attention kind {kind!r} (choose from {', '.join(KINDS)})")
        maps: list[Tensor] = getattr(self, kind)
        return maps

    def labels(self, kind: str) -> tuple[list[str], list[str]]:
        """(row labels, column labels) of the maps of ``kind``: queries, then keys."""
        if kind == "encoder_self":
            return self.source_labels, self.source_labels
        if kind == "decoder_self":
            return self.target_labels, self.target_labels
        self.maps(kind)  # validates the name
        return self.target_labels, self.source_labels

    @property
    def num_heads(self) -> int:
        """H, the number of heads (the same in every layer)."""
        return int(self.encoder_self[0].shape[0])


def token_label(tokenizer: Tokenizer, token_id: int) -> str:
    """A readable label for one subword id: specials by name, a word-initial space as ``▁``."""
    if 0 <= token_id < len(SPECIAL_TOKENS):
        return SPECIAL_TOKENS[token_id]
    text = tokenizer.decode([token_id])
    if not text or "\ufffd" in text:  # part of a multi-byte character: show the raw symbol
        return tokenizer.id_to_token(token_id) or f"#{token_id}"
    return "▁" + text[1:] if text.startswith(" ") else text


def _encode_sentence(tokenizer: Tokenizer, text: str, what: str) -> list[int]:
    from aiayn.data import normalize

    clean = normalize(text)
    if not clean:
        raise UserError(f"{what} is empty: give a sentence")
    return tokenizer.encode(clean)


@torch.no_grad()
def greedy_translation(
    model: Transformer, tokenizer: Tokenizer, src_ids: Sequence[int], *, extra_len: int = 50
) -> list[int]:
    """The model's greedy translation of one encoded sentence (ids without BOS/EOS), at most
    ``len(src_ids) + extra_len`` tokens (§6.1), with the shared KV-cached decoder; of the whole
    sentence, which the maps show (translating files truncates at the model's ``max_len``)."""
    options = DecodeOptions(beam_size=1, extra_len=extra_len, max_src_tokens=max(1, len(src_ids)))
    return translate_ids(model, [list(src_ids)], tokenizer, options)[0][0].tokens


def check_length(what: str, tokens: int, model_limit: int | None, max_tokens: int | None) -> None:
    """Refuse ``tokens`` (of ``what``: "the source sentence") beyond the model's learned
    positions ``model_limit`` or the drawing limit ``max_tokens`` (None: no such limit)."""
    if model_limit is not None and tokens > model_limit:
        raise UserError(f"{what} has {tokens} tokens; this model's limit is {model_limit}")
    if max_tokens is not None and tokens > max_tokens:
        raise UserError(
            f"{what} has {tokens} tokens, more than --max-tokens {max_tokens}: maps that size are "
            "unreadable and take minutes and gigabytes to draw; shorten it or raise --max-tokens"
        )


@torch.no_grad()
def collect_attention(
    model: Transformer,
    tokenizer: Tokenizer,
    source: str,
    target: str | None = None,
    *,
    max_tokens: int | None = None,
) -> AttentionMaps:
    """Run ``model`` once on (source, target) and return the attention of every layer and head.

    Args:
        model: an encoder–decoder :class:`~aiayn.models.Transformer` (put in eval mode for the
            call: no dropout on the weights; its mode is restored afterwards).
        tokenizer: the joint vocabulary the model was trained with.
        source: the source sentence.
        target: the target sentence; None = the model's own greedy translation (§6.1 length
            limit: source length + 50).
        max_tokens: the most tokens a side of a map may have (source with EOS, decoder input
            with BOS; None: the model's limit only).

    Raises:
        UserError: an empty sentence, or one longer than the model's learned positions or
            ``max_tokens`` (see the module docstring).
    """
    src_row = [*_encode_sentence(tokenizer, source, "the source sentence"), tokenizer.eos_id]
    learned = model.config.positional == "learned"  # sinusoidal positions go on (§3.5)
    limit = model.config.max_len if learned else None
    check_length("the source sentence", len(src_row), limit, max_tokens)  # S: with EOS
    was_training = model.training
    model.eval()
    try:
        if target is None:
            tgt_ids = greedy_translation(model, tokenizer, src_row[:-1])
            target_text = tokenizer.decode(tgt_ids)
            what = "the model's translation (give --tgt instead)"
        else:
            tgt_ids = _encode_sentence(tokenizer, target, "the target sentence")
            target_text = " ".join(target.split())
            what = "the target sentence"
        tgt_row = [tokenizer.bos_id, *tgt_ids]  # T tokens: the outputs shifted right (§3.1)
        check_length(what, len(tgt_row), limit, max_tokens)
        device = next(model.parameters()).device
        src = torch.tensor([src_row], device=device)  # (1, S)
        tgt = torch.tensor([tgt_row], device=device)  # (1, T)
        encoded = model.encode(src, need_weights=True)
        decoded = model.decode(tgt, encoded.memory, model.source_mask(src), need_weights=True)
    finally:
        model.train(was_training)
    assert encoded.self_weights is not None
    assert decoded.self_weights is not None and decoded.cross_weights is not None
    return AttentionMaps(
        source=" ".join(source.split()),
        target=target_text,
        target_from_model=target is None,
        source_labels=[token_label(tokenizer, i) for i in src_row],
        target_labels=[token_label(tokenizer, i) for i in tgt_row],
        encoder_self=[w[0].float().cpu() for w in encoded.self_weights],  # N × (H, S, S)
        decoder_self=[w[0].float().cpu() for w in decoded.self_weights],  # N × (H, T, T)
        cross=[w[0].float().cpu() for w in decoded.cross_weights],  # N × (H, T, S)
    )


def attention_filename(kind: str, layer: int, head: int) -> str:
    """``{kind}_L{layer}_H{head}.png``; ``layer`` and ``head`` count from 1."""
    return f"{kind}_L{layer}_H{head}.png"


def _cell_size(rows: int, cols: int) -> tuple[float, float]:
    """Figure (width, height) in inches for an R × C map with tick labels and a colour bar."""
    return (max(3.5, 0.28 * cols + 2.2), max(3.0, 0.28 * rows + 1.6))


def draw_heatmap(
    weights: Tensor,
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    path: Path,
    *,
    axis_names: tuple[str, str] = ("query", "key"),
) -> Path:
    """Write one (R, C) attention map as a PNG: white = 0, dark blue = 1, labelled axes."""
    from matplotlib.figure import Figure

    rows, cols = weights.shape
    fig = Figure(figsize=_cell_size(rows, cols), layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(weights.numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(cols), list(col_labels), rotation=90, fontsize=8)
    ax.set_yticks(range(rows), list(row_labels), fontsize=8)
    ax.set_ylabel(axis_names[0])
    ax.set_xlabel(axis_names[1])
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    return path


def _draw_overview(maps: AttentionMaps, kind: str, path: Path) -> Path:
    """Every layer (rows) × head (columns) of one kind in one figure, without tick labels."""
    from matplotlib.figure import Figure

    layers = maps.maps(kind)
    heads = maps.num_heads
    fig = Figure(figsize=(1.9 * heads + 0.6, 1.9 * len(layers) + 0.6), layout="constrained")
    axes = fig.subplots(len(layers), heads, squeeze=False)
    for layer, weights in enumerate(layers):  # weights: (H, R, C)
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(weights[head].numpy(), cmap="Blues", vmin=0.0, vmax=1.0)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")  # one scale: 0 .. 1
    fig.suptitle(f"{KIND_TITLES[kind]}: {maps.source!r}", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    return path


def write_attention_pngs(
    maps: AttentionMaps, out_dir: Path, *, overview: bool = True
) -> list[Path]:
    """Draw every (kind, layer, head) map into ``out_dir``; returns the files written.

    Files: ``{kind}_L{layer}_H{head}.png`` for each map and, with ``overview``,
    ``{kind}_all.png`` with every layer and head of that kind.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for kind in KINDS:
        rows, cols = maps.labels(kind)
        for layer, weights in enumerate(maps.maps(kind), start=1):  # weights: (H, R, C)
            for head in range(1, weights.shape[0] + 1):
                title = f"{KIND_TITLES[kind]}, layer {layer}, head {head}"
                path = out_dir / attention_filename(kind, layer, head)
                written.append(
                    draw_heatmap(
                        weights[head - 1], rows, cols, title, path, axis_names=_AXIS_NAMES[kind]
                    )
                )
        if overview:
            written.append(_draw_overview(maps, kind, out_dir / f"{kind}_all.png"))
    return written
