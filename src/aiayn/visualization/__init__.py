"""Inspection tools: a step-by-step trace of self-attention (``aiayn explain``); the attention
of any checkpoint (:func:`capture_attention`) and its head view (:func:`head_view`, for
notebooks)."""

from aiayn.visualization.capture import capture_attention
from aiayn.visualization.explain import (
    DEFAULT_TOKENS,
    WEIGHT_KEYS,
    AttentionTrace,
    ExplicitWeights,
    TraceCheck,
    build_trace,
    check_trace,
    format_matrix,
    format_trace,
    library_module,
    load_weights,
    parse_weights,
    positional_table,
)
from aiayn.visualization.head_view import HeadView, head_view

__all__ = [
    "DEFAULT_TOKENS",
    "WEIGHT_KEYS",
    "AttentionTrace",
    "ExplicitWeights",
    "HeadView",
    "TraceCheck",
    "build_trace",
    "capture_attention",
    "check_trace",
    "format_matrix",
    "format_trace",
    "head_view",
    "library_module",
    "load_weights",
    "parse_weights",
    "positional_table",
]
