"""Benchmark: which of a 60-minute run's averaging checkpoints to average (§6.1), chosen on the
validation set after benchmarks/train_multi30k.py's aiayn runs, with test_2016_flickr beside it.

    python benchmarks/multi30k_averaging.py --data-dir ../shared/data/multi30k \
        --direction en-de --direction de-en

A run of the recipe keeps the checkpoints it averages: n = ``train.average_last`` of them,
evenly spaced over the last w = ``train.average_window`` of its budget B, at the points
B − k·w·B/n, k = n−1 … 0 (``checkpoints/window``; :mod:`aiayn.training.averaging`). Another
setting (n', w') whose spacing w'/n' is a whole multiple m of w/n, with (n'−1)·m < n, has its
points among them: its checkpoints are every m-th of the window's, counted back from the last
(exactly, for a time budget as for a step budget: the points are fractions of the budget). So
each ``--variants`` entry ``n'/w'`` is what a run with ``--set train.average_last=n' --set
train.average_window=w'`` would have averaged, read from the runs already made; ``1/…`` is the
last weights.

Each variant is averaged by ``aiayn average``'s rule and scored as train_multi30k.py scores the
averaged weights: greedy and beam 4 (α 0.6) on the validation set (all 1,014 sentences) and on
test_2016_flickr, and beam 4 at the α chosen on validation (``--alphas``, grown past the grid's
largest α while that one scores best as train_multi30k.py grows it, aiayn tune-alpha's rule) on
test. The choice reads validation only. A variant's difference from the recipe's own
setting counts when it exceeds the larger min–max range over the seeds (the protocol's rule);
the recipe's row must give the test scores its runs recorded (checked, and the page says so).

The runs are the aiayn runs in the result store (``--results-store``, by default
results/multi30k_runs: ``DIRECTION/aiayn/seed_N/result.json.gz``, whose recipe names the run
folder that holds the checkpoints). Writes docs/results/multi30k_averaging.md and
results/multi30k_averaging.json.gz.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _multi30k_protocol as protocol
from _common import RESULTS, command_line, machine
from _multi30k_report import spread_text
from multi30k_candidates import aiayn_runs
from train_multi30k import add_alpha_growth_flags, alpha_rule

ROWS = ("validation, greedy", "validation, beam 4, α 0.6", "test, greedy", "test, beam 4, α 0.6",
        "test, beam 4, α tuned on validation")  # fmt: skip
TUNED = "test, beam 4, α tuned on validation"
RECORDED = {"test, greedy": "averaged, greedy", "test, beam 4, α 0.6": "averaged, beam 4, α 0.6",
            TUNED: "final, beam 4, α tuned on validation"}  # fmt: skip
"""The test rows, and the protocol's names for them (its rows of the averaged weights)."""


@dataclass(frozen=True)
class Variant:
    """n checkpoints evenly spaced over the last ``window`` fraction of the budget."""

    n: int
    window: float

    @property
    def name(self) -> str:
        return f"{self.n}/{self.window:g}"


def parse_variants(text: str) -> list[Variant]:
    """``--variants``: comma-separated ``n/w`` (n ≥ 1 checkpoints over the last w, 0 < w ≤ 1).

    >>> parse_variants("1/0.03,5/0.15")
    [Variant(n=1, window=0.03), Variant(n=5, window=0.15)]
    """
    out = []
    for part in text.split(","):
        n, sep, w = part.strip().partition("/")
        try:
            variant = Variant(int(n), float(w)) if sep else None
        except ValueError:
            variant = None
        if variant is None or variant.n < 1 or not 0 < variant.window <= 1:
            raise ValueError(f"--variants: {part.strip()!r} is not n/w (n >= 1, 0 < w <= 1)")
        out.append(variant)
    return out


def parse_alphas(text: str) -> list[float]:
    """``--alphas``: the α grid tuned on validation; it holds 0.6, the protocol's fixed α.

    >>> parse_alphas("0.6,1,1.5")
    [0.6, 1.0, 1.5]
    """
    try:
        alphas = [float(a) for a in text.split(",")]
    except ValueError:
        alphas = []
    if 0.6 not in alphas or not all(0 <= a < float("inf") for a in alphas):
        raise ValueError(f"--alphas: {text!r} is not a list of finite α >= 0 that holds 0.6")
    return alphas


