"""The FastAPI app of ``aiayn serve``: its routes (those the loaded models' families serve), its
error answers (every one a JSON :class:`~aiayn.serving.schemas.ErrorResponse` naming the field or
limit) and the guard every request passes (bearer token, body size, metrics). What OpenAI's
clients send and expect is adapted in :mod:`aiayn.serving.openai_api`; streamed completions are
:mod:`aiayn.serving.streaming`.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aiayn.serving import openai_api as oa
from aiayn.serving import schemas as s
from aiayn.serving.engine import Job, prepared
from aiayn.serving.health import Readiness, ready_response
from aiayn.serving.metrics import Metrics
from aiayn.serving.models import ServedModel
from aiayn.serving.options import ServeOptions
from aiayn.serving.playground import PAGE
from aiayn.serving.problems import Problem
from aiayn.serving.streaming import Update, events
from aiayn.serving.tasks import Task

ENDPOINTS = {
    "translate": "/v1/translate",
    "generate": "/v1/completions",
    "embed": "/v1/embeddings",
    "classify-text": "/v1/classify",
    "classify-image": "/v1/classify",
    "fill-mask": "/v1/fill-mask",
    "attention": "/v1/attention",
}
"""The endpoint serving each command of the family registry."""

OPEN_PATHS = frozenset({"/health", "/ready", "/"})
"""Paths answered without the bearer token: a load balancer's health check, and the playground
page (it holds no data; its calls carry the token typed into it)."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": s.ErrorResponse} for status in (400, 401, 404, 413, 415, 422, 499, 503, 504)
}

CHAT = "/v1/chat/completions"
MODEL = "/v1/models/{id}"
"""``GET /v1/models/NAME``, as the request metrics label it."""

MODEL_STATE = "model"
"""The request state's key naming the model a request went to (the latency's ``model`` label;
"" where none was chosen)."""


def create_app(
    models: Sequence[ServedModel],
    options: ServeOptions,
    metrics: Metrics,
    *,
    api_key: str | None = None,
    cors_origins: Sequence[str] = (),
) -> FastAPI:
    """The app serving ``models`` (their workers start with the app and finish their requests
    when it stops). ``api_key``: every path but ``/health`` needs ``Authorization: Bearer
    KEY``; ``cors_origins``: the browser origins allowed (none by default)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for model in models:
            model.start()
        try:
            yield
        finally:
            app.state.stopping = True
            for model in models:
                await asyncio.to_thread(model.stop)

    app = FastAPI(title="aiayn serve", version="1", lifespan=lifespan)
    app.state.stopping = False
    served = {c for m in models for c in m.tasks}
    paths = {ENDPOINTS[c] for c in served} | {"/", "/health", "/ready", "/v1/models", "/metrics"}
    paths.add(CHAT)
    _add_error_handlers(app)
    _add_info_routes(app, models, metrics)
    _add_chat_route(app, models)
    routes = _Routes(models, options)
    for command in served:
        routes.add(app, command)
    app.add_middleware(
        Guard, metrics=metrics, api_key=api_key, max_body=options.max_body_bytes, paths=paths
    )
    if cors_origins:  # outside the guard: a browser's preflight carries no token
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return app


def _add_info_routes(app: FastAPI, models: Sequence[ServedModel], metrics: Metrics) -> None:
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def playground() -> HTMLResponse:
        """The playground page (aiayn.serving.playground)."""
        return HTMLResponse(PAGE)

    @app.get("/health", response_model=s.Health)
    async def health() -> s.Health:
        """Whether the service is up (answered without a token)."""
        return s.Health(status="stopping" if app.state.stopping else "ok", models=len(models))

    @app.get("/ready", response_model=Readiness, responses={503: {"model": Readiness}})
    async def ready() -> JSONResponse:
        """Whether every model can answer now: workers started and all running (503 if not;
        answered without a token)."""
        return ready_response(models, stopping=app.state.stopping)

    @app.get("/v1/models", response_model=s.ModelList, responses=_ERRORS)
    async def list_models() -> s.ModelList:
        """What is loaded: each model's name, load time, family, parameters, endpoints,
        longest input."""
        return s.ModelList(data=[_card(m) for m in models])

    @app.get("/v1/models/{model_id:path}", response_model=s.ModelCard, responses=_ERRORS)
    async def retrieve_model(model_id: str) -> s.ModelCard:
        """One loaded model (OpenAI's ``models.retrieve``); 404 naming it when not loaded."""
        for m in models:
            if m.name == model_id:
                return _card(m)
        names = ", ".join(m.name for m in models)
        raise Problem(
            404, f"model: no loaded model {model_id!r} (these are: {names})", param="model"
        )

    @app.get("/metrics", response_class=Response, responses=_ERRORS)
    async def prometheus() -> Response:
        """The Prometheus metrics, text format."""
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)


