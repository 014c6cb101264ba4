"""The decoder-only step (prefill + cached steps) and text generation with GPT-2: against the full
forward pass, against each prompt decoded alone, and against Hugging Face ``generate``."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from aiayn.decoding import (
    GenerateOptions,
    LMState,
    decoder_only_step,
    generate,
    generate_ids,
    greedy_search,
    sample,
)
from aiayn.decoding.generate import prompt_generator
from aiayn.errors import UserError
from aiayn.inference.quantize import quantize_model
from aiayn.models.gpt2 import GPT2, GPT2Config

V = 211
PROMPTS = [[5, 17, 42, 8, 99, 3, 150], [60, 7], [11, 12, 13, 14], [200, 1, 77, 9, 31]]


def _tiny(eos: int = 0, **overrides: Any) -> GPT2Config:
    fields: dict[str, Any] = {
        "vocab_size": V,
        "max_len": 96,
        "d_model": 32,
        "num_heads": 4,
        "num_layers": 2,
        "dropout": 0.0,
        "embedding_dropout": 0.0,
        "attention_dropout": 0.0,
        "bos_id": eos,
        "eos_id": eos,
        "pad_id": eos,
    }
    return GPT2Config(**{**fields, **overrides})


@pytest.fixture(scope="module")
def model() -> GPT2:
    torch.manual_seed(0)
    m = GPT2(_tiny())
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:  # random LayerNorm biases make one token win everywhere
                p.normal_(0, 0.3)  # far from uniform, and greedy outputs do not collapse
    return m.eval()


def _full_log_probs(model: GPT2, ids: list[int]) -> torch.Tensor:
    """(T, V) log-probabilities of the model run on ``ids`` alone, no cache."""
    with torch.no_grad():
        return model.log_probs(model(torch.tensor([ids])).hidden)[0]


def _run_steps(model: GPT2, prompts: list[list[int]], cont: list[list[int]]) -> list[torch.Tensor]:
    """The step's (B, V) outputs: the first call (prefill) and one per continuation token."""
    step, state = decoder_only_step(model, prompts, max_new_tokens=len(cont[0]) + 1)
    bos = torch.zeros(len(prompts), 1, dtype=torch.long)
    log_probs, state = step(bos, state)
    outputs = [log_probs]
    for t in range(len(cont[0])):
        log_probs, state = step(torch.tensor([[c[t]] for c in cont]), state)
        outputs.append(log_probs)
    return outputs


BATCHES = {
    "unpadded": [PROMPTS[2], PROMPTS[2][::-1], [1, 2, 3, 4]],
    "padded": [PROMPTS[0], PROMPTS[1], PROMPTS[2]],
    "one-token prompt": [[9], PROMPTS[3], PROMPTS[1]],
}


@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("batch", BATCHES)
def test_cached_steps_equal_the_full_forward(model: GPT2, batch: str, quantize: str) -> None:
    """Also int8-quantised (``--quantize int8``): the cached steps equal the quantised model's
    full forward (activations are quantised per row, whatever else is in the batch)."""
    model = quantize_model(copy.deepcopy(model), quantize)
    prompts = BATCHES[batch]
    cont = [[(13 * r + 7 * t) % V for t in range(6)] for r in range(len(prompts))]
    outputs = _run_steps(model, prompts, cont)
    for r, (prompt, c) in enumerate(zip(prompts, cont, strict=True)):
        full = _full_log_probs(model, prompt + c)  # (T, V)
        for t, out in enumerate(outputs):
            torch.testing.assert_close(out[r], full[len(prompt) - 1 + t], atol=2e-5, rtol=0)


