"""Label smoothing (§5.4) and the fused output layer + loss: hand-checked numbers and torch
parity."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.layers.loss import label_smoothed_nll, linear_label_smoothed_cross_entropy


def test_label_smoothing_by_hand() -> None:
    # p = (0.5, 0.25, 0.25), gold y = 0, ε = 0.1, V = 3:
    # loss = 0.9·log 2 + (0.1/3)·(log 2 + 2·log 4) = 0.739347...
    log_probs = torch.tensor([[[0.5, 0.25, 0.25]]]).log()
    sums = label_smoothed_nll(log_probs, torch.tensor([[0]]), 0.1, pad_id=99)
    assert sums.loss.item() == pytest.approx(0.9 * math.log(2) + 0.1 / 3 * 5 * math.log(2))
    assert sums.nll.item() == pytest.approx(math.log(2))
    assert sums.tokens.item() == 1


def test_label_smoothing_equals_torch_cross_entropy_and_skips_padding() -> None:
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[1, 3:] = 0
    target[2, 1:] = 0
    sums = label_smoothed_nll(logits.log_softmax(-1), target, 0.1, pad_id=0)
    want = F.cross_entropy(
        logits.reshape(-1, 11),
        target.reshape(-1),
        label_smoothing=0.1,
        ignore_index=0,
        reduction="sum",
    )
    torch.testing.assert_close(sums.loss, want)
    assert sums.tokens.item() == 15 - 2 - 4
    with pytest.raises(ValueError, match="epsilon"):
        label_smoothed_nll(logits.log_softmax(-1), target, 1.0, pad_id=0)


@pytest.mark.parametrize("chunk_size", [1, 4, 512])
@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.4])
def test_fused_linear_cross_entropy_matches_reference(epsilon: float, chunk_size: int) -> None:
    """Loss, NLL and the gradients w.r.t. hidden states and weight equal autograd through
    F.cross_entropy(label_smoothing) on the full logits, whatever the chunking (13 = 3·4 + 1)."""
    hidden = torch.randn(13, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(17, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 17, (13,))
    fused = linear_label_smoothed_cross_entropy(
        hidden, weight, target, epsilon, chunk_size=chunk_size
    )
    logits = hidden @ weight.t()
    want = F.cross_entropy(logits, target, label_smoothing=epsilon, reduction="sum")
    torch.testing.assert_close(fused.loss, want)
    torch.testing.assert_close(fused.nll, F.cross_entropy(logits, target, reduction="sum"))
    assert fused.tokens.item() == 13 and not fused.nll.requires_grad
    got = torch.autograd.grad(fused.loss * 0.7, (hidden, weight))
    expected = torch.autograd.grad(want * 0.7, (hidden, weight))
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
    assert torch.autograd.gradcheck(
        lambda h, w: linear_label_smoothed_cross_entropy(h, w, target, epsilon, chunk_size=4).loss,
        (hidden, weight),
    )


def test_fused_linear_cross_entropy_in_bf16_and_without_grad() -> None:
    hidden = torch.randn(6, 8).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(40, 8).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 40, (6,))
    fused = linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1)
    logits = (hidden @ weight.t()).float()
    want = F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum")
    assert fused.loss.dtype == torch.float32
    torch.testing.assert_close(fused.loss, want)
    fused.loss.backward()
    assert hidden.grad is not None and hidden.grad.dtype == torch.bfloat16
    assert weight.grad is not None and weight.grad.dtype == torch.bfloat16
    with torch.no_grad():  # evaluation: the loss alone
        torch.testing.assert_close(
            linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1).loss, want
        )
    with pytest.raises(ValueError, match="epsilon"):
        linear_label_smoothed_cross_entropy(hidden, weight, target, 1.0)
    with pytest.raises(ValueError, match=r"hidden \(N, D\)"):
        linear_label_smoothed_cross_entropy(hidden[None], weight, target, 0.1)


def test_fused_linear_cross_entropy_under_bf16_autocast() -> None:
    """The GPU training path: fp32 states and weights, bf16 matmuls inside autocast, fp32
    log-softmax and accumulation; values and gradients against the same bf16 logits."""
    hidden = torch.randn(9, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    target = torch.randint(0, 50, (9,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1, chunk_size=4)
    got = torch.autograd.grad(fused.loss, (hidden, weight))
    logits = (hidden.bfloat16() @ weight.bfloat16().t()).float()
    want = F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum")
    expected = torch.autograd.grad(want, (hidden, weight))
    torch.testing.assert_close(fused.loss, want, rtol=1e-3, atol=1e-3)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)
