"""The protocol of benchmarks/train_multi30k.py: the peer's recipe read from aiayn's config
(configs/multi30k_small.yaml and overrides), the seeds' spread rule, the result files that make
the long experiment resumable; values checked by hand."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import _multi30k_protocol as protocol
from aiayn.training.config import load_run_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "multi30k_small.yaml"


def test_same_recipe_is_the_configs_recipe() -> None:
    r = protocol.same_recipe(load_run_config(str(CONFIG), []))
    # configs/multi30k_small.yaml: pre-norm, dropout 0.3, 2,500 tokens, warm-up 1,000, lr scale
    # 1, average_last 10 over 0.3; the small preset: 8k joint BPE, shared and tied embeddings
    assert (r.norm_first, r.final_norm, r.dropout) == (True, True, 0.3)
    assert (r.max_tokens, r.warmup, r.lr_scale) == (2500, 1000, 1.0)
    assert (r.average_last, r.average_window, r.tune_alpha) == (10, 0.3, True)
    assert (r.vocab_size, r.min_frequency) == (8000, 2)
    assert (r.share_embeddings, r.tie_output, r.activation) == (True, True, "relu")
    assert r.label_smoothing == 0.1  # train.label_smoothing null: the translation default
    assert (r.adam_betas, r.adam_eps, r.weight_decay, r.clip_norm) == ((0.9, 0.98), 1e-9, 0, None)


def test_same_recipe_follows_the_overrides() -> None:
    run = load_run_config(
        str(CONFIG),
        [
            "model.norm_first=false",
            "model.dropout=0.3",
            "model.share_embeddings=false",
            "train.label_smoothing=0.2",
            "train.warmup_steps=1500",
            "train.lr_scale=1.5",
            "train.max_tokens=3000",
            "train.average_window=0.2",
            "train.clip_norm=1.0",
            "data.vocab_size=6000",
        ],
    )
    r = protocol.same_recipe(run)
    assert (r.norm_first, r.final_norm) == (False, False)  # post-norm: no final LayerNorm
    assert (r.dropout, r.share_embeddings, r.tie_output) == (0.3, False, True)
    assert (r.label_smoothing, r.warmup, r.lr_scale) == (0.2, 1500, 1.5)
    assert (r.max_tokens, r.average_window, r.clip_norm, r.vocab_size) == (3000, 0.2, 1.0, 6000)


def test_the_peer_trains_with_every_field_of_its_recipe() -> None:
    import train_multi30k as bench

    run = load_run_config(str(CONFIG), ["train.label_smoothing=0.2", "train.clip_norm=1.0"])
    r = protocol.same_recipe(run)
    args = bench.parse_args(["--data-dir", "d", "--systems", "peer-same", "--steps", "peer-same=7"])
    s = bench.peer_settings(args, "peer-same", r, seed=3)
    assert (s.minutes, s.steps, s.seed, s.max_tokens, s.warmup, s.lr_scale) == (
        60.0, 7, 3, 2500, 1000, 1.0
    )  # fmt: skip
    assert (s.label_smoothing, s.clip_norm, s.adam_betas) == (0.2, 1.0, (0.9, 0.98))
    assert (s.adam_eps, s.weight_decay, s.average_last, s.average_window) == (1e-9, 0, 10, 0.3)
    paper = protocol.paper_recipe(run, warmup=3000, dropout=0.1, norm_first=False)
    p = bench.peer_settings(args, "peer-same", paper, seed=1)
    assert (p.warmup, p.label_smoothing, p.average_last) == (3000, 0.1, paper.average_last)
    with pytest.raises(ValueError, match="the peer's recipe has no max_tokens, warmup, lr_scale"):
        bench.peer_settings(args, "peer-same", object(), seed=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.positional=learned", "model.positional"),
        ("model.activation=silu", "model.activation"),
        ("train.accum_steps=2", "train.accum_steps"),
        ("data.lowercase=true", "data.lowercase"),
        ("train.precision=fp16", "train.precision"),
    ],
)
def test_settings_the_peer_lacks_are_refused_by_name(override: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        protocol.same_recipe(load_run_config(str(CONFIG), [override]))


def test_paper_recipe_keeps_the_old_peer() -> None:
    run = load_run_config(str(CONFIG), [])
    r = protocol.paper_recipe(run, warmup=4000, dropout=0.1, norm_first=False)
    assert (r.norm_first, r.final_norm, r.dropout, r.warmup, r.lr_scale) == (
        False,
        True,
        0.1,
        4000,
        1.0,
    )
    assert (r.average_last, r.tune_alpha, r.label_smoothing) == (0, False, 0.1)
    assert (r.max_tokens, r.vocab_size) == (2500, 8000)  # the config's batch and vocabulary
    assert "post-norm" in protocol.recipe_line(r) and "its last weights" in protocol.recipe_line(r)
    same = protocol.recipe_line(protocol.same_recipe(run))
    assert "pre-norm with final LayerNorms" in same and "averages its last 10" in same


def test_summarize_by_hand() -> None:
    s = protocol.summarize([1.0, 2.0, 4.0])
    assert s["mean"] == pytest.approx(7 / 3)
    assert (s["min"], s["max"], s["n"]) == (1.0, 4.0, 3)
    # deviations -4/3, -1/3, 5/3: (16 + 1 + 25) / 9 / 2 = 7/3
    assert s["std"] == pytest.approx(math.sqrt(7 / 3))
    assert protocol.summarize([5.0])["std"] is None
    with pytest.raises(ValueError):
        protocol.summarize([])


def test_a_difference_counts_only_beyond_the_spread() -> None:
    assert protocol.significant([30.0, 31.0], [32.0, 33.0]) is True  # 2 > range 1
    assert protocol.significant([30.0, 32.0], [31.0, 33.0]) is False  # 1 < range 2
    assert protocol.significant([30.0, 31.0], [31.0, 32.0]) is False  # 1 = range 1: not beyond
    assert protocol.significant([30.0, 30.5], [32.0, 36.0]) is False  # 3.75 < range 4
    assert protocol.significant([30.0], [40.0, 41.0]) is None  # one seed: cannot tell


def test_seeds_and_result_paths() -> None:
    assert protocol.seeds_of(1, 2) == [1, 2]
    assert protocol.seeds_of(7, 3) == [7, 8, 9]
    with pytest.raises(ValueError, match="--seeds"):
        protocol.seeds_of(1, 0)
    path = protocol.result_path(Path("r"), "en-de", "peer-same", 2)
    assert path == Path("r/en-de/peer-same/seed_2/result.json.gz")


def test_runs_with_a_result_are_skipped_seed_by_seed(tmp_path: Path) -> None:
    done = protocol.result_path(tmp_path, "en-de", "aiayn", 1)
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    left = protocol.result_path(tmp_path, "en-de", "peer-same", 1).parent
    left.mkdir(parents=True)  # a folder without a result: still to do
    assert protocol.missing_runs(tmp_path, "en-de", protocol.SYSTEMS, [1, 2]) == [
        ("peer-same", 1),
        ("peer-paper", 1),
        ("aiayn", 2),
        ("peer-same", 2),
        ("peer-paper", 2),
    ]
    assert protocol.missing_runs(tmp_path, "de-en", ("aiayn",), [1]) == [("aiayn", 1)]


def test_results_of_another_protocol_are_refused(tmp_path: Path) -> None:
    now = {"minutes": 60.0, "overrides": [], "alphas": [0.6, 1.0]}
    protocol.check_protocol(tmp_path / "a.json", json.loads(json.dumps(now)), now)
    with pytest.raises(ValueError, match=r"a\.json.*minutes: 0\.3 there, 60\.0 now"):
        protocol.check_protocol(tmp_path / "a.json", {**now, "minutes": 0.3}, now)
    with pytest.raises(ValueError, match="overrides"):
        protocol.check_protocol(tmp_path / "a.json", {**now, "overrides": ["x=1"]}, now)


def test_a_step_budget_binds_only_its_own_system(tmp_path: Path) -> None:
    made = {"minutes": None, "steps": {"aiayn": 4669, "peer-same": 3445}, "alphas": [0.6]}
    now = {**made, "steps": {"aiayn": 4669, "peer-same": 3744}}
    assert protocol.own_budget(now, "aiayn") == {**made, "steps": {"aiayn": 4669}}
    mine, theirs = protocol.own_budget(made, "aiayn"), protocol.own_budget(now, "aiayn")
    protocol.check_protocol(tmp_path / "a.json", mine, theirs)  # aiayn's result stays valid
    with pytest.raises(ValueError, match=r"steps: \{'peer-same': 3445\} there"):
        protocol.check_protocol(
            tmp_path / "p.json",
            protocol.own_budget(made, "peer-same"),
            protocol.own_budget(now, "peer-same"),
        )
    minutes = {"minutes": 60.0, "steps": None}
    assert protocol.own_budget(minutes, "aiayn") == minutes


def test_step_budgets_parse_and_bad_ones_are_named() -> None:
    assert protocol.parse_steps("4669") == dict.fromkeys(protocol.SYSTEMS, 4669)
    assert protocol.parse_steps("aiayn=4669,peer-same=3445") == {"aiayn": 4669, "peer-same": 3445}
    for text, named in [("0", "'0'"), ("aiayn=x", "'aiayn=x'"), ("peer=5", "'peer'"),
                        ("aiayn=-3", "'aiayn=-3'")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^--steps: .*{re.escape(named)}"):
            protocol.parse_steps(text)


def test_parallel_runs_all_run_at_once_and_each_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import train_multi30k

    runs = [("en-de", "aiayn", 1), ("en-de", "peer-same", 1), ("de-en", "aiayn", 1)]
    together = threading.Barrier(len(runs), timeout=10)  # breaks unless all run at the same time
    made: list[tuple[str, str, int]] = []

    def spawn(args: object, system: str, direction: str, seed: int) -> None:
        together.wait()
        made.append((direction, system, seed))

    monkeypatch.setattr(train_multi30k, "spawn", spawn)
    args = train_multi30k.parse_args(["--data-dir", str(tmp_path), "--parallel", "3"])
    train_multi30k.make_runs(args, runs)
    assert sorted(made) == sorted(runs)
    with pytest.raises(SystemExit):
        train_multi30k.parse_args(["--data-dir", str(tmp_path), "--parallel", "0"])


def test_the_decode_batch_is_part_of_the_protocol(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import train_multi30k

    base = ["--data-dir", str(tmp_path)]
    made = train_multi30k.protocol_of(train_multi30k.parse_args(base))
    assert made["decode_tokens"] is None
    made.pop("decode_tokens")  # results from before the option: each side's default batching
    now = train_multi30k.protocol_of(train_multi30k.parse_args(base))
    protocol.check_protocol(tmp_path / "a.json", made, now)
    bigger = train_multi30k.protocol_of(
        train_multi30k.parse_args([*base, "--decode-tokens", "16384"])
    )
    with pytest.raises(ValueError, match="decode_tokens: None there, 16384 now"):
        protocol.check_protocol(tmp_path / "a.json", made, bigger)
    with pytest.raises(SystemExit):
        train_multi30k.parse_args([*base, "--decode-tokens", "0"])
    assert "--decode-tokens must be >= 1, got 0" in capsys.readouterr().err


def test_a_results_store_keeps_the_results_apart_from_the_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import train_multi30k

    runs, store = tmp_path / "runs", tmp_path / "store"
    base = ["--data-dir", str(tmp_path), "--run-dir", str(runs)]
    assert train_multi30k.parse_args(base).results_store == str(runs)  # the default
    args = train_multi30k.parse_args([*base, "--results-store", str(store)])
    done = protocol.result_path(store, "en-de", "aiayn", 1)
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"protocol": train_multi30k.protocol_of(args)}))
    assert train_multi30k.runs_to_make(args, "en-de", [1]) == [
        ("en-de", "peer-same", 1),
        ("en-de", "peer-paper", 1),
    ]
    commands: list[list[str]] = []
    monkeypatch.setattr(train_multi30k.subprocess, "run", lambda cmd, check: commands.append(cmd))
    train_multi30k.spawn(args, "peer-same", "en-de", 1)
    assert (runs / "en-de" / "peer-same" / "seed_1" / "run").is_dir()  # checkpoints: run folder
    out = commands[0][commands[0].index("--out") + 1]
    assert out == str(protocol.result_path(store, "en-de", "peer-same", 1))  # result: the store
    assert not (store / "en-de" / "peer-same").exists()


@pytest.mark.parametrize("norm_first", [False, True])
def test_train_vs_torch_gives_the_peer_aiayns_layers(norm_first: bool, tmp_path: Path) -> None:
    from dataclasses import replace
    from types import SimpleNamespace

    import _peer_nmt as peer
    import train_vs_torch
    from aiayn.models.transformer import Transformer

    flags = SimpleNamespace(
        vocab_size=300, max_tokens=512, device="cpu", precision="auto", threads=1
    )
    run = train_vs_torch.run_config(flags, "tiny", tmp_path)
    run = replace(run, model=run.model.replace(norm_first=norm_first))
    layers = train_vs_torch.peer_layers(run, 300)
    assert layers.final_norm == norm_first  # a final LayerNorm per stack exactly with pre-norm
    theirs = sum(p.numel() for p in peer.TorchReference(layers).parameters())
    ours = sum(p.numel() for p in Transformer(run.model.replace(vocab_size=300)).parameters())
    assert theirs == ours
