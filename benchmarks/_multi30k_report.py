"""The report of benchmarks/train_multi30k.py, assembled from the run results there are: each
row's BLEU over seeds (mean, min–max, standard deviation), aiayn minus each peer with the spread
rule of :func:`_multi30k_protocol.significant`, sacreBLEU's paired bootstrap per seed, the
recipes, and the runs still missing.

A result (one system, one seed) is the worker's JSON: ``scores`` by row ("last, greedy", …,
"final, beam 4, α tuned on validation"), ``outputs`` (the test translations) by row, ``steps``,
``median_tgt_tokens_per_s``, ``recipe``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sacrebleu
from sacrebleu.significance import PairedTest, Result

import _multi30k_protocol as protocol

TUNED_ROW = "final, beam 4, α tuned on validation"
PAPER_PAIRS = (
    ("last, greedy", "last, greedy"),
    ("last, beam 4, α 0.6", "last, beam 4, α 0.6"),
    ("averaged, greedy", "last, greedy"),
    ("averaged, beam 4, α 0.6", "last, beam 4, α 0.6"),
    (TUNED_ROW, "last, beam 4, α 0.6"),
)
"""aiayn's rows against the paper-recipe peer's (its last weights, α 0.6), as before."""

Results = dict[str, dict[int, dict[str, Any]]]
"""system -> seed -> result."""


def row_names(runs: dict[int, dict[str, Any]]) -> list[str]:
    """The rows of a system's runs, in the order they first appear."""
    names: list[str] = []
    for result in runs.values():
        names += [n for n in result["scores"] if n not in names]
    return names


def values(runs: dict[int, dict[str, Any]], row: str, key: str = "bleu") -> list[float]:
    """``key`` of ``row`` in each seed's run that has the row, by seed."""
    return [runs[s]["scores"][row][key] for s in sorted(runs) if row in runs[s]["scores"]]


def pairs_for(results: Results, peer: str) -> list[tuple[str, str]]:
    """(aiayn row, peer row) compared: the same-recipe peer row by row, the paper peer as
    :data:`PAPER_PAIRS`; only rows that some run of each side has."""
    ours, theirs = row_names(results["aiayn"]), row_names(results[peer])
    candidates = [(r, r) for r in ours] if peer == "peer-same" else list(PAPER_PAIRS)
    return [(a, p) for a, p in candidates if a in ours and p in theirs]


def comparison(results: Results, peer: str) -> list[dict[str, Any]]:
    """aiayn minus ``peer`` per compared row: the means, their spreads, significance."""
    rows = []
    for ours, theirs in pairs_for(results, peer):
        a, p = values(results["aiayn"], ours), values(results[peer], theirs)
        rows.append(
            {
                "aiayn": ours,
                "peer": f"{peer}: {theirs}",
                "difference": protocol.summarize(a)["mean"] - protocol.summarize(p)["mean"],
                "aiayn_bleu": protocol.summarize(a),
                "peer_bleu": protocol.summarize(p),
                "significant": protocol.significant(a, p),
            }
        )
    return rows


def final_row(result: dict[str, Any], search: str) -> str:
    """The row of the final weights (averaged, else last) for ``search``."""
    averaged = f"averaged, {search}"
    return averaged if averaged in result["scores"] else f"last, {search}"


def paired_bootstrap(ours: list[str], theirs: list[str], refs: list[str]) -> dict[str, Any]:
    """sacreBLEU's paired bootstrap resampling (``--paired-bs``: 1,000 resamples, its seed
    12345), the peer as baseline: both BLEUs with their bootstrap mean and 95% half-interval,
    and the p-value of aiayn's difference."""
    test = PairedTest(
        [("peer", theirs), ("aiayn", ours)],
        {"BLEU": sacrebleu.BLEU()},
        references=[refs],
        test_type="bs",
        n_samples=1000,
    )
    _, scores = test()
    peer_result, aiayn_result = scores["BLEU"]
    assert isinstance(peer_result, Result) and isinstance(aiayn_result, Result)
    return {
        "aiayn_bleu": aiayn_result.score,
        "aiayn_mean": aiayn_result.mean,
        "aiayn_ci": aiayn_result.ci,
        "peer_bleu": peer_result.score,
        "peer_mean": peer_result.mean,
        "peer_ci": peer_result.ci,
        "p_value": aiayn_result.p_value,
    }


def bootstraps(results: Results, refs: list[str]) -> list[dict[str, Any]]:
    """Per seed that both sides ran, aiayn against each peer on test2016: final weights greedy
    against the peer's (same recipe: final greedy; paper: last greedy), and aiayn's tuned beam
    against the peer's (same recipe: tuned; paper: α 0.6)."""
    rows = []
    for peer in ("peer-same", "peer-paper"):
        for seed in sorted(set(results["aiayn"]) & set(results[peer])):
            a, p = results["aiayn"][seed], results[peer][seed]
            for ours, theirs in (
                (final_row(a, "greedy"), final_row(p, "greedy")),
                (TUNED_ROW, TUNED_ROW if TUNED_ROW in p["scores"] else "last, beam 4, α 0.6"),
            ):
                if ours in a["outputs"] and theirs in p["outputs"]:
                    test = paired_bootstrap(a["outputs"][ours], p["outputs"][theirs], refs)
                    rows.append({"seed": seed, "aiayn": ours, "peer": f"{peer}: {theirs}", **test})
    return rows


