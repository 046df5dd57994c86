"""Model API failures as typed :class:`~andon.base.ModelError` values, with messages that say
what to do.

Three sources (docs/models.md, Errors and retries): an HTTP error status (with the server's JSON
error body and ``Retry-After``), an ``{"error": {...}}`` payload inside the stream, and a transport
failure raised by httpx. Every message that quotes the server goes through :func:`scrub` first, so
an API key echoed back by a server ("Incorrect API key provided: sk-...") never reaches an error
(nor does a lone surrogate, which the session log could not write).

One HTTP 400 gets its own advice: DeepSeek's "The `reasoning_content` in the thinking mode must be
passed back to the API". andon sends that reasoning itself (``_request``), so the 400 means a bug
in andon, a proxy that strips the field, or a DeepSeek endpoint the spec does not name as one; it
is a ``BAD_REQUEST`` like any 400 (retrying cannot help) but says which.

A request longer than the model's context window is ``CONTEXT_OVERFLOW`` instead of
``BAD_REQUEST``, in every provider's shape (``andon.llm._overflow``), with the window and the
request's tokens when the server named them; never retried (the same request overflows again).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import httpx

from andon.base import ErrorCode, ModelError, clean_text
from andon.llm._overflow import detect_overflow
from andon.llm._request import DEEPSEEK
from andon.llm._retry import code_for_status
from andon.llm._wire import valid_text

__all__ = ["Context", "payload_error", "scrub", "status_error", "transport_error"]

MAX_QUOTE: Final = 500
"""Longest piece of server text quoted in a message."""

# Error ``code`` / ``type`` strings of OpenAI, DeepSeek, vLLM and friends, by prefix.
_NAMED_CODES: Final[tuple[tuple[str, ErrorCode], ...]] = (
    ("rate_limit", ErrorCode.RATE_LIMITED),
    ("insufficient_quota", ErrorCode.INSUFFICIENT_BALANCE),
    ("insufficient_balance", ErrorCode.INSUFFICIENT_BALANCE),
    ("insufficient_system_resource", ErrorCode.OVERLOADED),
    ("overloaded", ErrorCode.OVERLOADED),
    ("service_unavailable", ErrorCode.OVERLOADED),
    ("invalid_api_key", ErrorCode.AUTH),
    ("authentication", ErrorCode.AUTH),
    ("permission", ErrorCode.AUTH),
    ("invalid_request", ErrorCode.BAD_REQUEST),
    ("context_length", ErrorCode.CONTEXT_OVERFLOW),
    ("exceed_context_size", ErrorCode.CONTEXT_OVERFLOW),
    ("content_filter", ErrorCode.CONTENT_FILTER),
    ("server_error", ErrorCode.SERVER),
    ("internal", ErrorCode.SERVER),
)


@dataclass(frozen=True, slots=True)
class Context:
    """What an error message may name: the endpoint, the model, the key's variable and the
    provider the spec named."""

    url: str
    model: str
    key_env: str | None
    key_sent: bool
    secret: str | None  # only ever used to remove the key from quoted server text
    provider: str = "openai-compatible"

    def key_advice(self) -> str:
        if self.key_env is None:
            return "this model is configured to send no API key"
        if self.key_sent:
            return f"check the API key in ${self.key_env}"
        return f"no API key was sent: set ${self.key_env}"


def scrub(text: str, secret: str | None) -> str:
    """``text`` without the API key (and cut to a readable length, and valid to log)."""
    text = valid_text(text)
    if secret:
        text = text.replace(secret, "***")
    text = " ".join(text.split())
    if len(text) > MAX_QUOTE:
        text = text[: MAX_QUOTE - 3] + "..."
    return text


def _server_error(body: bytes, secret: str | None) -> tuple[Mapping[str, Any] | None, str, str]:
    """The error object of an error body (``error``, or the body itself when it is one, as old
    vLLM answers), the server's whole message (for reading figures) and the human part, scrubbed:
    ``error.message``, ``message``, ``detail`` or the text."""
    text = clean_text(body)
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, Mapping):
        error = parsed.get("error")
        candidates = [
            error.get("message") if isinstance(error, Mapping) else error,
            parsed.get("message"),
            parsed.get("detail"),
        ]
        obj = error if isinstance(error, Mapping) else parsed
        for candidate in candidates:
            if isinstance(candidate, str) and candidate.strip():
                return obj, valid_text(candidate), scrub(candidate, secret)
        return obj, text, scrub(text, secret) or "(no error message)"
    return None, text, scrub(text, secret) or "(no error message)"


_OVERFLOW_STATUSES: Final = frozenset({400, 413, 422, 500})
"""Statuses a context overflow arrives with (400 nearly always; 413 and 422 from proxies and
validators; 500 from a server that lets the exception through). Never a 401/403/429/503: those
mean something else whatever their text says."""


def _overflow_message(head: str, said: str, limit: int | None, requested: int | None) -> str:
    figures = ""
    if limit is not None and requested is not None:
        figures = f" of {limit} tokens (the server counted {requested} input tokens)"
    elif limit is not None:
        figures = f" of {limit} tokens"
    return (
        f"the request is longer than the model's context window{figures} ({head}: {said}); "
        "a shorter history is needed"
    )


def status_error(
    status: int, body: bytes, retry_after: float | None, context: Context
) -> ModelError:
    """The error for an HTTP error response (the table of docs/models.md, Errors and retries), with
    an actionable message."""
    code = code_for_status(status)
    error, whole, said = _server_error(body, context.secret)
    head = f"HTTP {status} from {context.url}"
    overflow = detect_overflow(error, whole) if status in _OVERFLOW_STATUSES else None
    if overflow is not None:
        limit, requested = overflow
        return ModelError(
            ErrorCode.CONTEXT_OVERFLOW,
            _overflow_message(head, said, limit, requested),
            status=status,
            retry_after=retry_after,
            limit=limit,
            requested=requested,
        )
    match code:
        case ErrorCode.AUTH:
            message = (
                f"the model API refused the credentials ({head}: {said}); {context.key_advice()}"
            )
        case ErrorCode.INSUFFICIENT_BALANCE:
            account = f" of the key in ${context.key_env}" if context.key_env else ""
            message = (
                f"the model API account{account} has insufficient balance ({head}: {said}); "
                "top up the account with the provider, then run again"
            )
        case ErrorCode.RATE_LIMITED:
            message = f"the model API is rate limiting requests ({head}: {said})"
        case ErrorCode.OVERLOADED:
            message = f"the model API is overloaded ({head}: {said}); try again later"
        case ErrorCode.SERVER:
            message = f"the model API failed ({head}: {said}); this is usually temporary"
        case _:
            hint = ""
            if status == 404:
                hint = f"; check the model name {context.model!r} and the base URL"
            elif 300 <= status < 400:
                hint = "; the base URL redirects: use the final URL"
            elif status == 400 and "reasoning_content" in said.lower():
                hint = _reasoning_advice(context.provider)
            message = f"the model API rejected the request ({head}: {said}){hint}"
    return ModelError(code, message, status=status, retry_after=retry_after)


def _reasoning_advice(provider: str) -> str:
    """What to do about DeepSeek's 400 for reasoning that was not passed back."""
    if provider == DEEPSEEK:
        return (
            "; DeepSeek's thinking mode needs the reasoning of every span that used tools "
            "passed back (reasoning_content on each of its assistant messages, in every later "
            "request): this is a bug in andon, or in a proxy between andon and the API that "
            "strips that field; --thinking off (thinking=False) avoids it"
        )
    return (
        "; this looks like DeepSeek's thinking mode, which needs the reasoning of every span "
        "that used tools passed back, but andon passes reasoning back only to a DeepSeek "
        "provider: name it in the spec (deepseek+URL#MODEL, e.g. "
        "deepseek+http://127.0.0.1:30000/v1#deepseek-v4-flash), or turn thinking off on the "
        "server"
    )


