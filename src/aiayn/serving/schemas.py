"""The service's requests and responses (pydantic): what each endpoint accepts, field by field,
and what it answers. Every request model forbids unknown fields, so a misspelt option is a 422
naming it rather than an option silently ignored. ``/v1/completions`` and ``/v1/embeddings``
accept every field of OpenAI's requests (a value a model cannot honour is refused by
:mod:`aiayn.serving.openai_api` with a 400 naming the field) and answer in OpenAI's shapes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from aiayn.limits import (
    MAX_BEAM_SIZE,
    MAX_COMPLETION_CHOICES,
    MAX_LENGTH_PENALTY_ALPHA,
    MAX_REQUEST_ITEMS,
)

Text = Annotated[str, Field(min_length=1)]
"""A non-empty text (an empty one is a 422)."""

Unicode = Annotated[str, Field(min_length=0)]
"""A text, empty or not, of valid Unicode: a lone surrogate (JSON's ``"\\ud800"``) is a 422,
as for :data:`Text`. A bare ``str`` field passes such a string on unchecked (pydantic checks
a string's encoding only where it has a constraint), and the tokenizer then fails on it."""

Texts = Annotated[list[Text], Field(min_length=1, max_length=MAX_REQUEST_ITEMS)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
"""A prompt given as token ids (OpenAI's ``prompt: [5, 6, 7]``)."""

TokenIdLists = Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_REQUEST_ITEMS)]
"""Prompts given as token ids (``prompt: [[5, 6], [7]]``)."""


def _null_is(default: Any) -> BeforeValidator:
    """An explicit JSON null read as the field's default (OpenAI's fields are nullable)."""
    return BeforeValidator(lambda value: default if value is None else value)


ModelName = Annotated[
    Unicode | None,
    Field(
        description="a loaded model's name (GET /v1/models); "
        "may be left out when one loaded model serves this"
    ),
]


class Request(BaseModel):
    """A request: unknown fields are refused (422 naming them)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class Answer(BaseModel):
    """A response."""

    model_config = ConfigDict(protected_namespaces=())


class TranslateRequest(Request):
    """``POST /v1/translate``: the options of ``aiayn translate``."""

    model: ModelName = None
    texts: Texts
    beam: Annotated[int, Field(ge=1, le=MAX_BEAM_SIZE)] | None = Field(
        None, description="beam size, 1 = greedy (default: the checkpoint's, else 4)"
    )
    alpha: (
        Annotated[float, Field(ge=0, le=MAX_LENGTH_PENALTY_ALPHA, allow_inf_nan=False)] | None
    ) = Field(None, description="length penalty alpha (default: the checkpoint's, else 0.6)")
    max_new_tokens: Annotated[int, Field(ge=1)] | None = Field(
        None, description="a cap on each translation's tokens"
    )
    n_best: Annotated[int, Field(ge=1, le=MAX_BEAM_SIZE)] | None = Field(
        None, description="hypotheses per text (at most the beam)"
    )
    prefix: Unicode = Field("", description="text put before every input, e.g. T5's task prefix")
    scores: bool = Field(False, description="give each translation's score")


class Scored(Answer):
    """One hypothesis: its text and score (the beam's length-penalised log-probability; null
    for greedy search, which has none)."""

    text: str
    score: float | None = None


class Translation(Answer):
    """One text's translation; ``hypotheses``: its n best, best first, when ``n_best`` > 1."""

    text: str
    score: float | None = None
    hypotheses: list[Scored] | None = None


class TranslateResponse(Answer):
    """The translations, in input order."""

    model: str
    translations: list[Translation]


Stop = Annotated[list[Text], Field(min_length=1, max_length=4)]


class StreamOptions(Request):
    """OpenAI's ``stream_options`` (only with ``stream: true``)."""

    include_usage: bool = Field(
        False, description="end the stream with a chunk of the request's usage (choices: [])"
    )
    include_obfuscation: bool | None = Field(
        None, description="OpenAI's padding of chunks: not done here (true is a 400)"
    )


Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)] | None


class CompletionOptions(Request):
    """The fields of ``POST /v1/completions`` that ``aiayn generate``'s options follow."""

    model: ModelName = None
    max_tokens: Annotated[int, _null_is(16), Field(ge=1)] = 16
    temperature: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    n: Annotated[int, _null_is(1), Field(ge=1, le=MAX_COMPLETION_CHOICES)] = 1
    stop: Text | Stop | None = None
    stream: Annotated[bool, _null_is(False)] = False


class CompletionRequest(CompletionOptions):
    """What the generation task reads (:class:`CompletionBody`'s options, its prompts as text).
    ``temperature`` left out or 0: greedy search (``aiayn generate``'s default); above 0:
    sampling (``--sample``)."""

    prompt: Text | Texts


