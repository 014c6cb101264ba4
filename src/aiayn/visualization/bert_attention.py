"""BERT's bidirectional self-attention over one text (``aiayn attention`` on a BERT checkpoint).

:func:`collect_bert_attention` encodes the text as BERT reads it, ``[CLS] text [SEP]`` (BERT §3,
"Input/Output Representations"; the special tokens are drawn, since many heads attend to them:
Clark et al. 2019, "What Does BERT Look At?"), runs the model once and keeps the weights its
forward returns (``BERT.forward(need_weights=True)``). Unlike the paper's decoder and GPT-2,
nothing is masked: every token attends to every token, before and after it.

A text with ``[MASK]`` (fill-mask input, BERT §3.1 "Task #1") gets a second view: the rows of the
masked positions alone, every head of a layer at once, i.e. where the model looks to fill the
mask; with the masked-LM head, the most probable tokens for each mask are listed too.

The text must fit the model's positions with its special tokens (it is refused, never cut).

Shape legend:
    B batch (1 here)   S tokens with [CLS] and [SEP]   M masked positions   H heads   N layers
    V vocabulary
"""

from __future__ import annotations

from typing import Any

import torch

from aiayn.checkpoint import Checkpoint
from aiayn.errors import UserError
from aiayn.models.bert import BERT
from aiayn.visualization.token_attention import (
    AttentionRequest,
    AttentionView,
    TokenAttention,
    check_length,
)

__all__ = ["BERT_NOTE", "bert_attention", "collect_bert_attention"]

BERT_NOTE = (
    "Bidirectional self-attention: every token attends to every token, before and after it (no "
    "mask). Rows are queries, columns are keys; every row is a softmax and sums to 1 (eq. 1). "
    "[CLS] and [SEP] are the special tokens BERT adds around the text (BERT §3); ## marks a "
    "word piece that continues a word. The masked-position view shows only the rows of the "
    "[MASK] tokens: where the model looks to predict them."
)


def _top_tokens(model: BERT, tokenizer: Any, hidden: torch.Tensor, where: list[int]) -> list[str]:
    """For each masked position, its three most probable tokens with their probabilities."""
    logits = model.mlm_logits(hidden[:, where]).float()[0]  # (M, V)
    logits = logits[:, : tokenizer.vocab_size]  # rows past the tokenizer's (padding) are no token
    probs = torch.softmax(logits, dim=-1)  # (M, V)
    top = probs.topk(min(3, probs.size(-1)), dim=-1)  # (M, 3)
    lines = []
    for values, ids in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        tokens = tokenizer.convert_ids_to_tokens(ids)
        lines.append(", ".join(f"{t} {p:.3f}" for t, p in zip(tokens, values, strict=True)))
    return lines


def _encode(model: BERT, tokenizer: Any, text: str, max_tokens: int | None) -> list[int]:
    """``[CLS] text [SEP]`` ids, refused (not cut) past the model's positions or ``max_tokens``."""
    if not text.strip():
        raise UserError("--text is empty: give a text")
    limit = model.config.max_len
    ids = list(tokenizer.encode(text, max_length=limit + 1).ids)
    check_length("the text (with [CLS] and [SEP])", len(ids), limit, max_tokens)
    return ids


@torch.no_grad()
def collect_bert_attention(
    model: BERT, tokenizer: Any, text: str, *, max_tokens: int | None = None
) -> TokenAttention:
    """The self-attention of every layer and head over ``[CLS] text [SEP]``; with ``[MASK]`` in
    the text, also the masked positions' rows (see the module docstring).

    Raises:
        UserError: an empty text, or one beyond the model's positions or ``max_tokens``.
    """
    ids = _encode(model, tokenizer, text, max_tokens)
    was_training = model.training
    model.eval()
    try:
        tokens = torch.tensor([ids], device=next(model.parameters()).device)  # (1, S)
        out = model(tokens, need_weights=True)
    finally:
        model.train(was_training)
    assert out.weights is not None
    labels = list(tokenizer.convert_ids_to_tokens(ids))
    layers = [w[0].float().cpu() for w in out.weights]  # N × (H, S, S)
    views = [
        AttentionView(
            "self",
            "bidirectional self-attention",
            labels,
            labels,
            layers,
            ("query: token", "key: token"),
        )
    ]
    where = [i for i, token_id in enumerate(ids) if token_id == tokenizer.mask_id]
    lines = [("Text", text), ("Tokens", " ".join(labels))]
    if where:
        rows = [f"{labels[i]} ({i})" for i in where]
        masked = [w[:, where, :] for w in layers]  # N × (H, M, S)
        views.append(
            AttentionView(
                "mask",
                "attention of the masked positions",
                rows,
                labels,
                masked,
                ("query: masked position", "key: token"),
            )
        )
        if model.mlm_head is not None:
            for row, top in zip(
                rows, _top_tokens(model, tokenizer, out.hidden, where), strict=True
            ):
                lines.append((f"Predicted at {row}", top))
    return TokenAttention(
        title=f"Attention maps: {text}",
        lines=lines,
        views=views,
        note=BERT_NOTE,
        inputs={"input_ids": ids},
        highlight={"self": (where, where)} if where else {},
        focus={"self": where[0]} if where else {},
        marked="the masked positions",
    )


def bert_attention(checkpoint: Checkpoint[Any], request: AttentionRequest) -> TokenAttention:
    """``aiayn attention`` for a BERT checkpoint: ``request.text``, with ``[MASK]`` or without."""
    from aiayn.checkpoint import checkpoint_bert_tokenizer

    assert request.text is not None
    tokenizer = checkpoint_bert_tokenizer(checkpoint.path)
    return collect_bert_attention(
        checkpoint.model, tokenizer, request.text, max_tokens=request.max_tokens
    )
