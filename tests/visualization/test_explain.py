"""aiayn.visualization.explain: the true numbers, the library agreement, bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from aiayn.attention import SelfAttention, causal_mask
from aiayn.errors import UserError
from aiayn.layers import sinusoidal_encoding
from aiayn.visualization import (
    AttentionTrace,
    ExplicitWeights,
    build_trace,
    check_trace,
    format_trace,
    library_module,
    load_weights,
    parse_weights,
)

STEP_TITLES = (
    "Step 1. Token embeddings (§3.4)",
    "Step 1b. Embeddings × √d_model = × 2.0000 (§3.4)",
    "Step 2. Positional encodings (§3.5)",
    "Step 3. Attention input X = embeddings + PE (§3.5)",
    "Step 4. Attention per head (§3.2.2)",
    "Step 4.1. Head 1 of 2: columns 0:2",
    "Step 4.2. Head 2 of 2: columns 2:4",
    "Q_1 = X W_Q[:, 0:2]",
    "K_2 = X W_K[:, 2:4]",
    "V_1 = X W_V[:, 0:2]",
    "Scores Q_1 K_1ᵀ (§3.2.1)",
    "Scaled scores Q_1 K_1ᵀ / √d_k, √d_k = √2 = 1.4142 (§3.2.1, eq. 1)",
    "Attention weights = softmax of each row (eq. 1)",
    "head_2 = weights · V_2 (eq. 1)",
    "Step 5. Concat(head_1, head_2) (§3.2.2)",
    "Step 6. Output = Concat · W_O (§3.2.2)",
)


def _query_row_example(first_query_row: list[float], d_model: int) -> ExplicitWeights:
    """Embeddings = identity, W_K = identity: scores row 0 = W_Q row 0 (before the 1/√d_k).

    With one head d_k = d_model, so W_Q row 0 = √d_model · target gives scaled scores = target.
    """
    root = math.sqrt(d_model)
    w_q = [[0.0] * d_model for _ in range(d_model)]
    w_q[0] = [root * s for s in first_query_row]
    eye = torch.eye(d_model, dtype=torch.float64).tolist()
    return parse_weights({"embeddings": eye, "W_Q": w_q, "W_K": eye}, source="example")


# -- the notes' arithmetic slips, pinned -------------------------------------------------------
def test_softmax_of_3_2_is_0_731_0_269_not_0_75_0_25() -> None:
    weights = _query_row_example([3.0, 2.0], d_model=2)
    trace = build_trace(
        ["The", "cat"], num_heads=1, weights=weights, positional=False, scale_embeddings=False
    )
    assert trace.d_model == 2  # taken from the weights
    torch.testing.assert_close(
        trace.scaled_scores[0, 0], torch.tensor([3.0, 2.0], dtype=torch.float64)
    )
    got = trace.weights[0, 0].tolist()
    assert got == pytest.approx([0.7311, 0.2689], abs=1e-4)
    assert got == pytest.approx([math.exp(1) / (math.exp(1) + 1), 1 / (math.exp(1) + 1)])
    text = format_trace(trace, check=check_trace(trace))
    assert "0.7311" in text
    assert "0.2689" in text
    assert "0.75" not in text
    assert "0.25" not in text


def test_softmax_of_1_0_1_is_0_4223_0_1554_0_4223() -> None:
    weights = _query_row_example([1.0, 0.0, 1.0], d_model=3)
    trace = build_trace(
        ["The", "cat", "sat"],
        num_heads=1,
        weights=weights,
        positional=False,
        scale_embeddings=False,
    )
    torch.testing.assert_close(
        trace.scaled_scores[0, 0], torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    )
    got = trace.weights[0, 0].tolist()
    assert got == pytest.approx([0.4223, 0.1554, 0.4223], abs=1e-4)
    e = math.e
    assert got == pytest.approx([e / (2 * e + 1), 1 / (2 * e + 1), e / (2 * e + 1)])
    text = format_trace(trace)
    rows = [line.split() for line in text.splitlines() if "0.4223" in line]
    assert ["The", "0.4223", "0.1554", "0.4223"] in rows


# -- the default trace -------------------------------------------------------------------------
@pytest.fixture
def default_trace() -> AttentionTrace:
    return build_trace()


def test_default_inputs_are_hand_checkable(default_trace: AttentionTrace) -> None:
    t = default_trace
    assert t.tokens == ("The", "cat", "sat")
    assert (t.d_model, t.num_heads, t.d_k) == (4, 2, 2)
    torch.testing.assert_close(t.embeddings, torch.eye(4, dtype=torch.float64)[:3])
    torch.testing.assert_close(t.scaled_embeddings, 2.0 * torch.eye(4, dtype=torch.float64)[:3])
    for w in (t.W_Q, t.W_K, t.W_V, t.W_O):
        torch.testing.assert_close(w, torch.eye(4, dtype=torch.float64))
    # §3.5 by hand: position 1, columns sin(1), cos(1), sin(1/100), cos(1/100).
    want_pe_1 = [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]
    assert t.positional_encoding[1].tolist() == pytest.approx(want_pe_1, abs=1e-12)
    torch.testing.assert_close(
        t.positional_encoding.float(), sinusoidal_encoding(3, 4), atol=1e-7, rtol=0
    )
    torch.testing.assert_close(t.x, t.scaled_embeddings + t.positional_encoding)
    # identity projections: head h's Q, K, V are X's columns h·d_k:(h+1)·d_k
    for h in range(2):
        for m in (t.q, t.k, t.v):
            torch.testing.assert_close(m[h], t.x[:, 2 * h : 2 * h + 2])
    assert t.sqrt_d_k == pytest.approx(math.sqrt(2))
    torch.testing.assert_close(t.scaled_scores, t.scores / math.sqrt(2))
    # scores[0, 0, 0] = |(2, 1)|² = 5 by hand
    assert float(t.scores[0, 0, 0]) == pytest.approx(5.0)


def test_default_softmax_rows_sum_to_one(default_trace: AttentionTrace) -> None:
    sums = default_trace.weights.sum(dim=-1)  # (H, T)
    torch.testing.assert_close(sums, torch.ones_like(sums))
    assert bool((default_trace.weights > 0).all())  # no mask: every key gets some weight
    torch.testing.assert_close(
        default_trace.weights, torch.softmax(default_trace.scaled_scores, dim=-1)
    )


def test_default_output_equals_library_module(default_trace: AttentionTrace) -> None:
    t = default_trace
    # An independent load of the same weights (x @ W means Linear.weight = Wᵀ).
    module = SelfAttention(4, 2).double().eval()
    with torch.no_grad():
        module.in_proj.weight.copy_(torch.cat([t.W_Q.T, t.W_K.T, t.W_V.T]))
        module.in_proj.bias.zero_()
        module.out_proj.weight.copy_(t.W_O.T)
        module.out_proj.bias.zero_()
        got = module(t.x[None], need_weights=True)
    torch.testing.assert_close(got.output[0], t.output, atol=1e-12, rtol=0)
    assert got.weights is not None
    torch.testing.assert_close(got.weights[0], t.weights, atol=1e-12, rtol=0)
    check = check_trace(t)
    assert check.passed
    assert check.max_abs_diff < 1e-12


def test_seeded_trace_equals_library_in_float32_too() -> None:
    """The agreement is not an artefact of identity weights or float64."""
    t = build_trace(["a", "b", "c", "d", "e"], d_model=8, num_heads=4, seed=7, causal=True)
    module = library_module(t).float()
    with torch.no_grad():
        got = module(t.x[None].float(), causal_mask(5), need_weights=True)
    torch.testing.assert_close(got.output[0].double(), t.output, atol=1e-5, rtol=1e-5)
    assert got.weights is not None
    torch.testing.assert_close(got.weights[0].double(), t.weights, atol=1e-5, rtol=1e-5)
    assert check_trace(t).passed


def test_default_text_has_every_step(default_trace: AttentionTrace) -> None:
    text = format_trace(default_trace, check=check_trace(default_trace))
    for title in STEP_TITLES:
        assert title in text, title
    assert "default: one-hot" in text
    assert "default: identity (4×4)" in text
    assert (
        text.rstrip()
        .splitlines()[-1]
        .startswith("check: equals aiayn.attention.SelfAttention output")
    )
    assert "Causal mask" not in text
    assert "-0.0000" not in text


def test_default_text_numbers_are_the_trace_numbers(default_trace: AttentionTrace) -> None:
    text = format_trace(default_trace, decimals=4)
    # X row "cat" = 2·e_1 + PE(1) = (sin 1, 2 + cos 1, sin .01, cos .01); cos .01 rounds to 1.
    assert "cat   0.8415   2.5403   0.0100   1.0000" in text
    w = default_trace.weights[0, 0].tolist()
    assert f"The  {w[0]:.4f}  {w[1]:.4f}  {w[2]:.4f}" in text
    assert "The  0.604" in format_trace(default_trace, decimals=3)


def test_causal_masks_the_future() -> None:
    t = build_trace(causal=True)
    assert t.mask is not None
    torch.testing.assert_close(t.mask, causal_mask(3)[0, 0])
    above = torch.ones(3, 3, dtype=torch.bool).triu(1)
    assert bool((t.weights[:, above] == 0).all())
    assert bool((t.weights[:, ~above] > 0).all())
    assert bool(torch.isinf(t.masked_scores[:, above]).all())
    torch.testing.assert_close(t.weights[:, 0, 0], torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(t.weights.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    assert check_trace(t).passed
    text = format_trace(t)
    assert "Causal mask (§3.2.3)" in text
    assert "-inf" in text


def test_options_off() -> None:
    t = build_trace(positional=False, scale_embeddings=False)
    torch.testing.assert_close(t.x, t.embeddings)
    assert t.embedding_scale == 1.0
    text = format_trace(t, check=check_trace(t))
    assert "skipped (--no-positional)" in text
    assert "Step 1b" not in text
    assert "check: PE" not in text
    assert check_trace(t).passed


def test_repeated_token_shares_its_embedding() -> None:
    t = build_trace(["the", "cat", "the"])
    torch.testing.assert_close(t.embeddings[0], t.embeddings[2])
    assert not torch.equal(t.x[0], t.x[2])  # the positions still differ


# -- seeds -------------------------------------------------------------------------------------
def test_seed_is_reproducible() -> None:
    a, b, c = build_trace(seed=1), build_trace(seed=1), build_trace(seed=2)
    for name in ("embeddings", "W_Q", "W_K", "W_V", "W_O", "output"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=0, rtol=0)
        assert not torch.allclose(getattr(a, name), getattr(c, name)), name
    assert format_trace(a) == format_trace(b)
    assert format_trace(a) != format_trace(c)
    assert not torch.equal(a.W_Q, torch.eye(4, dtype=torch.float64))
    assert "from seed 1" in format_trace(a)
    assert check_trace(a).passed


def test_seed_does_not_depend_on_global_rng() -> None:
    torch.manual_seed(123)
    a = build_trace(seed=5)
    torch.manual_seed(456)
    b = build_trace(seed=5)
    torch.testing.assert_close(a.output, b.output, atol=0, rtol=0)


# -- weights files -----------------------------------------------------------------------------
def test_weights_file_partial_and_token_dict(tmp_path: Path) -> None:
    w_v = [[0.0, 1.0], [1.0, 0.0]]
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"embeddings": {"x": [1, 2], "y": [3, 4]}, "W_V": w_v}))
    weights = load_weights(path)
    t = build_trace(["y", "x", "y"], num_heads=1, weights=weights, positional=False)
    torch.testing.assert_close(
        t.embeddings, torch.tensor([[3, 4], [1, 2], [3, 4]], dtype=torch.float64)
    )
    torch.testing.assert_close(t.W_V, torch.tensor(w_v, dtype=torch.float64))
    torch.testing.assert_close(t.W_Q, torch.eye(2, dtype=torch.float64))  # missing = default
    assert t.sources["W_V"] == str(path)
    assert t.sources["W_K"] == "default"
    assert check_trace(t).passed


@pytest.mark.parametrize(
    ("data", "tokens", "kwargs", "message"),
    [
        ({"W_Q": [[1, 0], [0, 1], [1, 1]]}, ["a"], {}, "W_Q must be square"),
        ({"W_K": [[1, 0], [0, 1]]}, ["a"], {"d_model": 4}, "W_K must be 4×4"),
        ({"W_O": [[1, 0], [0]]}, ["a"], {}, "rows of different lengths"),
        ({"W_V": [[1, "x"], [0, 1]]}, ["a"], {}, "W_V[0][1] must be a number"),
        ({"W_V": [[1, True], [0, 1]]}, ["a"], {}, "W_V[0][1] must be a number"),
        ({"W_V": [[1, float("nan")], [0, 1]]}, ["a"], {}, "finite"),
        ({"W_V": 3}, ["a"], {}, "W_V must be a non-empty list of rows"),
        ({"w_q": [[1]]}, ["a"], {}, "unknown key(s) 'w_q'"),
        ({"embeddings": [[1, 0]]}, ["a", "b"], {"num_heads": 1}, "embeddings must be 2×2"),
        ({"embeddings": {"a": [1, 0]}}, ["a", "b"], {"num_heads": 1}, "no row for token(s) 'b'"),
        ({"embeddings": {"a": [1, 0, 0]}}, ["a"], {"d_model": 2}, "must have d_model=2"),
        ([[1, 0]], ["a"], {}, "expected a JSON object"),
    ],
)
def test_bad_weights_raise_user_error(
    data: object, tokens: list[str], kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(UserError) as info:
        build_trace(tokens, weights=parse_weights(data, source="w.json"), **kwargs)
    assert message in str(info.value)
    assert "w.json" in str(info.value)


def test_unreadable_weights_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read weights file") as info:
        load_weights(tmp_path / "missing.json")
    assert "missing.json" in str(info.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(UserError, match="is not valid JSON") as info:
        load_weights(bad)
    assert "bad.json" in str(info.value)
    assert "line 1" in str(info.value)


@pytest.mark.parametrize(
    ("tokens", "kwargs", "message"),
    [
        ([], {}, "no tokens"),
        (["a"], {"d_model": 0}, "d_model=0"),
        (["a"], {"d_model": 4, "num_heads": 3}, "heads=3 does not divide d_model=4"),
        (["a"], {"num_heads": 0}, "heads=0"),
        (["a"], {"seed": 2**70}, f"seed={2**70}"),
        (["a"], {"seed": -1}, "seed=-1"),
    ],
)
def test_bad_sizes_raise_user_error(
    tokens: list[str], kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(UserError) as info:
        build_trace(tokens, **kwargs)
    assert message in str(info.value)


def test_bad_decimals(default_trace: AttentionTrace) -> None:
    with pytest.raises(UserError, match="decimals"):
        format_trace(default_trace, decimals=-1)


def test_trace_is_frozen(default_trace: AttentionTrace) -> None:
    with pytest.raises(AttributeError):
        default_trace.output = torch.zeros(3, 4)  # type: ignore[misc]


def test_seeded_matrices_do_not_depend_on_the_tokens() -> None:
    a = build_trace(["a", "b"], seed=9)
    b = build_trace(["x", "y", "z", "w"], seed=9)
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=0, rtol=0)
