"""``quantize_model`` (``--quantize int8``) for every family: the layers each family's policy
keeps in fp32 and the ones it quantises, outputs close to fp32 on random small models, the
decoding step with its key/value cache equal to the quantised model's full forward, and the
modes it accepts."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from aiayn.config import preset
from aiayn.decoding import inference_step
from aiayn.errors import UserError
from aiayn.inference.quantize import policy_of, quantize_model
from aiayn.layers.quantized import QuantizedLinear
from aiayn.models import BERT, GPT2, T5, GPT2Config, T5Config, Transformer, bert_preset
from aiayn.models.families import FAMILIES, QuantizePolicy
from aiayn.models.vit import ViT, vit_preset

V = 50
PAD, BOS, EOS = 0, 1, 2
SRC = torch.tensor([[5, 6, 7, 8, 9, EOS], [9, 10, 11, EOS, PAD, PAD]])
TGT = torch.tensor([[BOS, 12, 13, 14, 15], [BOS, 16, 17, 18, 19]])


def _models() -> dict[str, nn.Module]:
    """A small random model of every family, by its class name, in eval mode."""
    torch.manual_seed(0)
    t5 = T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, num_buckets=8, max_distance=6, max_len=8, gated=True,
    )  # fmt: skip
    models: list[nn.Module] = [
        Transformer(preset("tiny", vocab_size=V, d_model=32, d_ff=64, num_heads=4)),
        T5(t5),
        GPT2(GPT2Config(V, 16, 32, 4, 2, bos_id=EOS, eos_id=EOS, pad_id=EOS)),
        BERT(bert_preset("bert-tiny", vocab_size=V, head="classification", num_labels=3)),
        ViT(vit_preset("vit-tiny-digits", image_size=16, patch_size=4, num_labels=10)),
    ]
    return {type(m).__name__: m.eval() for m in models}


def _output(model: nn.Module) -> Tensor:
    """The model's main output on a fixed input: log-probs, final states or logits."""
    torch.manual_seed(1)
    with torch.no_grad():
        if isinstance(model, (Transformer, T5)):
            return model(SRC, TGT)  # (B, T, V) log-probs
        if isinstance(model, GPT2):
            return model.log_probs(model(TGT).hidden)  # (B, T, V)
        if isinstance(model, BERT):
            hidden = model(SRC, attention_mask=SRC != PAD).hidden[SRC != PAD]  # (N, D)
            logits = model.classify(SRC, attention_mask=SRC != PAD)  # (B, 3)
            return torch.cat([hidden.flatten(), logits.flatten()])
        assert isinstance(model, ViT)
        logits = model(torch.rand(3, model.config.num_channels, 16, 16)).logits
        assert logits is not None
        return logits


def test_every_family_has_a_policy_and_it_is_applied() -> None:
    """Every linear layer is int8 but those the family's policy keeps; nothing else changes."""
    for name, model in _models().items():
        kinds = {n: type(m) for n, m in model.named_modules()}
        policy = policy_of(model)
        quantized = quantize_model(model)
        assert quantized is model and not any(p.requires_grad for p in model.parameters())
        for module_name, kind in kinds.items():
            now = type(dict(model.named_modules())[module_name])
            if kind is nn.Linear and not policy.keeps(module_name):
                assert now is QuantizedLinear, (name, module_name)
            else:
                assert now is kind, (name, module_name)
    assert {type(f.quantize) for f in FAMILIES.values()} == {QuantizePolicy}


def test_the_heads_of_the_encoder_families_stay_fp32() -> None:
    """BERT's pooler and classifier, ViT's: few rows, nothing to gain; their outputs stay exact."""
    models = _models()
    for model in (models["BERT"], models["ViT"]):
        quantize_model(model)
        assert type(model.pooler) is not QuantizedLinear  # BERT's Pooler module, ViT's Linear
        assert type(model.classifier) is not QuantizedLinear
    assert QuantizePolicy(("pooler",)).keeps("pooler.dense")
    assert not QuantizePolicy(("pooler",)).keeps("poolers.dense")


@pytest.mark.parametrize("family", ["Transformer", "T5", "GPT2", "BERT", "ViT"])
def test_each_family_quantised_is_close_to_fp32(family: str) -> None:
    model = _models()[family]
    want = _output(model)
    got = _output(quantize_model(copy.deepcopy(model)))
    assert got.shape == want.shape and torch.isfinite(got).all()
    error = (got - want).norm() / want.norm()
    assert 0 < error < 0.03, error  # int8 changes the outputs, by a little


@pytest.mark.parametrize("family", ["Transformer", "T5"])
@torch.no_grad()
def test_the_cached_step_equals_the_quantised_full_forward(family: str) -> None:
    """Teacher-forced through the fast step with its key/value cache, position by position: the
    log-probabilities of the quantised model's full forward (activations are quantised per
    row, so a position computes the same sums alone or with the others)."""
    model = quantize_model(_models()[family])
    full = model(SRC, TGT)  # (B, T, V)
    step, state = inference_step(model, SRC, banned=(), capacity=2)
    for t in range(TGT.size(1)):
        log_probs, state = step(TGT[:, t : t + 1], state)
        torch.testing.assert_close(log_probs, full[:, t], atol=1e-5, rtol=1e-5)


def test_modes() -> None:
    model = _models()["GPT2"]
    assert quantize_model(model, "none") is model
    assert not any(isinstance(m, QuantizedLinear) for m in model.modules())
    with pytest.raises(UserError, match="--quantize must be one of none, int8, got 'int4'"):
        quantize_model(model, "int4")
    quantize_model(model)
    first = model.output_proj
    assert isinstance(first, QuantizedLinear)
    assert quantize_model(model).output_proj is first  # already int8: left as it is


def test_a_module_of_no_family_has_every_linear_quantised() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    quantize_model(model)
    assert [type(m) for m in model] == [QuantizedLinear, nn.ReLU, QuantizedLinear]


@pytest.mark.parametrize("beam", [1, 4])
def test_int8_translations_are_the_same_on_every_cpu_class(
    beam: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An int8 model translates token for token the same under every CPU class cap and
    whether or not the libraries' int8 kernels are exact here (every kernel gives the
    reference's bits), so its BLEU does not depend on the CPU either: greedy and beam search,
    a batch of sentences of several lengths (rows from 1 to the batch's beams)."""
    from types import SimpleNamespace

    from aiayn.decoding.translate import DecodeOptions, translate_ids
    from aiayn.kernels import cpu
    from aiayn.kernels import int8 as library

    torch.manual_seed(5)
    config = preset("tiny", vocab_size=V, d_model=64, d_ff=128, num_heads=4)
    model = quantize_model(Transformer(config).eval(), mode="int8")
    tokenizer = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS)
    sources = [[5, 6, 7, 8, 9], [9, 10], [11, 12, 13, 20, 21, 22, 23], [14]]
    options = DecodeOptions(beam_size=beam, extra_len=6)

    def tokens() -> list[list[int]]:
        rows = translate_ids(model, sources, tokenizer, options)  # type: ignore[arg-type]
        return [r[0].tokens for r in rows]

    want = tokens()
    assert any(len(t) > 2 for t in want)  # something was decoded
    for exact in (library.exact_library_kernels(), frozenset()):
        monkeypatch.setattr(library, "exact_library_kernels", lambda exact=exact: exact)
        for level in cpu.LEVELS:
            with cpu.capped(level):
                assert tokens() == want, (level, sorted(exact))
