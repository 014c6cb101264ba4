"""The attention page in a real headless browser (Chromium through Selenium): it loads without
script errors, picking another head changes the picture, and the decoder's masked
self-attention shows nothing above the diagonal.

Needs the Debian packages ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium``,
``/usr/bin/chromedriver``) and the ``selenium`` package; skipped, with the reason, without them.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aiayn.checkpoint import load_checkpoint
from aiayn.data.tokenizer import Tokenizer
from aiayn.visualization.attention_maps import collect_attention
from aiayn.visualization.html_report import write_attention_html

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WHITE = [255, 255, 255, 255]

# Headless, and quiet on a machine without network access (no background requests, no QUIC).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)

# Installed before any script of the page runs: collects uncaught errors and rejections.
ERROR_COLLECTOR = """
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
window.addEventListener("unhandledrejection", function (e) {
  window.__errors.push("unhandled rejection: " + String(e.reason));
});
"""


def _missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'selenium>=4.20', in the test extra)"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).is_file() and not shutil.which(Path(path).name):
            return f"{path} not found: install the Debian package {package}"
    return None


@pytest.fixture(scope="module")
def page(checkpoint_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML page for the tiny checkpoint and a given sentence pair."""
    checkpoint = load_checkpoint(checkpoint_dir)
    tokenizer = Tokenizer.load(checkpoint.tokenizer_path)
    maps = collect_attention(
        checkpoint.model, tokenizer, "the cat sat on the mat", "die katze sass auf der matte"
    )
    return write_attention_html(maps, tmp_path_factory.mktemp("html") / "attention.html")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="aiayn-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(shutil.which("chromedriver") or CHROMEDRIVER)
    browser = webdriver.Chrome(service=service, options=options)
    browser.set_page_load_timeout(15)
    try:
        browser.execute_cdp_cmd(
            "Page.addScriptToEvaluateOnNewDocument", {"source": ERROR_COLLECTOR}
        )
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _fingerprint(browser: Any) -> str:
    return str(browser.execute_script("return document.getElementById('map').toDataURL();"))


def test_page_in_headless_chromium(driver: Any, page: Path) -> None:
    from selenium.webdriver.support.ui import Select

    driver.get(page.as_uri())
    assert driver.execute_script("return window.__errors;") == []
    state = driver.execute_script("return window.aiaynAttention.state();")
    assert state == {"kind": "encoder_self", "layer": 1, "head": 1}

    # Picking another head redraws another picture.
    before = _fingerprint(driver)
    matrix_before = driver.execute_script("return window.aiaynAttention.matrix();")
    Select(driver.find_element("id", "head")).select_by_index(1)
    assert driver.execute_script("return window.aiaynAttention.state();")["head"] == 2
    assert driver.execute_script("return window.aiaynAttention.matrix();") != matrix_before
    assert _fingerprint(driver) != before

    # The decoder's masked self-attention: white above the diagonal, BOS sees only itself.
    kind = Select(driver.find_element("id", "kind"))
    kind.select_by_visible_text("decoder masked self-attention")
    layers = Select(driver.find_element("id", "layer"))
    assert len(layers.options) == 2  # the decoder has 2 layers, the encoder 1
    for layer in range(2):
        layers.select_by_index(layer)
        matrix = driver.execute_script("return window.aiaynAttention.matrix();")
        pixels = driver.execute_script(
            "var a = window.aiaynAttention, m = a.matrix();"
            "return m.map(function (row, r) { return row.map(function (_, c) {"
            "  return a.pixel(r, c); }); });"
        )
        t = len(matrix)
        assert t > 2 and all(len(row) == t for row in matrix)
        for r in range(t):
            assert abs(sum(matrix[r]) - 1) < 1e-3
            for c in range(r + 1, t):
                assert matrix[r][c] == 0 and pixels[r][c] == WHITE, (layer, r, c)
        assert pixels[0][0] != WHITE and matrix[0][0] == 1

    # Encoder–decoder attention is not masked: its picture differs again.
    kind.select_by_visible_text("encoder–decoder attention")
    assert driver.execute_script("return window.aiaynAttention.state();")["kind"] == "cross"

    assert driver.execute_script("return window.__errors;") == []
    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == [], severe


# -- the head view -------------------------------------------------------------------------
def _page_data(browser: Any) -> Any:
    return browser.execute_script(
        "return JSON.parse(document.getElementById('attention-data').textContent);"
    )


def _expected_lines(
    layer: list[list[list[float]]],
    threshold: float,
    *,
    heads: set[int] | None = None,
    row: int | None = None,
    col: int | None = None,
) -> list[tuple[int, int, int]]:
    """(head, row, col) of every weight the head view draws: above the threshold, of a head that
    is on, in the hovered row or column if any."""
    return [
        (h, r, c)
        for h, matrix in enumerate(layer)
        if heads is None or h in heads
        for r, weights in enumerate(matrix)
        if row is None or r == row
        for c, w in enumerate(weights)
        if w > threshold and (col is None or c == col)
    ]


