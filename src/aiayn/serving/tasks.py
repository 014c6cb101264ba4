"""What a served model does for an endpoint: a task per command of the family registry
(:data:`TASKS`), built from a loaded checkpoint, turning a request into a job for its worker and
the job's result into the response. Each task computes with the library functions its CLI command
calls, with the options that command would use.

This module holds the decoding tasks (``translate``, ``generate``); the encoder tasks are in
:mod:`aiayn.serving.encoder_tasks`.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from aiayn.attention import SlotPool
from aiayn.checkpoint import load_translation_tokenizer
from aiayn.checkpoint.load import Checkpoint
from aiayn.data import normalize
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding.beam import Hypothesis, SteppedBeamSearch
from aiayn.decoding.fast_step import InferenceStep
from aiayn.decoding.generate import continuation, prompt_generator
from aiayn.decoding.lm import LMStep, check_prompts
from aiayn.decoding.step import DecoderState, StepFunction
from aiayn.decoding.stepwise import Row, Sampling, SteppedSearch
from aiayn.decoding.translate import (
    DecodeOptions,
    beam_arguments,
    options_for_checkpoint,
    output_limits,
    source_batch,
    with_prefix,
)
from aiayn.errors import UserError
from aiayn.inference.packed import pack_for_inference
from aiayn.limits import MAX_REQUEST_ITEMS
from aiayn.serving import schemas as s
from aiayn.serving.decode import (
    Answered,
    BeamGroup,
    DecodeEngine,
    Group,
    SteppedGroup,
    row_keys,
)
from aiayn.serving.engine import Engine, Job, request_loop
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.problems import Problem


class Task:
    """A served model's endpoint: its worker (:attr:`engine`) and request handling."""

    command = ""
    max_input_tokens = 0

    def __init__(self, name: str, options: ServeOptions, metrics: Metrics):
        self.name, self.options, self.metrics = name, options, metrics
        self.engine: Engine = self.make_engine()

    @classmethod
    def serves(cls, ckpt: Checkpoint[Any]) -> bool:
        """Whether the checkpoint's model can serve this task (its head)."""
        return True

    def make_engine(self) -> Engine:
        """The worker (subclasses)."""
        raise NotImplementedError

    def job(self, payload: Any, cost: int, key: Any = None) -> Job:
        """A job answered on the request's event loop (:func:`~aiayn.serving.engine.prepared`
        prepares it on another thread)."""
        loop = request_loop()
        return Job(payload, cost, loop, loop.create_future(), key=key)

    def check_tokens(self, field: str, tokens: int, what: str) -> None:
        """413 naming ``field`` when the request asks for more than ``--max-request-tokens``
        tokens (``what`` says how they were counted)."""
        most = self.options.max_request_tokens
        if tokens > most:
            raise Problem(
                413,
                f"{field}: the request asks for {tokens:,} tokens ({what}); this server "
                f"takes at most {most:,} per request (--max-request-tokens): send fewer or "
                "shorter items",
                param=field,
            )


def too_long(field: str, tokens: int, limit: int, what: str = "tokens") -> Problem:
    """413 naming the field, its length and the model's."""
    return Problem(
        413, f"{field} has {tokens} {what}; the model reads at most {limit}", param=field
    )


@dataclass(frozen=True)
class TranslateJob:
    """A translate request: its texts' ids (empty ones are answered without decoding), options
    and per-text output limits."""

    rows: list[list[int]]
    options: DecodeOptions
    limits: list[int]
    scores: bool


