"""The HTTP model adapter: streaming chat completions from DeepSeek or any OpenAI-compatible server.

:class:`OpenAICompatible` owns the attempts and the driver owns the log (docs/models.md, Errors
and retries): for each HTTP request it first awaits ``on_attempt(n, error, delay)``, then runs one
:class:`~andon.llm._attempt.Attempt`, and on a failure asks the :class:`RetryPolicy` (or the
caller's ``decide_retry``, which replaces it) for a delay — but only while nothing of the attempt
has reached the caller, so a retry never repeats visible output. Backoff sleeps are abort-aware; an
abort during an attempt closes the response at once.

The API key is read from the environment when the adapter is built and lives in a :class:`_Secret`
whose repr hides it. It is only ever written into the ``Authorization`` header; server messages
that quote it are scrubbed before they become errors.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Final, final
from urllib.parse import urlsplit

import httpx

from andon.base import AbortSignal, Clock, ConfigError, ModelError, SystemClock
from andon.llm._attempt import Attempt, Timeouts
from andon.llm._failures import Context
from andon.llm._request import DEEPSEEK, build_request_body
from andon.llm._retry import RandomSource, RetryPolicy, abortable_sleep, retry_delay
from andon.llm._types import Chunk, Finish, ModelIdentity, ModelRequest, OnAttempt, RetryDecider

__all__ = ["OpenAICompatible"]

_log = logging.getLogger("andon.llm")

USER_AGENT: Final = "andon"


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default verifying TLS context, built once: loading the CA bundle takes tens of
    milliseconds, and a context is safe to share between clients."""
    return httpx.create_ssl_context()


class _Secret:
    """An API key that does not show itself: repr and str name only where it came from."""

    __slots__ = ("_source", "_value")

    def __init__(self, value: str | None, source: str | None) -> None:
        self._value = value
        self._source = source

    def reveal(self) -> str | None:
        return self._value

    def __repr__(self) -> str:
        state = "set" if self._value else "unset"
        return f"<secret ${self._source} {state}>" if self._source else "<no secret>"

    __str__ = __repr__


def _read_key(variable: str | None, *, required: bool, what: str) -> _Secret:
    if variable is None:
        return _Secret(None, None)
    value = os.environ.get(variable, "").strip()
    if not value:
        if required:
            raise ConfigError(
                f"${variable} is not set: export {variable}=<your API key> to use {what}"
            )
        return _Secret(None, variable)
    try:
        value.encode("ascii")
    except UnicodeEncodeError:
        raise ConfigError(
            f"${variable} holds characters that cannot be sent in an HTTP header; "
            "check that it holds only the API key"
        ) from None
    return _Secret(value, variable)


