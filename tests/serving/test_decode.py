"""Decode groups (aiayn.serving.decode): generation and greedy translation groups started at
different steps merge into one batch, and every request still gets the library's answer for its
input alone."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from aiayn.checkpoint import load_checkpoint, load_translation_tokenizer
from aiayn.data import normalize
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.decoding.translate import options_for_checkpoint, translate_ids
from aiayn.inference.packed import pack_for_inference
from aiayn.models.gpt2 import GPT2
from aiayn.serving import load_served_model
from aiayn.serving.decode import DecodeEngine, _merge_groups
from aiayn.serving.engine import Job
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.schemas import CompletionRequest, TranslateRequest
from aiayn.settings import performance_settings

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


TEXTS = ["a small dog runs on the mat", "two men", "the cat sleeps", "hello"]


def _translate_offline(folder: Path, text: str, max_new_tokens: int, beam: int = 1) -> str:
    """The library's answer for ``text`` alone (greedy or ``beam``, the served model's packed
    copy run with ``pack=False``: the same arithmetic as ``pack=True``)."""
    c = load_checkpoint(folder)
    tok = load_translation_tokenizer(c.path)
    options = options_for_checkpoint(
        None, beam_size=beam, max_new_tokens=max_new_tokens, pack=False
    )
    found = translate_ids(pack_for_inference(c.model), tok.encode_batch([normalize(text)]), tok,
                          options)  # fmt: skip
    return tok.decode_batch([found[0][0].tokens])[0]


def _counted(task: Any, calls: list[int], then: Callable[[int], None] = lambda n: None) -> None:
    """Count the rows of each call of ``task``'s search step (and call ``then`` with the count
    of calls after each)."""
    inner = task.search_step

    def step(tokens: torch.Tensor, state: Any) -> Any:
        calls.append(tokens.size(0))
        then(len(calls))
        return inner(tokens, state)

    task.search_step = step


def _through_worker(
    task: Any, requests: list[Any], calls: list[int], on_call: Callable[[int, list[Job]], None]
) -> list[Any]:
    """The answers to ``requests``: the first submitted to ``task``'s started worker(s), the
    others by ``on_call(n, jobs)``, called at each model call with the calls so far (the rows of
    each counted into ``calls``); the worker(s) stopped after."""
    engine = task.engine

    async def run() -> list[Any]:
        made = [task.prepare(r) for r in requests]
        _counted(task, calls, lambda n: on_call(n, made))
        engine.start()
        engine.submit(made[0])
        try:
            return list(await asyncio.wait_for(asyncio.gather(*(j.future for j in made)), 60))
        finally:
            engine.stop()

    return asyncio.run(run())


@pytest.mark.parametrize("beam", [1, 2])
def test_translation_groups_merge_and_answer_as_alone(
    checkpoints: dict[str, Path], beam: int
) -> None:
    """A group started 3 steps later (other source lengths) joins the running one before its
    first step: one model call per step from then on, over both groups' rows (greedy rows, or
    each beam search's beams); every answer is the library's for its text alone."""
    mt = load_served_model("mt", checkpoints["mt"], ServeOptions(), Metrics()).tasks["translate"]
    limits = [5, 4, 9, 8]

    async def jobs() -> list[Job]:
        return [mt.prepare(TranslateRequest(texts=[t], beam=beam, max_new_tokens=m))  # type: ignore[attr-defined]
                for t, m in zip(TEXTS, limits, strict=True)]  # fmt: skip

    made, calls = asyncio.run(jobs()), []
    _counted(mt, calls)
    first = mt.start(made[:2])  # type: ignore[attr-defined]
    answers = {}
    for _ in range(3):
        answers.update({id(j): r for j, r in first.advance()[0]})
    kept = first.rows
    second = mt.start(made[2:])  # type: ignore[attr-defined]
    groups = [first, second]
    _merge_groups(groups)
    assert groups == [first] and second.done
    while not first.done:
        before = len(calls)
        answers.update({id(j): r for j, r in first.advance()[0]})
        assert len(calls) - before <= 1
    assert calls[:3] == [2 * beam] * 3 and calls[3] == kept + 2 * beam
    assert len(calls) <= 3 + max(limits[2:]) + 1
    for job, text, limit in zip(made, TEXTS, limits, strict=True):
        want = _translate_offline(checkpoints["mt"], text, limit, beam)
        assert answers[id(job)].translations[0].text == want


def test_beam_groups_merge_after_steps_of_their_own(checkpoints: dict[str, Path]) -> None:
    """A beam group 3 steps in takes in one that has run a step of its own: from then on one
    model call per step over both groups' beams (one search, each sentence at its own step);
    every answer is the library's for its text alone."""
    mt = load_served_model("mt", checkpoints["mt"], ServeOptions(), Metrics()).tasks["translate"]
    limits = [7, 5, 9, 8]

    async def jobs() -> list[Job]:
        return [mt.prepare(TranslateRequest(texts=[t], beam=2, max_new_tokens=m))  # type: ignore[attr-defined]
                for t, m in zip(TEXTS, limits, strict=True)]  # fmt: skip

    made, calls = asyncio.run(jobs()), []
    _counted(mt, calls)
    first, answers = mt.start(made[:2]), {}  # type: ignore[attr-defined]
    for _ in range(3):
        answers.update(first.advance()[0])
    second = mt.start(made[2:])  # type: ignore[attr-defined]
    answers.update(second.advance()[0])
    rows, groups = first.rows + second.rows, [first, second]
    _merge_groups(groups)
    assert groups == [first] and second.done and first.rows == rows > 0
    steps = len(calls)
    while not first.done:
        before = len(calls)
        answers.update(first.advance()[0])
        assert len(calls) - before <= 1
    assert calls[steps] == rows and set(answers) == set(made)
    for job, text, limit in zip(made, TEXTS, limits, strict=True):
        want = _translate_offline(checkpoints["mt"], text, limit, 2)
        assert answers[job].translations[0].text == want


