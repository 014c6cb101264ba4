"""The protocol of benchmarks/train_multi30k.py, as pure functions: the peer's recipes read from
aiayn's run config, the seeds' spread and when a difference exceeds it, and the result files that
let the long experiment be spread over several sessions.

- :func:`same_recipe`: the peer gets aiayn's recipe, field by field, from the same
  :class:`~aiayn.training.config.RunConfig` (configs/multi30k_small.yaml plus the same
  ``--set`` overrides); a setting the peer does not implement is refused by name.
- :func:`peer_config`: the peer's layers, aiayn's sizes given a recipe.
- :func:`paper_recipe`: the paper's recipe for 100k-step runs (post-norm, warm-up 4,000, dropout
  0.1, ε_ls 0.1, its last weights, beam α 0.6), the second row.
- :func:`summarize`, :func:`significant`: mean, min–max and standard deviation over seeds; a
  difference of means counts only when it is larger than the larger min–max range of the two.
- :func:`result_path`, :func:`missing_runs`, :func:`check_protocol`: one gzipped JSON per
  (system, seed, direction), skipped when present; results of another protocol are never mixed
  in.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSTEMS = ("aiayn", "peer-same", "peer-paper")
"""aiayn; the peer with aiayn's recipe (the primary comparison); the peer with the paper's."""

PEER_ACTIVATIONS = ("relu", "gelu")  # what nn.Transformer's layers take by name


@dataclass(frozen=True)
class PeerRecipe:
    """Everything the peer is trained and decoded with besides the layer sizes.

    Attributes:
        name: "same" (aiayn's recipe) or "paper".
        norm_first: pre-norm (True) or post-norm.
        final_norm: a LayerNorm at the end of each stack (aiayn: exactly with pre-norm).
        dropout, attention_dropout, activation, layer_norm_eps: the layers'.
        share_embeddings, tie_output: §3.4 (one embedding for both sides; output tied to it).
        vocab_size, min_frequency: the joint BPE learnt.
        max_tokens: batch budget in tokens per side.
        warmup, lr_scale: eq. (3), times ``lr_scale``.
        label_smoothing, adam_betas, adam_eps, weight_decay, clip_norm: the optimisation.
        average_last, average_window: §6.1 averaging over the end of the budget (< 2: none).
        tune_alpha: beam α chosen on the validation set (else α 0.6 only).
    """

    name: str
    norm_first: bool
    final_norm: bool
    dropout: float
    attention_dropout: float
    activation: str
    layer_norm_eps: float
    share_embeddings: bool
    tie_output: bool
    vocab_size: int
    min_frequency: int
    max_tokens: int
    warmup: int
    lr_scale: float
    label_smoothing: float
    adam_betas: tuple[float, float]
    adam_eps: float
    weight_decay: float
    clip_norm: float | None
    average_last: int
    average_window: float
    tune_alpha: bool


def _refuse_unsupported(run: Any) -> None:
    """A setting of aiayn's config the peer does not implement: a ValueError naming it."""
    m, d, t = run.model, run.data, run.train
    unsupported = {
        "model.positional": (m.positional, "sinusoidal"),
        "model.output_bias": (m.output_bias, False),
        "model.tgt_vocab_size": (m.tgt_vocab_size, None),
        "data.lowercase": (d.lowercase, False),
        "train.accum_steps": (t.accum_steps, 1),
        "train.max_epochs": (t.max_epochs, None),
    }
    for key, (value, supported) in unsupported.items():
        if value != supported:
            raise ValueError(f"the peer supports only {key}={supported!r}, got {value!r}")
    if m.activation not in PEER_ACTIVATIONS:
        raise ValueError(
            f"the peer supports model.activation {PEER_ACTIVATIONS}, not {m.activation}"
        )
    if t.precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"the peer supports train.precision auto, fp32, bf16, not {t.precision}")