class TranslateTask(Task):
    """``/v1/translate``: ``aiayn translate``'s decoding (the checkpoint's recorded settings,
    else the paper's), greedy or beam search, with the request's beam, alpha, n-best and cap."""

    command = "translate"

    def __init__(self, name: str, ckpt: Checkpoint[Any], options: ServeOptions, metrics: Metrics):
        self.generation = ckpt.state.get("generation")
        self.tokenizer = load_translation_tokenizer(ckpt.path)
        self.model = pack_for_inference(ckpt.model.eval())  # as translate's pack=True
        self.device = next(self.model.parameters()).device
        base = options_for_checkpoint(self.generation)
        t = self.tokenizer
        banned = (t.pad_id, t.bos_id) if base.banned is None else base.banned
        self.step = InferenceStep(self.model, banned=banned, renormalize=base.renormalize)
        self.search_step: StepFunction = self.step
        self.max_input_tokens = base.max_src_tokens or self.model.config.max_len - 1
        super().__init__(name, options, metrics)

    def make_engine(self) -> Engine:
        return DecodeEngine(self.name, self.options, self.metrics, self.start, self.pools)

    def pools(self) -> tuple[SlotPool, ...]:
        """A worker's key/value cache: the step's target and source slot pools (empty; they
        grow to what the worker's rows need); none for the module step (its own caches)."""
        if self.step.fallback is not None:
            return ()
        return self.step.pools(8, 64, 8, 64)

    def prepare(self, req: s.TranslateRequest) -> Job:
        """The request's job; 422 for options that do not go together or a beam beyond
        ``--max-beam``, 413 for a long text or more tokens than ``--max-request-tokens``."""
        most = self.options.max_beam
        for field, value in (("beam", req.beam), ("n_best", req.n_best)):
            if value is not None and value > most:
                raise Problem(
                    422,
                    f"{field}: {value} is more than this server's largest beam, "
                    f"{most} (--max-beam)",
                    param=field,
                )
        try:
            o = options_for_checkpoint(
                self.generation,
                beam_size=req.beam,
                alpha=req.alpha,
                n_best=req.n_best,
                max_new_tokens=req.max_new_tokens,
            )
        except UserError as error:
            raise Problem(422, str(error), param=_param_of(str(error))) from None
        ids = self.tokenizer.encode_batch(
            [with_prefix(req.prefix, normalize(t)) for t in req.texts]
        )
        rows = [[int(x) for x in row] for row in ids]
        for i, row in enumerate(rows):
            if len(row) > self.max_input_tokens:
                raise too_long(f"texts.{i}", len(row), self.max_input_tokens, "subword tokens")
        limits = output_limits(self.model, o, [len(r) for r in rows])
        asked = sum(len(r) + 1 + m for r, m in zip(rows, limits, strict=True)) * o.beam_size
        self.check_tokens("texts", asked, "each text's source and output limit, times the beam")
        cost = sum(len(r) + 1 for r in rows)  # the source tokens the encoder reads
        payload = TranslateJob(rows, o, limits, req.scores)
        job = self.job(payload, cost, key=replace(o, max_new_tokens=None))
        job.reserve, job.rows = asked, len(rows) * o.beam_size
        return job

    def start(self, jobs: list[Job], pools: tuple[SlotPool, ...] = ()) -> Group:
        """One group: every non-empty text of the jobs, one batch."""
        o: DecodeOptions = jobs[0].payload.options
        rows, limits, counts = [], [], []
        for job in jobs:
            p: TranslateJob = job.payload
            todo = [i for i, r in enumerate(p.rows) if r]
            rows += [p.rows[i] for i in todo]
            limits += [p.limits[i] for i in todo]
            counts.append(len(todo))
        if not rows:  # only empty texts: nothing to run
            return Answered(jobs, lambda job, found: self._answer(job.payload, found))
        self.metrics.tokens.labels(self.name, "input").inc(sum(map(len, rows)))
        src = source_batch(rows, self.tokenizer).to(self.device)  # (B, S)
        own = (pools[0], pools[1]) if pools else None
        state = self.step.initial_state(src, capacity=max(limits) + 1, pools=own)
        if o.beam_size > 1:
            return self._beam_group(jobs, counts, state, limits)
        cut = 1 if o.forced_eos else 0  # as translate: forced EOS takes the last position
        t = self.tokenizer
        search = SteppedSearch(
            self.search_step,
            state,
            row_keys(counts),
            [max(0, m - cut) for m in limits],
            bos_id=t.bos_id,
            eos_id=t.eos_id,
            min_len=o.min_len,
            device=self.device,
        )

        def finish(job: Job, done: list[Row]) -> s.TranslateResponse:
            hyps = [[Hypothesis(r.tokens, math.nan, math.nan)] for r in done]
            return self._answer(job.payload, hyps)

        return SteppedGroup(jobs, search, finish)

    def _beam_group(
        self, jobs: list[Job], counts: list[int], state: DecoderState, limits: list[int]
    ) -> Group:
        """The beam search of the jobs' sentences (``aiayn translate``'s rules for the jobs'
        options)."""
        o: DecodeOptions = jobs[0].payload.options
        t = self.tokenizer
        search = SteppedBeamSearch(
            self.search_step,
            state,
            row_keys(counts),
            limits,
            bos_id=t.bos_id,
            eos_id=t.eos_id,
            device=self.device,
            **beam_arguments(o),
        )
        return BeamGroup(jobs, counts, search, lambda job, found: self._answer(job.payload, found))

    def _answer(self, p: TranslateJob, found: list[list[Hypothesis]]) -> s.TranslateResponse:
        """The response: the found n-best lists put back among the empty texts, decoded."""
        empty = [Hypothesis([], 0.0, 0.0)]  # what translate gives an empty text
        it = iter(found)
        lists = [next(it) if row else empty for row in p.rows]
        out = []
        for hyps in lists:
            texts = self.tokenizer.decode_batch([h.tokens for h in hyps])
            scored = [
                s.Scored(text=t, score=_finite(h.score)) for t, h in zip(texts, hyps, strict=True)
            ]
            best = scored[0]
            out.append(
                s.Translation(
                    text=best.text,
                    score=best.score if p.scores or p.options.n_best > 1 else None,
                    hypotheses=scored if p.options.n_best > 1 else None,
                )
            )
        return s.TranslateResponse(model=self.name, translations=out)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _param_of(message: str) -> str | None:
    """The request field a :class:`DecodeOptions` message names."""
    for field, name in (("n_best", "n_best"), ("beam_size", "beam"), ("alpha", "alpha")):
        if message.startswith(field):
            return name
    return None