def test_each_row_keeps_its_own_positions_in_its_own_slot(model: GPT2) -> None:
    step, state = decoder_only_step(model, [PROMPTS[0], PROMPTS[1]], max_new_tokens=2)
    assert state.slots.lengths.tolist() == [7, 2]  # no padding column is cached
    assert len(set(state.slots.rows.tolist())) == 2
    bos = torch.zeros(2, 1, dtype=torch.long)
    _, state = step(bos, state)  # the prompt's log-probs: nothing written
    _, state = step(bos, state)
    assert isinstance(state, LMState) and state.length == 8
    assert state.slots.lengths.tolist() == [8, 3]
    pool = state.slots.pool
    free = pool.free
    state.index_select(torch.tensor([1, 1]))  # row 0 leaves, row 1 is continued twice
    assert pool.free == free  # row 0's slot holds the copy


def test_the_padding_grows_past_its_first_capacity(model: GPT2) -> None:
    prompts = [PROMPTS[0], PROMPTS[1]]
    step, state = decoder_only_step(model, prompts)  # no max_new_tokens: capacity P + 64
    outs = greedy_search(step, state, bos_id=0, eos_id=0, max_len=80, min_len=80, batch_size=2)
    assert outs[1] == _alone(
        model, prompts[1], GenerateOptions(max_new_tokens=80, min_new_tokens=80)
    )
    assert len(outs[1]) == 80


def _alone(model: GPT2, prompt: list[int], options: GenerateOptions) -> list[int]:
    return generate_ids(model, [prompt], options)[0][0].tokens


METHODS = {
    "greedy": GenerateOptions(max_new_tokens=15),
    "beam": GenerateOptions(max_new_tokens=15, method="beam", beam_size=3, alpha=0.6),
    "sample": GenerateOptions(max_new_tokens=15, method="sample", top_k=50, top_p=0.95, seed=7),
    "sample-hot": GenerateOptions(max_new_tokens=15, method="sample", temperature=1.5, seed=1),
}


@pytest.mark.parametrize("method", METHODS)
def test_each_prompt_of_a_batch_gets_its_output_alone(model: GPT2, method: str) -> None:
    options = METHODS[method]
    batched = [h[0].tokens for h in generate_ids(model, PROMPTS, options)]
    alone = [_alone(model, p, options) for p in PROMPTS]
    assert batched == alone
    assert sum(len(o) for o in batched) >= 20  # they are not all cut short by EOS
    assert len({tuple(o) for o in batched}) == len(PROMPTS)


def test_a_batch_smaller_than_the_prompts_keeps_input_order(model: GPT2) -> None:
    options = GenerateOptions(max_new_tokens=10)
    all_at_once = generate_ids(model, PROMPTS, options)
    in_pairs = generate_ids(model, PROMPTS, GenerateOptions(max_new_tokens=10, batch_size=2))
    assert [h[0].tokens for h in in_pairs] == [h[0].tokens for h in all_at_once]
    assert [h[0].tokens for h in all_at_once] == [_alone(model, p, options) for p in PROMPTS]


def test_seeded_samples_are_reproducible_and_seeds_differ(model: GPT2) -> None:
    def draw(seed: int) -> list[list[int]]:
        options = GenerateOptions(max_new_tokens=12, method="sample", seed=seed)
        return [h[0].tokens for h in generate_ids(model, PROMPTS, options)]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)


def test_each_prompt_draws_from_its_own_seeded_stream() -> None:
    def draw(seed: int, prompt: list[int]) -> list[float]:
        return torch.rand(4, generator=prompt_generator(seed, prompt, torch.device("cpu"))).tolist()

    assert draw(1, [5, 6]) == draw(1, [5, 6])
    assert draw(1, [5, 6]) != draw(1, [5, 7])
    assert draw(1, [5, 6]) != draw(2, [5, 6])


def test_beam_1_equals_greedy(model: GPT2) -> None:
    greedy = generate_ids(model, PROMPTS, GenerateOptions(max_new_tokens=20, min_new_tokens=3))
    beam = generate_ids(
        model,
        PROMPTS,
        GenerateOptions(max_new_tokens=20, min_new_tokens=3, method="beam", beam_size=1),
    )
    assert [h[0].tokens for h in beam] == [h[0].tokens for h in greedy]
    assert all(math.isfinite(h[0].score) for h in beam)


