"""The decode worker (aiayn.serving.decode) over one key/value cache with per-row lengths: groups
with other options and other start steps step in one model call, requests are admitted by
prefill budget and cache tokens, slots are freed as rows leave, and every request still gets
the library's answer for its input alone."""

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
from aiayn.serving.decode import DecodeEngine, _return_memory, _Worker, advance
from aiayn.serving.engine import Job
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.schemas import CompletionRequest, TranslateRequest
from aiayn.settings import performance_settings

PROMPTS = ["the cat sleeps on", "a", "two men", "hello world the cat"]
TEXTS = ["a small dog runs on the mat", "two men", "the cat sleeps", "hello"]


def _task(folder: Path, name: str, command: str, **options: Any) -> Any:
    return load_served_model(name, folder, ServeOptions(**options), Metrics()).tasks[command]


def _translate_offline(folder: Path, text: str, max_new_tokens: int, beam: int = 1) -> str:
    """The library's answer for ``text`` alone (greedy or ``beam``, the served model's packed
    copy run with ``pack=False``: the same arithmetic as ``pack=True``)."""
    c = load_checkpoint(folder)
    tok = load_translation_tokenizer(c.path)
    options = options_for_checkpoint(
        None, beam_size=beam, max_new_tokens=max_new_tokens, pack=False
    )
    found = translate_ids(
        pack_for_inference(c.model), tok.encode_batch([normalize(text)]), tok, options
    )
    return tok.decode_batch([found[0][0].tokens])[0]


def _generate_offline(folder: Path, prompt: str, options: GenerateOptions) -> str:
    c = load_checkpoint(folder, expect=GPT2)
    return generate(c.model, load_lm_tokenizer(c.tokenizer_path), [prompt], options)[0]


def _counted(task: Any, calls: list[int], then: Callable[[int], None] = lambda n: None) -> None:
    """Count the rows of each model call of ``task``'s search step (and call ``then`` with the
    count of calls after each): every group started from now on shares the counting step."""
    inner = task.search_step

    def step(tokens: torch.Tensor, state: Any) -> Any:
        calls.append(tokens.size(0))
        then(len(calls))
        return inner(tokens, state)

    task.search_step = step


def _through_worker(
    task: Any,
    requests: list[Any],
    on_call: Callable[[int, list[Job]], None],
    *args: Any,
) -> tuple[list[Any], list[int]]:
    """The answers to ``requests`` and the rows of each model call: the first request submitted
    to ``task``'s started worker(s), the others by ``on_call(n, jobs)``, called at each model
    call with the calls so far; the worker(s) stopped after."""
    engine, calls = task.engine, []

    async def run() -> list[Any]:
        made = [task.prepare(r, *args) for r in requests]
        _counted(task, calls, lambda n: on_call(n, made))
        engine.start()
        engine.submit(made[0])
        try:
            return list(await asyncio.wait_for(asyncio.gather(*(j.future for j in made)), 60))
        finally:
            engine.stop()

    return asyncio.run(run()), calls


def test_translations_with_other_options_and_start_steps_share_each_model_call(
    checkpoints: dict[str, Path],
) -> None:
    """Greedy and beam-3 requests arriving at steps 0, 2 and 4 (other source lengths, limits,
    beams): from the step each joins, one model call per round runs every row; every answer is
    the library's for its text alone."""
    mt = _task(checkpoints["mt"], "mt", "translate", decode_workers=1)
    requests = [
        TranslateRequest(texts=[TEXTS[0]], beam=1, max_new_tokens=12),
        TranslateRequest(texts=TEXTS[1:3], beam=3, max_new_tokens=9),
        TranslateRequest(texts=[TEXTS[3]], beam=1, max_new_tokens=7),
    ]
    at = {2: 1, 4: 2}  # call -> the request submitted after it
    answers, calls = _through_worker(
        mt, requests, lambda n, made: mt.engine.submit(made[at[n]]) if n in at else None
    )
    assert calls[:3] == [1, 1, 1 + 2 * 3]  # K = 3 rows per sentence
    assert max(calls) == 1 + 6 + 1  # all three requests' rows in one call
    assert mt.engine.group_steps == len(calls)  # one call per round
    got = [t.text for a in answers for t in a.translations]
    want = [
        _translate_offline(checkpoints["mt"], TEXTS[0], 12),
        *(_translate_offline(checkpoints["mt"], t, 9, 3) for t in TEXTS[1:3]),
        _translate_offline(checkpoints["mt"], TEXTS[3], 7),
    ]
    assert got == want