def _drawn(browser: Any) -> list[tuple[int, int, int]]:
    lines = browser.execute_script(
        "return Array.prototype.map.call(document.querySelectorAll('#hv-svg line'), function (l) {"
        "  return [+l.getAttribute('data-head'), +l.getAttribute('data-row'),"
        "          +l.getAttribute('data-col')]; });"
    )
    assert browser.execute_script("return window.aiaynHeadView.lineCount();") == len(lines)
    return sorted(tuple(line) for line in lines)


def _token(browser: Any, side: str, index: int) -> Any:
    return browser.find_element(
        "css selector", f'#hv-svg text[data-side="{side}"][data-index="{index}"]'
    )


def test_head_view_in_headless_chromium(driver: Any, page: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    driver.set_window_size(1400, 1600)  # the head view, below the heatmap, in sight
    driver.get(page.as_uri())
    assert driver.execute_script("return window.__errors;") == []
    driver.execute_script("document.getElementById('hv-svg').scrollIntoView();")
    data = _page_data(driver)
    threshold = data["threshold"]
    assert driver.execute_script("return window.aiaynHeadView.threshold;") == threshold > 0
    state = driver.execute_script("return window.aiaynHeadView.state();")
    assert state == {"kind": "encoder_self", "layer": 1, "heads": [1, 2], "token": None}

    # Every head of the layer at once: one line per weight above the threshold.
    layer = data["kinds"][0]["layers"][0]
    everything = _expected_lines(layer, threshold)
    assert _drawn(driver) == sorted(everything) and len(everything) > len(layer[0])

    # Hovering over a query isolates its row; over a key, its column; leaving restores all.
    ActionChains(driver).move_to_element(_token(driver, "left", 1)).perform()
    assert driver.execute_script("return window.aiaynHeadView.state();")["token"] == {
        "side": "left",
        "index": 1,
    }
    row = _expected_lines(layer, threshold, row=1)
    assert _drawn(driver) == sorted(row) and 0 < len(row) < len(everything)
    ActionChains(driver).move_to_element(_token(driver, "right", 2)).perform()
    assert _drawn(driver) == sorted(_expected_lines(layer, threshold, col=2))
    ActionChains(driver).move_to_element(driver.find_element("tag name", "h1")).perform()
    assert _drawn(driver) == sorted(everything)

    # A head clicked off is not drawn; clicked again, it is.
    driver.find_element("css selector", '#hv-heads .hv-head[data-head="0"]').click()
    assert _drawn(driver) == sorted(_expected_lines(layer, threshold, heads={1}))
    driver.find_element("css selector", '#hv-heads .hv-head[data-head="0"]').click()
    assert _drawn(driver) == sorted(everything)

    # The decoder's masked self-attention, layer 2: no line to a later position.
    Select(driver.find_element("id", "hv-kind")).select_by_visible_text(
        "decoder masked self-attention"
    )
    Select(driver.find_element("id", "hv-layer")).select_by_index(1)
    decoder = data["kinds"][1]["layers"][1]
    drawn = _drawn(driver)
    assert drawn == sorted(_expected_lines(decoder, threshold))
    assert all(c <= r for _, r, c in drawn)

    assert driver.execute_script("return window.__errors;") == []
    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == [], severe


@pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")
def test_head_view_opens_on_berts_mask(
    driver: Any, converted_families: dict[str, Any], tmp_path: Path
) -> None:
    """A fill-mask text: the head view opens with the [MASK] row isolated (its attention)."""
    from aiayn.visualization import capture_attention, head_view

    checkpoint = converted_families["bert"].checkpoint
    attention = capture_attention(checkpoint, text="the cat [MASK] on the mat .")
    path = head_view(attention).save(tmp_path / "head_view.html")
    driver.get(path.as_uri())
    assert driver.execute_script("return window.__errors;") == []
    data = _page_data(driver)
    where = data["kinds"][0]["rows"].index("[MASK]")
    state = driver.execute_script("return window.aiaynHeadView.state();")
    assert state["token"] == {"side": "left", "index": where}
    layer = data["kinds"][0]["layers"][0]
    assert _drawn(driver) == sorted(_expected_lines(layer, data["threshold"], row=where))
    _token(driver, "left", where).click()  # unpinned: every line
    driver.execute_script("window.aiaynHeadView.leave();")
    assert _drawn(driver) == sorted(_expected_lines(layer, data["threshold"]))
    assert driver.execute_script("return window.__errors;") == []