def test_beam_groups_on_the_module_step_decode_apart(checkpoints: dict[str, Path]) -> None:
    """A served model the flattened step does not run (a forward hook on a decoder layer: the
    module step runs it, whose states do not merge): a later beam group does not join the
    running one; each decodes on its own, and answers as the library does for its text alone."""
    from aiayn.decoding import InferenceStep
    from aiayn.serving.tasks import TranslateTask

    mt = load_served_model("mt", checkpoints["mt"], ServeOptions(), Metrics()).tasks["translate"]
    assert isinstance(mt, TranslateTask)
    mt.model.decoder.layers[0].feed_forward.register_forward_hook(lambda *_: None)
    given = mt.step
    mt.step = InferenceStep(mt.model, banned=given.banned_given, renormalize=given.renormalize)
    mt.search_step = mt.step
    assert mt.step.fallback is not None
    limits = [6, 9]

    async def jobs() -> list[Job]:
        return [mt.prepare(TranslateRequest(texts=[t], beam=2, max_new_tokens=m))
                for t, m in zip(TEXTS, limits, strict=False)]  # fmt: skip

    made = asyncio.run(jobs())
    first, answers = mt.start(made[:1]), {}
    answers.update(first.advance()[0])
    groups = [first, mt.start(made[1:])]
    _merge_groups(groups)
    assert len(groups) == 2
    while not all(g.done for g in groups):
        for group in groups:
            answers.update(group.advance()[0])
    for job, text, limit in zip(made, TEXTS, limits, strict=False):
        want = _translate_offline(checkpoints["mt"], text, limit, 2)
        assert answers[job].translations[0].text == want


def test_a_translation_arriving_mid_decode_joins_the_running_batch(
    checkpoints: dict[str, Path],
) -> None:
    """Through the worker: a request submitted while another decodes runs in the same model
    call from the next step on (as many group steps as rounds); both answers are the library's
    for each text alone."""
    options = ServeOptions(decode_workers=1)  # another worker would take the second request
    mt = load_served_model("mt", checkpoints["mt"], options, Metrics()).tasks["translate"]
    engine = mt.engine
    assert isinstance(engine, DecodeEngine)

    requests = [TranslateRequest(texts=[TEXTS[0]], beam=1, max_new_tokens=6),
                TranslateRequest(texts=TEXTS[1:3], beam=1, max_new_tokens=9)]  # fmt: skip
    calls: list[int] = []
    answers = _through_worker(
        mt, requests, calls, lambda n, made: engine.submit(made[1]) if n == 3 else None
    )
    assert calls[:4] == [1, 1, 1, 3]
    # one batch per round (a round whose rows all reached their limits makes no call)
    assert engine.group_steps == engine.rounds >= len(calls)
    got = [t.text for a in answers for t in a.translations]
    limits = [6, 9, 9]
    want = [
        _translate_offline(checkpoints["mt"], t, m) for t, m in zip(TEXTS, limits, strict=False)
    ]
    assert got == want


