"""The pure helpers of benchmarks/translate_vs_ct2.py with hand-computed values (read floors,
goal verdicts, output comparison), and its model-reading helpers on a tiny aiayn Transformer:
which weights a decoding step reads, and the margin that tells near-ties apart, held to the
model's own teacher-forced log-probabilities. No timing is asserted."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from aiayn.config import TransformerConfig
from aiayn.convert.generation import Seq2SeqSpecials
from aiayn.models import Transformer
from translate_vs_ct2 import (
    AIAYN_FP32,
    AIAYN_INT8,
    compare_outputs,
    first_difference,
    floor_bytes,
    floor_lines,
    goal_lines,
    goal_verdicts,
    holds_int8,
    mismatch_margin,
    output_lines,
    read_floor,
    sequence_log_probs,
    step_linears,
    weight_read_bytes,
)


def test_weight_read_bytes_by_hand() -> None:
    shapes = [(4, 3), (2, 5)]
    assert weight_read_bytes(shapes, [False, False]) == 4 * 12 + 4 * 10  # fp32: 4 bytes each
    assert weight_read_bytes(shapes, [True, True]) == (12 + 4 * 4) + (10 + 4 * 2)  # + row scales
    assert weight_read_bytes(shapes, [True, False]) == (12 + 16) + 40
    with pytest.raises(ValueError):
        weight_read_bytes(shapes, [True])


def test_read_floor_scales_the_measured_bandwidth() -> None:
    # 200 MB read in 8 ms: 25 GB/s; 52 MB at that rate take 2.08 ms
    assert read_floor(200_000_000, 8e-3, 52_000_000) == pytest.approx(2.08e-3)
    assert read_floor(10, 1.0, 10) == 1.0


def row(batch: int, beam: int, **tok_s: float) -> dict[str, Any]:
    return {"batch": batch, "beam": beam, "tok_s": tok_s}


def test_goal_verdicts_take_ctranslate2s_fastest_int8_type() -> None:
    rows = [
        row(1, 1, **{AIAYN_FP32: 100.0, AIAYN_INT8: 240.0, "CTranslate2 float32": 90.0,
                     "CTranslate2 int8": 150.0, "CTranslate2 int8_float32": 200.0}),
        row(32, 1, **{AIAYN_FP32: 600.0, "CTranslate2 float32": 450.0, "CTranslate2 int8": 900.0}),
    ]  # fmt: skip
    by = {(tuple(g["config"]), g["ours"], g["peer"]): g for g in goal_verdicts(rows)}
    twice = by[((1, 1), AIAYN_INT8, AIAYN_FP32)]
    assert twice["ratio"] == pytest.approx(2.4) and twice["met"] is True
    vs_ct2 = by[((1, 1), AIAYN_INT8, "ct2 int8")]
    assert vs_ct2["peer_used"] == "CTranslate2 int8_float32"  # the faster of its int8 types
    assert vs_ct2["ratio"] == pytest.approx(1.2) and vs_ct2["met"] is True
    fp32 = by[((1, 1), AIAYN_FP32, "ct2 float32")]
    assert fp32["ratio"] == pytest.approx(100 / 90) and fp32["met"] is False
    assert by[((32, 1), AIAYN_FP32, "ct2 float32")]["ratio"] == pytest.approx(600 / 450)
    not_run = by[((32, 1), AIAYN_INT8, "ct2 int8")]  # no int8 row at batch 32
    assert (not_run["ratio"], not_run["met"]) == (None, None)
    assert by[((32, 4), AIAYN_INT8, "ct2 int8")]["met"] is None  # no such configuration


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) == -1
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_compare_outputs_counts_identical_and_near_ties() -> None:
    ours = [[1, 2], [3, 4], [5, 6], [7]]
    peer = [[1, 2], [3, 9], [5, 6], [8]]
    margins = {1: 2e-5, 3: -0.5}
    got = compare_outputs(ours, peer, lambda i: margins[i], tie=1e-3)
    assert got == {"identical": 2, "sentences": 4, "mismatch_margins": margins, "near_ties": 1}


# --------------------------------------------------------------------- on a tiny model

PAD, EOS = 19, 0


@pytest.fixture(scope="module")
def tiny() -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=20, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=2, dropout=0.0, pad_id=PAD, output_bias=True,
    )  # fmt: skip
    model = Transformer(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    return model


SPECIALS = Seq2SeqSpecials(decoder_start_id=PAD, eos_id=EOS, pad_id=PAD, banned_ids=(PAD,))


def test_step_linears_are_the_decoders_and_the_output_projection(tiny: Transformer) -> None:
    linears = step_linears(tiny)
    assert len(linears) == 2 * 6 + 1  # six per decoder layer, and the output projection
    assert linears[-1] == ("output_proj", 20)
    rows = dict(linears)
    assert rows["decoder.layers.0.self_attn.in_proj"] == 48  # Q, K and V: 3 × 16
    assert rows["decoder.layers.0.cross_attn.in_proj"] == 16  # queries only
    assert rows["decoder.layers.1.feed_forward.linear1"] == 32
    # fp32: (48·16 + 16·16 + 16·16 + 16·16 + 32·16 + 16·32) per layer, 20·16 for the output
    per_layer = 48 * 16 + 3 * 16 * 16 + 2 * 32 * 16
    got = floor_bytes(tiny, None)
    assert got["fp32"] == 4 * (2 * per_layer + 20 * 16)
    rows_read = 2 * (48 + 16 + 16 + 16 + 32 + 16) + 20
    assert got["int8"] == 2 * per_layer + 20 * 16 + 4 * rows_read
    assert "aiayn_int8_layout" not in got


def test_holds_int8_looks_for_an_int8_tensor(tiny: Transformer) -> None:
    class Int8Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("weight", torch.zeros(20, 16, dtype=torch.int8))

    holder = torch.nn.Module()
    holder.output_proj = Int8Linear()
    assert holds_int8(holder, "output_proj")
    assert not holds_int8(tiny, "output_proj")
    assert not holds_int8(holder, "decoder.layers.0.self_attn.in_proj")  # no such module


def test_margins_are_the_models_own_log_probability_gaps(tiny: Transformer) -> None:
    src, a, b = [3, 4, 5], [6, 7, 8], [6, 9, 8]
    logp = sequence_log_probs(tiny, SPECIALS, src, a)  # (T, V), pad excluded
    assert logp.shape == (3, 20)
    assert torch.isinf(logp[:, PAD]).all()
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(3))
    with torch.inference_mode():
        full = tiny(torch.tensor([[*src, EOS]]), torch.tensor([[PAD, 6, 7]]))[0]
    kept = torch.log_softmax(full[1].masked_fill(torch.arange(20) == PAD, float("-inf")), -1)
    greedy = mismatch_margin(tiny, SPECIALS, src, a, b, beam=1)
    assert greedy == pytest.approx(float(kept[7] - kept[9]), abs=1e-5)
    beam = mismatch_margin(tiny, SPECIALS, src, a, b, beam=4)
    logp_b = sequence_log_probs(tiny, SPECIALS, src, b)
    total_a = sum(float(logp[i, t]) for i, t in enumerate(a))
    total_b = sum(float(logp_b[i, t]) for i, t in enumerate(b))
    assert beam == pytest.approx(total_a - total_b, abs=1e-5)


def test_the_report_lines_carry_the_floor_margins_and_verdicts() -> None:
    floor_row = {
        "batch": 1, "beam": 1, "read_s": {"median": 8e-3, "min": 8e-3, "max": 8e-3, "n": 1},
        "floor_s": {"fp32": 8e-3, "int8": 2e-3, "aiayn_int8_layout": 2e-3},
        "bandwidth_gb_s": 25.0, "floor_share": {AIAYN_INT8: 0.5, AIAYN_FP32: 0.4},
        "fp32_vs_ct2": {"identical": 7, "sentences": 8, "mismatch_margins": {3: -2e-5},
                        "near_ties": 1},
        "int8_same_as_own_fp32": {AIAYN_INT8: 0.25},
    }  # fmt: skip
    report = {
        "floor_bytes": {"fp32": 200e6, "int8": 50e6, "aiayn_int8_layout": 50e6,
                        "aiayn_fp32_linears": []},
        "rows": [floor_row], "args": {"tie": 1e-3},
        "goals": goal_verdicts([row(1, 1, **{AIAYN_FP32: 100.0, AIAYN_INT8: 150.0})]),
    }  # fmt: skip
    floor = " ".join(floor_lines(report))
    assert "200 MB of fp32 weights" in floor and "they are 50 MB" in floor
    assert "2.00 ms per token" in floor and "every one of them in int8" in floor
    assert "aiayn int8 50%" in floor
    outputs = " ".join(output_lines(report))
    assert "on **7/8**" in outputs and "2.0e-05 nats" in outputs and "1 near-ties" in outputs
    assert "aiayn int8 = its own fp32 on 25%" in outputs
    goals = goal_lines(report)
    assert (
        "| batch 1, greedy: aiayn int8 ≥ 2.0× aiayn fp32 | 1.50× (vs aiayn fp32) | **not met** |"
        in goals
    )
    assert "| batch 32, greedy: aiayn int8 ≥ 1.0× ct2 int8 | – | not measured |" in goals
    assert (
        "| batch 1, greedy: aiayn int8 ≥ 70% of the int8 read floor | 50% | **not met** |" in goals
    )


def test_ctranslate2_is_timed_with_both_gemm_backends_and_the_class_isa() -> None:
    """A peer gets its best settings: both GEMM backends, under the class's ISA cap."""
    from translate_vs_ct2 import ct2_variants

    assert ct2_variants("native", intel=True) == [
        ("", {}),
        (" [CT2_USE_MKL=0]", {"CT2_USE_MKL": "0"}),
    ]
    isa = {"CT2_FORCE_CPU_ISA": "AVX2"}
    assert ct2_variants("avx2", intel=False) == [
        ("", isa),
        (" [CT2_USE_MKL=1]", {**isa, "CT2_USE_MKL": "1"}),
    ]


def test_each_cpu_class_has_its_goals() -> None:
    from translate_vs_ct2 import AVX2_GOALS, FLOOR_GOAL, GOALS, goals_of

    assert goals_of(None) == (GOALS, FLOOR_GOAL) and goals_of("generic") == (GOALS, FLOOR_GOAL)
    goals, floor = goals_of("avx2")
    assert goals is AVX2_GOALS and floor == 0.60
    rows = [row(1, 1, **{AIAYN_FP32: 100.0, AIAYN_INT8: 240.0, "CTranslate2 int8_float32": 100.0,
                         "CTranslate2 int8_float32 [CT2_USE_MKL=1]": 130.0})]  # fmt: skip
    by = {(tuple(g["config"]), g["ours"], g["peer"]): g for g in goal_verdicts(rows, goals)}
    int8 = by[((1, 1), AIAYN_INT8, "ct2 int8")]  # against the faster backend: 240 / 130
    assert int8["ratio"] == pytest.approx(240 / 130) and int8["met"] is False  # < 2.0
    assert int8["peer_used"] == "CTranslate2 int8_float32 [CT2_USE_MKL=1]"
    assert by[((1, 1), AIAYN_INT8, AIAYN_FP32)]["met"] is True  # 2.4 >= 1.5
