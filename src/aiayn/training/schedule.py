"""The learning-rate schedule of §5.3, eq. (3):

    lrate = scale · d_model^−0.5 · min(step^−0.5, step · warmup_steps^−1.5)

Linear warm-up for ``warmup_steps`` steps, then decay with the inverse square root of the step.
The peak, reached at step = warmup_steps, is scale · (d_model · warmup_steps)^−0.5. ``scale`` = 1
is the paper; small models on small data usually want a larger scale (a higher peak).
"""

from __future__ import annotations


def transformer_lr(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Learning rate at optimizer step ``step`` (1-based) by eq. (3)."""
    if step < 1:
        raise ValueError(f"step must be >= 1 (the schedule is 1-based), got {step}")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
