"""House rule 7 for the flattened inference step: every value of every model option is held to the
module step, and a model with a part the fast path does not compute is run by the module step,
never differently.

A new field of TransformerConfig (or T5Config) fails ``test_every_option_is_enumerated`` (or
``test_every_t5_option_is_enumerated``) until its values are added to OPTION_VALUES (or
T5_OPTION_VALUES), and so checked here.

Every option and supported part is checked in fp32 and int8-quantised (``--quantize int8``:
:func:`~aiayn.inference.quantize.quantize_model`), the quantised step held to the quantised
model's module step.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

from aiayn.attention import CrossAttention, SelfAttention
from aiayn.config import TransformerConfig, preset
from aiayn.decoding import InferenceState, InferenceStep, encoder_decoder_step, inference_step
from aiayn.decoding.step import DecoderState, join_states
from aiayn.inference.quantize import quantize_model
from aiayn.layers import FeedForward, GatedFeedForward, RMSNorm
from aiayn.layers.relative_position import RelativePositionBias
from aiayn.models import T5, Transformer
from aiayn.models.t5 import T5Config

V = 30
PAD, BOS, EOS = 0, 1, 2
QUANTIZE = ["none", "int8"]

# every settable field, with the values checked (defaults of the tiny test model included)
OPTION_VALUES: dict[str, list[object]] = {
    "vocab_size": [V, 41],
    "tgt_vocab_size": [None, 37],  # separate vocabularies need share_embeddings=False
    "d_model": [32, 48],
    "d_ff": [64, 24],
    "num_heads": [4, 1, 8],
    "num_encoder_layers": [2, 0, 1],
    "num_decoder_layers": [2, 1, 3],
    "dropout": [0.0, 0.3],  # eval mode: no dropout on either path
    "attention_dropout": [0.0, 0.2],
    "activation": ["relu", "gelu", "silu"],
    "norm_first": [False, True],
    "positional": ["sinusoidal", "sinusoidal-halves", "learned", "none"],
    "max_len": [64, 3],  # 3: the step computes sinusoids past its table
    "share_embeddings": [True, False],
    "tie_output": [True, False],
    "output_bias": [False, True],  # drawn at random below (it starts at zero)
    "layer_norm_eps": [1e-5, 1e-2],
    "pad_id": [PAD],  # the searches' PAD/BOS/EOS ids are fixed by the tokenizer
}
NEEDS = {
    ("tgt_vocab_size", 37): {"share_embeddings": False},
    ("positional", "sinusoidal-halves"): {"max_len": 3},  # within and past the step's table
}


def test_every_option_is_enumerated() -> None:
    fields = {f.name for f in dataclasses.fields(TransformerConfig) if f.init}
    assert fields == set(OPTION_VALUES)


def _cases() -> list[tuple[str, object]]:
    return [(name, value) for name, values in OPTION_VALUES.items() for value in values]


def _base() -> TransformerConfig:
    return preset("tiny", vocab_size=V, d_model=32, d_ff=64, num_heads=4, dropout=0.0)


def _option_model(name: str, value: object) -> Transformer:
    """The tiny model with option ``name`` set to ``value`` (and what it needs), eval mode, its
    output bias drawn at random where it has one (it starts at zero)."""
    torch.manual_seed(0)
    config = _base().replace(**{name: value, **NEEDS.get((name, value), {})})
    model = Transformer(config).eval()
    if model.output_proj.bias is not None:
        torch.nn.init.normal_(model.output_proj.bias)
    return model


@pytest.mark.parametrize("quantize", QUANTIZE)
@pytest.mark.parametrize(("name", "value"), _cases(), ids=lambda x: str(x))
@torch.no_grad()
def test_fast_step_equals_module_step_for_every_option_value(
    name: str, value: object, quantize: str
) -> None:
    model = _option_model(name, value)
    config = model.config
    quantize_model(model, quantize)
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
    module_step, module_state = encoder_decoder_step(model, src)
    fast_step, fast_state = inference_step(model, src, capacity=2)
    tokens = torch.full((2, 1), BOS)
    for _ in range(5):
        want, module_state = module_step(tokens, module_state)
        got, fast_state = fast_step(tokens, fast_state)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        tokens = torch.randint(3, config.target_vocab_size, (2, 1))


@pytest.mark.parametrize("quantize", QUANTIZE)
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("banned", [(), (PAD, BOS), (PAD, BOS, 7)])
@torch.no_grad()
def test_fast_step_equals_module_step_for_every_ban_and_renormalisation(
    banned: tuple[int, ...], renormalize: bool, quantize: str
) -> None:
    """The step options of the searches (banned tokens, ``renormalize``) on both steps; with
    ``renormalize`` the allowed tokens' probabilities sum to 1 and equal the model's own
    distribution divided by the allowed share (Hugging Face's second log-softmax)."""
    torch.manual_seed(0)
    model = Transformer(_base()).eval()
    quantize_model(model, quantize)
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
    module_step, module_state = encoder_decoder_step(
        model, src, banned=banned, renormalize=renormalize
    )
    fast_step, fast_state = inference_step(
        model, src, banned=banned, renormalize=renormalize, capacity=2
    )
    own_step, own_state = encoder_decoder_step(model, src, banned=())
    tokens = torch.full((2, 1), BOS)
    for _ in range(4):
        want, module_state = module_step(tokens, module_state)
        got, fast_state = fast_step(tokens, fast_state)
        own, own_state = own_step(tokens, own_state)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        allowed = torch.ones(V, dtype=torch.bool)
        allowed[list(banned)] = False
        assert torch.isneginf(got[:, ~allowed]).all()
        expected = own[:, allowed]
        if renormalize:
            expected = expected - torch.logsumexp(expected, dim=-1, keepdim=True)
        torch.testing.assert_close(got[:, allowed], expected, atol=1e-5, rtol=1e-5)
        tokens = torch.randint(3, V, (2, 1))


@torch.no_grad()
def test_start_token_with_the_pad_id() -> None:
    """Marian starts decoding with its pad id: a real token to both steps, not padding."""
    torch.manual_seed(0)
    config = _base().replace(
        activation="silu",
        positional="sinusoidal-halves",
        output_bias=True,
        share_embeddings=False,
        tgt_vocab_size=37,
    )
    model = Transformer(config).eval()
    assert model.output_proj.bias is not None
    torch.nn.init.normal_(model.output_proj.bias)
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
    module_step, module_state = encoder_decoder_step(model, src, banned=())
    fast_step, fast_state = inference_step(model, src, banned=(), capacity=2)
    tokens = torch.full((2, 1), PAD)
    for _ in range(4):
        want, module_state = module_step(tokens, module_state)
        got, fast_state = fast_step(tokens, fast_state)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        tokens = torch.randint(3, 37, (2, 1))


def _swap_feed_forward(build: Callable[[int, int], nn.Module]) -> Callable[[Transformer], None]:
    def swap(model: Transformer) -> None:
        for layer in model.decoder.layers:
            layer.feed_forward = build(32, 64)

    return swap


def _all_norms(model: Transformer) -> None:
    for layer in model.decoder.layers:
        for sub in (layer.self_sublayer, layer.cross_sublayer, layer.ff_sublayer):
            sub.norm = RMSNorm(32, eps=1e-3)
            nn.init.normal_(sub.norm.weight)


def _all_attention(scale: float, head_dim: int) -> Callable[[Transformer], None]:
    def swap(model: Transformer) -> None:
        for layer in model.decoder.layers:
            layer.self_attn = SelfAttention(32, 4, head_dim=head_dim, scale=scale, bias=False)
            layer.cross_attn = CrossAttention(32, 4, head_dim=head_dim, scale=scale, bias=False)

    return swap


def _position_bias(model: Transformer) -> None:
    bias = RelativePositionBias(4, bidirectional=False, num_buckets=6, max_distance=5)
    nn.init.normal_(bias.embedding.weight)
    model.decoder.position_bias = bias


SUPPORTED_PARTS: dict[str, Callable[[Transformer], None]] = {
    "GELU (tanh) feed-forward": _swap_feed_forward(lambda d, f: FeedForward(d, f, "gelu_tanh")),
    "gated GELU (tanh)": _swap_feed_forward(lambda d, f: GatedFeedForward(d, f, "gelu_tanh")),
    "gated ReLU": _swap_feed_forward(lambda d, f: GatedFeedForward(d, f, "relu")),
    "gated SiLU with biases": _swap_feed_forward(
        lambda d, f: GatedFeedForward(d, f, "silu", bias=True)
    ),
    "RMSNorm everywhere": _all_norms,
    "unscaled attention, heads of 12": _all_attention(1.0, 12),
    "attention scaled by 0.3, heads of 5": _all_attention(0.3, 5),
    "a relative position bias": _position_bias,
}


@pytest.mark.parametrize("quantize", QUANTIZE)
@pytest.mark.parametrize("part", list(SUPPORTED_PARTS))
@torch.no_grad()
def test_fast_step_equals_module_step_for_other_parts(part: str, quantize: str) -> None:
    """T5's and Marian's parts in the paper model's decoder, one at a time: same log-probs."""
    torch.manual_seed(0)
    model = Transformer(_base()).eval()
    SUPPORTED_PARTS[part](model)
    quantize_model(model, quantize)
    _assert_steps_agree(model, steps=7)  # past a capacity of 2, and the bias table's growth


def _assert_steps_agree(model: nn.Module, *, steps: int, vocab: int = V) -> None:
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
    module_step, module_state = encoder_decoder_step(model, src, banned=())  # type: ignore[arg-type]
    fast_step, fast_state = inference_step(model, src, banned=(), capacity=2)  # type: ignore[arg-type]
    tokens = torch.full((2, 1), BOS)
    for _ in range(steps):
        want, module_state = module_step(tokens, module_state)
        got, fast_state = fast_step(tokens, fast_state)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        tokens = torch.randint(3, vocab, (2, 1))


# every settable field of T5Config, with the values checked (the tiny test model's included)
T5_OPTION_VALUES: dict[str, list[object]] = {
    "vocab_size": [V, 41],
    "d_model": [32, 24],
    "d_kv": [8, 5],
    "d_ff": [64, 24],
    "num_heads": [4, 1],
    "num_encoder_layers": [2, 0],
    "num_decoder_layers": [2, 1, 3],
    "activation": ["relu", "gelu", "gelu_tanh", "silu"],
    "gated": [False, True],
    "num_buckets": [8, 4, 32],  # 32 with max_distance 128 (it must exceed num_buckets / 2)
    "max_distance": [6, 5, 128],
    "dropout": [0.0, 0.3],  # eval mode: no dropout on either path
    "layer_norm_eps": [1e-6, 1e-2],
    "tie_output": [True, False],
    "scale_output": [True, False],
    "max_len": [4, 64],  # 4: the bias table grows past it
    "pad_id": [PAD],
}


T5_CASES = [(name, value) for name, values in T5_OPTION_VALUES.items() for value in values]


def test_every_t5_option_is_enumerated() -> None:
    fields = {f.name for f in dataclasses.fields(T5Config) if f.init}
    assert fields == set(T5_OPTION_VALUES)


@pytest.mark.parametrize("quantize", QUANTIZE)
@pytest.mark.parametrize(("name", "value"), T5_CASES, ids=lambda x: str(x))
@torch.no_grad()
def test_fast_step_equals_module_step_for_every_t5_option(
    name: str, value: object, quantize: str
) -> None:
    model = _t5(name, value)
    quantize_model(model, quantize)
    _assert_steps_agree(model, steps=6, vocab=model.config.vocab_size)


def _t5(name: str, value: object) -> T5:
    """The tiny T5 with ``name`` = ``value`` (random weights, norms not all ones)."""
    torch.manual_seed(0)
    base = T5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, num_buckets=8, max_distance=6, max_len=4,
    )  # fmt: skip
    needs = {"max_distance": 128} if (name, value) == ("num_buckets", 32) else {}
    model = T5(base.replace(**{name: value, **needs})).eval()
    for norm in (m for m in model.modules() if isinstance(m, RMSNorm)):
        nn.init.normal_(norm.weight)  # not all ones: a misplaced norm shows
    return model


