"""Bring the stored results of benchmarks/train_multi30k.py to its α rule without training again:
the α of the tuned row is the best on the validation set of the grid, grown past the grid's
largest α while that one scores best (``--alpha-grow-by``, ``--alpha-grow-to``).

    python benchmarks/multi30k_retune.py --data-dir ../shared/data/multi30k --direction de-en \
        --results-store results/multi30k_runs

It takes train_multi30k.py's flags, so the protocol it brings the results to is the one that
script runs. A result made before the rule (its protocol the same but for ``alpha_growth``):

- with no tuned row (the paper-recipe peer), or whose α lies inside its grid: the rule would
  have decoded nothing more; the result stays as it is and its protocol gains the rule;
- whose α is the grid's largest: its weights are read from its run folder (``--run-dir``;
  aiayn: the checkpoint the row names; the peer: ``peer_weights.pt``), the stored α's
  validation BLEU is decoded again and must be reproduced (the weights are the run's), then only
  the grown α's are decoded (the grid's scores are the stored ones). When the α changes, the
  tuned row and its test output are replaced; ``retuned`` records the α before and the command;
- whose weights are gone: named and left as it is; the exit status is 2. Such a run is made
  again: remove its result file and run train_multi30k.py.

The direction's reports are written again afterwards (as ``train_multi30k.py --report-only``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _multi30k_protocol as protocol
import train_multi30k as bench
from _common import command_line, machine, read_json

TUNED_ROW = f"final, {bench.TUNED}"
WeightsOf = Callable[[str], "bench.Translate | None"]
"""A row's checkpoint label ("averaged", "last") -> its weights as a Translate, None if gone."""


def retune(
    result: dict[str, Any],
    expected: dict[str, Any],
    weights_of: WeightsOf,
    val: tuple[list[str], list[str]],
    test: tuple[list[str], list[str]],
) -> str:
    """Bring one result (changed in place) to ``expected``'s α rule; what was done: "current",
    "inside" (nothing to decode), "same α" or "new α" (re-tuned), "no weights" (unchanged)."""
    from aiayn.evaluation.tuning import LengthScore, next_alpha, tune_alpha

    found = protocol.own_budget(result["protocol"], result["system"])
    wanted = protocol.own_budget(expected, result["system"])
    if found == wanted:
        return "current"
    named = Path(f"{result['system']} seed {result['seed']}")  # for the error's words
    if "alpha_growth" in found:  # made under another growth: not this script's to change
        protocol.check_protocol(named, found, wanted)
    protocol.check_protocol(named, {**found, "alpha_growth": wanted["alpha_growth"]}, wanted)
    by, to = wanted["alpha_growth"]
    row = result["scores"].get(TUNED_ROW)
    table = {float(a): LengthScore(**s) for a, s in (row or {}).get("validation", {}).items()}
    if row is None or next_alpha(table, by, to) is None:
        result["protocol"]["alpha_growth"] = wanted["alpha_growth"]
        return "inside"
    label, before = row["checkpoint"], row["alpha"]
    translate = weights_of(label)
    if translate is None:
        return "no weights"
    _check_reproduced(translate, val, before, table[before].bleu)
    alpha, table = tune_alpha(
        lambda a: translate(val[0], 4, a), val[1], wanted["alphas"], known=table, grow_by=by,
        grow_to=to,
    )  # fmt: skip
    kept = {k: v for k, v in row.items() if k not in ("validation", "checkpoint")}
    if alpha != before:
        result["outputs"][TUNED_ROW] = translate(test[0], 4, alpha)
        kept = {**bench.score(result["outputs"][TUNED_ROW], test[1]), "alpha": alpha}
    grown = {f"{a:g}": asdict(s) for a, s in table.items()}
    result["scores"][TUNED_ROW] = {**kept, "validation": grown, "checkpoint": label}
    result["protocol"]["alpha_growth"] = wanted["alpha_growth"]
    result["retuned"] = {"alpha_before": before, "command": command_line(), "machine": machine()}
    return "new α" if alpha != before else "same α"


