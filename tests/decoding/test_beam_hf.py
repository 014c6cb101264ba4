"""``beam_search(length_penalty="hf")`` against Hugging Face ``generate`` itself, token for token.

A small random Marian model is built with transformers; the step function below runs that very
model incrementally (encoder once, decoder with its key/value cache), so that aiayn's search and
``model.generate`` see the same distributions. Mapping of the arguments (the module under test
documents it): ``max_new_tokens`` -> ``max_len``, ``min_new_tokens`` -> ``min_len``,
``length_penalty`` -> ``alpha``, ``early_stopping`` -> ``early_stopping``,
``forced_eos_token_id=eos`` -> ``forced_eos=True``, ``num_return_sequences`` -> ``n_best``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest
import torch
from torch import Tensor

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, EncoderDecoderCache, MarianConfig, MarianMTModel  # noqa: E402
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput  # noqa: E402

from aiayn.decoding import beam_search, greedy_search  # noqa: E402
from aiayn.decoding.beam import hf_length_penalty  # noqa: E402
from aiayn.decoding.step import DecoderState, StepFunction  # noqa: E402

PAD, EOS, VOCAB = 0, 1, 60  # Marian starts the decoder with PAD
Layer = tuple[Tensor, Tensor, Tensor, Tensor]  # self-attn keys, values; cross-attn keys, values


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread is faster, and does not stall when the cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> MarianMTModel:
    """Every parameter redrawn: activations O(1), peaked distributions, EOS now and then."""
    config = MarianConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
        forced_eos_token_id=None,  # MarianConfig's default forces EOS: the tests choose
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed" in name:
                torch.nn.init.normal_(p, std=1.0)
            elif p.dim() == 2:  # (out, in) weights; the output layer's logits have std ≈ 3
                scale = 3.0 if "lm_head" in name else 1.0
                torch.nn.init.normal_(p, std=scale / math.sqrt(p.size(1)))
            else:  # biases and layer-norm gains
                mean = 1.0 if "layer_norm.weight" in name else 0.0
                torch.nn.init.normal_(p, mean=mean, std=0.2)
        torch.nn.init.normal_(model.final_logits_bias, std=0.5)
        model.final_logits_bias[0, EOS] += 7.0  # EOS otherwise never wins
    return model


def _sources(count: int = 20, seed: int = 1) -> list[list[int]]:
    """Source sentences of 1 to 8 tokens (then EOS), none of them PAD or EOS."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (count,), generator=g).tolist()
    return [[*torch.randint(2, VOCAB, (n,), generator=g).tolist(), EOS] for n in lengths]


def _batch(sources: list[list[int]]) -> tuple[Tensor, Tensor]:
    """(B, S) ids padded with PAD, and their (B, S) attention mask."""
    width = max(map(len, sources))
    ids = torch.tensor([s + [PAD] * (width - len(s)) for s in sources])
    return ids, (ids != PAD).long()


@dataclass(frozen=True)
class HFState:
    """The HF model's decoding state, rows ``b·K + k``.

    Attributes:
        memory: (B, S, D) encoder output.
        mask: (B, S) source attention mask.
        cache: per decoder layer, self-attention keys/values (B, H, t, d) and cross-attention
            keys/values (B, H, S, d); None before the first step.
    """

    memory: Tensor
    mask: Tensor
    cache: tuple[Layer, ...] | None = None

    def index_select(self, index: Tensor) -> HFState:
        return self._rows(lambda x: x.index_select(0, index))

    def repeat_interleave(self, repeats: int) -> HFState:
        return self._rows(lambda x: x.repeat_interleave(repeats, dim=0))

    def _rows(self, f: Callable[[Tensor], Tensor]) -> HFState:
        """Apply ``f`` (a batch-row selection) to every tensor."""
        cache = None
        if self.cache is not None:
            cache = tuple((f(sk), f(sv), f(ck), f(cv)) for sk, sv, ck, cv in self.cache)
        return HFState(f(self.memory), f(self.mask), cache)


