"""aiayn's translation of converted Hugging Face encoder–decoders (T5 v1.0 and v1.1, Marian)
against transformers' own ``generate`` with the same settings: token-identical outputs, greedy
and beam 4, batched and one sentence at a time; and rows that join a running stepwise search
(``aiayn serve``) against the library's search of each alone.

The models are tiny, with every parameter drawn at random and EOS made likelier than chance, so
that some outputs end by EOS and others at the length limit (both are asserted)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import MarianConfig, MarianMTModel, T5ForConditionalGeneration
from transformers import T5Config as HFT5Config

from aiayn.convert import from_hf
from aiayn.decoding import InferenceState, InferenceStep
from aiayn.decoding.greedy import greedy_search
from aiayn.decoding.sampling import sample
from aiayn.decoding.stepwise import Sampling, SteppedSearch
from aiayn.decoding.translate import (
    options_for_checkpoint,
    output_limits,
    source_batch,
    translate_ids,
)

V = 60
M = 9  # max_new_tokens
SOURCES = 20


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random: weights N(0, 0.4), norms N(1, 0.2) (their biases N(0, 0.2));
    Marian's sinusoid tables stay (they are computed, not stored)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue
            if "layer_norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
            else:
                p.normal_(0, 0.4)


def hf_t5(style: str) -> T5ForConditionalGeneration:
    config = HFT5Config(
        vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=12,
        feed_forward_proj="relu" if style == "v1.0" else "gated-gelu",
        decoder_start_token_id=0,
    )  # fmt: skip
    if style == "v1.1":
        config.tie_word_embeddings = False
    model = T5ForConditionalGeneration(config)
    model.encoder.set_input_embeddings(model.shared)
    model.decoder.set_input_embeddings(model.shared)
    _randomise(model, 3)
    with torch.no_grad():  # EOS (1) likelier than chance
        model.lm_head.weight[1] *= 3 if style == "v1.1" else 2
    return model.eval()


def hf_marian() -> MarianMTModel:
    config = MarianConfig(
        vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=64, activation_function="swish", scale_embedding=True,
        pad_token_id=V - 1, decoder_start_token_id=V - 1, eos_token_id=0, forced_eos_token_id=0,
        bad_words_ids=[[V - 1]], num_beams=4,
    )  # fmt: skip
    model = MarianMTModel(config)
    _randomise(model, 4)
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.5)
        model.final_logits_bias[0, 0] += 6.0  # EOS (0)
    return model.eval()


MODELS = {"t5-v1.0": lambda: hf_t5("v1.0"), "t5-v1.1": lambda: hf_t5("v1.1"), "marian": hf_marian}


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    hf = MODELS[request.param]()
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    converted = from_hf(folder)
    assert converted.generation is not None
    return hf, converted.model, converted.generation


def sources(eos: int, pad: int) -> list[list[int]]:
    """Random sources of 1..12 ids, none special."""
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(1, 13, (SOURCES,), generator=g).tolist()
    ids = [i for i in range(V) if i not in (eos, pad, 1)]
    return [
        [ids[j] for j in torch.randint(0, len(ids), (n,), generator=g).tolist()] for n in lengths
    ]


def hf_generate(
    hf: Any, rows: list[list[int]], eos: int, pad: int, **settings: Any
) -> list[list[int]]:
    """transformers' outputs for ``rows`` (each + EOS, right padded), without start, EOS, pad."""
    width = max(map(len, rows)) + 1
    ids = torch.full((len(rows), width), pad)
    for r, row in enumerate(rows):
        ids[r, : len(row) + 1] = torch.tensor([*row, eos])
    out = hf.generate(
        input_ids=ids, attention_mask=(ids != pad).long(), do_sample=False, max_new_tokens=M,
        **settings,
    )  # fmt: skip
    results = []
    for row in out[:, 1:].tolist():
        results.append(row[: row.index(eos)] if eos in row else row)  # pad may be an output
    return results