def _card(m: ServedModel) -> s.ModelCard:
    """The model object of ``m``."""
    return s.ModelCard(
        id=m.name,
        created=m.created,
        family=m.family.name,
        parameters=m.parameters,
        endpoints=sorted({ENDPOINTS[c] for c in m.tasks}),
        reads="image" if m.family.reads == "image" else "text",
        max_input_tokens=m.max_input_tokens,
    )


def _add_chat_route(app: FastAPI, models: Sequence[ServedModel]) -> None:
    """``POST /v1/chat/completions``: OpenAI clients' chat call, answered with a 404 that says
    why rather than a bare one (left out of the OpenAPI schema: nothing is served there)."""

    @app.post(CHAT, include_in_schema=False)
    async def chat_completions(request: Request) -> Any:
        """Always a 404 saying why: no served model has a chat template."""
        generators = [m.name for m in models if "generate" in m.tasks]
        instead = (
            f"; send prompts to /v1/completions (served by {', '.join(generators)})"
            if generators
            else ""
        )
        raise Problem(
            404,
            f"{CHAT} is not served: no loaded model has a chat template (aiayn's GPT-2 "
            f"checkpoints are plain language models, which continue a text){instead}",
        )


class _Routes:
    """The endpoints of the loaded models' commands."""

    def __init__(self, models: Sequence[ServedModel], options: ServeOptions):
        self.models, self.options = models, options

    def pick(self, command: str, name: str | None) -> Task:
        """The task of model ``name`` (or of the one model serving ``command``)."""
        serving = [m for m in self.models if command in m.tasks]
        path = ENDPOINTS[command]
        if name is None:
            if len(serving) == 1:
                return serving[0].tasks[command]
            names = ", ".join(m.name for m in serving)
            raise Problem(
                422, f"model: several models serve {path} ({names}): name one", param="model"
            )
        for m in serving:
            if m.name == name:
                return m.tasks[command]
        names = ", ".join(m.name for m in serving)
        raise Problem(
            404, f"model: no loaded model {name!r} serves {path} (these do: {names})", param="model"
        )

    async def answer(self, request: Request, task: Task, job: Job) -> Any:
        """Queue the job and wait for its answer, the client's leaving or the timeout."""
        setattr(request.state, MODEL_STATE, task.name)
        task.engine.submit(job)
        left = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait(
                {job.future, left},
                timeout=self.options.timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            left.cancel()
        if job.future in done:
            return job.future.result()
        job.cancelled = True  # the worker drops it (or its rows) at the next step
        job.future.cancel()
        if left in done:
            raise Problem(499, "the client closed the connection")
        raise Problem(504, f"no answer within {self.options.timeout_s:g} s (--timeout-s)")

    def add(self, app: FastAPI, command: str) -> None:
        """Add the route of ``command``."""
        getattr(self, "_" + command.replace("-", "_"))(app)

    def _translate(self, app: FastAPI) -> None:
        @app.post("/v1/translate", response_model=s.TranslateResponse, responses=_ERRORS)
        async def translate(body: s.TranslateRequest, request: Request) -> Any:
            """Translate texts (``aiayn translate``'s results for the same options)."""
            task = self.pick("translate", body.model)
            job = await prepared(lambda: task.prepare(body))  # type: ignore[attr-defined]
            return await self.answer(request, task, job)

    def _generate(self, app: FastAPI) -> None:
        ok: dict[int | str, dict[str, Any]] = {
            200: {"content": {"text/event-stream": {"schema": _SSE_EVENT}}}
        }

        @app.post(
            "/v1/completions", response_model=s.CompletionResponse, responses={**_ERRORS, **ok}
        )
        async def completions(body: s.CompletionBody, request: Request) -> Any:
            """Continue prompts (OpenAI's completions; ``aiayn generate``'s results, with
            ``echo`` its printed prompt + continuation)."""
            task = self.pick("generate", body.model)
            setattr(request.state, MODEL_STATE, task.name)
            created = int(time.time())
            plan = await prepared(lambda: oa.plan_completion(task, body, created))
            if body.stream:
                return self._stream(task, plan)
            return plan.finish(await self.answer(request, task, plan.job))

    def _stream(self, task: Task, plan: oa.CompletionPlan) -> StreamingResponse:
        """Server-sent events in OpenAI's chunk format, ending with ``[DONE]``."""
        updates: asyncio.Queue[Update] = asyncio.Queue()
        plan.job.progress = updates.put_nowait
        task.engine.submit(plan.job)
        return StreamingResponse(
            events(plan, updates, self.options.timeout_s, task.name),
            media_type="text/event-stream",
        )

    def _embed(self, app: FastAPI) -> None:
        @app.post("/v1/embeddings", response_model=s.EmbeddingResponse, responses=_ERRORS)
        async def embeddings(body: s.EmbeddingRequest, request: Request) -> Any:
            """Sentence embeddings (OpenAI's embeddings; ``aiayn embed``'s vectors), as floats
            or base64 (``encoding_format``)."""
            task: Any = self.pick("embed", body.model)
            oa.check_embeddings(body, task.model.config.d_model)
            job = await prepared(lambda: oa.as_400(lambda: task.prepare(body)))
            return oa.encode_embeddings(await self.answer(request, task, job), body.encoding_format)

    def _fill_mask(self, app: FastAPI) -> None:
        @app.post("/v1/fill-mask", response_model=s.FillMaskResponse, responses=_ERRORS)
        async def fill_mask(body: s.FillMaskRequest, request: Request) -> Any:
            """The most probable tokens at each mask (``aiayn fill-mask``)."""
            task = self.pick("fill-mask", body.model)
            job = await prepared(lambda: task.prepare(body))  # type: ignore[attr-defined]
            return await self.answer(request, task, job)

    def _attention(self, app: FastAPI) -> None:
        @app.post("/v1/attention", response_model=s.AttentionResponse, responses=_ERRORS)
        async def attention(body: s.AttentionRequest, request: Request) -> Any:
            """Every layer's and head's attention for one text (``aiayn attention``'s maps)."""
            task = self.pick("attention", body.model)
            job = await prepared(lambda: task.prepare(body))  # type: ignore[attr-defined]
            return await self.answer(request, task, job)

    def _classify_text(self, app: FastAPI) -> None:
        if any(r.path == "/v1/classify" for r in app.routes):  # type: ignore[attr-defined]
            return
        kinds = {c for m in self.models for c in m.tasks if ENDPOINTS[c] == "/v1/classify"}
        extra = _classify_body(kinds)

        @app.post(
            "/v1/classify",
            response_model=s.ClassifyResponse,
            responses=_ERRORS,
            openapi_extra=extra,
        )
        async def classify(request: Request) -> Any:
            """Labels of texts (JSON, a BERT classifier) or of an uploaded image (multipart
            form: ``image``, optional ``model`` and ``top_k``; a ViT)."""
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind == "application/json" and "classify-text" in kinds:
                body = await _json_body(request, s.ClassifyRequest)
                task = self.pick("classify-text", body.model)
                job = await prepared(lambda: task.prepare(body))  # type: ignore[attr-defined]
                return await self.answer(request, task, job)
            if kind == "multipart/form-data" and "classify-image" in kinds:
                return await self._classify_image_form(request)
            wanted = " or ".join(_CONTENT[k] for k in sorted(kinds))
            raise Problem(415, f"Content-Type must be {wanted}, got {kind or 'none'}")

    _classify_image = _classify_text

    async def _classify_image_form(self, request: Request) -> Any:
        form = await request.form(max_files=1, max_fields=2)
        unknown = sorted(set(form) - {"image", "model", "top_k"})
        if unknown:
            raise Problem(422, f"{unknown[0]}: unknown field", param=unknown[0])
        image, name, top_k = form.get("image"), form.get("model"), form.get("top_k")
        if image is None or isinstance(image, str):
            raise Problem(422, "image: an uploaded image file is required", param="image")
        if name is not None and not isinstance(name, str):
            raise Problem(422, "model: must be a text field", param="model")
        task = self.pick("classify-image", name or None)
        k = _form_int(top_k, "top_k")
        data = await image.read()
        job = await prepared(lambda: task.prepare(data, k))  # type: ignore[attr-defined]
        return await self.answer(request, task, job)


_CONTENT = {"classify-text": "application/json", "classify-image": "multipart/form-data"}


def _classify_body(kinds: set[str]) -> dict[str, Any]:
    """``/v1/classify``'s request body in the OpenAPI schema: JSON texts and/or an image form."""
    content: dict[str, Any] = {}
    if "classify-text" in kinds:
        content["application/json"] = {"schema": s.ClassifyRequest.model_json_schema()}
    if "classify-image" in kinds:
        content["multipart/form-data"] = {
            "schema": {
                "type": "object",
                "required": ["image"],
                "properties": {
                    "image": {"type": "string", "format": "binary"},
                    "model": {"type": "string"},
                    "top_k": {"type": "integer", "minimum": 1},
                },
                "additionalProperties": False,
            }
        }
    return {"requestBody": {"required": True, "content": content}}


def _form_int(value: Any, field: str) -> int | None:
    """A form field holding an integer ≥ 1, or None; 422 naming it otherwise."""
    if value is None:
        return None
    try:
        number = int(value) if isinstance(value, str) else None
    except ValueError:
        number = None
    if number is None or number < 1:
        raise Problem(422, f"{field}: must be an integer >= 1", param=field)
    return number


async def _json_body(request: Request, model: type[Any]) -> Any:
    """The request's JSON body validated as ``model`` (a 422 naming the field otherwise)."""
    from pydantic import ValidationError

    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise _validation_problem(error.errors(include_url=False), prefix=()) from None


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return problem_response(_validation_problem(list(error.errors()), prefix=("body",)))

    @app.exception_handler(HTTPException)
    async def http_problem(request: Request, error: HTTPException) -> JSONResponse:
        if isinstance(error, Problem):
            return problem_response(error)
        return problem_response(
            Problem(error.status_code, str(error.detail), headers=dict(error.headers or {}))
        )

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception) -> JSONResponse:
        return problem_response(Problem(500, "internal error (see the server's log)"))


