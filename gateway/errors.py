"""Errors as values, and the one place where they become HTTP.

Handlers return an ``ApiError`` (or raise one of surogate's errors, which ``from_exception``
turns into one); ``render`` writes it in the envelope of the API the client called, with that
API's status codes (serving-protocols.md §2.5):

- OpenAI routes: ``{"error": {"message", "type", "param", "code"}}``, ``code`` a string or null;
  503 when overloaded or loading.
- Anthropic routes: ``{"type": "error", "error": {"type", "message"}, "request_id"}``; 529
  ``overloaded_error`` when overloaded or loading.

Nothing here shows a traceback to a client: unexpected exceptions become a 500 that names the
request id, and the traceback goes to the log.
"""

from __future__ import annotations

import enum
import re
from typing import Literal

import msgspec

from surogate.errors import NotFoundError, SurogateError
from surogate.serve.frontend import RequestError

Api = Literal["openai", "anthropic"]


class Kind(enum.Enum):
    invalid_request = "invalid_request"
    authentication = "authentication"
    permission = "permission"
    not_found = "not_found"
    method_not_allowed = "method_not_allowed"
    too_large = "too_large"
    rate_limit = "rate_limit"
    overloaded = "overloaded"
    internal = "internal"


class ApiError(msgspec.Struct, frozen=True):
    kind: Kind
    message: str
    param: str | None = None
    code: str | None = None  # OpenAI's machine-readable code; defaults per kind
    retry_after: int | None = None  # seconds, for 429 / 503 / 529


# kind -> (status, OpenAI type, OpenAI default code)
_OPENAI = {
    Kind.invalid_request: (400, "invalid_request_error", None),
    Kind.authentication: (401, "invalid_request_error", "invalid_api_key"),
    Kind.permission: (403, "invalid_request_error", "permission_denied"),
    Kind.not_found: (404, "invalid_request_error", "not_found"),
    Kind.method_not_allowed: (405, "invalid_request_error", "method_not_allowed"),
    Kind.too_large: (413, "invalid_request_error", "request_too_large"),
    Kind.rate_limit: (429, "rate_limit_error", "rate_limit_exceeded"),
    Kind.overloaded: (503, "server_error", "overloaded"),
    Kind.internal: (500, "server_error", None),
}
# kind -> (status, Anthropic type)
_ANTHROPIC = {
    Kind.invalid_request: (400, "invalid_request_error"),
    Kind.authentication: (401, "authentication_error"),
    Kind.permission: (403, "permission_error"),
    Kind.not_found: (404, "not_found_error"),
    Kind.method_not_allowed: (405, "invalid_request_error"),
    Kind.too_large: (413, "request_too_large"),
    Kind.rate_limit: (429, "rate_limit_error"),
    Kind.overloaded: (529, "overloaded_error"),
    Kind.internal: (500, "api_error"),
}


# -- the two envelopes (also used in the OpenAPI document) --

class OpenAIErrorInfo(msgspec.Struct):
    """https://platform.openai.com/docs/guides/error-codes"""

    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorResponse(msgspec.Struct):
    error: OpenAIErrorInfo


class AnthropicErrorInfo(msgspec.Struct):
    """https://docs.claude.com/en/api/errors"""

    type: str
    message: str


class AnthropicErrorResponse(msgspec.Struct, tag_field="type", tag="error"):
    error: AnthropicErrorInfo
    request_id: str | None = None


_encoder = msgspec.json.Encoder()


def status_of(err: ApiError, api: Api) -> int:
    return (_OPENAI if api == "openai" else _ANTHROPIC)[err.kind][0]


def error_body(err: ApiError, api: Api, request_id: str | None = None):
    if api == "openai":
        _, etype, code = _OPENAI[err.kind]
        return OpenAIErrorResponse(OpenAIErrorInfo(err.message, etype, err.param, err.code or code))
    _, etype = _ANTHROPIC[err.kind]
    message = f"{err.param}: {err.message}" if err.param and err.param not in err.message else err.message
    return AnthropicErrorResponse(AnthropicErrorInfo(etype, message), request_id=request_id)


def render(err: ApiError, api: Api, request_id: str | None = None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers and JSON body for an error on a route of ``api``."""
    headers = [(b"content-type", b"application/json")]
    if err.retry_after is not None:
        headers.append((b"retry-after", str(err.retry_after).encode()))
    if err.kind in (Kind.invalid_request, Kind.authentication, Kind.not_found, Kind.too_large):
        headers.append((b"x-should-retry", b"false"))  # the SDKs would otherwise retry some of these
    return status_of(err, api), headers, _encoder.encode(error_body(err, api, request_id))


# -- constructors for the common cases --

def invalid(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(Kind.invalid_request, message, param=param, code=code)


def unknown_model(name: str) -> ApiError:
    return ApiError(Kind.not_found, f"The model `{name}` does not exist or you do not have access to it.",
                    param="model", code="model_not_found")


def model_loading(name: str) -> ApiError:
    return ApiError(Kind.overloaded, f"The model `{name}` is loading; retry shortly.", retry_after=5)


def model_asleep(name: str) -> ApiError:
    return ApiError(Kind.overloaded, f"The model `{name}` is asleep; wake it with `POST /wake_up?model={name}`.",
                    code="model_asleep", retry_after=5)


def shutting_down() -> ApiError:
    return ApiError(Kind.overloaded, "The server is shutting down; retry on another replica or after its restart.",
                    code="shutting_down", retry_after=5)


def queue_full(name: str, limit: int) -> ApiError:
    return ApiError(Kind.rate_limit, f"Too many requests are waiting for the model `{name}` ({limit}); retry shortly.",
                    retry_after=1)


def unsupported(param: str, what: str) -> ApiError:
    return ApiError(Kind.invalid_request, f"{what} is not supported by this server.", param=param,
                    code="unsupported_parameter")


_PATH = re.compile(r" - at `\$(.*)`$")
_MISSING = re.compile(r"Object missing required field `([^`]*)`")


def from_decode_error(e: msgspec.DecodeError) -> ApiError:
    """A body msgspec refused: the message names the field as a JSON path; ``param`` carries it
    without the leading ``$.``."""
    text = str(e)
    at = _PATH.search(text)
    path = at.group(1).lstrip(".") if at else ""
    missing = _MISSING.match(text)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    if isinstance(e, msgspec.ValidationError):
        body = _PATH.sub("", text)
        return invalid(f"{body} (at `{path}`)" if path else body, param=path or None)
    return invalid(f"The request body is not valid JSON: {text}")


def from_exception(e: BaseException) -> ApiError:
    if isinstance(e, ApiErrorException):
        return e.error
    if isinstance(e, RequestError):
        message = f"{e.message} ({e.hint})" if e.hint else e.message
        return invalid(message, param=e.param, code=e.code)
    if isinstance(e, msgspec.DecodeError):
        return from_decode_error(e)
    if isinstance(e, NotFoundError):
        return ApiError(Kind.not_found, e.message)
    if isinstance(e, SurogateError) and isinstance(e, ValueError):
        return invalid(e.message)
    return ApiError(Kind.internal, "The server had an error while processing your request.")


class ApiErrorException(Exception):
    """For the few places deep in a generator where returning a value is not possible."""

    def __init__(self, error: ApiError):
        super().__init__(error.message)
        self.error = error
