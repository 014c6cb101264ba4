"""Screenshot of the head view of a page ``aiayn attention`` wrote (headless Chromium, Selenium).

    python scripts/screenshot_head_view.py maps/attention.html docs/images/head_view_lm.png \
        [--kind self] [--layer 2] [--hover left:4] [--width 820]

Opens the page, picks the attention and the layer, optionally hovers over a token (``left:4``:
the query at position 4; ``right:0``: the key at position 0), and saves the head view's section
as a PNG. Needs ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` (Debian's ``chromium`` and
``chromium-driver``) and the ``selenium`` package.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path


def main() -> None:
    """Parse the arguments and write the screenshot."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path, help="an attention.html or head_view.html")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--kind", default=None, help="the attention (a view name, e.g. self)")
    parser.add_argument("--layer", type=int, default=1, help="the layer, from 1 (1)")
    parser.add_argument("--hover", default=None, help="SIDE:INDEX of a token to isolate")
    parser.add_argument("--width", type=int, default=820, help="window width in pixels (820)")
    args = parser.parse_args()

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--force-device-scale-factor=1", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="aiayn-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    browser = webdriver.Chrome(service=service, options=options)
    try:
        browser.set_window_size(args.width, 2400)
        browser.get(args.page.resolve().as_uri())
        kind = args.kind or browser.execute_script("return window.aiaynHeadView.state().kind;")
        browser.execute_script("window.aiaynHeadView.select(arguments[0], arguments[1]);", kind,
                               args.layer)  # fmt: skip
        section = browser.find_element("css selector", "section.headview")
        browser.execute_script("arguments[0].scrollIntoView();", section)
        if args.hover:
            side, index = args.hover.split(":")
            token = f'#hv-svg text[data-side="{side}"][data-index="{int(index)}"]'
            ActionChains(browser).move_to_element(
                browser.find_element("css selector", token)
            ).perform()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(section.screenshot_as_png)
        print(f"wrote {args.out}")
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
