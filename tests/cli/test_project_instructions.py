"""Project instructions (docs/agent-loop.md, Project instructions): the AGENTS.md files from the
git root down to ``--cwd`` reach the model after andon's own text, in order, are logged with their
paths and hashes, shown by ``andon log``, read again on resume, and odd files are skipped with a
warning. Real ``git init`` repositories, real files, ``python -m andon`` against the mock server,
whose recorded requests show the system message the model received."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from andon.supervisor import DEFAULT_SYSTEM_PROMPT
from andon.testing import MockModelServer
from tests.cli.support import assert_balanced, env, records

ROOT_RULE = "ROOT-RULE: run ./build.sh before you say done."
PKG_RULE = "PKG-RULE: never edit generated/."


def _git_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True, timeout=30)
    return path


def _no_git_above(path: Path) -> None:
    for folder in (path, *path.parents):
        if (folder / ".git").exists():
            pytest.skip(f"the test's temporary folder is inside a git tree ({folder})")


def _andon(
    tmp_path: Path, *args: str, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "andon", *args],
        cwd=tmp_path,
        env=environ or env(ANDON_HOME=str(tmp_path / "home")),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _run(
    tmp_path: Path,
    cwd: Path,
    *extra: str,
    command: tuple[str, ...] = ("run",),
    environ: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """One ``andon run --json`` (or ``command``) in ``cwd`` against a fresh mock server: the
    process and the system message of every request the model received."""
    with MockModelServer([{"text": "Done."}]) as server:
        args = [*command, "go", "--json", "--model", f"{server.base_url}#mock", "--cwd", str(cwd)]
        if command == ("run",):
            args += ["--session", str(tmp_path / "s")]
        done = _andon(tmp_path, *args, *extra, environ=environ)
        bodies = [r.body for r in server.requests if r.path.endswith("/chat/completions")]
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    systems = [m["content"] for b in bodies for m in b["messages"] if m["role"] == "system"]
    assert len(systems) == len(bodies) >= 1
    return done, systems


def _starts(tmp_path: Path) -> list[dict[str, Any]]:
    return [
        r["data"]
        for r in records(tmp_path / "s")
        if r["type"] in ("session/start", "session/resumed")
    ]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose root and ``pkg/`` hold AGENTS.md, with a working directory
    ``pkg/src`` (no file of its own) below them, and an AGENTS.md above the root."""
    _no_git_above(tmp_path)
    (tmp_path / "AGENTS.md").write_text("ABOVE-ROOT: must never be read.\n")
    root = _git_repo(tmp_path / "repo")
    (root / "AGENTS.md").write_text(ROOT_RULE + "\n")
    (root / "pkg" / "src").mkdir(parents=True)
    (root / "pkg" / "AGENTS.md").write_text(PKG_RULE + "\n")
    return root


def test_two_levels_reach_the_model_in_order_after_andons_own_text(
    tmp_path: Path, repo: Path
) -> None:
    done, systems = _run(tmp_path, repo / "pkg" / "src")
    system = systems[0]
    assert system.startswith(DEFAULT_SYSTEM_PROMPT)  # andon's guidance on stops stays first
    lines = system.splitlines()
    assert lines.index("--- AGENTS.md ---") < lines.index(ROOT_RULE)
    assert lines.index(ROOT_RULE) < lines.index("--- pkg/AGENTS.md ---")
    assert lines.index("--- pkg/AGENTS.md ---") < lines.index(PKG_RULE)
    assert "ABOVE-ROOT" not in system  # above the git root: not the project's
    assert done.stderr.count("warning") == 0
    assert_balanced(tmp_path / "s")