def picked(window: list[int], recipe: Variant, variant: Variant) -> list[int]:
    """The steps of ``window`` (the recipe's averaging checkpoints, ascending) that ``variant``
    averages: those at its :func:`~aiayn.training.averaging.averaging_points` (as fractions of
    the budget); a ValueError naming the variant when its points are not all the recipe's.

    >>> picked(list(range(1, 11)), Variant(10, 0.3), Variant(5, 0.3))   # every second
    [2, 4, 6, 8, 10]
    >>> picked(list(range(1, 11)), Variant(10, 0.3), Variant(3, 0.09))  # the last 3
    [8, 9, 10]
    """
    from aiayn.training.averaging import averaging_points

    if len(window) != recipe.n:
        raise ValueError(f"{len(window)} window checkpoints where the recipe writes {recipe.n}")
    ours = averaging_points(1.0, recipe.window, recipe.n)
    at = [[i for i, p in enumerate(ours) if abs(p - x) < 1e-9]
          for x in averaging_points(1.0, variant.window, variant.n)]  # fmt: skip
    if not all(at):
        raise ValueError(
            f"--variants {variant.name}: its checkpoints are not among the {recipe.name} "
            f"recipe's (spacing {variant.window / variant.n:g} of the budget, not a multiple of "
            f"{recipe.window / recipe.n:g} reaching back at most {recipe.window:g})"
        )
    return [window[i[0]] for i in at]


def window_steps(run_folder: Path, recipe: Variant, steps: int) -> dict[int, Path]:
    """step -> averaging checkpoint of a run folder (``checkpoints/window/step_N``), as the
    trainer lists them."""
    from aiayn.training.averaging import WINDOW_DIR, AveragingPlan, AveragingWindow

    folder = run_folder / "checkpoints" / WINDOW_DIR
    plan = AveragingPlan.of(recipe.n, recipe.window, steps)
    found = dict(AveragingWindow(folder, plan).written())
    if not found:
        raise ValueError(f"{folder}: no averaging checkpoints (was the run folder deleted?)")
    return found


def score_variant(
    args: argparse.Namespace, direction: str, paths: list[Path], val: tuple[list[str], list[str]]
) -> dict[str, dict[str, Any]]:
    """The average of ``paths`` scored on every row of :data:`ROWS`: the protocol's rows of
    averaged weights (:func:`train_multi30k.scored_rows`), and greedy search on ``val``."""
    from aiayn.checkpoint import average_checkpoints, load_checkpoint
    from aiayn.data import Tokenizer
    from aiayn.decoding.translate import DecodeOptions, translate_texts
    from train_multi30k import score, scored_rows

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = load_checkpoint(average_checkpoints(paths, Path(tmp) / "averaged"))
        tokenizer = Tokenizer.load(ckpt.tokenizer_path)

    def translate(sources: list[str], beam: int, alpha: float) -> list[str]:
        options = DecodeOptions(beam_size=beam, alpha=alpha)
        return translate_texts(ckpt.model, tokenizer, sources, options)

    found, _ = scored_rows(args, direction, {"averaged": translate}, tune=True)
    rows = {ours: found[theirs] for ours, theirs in RECORDED.items()}
    rows["validation, greedy"] = score(translate(val[0], 1, 0.6), val[1])
    rows["validation, beam 4, α 0.6"] = rows[TUNED]["validation"]["0.6"]
    return rows


def study_direction(args: argparse.Namespace, direction: str) -> dict[str, Any]:
    """Every variant of every aiayn run of ``direction``: steps averaged and scores, by seed."""
    from train_multi30k import eval_set

    runs = aiayn_runs(Path(args.results_store), direction)
    val = eval_set(args, direction, "val")
    out: dict[str, Any] = {"seeds": {}, "recorded": {}}
    for seed, result in runs.items():
        train = result["recipe"]["train"]
        recipe = Variant(int(train["average_last"]), float(train["average_window"]))
        window = window_steps(Path(result["recipe"]["run_dir"]), recipe, result["steps"])
        by_variant: dict[str, Any] = {}
        for variant in [*(v for v in args.variants if v != recipe), recipe]:
            steps = picked(list(window), recipe, variant)
            label = f"{direction} seed {seed} {variant.name}"
            print(f"{label}: steps {steps}", flush=True)
            worker = argparse.Namespace(**vars(args), worker=label)
            rows = score_variant(worker, direction, [window[s] for s in steps], val)
            by_variant[variant.name] = {"steps": steps, "of_steps": result["steps"], "rows": rows}
        out["recipe"] = recipe.name
        out["seeds"][seed] = by_variant
        recorded = {r: k for r, k in RECORDED.items() if k in result["scores"]}
        out["recorded"][seed] = {r: result["scores"][k]["bleu"] for r, k in recorded.items()}
    return out


