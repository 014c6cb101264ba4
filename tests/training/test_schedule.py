"""The eq. (3) schedule: hand-checked numbers."""

from __future__ import annotations

import pytest

from aiayn.training import transformer_lr


def test_schedule_hand_values() -> None:
    # base: d_model = 512, warmup = 4000
    assert transformer_lr(1, 512, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert transformer_lr(4000, 512, 4000) == pytest.approx(6.987712e-4, rel=1e-6)  # the peak
    assert transformer_lr(16000, 512, 4000) == pytest.approx(6.987712e-4 / 2, rel=1e-6)
    assert transformer_lr(100, 512, 4000, scale=2.0) == pytest.approx(
        2 * transformer_lr(100, 512, 4000)
    )
    lrs = [transformer_lr(s, 512, 4000) for s in range(1, 20000, 97)]
    peak = max(range(len(lrs)), key=lrs.__getitem__)
    assert lrs[:peak] == sorted(lrs[:peak]) and lrs[peak:] == sorted(lrs[peak:], reverse=True)
    with pytest.raises(ValueError, match="1-based"):
        transformer_lr(0, 512, 4000)
