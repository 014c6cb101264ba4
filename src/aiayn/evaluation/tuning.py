"""Tuning the length penalty α of beam search on a validation set (never on a test set).

Beam search ranks finished hypotheses by log P(Y | X) / lp(|Y|) (GNMT's lp, Wu et al. 2016,
eq. 14; see :mod:`aiayn.decoding.beam`). log P only falls as Y grows, so with a small α the
beam prefers short outputs; how large α must be depends on the model (the paper tuned α = 0.6
for its WMT models on the development set, §6.1). :func:`tune_alpha` decodes the validation set
at each α of a grid and keeps the one with the highest BLEU (:func:`choose_alpha`), the grid
grown past its largest α while that α scores best if asked (:func:`next_alpha`); the result
is saved beside the model (``tuned_alpha.json`` in the checkpoint folder) and read back by
``--alpha auto`` (:func:`read_tuned_alpha`). docs/quality.md has the measurements behind it.

Length figures are sacreBLEU's: ``ratio`` = hypothesis / reference length in 13a tokens, and
the brevity penalty BP = exp(1 − 1/ratio) when ratio < 1, else 1.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import sacrebleu

from aiayn.checkpoint.checksums import add_checksum, read_checksums
from aiayn.checkpoint.files import ADDED_FILES, read_small
from aiayn.errors import UserError
from aiayn.limits import MAX_BEAM_SIZE, MAX_CHECKPOINT_JSON_BYTES
from aiayn.validation import NonNegativeFloat, PenaltyAlpha, check_value

TUNED_ALPHA_FILE = ADDED_FILES[0]
"""The file in a checkpoint folder that ``aiayn tune-alpha`` writes and ``--alpha auto`` reads
(listed in the checkpoint's ``SHA256SUMS`` once written)."""

DEFAULT_ALPHAS = (0.0, 0.3, 0.6, 0.9, 1.2, 1.5, 2.0)
"""The grid ``aiayn tune-alpha`` searches by default."""


@dataclass(frozen=True)
class LengthScore:
    """Corpus BLEU with its length figures (sacreBLEU, detokenized, cased, 13a).

    Attributes:
        bleu: the BLEU score.
        bp: the brevity penalty.
        ratio: hypothesis length / reference length (13a tokens).
        hyp_len, ref_len: the two lengths.
    """

    bleu: float
    bp: float
    ratio: float
    hyp_len: int
    ref_len: int


def length_score(hypotheses: Sequence[str], references: Sequence[str]) -> LengthScore:
    """BLEU, brevity penalty and length ratio of ``hypotheses`` against ``references``."""
    if len(hypotheses) != len(references) or not references:
        raise UserError(
            f"{len(hypotheses)} hypotheses and {len(references)} references: they must align "
            "and not be empty"
        )
    result = sacrebleu.BLEU().corpus_score(list(hypotheses), [list(references)])
    ratio = result.sys_len / result.ref_len if result.ref_len else math.nan
    return LengthScore(float(result.score), float(result.bp), ratio, result.sys_len, result.ref_len)


def choose_alpha(scores: Mapping[float, LengthScore]) -> float:
    """The α of the highest BLEU; among equal BLEU, the length ratio closest to 1 (in log),
    then the smallest α.

    >>> s = lambda bleu, ratio: LengthScore(bleu, 1.0, ratio, 0, 0)
    >>> choose_alpha({0.6: s(33.4, 0.94), 1.0: s(33.8, 0.96), 1.5: s(33.8, 0.99)})
    1.5
    """
    if not scores:
        raise ValueError("no α was scored")
    return min(scores, key=lambda a: (-scores[a].bleu, _length_distance(scores[a].ratio), a))


def _length_distance(ratio: float) -> float:
    """|log ratio|; infinite for empty output (ratio 0) or no ratio at all.

    >>> _length_distance(1.0), _length_distance(0.0)
    (0.0, inf)
    """
    return abs(math.log(ratio)) if ratio > 0 and math.isfinite(ratio) else math.inf


@dataclass(frozen=True)
class TunedAlpha:
    """The outcome of :func:`tune_alpha`, as saved in ``tuned_alpha.json``.

    Attributes:
        alpha: the chosen α.
        beam_size: the beam it was tuned with.
        length_penalty: the beam's rules ("gnmt" or "hf").
        source, reference: the validation files (or sacreBLEU/split names) it was tuned on.
        sentences: how many sentences.
        scores: per α of the grid, its :class:`LengthScore` as a dict.
    """

    alpha: float
    beam_size: int
    length_penalty: str
    source: str
    reference: str
    sentences: int
    scores: dict[str, dict[str, float]]

    def save(self, folder: Path, *, force: bool = False) -> Path:
        """Write ``folder/tuned_alpha.json`` (an existing one only with ``force``)."""
        path = folder / TUNED_ALPHA_FILE
        if path.exists() and not force:
            raise UserError(f"{path} exists: pass --force to replace it")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        add_checksum(folder, TUNED_ALPHA_FILE)
        return path


def read_tuned_alpha(folder: Path) -> TunedAlpha:
    """The :class:`TunedAlpha` saved in a checkpoint folder, or a :class:`UserError` saying how
    to make one."""
    path = folder / TUNED_ALPHA_FILE
    if not path.is_file():
        raise UserError(
            f"--alpha auto: {folder} has no {TUNED_ALPHA_FILE}; tune α on the validation set "
            f"first: aiayn tune-alpha --checkpoint {folder}"
        )
    data = read_small(path, MAX_CHECKPOINT_JSON_BYTES)  # a regular file in the folder
    expected = (read_checksums(folder) or {}).get(TUNED_ALPHA_FILE)
    if expected is not None and hashlib.sha256(data).hexdigest() != expected:  # what is parsed
        raise UserError(f"{path}: corrupt: its SHA-256 differs from the one recorded in SHA256SUMS")
    try:
        values = json.loads(data.decode("utf-8"))
        tuned = TunedAlpha(**values)
    except (ValueError, TypeError) as error:
        raise UserError(f"{path} is not a tune-alpha result ({error})") from None
    _check_tuned(path, tuned)
    return tuned


def _check_tuned(path: Path, tuned: TunedAlpha) -> None:
    """The fields ``--alpha auto`` uses: α a finite number >= 0, the beam an integer within
    :data:`~aiayn.limits.MAX_BEAM_SIZE`, the rules a name."""
    alpha, beam = tuned.alpha, tuned.beam_size
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha < math.inf:
        raise UserError(f"{path}: alpha must be a number >= 0, got {alpha!r}")
    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM_SIZE:
        raise UserError(
            f"{path}: beam_size must be an integer in [1, {MAX_BEAM_SIZE}] "
            f"(aiayn.limits.MAX_BEAM_SIZE), got {str(beam)[:40]}"
        )
    if tuned.length_penalty not in ("gnmt", "hf"):
        raise UserError(
            f"{path}: length_penalty must be 'gnmt' or 'hf', got {tuned.length_penalty!r}"
        )


Decode = Callable[[float], list[str]]
"""α -> the detokenized best hypotheses of the validation sources with that α."""


def tune_alpha(
    decode: Decode,
    references: Sequence[str],
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    *,
    report: Callable[[float, LengthScore], None] | None = None,
    known: Mapping[float, LengthScore] | None = None,
    grow_by: float = 0.0,
    grow_to: float = 0.0,
) -> tuple[float, dict[float, LengthScore]]:
    """Decode at each α of ``alphas`` (``decode``), score against ``references`` and return
    (:func:`choose_alpha`'s α, every α's score, by α); ``report`` sees each score as it comes.

    ``known``: scores measured before (a saved table), not decoded again. With ``grow_by`` > 0
    the grid grows past its largest α while that α scores best (:func:`next_alpha`), by
    ``grow_by`` at a time up to ``grow_to``: a best α at the grid's edge says only that BLEU may
    still rise beyond it."""
    _check_grid(alphas, grow_by, grow_to)
    scores: dict[float, LengthScore] = dict(known or {})

    def measure(alpha: float) -> None:
        if alpha not in scores:
            scores[alpha] = length_score(decode(alpha), references)
            if report is not None:
                report(alpha, scores[alpha])

    for alpha in sorted(set(alphas)):
        measure(alpha)
    while (more := next_alpha(scores, grow_by, grow_to)) is not None:
        measure(more)
    return choose_alpha(scores), dict(sorted(scores.items()))


def next_alpha(scores: Mapping[float, LengthScore], grow_by: float, grow_to: float) -> float | None:
    """The α to decode next when the best α of ``scores`` (:func:`choose_alpha`) is also the
    largest: the largest + ``grow_by``, if that is at most ``grow_to``; otherwise None (and
    always None for ``grow_by`` 0: the grid as given).

    >>> s = lambda bleu: LengthScore(bleu, 1.0, 1.0, 0, 0)
    >>> next_alpha({1.0: s(30.0), 2.0: s(31.0)}, 0.5, 4.0)  # the best is the edge: beyond it
    2.5
    >>> print(next_alpha({1.0: s(30.0), 2.0: s(29.0)}, 0.5, 4.0))  # the best is inside
    None
    >>> print(next_alpha({3.5: s(30.0), 4.0: s(31.0)}, 0.5, 4.0))  # the edge is the bound
    None
    """
    if grow_by <= 0 or not scores:
        return None
    largest = max(scores)
    more = round(largest + grow_by, 9)  # 2.0 + 0.5 is 2.5, not 2.5000000001
    if choose_alpha(scores) != largest or more > grow_to + 1e-9:
        return None
    return more


def _check_grid(alphas: Sequence[float], grow_by: float, grow_to: float) -> None:
    """A UserError naming the bad value: α and ``grow_to`` follow the rule of
    :class:`~aiayn.decoding.translate.DecodeOptions`'s α (a finite number in 0 ..
    :data:`~aiayn.limits.MAX_LENGTH_PENALTY_ALPHA`), ``grow_by`` is a finite number >= 0."""
    if not alphas:
        raise UserError("the α grid must hold at least one α, got none")
    for alpha in alphas:
        check_value(alpha, PenaltyAlpha, "each α of the grid")
    check_value(grow_by, NonNegativeFloat, "grow_by")
    check_value(grow_to, PenaltyAlpha, "grow_to")


def tuned_record(
    alpha: float,
    scores: Mapping[float, LengthScore],
    *,
    beam_size: int,
    length_penalty: str,
    source: str,
    reference: str,
    sentences: int,
) -> TunedAlpha:
    """The :class:`TunedAlpha` to save for a :func:`tune_alpha` outcome."""
    table = {f"{a:g}": asdict(s) for a, s in sorted(scores.items())}
    return TunedAlpha(alpha, beam_size, length_penalty, source, reference, sentences, table)
