"""How ``aiayn serve`` bounds its connections, below the app: uvicorn's configuration
(:func:`server_config`) with an HTTP protocol that adds what uvicorn lacks.

- **A header-read timeout** (``header_timeout_s``): a connection must send a request's complete
  headers within that many seconds of opening, or of the end of its previous answer, or it is
  closed. uvicorn has no such timeout: its keep-alive timer (``timeout_keep_alive``,
  ``keep_alive_s`` here) runs only between requests and stops at the first byte received, so
  a client sending its headers a byte a second held its connection forever.
- **A connection cap** (``max_connections``): a connection beyond it is answered 503 (with
  ``Connection: close``) and closed at once, before its request is read. uvicorn's
  ``limit_concurrency`` answers 503 only once a request's headers are complete, so it does not
  bound connections that never complete them, and at the cap it refuses the requests of the
  connections already open too.
- **Header size**: httptools' parser refuses headers over 80 KiB (llhttp's bound), h11's over
  :data:`MAX_HEADER_BYTES` (uvicorn's ``h11_max_incomplete_event_size``).

``Connection: close`` after an answer sent before its request's body was read (a 413, a 401) is
the app's (:class:`aiayn.serving.app.Guard`): uvicorn closes a connection whose answer says so,
instead of reading and discarding the rest of the body.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiayn.serving.options import ServeOptions

MAX_HEADER_BYTES = 16 * 1024
"""The most bytes of a request's headers with h11 (uvicorn's default, as httptools' own 80 KiB
bound on the other parser: an API request's headers are a few hundred bytes)."""

_BUSY = json.dumps(
    {
        "error": {
            "message": "too many connections: retry later (--max-connections)",
            "type": "server_error",
            "param": None,
        }
    }
).encode()
BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)
"""What a connection beyond the cap receives before it is closed."""


def protocol_class(options: ServeOptions) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools' where installed, else h11's) with ``options``'
    header-read timeout and connection cap."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # httptools not installed: uvicorn's pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    timeout, cap = options.header_timeout_s, options.max_connections

    class Bounded(Base):
        """uvicorn's protocol, its connections capped and their headers timed."""

        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            """Take the connection, or answer 503 and close it when ``cap`` are open."""
            super().connection_made(transport)
            if len(self.connections) > cap:
                transport.write(BUSY_ANSWER)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            """Parse as uvicorn does; once a request's headers are complete, stop the timer."""
            super().data_received(data)
            if not _reading_headers(self):
                self._disarm()

        def on_response_complete(self) -> None:
            """After an answer, the next request's headers are timed from now."""
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            """Stop the timer with the connection."""
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(timeout, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            """The headers did not come in time: close the connection (a request already
            being answered is left alone)."""
            self._deadline = None
            if _reading_headers(self) and not self.transport.is_closing():
                self.transport.close()

    return Bounded


def _reading_headers(protocol: Any) -> bool:
    """Whether ``protocol`` waits for a request's headers: no request is being answered."""
    cycle = getattr(protocol, "cycle", None)
    return cycle is None or bool(cycle.response_complete)


def server_config(
    app: Any, options: ServeOptions, *, host: str, port: int, log_level: str = "info"
) -> Any:
    """uvicorn's configuration for ``app`` on ``host:port`` with ``options``' connection
    bounds (keep-alive, header timeout, connection cap, header size)."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=protocol_class(options),
        timeout_keep_alive=options.keep_alive_s,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