def test_the_log_records_paths_and_hashes_and_andon_log_shows_them(
    tmp_path: Path, repo: Path
) -> None:
    done, systems = _run(tmp_path, repo / "pkg")
    (start,) = _starts(tmp_path)
    added = start["project_instructions"]
    root_bytes = (repo / "AGENTS.md").read_bytes()
    pkg_bytes = (repo / "pkg" / "AGENTS.md").read_bytes()
    assert added["root"] == os.path.realpath(repo)
    assert added["files"] == [
        {"path": "AGENTS.md", "sha256": hashlib.sha256(root_bytes).hexdigest(), "bytes": 47},
        {"path": "pkg/AGENTS.md", "sha256": hashlib.sha256(pkg_bytes).hexdigest(), "bytes": 33},
    ]
    assert len(root_bytes) == 47 and len(pkg_bytes) == 33
    # The log holds exactly what the model was sent, and where the instructions begin in it.
    assert start["system_prompt"] == systems[0]
    assert start["system_prompt"][: -added["chars"]] == DEFAULT_SYSTEM_PROMPT
    # --json mirrors the records: the live stream's session/start carries the same field.
    streamed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["data"] for e in streamed if e["type"] == "session/start"] == [start]

    shown = _andon(tmp_path, "log", str(tmp_path / "s"))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    at = lines.index(f"  project instructions from {os.path.realpath(repo)}:")
    assert lines[0].startswith("session ")
    assert lines[at + 1 : at + 3] == [
        f"    AGENTS.md · 47 bytes · sha256 {hashlib.sha256(root_bytes).hexdigest()[:12]}",
        f"    pkg/AGENTS.md · 33 bytes · sha256 {hashlib.sha256(pkg_bytes).hexdigest()[:12]}",
    ]
    assert_balanced(tmp_path / "s")


def test_a_system_file_replaces_only_andons_text(tmp_path: Path, repo: Path) -> None:
    (tmp_path / "system.txt").write_text("CUSTOM BASE: you are a release bot.")
    _, systems = _run(tmp_path, repo / "pkg", "--system", str(tmp_path / "system.txt"))
    system = systems[0]
    assert system.startswith("CUSTOM BASE: you are a release bot.\n\n# Project instructions\n")
    assert DEFAULT_SYSTEM_PROMPT not in system
    assert system.index(ROOT_RULE) < system.index(PKG_RULE)
    (start,) = _starts(tmp_path)
    assert [f["path"] for f in start["project_instructions"]["files"]] == [
        "AGENTS.md",
        "pkg/AGENTS.md",
    ]


@pytest.mark.parametrize("how", ["flag", "variable", "andon.toml"])
def test_the_opt_out_adds_none(tmp_path: Path, repo: Path, how: str) -> None:
    extra: list[str] = []
    environ = env(ANDON_HOME=str(tmp_path / "home"))
    if how == "flag":
        extra.append("--no-project-instructions")
    elif how == "variable":
        environ["ANDON_PROJECT_INSTRUCTIONS"] = "0"
    else:
        (tmp_path / "andon.toml").write_text("project_instructions = false\n")
    _, systems = _run(tmp_path, repo / "pkg", *extra, environ=environ)
    assert systems == [DEFAULT_SYSTEM_PROMPT]
    (start,) = _starts(tmp_path)
    assert "project_instructions" not in start
    # Turned on again (the default), the resumed session gets them: the switch is what decided.
    (tmp_path / "andon.toml").unlink(missing_ok=True)
    resume = ("resume", str(tmp_path / "s"))
    _, systems = _run(tmp_path, repo / "pkg", command=resume)
    assert systems[0].startswith(DEFAULT_SYSTEM_PROMPT + "\n\n# Project instructions\n")
    assert ROOT_RULE in systems[0] and PKG_RULE in systems[0]


def test_a_bad_setting_value_is_one_line_and_exit_2(tmp_path: Path, repo: Path) -> None:
    environ = env(ANDON_HOME=str(tmp_path / "home"), ANDON_PROJECT_INSTRUCTIONS="maybe")
    done = _andon(tmp_path, "run", "--model", "script:none.json", "go", environ=environ)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "andon: project-instructions takes on or off (got 'maybe') "
        "(from ANDON_PROJECT_INSTRUCTIONS)"
    ]


def test_resume_reads_them_again_and_records_them(tmp_path: Path, repo: Path) -> None:
    _run(tmp_path, repo / "pkg")
    (repo / "AGENTS.md").write_text("ROOT-RULE v2: run ./build.sh --strict.\n")
    (repo / "pkg" / "AGENTS.md").unlink()
    _, systems = _run(tmp_path, repo / "pkg", command=("resume", str(tmp_path / "s")))
    system = systems[0]
    # The base text once, the instructions as they are now, the old ones gone (not doubled).
    assert system.startswith(DEFAULT_SYSTEM_PROMPT + "\n\n# Project instructions\n")
    assert system.count("# Project instructions") == 1
    assert "ROOT-RULE v2: run ./build.sh --strict." in system
    assert ROOT_RULE not in system and PKG_RULE not in system
    start, resumed = _starts(tmp_path)
    assert resumed["system_prompt"] == system
    assert [f["path"] for f in start["project_instructions"]["files"]] == [
        "AGENTS.md",
        "pkg/AGENTS.md",
    ]
    (again,) = resumed["project_instructions"]["files"]
    new_bytes = (repo / "AGENTS.md").read_bytes()
    assert again == {
        "path": "AGENTS.md",
        "sha256": hashlib.sha256(new_bytes).hexdigest(),
        "bytes": len(new_bytes),
    }
    shown = _andon(tmp_path, "log", str(tmp_path / "s"))
    after = shown.stdout[shown.stdout.index("\nresumed ") :]
    assert f"    AGENTS.md · {len(new_bytes)} bytes · sha256 {again['sha256'][:12]}" in after
    assert "pkg/AGENTS.md" not in after
    assert_balanced(tmp_path / "s")


