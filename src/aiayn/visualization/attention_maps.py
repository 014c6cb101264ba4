"""Attention maps of an encoder–decoder for one sentence pair (``aiayn attention``).

:func:`collect_attention` runs the model (the paper's, or a converted T5 or Marian) once,
teacher-forced, on a source sentence and a target sentence (by default the model's own greedy
translation) and keeps the attention weights the model *returns* (``encode`` / ``decode`` with
``need_weights=True``; nothing is stashed on the modules). :func:`translation_attention` is the
family registry's capture for these families (``Family.attention``). Three kinds of attention
(§3.2.3):

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
shown as ``▁``, special tokens by name (``<s>``, ``</s>``). A converted model's labels are its
SentencePiece pieces (``▁`` starts a word) and special tokens.

Shape legend:
    B  batch size (1 here)     H  heads          N  layers
    S  source length (with EOS) T  decoder input length (BOS + target tokens)
    R, C  rows (queries) and columns (keys) of one map
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.checkpoint import Checkpoint
from aiayn.data.pretrained_tokenizer import TranslationTokenizer
from aiayn.data.tokenizer import SPECIAL_TOKENS, Tokenizer
from aiayn.decoding.translate import DecodeOptions, translate_ids
from aiayn.errors import UserError
from aiayn.models.transformer import EncoderDecoder
from aiayn.visualization.token_attention import (
    AttentionRequest,
    AttentionView,
    TokenAttention,
    check_length,
    draw_heatmap,
    readable,
    write_view_pngs,
)

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
    "translation_attention",
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


TRANSLATION_NOTE = (
    "Rows are queries, columns are keys; every row is a softmax and sums to 1 (§3.2.1, eq. 1). "
    "In the decoder, the query at input token y_i (the outputs shifted right, starting with the "
    "decoder's start token) predicts y_(i+1); its self-attention is masked so that no position "
    "sees a later one (§3.2.3): nothing above the diagonal. A leading ▁ marks the start of a "
    "word."
)


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
        source_ids: the S ids of the encoder input (with EOS).
        target_ids: the T ids of the decoder input (with the decoder's start token).
    """

    source: str
    target: str
    target_from_model: bool
    source_labels: list[str]
    target_labels: list[str]
    encoder_self: list[Tensor]
    decoder_self: list[Tensor]
    cross: list[Tensor]
    source_ids: list[int] = field(default_factory=list)
    target_ids: list[int] = field(default_factory=list)

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

    def token_attention(self) -> TokenAttention:
        """These maps as the views every page and picture draws (:mod:`~aiayn.visualization.
        token_attention`): one per kind, in :data:`KINDS` order."""
        views = []
        for kind in KINDS:
            rows, cols = self.labels(kind)
            views.append(
                AttentionView(
                    kind, KIND_TITLES[kind], rows, cols, self.maps(kind), _AXIS_NAMES[kind]
                )
            )
        origin = "the model's own greedy translation" if self.target_from_model else "given"
        inputs = {"input_ids": self.source_ids, "decoder_input_ids": self.target_ids}
        return TokenAttention(
            title=f"Attention maps: {self.source}",
            lines=[("Source", self.source), (f"Target ({origin})", self.target)],
            views=views,
            note=TRANSLATION_NOTE,
            inputs={k: v for k, v in inputs.items() if v},
        )


def token_label(tokenizer: Tokenizer, token_id: int) -> str:
    """A readable label for one subword id: specials by name, a word-initial space as ``▁``."""
    if 0 <= token_id < len(SPECIAL_TOKENS):
        return SPECIAL_TOKENS[token_id]
    text = tokenizer.decode([token_id])
    if not text or "\ufffd" in text:  # part of a multi-byte character: show the raw symbol
        return tokenizer.id_to_token(token_id) or f"#{token_id}"
    return readable(text)


def side_labels(tokenizer: Any, ids: Sequence[int], *, target: bool) -> list[str]:
    """Labels of one side's ids: aiayn's own vocabulary by :func:`token_label`; a converted
    model's by its pieces (SentencePiece's ``▁`` marks a word start; special tokens by name),
    from the target vocabulary for the decoder side (Marian's may be separate)."""
    if isinstance(tokenizer, Tokenizer):
        return [token_label(tokenizer, i) for i in ids]
    return [readable(tokenizer.id_to_token(i, target=target) or f"#{i}") for i in ids]


def _encode_sentence(tokenizer: Any, text: str, what: str) -> list[int]:
    from aiayn.data import normalize

    clean = normalize(text)
    if not clean:
        raise UserError(f"{what} is empty: give a sentence")
    ids: list[int] = tokenizer.encode(clean)
    return ids


