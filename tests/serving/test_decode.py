"""Decode groups (aiayn.serving.decode): generation groups started at different steps merge into
one batch, and every request still gets the library's answer for its input alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiayn.checkpoint import load_checkpoint
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.models.gpt2 import GPT2
from aiayn.serving import load_served_model
from aiayn.serving.decode import _merge_groups
from aiayn.serving.engine import Job
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.schemas import CompletionRequest

PROMPTS = ["the cat sleeps on", "a", "two men", "hello world the cat"]


def test_generation_groups_merge_and_answer_as_alone(checkpoints: dict[str, Path]) -> None:
    lm = load_served_model("lm", checkpoints["lm"], ServeOptions(), Metrics()).tasks["generate"]

    async def jobs() -> list[Job]:
        return [lm.prepare(CompletionRequest(prompt=p, max_tokens=8 + i), 0)  # type: ignore[attr-defined]
                for i, p in enumerate(PROMPTS)]  # fmt: skip

    made = asyncio.run(jobs())
    first = lm.start(made[:2])  # type: ignore[attr-defined]
    answers = {}
    for _ in range(3):
        answers.update({id(j): r for j, r in first.advance()[0]})
    second = lm.start(made[2:])  # type: ignore[attr-defined]
    answers.update({id(j): r for j, r in second.advance()[0]})
    groups = [first, second]
    _merge_groups(groups)
    assert groups == [first] and second.done and first.rows == 4 - len(answers)
    while not first.done:
        answers.update({id(j): r for j, r in first.advance()[0]})
    c = load_checkpoint(checkpoints["lm"], expect=GPT2)
    tok = load_lm_tokenizer(c.tokenizer_path)
    for i, job in enumerate(made):
        expected = generate(c.model, tok, [PROMPTS[i]], GenerateOptions(max_new_tokens=8 + i))
        assert answers[id(job)].choices[0].text == expected[0]