@dataclass(frozen=True)
class GenerateJob:
    """A completion request: prompt ids (each repeated n times as rows), its method's
    parameters, its stop strings and the streaming flag; ``decoded``: each prompt's text, once
    a decode worker has decoded it (a watched row's text is decoded after every step)."""

    prompts: list[list[int]]
    n: int
    max_tokens: int
    sampling: Sampling | None
    seed: int | None
    stop: tuple[str, ...]
    created: int
    id: str
    decoded: dict[int, str] = dataclasses.field(default_factory=dict, compare=False)


class GenerateTask(Task):
    """``/v1/completions``: ``aiayn generate``'s greedy search (temperature left out or 0) or
    sampling (temperature > 0, top_p), every prompt from its own generator seeded from the
    request's seed and the prompt (``--seed``); choice j > 0 of a prompt from seed + j."""

    command = "generate"

    def __init__(self, name: str, ckpt: Checkpoint[Any], options: ServeOptions, metrics: Metrics):
        self.tokenizer = load_lm_tokenizer(ckpt.tokenizer_path)
        self.model = pack_for_inference(ckpt.model.eval())  # as generate's pack=True
        self.config = self.model.config
        self.device = self.model.embedder.embedding.weight.device
        self.max_input_tokens = self.config.max_len
        self.step = LMStep(self.model)
        self.search_step: StepFunction = self.step  # what the searches call (tests count it)
        super().__init__(name, options, metrics)

    def make_engine(self) -> Engine:
        return DecodeEngine(self.name, self.options, self.metrics, self.start, self.pools)

    def pools(self) -> tuple[SlotPool, ...]:
        """A worker's key/value cache: one slot pool (empty; it grows to what the worker's
        rows need)."""
        return (self.step.pool(8, 64),)

    def prepare(self, req: s.CompletionRequest, created: int) -> Job:
        """The request's job; 422 for options of another method, 413 for a long prompt."""
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        _check_items(len(prompts), req.n)  # before any prompt is encoded
        ids = [self.tokenizer.encode(p) or [self.config.bos_id] for p in prompts]
        return self.prepare_ids(req, ids, isinstance(req.prompt, str), created)

    def prepare_ids(
        self, req: s.CompletionRequest, ids: list[list[int]], single: bool, created: int
    ) -> Job:
        """The job of prompts already as token ids (``req``'s own prompt is not read: its
        options are); ``single``: one prompt, named ``prompt`` rather than ``prompt.i``."""
        sampling = _sampling(req)
        _check_items(len(ids), req.n)
        for i, row in enumerate(ids):
            self._check("prompt" if single else f"prompt.{i}", row, req.max_tokens)
        self.check_request(ids, req.max_tokens, req.n)
        stop = () if req.stop is None else (req.stop,) if isinstance(req.stop, str) else req.stop
        payload = GenerateJob(
            ids,
            req.n,
            req.max_tokens,
            sampling,
            req.seed,
            tuple(stop),
            created,
            "cmpl-" + secrets.token_hex(12),
        )
        cost = sum(len(r) for r in ids) * req.n  # the prompt tokens the prefill reads
        job = self.job(payload, cost, key=sampling)
        job.reserve = sum(len(r) + req.max_tokens for r in ids) * req.n
        job.rows = len(ids) * req.n
        return job

    def check_request(self, prompts: list[list[int]], max_tokens: int, n: int) -> None:
        """413 naming ``prompt`` when the prompts' tokens plus ``max_tokens``, times ``n``,
        are more than ``--max-request-tokens``."""
        asked = sum(len(p) + max_tokens for p in prompts) * n
        self.check_tokens("prompt", asked, "each prompt's tokens and max_tokens, times n")

    def _check(self, field: str, row: list[int], max_tokens: int) -> None:
        c = self.config
        if max(row) >= c.vocab_size or min(row) < 0:
            raise Problem(422, f"{field} encodes to an id outside the vocabulary", param=field)
        if len(row) + max_tokens > c.max_len:
            raise Problem(
                413,
                f"{field} has {len(row)} tokens: with max_tokens = {max_tokens} it needs "
                f"{len(row) + max_tokens} positions; the model reads at most {c.max_len}",
                param=field,
            )

    def start(self, jobs: list[Job], pools: tuple[SlotPool, ...] = ()) -> Group:
        """One group: every prompt × choice of the jobs, one batch, prefilled into ``pools``."""
        prompts, limits, gens, counts = [], [], [], []
        for job in jobs:
            p: GenerateJob = job.payload
            for prompt in p.prompts:
                for choice in range(p.n):
                    prompts.append(prompt)
                    limits.append(p.max_tokens)
                    gens.append(self._generator(p.seed, choice, prompt))
            counts.append(len(p.prompts) * p.n)
        check_prompts(self.model, prompts, max(limits))
        pool = pools[0] if pools else None
        state = self.step.prefill(prompts, max(map(len, prompts)) + max(limits), pool)
        sampling: Sampling | None = jobs[0].payload.sampling
        search = SteppedSearch(
            self.search_step,
            state,
            row_keys(counts),
            limits,
            bos_id=self.config.bos_id,
            eos_id=self.config.eos_id,
            sampling=sampling,
            generators=gens if sampling is not None else None,
            device=self.device,
        )
        self.metrics.tokens.labels(self.name, "input").inc(sum(map(len, prompts)))
        return SteppedGroup(jobs, search, self._finish, self._watch, _watched)

    def _generator(self, seed: int | None, choice: int, prompt: list[int]) -> torch.Generator:
        if seed is None:
            return torch.Generator(self.device).manual_seed(secrets.randbits(63))
        return prompt_generator((seed + choice) % 2**63, prompt, self.device)

    def _texts(self, job: Job, rows: list[Row]) -> list[tuple[Row, str, bool]]:
        """(row, its text so far cut at the first stop string, whether one was found)."""
        p: GenerateJob = job.payload
        out = []
        for row in rows:
            i: int = row.key[1] // p.n  # type: ignore[index]
            if i not in p.decoded:
                p.decoded[i] = self.tokenizer.decode(p.prompts[i])
            text = continuation(self.tokenizer, p.prompts[i], row.tokens, p.decoded[i])
            cut = min((i for i in (text.find(x) for x in p.stop) if i >= 0), default=-1)
            out.append((row, text if cut < 0 else text[:cut], cut >= 0))
        return out

    def _watch(self, job: Job, rows: list[Row]) -> list[Any]:
        """Rows that reached a stop string end; streaming requests get their new text (only
        the requests :func:`_watched` picks are watched)."""
        texts = self._texts(job, rows)
        for row, text, _ in texts:
            job.notify((row.key[1], text, None))  # type: ignore[index]
        return [row.key for row, _, stopped in texts if stopped]

    def _finish(self, job: Job, rows: list[Row]) -> s.CompletionResponse:
        p: GenerateJob = job.payload
        choices = []
        for row, text, stopped in self._texts(job, rows):
            reason: Literal["stop", "length"] = (
                "length" if len(row.tokens) >= row.limit and not stopped else "stop"
            )
            index: int = row.key[1]  # type: ignore[index]
            job.notify((index, text, reason))
            choices.append(s.CompletionChoice(text=text, index=index, finish_reason=reason))
        prompt_tokens = sum(len(x) for x in p.prompts)  # each prompt once, whatever n
        completion = sum(len(r.tokens) for r in rows)
        usage = s.Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            total_tokens=prompt_tokens + completion,
        )
        return s.CompletionResponse(
            id=p.id, created=p.created, model=self.name, choices=choices, usage=usage
        )


def _sampling(req: s.CompletionRequest) -> Sampling | None:
    """Sampling's parameters, or None for greedy search; 422 for top_p or seed without it."""
    if req.temperature:
        return Sampling(temperature=req.temperature, top_p=req.top_p)
    for field in ("top_p", "seed"):
        if getattr(req, field) is not None:
            raise Problem(
                422,
                f"{field} applies to sampling: give temperature > 0 (temperature left out "
                "or 0 is greedy search)",
                param=field,
            )
    return None


def _check_items(prompts: int, n: int) -> None:
    """422 naming ``n`` when ``prompts`` × ``n`` completions are more than a request may ask."""
    if prompts * n > MAX_REQUEST_ITEMS:
        raise Problem(
            422,
            f"n: {prompts} prompts × n = {n} completions is more than "
            f"{MAX_REQUEST_ITEMS} per request",
            param="n",
        )


def _watched(job: Job) -> bool:
    """Whether a completion's rows are looked at after each step: it has stop strings or
    streams."""
    return bool(job.payload.stop) or job.progress is not None
