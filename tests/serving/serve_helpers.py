"""What the serving tests that run a real server share: uvicorn in a thread on a free loopback
port, and the library's own generation for the LM checkpoint (what an answer must equal)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from aiayn.checkpoint import load_checkpoint
from aiayn.data.text_tokenizer import load_lm_tokenizer
from aiayn.decoding import GenerateOptions, generate
from aiayn.models.gpt2 import GPT2
from aiayn.serving import ServeOptions
from aiayn.serving.connections import server_config


@contextmanager
def live_server(app: Any, options: ServeOptions | None = None) -> Iterator[str]:
    """``app`` served by uvicorn in a thread on 127.0.0.1 (a free port) until the block ends;
    yields its base URL once /health answers. With ``options``, uvicorn is configured as
    ``aiayn serve`` configures it (:func:`aiayn.serving.connections.server_config`: header
    timeout, connection cap, keep-alive)."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if options is None:
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    else:
        config = server_config(app, options, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)


def lm_and_tokenizer(checkpoints: dict[str, Path]) -> tuple[Any, Any]:
    """The LM checkpoint's model and tokenizer, as the library loads them."""
    c = load_checkpoint(checkpoints["lm"], expect=GPT2)
    return c.model, load_lm_tokenizer(c.tokenizer_path)


def generated(checkpoints: dict[str, Path], prompts: list[str], **options: Any) -> list[str]:
    """What the library generates for ``prompts`` with the LM checkpoint."""
    model, tokenizer = lm_and_tokenizer(checkpoints)
    return generate(model, tokenizer, prompts, GenerateOptions(**options))
