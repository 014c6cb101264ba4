"""T5's relative position bias drawn: the bucket of each distance (hand-computed, and equal to
transformers' ``T5Attention._relative_position_bucket``), the runs of one bucket, the bias per
head equal to what the attention adds, and ``aiayn attention --bias`` end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from aiayn.checkpoint import save_checkpoint
from aiayn.cli.main import main
from aiayn.data import Tokenizer
from aiayn.layers.relative_position import RelativePositionBias
from aiayn.models.t5 import T5, t5_preset
from aiayn.visualization.position_bias import (
    bias_by_distance,
    bucket_spans,
    default_reach,
    distance_buckets,
    exact_distances,
)

# (relative position key − query, bucket), worked out by hand from the rule: with 32 buckets and
# max_distance 128, a bidirectional half has n' = 16 buckets, distances 0..7 exact, then
# 8 + ⌊log(d / 8) / log(128 / 8) · 8⌋ capped at 15; keys after the query add 16. Causal: n' = 32,
# distances 0..15 exact, then 16 + ⌊log(d / 16) / log(8) · 16⌋ capped at 31; later keys: 0.
BIDIRECTIONAL = {
    0: 0, -1: 1, -7: 7, -8: 8, -11: 8, -12: 9, -16: 10, -127: 15, -128: 15, -1000: 15,
    1: 17, 7: 23, 8: 24, 12: 25, 64: 30, 200: 31,
}  # fmt: skip
# e.g. d = 22 causal: 16 + ⌊ln(22/16) / ln 8 · 16⌋ = 16 + ⌊2.45⌋ = 18
CAUSAL = {5: 0, 0: 0, -1: 1, -15: 15, -16: 16, -22: 18, -32: 21, -127: 31, -128: 31, -500: 31}


@pytest.mark.parametrize(("bidirectional", "expected"), [(True, BIDIRECTIONAL), (False, CAUSAL)])
def test_buckets_by_hand(bidirectional: bool, expected: dict[int, int]) -> None:
    distances, buckets = distance_buckets(
        -1000, 200, bidirectional=bidirectional, num_buckets=32, max_distance=128
    )
    got = dict(zip(distances.tolist(), buckets.tolist(), strict=True))
    assert {r: got[r] for r in expected} == expected
    assert exact_distances(bidirectional=bidirectional, num_buckets=32) == (
        8 if bidirectional else 16
    )


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 20), (6, 7)])
def test_buckets_equal_transformers(
    bidirectional: bool, num_buckets: int, max_distance: int
) -> None:
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    distances, buckets = distance_buckets(
        -300, 300, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    expected = t5.T5Attention._relative_position_bucket(
        distances, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(buckets, expected)


def test_bucket_spans_are_the_runs_of_one_bucket() -> None:
    distances, buckets = distance_buckets(-3, 3, bidirectional=True, num_buckets=8, max_distance=16)
    assert buckets.tolist() == [2, 2, 1, 0, 5, 6, 6]
    assert bucket_spans(distances, buckets) == [
        (2, -3, -2),
        (1, -1, -1),
        (0, 0, 0),
        (5, 1, 1),
        (6, 2, 3),
    ]
    assert default_reach(128) == 160 and default_reach(3) == 4


@pytest.mark.parametrize("bidirectional", [True, False])
def test_the_curve_is_what_the_attention_adds(bidirectional: bool) -> None:
    torch.manual_seed(0)
    bias = RelativePositionBias(4, bidirectional=bidirectional, num_buckets=8, max_distance=12)
    curve = bias_by_distance("stack", bias, reach=30)
    assert curve.distances[0] == -30 and curve.distances[-1] == (30 if bidirectional else 0)
    added = bias(31, 31)[0].detach()  # (H, T, S): query q, key k at relative position k − q
    for j, r in enumerate(curve.distances.tolist()):
        q, k = (0, r) if r >= 0 else (-r, 0)
        assert torch.equal(curve.values[:, j], added[:, q, k]), r


@pytest.fixture(scope="module")
def t5_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("t5_bias")
    tokenizer = Tokenizer.train(["a small dog runs", "the cat sat"] * 20, 300, min_frequency=1)
    tokenizer.save(root / "tok.json")
    torch.manual_seed(0)
    model = T5(t5_preset("t5-tiny", vocab_size=tokenizer.vocab_size))
    return save_checkpoint(root / "t5", model, {}, root / "tok.json")


def test_cli_draws_both_stacks(
    t5_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bias.png"
    assert main(["attention", "--checkpoint", str(t5_checkpoint), "--bias", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "encoder: 4 heads, relative positions -160..160, 32 buckets",
        "decoder: 4 heads, relative positions -160..0, 32 buckets",
        f"wrote {out}",
    ]
    with Image.open(out) as image:
        assert image.format == "PNG" and image.width > 800
    args = ["attention", "--checkpoint", str(t5_checkpoint), "--bias", str(out)]
    assert main(args) == 2  # exists: not replaced without --force
    assert "exists: pass --force" in capsys.readouterr().err
    assert main([*args, "--force", "--bias-reach", "20"]) == 0
    assert "relative positions -20..20" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--bias-reach", "5000"], "--bias-reach 5000 is more than 4096"),
        (["--src", "hi"], "give it without --src"),
    ],
)
def test_cli_refusals(
    t5_checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    args = ["attention", "--checkpoint", str(t5_checkpoint), "--bias", str(tmp_path / "b.png")]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "b.png").exists()
