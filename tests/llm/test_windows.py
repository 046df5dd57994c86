"""Context windows (docs/models.md, Context windows): the documented table, and discovery against
small real HTTP servers on loopback answering llama.cpp's, vLLM's and Ollama's shapes, garbage,
redirects elsewhere, or nothing at all."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

from andon.llm import discover_context_window, known_context_window
from tests.llm.loopback import Answer, ok, serving

LLAMACPP_PROPS = ok(
    {
        "default_generation_settings": {"id": 0, "n_ctx": 2048, "params": {"n_predict": -1}},
        "total_slots": 1,
        "chat_template": "{{ messages }}" * 100,
    }
)
LLAMACPP_MODELS = ok({"object": "list", "data": [{"id": "smol", "meta": {"n_ctx_train": 8192}}]})


async def test_llama_cpp_props_give_the_slot_context_not_the_training_length() -> None:
    async with serving({"/props": LLAMACPP_PROPS, "/v1/models": LLAMACPP_MODELS}) as server:
        assert await discover_context_window(f"{server.url}/v1", timeout=5) == 2048


async def test_vllm_models_give_max_model_len_and_the_spec_model_wins() -> None:
    models = ok(
        {
            "object": "list",
            "data": [
                {"id": "big", "object": "model", "max_model_len": 32768},
                {"id": "small", "object": "model", "max_model_len": 4096},
            ],
        }
    )
    async with serving({"/v1/models": models}) as server:
        base = f"{server.url}/v1/"
        assert await discover_context_window(base, timeout=5, model="big") == 32768
        assert await discover_context_window(base, timeout=5, model="small") == 4096
        assert await discover_context_window(base, timeout=5) == 4096  # unknown: the smallest


@pytest.mark.parametrize(
    "field", ["context_length", "context_window", "max_context_length", "n_ctx"]
)
async def test_other_servers_fields_in_a_models_entry(field: str) -> None:
    async with serving({"/v1/models": ok({"data": [{"id": "m", field: 16384}]})}) as server:
        assert await discover_context_window(f"{server.url}/v1", timeout=5) == 16384


async def test_ollama_loaded_model_context() -> None:
    ps = ok({"models": [{"name": "qwen3:4b", "model": "qwen3:4b", "context_length": 4096}]})
    async with serving({"/api/ps": ps}) as server:
        assert (
            await discover_context_window(f"{server.url}/v1", timeout=5, model="qwen3:4b") == 4096
        )


@pytest.mark.parametrize(
    "answers",
    [
        {"/props": (200, {}, b"<html>hello</html>"), "/v1/models": ok({"data": "nope"})},
        {"/props": ok({"default_generation_settings": {"n_ctx": "2048"}}), "/v1/models": ok([])},
        {"/props": ok({"n_ctx": True}), "/v1/models": ok({"data": [{"max_model_len": -5}]})},
        {"/props": ok({"n_ctx": 2**40}), "/v1/models": ok({"data": [{"max_model_len": 1.5}]})},
        {"/props": (500, {}, b'{"n_ctx": 2048}')},
        # llama-cpp-python's server: its models list names no window.
        {"/v1/models": ok({"object": "list", "data": [{"id": "m", "owned_by": "me"}]})},
        {"/props": (200, {}, b"[" * 100_000)},
        {"/props": ok({"n_ctx": 2048, "pad": "x" * (2 << 20)})},  # too long to read
    ],
)
async def test_garbage_is_none(answers: Mapping[str, Answer]) -> None:
    async with serving(answers) as server:
        assert await discover_context_window(f"{server.url}/v1", timeout=5) is None


async def test_a_hanging_server_is_none_within_the_bound() -> None:
    async with serving({"/props": None, "/v1/models": None, "/api/ps": None}) as server:
        started = time.monotonic()
        assert await discover_context_window(f"{server.url}/v1", timeout=0.3) is None
        assert time.monotonic() - started < 10  # bounded (0.3 s asked; generous under load)


async def test_what_answered_in_time_counts_beside_a_hanging_place() -> None:
    async with serving({"/props": None, "/v1/models": ok({"data": [{"max_model_len": 777}]})}) as s:
        assert await discover_context_window(f"{s.url}/v1", timeout=1.0) == 777


async def test_a_redirect_elsewhere_is_not_followed() -> None:
    async with serving({"/props": LLAMACPP_PROPS}, host="127.0.0.2") as elsewhere:
        moved: Answer = (302, {"Location": f"{elsewhere.url}/props"}, b"")
        async with serving({"/props": moved, "/v1/models": moved}) as server:
            assert await discover_context_window(f"{server.url}/v1", timeout=5) is None
        assert elsewhere.seen == []


async def test_the_key_is_sent_and_nothing_is_asked_of_a_closed_port() -> None:
    async with serving({"/v1/models": ok({"data": [{"max_model_len": 512}]})}) as server:
        assert await discover_context_window(f"{server.url}/v1", timeout=5, api_key="k") == 512
        assert {h.get("authorization") for _, h in server.seen} == {"Bearer k"}
        url = server.url
    assert await discover_context_window(f"{url}/v1", timeout=2) is None  # closed now
    assert await discover_context_window("ftp://127.0.0.1/v1", timeout=2) is None
    assert await discover_context_window("not a url", timeout=2) is None


def test_known_windows() -> None:
    assert known_context_window("deepseek-v4-flash") == 1_048_576
    assert known_context_window(" deepseek-v4-pro ") == 1_048_576
    assert known_context_window("deepseek+http://127.0.0.1:30000/v1#deepseek-v4-flash") == 1_048_576
    assert known_context_window("deepseek+http://127.0.0.1:30000/v1#other") is None
    assert known_context_window("openai:gpt-4.1") == 1_047_576
    assert known_context_window("openai:gpt-4.1-2025-04-14") == 1_047_576
    assert known_context_window("openai:gpt-4o-mini") == 128_000
    assert known_context_window("openai:some-future-model") is None
    assert known_context_window("http://127.0.0.1:8080/v1#deepseek-v4-flash") is None
    assert known_context_window("script:demo.yaml") is None
    assert known_context_window("deepseek-chat") is None  # refused as a spec: not known
    assert known_context_window("") is None
