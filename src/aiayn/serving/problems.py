"""What the service answers when a request cannot be served: one exception carrying the HTTP
status, a message naming the field or limit, and the field's path (a Starlette
``HTTPException``, so that it passes through FastAPI's body reading as it is)."""

from __future__ import annotations

from starlette.exceptions import HTTPException


class Problem(HTTPException):
    """A request the service refuses or could not finish.

    Attributes:
        status: the HTTP status (413, 422, 503, 504, …).
        message: one line naming the field, value or limit.
        param: the field's path in the request ("texts.2"), or None.
        headers: extra response headers (``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(status, message, headers or {})
        self.status, self.message, self.param = status, message, param

    @property
    def kind(self) -> str:
        """OpenAI's error ``type``: ``invalid_request_error`` for a client's mistake."""
        return "invalid_request_error" if self.status < 500 else "server_error"