class _OtherFeedForward(FeedForward):
    """A subclass: may compute anything."""


class _OtherBias(RelativePositionBias):
    """A subclass: may compute anything."""


def _swap_norm(model: Transformer) -> None:
    model.decoder.layers[1].cross_sublayer.norm = nn.Identity()


def _swap_attention(model: Transformer) -> None:
    model.decoder.layers[0].self_attn = SelfAttention(32, 4, scale=1.0)


def _swap_cross_attention(model: Transformer) -> None:
    model.decoder.layers[0].cross_attn = CrossAttention(32, 4, head_dim=4, scale=1.0)


def _other_head_size(model: Transformer) -> None:
    model.decoder.layers[1].cross_attn = CrossAttention(32, 8, head_dim=4)  # scale 1/√d_k


def _other_norm_placement(model: Transformer) -> None:
    model.decoder.layers[0].ff_sublayer.norm_first = True  # the config is post-norm


def _add_token_types(model: Transformer) -> None:
    model.decoder.embedder.token_types = nn.Embedding(2, 32)


def _other_bias(model: Transformer) -> None:
    model.decoder.position_bias = _OtherBias(4, bidirectional=False)


def _hook_on_a_layer(model: Transformer) -> None:
    model.decoder.layers[1].feed_forward.register_forward_hook(lambda m, i, o: o * 0.5)