def _hf_step(model: MarianMTModel, src: Tensor, mask: Tensor) -> tuple[StepFunction, HFState]:
    """Encode once; the step runs the HF decoder on the newest tokens with the cache."""
    with torch.no_grad():
        memory = model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state

    def step(tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        assert isinstance(state, HFState)
        past = None
        if state.cache is not None:
            past = EncoderDecoderCache(
                DynamicCache([c[:2] for c in state.cache]),
                DynamicCache([c[2:] for c in state.cache]),
            )
        out = model(
            encoder_outputs=(state.memory,),
            attention_mask=state.mask,
            decoder_input_ids=tokens,
            past_key_values=past,
            use_cache=True,
        )
        pkv = out.past_key_values
        layers = zip(pkv.self_attention_cache.layers, pkv.cross_attention_cache.layers, strict=True)
        cache = tuple((s.keys, s.values, c.keys, c.values) for s, c in layers)
        log_probs = out.logits[:, -1].float().log_softmax(-1)  # (B, V)
        return log_probs, replace(state, cache=cache)

    return step, HFState(memory, mask)


@dataclass(frozen=True)
class Case:
    """One setting of ``generate``'s beam search."""

    k: int
    alpha: float
    early: bool | str
    forced: bool
    n: int = 1
    max_new: int = 8
    min_new: int = 0


@dataclass(frozen=True)
class Output:
    """One returned sequence: its tokens (no decoder start, EOS or padding) and score."""

    tokens: list[int]
    score: float


def _hf(model: MarianMTModel, sources: list[list[int]], case: Case) -> list[list[Output]]:
    """``model.generate``'s n best sequences per sentence, best first."""
    ids, mask = _batch(sources)
    with torch.no_grad():
        out = model.generate(  # type: ignore[misc]  # HF's self type misses MarianMTModel
            ids,
            attention_mask=mask,
            num_beams=case.k,
            max_new_tokens=case.max_new,
            min_new_tokens=case.min_new,
            length_penalty=case.alpha,
            early_stopping=case.early,
            forced_eos_token_id=EOS if case.forced else None,
            bad_words_ids=None,
            do_sample=False,
            num_return_sequences=case.n,
            output_scores=True,
            return_dict_in_generate=True,
        )
    assert isinstance(out, GenerateBeamEncoderDecoderOutput)
    assert out.sequences_scores is not None
    rows = [_strip(row) for row in out.sequences[:, 1:].tolist()]  # (B·n, T) less the start
    scores = out.sequences_scores.tolist()
    outputs = [Output(r, s) for r, s in zip(rows, scores, strict=True)]
    return [outputs[i : i + case.n] for i in range(0, len(outputs), case.n)]


def _strip(row: list[int]) -> list[int]:
    return row[: row.index(EOS)] if EOS in row else row


def _ours(model: MarianMTModel, sources: list[list[int]], case: Case) -> list[list[Output]]:
    """aiayn's beam search in the "hf" style over the same model."""
    ids, mask = _batch(sources)
    step, state = _hf_step(model, ids, mask)
    hyps = beam_search(
        step,
        state,
        batch_size=len(sources),
        beam_size=case.k,
        bos_id=PAD,
        eos_id=EOS,
        max_len=case.max_new,
        min_len=case.min_new,
        alpha=case.alpha,
        n_best=case.n,
        length_penalty="hf",
        early_stopping=case.early,
        forced_eos=case.forced,
    )
    return [[Output(h.tokens, h.score) for h in sentence] for sentence in hyps]


def _assert_same(ours: list[list[Output]], theirs: list[list[Output]]) -> None:
    """The same sequences in the same order, and the same scores within 1e-4."""
    assert [[o.tokens for o in s] for s in ours] == [[o.tokens for o in s] for s in theirs]
    for mine, hf in zip(ours, theirs, strict=True):
        for a, b in zip(mine, hf, strict=True):
            assert a.score == pytest.approx(b.score, abs=1e-4)


def test_hf_length_penalty_hand_values() -> None:
    assert hf_length_penalty(4, 0.5) == 2.0  # |Y|^α
    assert hf_length_penalty(3, 2.0) == 9.0
    assert hf_length_penalty(7, 0.0) == 1.0
    assert hf_length_penalty(1, 0.6) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length_penalty": "fairseq"}, "fairseq"),
        ({"early_stopping": False}, "length_penalty='hf'"),
        ({"forced_eos": True}, "length_penalty='hf'"),
        ({"length_penalty": "hf", "early_stopping": "always"}, "always"),
        ({"length_penalty": "hf", "max_len": 0}, "max_new_tokens"),
    ],
)
def test_style_arguments_are_checked(kwargs: dict[str, object], message: str) -> None:
    def step(tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        raise AssertionError("never reached")

    class State:
        def repeat_interleave(self, repeats: int) -> State:
            return self

    args: dict[str, object] = {"max_len": 5, **kwargs}
    with pytest.raises(ValueError, match=message):
        beam_search(step, State(), batch_size=1, beam_size=2, bos_id=PAD, eos_id=EOS, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("forced", [False, True], ids=["no forced EOS", "forced EOS"])
@pytest.mark.parametrize("k", [2, 4, 5])
def test_beam_search_matches_generate_batched(model: MarianMTModel, k: int, forced: bool) -> None:
    """20 padded sentences at once, every α × early_stopping; n = K for two α, 1 for the others;
    min_new_tokens 2 at α = 1. The cases are not vacuous: most best outputs end with EOS before
    the limit, some at it, and the three early_stopping values do give different outputs."""
    sources, limit = _sources(), 8 - forced  # the longest output without EOS
    ended = at_limit = 0
    differ: set[str] = set()
    for alpha in (0.6, 1.0, 2.0, 0.0):
        outputs = {}
        for early in (True, False, "never"):
            n = k if alpha in (0.6, 2.0) else 1
            case = Case(k, alpha, early, forced, n=n, min_new=2 if alpha == 1.0 else 0)
            outputs[early] = hf = _hf(model, sources, case)
            _assert_same(_ours(model, sources, case), hf)
            ended += sum(len(s[0].tokens) < limit for s in hf)
            at_limit += sum(len(s[0].tokens) == limit for s in hf)
        differ |= {"True/False"} if outputs[True] != outputs[False] else set()
        differ |= {"False/never"} if outputs[False] != outputs["never"] else set()
    assert ended >= 0.5 * 12 * len(sources) and at_limit >= 12
    assert differ == {"True/False", "False/never"}


@pytest.mark.parametrize(
    "case",
    [
        Case(4, 1.0, False, False, n=4),
        Case(5, 0.6, "never", True, n=1, min_new=3),
        Case(2, 2.0, True, False, n=2, max_new=5),
        Case(5, 2.0, "never", False, n=5),
        Case(2, 0.0, False, True, n=1),
        Case(4, -1.0, "never", False, n=4),  # α < 0: "never" bounds at the current length
    ],
    ids=str,
)
def test_beam_search_matches_generate_alone(model: MarianMTModel, case: Case) -> None:
    """Batch 1, no padding: each sentence decoded on its own."""
    for source in _sources():
        _assert_same(_ours(model, [source], case), _hf(model, [source], case))


@pytest.mark.filterwarnings("ignore:Unfeasible length constraints")
@pytest.mark.parametrize(
    "case",
    [
        Case(3, 1.0, False, False, n=3, max_new=1),  # the first step is the last
        Case(3, 1.0, True, True, n=1, max_new=1),  # ... and EOS is forced there
        Case(3, 0.6, False, False, n=3, max_new=2, min_new=5),  # EOS never allowed
        Case(3, 0.6, "never", True, n=3, max_new=3, min_new=5),  # forced EOS beats min_new
        Case(4, 2.0, True, True, n=2, max_new=4, min_new=1),
    ],
    ids=str,
)
def test_short_limits_and_min_new_tokens(model: MarianMTModel, case: Case) -> None:
    _assert_same(_ours(model, _sources(), case), _hf(model, _sources(), case))


def test_per_sentence_limits_equal_generate_with_each_limit(model: MarianMTModel) -> None:
    """A (B,) max_len: each sentence ends as ``generate`` with its own max_new_tokens."""
    sources = _sources()
    limits = [2 + i % 7 for i in range(len(sources))]
    ids, mask = _batch(sources)
    step, state = _hf_step(model, ids, mask)
    together = beam_search(
        step,
        state,
        batch_size=len(sources),
        beam_size=3,
        bos_id=PAD,
        eos_id=EOS,
        max_len=torch.tensor(limits),
        alpha=1.0,
        n_best=3,
        length_penalty="hf",
        early_stopping=False,
    )
    for source, limit, hyps in zip(sources, limits, together, strict=True):
        hf = _hf(model, [source], Case(3, 1.0, False, False, n=3, max_new=limit))
        _assert_same([[Output(h.tokens, h.score) for h in hyps]], hf)


@pytest.mark.parametrize(("forced", "min_new"), [(False, 0), (True, 0), (False, 3)])
def test_greedy_search_matches_generate_greedy(
    model: MarianMTModel, forced: bool, min_new: int
) -> None:
    """HF greedy (num_beams=1) with max_new_tokens M is greedy_search with max_len M, or M − 1
    when EOS is forced at the M-th token."""
    sources, m = _sources(), 8
    ids, mask = _batch(sources)
    with torch.no_grad():
        out = model.generate(  # type: ignore[misc]  # HF's self type misses MarianMTModel
            ids,
            attention_mask=mask,
            num_beams=1,
            do_sample=False,
            max_new_tokens=m,
            min_new_tokens=min_new,
            forced_eos_token_id=EOS if forced else None,
        )
    hf = [_strip(row) for row in out[:, 1:].tolist()]
    step, state = _hf_step(model, ids, mask)
    ours = greedy_search(
        step,
        state,
        bos_id=PAD,
        eos_id=EOS,
        max_len=m - forced,
        min_len=min_new,
        batch_size=len(sources),
    )
    assert ours == hf
    assert 0 < sum(len(o) < m - forced for o in ours) < len(ours)  # EOS and the limit both