def problem_response(problem: Problem) -> JSONResponse:
    """The JSON answer of ``problem``."""
    body = s.ErrorResponse(
        error=s.ErrorBody(message=problem.message, type=problem.kind, param=problem.param)
    )
    return JSONResponse(body.model_dump(), status_code=problem.status, headers=problem.headers)


_SCALAR_TAGS = frozenset(
    {
        "str",
        "int",
        "float",
        "bool",
        "bytes",
        "none",
        "decimal",
        "date",
        "time",
        "datetime",
        "timedelta",
        "uuid",
        "url",
        "any",
    }
)
_TAG = re.compile(r"[a-z]+(-[a-z]+)+(\[.*\])?|[a-z]+\[.*\]")
"""A tag of pydantic's (``constrained-str``, ``list[int]``, ``function-after[f(), str]``,
``literal['a']``): lower-case words joined by hyphens and/or a bracketed part, which no field
name of the service has."""


def is_type_tag(part: str) -> bool:
    """Whether a part of pydantic's error location is a type tag (the alternative of a union
    that failed) rather than a field name or an index: ``str``, ``list[int]``,
    ``function-after[…]`` are; ``stream``, ``stream_options``, ``integer_ids``, ``3`` are not."""
    return part in _SCALAR_TAGS or _TAG.fullmatch(part) is not None