@pytest.mark.parametrize("beam", [1, 4])
def test_outputs_equal_hugging_face_generate(pair: Any, beam: int) -> None:
    hf, model, specials = pair
    eos, pad = specials.eos_id, specials.pad_id
    rows = sources(eos, pad)
    generation = dataclasses.asdict(specials)
    options = options_for_checkpoint(
        generation, beam_size=beam, extra_len=1000, max_new_tokens=M, max_tokens=64
    )
    tokenizer = SimpleNamespace(pad_id=pad, eos_id=eos, bos_id=specials.decoder_start_id)
    ours = [h[0].tokens for h in translate_ids(model, rows, tokenizer, options)]  # type: ignore[arg-type]
    settings: dict[str, Any] = {"num_beams": beam}
    if specials.banned_ids:
        settings["bad_words_ids"] = [[t] for t in specials.banned_ids]
    settings["forced_eos_token_id"] = eos if specials.forced_eos else None
    batched = hf_generate(hf, rows, eos, pad, **settings)
    alone = [hf_generate(hf, [row], eos, pad, **settings)[0] for row in rows]
    assert ours == batched == alone
    full = sum(len(o) >= M - int(specials.forced_eos) for o in ours)
    assert 0 < full < len(ours), "want outputs ending by EOS and at the limit"


class _Searches:
    """Stepwise searches of the converted model, as ``aiayn serve`` runs them: its flattened
    step (renormalised where the model's settings say so), its limits."""

    def __init__(self, model: Any, specials: Any, rows: list[list[int]], sampled: bool):
        generation = dataclasses.asdict(specials)
        self.o = options_for_checkpoint(generation, beam_size=1, max_new_tokens=M)
        self.tok = SimpleNamespace(pad_id=specials.pad_id, eos_id=specials.eos_id,
                                   bos_id=specials.decoder_start_id)  # fmt: skip
        banned = (self.tok.pad_id, self.tok.bos_id) if self.o.banned is None else self.o.banned
        self.step = InferenceStep(model, banned=banned, renormalize=self.o.renormalize)
        self.pools = self.step.pools(2, 2, 2, 2)  # both grow on the way
        cut = 1 if self.o.forced_eos else 0
        limits = output_limits(model, self.o, [len(r) for r in rows])
        self.rows, self.limits, self.sampled = rows, [max(0, m - cut) for m in limits], sampled

    def generators(self, ids: list[int]) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(11 + i) for i in ids]

    def search(self, ids: list[int]) -> SteppedSearch:
        src = source_batch([self.rows[i] for i in ids], self.tok)  # type: ignore[arg-type]
        state = self.step.initial_state(src, capacity=max(self.limits) + 1, pools=self.pools)
        return SteppedSearch(
            self.step, state, ids, [self.limits[i] for i in ids], bos_id=self.tok.bos_id,
            eos_id=self.tok.eos_id, min_len=self.o.min_len,
            sampling=Sampling(0.8) if self.sampled else None,
            generators=self.generators(ids) if self.sampled else None,
        )  # fmt: skip

    def alone(self, i: int) -> list[int]:
        """The library's search of row i alone (greedy_search, or sample with its generator)."""
        state = self.step.initial_state(source_batch([self.rows[i]], self.tok))  # type: ignore[arg-type]
        ends = {"bos_id": self.tok.bos_id, "eos_id": self.tok.eos_id, "batch_size": 1,
                "max_len": self.limits[i], "min_len": self.o.min_len}  # fmt: skip
        if self.sampled:
            return sample(self.step, state, **ends, temperature=0.8,
                          generator=self.generators([i]))[0]  # fmt: skip
        return greedy_search(self.step, state, **ends)[0]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampling"])
def test_rows_that_join_a_running_search_get_what_they_get_alone(pair: Any, sampled: bool) -> None:
    """Rows 0-3 start; rows 4-7 join before their first step, rows 8-11 after theirs (other
    source lengths, each row over its own); rows leave as they end, freeing their slots: every
    row's output is the library's for it alone."""
    _, model, specials = pair
    runs = _Searches(model, specials, sources(specials.eos_id, specials.pad_id)[:12], sampled)
    a, out = runs.search(list(range(4))), {}
    for _ in range(3):
        out.update({r.key: r.tokens for r in a.advance()})
    running = len(a.rows)
    a.merge(runs.search(list(range(4, 8))))
    out.update({r.key: r.tokens for r in a.advance()})
    c = runs.search(list(range(8, 12)))
    out.update({r.key: r.tokens for r in c.advance()})
    a.merge(c)
    assert isinstance(a.state, InferenceState) and len(set(a.state.slots.lengths.tolist())) > 1
    while not a.done:
        out.update({r.key: r.tokens for r in a.advance()})
    assert runs.pools[0].free == runs.pools[0].slots  # every slot freed
    assert running > 0, "want rows of the first search still running when others join"
    assert out == {i: runs.alone(i) for i in range(12)}
    lengths = [len(out[i]) for i in range(12)]
    assert lengths != runs.limits, "want outputs ending by EOS"
