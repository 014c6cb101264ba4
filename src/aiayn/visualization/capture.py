"""The attention of any checkpoint, through the family registry (``aiayn attention``, notebooks).

Each family names its capture in the registry (``Family.attention``, an
:class:`~aiayn.models.families.AttentionCapture`): the function that runs its model once on the
input and keeps the weights the forward returns, the flag its input comes from (``--src``,
``--text`` or ``--image``) and the further flags it takes (``--tgt``, ``--continue``).
:func:`check_request` holds a request to them; :func:`capture_attention` loads a checkpoint and
calls its family's capture, e.g. in a notebook::

    from aiayn.visualization import capture_attention, head_view
    head_view(capture_attention("runs/lm_demo", text="Tom is my friend.", continuation=8))
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from aiayn.errors import UserError
from aiayn.models.families import FAMILIES, AttentionCapture, Family
from aiayn.visualization.html_report import write_attention_files
from aiayn.visualization.token_attention import AttentionRequest, TokenAttention

__all__ = [
    "INPUT_FLAGS",
    "attention_capture",
    "capture_attention",
    "check_request",
    "given_flags",
    "write_capture",
]

INPUT_FLAGS: dict[str, str] = {"src": "SENTENCE", "text": "TEXT", "image": "IMAGE"}
"""The flags an input comes from, with their metavars."""


def attention_capture(family: Family, where: object) -> AttentionCapture:
    """The family's capture; a family without one is a :class:`UserError` naming ``where``."""
    if family.attention is None:
        raise UserError(f"{where} holds a {family.name} model, whose attention is not drawn yet")
    return family.attention


def given_flags(request: AttentionRequest, *, source: bool) -> set[str]:
    """The flags (without ``--``) that ``request`` was given: ``src`` or ``text`` for its text
    (``source``: it came from ``--src``), ``tgt``, ``continue``, ``image``."""
    given = set()
    if request.text is not None:
        given.add("src" if source else "text")
    if request.target is not None:
        given.add("tgt")
    if request.continuation:
        given.add("continue")
    if request.image is not None:
        given.add("image")
    return given


def _readers(flag: str) -> str:
    """The families whose input comes from ``flag``, as "Transformer or T5"."""
    return " or ".join(
        f.title for f in FAMILIES.values() if f.attention and f.attention.reads == flag
    )


def check_request(family: Family, given: Collection[str], where: object) -> AttentionCapture:
    """The family's capture, if the flags ``given`` (without ``--``) are the ones it reads.

    Raises:
        UserError: naming the flag that does not apply, or the input flag that is missing.
    """
    capture = attention_capture(family, where)
    reads = capture.reads
    holds = f"{where} holds a {family.name} model"
    for flag in sorted(given):
        if flag in INPUT_FLAGS and flag != reads:
            raise UserError(
                f"--{flag} is for {_readers(flag)} checkpoints; {holds}: give --{reads}"
            )
        if flag not in INPUT_FLAGS and flag not in capture.options:
            takes = ", ".join(f"--{o}" for o in sorted(capture.options)) or "none"
            raise UserError(f"--{flag} does not apply here: {holds} (its options: {takes})")
    if reads not in given:
        raise UserError(f"{holds}: give --{reads} {INPUT_FLAGS[reads]}")
    return capture


def capture_attention(
    checkpoint: str | Path,
    *,
    text: str | None = None,
    target: str | None = None,
    continuation: int = 0,
    image: str | None = None,
    max_tokens: int | None = None,
) -> Any:
    """Load ``checkpoint`` and return its family's attention for the input: a
    :class:`~aiayn.visualization.token_attention.TokenAttention` for text (``text`` is a
    translation model's source sentence, a language model's prompt, BERT's text), a ViT's
    :class:`~aiayn.visualization.image_view.ImageAttentionResult` for ``image``."""
    from aiayn.checkpoint import read_checkpoint_config

    folder, family, _, _ = read_checkpoint_config(checkpoint)
    request = AttentionRequest(text, target, continuation, image, max_tokens)
    capture = attention_capture(family, folder)
    check_request(family, given_flags(request, source=capture.reads == "src"), folder)
    return run_capture(capture, folder, request)


def run_capture(capture: AttentionCapture, folder: Path, request: AttentionRequest) -> Any:
    """Load the checkpoint at ``folder`` and run ``capture`` on ``request`` (checked)."""
    from torch import nn

    from aiayn.checkpoint import load_checkpoint
    from aiayn.models.families import resolve

    loaded = load_checkpoint(folder, expect=nn.Module, command="attention")
    return resolve(capture.collect)(loaded, request)


def write_capture(result: Any, folder: Path, *, png: bool = True) -> list[Path]:
    """Write a capture's ``result`` into ``folder``; returns the files written. A
    :class:`~aiayn.visualization.token_attention.TokenAttention` (the text families'): its PNGs
    (with ``png``) and ``attention.html`` (:func:`~aiayn.visualization.html_report.
    write_attention_files`); any other result (a ViT's) writes itself:
    ``write(folder, png=...)``."""
    if isinstance(result, TokenAttention):
        return write_attention_files(result, folder, png=png)
    written: list[Path] = result.write(folder, png=png)
    return written
