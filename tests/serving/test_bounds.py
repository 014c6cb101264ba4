"""What one request may ask of ``aiayn serve`` (:mod:`aiayn.limits`, ``ServeOptions``): the beam
(``--max-beam``, 16 by default), ``n``, the items and the tokens of a request
(``--max-request-tokens``), and an uploaded image's shape (its longest side, which a resize's
cost grows with). Each refusal is a 4xx naming the field."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from aiayn import limits
from aiayn.data.images import check_pixels
from aiayn.errors import UserError


@pytest.fixture(scope="module")
def small(checkpoints: dict[str, Path], serve_app: Any) -> Any:
    """The translation, LM and BERT models served with a 200-token request bound."""
    with serve_app(checkpoints, ["mt", "lm", "mlm"], max_request_tokens=200) as c:
        yield c


def _refused(r: Any, status: int, param: str) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param + ":")
    assert "\n" not in error["message"]
    return str(error["message"])


def test_beam_is_bounded_by_max_beam(client: TestClient, checkpoints: dict[str, Path],
                                     serve_app: Any) -> None:  # fmt: skip
    assert limits.SERVE_MAX_BEAM == 16
    r = client.post("/v1/translate", json={"model": "mt", "texts": ["hello world"], "beam": 17})
    assert "16 (--max-beam)" in _refused(r, 422, "beam")
    r = client.post("/v1/translate", json={"model": "mt", "texts": ["hello"], "beam": 1000})
    _refused(r, 422, "beam")
    ok = client.post("/v1/translate", json={"model": "mt", "texts": ["hello world"], "beam": 16})
    assert ok.status_code == 200 and len(ok.json()["translations"]) == 1
    with serve_app(checkpoints, ["mt"], max_beam=20) as wide:  # configurable
        r = wide.post("/v1/translate", json={"texts": ["hello world"], "beam": 20, "n_best": 20})
        assert r.status_code == 200 and len(r.json()["translations"][0]["hypotheses"]) == 20
        r = wide.post("/v1/translate", json={"texts": ["hello world"], "beam": 21})
        _refused(r, 422, "beam")


def test_n_and_items_are_bounded(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": "lm", "prompt": "hi", "n": 17})
    _refused(r, 422, "n")
    texts = ["a"] * (limits.MAX_REQUEST_ITEMS + 1)
    _refused(client.post("/v1/translate", json={"model": "mt", "texts": texts}), 422, "texts")
    r = client.post("/v1/completions", json={"model": "lm", "prompt": ["hi"] * 100, "n": 11})
    assert "1024 per request" in _refused(r, 422, "n")


def test_request_tokens_are_bounded(small: TestClient) -> None:
    text = "the cat sleeps on the mat"
    r = small.post("/v1/translate", json={"texts": [text] * 2, "beam": 1, "max_new_tokens": 5})
    assert r.status_code == 200  # well within 200 tokens
    r = small.post("/v1/translate", json={"texts": [text] * 2, "beam": 16})
    message = _refused(r, 413, "texts")
    assert "--max-request-tokens" in message and "times the beam" in message
    r = small.post("/v1/completions", json={"prompt": "hi", "max_tokens": 20, "n": 16})
    assert "at most 200 per" in _refused(r, 400, "prompt")  # OpenAI's status for a long request
    r = small.post("/v1/completions", json={"prompt": [[5, 6, 7]] * 16, "max_tokens": 20})
    _refused(r, 400, "prompt")  # token-id prompts are counted as they are
    r = small.post("/v1/completions", json={"prompt": "hi", "max_tokens": 10, "n": 2})
    assert r.status_code == 200
    many = ["the cat sat on the mat ."] * 30
    _refused(small.post("/v1/embeddings", json={"input": many}), 400, "input")
    _refused(small.post("/v1/fill-mask", json={"texts": [t + " [MASK]" for t in many]}), 413,
             "texts")  # fmt: skip
    assert small.post("/v1/embeddings", json={"input": many[:2]}).status_code == 200


def _grey_png_header_only(width: int, height: int) -> bytes:
    """A grey PNG of ``width`` × ``height`` whose pixel data is a few bytes of zlib that
    decompress to nothing useful: enough for Pillow to read the size from its header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))  # fmt: skip


def test_images_with_a_side_beyond_the_bound_are_refused(client: TestClient) -> None:
    # the 64,000,000 × 1 grey PNG is within MAX_IMAGE_PIXELS, but its resize took 0.9 GB
    assert limits.MAX_IMAGE_PIXELS >= 64_000_000 * 1
    for width, height in ((64_000_000, 1), (1, 64_000_000), (limits.MAX_IMAGE_SIDE + 1, 2)):
        data = _grey_png_header_only(width, height)
        r = client.post("/v1/classify", files={"image": ("long.png", data, "image/png")})
        message = _refused(r, 413, "image")
        assert f"{max(width, height):,}" in message and f"{limits.MAX_IMAGE_SIDE:,}" in message
    with pytest.raises(UserError, match="a side of 64,000,000 pixels"):
        check_pixels("x.png", 64_000_000, 1)
    check_pixels("x.png", limits.MAX_IMAGE_SIDE, 1)  # at the bound: accepted
    out = io.BytesIO()
    Image.new("L", (limits.MAX_IMAGE_SIDE, 1), 7).save(out, format="PNG")
    r = client.post("/v1/classify", files={"image": ("wide.png", out.getvalue(), "image/png")})
    assert r.status_code == 200 and r.json()["model"] == "vit"