# -- Markdown ------------------------------------------------------------------------------------
def spread_text(s: dict[str, Any], digits: int = 2) -> tuple[str, str, str]:
    """(mean, "min–max", std) as text."""
    std = "–" if s["std"] is None else f"{s['std']:.{digits}f}"
    return f"{s['mean']:.{digits}f}", f"{s['min']:.{digits}f}–{s['max']:.{digits}f}", std


def score_table(results: Results) -> list[str]:
    """Per system and row: BLEU mean, min–max, std; chrF, BP and length ratio means; seeds."""
    lines = [
        "| system | checkpoint, search | BLEU mean | BLEU min–max | BLEU std | chrF | BP | "
        "hyp/ref | seeds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for system in protocol.SYSTEMS:
        runs = results[system]
        for row in row_names(runs):
            mean, span, std = spread_text(protocol.summarize(values(runs, row)))
            chrf, bp, ratio = (
                protocol.summarize(values(runs, row, key))["mean"]
                for key in ("chrf", "brevity_penalty", "length_ratio")
            )
            alphas = sorted({runs[s]["scores"][row].get("alpha") for s in runs} - {None})
            label = row + (f" (α {', '.join(f'{a:g}' for a in alphas)})" if alphas else "")
            lines.append(
                f"| {system} | {label} | {mean} | {span} | {std} | {chrf:.2f} | {bp:.3f} | "
                f"{ratio:.3f} | {len(values(runs, row))} |"
            )
    return lines


def training_table(results: Results) -> list[str]:
    """Per system: steps and median target tokens/s over the seeds (mean, min–max)."""
    lines = [
        "| system | steps, mean (min–max) | median target tokens/s, mean (min–max) | seeds |",
        "|---|---|---|---|",
    ]
    for system in protocol.SYSTEMS:
        runs = [results[system][s] for s in sorted(results[system])]
        if not runs:
            continue
        steps = protocol.summarize([float(r["steps"]) for r in runs])
        rates = [r["median_tgt_tokens_per_s"] for r in runs if r["median_tgt_tokens_per_s"]]
        rate = protocol.summarize(rates) if rates else None
        rate_text = (
            "–" if rate is None else f"{rate['mean']:,.0f} ({rate['min']:,.0f}–{rate['max']:,.0f})"
        )
        lines.append(
            f"| {system} | {steps['mean']:,.0f} ({steps['min']:,.0f}–{steps['max']:,.0f}) | "
            f"{rate_text} | {len(runs)} |"
        )
    return lines


def comparison_table(rows: list[dict[str, Any]]) -> list[str]:
    """aiayn minus a peer per row, with the larger spread and the verdict."""
    lines = [
        "| aiayn | peer | BLEU difference of means | larger min–max range | exceeds the spread |",
        "|---|---|---|---|---|",
    ]
    verdicts = {True: "yes", False: "no", None: "n/a (< 2 seeds)"}
    for c in rows:
        a, p = c["aiayn_bleu"], c["peer_bleu"]
        spread = max(a["max"] - a["min"], p["max"] - p["min"])
        lines.append(
            f"| {c['aiayn']} | {c['peer']} | {c['difference']:+.2f} | {spread:.2f} | "
            f"{verdicts[c['significant']]} |"
        )
    return lines


def bootstrap_table(rows: list[dict[str, Any]]) -> list[str]:
    """The paired bootstrap per seed."""
    lines = [
        "| seed | aiayn | peer | aiayn BLEU (bootstrap mean ± 95% CI) | "
        "peer BLEU (mean ± 95% CI) | p |",
        "|---|---|---|---|---|---|",
    ]
    for b in rows:
        lines.append(
            f"| {b['seed']} | {b['aiayn']} | {b['peer']} | {b['aiayn_bleu']:.2f} "
            f"({b['aiayn_mean']:.2f} ± {b['aiayn_ci']:.2f}) | {b['peer_bleu']:.2f} "
            f"({b['peer_mean']:.2f} ± {b['peer_ci']:.2f}) | {b['p_value']:.4f} |"
        )
    return lines


def aiayn_recipe_line(recipe: dict[str, Any]) -> str:
    """aiayn's recipe in one line, from its run config."""
    m, t = recipe["model"], recipe["train"]
    smoothing = t["label_smoothing"] if t["label_smoothing"] is not None else "0.1 (default)"
    return (
        f"{Path(recipe['config_file']).name}: {recipe['parameters']:,} parameters, model {m}, "
        f"batches of {t['max_tokens']:,} tokens, warm-up {t['warmup_steps']:,}, lr scale "
        f"{t['lr_scale']:g}, label smoothing {smoothing}, Adam {tuple(t['adam_betas'])} ε "
        f"{t['adam_eps']:g}, averages its last {t['average_last']} checkpoints over the last "
        f"{t['average_window']:.0%}, beam α tuned on validation"
    )


def recipe_lines(results: Results) -> list[str]:
    """Each system's recipe in one line (from its first run there is)."""
    lines = []
    for system in protocol.SYSTEMS:
        runs = results[system]
        if not runs:
            continue
        recipe = runs[min(runs)]["recipe"]
        if system == "aiayn":
            text = aiayn_recipe_line(recipe)
        else:
            known = {
                k: v for k, v in recipe.items() if k in protocol.PeerRecipe.__dataclass_fields__
            }
            known["adam_betas"] = tuple(known["adam_betas"])
            text = (
                f"benchmarks/_peer_nmt.py, {recipe['parameters']:,} parameters, "
                + protocol.recipe_line(protocol.PeerRecipe(**known))
                + f", {recipe['precision']}"
            )
        lines.append(f"- {system}: {text}.")
    return lines