def _custom_projection(model: Transformer) -> None:
    linear = model.decoder.layers[0].self_attn.out_proj
    model.decoder.layers[0].self_attn.out_proj = nn.Sequential(linear, nn.Tanh())


UNKNOWN_PARTS: dict[str, tuple[Callable[[Transformer], None], str]] = {
    "a feed-forward subclass": (
        _swap_feed_forward(lambda d, f: _OtherFeedForward(d, f, "relu")),
        "FeedForward or GatedFeedForward .*got _OtherFeedForward",
    ),
    "a norm of another kind": (_swap_norm, "LayerNorm or RMSNorm, got Identity"),
    "one unscaled self-attention": (_swap_attention, "one attention shape.*scale 1.0"),
    "one unscaled cross-attention": (_swap_cross_attention, "one attention shape.*scale 1.0"),
    "token-type embeddings": (_add_token_types, "without token types"),
    "heads of another size": (_other_head_size, "4 heads of size 8.*got 8 of size 4"),
    "a sub-layer normed first": (_other_norm_placement, "norm_first=False"),
    "a position bias subclass": (_other_bias, "T5's position bias, got _OtherBias"),
    "a forward hook": (_hook_on_a_layer, r"no forward hooks, .* decoder\.layers\.1\.feed_forward"),
    "a custom module for a linear": (
        _custom_projection,
        "PackedLinear or QuantizedLinear, got Sequential",
    ),
}