def same_recipe(run: Any, translation_label_smoothing: float = 0.1) -> PeerRecipe:
    """aiayn's recipe for the peer, read from aiayn's run config ``run`` (a RunConfig):
    train.label_smoothing None is the translation task's default,
    ``translation_label_smoothing``."""
    _refuse_unsupported(run)
    m, d, t = run.model, run.data, run.train
    smoothing = translation_label_smoothing if t.label_smoothing is None else t.label_smoothing
    return PeerRecipe(
        name="same",
        norm_first=m.norm_first,
        final_norm=m.norm_first,  # aiayn's pre-norm stacks end with a LayerNorm, post-norm not
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation=m.activation,
        layer_norm_eps=m.layer_norm_eps,
        share_embeddings=m.share_embeddings,
        tie_output=m.tie_output,
        vocab_size=d.vocab_size,
        min_frequency=d.min_frequency,
        max_tokens=t.max_tokens,
        warmup=t.warmup_steps,
        lr_scale=t.lr_scale,
        label_smoothing=smoothing,
        adam_betas=tuple(t.adam_betas),
        adam_eps=t.adam_eps,
        weight_decay=t.weight_decay,
        clip_norm=t.clip_norm,
        average_last=t.average_last,
        average_window=t.average_window,
        tune_alpha=True,
    )


def paper_recipe(run: Any, *, warmup: int, dropout: float, norm_first: bool) -> PeerRecipe:
    """The paper's recipe (§5.3–5.4: Adam (0.9, 0.98, 1e-9), eq. (3) at scale 1, ε_ls 0.1; its
    last weights; beam α 0.6) with the warm-up, dropout and norm placement given (the
    ``--peer-*`` flags); sizes, vocabulary and batch budget from aiayn's config. Its stacks keep
    ``nn.Transformer``'s final LayerNorms, as the peer always had."""
    d, t = run.data, run.train
    return PeerRecipe(
        name="paper",
        norm_first=norm_first,
        final_norm=True,
        dropout=dropout,
        attention_dropout=0.0,
        activation="relu",
        layer_norm_eps=1e-5,
        share_embeddings=True,
        tie_output=True,
        vocab_size=d.vocab_size,
        min_frequency=d.min_frequency,
        max_tokens=t.max_tokens,
        warmup=warmup,
        lr_scale=1.0,
        label_smoothing=0.1,
        adam_betas=(0.9, 0.98),
        adam_eps=1e-9,
        weight_decay=0.0,
        clip_norm=None,
        average_last=0,
        average_window=0.1,
        tune_alpha=False,
    )


def recipe_line(r: PeerRecipe) -> str:
    """The recipe in one line."""
    norm = ("pre" if r.norm_first else "post") + "-norm"
    norm += " with final LayerNorms" if r.final_norm else " without final LayerNorms"
    embeddings = ("shared" if r.share_embeddings else "separate") + " embeddings"
    embeddings += ", output tied" if r.tie_output else ", output untied"
    averaging = (
        f"averages its last {r.average_last} snapshots over the last {r.average_window:.0%}"
        if r.average_last >= 2
        else "its last weights"
    )
    alpha = "beam α tuned on validation" if r.tune_alpha else "beam α 0.6"
    return (
        f"{norm}, dropout {r.dropout:g}, {r.activation}, {embeddings}, joint BPE of "
        f"{r.vocab_size:,}, batches of {r.max_tokens:,} tokens, warm-up {r.warmup:,}, "
        f"lr scale {r.lr_scale:g}, label smoothing {r.label_smoothing:g}, Adam "
        f"{tuple(r.adam_betas)} ε {r.adam_eps:g}, weight decay {r.weight_decay:g}, clip "
        f"{r.clip_norm}, {averaging}, {alpha}"
    )


def peer_config(run: Any, recipe: PeerRecipe, vocab_size: int) -> Any:
    """The peer's layers (a ``_peer_nmt.PeerConfig``): aiayn's sizes from ``run``, the
    recipe's norm placement, dropout and embeddings."""
    import _peer_nmt as peer

    m = run.model
    return peer.PeerConfig(
        vocab_size=vocab_size,
        d_model=m.d_model,
        num_heads=m.num_heads,
        num_encoder_layers=m.num_encoder_layers,
        num_decoder_layers=m.num_decoder_layers,
        d_ff=m.d_ff,
        dropout=recipe.dropout,
        attention_dropout=recipe.attention_dropout,
        norm_first=recipe.norm_first,
        final_norm=recipe.final_norm,
        activation=recipe.activation,
        layer_norm_eps=recipe.layer_norm_eps,
        share_embeddings=recipe.share_embeddings,
        tie_output=recipe.tie_output,
    )


