"""The training objective (output layer on non-pad positions, fused loss) equals the explicit
forward + log-softmax + label-smoothed NLL, in value and in every parameter's gradient."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from aiayn.config import preset
from aiayn.layers.loss import label_smoothed_nll
from aiayn.models import T5, Transformer, t5_preset
from aiayn.models.transformer import EncoderDecoder
from aiayn.training.objective import TranslationObjective


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    src = torch.randint(4, 60, (3, 7))
    src[1, 5:] = 0
    tgt = torch.randint(4, 60, (3, 6))
    tgt[0, 4:] = 0
    tgt[2, 2:] = 0
    tgt_in = torch.cat([torch.ones(3, 1, dtype=torch.long), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


MODELS: dict[str, Callable[[], EncoderDecoder]] = {
    "post-norm": lambda: Transformer(preset("tiny", vocab_size=60, dropout=0.0)),
    "pre-norm": lambda: Transformer(preset("tiny", vocab_size=60, dropout=0.0, norm_first=True)),
    "Marian's logits bias": lambda: Transformer(
        preset("tiny", vocab_size=60, dropout=0.0, output_bias=True, activation="silu")
    ),
    "T5 v1.0 (scaled output)": lambda: T5(t5_preset("t5-tiny", vocab_size=60, dropout=0.0)),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_objective_equals_explicit_loss_and_gradients(name: str) -> None:
    torch.manual_seed(0)
    model = MODELS[name]()
    if model.output_proj.bias is not None:
        torch.nn.init.normal_(model.output_proj.bias)  # not its zero start
    src, tgt_in, tgt_out = _batch()
    n = int((tgt_out != 0).sum())

    sums = TranslationObjective(model)(src, tgt_in, tgt_out, n)
    sums.loss.backward()
    fast = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    want = label_smoothed_nll(model(src, tgt_in), tgt_out, 0.1, 0)
    want.loss.backward()

    torch.testing.assert_close(sums.loss, want.loss)
    torch.testing.assert_close(sums.nll, want.nll)
    assert sums.tokens.item() == want.tokens.item() == n
    assert fast.keys() == {k for k, p in model.named_parameters() if p.grad is not None}
    for name, p in model.named_parameters():
        torch.testing.assert_close(fast[name], p.grad, msg=name)


def test_label_smoothing_is_a_training_setting() -> None:
    """ε_ls comes from train.label_smoothing (default: §5.4's 0.1 for translation, 0 for a
    language model), not from the model config."""
    from aiayn.training.config import load_run_config
    from aiayn.training.lm import LanguageModelTask
    from aiayn.training.translation import TranslationTask

    model = Transformer(preset("tiny", vocab_size=60))
    for overrides, want in (([], 0.1), (["train.label_smoothing=0.25"], 0.25)):
        task = TranslationTask(load_run_config(None, overrides))
        assert task.objective(model).label_smoothing == want
    lm = load_run_config("configs/lm_demo.yaml")
    assert LanguageModelTask(lm).label_smoothing == 0.0
