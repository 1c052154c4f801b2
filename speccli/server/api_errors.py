"""How a request ends without a completion: OpenAI's error shape (`APIError`, whose response is
`{"error": {"message", "type", "param", "code"}}`, never a traceback), including the shutting-down 503
and a failed generation's; and a client that left (`ClientGone`)."""
from __future__ import annotations

from starlette.responses import JSONResponse

from speccli.server.worker import SHUTTING_DOWN, GenerationError, LostGeneration, StoppedGeneration

SHUTTING_DOWN_CODE = "server_shutting_down"
UNAVAILABLE_CODE = "backend_unavailable"


class APIError(Exception):
    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code, self.headers = status, message, kind, param, code, headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class ClientGone(Exception):
    """The client closed the connection while its request waited or ran."""


def shutting_down_error() -> APIError:
    return APIError(503, SHUTTING_DOWN, kind="server_error", code=SHUTTING_DOWN_CODE)


def api_error_for(error: GenerationError) -> APIError:
    """A failed generation as the client hears it, whole or as a stream's last event."""
    if isinstance(error, StoppedGeneration):
        return shutting_down_error()
    if isinstance(error, LostGeneration):
        return unavailable_error(str(error))
    return APIError(error.status, str(error), kind="server_error")


def unavailable_error(reason: str) -> APIError:
    """The models cannot run any more (an RPC server went away): every generation gets this."""
    return APIError(503, f"{reason}; restart the server once it is back", kind="server_error", code=UNAVAILABLE_CODE)
