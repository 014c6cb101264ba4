"""House rule 7 for encoder inference on the real tokens only: every value of every option of
BERT, ViT, the paper's Transformer (and Marian) and T5 is held to the model's own forward at every
real position, over padded batches of different lengths (right, left and inner padding, a row
without a real token, no padding); padded positions come out zero; every part the fast path does
not compute is refused, and so is a model in training mode.

A new field of BertConfig, ViTConfig, TransformerConfig or T5Config fails its
``test_every_*_option_is_enumerated`` until its values are added here, and so checked.

Each case runs three times: on the model (PyTorch's linear kernels, the activation after the
product), on a copy packed for oneDNN with every product on oneDNN's kernel (the activation and
the residual addition inside it), and on an int8-quantised copy (``--quantize int8``), whose
fast path is held to its own forward.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor, nn

from aiayn.attention import SelfAttention
from aiayn.config import TransformerConfig, preset
from aiayn.inference import pack_for_inference, packing_available
from aiayn.inference.encoder import BertInference, EncoderInference, ViTInference
from aiayn.inference.quantize import quantize_model
from aiayn.layers import FeedForward, RMSNorm, SelfAttentionBlock
from aiayn.layers.relative_position import RelativePositionBias
from aiayn.models import BERT, T5, BertConfig, T5Config, Transformer, bert_preset
from aiayn.models.bert import Pooler
from aiayn.models.transformer import Encoder
from aiayn.models.vit import ViT, ViTConfig, vit_preset

TOLERANCE = 1e-5


def _randomized(model: nn.Module) -> nn.Module:
    """Weights large enough to matter and norms, biases away from 1 and 0, so that a misplaced
    norm, bias or mask shows; returns the model in eval mode."""
    torch.manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.normal_(module.weight, std=0.15)
            if isinstance(module, (nn.LayerNorm, RMSNorm)):
                nn.init.normal_(module.weight, mean=1.0, std=0.2)
            bias = getattr(module, "bias", None)
            if isinstance(bias, nn.Parameter):
                nn.init.normal_(bias, std=0.1)
    return model.eval()


def _kernels(model: nn.Module) -> Iterator[nn.Module]:
    """The model, its copy with every product on oneDNN's kernel (where oneDNN is built), and its
    int8-quantised copy."""
    yield model
    if packing_available():
        yield pack_for_inference(model, dense_small=False)
    yield quantize_model(copy.deepcopy(model))


def _assert_real_rows_equal(got: Tensor, want: Tensor, real: Tensor) -> None:
    """Equal at the real positions, zero at the padded ones."""
    torch.testing.assert_close(got[real], want[real], atol=TOLERANCE, rtol=TOLERANCE)
    assert not got[~real].any()


# -- BERT ------------------------------------------------------------------------------------------

# every settable field, with the values checked (bert-tiny's included)
BERT_OPTION_VALUES: dict[str, list[object]] = {
    "vocab_size": [1000, 37],
    "max_len": [128, 9],  # 9: the batch's length exactly
    "type_vocab_size": [2, 1, 3],
    "d_model": [64, 48],
    "num_heads": [4, 1, 8],
    "num_layers": [2, 0, 1],
    "d_ff": [256, 24],
    "activation": ["gelu", "gelu_tanh", "relu", "silu"],
    "dropout": [0.1, 0.0],  # eval mode: no dropout on either path
    "attention_dropout": [0.1, 0.0],
    "classifier_dropout": [None, 0.3],
    "layer_norm_eps": [1e-12, 1e-2],
    "pad_id": [0, 5],
    "head": ["none", "mlm", "classification"],
    "num_labels": [2, 3],
    "pooler": [True, False],
    "id2label": [(), ("negative", "positive")],  # num_labels 2
}


def test_every_bert_option_is_enumerated() -> None:
    fields = {f.name for f in dataclasses.fields(BertConfig) if f.init}
    assert fields == set(BERT_OPTION_VALUES)


def _bert_batch(config: BertConfig) -> tuple[Tensor, Tensor, Tensor]:
    """(4, 9) ids, segment ids and attention mask: rows of 9, 5 (right-padded), 4 (left and
    inner padding) and no real token."""
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (4, 9), generator=g)
    types = torch.randint(0, config.type_vocab_size, (4, 9), generator=g)
    mask = torch.tensor(
        [[1] * 9, [1] * 5 + [0] * 4, [0, 0, 1, 1, 0, 1, 1, 0, 0], [0] * 9], dtype=torch.long
    )
    return tokens.masked_fill(mask == 0, config.pad_id), types, mask


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in BERT_OPTION_VALUES.items() for value in values],
    ids=str,
)
def test_bert_equals_its_forward_for_every_option(name: str, value: object) -> None:
    needs = {"head": "none"} if (name, value) == ("pooler", False) else {}
    model = _randomized(BERT(bert_preset("bert-tiny", **{name: value, **needs})))
    tokens, types, mask = _bert_batch(model.config)
    real = mask.bool()
    for runner in _kernels(model):
        with torch.no_grad():
            want = runner(tokens, types, mask)
            alone = runner(tokens[:1], types[:1])  # no padding in the batch: one attention
        got = BertInference(runner)(tokens, types, mask)
        _assert_real_rows_equal(got.hidden, want.hidden, real)
        if want.pooled is not None:
            assert got.pooled is not None
            rows = real[:, 0]  # the pooler reads position 0: a real one in rows 0 and 1
            torch.testing.assert_close(got.pooled[rows], want.pooled[rows], atol=TOLERANCE, rtol=0)
        unpadded = BertInference(runner)(tokens[:1], types[:1], torch.ones(1, 9))
        torch.testing.assert_close(unpadded.hidden, alone.hidden, atol=TOLERANCE, rtol=0)


# -- ViT -------------------------------------------------------------------------------------------

VIT_OPTION_VALUES: dict[str, list[object]] = {
    "image_size": [32, 24],
    "patch_size": [8, 16],
    "num_channels": [3, 1],
    "d_model": [32, 48],
    "num_heads": [4, 1],
    "num_layers": [2, 1, 3],
    "d_ff": [64, 24],
    "activation": ["gelu", "gelu_tanh", "relu", "silu"],
    "dropout": [0.0, 0.2],
    "attention_dropout": [0.0, 0.1],
    "layer_norm_eps": [1e-12, 1e-2],
    "qkv_bias": [True, False],
    "pooler": [True, False],
    "num_labels": [5, 0],
    "id2label": [(), ("a", "b", "c", "d", "e")],
}


def test_every_vit_option_is_enumerated() -> None:
    fields = {f.name for f in dataclasses.fields(ViTConfig) if f.init}
    assert fields == set(VIT_OPTION_VALUES)


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in VIT_OPTION_VALUES.items() for value in values],
    ids=str,
)
def test_vit_equals_its_forward_for_every_option(name: str, value: object) -> None:
    model = _randomized(ViT(vit_preset("vit-tiny", **{name: value})))
    c = model.config
    g = torch.Generator().manual_seed(2)
    for size in (c.image_size, c.image_size + c.patch_size):  # another size: positions resized
        pixels = torch.randn(2, c.num_channels, size, size, generator=g)
        for runner in _kernels(model):
            with torch.no_grad():
                want = runner(pixels)
            got = ViTInference(runner)(pixels)
            torch.testing.assert_close(got.hidden, want.hidden, atol=TOLERANCE, rtol=TOLERANCE)
            for ours, theirs in ((got.pooled, want.pooled), (got.logits, want.logits)):
                assert (ours is None) == (theirs is None)
                if ours is not None:
                    torch.testing.assert_close(ours, theirs, atol=TOLERANCE, rtol=TOLERANCE)


# -- the paper's Transformer (Marian) and T5: their encoders ---------------------------------------

V, PAD, EOS = 30, 0, 2

# every settable field of TransformerConfig (decoder-only fields too: they must not matter)
TRANSFORMER_OPTION_VALUES: dict[str, list[object]] = {
    "vocab_size": [V, 41],
    "tgt_vocab_size": [None, 37],  # separate vocabularies need share_embeddings=False
    "d_model": [32, 48],
    "d_ff": [64, 24],
    "num_heads": [4, 1, 8],
    "num_encoder_layers": [2, 0, 1],
    "num_decoder_layers": [2, 1],
    "dropout": [0.0, 0.3],
    "attention_dropout": [0.0, 0.2],
    "activation": ["relu", "gelu", "silu"],
    "norm_first": [False, True],
    "positional": ["sinusoidal", "sinusoidal-halves", "learned", "none"],
    "max_len": [64, 3],  # 3: sinusoids computed past the table
    "share_embeddings": [True, False],
    "tie_output": [True, False],
    "output_bias": [False, True],
    "layer_norm_eps": [1e-5, 1e-2],
    "pad_id": [PAD],  # the batch below pads with it
}
T5_OPTION_VALUES: dict[str, list[object]] = {
    "vocab_size": [V, 41],
    "d_model": [32, 24],
    "d_kv": [8, 5],
    "d_ff": [64, 24],
    "num_heads": [4, 1],
    "num_encoder_layers": [2, 0],
    "num_decoder_layers": [2, 1],
    "activation": ["relu", "gelu", "gelu_tanh", "silu"],
    "gated": [False, True],
    "num_buckets": [8, 4, 32],  # 32 with max_distance 128
    "max_distance": [6, 5, 128],
    "dropout": [0.0, 0.3],
    "layer_norm_eps": [1e-6, 1e-2],
    "tie_output": [True, False],
    "scale_output": [True, False],
    "max_len": [4, 64],
    "pad_id": [PAD],
}


def test_every_transformer_and_t5_option_is_enumerated() -> None:
    for config, values in (
        (TransformerConfig, TRANSFORMER_OPTION_VALUES),
        (T5Config, T5_OPTION_VALUES),
    ):
        assert {f.name for f in dataclasses.fields(config) if f.init} == set(values)


SOURCES = torch.tensor(
    [
        [5, 6, 7, 8, 9, 3, EOS],
        [9, 10, EOS, PAD, PAD, PAD, PAD],  # right padding
        [PAD, PAD, 4, 5, PAD, 6, EOS],  # left and inner padding: T5's bias at the real positions
        [PAD] * 7,  # no real token
    ]
)


def _assert_encoder_equal(model: Transformer | T5) -> None:
    real = SOURCES != PAD
    for runner in _kernels(model):
        with torch.no_grad():
            want = runner.encoder(SOURCES, runner.source_mask(SOURCES)).memory
            alone = runner.encoder(SOURCES[:1]).memory
        run = EncoderInference(runner.encoder)
        _assert_real_rows_equal(run(SOURCES, real), want, real)
        torch.testing.assert_close(run(SOURCES[:1]), alone, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in TRANSFORMER_OPTION_VALUES.items() for value in values],
    ids=str,
)
def test_transformer_encoder_equals_its_forward_for_every_option(name: str, value: object) -> None:
    base = preset("tiny", vocab_size=V, d_model=32, d_ff=64, num_heads=4, dropout=0.0)
    needs = {"share_embeddings": False} if name == "tgt_vocab_size" else {}
    _assert_encoder_equal(_randomized(Transformer(base.replace(**{name: value, **needs}))))


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in T5_OPTION_VALUES.items() for value in values],
    ids=str,
)
def test_t5_encoder_equals_its_forward_for_every_option(name: str, value: object) -> None:
    base = T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, num_buckets=8, max_distance=6, max_len=4,
    )  # fmt: skip
    needs = {"max_distance": 128} if (name, value) == ("num_buckets", 32) else {}
    model = _randomized(T5(base.replace(**{name: value, **needs})))
    for bias in (m for m in model.modules() if isinstance(m, RelativePositionBias)):
        nn.init.normal_(bias.embedding.weight)
    _assert_encoder_equal(model)


# -- refusals --------------------------------------------------------------------------------------


class _OtherFeedForward(FeedForward):
    """A subclass: may compute anything."""


class _OtherAttention(SelfAttention):
    """A subclass: may compute anything."""


class _OtherBlock(SelfAttentionBlock):
    """A subclass: may compute anything."""


class _OtherBias(RelativePositionBias):
    """A subclass: may compute anything."""


class _OtherEncoder(Encoder):
    """A subclass: may compute anything."""


class _OtherPooler(Pooler):
    """A subclass: may compute anything."""


def _bert() -> BERT:
    torch.manual_seed(0)
    return BERT(bert_preset("bert-tiny")).eval()


def _layer(model: BERT, i: int = 0) -> SelfAttentionBlock:
    layer = model.encoder.layers[i]
    assert isinstance(layer, SelfAttentionBlock)
    return layer


def _swap_block(model: BERT) -> None:
    old = _layer(model)
    model.encoder.layers[0] = _OtherBlock(
        old.self_attn, old.feed_forward, nn.LayerNorm, norm_first=False, dropout=0.0
    )


def _other_encoder(model: BERT) -> None:
    e = model.encoder
    model.encoder = _OtherEncoder(e.embedder, list(e.layers), None)


def _head_shape(model: BERT) -> None:
    _layer(model, 1).self_attn = SelfAttention(64, 8)


def _mixed_placement(model: BERT) -> None:
    _layer(model).ff_sublayer.norm_first = True


def _position_bias(model: BERT) -> None:
    model.encoder.position_bias = _OtherBias(4, bidirectional=True)


def _final_norm(model: BERT) -> None:
    model.encoder.final_norm = nn.Identity()


UNKNOWN_PARTS: dict[str, tuple[Callable[[BERT], None], str]] = {
    "a feed-forward subclass": (
        lambda m: setattr(_layer(m), "feed_forward", _OtherFeedForward(64, 256, "gelu")),
        "FeedForward or GatedFeedForward .*got _OtherFeedForward",
    ),
    "an attention subclass": (
        lambda m: setattr(_layer(m), "self_attn", _OtherAttention(64, 4)),
        "aiayn's SelfAttention, got _OtherAttention",
    ),
    "a block subclass": (_swap_block, "SelfAttentionBlock, got _OtherBlock"),
    "a norm of another kind": (
        lambda m: setattr(_layer(m).attn_sublayer, "norm", nn.Identity()),
        "LayerNorm or RMSNorm, got Identity",
    ),
    "heads of another shape": (_head_shape, r"one attention shape .*\(4, 16\), \(8, 8\)"),
    "sub-layers normed apart": (_mixed_placement, "share norm_first"),
    "a position bias subclass": (_position_bias, "T5's position bias, got _OtherBias"),
    "a final norm of another kind": (_final_norm, "final LayerNorm or RMSNorm, got Identity"),
    "an encoder subclass": (_other_encoder, "aiayn's Encoder, got _OtherEncoder"),
    "a pooler subclass": (
        lambda m: setattr(m, "pooler", _OtherPooler(64)),
        "BERT's Pooler, got _OtherPooler",
    ),
}


@pytest.mark.parametrize("part", list(UNKNOWN_PARTS))
def test_parts_the_fast_path_does_not_compute_are_refused(part: str) -> None:
    model = _bert()
    swap, message = UNKNOWN_PARTS[part]
    swap(model)
    model.eval()  # the new part too
    tokens, types, mask = _bert_batch(model.config)
    with torch.no_grad():
        model(tokens, types, mask)  # the reference path runs it
    with pytest.raises(TypeError, match=message):
        BertInference(model)


def test_models_in_training_mode_and_other_models_are_refused() -> None:
    model = _bert().train()
    with pytest.raises(ValueError, match=r"without dropout: call model.eval\(\) first"):
        BertInference(model)
    model.eval()
    _layer(model).self_attn.train()  # a part left in training mode drops out too
    with pytest.raises(ValueError, match="without dropout"):
        BertInference(model)
    vit = ViT(vit_preset("vit-tiny")).train()
    with pytest.raises(ValueError, match="without dropout"):
        ViTInference(vit)
    vit.eval().final_norm = nn.Identity()
    with pytest.raises(TypeError, match="final LayerNorm or RMSNorm, got Identity"):
        ViTInference(vit)
    with pytest.raises(TypeError, match="aiayn's BERT, got ViT"):
        BertInference(vit)  # type: ignore[arg-type]


def test_a_mask_of_another_shape_is_refused() -> None:
    model = _bert()
    tokens = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"real has shape \(2, 3\), tokens \(2, 4\)"):
        EncoderInference(model.encoder)(tokens, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 3\)"):
        BertInference(model)(tokens, attention_mask=torch.ones(2, 3))


def test_forward_hooks_run_where_the_module_call_would_and_are_refused_elsewhere() -> None:
    """T5's encoder refuses float16 in a forward pre-hook: so does the fast path. A hook on a
    part whose forward the fast path does not call would not run: refused."""
    t5 = T5(T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_heads=4)).eval().half()
    with pytest.raises(ValueError, match="T5 overflows float16"):
        EncoderInference(t5.encoder)(SOURCES)
    model = _bert()
    model.encoder.embedder.register_forward_hook(lambda *args: None)  # called: it runs
    BertInference(model)(*_bert_batch(model.config))
    _layer(model, 1).feed_forward.register_forward_hook(lambda *args: None)
    with pytest.raises(TypeError, match=r"no forward hooks, found some on layers\.1\.feed_forward"):
        BertInference(model)
