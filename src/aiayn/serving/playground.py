"""The playground page of ``aiayn serve`` (``GET /``): one self-contained HTML page (inline script
and CSS, nothing loaded from elsewhere) that lists the loaded models (``/v1/models``) and sends
what is typed, or an image dropped on it, to the chosen model's endpoint: translations,
continuations, nearest-sentence similarities (the first line against the others), labels, or
masked tokens. A bearer token, when the service needs one, is typed into the page and sent with
every call. The page itself holds no data and is served without the token.

After a translation, when the model serves ``/v1/attention``, the page asks for the
encoder–decoder attention of the answer (the first line's source and its translation as the
target, the maps ``aiayn attention`` captures; where the answer, tokenized again, has more tokens
than a map's side, the model's own greedy translation, as the maps' lines then say) and draws
it with the attention page's head view (:mod:`aiayn.visualization.head_view`: its style, markup
and script, unchanged) in an inline frame of its own, built in the browser from the answer's
JSON: every head of a layer at once, a line from each decoder input to each source token it
attends to.

The page's template, style and script are files of the package: ``static/playground.html``,
``.css`` and ``.js``, with ``static/attention_frame.html`` for the frame (read with
:func:`~aiayn.visualization.static_files.static_text`); the script's ``/*NAME*/`` placeholders
are filled in here.

The script exposes ``window.aiaynPlayground`` (``models()``, ``choose(name)``, ``run()``,
``output()``, ``attention()``: the drawn maps' token counts) for the headless-browser test.
"""

from __future__ import annotations

import json

from aiayn.visualization.head_view import (
    HEAD_VIEW_SCRIPT,
    HEAD_VIEW_STYLE,
    HEAD_VIEW_THRESHOLD,
    head_view_section,
)
from aiayn.visualization.html_report import page_head
from aiayn.visualization.static_files import fill, static_text

_FRAME_DATA = "\0"  # marks where the frame's page is cut for the answer's JSON


def _page_file(name: str) -> str:
    """The text of ``static/<name>`` in :mod:`aiayn.serving` (the playground's files)."""
    return static_text("aiayn.serving", name)


def _js_string(text: str) -> str:
    """``text`` as a JavaScript string literal that is safe inside a ``<script>`` element."""
    literal = json.dumps(text)
    return literal.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _frame() -> tuple[str, str]:
    """The head view's page (the attention page's head view, as ``head_view`` writes it) before
    and after its data, which the script puts between them."""
    page = fill(
        _page_file("attention_frame.html"),
        head=page_head("Encoder–decoder attention", HEAD_VIEW_STYLE),
        section=head_view_section(),
        data=_FRAME_DATA,
        script=HEAD_VIEW_SCRIPT,
    )
    head, tail = page.split(_FRAME_DATA)
    return head, tail


def _filled(script: str, values: dict[str, str]) -> str:
    """``script`` with each placeholder (a key of ``values``: ``/*NAME*/`` and the default that
    keeps the file valid JavaScript) replaced by its value; each must occur exactly once."""
    for placeholder, value in values.items():
        if script.count(placeholder) != 1:
            raise ValueError(f"static/playground.js should hold {placeholder} once")
        script = script.replace(placeholder, value)
    return script


def _page() -> str:
    """``static/playground.html`` with its style and its script, whose placeholders hold the
    frame's page and the head view's threshold."""
    head, tail = _frame()
    script = _filled(
        _page_file("playground.js"),
        {
            '/*FRAME_HEAD*/""': _js_string(head),
            '/*FRAME_TAIL*/""': _js_string(tail),
            "/*THRESHOLD*/0": json.dumps(HEAD_VIEW_THRESHOLD),
        },
    )
    return fill(_page_file("playground.html"), style=_page_file("playground.css"), script=script)


PAGE = _page()
"""The page (``GET /``)."""