def test_beam_n_best_are_distinct_and_sorted(model: GPT2) -> None:
    options = GenerateOptions(max_new_tokens=8, method="beam", beam_size=4, n_best=3)
    for hyps in generate_ids(model, PROMPTS[:2], options):
        assert len(hyps) == 3 and len({tuple(h.tokens) for h in hyps}) == 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_index_select_and_repeat_interleave_reorder_every_part(model: GPT2) -> None:
    """A state is used once: selecting rows hands their slots on (copies for rows picked twice),
    so each case starts from its own prefill."""
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2]]  # lengths 7, 2, 4

    def started(steps: int) -> tuple[Any, LMState]:
        step, state = decoder_only_step(model, prompts, max_new_tokens=4)
        for _ in range(steps):
            _, state = step(torch.zeros(3, 1, dtype=torch.long), state)  # type: ignore[assignment]
        return step, state

    index = torch.tensor([2, 0, 0, 1])
    step, state = started(0)
    pending = state.pending
    assert pending is not None
    first, _ = step(torch.zeros(4, 1, dtype=torch.long), state.index_select(index))
    torch.testing.assert_close(first, pending[index], atol=0, rtol=0)  # the pending follow
    tokens = torch.tensor([[21], [22], [23]])
    step, state = started(1)
    expected, _ = step(tokens, state)  # (3, V)
    step, state = started(1)
    got, _ = step(tokens[index], state.index_select(index))
    torch.testing.assert_close(got, expected[index], atol=2e-5, rtol=0)
    step, state = started(1)
    got, _ = step(tokens.repeat_interleave(2, dim=0), state.repeat_interleave(2))  # 0, 0, 1, ...
    torch.testing.assert_close(got, expected.repeat_interleave(2, dim=0), atol=2e-5, rtol=0)


def test_a_state_stepped_twice_gives_the_same_output(model: GPT2) -> None:
    """Two continuations of one state (beam search's siblings) never see each other's writes."""
    step, state = decoder_only_step(model, [PROMPTS[0], PROMPTS[1]], max_new_tokens=4)
    _, state = step(torch.zeros(2, 1, dtype=torch.long), state)
    a, _ = step(torch.tensor([[21], [22]]), state)
    step(torch.tensor([[40], [41]]), state)  # a sibling writes the same column
    again, _ = step(torch.tensor([[21], [22]]), state)
    torch.testing.assert_close(again, a, atol=0, rtol=0)


@pytest.mark.parametrize("search", ["greedy", "sample"])
def test_n_new_tokens_take_n_model_passes(model: GPT2, search: str) -> None:
    """The prefill gives the first new token, one pass each the others; the searches end the
    rows at their length limit with EOS without running the step once more."""
    calls = []
    hook = model.final_norm.register_forward_hook(lambda *_: calls.append(1))
    ends = {"bos_id": 0, "eos_id": 0, "max_len": 12, "min_len": 12, "batch_size": 4}
    try:
        step, state = decoder_only_step(model, PROMPTS, max_new_tokens=12)
        if search == "greedy":
            outputs = greedy_search(step, state, **ends)
        else:
            outputs = sample(step, state, **ends, generator=torch.Generator().manual_seed(0))
    finally:
        hook.remove()
    assert len(calls) == 12  # prefill + 11 steps
    assert all(len(o) == 12 for o in outputs)


