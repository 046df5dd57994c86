"""MCP server configuration: andon.toml tables, the mcpServers JSON file, --mcp flags; every
mistake one line naming where."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from andon.base import ConfigError
from andon.cli._mcp_config import (
    McpServerSettings,
    merge_servers,
    parse_mcp_flag,
    parse_mcp_json,
    parse_mcp_table,
)

TOML = """
[mcp.servers.time]
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
env = { TZ = "UTC" }
cwd = "tools"
enabled_tools = ["get_current_time"]
startup_timeout = 10
tool_timeout = 60

[mcp.servers.everything]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-everything"]
disabled_tools = ["get-env"]
"""


def test_toml_tables_give_each_server(tmp_path: Path) -> None:
    path = tmp_path / "andon.toml"
    time_, everything = parse_mcp_table(tomllib.loads(TOML)["mcp"], path)
    assert time_ == McpServerSettings(
        name="time",
        argv=("mcp-server-time", "--local-timezone", "UTC"),
        env={"TZ": "UTC"},
        cwd=str(tmp_path / "tools"),
        enabled_tools=("get_current_time",),
        startup_timeout=10.0,
        tool_timeout=60.0,
    )
    assert everything.argv == ("npx", "-y", "@modelcontextprotocol/server-everything")
    assert everything.enabled_tools is None and everything.disabled_tools == ("get-env",)
    assert everything.env == {} and everything.cwd is None and everything.tool_timeout is None


def test_the_json_file_other_agents_read(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "fs": {"command": "npx", "args": ["-y", "server-filesystem", "."]},
                    "off": {"command": "x", "disabled": True},
                    "git": {"command": "uvx", "args": ["mcp-server-git"], "env": {"A": "b"}},
                }
            }
        )
    )
    fs, git = parse_mcp_json(path)
    assert (fs.name, fs.argv) == ("fs", ("npx", "-y", "server-filesystem", "."))
    assert (git.name, git.env) == ("git", {"A": "b"})


def test_a_flag_is_split_as_a_shell_would_and_flags_win(tmp_path: Path) -> None:
    flag = parse_mcp_flag("time=mcp-server-time --local-timezone 'Europe/Paris'")
    assert flag.argv == ("mcp-server-time", "--local-timezone", "Europe/Paris")
    toml = parse_mcp_table(tomllib.loads(TOML)["mcp"], tmp_path / "andon.toml")
    merged = merge_servers(toml, [flag])
    assert [s.name for s in merged] == ["time", "everything"]
    assert merged[0] is flag


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ('[mcp.servers.a]\nargs = ["x"]\n', "command is missing"),
        ('[mcp.servers.a]\ncommand = ""\n', "command must be a non-empty string"),
        ('[mcp.servers.a]\ncommand = "x"\nargs = "y"\n', "args must be a list of strings"),
        ('[mcp.servers.a]\ncommand = "x"\nenv = { A = 1 }\n', "env must be a table"),
        ('[mcp.servers.a]\ncommand = "x"\nport = 1\n', "unknown key 'port'"),
        ('[mcp.servers.a]\ncommand = "x"\nstartup_timeout = 0\n', "startup_timeout must be"),
        ('[mcp.servers.a]\ncommand = "x"\ntool_timeout = inf\n', "tool_timeout must be"),
        (
            '[mcp.servers.a]\ncommand = "x"\nenabled_tools = []\ndisabled_tools = []\n',
            "not both",
        ),
        ('[mcp.servers.a_b]\ncommand = "x"\n', "server name 'a_b'"),
        ('[mcp.servers."a b"]\ncommand = "x"\n', "server name 'a b'"),
        ("[mcp]\nserver = 1\n", "unknown key 'server'"),
    ],
)
def test_a_wrong_table_names_the_key(tmp_path: Path, toml: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_mcp_table(tomllib.loads(toml)["mcp"], tmp_path / "andon.toml")
    assert said in str(caught.value)
    assert str(tmp_path / "andon.toml") in str(caught.value)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"{", "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[]", '"mcpServers"'),
        (b'{"mcpServers": {"web": {"url": "https://x"}}}', "reached by URL is not supported"),
        (b'{"mcpServers": {"a": {"command": "x", "timeout": 3}}}', "unknown key 'timeout'"),
        (b'{"mcpServers": {"a": []}}', "must be an object"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    ],
)
def test_a_wrong_json_file_is_one_line(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "mcp.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        parse_mcp_json(path)
    assert said in str(caught.value)


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("time", "expected NAME=COMMAND"),
        ("time=", "the command is empty"),
        ("time='unclosed", "No closing quotation"),
        ("t__x=cmd", "server name 't__x'"),
    ],
)
def test_a_wrong_flag_is_one_line(flag: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_mcp_flag(flag)
    assert said in str(caught.value)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        parse_mcp_json(tmp_path / "nope.json")


def test_settings_merge_andon_toml_the_file_and_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from andon.cli._settings import resolve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "andon.toml").write_text(TOML)
    (tmp_path / "mcp.json").write_text(
        json.dumps({"mcpServers": {"everything": {"command": "node", "args": ["e.js"]}}})
    )
    settings = resolve(
        {"mcp_config": "mcp.json", "mcp": ["extra=python3 server.py"]},
        env={},
    )
    assert [(s.name, s.argv[0]) for s in settings.mcp_servers] == [
        ("time", "mcp-server-time"),
        ("everything", "node"),
        ("extra", "python3"),
    ]
    from_env = resolve({}, env={"ANDON_MCP_CONFIG": "mcp.json"})
    assert [s.argv for s in from_env.mcp_servers][1] == ("node", "e.js")
    with pytest.raises(ConfigError, match="from ANDON_MCP_CONFIG"):
        resolve({}, env={"ANDON_MCP_CONFIG": "missing.json"})
