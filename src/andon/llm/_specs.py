"""Model specs (docs/models.md, Choosing a model): the ``--model`` string becomes a model.

* ``deepseek-v4-flash``, ``deepseek-v4-pro``: ``https://api.deepseek.com``, key in
  ``$DEEPSEEK_API_KEY`` (required), thinking on unless turned off, always sent explicitly.
* ``openai:MODEL``: ``https://api.openai.com/v1``, key in ``$OPENAI_API_KEY`` (required).
* ``URL#MODEL`` (e.g. ``http://127.0.0.1:11434/v1#qwen3``): the URL is the base, key in
  ``$ANDON_API_KEY`` if set (local servers need none). A generic OpenAI-compatible endpoint: no
  ``thinking`` switch, no reasoning sent back.
* ``deepseek+URL#MODEL`` (e.g. ``deepseek+http://127.0.0.1:30000/v1#deepseek-v4-flash``): the same,
  but the endpoint speaks DeepSeek's dialect — DeepSeek's API behind a proxy, or a V4 model served
  by SGLang or vLLM — so DeepSeek's ``thinking`` switch and reasoning pass-back apply. The key is
  still ``$ANDON_API_KEY``, optional: the key belongs to the endpoint, and ``$DEEPSEEK_API_KEY``
  is DeepSeek's own, which a proxy or a local server should not be sent by accident.
* ``script:FILE``: :meth:`Scripted.from_file`, no network, no key.

Why ``provider+URL`` and not ``URL#provider:MODEL``: the model part is the server's own name,
passed on untouched, and real names contain ``:`` (Ollama's ``qwen3:8b``, ``deepseek-r1:8b``), so
any marker inside it could collide with a name. A URL scheme cannot contain ``+http`` by accident
here (only ``http`` and ``https`` are accepted), so ``deepseek+http://…`` is unambiguous, and it
reads like the ``git+https://`` and ``postgresql+psycopg://`` forms people know. ``deepseek`` is
the only provider a URL can name, since it is the only one whose wire format differs.

The retired DeepSeek aliases ``deepseek-chat`` and ``deepseek-reasoner`` are refused with a pointer
to the current names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from andon.base import API_KEY_ENV_VARS, ConfigError
from andon.llm._request import DEEPSEEK
from andon.llm._scripted import Scripted
from andon.llm._types import Model

__all__ = ["API_KEY_ENV_VARS", "DEEPSEEK_MODELS", "SPEC_FORMS", "api_key_env_for", "from_spec"]

DEEPSEEK_BASE_URL: Final = "https://api.deepseek.com"
OPENAI_BASE_URL: Final = "https://api.openai.com/v1"
DEEPSEEK_MODELS: Final = ("deepseek-v4-flash", "deepseek-v4-pro")
_RETIRED: Final = ("deepseek-chat", "deepseek-reasoner")
_URL_PROVIDERS: Final = (DEEPSEEK,)
"""The providers a ``provider+URL#MODEL`` spec may name."""
_PROVIDER_PREFIX: Final = re.compile(r"([A-Za-z][A-Za-z0-9_.-]*)\+(.*)", re.DOTALL)
_THINKING_ONLY: Final = (
    "thinking on/off applies to DeepSeek models only (deepseek-v4-flash, deepseek-v4-pro, "
    "deepseek+URL#MODEL), not to {spec!r}; leave it unset"
)

SPEC_FORMS: Final = (
    "deepseek-v4-flash, deepseek-v4-pro (key in $DEEPSEEK_API_KEY); "
    "openai:MODEL (key in $OPENAI_API_KEY); "
    "URL#MODEL, e.g. http://127.0.0.1:11434/v1#qwen3 (key in $ANDON_API_KEY if the server needs "
    "one); deepseek+URL#MODEL, e.g. deepseek+http://127.0.0.1:30000/v1#deepseek-v4-flash (a "
    "DeepSeek proxy or self-hosted V4: DeepSeek's thinking and reasoning rules; key in "
    "$ANDON_API_KEY if the server needs one); script:FILE (a scripted model, no network)"
)
"""The accepted forms, as error messages list them."""

_SCRIPT_OPTIONS: Final = frozenset({"max_retries", "clock", "rng"})
_HTTP_OPTIONS: Final = frozenset(
    {
        "connect_timeout",
        "first_content_timeout",
        "idle_timeout",
        "total_timeout",
        "max_retries",
        "retry_policy",
        "clock",
        "rng",
        "client",
    }
)


@dataclass(frozen=True, slots=True)
class _Endpoint:
    base_url: str
    model: str
    provider: str
    key_env: str
    key_required: bool


