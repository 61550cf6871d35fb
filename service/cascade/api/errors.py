"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cascade.api.openai_protocol import LoneSurrogateError
from cascade.engine.manager import EngineNotReadyError
from cascade.engine.types import EngineFailedError, EngineRequestError

logger = logging.getLogger("cascade.api")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",  # OpenAI's type for an unknown model or route
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}
# The code of an error raised without one: every error names a code clients can branch on.
_DEFAULT_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limit_exceeded",
    431: "headers_too_large",
    500: "internal_error",
    503: "service_unavailable",
    504: "timeout",
}
MAX_MESSAGE_CHARS = 500
MAX_PARAM_CHARS = 200
"""A ``param`` may echo a client's key: cut like a message."""
_CUT_MARK = "… (truncated)"
_UNPARSED_BODY = "There was an error parsing the body"
"""FastAPI's 400 for a body its JSON reading failed on other than as a syntax error (bytes that are not
UTF-8, nesting past the parser's depth): the same ``invalid_json`` as a syntax error."""


class APIError(Exception):
    """An error the client caused (4xx) or must retry (503), carried to the OpenAI error shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def _cut(text: str, limit: int) -> str:
    """At most ``limit`` characters, the mark of a cut included, encodable as UTF-8."""
    if len(text) > limit:
        text = text[:limit - len(_CUT_MARK)] + _CUT_MARK
    return text.encode("utf-8", "replace").decode("utf-8")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The JSON body OpenAI clients parse into typed exceptions. Messages may echo input: they are
    cut to ``MAX_MESSAGE_CHARS`` and made encodable (a lone surrogate must not fail the reply)."""
    message = _cut(message, MAX_MESSAGE_CHARS)
    if param is not None:
        param = _cut(param, MAX_PARAM_CHARS)
    if code is None:
        code = "invalid_parameter" if status == 400 and param else _DEFAULT_CODES.get(status, "error")
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    """Render an ``APIError``."""
    return JSONResponse(error_body(error.status, error.message, error.param, error.code),
                        status_code=error.status, headers=error.headers)


_TYPE_NAMES = frozenset(("str", "int", "float", "bool", "none"))


def _union_member(part: object) -> bool:
    """A union member's tag in a validation location (``str``, ``list[int]``, ``TextPart``): not a
    path the client wrote, so ``prompt.str`` is named ``prompt`` (field names are lower case)."""
    return isinstance(part, str) and (part in _TYPE_NAMES or "[" in part or part[:1].isupper())


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    """Message, param and code: ``invalid_json`` for a body that is not JSON (as the codec routes say),
    else ``invalid_value``."""
    errors = exc.errors()
    if not errors:
        return "Invalid request", None, "invalid_value"
    def path(error: Any) -> list[str]:
        return [str(part) for part in error.get("loc", ()) if part != "body" and not _union_member(part)]

    # Of a union's alternatives, the one that got furthest names the field the client got wrong.
    lead = path(errors[0])
    first = max((e for e in errors if path(e)[:len(lead)] == lead), key=lambda e: len(path(e))) if lead \
        else errors[0]
    loc = path(first)
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, LoneSurrogateError):
        loc.extend(str(part) for part in cause.path)
    param = ".".join(loc) or None
    if first.get("type") == "missing" and not loc:
        return "The request body is empty (or null): send a JSON object", None, "invalid_value"
    if first.get("type") == "json_invalid":
        return "Request body is not valid JSON: " + str(first.get("msg", "")), None, "invalid_json"
    msg = str(first.get("msg", "invalid value"))
    return (f"Invalid value for '{param}': {msg}" if param else msg), param, "invalid_value"


def is_engine_failure(exc: BaseException) -> bool:
    """Only a dead engine may tell clients the service is restarting (the adapter raises
    ``EngineFailedError`` for that and nothing else)."""
    return isinstance(exc, EngineFailedError)


def as_api_error(exc: BaseException) -> APIError | None:
    """The client-facing error for an exception the routes let through, when it has one."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, EngineRequestError):
        return APIError(400, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, EngineNotReadyError):
        return APIError(503, str(exc), code="engine_unavailable", headers={"Retry-After": "5"})
    return None


def install_error_handlers(app: FastAPI) -> None:
    """Every failure path answers in OpenAI's shape; unexpected errors are 500 without internals.

    The engine's request errors get their own handler: the catch-all ``Exception`` handler runs in
    Starlette's outermost middleware, which re-raises after answering, and the server then closes
    the keep-alive connection under the client."""

    @app.exception_handler(APIError)
    @app.exception_handler(EngineRequestError)
    @app.exception_handler(EngineNotReadyError)
    async def _api_error(_: Request, exc: Exception) -> JSONResponse:
        error = as_api_error(exc)
        assert error is not None
        return error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = _validation_message(exc)
        content_type = request.headers.get("content-type", "")
        if param is None and "json" not in content_type.lower():
            # e.g. curl -d, which sends a form: the body was never read as JSON
            message = (f"The request body must be JSON sent with content-type: application/json (got "
                       f"{content_type or 'no content-type'}): {message}")
        return error_response(APIError(400, message, param=param, code=code))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == _UNPARSED_BODY:
            return error_response(APIError(400, "Request body is not valid JSON (not UTF-8, or nested too deeply)",
                                           code="invalid_json"))
        message = "Unknown route" if exc.status_code == 404 else str(exc.detail)
        return error_response(APIError(exc.status_code, message, headers=getattr(exc, "headers", None)))


def unexpected_error(exc: Exception, engine_dead: bool) -> APIError:
    """What an exception no handler took becomes; the gateway middleware answers it, so it gets the
    request id, is counted under its real status and leaves a keep-alive connection open (Starlette's
    catch-all ``Exception`` handler runs outside every middleware and closes the connection)."""
    if is_engine_failure(exc) or engine_dead:
        return APIError(503, "The engine failed while serving this request; the service is restarting",
                        code="engine_unavailable", headers={"Retry-After": "10"})
    return APIError(500, "Internal server error", code="internal_error")