def test_resume_with_the_opt_out_keeps_the_base_and_drops_them(tmp_path: Path, repo: Path) -> None:
    (tmp_path / "system.txt").write_text("CUSTOM BASE.")
    _run(tmp_path, repo / "pkg", "--system", str(tmp_path / "system.txt"))
    resume = ("resume", str(tmp_path / "s"))
    _, systems = _run(tmp_path, repo / "pkg", "--no-project-instructions", command=resume)
    assert systems == ["CUSTOM BASE."]  # the logged base, without the earlier instructions
    _, resumed = _starts(tmp_path)
    assert "project_instructions" not in resumed


def test_without_a_git_root_only_the_working_directorys_own_file(tmp_path: Path) -> None:
    _no_git_above(tmp_path)
    (tmp_path / "AGENTS.md").write_text("PARENT: not read without a git root.\n")
    work = tmp_path / "ws"
    work.mkdir()
    (work / "AGENTS.md").write_text("OWN: read.\n")
    _, systems = _run(tmp_path, work)
    assert "OWN: read." in systems[0] and "PARENT" not in systems[0]
    (start,) = _starts(tmp_path)
    assert start["project_instructions"]["root"] == os.path.realpath(work)
    assert [f["path"] for f in start["project_instructions"]["files"]] == ["AGENTS.md"]


def test_a_git_file_marks_the_root_too(tmp_path: Path) -> None:
    """A worktree or a submodule has a ``.git`` file, not a folder."""
    _no_git_above(tmp_path)
    root = tmp_path / "wt"
    (root / "sub").mkdir(parents=True)
    (root / ".git").write_text("gitdir: /elsewhere/.git/worktrees/wt\n")
    (root / "AGENTS.md").write_text(ROOT_RULE + "\n")
    _, systems = _run(tmp_path, root / "sub")
    assert ROOT_RULE in systems[0]


# --- odd files ------------------------------------------------------------------------------------


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("andon: warning:")]