def _bad(spec: str, why: str) -> ConfigError:
    return ConfigError(f"unknown model spec {spec!r}: {why}. Accepted forms: {SPEC_FORMS}")


def _parse(spec: str) -> _Endpoint | str:
    """The HTTP endpoint a spec names, or the script path of a ``script:FILE`` spec."""
    spec = spec.strip()
    if spec in DEEPSEEK_MODELS:
        return _Endpoint(DEEPSEEK_BASE_URL, spec, DEEPSEEK, "DEEPSEEK_API_KEY", True)
    if spec in _RETIRED:
        raise ConfigError(
            f"{spec!r} is a retired DeepSeek alias; use deepseek-v4-flash or deepseek-v4-pro "
            "(thinking is on by default; --thinking off turns it off)"
        )
    if spec.startswith("script:"):
        path = spec.removeprefix("script:")
        if not path:
            raise _bad(spec, "script: needs a file, e.g. script:demo.yaml")
        return path
    if spec.startswith("openai:"):
        model = spec.removeprefix("openai:")
        if not model:
            raise _bad(spec, "openai: needs a model name, e.g. openai:gpt-4.1")
        return _Endpoint(OPENAI_BASE_URL, model, "openai", "OPENAI_API_KEY", True)
    provider = "openai-compatible"
    url_spec = spec
    named = None if spec.startswith(("http://", "https://")) else _PROVIDER_PREFIX.fullmatch(spec)
    if named is not None and (named.group(1) in _URL_PROVIDERS or "://" in named.group(2)):
        provider, url_spec = named.group(1), named.group(2)
        if provider not in _URL_PROVIDERS:
            raise _bad(
                spec,
                f"{provider!r} is not a provider a URL can name; the only one is deepseek "
                "(deepseek+URL#MODEL)",
            )
        if not url_spec.startswith(("http://", "https://")):
            raise _bad(spec, f"{provider}+ must be followed by an http:// or https:// base URL")
    if "#" in url_spec:
        url, _, model = url_spec.partition("#")
        if not url.startswith(("http://", "https://")):
            raise _bad(
                spec,
                "the part before # must be an http:// or https:// base URL "
                "(or deepseek+ and such a URL)",
            )
        if not model:
            raise _bad(spec, "the part after # must name the model")
        return _Endpoint(url, model, provider, "ANDON_API_KEY", False)
    if url_spec.startswith(("http://", "https://")):
        raise _bad(spec, "a URL needs #MODEL after it")
    raise _bad(spec, "not a known model" if spec else "it is empty")


def api_key_env_for(spec: str) -> str | None:
    """The environment variable ``spec`` reads its API key from (``None`` for scripts).

    Raises :class:`~andon.base.ConfigError` for a spec :func:`from_spec` would refuse.
    """
    parsed = _parse(spec)
    return parsed.key_env if isinstance(parsed, _Endpoint) else None


def from_spec(spec: str, *, thinking: bool | None = None, **options: Any) -> Model:
    """The model a ``--model`` spec names (see the module docstring for the forms).

    ``thinking`` applies to DeepSeek only (the presets and ``deepseek+URL#MODEL``; ``None``: on,
    sent explicitly) and is refused for other models. ``options`` are
    :class:`OpenAICompatible`'s keyword options (timeouts, ``max_retries``, ``retry_policy``,
    ``clock``, ``rng``, ``client``); a ``script:`` spec uses ``max_retries``, ``clock`` and
    ``rng`` and ignores the HTTP-only ones. A missing required key, an unreadable script or a
    malformed spec raise :class:`~andon.base.ConfigError`.
    """
    unknown = set(options) - _HTTP_OPTIONS
    if unknown:
        raise TypeError(f"from_spec() got unknown option(s): {', '.join(sorted(unknown))}")
    parsed = _parse(spec)
    if isinstance(parsed, str):
        if thinking is not None:  # a script has no thinking mode: saying so beats ignoring it
            raise ConfigError(_THINKING_ONLY.format(spec=spec))
        script_options = {k: v for k, v in options.items() if k in _SCRIPT_OPTIONS}
        return Scripted.from_file(parsed, **script_options)
    if thinking is not None and parsed.provider != DEEPSEEK:
        raise ConfigError(_THINKING_ONLY.format(spec=spec))
    if parsed.provider == DEEPSEEK and thinking is None:
        thinking = True  # the API's default, sent explicitly
    # The HTTP stack is imported only for a model that speaks HTTP (andon.llm's docstring).
    from andon.llm._openai import OpenAICompatible

    return OpenAICompatible(
        parsed.base_url,
        parsed.model,
        api_key_env=parsed.key_env,
        api_key_required=parsed.key_required,
        provider=parsed.provider,
        thinking=thinking,
        spec=spec.strip(),
        **options,
    )
