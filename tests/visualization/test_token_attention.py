"""aiayn.visualization.token_attention: token labels, the views' lookups and files, by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.errors import UserError
from aiayn.visualization.token_attention import (
    AttentionView,
    TokenAttention,
    check_length,
    readable,
    write_view_pngs,
)


@pytest.mark.parametrize(
    ("label", "shown"),
    [
        (" cat", "▁cat"),
        ("cat", "cat"),
        ("\n", "\\n"),
        (" a\tb", "▁a\\tb"),
        ("\x1d", "\\x1d"),
        ("café", "café"),
        ("  ", "▁ "),
    ],
)
def test_readable_shows_spaces_and_control_characters(label: str, shown: str) -> None:
    assert readable(label) == shown


def _attention() -> TokenAttention:
    weights = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])  # (H=1, R=2, C=2)
    view = AttentionView("self", "causal self-attention", ["a", "b"], ["a", "b"], [weights] * 3)
    return TokenAttention("t", [("Prompt", "a b")], [view])


def test_views_by_name_and_summary() -> None:
    attention = _attention()
    assert attention.view("self").num_heads == 1
    with pytest.raises(ValueError, match=r"unknown attention view 'cross' \(choose from self\)"):
        attention.view("cross")
    assert attention.summary() == [
        "Prompt: a b",
        "causal self-attention: 2 × 2 tokens, 3 layers × 1 heads",
    ]


def test_pngs_one_per_layer_and_head_and_an_overview(tmp_path: Path) -> None:
    written = write_view_pngs(_attention().views, "'a b'", tmp_path)
    assert [p.name for p in written] == [
        "self_L1_H1.png",
        "self_L2_H1.png",
        "self_L3_H1.png",
        "self_all.png",
    ]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written)


def test_length_limits_name_the_input() -> None:
    check_length("the prompt", 5, 5, 5)
    with pytest.raises(UserError, match=r"^the prompt has 6 tokens; this model's limit is 5$"):
        check_length("the prompt", 6, 5, None)
    with pytest.raises(UserError, match=r"^the text has 6 tokens, more than --max-tokens 5"):
        check_length("the text", 6, None, 5)
