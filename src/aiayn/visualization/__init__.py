"""Inspection tools: a step-by-step trace of self-attention (``aiayn explain``)."""

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

__all__ = [
    "DEFAULT_TOKENS",
    "WEIGHT_KEYS",
    "AttentionTrace",
    "ExplicitWeights",
    "TraceCheck",
    "build_trace",
    "check_trace",
    "format_matrix",
    "format_trace",
    "library_module",
    "load_weights",
    "parse_weights",
    "positional_table",
]