# -- seeds: the spread and what exceeds it -------------------------------------------------------
def summarize(values: list[float]) -> dict[str, Any]:
    """Mean, min, max, sample standard deviation (n−1; None for one value) and n."""
    if not values:
        raise ValueError("no values to summarize")
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
        "n": len(values),
    }


def significant(ours: list[float], theirs: list[float]) -> bool | None:
    """Whether the difference of the means exceeds the spread: |mean(ours) − mean(theirs)| is
    larger than the larger min–max range of the two sides. None (cannot tell) when a side has
    fewer than 2 values."""
    if len(ours) < 2 or len(theirs) < 2:
        return None
    spread = max(max(ours) - min(ours), max(theirs) - min(theirs))
    return abs(statistics.fmean(ours) - statistics.fmean(theirs)) > spread


# -- the result files ----------------------------------------------------------------------------
def parse_steps(text: str) -> dict[str, int]:
    """``--steps``: a budget in optimizer steps instead of minutes, ``N`` for every system or
    ``SYSTEM=N,…`` for each (a system left out keeps none: it cannot run). ValueError names a
    bad part."""
    if "=" not in text:
        return dict.fromkeys(SYSTEMS, _positive(text, text))
    steps: dict[str, int] = {}
    for part in text.split(","):
        system, _, value = part.partition("=")
        if system not in SYSTEMS:
            raise ValueError(f"--steps: unknown system {system!r} in {part!r} (of {SYSTEMS})")
        steps[system] = _positive(value, part)
    return steps


def _positive(value: str, part: str) -> int:
    if not value.isdigit() or int(value) == 0:
        raise ValueError(f"--steps: {part!r} is not a positive whole number of steps")
    return int(value)


def seeds_of(base: int, count: int) -> list[int]:
    """The seeds of ``count`` runs: ``base``, ``base + 1``, …"""
    if count < 1:
        raise ValueError(f"--seeds must be >= 1, got {count}")
    return [base + k for k in range(count)]


RESULT_FILE = "result.json.gz"
"""One run's result, gzipped JSON, in its seed's folder."""
PLAIN_RESULT_FILE = "result.json"
"""A result written before results were gzipped: still read, never written."""


def result_path(root: Path, direction: str, system: str, seed: int) -> Path:
    """``root/DIRECTION/SYSTEM/seed_N/result.json.gz``: where one run's result is written."""
    return root / direction / system / f"seed_{seed}" / RESULT_FILE


def result_in(folder: Path) -> Path | None:
    """The result file in a seed's ``folder``: result.json.gz, else a plain result.json written
    before results were gzipped; None when neither is there."""
    for name in (RESULT_FILE, PLAIN_RESULT_FILE):
        if (folder / name).is_file():
            return folder / name
    return None


def stored_result(root: Path, direction: str, system: str, seed: int) -> Path | None:
    """One run's result file in ``root`` (:func:`result_in`), or None."""
    return result_in(result_path(root, direction, system, seed).parent)


def missing_runs(
    root: Path, direction: str, systems: tuple[str, ...], seeds: list[int]
) -> list[tuple[str, int]]:
    """(system, seed) of the runs whose result file is not there yet, seed by seed (each seed's
    systems one after the other, so that slow drift of the machine meets every system)."""
    return [
        (system, seed)
        for seed in seeds
        for system in systems
        if stored_result(root, direction, system, seed) is None
    ]


def own_budget(protocol_: dict[str, Any], system: str) -> dict[str, Any]:
    """The protocol as one system's result depends on it: of a step budget per system, only its
    own count (a peer's new count leaves aiayn's results valid, and the other way round)."""
    steps = protocol_.get("steps")
    if not steps:
        return protocol_
    return {**protocol_, "steps": {system: steps.get(system)}}


def check_protocol(path: Path, found: dict[str, Any], expected: dict[str, Any]) -> None:
    """A result made under another protocol (budget, config, overrides, test sentences, α grid,
    …) is a ValueError naming the file and the keys that differ: results are never mixed."""
    keys = sorted(set(found) | set(expected))
    differ = [k for k in keys if found.get(k) != expected.get(k)]
    if differ:
        details = ", ".join(f"{k}: {found.get(k)!r} there, {expected.get(k)!r} now" for k in differ)
        raise ValueError(
            f"{path} was made under another protocol ({details});"
            " use another --run-dir or --results-store"
        )
