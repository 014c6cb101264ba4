"""Connections a client cannot hold: raw sockets against a real ``aiayn serve`` server (uvicorn
configured by :func:`aiayn.serving.connections.server_config`) on 127.0.0.1.

- after a 413 for a body past ``max_body_bytes`` (chunked, or by ``Content-Length``) the answer
  says ``Connection: close`` and the server closes the connection, instead of reading and
  discarding the rest of the body;
- a connection that sends its headers a byte at a time is closed after ``header_timeout_s``,
  on a fresh connection and on a kept-alive one after its first answer;
- beyond ``max_connections`` a connection is answered 503 and closed; once one closes, a new
  one is served.

Every loop is bounded and every socket has a timeout, so each test ends by itself."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from serve_helpers import live_server

from aiayn.serving import ServeOptions


@contextmanager
def _served(checkpoints: dict[str, Path], serve_app: Any, **options: Any) -> Iterator[int]:
    """The translation checkpoint served with ``options``; yields the port."""
    app = serve_app(checkpoints, ["mt"], **options).app
    with live_server(app, ServeOptions(**options)) as url:
        time.sleep(0.2)  # the readiness checks' connections are closed by now
        yield int(url.rsplit(":", 1)[1])


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float = 10.0) -> tuple[bytes, bool]:
    """(what the server sent, whether it closed the connection within ``limit_s``)."""
    got, deadline = b"", time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += chunk
    return got, False


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_413_for_a_chunked_body_closes_the_connection(
    checkpoints: dict[str, Path], serve_app: Any
) -> None:
    with _served(checkpoints, serve_app, max_body_bytes=1024) as port, _connect(port) as sock:
        sock.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + _chunk(b'{"texts": ["' + b"a" * 1000)
            + _chunk(b"a" * 1000)
        )
        got, closed = _read_until_closed(sock)
        head = got.split(b"\r\n\r\n", 1)[0].lower()
        assert head.startswith(b"http/1.1 413"), got[:200]
        assert b"connection: close" in head
        assert b"--max-body-bytes" in got
        assert closed, "the connection stayed open after the 413"


def test_413_by_content_length_closes_before_reading_the_body(
    checkpoints: dict[str, Path], serve_app: Any
) -> None:
    with _served(checkpoints, serve_app, max_body_bytes=1024) as port, _connect(port) as sock:
        sock.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n"
        )
        got, closed = _read_until_closed(sock)
        assert got.lower().startswith(b"http/1.1 413") and b"connection: close" in got.lower()
        assert closed
        # a request within the bound on a new connection is answered, and keeps its connection
        with _connect(port) as again:
            body = b'{"texts": ["hello world"]}'
            again.sendall(
                b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            answer = again.recv(65536).lower()
            assert answer.startswith(b"http/1.1 200") and b"connection: close" not in answer


def _dribble(sock: socket.socket, data: bytes, pause: float, limit_s: float) -> float | None:
    """Send ``data`` a byte every ``pause`` seconds (again from its start when it runs out)
    for at most ``limit_s`` seconds; the seconds until the server closed the connection, or
    None if it did not."""
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < limit_s:
        try:
            sock.send(data[i % len(data) : i % len(data) + 1])
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started
        i += 1
        ready, _, _ = select.select([sock], [], [], pause)
        if ready:
            try:
                if not sock.recv(65536):
                    return time.monotonic() - started
            except ConnectionResetError:
                return time.monotonic() - started
    return None


SLOW_HEADERS = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200


def test_headers_sent_a_byte_at_a_time_time_out(
    checkpoints: dict[str, Path], serve_app: Any
) -> None:
    with _served(checkpoints, serve_app, header_timeout_s=1.0) as port:
        with _connect(port) as sock:
            closed_after = _dribble(sock, SLOW_HEADERS, pause=0.1, limit_s=8)
        assert closed_after is not None, "a connection sending its headers slowly stayed open"
        assert 0.8 <= closed_after <= 4
        with _connect(port) as sock:  # kept alive after an answer: timed from its end
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            closed_after = _dribble(sock, SLOW_HEADERS, pause=0.1, limit_s=8)
        assert closed_after is not None and closed_after <= 4
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200


def test_connections_beyond_the_cap_are_refused(
    checkpoints: dict[str, Path], serve_app: Any
) -> None:
    with _served(checkpoints, serve_app, max_connections=3, header_timeout_s=30) as port:
        held = [_connect(port) for _ in range(3)]
        try:
            for sock in held:  # each is served (and kept open)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            with _connect(port) as extra:
                got, closed = _read_until_closed(extra)
            assert got.startswith(b"HTTP/1.1 503") and b"--max-connections" in got
            assert closed
            held.pop().close()
            time.sleep(0.2)  # the server sees it go
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        finally:
            for sock in held:
                sock.close()