_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
    "description": "one server-sent event: its data a completion chunk as JSON, or [DONE]",
}
"""The schema of one event of a streamed completion (OpenAPI 3.0/3.1 describe a
``text/event-stream`` response by the schema of each event)."""


def _validation_problem(errors: Sequence[Any], *, prefix: tuple[str, ...]) -> Problem:
    """A 422 naming the first field pydantic refused: ``texts.2: String should have at least 1
    character``; malformed JSON says so."""
    e = _most_telling(errors)
    if e["type"] == "json_invalid":
        reason = e.get("ctx", {}).get("error", "malformed")
        return Problem(422, f"the body is not valid JSON ({reason})")
    loc = [str(x) for x in e["loc"]][len(prefix) :]
    loc = [x for x in loc if not is_type_tag(x)]
    field = ".".join(loc) or "body"
    messages = {"extra_forbidden": "unknown field", "missing": "required field missing"}
    return Problem(422, f"{field}: {messages.get(e['type'], e['msg'])}", param=field)


def _most_telling(errors: Sequence[Any]) -> Any:
    """Of a union's errors (one per alternative), the one that is not a mere wrong type: for
    ``prompt: []``, "at least 1 item" rather than "not a string"."""
    return next((e for e in errors if not e["type"].endswith("_type")), errors[0])


