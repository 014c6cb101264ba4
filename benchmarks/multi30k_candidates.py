"""Recipe candidates for configs/multi30k_small.yaml, each against the runs it changes: aiayn's
BLEU per row (mean and min–max over seeds) of each candidate's runs beside the baseline's, the
difference of the means, and whether it exceeds the spread (the larger min–max range of the two
sides, :func:`_multi30k_protocol.significant`, as benchmarks/train_multi30k.py's report); first,
the baseline alone over every seed it ran.

    python benchmarks/multi30k_candidates.py --direction en-de --baseline runs/gpu_multi30k \
        --candidate runs/cand_dropout0.3 --candidate runs/cand_window0.3 \
        --out docs/results/multi30k_candidates_en-de.md

Each run folder is a ``--run-dir`` or ``--results-store`` of benchmarks/train_multi30k.py
(``DIRECTION/aiayn/seed_N/result.json.gz``, or an older run's plain result.json); the stored
ones are under results/ (docs/quality.md). A candidate is its ``--set`` overrides beyond the
baseline's; every other part of the protocol (budget, config file, test sentences, α grid,
device, threads) must be the baseline's, or the candidate is refused by name. Seeds are matched:
a candidate is compared on the seeds both sides ran.

A candidate that changes what a step costs (the vocabulary size, the batch size) makes another
number of steps in the same minutes: given as ``--rate-candidate DIR``, it is replayed at its own
step budget (the baseline's scaled by the two recipes' measured step rates), and its table names
both budgets; a plain ``--candidate`` of another budget is refused.

The page names the machines each side trained on (CPU model, or GPU, and torch), and a
candidate's table says so when they are not the baseline's: BLEU moves with the host, so a
comparison across hosts is marked where it is read.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import _multi30k_protocol as protocol
from _common import command_line, read_json
from _multi30k_report import row_names, spread_text, values

SAME = ("minutes", "steps", "config", "config_sha256", "test_sentences", "alphas", "device",
        "threads")  # fmt: skip
"""What a candidate's protocol shares with the baseline's (its overrides differ)."""


def aiayn_runs(run_dir: Path, direction: str) -> dict[int, dict[str, Any]]:
    """seed -> aiayn's result in ``run_dir`` for ``direction``."""
    found = {}
    for folder in sorted((run_dir / direction / "aiayn").glob("seed_*")):
        path = protocol.result_in(folder)
        if path is not None:
            result = read_json(path)
            found[int(result["seed"])] = result
    if not found:
        raise ValueError(f"{run_dir}: no aiayn result for {direction}")
    return found


def changes(
    base: dict[str, Any], cand: dict[str, Any], name: str, *, own_steps: bool = False
) -> list[str]:
    """The candidate's overrides beyond the baseline's; a ValueError naming ``name`` and the
    part of the protocol that differs otherwise (``own_steps``: its step budget may differ)."""
    p, q = base["protocol"], cand["protocol"]
    same = [k for k in SAME if not (own_steps and k == "steps")]
    differ = [k for k in same if protocol.own_budget(p, "aiayn").get(k)
              != protocol.own_budget(q, "aiayn").get(k)]  # fmt: skip
    if differ:
        raise ValueError(f"{name}: not comparable with the baseline ({', '.join(differ)} differ)")
    return [o for o in q["overrides"] if o not in p["overrides"]]