def test_refuses_bad_prompts_naming_the_numbers(model: GPT2) -> None:
    with pytest.raises(UserError, match="prompt 1 is empty"):
        decoder_only_step(model, [[1, 2], []])
    with pytest.raises(
        UserError,
        match="prompt 0 has 10 tokens: with 87 new tokens it needs 97 positions, more than "
        "max_len = 96",
    ):
        decoder_only_step(model, [[1] * 10], max_new_tokens=87)
    decoder_only_step(model, [[1] * 10], max_new_tokens=86)  # exactly max_len: fine
    with pytest.raises(UserError, match=f"id {V}, outside the vocabulary 0..{V - 1}"):
        decoder_only_step(model, [[1, V]])
    with pytest.raises(UserError, match="prompt 2 has 90 tokens"):
        generate_ids(model, [[1], [2], [3] * 90], GenerateOptions(max_new_tokens=10))
    with pytest.raises(UserError, match="no prompts"):
        decoder_only_step(model, [])
    assert generate_ids(model, []) == [] and generate(model, _Letters(), []) == []


def test_refuses_a_training_model() -> None:
    model = GPT2(_tiny())
    with pytest.raises(ValueError, match="eval"):
        decoder_only_step(model, [[1, 2]])


def test_decoding_past_max_len_is_refused() -> None:
    model = GPT2(_tiny(max_len=8)).eval()
    step, state = decoder_only_step(model, [[1, 2, 3]])
    with pytest.raises(UserError, match="max_len = 8"):
        greedy_search(step, state, bos_id=0, eos_id=0, max_len=20, min_len=20, batch_size=1)


def test_pad_and_bos_are_banned_unless_they_are_eos() -> None:
    torch.manual_seed(1)
    model = GPT2(_tiny(bos_id=1, eos_id=2, pad_id=0)).eval()
    step, state = decoder_only_step(model, [[5, 6], [7]])
    first, state = step(torch.ones(2, 1, dtype=torch.long), state)
    later, _ = step(torch.tensor([[3], [4]]), state)
    for log_probs in (first, later):
        assert torch.isinf(log_probs[:, :2]).all() and torch.isfinite(log_probs[:, 2:]).all()
    _, state = decoder_only_step(model, [[5, 6]], banned=())
    assert state.pending is not None and torch.isfinite(state.pending).all()


