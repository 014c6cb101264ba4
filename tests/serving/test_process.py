"""A real ``aiayn serve`` process on a free port, over HTTP: it answers, and SIGTERM lets the
request in flight finish before the process exits 0."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_served_process_answers_and_stops_cleanly_on_sigterm(
    checkpoints: dict[str, Path],
) -> None:
    port = _free_port()
    env = {**os.environ, "AIAYN_API_KEY": "k"}
    argv = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", f"lm={checkpoints['lm']}",
            "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k"}
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert httpx.get(f"{base}/v1/models", timeout=5).status_code == 401  # the env's key
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "the cat", "max_tokens": 3},
                       headers=auth, timeout=30)  # fmt: skip
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        result: dict[str, httpx.Response] = {}

        def slow() -> None:
            body = {"prompt": ["the cat"] * 64, "max_tokens": 30, "n": 8}
            result["r"] = httpx.post(f"{base}/v1/completions", json=body, headers=auth, timeout=60)

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.5)  # in flight
        proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert result["r"].status_code == 200
        assert len(result["r"].json()["choices"]) == 512
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.stdout.read() if proc.stdout else ""
    assert "Traceback" not in out, out