def test_completions_with_other_sampling_options_share_each_model_call(
    checkpoints: dict[str, Path],
) -> None:
    """Greedy, and sampling at two temperatures with seeds, arriving at other steps: after
    each one's prompt pass, one model call per round; every answer is ``aiayn generate``'s."""
    lm = _task(checkpoints["lm"], "lm", "generate", decode_workers=1)
    requests = [
        CompletionRequest(prompt=PROMPTS[0], max_tokens=10),
        CompletionRequest(prompt=PROMPTS[1], max_tokens=8, temperature=0.7, seed=3),
        CompletionRequest(prompt=PROMPTS[2], max_tokens=6, temperature=1.3, seed=5),
    ]
    at = {1: 1, 3: 2}
    answers, calls = _through_worker(
        lm, requests, lambda n, made: lm.engine.submit(made[at[n]]) if n in at else None, 0
    )
    assert max(calls) == 3  # the three requests' rows in one call
    options = [
        GenerateOptions(max_new_tokens=10),
        GenerateOptions(max_new_tokens=8, method="sample", temperature=0.7, seed=3),
        GenerateOptions(max_new_tokens=6, method="sample", temperature=1.3, seed=5),
    ]
    for answer, prompt, o in zip(answers, PROMPTS, options, strict=False):
        assert answer.choices[0].text == _generate_offline(checkpoints["lm"], prompt, o)


def test_each_request_times_its_own_output_tokens(checkpoints: dict[str, Path]) -> None:
    """Time per output token counts each request's own rounds from its first token to its
    answer, whatever joined around it (a request ended by its limit is answered at the round
    after its last token): 5 tokens give 5, 3 tokens joining two rounds later give 3; each
    request's first token is timed once."""
    lm = _task(checkpoints["lm"], "lm", "generate", decode_workers=1)
    per_token: list[int] = []
    first: list[float] = []
    metrics = lm.engine.metrics
    metrics.per_output_token = lambda model, seconds, tokens: per_token.append(tokens)
    metrics.first_tokens = lambda model, arrived, now: first.extend(now - t for t in arrived)
    requests = [CompletionRequest(prompt=PROMPTS[0], max_tokens=5),
                CompletionRequest(prompt=PROMPTS[2], max_tokens=3)]  # fmt: skip
    _through_worker(lm, requests, lambda n, made: lm.engine.submit(made[1]) if n == 2 else None, 0)
    assert sorted(per_token) == [3, 5]
    assert len(first) == 2 and all(t > 0 for t in first)


def test_beam_groups_on_the_module_step_decode_apart(checkpoints: dict[str, Path]) -> None:
    """A served model the flattened step does not run (a forward hook on a decoder layer: the
    module step runs it, whose states do not join): each group makes its own model call, and
    answers as the library does for its text alone."""
    from aiayn.decoding import InferenceStep
    from aiayn.serving.tasks import TranslateTask

    mt = _task(checkpoints["mt"], "mt", "translate", decode_workers=1)
    assert isinstance(mt, TranslateTask)
    mt.model.decoder.layers[0].feed_forward.register_forward_hook(lambda *_: None)
    given = mt.step
    mt.step = InferenceStep(mt.model, banned=given.banned_given, renormalize=given.renormalize)
    mt.search_step = mt.step
    assert mt.step.fallback is not None and mt.pools() == ()
    requests = [TranslateRequest(texts=[t], beam=2, max_new_tokens=m) for t, m in
                zip(TEXTS, [6, 9], strict=False)]  # fmt: skip
    answers, calls = _through_worker(
        mt, requests, lambda n, made: mt.engine.submit(made[1]) if n == 1 else None
    )
    assert set(calls) <= {1, 2}  # never the two groups' rows in one call
    for answer, text, limit in zip(answers, TEXTS, [6, 9], strict=False):
        want = _translate_offline(checkpoints["mt"], text, limit, 2)
        assert answer.translations[0].text == want


@pytest.mark.parametrize("beam", [1, 3])
def test_two_decode_workers_run_their_own_groups(checkpoints: dict[str, Path], beam: int) -> None:
    """With two decode workers, a request that arrives while one worker is inside its step is
    started by the other, on its own thread (its own pools); every answer is the library's for
    its text alone."""
    with performance_settings(serve_worker_rows=1):  # the first worker is full at one row
        mt = _task(checkpoints["mt"], "mt", "translate", decode_workers=2)
    engine, threads = mt.engine, []
    assert isinstance(engine, DecodeEngine) and engine.threads == 2
    starter = engine._start

    def start(jobs: list[Job], pools: Any) -> Any:
        threads.append((threading.current_thread().name, id(pools)))
        return starter(jobs, pools)

    def hand_over(calls: int, made: list[Job]) -> None:  # inside the first worker's first step
        if calls == 1:
            engine.submit(made[1])
            waited = time.monotonic()
            while engine._queue and time.monotonic() - waited < 30:
                time.sleep(0.001)  # only the other worker can take it

    engine._start = start
    requests = [TranslateRequest(texts=[TEXTS[0]], beam=beam, max_new_tokens=8),
                TranslateRequest(texts=TEXTS[1:3], beam=beam, max_new_tokens=6)]  # fmt: skip
    answers, _ = _through_worker(mt, requests, hand_over)
    assert len({name for name, _ in threads}) == 2 and len({p for _, p in threads}) == 2
    got = [t.text for a in answers for t in a.translations]
    want = [_translate_offline(checkpoints["mt"], t, m, beam)
            for t, m in zip(TEXTS, [8, 6, 6], strict=False)]  # fmt: skip
    assert got == want


