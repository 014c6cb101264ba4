"""``POST /v1/attention``: the attention maps of one text, as ``aiayn attention`` captures them.

The checkpoint's family names its capture in the registry (``Family.attention``); the task calls
it as the command does (:func:`aiayn.visualization.capture.run_capture`'s call, on the loaded
checkpoint), with ``--max-tokens``'s default (:data:`~aiayn.limits.MAX_ATTENTION_TOKENS`) as the
bound on each side. Families whose capture reads text are served (a translation model's source
sentence and optional target, a GPT-2 prompt, a BERT text); a ViT's image maps are not.

A request runs alone (an :class:`~aiayn.serving.engine.Inline` job) on the worker of the model's
other endpoint, between its batches or decoding steps, so that it never runs the model at the
same time as that worker does.

Shape legend:  N layers   H heads   R rows (queries)   C columns (keys)
"""

from __future__ import annotations

from typing import Any

from aiayn.checkpoint.load import Checkpoint
from aiayn.errors import LengthError, UserError
from aiayn.limits import MAX_ATTENTION_TOKENS, MAX_ATTENTION_WEIGHTS
from aiayn.models.families import AttentionCapture, family_of, resolve
from aiayn.serving import schemas as s
from aiayn.serving.engine import INLINE, BatchEngine, Engine, Inline, Job
from aiayn.serving.metrics import Metrics
from aiayn.serving.options import ServeOptions
from aiayn.serving.problems import Problem
from aiayn.serving.tasks import Task
from aiayn.visualization.token_attention import AttentionRequest, TokenAttention

TEXT_INPUTS = frozenset({"src", "text"})
"""The captures' input flags the endpoint serves: a text (not an image)."""


class AttentionTask(Task):
    """``/v1/attention`` for a checkpoint whose family's capture reads text."""

    command = "attention"
    max_input_tokens = 0  # bounds nothing the model card reports; MAX_ATTENTION_TOKENS a side

    def __init__(
        self,
        name: str,
        ckpt: Checkpoint[Any],
        options: ServeOptions,
        metrics: Metrics,
        host: Engine | None = None,
    ):
        self.ckpt = ckpt
        capture = family_of(ckpt.model).attention
        assert capture is not None
        self.capture: AttentionCapture = capture
        self._collect = resolve(capture.collect)
        self._host = host
        super().__init__(name, options, metrics)

    @classmethod
    def serves(cls, ckpt: Checkpoint[Any]) -> bool:
        """Whether the family's attention capture reads text."""
        capture = family_of(ckpt.model).attention
        return capture is not None and capture.reads in TEXT_INPUTS

    def make_engine(self) -> Engine:
        """The worker of the model's other endpoint (its own when it has none)."""
        if self._host is not None:
            return self._host
        return BatchEngine(self.name, self.options, self.metrics, _refuse_batches)

    def prepare(self, req: s.AttentionRequest) -> Job:
        """The request's job (run alone on the worker); 422 for a target the family does not
        take."""
        if req.target is not None and "tgt" not in self.capture.options:
            raise Problem(
                422,
                f"target: model {self.name} is not a translation model; give text only",
                param="target",
            )
        request = AttentionRequest(
            text=req.text, target=req.target, max_tokens=MAX_ATTENTION_TOKENS
        )
        views = None if req.views is None else tuple(req.views)
        cost = len(req.text) + len(req.target or "")
        return self.job(Inline(lambda: self._answer(request, views)), cost, key=INLINE)

    def _answer(self, request: AttentionRequest, views: tuple[str, ...] | None) -> Any:
        """The capture's maps (on the worker): 413 for a side over the bound or the model's
        positions, 422 for an unknown view name or an empty text."""
        try:
            found: TokenAttention = self._collect(self.ckpt, request)
        except LengthError as error:
            field = "target" if request.target is not None and "target" in str(error) else "text"
            raise Problem(413, f"{field}: {_service_words(error)}", param=field) from None
        except UserError as error:
            raise Problem(422, f"text: {error}", param="text") from None
        return attention_response(self.name, found, views)


def _service_words(error: LengthError) -> str:
    """The capture's message in the service's words (not the command's flags)."""
    message = str(error).replace("--tgt", "target")
    flag = f"more than --max-tokens {error.limit}"
    if flag not in message:
        return message
    head = message.split(":", 1)[0]
    return head.replace(flag, f"more than the {error.limit} a side that /v1/attention draws")


def attention_response(
    model: str, found: TokenAttention, views: tuple[str, ...] | None = None
) -> s.AttentionResponse:
    """``found`` as the endpoint's answer, its views (or those named in ``views``, in that
    order; 422 for a name it does not have) with every weight as the model returned it."""
    names = [v.name for v in found.views]
    wanted = names if views is None else list(views)
    for i, name in enumerate(wanted):
        if name not in names:
            raise Problem(
                422,
                f"views.{i}: no view {name!r} (this model's: {', '.join(names)})",
                param=f"views.{i}",
            )
    _check_size(found, wanted)
    maps = []
    for name in wanted:
        view = found.view(name)
        maps.append(
            s.AttentionMap(
                name=view.name,
                title=view.title,
                rows=view.rows,
                cols=view.cols,
                axis_names=list(view.axis_names),
                layers=[w.tolist() for w in view.layers],  # N × (H, R, C)
            )
        )
    lines = [s.InputLine(label=label, text=text) for label, text in found.lines]
    return s.AttentionResponse(model=model, title=found.title, lines=lines, views=maps)


def _check_size(found: TokenAttention, wanted: list[str]) -> None:
    """413 when the views asked for hold more than MAX_ATTENTION_WEIGHTS weights in all."""
    total = sum(w.numel() for name in wanted for w in found.view(name).layers)  # N × H·R·C
    if total > MAX_ATTENTION_WEIGHTS:
        raise Problem(
            413,
            f"views: {total:,} weights is more than the {MAX_ATTENTION_WEIGHTS:,} "
            "one answer carries; ask for fewer views or a shorter text",
            param="views",
        )


def _refuse_batches(jobs: Any) -> list[Any]:
    """The own worker of a model with no other endpoint runs only inline jobs."""
    return [Problem(422, "this worker runs attention requests only") for _ in jobs]