def _check_reproduced(
    translate: bench.Translate, val: tuple[list[str], list[str]], alpha: float, bleu: float
) -> None:
    """The weights read back decode the validation set at the stored α to the stored BLEU (a
    ValueError otherwise: they are not the run's, and nothing is replaced)."""
    from aiayn.evaluation.tuning import length_score

    again = length_score(translate(val[0], 4, alpha), val[1]).bleu
    if abs(again - bleu) > 1e-9:
        raise ValueError(
            f"the saved weights give validation BLEU {again:.4f} at α {alpha:g} where the run "
            f"recorded {bleu:.4f}: they are not the run's weights"
        )


def weights_of(
    args: Any, direction: str, system: str, seed: int, device: torch.device
) -> WeightsOf:
    """A run's weights by label from its run folder (``--run-dir``): aiayn's checkpoints
    ("averaged"; "last": the last step's), the peer's ``peer_weights.pt``."""
    import _peer_nmt as peer

    work = bench.work_path(args, direction, system, seed)

    def of(label: str) -> bench.Translate | None:
        if system == "aiayn":
            path = _aiayn_checkpoint(work / "checkpoints", label)
            return None if path is None else bench.aiayn_translate(args, path, device)[0]
        if not (work / peer.WEIGHTS_FILE).is_file():
            return None
        model, tokenizer = peer.load_weights(work, label, device)
        return bench.peer_translate(peer, model, tokenizer, device, args.decode_tokens)

    return of


def _aiayn_checkpoint(folder: Path, label: str) -> Path | None:
    """``checkpoints/averaged``, or for "last" the newest ``step_*`` checkpoint; None if gone."""
    if label == "averaged":
        path: Path | None = folder / "averaged"
    else:
        steps = sorted(folder.glob("step_*")) if folder.is_dir() else []
        path = steps[-1] if steps else None
    return path if path is not None and path.is_dir() else None


def main(argv: list[str] | None = None) -> int:
    """Each direction asked: its results brought to the rule, then its reports written again
    (when none is left behind). 2 when a result's weights are gone."""
    from aiayn.performance import configure_device
    from aiayn.training.trainer import resolve_device

    args = bench.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    seeds = bench.seeds_of(args)
    device = resolve_device(args.device)
    configure_device(device)  # as the runs' own processes decoded (TF32 on CUDA)
    gone: list[Path] = []
    for direction in bench.DIRECTIONS if args.direction == "both" else (args.direction,):
        left = retune_direction(args, direction, seeds, device)
        gone += left
        if not left:
            bench.report_direction(args, direction, seeds)
    for path in gone:
        print(f"{path}: its α is the grid's largest and its weights are gone: make the run again "
              "(remove the file, then run train_multi30k.py)", file=sys.stderr)  # fmt: skip
    return 2 if gone else 0


def retune_direction(
    args: Any, direction: str, seeds: list[int], device: torch.device
) -> list[Path]:
    """Each stored result of ``direction`` brought to the rule and rewritten when it changed;
    the result files whose weights are gone."""
    expected = bench.protocol_of(args)
    val, test = (bench.eval_set(args, direction, s) for s in ("val", "test_2016_flickr"))
    gone = []
    for system in protocol.SYSTEMS:
        for seed in seeds:
            path = protocol.stored_result(Path(args.results_store), direction, system, seed)
            if path is None:
                continue
            result = read_json(path)
            of = weights_of(args, direction, system, seed, device)
            done = retune(result, expected, of, val, test)
            print(f"{path}: {done}", flush=True)
            if done == "no weights":
                gone.append(path)
            elif done != "current":
                out = protocol.result_path(Path(args.results_store), direction, system, seed)
                bench.write_result(out, result)
                if path != out:  # a plain result.json of an older run: now gzipped
                    path.unlink()
    return gone


if __name__ == "__main__":
    raise SystemExit(main())
