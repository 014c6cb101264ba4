"""Decoding: searches written against one step function (tokens, state) -> (log-probs, state)."""

from aiayn.decoding.step import (
    DecoderState,
    Seq2SeqState,
    StepFunction,
    encoder_decoder_step,
    greedy_search,
)

__all__ = [
    "DecoderState",
    "Seq2SeqState",
    "StepFunction",
    "encoder_decoder_step",
    "greedy_search",
]
