"""Parameter counts: closed form equals the model; base/big within 4% of Table 3."""

from __future__ import annotations

import pytest
import torch

from aiayn.config import preset
from aiayn.models import (
    Transformer,
    count_parameters,
    expected_parameter_count,
    parameter_breakdown,
)
from aiayn.models.flops import forward_flops, training_flops


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"norm_first": True},
        {"share_embeddings": False, "tie_output": False, "tgt_vocab_size": 77},
        {"share_embeddings": False, "tie_output": True},
        {"positional": "learned"},
    ],
)
def test_closed_form_equals_model(changes: dict[str, object]) -> None:
    config = preset("tiny", vocab_size=91).replace(**changes)
    model = Transformer(config)
    assert count_parameters(model) == expected_parameter_count(config)
    breakdown = parameter_breakdown(model)
    assert sum(breakdown.values()) == count_parameters(model)
    assert "other" not in breakdown
    d, n_enc = config.d_model, config.num_encoder_layers
    assert breakdown["encoder self-attention"] == n_enc * 4 * (d * d + d)
    target_table = 0 if config.share_embeddings else config.target_vocab_size * d
    assert breakdown["token embeddings"] == config.vocab_size * d + target_table


def test_hand_count_of_one_tiny_model() -> None:
    # D=8, F=16, V=10, 1+1 layers, tied: attention 4·(64+8)=288, ffn 2·8·16+16+8=280, norm 16
    config = preset(
        "tiny",
        vocab_size=10,
        d_model=8,
        d_ff=16,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    encoder = 288 + 280 + 2 * 16
    decoder = 2 * 288 + 280 + 3 * 16
    assert count_parameters(Transformer(config)) == encoder + decoder + 10 * 8


@pytest.mark.parametrize(("name", "paper"), [("base", 65e6), ("big", 213e6)])
def test_base_and_big_are_close_to_table_3(name: str, paper: float) -> None:
    with torch.device("meta"):
        model = Transformer(preset(name, vocab_size=37000))
    assert abs(count_parameters(model) - paper) / paper < 0.04


def test_forward_flops_by_hand() -> None:
    # D = 4, F = 8, V = 10, 1 + 1 layers, s = 2, t = 3:
    # encoder 2·(4·16 + 2·32)·2 + 4·4·4 = 512 + 64; decoder 2·(6·16 + 64)·3 + 4·16·2 + 4·9·4
    # + 4·3·2·4 = 960 + 128 + 144 + 96; output 2·4·10·3 = 240
    config = preset("tiny", vocab_size=10, d_model=4, d_ff=8, num_heads=2).replace(
        num_encoder_layers=1, num_decoder_layers=1
    )
    assert forward_flops(config, 2, 3) == 576 + 1328 + 240
    assert training_flops(config, [2, 2], [3, 3]) == 6 * 2144
    with pytest.raises(ValueError, match="2 source lengths but 1"):
        training_flops(config, [2, 2], [3])


def test_flops_formula_equals_torch_flop_counter() -> None:
    """Without padding, the formula counts exactly the matmul FLOPs torch's counter sees."""
    from torch.utils.flop_counter import FlopCounterMode

    config = preset("tiny", vocab_size=37, dropout=0.0)
    model = Transformer(config)
    src, tgt = torch.randint(4, 37, (3, 5)), torch.randint(4, 37, (3, 7))
    # explicit attention (need_weights) so every product is an aten matmul the counter knows
    with FlopCounterMode(display=False) as counter:
        memory = model.encode(src, need_weights=True).memory
        hidden = model.decode(tgt, memory, model.source_mask(src), need_weights=True).hidden
        model.output_proj(hidden).sum().backward()
    assert counter.get_total_flops() == training_flops(config, [5] * 3, [7] * 3)
