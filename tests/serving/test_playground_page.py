"""The playground page (``GET /``) as the service sends it, without a browser: built from the
package's ``static/playground.html``, ``.css`` and ``.js``, its script's placeholders filled in
with the head view's frame and threshold, and served without the bearer token.

The browser test (test_playground.py) runs it; this one needs no Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aiayn.serving.playground import PAGE
from aiayn.visualization.head_view import (
    HEAD_VIEW_SCRIPT,
    HEAD_VIEW_STYLE,
    HEAD_VIEW_THRESHOLD,
    head_view_section,
)
from aiayn.visualization.static_files import static_text

_FRAME = re.compile(r'var FRAME_HEAD = ("(?:[^"\\]|\\.)*"), FRAME_TAIL = ("(?:[^"\\]|\\.)*");')


def _file(name: str) -> str:
    return static_text("aiayn.serving", name)


def test_the_page_is_its_template_with_its_style_and_script() -> None:
    head, rest = _file("playground.html").split("$style")  # one of each, no other placeholder
    middle, tail = rest.split("$script")
    start = head + _file("playground.css") + middle
    assert PAGE.startswith(start) and PAGE.endswith(tail) and "$" not in head + middle + tail
    script = PAGE[len(start) : len(PAGE) - len(tail)]
    found = _FRAME.search(script)
    assert found is not None
    expected = (
        _file("playground.js")
        .replace('/*FRAME_HEAD*/""', found.group(1))
        .replace('/*FRAME_TAIL*/""', found.group(2))
        .replace("/*THRESHOLD*/0", json.dumps(HEAD_VIEW_THRESHOLD))
    )
    assert script == expected and "/*FRAME_HEAD*/" not in PAGE and "/*THRESHOLD*/" not in PAGE
    assert "window.aiaynPlayground = {" in script
    assert f"threshold: {HEAD_VIEW_THRESHOLD}, marked" in script


def test_the_frame_is_the_head_views_page_around_its_data() -> None:
    found = _FRAME.search(PAGE)
    assert found is not None
    head, tail = (json.loads(literal) for literal in found.groups())
    assert "<" not in found.group(0)  # the literals are safe inside the page's <script>
    assert head.startswith("<!DOCTYPE html>") and HEAD_VIEW_STYLE in head
    assert head.endswith(
        f'{head_view_section()}\n<script type="application/json" id="attention-data">'
    )
    assert tail == f"</script>\n<script>\n{HEAD_VIEW_SCRIPT}</script>\n</body>\n</html>\n"


def test_the_page_is_served_without_the_token(checkpoints: dict[str, Path], serve_app: Any) -> None:
    with serve_app(checkpoints, ["lm"], api_key="secret") as client:
        r = client.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert r.text == PAGE
        assert client.get("/v1/models").status_code == 401