class Guard:
    """Every HTTP request passes here first: the bearer token (401 without it), the body size
    (413 beyond ``max_body`` bytes, by ``Content-Length`` or as the body arrives) and the
    request metrics (endpoint, model, status, latency). An answer that starts before the
    request's body was read to its end (a 413, a 401) says ``Connection: close``, so the server
    closes the connection rather than read and discard the rest of the body."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        api_key: str | None,
        max_body: int,
        paths: set[str],
    ):
        self.app, self.metrics, self.api_key = app, metrics, api_key
        self.max_body, self.paths = max_body, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status, body = time.monotonic(), [500], _Body(scope)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if not body.read:
                    message = {**message, "headers": [*message.get("headers", []), _CLOSE]}
            await send(message)

        try:
            refused = self._refusal(scope)
            if refused is not None:
                await problem_response(refused)(scope, receive, sending)
                return
            await self.app(scope, self._limited(receive, body), sending)
        finally:
            model = str(scope.get("state", {}).get(MODEL_STATE, ""))
            seconds = time.monotonic() - started
            self.metrics.request(self._label(scope["path"]), status[0], seconds, model)

    def _label(self, path: str) -> str:
        """The request metrics' endpoint label: a served path, ``/v1/models/{id}``, or other."""
        if path in self.paths:
            return path
        return MODEL if path.startswith("/v1/models/") else "other"

    def _refusal(self, scope: Scope) -> Problem | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
        if self.api_key is not None and scope["path"] not in OPEN_PATHS and not preflight:
            given = headers.get("authorization", "")
            expected = f"Bearer {self.api_key}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return Problem(
                    401,
                    "a bearer token is required: Authorization: Bearer KEY",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            return self._too_large()
        return None

    def _too_large(self) -> Problem:
        return Problem(413, f"the body is larger than {self.max_body} bytes (--max-body-bytes)")

    def _limited(self, receive: Receive, body: _Body) -> Callable[[], Awaitable[Message]]:
        seen = [0]

        async def limited() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > self.max_body:
                    raise self._too_large()
                if not message.get("more_body", False):
                    body.read = True
            return message

        return limited


_CLOSE = (b"connection", b"close")


class _Body:
    """Whether a request's body has been read to its end (a request without one has)."""

    def __init__(self, scope: Scope):
        headers = dict(scope["headers"])
        length = headers.get(b"content-length", b"0").strip()
        empty = not length.isdigit() or not int(length)
        self.read = empty and b"transfer-encoding" not in headers
