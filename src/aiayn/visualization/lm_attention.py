"""A language model's causal self-attention over a prompt (``aiayn attention`` on GPT-2).

:func:`collect_lm_attention` runs the model once on the prompt's tokens, or on the prompt and its
greedy continuation (the model's own next tokens, :func:`aiayn.decoding.generate.generate_ids`),
and keeps the weights its forward returns (``GPT2.forward(need_weights=True)``). The maps are
causal (Radford et al. 2018 §3.1, the paper's masked decoder self-attention §3.2.3 without an
encoder): row i is the query of token i, which predicts token i + 1, and sees tokens 0..i only,
so every weight above the diagonal is exactly zero.

The prompt is read as the model reads it in ``aiayn generate``: its ids with no BOS added (an
empty prompt is refused here: there is nothing to draw).

Shape legend:
    B batch (1 here)   T tokens (prompt + continuation)   H heads   N layers
"""

from __future__ import annotations

from typing import Any

import torch

from aiayn.checkpoint import Checkpoint
from aiayn.errors import UserError
from aiayn.models.gpt2 import GPT2
from aiayn.visualization.token_attention import (
    AttentionRequest,
    AttentionView,
    TokenAttention,
    check_length,
    readable,
)

__all__ = ["LM_NOTE", "collect_lm_attention", "lm_attention", "lm_token_label"]

LM_NOTE = (
    "Causal self-attention: row i is the query at token i, the one that predicts token i + 1; it "
    "may attend to tokens 0..i only (the mask of the paper's decoder, §3.2.3), so nothing is drawn "
    "above the diagonal. Every row is a softmax and sums to 1 (eq. 1). A leading ▁ marks a space "
    "before the token."
)


def lm_token_label(tokenizer: Any, token_id: int) -> str:
    """One token as text (a leading space as ``▁``, a newline as ``\\n``), or ``#id`` for a
    byte that is only part of a character."""
    text = str(tokenizer.decode([token_id]))
    if not text or "\ufffd" in text:
        return f"#{token_id}"
    return readable(text)


@torch.no_grad()
def collect_lm_attention(
    model: GPT2,
    tokenizer: Any,
    prompt: str,
    *,
    continuation: int = 0,
    max_tokens: int | None = None,
) -> TokenAttention:
    """The causal self-attention of every layer and head over ``prompt`` (and its greedy
    continuation of ``continuation`` tokens, fewer if the model ends it).

    Raises:
        UserError: an empty prompt, or prompt + continuation beyond the model's positions or
            ``max_tokens``.
    """
    from aiayn.decoding.generate import GenerateOptions, generate_ids

    ids: list[int] = list(tokenizer.encode(prompt)) if prompt.strip() else []
    if not ids:
        raise UserError("--text is empty: give a prompt")
    limit = model.config.max_len
    what = f"the prompt with {continuation} new tokens" if continuation else "the prompt"
    check_length(what, len(ids) + continuation, limit, max_tokens)
    new: list[int] = []
    was_training = model.training
    model.eval()
    try:
        if continuation:
            options = GenerateOptions(max_new_tokens=continuation, method="greedy", pack=False)
            new = list(generate_ids(model, [ids], options)[0][0].tokens)
        device = next(model.parameters()).device
        tokens = torch.tensor([[*ids, *new]], device=device)  # (1, T)
        out = model(tokens, need_weights=True)
    finally:
        model.train(was_training)
    assert out.weights is not None
    labels = [lm_token_label(tokenizer, i) for i in tokens[0].tolist()]
    view = AttentionView(
        "self",
        "causal self-attention",
        labels,
        labels,
        [w[0].float().cpu() for w in out.weights],  # N × (H, T, T)
        ("query: token (predicts the next)", "key: token"),
    )
    lines = [("Prompt", prompt)]
    if continuation:
        lines.append((f"Greedy continuation ({len(new)} tokens)", tokenizer.decode(new)))
    later = list(range(len(ids), len(ids) + len(new)))
    return TokenAttention(
        title=f"Attention maps: {prompt}",
        lines=lines,
        views=[view],
        note=LM_NOTE,
        inputs={"input_ids": tokens[0].tolist()},
        highlight={"self": (later, later)} if later else {},
        marked="the model's greedy continuation",
    )


def lm_attention(checkpoint: Checkpoint[Any], request: AttentionRequest) -> TokenAttention:
    """``aiayn attention`` for a language-model checkpoint: ``request.text`` is the prompt,
    ``request.continuation`` the greedy tokens to append."""
    from aiayn.data.text_tokenizer import load_lm_tokenizer

    assert request.text is not None
    tokenizer = load_lm_tokenizer(checkpoint.tokenizer_path)
    return collect_lm_attention(
        checkpoint.model,
        tokenizer,
        request.text,
        continuation=request.continuation,
        max_tokens=request.max_tokens,
    )