class CompletionBody(CompletionOptions):
    """``POST /v1/completions``: every field of OpenAI's request. Fields the models cannot
    honour are accepted at their neutral values only (0 penalties, no ``logprobs``, no
    ``logit_bias``, no ``suffix``, ``best_of`` = ``n``): another value is a 400 naming the
    field (:mod:`aiayn.serving.openai_api`)."""

    prompt: Text | Texts | TokenIds | TokenIdLists = Field(
        description="a text, texts, a prompt's token ids, or prompts' token ids"
    )
    stream_options: StreamOptions | None = None
    echo: Annotated[bool, _null_is(False)] = Field(
        False, description="put the prompt before each completion (aiayn generate's output)"
    )
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = Field(
        None, description="not served: any value is a 400"
    )
    presence_penalty: Penalty = Field(None, description="0 only (a 400 otherwise)")
    frequency_penalty: Penalty = Field(None, description="0 only (a 400 otherwise)")
    best_of: Annotated[int, Field(ge=1, le=MAX_COMPLETION_CHOICES)] | None = Field(
        None, description="left out or equal to n (a 400 otherwise)"
    )
    logit_bias: dict[Unicode, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None, description="left out or empty (a 400 otherwise)"
    )
    suffix: Unicode | None = Field(None, description="left out or empty (a 400 otherwise)")
    user: Unicode | None = Field(None, description="accepted and ignored (neither logged nor kept)")


class CompletionChoice(Answer):
    """One completion: ``index`` = prompt number × n + choice number."""

    text: str
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class Usage(Answer):
    """Tokens read and written."""

    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int


class CompletionResponse(Answer):
    """OpenAI's ``text_completion`` object."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class EmbeddingRequest(Request):
    """``POST /v1/embeddings`` (OpenAI's fields; ``normalize`` is aiayn's, as ``aiayn embed
    --no-normalize``). ``encoding_format: "base64"`` (the OpenAI client's default) gives each
    vector as the base64 of its little-endian float32 bytes. ``dimensions`` may only be the
    model's own width (no served model was trained for shortened vectors: a 400 otherwise)."""

    model: ModelName = None
    input: Text | Texts
    encoding_format: Annotated[Literal["float", "base64"], _null_is("float")] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: Unicode | None = Field(None, description="accepted and ignored (neither logged nor kept)")
    normalize: bool = True


class Embedding(Answer):
    """One input's vector: floats, or (``encoding_format: "base64"``) the base64 of its
    little-endian float32 bytes."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingResponse(Answer):
    """The vectors, in input order."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class ClassifyRequest(Request):
    """``POST /v1/classify`` as JSON: texts (and second texts of pairs) for a BERT classifier."""

    model: ModelName = None
    texts: Texts
    pairs: Annotated[list[Unicode], Field(min_length=1, max_length=MAX_REQUEST_ITEMS)] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = Field(None, description="labels per text (1)")


class Label(Answer):
    """A label and its probability."""

    label: str
    probability: float


class ClassifyResponse(Answer):
    """Per text or image, its ``top_k`` labels, most probable first."""

    model: str
    labels: list[list[Label]]


class FillMaskRequest(Request):
    """``POST /v1/fill-mask``: texts with the mask token, for a BERT with its masked-LM head."""

    model: ModelName = None
    texts: Texts
    top_k: Annotated[int, Field(ge=1)] = 5


class Prediction(Answer):
    """One candidate for a mask: id, token, probability, the text with it filled in."""

    token_id: int
    token: str
    probability: float
    sequence: str


class FillMaskResponse(Answer):
    """Per text, per mask (left to right), its candidates, most probable first."""

    model: str
    predictions: list[list[list[Prediction]]]


class AttentionRequest(Request):
    """``POST /v1/attention``: ``aiayn attention``'s maps of one text (``--src`` of a
    translation model, ``--text`` of GPT-2 or BERT)."""

    model: ModelName = None
    text: Text = Field(description="the source sentence (translation), prompt (GPT-2) or text")
    target: Text | None = Field(
        None,
        description="a translation model's target sentence (default: its own greedy translation)",
    )
    views: Annotated[list[Text], Field(min_length=1, max_length=8)] | None = Field(
        None, description="the maps to return by name, e.g. cross (default: all)"
    )


class AttentionMap(Answer):
    """One use of attention, every layer and head: ``layers[n][h][r][c]`` is the weight of query
    ``rows[r]`` on key ``cols[c]`` in head h of layer n (each row sums to 1)."""

    name: str
    title: str
    rows: list[str]
    cols: list[str]
    axis_names: list[str]
    layers: list[list[list[list[float]]]]


class InputLine(Answer):
    """A part of the input ("Source", "Target (the model's own greedy translation)")."""

    label: str
    text: str


class AttentionResponse(Answer):
    """The maps of one input, as ``aiayn attention`` captures them."""

    model: str
    title: str
    lines: list[InputLine]
    views: list[AttentionMap]


class ModelCard(Answer):
    """A loaded model (OpenAI's model object and aiayn's fields): its name, load time, family,
    parameters, endpoints, what it reads (text or image) and its length limit (tokens, or image
    patches + 1)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="when the model was loaded (Unix time, seconds)")
    owned_by: str = "aiayn"
    family: str
    parameters: int
    endpoints: list[str]
    reads: Literal["text", "image"]
    max_input_tokens: int


class ModelList(Answer):
    """What is loaded."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(Answer):
    """``GET /health``."""

    status: Literal["ok", "stopping"]
    models: int


class ErrorBody(Answer):
    """What went wrong: a message naming the field or limit, the field's path when there is one."""

    message: str
    type: str
    param: str | None = None


class ErrorResponse(Answer):
    """Every error answer (4xx, 5xx)."""

    error: ErrorBody
