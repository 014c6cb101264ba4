"""aiayn.visualization.experiments, AdditiveAttention and ``aiayn experiment``: every experiment
runs at its quick size, and the claims that are deterministic hold (timings are not asserted)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from aiayn.attention import causal_mask
from aiayn.attention.additive import AdditiveAttention
from aiayn.cli.main import main
from aiayn.errors import UserError
from aiayn.layers import sinusoidal_encoding
from aiayn.visualization.experiments import (
    EXPERIMENTS,
    ExperimentResult,
    PeakMemory,
    format_table,
    multihead_parameter_formula,
    run_experiment,
    softmax_jacobian_norm,
)

COLUMNS = {
    "scaling": ["d_k", "scaling", "score_std", "sqrt_d_k", "entropy", "max_weight", "grad_norm"],
    "additive": [
        "kind",
        "T",
        "d_k",
        "forward_ms",
        "fwd_bwd_ms",
        "fwd_peak_mib",
        "fwd_bwd_peak_mib",
    ],
    "multihead": [
        "heads",
        "d_k",
        "params",
        "formula",
        "params_with_bias",
        "fwd_mflops",
        "forward_ms",
        "fwd_bwd_ms",
    ],
    "positional": ["distance", "dot", "spread_over_p", "dot_at_minus_k", "cosine"],
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExperimentResult]:
    out = tmp_path_factory.mktemp("experiments")
    return {name: run_experiment(name, out, quick=True) for name in EXPERIMENTS}


def test_registry_names() -> None:
    assert list(EXPERIMENTS) == ["scaling", "additive", "multihead", "positional"]


@pytest.mark.parametrize("name", list(COLUMNS))
def test_each_experiment_writes_a_plot_and_a_table(
    results: dict[str, ExperimentResult], name: str
) -> None:
    result = results[name]
    assert result.name == name and result.rows and result.summary
    assert all(list(row) == COLUMNS[name] for row in result.rows)
    assert result.plot.name == f"{name}.png"
    assert result.plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = result.table.read_text(encoding="utf-8")
    assert markdown.startswith(f"# {result.title}") and format_table(result.rows) in markdown
    csv_lines = result.table.with_suffix(".csv").read_text(encoding="utf-8").splitlines()
    assert csv_lines[0] == ",".join(COLUMNS[name]) and len(csv_lines) == len(result.rows) + 1


def test_unknown_experiment() -> None:
    with pytest.raises(UserError, match="scaling, additive, multihead, positional"):
        run_experiment("nope", Path("unused"))


# -- 1. scaling ------------------------------------------------------------------------------
def test_scaling_claims(results: dict[str, ExperimentResult]) -> None:
    rows = results["scaling"].rows
    unscaled = [r for r in rows if r["scaling"] == "none"]
    scaled = [r for r in rows if r["scaling"] != "none"]
    assert len(unscaled) == len(scaled) >= 4
    for row in unscaled:  # Var(q·k) = d_k for unit-variance components
        assert row["score_std"] == pytest.approx(math.sqrt(row["d_k"]), rel=0.1)
    for row in scaled:
        assert row["score_std"] == pytest.approx(1.0, rel=0.1)
    entropies = [r["entropy"] for r in unscaled]
    assert all(a > b for a, b in itertools.pairwise(entropies))
    assert entropies[-1] < 0.25 * entropies[0]
    flat = [r["entropy"] for r in scaled]
    assert max(flat) - min(flat) < 0.05 * max(flat)
    assert unscaled[-1]["grad_norm"] < 0.5 * scaled[-1]["grad_norm"]
    assert unscaled[-1]["max_weight"] > 0.8 > scaled[-1]["max_weight"]


def test_softmax_jacobian_norm_matches_autograd() -> None:
    logits = torch.randn(5, 7, dtype=torch.float64)
    expected = torch.stack(
        [
            torch.autograd.functional.jacobian(lambda z: torch.softmax(z, -1), row).norm()
            for row in logits
        ]
    )
    torch.testing.assert_close(softmax_jacobian_norm(torch.softmax(logits, -1)), expected)
    one_hot = torch.tensor([[0.0, 1.0, 0.0]])
    assert float(softmax_jacobian_norm(one_hot)) == 0.0


# -- 2. additive -----------------------------------------------------------------------------
def test_additive_experiment_rows(results: dict[str, ExperimentResult]) -> None:
    rows = results["additive"].rows
    assert {r["kind"] for r in rows} == {"dot", "dot_fused", "additive"}
    assert all(r["forward_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in rows)
    by_key = {(r["kind"], r["T"], r["d_k"]): r for r in rows}
    for (kind, t, d_k), row in by_key.items():
        if kind == "additive":  # memory is counted, not timed: the (T, S, A) hidden layer
            assert row["fwd_bwd_peak_mib"] > by_key["dot", t, d_k]["fwd_bwd_peak_mib"]


def test_additive_attention_is_bahdanau_with_the_mask_convention() -> None:
    torch.manual_seed(0)
    layer = AdditiveAttention(4, hidden_size=3)
    q, k, v = torch.randn(2, 1, 3, 4), torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 6)
    out, weights = layer(q, k, v, need_weights=True)
    assert out.shape == (2, 1, 3, 6) and weights is not None and weights.shape == (2, 1, 3, 5)
    w_q, w_k, b_k, vec = layer.w_query.weight, layer.w_key.weight, layer.w_key.bias, layer.v.weight
    assert b_k is not None
    scores = torch.empty(2, 1, 3, 5)
    for b in range(2):
        for i in range(3):
            for j in range(5):  # score(q, k) = vᵀ tanh(W_q q + W_k k)
                hidden = torch.tanh(w_q @ q[b, 0, i] + w_k @ k[b, 0, j] + b_k)
                scores[b, 0, i, j] = (vec @ hidden).squeeze()
    torch.testing.assert_close(weights, torch.softmax(scores, -1))
    torch.testing.assert_close(out, weights @ v)

    mask = causal_mask(3, 5, offset=2)  # (1, 1, 3, 5): True = may attend
    mask = mask & torch.tensor([True, True, True, True, False])  # key 4 blocked everywhere
    mask[..., 0, :] = False  # query 0 sees nothing
    out, weights = layer(q, k, v, mask, need_weights=True)
    assert weights is not None
    assert bool((weights[~mask.expand_as(weights)] == 0).all())
    assert bool((weights[..., 0, :] == 0).all()) and bool((out[..., 0, :] == 0).all())
    torch.testing.assert_close(weights[..., 1:, :].sum(-1), torch.ones(2, 1, 2))
    with pytest.raises(TypeError, match="boolean"):
        layer(q, k, v, mask.int())
    assert layer(q, k, v)[1] is None


def test_peak_memory_counts_new_tensors_only() -> None:
    existing = torch.ones(1024, 256)  # 1 MiB, allocated before: not counted
    with PeakMemory() as tracker:
        a = existing * 2  # +1 MiB
        b = a + 1  # +1 MiB (both alive)
        del a
        c = b.sum()
    assert tracker.peak_bytes == 2 * 2**20
    assert float(c) == 3 * 1024 * 256


# -- 3. multi-head ---------------------------------------------------------------------------
def test_multihead_claims(results: dict[str, ExperimentResult]) -> None:
    rows = results["multihead"].rows
    assert [r["heads"] for r in rows] == [1, 8]
    assert len({r["params"] for r in rows}) == 1
    assert len({r["params_with_bias"] for r in rows}) == 1
    assert len({r["fwd_mflops"] for r in rows}) == 1
    for row in rows:
        assert row["params"] == row["formula"] == 4 * (row["heads"] * row["d_k"]) ** 2


def test_multihead_parameter_formula() -> None:
    assert multihead_parameter_formula(512, 64, 8, 512) == 4 * 512 * 512 == 1_048_576
    assert multihead_parameter_formula(512, 512, 1, 512) == 1_048_576
    m, h, n_h, o = 10, 3, 2, 7  # different input and output sizes
    layers = [nn.Linear(m, h * n_h, bias=False) for _ in range(3)]
    layers.append(nn.Linear(h * n_h, o, bias=False))
    assert multihead_parameter_formula(m, h, n_h, o) == sum(
        p.numel() for p in nn.ModuleList(layers).parameters()
    )


# -- 4. positional ---------------------------------------------------------------------------
def test_positional_claims(results: dict[str, ExperimentResult]) -> None:
    rows = results["positional"].rows
    assert rows[0]["distance"] == 0 and rows[0]["dot"] == pytest.approx(16.0, abs=1e-5)
    for row in rows:
        assert row["spread_over_p"] < 1e-4
        assert row["dot"] == pytest.approx(row["dot_at_minus_k"], abs=1e-5)


def test_positional_dot_product_depends_only_on_distance() -> None:
    pe = sinusoidal_encoding(40, 16).double()  # (P, D)
    dots = pe @ pe.T  # (P, P)
    for k in range(1, 20):
        same_distance = torch.tensor([dots[p, p + k] for p in range(40 - k)])
        assert float(same_distance.max() - same_distance.min()) < 1e-5
        assert float(dots[30, 30 + 5]) == pytest.approx(float(dots[30, 30 - 5]), abs=1e-5)
    i = torch.arange(0, 16, 2, dtype=torch.float64)
    omega = 1.0 / 10000 ** (i / 16)  # Σ_i cos(ω_i k)
    assert float(dots[3, 10]) == pytest.approx(float(torch.cos(omega * 7).sum()), abs=1e-5)


# -- the command -----------------------------------------------------------------------------
def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()] == list(EXPERIMENTS)


@pytest.mark.parametrize("argv", [["experiment", "nope"], ["experiment"]])
def test_cli_unknown_or_missing_name(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("aiayn experiment: error: ")
    assert "scaling, additive, multihead, positional" in err and "Traceback" not in err


def test_cli_runs_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "positional", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| distance | dot | spread_over_p | dot_at_minus_k | cosine |" in out
    assert f"plot: {tmp_path / 'positional.png'}" in out
    assert (tmp_path / "positional.png").is_file() and (tmp_path / "positional.md").is_file()
