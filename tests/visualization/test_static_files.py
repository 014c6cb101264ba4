"""The pages' HTML templates, style sheets and scripts are files of the package (``static/``):
every file the code names is there, found through :mod:`importlib.resources` and shipped by the
package data of pyproject.toml, no file there is left unnamed, and the pages rendered from them
hold their scripts and styles, with the values escaped as before."""

from __future__ import annotations

import re
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch
from PIL import Image

from aiayn.visualization.attention_page import page_head
from aiayn.visualization.head_view import (
    HEAD_VIEW_SCRIPT,
    HEAD_VIEW_STYLE,
    HEAD_VIEW_THRESHOLD,
    head_view,
    head_view_section,
)
from aiayn.visualization.html_report import attention_html
from aiayn.visualization.image_attention import ImageAttention, image_attention_html
from aiayn.visualization.static_files import fill, page_file
from aiayn.visualization.token_attention import AttentionView, TokenAttention

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "aiayn"

# the loaders' calls with a file name, by the package whose static/ folder they read
NAMED = {
    "aiayn.visualization": (sorted((SOURCE / "visualization").glob("*.py")), "page_file"),
    "aiayn.serving": ([SOURCE / "serving" / "playground.py"], "_page_file"),
}
NASTY = "<b>R&D</b> $title ${data} 'q' \"dq\""  # markup, an entity and template placeholders


def named_files(package: str) -> set[str]:
    """The ``static/`` files the code of ``package`` names in its loader's calls."""
    paths, loader = NAMED[package]
    call = re.compile(rf'(?<![\w.]){loader}\(\s*"([^"]+)"\s*\)')
    return {name for path in paths for name in call.findall(path.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("package", sorted(NAMED))
def test_every_named_file_is_in_the_package_and_shipped(package: str) -> None:
    names = named_files(package)
    assert names, f"no static file named in {package}"
    static = resources.files(package) / "static"
    for name in names:
        assert (static / name).is_file(), f"{package}: static/{name} is missing"
        assert (static / name).read_text(encoding="utf-8").strip(), f"static/{name} is empty"
    on_disk = {p.name for p in (SOURCE / package.split(".")[1] / "static").iterdir()}
    assert on_disk == names, f"{package}: files in static/ that no code names, or the reverse"
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["aiayn"]
    shipped = {p.relative_to(SOURCE) for pattern in patterns for p in SOURCE.glob(pattern)}
    folder = Path(package.split(".")[1]) / "static"
    assert {folder / name for name in names} <= shipped, "not in the package data (the wheel)"


def test_fill_puts_values_in_as_given_and_wants_every_one() -> None:
    assert fill("<p>$a ${b}c</p>", a="$b {x}", b="<i>") == "<p>$b {x} <i>c</p>"
    with pytest.raises(KeyError):
        fill("$a $b", a="1")


def _token_attention() -> TokenAttention:
    torch.manual_seed(0)
    weights = torch.softmax(torch.randn(2, 3, 4), dim=-1)  # (H, R, C)
    view = AttentionView(
        "cross", "enc–dec", ["a", "<b>", "c"], ["d", "e", "f&", "</script>"], [weights]
    )
    return TokenAttention(NASTY, [("Source", NASTY)], [view], note=NASTY, marked=NASTY)


def test_attention_page_holds_its_scripts_style_and_escaped_values() -> None:
    page = attention_html(_token_attention(), title=NASTY)
    for script in (page_file("html_report.js"), HEAD_VIEW_SCRIPT):
        assert f"<script>\n{script}</script>" in page
    style = page_file("page.css") + page_file("html_report.css") + HEAD_VIEW_STYLE
    assert f"<style>\n{style}</style>" in page
    escaped = "&lt;b&gt;R&amp;D&lt;/b&gt; $title ${data} &#x27;q&#x27; &quot;dq&quot;"
    assert f"<title>{escaped}</title>" in page and f"<h1>{escaped}</h1>" in page
    assert f'<p class="note">{escaped}</p>' in page
    assert "<b>R&D" not in page
    assert page.count("</script>") == 3  # the data's "</script>" token is escaped
    assert f"above {HEAD_VIEW_THRESHOLD}, as opaque" in page
    assert head_view_section() in page and not head_view_section().endswith("\n")


def test_head_view_page_holds_its_script_and_style() -> None:
    page = head_view(_token_attention()).html
    assert f"<script>\n{HEAD_VIEW_SCRIPT}</script>" in page
    assert page_head(NASTY, HEAD_VIEW_STYLE) in page
    assert page.startswith("<!DOCTYPE html>\n<html") and page.endswith("</body>\n</html>\n")
    assert "<h1>&lt;b&gt;R&amp;D&lt;/b&gt; $title ${data}" in page


def test_image_page_holds_its_script_style_and_escaped_values() -> None:
    torch.manual_seed(0)
    weights = [torch.softmax(torch.randn(2, 5, 5), dim=-1) for _ in range(2)]  # L × (n, T, T)
    image = Image.new("RGB", (16, 16), (10, 200, 30))
    attention = ImageAttention(
        NASTY, image, (16, 16), 8, (2, 2), weights, torch.tensor([0.6, 0.4]), (NASTY, "dog")
    )
    page = image_attention_html(attention, title=NASTY)
    assert f"<script>\n{page_file('image_attention.js')}</script>" in page
    assert f"<style>\n{page_file('image_attention.css')}</style>" in page
    assert "read as 16×16 pixels, a 2×2 grid of\n8×8 patches; 2 layers × 2 heads." in page
    assert page.count("&lt;b&gt;R&amp;D&lt;/b&gt; $title ${data}") == 4  # title ×2, name, label
    assert "<b>R&D" not in page
    assert page.count('src="data:image/') == 2  # the input and the rollout