@final
class OpenAICompatible:
    """A :class:`~andon.llm.Model` over ``POST {base_url}/chat/completions`` with SSE streaming.

    ``api_key_env`` names the environment variable holding the key (read now; ``None`` sends no
    key); a missing key raises :class:`~andon.base.ConfigError` naming the variable unless
    ``api_key_required`` is false. ``provider="deepseek"`` (at any base URL: the API, a proxy, a
    self-hosted V4) sends ``thinking`` explicitly (``None`` means on, the API's default) and, with
    thinking on, passes reasoning back as DeepSeek requires; other providers never get reasoning
    back. Timeouts are seconds or ``None``: ``connect`` (transport level),
    ``first_content`` (from sending the request to the first data event), ``idle`` (between data
    events; keep-alive comments do not count) and ``total`` (per attempt); the last three run on
    ``clock``. Failures are retried per ``retry_policy`` (default: ``RetryPolicy(max_retries)``)
    with jitter from ``rng``, unless a call of :meth:`stream` brings its own ``decide_retry``.
    Pass ``client`` to share an ``httpx.AsyncClient`` (it is then not closed here); otherwise the
    adapter makes its own, which :meth:`aclose` (or ``async with``) closes. ``spec`` is the user's
    model spec, recorded in :attr:`info`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None,
        api_key_required: bool = True,
        provider: str = "openai-compatible",
        thinking: bool | None = None,
        connect_timeout: float | None = 10.0,
        first_content_timeout: float | None = 300.0,
        idle_timeout: float | None = 120.0,
        total_timeout: float | None = None,
        max_retries: int = 3,
        retry_policy: RetryPolicy | None = None,
        clock: Clock | None = None,
        rng: RandomSource | None = None,
        client: httpx.AsyncClient | None = None,
        spec: str | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"the model base URL must be an http:// or https:// URL, got {base_url!r}"
            )
        if not model or not model.strip():
            raise ConfigError("the model name must not be empty")
        if thinking is not None and provider != DEEPSEEK:
            raise ConfigError(
                f"thinking on/off applies to DeepSeek models only, not to provider {provider!r}"
            )
        try:
            self._timeouts = Timeouts(
                connect=connect_timeout,
                first_content=first_content_timeout,
                idle=idle_timeout,
                total=total_timeout,
            )
            self._policy = retry_policy or RetryPolicy(max_retries=max_retries)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self._base_url = base_url.rstrip("/")
        self._url = f"{self._base_url}/chat/completions"
        # Shown in reprs and errors: without any user:password@ a URL may carry.
        self._shown_url = self._base_url
        if parts.username is not None or parts.password is not None:
            netloc = parts.netloc.rpartition("@")[2]
            self._shown_url = parts._replace(netloc=netloc).geturl().rstrip("/")
        self._model = model
        self._provider = provider
        self._thinking = thinking
        self._info = ModelIdentity(
            spec=spec or f"{self._shown_url}#{model}", provider=provider, name=model
        )
        self._secret = _read_key(api_key_env, required=api_key_required, what=self._info.spec)
        self._key_env = api_key_env
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rng = rng
        self._external = client
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._httpx_timeout = httpx.Timeout(
            connect=connect_timeout, read=None, write=None, pool=None
        )

    # --- identity -------------------------------------------------------------------------------

    @property
    def info(self) -> ModelIdentity:
        """The spec, provider and model name (never anything about the key)."""
        return self._info

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def api_key_env(self) -> str | None:
        """The environment variable the key was read from (tools must not inherit it)."""
        return self._key_env

    @property
    def thinking(self) -> bool | None:
        return self._thinking

    def __repr__(self) -> str:
        key = f" key=${self._key_env}" if self._key_env else ""
        return f"<OpenAICompatible {self._provider} {self._model!r} at {self._shown_url}{key}>"

    # --- the client -----------------------------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._external is not None:
            return self._external
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            # Pooled connections belong to the loop that opened them: a new loop (a new
            # asyncio.run) gets a new client.
            self._client = httpx.AsyncClient(
                verify=_tls(),
                timeout=self._httpx_timeout,
                limits=httpx.Limits(max_connections=16, max_keepalive_connections=4),
            )
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the adapter's own HTTP client (a client passed in is left open)."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> OpenAICompatible:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _headers(self) -> dict[str, str]:
        headers = {
            "Accept": "text/event-stream",
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        }
        key = self._secret.reveal()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _context(self) -> Context:
        key = self._secret.reveal()
        return Context(
            url=self._shown_url,
            model=self._model,
            key_env=self._key_env,
            key_sent=key is not None,
            secret=key,
            provider=self._provider,
        )

    # --- the stream -----------------------------------------------------------------------------

    def request_body(self, request: ModelRequest) -> dict[str, object]:
        """The JSON body this adapter sends for ``request`` (for tests and debugging)."""
        return build_request_body(
            request, model=self._model, provider=self._provider, thinking=self._thinking
        )

    async def stream(
        self,
        request: ModelRequest,
        signal: AbortSignal,
        on_attempt: OnAttempt,
        *,
        decide_retry: RetryDecider | None = None,
    ) -> AsyncIterator[Chunk]:
        """Stream the reply to ``request``; see the :class:`~andon.llm.Model` protocol.

        ``decide_retry`` (:data:`~andon.llm.RetryDecider`) replaces the retry policy, budget
        included, for this request; it is never asked once data of the attempt has streamed.
        """
        body = json.dumps(self.request_body(request), ensure_ascii=False, allow_nan=False)
        content = body.encode("utf-8")
        context = self._context()
        attempt = 1
        cause: ModelError | None = None
        delay: float | None = None
        while True:
            signal.throw_if_aborted()
            await on_attempt(attempt, cause, delay)
            signal.throw_if_aborted()
            client = self._http()
            http_request = client.build_request(
                "POST",
                self._url,
                content=content,
                headers=self._headers(),
                timeout=self._httpx_timeout,
            )
            _log.debug(
                "model request attempt %d: POST %s/chat/completions (%s)",
                attempt,
                self._shown_url,
                self._model,
            )
            current = Attempt(
                client,
                http_request,
                signal=signal,
                clock=self._clock,
                timeouts=self._timeouts,
                context=context,
            )
            try:
                while True:
                    chunk = await current.next()
                    yield chunk
                    if isinstance(chunk, Finish):
                        return
            except ModelError as exc:
                error = exc
            finally:
                await current.close(drain=current.finished)
            # Once a chunk reached the caller, a retry would repeat it: the failure is final, and
            # not even a decider is asked.
            next_delay = None
            if not current.delivered:
                next_delay = await retry_delay(
                    error,
                    attempt,
                    policy=self._policy,
                    rng=self._rng,
                    decide_retry=decide_retry,
                )
            if next_delay is None:
                _log.debug("model request attempt %d failed for good: %s", attempt, error.code)
                raise error
            _log.debug(
                "model request attempt %d failed (%s); retrying in %.3f s",
                attempt,
                error.code,
                next_delay,
            )
            await abortable_sleep(self._clock, next_delay, signal)
            cause, delay = error, next_delay
            attempt += 1
