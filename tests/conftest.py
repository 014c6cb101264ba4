"""Shared fixtures: deterministic seeds and small configs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings

from aiayn.config import TransformerConfig, preset


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def tiny_config() -> TransformerConfig:
    """A 2+2-layer model, dropout off, small vocabulary."""
    return preset("tiny", vocab_size=50, dropout=0.0, d_model=32, d_ff=64, num_heads=4)


# Hypothesis: a fixed, modest budget so the suite is quick and reproducible in CI.
settings.register_profile("aiayn", max_examples=25, deadline=None, derandomize=True)
settings.load_profile("aiayn")