@pytest.mark.parametrize(("fill_rows", "taken"), [(64, [4, 0]), (3, [3, 1]), (2, [2, 2])])
def test_decode_workers_fill_in_order(
    checkpoints: dict[str, Path], fill_rows: int, taken: list[int]
) -> None:
    """Workers fill in order: the second takes requests only where the first's rows would pass
    serve_worker_rows (the last worker takes any); four one-row requests waiting at once go
    to the first worker alone up to its rows, the rest to the second; every answer is the
    library's."""
    with performance_settings(serve_worker_rows=fill_rows):
        lm = _task(checkpoints["lm"], "lm", "generate", decode_workers=2)
    engine, started = lm.engine, {"aiayn-serve-lm": 0, "aiayn-serve-lm-1": 0}
    starter = engine._start

    def start(jobs: list[Job], pools: Any) -> Any:
        started[threading.current_thread().name] += len(jobs)
        return starter(jobs, pools)

    def slow_first(n: int) -> None:  # the second worker has time to take what is left
        if threading.current_thread().name == "aiayn-serve-lm":
            time.sleep(0.05)

    engine._start = start
    _counted(lm, [], slow_first)

    async def run() -> list[Any]:
        made = [lm.prepare(CompletionRequest(prompt=p, max_tokens=5), 0) for p in PROMPTS]
        assert [j.rows for j in made] == [1, 1, 1, 1]
        for job in made:  # all waiting before a worker runs
            engine._queue.append(job)
        engine.start()
        try:
            return list(await asyncio.wait_for(asyncio.gather(*(j.future for j in made)), 60))
        finally:
            engine.stop()

    answers = asyncio.run(run())
    assert list(started.values()) == taken
    for answer, prompt in zip(answers, PROMPTS, strict=True):
        want = _generate_offline(checkpoints["lm"], prompt, GenerateOptions(max_new_tokens=5))
        assert answer.choices[0].text == want


def _jobs(task: Any, requests: list[Any], *args: Any) -> list[Job]:
    """The requests' jobs, answered on an event loop left open (run it to read the answers)."""

    async def made() -> list[Job]:
        return [task.prepare(r, *args) for r in requests]

    return asyncio.new_event_loop().run_until_complete(made())


def test_beam_search_answers_each_request_when_its_sentences_are_done(
    checkpoints: dict[str, Path],
) -> None:
    """One beam-search group of requests with other length limits: each is answered the step
    its own sentences are done, the shortest first, while the search goes on for the others;
    every answer is the library's for its text alone; every slot is free at the end."""
    mt = _task(checkpoints["mt"], "mt", "translate")
    limits = [2, 9, 5]
    made = _jobs(mt, [TranslateRequest(texts=[t], beam=2, max_new_tokens=m)
                      for t, m in zip(TEXTS, limits, strict=False)])  # fmt: skip
    pools = mt.pools()
    group = mt.start(made, pools)
    answered_at, answers, steps = {}, {}, 0
    while not group.done:
        ended, _ = advance(group)
        steps += 1
        for job, result in ended:
            answered_at[job], answers[job] = steps, result
    order = [answered_at[j] for j in made]
    assert order[0] < order[2] < order[1] <= steps
    assert all(pool.free == pool.slots for pool in pools)
    for job, text, limit in zip(made, TEXTS, limits, strict=False):
        want = _translate_offline(checkpoints["mt"], text, limit, 2)
        assert answers[job].translations[0].text == want


@pytest.mark.parametrize("beam", [1, 2])
def test_a_request_of_empty_texts_in_a_group_is_answered_at_the_first_step(
    checkpoints: dict[str, Path], beam: int
) -> None:
    """A request whose texts are all empty has no rows in its group: it is answered at the
    group's first step (what ``translate`` gives empty texts), the others when their rows end,
    each with the library's answer."""
    mt = _task(checkpoints["mt"], "mt", "translate")
    texts = [[TEXTS[0]], [" ", "\t "]]  # the second's texts normalise to empty ones
    made = _jobs(mt, [TranslateRequest(texts=t, beam=beam, max_new_tokens=5) for t in texts])
    group = mt.start(made, mt.pools())
    answered_at, answers, steps = {}, {}, 0
    while not group.done and steps < 20:
        ended, _ = advance(group)
        steps += 1
        for job, result in ended:
            answered_at[job], answers[job] = steps, result
    assert answered_at.get(made[1]) == 1 < answered_at[made[0]]
    assert [t.text for t in answers[made[1]].translations] == ["", ""]
    want = _translate_offline(checkpoints["mt"], TEXTS[0], 5, beam)
    assert answers[made[0]].translations[0].text == want
    (alone,) = _jobs(mt, [TranslateRequest(texts=texts[1], beam=beam)])
    group = mt.start([alone], mt.pools())  # nothing to step: no model call at all
    assert group.step is None and group.inputs() is None
    ((job, result),), generated = advance(group)
    assert job is alone and group.done and generated == 0
    assert [t.text for t in result.translations] == ["", ""]


