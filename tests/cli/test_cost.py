"""``cost`` in ``run/summary``: the price table, ``[prices."MODEL"]`` in ``andon.toml``, and priced
runs of the real executable against the mock model server (``URL#MODEL`` plus a price override
for that model name: a priced run without a network or a key)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from andon.base import ConfigError
from andon.cli._prices import BUILTIN, READ_ON, TABLE_NAME, Price, cost, parse_prices
from andon.llm import DEEPSEEK_MODELS, ModelIdentity
from andon.testing import MockModelServer
from tests.cli.support import env, run, script

PRICE = Price(input_cache_hit=0.5, input_cache_miss=2.0, output=8.0)
PRICES_TOML = (
    '[prices."mock-priced"]\ninput_cache_hit = 0.5\ninput_cache_miss = 2.0\noutput = 8.0\n'
)
NO_SPLIT = "no cache split reported: every prompt token priced as a cache miss"


def info(spec: str, provider: str, name: str) -> ModelIdentity:
    return ModelIdentity(spec=spec, provider=provider, name=name)


FLASH = info("deepseek-v4-flash", "deepseek", "deepseek-v4-flash")


def home(tmp_path: Path) -> dict[str, str]:
    return env(ANDON_HOME=str(tmp_path / "home"))


# --- the table and the formula --------------------------------------------------------------------


def test_the_table_prices_every_built_in_deepseek_spec_as_read_on_its_date() -> None:
    assert set(BUILTIN) == set(DEEPSEEK_MODELS)
    assert BUILTIN["deepseek-v4-flash"] == Price(0.0028, 0.14, 0.28)
    assert BUILTIN["deepseek-v4-pro"] == Price(0.003625, 0.435, 0.87)
    assert READ_ON == "2026-12-03" and READ_ON in TABLE_NAME


def test_cost_prices_hits_misses_and_output_and_counts_reasoning_once() -> None:
    usage = {
        "prompt_tokens": 3_000_000,
        "completion_tokens": 1_000_000,
        "cached_prompt_tokens": 2_000_000,
        "uncached_prompt_tokens": 1_000_000,
        "reasoning_tokens": 400_000,  # part of completion_tokens: not priced again
    }
    spent = cost(usage, FLASH, {})
    assert spent == {"usd": pytest.approx(2 * 0.0028 + 0.14 + 0.28), "priced_by": TABLE_NAME}
    pro = cost(usage, info("deepseek-v4-pro", "deepseek", "deepseek-v4-pro"), {})
    assert pro is not None and pro["usd"] == pytest.approx(2 * 0.003625 + 0.435 + 0.87)


def test_without_a_cache_split_every_prompt_token_is_a_miss_and_priced_by_says_so() -> None:
    spent = cost({"prompt_tokens": 1_000_000, "completion_tokens": 0}, FLASH, {})
    assert spent == {"usd": pytest.approx(0.14), "priced_by": f"{TABLE_NAME}; {NO_SPLIT}"}


def test_a_mixed_run_prices_prompt_tokens_not_reported_as_hits_as_misses() -> None:
    # One request reported 600 hits + 400 misses, another (no split) 1000 prompt tokens.
    usage = {"prompt_tokens": 2000, "completion_tokens": 0, "cached_prompt_tokens": 600,
             "uncached_prompt_tokens": 400}  # fmt: skip
    spent = cost(usage, info("u#m", "openai-compatible", "m"), {"m": PRICE})
    assert spent == {"usd": round((600 * 0.5 + 1400 * 2.0) / 1e6, 6), "priced_by": "andon.toml"}


def test_cost_is_rounded_to_six_decimals() -> None:
    spent = cost({"prompt_tokens": 1, "completion_tokens": 1}, FLASH, {})
    assert spent is not None and spent["usd"] == round((0.14 + 0.28) / 1e6, 6) == 0.0


@pytest.mark.parametrize(
    "model",
    [
        info("openai:gpt-4.1", "openai", "gpt-4.1"),
        info("http://127.0.0.1:1/v1#qwen3", "openai-compatible", "qwen3"),
        info("script:s.yaml", "script", "scripted"),
        # Only the built-in spec is priced by DeepSeek's table, not another host's model of
        # the same name.
        info("http://proxy/v1#deepseek-v4-flash", "openai-compatible", "deepseek-v4-flash"),
    ],
    ids=["openai", "custom-url", "script", "custom-url-deepseek-name"],
)
def test_a_model_without_a_price_has_no_cost(model: ModelIdentity) -> None:
    assert cost({"prompt_tokens": 10, "completion_tokens": 10}, model, {}) is None


def test_andon_toml_prices_a_custom_model_and_overrides_the_table() -> None:
    usage = {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}
    custom = info("http://127.0.0.1:1/v1#mock-priced", "openai-compatible", "mock-priced")
    assert cost(usage, custom, {"mock-priced": PRICE}) == {
        "usd": 10.0,
        "priced_by": f"andon.toml; {NO_SPLIT}",
    }
    cheaper = {"deepseek-v4-flash": Price(0.0, 0.01, 0.02)}
    spent = cost(usage, FLASH, cheaper)
    assert spent is not None and spent["usd"] == pytest.approx(0.03)
    assert spent["priced_by"].startswith("andon.toml")


# --- [prices."MODEL"] in andon.toml ---------------------------------------------------------------

BAD_PRICES = {
    "negative": ('[prices.m]\ninput_cache_hit = -1\ninput_cache_miss = 1\noutput = 1\n',
                 'prices."m".input_cache_hit must be a finite number >= 0'),
    "infinite": ('[prices.m]\ninput_cache_hit = 1\ninput_cache_miss = inf\noutput = 1\n',
                 'prices."m".input_cache_miss must be a finite number >= 0'),
    "nan": ('[prices.m]\ninput_cache_hit = 1\ninput_cache_miss = 1\noutput = nan\n',
            'prices."m".output must be a finite number >= 0'),
    "text": ('[prices.m]\ninput_cache_hit = "1"\ninput_cache_miss = 1\noutput = 1\n',
             'prices."m".input_cache_hit must be a finite number >= 0'),
    "bool": ('[prices.m]\ninput_cache_hit = true\ninput_cache_miss = 1\noutput = 1\n',
             'prices."m".input_cache_hit must be a finite number >= 0'),
    "missing": ('[prices.m]\ninput_cache_hit = 1\noutput = 1\n',
                'prices."m".input_cache_miss is missing'),
    "unknown key": ('[prices.m]\ninput = 1\ninput_cache_hit = 1\ninput_cache_miss = 1\n'
                    'output = 1\n', 'prices."m".input is not a price'),
    "not a table": ('[prices]\nm = 3\n', 'prices."m" must be a table'),
    "prices not a table": ('prices = 3\n', 'prices must be a table'),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_PRICES))
def test_a_bad_price_is_one_line_naming_the_file_and_key_and_exit_2(
    tmp_path: Path, case: str
) -> None:
    text, expected = BAD_PRICES[case]
    (tmp_path / "andon.toml").write_text(text)
    model = script(tmp_path / "s.json", [{"text": "Hi."}])
    result = run("run", "--model", model, "hi", cwd=tmp_path, environ=home(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"andon: {tmp_path / 'andon.toml'}: {expected}"), result.stderr
    assert result.stdout == "" and not (tmp_path / "home").exists()  # refused before any session


def test_a_price_table_parses_to_prices_and_refuses_an_empty_model_name() -> None:
    table = {"m": {"input_cache_hit": 0, "input_cache_miss": 1, "output": 2.5}}
    assert parse_prices(table, Path("andon.toml")) == {"m": Price(0.0, 1.0, 2.5)}
    with pytest.raises(ConfigError, match="the model name is empty"):
        parse_prices({" ": table["m"]}, Path("andon.toml"))


# --- priced runs against the mock server ----------------------------------------------------------


def _replies(usages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "text": "Checking.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "echo ok"}}],
            "usage": usages[0],
        },
        {"text": "All green.", "usage": usages[1]},
    ]


def _priced_run(tmp_path: Path, replies: list[dict[str, Any]], *flags: str) -> Any:
    (tmp_path / "andon.toml").write_text(PRICES_TOML)
    with MockModelServer(replies) as server:
        return run(
            "run", *flags, "--model", f"{server.base_url}#mock-priced", "fix it",
            cwd=tmp_path, environ=home(tmp_path),
        )  # fmt: skip


def _summary(stdout: str) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    assert summary["type"] == "run/summary"
    return summary


PLAIN = [
    {"prompt_tokens": 1000, "completion_tokens": 200},
    {"prompt_tokens": 1500, "completion_tokens": 100},
]


def test_a_priced_run_without_a_cache_split_prices_every_prompt_token_as_a_miss(
    tmp_path: Path,
) -> None:
    result = _priced_run(tmp_path, _replies(PLAIN), "--json")
    assert result.returncode == 0, result.stderr
    summary = _summary(result.stdout)
    assert summary["usage"] == {
        "prompt_tokens": 2500,
        "completion_tokens": 300,
        "cached_prompt_tokens": 0,
    }
    assert summary["cost"] == {
        "usd": pytest.approx((2500 * 2.0 + 300 * 8.0) / 1e6),
        "priced_by": f"andon.toml; {NO_SPLIT}",
    }
    assert summary["final_text"] == "All green."


def test_the_human_summary_says_the_cost(tmp_path: Path) -> None:
    result = _priced_run(tmp_path, _replies(PLAIN))
    assert result.returncode == 0, result.stderr
    assert ", $0.0074, ended completed, exit 0" in result.stderr, result.stderr


def test_a_run_of_a_model_without_a_price_has_no_cost(tmp_path: Path) -> None:
    with MockModelServer(_replies(PLAIN)) as server:
        result = run(
            "run", "--json", "--model", f"{server.base_url}#unpriced", "fix it",
            cwd=tmp_path, environ=home(tmp_path),
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "cost" not in _summary(result.stdout)


DEEPSEEK_SHAPED = [
    {"prompt_tokens": 1000, "completion_tokens": 200, "prompt_cache_hit_tokens": 600,
     "prompt_cache_miss_tokens": 400, "completion_tokens_details": {"reasoning_tokens": 50}},
    {"prompt_tokens": 1500, "completion_tokens": 100, "prompt_cache_hit_tokens": 1200,
     "prompt_cache_miss_tokens": 300, "completion_tokens_details": {"reasoning_tokens": 20}},
]  # fmt: skip


def _mock_sends_deepseek_usage() -> str | None:
    """Why the mock server cannot serve DeepSeek's usage fields yet, or None if it can."""
    reply = {"text": "x", "usage": DEEPSEEK_SHAPED[0]}
    try:
        server = MockModelServer([reply])
    except ConfigError as e:
        return f"the mock server's script does not take DeepSeek-shaped usage yet ({e})"
    with server:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
        text = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=10).text
    if "prompt_cache_hit_tokens" not in text or "prompt_cache_miss_tokens" not in text:
        return "the mock server does not emit prompt_cache_hit_tokens/prompt_cache_miss_tokens yet"
    return None


def test_a_priced_run_with_deepseek_cache_hits_prices_them_as_hits(tmp_path: Path) -> None:
    missing = _mock_sends_deepseek_usage()
    if missing is not None:
        pytest.skip(missing)
    result = _priced_run(tmp_path, _replies(DEEPSEEK_SHAPED), "--json")
    assert result.returncode == 0, result.stderr
    summary = _summary(result.stdout)
    assert summary["usage"] == {
        "prompt_tokens": 2500,
        "completion_tokens": 300,
        "cached_prompt_tokens": 1800,
        "uncached_prompt_tokens": 700,
        "reasoning_tokens": 70,
    }
    assert summary["cost"] == {
        "usd": pytest.approx((1800 * 0.5 + 700 * 2.0 + 300 * 8.0) / 1e6),  # reasoning: once
        "priced_by": "andon.toml",
    }
