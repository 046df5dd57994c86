"""Model specs (docs/models.md, Choosing a model): every accepted form, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andon.base import ConfigError, ScriptInvalid
from andon.llm import (
    API_KEY_ENV_VARS,
    DEEPSEEK_MODELS,
    SPEC_FORMS,
    ModelIdentity,
    ModelRequest,
    OpenAICompatible,
    Scripted,
    api_key_env_for,
    from_spec,
)

KEYS = ("DEEPSEEK_API_KEY", "OPENAI_API_KEY", "ANDON_API_KEY")


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in KEYS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("name", DEEPSEEK_MODELS)
def test_deepseek_presets(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-key")
    model = from_spec(name)
    assert isinstance(model, OpenAICompatible)
    assert model.info == ModelIdentity(spec=name, provider="deepseek", name=name)
    assert model.base_url == "https://api.deepseek.com"
    assert model.api_key_env == "DEEPSEEK_API_KEY"
    assert model.thinking is True  # the API's default, sent explicitly
    body = model.request_body(_request())
    assert body["thinking"] == {"type": "enabled"}
    off = from_spec(name, thinking=False)
    assert isinstance(off, OpenAICompatible)
    assert off.request_body(_request())["thinking"] == {"type": "disabled"}


def _request() -> ModelRequest:
    return ModelRequest(messages=({"role": "user", "content": "hi"},))


def test_openai_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "oa-key")
    model = from_spec("openai:gpt-4.1")
    assert isinstance(model, OpenAICompatible)
    assert model.info == ModelIdentity(spec="openai:gpt-4.1", provider="openai", name="gpt-4.1")
    assert model.base_url == "https://api.openai.com/v1"
    assert model.api_key_env == "OPENAI_API_KEY"
    assert "thinking" not in model.request_body(_request())


def test_url_form_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    model = from_spec("http://127.0.0.1:11434/v1#qwen3")
    assert isinstance(model, OpenAICompatible)
    assert model.info == ModelIdentity(
        spec="http://127.0.0.1:11434/v1#qwen3", provider="openai-compatible", name="qwen3"
    )
    assert model.base_url == "http://127.0.0.1:11434/v1"
    assert model.api_key_env == "ANDON_API_KEY"


def test_script_form(tmp_path: Path) -> None:
    script = tmp_path / "demo.json"
    script.write_text(json.dumps({"replies": [{"text": "hi"}]}))
    model = from_spec(f"script:{script}", max_retries=1, idle_timeout=5.0)
    assert isinstance(model, Scripted)
    assert model.info.spec == f"script:{script}"
    assert model.remaining == 1


def test_script_form_with_a_bad_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ScriptInvalid, match=r"missing\.yaml"):
        from_spec(f"script:{tmp_path / 'missing.yaml'}")


@pytest.mark.parametrize(
    ("spec", "variable"),
    [
        ("deepseek-v4-flash", "DEEPSEEK_API_KEY"),
        ("deepseek-v4-pro", "DEEPSEEK_API_KEY"),
        ("openai:gpt-4.1", "OPENAI_API_KEY"),
    ],
)
def test_a_missing_required_key_names_the_variable(spec: str, variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        from_spec(spec)


def test_an_empty_key_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "  ")
    with pytest.raises(ConfigError, match="DEEPSEEK_API_KEY is not set"):
        from_spec("deepseek-v4-flash")


@pytest.mark.parametrize("retired", ["deepseek-chat", "deepseek-reasoner"])
def test_retired_deepseek_aliases_point_to_the_current_names(retired: str) -> None:
    with pytest.raises(ConfigError, match="retired") as info:
        from_spec(retired)
    assert "deepseek-v4-flash" in str(info.value)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "gpt-4.1",
        "deepseek-v3",
        "openai:",
        "script:",
        "http://127.0.0.1:11434/v1",
        "http://127.0.0.1:11434/v1#",
        "ftp://host/v1#model",
        "localhost:8000#model",
    ],
)
def test_bad_specs_list_the_accepted_forms(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_spec(spec)
    message = str(info.value)
    for form in ("deepseek-v4-flash", "openai:MODEL", "URL#MODEL", "script:FILE"):
        assert form in message


def test_thinking_is_refused_where_it_means_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "oa-key")
    with pytest.raises(ConfigError, match="DeepSeek"):
        from_spec("openai:gpt-4.1", thinking=True)
    with pytest.raises(ConfigError, match="DeepSeek"):
        from_spec("http://127.0.0.1:8000/v1#m", thinking=False)


def test_unknown_options_are_a_programming_error() -> None:
    with pytest.raises(TypeError, match="colour"):
        from_spec("http://127.0.0.1:8000/v1#m", colour="red")


def test_options_reach_the_adapter() -> None:
    with pytest.raises(ConfigError, match="idle timeout"):
        from_spec("http://127.0.0.1:8000/v1#m", idle_timeout=-1)


def test_api_key_env_for_each_form() -> None:
    assert api_key_env_for("deepseek-v4-flash") == "DEEPSEEK_API_KEY"
    assert api_key_env_for("openai:gpt-4.1") == "OPENAI_API_KEY"
    assert api_key_env_for("http://127.0.0.1:8000/v1#m") == "ANDON_API_KEY"
    assert api_key_env_for("script:demo.yaml") is None
    assert set(KEYS) == API_KEY_ENV_VARS
    with pytest.raises(ConfigError):
        api_key_env_for("deepseek-chat")


def test_the_key_is_read_at_construction_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "first-key")
    model = from_spec("deepseek-v4-flash")
    monkeypatch.setenv("DEEPSEEK_API_KEY", "second-key")
    assert isinstance(model, OpenAICompatible)
    assert model._headers()["Authorization"] == "Bearer first-key"
    assert "first-key" not in repr(model)
    assert repr(model._secret) == "<secret $DEEPSEEK_API_KEY set>"


def test_credentials_in_a_url_are_not_shown() -> None:
    model = OpenAICompatible("http://user:hunter2@127.0.0.1:8000/v1", "m", api_key_env=None)
    assert "hunter2" not in repr(model) and "hunter2" not in model.info.spec
    assert model.info.spec == "http://127.0.0.1:8000/v1#m"


def test_bad_adapter_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="http"):
        OpenAICompatible("127.0.0.1:8000/v1", "m", api_key_env=None)
    with pytest.raises(ConfigError, match="model name"):
        OpenAICompatible("http://127.0.0.1:8000/v1", " ", api_key_env=None)
    with pytest.raises(ConfigError, match="max_retries"):
        OpenAICompatible("http://127.0.0.1:8000/v1", "m", api_key_env=None, max_retries=-1)


def test_thinking_is_refused_for_a_script(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"text": "hi"}]))
    with pytest.raises(ConfigError, match="DeepSeek models only"):
        from_spec(f"script:{path}", thinking=True)
    assert from_spec(f"script:{path}").info.provider == "script"


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("bad.yaml", 'replies:\n  - text: "ok\n   bad: [\n', "bad.yaml:4:1"),
        ("bad.json", '{"replies": [\n  {"text": }\n]}', "bad.json:2:12"),
    ],
)
def test_a_script_that_does_not_parse_is_one_line_naming_file_and_line(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ScriptInvalid) as caught:
        from_spec(f"script:{path}")
    message = str(caught.value)
    assert where in message and "\n" not in message and "<unicode string>" not in message


@pytest.mark.parametrize("name", ["deep.yaml", "deep.json"])
def test_a_script_nested_5000_deep_is_a_clear_error(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(ScriptInvalid, match="nests too deeply"):
        from_spec(f"script:{path}")


# --- deepseek+URL#MODEL: a DeepSeek-compatible endpoint at a custom URL --------------------------


def test_deepseek_at_a_custom_url(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = "deepseek+http://127.0.0.1:30000/v1#deepseek-v4-flash"
    model = from_spec(spec)  # no key needed: a proxy or a local server may want none
    assert isinstance(model, OpenAICompatible)
    assert model.info == ModelIdentity(spec=spec, provider="deepseek", name="deepseek-v4-flash")
    assert model.base_url == "http://127.0.0.1:30000/v1"
    assert model.api_key_env == "ANDON_API_KEY"
    assert api_key_env_for(spec) == "ANDON_API_KEY"
    assert model.thinking is True  # DeepSeek's default, sent explicitly
    tools_span = ModelRequest(
        messages=(
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
        )
    )
    body = model.request_body(tools_span)
    assert body["thinking"] == {"type": "enabled"}
    sent = body["messages"]
    assert isinstance(sent, list)
    assert sent[1]["reasoning_content"] == ""  # the reasoning rule applies
    off = from_spec(spec, thinking=False)
    assert isinstance(off, OpenAICompatible)
    off_body = off.request_body(tools_span)
    assert off_body["thinking"] == {"type": "disabled"}
    off_sent = off_body["messages"]
    assert isinstance(off_sent, list)
    assert "reasoning_content" not in off_sent[1]
    monkeypatch.setenv("ANDON_API_KEY", "proxy-key")
    keyed = from_spec("deepseek+https://llm.example.org/deepseek#deepseek-v4-pro")
    assert isinstance(keyed, OpenAICompatible)
    assert keyed._headers()["Authorization"] == "Bearer proxy-key"


def test_model_names_with_colons_stay_untouched() -> None:
    # Why the provider goes before the URL, not into the model part: names contain ':'.
    model = from_spec("http://127.0.0.1:11434/v1#qwen3:8b")
    assert model.info.name == "qwen3:8b" and model.info.provider == "openai-compatible"
    named = from_spec("deepseek+http://127.0.0.1:11434/v1#deepseek-r1:8b")
    assert named.info.name == "deepseek-r1:8b" and named.info.provider == "deepseek"
    plus = from_spec("http://127.0.0.1:8000/a+b/v1#m")  # a '+' inside a URL is only a URL
    assert plus.info.provider == "openai-compatible"


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("deepseek+", "deepseek+ must be followed by an http:// or https:// base URL"),
        ("deepseek+ftp://host/v1#m", "deepseek+ must be followed by an http:// or https://"),
        ("deepseek+127.0.0.1:30000/v1#m", "deepseek+ must be followed by an http:// or https://"),
        ("deepseek+http://127.0.0.1:30000/v1", "a URL needs #MODEL after it"),
        ("deepseek+http://127.0.0.1:30000/v1#", "the part after # must name the model"),
        ("vllm+http://127.0.0.1:8000/v1#m", "'vllm' is not a provider a URL can name"),
        ("deepseek:http://127.0.0.1:8000/v1#m", "(or deepseek+ and such a URL)"),
    ],
)
def test_bad_provider_specs_are_one_line_naming_the_spec_and_the_forms(spec: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_spec(spec)
    message = str(info.value)
    assert "\n" not in message
    assert repr(spec) in message and why in message
    assert "deepseek+URL#MODEL" in message and message.endswith(SPEC_FORMS)


def test_thinking_is_still_refused_for_a_plain_url() -> None:
    with pytest.raises(ConfigError, match=r"deepseek\+URL#MODEL"):
        from_spec("http://127.0.0.1:8000/v1#deepseek-v4-flash", thinking=True)