BAD_OPTIONS = [
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ({"max_new_tokens": 2.5}, r"max_new_tokens has the wrong type: 2.5 \(expected an integer\)"),
    ({"max_new_tokens": True}, r"max_new_tokens has the wrong type: True \(expected an integer"),
    ({"min_new_tokens": -1}, "min_new_tokens must be >= 0, got -1"),
    ({"min_new_tokens": 51}, "min_new_tokens must be between 0 and 50 .*, got 51"),
    ({"method": "top"}, "method must be one of 'greedy', 'beam', 'sample', got 'top'"),
    ({"beam_size": 0}, r"beam_size must be in \[1, 1000\], got 0"),
    ({"n_best": 5, "method": "beam"}, "n_best must be between 1 and 4 .*, got 5"),
    ({"n_best": 2}, "n_best = 2 needs method 'beam', got 'greedy'"),
    ({"alpha": -0.1}, r"alpha must be in \[0, 10\], got -0.1"),
    ({"alpha": math.nan}, r"alpha must be in \[0, 10\], got nan"),
    ({"alpha": 1e308}, r"alpha must be in \[0, 10\], got 1e\+308"),
    ({"temperature": 0.0}, "temperature must be finite and > 0, got 0.0"),
    ({"temperature": math.inf}, "temperature must be finite .* got inf"),
    ({"top_k": 0}, "top_k must be >= 1, got 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
    ({"top_p": math.nan}, r"top_p must be in \(0, 1\], got nan"),
    ({"seed": -1}, r"seed must be in \[0, 2\*\*63\), got -1"),
    ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_OPTIONS, ids=[str(f) for f, _ in BAD_OPTIONS])
def test_options_refuse_bad_values_by_name(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(UserError, match=message):
        GenerateOptions(**fields)


class _Letters:
    """A one-character-per-token tokenizer that joins tokens with spaces, as word-level ones do
    (BOS, id 0, is skipped on decoding)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 0x4E00 for c in text if c != " "]

    def decode(self, ids: Any) -> str:
        return " ".join(chr(0x4E00 + i) for i in ids if i > 0)


def test_generate_returns_the_new_text_in_input_order(model: GPT2) -> None:
    ids = [[7, 8, 9], [30, 31, 32], [0]]  # an empty prompt starts from BOS (0)
    texts = [_Letters().decode(ids[0]), _Letters().decode(ids[1]), ""]
    options = GenerateOptions(max_new_tokens=6, min_new_tokens=6)
    out = generate(model, _Letters(), texts, options)
    new = [_Letters().decode(h[0].tokens) for h in generate_ids(model, ids, options)]
    assert out == [" " + new[0], " " + new[1], new[2]]  # the space a joined decode puts
    assert all(len(n.split()) == 6 for n in new)
    assert generate(model, _Letters(), texts[1:2], options) == out[1:2]


# -- against Hugging Face ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, GPT2]:
    """A random Hugging Face GPT-2 and the same weights as aiayn's, through the converter."""
    transformers = pytest.importorskip("transformers")
    from aiayn.convert.gpt2 import gpt2_from_hf

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=V,
        n_positions=96,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ".ln_" not in name:  # as in the `model` fixture
                p.normal_(0, 0.3)
    folder = tmp_path_factory.mktemp("hf_gpt2")
    hf.save_pretrained(folder)
    ours, _ = gpt2_from_hf(folder)
    return hf, ours.eval()


def _with_eos(model: GPT2, eos: int) -> GPT2:
    """The same weights with ``eos`` as GPT-2's one special token (BOS = EOS = PAD)."""
    other = GPT2(model.config.replace(bos_id=eos, eos_id=eos, pad_id=eos))
    other.load_state_dict(model.state_dict())
    return other.eval()


def _hf_greedy(hf: Any, prompts: list[list[int]], eos: int, min_new: int) -> list[list[int]]:
    """Hugging Face's greedy continuation of left-padded prompts, cut at the first EOS."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts])  # (B, P)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # (B, P)
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=50,
            min_new_tokens=min_new,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    rows = out[:, width:].tolist()
    return [row[: row.index(eos)] if eos in row else row for row in rows]


def _latest_first_token(tokens: list[int]) -> int:
    """The token of ``tokens`` whose first occurrence comes last (an EOS that ends it latest)."""
    first: dict[int, int] = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    return max(first, key=lambda t: first[t])


@pytest.mark.parametrize("batch", [[PROMPTS[0]], PROMPTS], ids=["batch 1", "left-padded batch"])
def test_greedy_50_tokens_equal_hugging_face_generate(
    hf_pair: tuple[Any, GPT2], batch: list[list[int]]
) -> None:
    """EOS held back (min_new_tokens = 50 on both sides): all 50 tokens compared; then with an
    EOS that the first prompt produces at some step: both stop each row at the same token."""
    hf, ours = hf_pair
    expected = _hf_greedy(hf, batch, 0, 50)
    for pack in (False, True):  # the model's own linear layers, and oneDNN-packed ones (CPU)
        full = GenerateOptions(max_new_tokens=50, min_new_tokens=50, pack=pack)
        assert [h[0].tokens for h in generate_ids(ours, batch, full)] == expected
    assert all(len(g) == 50 for g in expected) and len(set(expected[0])) >= 5
    eos = _latest_first_token(expected[0])
    stopping = _with_eos(ours, eos)
    expected = _hf_greedy(hf, batch, eos, 0)
    for pack in (False, True):
        options = GenerateOptions(max_new_tokens=50, pack=pack)
        assert [h[0].tokens for h in generate_ids(stopping, batch, options)] == expected
    assert 0 < len(expected[0]) < 50


def test_generation_gives_the_models_mode_back(model: GPT2) -> None:
    model.train()
    generate_ids(model, PROMPTS[:2], GenerateOptions(max_new_tokens=3, pack=False))
    assert model.training
    model.eval()
