"""The playground page (``GET /``) in headless Chromium, against a real server: it loads without
script errors, lists the loaded models, and shows the endpoints' answers for typed text and for
an uploaded image, and after a translation the head view of its encoder–decoder attention.

Needs Chromium, chromedriver and selenium, as the attention page's browser test
(tests/visualization/test_html_browser.py, whose browser set-up this reuses); skipped without.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from serve_helpers import live_server

from data_builders import load_test_file


def _browser_test() -> ModuleType:
    return load_test_file("visualization/test_html_browser.py")


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    b = _browser_test()
    reason = b._missing()
    if reason is not None:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or b.CHROMIUM
    for flag in b.CHROMIUM_FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="aiayn-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver") or b.CHROMEDRIVER),
                               options=options)  # fmt: skip
    browser.set_page_load_timeout(30)
    browser.set_script_timeout(60)
    try:
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                {"source": b.ERROR_COLLECTOR})  # fmt: skip
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def base(checkpoints: dict[str, Path], serve_app: Any) -> Iterator[str]:
    """A real server (uvicorn in a thread) of the translation model, the LM and the ViT."""
    with live_server(serve_app(checkpoints, ["mt", "lm", "vit"]).app) as url:
        yield url


def _run(driver: Any) -> str:
    driver.execute_async_script(
        "var done = arguments[arguments.length - 1];"
        "window.aiaynPlayground.run().then(function () { done(); });"
    )
    return str(driver.execute_script("return window.aiaynPlayground.output();"))


_LABELS = (
    "return Array.prototype.map.call(document.querySelectorAll("
    "'#hv-svg text[data-side=\"' + arguments[0] + '\"]'), function (t) {"
    " return t.textContent; });"
)


def _check_attention(driver: Any, base: str, source: str, translation: str) -> bool:
    """The encoder–decoder attention of the first line's answer (of the model's greedy one when
    the answer re-tokenized is too long, as a random model's is) is drawn in the head view: a
    token per decoder input on the left, per source token on the right, lines between them,
    as ``/v1/attention`` gives them; no script error in its frame. Returns whether the page
    fell back to the greedy translation."""
    body = {"model": "mt", "text": source, "views": ["cross"], "target": translation}
    r = httpx.post(base + "/v1/attention", json=body)
    fell_back = r.status_code == 413
    if fell_back or not translation:  # the page's fallback: the greedy translation
        r = httpx.post(base + "/v1/attention", json={**body, "target": None})
    maps = r.json()["views"][0]
    drawn = driver.execute_script("return window.aiaynPlayground.attention();")
    assert drawn == {"view": "cross", "rows": len(maps["rows"]), "cols": len(maps["cols"]),
                     "layers": len(maps["layers"])}  # fmt: skip
    assert driver.find_element("id", "attention").is_displayed()
    driver.switch_to.frame(driver.find_element("id", "attention-frame"))
    try:
        assert driver.execute_script(_LABELS, "left") == maps["rows"]  # BOS + the answer
        assert driver.execute_script(_LABELS, "right") == maps["cols"]  # the source + EOS
        state = driver.execute_script("return window.aiaynHeadView.state();")
        assert state == {"kind": "cross", "layer": 1, "heads": [1, 2, 3, 4], "token": None}
        above = sum(
            w > driver.execute_script("return window.aiaynHeadView.threshold;")
            for head in maps["layers"][0] for row in head for w in row
        )  # fmt: skip
        assert driver.execute_script("return window.aiaynHeadView.lineCount();") == above > 0
        assert driver.execute_script("return window.__errors;") == []
    finally:
        driver.switch_to.default_content()
    return fell_back


def test_the_playground_in_headless_chromium(
    driver: Any, base: str, tmp_path: Path, png_bytes: Any
) -> None:
    driver.get(base + "/")
    driver.execute_async_script(
        "var done = arguments[arguments.length - 1];"
        "window.aiaynPlayground.ready().then(function () { done(); });"
    )
    assert driver.execute_script("return window.aiaynPlayground.models();") == ["mt", "lm", "vit"]

    text = "a small dog runs\nhello world"
    driver.find_element("id", "text").send_keys(text)
    expected = httpx.post(base + "/v1/translate", json={"model": "mt", "texts": text.split("\n")})
    assert _run(driver) == "\n".join(t["text"] for t in expected.json()["translations"])
    first = expected.json()["translations"][0]["text"]
    fell_back = _check_attention(driver, base, "a small dog runs", first)

    driver.execute_script("window.aiaynPlayground.choose('lm');")
    field = driver.find_element("id", "text")
    field.clear()
    field.send_keys("the cat")
    expected = httpx.post(base + "/v1/completions",
                          json={"model": "lm", "prompt": "the cat", "max_tokens": 32})  # fmt: skip
    assert _run(driver) == "the cat" + expected.json()["choices"][0]["text"]
    assert driver.execute_script("return window.aiaynPlayground.attention();") is None
    assert driver.find_element("id", "attention").is_displayed() is False

    driver.execute_script("window.aiaynPlayground.choose('vit');")
    assert driver.find_element("id", "text-input").is_displayed() is False
    (tmp_path / "a.png").write_bytes(png_bytes(3))
    driver.find_element("id", "image").send_keys(str(tmp_path / "a.png"))
    labels = httpx.post(base + "/v1/classify", files={"image": ("a.png", png_bytes(3))}).json()
    shown = " ".join(f"{x['label']} {x['probability']:.3f}" for x in labels["labels"][0])
    assert _run(driver).split() == shown.split()

    assert driver.execute_script("return window.__errors;") == []
    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    if fell_back:  # the browser logs the answer's 413, which the page answers with the fallback
        refused = f"{base}/v1/attention - Failed to load resource: the server responded with a "
        assert [e["source"] for e in severe[:1]] == ["network"], severe
        assert severe[0]["message"].startswith(refused) and "413" in severe[0]["message"]
        severe = severe[1:]
    assert severe == [], severe
