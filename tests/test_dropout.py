"""The CPU dropout: drop rate p (to 2^-16), unbiased, seedable, identity in eval mode."""

from __future__ import annotations

import pytest
import torch

from aiayn.layers import Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_drop_rate_and_scale(p: float) -> None:
    x = torch.ones(1000, 1000)
    y = dropout(x, p)
    kept = y != 0
    rate = 1 - kept.float().mean().item()
    assert rate == pytest.approx(p, abs=0.002)  # 10^6 draws: std ≈ 0.0005
    p_used = round(p * 65536) / 65536
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p_used)))
    assert y.mean().item() == pytest.approx(1.0, abs=0.005)


def test_masks_are_independent_across_positions_and_calls() -> None:
    x = torch.ones(4096)
    a, b = dropout(x, 0.5) != 0, dropout(x, 0.5) != 0
    assert not torch.equal(a, b)
    # neighbouring elements share a 64-bit draw: their keep decisions must still be independent
    both = (a[0::2] & a[1::2]).float().mean().item()
    assert both == pytest.approx(0.25, abs=0.03)


def test_seeded_gradient_and_eval_mode() -> None:
    x = torch.randn(8, 9, requires_grad=True)
    torch.manual_seed(3)
    y1 = dropout(x, 0.2)
    torch.manual_seed(3)
    y2 = dropout(x, 0.2)
    assert torch.equal(y1, y2)
    y1.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, (y1 / x).detach().nan_to_num())
    module = Dropout(0.2).eval()
    assert module(x) is x and dropout(x, 0.0) is x
    with pytest.raises(ValueError, match=r"got 1\.0"):
        Dropout(1.0)