@torch.no_grad()
def greedy_translation(
    model: EncoderDecoder,
    tokenizer: Any,
    src_ids: Sequence[int],
    *,
    extra_len: int = 50,
    options: DecodeOptions | None = None,
) -> list[int]:
    """The model's greedy translation of one encoded sentence (ids without BOS/EOS), at most
    ``len(src_ids) + extra_len`` tokens (§6.1), with the shared KV-cached decoder; of the whole
    sentence, which the maps show (translating files truncates at the model's ``max_len``).
    ``options``: a converted model's decoding rules (banned and forced tokens, length cap) with
    beam 1; None: the paper's."""
    if options is None:
        options = DecodeOptions(beam_size=1, extra_len=extra_len)
    options = replace(options, max_src_tokens=max(1, len(src_ids)))
    return translate_ids(model, [list(src_ids)], tokenizer, options)[0][0].tokens


def _target(
    model: EncoderDecoder,
    tokenizer: Any,
    src_ids: list[int],
    target: str | None,
    options: DecodeOptions | None,
) -> tuple[list[int], str, str]:
    """(ids, text, what it is for messages) of the given target, or of the model's greedy
    translation of ``src_ids`` when ``target`` is None."""
    if target is None:
        tgt_ids = greedy_translation(model, tokenizer, src_ids, options=options)
        text: str = tokenizer.decode_batch([tgt_ids])[0]
        return tgt_ids, text, "the model's translation (give --tgt instead)"
    tgt_ids = _encode_sentence(tokenizer, target, "the target sentence")
    return tgt_ids, " ".join(target.split()), "the target sentence"


@torch.no_grad()
def collect_attention(
    model: EncoderDecoder,
    tokenizer: Tokenizer | TranslationTokenizer,
    source: str,
    target: str | None = None,
    *,
    max_tokens: int | None = None,
    options: DecodeOptions | None = None,
) -> AttentionMaps:
    """Run ``model`` once on (source, target) and return the attention of every layer and head.

    Args:
        model: an encoder–decoder (the paper's :class:`~aiayn.models.Transformer`, or a
            converted T5 or Marian; put in eval mode for the call: no dropout on the weights;
            its mode is restored afterwards).
        tokenizer: the vocabulary the model was trained with (aiayn's joint BPE, or a
            converted model's own).
        source: the source sentence.
        target: the target sentence; None = the model's own greedy translation (§6.1 length
            limit: source length + 50).
        max_tokens: the most tokens a side of a map may have (source with EOS, decoder input
            with BOS; None: the model's limit only).
        options: a converted model's decoding rules for its greedy translation.

    Raises:
        UserError: an empty sentence, or one longer than the model's learned positions or
            ``max_tokens`` (see the module docstring).
    """
    src_row = [*_encode_sentence(tokenizer, source, "the source sentence"), tokenizer.eos_id]
    limit = model.config.max_positions  # None: sinusoidal and relative positions go on
    check_length("the source sentence", len(src_row), limit, max_tokens)  # S: with EOS
    was_training = model.training
    model.eval()
    try:
        tgt_ids, target_text, what = _target(model, tokenizer, src_row[:-1], target, options)
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
        source_labels=side_labels(tokenizer, src_row, target=False),
        target_labels=side_labels(tokenizer, tgt_row, target=True),
        encoder_self=[w[0].float().cpu() for w in encoded.self_weights],  # N × (H, S, S)
        decoder_self=[w[0].float().cpu() for w in decoded.self_weights],  # N × (H, T, T)
        cross=[w[0].float().cpu() for w in decoded.cross_weights],  # N × (H, T, S)
        source_ids=src_row,
        target_ids=tgt_row,
    )


def translation_attention(checkpoint: Checkpoint[Any], request: AttentionRequest) -> TokenAttention:
    """``aiayn attention`` for an encoder–decoder checkpoint (the paper's model, a converted T5
    or Marian): its maps for ``request.text`` and ``request.target`` (default: its own greedy
    translation, with a converted model's decoding rules), every kind of §3.2.3."""
    from aiayn.checkpoint import load_translation_tokenizer
    from aiayn.decoding.translate import options_for_checkpoint

    assert request.text is not None
    tokenizer = load_translation_tokenizer(checkpoint.path)
    options = options_for_checkpoint(checkpoint.state.get("generation"), beam_size=1)
    maps = collect_attention(
        checkpoint.model,
        tokenizer,
        request.text,
        request.target,
        max_tokens=request.max_tokens,
        options=options,
    )
    return maps.token_attention()


def attention_filename(kind: str, layer: int, head: int) -> str:
    """``{kind}_L{layer}_H{head}.png``; ``layer`` and ``head`` count from 1."""
    return f"{kind}_L{layer}_H{head}.png"


def write_attention_pngs(
    maps: AttentionMaps, out_dir: Path, *, overview: bool = True
) -> list[Path]:
    """Draw every (kind, layer, head) map into ``out_dir``; returns the files written.

    Files: ``{kind}_L{layer}_H{head}.png`` for each map and, with ``overview``,
    ``{kind}_all.png`` with every layer and head of that kind.
    """
    return write_view_pngs(
        maps.token_attention().views, repr(maps.source), out_dir, overview=overview
    )