def summary(study: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant and row: the BLEU over seeds, its difference from the recipe's row and whether
    that exceeds the spread (:func:`_multi30k_protocol.significant`)."""
    seeds = study["seeds"]
    names = list(next(iter(seeds.values())))
    out = []
    for name in names:
        for row in ROWS:
            values = [seeds[s][name]["rows"][row]["bleu"] for s in seeds]
            base = [seeds[s][study["recipe"]]["rows"][row]["bleu"] for s in seeds]
            out.append({
                "variant": name, "row": row, "bleu": protocol.summarize(values),
                "difference": statistics.fmean(values) - statistics.fmean(base),
                "significant": protocol.significant(values, base),
            })  # fmt: skip
    return out


def reproduced(study: dict[str, Any]) -> float | None:
    """The largest |BLEU| difference between the recipe's rows here and as its runs recorded
    them (None: they recorded none)."""
    return max(
        (abs(study["seeds"][seed][study["recipe"]]["rows"][row]["bleu"] - bleu)
         for seed, recorded in study["recorded"].items() for row, bleu in recorded.items()),
        default=None,
    )  # fmt: skip


def markdown(direction: str, study: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """One direction's table (``rows``: its :func:`summary`): a line per variant, a column per
    row of :data:`ROWS`."""
    seeds = study["seeds"]
    first = next(iter(seeds.values()))
    verdict = {True: " (beyond)", False: "", None: ""}
    cells: dict[str, list[str]] = {}
    for r in rows:
        mean, span, _ = spread_text(r["bleu"])
        diff = "" if r["variant"] == study["recipe"] else f", {r['difference']:+.2f}"
        cell = f"{mean} ({span}){diff}{verdict[r['significant']]}"
        cells.setdefault(r["variant"], []).append(cell)
    alphas = {n: sorted({seeds[s][n]["rows"][TUNED]["alpha"] for s in seeds}) for n in first}
    same = reproduced(study)
    check = "its runs recorded none of its rows"
    if same is not None:
        check = f"its rows here differ from those its runs recorded by at most {same:.2f} BLEU"
    lines = [
        f"## {direction}",
        "",
        f"Seeds {', '.join(map(str, seeds))}; the recipe's setting is {study['recipe']} (the "
        f"last row); {check}.",
        "",
        f"| n/w | steps averaged (seed {min(seeds)}) | {' | '.join(ROWS)} | α tuned |",
        "|---|---|" + "---|" * len(ROWS) + "---|",
    ]
    for name, row in first.items():
        steps = row["steps"]
        span = f"{steps[0]:,}–{steps[-1]:,} of {row['of_steps']:,}" if len(steps) > 1 else (
            f"{steps[0]:,}")  # fmt: skip
        alpha = ", ".join(f"{a:g}" for a in alphas[name])
        lines.append(f"| {name} | {span} | " + " | ".join(cells[name]) + f" | {alpha} |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--direction", action="append", choices=("en-de", "de-en"), required=True)
    p.add_argument("--results-store", default=str(RESULTS / "multi30k_runs"))
    p.add_argument("--variants", default="1/0.03,3/0.09,5/0.15,5/0.3,7/0.21",
                   help="n/w: n checkpoints over the last w of the budget (the recipe's own "
                        "setting is always added)")  # fmt: skip
    p.add_argument("--alphas", default="0.6,1,1.5,2", help="the α grid tuned on validation")
    add_alpha_growth_flags(p)
    p.add_argument("--test-sentences", type=int, help="only the first N sentences of each set")
    p.add_argument(
        "--name", default="multi30k_averaging", help="docs/results/NAME.md, results/NAME.json.gz"
    )
    args = p.parse_args(argv)
    try:
        args.variants = parse_variants(args.variants)
        args.alphas = parse_alphas(args.alphas)
        studies = {d: study_direction(args, d) for d in args.direction}
    except ValueError as error:
        p.error(str(error))
    write(args, studies)


def write(args: argparse.Namespace, studies: dict[str, dict[str, Any]]) -> None:
    """docs/results/NAME.md and results/NAME.json.gz."""
    from _common import write_report

    lines = [
        "# Multi30k: which checkpoints to average, read from the protocol's aiayn runs",
        "",
        f"`{command_line()}`",
        "",
        "BLEU (sacreBLEU, detokenized, cased), mean (min–max) over seeds; after a variant's mean, "
        "its difference from the recipe's setting, “(beyond)” when it exceeds the larger "
        "min–max range of the two. The choice reads the validation columns only. n/w: n "
        f"checkpoints evenly spaced over the last w of the budget. Scored on {machine()['cpu']}. "
        f"The tuned row's α: {alpha_rule(args.alphas, args.alpha_grow_by, args.alpha_grow_to)}.",
        "",
    ]
    summaries = {d: summary(s) for d, s in studies.items()}
    for direction, study in studies.items():
        lines += markdown(direction, study, summaries[direction])
    data = {"command": command_line(), "machine": machine(), "alphas": args.alphas,
            "alpha_growth": [args.alpha_grow_by, args.alpha_grow_to], "directions": studies,
            "summary": summaries}  # fmt: skip
    print(write_report(args.name, data, lines))


if __name__ == "__main__":
    main()