@pytest.mark.parametrize("beam", [1, 3])
def test_two_decode_workers_run_their_own_groups(checkpoints: dict[str, Path], beam: int) -> None:
    """With two decode workers, a request that arrives while one worker is inside its step is
    started by the other, on its own thread; every answer is the library's for its text
    alone."""
    mt = load_served_model("mt", checkpoints["mt"], ServeOptions(decode_workers=2), Metrics()
                           ).tasks["translate"]  # fmt: skip
    engine, threads = mt.engine, []
    assert isinstance(engine, DecodeEngine) and engine.threads == 2
    starter = engine._start

    def start(jobs: list[Job]) -> Any:
        threads.append(threading.current_thread().name)
        return starter(jobs)

    def hand_over(calls: int, made: list[Job]) -> None:  # inside the first worker's first step
        if calls == 1:
            engine.submit(made[1])
            waited = time.monotonic()
            while engine._queue and time.monotonic() - waited < 30:
                time.sleep(0.001)  # only the other worker can take it

    engine._start = start
    requests = [TranslateRequest(texts=[TEXTS[0]], beam=beam, max_new_tokens=8),
                TranslateRequest(texts=TEXTS[1:3], beam=beam, max_new_tokens=6)]  # fmt: skip
    answers = _through_worker(mt, requests, [], hand_over)
    assert len(set(threads)) == 2, threads
    assert not any(t.is_alive() for t in threading.enumerate() if t.name in threads)
    got = [t.text for a in answers for t in a.translations]
    want = [_translate_offline(checkpoints["mt"], t, m, beam)
            for t, m in zip(TEXTS, [8, 6, 6], strict=False)]  # fmt: skip
    assert got == want


def test_beam_search_answers_each_request_when_its_sentences_are_done(
    checkpoints: dict[str, Path],
) -> None:
    """One beam-search group of requests with other length limits: each is answered the step
    its own sentences are done, the shortest first, while the search goes on for the others;
    every answer is the library's for its text alone."""
    mt = load_served_model("mt", checkpoints["mt"], ServeOptions(), Metrics()).tasks["translate"]
    limits = [2, 9, 5]

    async def jobs() -> list[Job]:
        return [mt.prepare(TranslateRequest(texts=[t], beam=2, max_new_tokens=m))  # type: ignore[attr-defined]
                for t, m in zip(TEXTS, limits, strict=False)]  # fmt: skip

    made = asyncio.run(jobs())
    group = mt.start(made)  # type: ignore[attr-defined]
    answered_at, answers, steps = {}, {}, 0
    while not group.done:
        ended, _ = group.advance()
        steps += 1
        for job, result in ended:
            answered_at[id(job)], answers[id(job)] = steps, result
    order = [answered_at[id(j)] for j in made]
    assert order[0] < order[2] < order[1] <= steps
    c = load_checkpoint(checkpoints["mt"])
    tok = load_translation_tokenizer(c.path)
    model = pack_for_inference(c.model)
    for job, text, limit in zip(made, TEXTS, limits, strict=False):
        o = options_for_checkpoint(None, beam_size=2, max_new_tokens=limit, pack=False)
        found = translate_ids(model, tok.encode_batch([normalize(text)]), tok, o)
        assert answers[id(job)].translations[0].text == tok.decode_batch([found[0][0].tokens])[0]


def _three_steps_in(folder: Path, beam: int, limits: tuple[int, ...]) -> tuple[Any, Any, list[Job]]:
    """The served translation task, a group of a request with the first limit 3 steps in, and
    requests with the others (one text, ``beam``)."""
    mt = load_served_model("mt", folder, ServeOptions(), Metrics()).tasks["translate"]

    async def jobs() -> list[Job]:
        return [mt.prepare(TranslateRequest(texts=[TEXTS[0]], beam=beam, max_new_tokens=m))  # type: ignore[attr-defined]
                for m in limits]  # fmt: skip

    made = asyncio.run(jobs())
    first = mt.start(made[:1])  # type: ignore[attr-defined]
    for _ in range(3):
        first.advance()
    assert not first.done
    return mt, first, made