def compare(
    base: dict[int, dict[str, Any]], cand: dict[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per row both sides have, on the seeds both ran: each side's BLEU summary, the difference
    of the means (candidate − baseline) and whether it exceeds the spread."""
    seeds = sorted(set(base) & set(cand))
    if not seeds:
        raise ValueError("the candidate ran none of the baseline's seeds")
    rows = []
    for row in base[seeds[0]]["scores"]:
        if not all(row in base[s]["scores"] and row in cand[s]["scores"] for s in seeds):
            continue
        b = [base[s]["scores"][row]["bleu"] for s in seeds]
        c = [cand[s]["scores"][row]["bleu"] for s in seeds]
        rows.append({
            "row": row, "seeds": seeds, "baseline": protocol.summarize(b),
            "candidate": protocol.summarize(c),
            "difference": protocol.summarize(c)["mean"] - protocol.summarize(b)["mean"],
            "significant": protocol.significant(c, b),
        })  # fmt: skip
    return rows


def table(
    name: str, overrides: list[str], rows: list[dict[str, Any]], notes: str = ""
) -> list[str]:
    """One candidate's markdown table (``notes``: its own budget or machines, where they are
    not the baseline's)."""
    verdict = {True: "yes", False: "no", None: "n/a (< 2 seeds)"}
    out = [
        f"### {name}: {' '.join(f'`{o}`' for o in overrides) or '(no overrides)'}",
        "",
        f"Seeds {', '.join(map(str, rows[0]['seeds']))}.{notes}",
        "",
        "| checkpoint, search | baseline | candidate | difference | exceeds the spread |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        b, c = spread_text(r["baseline"]), spread_text(r["candidate"])
        out.append(f"| {r['row']} | {b[0]} ({b[1]}) | {c[0]} ({c[1]}) | "
                   f"{r['difference']:+.2f} | {verdict[r['significant']]} |")  # fmt: skip
    return [*out, ""]


def baseline_table(base: dict[int, dict[str, Any]]) -> list[str]:
    """The baseline alone over every seed it ran (a candidate's table uses only the seeds both
    sides ran): per row, BLEU mean (min–max) and each seed's BLEU in seed order."""
    seeds = sorted(base)
    out = [
        f"The baseline over all its seeds ({', '.join(map(str, seeds))}):",
        "",
        "| checkpoint, search | BLEU mean (min–max) | per seed |",
        "|---|---|---|",
    ]
    for row in row_names(base):
        bleu = values(base, row)
        if len(bleu) < len(seeds):  # the per-seed column lists every seed or the row is left out
            continue
        mean, span, _ = spread_text(protocol.summarize(bleu))
        out.append(f"| {row} | {mean} ({span}) | {', '.join(f'{b:.2f}' for b in bleu)} |")
    return [*out, ""]


def report(args: argparse.Namespace) -> str:
    """The markdown page: the command, the baseline, then one table per candidate."""
    base = aiayn_runs(Path(args.baseline), args.direction)
    first = base[min(base)]
    budget = _budget(first)
    lines = [
        f"# Multi30k {args.direction}: recipe candidates for aiayn",
        "",
        f"`{command_line()}`",
        "",
        f"Baseline `{args.baseline}`: {first['protocol']['config']} with "
        f"{' '.join(f'`{o}`' for o in first['protocol']['overrides']) or 'no overrides'}, "
        f"{budget} per run, trained on {machines(base, list(base))}. BLEU on "
        "test_2016_flickr (sacreBLEU, detokenized, cased); mean (min–max) over seeds; a difference "
        "exceeds the spread when it is larger than the larger min–max range of the two sides.",
        "",
        *baseline_table(base),
    ]
    paths = [(p, False) for p in args.candidate] + [(p, True) for p in args.rate_candidate]
    for path, own_steps in paths:
        cand = aiayn_runs(Path(path), args.direction)
        overrides = changes(first, cand[min(cand)], path, own_steps=own_steps)
        rows = compare(base, cand)
        own = f" Its budget: {_budget(cand[min(cand)])} (the baseline's: {budget})."
        notes = own if own_steps else ""
        on, base_on = machines(cand, rows[0]["seeds"]), machines(base, rows[0]["seeds"])
        if on != base_on:
            notes += f" **Another host:** trained on {on}; the baseline on {base_on}."
        lines += table(Path(path).name, overrides, rows, notes)
    return "\n".join(lines)


def machines(runs: dict[int, dict[str, Any]], seeds: list[int]) -> str:
    """The machines ``seeds`` of ``runs`` trained on, each once, in seed order."""
    named = dict.fromkeys(_machine(runs[s]["machine"]) for s in sorted(seeds))
    return "; ".join(named)


def _budget(result: dict[str, Any]) -> str:
    """aiayn's budget in a result's protocol, in words."""
    steps = protocol.own_budget(result["protocol"], "aiayn").get("steps")
    return f"{steps['aiayn']:,} steps" if steps else f"{result['protocol']['minutes']:g} minutes"


def _machine(machine: dict[str, Any]) -> str:
    """The device the runs trained on, with its torch."""
    return f"{machine.get('gpu') or machine.get('cpu', '?')}, torch {machine.get('torch', '?')}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--direction", choices=("en-de", "de-en"), required=True)
    p.add_argument("--baseline", required=True, help="the run folder the candidates change")
    p.add_argument("--candidate", action="append", default=[], help="a candidate's run folder")
    p.add_argument(
        "--rate-candidate",
        action="append",
        default=[],
        help="a candidate's run folder, replayed at its own step budget (it changes a step's cost)",
    )
    p.add_argument("--out", help="write the page here (default: print it)")
    args = p.parse_args(argv)
    if not args.candidate and not args.rate_candidate:
        p.error("give at least one --candidate or --rate-candidate")
    try:
        text = report(args)
    except ValueError as error:
        p.error(str(error))
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