def test_a_cancelled_request_leaves_the_joint_call_and_frees_its_slots(
    checkpoints: dict[str, Path],
) -> None:
    """Two beam groups stepping in one call; nobody waits for the second's request any more:
    its sentences leave at the next round, their slots freed, and the first's answer is still
    the library's."""
    mt = _task(checkpoints["mt"], "mt", "translate", decode_workers=1)
    engine: DecodeEngine = mt.engine
    made = _jobs(mt, [TranslateRequest(texts=[TEXTS[0]], beam=2, max_new_tokens=9),
                      TranslateRequest(texts=TEXTS[1:3], beam=2, max_new_tokens=9)])  # fmt: skip
    calls: list[int] = []
    _counted(mt, calls)
    worker = _Worker()
    for jobs in (made[:1], made[1:]):
        engine._begin(worker, jobs, worker.groups)
    engine._round(worker, [])
    engine._round(worker, [])
    assert calls == [6, 6]  # one call for both groups: 2 + 4 beams
    made[1].cancelled = True
    self_pool = worker.pools[0]
    engine._round(worker, [])
    assert calls[-1] == 2 and self_pool.free == self_pool.slots - 2
    while not worker.groups[0].done:
        engine._round(worker, [])
    assert not made[1].settled and made[0].settled
    want = _translate_offline(checkpoints["mt"], TEXTS[0], 9, 2)
    loop = made[0].loop
    loop.run_until_complete(asyncio.sleep(0))
    assert made[0].future.result().translations[0].text == want


def test_admission_waits_for_cache_tokens_and_spreads_prefill_over_rounds(
    checkpoints: dict[str, Path],
) -> None:
    """Requests are admitted first come first served: while their prefill fits the round's
    --max-batch-tokens (the rest wait for the next round, the running rows stepping
    meanwhile), and while their cache tokens fit --max-cache-tokens (else they wait for rows
    to leave); the first is admitted whatever its size when nothing runs."""
    lm = _task(checkpoints["lm"], "lm", "generate", decode_workers=1)
    made = _jobs(lm, [CompletionRequest(prompt=p, max_tokens=6) for p in PROMPTS], 0)
    costs, reserves = [j.cost for j in made], [j.reserve for j in made]
    assert reserves == [c + 6 for c in costs]  # its prompt and max_tokens, n = 1
    options = ServeOptions(max_batch_tokens=costs[0] + costs[1],
                           max_cache_tokens=sum(reserves[:3]), decode_workers=1)  # fmt: skip
    engine = DecodeEngine("lm", options, Metrics(), lm.start, lm.pools)
    for job in made:
        engine.submit(job)
    worker = _Worker()
    engine._admit(worker)
    assert [len(g.jobs) for g in worker.groups] == [2]  # the prefill budget of a round
    engine._round(worker, [])
    engine._admit(worker)
    assert sum(len(g.jobs) for g in worker.groups) == 3  # the cache is full: the 4th waits
    assert len(engine._queue) == 1
    while len(engine._queue):
        engine._round(worker, [])
        for group in worker.groups:
            if group.done:
                worker.let_go(group.jobs)
        worker.groups[:] = [g for g in worker.groups if not g.done]
        engine._admit(worker)
    while worker.groups:
        engine._round(worker, [])
        worker.groups[:] = [g for g in worker.groups if not g.done]
    assert all(job.settled for job in made)
    assert worker.pools[0].free == worker.pools[0].slots


def test_a_worker_with_nothing_to_run_returns_large_pools(checkpoints: dict[str, Path]) -> None:
    """Pools over serve_pool_keep_bytes are dropped when the worker has nothing to run; smaller
    ones are kept."""
    mt = _task(checkpoints["mt"], "mt", "translate")
    worker = _Worker()
    worker.pools = mt.pools()
    size = sum(p.buffer.numel() * p.buffer.element_size() for p in worker.pools)
    with performance_settings(serve_pool_keep_bytes=size):
        _return_memory(worker)
    assert worker.pools is not None
    with performance_settings(serve_pool_keep_bytes=size - 1):
        _return_memory(worker)
    assert worker.pools is None
