"""The decoding side of a Hugging Face encoder–decoder checkpoint (Marian, T5): its special ids
and the generation settings of ``generation_config.json`` (or, in older folders, ``config.json``)
that aiayn's searches apply: beams, Hugging Face's length normalisation α and stopping rule, the
longest output, banned tokens, a forced EOS at the last position, renormalised log-probs.

Settings aiayn's searches do not apply (n-gram blocking, repetition penalties, group beams,
sampling) are listed by :func:`unapplied_settings`, for the converter to warn about.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiayn.errors import UserError


def is_token_id(value: object, vocab: int) -> bool:
    """Whether ``value`` is an int id of a vocabulary of ``vocab`` tokens (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab


@dataclass(frozen=True)
class Seq2SeqSpecials:
    """The special ids and generation defaults of an encoder–decoder checkpoint: what decoding
    needs besides the model (Marian; meant for T5 too).

    Attributes:
        decoder_start_id: the decoder's first input (Marian: the pad id).
        eos_id: the end-of-sequence id.
        pad_id: the padding id.
        banned_ids: single tokens never generated (Hugging Face ``bad_words_ids`` of one token;
            OPUS-MT bans its pad id).
        forced_eos: EOS is forced at the last position ``max_length`` allows
            (``forced_eos_token_id`` equal to the EOS id).
        num_beams: beam size, when the checkpoint sets one.
        max_length: longest output in tokens, decoder start included (Hugging Face's count),
            when set.
        length_penalty: Hugging Face's exponent α of the length normalisation (score /
            length^α), when set.
        early_stopping: Hugging Face's beam stopping rule (True, False or "never"), when set.
        renormalize_logits: log-softmax again after the banned ids are removed, when set.
    """

    decoder_start_id: int
    eos_id: int
    pad_id: int
    banned_ids: tuple[int, ...] = ()
    forced_eos: bool = False
    num_beams: int | None = None
    max_length: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None
    renormalize_logits: bool | None = None


def _banned(bad_words: object, vocab: int) -> tuple[int, ...]:
    if bad_words is None:
        return ()
    if not isinstance(bad_words, list) or not all(isinstance(w, list) for w in bad_words):
        raise UserError(f"bad_words_ids={bad_words!r} is not a list of token-id lists")
    banned: list[int] = []
    for words in bad_words:
        if len(words) != 1 or not is_token_id(words[0], vocab):
            raise UserError(
                f"bad_words_ids entry {words!r} is not supported: only single tokens of the "
                f"target vocabulary (size {vocab}) can be banned"
            )
        if words[0] not in banned:
            banned.append(words[0])
    return tuple(banned)


def _positive_int(value: object, key: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{key}={value!r} is not a positive integer")
    return value


def _number(value: object, key: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise UserError(f"{key}={value!r} is not a finite number")
    return float(value)


def _flag(value: object, key: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise UserError(f"{key}={value!r} is not true or false")


def _early_stopping(value: object) -> bool | str | None:
    if value is None or isinstance(value, bool):
        return value
    if value == "never":
        return "never"
    raise UserError(f"early_stopping={value!r} is not true, false or 'never'")


def generation_defaults(
    hf_config: Mapping[str, Any],
    generation_config: Mapping[str, Any] | None,
    *,
    target_vocab: int,
    id_defaults: Mapping[str, Any],
) -> Seq2SeqSpecials:
    """The special ids and generation settings of an encoder–decoder checkpoint: each key from
    ``generation_config`` (``generation_config.json``) when it has it, else from ``config.json``,
    else ``id_defaults`` (the family's config class defaults for the ids) or unset (settings).

    Raises:
        UserError: naming an id outside the target vocabulary, several EOS ids, a forced EOS
            other than the EOS id, or a banned sequence of several tokens.
    """
    generation = dict(generation_config or {})

    def setting(key: str) -> Any:
        if key in generation:
            return generation[key]
        return hf_config.get(key, id_defaults.get(key))

    def token(key: str) -> int:
        value = setting(key)
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not is_token_id(value, target_vocab):
            raise UserError(
                f"{key}={value!r} is not one id of the target vocabulary (size {target_vocab})"
            )
        return int(value)

    eos = token("eos_token_id")
    forced = setting("forced_eos_token_id")
    if forced is not None and token("forced_eos_token_id") != eos:
        raise UserError(
            f"forced_eos_token_id={forced!r} differs from eos_token_id={eos}: only EOS can be "
            "forced at the last position"
        )
    return Seq2SeqSpecials(
        decoder_start_id=token("decoder_start_token_id"),
        eos_id=eos,
        pad_id=token("pad_token_id"),
        banned_ids=_banned(setting("bad_words_ids"), target_vocab),
        forced_eos=forced is not None,
        num_beams=_positive_int(setting("num_beams"), "num_beams"),
        max_length=_positive_int(setting("max_length"), "max_length"),
        length_penalty=_number(setting("length_penalty"), "length_penalty"),
        early_stopping=_early_stopping(setting("early_stopping")),
        renormalize_logits=_flag(setting("renormalize_logits"), "renormalize_logits"),
    )


UNAPPLIED: dict[str, object] = {
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "do_sample": False,
    "forced_bos_token_id": None,
    "exponential_decay_length_penalty": None,
}
"""Generation settings aiayn's searches do not apply, with the value that changes nothing."""


def unapplied_settings(
    hf_config: Mapping[str, Any], generation_config: Mapping[str, Any] | None
) -> list[str]:
    """``key=value`` of each setting of :data:`UNAPPLIED` the checkpoint sets to something else
    (outputs may then differ from Hugging Face ``generate``)."""
    settings = {**hf_config, **(generation_config or {})}
    return [
        f"{key}={settings[key]!r}"
        for key, neutral in UNAPPLIED.items()
        if settings.get(key, neutral) not in (neutral, None)
    ]