def test_a_translation_merge_waits_when_the_columns_would_not_fit(
    checkpoints: dict[str, Path],
) -> None:
    """The served model reads 24 positions: a group 3 steps in cannot take rows that may need
    22 more columns (3 + 22 > 24); it can take rows that need 21 at most, within the tokens
    the worker's groups may hold."""
    mt, first, made = _three_steps_in(checkpoints["mt"], 1, (12, 22, 21))
    groups = [first, mt.start(made[1:2])]  # type: ignore[attr-defined]
    _merge_groups(groups)
    assert len(groups) == 2
    groups = [first, mt.start(made[2:])]  # type: ignore[attr-defined]
    budget = first.cost + groups[1].cost  # type: ignore[attr-defined]
    _merge_groups(groups, budget - 1)  # more tokens than the worker's groups may hold
    assert len(groups) == 2
    _merge_groups(groups, budget)
    assert groups == [first] and first.rows == 2


def test_a_cancelled_beam_search_leaves_the_shared_batch(checkpoints: dict[str, Path]) -> None:
    """Two merged groups (one search); nobody waits for the second's request any more: its
    sentences leave at the next step, and the first's answer is still the library's."""
    mt = load_served_model("mt", checkpoints["mt"], ServeOptions(), Metrics()).tasks["translate"]

    async def jobs() -> list[Job]:
        return [mt.prepare(TranslateRequest(texts=[TEXTS[0]], beam=2, max_new_tokens=9)),  # type: ignore[attr-defined]
                mt.prepare(TranslateRequest(texts=TEXTS[1:3], beam=2, max_new_tokens=9))]  # type: ignore[attr-defined]  # fmt: skip

    made, calls = asyncio.run(jobs()), []
    _counted(mt, calls)
    first, second = mt.start(made[:1]), mt.start(made[1:])  # type: ignore[attr-defined]
    groups = [first, second]
    _merge_groups(groups)
    assert groups == [first]
    answers = dict(first.advance()[0])
    assert calls == [6] and first.rows == 6
    made[1].cancelled = True
    first.drop_cancelled()
    while not first.done:
        answers.update(first.advance()[0])
    assert calls[1] == 2 and made[1] not in answers
    want = _translate_offline(checkpoints["mt"], TEXTS[0], 9, 2)
    assert answers[made[0]].translations[0].text == want


def test_a_beam_merge_waits_when_the_columns_would_not_fit(
    checkpoints: dict[str, Path],
) -> None:
    """The served model reads 24 positions: a beam group 3 steps in cannot take a search that
    may run 22 more steps (limit 21, and EOS: 3 + 22 > 24); it takes one of 21."""
    mt, first, made = _three_steps_in(checkpoints["mt"], 2, (12, 21, 20))
    groups = [first, mt.start(made[1:2])]  # type: ignore[attr-defined]
    _merge_groups(groups)
    assert len(groups) == 2
    groups[1].close()  # type: ignore[attr-defined]
    groups = [first, mt.start(made[2:])]  # type: ignore[attr-defined]
    _merge_groups(groups)
    assert groups == [first]
    while not first.done:
        first.advance()


@pytest.mark.parametrize("over", [0, 1])
def test_beam_groups_merge_only_within_beam_merge_max_tokens(
    checkpoints: dict[str, Path], over: int
) -> None:
    """Two beam groups whose requests hold T tokens merge under a bound of T, not of T − 1
    (the bound in force when the running group started)."""
    mt = load_served_model("mt", checkpoints["mt"], ServeOptions(), Metrics()).tasks["translate"]

    async def jobs() -> list[Job]:
        return [mt.prepare(TranslateRequest(texts=[t], beam=2, max_new_tokens=6))  # type: ignore[attr-defined]
                for t in TEXTS[:2]]  # fmt: skip

    made = asyncio.run(jobs())
    with performance_settings(beam_merge_max_tokens=made[0].cost + made[1].cost - over):
        groups = [mt.start(made[:1]), mt.start(made[1:])]  # type: ignore[attr-defined]
    _merge_groups(groups)
    assert len(groups) == 1 + over
    for group in groups:
        group.close()  # type: ignore[attr-defined]