def test_a_symlink_out_of_the_tree_is_skipped_and_one_inside_followed(
    tmp_path: Path, repo: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-KEY-MATERIAL\n")
    (repo / "AGENTS.md").unlink()
    (repo / "AGENTS.md").symlink_to(secret)
    (repo / "docs").mkdir()
    (repo / "docs" / "pkg-rules.md").write_text(PKG_RULE + " (via a link)\n")
    (repo / "pkg" / "AGENTS.md").unlink()
    (repo / "pkg" / "AGENTS.md").symlink_to(Path("..") / "docs" / "pkg-rules.md")
    done, systems = _run(tmp_path, repo / "pkg")
    assert "SECRET-KEY-MATERIAL" not in systems[0]
    assert PKG_RULE + " (via a link)" in systems[0]
    assert _warnings(done.stderr) == [
        f"andon: warning: project instructions AGENTS.md skipped: a symlink to {secret}, "
        f"outside {os.path.realpath(repo)}"
    ]
    log = (tmp_path / "s" / "events.jsonl").read_text()
    assert "SECRET-KEY-MATERIAL" not in log
    (start,) = _starts(tmp_path)
    assert [f["path"] for f in start["project_instructions"]["files"]] == ["pkg/AGENTS.md"]


def test_an_unreadable_file_is_one_warning_and_the_run_goes_on(tmp_path: Path, repo: Path) -> None:
    """A socket named AGENTS.md cannot be opened for reading, even by root (ENXIO)."""
    (repo / "AGENTS.md").unlink()
    holder = socket.socket(socket.AF_UNIX)
    try:
        holder.bind(str(repo / "AGENTS.md"))
        done, systems = _run(tmp_path, repo / "pkg")
    finally:
        holder.close()
    assert PKG_RULE in systems[0]
    (warning,) = _warnings(done.stderr)
    assert warning.startswith("andon: warning: project instructions AGENTS.md skipped: ")
    (start,) = _starts(tmp_path)
    assert [f["path"] for f in start["project_instructions"]["files"]] == ["pkg/AGENTS.md"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_a_file_without_read_permission_is_one_warning(tmp_path: Path, repo: Path) -> None:
    (repo / "pkg" / "AGENTS.md").chmod(0)
    done, systems = _run(tmp_path, repo / "pkg")
    assert ROOT_RULE in systems[0] and PKG_RULE not in systems[0]
    assert _warnings(done.stderr) == [
        "andon: warning: project instructions pkg/AGENTS.md skipped: cannot read it: "
        "Permission denied"
    ]


def test_a_fifo_or_a_folder_is_skipped_without_a_hang(tmp_path: Path, repo: Path) -> None:
    (repo / "AGENTS.md").unlink()
    os.mkfifo(repo / "AGENTS.md")  # nobody writes: a blocking read would never end
    (repo / "pkg" / "AGENTS.md").unlink()
    (repo / "pkg" / "AGENTS.md").mkdir()
    done, systems = _run(tmp_path, repo / "pkg")
    assert systems == [DEFAULT_SYSTEM_PROMPT]
    assert _warnings(done.stderr) == [
        "andon: warning: project instructions AGENTS.md skipped: not a regular file",
        "andon: warning: project instructions pkg/AGENTS.md skipped: a folder, not a file",
    ]
    (start,) = _starts(tmp_path)
    assert "project_instructions" not in start


def test_a_huge_file_is_cut_on_a_character_boundary_and_says_so(tmp_path: Path, repo: Path) -> None:
    cap = 64 * 1024
    # A three-byte character straddles the cap: the cut drops it whole, never half of it.
    data = b"H" * (cap - 1) + "€".encode() + b"tail that is not sent\n" * 5000
    (repo / "AGENTS.md").write_bytes(data)
    done, systems = _run(tmp_path, repo / "pkg")
    system = systems[0]
    assert "H" * (cap - 1) + "\n[andon read only the first 65535 of " in system
    assert f"of {len(data)} bytes of AGENTS.md; the rest is not shown]" in system
    assert "tail that is not sent" not in system and "\ufffd" not in system
    assert system.index(PKG_RULE) > system.index("the rest is not shown]")
    assert _warnings(done.stderr) == [
        f"andon: warning: project instructions AGENTS.md: only its first 65535 of {len(data)} "
        "bytes are used (at most 65536 of a file)"
    ]
    (start,) = _starts(tmp_path)
    first = start["project_instructions"]["files"][0]
    assert first == {
        "path": "AGENTS.md",
        "sha256": hashlib.sha256(data[: cap - 1]).hexdigest(),
        "bytes": cap - 1,
        "truncated": True,
    }
    shown = _andon(tmp_path, "log", str(tmp_path / "s"))
    assert f"    AGENTS.md · {cap - 1} bytes, truncated · sha256 " in shown.stdout
    assert_balanced(tmp_path / "s")


def test_bytes_that_are_not_utf8_become_u_fffd_and_the_hash_is_of_the_bytes(
    tmp_path: Path, repo: Path
) -> None:
    raw = b"Caf\xe9 rules: \xff\xfe keep going.\n"
    (repo / "pkg" / "AGENTS.md").write_bytes(raw)
    _, systems = _run(tmp_path, repo / "pkg")
    assert "Caf\ufffd rules: \ufffd\ufffd keep going." in systems[0]
    (start,) = _starts(tmp_path)
    assert start["project_instructions"]["files"][1]["sha256"] == hashlib.sha256(raw).hexdigest()
    assert_balanced(tmp_path / "s")


def test_an_empty_file_is_skipped_without_a_word(tmp_path: Path, repo: Path) -> None:
    (repo / "AGENTS.md").write_bytes(b"")
    (repo / "pkg" / "AGENTS.md").write_text("  \n\t\n")
    (repo / "pkg" / "src" / "AGENTS.md").write_text("SRC-RULE: one file that says something.\n")
    done, systems = _run(tmp_path, repo / "pkg" / "src")
    assert _warnings(done.stderr) == []
    (start,) = _starts(tmp_path)
    assert [f["path"] for f in start["project_instructions"]["files"]] == ["pkg/src/AGENTS.md"]
    assert "--- AGENTS.md ---" not in systems[0] and "--- pkg/AGENTS.md ---" not in systems[0]
    assert "--- pkg/src/AGENTS.md ---\nSRC-RULE: one file that says something.\n" in systems[0]