def payload_error(error: object, secret: str | None) -> ModelError:
    """The error for an ``{"error": ...}`` payload in the stream: its mapped code, else SERVER."""
    code = ErrorCode.SERVER
    said = "(no error message)"
    whole = ""
    obj: Mapping[str, Any] | None = None
    if isinstance(error, Mapping):
        obj = error
        message = error.get("message")
        if isinstance(message, str) and message.strip():
            said, whole = scrub(message, secret), valid_text(message)
        code = _code_of(error)
    elif isinstance(error, str) and error.strip():
        said, whole = scrub(error, secret), valid_text(error)
    overflow = detect_overflow(obj, whole)
    if overflow is not None:
        limit, requested = overflow
        return ModelError(
            ErrorCode.CONTEXT_OVERFLOW,
            _overflow_message("in the stream", said, limit, requested),
            limit=limit,
            requested=requested,
        )
    return ModelError(code, f"the model API reported an error mid-stream: {said}")


def _code_of(error: Mapping[str, Any]) -> ErrorCode:
    for field in ("code", "type", "status"):
        value = error.get(field)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            status = int(value)
            if 400 <= status <= 599:
                return code_for_status(status)
        elif isinstance(value, str):
            lowered = value.lower()
            for prefix, code in _NAMED_CODES:
                if lowered.startswith(prefix):
                    return code
    return ErrorCode.SERVER


def transport_error(
    exc: httpx.HTTPError, *, data_started: bool, connect_timeout: float | None, context: Context
) -> ModelError:
    """The error for a failure httpx raised: connect problems, resets, broken streams."""
    what = scrub(str(exc), context.secret) or type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        limit = f" within {connect_timeout:g} s" if connect_timeout is not None else ""
        return ModelError(
            ErrorCode.TIMEOUT,
            f"could not connect to the model API at {context.url}{limit} (connect timeout)",
        )
    if isinstance(exc, httpx.ConnectError):
        return ModelError(
            ErrorCode.CONNECTION,
            f"cannot connect to the model API at {context.url}: {what}; "
            "check the base URL and that the server is running",
        )
    if isinstance(exc, httpx.TimeoutException):
        return ModelError(ErrorCode.TIMEOUT, f"the model API timed out: {what}")
    if isinstance(exc, httpx.DecodingError):
        return ModelError(
            ErrorCode.MALFORMED_STREAM, f"the model API sent a body that cannot be decoded: {what}"
        )
    if data_started:
        return ModelError(
            ErrorCode.STREAM_TRUNCATED,
            f"the connection to the model API broke mid-stream ({what}); the reply is incomplete",
        )
    return ModelError(
        ErrorCode.CONNECTION,
        f"the connection to the model API at {context.url} failed before any data ({what})",
    )
