"""The context window of a model (docs/models.md, Context windows): known for the specs andon
names, asked from the server where it says so for the others.

The table holds only windows the providers document: DeepSeek V4 (both names, and a
``deepseek+URL#deepseek-v4-*`` proxy or self-hosted V4) and the OpenAI models of the GPT-4.1 and
GPT-4o families (platform.openai.com/docs/models, as quoted by the model pages of Vercel's AI
gateway: 1,047,576 for GPT-4.1, mini and nano; 128,000 for GPT-4o and GPT-4o mini). Everything else
— a script, a custom URL, an OpenAI model not in the table — is ``None``: unknown, never a guess.

Discovery asks an OpenAI-compatible server, under one time bound, at three places at once:

* ``GET {root}/props`` — llama.cpp's server: ``default_generation_settings.n_ctx``, the context
  of one slot (what one request may fill; ``--ctx-size`` divided by ``--parallel``);
* ``GET {base}/models`` — vLLM: ``data[i].max_model_len``; other servers' entries may say
  ``context_length``, ``context_window``, ``max_context_length`` or ``n_ctx``;
* ``GET {root}/api/ps`` — Ollama: ``models[i].context_length`` of a loaded model.

``{root}`` is the base URL without its last ``/v1``. An entry for the spec's model wins; otherwise
the smallest window listed (erring low only compacts earlier). Never a training length
(llama.cpp's ``meta.n_ctx_train``): a server is often run with less. Redirects are not followed,
so nothing off the base URL's host is ever asked; a body is read to at most
:data:`MAX_BODY_BYTES`; any failure, any timeout, any answer of another shape is ``None``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from andon.base import ConfigError
from andon.llm._request import DEEPSEEK
from andon.llm._specs import DEEPSEEK_MODELS, _Endpoint, _parse

if TYPE_CHECKING:
    import httpx

__all__ = ["MAX_BODY_BYTES", "discover_context_window", "known_context_window"]

DEEPSEEK_V4_WINDOW: Final = 1_048_576

OPENAI_WINDOWS: Final[Mapping[str, int]] = {
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
}
"""OpenAI model -> its documented context window (see the module docstring)."""

_DATED: Final = re.compile(r"(.+)-\d{4}-\d{2}-\d{2}")
"""A dated snapshot (``gpt-4.1-2025-04-14``) has its family's window."""

MAX_BODY_BYTES: Final = 1 << 20
"""The most of an answer discovery reads (llama.cpp's ``/props`` quotes the chat template)."""

MAX_WINDOW: Final = 1 << 31
"""A window beyond this is not a window."""

_MODEL_FIELDS: Final = ("max_model_len", "context_length", "context_window", "max_context_length")


def known_context_window(spec: str) -> int | None:
    """The documented context window of the model ``spec`` names, or ``None`` if andon does not
    know it (scripts, custom URLs, unlisted models, a spec that is not one)."""
    try:
        parsed = _parse(spec)
    except ConfigError:
        return None
    if not isinstance(parsed, _Endpoint):
        return None  # a script
    if parsed.provider == DEEPSEEK:
        return DEEPSEEK_V4_WINDOW if parsed.model in DEEPSEEK_MODELS else None
    if parsed.provider == "openai":
        name = parsed.model.strip()
        dated = _DATED.fullmatch(name)
        return OPENAI_WINDOWS.get(name) or (OPENAI_WINDOWS.get(dated.group(1)) if dated else None)
    return None


def _window(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 < value < MAX_WINDOW else None


def _from_props(props: object) -> int | None:
    if not isinstance(props, Mapping):
        return None
    settings = props.get("default_generation_settings")
    if isinstance(settings, Mapping):
        found = _window(settings.get("n_ctx"))
        params = settings.get("params")
        if found is None and isinstance(params, Mapping):
            found = _window(params.get("n_ctx"))
        if found is not None:
            return found
    return _window(props.get("n_ctx"))


def _entry_window(entry: Mapping[str, Any]) -> int | None:
    for field in _MODEL_FIELDS:
        found = _window(entry.get(field))
        if found is not None:
            return found
    return _window(entry.get("n_ctx"))


def _from_entries(entries: object, model: str | None, names: Iterable[str]) -> int | None:
    """The window of ``model``'s entry in a list of model entries, else the smallest listed."""
    if not isinstance(entries, list):
        return None
    windows: list[int] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        found = _entry_window(entry)
        if found is None:
            continue
        if model is not None and any(entry.get(name) == model for name in names):
            return found
        windows.append(found)
    return min(windows, default=None)


def _from_models(answer: object, model: str | None) -> int | None:
    if not isinstance(answer, Mapping):
        return None
    return _from_entries(answer.get("data"), model, ("id", "root"))


def _from_ollama(answer: object, model: str | None) -> int | None:
    if not isinstance(answer, Mapping):
        return None
    return _from_entries(answer.get("models"), model, ("name", "model"))


async def _get_json(
    client: httpx.AsyncClient, url: str, headers: Mapping[str, str], timeout: float
) -> object:
    """The JSON ``url`` answers with a 200, or ``None``; never raises (but a cancel)."""
    import httpx  # loaded by discover_context_window already; the name is needed here too

    try:
        request = client.build_request("GET", url, headers=headers, timeout=timeout)
        response = await client.send(request, stream=True, follow_redirects=False)
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):
        return None
    try:
        if response.status_code != 200:
            return None
        body = bytearray()
        async for piece in response.aiter_bytes():
            body += piece
            if len(body) > MAX_BODY_BYTES:
                return None
        return json.loads(bytes(body))
    except (httpx.HTTPError, ValueError, RecursionError):
        return None
    finally:
        with contextlib.suppress(httpx.HTTPError):
            await response.aclose()


def _root(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


async def discover_context_window(
    base_url: str,
    *,
    timeout: float,
    client: httpx.AsyncClient | None = None,
    model: str | None = None,
    api_key: str | None = None,
) -> int | None:
    """The context window the OpenAI-compatible server at ``base_url`` says it has, or ``None``.

    Asks the places of the module docstring at once and waits at most ``timeout`` seconds in all
    (what answered by then counts). ``model`` picks its entry where a server lists several;
    ``api_key`` is sent as a bearer token, as the adapter sends it, only to this host. ``client``
    is used as it is and left open (its redirect setting is overridden: none are followed).
    Never raises for a server that does not answer, answers an error or answers something else.
    """
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or not timeout > 0:
        return None
    base = base_url.rstrip("/")
    root = _root(base)
    headers = {"Accept": "application/json", "User-Agent": "andon"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    # Imported on first discovery, not with the package (andon.llm's docstring).
    import httpx

    own = client is None
    http = client if client is not None else httpx.AsyncClient(follow_redirects=False)
    tasks: dict[str, asyncio.Task[object]] = {}
    try:
        tasks = {
            "props": asyncio.create_task(_get_json(http, f"{root}/props", headers, timeout)),
            "models": asyncio.create_task(_get_json(http, f"{base}/models", headers, timeout)),
            "ollama": asyncio.create_task(_get_json(http, f"{root}/api/ps", headers, timeout)),
        }
        await asyncio.wait(tasks.values(), timeout=timeout)
        answers = {
            name: task.result()
            if task.done() and not task.cancelled() and task.exception() is None
            else None
            for name, task in tasks.items()
        }
    finally:
        for task in tasks.values():
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        if own:
            await http.aclose()
    return (
        _from_props(answers["props"])
        or _from_models(answers["models"], model)
        or _from_ollama(answers["ollama"], model)
    )
