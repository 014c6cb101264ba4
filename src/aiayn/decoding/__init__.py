"""Decoding: searches written against one step function (tokens, state) -> (log-probs, state)."""

from aiayn.decoding.beam import Hypothesis, SteppedBeamSearch, beam_search, gnmt_length_penalty
from aiayn.decoding.fast_step import InferenceState, InferenceStep, inference_step
from aiayn.decoding.generate import GenerateOptions, generate, generate_ids
from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.lm import LMState, decoder_only_step
from aiayn.decoding.sampling import filter_logits, sample, sample_tokens
from aiayn.decoding.step import DecoderState, Seq2SeqState, StepFunction, encoder_decoder_step

__all__ = [
    "DecoderState",
    "GenerateOptions",
    "Hypothesis",
    "InferenceState",
    "InferenceStep",
    "LMState",
    "Seq2SeqState",
    "StepFunction",
    "SteppedBeamSearch",
    "beam_search",
    "decoder_only_step",
    "encoder_decoder_step",
    "filter_logits",
    "generate",
    "generate_ids",
    "gnmt_length_penalty",
    "greedy_search",
    "inference_step",
    "sample",
    "sample_tokens",
]