@pytest.mark.parametrize("part", list(UNKNOWN_PARTS))
@torch.no_grad()
def test_parts_the_fast_step_does_not_compute_run_the_module_step(
    part: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The module step runs any part; where the fast step would compute one otherwise, it runs
    the module step (same log-probs) and says why once, at debug level."""
    torch.manual_seed(0)
    model = Transformer(_base()).eval()
    swap, message = UNKNOWN_PARTS[part]
    swap(model)
    with caplog.at_level(logging.DEBUG, logger="aiayn.decoding.fast_step"):
        _assert_steps_agree(model, steps=4)
        _assert_steps_agree(model, steps=1)  # the same model again: nothing more said
    step = InferenceStep(model)
    assert step.fallback is not None and re.search(message, step.fallback)
    said = [r.getMessage() for r in caplog.records if r.name == "aiayn.decoding.fast_step"]
    assert len(said) == 1 and re.search(message, said[0]), said


# Rows that started at different steps, joined into one batch over one pair of slot pools
# (InferenceState.concat), and rows leaving (their slots freed): every row's log-probs at every
# step are the module step's for its source alone.
MERGE_SOURCES = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14]]


class _Merged:
    """One decode of MERGE_SOURCES' rows, joined and dropped as the test says, each row's
    log-probs checked against its own feed through the module step alone."""

    def __init__(self, model: nn.Module, vocab: int, steps: int):
        g = torch.Generator().manual_seed(1)
        self.feeds = [[BOS, *torch.randint(3, vocab, (steps,), generator=g).tolist()]
                      for _ in MERGE_SOURCES]  # fmt: skip
        self.want = [self._alone(model, i) for i in range(len(MERGE_SOURCES))]
        self.step = InferenceStep(model, banned=())  # type: ignore[arg-type]
        self.pools = self.step.pools(2, 2, 1, 2)  # every one grows on the way
        self.rows: list[int] = []
        self.at: dict[int, int] = {}
        self.state: DecoderState | None = None

    def _alone(self, model: nn.Module, i: int) -> list[torch.Tensor]:
        step, state = encoder_decoder_step(model, _merge_batch([i]), banned=())  # type: ignore[arg-type]
        out = []
        for token in self.feeds[i][:-1]:
            log_probs, state = step(torch.tensor([[token]]), state)
            out.append(log_probs[0])
        return out

    def start(self, rows: list[int]) -> DecoderState:
        self.at.update({r: 0 for r in rows})
        return self.step.initial_state(_merge_batch(rows), capacity=2, pools=self.pools)

    def join(self, rows: list[int], state: DecoderState) -> None:
        self.state = state if self.state is None else join_states([self.state, state])
        self.rows += rows

    def advance(self, steps: int) -> None:
        for _ in range(steps):
            tokens = torch.tensor([[self.feeds[r][self.at[r]]] for r in self.rows])  # (B, 1)
            assert self.state is not None
            got, self.state = self.step(tokens, self.state)
            for i, r in enumerate(self.rows):
                torch.testing.assert_close(got[i], self.want[r][self.at[r]], atol=1e-5, rtol=1e-5)
                self.at[r] += 1

    def drop(self, rows: list[int]) -> None:
        keep = [i for i, r in enumerate(self.rows) if r not in rows]
        assert self.state is not None
        self.state = self.state.index_select(torch.tensor(keep))
        self.rows = [self.rows[i] for i in keep]


def _merge_batch(rows: list[int]) -> torch.Tensor:
    """(b, S) the sources ``rows`` of MERGE_SOURCES, each with EOS, right-padded."""
    width = max(len(MERGE_SOURCES[r]) for r in rows) + 1
    return torch.tensor([[*MERGE_SOURCES[r], EOS] + [PAD] * (width - 1 - len(MERGE_SOURCES[r]))
                         for r in rows])  # fmt: skip


def _assert_merged_rows_agree(model: nn.Module, *, vocab: int = V) -> None:
    """Rows 0, 1 start; row 2 joins before its first step, row 3 after its own first step;
    the oldest rows leave, freeing their slots: each row keeps its own positions throughout."""
    run = _Merged(model, vocab, steps=7)  # the most steps a row runs here
    run.join([0, 1], run.start([0, 1]))
    run.advance(3)  # past a capacity of 2
    run.join([2], run.start([2]))  # 3 pad columns
    run.advance(2)
    late = run.start([3])
    first, late = run.step(torch.tensor([[BOS]]), late)
    torch.testing.assert_close(first[0], run.want[3][0], atol=1e-5, rtol=1e-5)
    run.at[3] = 1
    run.join([3], late)  # 4 pad columns
    run.advance(2)
    run.drop([0, 1])
    assert isinstance(run.state, InferenceState)
    assert run.state.slots.lengths.tolist() == [4, 3]  # no column of the rows that left
    assert run.state.sources.lengths.tolist() == [4, 2]  # the real source tokens
    run.advance(1)
    run.drop([2])
    assert isinstance(run.state, InferenceState) and run.state.slots.lengths.tolist() == [4]
    run.advance(2)
    assert run.pools[0].free == run.pools[0].slots - 1  # only row 3's slot is taken


@pytest.mark.parametrize(("name", "value"), _cases(), ids=lambda x: str(x))
@torch.no_grad()
def test_merged_rows_equal_the_module_step_alone_for_every_option_value(
    name: str, value: object
) -> None:
    model = _option_model(name, value)
    _assert_merged_rows_agree(model, vocab=model.config.target_vocab_size)


@pytest.mark.parametrize("family", ["paper", "T5"])
@torch.no_grad()
def test_merged_rows_of_an_int8_model_equal_its_module_step_alone(family: str) -> None:
    """Quantised (``--quantize int8``, its activations scaled per row): these two models here,
    the other parts in both kinds below."""
    torch.manual_seed(0)
    model = Transformer(_base()).eval() if family == "paper" else _t5("max_len", 4)
    quantize_model(model, "int8")
    _assert_merged_rows_agree(model, vocab=model.config.vocab_size)


@pytest.mark.parametrize("quantize", QUANTIZE)
@pytest.mark.parametrize("part", list(SUPPORTED_PARTS))
@torch.no_grad()
def test_merged_rows_equal_the_module_step_alone_for_other_parts(part: str, quantize: str) -> None:
    """T5's relative position bias among them: one table slice serves every row, the distance
    from a row's query to its own columns being what it is alone."""
    torch.manual_seed(0)
    model = Transformer(_base()).eval()
    SUPPORTED_PARTS[part](model)
    quantize_model(model, quantize)
    _assert_merged_rows_agree(model)


@pytest.mark.parametrize(("name", "value"), T5_CASES, ids=lambda x: str(x))
@torch.no_grad()
def test_merged_rows_equal_the_module_step_alone_for_every_t5_option(
    name: str, value: object
) -> None:
    model = _t5(name, value)
    _assert_merged_rows_agree(model, vocab=model.config.vocab_size)


def test_states_of_the_module_step_do_not_merge() -> None:
    torch.manual_seed(0)
    model = Transformer(_base()).eval()
    model.decoder.layers[0].self_attn = SelfAttention(32, 4, scale=1.0)  # a part it refuses
    step = InferenceStep(model)
    assert step.fallback is not None
    a, b = (step.initial_state(_merge_batch([i])) for i in (0, 1))
    with pytest.raises(ValueError, match="do not join"):
        join_states([a, b])
